//! A chain's WGSL: its members' sources joined, and the entry point that runs them
//! as phases.

use super::*;

/// A member's layout in a chain: its storage buffers writable. wgpu allows a buffer
/// one kind of use per dispatch, and a chain's members read buffers that others write.
pub(super) fn writable(layout: &[Binding]) -> Vec<Binding> {
    layout
        .iter()
        .map(|b| match b {
            Binding::Read => Binding::ReadWrite,
            b => *b,
        })
        .collect()
}

/// A member's source in a chain: its storage buffers declared writable ([`writable`]),
/// its uniforms read through `chain_zero` (see the module's notes), and its step's
/// declaration left to the chain's ([`STEP_DECL`]).
fn member_source(d: &Deferred) -> Result<String> {
    let src = d
        .source()
        .replace("var<storage, read>", "var<storage, read_write>");
    let src = wgsl_link::index_uniforms(&src, "chain_zero");
    if !src.contains(STEP_DECL_INDEXED) {
        return Err(Error::gpu(format!(
            "chain: {} does not declare the step as {STEP_DECL}",
            d.label()
        )));
    }
    Ok(src.replacen(STEP_DECL_INDEXED, "", 1))
}

/// The module of a chain of `members`: each joined, then the driver and its entry point.
pub(super) fn chain_source(members: &[&Arc<Deferred>]) -> Result<(String, Vec<(String, f64)>)> {
    let bases = member_bases(members);
    let mut directives: Vec<String> = Vec::new();
    let mut bodies = String::new();
    let mut constants = Vec::new();
    let mut calls = String::new();
    let mut lanes: Option<f64> = None;
    let mut ws0 = String::new();
    for (k, d) in members.iter().enumerate() {
        let linked = wgsl_link::link(&member_source(d)?, k, bases[k])?;
        for dir in &linked.directives {
            if !directives.contains(dir) {
                directives.push(dir.clone());
            }
        }
        bodies.push_str(&linked.body);
        bodies.push('\n');
        for (name, v) in d.constants() {
            let Some((_, renamed)) = linked.overrides.iter().find(|(o, _)| o == name) else {
                return Err(Error::gpu(format!(
                    "chain: {} sets {name}, which it does not declare",
                    d.label()
                )));
            };
            constants.push((renamed.clone(), *v));
        }
        // Every phase runs on the chain's workgroups: their sizes must agree.
        let size = constants
            .iter()
            .find(|(c, _)| *c == linked.workgroup_size)
            .map(|(_, v)| *v)
            .or_else(|| {
                linked
                    .workgroup_size
                    .trim_end_matches('u')
                    .parse::<f64>()
                    .ok()
            });
        match (size, lanes) {
            (None, _) => {
                return Err(Error::gpu(format!(
                    "chain: {}'s workgroup size {} is not a constant",
                    d.label(),
                    linked.workgroup_size
                )))
            }
            (Some(s), Some(l)) if s != l => {
                return Err(Error::gpu(format!(
                    "chain: {} has {s} lanes a workgroup, the chain {l}",
                    d.label()
                )))
            }
            (Some(s), _) => lanes = Some(s),
        }
        if k == 0 {
            ws0 = linked.workgroup_size.clone();
        }
        calls.push_str(&phase_call(k, &linked)?);
    }
    let mut src = directives.join("\n");
    src.push('\n');
    src.push_str(&bodies);
    src.push_str(CHAIN_WGSL);
    // The subgroup builtins only where a phase takes them (they need the feature).
    let mut params = vec![
        "@builtin(local_invocation_index) chain_l: u32",
        "@builtin(local_invocation_id) chain_lid: vec3<u32>",
    ];
    if calls.contains("chain_sid") {
        params.push("@builtin(subgroup_invocation_id) chain_sid: u32");
    }
    if calls.contains("chain_ssz") {
        params.push("@builtin(subgroup_size) chain_ssz: u32");
    }
    src.push_str(&format!(
        "\n@compute @workgroup_size({ws0})\nfn main({}) {{\n    chain_zero = subgroupBroadcastFirst(chain.zero.x);\n{calls}}}\n",
        params.join(", ")
    ));
    Ok((src, constants))
}

/// The entry point's part for phase `k`: wait for the phase before, then take items
/// until none is left, each a call of the kernel's lifted entry point.
fn phase_call(k: usize, linked: &wgsl_link::Linked) -> Result<String> {
    let args: Vec<String> = linked
        .builtins
        .iter()
        .map(|b| {
            Ok(match b.as_str() {
                "workgroup_id" => format!("chain_wid({k}u, i)"),
                "num_workgroups" => format!("chain.grid[{k}].xyz"),
                "local_invocation_index" => "chain_l".to_string(),
                "local_invocation_id" => "chain_lid".to_string(),
                "global_invocation_id" => format!(
                    "chain_wid({k}u, i) * vec3<u32>(u32({}), 1u, 1u) + chain_lid",
                    linked.workgroup_size
                ),
                "subgroup_invocation_id" => "chain_sid".to_string(),
                "subgroup_size" => "chain_ssz".to_string(),
                other => {
                    return Err(Error::gpu(format!(
                        "chain: a kernel takes the builtin {other}"
                    )))
                }
            })
        })
        .collect::<Result<_>>()?;
    let wait = if k == 0 {
        String::new()
    } else {
        format!("    if (!chain_ready({k}u, chain_l)) {{\n        return;\n    }}\n")
    };
    // The first phase that has items zeroes the chain before's counters: the first, or
    // the second where the first is skipped.
    let clear = if k <= 1 {
        format!("        if (i == 0u && chain_first() == {k}u) {{\n            chain_clear(chain_l);\n        }}\n")
    } else {
        String::new()
    };
    Ok(format!(
        "{wait}    loop {{\n        let i = chain_claim({k}u, chain_l);\n        if (i >= chain_items({k}u)) {{\n            break;\n        }}\n{clear}        {}({});\n        chain_done({k}u, chain_l);\n    }}\n",
        linked.entry,
        args.join(", ")
    ))
}

/// Each member's binding base: its binding b (b >= 1; its step, binding 0, is the
/// chain's) lands at base + b. The chain's own three come first (counters, parameters,
/// step), then one member after another.
pub(super) fn member_bases(members: &[&Arc<Deferred>]) -> Vec<u32> {
    let mut at = 3;
    members
        .iter()
        .map(|d| {
            let base = at - 1;
            at += d.bindings().len().saturating_sub(1) as u32;
            base
        })
        .collect()
}

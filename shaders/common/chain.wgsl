// A chain (`ops::chain`): several single-token kernels, each joined into this module by
// `gpu::wgsl_link` with its bindings from a base of its own, run in turn by one dispatch
// of a few workgroups. Kernel k is phase k; its workgroups are the phase's items, which
// the chain's workgroups claim from a counter one at a time. A phase starts once every
// item of the phase before is done.
//
// Nothing assumes that the chain's workgroups run at once (a driver may run them one
// after another): a workgroup that finds the phase before unfinished reads its count at
// most `spin` times and then leaves the dispatch; the workgroup that finishes a phase's
// last item never waits at the next, so the chain always completes. On llvmpipe a
// workgroup may take 65535 loop trips in all (its loop limiter, which ends every loop
// after one trip once they are spent, silently); the host sizes `spin` so that the
// waits and the most work one workgroup could take stay within them (`Run::spin` in
// ops/chain/runs.rs).
//
// The counters of a chain's run are zeroed by the chain after it in the step, whose
// dispatch starts once this one has ended (the step's last chain's by the first chain
// of the next step): a counter is never zeroed while a workgroup may still read it.
//
// Counts are read with a read-modify-write (an add of 0), which no compiler moves the
// phase's loads above. The chain's three bindings come first, the kernels' after them.

struct ChainParams {
    // This run's counters: phase k's claims at base + 2 k, its items done after them.
    base: u32,
    // The counters the chain before this one used, zeroed by this one.
    clear: u32,
    clear_n: u32,
    // The most reads of a count before a workgroup gives up waiting (`chain_spin`).
    spin: u32,
    // The most cached positions at which phase 0 runs here, where it walks them
    // (attention, `ops::chain::KvTrips`); past them the host runs it before the chain,
    // and phase 0 has no items. All ones where phase 0 is not optional.
    kv_max: u32,
    // The loop trips a workgroup has for its waits, less phase 0's that grow with the
    // cached positions: kv_8 more per eight of them.
    left: u32,
    kv_8: u32,
    phases: u32,
    // Zero, which the compiler cannot know: the index of the kernels' uniforms
    // (`gpu::wgsl_link::index_uniforms`).
    zero: vec4<u32>,
    // Per phase: its kernel's workgroups along x, y and z, and their product.
    grid: array<vec4<u32>, 8>,
}

@group(0) @binding(0) var<storage, read_write> chain_counts: array<atomic<u32>>;
@group(0) @binding(1) var<storage, read_write> chain: ChainParams;

// The step's values (common/step.wgsl's `Step`), bound once for every kernel of the
// chain, which reads them as `step[chain_zero]` (`ops::chain`'s `STEP_DECL`).
struct ChainStep {
    n_tokens: u32,
    pos: u32,
    n_kv: u32,
    _pad: u32,
}
@group(0) @binding(2) var<uniform> step: array<ChainStep, 1>;

var<workgroup> chain_shared: u32;
// `chain.zero.x`, for the whole workgroup (set first thing by the entry point).
var<private> chain_zero: u32;

// Lane 0's `v`, for the whole workgroup.
fn chain_lane0(v: u32, l: u32) -> u32 {
    if (l == 0u) {
        chain_shared = v;
    }
    return workgroupUniformLoad(&chain_shared);
}

// The next item of phase k for this workgroup; one past the phase's last when none is
// left.
fn chain_claim(k: u32, l: u32) -> u32 {
    var c = 0u;
    if (l == 0u) {
        c = atomicAdd(&chain_counts[chain.base + 2u * k], 1u);
    }
    return chain_lane0(c, l);
}

// An item of phase k is done: every lane's stores land before lane 0 counts it.
fn chain_done(k: u32, l: u32) {
    storageBarrier();
    if (l == 0u) {
        atomicAdd(&chain_counts[chain.base + 2u * k + 1u], 1u);
    }
}

// Whether phase k may start: every item of phase k - 1 is done. False where this
// workgroup's reads ran out first; it then leaves the dispatch.
fn chain_ready(k: u32, l: u32) -> bool {
    var ok = 0u;
    if (l == 0u) {
        let want = chain_items(k - 1u);
        let at = chain.base + 2u * k - 1u;
        var seen = atomicAdd(&chain_counts[at], 0u);
        let spin = chain_spin();
        for (var s = 0u; s < spin && seen < want; s++) {
            seen = atomicAdd(&chain_counts[at], 0u);
        }
        ok = u32(seen >= want);
    }
    return chain_lane0(ok, l) == 1u;
}

// Zero the counters of the chain before this one (the workgroup that takes the first
// item of the first phase with items does it: `chain_first`).
fn chain_clear(l: u32) {
    for (var i = 0u; l == 0u && i < chain.clear_n; i++) {
        atomicStore(&chain_counts[chain.clear + i], 0u);
    }
}

// Item i of phase k as its kernel's workgroup id.
fn chain_wid(k: u32, i: u32) -> vec3<u32> {
    let g = chain.grid[k];
    return vec3<u32>(i % g.x, (i / g.x) % g.y, i / (g.x * g.y));
}

// Reads each wait may take this step: what the trip budget leaves after the most work a
// workgroup could take at this step's cached positions, shared among the phases
// (`Run::spin` in ops/chain/runs.rs), at most `spin`.
fn chain_spin() -> u32 {
    let n_kv = step[chain_zero].n_kv;
    let kv = select(chain.kv_8 * ((min(n_kv, chain.kv_max) + 7u) / 8u), 0u, n_kv > chain.kv_max);
    return min(chain.spin, (chain.left - min(kv, chain.left)) / max(chain.phases, 1u));
}

// Phase k's items this step: none for an optional phase 0 past its positions.
fn chain_items(k: u32) -> u32 {
    let skipped = k == 0u && step[chain_zero].n_kv > chain.kv_max;
    return select(chain.grid[k].w, 0u, skipped);
}

// The first phase with items, whose first item zeroes the chain before's counters.
fn chain_first() -> u32 {
    return select(0u, 1u, chain_items(0u) == 0u);
}

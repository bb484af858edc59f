//! Recording a step with its chains.

use super::*;

/// [`crate::ops::record_plan`], with the chains of `plan` in one dispatch each where `step`
/// runs them ([`Chains::run_in`]).
pub fn record_plan(
    enc: &mut wgpu::CommandEncoder,
    plan: &[Dispatch],
    chains: &Chains,
    step: &StepInfo,
) -> Result<()> {
    if step.n_tokens == 1 {
        chains.start()?;
    }
    let pipelines = match chains.pipelines()? {
        Some(p) if chains.run_in(plan, step) => p,
        _ => return crate::ops::record_plan(enc, plan, step),
    };
    chains
        .steps
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut passes = crate::ops::StepPasses::begin(enc);
    let mut next = chains.chains.iter().peekable();
    let mut i = 0;
    while i < plan.len() {
        // A chain dispatches after what its range records apart (`Chain::lead_apart`),
        // which the loop records as any other dispatch.
        if let Some(c) = next.next_if(|c| c.lead_apart(step).end == i) {
            let pass = passes.pass(enc);
            pass.set_pipeline(&pipelines[c.build]);
            pass.set_bind_group(0, &c.bind_group, &[]);
            pass.dispatch_workgroups(chains.workgroups, 1, 1);
            i = c.range.end;
            continue;
        }
        passes.record(enc, &plan[i], step)?;
        i += 1;
    }
    Ok(())
}

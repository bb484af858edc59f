//! The chains' unit tests: runs' trip budgets, and the parameter block against its
//! shader (the shapes' choice is tested in shape.rs).

use super::*;
use crate::gpu::wgsl_layout::wgsl_mirror;

#[test]
fn a_run_leaves_its_waits_the_trips_its_work_does_not_take() {
    let run = |work, phases: usize| Run {
        range: 0..phases,
        members: (0..phases).collect(),
        grids: vec![[1, 1, 1]; phases],
        work,
        bindings: Bindings::CHAIN,
        kv: None,
    };
    assert_eq!(run(1000, 4).spin(0), MAX_SPIN);
    let tight = run(60_000, 4);
    assert_eq!(
        tight.spin(0),
        (TRIP_BUDGET - 60_000 - 4 * TRIPS_PER_PHASE - 64) / 4
    );
    assert!(tight.spin(0) >= MIN_SPIN);
    assert_eq!(run(70_000, 2).spin(0), 0);
}

#[test]
fn a_run_led_by_attention_keeps_its_waits_within_the_budget_up_to_its_limit() {
    let run = |max_kv| Run {
        range: 0..5,
        members: (0..5).collect(),
        grids: vec![[3, 1, 1]; 5],
        work: 30_000,
        bindings: Bindings::CHAIN,
        kv: Some((3, KvTrips { per_8: 37, max_kv })),
    };
    let r = run(4096);
    let limit = r.kv_max().unwrap();
    assert!((KV_MIN..4096).contains(&limit));
    // At the limit every wait still gets its fewest reads, and the work and the
    // waits stay within the budget; one position past it, the phase runs apart.
    assert!(r.spin(limit) >= MIN_SPIN);
    assert!(r.fixed() + r.kv_work(limit) + 5 * r.spin(limit) <= TRIP_BUDGET);
    assert!(r.kv_work(limit + 8) + r.fixed() + 5 * MIN_SPIN > TRIP_BUDGET);
    assert!(r.spin(limit + 1) > r.spin(limit));
    // The kernel's own limit caps it.
    assert_eq!(run(1000).kv_max(), Some(1000));
}

#[test]
fn params_mirror_the_shader() {
    wgsl_mirror!(super::ChainParams, "common/chain.wgsl", "ChainParams", {
        base, clear, clear_n, spin, kv_max, left, kv_8, phases, zero, grid
    });
    wgsl_mirror!(crate::ops::StepInfo, "common/chain.wgsl", "ChainStep", {
        n_tokens,
        pos,
        n_kv,
    });
}

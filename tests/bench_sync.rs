//! `wgllm-bench sync`: a chain of dependent steps as a dispatch per step and as phases
//! of one dispatch, every run checked by the tool (a phase that read its predecessor
//! unfinished, or that the driver's loop limiter cut short, fails it), with more
//! workgroups than the driver runs at once as well as fewer.

mod common;

use common::{bench, bench_json};

#[test]
fn phases_of_one_dispatch_keep_their_order() {
    let doc = bench_json(&[
        "sync",
        "--phases",
        "60",
        "--items",
        "12",
        "--workgroups",
        "1,2,5,40",
        "--reps",
        "2",
        "--json",
    ]);
    let results = doc["results"].as_array().unwrap();
    let chains: Vec<(&str, u64)> = results
        .iter()
        .map(|r| {
            (
                r["chain"].as_str().unwrap(),
                r["workgroups"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        chains,
        [
            ("a dispatch per phase", 12),
            ("one dispatch", 1),
            ("one dispatch", 2),
            ("one dispatch", 5),
            ("one dispatch", 40),
        ],
        "{doc}"
    );
    for r in results {
        let us = r["us_per_phase"].as_f64().unwrap();
        assert!(us > 0.0 && us.is_finite(), "{doc}");
    }
}

#[test]
fn work_beyond_the_loop_budget_is_refused() {
    // 1024 phases of 64 items would leave a workgroup no loop trips for waiting.
    let out = bench(&["sync", "--phases", "1024", "--items", "64"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("1024 phases of 64 items"), "{err}");
    let out = bench(&["sync", "--phases", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--phases 0 is outside 1..=1024"), "{err}");
}

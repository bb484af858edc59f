//! `wgllm-bench kernels --per-pass N`: several products to a timed pass, each reported
//! at the pass's time over N, and a count outside 1..=64 refused with a message.

mod common;

use common::{bench, bench_json};

/// The median per product of one Q4_0 576x1536 product timed `per_pass` to a pass.
fn median_ms(per_pass: &str) -> f64 {
    let doc = bench_json(&[
        "kernels",
        "--type",
        "q4_0",
        "--shape",
        "576x1536",
        "--batch",
        "1",
        "--variant",
        "row",
        "--reps",
        "3",
        "--per-pass",
        per_pass,
        "--json",
    ]);
    assert_eq!(doc["per_pass"], per_pass.parse::<u32>().unwrap(), "{doc}");
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{doc}");
    assert_eq!(results[0]["status"], "ok", "{doc}");
    let ms = results[0]["median_ms"].as_f64().unwrap();
    assert!(ms > 0.0 && ms.is_finite(), "{doc}");
    ms
}

#[test]
fn products_share_a_timed_pass() {
    // Eight products to a pass are reported per product: near one product's time, not
    // eight times it (a wide margin, as the two runs share a noisy machine).
    let one = median_ms("1");
    let eight = median_ms("8");
    assert!(
        eight < 4.0 * one,
        "8 per pass: {eight} ms a product, 1: {one} ms"
    );
}

#[test]
fn a_count_outside_the_range_is_refused() {
    for n in ["0", "65"] {
        let out = bench(&["kernels", "--per-pass", n]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--per-pass"), "{err}");
    }
}

//! `wgllm run` at the edges of its limits, with the real SmolLM2 model: a prompt longer
//! than the context, generation past it, an empty prompt, a prompt of special tokens
//! only, a context past the trained one, and Ctrl-C during generation.
//!
//! Every case runs on the CPU backend (`--gpu-layers 0`) and generates a few tokens at
//! most.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
        .to_string_lossy()
        .into_owned()
}

/// `wgllm run -m SmolLM2 --quiet --temp 0 <args>`, with a runtime folder.
fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_wgllm"));
    let m = model();
    // The CPU backend: these cases are about the CLI, and it is the faster one here.
    cmd.args([
        "run",
        "-m",
        &m,
        "--quiet",
        "--temp",
        "0",
        "--gpu-layers",
        "0",
    ])
    .args(args);
    common::with_runtime_dir(&mut cmd);
    cmd
}

fn run(args: &[&str]) -> Output {
    command(args).output().unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The `--json` object of a successful run.
fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "failed: {}", stderr(out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn ids(v: &serde_json::Value, key: &str) -> Vec<u64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key} in {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

#[test]
fn a_prompt_longer_than_the_context_is_an_error() {
    let prompt = "The quick brown fox jumps over the lazy dog. ".repeat(8);
    let out = run(&["-c", "16", "-p", &prompt, "-n", "1"]);
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(line.contains("context only 16"), "{line}");
    assert!(line.contains("raise -c"), "{line}");
}

#[test]
fn generation_stops_at_the_end_of_the_context() {
    // "Hello, my name is" is 5 tokens; a context of 8 leaves room for 3.
    let out = run(&["-c", "8", "-p", "Hello, my name is", "-n", "50", "--json"]);
    let err = stderr(&out);
    assert!(
        err.contains("warning: -n 50 exceeds the context; generating at most 3 tokens"),
        "{err}"
    );
    let v = json(&out);
    let prompt = ids(&v, "prompt_tokens");
    let gen = ids(&v, "tokens");
    assert_eq!(prompt.len(), 5);
    assert!(gen.len() <= 3, "{gen:?}");
    assert!(prompt.len() + gen.len() <= 8);
}

#[test]
fn an_empty_prompt_starts_from_bos() {
    // SmolLM2 does not add BOS to prompts but has one (<|im_start|>, id 1).
    let out = run(&["-p", "", "-n", "2", "-c", "32", "--json"]);
    let v = json(&out);
    assert_eq!(ids(&v, "prompt_tokens"), vec![1]);
    assert!(ids(&v, "tokens").len() <= 2);
}

#[test]
fn a_prompt_of_special_tokens_only() {
    let out = run(&[
        "-p",
        "<|im_start|><|im_end|>",
        "-n",
        "2",
        "-c",
        "32",
        "--json",
    ]);
    let v = json(&out);
    assert_eq!(ids(&v, "prompt_tokens"), vec![1, 2]);
    assert!(ids(&v, "tokens").len() <= 2);
}

#[test]
fn a_context_past_the_trained_one_warns() {
    // SmolLM2 was trained with 8192 positions.
    let out = run(&["-c", "8200", "-p", "Hi", "-n", "1", "--json"]);
    let err = stderr(&out);
    assert!(
        err.contains("warning: context 8200 is larger than the model's trained context 8192"),
        "{err}"
    );
    let v = json(&out);
    assert!(ids(&v, "tokens").len() <= 1);
}

/// Without -c, a bounded request gets the context it needs (prompt, tokens and one more,
/// rounded up to 256; at most the 4096 default); -c wins when given.
#[test]
fn the_context_follows_the_request() {
    let n_ctx = |args: &[&str]| json(&run(args))["n_ctx"].as_u64();
    assert_eq!(n_ctx(&["-p", "Hi", "-n", "3", "--json"]), Some(256));
    assert_eq!(n_ctx(&["-p", "Hi", "-n", "300", "--json"]), Some(512));
    assert_eq!(
        n_ctx(&["-p", "Hi", "-n", "1", "-c", "1000", "--json"]),
        Some(1000)
    );
}

#[test]
fn ctrl_c_stops_generation_and_prints_the_stats() {
    let mut child = command(&["-p", "Once upon a time", "-n", "-1", "-c", "256"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first generated text, then interrupt.
    let mut stdout = child.stdout.take().unwrap();
    let started = Instant::now();
    let mut first = [0u8; 1];
    let n = stdout.read(&mut first).unwrap();
    assert_eq!(n, 1, "no output before the stream closed");
    assert!(started.elapsed() < Duration::from_secs(300));
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let reader = std::thread::spawn(move || {
        let mut rest = Vec::new();
        let _ = stdout.read_to_end(&mut rest);
        rest
    });
    let stderr_pipe = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        BufReader::new(stderr_pipe)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    // One more token at most should follow the interrupt; never wait forever.
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still generating 240 s after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = reader.join();
    let err_lines = err_reader.join().unwrap();
    let err = err_lines.join("\n");
    assert!(status.success(), "exit {status}: {err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(err.contains("generation:"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

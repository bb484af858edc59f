//! `wgllm chat` driven through stdin on the real SmolLM2 model (CPU, greedy, short
//! replies), and the prompt text a two-turn Gemma conversation renders to.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use wgllm::chat::{ChatTemplate, Message};
use wgllm::gguf::GgufFile;

fn model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name)
}

/// `(processed, cached, generated)` from a `[turn N: …]` line of `wgllm chat`.
fn turn_stats(stderr: &str, n: u32) -> (u64, u64, u64) {
    let prefix = format!("[turn {n}: ");
    let line = stderr
        .lines()
        .find_map(|l| l.find(&prefix).map(|i| &l[i + prefix.len()..]))
        .unwrap_or_else(|| panic!("no {prefix:?} line in stderr:\n{stderr}"));
    // "12 prompt tokens processed, 0 from cache; 8 generated; 0.3 s]"
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit() && c != '.')
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(nums.len() >= 3, "cannot read {line:?}");
    (nums[0], nums[1], nums[2])
}

#[test]
fn two_turns_keep_the_cache_and_exit_cleanly() {
    let xdg = std::env::temp_dir().join(format!("wgllm-xdg-chat-{}", std::process::id()));
    std::fs::create_dir_all(&xdg).unwrap();
    let m = model("SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut child = Command::new(env!("CARGO_BIN_EXE_wgllm"))
        .args(["chat", "-m"])
        .arg(&m)
        .args(["--gpu-layers", "0", "--temp", "0", "-n", "8", "-c", "512"])
        .env("XDG_RUNTIME_DIR", &xdg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start wgllm");
    {
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(b"What is the capital of France?\nAnd of Italy?\n/exit\n")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exit {:?}; stderr:\n{stderr}",
        out.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    // Each reply ends with a newline on stdout; greedy SmolLM2 answers both.
    let replies: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(replies.len() >= 2, "want two replies, stdout:\n{stdout}");

    let (p1, c1, g1) = turn_stats(&stderr, 1);
    let (p2, c2, g2) = turn_stats(&stderr, 2);
    assert_eq!(c1, 0, "the first turn starts from an empty cache");
    assert!(
        p1 > 10,
        "the first turn processes the system prompt and question"
    );
    assert!(g1 > 0 && g2 > 0, "both turns generate: {g1}, {g2}");
    // The second turn reuses everything the first left in the cache (its prompt and its
    // reply) and processes only the new text.
    assert_eq!(
        c2,
        p1 + g1,
        "turn 2 does not start from turn 1's cache:\n{stderr}"
    );
    assert!(
        p2 < p1,
        "turn 2 processed {p2} tokens, turn 1 {p1}:\n{stderr}"
    );
    assert!(stderr.contains("prompt:"), "no summary line:\n{stderr}");
    assert!(!stderr.contains("[turn 3"), "/exit did not end the session");
}

#[test]
fn gemma_two_turn_prompt_renders_gemma_turns() {
    let path = model("gemma-3-270m-q4_k_m.gguf");
    let f = GgufFile::open(&path).expect("Gemma model (see models/)");
    let md = f.metadata();
    let src = md.get_str("tokenizer.chat_template").unwrap();
    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    let bos = tokens[md.require_u32("tokenizer.ggml.bos_token_id").unwrap() as usize];
    let eos = tokens[md.require_u32("tokenizer.ggml.eos_token_id").unwrap() as usize];
    let t = ChatTemplate::new(src, "gemma3", bos, eos).unwrap();

    let first = vec![Message::new("user", "Hello")];
    assert_eq!(
        t.render(&first, true).unwrap(),
        "<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n"
    );
    let mut two = first.clone();
    two.push(Message::new("assistant", "Hi! How can I help?"));
    two.push(Message::new("user", "Name a color."));
    assert_eq!(
        t.render(&two, true).unwrap(),
        "<bos><start_of_turn>user\nHello<end_of_turn>\n\
         <start_of_turn>model\nHi! How can I help?<end_of_turn>\n\
         <start_of_turn>user\nName a color.<end_of_turn>\n\
         <start_of_turn>model\n"
    );
    // The second turn's new text: everything after the first exchange.
    assert_eq!(
        t.render_delta(&two[..2], &two).unwrap(),
        "<start_of_turn>user\nName a color.<end_of_turn>\n<start_of_turn>model\n"
    );
}

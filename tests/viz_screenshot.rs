//! End-to-end check of `wgllm-viz`: a headless run under Xvfb on lavapipe generates two
//! tokens with SmolLM2, renders the chips and the attention view offscreen and writes a
//! PNG of the requested size that actually shows something.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(MODEL)
}

/// (width, height, RGBA pixels) of an 8-bit RGBA PNG.
fn read_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::fs::File::open(path).unwrap();
    let decoder = png::Decoder::new(std::io::BufReader::new(file));
    let mut reader = decoder.read_info().unwrap();
    let size = reader.output_buffer_size().unwrap();
    let mut buf = vec![0; size];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgba);
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

/// `xvfb-run -a` picks a free display number racily: run one at a time.
static XVFB: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run_viz(args: &[&str]) -> std::process::Output {
    let _one = XVFB.lock().unwrap_or_else(|e| e.into_inner());
    let xdg = std::env::temp_dir().join("wgllm-viz-test-xdg");
    std::fs::create_dir_all(&xdg).unwrap();
    // An X authority file of our own: without one, xvfb-run makes a temporary
    // directory for it and exits 5 when removing that directory fails at the end, which
    // it did now and then, failing a run whose program had done right.
    let auth = xdg.join("Xauthority");
    std::fs::write(&auth, b"").unwrap();
    Command::new("xvfb-run")
        .arg("-a")
        .arg("-f")
        .arg(&auth)
        .arg(env!("CARGO_BIN_EXE_wgllm-viz"))
        .args(args)
        .env("WGPU_BACKEND", "vulkan")
        .env("XDG_RUNTIME_DIR", &xdg)
        .output()
        .expect("xvfb-run must be installed (Debian package xvfb; tools/setup installs it)")
}

#[test]
fn screenshot_shows_chips_and_heatmap() {
    let out = std::env::temp_dir().join(format!("wgllm-viz-test-{}.png", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let model = model_path();
    let res = run_viz(&[
        "-m",
        model.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--tokens",
        "2",
        "--temp",
        "0",
        "-c",
        "128",
        "--size",
        "1000x700",
        "--screenshot",
        out.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "wgllm-viz failed: {stderr}");
    // Greedy SmolLM2 continues the prompt with " Paris" (llama.cpp agrees); the binary
    // prints the whole sequence.
    let stdout = String::from_utf8_lossy(&res.stdout);
    assert!(stdout.contains("The capital of France is"), "{stdout}");

    let (w, h, px) = read_png(&out);
    assert_eq!((w, h), (1000, 700));
    assert_eq!(px.len(), 1000 * 700 * 4);
    let colors: HashSet<[u8; 4]> = px
        .chunks_exact(4)
        .map(|p| [p[0], p[1], p[2], p[3]])
        .collect();
    // Text, panels, chips in several colours and a heatmap: far more than a blank frame.
    assert!(colors.len() > 50, "only {} distinct colours", colors.len());
    // The chip palette's pastel greens/yellows/reds (blue channel 110) are present, as are
    // the heatmap's dark blues: count pixels of each family.
    let chip = px
        .chunks_exact(4)
        .filter(|p| p[2] == 110 && p[0] > 130 && p[1] > 100)
        .count();
    assert!(chip > 200, "no token chips drawn ({chip} chip pixels)");
    let _ = std::fs::remove_file(&out);
}

#[test]
fn bad_model_file_is_an_error_not_a_crash() {
    let dir = std::env::temp_dir().join(format!("wgllm-viz-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00garbage").unwrap();
    let png = dir.join("never.png");
    let res = run_viz(&[
        "-m",
        bad.to_str().unwrap(),
        "--tokens",
        "1",
        "--screenshot",
        png.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&res.stderr);
    assert_eq!(res.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cannot load the model"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!png.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

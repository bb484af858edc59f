#!/usr/bin/env bash
# Kernel and model benchmarks on a machine with a GPU. Builds release, then writes
# reports under $OUT (or ./bench-out): the device's read peak, kernel variants over
# real model shapes (JSON + comparison table) and pp/tg throughput of the real models.
# Meant to finish in well under 8 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./bench-out}"
mkdir -p "$OUT"
# A Vulkan loader unpacked from .deb files (no root needed) is used when present.
if [ -d .gl/usr/lib/x86_64-linux-gnu ]; then
  export LD_LIBRARY_PATH=".gl/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
fi
cargo build --release --bin wgllm-bench --bin wgllm 2>&1 | tail -2
B=./target/release/wgllm-bench
./target/release/wgllm devices > "$OUT/devices.txt" 2>&1 || true
timeout 60 $B peak --all --mib 256 > "$OUT/peak.md" 2>&1 || true
timeout 240 $B kernels --full --reps 10 --json > "$OUT/kernels.json" 2> "$OUT/kernels.err" || true
timeout 120 $B kernels --full --reps 5 --batch 1 --compare > "$OUT/kernels-compare.md" 2>&1 || true
for m in models/*.gguf; do
  [ -f "$m" ] || continue
  for v in sg wg ks; do
    WGLLM_MUL_MAT=$v timeout 60 $B model -m "$m" -p 512 -n 128 -r 3 > "$OUT/model-$(basename "$m" .gguf)-$v.md" 2>&1 || true
  done
done
echo "reports in $OUT"
ls -la "$OUT"

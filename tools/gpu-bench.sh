#!/usr/bin/env bash
# Kernel and model benchmarks on a machine with a GPU, in order of what matters most,
# each step under its own time limit so that one slow step cannot eat the rest:
#   1. the adapters, and the device's read peak over every probe;
#   2. every quantized matvec (batch 1) over real model shapes, checked, then timed
#      against the peak (with SAVE=1, the fastest correct variant per type saved for
#      the adapter, which the model runs then use instead of the defaults);
#   3. pp/tg of the real models in models/ when present, else of synthetic 1B- and
#      8B-shaped Q4_K_M files written here, with where the host's time goes, beside
#      llama.cpp's llama-bench on the same file when LLAMA_BENCH names one (its
#      libraries beside it); then each model's decode step per kernel (WGLLM_PROFILE);
#      then sampled generation with top-k chosen on the device and on the host;
#   4. the batch-1 products again, eight to a timed pass (`--per-pass`);
#   5. weight upload against the device's write bandwidth;
#   6. the prompt kernels (batch 16 and 64).
# Reports go to $OUT (default ./bench-out): report.md, and err.log for what steps said
# on stderr. Binaries come from WGLLM_BIN (a folder holding wgllm and wgllm-bench)
# when set, else from a release build here. Meant to finish in under 7 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./bench-out}"
mkdir -p "$OUT"
R="$OUT/report.md"
E="$OUT/err.log"
: >"$R"
: >"$E"
if [ -n "${WGLLM_BIN:-}" ]; then
  BIN="$WGLLM_BIN"
else
  cargo build --release --bin wgllm-bench --bin wgllm 2>&1 | tail -2
  BIN=./target/release
fi
B="$BIN/wgllm-bench"
COLD_MIB="${COLD_MIB:-512}"
TYPES=q4_0,q4_1,q5_0,q8_0,q4_k,q5_k,q6_k,f16
SYNTH_DIR="${SYNTH_DIR:-/tmp}"

# step TITLE SECONDS COMMAND...: runs COMMAND under a time limit, its stdout into the
# report under TITLE, with the seconds it took.
step() {
  local title=$1 limit=$2
  shift 2
  local t0=$SECONDS
  {
    echo "## $title"
    echo
    echo "\`$*\`"
    echo
  } >>"$R"
  echo "== $title" >>"$E"
  timeout "$limit" "$@" >>"$R" 2>>"$E"
  local rc=$?
  echo >>"$R"
  echo "(exit $rc, $((SECONDS - t0)) s)" >>"$R"
  echo >>"$R"
  echo "$title: exit $rc, $((SECONDS - t0)) s"
}

step "Adapters" 30 "$BIN/wgllm" devices
command -v nvidia-smi >/dev/null && step "nvidia-smi" 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv
step "Read peak, every probe" 60 "$B" peak --all --mib "$COLD_MIB"
# A tuning file chosen from single products alone would override what they do not
# show: the tiled product in batches, the GLU store of single tokens.
SAVE_FLAG=()
[ "${SAVE:-0}" = 1 ] && SAVE_FLAG=(--save)
step "Quantized matvecs, batch 1" 120 "$B" kernels --full --batch 1 --reps 10 \
  --cold-mib "$COLD_MIB" --type "$TYPES" "${SAVE_FLAG[@]}"

models=(models/*.gguf)
if [ ! -f "${models[0]}" ]; then
  models=()
  for size in 1b 8b; do
    f="$SYNTH_DIR/synth-$size-q4_k_m.gguf"
    [ -f "$f" ] || timeout 120 "$B" synth --size "$size" --type q4_k_m -o "$f" >/dev/null 2>>"$E"
    [ -f "$f" ] && models+=("$f")
  done
fi
for m in "${models[@]}"; do
  name=$(basename "$m" .gguf)
  # The host's times and the profile are printed on stderr: into the report too.
  step "wgllm: $name" 75 env WGLLM_HOST_TIMES=1 bash -c '"$0" "$@" 2>&1' \
    "$B" model -m "$m" -p 512 -n 128 -r 3
  if [ -n "${LLAMA_BENCH:-}" ]; then
    step "llama.cpp: $name" 75 env LD_LIBRARY_PATH="$(dirname "$LLAMA_BENCH"):${LD_LIBRARY_PATH:-}" \
      "$LLAMA_BENCH" -m "$m" -ngl 99 -p 512 -n 128 -r 3
  fi
done
# Sampled generation (temperature 0.8, top-k 40) with the candidates chosen on the
# device, then on the host from every logit read back, twice over.
for m in "${models[@]}"; do
  step "wgllm sampled, top-k on the device / the host: $(basename "$m" .gguf)" 60 bash -c '
    for i in 1 2; do for where in device host; do
      printf "%s: " "$where"
      WGLLM_TOP_K=$where "$0" run -m "$1" -p "The history of the Roman empire" -n 128 \
        --temp 0.8 --seed 1 2>&1 >/dev/null | tail -1
    done; done' "$BIN/wgllm" "$m"
done
# Each dispatch in a timed pass of its own: shares, not speed.
for m in "${models[@]}"; do
  step "wgllm decode step per kernel: $(basename "$m" .gguf)" 45 env WGLLM_PROFILE=1 \
    bash -c '"$0" "$@" 2>&1' "$B" model -m "$m" -p 0 -n 16 -r 1
done

# The same products eight to a timed pass: the per-pass cost (25-28 us on an H200,
# docs/perf.md) left out, as a decode step's stream of dispatches sees them.
step "Quantized matvecs, batch 1, eight per pass" 90 "$B" kernels --full --batch 1 --reps 5 \
  --per-pass 8 --variant row,wg,mr,ks --cold-mib "$COLD_MIB" --type "$TYPES"
step "Weight upload" 60 "$B" upload --mib 1024
step "Quantized products, batch 16 and 64" 90 "$B" kernels --full --batch 16,64 --reps 5 --variant wg,sg,mr \
  --cold-mib "$COLD_MIB" --type "$TYPES"
echo "reports in $OUT"

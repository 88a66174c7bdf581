#!/usr/bin/env bash
# The GPU validation run (issue 12 item 8), prepared as one command for a machine with an
# NVIDIA GPU: `validate profile` and `validate all` with `--compute cuda`.
#
# Here (the build machine, no GPU needed):
#   cargo build --release --features cuda
#   mkdir -p .device-bin && cp target/release/moonagent .device-bin/   # .device-bin is ignored
# There (the session's `device` tool; the binary travels as a carried path):
#   run(command="BUDGET_S=300 bash scripts/device_validate.sh .device-bin/moonagent",
#       carry=[".device-bin"], timeout_s=340)
# A session's device time is 15 minutes in all (2026-12-06), the machine's start included,
# so a 300 s budget leaves room to run it again; with more time, BUDGET_S=520 and
# timeout_s=580 give the 7B study 16 requests a run instead of 8 and the scaled study
# three repeats.
# Anywhere with a GPU: bash scripts/device_validate.sh [BIN] [OUTDIR]
#
# What it runs, each step under its own time limit so that one slow step cannot take the
# others' time (the steps end within BUDGET_S, default 520 s):
#   1. nvidia-smi: the device as the driver reports it
#   2. the compute_cuda test binary, if one was carried beside BIN (CUDA against the CPU
#      backend, also from 4 threads at once):
#        cargo test --release --features cuda -p moonagent-validation --test compute_cuda --no-run
#        cp target/release/deps/compute_cuda-<hash> .device-bin/compute_cuda
#      and compute_timing (the host's attention on every core against serial, medians):
#        cargo build --release -p moonagent-validation --example compute_timing
#        cp target/release/examples/compute_timing .device-bin/
#   3. validate profile --compute cuda --base h200 on the scaled model (qwen2.5-vl-tiny)
#   4. validate all --compute cuda --base h200 --model qwen2.5-vl-7b: profile -> runs ->
#      compare on the real model's shapes (random weights: 8.3 G f32 parameters, ~33 GB of
#      host and again of device memory), B0 and B3, one repeat of a short trace
#   5. validate all --compute cuda --base h200 --requests 120 on the scaled model, three
#      repeats if the time left allows, else one
# If step 3 fails, libs.log records where the CUDA libraries are, for a rerun.
# Results: OUTDIR (default $OUT, else ./device-validate) gets summary.md (every step's exit
# status, time and last lines), the reports (report-*.md) and results.tgz (every output
# folder), which is what `device` brings back (at most 8 files, 2 folders deep).
#
# cuBLAS: cudarc loads libcublas by name at run time. Where CUDA comes as pip wheels (the
# device image's PyTorch), their lib folders are put on LD_LIBRARY_PATH first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=${1:-target/release/moonagent}
OUTDIR=${2:-${OUT:-device-validate}}
mkdir -p "$OUTDIR"
WORK=$(mktemp -d)
SUMMARY=$OUTDIR/summary.md
t0=$(date +%s)
# Seconds the steps may take in all (the device call should allow ~40 more).
BUDGET_S=${BUDGET_S:-520}

if [[ ! -x $BIN ]]; then
  echo "error: $BIN is not an executable moonagent (build it with --features cuda)" | tee "$SUMMARY"
  exit 2
fi

# CUDA libraries shipped as Python wheels (nvidia-cublas and friends), then the toolkit's.
for py in python3 /opt/torch/.venv/bin/python3; do
  libs=$("$py" - 2>/dev/null <<'EOF'
import glob, os
try:
    import nvidia
except ImportError:
    raise SystemExit
dirs = set()
for base in nvidia.__path__:
    dirs.update(os.path.dirname(p) for p in glob.glob(os.path.join(base, "*", "lib", "*.so*")))
print(":".join(sorted(dirs)))
EOF
  ) && [[ -n $libs ]] && { export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; break; }
done
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
# cudarc (built for CUDA 12 names) asks for libcublas.so, .so.12, .so.11 ...; a CUDA 13
# install ships only libcublas.so.13. The calls the backend makes (cublasCreate_v2,
# cublasSetStream_v2, cublasSgemm_v2) are in both, so link the unversioned name to it.
IFS=: read -ra LD_DIRS <<< "${LD_LIBRARY_PATH:-}"
have_name() { local d; for d in "${LD_DIRS[@]}"; do [[ -e $d/$1 ]] && return 0; done; return 1; }
if ! have_name libcublas.so && ! have_name libcublas.so.12; then
  for d in "${LD_DIRS[@]}"; do
    f=$(ls "$d"/libcublas.so.* 2>/dev/null | head -1)
    if [[ -n $f ]]; then
      mkdir -p "$WORK/lib" && ln -sf "$f" "$WORK/lib/libcublas.so"
      export LD_LIBRARY_PATH="$WORK/lib:${LD_LIBRARY_PATH:-}"
      CUBLAS_LINK="$WORK/lib/libcublas.so -> $f"
      break
    fi
  done
fi

{
  echo "# moonagent: the GPU validation run"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- binary: $BIN ($("$BIN" --version 2>&1 | head -1))"
  echo "- host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  echo "- LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
  echo "- libcublas found: $(ls "${LD_DIRS[@]}" 2>/dev/null | grep -m1 '^libcublas\.so' || echo none)"
  echo "- libcublas linked: ${CUBLAS_LINK:-no}"
  echo
  echo "| step | exit | seconds | what |"
  echo "|---|---|---|---|"
} > "$SUMMARY"

# step NAME LIMIT_S CMD...: run CMD under `timeout`, log to WORK/NAME.log, add a row.
step() {
  local name=$1 limit=$2
  shift 2
  local s=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" > "$WORK/$name.log" 2>&1
  local rc=$?
  echo "| $name | $rc | $(( $(date +%s) - s )) | \`${*#"$BIN "}\` |" >> "$SUMMARY"
  return $rc
}
left() { echo $(( BUDGET_S - ($(date +%s) - t0) )); }

nvidia-smi > "$WORK/nvidia-smi.log" 2>&1
TEST_BIN=$(dirname "$BIN")/compute_cuda
[[ -x $TEST_BIN ]] && step test-cuda 60 "$TEST_BIN" --test-threads 1
TIMING_BIN=$(dirname "$BIN")/compute_timing
[[ -x $TIMING_BIN ]] && step timing 40 "$TIMING_BIN" 10
step profile-tiny 90 "$BIN" validate profile --compute cuda --base h200 \
  --model qwen2.5-vl-tiny --out "$WORK/profile-tiny"
ok_tiny=$?
if [[ $ok_tiny != 0 ]]; then
  # What a rerun needs to know: where the libraries are and what the driver says.
  { ldconfig -p | grep -i -E 'cublas|libcuda'; find / -xdev -name 'libcublas*.so*' 2>/dev/null | head -20
    ls -la /usr/local/cuda* 2>&1 | head -20; } > "$WORK/libs.log" 2>&1
fi
if [[ $ok_tiny == 0 ]]; then
  # The real model's shapes first (what no CPU can run), then as much of the scaled
  # model's study as the time left allows.
  # Its length is an estimate (~1 request/s of B3 capacity with host attention: ~60 s of
  # profile and ~170 s of runs for 16 requests per run).
  # Under a short budget (BUDGET_S=300) it gets 8 requests a run, which the estimate puts
  # at ~60 s of profile and ~90 s of runs.
  if [[ $(left) -gt 440 ]]; then n7b=16 lim7b=330; else n7b=8 lim7b=$(( $(left) - 110 )); fi
  [[ $(left) -gt 120 ]] && step all-7b $lim7b "$BIN" \
    validate all --compute cuda --base h200 --model qwen2.5-vl-7b --requests $n7b --repeats 1 \
    --out "$WORK/all-7b"
  if [[ $(left) -gt 300 ]]; then reps=3; else reps=1; fi
  [[ $(left) -gt 110 ]] && step all-tiny-r$reps $(( $(left) - 10 )) "$BIN" validate all \
    --compute cuda --base h200 --requests 120 --repeats $reps --out "$WORK/all-tiny"
fi

{
  echo
  for f in "$WORK"/*.log; do
    echo "## $(basename "$f" .log) (last 40 lines)"
    echo
    echo '```'
    tail -n 40 "$f"
    echo '```'
    echo
  done
} >> "$SUMMARY"
for r in all-7b all-tiny; do
  [[ -f $WORK/$r/report.md ]] && cp "$WORK/$r/report.md" "$OUTDIR/report-$r.md"
done
for r in test-cuda timing profile-tiny; do
  [[ -f $WORK/$r.log ]] && cp "$WORK/$r.log" "$OUTDIR/$r.log"
done
tar czf "$OUTDIR/results.tgz" -C "$WORK" . 2>/dev/null
rm -rf "$WORK"
echo "wrote $OUTDIR ($(( $(date +%s) - t0 )) s)"
cat "$SUMMARY" | head -20

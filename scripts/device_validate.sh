#!/usr/bin/env bash
# The GPU validation run (issue 12 item 8), prepared as one command for a machine with an
# NVIDIA GPU: `validate profile` and `validate all` with `--compute cuda`.
#
# Here (the build machine, no GPU needed):
#   cargo build --release --features cuda
#   mkdir -p .device-bin && cp target/release/moonagent .device-bin/   # .device-bin is ignored
# There (the session's `device` tool; the binary travels as a carried path):
#   run(command="bash scripts/device_validate.sh .device-bin/moonagent", carry=[".device-bin"],
#       timeout_s=540)
# Anywhere with a GPU: bash scripts/device_validate.sh [BIN] [OUTDIR]
#
# What it runs, each step under its own time limit so that one slow step cannot take the
# others' time (the whole script ends within ~8 minutes):
#   1. nvidia-smi: the device as the driver reports it
#   2. validate profile --compute cuda --base h200 on the scaled model (qwen2.5-vl-tiny)
#   3. validate all --compute cuda --base h200 --quick: profile -> runs -> compare, B0 and B3
#   4. validate all --compute cuda --base h200 (the full study: 200 requests per run, 2 loads,
#      3 repeats), if time is left
#   5. validate profile --compute cuda --base h200 --model qwen2.5-vl-7b: the fit on the real
#      model's shapes (random weights: 7B f32 parameters, ~31 GB of host memory)
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

{
  echo "# moonagent: the GPU validation run"
  echo
  echo "- date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- binary: $BIN ($("$BIN" --version 2>&1 | head -1))"
  echo "- host: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  echo "- GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
  echo "- LD_LIBRARY_PATH: ${LD_LIBRARY_PATH:-}"
  echo "- libcublas found: $(ls ${LD_LIBRARY_PATH//:/ } 2>/dev/null | grep -m1 '^libcublas\.so' || echo none)"
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
left() { echo $(( 480 - ($(date +%s) - t0) )); }

nvidia-smi > "$WORK/nvidia-smi.log" 2>&1
step profile-tiny 90 "$BIN" validate profile --compute cuda --base h200 \
  --model qwen2.5-vl-tiny --out "$WORK/profile-tiny"
ok_tiny=$?
if [[ $ok_tiny == 0 ]]; then
  step all-quick 150 "$BIN" validate all --compute cuda --base h200 --quick --out "$WORK/all-quick"
  [[ $(left) -gt 240 ]] && step all-full $(( $(left) - 150 )) "$BIN" validate all --compute cuda \
    --base h200 --out "$WORK/all-full"
  [[ $(left) -gt 60 ]] && step profile-7b $(( $(left) - 20 )) "$BIN" validate profile \
    --compute cuda --base h200 --model qwen2.5-vl-7b --out "$WORK/profile-7b"
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
for r in all-quick all-full; do
  [[ -f $WORK/$r/report.md ]] && cp "$WORK/$r/report.md" "$OUTDIR/report-$r.md"
done
tar czf "$OUTDIR/results.tgz" -C "$WORK" . 2>/dev/null
rm -rf "$WORK"
echo "wrote $OUTDIR ($(( $(date +%s) - t0 )) s)"
cat "$SUMMARY" | head -20

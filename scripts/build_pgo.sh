#!/usr/bin/env bash
# A profile-guided (PGO) release build of the CLI, for long sweeps and replays.
#
#   bash scripts/build_pgo.sh [--no-verify]
#
# 1. builds an instrumented moonagent (target/pgo-gen),
# 2. runs it on a fixed training set: the embedded ladder (W1-W4, every mode) and W1-W4
#    traces generated with seed 7 (not the seeds of the benchmarks in sim/README.md, so
#    the figures are judged on runs the profile did not see), each under every mode, and
#    a store-level replay under every policy,
# 3. merges the profile and builds target/pgo/release/moonagent with it,
# 4. unless --no-verify: runs scripts/golden.sh with the plain release build and the PGO
#    build and requires byte-identical result files (PGO changes code layout and
#    inlining, never what is computed).
#
# Idempotent: a rerun rebuilds the profile from scratch (it is only valid for the
# source it was measured on). Needs llvm-profdata from the toolchain's llvm-tools
# component, added with rustup when missing. Takes two release builds, training runs and
# two golden runs (6-7 minutes on the project's 2-core machine). Not part of the test
# suite: the suite tests the code, this is a build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
verify=1
case "${1:-}" in
  --no-verify) verify=0 ;;
  "") ;;
  *) echo "usage: scripts/build_pgo.sh [--no-verify]" >&2; exit 2 ;;
esac

host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [[ ! -x $profdata ]]; then
  echo "build_pgo: adding the llvm-tools component (for llvm-profdata)" >&2
  rustup component add llvm-tools >&2 || {
    echo "build_pgo: llvm-profdata is missing ($profdata) and 'rustup component add llvm-tools' failed;" >&2
    echo "build_pgo: install the llvm-tools component of $(rustc -V) and rerun" >&2
    exit 1
  }
fi

work="$root/target/pgo-work"
rm -rf "$work"
mkdir -p "$work/raw" "$work/traces"
flags=${RUSTFLAGS:-}

echo "build_pgo: [1/4] instrumented build (target/pgo-gen)" >&2
RUSTFLAGS="$flags -Cprofile-generate=$work/raw" \
  cargo build --release --quiet --target-dir target/pgo-gen -p moonagent
gen="$root/target/pgo-gen/release/moonagent"

echo "build_pgo: [2/4] training runs (log: target/pgo-work/train.log)" >&2
log="$work/train.log"
# Run a training command with its output in the log; on failure, say so and show the
# start of its output (the error comes first, a backtrace after it).
run() {
  local ok=0
  "$gen" "$@" > "$work/run.out" 2>&1 || ok=$?
  cat "$work/run.out" >> "$log"
  if [[ $ok != 0 ]]; then
    echo "build_pgo: training run failed: moonagent $*" >&2
    head -n 20 "$work/run.out" >&2
    exit 1
  fi
}
# One workload: a seed-7 trace of it, simulated under every mode.
train() {
  local w=$1
  shift
  run trace generate "$w" "$@" --seed 7 --no-stats --out "$work/traces/$w.jsonl"
  run simulate --trace "$work/traces/$w.jsonl" --modes b0,b1,b2,b3,full
}
run simulate --requests 2000
train w1 --requests 40000 --rate 150
train w2 --requests 10000
train w3 --requests 10000
train w4 --requests 10000
run replay --trace "$work/traces/w3.jsonl" --capacity 20% --no-trace-cache \
  --policy lru --policy fifo --policy s3-fifo --policy sieve --policy mooncake-default \
  --policy type-aware

echo "build_pgo: [3/4] merging the profile, optimised build (target/pgo)" >&2
"$profdata" merge -o "$work/moonagent.profdata" "$work"/raw/*.profraw
RUSTFLAGS="$flags -Cprofile-use=$work/moonagent.profdata" \
  cargo build --release --quiet --target-dir target/pgo -p moonagent
pgo="$root/target/pgo/release/moonagent"

if [[ $verify == 1 ]]; then
  echo "build_pgo: [4/4] golden outputs, plain release build vs PGO build" >&2
  cargo build --release --quiet -p moonagent
  rm -rf "$work/golden-plain" "$work/golden-pgo"
  # The golden files of build $1 (binary $2) into $work/golden-$1; on failure, the log.
  golden() {
    if ! bash scripts/golden.sh "$work/golden-$1" "$2" > "$work/golden-$1.log" 2>&1; then
      echo "build_pgo: scripts/golden.sh failed with the $1 build:" >&2
      cat "$work/golden-$1.log" >&2
      exit 1
    fi
  }
  golden plain "$root/target/release/moonagent"
  golden pgo "$pgo"
  if ! diff -q "$work/golden-plain/SHA256SUMS" "$work/golden-pgo/SHA256SUMS" > /dev/null; then
    echo "build_pgo: the PGO build's result files differ from the plain build's:" >&2
    diff "$work/golden-plain/SHA256SUMS" "$work/golden-pgo/SHA256SUMS" >&2 || true
    exit 1
  fi
  echo "build_pgo: result files identical ($(wc -l < "$work/golden-pgo/SHA256SUMS") files)" >&2
else
  echo "build_pgo: [4/4] skipped (--no-verify)" >&2
fi
echo "$pgo"

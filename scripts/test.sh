#!/usr/bin/env bash
# moonagent's whole test suite: the README's test command, and what .ci/run calls.
#
#   1. cargo fmt --check and clippy -D warnings on every target
#   2. unit, property and integration tests of every crate
#   3. loom model-checking of the fork's concurrent refcount/release paths (cfg(loom))
#   4. tests against a real Mooncake Store, started by scripts/mooncake.sh and stopped by PID
#
# Shared public traces: tests read them from $MOONAGENT_TRACES (.ci/run points it at
# ../shared/traces). Unset on a laptop, those tests skip with a line naming what is missing.
# MOONAGENT_SKIP_REAL_STORE=1 skips step 4 (no Python / no network to PyPI).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*" >&2; }
t0=$(date +%s)

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "unit, property and integration tests"
cargo test --workspace --quiet

step "loom model checking (cfg(loom), release)"
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test --quiet --release -p moonagent-core --test loom_fork

if [[ ${MOONAGENT_SKIP_REAL_STORE:-0} == 1 ]]; then
  step "real Mooncake Store tests: skipped (MOONAGENT_SKIP_REAL_STORE=1)"
else
  step "real Mooncake Store tests (scripts/mooncake.sh up ... down)"
  bash scripts/mooncake.sh up > target/mooncake.env
  trap 'bash scripts/mooncake.sh down' EXIT
  set -a; . target/mooncake.env; set +a
  cargo test --quiet -p moonagent-validation --test real_mooncake
fi

step "all green in $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# The README's figures (docs/figures/*.svg), each drawn by the command it illustrates:
#
#   ladder.svg               moonagent simulate --out DIR                       (DIR/ladder.svg)
#   replay-sessions.svg      moonagent replay --trace sessions.jsonl ... --plot FILE
#   mooncake-capacity.svg    moonagent repro mooncake-capacity --plot FILE      (needs $MOONAGENT_TRACES)
#   sweep-best.svg           moonagent sweep best DIR --x ... --y ... --slo ... --plot FILE
#
#   bash scripts/figures.sh [OUT_DIR]     (default docs/figures; about 40 s on 2 cores)
#
# MOONAGENT_BIN names the binary; by default `cargo build --release` builds it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=$(mkdir -p "${1:-docs/figures}" && cd "${1:-docs/figures}" && pwd)
BIN=${MOONAGENT_BIN:-}
if [[ -z $BIN ]]; then
  cargo build --quiet --release --bin moonagent
  BIN=${CARGO_TARGET_DIR:-target}/release/moonagent
fi
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
log() { echo "[figures] $*" >&2; }

# Relative paths inside $TMP, so no machine's path lands in a figure's title.
cd "$TMP"
"$BIN" simulate --out ladder > /dev/null
cp ladder/ladder.svg "$OUT/ladder.svg"
log "ladder.svg"

"$BIN" trace generate sessions --no-stats --out sessions.jsonl > /dev/null
"$BIN" replay --trace sessions.jsonl --capacity 5%,10%,20%,40% \
  --policy-config "$ROOT/examples/policies/default.toml" \
  --policy-config "$ROOT/examples/policies/reuse-scale-only.toml" \
  --policy-config "$ROOT/examples/policies/balanced.toml" \
  --policy lru,gdsf,belady --plot "$OUT/replay-sessions.svg" > /dev/null
log "replay-sessions.svg"

if [[ -n ${MOONAGENT_TRACES:-} && -f $MOONAGENT_TRACES/mooncake/conversation_trace.jsonl ]]; then
  "$BIN" repro mooncake-capacity --plot "$OUT/mooncake-capacity.svg" > /dev/null
  log "mooncake-capacity.svg"
else
  log "mooncake-capacity.svg skipped: no \$MOONAGENT_TRACES/mooncake/conversation_trace.jsonl"
fi

"$BIN" sweep run "$ROOT/examples/sweeps/seed002_type_aware.toml" --out seed002 --quiet > /dev/null
"$BIN" sweep best seed002 --x capacity_bytes --y encoder_output.hit_rate:max \
  --slo 'kv_cache.hit_rate>=0.7' --plot "$OUT/sweep-best.svg" > /dev/null
log "sweep-best.svg"
log "figures in $OUT"

#!/usr/bin/env bash
# The inputs of the notebooks in notebooks/: runs the moonagent commands whose tables they
# read, into $MOONAGENT_NB_INPUT (default target/nb-inputs, where the notebooks look).
#
#   bash scripts/nb_inputs.sh [--quick] [ladder|eviction|sweeps|validation]...   (none: all)
#
# ladder      moonagent simulate --out D/ladder/h200; moonagent simulate --hardware b200 --out D/ladder/b200
# eviction    moonagent repro eviction-ablation --out D/eviction/ablation.parquet
#             moonagent repro mooncake-capacity --out D/eviction/mooncake-capacity.parquet
#             moonagent trace generate sessions --out D/eviction/sessions.jsonl
#             moonagent replay --trace D/eviction/sessions.jsonl --capacity 5%,10%,20%,40% \
#               --policy-config examples/policies/{default,grace-only,reuse-scale-only,balanced}.toml \
#               --policy lru,gdsf,belady --out D/eviction/sessions-capacity.parquet
# sweeps      moonagent sweep run examples/sweeps/seed002_type_aware.toml --out D/sweeps/seed002
#             moonagent sweep best D/sweeps/seed002 --x capacity_bytes --y encoder_output.hit_rate:max \
#               --slo kv_cache.hit_rate>=0.7 --json > D/sweeps/seed002/best.json
# validation  moonagent validate all --out D/validation
#             (the real backend: profile, runs at 20% and 70% of capacity, 3 repeats, B0 and
#             B3, compared with the simulator; ~5 min, real time: the runs replay arrivals)
#
# --quick: small sizes, what scripts/test_notebooks.sh runs (seconds on a debug build):
# 200 requests per ladder workload, 40 sessions, the first 3,000 requests of the Mooncake
# trace (or a small synthetic trace in its format when $MOONAGENT_TRACES has none), a
# 2 x 2 x 2 sweep with 2 seeds, and `validate all --quick --loads 0.7 --modes b3` (the
# small profile grid and one B3 run of 30 requests at 70% of capacity, ~30 s: the run is
# real time, at 20% it would take a minute more).
# MOONAGENT_BIN names the binary; by default `cargo build --release` builds it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

QUICK=0
WHAT=()
for a in "$@"; do
  case $a in
    --quick) QUICK=1 ;;
    ladder | eviction | sweeps | validation) WHAT+=("$a") ;;
    *) echo "nb_inputs.sh: unknown argument $a (expected --quick, ladder, eviction, sweeps, validation)" >&2; exit 2 ;;
  esac
done
[[ ${#WHAT[@]} -eq 0 ]] && WHAT=(ladder eviction sweeps validation)

D=${MOONAGENT_NB_INPUT:-target/nb-inputs}
BIN=${MOONAGENT_BIN:-}
if [[ -z $BIN ]]; then
  cargo build --quiet --release --bin moonagent
  BIN=${CARGO_TARGET_DIR:-target}/release/moonagent
fi
log() { echo "[nb-inputs] $*" >&2; }
run() {
  local t=$SECONDS
  "$BIN" "$@" > /dev/null
  log "$(( SECONDS - t )) s  moonagent $*"
}

ladder() {
  local req=()
  [[ $QUICK == 1 ]] && req=(--requests 200)
  run simulate "${req[@]}" --out "$D/ladder/h200"
  run simulate --hardware b200 "${req[@]}" --out "$D/ladder/b200"
}

# A small trace in Mooncake's FAST'25 JSONL format: conversations whose turns extend a
# shared system prompt and their own history (so prefixes repeat), deterministic.
synthetic_mooncake() {
  awk 'BEGIN {
    srand(7); next_id = 64; t = 0
    for (c = 0; c < 300; c++) { n[c] = 0; len[c] = 0 }
    for (r = 0; r < 3000; r++) {
      c = int(rand() * 300); t += int(rand() * 200)
      if (len[c] == 0) { for (i = 0; i < 4; i++) ids[c, i] = i % 8; len[c] = 4 }
      add = 1 + int(rand() * 4)
      for (i = 0; i < add; i++) ids[c, len[c]++] = next_id++
      s = ""
      for (i = 0; i < len[c]; i++) s = s (i ? ", " : "") ids[c, i]
      printf "{\"timestamp\": %d, \"input_length\": %d, \"output_length\": 100, \"hash_ids\": [%s]}\n", t, 512 * len[c], s
    }
  }'
}

eviction() {
  mkdir -p "$D/eviction"
  local sessions=() trace=()
  if [[ $QUICK == 1 ]]; then
    sessions=(--sessions 40)
    local src=${MOONAGENT_TRACES:-}/mooncake/conversation_trace.jsonl
    if [[ -n ${MOONAGENT_TRACES:-} && -f $src ]]; then
      head -n 3000 "$src" > "$D/eviction/mooncake-head.jsonl"
    else
      log "no \$MOONAGENT_TRACES/mooncake/conversation_trace.jsonl: a synthetic trace in its format"
      synthetic_mooncake > "$D/eviction/mooncake-head.jsonl"
    fi
    trace=(--trace "$D/eviction/mooncake-head.jsonl")
  fi
  run repro eviction-ablation "${sessions[@]}" --out "$D/eviction/ablation.parquet"
  run repro mooncake-capacity "${trace[@]}" --out "$D/eviction/mooncake-capacity.parquet"
  run trace generate sessions "${sessions[@]}" --no-stats --out "$D/eviction/sessions.jsonl"
  run replay --trace "$D/eviction/sessions.jsonl" --capacity 5%,10%,20%,40% \
    --policy-config examples/policies/default.toml \
    --policy-config examples/policies/grace-only.toml \
    --policy-config examples/policies/reuse-scale-only.toml \
    --policy-config examples/policies/balanced.toml \
    --policy lru,gdsf,belady \
    --out "$D/eviction/sessions-capacity.parquet"
}

sweeps() {
  local set=() slo=0.7
  [[ $QUICK == 1 ]] && slo=0.4 && set=(--set base.workload.config.sessions=40 --set seeds=2
    --set 'axis.0.values=[1.0, 8.0]' --set 'axis.1.values=[0, 10000]'
    --set 'axis.2.values=["10%", "40%"]')
  rm -rf "$D/sweeps/seed002"
  run sweep run examples/sweeps/seed002_type_aware.toml --out "$D/sweeps/seed002" --quiet "${set[@]}"
  "$BIN" sweep best "$D/sweeps/seed002" --x capacity_bytes --y encoder_output.hit_rate:max \
    --slo "kv_cache.hit_rate>=$slo" --json > "$D/sweeps/seed002/best.json"
  log "sweep best --json > $D/sweeps/seed002/best.json"
}

validation() {
  local quick=()
  [[ $QUICK == 1 ]] && quick=(--quick --loads 0.7 --modes b3)
  rm -rf "$D/validation"
  run validate all "${quick[@]}" --out "$D/validation"
}

for w in "${WHAT[@]}"; do "$w"; done
log "inputs in $D"

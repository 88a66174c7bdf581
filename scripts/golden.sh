#!/usr/bin/env bash
# Golden outputs of the simulator: every result file a refactor must leave byte-identical.
#
#   bash scripts/golden.sh OUT [BIN]
#
# Writes into OUT the B0 -> Full ladder on H200 and B200 (ladder.parquet/.csv,
# summary.json) and, for W1-W4, a hot forked W4, the 600-session workload and Mooncake's
# conversation trace when $MOONAGENT_TRACES has it, every mode's per-request and
# per-worker Parquet and the summaries, at the default KV pool and at a tight one (thousands of preemptions);
# then OUT/SHA256SUMS. Compare two runs with `diff OUT1/SHA256SUMS OUT2/SHA256SUMS`.
# BIN defaults to target/release/moonagent (built first if missing).
set -euo pipefail
out=${1:?usage: golden.sh OUT [BIN]}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bin=${2:-target/release/moonagent}
[[ -x $bin ]] || cargo build --release --quiet
mkdir -p "$out/traces"
out=$(cd "$out" && pwd)

"$bin" simulate --out "$out/ladder-h200" > /dev/null
"$bin" simulate --hardware b200 --out "$out/ladder-b200" > /dev/null

gen() { "$bin" trace generate "$@" --no-stats > /dev/null; }
gen w1 --requests 3000 --out "$out/traces/w1.jsonl"
gen w2 --requests 1500 --out "$out/traces/w2.jsonl"
gen w3 --requests 3000 --out "$out/traces/w3.jsonl"
gen w4 --requests 1500 --out "$out/traces/w4.jsonl"
gen w4 --requests 1500 --rate 40 --set repeat_rate=0.9 --out "$out/traces/w4-hot.jsonl"
gen sessions --out "$out/traces/sessions.jsonl"
names=(w1 w2 w3 w4 w4-hot sessions)
conv=${MOONAGENT_TRACES:-}/mooncake/conversation_trace.jsonl
if [[ -n ${MOONAGENT_TRACES:-} && -f $conv ]]; then
  "$bin" trace import mooncake "$conv" --out "$out/traces/conversation.jsonl" --no-stats > /dev/null
  names+=(conversation)
fi

# 0.115 of HBM leaves ~1.1 GB of KV pages per GPU: thousands of preemptions on W4.
printf 'base.kv_mem_fraction = 0.115\n' > "$out/tight.toml"
for t in "${names[@]}"; do
  "$bin" simulate --trace "$out/traces/$t.jsonl" --out "$out/$t" > /dev/null
done
# (The sessions' and conversations' longest prompts do not fit so small a pool.)
for t in w1 w2 w3 w4 w4-hot; do
  "$bin" simulate --trace "$out/traces/$t.jsonl" --config "$out/tight.toml" --out "$out/$t-tight" > /dev/null
done
(cd "$out" && find . -type f ! -name SHA256SUMS ! -path './traces/*' ! -name tight.toml \
   | sort | xargs sha256sum > SHA256SUMS)
echo "$(wc -l < "$out/SHA256SUMS") result files in $out/SHA256SUMS" >&2

#!/usr/bin/env bash
# Mutation testing of the safety-critical modules with cargo-mutants. Not part of CI (a full
# pass takes hours on this 2-core machine); run it by hand, in pieces.
#
#   scripts/mutants.sh list                       # the modules and their files
#   scripts/mutants.sh run MODULE [k/n]           # shard k of n of one module (default 0/1)
#   scripts/mutants.sh run-all [n]                # every module, in n shards each
#   scripts/mutants.sh score                      # caught / missed / timeout / unviable per module
#
# Resumable: each (module, shard) writes to target/mutants/MODULE/k-of-n/; a piece whose
# outcomes.json says it finished is skipped on the next call (delete the folder to redo
# it), so an interrupted run-all continues where it stopped. Shards of one module must
# use the same n (cargo-mutants divides the mutants by n). Extra cargo-mutants arguments
# go after `--` (e.g. `-- --in-diff my.diff`, `-- --timeout 120`). MUTANTS_ONLY=FILE limits
# a module to one of its files (its own output folder, MODULE@FILE). MUTANTS_ITERATE=1
# reruns a finished piece testing only what it did not catch (cargo-mutants --iterate),
# e.g. after adding tests for its survivors (names carry line:column: after editing the
# mutated file itself, rerun the piece from scratch instead).
#
# Needs cargo-mutants (`cargo install --locked cargo-mutants`). Runs at nice 19, one job.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# module -> "package file-glob..." (the files whose mutants the module's tests must kill).
declare -A MODULES=(
  [store]="moonagent-core core/src/store/mem.rs core/src/store/mod.rs core/src/store/key.rs core/src/store/vindex.rs core/src/store/keyindex.rs"
  [policies]="moonagent-core core/src/store/policy.rs core/src/store/policies/*.rs"
  [mm_cache]="moonagent-core core/src/mm_cache/mod.rs core/src/mm_cache/envelope.rs core/src/mm_cache/plan.rs"
  [fingerprint]="moonagent-core core/src/fingerprint.rs"
  [fork]="moonagent-core core/src/fork/*.rs"
  [traces]="moonagent-traces traces/src/schema.rs"
  [serve]="moonagent-core core/src/serve/kv_prefix.rs core/src/serve/memo.rs core/src/serve/decode.rs core/src/serve/engine.rs"
)
ORDER=(store policies mm_cache fingerprint fork traces serve)
# module -> the test targets that state its invariants (INVARIANTS.md). Running only these
# keeps a mutant to seconds instead of the whole suite; MUTANTS_ALL_TESTS=1 runs every test
# of the package instead (slower; a mutant caught only elsewhere then counts as caught).
declare -A TESTS=(
  [store]="--lib --test store_model --test store_victim_recheck --test store_key --test store_mooncake_experiments --test store_trait_defaults --test store_victim_index"
  [policies]="--lib --test policy_victim_order --test policy_properties --test policy_belady_bound --test store_victim_recheck --test policy_semantics"
  [mm_cache]="--lib --test mm_cache_lookup --test mm_cache_plan --test mm_cache_faults --test mm_cache_auth"
  [fingerprint]="--lib --test fingerprint"
  [fork]="--lib --test fork_prop --test fork_token_identity"
  [traces]="--lib --test it"
  [serve]="--lib --test serve_prop"
)
OUT=target/mutants

usage() { sed -n '2,17p' "$0" >&2; exit 2; }

need_tool() {
  command -v cargo-mutants >/dev/null || {
    echo "cargo-mutants not found: cargo install --locked cargo-mutants" >&2
    exit 1
  }
}

# finished DIR: the piece in DIR ran to its end (cargo-mutants writes end_time last).
finished() {
  [[ -f $1/mutants.out/outcomes.json ]] &&
    python3 - "$1/mutants.out/outcomes.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
sys.exit(0 if d.get("end_time") else 1)
PY
}

run_piece() {
  local module=$1 shard=$2; shift 2
  local spec=${MODULES[$module]:-}
  [[ -n $spec ]] || { echo "unknown module $module (see: $0 list)" >&2; exit 2; }
  local pkg files=() args=()
  read -r pkg rest <<<"$spec"
  # Expand the globs here so a typo fails loudly instead of matching nothing.
  for g in $rest; do
    for f in $g; do [[ -f $f ]] || { echo "no file $f" >&2; exit 2; }; files+=("$f"); done
  done
  if [[ -n ${MUTANTS_ONLY:-} ]]; then
    [[ " ${files[*]} " == *" $MUTANTS_ONLY "* ]] || { echo "$MUTANTS_ONLY is not in $module" >&2; exit 2; }
    files=("$MUTANTS_ONLY")
    module="$module@$(basename "$MUTANTS_ONLY" .rs)"
  fi
  for f in "${files[@]}"; do args+=(--file "$f"); done
  local tests=()
  [[ ${MUTANTS_ALL_TESTS:-0} == 1 ]] || read -r -a tests <<<"${TESTS[${module%@*}]}"
  local dir="$OUT/$module/${shard/\//-of-}"
  local iterate=()
  if [[ ${MUTANTS_ITERATE:-0} == 1 ]]; then
    iterate=(--iterate)
  elif finished "$dir"; then
    echo "== $module $shard: done before (rm -r $dir to redo, MUTANTS_ITERATE=1 for survivors)" >&2
    return 0
  fi
  mkdir -p "$dir"
  echo "== $module shard $shard: ${files[*]}" >&2
  # Exit status 2 means mutants were missed: recorded, not a failure of this script.
  local rc=0
  nice -n 19 cargo mutants --package "$pkg" "${args[@]}" --shard "$shard" \
    --jobs 1 --output "$dir" "${iterate[@]}" "$@" -- "${tests[@]}" || rc=$?
  [[ $rc -eq 0 || $rc -eq 2 || $rc -eq 3 ]] || { echo "cargo mutants failed ($rc)" >&2; exit "$rc"; }
}

score() {
  python3 - "$OUT" <<'PY'
import json, pathlib, sys
root = pathlib.Path(sys.argv[1])
for mod in sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []:
    tot = {}
    done = 0
    pieces = sorted(mod.glob("*/mutants.out/outcomes.json"))
    for f in pieces:
        d = json.loads(f.read_text())
        done += bool(d.get("end_time"))
        for k in ("caught", "missed", "timeout", "unviable", "success"):
            tot[k] = tot.get(k, 0) + int(d.get(k, 0) or 0)
    # --iterate passes test only the survivors of earlier passes; cargo-mutants lists
    # what those caught (or found unviable) in previously_caught.txt.
    # Names carry line:column, so after editing a file its earlier names go stale: rerun
    # that piece from scratch (rm -r its folder) for an exact score.
    earlier = 0
    for f in mod.glob("*/mutants.out/previously_caught.txt"):
        now = {m["name"] for m in json.loads((f.parent / "mutants.json").read_text())}
        earlier += sum(1 for n in f.read_text().splitlines() if n not in now)
    caught = tot.get("caught", 0) + earlier
    tested = caught + tot.get("missed", 0) + tot.get("timeout", 0)
    pct = 100.0 * caught / tested if tested else 0.0
    print(f"{mod.name}: {done}/{len(pieces)} pieces finished; caught {tot.get('caught',0)}"
          f" (+{earlier} caught or unviable in earlier passes), "
          f"missed {tot.get('missed',0)}, timeout {tot.get('timeout',0)}, "
          f"unviable {tot.get('unviable',0)}; score {pct:.1f}% (earlier unviable counted as caught)")
    for f in sorted(mod.glob("*/mutants.out/missed.txt")):
        for line in f.read_text().splitlines():
            print(f"  missed: {line}")
PY
}

cmd=${1:-}; shift || true
extra=()
pos=()
while [[ $# -gt 0 ]]; do
  if [[ $1 == -- ]]; then shift; extra=("$@"); break; fi
  pos+=("$1"); shift
done
case $cmd in
  list) for m in "${ORDER[@]}"; do echo "$m: ${MODULES[$m]}"; done ;;
  run) need_tool; [[ ${#pos[@]} -ge 1 ]] || usage; run_piece "${pos[0]}" "${pos[1]:-0/1}" "${extra[@]}" ;;
  run-all)
    need_tool
    n=${pos[0]:-1}
    for m in "${ORDER[@]}"; do
      for ((k = 0; k < n; k++)); do run_piece "$m" "$k/$n" "${extra[@]}"; done
    done
    score ;;
  score) score ;;
  *) usage ;;
esac

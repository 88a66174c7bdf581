#!/usr/bin/env bash
# libCacheSim as the oracle of `moonagent replay --cache-model plain` (issue 15): LRU, FIFO,
# S3-FIFO, SIEVE and Belady must give libCacheSim's hit counts exactly on a Zipf trace and
# on Mooncake's conversation trace (the latter needs MOONAGENT_TRACES; see the test's docs).
# Then the csv case: one Zipf trace written as libCacheSim csv twice (string ids hashed,
# comma, header; numeric ids, tab, no header), read by libCacheSim's csv reader and by
# `--trace-format csv` with the same --trace-type-params: LRU, FIFO, S3-FIFO and SIEVE
# must give identical hit counts at 1% and 10% of the distinct objects.
#
# Installs, idempotently, PyPI's libcachesim into the suite's venv
# $MOONAGENT_HOME (default ~/.cache/moonagent)/py-venv (the venv of test_sweep_python.sh).
# Builds the debug binary unless MOONAGENT_BIN names one. ~35 s on 2 cores.
#
# Without network access to PyPI the script says so and skips, unless CI=true.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOME_DIR=${MOONAGENT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/moonagent}
VENV=$HOME_DIR/py-venv
PKG="libcachesim==0.3.5"

log() { echo "[libcachesim] $*" >&2; }
skip_or_fail() {
  if [[ ${CI:-} == true ]]; then log "$1"; exit 1; fi
  log "$1; skipping"; exit 0
}

command -v python3 >/dev/null || skip_or_fail "python3 not found"
if [[ ! -x $VENV/bin/python ]]; then
  log "creating $VENV"
  python3 -m venv "$VENV" || skip_or_fail "cannot create a venv at $VENV"
fi
if ! "$VENV/bin/python" -c "import libcachesim" 2>/dev/null; then
  log "installing $PKG into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$PKG" ||
    skip_or_fail "could not install $PKG from PyPI"
fi

BIN=${MOONAGENT_BIN:-}
if [[ -z $BIN ]]; then
  cargo build --quiet --bin moonagent
  BIN=${CARGO_TARGET_DIR:-target}/debug/moonagent
fi
"$VENV/bin/python" -u tests/python/test_libcachesim_oracle.py --bin "$BIN"

CSV_DIR=$(mktemp -d)
trap 'rm -rf "$CSV_DIR"' EXIT
log "csv traces: libCacheSim's csv reader vs --trace-format csv"
MOONAGENT_CACHE=$CSV_DIR/compiled "$VENV/bin/python" -u - "$BIN" "$CSV_DIR" <<'PY'
import json, os, random, subprocess, sys
import libcachesim as lcs

bin_path, tmp = sys.argv[1], sys.argv[2]
n_req, n_obj = 100_000, 10_000
weights = [1.0 / (i + 1) for i in range(n_obj)]
ids = random.Random(3).choices(range(n_obj), weights=weights, k=n_req)
distinct = len(set(ids))
caps = [max(1, round(distinct * s)) for s in (0.01, 0.10)]
policies = {
    "lru": lambda k: lcs.LRU(k),
    "fifo": lambda k: lcs.FIFO(k),
    "s3-fifo": lambda k: lcs.S3FIFO(k, move_to_main_threshold=2),
    "sieve": lambda k: lcs.Sieve(k),
}
variants = [  # file, rows, params, libCacheSim reader options
    ("str.csv", ["time,key,size"] + [f"{i // 100},key-{o},1" for i, o in enumerate(ids)],
     "time-col=1,obj-id-col=2,obj-size-col=3,delimiter=,,has-header=true,obj-id-is-num=false",
     dict(delimiter=",", has_header=True, obj_id_is_num=False)),
    ("num.tsv", [f"1\t{i // 100}\t{o + 1}" for i, o in enumerate(ids)],
     "obj-size-col=1,time-col=2,obj-id-col=3,delimiter=\\t,has-header=false,obj-id-is-num=true",
     dict(delimiter="\t", has_header=False, obj_id_is_num=True)),
]
cols = {"str.csv": (1, 2, 3), "num.tsv": (2, 3, 1)}
bad = 0
for name, rows, params, opts in variants:
    path = os.path.join(tmp, name)
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    out = os.path.join(tmp, name + ".json")
    subprocess.run([bin_path, "replay", "--trace", path, "--trace-format", "csv",
                    "--trace-type-params", params, "--cache-model", "plain",
                    "--capacity-unit", "objects", "--capacity", ",".join(map(str, caps)),
                    "--policy", ",".join(policies), "--no-min-bound", "--out", out],
                   check=True, capture_output=True)
    runs = json.load(open(out))["runs"]
    for k, run in zip(caps, runs):
        ours = {r["label"]: r["total"]["hits"] for r in run["results"]}
        for pol, make in policies.items():
            p = lcs.ReaderInitParam(has_header_set=True, obj_id_is_num_set=True, **opts)
            p.time_field, p.obj_id_field, p.obj_size_field = cols[name]
            reader = lcs.TraceReader(path, lcs.TraceType.CSV_TRACE, reader_init_params=p)
            mr, _ = make(k).process_trace(reader)
            theirs = round((1 - mr) * n_req)
            ok = theirs == ours[pol]
            bad += not ok
            print(f"[libcachesim-csv] {name} {pol:8} {k:5} objects: libCacheSim {theirs}, "
                  f"moonagent {ours[pol]}{'' if ok else '  MISMATCH'}", flush=True)
sys.exit(f"{bad} csv cells differ" if bad else 0)
PY

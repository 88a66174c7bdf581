"""libCacheSim (PyPI `libcachesim`) as the oracle of `moonagent replay --cache-model plain`.

Both simulators replay the same traces with unit object sizes and an object-count capacity;
the hit counts must be identical for every policy both implement the same way:

  (a) a Zipf(1.0) trace, 200,000 requests over 20,000 objects, generated here from a fixed
      seed and written as libCacheSim's oracleGeneral binary, which moonagent reads too;
  (b) Mooncake's conversation trace (FAST'25) flattened to its KV blocks: libCacheSim reads
      the blocks flattened here; moonagent reads the raw JSONL with its own importer
      (`--trace-format mooncake`), so its flattening is checked as well. Needs
      MOONAGENT_TRACES; skipped with a printed line without it, a failure under CI=true.

Capacities: 1%, 5%, 10% and 30% of the trace's distinct objects.

Remaining differences, stated and checked rather than hidden:
  - W-TinyLFU: same structure and order of events (window LRU 1%, SLRU main 20/80,
    admission when the window victim's estimate is strictly higher), but libCacheSim's
    sketch is a counting Bloom filter with its own hashing and moonagent's is Caffeine's
    count-min sketch (every row incremented, 4-bit, halved every 10 x width increments;
    libCacheSim's grows only the minimal counters, unbounded, halved after 32 x main size
    hits in main), so estimates, and admissions, differ. Measured: Zipf within 1%,
    Mooncake -9.7% to +16.2% of libCacheSim's hits; required within 20%, printed.
  - Belady: libCacheSim's always admits the missed object (evicting the resident object
    with the furthest next access), as moonagent's `belady` policy in the plain model
    does, so the two must be equal; moonagent's `min_bound` (MIN with bypass: an object
    whose next access is further than every resident's is not admitted) must be >= both.

usage: test_libcachesim_oracle.py --bin target/debug/moonagent
"""

import argparse
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

import libcachesim as lcs

SHARES = [0.01, 0.05, 0.10, 0.30]
POLICIES = {  # moonagent name -> libCacheSim constructor
    "lru": lambda k: lcs.LRU(k),
    "fifo": lambda k: lcs.FIFO(k),
    "s3-fifo": lambda k: lcs.S3FIFO(k, move_to_main_threshold=2),
    "sieve": lambda k: lcs.Sieve(k),
    "belady": lambda k: lcs.Belady(k),
}
# Same algorithm, different frequency sketch (libCacheSim: a counting Bloom filter with its
# own hashing; moonagent: Caffeine's 4-bit count-min sketch): reported side by side and
# required to be within APPROX of each other, not equal.
APPROX = {"w-tinylfu": lambda k: lcs.WTinyLFU(k)}
APPROX_TOLERANCE = 0.20


def log(msg):
    print(f"[libcachesim-oracle] {msg}", flush=True)


def zipf_ids(n_req, n_obj, alpha, seed):
    weights = [1.0 / (i + 1) ** alpha for i in range(n_obj)]
    return random.Random(seed).choices(range(n_obj), weights=weights, k=n_req)


def mooncake_ids(path):
    ids = []
    with open(path) as f:
        for line in f:
            ids.extend(json.loads(line)["hash_ids"])
    return ids


def write_oracle_general(path, ids):
    """24-byte records: u32 timestamp, u64 obj_id, u32 obj_size (1), i64 next access."""
    nxt = [-1] * len(ids)
    last = {}
    for i in range(len(ids) - 1, -1, -1):
        nxt[i] = last.get(ids[i], -1)
        last[ids[i]] = i
    rec = struct.Struct("<IQIq")
    with open(path, "wb") as f:
        f.write(b"".join(rec.pack(i // 1000, o + 1, 1, nxt[i]) for i, o in enumerate(ids)))
    return len(last)


def lib_hits(path, n_req, make, k):
    reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
    miss_ratio, _ = make(k).process_trace(reader)
    return round((1.0 - miss_ratio) * n_req)


def moonagent_hits(bin_path, trace, fmt, caps, out):
    cmd = [
        bin_path, "replay", "--trace", trace, "--trace-format", fmt,
        "--cache-model", "plain", "--capacity-unit", "objects",
        "--capacity", ",".join(str(k) for k in caps),
        "--policy", ",".join(list(POLICIES) + list(APPROX)), "--out", out,
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        report = json.load(f)
    hits, minb = {}, {}
    for run in report["runs"]:
        k = run["capacity_bytes"]
        for r in run["results"]:
            hits[(r["label"], k)] = (r["total"]["hits"], r["total"]["lookups"])
        (h, _), = run["min_bound"].values()
        minb[k] = h
    return hits, minb


def check_trace(name, bin_path, og_path, n_req, distinct, moon_trace, moon_fmt, tmp):
    caps = [max(1, round(distinct * s)) for s in SHARES]
    t0 = time.time()
    ours, minb = moonagent_hits(bin_path, moon_trace, moon_fmt, caps, os.path.join(tmp, f"{name}.json"))
    t1 = time.time()
    failures = []
    log(f"{name}: {n_req} requests, {distinct} objects; capacities {caps} objects "
        f"(moonagent {t1 - t0:.1f} s)")
    log(f"  {'policy':10} {'capacity':>8} {'libCacheSim':>12} {'moonagent':>10}  diff")
    for pol, make in POLICIES.items():
        for k in caps:
            theirs = lib_hits(og_path, n_req, make, k)
            mine, lookups = ours[(pol, k)]
            if lookups != n_req:
                failures.append(f"{name} {pol} k={k}: {lookups} lookups, trace has {n_req}")
            diff = mine - theirs
            log(f"  {pol:10} {k:>8} {theirs:>12} {mine:>10}  {diff:+d}")
            if diff != 0:
                failures.append(f"{name} {pol} k={k}: libCacheSim {theirs}, moonagent {mine}")
    for k in caps:
        belady = ours[("belady", k)][0]
        log(f"  {'min-bound':10} {k:>8} {'-':>12} {minb[k]:>10}  (MIN with bypass; belady {belady})")
        if minb[k] < belady:
            failures.append(f"{name} k={k}: min_bound {minb[k]} < belady {belady}")
    for pol, make in APPROX.items():
        for k in caps:
            theirs = lib_hits(og_path, n_req, make, k)
            mine = ours[(pol, k)][0]
            rel = (mine - theirs) / max(theirs, 1)
            log(f"  {pol:10} {k:>8} {theirs:>12} {mine:>10}  {mine - theirs:+d} ({100 * rel:+.2f}%, "
                "different sketch: not required equal)")
            if abs(rel) > APPROX_TOLERANCE:
                failures.append(f"{name} {pol} k={k}: libCacheSim {theirs}, moonagent {mine}, "
                                f"{100 * rel:+.2f}% (tolerance {100 * APPROX_TOLERANCE:.0f}%)")
    log(f"{name}: libCacheSim side {time.time() - t1:.1f} s")
    return failures


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    args = ap.parse_args()
    ci = os.environ.get("CI") == "true"
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        ids = zipf_ids(200_000, 20_000, 1.0, seed=15)
        og = os.path.join(tmp, "zipf.oracleGeneral")
        distinct = write_oracle_general(og, ids)
        failures += check_trace("zipf", args.bin, og, len(ids), distinct, og, "oracle-general", tmp)

        traces = os.environ.get("MOONAGENT_TRACES")
        conv = traces and os.path.join(traces, "mooncake", "conversation_trace.jsonl")
        if not conv or not os.path.exists(conv):
            msg = (f"Mooncake conversation trace not found ({conv or 'MOONAGENT_TRACES unset'}): "
                   "the Mooncake half of the oracle test is skipped")
            if ci:
                log(msg + " (CI=true: failing)")
                sys.exit(1)
            log(msg)
        else:
            ids = mooncake_ids(conv)
            og = os.path.join(tmp, "mooncake.oracleGeneral")
            distinct = write_oracle_general(og, ids)
            failures += check_trace("mooncake", args.bin, og, len(ids), distinct, conv, "mooncake", tmp)
    if failures:
        for f in failures:
            log("MISMATCH " + f)
        sys.exit(1)
    log("lru, fifo, s3-fifo, sieve and belady agree with libCacheSim exactly; "
        f"w-tinylfu within {100 * APPROX_TOLERANCE:.0f}%")


if __name__ == "__main__":
    main()

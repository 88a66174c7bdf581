"""moonagent's plain replay vs libCacheSim (PyPI `libcachesim`), one thread, same trace.

A Zipf(1.0) trace (REQUESTS over OBJECTS, unit sizes) is written once as an oracleGeneral
file; a cache of CACHE objects replays it under each policy, REPS rounds that alternate
the two simulators. Reported per policy, medians over the rounds:

  - whole process: `moonagent replay --cache-model plain` (read, compile, replay, exit) vs
    a fresh `python -c` running libCacheSim's `process_trace` (interpreter start and
    import included, as a user of the bindings waits for them);
  - replay loop: moonagent's `replayed in` (stderr) vs `process_trace` timed in-process
    (libCacheSim reads the trace as it goes, so its loop includes reading);

with ratios libCacheSim / moonagent (> 1: moonagent faster), measured in the same run.
Hit counts are checked equal on every round.

usage: python scripts/bench_libcachesim.py --bin target/release/moonagent
       [--requests 2000000 --objects 200000 --cache 20000 --reps 5]
"""

import argparse
import os
import random
import re
import statistics
import struct
import subprocess
import sys
import tempfile
import time

POLICIES = {"lru": "LRU", "s3-fifo": "S3FIFO", "sieve": "Sieve"}

LIB = r"""
import sys, time, libcachesim as lcs
path, cls, k, n, hp = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
r = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
c = getattr(lcs, cls)(k, hashpower=hp)
t = time.perf_counter()
mr, _ = c.process_trace(r)
print(time.perf_counter() - t, round((1 - mr) * n))
"""


def zipf_file(path, n_req, n_obj, seed=15):
    weights = [1.0 / (i + 1) for i in range(n_obj)]
    ids = random.Random(seed).choices(range(n_obj), weights=weights, k=n_req)
    rec = struct.Struct("<IQIq")
    with open(path, "wb") as f:
        f.write(b"".join(rec.pack(i // 1000, o + 1, 1, -1) for i, o in enumerate(ids)))


def run_moonagent(bin_path, trace, pol, k):
    t = time.perf_counter()
    p = subprocess.run(
        [bin_path, "replay", "--trace", trace, "--cache-model", "plain", "--capacity-unit",
         "objects", "--capacity", str(k), "--policy", pol, "--no-min-bound"],
        check=True, capture_output=True, text=True,
        env={**os.environ, "RAYON_NUM_THREADS": "1"},
    )
    whole = time.perf_counter() - t
    loop = float(re.search(r"replayed in ([0-9.]+) s", p.stderr).group(1))
    # The policy's row of the printed table ends with its hits and lookups.
    row = next(line.split() for line in p.stdout.splitlines() if line.split()[:1] == [pol])
    hits = int(row[-2])
    return whole, loop, hits


def run_lib(trace, cls, k, n, hashpower):
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", LIB, trace, cls, str(k), str(n), str(hashpower)],
                       check=True, capture_output=True, text=True)
    whole = time.perf_counter() - t
    loop, hits = p.stdout.split()
    return whole, float(loop), int(hits)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--requests", type=int, default=2_000_000)
    ap.add_argument("--objects", type=int, default=200_000)
    ap.add_argument("--cache", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "zipf.oracleGeneral")
        zipf_file(trace, a.requests, a.objects)
        print(f"Zipf(1.0): {a.requests} requests over {a.objects} objects, cache {a.cache} "
              f"objects, {a.reps} alternating rounds, medians (load {os.getloadavg()[0]:.2f})")
        # libCacheSim's default hash table (2^24 buckets) and one sized to the cache.
        fitted = max(10, (a.cache - 1).bit_length() + 1)
        print(f"{'policy':8} {'hash':>4} {'moon whole s':>12} {'lib whole s':>11} {'ratio':>6} "
              f"{'moon loop s':>11} {'lib loop s':>10} {'ratio':>6}")
        for pol, cls in POLICIES.items():
            m_whole, m_loop = [], []
            lib = {24: ([], []), fitted: ([], [])}
            for _ in range(a.reps):
                w, l, h1 = run_moonagent(a.bin, trace, pol, a.cache)
                m_whole.append(w)
                m_loop.append(l)
                for hp, (lw, ll) in lib.items():
                    w, l, h2 = run_lib(trace, cls, a.cache, a.requests, hp)
                    lw.append(w)
                    ll.append(l)
                    if h1 != h2:
                        sys.exit(f"{pol}: hits differ: moonagent {h1}, libCacheSim {h2}")
            mw, ml = statistics.median(m_whole), statistics.median(m_loop)
            for hp, (lw, ll) in lib.items():
                lw, ll = statistics.median(lw), statistics.median(ll)
                print(f"{pol:8} 2^{hp:<2} {mw:12.3f} {lw:11.3f} {lw / mw:6.2f} {ml:11.3f} "
                      f"{ll:10.3f} {ll / ml:6.2f}")


if __name__ == "__main__":
    main()

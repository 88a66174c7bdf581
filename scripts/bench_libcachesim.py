"""moonagent's plain replay vs libCacheSim (PyPI `libcachesim`), one thread, same trace.

A Zipf(1.0) trace (REQUESTS over OBJECTS, unit sizes) is written once as an oracleGeneral
file; a cache of CACHE objects replays it under each policy, REPS rounds that alternate
the two simulators. Reported per policy, medians over the rounds:

  - whole process, twice for moonagent: `moonagent replay --cache-model plain` with an
    empty compiled-trace cache (cold: hash, read, compile, replay while the compiled
    trace is written, exit) and again with the cache it left (warm: hash, map, replay,
    exit), vs a fresh `python -c` running libCacheSim's `process_trace` (interpreter
    start and import included, as a user of the bindings waits for them);
  - replay loop: moonagent's `replayed in` (stderr) vs `process_trace` timed in-process
    (libCacheSim reads the trace as it goes, so its loop includes reading);

with ratios libCacheSim / moonagent (> 1: moonagent faster), measured in the same run.
Hit counts are checked equal on every round. Also printed: moonagent's fastest and
slowest whole process per policy (cold and warm), and its own phase times
(stderr `timing:`), medians: hashing the trace, and reading + compiling it (cold) or
mapping the compiled file (warm).

usage: ~/.cache/moonagent/py-venv/bin/python scripts/bench_libcachesim.py \
           --bin target/release/moonagent
       [--requests 2000000 --objects 200000 --cache 20000 --reps 5]

The issue's size: --requests 10000000 --objects 1000000 --cache 100000 --reps 5.
"""

import argparse
import os
import random
import re
import shutil
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


def run_moonagent(bin_path, trace, pol, k, cache_dir):
    t = time.perf_counter()
    p = subprocess.run(
        [bin_path, "replay", "--trace", trace, "--cache-model", "plain", "--capacity-unit",
         "objects", "--capacity", str(k), "--policy", pol, "--no-min-bound"],
        check=True, capture_output=True, text=True,
        env={**os.environ, "RAYON_NUM_THREADS": "1", "MOONAGENT_CACHE": cache_dir},
    )
    whole = time.perf_counter() - t
    m = re.search(r"trace hashed in ([0-9.]+) s, (read and compiled|mapped from the cache) "
                  r"in ([0-9.]+) s, replayed in ([0-9.]+) s", p.stderr)
    hashed, how, load, loop = float(m.group(1)), m.group(2), float(m.group(3)), float(m.group(4))
    # The policy's row of the printed table ends with its hits and lookups.
    row = next(line.split() for line in p.stdout.splitlines() if line.split()[:1] == [pol])
    hits = int(row[-2])
    return whole, loop, hits, hashed, load, how


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
    try:
        import libcachesim  # noqa: F401  (checked here; each round imports it afresh)
    except ImportError:
        sys.exit(f"bench_libcachesim: {sys.executable} cannot import libcachesim; run it with "
                 "the suite's venv, ~/.cache/moonagent/py-venv/bin/python (bash "
                 "scripts/test_libcachesim.sh creates it and installs libcachesim==0.3.5)")
    if not os.access(a.bin, os.X_OK):
        sys.exit(f"bench_libcachesim: --bin {a.bin}: no executable there "
                 "(cargo build --release -p moonagent)")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "zipf.oracleGeneral")
        zipf_file(trace, a.requests, a.objects)
        cache_dir = os.path.join(tmp, "compiled")
        print(f"Zipf(1.0): {a.requests} requests over {a.objects} objects, cache {a.cache} "
              f"objects, {a.reps} alternating rounds, medians (load {os.getloadavg()[0]:.2f})")
        # libCacheSim's default hash table (2^24 buckets) and one sized to the cache.
        fitted = max(10, (a.cache - 1).bit_length() + 1)
        print(f"{'policy':8} {'hash':>4} {'lib whole s':>11} {'cold s':>7} {'ratio':>6} "
              f"{'warm s':>7} {'ratio':>6} {'lib loop s':>10} {'moon loop s':>11} {'ratio':>6}")
        phases = {"hash": [], "read and compiled": [], "mapped from the cache": []}
        spread = []
        for pol, cls in POLICIES.items():
            cold, warm, m_loop = [], [], []
            lib = {24: ([], []), fitted: ([], [])}
            for _ in range(a.reps):
                shutil.rmtree(cache_dir, ignore_errors=True)
                runs = []
                for want in ("read and compiled", "mapped from the cache"):
                    w, l, h1, hashed, load, how = run_moonagent(a.bin, trace, pol, a.cache,
                                                                cache_dir)
                    if how != want:
                        sys.exit(f"{pol}: expected the trace {want}, it was {how}")
                    phases["hash"].append(hashed)
                    phases[how].append(load)
                    runs.append((w, l, h1))
                cold.append(runs[0][0])
                warm.append(runs[1][0])
                m_loop.extend([runs[0][1], runs[1][1]])
                for hp, (lw, ll) in lib.items():
                    w, l, h2 = run_lib(trace, cls, a.cache, a.requests, hp)
                    lw.append(w)
                    ll.append(l)
                    if any(h2 != r[2] for r in runs):
                        sys.exit(f"{pol}: hits differ: moonagent {[r[2] for r in runs]}, "
                                 f"libCacheSim {h2}")
            mc, mw, ml = (statistics.median(x) for x in (cold, warm, m_loop))
            # The spread, because a cold run is where the host shows (page faults on
            # 360 MB of fresh memory, the compiled file's write).
            spread.append(f"{pol} cold {min(cold):.3f}-{max(cold):.3f} s, "
                          f"warm {min(warm):.3f}-{max(warm):.3f} s")
            for hp, (lw, ll) in lib.items():
                lw, ll = statistics.median(lw), statistics.median(ll)
                print(f"{pol:8} 2^{hp:<2} {lw:11.3f} {mc:7.3f} {lw / mc:6.2f} {mw:7.3f} "
                      f"{lw / mw:6.2f} {ll:10.3f} {ml:11.3f} {ll / ml:6.2f}", flush=True)
        print("moonagent whole process, fastest-slowest round: " + "; ".join(spread))
        print("moonagent phases, medians over every run: " + ", ".join(
            f"{k} {statistics.median(v):.3f} s" for k, v in phases.items()
        ) + f" (load {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()

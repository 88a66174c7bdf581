#!/usr/bin/env python3
"""Judge a scheduling change over many trace seeds, not one: for each binary, the ratio of
mode B to mode A (throughput, TTFT P50 and P95) on every seed's generated trace, and each
binary's ratios paired seed by seed against the first binary's.

    python3 scripts/seed_compare.py BASE [NEW ...] --workload w4 --seeds 36 \
        [--requests 1500] [--rate 40] [--set repeat_rate=0.9] [--config tight.toml] \
        [--modes b3,full] [--csv OUT.csv]

Traces come from BASE's `trace generate WORKLOAD --seed K` for K in 0..seeds (the same
traces for every binary). A run is `BIN simulate --trace T [--config C] --modes A,B
--out DIR`; its summary.json gives the figures. Printed: per binary the geometric mean,
median, minimum and wins (ratio > 1) of B/A throughput, medians of the TTFT ratios; per
later binary the mean log ratio of its B/A throughput to BASE's (x its exp), that mean's
standard error over seeds, and on how many seeds it was higher. `--csv` writes one row per
(binary, seed) for polars or pandas. Where the regime is chaotic (thousands of
preemptions), one seed moves by +-10% under any change: read the standard error.
"""
import argparse
import csv
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"seed_compare: `{' '.join(cmd)}` failed (exit {p.returncode}):\n{p.stderr}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("bins", nargs="+", help="moonagent binaries; the first is the base")
    p.add_argument("--workload", required=True, help="a `trace generate` workload (w1 .. w4, sessions)")
    p.add_argument("--seeds", type=int, default=12)
    p.add_argument("--requests", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--set", action="append", default=[], help="generator KEY=VALUE (repeatable)")
    p.add_argument("--config", help="simulator config TOML for every run")
    p.add_argument("--modes", default="b3,full", help="A,B: the ratio is B over A")
    p.add_argument("--csv", help="write one row per (binary, seed)")
    a = p.parse_args()
    modes = a.modes.split(",")
    if len(modes) != 2:
        p.error("--modes takes two modes, A,B")
    for b in a.bins:
        if not os.access(b, os.X_OK):
            p.error(f"{b}: not an executable")
    rows = []
    with tempfile.TemporaryDirectory(prefix="seed_compare.") as tmp:
        for k in range(a.seeds):
            trace = os.path.join(tmp, f"{a.workload}-{k}.jsonl")
            gen = [a.bins[0], "trace", "generate", a.workload, "--seed", str(k), "--no-stats", "--out", trace]
            if a.requests is not None:
                gen += ["--requests", str(a.requests)]
            if a.rate is not None:
                gen += ["--rate", str(a.rate)]
            for s in a.set:
                gen += ["--set", s]
            run(gen)
            for i, b in enumerate(a.bins):
                out = os.path.join(tmp, f"out-{i}-{k}")
                cmd = [b, "simulate", "--trace", trace, "--modes", a.modes, "--out", out]
                if a.config:
                    cmd += ["--config", a.config]
                run(cmd)
                with open(os.path.join(out, "summary.json")) as f:
                    s = {x["mode"].lower(): x for x in json.load(f)}
                ma, mb = (s[m.lower()] for m in modes)
                rows.append({
                    "binary": i, "path": b, "seed": k,
                    "throughput_ratio": mb["throughput_rps"] / ma["throughput_rps"],
                    "ttft_p50_ratio": mb["ttft_ms"]["p50"] / ma["ttft_ms"]["p50"],
                    "ttft_p95_ratio": mb["ttft_ms"]["p95"] / ma["ttft_ms"]["p95"],
                    "preemptions_a": ma["preemptions"], "preemptions_b": mb["preemptions"],
                })
            print(f"\rseed {k + 1}/{a.seeds}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    name = f"{modes[1]}/{modes[0]}"
    for i, b in enumerate(a.bins):
        r = [x for x in rows if x["binary"] == i]
        thr = [x["throughput_ratio"] for x in r]
        print(f"[{i}] {b}: {name} throughput geomean {statistics.geometric_mean(thr):.3f}, median "
              f"{statistics.median(thr):.3f}, min {min(thr):.3f}, wins {sum(v > 1 for v in thr)}/{len(thr)}; "
              f"TTFT P50 median {statistics.median(x['ttft_p50_ratio'] for x in r):.3f}, "
              f"P95 median {statistics.median(x['ttft_p95_ratio'] for x in r):.3f}")
    base = [x["throughput_ratio"] for x in rows if x["binary"] == 0]
    for i in range(1, len(a.bins)):
        d = [math.log(y / x) for x, y in
             zip(base, (x["throughput_ratio"] for x in rows if x["binary"] == i))]
        m = statistics.mean(d)
        se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else float("nan")
        print(f"[{i}] against [0]: mean log ratio of {name} throughput {m:+.4f} (x{math.exp(m):.3f}), "
              f"standard error {se:.4f}, higher on {sum(v > 0 for v in d)}/{len(d)} seeds")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())

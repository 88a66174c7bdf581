#!/usr/bin/env python3
"""Time two moonagent binaries on the same simulations, alternating, and print medians
and their ratio (a refactor's speed against the commit before it).

    python3 scripts/ab_simulate.py BEFORE AFTER TRACE:MODE [TRACE:MODE ...] [--reps N]

Each run is `BIN simulate --trace TRACE --modes MODE` (whole process: reading the trace
included); rounds alternate which binary goes first. Where both binaries print the
`timing:` line on stderr, the simulation loop's medians (seconds and M events/s) are
printed too. Wall clock on a shared host is noisy:
quote the medians and, for a repeatable figure, count instructions with
`valgrind --tool=callgrind` instead.
"""
import argparse
import re
import statistics
import subprocess
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("before")
    p.add_argument("after")
    p.add_argument("runs", nargs="+", help="TRACE:MODE")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    bins = {"before": a.before, "after": a.after}
    for run in a.runs:
        trace, _, mode = run.rpartition(":")
        t = {k: [] for k in bins}
        loop = {k: [] for k in bins}
        for r in range(a.reps):
            for k in (["before", "after"] if r % 2 == 0 else ["after", "before"]):
                t0 = time.perf_counter()
                p = subprocess.run([bins[k], "simulate", "--trace", trace, "--modes", mode],
                                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True)
                t[k].append(time.perf_counter() - t0)
                m = re.search(r"simulated (\d+) events in ([0-9.]+) s", p.stderr)
                if m:
                    loop[k].append((int(m.group(1)), float(m.group(2))))
        b, f = statistics.median(t["before"]), statistics.median(t["after"])
        print(f"{run}: before {b:.3f} s, after {f:.3f} s (medians of {a.reps}), after/before {f / b:.3f}")
        if all(len(loop[k]) == a.reps for k in bins):
            lb = statistics.median(s for _, s in loop["before"])
            lf = statistics.median(s for _, s in loop["after"])
            eb, ef = loop["before"][0][0], loop["after"][0][0]
            print(f"  loop: before {lb:.3f} s ({eb / lb / 1e6:.2f} M events/s), after {lf:.3f} s "
                  f"({ef / lf / 1e6:.2f} M events/s), after/before {lf / lb:.3f}")
            print(f"  whole process: before {eb / b / 1e6:.2f} M events/s, after {ef / f / 1e6:.2f} M events/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

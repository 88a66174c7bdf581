#!/usr/bin/env python3
"""Fit a hardware profile's `decode_contention` (kv, encoder) on a `validate all` study's
capacity bursts and write, for each round k, DIR/profile/profile-calibrated-<k>.toml with the
fitted table added, as OUT/profile-calibrated-<k>-decode-contention.toml.

Per decode iteration that ran while every worker was busy (mean concurrency >= workers -
0.05) in the bursts: y = measured / profiled (operator profile) / ((workers / cores) x the
round's alone decode factor) - 1, regressed without intercept on the iteration's KV share of
its bytes (the cost model's, `(ctx + batch) / (ctx + batch + h)`, h = LLM weight bytes over
one token's KV bytes) and the share of its span an encoder batch ran beside it
(`step_diag`'s with_encode); negative coefficients are set to 0. Then
`moonagent validate compare --run DIR/runs/<mode>-<load>-<k> ... --hardware OUT/...` prices
the round's runs with it.

usage: fit_decode_contention.py STUDY_DIR OUT_DIR [--step-diag BIN] [--h 6875] [--workers 3] [--cores 2]
(BIN: target/release/examples/step_diag, built by
`cargo build --release -p moonagent-validation --example step_diag`; h 6875 is the CPU
study model's, qwen2.5-vl-tiny.)
"""
import argparse, csv, io, os, re, subprocess, sys


def lstsq2(rows):
    """Least squares of y on (a, b), no intercept, coefficients >= 0."""
    saa = sum(a * a for a, _, _ in rows); sbb = sum(b * b for _, b, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    say = sum(a * y for a, _, y in rows); sby = sum(b * y for _, b, y in rows)
    det = saa * sbb - sab * sab
    ka, kb = ((say * sbb - sby * sab) / det, (sby * saa - say * sab) / det) if det > 0 else (0.0, 0.0)
    if ka < 0:
        ka, kb = 0.0, max(0.0, sby / sbb) if sbb > 0 else 0.0
    if kb < 0:
        ka, kb = max(0.0, say / saa) if saa > 0 else 0.0, 0.0
    return ka, kb


def main():
    p = argparse.ArgumentParser()
    p.add_argument("study"); p.add_argument("out")
    p.add_argument("--step-diag", default="target/release/examples/step_diag")
    p.add_argument("--h", type=float, default=6875.0)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--cores", type=float, default=2.0)
    a = p.parse_args()
    prof = os.path.join(a.study, "profile")
    bursts = sorted(d for d in os.listdir(a.study) if d.startswith("capacity-"))
    if not bursts:
        sys.exit(f"{a.study}: no capacity-<mode>/ folder (a study with --capacity measured)")
    steps = []
    for d in bursts:
        out = subprocess.run([a.step_diag, os.path.join(prof, "profile.toml"),
                              os.path.join(a.study, d, "timed.jsonl")],
                             check=True, capture_output=True, text=True).stdout
        for r in csv.DictReader(io.StringIO(out)):
            if r["kind"] == "decode" and float(r["busy"]) >= a.workers - 0.05:
                x = int(r["ctx_sum"]) + int(r["batch"])
                steps.append((x / (x + a.h), float(r["with_encode"]),
                              int(r["measured_ns"]) / int(r["predicted_ns"])))
    os.makedirs(a.out, exist_ok=True)
    k = 0
    while os.path.exists(os.path.join(prof, f"profile-calibrated-{k}.toml")):
        src = open(os.path.join(prof, f"profile-calibrated-{k}.toml")).read()
        alone = float(re.search(r"\[step_scale\][^\[]*?\ndecode = ([0-9.eE+-]+)", src, re.S).group(1))
        share = a.workers / a.cores
        kv, enc = lstsq2([(s, e, r / (share * alone) - 1.0) for s, e, r in steps])
        path = os.path.join(a.out, f"profile-calibrated-{k}-decode-contention.toml")
        with open(path, "w") as f:
            f.write(src.rstrip() + f"\n\n[decode_contention]\nkv = {kv!r}\nencoder = {enc!r}\n")
        print(f"round {k}: {len(steps)} all-busy decode iterations, alone decode {alone:.3f}: "
              f"kv {kv:.3f}, encoder {enc:.3f} -> {path}")
        k += 1


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Sweep results from Python: the example plan's tables load as they are in polars and
pandas; shards run as separate processes (through the Slurm array script) and, when Ray is
installed, as Ray tasks merge into tables byte-identical to a single run.

    python tests/python/test_sweep_parquet.py --bin target/debug/moonagent [--ray] [--full]

Run by scripts/test_sweep_python.sh, which builds the binary and prepares a venv with
polars, pandas and pyarrow (and ray). Without --full the example plan runs at a reduced
size (40 sessions, 2 seeds) so a debug build finishes in seconds; --full runs it as written.
"""

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "sweeps", "seed002_type_aware.toml")
SMALL = ["--set", "base.workload.config.sessions=40", "--set", "seeds=2"]


def sh(cmd, **kw):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"FAILED ({p.returncode}): {' '.join(cmd)}")
    print(f"  ok {time.time() - t:6.1f} s  {' '.join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd))}")
    return p.stdout


def check_tables(out, points, seeds):
    import pandas as pd
    import polars as pl
    import pyarrow.parquet as pq

    res_path = os.path.join(out, "results.parquet")
    sum_path = os.path.join(out, "summary.parquet")
    runs = points * seeds

    df = pl.read_parquet(res_path)
    pdf = pd.read_parquet(res_path)
    assert df.height == runs and len(pdf) == runs, (df.height, len(pdf), runs)
    assert df.columns == list(pdf.columns)
    axes = ["reuse_scale", "grace_ms", "capacity"]
    assert df.columns[:3] == ["point", "point_id", "seed"], df.columns
    assert df.columns[3:6] == axes, df.columns
    assert df.schema["reuse_scale"] == pl.Float64
    assert df.schema["grace_ms"] == pl.Int64
    assert df.schema["capacity"] == pl.String
    assert df.schema["encoder_output.hit_rate"] == pl.Float64
    assert df.schema["encoder_output.lookups"] == pl.UInt64
    assert df.null_count().sum_horizontal().item() == 0
    assert df.select(["point", "seed"]).unique().height == runs, "every run once"
    assert df["point"].is_sorted() and df["point"].n_unique() == points
    for col in ("encoder_output.hit_rate", "kv_cache.hit_rate", "total.saving_time_rate"):
        assert df[col].min() >= 0.0 and df[col].max() <= 1.0, col
    # polars and pandas read the same numbers.
    for col in df.columns:
        a, b = df[col].to_list(), pdf[col].tolist()
        assert a == b, col
    # More capacity never lowers the KV hit rate on average in this workload.
    by_cap = df.group_by("capacity").agg(pl.col("kv_cache.hit_rate").mean()).sort("capacity")
    assert by_cap.height == 3

    s = pl.read_parquet(sum_path)
    ps = pd.read_parquet(sum_path)
    assert s.height == points and len(ps) == points
    assert (s["n_seeds"] == seeds).all()
    for suffix in ("mean", "ci95_lo", "ci95_hi"):
        assert f"encoder_output.hit_rate.{suffix}" in s.columns
    lo, mean, hi = (s[f"kv_cache.hit_rate.{x}"] for x in ("ci95_lo", "mean", "ci95_hi"))
    assert ((lo <= mean) & (mean <= hi)).all()
    meta = pq.read_metadata(res_path).metadata
    assert b"moonagent.sweep.plan_hash" in meta
    assert json.loads(meta[b"moonagent.sweep.axes"]) == axes
    return df


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the moonagent binary")
    ap.add_argument("--ray", action="store_true", help="also run the Ray launcher on a local Ray instance")
    ap.add_argument("--full", action="store_true", help="run the example plan as written (release build advised)")
    args = ap.parse_args()
    binary = os.path.abspath(args.bin)
    sets = [] if args.full else SMALL
    work = tempfile.mkdtemp(prefix="moonagent-sweep-py-")
    try:
        print(f"sweep Python checks in {work}")
        plan_out = sh([binary, "sweep", "check", EXAMPLE, *sets])
        points = int(plan_out.split(" points x ")[0].rsplit(" ", 1)[1])
        seeds = int(plan_out.split(" points x ")[1].split(" seeds")[0])
        assert points == 60, plan_out

        # 1. The example plan, on 2 threads; its tables in polars and pandas.
        single = os.path.join(work, "single")
        sh([binary, "sweep", "run", EXAMPLE, "--out", single, "--threads", "2", "--quiet", *sets])
        check_tables(single, points, seeds)

        # 2. Shards as separate processes, through the Slurm array script, then merge.
        slurm = os.path.join(work, "slurm")
        procs = []
        for i in range(3):
            env = dict(os.environ, SLURM_ARRAY_TASK_ID=str(i), SLURM_ARRAY_TASK_MIN="0", SLURM_ARRAY_TASK_COUNT="3",
                       SLURM_CPUS_PER_TASK="1", MOONAGENT=binary, SWEEP_SET=" ".join(sets))
            procs.append(subprocess.Popen(["bash", os.path.join(ROOT, "examples", "slurm", "sweep_array.sbatch"), EXAMPLE, slurm],
                                          env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for p in procs:
            _, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"shard process failed:\n{err}")
        print("  ok         3 shard processes (examples/slurm/sweep_array.sbatch)")
        merged = os.path.join(work, "merged")
        sh([binary, "sweep", "merge", *[os.path.join(slurm, f"shard-{i}") for i in range(3)],
            "--out", os.path.join(merged, "results.parquet")])
        for f in ("results.parquet", "summary.parquet"):
            assert filecmp.cmp(os.path.join(single, f), os.path.join(merged, f), shallow=False), f"{f}: shards+merge differ from one run"
        print("  ok         merged shards byte-identical to the single run")

        # 3. best: Pareto front and the best point under an SLO, as JSON.
        best = json.loads(sh([binary, "sweep", "best", single, "--x", "encoder_output.recompute_s",
                              "--y", "kv_cache.hit_rate:max", "--slo", "kv_cache.hit_rate>=0.5", "--json"]))
        assert best["points"] == points and best["front"], best
        if best["best"] is not None:
            assert best["best"]["means"]["kv_cache.hit_rate"] >= 0.5

        # 4. Ray: one task per shard on a local Ray instance, then merge.
        if args.ray:
            ray_out = os.path.join(work, "ray")
            sh([sys.executable, os.path.join(ROOT, "examples", "ray", "ray_sweep.py"), EXAMPLE, "--out", ray_out,
                "--shards", "3", "--threads", "1", "--num-cpus", "2", "--binary", binary,
                *[x for s in sets[1::2] for x in ("--set", s)]])
            for f in ("results.parquet", "summary.parquet"):
                assert filecmp.cmp(os.path.join(single, f), os.path.join(ray_out, f), shallow=False), f"{f}: Ray differs"
            print("  ok         Ray shards byte-identical to the single run")
        print("sweep Python checks: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

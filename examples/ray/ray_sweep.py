#!/usr/bin/env python3
"""Run a moonagent sweep on a Ray cluster: one Ray task per shard, then a merge.

Each task runs the moonagent binary on its shard,

    moonagent sweep run PLAN --out OUT/shard-<i> --shard <i>/<N> --threads T --resume

reserving T CPUs, so Ray packs as many shards per node as fit. A task that fails (a
crashed process, a lost node) is retried by Ray; --resume makes the retry skip the runs
its earlier attempt finished. When every shard is done the driver runs

    moonagent sweep merge OUT/shard-* --out OUT/results.parquet

which checks that every (point, seed) is present exactly once, and writes
OUT/summary.parquet beside it. The results are byte-identical to a single-machine run.

OUT must be on a filesystem every node sees (the binary and the plan too, or give
--binary with a path valid on every node). Without --address the script starts a local
Ray instance (what CI does); --address auto joins a running cluster.

    python examples/ray/ray_sweep.py examples/sweeps/seed002_type_aware.toml \\
        --out /shared/sweeps/seed002 --shards 16 --threads 4 --address auto

Needs `pip install ray`; moonagent itself needs nothing from Python.
"""

import argparse
import os
import shutil
import subprocess
import sys


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plan", help="sweep plan (TOML)")
    ap.add_argument("--out", required=True, help="sweep folder; shards go to OUT/shard-<i>")
    ap.add_argument("--shards", type=int, required=True, help="number of shards (Ray tasks)")
    ap.add_argument("--threads", type=int, default=1, help="threads per shard, and the CPUs each task reserves (default 1)")
    ap.add_argument(
        "--binary",
        default=os.environ.get("MOONAGENT") or shutil.which("moonagent") or "moonagent",
        help="the moonagent binary (default: $MOONAGENT, else moonagent on PATH)",
    )
    ap.add_argument("--address", default=None, help="Ray cluster address ('auto' joins a running cluster); default: a local instance")
    ap.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray instance (default: all)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="plan override passed to every shard (repeatable)")
    ap.add_argument("--retries", type=int, default=2, help="Ray retries per failed shard (default 2)")
    args = ap.parse_args(argv)
    if args.shards < 1:
        ap.error("--shards must be at least 1")
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    return args


def shard_command(binary, plan, out, i, n, threads, sets):
    cmd = [binary, "sweep", "run", plan, "--out", os.path.join(out, f"shard-{i}"), "--shard", f"{i}/{n}", "--threads", str(threads), "--resume", "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def run_shard(cmd):
    """Body of one Ray task: run the binary, raise with its stderr if it fails."""
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr[-4000:]}")
    return p.stdout


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import ray  # imported here so --help works without Ray

    binary = os.path.abspath(args.binary) if os.path.exists(args.binary) else args.binary
    plan = os.path.abspath(args.plan)
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    # Validate the plan once on the driver before scheduling anything.
    check = [binary, "sweep", "check", plan] + [x for s in args.sets for x in ("--set", s)]
    subprocess.run(check, check=True)

    if args.address is None:
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=args.address, log_to_driver=False)
    try:
        task = ray.remote(run_shard).options(
            num_cpus=args.threads, max_retries=args.retries, retry_exceptions=True
        )
        cmds = [shard_command(binary, plan, out, i, args.shards, args.threads, args.sets) for i in range(args.shards)]
        refs = [task.remote(c) for c in cmds]
        for i, _ in enumerate(ray.get(refs)):
            print(f"shard {i}/{args.shards} done", file=sys.stderr)
    finally:
        ray.shutdown()

    dirs = [os.path.join(out, f"shard-{i}") for i in range(args.shards)]
    merge = [binary, "sweep", "merge", *dirs, "--out", os.path.join(out, "results.parquet")]
    subprocess.run(merge, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

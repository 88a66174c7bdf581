"""scripts/seed_compare.py on two seeds: the same binary twice gives the same ratios seed
by seed (a paired log ratio of exactly 0, higher on no seed), one CSV row per (binary,
seed), and a bad argument is refused with a message, not a traceback.

    python tests/python/test_seed_compare.py --bin target/debug/moonagent
"""
import argparse
import csv
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "seed_compare.py"


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "rows.csv"
        r = subprocess.run([sys.executable, str(SCRIPT), a.bin, a.bin, "--workload", "w4",
                            "--requests", "40", "--seeds", "2", "--csv", str(out)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"seed_compare failed:\n{r.stderr}")
            return 1
        if "mean log ratio of full/b3 throughput +0.0000 (x1.000)" not in r.stdout \
                or "higher on 0/2 seeds" not in r.stdout:
            print(f"seed_compare: the same binary twice did not pair to 0:\n{r.stdout}")
            return 1
        rows = list(csv.DictReader(out.open()))
        if sorted((x["binary"], x["seed"]) for x in rows) != [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]:
            print(f"seed_compare: CSV rows {rows}")
            return 1
        by = {(x["binary"], x["seed"]): x for x in rows}
        for k in ("0", "1"):
            if by[("0", k)]["throughput_ratio"] != by[("1", k)]["throughput_ratio"]:
                print(f"seed_compare: seed {k} differs between two runs of one binary: {rows}")
                return 1
            if not float(by[("0", k)]["throughput_ratio"]) > 0:
                print(f"seed_compare: seed {k} ratio {by[('0', k)]}")
                return 1
        bad = subprocess.run([sys.executable, str(SCRIPT), a.bin, "--workload", "w4", "--modes", "full"],
                             capture_output=True, text=True)
        if bad.returncode == 0 or "--modes takes two modes" not in bad.stderr or "Traceback" in bad.stderr:
            print(f"seed_compare accepted one mode or failed badly:\n{bad.stderr}")
            return 1
    print("seed_compare: same binary pairs to 0 on 2 seeds, CSV rows and argument errors checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())

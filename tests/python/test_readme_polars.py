"""The README's polars examples run as written on what `moonagent simulate --out out` and
`moonagent simulate --trace T --out DIR` write.

    python tests/python/test_readme_polars.py --bin target/debug/moonagent
"""
import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def block(readme: str, marker: str):
    m = re.search(r"<!-- " + marker + r"[^>]*-->\s*```python\n(.*?)```", readme, re.S)
    return m.group(1) if m else None


def run_block(code: str, cwd: str, want: tuple, what: str) -> bool:
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"README {what} failed:\n{r.stderr}")
        return False
    for w in want:
        if w not in r.stdout:
            print(f"README {what} printed no row for {w}:\n{r.stdout}")
            return False
    return True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    a = p.parse_args()
    readme = (ROOT / "README.md").read_text()
    ladder = block(readme, "polars-example:")
    workers = block(readme, "polars-example-workers:")
    for name, code in (("polars-example", ladder), ("polars-example-workers", workers)):
        if code is None:
            print(f"README.md: no python block after '<!-- {name}:' found")
            return 1
    bin_ = str(pathlib.Path(a.bin).resolve())
    quiet = dict(check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="moonagent-readme-") as d:
        subprocess.run([bin_, "simulate", "--requests", "100", "--out", "out"], cwd=d, **quiet)
        # One row per mode of the ladder.
        if not run_block(ladder, d, ("B0", "B1", "B2", "B3", "Full"), "polars example"):
            return 1
        # The commands the README states before the per-worker example.
        subprocess.run([bin_, "trace", "generate", "w4", "--requests", "300", "--out",
                        "w4.jsonl"], cwd=d, **quiet)
        subprocess.run([bin_, "simulate", "--trace", "w4.jsonl", "--modes", "b3,full",
                        "--out", "out-w4"], cwd=d, **quiet)
        # One row per EPD role.
        if not run_block(workers, d, ("encoder", "prefill", "decode"),
                         "per-worker polars example"):
            return 1
    print("ok  README polars examples run and print a row per mode and per role")
    return 0


if __name__ == "__main__":
    sys.exit(main())

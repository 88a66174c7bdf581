"""The README's polars example runs as written on what `moonagent simulate --out out` writes.

    python tests/python/test_readme_polars.py --bin target/debug/moonagent
"""
import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    a = p.parse_args()
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- polars-example[^>]*-->\s*```python\n(.*?)```", readme, re.S)
    if not m:
        print("README.md: no polars example block after '<!-- polars-example' found")
        return 1
    code = m.group(1)
    with tempfile.TemporaryDirectory(prefix="moonagent-readme-") as d:
        subprocess.run([str(pathlib.Path(a.bin).resolve()), "simulate", "--requests", "100",
                        "--out", "out"], cwd=d, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        r = subprocess.run([sys.executable, "-c", code], cwd=d, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"README polars example failed:\n{r.stderr}")
            return 1
        # One row per mode of the ladder.
        for mode in ("B0", "B1", "B2", "B3", "Full"):
            if mode not in r.stdout:
                print(f"README polars example printed no row for {mode}:\n{r.stdout}")
                return 1
    print("ok  README polars example runs and prints a row per mode")
    return 0


if __name__ == "__main__":
    sys.exit(main())

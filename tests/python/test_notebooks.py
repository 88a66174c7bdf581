#!/usr/bin/env python3
"""The notebooks in notebooks/: committed clean, and each runs top to bottom.

    python tests/python/test_notebooks.py [--input DIR] [--figures DIR] [NOTEBOOK.ipynb ...]

Checks first that no notebook carries outputs, an execution count or an absolute path
(a /home, /root, /work, /tmp, /Users or C:\\ path in any cell), then executes every one
headless (nbclient, ipykernel) in notebooks/ with MOONAGENT_NB_INPUT=DIR (without
--input, on the notebooks' own default, target/nb-inputs); a cell that
raises fails the run, naming the notebook and the cell. Run by scripts/test_notebooks.sh,
which makes DIR with scripts/nb_inputs.sh --quick.
"""

import argparse
import base64
import os
import re
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NB_DIR = os.path.join(ROOT, "notebooks")
ABSOLUTE = re.compile(r"""(?<![\w.])(/home/|/root/|/work/|/tmp/|/Users/|/var/|[A-Za-z]:\\\\)""")


def check_clean(path):
    """Errors: outputs, execution counts or absolute paths in a committed notebook."""
    nb = nbformat.read(path, as_version=4)
    errs = []
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            if c.get("outputs"):
                errs.append(f"cell {i} has outputs (strip them)")
            if c.get("execution_count") is not None:
                errs.append(f"cell {i} has an execution count (strip it)")
        m = ABSOLUTE.search(c.source)
        if m:
            errs.append(f"cell {i} names an absolute path ({m.group(0)}...)")
    return nb, errs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", help="the notebooks' input folder (default: theirs, target/nb-inputs)")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per cell")
    ap.add_argument("--figures", help="also write every figure as <notebook>-<n>.png here")
    ap.add_argument("notebooks", nargs="*")
    a = ap.parse_args()
    paths = a.notebooks or sorted(
        os.path.join(NB_DIR, f) for f in os.listdir(NB_DIR) if f.endswith(".ipynb")
    )
    assert paths, f"no notebook in {NB_DIR}"
    if a.input:
        os.environ["MOONAGENT_NB_INPUT"] = os.path.abspath(a.input)
    failed = []
    for p in paths:
        name = os.path.relpath(p, ROOT)
        nb, errs = check_clean(p)
        if errs:
            failed.append(name)
            for e in errs:
                print(f"FAIL {name}: {e}")
            continue
        t = time.time()
        client = NotebookClient(
            nb, timeout=a.timeout, kernel_name="python3", resources={"metadata": {"path": NB_DIR}}
        )
        try:
            client.execute()
        except CellExecutionError as e:
            failed.append(name)
            print(f"FAIL {name}:\n{e}")
            continue
        pngs = [
            o["data"]["image/png"]
            for c in nb.cells
            if c.cell_type == "code"
            for o in c.get("outputs", [])
            if "image/png" in o.get("data", {})
        ]
        if a.figures:
            os.makedirs(a.figures, exist_ok=True)
            stem = os.path.splitext(os.path.basename(p))[0]
            for k, png in enumerate(pngs):
                with open(os.path.join(a.figures, f"{stem}-{k}.png"), "wb") as f:
                    f.write(base64.b64decode(png))
        figures = len(pngs)
        print(f"  ok {time.time() - t:5.1f} s  {name} ({figures} figures)")
    print(f"{len(paths) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

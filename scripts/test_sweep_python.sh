#!/usr/bin/env bash
# Sweep results from Python (issue 7): the example plan's Parquet tables load as they are
# in polars and pandas; shards run as separate processes through the Slurm array script and
# as Ray tasks on a local Ray instance merge into tables byte-identical to one run.
#
# Installs, idempotently, a venv under $MOONAGENT_HOME (default ~/.cache/moonagent)/py-venv
# with polars, pandas and pyarrow (~30 s the first time) and ray (~90 s the first time).
# Also the README's polars examples and scripts/seed_compare.py (tests/python/).
# Builds the debug binary unless MOONAGENT_BIN names one.
#
#   MOONAGENT_SWEEP_RAY=0    skip the Ray part (the process-level shards + merge still run)
#   MOONAGENT_SWEEP_FULL=1   run the example plan at its written size (use a release binary)
#
# Without network access to PyPI the script says so and skips, unless CI=true.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOME_DIR=${MOONAGENT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/moonagent}
VENV=$HOME_DIR/py-venv
RAY=${MOONAGENT_SWEEP_RAY:-1}
PY_PKGS=("polars==2.1.0" "pandas==3.1.1" "pyarrow==26.0.1")
RAY_PKG="ray==2.60.0"

log() { echo "[sweep-python] $*" >&2; }
have() { "$VENV/bin/python" -c "import $1" 2>/dev/null; }
skip_or_fail() {
  if [[ ${CI:-} == true ]]; then log "$1"; exit 1; fi
  log "$1; skipping"; exit 0
}

command -v python3 >/dev/null || skip_or_fail "python3 not found"
if [[ ! -x $VENV/bin/python ]]; then
  log "creating $VENV"
  python3 -m venv "$VENV" || skip_or_fail "cannot create a venv at $VENV"
fi
if ! have polars || ! have pandas || ! have pyarrow; then
  log "installing ${PY_PKGS[*]} into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PKGS[@]}" ||
    skip_or_fail "could not install polars/pandas/pyarrow from PyPI"
fi
if [[ $RAY == 1 ]] && ! have ray; then
  log "installing $RAY_PKG into $VENV"
  if ! "$VENV/bin/pip" install -q --disable-pip-version-check "$RAY_PKG"; then
    [[ ${CI:-} == true ]] && { log "could not install ray"; exit 1; }
    log "could not install ray; the Ray part is skipped"
    RAY=0
  fi
fi

BIN=${MOONAGENT_BIN:-}
if [[ -z $BIN ]]; then
  cargo build --quiet --bin moonagent
  BIN=${CARGO_TARGET_DIR:-target}/debug/moonagent
fi

# Syntax check of the Ray launcher without writing __pycache__.
"$VENV/bin/python" -c 'import sys; compile(open(sys.argv[1]).read(), sys.argv[1], "exec")' examples/ray/ray_sweep.py
args=(--bin "$BIN")
[[ $RAY == 1 ]] && args+=(--ray)
[[ ${MOONAGENT_SWEEP_FULL:-0} == 1 ]] && args+=(--full)
"$VENV/bin/python" tests/python/test_sweep_parquet.py "${args[@]}"
# The README's "analyse them with polars" example, as written.
"$VENV/bin/python" tests/python/test_readme_polars.py --bin "$BIN"
"$VENV/bin/python" tests/python/test_seed_compare.py --bin "$BIN"

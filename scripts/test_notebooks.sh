#!/usr/bin/env bash
# The notebooks (issue 13): every notebook in notebooks/ is committed without outputs or
# absolute paths and runs top to bottom, headless, on small inputs made here
# (scripts/nb_inputs.sh --quick into target/nb-inputs-quick; under a minute on a debug build,
# most of it the validation notebook's real-time backend run); a cell that raises fails.
#
# Uses the venv of scripts/test_sweep_python.sh ($MOONAGENT_HOME, default
# ~/.cache/moonagent, /py-venv) and installs into it, idempotently, polars and pyarrow (as
# that script does) plus matplotlib, nbclient, nbformat and ipykernel (~40 s the first time).
# Builds the debug binary unless MOONAGENT_BIN names one. The kernel is the venv's own
# python (ipykernel's built-in python3 spec), so nothing is registered outside the venv.
# Without network access to PyPI the script says so and skips, unless CI=true.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOME_DIR=${MOONAGENT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/moonagent}
VENV=$HOME_DIR/py-venv
PY_PKGS=("polars==2.1.0" "pyarrow==26.0.1" "matplotlib==3.11.2" "nbclient==0.11.0"
  "nbformat==5.11.1" "ipykernel==7.4.0")

log() { echo "[notebooks] $*" >&2; }
have() { "$VENV/bin/python" -c "import $1" 2>/dev/null; }
skip_or_fail() {
  if [[ ${CI:-} == true ]]; then log "$1"; exit 1; fi
  log "$1; skipping"; exit 0
}

t0=$SECONDS
command -v python3 >/dev/null || skip_or_fail "python3 not found"
if [[ ! -x $VENV/bin/python ]]; then
  log "creating $VENV"
  python3 -m venv "$VENV" || skip_or_fail "cannot create a venv at $VENV"
fi
if ! have polars || ! have pyarrow || ! have matplotlib || ! have nbclient || ! have nbformat ||
  ! have ipykernel; then
  log "installing ${PY_PKGS[*]} into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PKGS[@]}" ||
    skip_or_fail "could not install the notebook packages from PyPI"
fi

BIN=${MOONAGENT_BIN:-}
if [[ -z $BIN ]]; then
  cargo build --quiet --bin moonagent
  BIN=${CARGO_TARGET_DIR:-target}/debug/moonagent
fi

IN=${CARGO_TARGET_DIR:-target}/nb-inputs-quick
rm -rf "$IN"
mkdir -p "$IN"
t1=$SECONDS
if ! MOONAGENT_BIN=$BIN MOONAGENT_NB_INPUT=$IN bash scripts/nb_inputs.sh --quick 2> "$IN.log"; then
  cat "$IN.log" >&2
  exit 1
fi
log "inputs in $(( SECONDS - t1 )) s"
# A batch log (stderr not a terminal) names each stage of `validate all` on a line of its
# own (progress::stage).
for stage in "validate \[ *[0-9]+ s\] round 1/1: calibration run" \
  "validate \[ *[0-9]+ s\] round 1/1: B3 at 70% of capacity"; do
  if ! grep -Eq "$stage" "$IN.log"; then
    cat "$IN.log" >&2
    echo "[notebooks] FAIL: no line matching '$stage' in the inputs' stderr" >&2
    exit 1
  fi
done
t1=$SECONDS
PATH=$VENV/bin:$PATH JUPYTER_PLATFORM_DIRS=1 \
  "$VENV/bin/python" tests/python/test_notebooks.py --input "$IN" 2> >(grep -v 'Kernel is running over TCP' >&2)
log "notebooks executed in $(( SECONDS - t1 )) s; the whole step $(( SECONDS - t0 )) s"

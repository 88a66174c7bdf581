#!/usr/bin/env bash
# libCacheSim as the oracle of `moonagent replay --cache-model plain` (issue 15): LRU, FIFO,
# S3-FIFO, SIEVE and Belady must give libCacheSim's hit counts exactly on a Zipf trace and
# on Mooncake's conversation trace (the latter needs MOONAGENT_TRACES; see the test's docs).
#
# Installs, idempotently, PyPI's libcachesim into the suite's venv
# $MOONAGENT_HOME (default ~/.cache/moonagent)/py-venv (the venv of test_sweep_python.sh).
# Builds the debug binary unless MOONAGENT_BIN names one. ~35 s on 2 cores.
#
# Without network access to PyPI the script says so and skips, unless CI=true.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOME_DIR=${MOONAGENT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/moonagent}
VENV=$HOME_DIR/py-venv
PKG="libcachesim==0.3.5"

log() { echo "[libcachesim] $*" >&2; }
skip_or_fail() {
  if [[ ${CI:-} == true ]]; then log "$1"; exit 1; fi
  log "$1; skipping"; exit 0
}

command -v python3 >/dev/null || skip_or_fail "python3 not found"
if [[ ! -x $VENV/bin/python ]]; then
  log "creating $VENV"
  python3 -m venv "$VENV" || skip_or_fail "cannot create a venv at $VENV"
fi
if ! "$VENV/bin/python" -c "import libcachesim" 2>/dev/null; then
  log "installing $PKG into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "$PKG" ||
    skip_or_fail "could not install $PKG from PyPI"
fi

BIN=${MOONAGENT_BIN:-}
if [[ -z $BIN ]]; then
  cargo build --quiet --bin moonagent
  BIN=${CARGO_TARGET_DIR:-target}/debug/moonagent
fi
"$VENV/bin/python" -u tests/python/test_libcachesim_oracle.py --bin "$BIN"

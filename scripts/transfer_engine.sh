#!/usr/bin/env bash
# Build Mooncake's Transfer Engine (shared libraries) from the vendored source, once per machine,
# for moonagent's `transfer-engine` cargo feature (mooncake-rs links against it).
#
#   scripts/transfer_engine.sh build   install missing -dev packages, build if no stamp, print env
#   scripts/transfer_engine.sh env     print the env lines only (fails if not built)
#   scripts/transfer_engine.sh path    print the lib dir only (fails if not built)
#
# Printed env (one VAR=value per line, for `export $(bash scripts/transfer_engine.sh build)`):
#   TRANSFER_ENGINE_LIB_DIR=<dir>   mooncake-rs's build.rs links the .so files found there
#   LD_LIBRARY_PATH=<dir>[:old]     the test/run binaries load them from there
#
# Installs into $MOONAGENT_HOME (default ~/.cache/moonagent)/transfer-engine/<commit>/:
#   lib/      only the shared libraries (libtransfer_engine.so, libmooncake_common.so, libasio.so):
#             a libtransfer_engine.a there would make mooncake-rs link statically and fail
#   prefix/   yalantinglibs headers (a build-time dependency)
#   .built    stamp written last; a second call with the stamp present returns at once
# The build log goes to $MOONAGENT_HOME/logs/transfer-engine-<commit>.log; the build time is
# written to lib/../build-seconds. A failed build leaves no stamp (the next call retries).
#
# Tunables (env): MOONAGENT_TE_TARBALL (default ../shared/vendor/mooncake/mooncake-3b5a5941-src.tar.gz
# relative to the repository root), MOONAGENT_TE_JOBS (2).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
COMMIT=3b5a5941
HOME_DIR=${MOONAGENT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/moonagent}
TARBALL=${MOONAGENT_TE_TARBALL:-$ROOT/../shared/vendor/mooncake/mooncake-$COMMIT-src.tar.gz}
JOBS=${MOONAGENT_TE_JOBS:-2}
DEST=$HOME_DIR/transfer-engine/$COMMIT
LIB=$DEST/lib
STAMP=$DEST/.built
LOGS=$HOME_DIR/logs
LOG=$LOGS/transfer-engine-$COMMIT.log
# Debian packages the Transfer Engine's cmake needs (ibverbs is linked even without RDMA hardware).
# patchelf: the libraries' RUNPATH points into the (deleted) build tree; it is set to $ORIGIN.
PKGS="cmake g++ make pkg-config patchelf libibverbs-dev librdmacm-dev libgoogle-glog-dev libgflags-dev
libjsoncpp-dev libnuma-dev libyaml-cpp-dev libcurl4-openssl-dev libasio-dev"

log() { echo "[transfer-engine] $*" >&2; }

print_env() {
  echo "TRANSFER_ENGINE_LIB_DIR=$LIB"
  echo "LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

require_built() {
  if [[ ! -f $STAMP ]]; then
    log "not built: no $STAMP; run: bash scripts/transfer_engine.sh build"
    exit 1
  fi
}

install_packages() {
  local missing="" p
  for p in $PKGS; do
    dpkg -s "$p" > /dev/null 2>&1 || missing="$missing $p"
  done
  [[ -z $missing ]] && return 0
  log "installing missing Debian packages:$missing"
  local SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
  $SUDO apt-get update -qq >> "$LOG" 2>&1 || { log "apt-get update failed; see $LOG"; exit 1; }
  # shellcheck disable=SC2086
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >> "$LOG" 2>&1; then
    log "apt-get install failed for:$missing; see $LOG"; exit 1
  fi
}

# Every library in lib/ finds its siblings through RUNPATH=$ORIGIN (cmake leaves the build
# tree's folders there). Checked on every call, so an older build here is fixed in place.
fix_runpath() {
  local f bad=""
  for f in "$LIB"/*.so; do
    readelf -d "$f" | grep 'RUNPATH.*\[\$ORIGIN\]' > /dev/null || bad="$bad $f"
  done
  [[ -z $bad ]] && return 0
  install_packages
  # shellcheck disable=SC2086
  patchelf --set-rpath '$ORIGIN' $bad
}

build() {
  mkdir -p "$LOGS" "$DEST"
  # One build at a time per machine: a second caller waits here, then sees the stamp.
  exec 9> "$DEST/.lock"
  flock 9
  if [[ -f $STAMP ]]; then fix_runpath; print_env; return 0; fi
  [[ -f $TARBALL ]] || { log "source tarball not found: $TARBALL (set MOONAGENT_TE_TARBALL)"; exit 1; }
  : > "$LOG"
  install_packages
  local start src prefix secs
  start=$(date +%s)
  log "building the Transfer Engine from $TARBALL into $DEST (2-21 min measured on 2 cores); log $LOG"
  rm -rf "$DEST/src" "$LIB"
  mkdir -p "$DEST/src"
  tar xzf "$TARBALL" -C "$DEST/src"
  src=$(find "$DEST/src" -mindepth 1 -maxdepth 1 -type d | head -1)
  prefix=$DEST/prefix
  {
    nice -n 15 cmake -S "$src/extern/yalantinglibs" -B "$src/build-ylt" -DBUILD_EXAMPLES=OFF \
      -DBUILD_BENCHMARK=OFF -DBUILD_UNIT_TESTS=OFF -DCMAKE_INSTALL_PREFIX="$prefix" &&
    nice -n 15 make -C "$src/build-ylt" -j"$JOBS" install &&
    nice -n 15 cmake -S "$src" -B "$src/build-te" -DCMAKE_BUILD_TYPE=Release -DENABLE_DEBUG_SYMBOLS=OFF \
      -DBUILD_SHARED_LIBS=ON -DWITH_STORE=OFF -DWITH_STORE_RUST=OFF -DBUILD_UNIT_TESTS=OFF \
      -DBUILD_EXAMPLES=OFF -DBUILD_BENCHMARK=OFF -DCMAKE_PREFIX_PATH="$prefix" &&
    nice -n 15 make -C "$src/build-te" -j"$JOBS" transfer_engine
  } >> "$LOG" 2>&1 || { log "build failed; last lines of $LOG:"; tail -20 "$LOG" >&2; exit 1; }
  mkdir -p "$LIB"
  local want
  for want in libtransfer_engine.so libmooncake_common.so libasio.so; do
    local f
    f=$(find "$src/build-te" -name "$want" \( -type f -o -type l \) | head -1)
    [[ -n $f ]] || { log "build finished but $want was not produced; see $LOG"; exit 1; }
    cp -L "$f" "$LIB/$want"
  done
  fix_runpath
  secs=$(( $(date +%s) - start ))
  echo "$secs" > "$DEST/build-seconds"
  # The object files are not needed once the libraries are copied (hundreds of MB).
  rm -rf "$src/build-te" "$src/build-ylt"
  touch "$STAMP"
  log "built in ${secs}s"
  print_env
}

case "${1:-}" in
  build) build ;;
  env) require_built; print_env ;;
  path) require_built; echo "$LIB" ;;
  *) echo "usage: $0 build|env|path" >&2; exit 2 ;;
esac

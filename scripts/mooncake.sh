#!/usr/bin/env bash
# Start or stop a real Mooncake Store on loopback for moonagent's real-store tests and runs.
#
#   scripts/mooncake.sh up      install (idempotent), start master + moonagent's bridge, wait for health
#   scripts/mooncake.sh down    stop both, by PID file only
#   scripts/mooncake.sh env     print the environment the tests read (MOONAGENT_MOONCAKE_BRIDGE=...)
#
# Installs into $MOONAGENT_HOME (default ~/.cache/moonagent): a Python venv with the PyPI wheel
# mooncake-transfer-engine-non-cuda (ships mooncake_master and the Python client), and the one
# system library the wheel needs on Debian 12 (libibverbs1, via apt-get, only if missing).
# The bridge (scripts/mooncake_bridge.py) holds the store client that contributes the memory
# segment, and serves moonagent's raw-bytes protocol to the Rust BridgeStore.
#
# Tunables (env): MC_VERSION (0.3.13.post1), MC_RPC_PORT (50151), MC_META_PORT (18180),
# MC_ADMIN_PORT (19103), MC_BRIDGE_PORT (18190), MC_SEGMENT_BYTES (268435456 = 256 MiB),
# MC_MASTER_EXTRA_ARGS (e.g. "--eviction_high_watermark_ratio=0.8 --default_kv_lease_ttl=500").
set -euo pipefail

HOME_DIR=${MOONAGENT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/moonagent}
MC_VERSION=${MC_VERSION:-0.3.13.post1}
MC_RPC_PORT=${MC_RPC_PORT:-50151}
MC_META_PORT=${MC_META_PORT:-18180}
MC_ADMIN_PORT=${MC_ADMIN_PORT:-19103}
MC_BRIDGE_PORT=${MC_BRIDGE_PORT:-18190}
MC_SEGMENT_BYTES=${MC_SEGMENT_BYTES:-268435456}
MC_MASTER_EXTRA_ARGS=${MC_MASTER_EXTRA_ARGS:-}
HOST=127.0.0.1
VENV=$HOME_DIR/mooncake-venv
RUN=$HOME_DIR/run
LOGS=$HOME_DIR/logs
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

log() { echo "[mooncake] $*" >&2; }
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

print_env() {
  echo "MOONAGENT_MOONCAKE_BRIDGE=$HOST:$MC_BRIDGE_PORT"
  echo "MOONAGENT_MOONCAKE_ADMIN=http://$HOST:$MC_ADMIN_PORT"
}

install() {
  mkdir -p "$RUN" "$LOGS"
  if [[ ! -x $VENV/bin/python ]] || ! "$VENV/bin/python" -c 'import importlib.util,sys; sys.exit(0 if importlib.util.find_spec("mooncake") else 1)'; then
    log "installing mooncake-transfer-engine-non-cuda==$MC_VERSION into $VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check "mooncake-transfer-engine-non-cuda==$MC_VERSION"
  fi
  PKG=$("$VENV/bin/python" -c 'import importlib.util,os; print(os.path.dirname(importlib.util.find_spec("mooncake").origin))')
  MASTER_BIN=$PKG/mooncake_master
  # grep reads all of ldd's output (no -q): with pipefail, an early exit would SIGPIPE ldd
  # and make a missing library look present.
  if ldd "$MASTER_BIN" "$PKG/store.so" | grep 'not found' > /dev/null; then
    missing=$(ldd "$MASTER_BIN" "$PKG/store.so" | awk '/not found/{print $1}' | sort -u | tr '\n' ' ')
    log "missing shared libraries: $missing; installing libibverbs1 (and libnuma1/librdmacm1 if listed)"
    pkgs="libibverbs1"
    [[ $missing == *libnuma* ]] && pkgs="$pkgs libnuma1"
    [[ $missing == *librdmacm* ]] && pkgs="$pkgs librdmacm1"
    SUDO=""; [[ $(id -u) -eq 0 ]] || SUDO=sudo
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
    if ldd "$MASTER_BIN" "$PKG/store.so" | grep 'not found'; then log "still missing libraries"; exit 1; fi
  fi
}

wait_http() { # url seconds
  local deadline=$(( $(date +%s) + $2 ))
  until curl -sf -m 2 -o /dev/null "$1"; do
    (( $(date +%s) < deadline )) || return 1
    sleep 0.3
  done
}

wait_port() { # port seconds
  local deadline=$(( $(date +%s) + $2 ))
  until (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; do
    (( $(date +%s) < deadline )) || return 1
    sleep 0.3
  done
}

up() {
  install
  if alive "$RUN/master.pid"; then
    log "master already running (pid $(cat "$RUN/master.pid"))"
  else
    # shellcheck disable=SC2086
    nohup "$MASTER_BIN" --rpc_address=$HOST --rpc_port="$MC_RPC_PORT" \
      --enable_http_metadata_server=true --http_metadata_server_host=$HOST \
      --http_metadata_server_port="$MC_META_PORT" --metrics_host=$HOST --metrics_port="$MC_ADMIN_PORT" \
      --logtostderr=true $MC_MASTER_EXTRA_ARGS > "$LOGS/master.log" 2>&1 < /dev/null &
    echo $! > "$RUN/master.pid"
    log "master started (pid $!), log $LOGS/master.log"
  fi
  if ! wait_http "http://$HOST:$MC_ADMIN_PORT/health" 30; then
    log "master not healthy; last lines of its log:"; tail -20 "$LOGS/master.log" >&2; exit 1
  fi
  if alive "$RUN/bridge.pid"; then
    log "bridge already running (pid $(cat "$RUN/bridge.pid"))"
  else
    MC_TCP_BIND_ADDRESS=$HOST nohup "$VENV/bin/python" "$HERE/mooncake_bridge.py" \
      --listen "$HOST:$MC_BRIDGE_PORT" --master "$HOST:$MC_RPC_PORT" \
      --metadata "http://$HOST:$MC_META_PORT/metadata" --segment-bytes "$MC_SEGMENT_BYTES" \
      > "$LOGS/bridge.log" 2>&1 < /dev/null &
    echo $! > "$RUN/bridge.pid"
    log "bridge started (pid $!), log $LOGS/bridge.log"
  fi
  if ! wait_port "$MC_BRIDGE_PORT" 60; then
    log "bridge not listening; last lines of its log:"; tail -20 "$LOGS/bridge.log" >&2; exit 1
  fi
  print_env
}

stop() { # name
  local f=$RUN/$1.pid pid
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
    log "$1 (pid $pid) stopped"
  fi
  rm -f "$f"
}

case "${1:-}" in
  up) up ;;
  down) stop bridge; stop master ;;
  env) print_env ;;
  install) install ;;
  *) echo "usage: $0 up|down|env|install" >&2; exit 2 ;;
esac

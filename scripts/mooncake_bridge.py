#!/usr/bin/env python3
"""moonagent's raw-bytes bridge to a real Mooncake Store.

The Mooncake wheel exposes no C ABI that Rust can link, so the Rust `BridgeStore`
(moonagent-validation) speaks a small length-prefixed binary protocol over loopback TCP to
this process, which holds one `MooncakeDistributedStore` client (and contributes its memory
segment to the store, as the stock REST gateway does). One request at a time.

Frame (all integers little-endian):
  request : u8 op | u32 key_len | key | op fields
  response: i64 code (>= 0 ok, Mooncake error code < 0) | u64 len | bytes
Ops:
  1 PUT       u8 data_type | u8 flags (1 = hard pin, 2 = soft pin) | u64 len | bytes
  2 PUT_START u8 data_type | u8 flags | u64 size
  3 PUT_END   u64 len | bytes   (len = 2^64-1: size-only, completes the reserved object)
  4 REVOKE
  5 GET       u64 buffer capacity        -> code = object size, bytes
  6 SIZE                                  -> code = object size
  7 EXISTS                                -> code = 1 or 0
  8 REMOVE    u8 force
  9 PING
"""
import argparse
import os
import socket
import struct
import sys

import mooncake.store as mc

SIZE_ONLY = (1 << 64) - 1
# moonagent DataType index -> the wheel's ObjectDataType. The wheel (0.3.13.post1) has no
# HIDDEN_STATE type (seed 002's patch adds it); encoder outputs travel as TENSOR.
DTYPES = [mc.ObjectDataType.GENERAL, mc.ObjectDataType.KVCACHE, mc.ObjectDataType.TENSOR]


def recv_exact(conn, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def config(dtype, flags, soft_ttl_ms):
    cfg = mc.ReplicateConfig()
    cfg.data_type = DTYPES[dtype] if dtype < len(DTYPES) else mc.ObjectDataType.GENERAL
    cfg.with_hard_pin = bool(flags & 1)
    if flags & 2:
        cfg.soft_pin_action = mc.SoftPinAction.ENABLE
        if soft_ttl_ms:
            cfg.soft_pin_ttl_ms = soft_ttl_ms
    return cfg


def serve(store, conn, soft_ttl_ms):
    reserved = {}  # key -> size, for PUT_END of a PUT_START
    while True:
        try:
            head = recv_exact(conn, 5)
        except ConnectionError:
            return
        op, klen = struct.unpack("<BI", head)
        key = recv_exact(conn, klen).decode()
        code, out = 0, b""
        if op == 1:
            dtype, flags, n = struct.unpack("<BBQ", recv_exact(conn, 10))
            data = recv_exact(conn, n)
            # The Python put returns 0 for an existing key and keeps the old value; a
            # session start tells "already exists" (-705) apart, so probe with it first.
            probe = store.batch_put_session_start([key], [max(n, 1)], config(dtype, flags, soft_ttl_ms))[0]
            if probe == 0:
                store.batch_put_session_revoke([key])
                code = store.put(key, data, config(dtype, flags, soft_ttl_ms))
            else:
                code = probe
        elif op == 2:
            dtype, flags, n = struct.unpack("<BBQ", recv_exact(conn, 10))
            if key in reserved:
                # Observed on 0.3.13.post1: the client answers a second session start on a key
                # it holds in progress with -600 (INVALID_PARAMS) instead of -705. A put in
                # progress exists for every other caller, so report "already exists".
                code = -705
            else:
                code = store.batch_put_session_start([key], [n], config(dtype, flags, soft_ttl_ms))[0]
            if code == 0:
                reserved[key] = (n, dtype, flags)
        elif op == 3:
            (n,) = struct.unpack("<Q", recv_exact(conn, 8))
            data = None if n == SIZE_ONLY else recv_exact(conn, n)
            if key not in reserved:
                code = -704
            elif data is None:
                code = store.batch_put_session_end([key])[0]
                reserved.pop(key, None)
            else:
                # The wheel cannot write bytes into a reserved session object: release the
                # reservation and put the bytes in one call (same key, same config).
                size, dtype, flags = reserved.pop(key)
                store.batch_put_session_revoke([key])
                code = -600 if len(data) != size else store.put(key, data, config(dtype, flags, soft_ttl_ms))
        elif op == 4:
            code = store.batch_put_session_revoke([key])[0]
            reserved.pop(key, None)
        elif op == 5:
            (cap,) = struct.unpack("<Q", recv_exact(conn, 8))
            size = store.get_size(key)
            if size < 0:
                code = size
            elif size > cap:
                code, out = -10, struct.pack("<Q", size)
            else:
                out = store.get(key)
                code = len(out) if len(out) == size else -707
        elif op == 6:
            code = store.get_size(key)
        elif op == 7:
            r = store.is_exist(key)
            code = 1 if r == 1 else (0 if r == 0 else r)
        elif op == 8:
            (force,) = struct.unpack("<B", recv_exact(conn, 1))
            code = store.remove(key, bool(force))
        elif op == 9:
            code = 0
        else:
            code = -600
        conn.sendall(struct.pack("<qQ", code, len(out)) + out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:18090")
    ap.add_argument("--master", default="127.0.0.1:50051")
    ap.add_argument("--metadata", default="http://127.0.0.1:18080/metadata")
    ap.add_argument("--segment-bytes", type=int, default=256 << 20)
    ap.add_argument("--local-buffer-bytes", type=int, default=64 << 20)
    ap.add_argument("--soft-pin-ttl-ms", type=int, default=0)
    a = ap.parse_args()
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    store = mc.MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", a.metadata, a.segment_bytes, a.local_buffer_bytes, "tcp", "", a.master)
    if rc != 0:
        print(f"mooncake setup failed: {rc}", file=sys.stderr)
        sys.exit(1)
    host, port = a.listen.rsplit(":", 1)
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, int(port)))
    srv.listen(8)
    print(f"bridge listening on {a.listen}", file=sys.stderr, flush=True)
    while True:
        conn, _ = srv.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            serve(store, conn, a.soft_pin_ttl_ms)


if __name__ == "__main__":
    main()

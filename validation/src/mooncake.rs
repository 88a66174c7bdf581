//! `BridgeStore`: the `Store` trait over a real Mooncake Store.
//!
//! Speaks the length-prefixed protocol of `scripts/mooncake_bridge.py` over loopback TCP
//! (see that file for the frame layout). The real master keeps its own clock: the `now`
//! arguments of the trait are ignored here, and leases, eviction ticks and soft-pin TTLs
//! run in the master's wall time.
//!
//! Differences from `MemStore` that come from the real client, not from the model:
//! - a put of an existing key is detected with a session-start probe (the Python `put`
//!   returns 0 for an existing key and keeps the old value);
//! - `put_end` with bytes releases the reservation and puts the bytes in one call (the
//!   wheel cannot write bytes into a reserved object); size-only `put_end` completes it;
//! - encoder outputs are stored with the wheel's `TENSOR` type (it has no `HIDDEN_STATE`).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use moonagent_core::store::{Nanos, Payload, ReplicateConfig, Store, StoreError, StoreResult};

/// Environment variable naming the bridge address (`host:port`), set by `scripts/mooncake.sh env`.
pub const BRIDGE_ENV: &str = "MOONAGENT_MOONCAKE_BRIDGE";

const SIZE_ONLY: u64 = u64::MAX;

/// A `Store` backed by a real Mooncake Store through moonagent's bridge.
#[derive(Debug)]
pub struct BridgeStore {
    conn: TcpStream,
}

/// Map a Mooncake return code (< 0) to the core's error.
pub fn error_from_code(code: i64) -> StoreError {
    match code {
        -704 => StoreError::NotFound,
        -703 => StoreError::NotReady,
        -705 => StoreError::AlreadyExists,
        -706 => StoreError::HasLease,
        -200 => StoreError::NoAvailableHandle,
        -707 => StoreError::LeaseExpired,
        -801 => StoreError::ChecksumMismatch,
        -900 => StoreError::Unavailable("RPC failure (-900)".into()),
        c => StoreError::InvalidParams(format!("Mooncake error code {c}")),
    }
}

fn io_err(e: std::io::Error) -> StoreError {
    StoreError::Unavailable(format!("bridge connection: {e}"))
}

impl BridgeStore {
    /// Connect to a bridge at `addr` (`127.0.0.1:18190`).
    pub fn connect(addr: &str) -> StoreResult<Self> {
        let sock = addr
            .to_socket_addrs()
            .map_err(io_err)?
            .next()
            .ok_or_else(|| StoreError::Unavailable(format!("no address for {addr}")))?;
        let conn = TcpStream::connect_timeout(&sock, Duration::from_secs(5)).map_err(io_err)?;
        conn.set_nodelay(true).map_err(io_err)?;
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(io_err)?;
        let mut s = Self { conn };
        s.call(9, "", &[], &[])?;
        Ok(s)
    }

    /// Connect to the bridge named by `MOONAGENT_MOONCAKE_BRIDGE`, if set.
    pub fn from_env() -> Option<StoreResult<Self>> {
        std::env::var(BRIDGE_ENV).ok().map(|a| Self::connect(&a))
    }

    /// One request; returns (code, payload). Negative codes are returned as `Ok` here.
    fn call(
        &mut self,
        op: u8,
        key: &str,
        fields: &[u8],
        body: &[u8],
    ) -> StoreResult<(i64, Vec<u8>)> {
        let mut frame = Vec::with_capacity(5 + key.len() + fields.len());
        frame.push(op);
        frame.extend_from_slice(&(key.len() as u32).to_le_bytes());
        frame.extend_from_slice(key.as_bytes());
        frame.extend_from_slice(fields);
        self.conn.write_all(&frame).map_err(io_err)?;
        if !body.is_empty() {
            self.conn.write_all(body).map_err(io_err)?;
        }
        let mut head = [0u8; 16];
        self.conn.read_exact(&mut head).map_err(io_err)?;
        let code = i64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
        let len = u64::from_le_bytes(head[8..].try_into().expect("8 bytes"));
        let mut out = vec![
            0u8;
            usize::try_from(len)
                .map_err(|_| StoreError::Unavailable("oversized reply".into()))?
        ];
        self.conn.read_exact(&mut out).map_err(io_err)?;
        Ok((code, out))
    }

    fn unit(code: i64) -> StoreResult<()> {
        if code >= 0 {
            Ok(())
        } else {
            Err(error_from_code(code))
        }
    }
}

fn cfg_fields(cfg: &ReplicateConfig, len: u64) -> Vec<u8> {
    let mut f = vec![
        cfg.data_type.index() as u8,
        u8::from(cfg.hard_pin) | (u8::from(cfg.soft_pin) << 1),
    ];
    f.extend_from_slice(&len.to_le_bytes());
    f
}

impl Store for BridgeStore {
    fn put_start(
        &mut self,
        _now: Nanos,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        let (code, _) = self.call(2, key, &cfg_fields(cfg, size), &[])?;
        Self::unit(code)
    }

    fn put_end(&mut self, _now: Nanos, key: &str, payload: Payload) -> StoreResult<()> {
        let (code, _) = match &payload {
            Payload::Bytes(b) => self.call(3, key, &(b.len() as u64).to_le_bytes(), b)?,
            Payload::SizeOnly(_) => self.call(3, key, &SIZE_ONLY.to_le_bytes(), &[])?,
        };
        Self::unit(code)
    }

    fn put_revoke(&mut self, _now: Nanos, key: &str) -> StoreResult<()> {
        let (code, _) = self.call(4, key, &[], &[])?;
        Self::unit(code)
    }

    fn put(
        &mut self,
        _now: Nanos,
        key: &str,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        let bytes = match payload {
            Payload::Bytes(b) => b,
            // A real store holds bytes: a size-only object is stored zero-filled.
            Payload::SizeOnly(n) => {
                vec![0u8; usize::try_from(n).map_err(|_| StoreError::InvalidParams("size".into()))?]
            }
        };
        let (code, _) = self.call(1, key, &cfg_fields(cfg, bytes.len() as u64), &bytes)?;
        Self::unit(code)
    }

    fn get_into(&mut self, _now: Nanos, key: &str, buf: &mut [u8]) -> StoreResult<u64> {
        let (code, out) = self.call(5, key, &(buf.len() as u64).to_le_bytes(), &[])?;
        match code {
            -10 => {
                let needed = out
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map_or(0, u64::from_le_bytes);
                Err(StoreError::BufferTooSmall {
                    needed,
                    capacity: buf.len() as u64,
                })
            }
            c if c < 0 => Err(error_from_code(c)),
            _ => {
                buf[..out.len()].copy_from_slice(&out);
                Ok(out.len() as u64)
            }
        }
    }

    fn get_size(&mut self, _now: Nanos, key: &str) -> StoreResult<u64> {
        let (code, _) = self.call(6, key, &[], &[])?;
        if code < 0 {
            Err(error_from_code(code))
        } else {
            Ok(code as u64)
        }
    }

    fn exists(&mut self, _now: Nanos, key: &str) -> StoreResult<bool> {
        let (code, _) = self.call(7, key, &[], &[])?;
        match code {
            1 => Ok(true),
            0 => Ok(false),
            c => Err(error_from_code(c)),
        }
    }

    fn remove(&mut self, _now: Nanos, key: &str, force: bool) -> StoreResult<()> {
        let (code, _) = self.call(8, key, &[u8::from(force)], &[])?;
        Self::unit(code)
    }
}

//! Mooncake's Transfer Engine between workers: the KV path Mooncake itself uses from
//! prefill to decode (the `transfer-engine` feature; FFI through `mooncake-rs`).
//!
//! [`TeCluster::start`] creates one engine per worker on 127.0.0.1 with P2P-handshake
//! metadata (no etcd, no metadata server), installs the `tcp` transport and registers one
//! host buffer per worker. Worker `w`'s buffer is `workers` slots of `slot_bytes`: slot `w`
//! is what `w` sends from, slot `s` (for `s != w`) is where sender `s`'s bytes land. So
//! each slot has exactly one writer, the [`TeNic`] of its sender, and no two transfers
//! touch the same bytes at once; every engine opens every peer's segment up front (a peer
//! is named `ip:port`, as the engine reports its own address in P2P mode).
//!
//! The library is linked at build time: the feature needs `TRANSFER_ENGINE_LIB_DIR`
//! (validation's `build.rs` stops with a line naming `scripts/transfer_engine.sh`
//! otherwise) and the binary loads it from that folder (an rpath for this package's
//! tests; `LD_LIBRARY_PATH` for the CLI). Without the feature [`TeCluster::start`]
//! returns [`TeError::NotCompiled`].

/// Why the Transfer Engine path could not be set up or a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TeError {
    /// The binary was built without the `transfer-engine` feature.
    #[error("the Transfer Engine KV path is not in this build: build with `--features transfer-engine` (moonagent-validation's feature; the CLI's too) after `export $(bash scripts/transfer_engine.sh build)`")]
    NotCompiled,
    /// An engine could not be created or its transport installed.
    #[error("Transfer Engine of worker {worker}: {what} (is the library from scripts/transfer_engine.sh intact? its log: ~/.cache/moonagent/logs/): {detail}")]
    Setup {
        /// The worker.
        worker: usize,
        /// The step that failed.
        what: &'static str,
        /// The engine's error.
        detail: String,
    },
    /// A transfer was refused, failed or timed out.
    #[error(
        "Transfer Engine write {from}->{to} of {bytes} bytes at slot offset {offset}: {detail}"
    )]
    Transfer {
        /// Sender.
        from: usize,
        /// Receiver.
        to: usize,
        /// Offset in the slot.
        offset: usize,
        /// Bytes.
        bytes: usize,
        /// Why.
        detail: String,
    },
    /// A request outside the cluster or the slot.
    #[error("Transfer Engine: {0}")]
    Range(String),
}

/// How long one transfer may take before it is reported as failed.
pub const TRANSFER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[cfg(feature = "transfer-engine")]
pub use imp::{TeCluster, TeNic};

#[cfg(feature = "transfer-engine")]
mod imp {
    use std::ffi::c_void;
    use std::mem::ManuallyDrop;
    use std::ptr::NonNull;
    use std::sync::Arc;
    use std::time::Instant;

    use mooncake::{Opcode, TransferEngine, TransferRequest};

    use super::{TeError, TRANSFER_TIMEOUT};

    /// P2P-handshake metadata: peers exchange segment descriptions directly.
    const P2P: &str = "P2PHANDSHAKE";
    const HOST: &str = "127.0.0.1";
    /// Memory location tag for host buffers.
    const LOCATION: &str = "cpu:0";

    struct Worker {
        /// Dropped by hand in `Drop`: the engine is destroyed before the buffer is freed.
        engine: ManuallyDrop<TransferEngine>,
        buf: NonNull<u8>,
        len: usize,
        /// Segment id of every peer's buffer, as this engine opened it (`None` for itself).
        segments: Vec<Option<i32>>,
        registered: bool,
    }

    impl Worker {
        fn engine(&self) -> &TransferEngine {
            &self.engine
        }
    }

    // The buffer is only touched through the slot discipline described in the module doc.
    unsafe impl Send for Worker {}
    unsafe impl Sync for Worker {}

    impl Drop for Worker {
        fn drop(&mut self) {
            if self.registered {
                // SAFETY: `buf` was registered with this engine and is still allocated.
                let _ = unsafe { self.engine.unregister_memory(self.buf.as_ptr().cast()) };
            }
            // SAFETY: dropped once, here, and not used afterwards. Its threads stop here;
            // none of them can touch the buffer afterwards.
            unsafe { ManuallyDrop::drop(&mut self.engine) };
            // SAFETY: `buf` came from `Box::<[u8]>::into_raw` with length `len`.
            drop(unsafe {
                Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                    self.buf.as_ptr(),
                    self.len,
                ))
            });
        }
    }

    struct Inner {
        workers: Vec<Worker>,
        slot: usize,
    }

    /// One Transfer Engine per worker, on loopback, each with a registered host buffer.
    pub struct TeCluster {
        inner: Arc<Inner>,
        nics: Vec<TeNic>,
    }

    impl std::fmt::Debug for TeCluster {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("TeCluster")
                .field("workers", &self.inner.workers.len())
                .field("slot_bytes", &self.inner.slot)
                .finish()
        }
    }

    impl TeCluster {
        /// Start `workers` engines with `slot_bytes` per slot (each buffer is
        /// `workers * slot_bytes`), and open every peer's segment from every engine.
        pub fn start(workers: usize, slot_bytes: usize) -> Result<Self, TeError> {
            if workers == 0 || slot_bytes == 0 {
                return Err(TeError::Range(format!(
                    "expected at least one worker and a non-empty slot, got {workers} workers of {slot_bytes} bytes"
                )));
            }
            let len = workers.checked_mul(slot_bytes).ok_or_else(|| {
                TeError::Range(format!("{workers} slots of {slot_bytes} bytes overflow"))
            })?;
            let mut ws = Vec::with_capacity(workers);
            let mut names = Vec::with_capacity(workers);
            for w in 0..workers {
                let setup = |what: &'static str| {
                    move |e: mooncake::MooncakeError| TeError::Setup {
                        worker: w,
                        what,
                        detail: e.to_string(),
                    }
                };
                let engine =
                    TransferEngine::new(P2P, HOST, HOST, 0).map_err(setup("create engine"))?;
                engine
                    .install_transport("tcp")
                    .map_err(setup("install the tcp transport"))?;
                let name = engine
                    .get_local_addr()
                    .map_err(setup("read the local address"))?;
                let buf = Box::<[u8]>::into_raw(vec![0u8; len].into_boxed_slice());
                let buf = NonNull::new(buf.cast::<u8>()).ok_or_else(|| TeError::Setup {
                    worker: w,
                    what: "allocate the buffer",
                    detail: "null".into(),
                })?;
                let mut worker = Worker {
                    engine: ManuallyDrop::new(engine),
                    buf,
                    len,
                    segments: Vec::new(),
                    registered: false,
                };
                // SAFETY: the buffer lives until `worker` drops, after unregistering.
                unsafe {
                    worker
                        .engine()
                        .register_memory(buf.as_ptr().cast(), len, LOCATION)
                        .map_err(setup("register the buffer"))?;
                }
                worker.registered = true;
                names.push(name);
                ws.push(worker);
            }
            for (w, worker) in ws.iter_mut().enumerate() {
                for (p, name) in names.iter().enumerate() {
                    let seg =
                        if p == w {
                            None
                        } else {
                            // `open_segment` takes the `ip:port` name P2P mode gives a peer
                            // (mooncake-rs's `validate_peer_name` would reject it; unused here).
                            Some(worker.engine().open_segment(name).map_err(|e| {
                                TeError::Setup {
                                    worker: w,
                                    what: "open a peer's segment",
                                    detail: format!("{name}: {e}"),
                                }
                            })?)
                        };
                    worker.segments.push(seg);
                }
            }
            let inner = Arc::new(Inner {
                workers: ws,
                slot: slot_bytes,
            });
            let nics = (0..workers)
                .map(|me| TeNic {
                    inner: Arc::clone(&inner),
                    me,
                })
                .collect();
            Ok(Self { inner, nics })
        }

        /// Workers.
        pub fn workers(&self) -> usize {
            self.inner.workers.len()
        }

        /// Bytes of one slot: the most one [`TeNic::write`] moves.
        pub fn slot_bytes(&self) -> usize {
            self.inner.slot
        }

        /// Each worker's sending side, in worker order (one each; call once).
        pub fn take_nics(&mut self) -> Vec<TeNic> {
            std::mem::take(&mut self.nics)
        }
    }

    /// One worker's sending side: the only writer of its own slot everywhere.
    pub struct TeNic {
        inner: Arc<Inner>,
        me: usize,
    }

    impl std::fmt::Debug for TeNic {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("TeNic").field("worker", &self.me).finish()
        }
    }

    impl TeNic {
        /// This NIC's worker.
        pub fn worker(&self) -> usize {
            self.me
        }

        /// Bytes of a slot.
        pub fn slot_bytes(&self) -> usize {
            self.inner.slot
        }

        fn slot_ptr(&self, worker: usize, slot: usize) -> *mut u8 {
            // SAFETY: worker < workers and slot < workers (checked by callers), so the
            // offset is inside the buffer.
            unsafe {
                self.inner.workers[worker]
                    .buf
                    .as_ptr()
                    .add(slot * self.inner.slot)
            }
        }

        fn check(&self, to: usize, offset: usize, len: usize) -> Result<(), TeError> {
            let n = self.inner.workers.len();
            if to >= n {
                return Err(TeError::Range(format!(
                    "worker {to} does not exist ({n} workers)"
                )));
            }
            if offset
                .checked_add(len)
                .is_none_or(|end| end > self.inner.slot)
            {
                return Err(TeError::Range(format!(
                    "{len} bytes at offset {offset} do not fit a slot of {} bytes",
                    self.inner.slot
                )));
            }
            Ok(())
        }

        /// This worker's own slot (what it sends from), to fill.
        pub fn outbox(&mut self) -> &mut [u8] {
            // SAFETY: slot `me` of worker `me` is only read by the engine during this
            // NIC's own `write` (which holds `&mut self`), so no one else aliases it now.
            unsafe {
                std::slice::from_raw_parts_mut(self.slot_ptr(self.me, self.me), self.inner.slot)
            }
        }

        /// What has landed from this worker in worker `to`'s buffer: `len` bytes at
        /// `offset` of slot `me` there.
        pub fn landed(&self, to: usize, offset: usize, len: usize) -> Result<&[u8], TeError> {
            self.check(to, offset, len)?;
            // SAFETY: slot `me` of `to` is written only by this NIC's `write`, which needs
            // `&mut self` and has completed; the borrow of `self` keeps it from starting.
            Ok(unsafe { std::slice::from_raw_parts(self.slot_ptr(to, self.me).add(offset), len) })
        }

        /// The first byte of `len` at `offset` where what landed in worker `to` differs from
        /// this worker's outbox (what it sent), if any.
        pub fn first_difference(
            &self,
            to: usize,
            offset: usize,
            len: usize,
        ) -> Result<Option<usize>, TeError> {
            let landed = self.landed(to, offset, len)?;
            // SAFETY: as in `outbox`, read-only here; `&self` keeps `write` from running.
            let sent = unsafe {
                std::slice::from_raw_parts(self.slot_ptr(self.me, self.me).add(offset), len)
            };
            Ok(sent.iter().zip(landed).position(|(a, b)| a != b))
        }

        /// Move `len` bytes at `offset` of this worker's outbox to the same offset of slot
        /// `me` in worker `to`'s buffer, through the Transfer Engine; returns when the
        /// engine reports the transfer complete.
        pub fn write(&mut self, to: usize, offset: usize, len: usize) -> Result<(), TeError> {
            self.check(to, offset, len)?;
            let err = |detail: String| TeError::Transfer {
                from: self.me,
                to,
                offset,
                bytes: len,
                detail,
            };
            if len == 0 {
                return Ok(());
            }
            let w = &self.inner.workers[self.me];
            let seg =
                w.segments[to].ok_or_else(|| err("a worker cannot write to itself".into()))?;
            let src = self.slot_ptr(self.me, self.me).wrapping_add(offset);
            let dst = self.slot_ptr(to, self.me) as u64 + offset as u64;
            let mut req = [TransferRequest {
                opcode: Opcode::Write as i32,
                source: src.cast::<c_void>(),
                target_id: seg,
                target_offset: dst,
                length: len as u64,
            }];
            let engine = w.engine();
            let batch = engine
                .allocate_batch_id(1)
                .map_err(|e| err(e.to_string()))?;
            let r = engine
                .submit_transfer(batch, &mut req)
                .map_err(|e| err(e.to_string()))
                .and_then(|()| wait(engine, batch).map_err(err));
            let freed = engine.free_batch_id(batch).map_err(|e| err(e.to_string()));
            r.and(freed)
        }
    }

    /// Poll one transfer's status until it completes: yield for the first polls (short
    /// transfers), then sleep briefly (mooncake-rs's own wait busy-polls with `yield_now`,
    /// which on two cores takes time from the engine's threads).
    fn wait(engine: &TransferEngine, batch: u64) -> Result<(), String> {
        let t0 = Instant::now();
        let mut polls = 0u32;
        loop {
            let (status, _) = engine
                .get_transfer_status(batch, 0)
                .map_err(|e| e.to_string())?;
            match status {
                4 => return Ok(()),
                5 => return Err("the engine reported a timeout".into()),
                6 => return Err("the engine reported a failure".into()),
                2 | 3 => {
                    return Err(format!(
                        "the engine reported status {status} (invalid or canceled)"
                    ))
                }
                _ => {}
            }
            if t0.elapsed() > TRANSFER_TIMEOUT {
                return Err(format!("not complete after {TRANSFER_TIMEOUT:?}"));
            }
            polls += 1;
            if polls < 200 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }
}

/// Fill `buf` with worker `worker`'s fixed pattern (what its outbox holds between stamps).
pub fn fill_pattern(buf: &mut [u8], worker: usize) {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (worker as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    for b in buf.iter_mut() {
        // xorshift64: cheap, deterministic, no run of equal bytes to hide a short copy.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

/// Mark `buf` (a pattern-filled region about to be sent) with transfer `seq`: its first and
/// last 8 bytes, so a stale or partial landing differs from what was sent.
pub fn stamp(buf: &mut [u8], seq: u64) {
    let s = seq.to_le_bytes();
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&s[..n]);
    if buf.len() >= 16 {
        let l = buf.len();
        buf[l - 8..].copy_from_slice(&s);
    }
}

#[cfg(not(feature = "transfer-engine"))]
pub use absent::{TeCluster, TeNic};

/// Without the feature: the types exist so the backend compiles, and starting a cluster
/// is [`TeError::NotCompiled`]; a [`TeNic`] cannot exist.
#[cfg(not(feature = "transfer-engine"))]
mod absent {
    use super::TeError;

    /// Not in this build: [`TeCluster::start`] fails with [`TeError::NotCompiled`].
    #[derive(Debug)]
    pub struct TeCluster(());

    impl TeCluster {
        /// Always [`TeError::NotCompiled`].
        pub fn start(_workers: usize, _slot_bytes: usize) -> Result<Self, TeError> {
            Err(TeError::NotCompiled)
        }
        /// Never reached.
        pub fn take_nics(&mut self) -> Vec<TeNic> {
            Vec::new()
        }
    }

    /// Uninhabited without the feature.
    #[derive(Debug)]
    pub enum TeNic {}

    impl TeNic {
        /// Never called (no value exists).
        pub fn worker(&self) -> usize {
            match *self {}
        }
        /// Never called (no value exists).
        pub fn slot_bytes(&self) -> usize {
            match *self {}
        }
        /// Never called (no value exists).
        pub fn outbox(&mut self) -> &mut [u8] {
            match *self {}
        }
        /// Never called (no value exists).
        pub fn landed(&self, _to: usize, _offset: usize, _len: usize) -> Result<&[u8], TeError> {
            match *self {}
        }
        /// Never called (no value exists).
        pub fn first_difference(
            &self,
            _to: usize,
            _offset: usize,
            _len: usize,
        ) -> Result<Option<usize>, TeError> {
            match *self {}
        }
        /// Never called (no value exists).
        pub fn write(&mut self, _to: usize, _offset: usize, _len: usize) -> Result<(), TeError> {
            match *self {}
        }
    }
}

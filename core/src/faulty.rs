//! `FaultyStore`: a [`Store`] wrapper that injects faults on a seeded schedule.
//!
//! It exists to prove the embedding cache's failure model: every fault must end as a
//! counted miss (never a wrong embedding) or, for a broken client, as an error (never a
//! silent miss). Faults ([`FaultKind`]) and where they strike:
//!
//! - puts of meta keys (`mc:mmmeta:`): drop (the put reports success, nothing is stored),
//!   corrupt (one byte flipped), stale schema version and swapped tenant (the envelope is
//!   decoded, rewritten and re-framed, so it is well-formed but wrong; a meta that is not
//!   an envelope is stored unchanged and nothing is counted);
//! - puts of blob keys (`mc:mmblob:`): drop, corrupt (one byte flipped), truncate;
//! - reads into a buffer (`get_into`): lease expiry during the transfer (the inner read
//!   happens, the buffer is scribbled, `LeaseExpired` is returned), buffer registration
//!   failure; `get_size`: lease expiry;
//! - reads that span time (`begin_read`): the hold is refused (the inner store grants the
//!   read's lease, as a store that cannot hold readers does, holds nothing, and an error
//!   is returned: the reader goes ahead on the lease alone);
//! - every operation: store unavailable (on `end_read` the inner read stays open: a hold
//!   the caller could not close).
//!
//! Data faults are persistent (what is stored is wrong); read faults are transient.
//! Put faults apply to `put` and to `put_end` (batch forms go through them). A schedule
//! is per-operation probabilities per kind, drawn from one seeded [`Rng`] stream, plus an
//! explicit queue ([`FaultyStore::push_fault`]) whose head strikes the next operation it
//! applies to. At most one fault per operation. Every fault actually applied is counted
//! per kind ([`FaultyStore::injected`]) and, when enabled, logged with its operation and key.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::mm_cache::envelope::{Envelope, SCHEMA_VERSION};
use crate::mm_cache::{BLOB_PREFIX, META_PREFIX};
use crate::rng::Rng;
use crate::store::{DataType, Nanos, Payload, ReplicateConfig, Store, StoreError, StoreResult};

/// A kind of injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// A meta put is silently lost.
    DropMeta,
    /// A meta put stores one flipped byte.
    CorruptMeta,
    /// A meta put stores the envelope with an older schema version.
    StaleSchema,
    /// A meta put stores the envelope with another tenant.
    SwapTenant,
    /// A blob put is silently lost.
    DropBlob,
    /// A blob put stores one flipped byte.
    CorruptBlob,
    /// A blob put stores a prefix of the blob.
    TruncateBlob,
    /// A read's lease expires during the transfer.
    LeaseExpired,
    /// The client cannot register the read buffer.
    BufferRegistration,
    /// The store cannot be reached.
    Unavailable,
    /// A read that spans time is not held open (`begin_read` refused).
    HoldRefused,
}

impl FaultKind {
    /// Number of kinds.
    pub const COUNT: usize = 11;
    /// Every kind, in index order.
    pub const ALL: [FaultKind; Self::COUNT] = [
        FaultKind::DropMeta,
        FaultKind::CorruptMeta,
        FaultKind::StaleSchema,
        FaultKind::SwapTenant,
        FaultKind::DropBlob,
        FaultKind::CorruptBlob,
        FaultKind::TruncateBlob,
        FaultKind::LeaseExpired,
        FaultKind::BufferRegistration,
        FaultKind::Unavailable,
        FaultKind::HoldRefused,
    ];

    /// Dense index.
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::DropMeta => "drop_meta",
            FaultKind::CorruptMeta => "corrupt_meta",
            FaultKind::StaleSchema => "stale_schema",
            FaultKind::SwapTenant => "swap_tenant",
            FaultKind::DropBlob => "drop_blob",
            FaultKind::CorruptBlob => "corrupt_blob",
            FaultKind::TruncateBlob => "truncate_blob",
            FaultKind::LeaseExpired => "lease_expired",
            FaultKind::BufferRegistration => "buffer_registration",
            FaultKind::Unavailable => "unavailable",
            FaultKind::HoldRefused => "hold_refused",
        }
    }
}

/// A store operation, as recorded in the fault log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `put_start`.
    PutStart,
    /// `put_end`.
    PutEnd,
    /// `put_revoke`.
    PutRevoke,
    /// `put`.
    Put,
    /// `get_into`.
    GetInto,
    /// `get_size`.
    GetSize,
    /// `exists`.
    Exists,
    /// `remove`.
    Remove,
    /// `begin_read`.
    BeginRead,
    /// `end_read`.
    EndRead,
}

/// One applied fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injection {
    /// Sequence number of the operation (counting every call through the wrapper).
    pub op_seq: u64,
    /// The operation.
    pub op: Op,
    /// Its key.
    pub key: String,
    /// The fault.
    pub kind: FaultKind,
}

/// Per-kind fault probabilities (each per applicable operation); serde for configs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultRates {
    /// [`FaultKind::DropMeta`].
    pub drop_meta: f64,
    /// [`FaultKind::CorruptMeta`].
    pub corrupt_meta: f64,
    /// [`FaultKind::StaleSchema`].
    pub stale_schema: f64,
    /// [`FaultKind::SwapTenant`].
    pub swap_tenant: f64,
    /// [`FaultKind::DropBlob`].
    pub drop_blob: f64,
    /// [`FaultKind::CorruptBlob`].
    pub corrupt_blob: f64,
    /// [`FaultKind::TruncateBlob`].
    pub truncate_blob: f64,
    /// [`FaultKind::LeaseExpired`].
    pub lease_expired: f64,
    /// [`FaultKind::BufferRegistration`].
    pub buffer_registration: f64,
    /// [`FaultKind::Unavailable`].
    pub unavailable: f64,
    /// [`FaultKind::HoldRefused`].
    pub hold_refused: f64,
}

impl FaultRates {
    /// The same probability for every kind.
    pub fn uniform(p: f64) -> Self {
        Self::from_array([p; FaultKind::COUNT])
    }

    /// Rates from an array in [`FaultKind::ALL`] order.
    pub fn from_array(a: [f64; FaultKind::COUNT]) -> Self {
        Self {
            drop_meta: a[0],
            corrupt_meta: a[1],
            stale_schema: a[2],
            swap_tenant: a[3],
            drop_blob: a[4],
            corrupt_blob: a[5],
            truncate_blob: a[6],
            lease_expired: a[7],
            buffer_registration: a[8],
            unavailable: a[9],
            hold_refused: a[10],
        }
    }

    /// Rates as an array in [`FaultKind::ALL`] order.
    pub fn to_array(&self) -> [f64; FaultKind::COUNT] {
        [
            self.drop_meta,
            self.corrupt_meta,
            self.stale_schema,
            self.swap_tenant,
            self.drop_blob,
            self.corrupt_blob,
            self.truncate_blob,
            self.lease_expired,
            self.buffer_registration,
            self.unavailable,
            self.hold_refused,
        ]
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum KeyClass {
    Meta,
    Blob,
    Other,
}

fn class(key: &str) -> KeyClass {
    if key.starts_with(META_PREFIX) {
        KeyClass::Meta
    } else if key.starts_with(BLOB_PREFIX) {
        KeyClass::Blob
    } else {
        KeyClass::Other
    }
}

/// A picked fault; `Some(prefix)` when it came from the queue (`None` prefix inside = any key).
type Picked = (FaultKind, Option<Option<String>>);

/// What a put does after the schedule has spoken.
enum PutFate {
    Store(Payload),
    Drop,
    Fail(StoreError),
}

/// A [`Store`] that injects faults into an inner store on a seeded schedule.
#[derive(Debug)]
pub struct FaultyStore<S: Store> {
    inner: S,
    rng: Rng,
    rates: [f64; FaultKind::COUNT],
    queue: VecDeque<(FaultKind, Option<String>)>,
    injected: [u64; FaultKind::COUNT],
    log: Vec<Injection>,
    log_enabled: bool,
    ops: u64,
    swapped_tenant: String,
    pending: FxHashMap<String, ReplicateConfig>,
}

impl<S: Store> FaultyStore<S> {
    /// Wrap `inner` with no faults scheduled; `seed` drives every random choice.
    pub fn new(inner: S, seed: u64) -> Self {
        Self {
            inner,
            rng: Rng::stream(seed, "faulty_store"),
            rates: [0.0; FaultKind::COUNT],
            queue: VecDeque::new(),
            injected: [0; FaultKind::COUNT],
            log: Vec::new(),
            log_enabled: false,
            ops: 0,
            swapped_tenant: "mallory".to_owned(),
            pending: FxHashMap::default(),
        }
    }

    /// Use `rates` for the random schedule.
    pub fn with_rates(mut self, rates: FaultRates) -> Self {
        self.rates = rates.to_array();
        self
    }

    /// Set one kind's probability.
    pub fn set_rate(&mut self, kind: FaultKind, p: f64) {
        self.rates[kind.index()] = p;
    }

    /// Record every applied fault in [`FaultyStore::log`].
    pub fn with_log(mut self, on: bool) -> Self {
        self.log_enabled = on;
        self
    }

    /// The tenant a [`FaultKind::SwapTenant`] writes (default `mallory`).
    pub fn with_swapped_tenant(mut self, tenant: &str) -> Self {
        self.swapped_tenant = tenant.to_owned();
        self
    }

    /// Queue `kind` to strike the next operation it applies to (before any random fault).
    pub fn push_fault(&mut self, kind: FaultKind) {
        self.queue.push_back((kind, None));
    }

    /// Queue `kind` to strike the next operation it applies to whose key starts with `prefix`.
    pub fn push_fault_for(&mut self, kind: FaultKind, prefix: &str) {
        self.queue.push_back((kind, Some(prefix.to_owned())));
    }

    /// Queued faults not yet applied.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Faults applied of `kind`.
    pub fn injected(&self, kind: FaultKind) -> u64 {
        self.injected[kind.index()]
    }

    /// Faults applied, per kind in [`FaultKind::ALL`] order.
    pub fn injected_all(&self) -> [u64; FaultKind::COUNT] {
        self.injected
    }

    /// The log of applied faults (empty unless enabled).
    pub fn log(&self) -> &[Injection] {
        &self.log
    }

    /// Take the log.
    pub fn take_log(&mut self) -> Vec<Injection> {
        std::mem::take(&mut self.log)
    }

    /// Operations seen so far.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// The inner store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The inner store, mutably (bypasses the schedule).
    pub fn inner_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner store back.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// Pick the fault for this operation among `applicable` (queue head first). The caller
    /// applies it and calls [`Self::record`], or [`Self::unpick`] if it could not apply.
    fn pick(&mut self, key: &str, applicable: &[FaultKind]) -> Option<Picked> {
        if let Some((k, prefix)) = self.queue.front() {
            let key_ok = prefix.as_deref().is_none_or(|p| key.starts_with(p));
            if key_ok && applicable.contains(k) {
                return self.queue.pop_front().map(|(k, p)| (k, Some(p)));
            }
        }
        for &k in applicable {
            let p = self.rates[k.index()];
            if p > 0.0 && self.rng.chance(p) {
                return Some((k, None));
            }
        }
        None
    }

    /// Put a queued fault that could not apply back at the head of the queue.
    fn unpick(&mut self, picked: Picked) {
        if let (k, Some(prefix)) = picked {
            self.queue.push_front((k, prefix));
        }
    }

    /// A fault that lets the inner operation happen and then fails the call with `err`:
    /// recorded when the inner operation succeeded; when it failed, its own error is
    /// returned and a queued fault waits for an operation it can strike.
    fn fail_after<T>(
        &mut self,
        picked: Picked,
        op: Op,
        key: &str,
        inner: StoreResult<T>,
        err: StoreError,
    ) -> StoreResult<T> {
        match inner {
            Ok(_) => {
                self.record(op, key, picked.0);
                Err(err)
            }
            Err(e) => {
                self.unpick(picked);
                Err(e)
            }
        }
    }

    fn record(&mut self, op: Op, key: &str, kind: FaultKind) {
        self.injected[kind.index()] += 1;
        if self.log_enabled {
            self.log.push(Injection {
                op_seq: self.ops,
                op,
                key: key.to_owned(),
                kind,
            });
        }
    }

    fn begin(&mut self) {
        self.ops += 1;
    }

    /// Only the store-unavailable fault applies (no data, no buffer).
    fn plain(&mut self, op: Op, key: &str) -> StoreResult<()> {
        self.begin();
        if let Some((k, _)) = self.pick(key, &[FaultKind::Unavailable]) {
            self.record(op, key, k);
            return Err(unavailable());
        }
        Ok(())
    }

    /// Decide what a put of `payload` under `key` stores.
    fn put_fate(&mut self, op: Op, key: &str, payload: Payload) -> PutFate {
        let cls = class(key);
        let mut applicable: Vec<FaultKind> = Vec::with_capacity(5);
        match cls {
            KeyClass::Meta => {
                applicable.push(FaultKind::DropMeta);
                if matches!(&payload, Payload::Bytes(b) if !b.is_empty()) {
                    // The rewrites need a decodable envelope; that is checked only once
                    // one of them is picked (decoding every meta put would be wasted work).
                    applicable.extend([
                        FaultKind::CorruptMeta,
                        FaultKind::StaleSchema,
                        FaultKind::SwapTenant,
                    ]);
                }
            }
            KeyClass::Blob => {
                applicable.push(FaultKind::DropBlob);
                if matches!(&payload, Payload::Bytes(b) if !b.is_empty()) {
                    applicable.push(FaultKind::CorruptBlob);
                }
                if !payload.is_empty() {
                    applicable.push(FaultKind::TruncateBlob);
                }
            }
            KeyClass::Other => {}
        }
        applicable.push(FaultKind::Unavailable);
        let Some(picked) = self.pick(key, &applicable) else {
            return PutFate::Store(payload);
        };
        let kind = picked.0;
        let envelope = match (kind, &payload) {
            (FaultKind::StaleSchema | FaultKind::SwapTenant, Payload::Bytes(b)) => {
                Envelope::decode(b).ok()
            }
            _ => None,
        };
        let fate = match (kind, payload, envelope) {
            (FaultKind::Unavailable, _, _) => PutFate::Fail(unavailable()),
            (FaultKind::DropMeta | FaultKind::DropBlob, _, _) => PutFate::Drop,
            (FaultKind::CorruptMeta | FaultKind::CorruptBlob, Payload::Bytes(mut b), _) => {
                self.flip(&mut b);
                PutFate::Store(Payload::Bytes(b))
            }
            (FaultKind::TruncateBlob, Payload::Bytes(mut b), _) => {
                let keep = self.rng.below(b.len() as u64) as usize;
                b.truncate(keep);
                PutFate::Store(Payload::Bytes(b))
            }
            (FaultKind::TruncateBlob, Payload::SizeOnly(n), _) => {
                PutFate::Store(Payload::SizeOnly(self.rng.below(n)))
            }
            (FaultKind::StaleSchema | FaultKind::SwapTenant, p, Some(mut env)) => {
                if kind == FaultKind::StaleSchema {
                    env.schema_version = SCHEMA_VERSION.wrapping_sub(1);
                } else {
                    env.tenant = if env.tenant == self.swapped_tenant {
                        format!("{}'", self.swapped_tenant)
                    } else {
                        self.swapped_tenant.clone()
                    };
                }
                match env.encode() {
                    Ok(b) => PutFate::Store(Payload::Bytes(b)),
                    Err(_) => {
                        self.unpick(picked);
                        return PutFate::Store(p);
                    }
                }
            }
            // A rewrite of a meta that is not an envelope: store unchanged, record nothing.
            (_, p, _) => {
                self.unpick(picked);
                return PutFate::Store(p);
            }
        };
        self.record(op, key, kind);
        fate
    }

    fn flip(&mut self, b: &mut [u8]) {
        if b.is_empty() {
            return;
        }
        let i = self.rng.below(b.len() as u64) as usize;
        let x = 1 + self.rng.below(255) as u8;
        b[i] ^= x;
    }
}

fn unavailable() -> StoreError {
    StoreError::Unavailable("injected fault".into())
}

impl<S: Store> Store for FaultyStore<S> {
    fn put_start(
        &mut self,
        now: Nanos,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        self.plain(Op::PutStart, key)?;
        self.inner.put_start(now, key, size, cfg)?;
        self.pending.insert(key.to_owned(), *cfg);
        Ok(())
    }

    fn put_end(&mut self, now: Nanos, key: &str, payload: Payload) -> StoreResult<()> {
        self.begin();
        let cfg = self
            .pending
            .remove(key)
            .unwrap_or_else(|| ReplicateConfig::of(DataType::EncoderOutput));
        let size = payload.len();
        match self.put_fate(Op::PutEnd, key, payload) {
            PutFate::Fail(e) => Err(e),
            PutFate::Drop => {
                let _ = self.inner.put_revoke(now, key);
                Ok(())
            }
            PutFate::Store(p) if p.len() == size => self.inner.put_end(now, key, p),
            // A truncated payload no longer fits its reservation: re-put at its size.
            PutFate::Store(p) => {
                let _ = self.inner.put_revoke(now, key);
                self.inner.put(now, key, p, &cfg)
            }
        }
    }

    fn put_revoke(&mut self, now: Nanos, key: &str) -> StoreResult<()> {
        self.plain(Op::PutRevoke, key)?;
        self.pending.remove(key);
        self.inner.put_revoke(now, key)
    }

    fn put(
        &mut self,
        now: Nanos,
        key: &str,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        self.begin();
        match self.put_fate(Op::Put, key, payload) {
            PutFate::Fail(e) => Err(e),
            PutFate::Drop => Ok(()),
            PutFate::Store(p) => self.inner.put(now, key, p, cfg),
        }
    }

    fn get_into(&mut self, now: Nanos, key: &str, buf: &mut [u8]) -> StoreResult<u64> {
        self.begin();
        let applicable = [
            FaultKind::LeaseExpired,
            FaultKind::BufferRegistration,
            FaultKind::Unavailable,
        ];
        let Some(picked) = self.pick(key, &applicable) else {
            return self.inner.get_into(now, key, buf);
        };
        match picked.0 {
            FaultKind::LeaseExpired => {
                let r = self.inner.get_into(now, key, buf);
                if let Ok(n) = r {
                    // The transfer was cut: whatever landed is not to be trusted.
                    if let Some(b) = buf.get_mut(..(n as usize).min(buf.len())) {
                        self.flip(b);
                    }
                }
                self.fail_after(picked, Op::GetInto, key, r, StoreError::LeaseExpired)
            }
            FaultKind::BufferRegistration => {
                self.record(Op::GetInto, key, FaultKind::BufferRegistration);
                Err(StoreError::BufferRegistration("injected fault".into()))
            }
            k => {
                self.record(Op::GetInto, key, k);
                Err(unavailable())
            }
        }
    }

    fn begin_read(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        self.begin();
        let Some(picked) = self.pick(key, &[FaultKind::HoldRefused, FaultKind::Unavailable]) else {
            return self.inner.begin_read(now, key);
        };
        match picked.0 {
            // The lease-granting read of a store that cannot hold readers; nothing is
            // held, so the caller must not close it.
            FaultKind::HoldRefused => {
                let r = self.inner.get_size(now, key);
                let err = StoreError::InvalidParams("read hold refused (injected fault)".into());
                self.fail_after(picked, Op::BeginRead, key, r, err)
            }
            k => {
                self.record(Op::BeginRead, key, k);
                Err(unavailable())
            }
        }
    }

    fn end_read(&mut self, now: Nanos, key: &str) -> StoreResult<()> {
        self.plain(Op::EndRead, key)?;
        self.inner.end_read(now, key)
    }

    fn get_size(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        self.begin();
        let Some(picked) = self.pick(key, &[FaultKind::LeaseExpired, FaultKind::Unavailable])
        else {
            return self.inner.get_size(now, key);
        };
        match picked.0 {
            FaultKind::LeaseExpired => {
                let r = self.inner.get_size(now, key);
                self.fail_after(picked, Op::GetSize, key, r, StoreError::LeaseExpired)
            }
            k => {
                self.record(Op::GetSize, key, k);
                Err(unavailable())
            }
        }
    }

    fn exists(&mut self, now: Nanos, key: &str) -> StoreResult<bool> {
        self.plain(Op::Exists, key)?;
        self.inner.exists(now, key)
    }

    fn remove(&mut self, now: Nanos, key: &str, force: bool) -> StoreResult<()> {
        self.plain(Op::Remove, key)?;
        self.inner.remove(now, key, force)
    }
}

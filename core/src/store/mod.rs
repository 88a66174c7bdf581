//! The store: Mooncake Store's operation set and its semantics, modelled once.
//!
//! [`Store`] is the operation set of a Mooncake Store client (put start/end/revoke, get
//! into a caller buffer, exists, remove with or without force, batch forms, a replicate
//! config with soft pin, hard pin and data type). [`MemStore`] is the embedded default: a
//! sans-IO model of the real master (leases granted by reads, invisible puts in progress,
//! insert-if-absent puts, no-space puts failing at once, watermark-triggered batch
//! eviction on an eviction "tick"), whose victim choice is delegated to an
//! [`EvictionPolicy`]. The adapter for a real Mooncake Store implements the same trait.
//!
//! Time is always an argument (`now`, integer nanoseconds of whatever clock the driver
//! uses: virtual in the simulator, monotonic wall time in the real backend).

mod error;
mod key;
mod keyindex;
mod mem;
pub mod policies;
pub mod policy;
mod recorded;
pub mod vindex;

pub use error::{ConfigError, StoreError, StoreResult};
pub use key::{OtherKey, StoreKey, StrKey, KV_PREFIX, MM_BLOB_PREFIX, MM_META_PREFIX};
pub use mem::{MemStore, MemStoreConfig, ObjId, StoreStats, TypeStats};
pub use policy::{
    Candidate, EvictRequest, EvictionPolicy, MooncakeDefault, ObjectMeta, PolicyConfig,
    PolicyNameError,
};
pub use recorded::{OpKind, Recorded, StoreOp};
pub use vindex::VictimIndex;

use serde::{Deserialize, Serialize};

/// Integer nanoseconds. Virtual in the simulator, monotonic wall time in real runs.
pub type Nanos = u64;

/// One millisecond in [`Nanos`].
pub const MS: Nanos = 1_000_000;
/// One second in [`Nanos`].
pub const SEC: Nanos = 1_000_000_000;

/// What an object holds. Mooncake's `ObjectDataType`, with encoder outputs (seed 002's
/// `HIDDEN_STATE`) as a first-class type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataType {
    /// Anything else (Mooncake's default type).
    General,
    /// Prefix KV cache blocks.
    KvCache,
    /// Vision-encoder outputs (visual embeddings, "encoder hidden states") and their meta.
    EncoderOutput,
}

impl DataType {
    /// Every data type, in index order.
    pub const ALL: [DataType; 3] = [
        DataType::General,
        DataType::KvCache,
        DataType::EncoderOutput,
    ];
    /// Number of data types (size of per-type arrays).
    pub const COUNT: usize = 3;

    /// Dense index for per-type arrays.
    #[inline]
    pub fn index(self) -> usize {
        self as usize
    }

    /// Stable snake_case name (as in configs and reports).
    pub fn name(self) -> &'static str {
        match self {
            DataType::General => "general",
            DataType::KvCache => "kv_cache",
            DataType::EncoderOutput => "encoder_output",
        }
    }
}

/// Mooncake's `ReplicateConfig`, reduced to what a single-replica memory store uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicateConfig {
    /// Object data type (drives type-aware eviction and per-type reports).
    pub data_type: DataType,
    /// Never evicted while pinned (it can still be removed).
    pub hard_pin: bool,
    /// Evicted only after every evictable unpinned object, until the soft-pin TTL
    /// (`MemStoreConfig::soft_pin_ttl_ns`, counted from the put, not refreshed by reads).
    pub soft_pin: bool,
}

impl Default for ReplicateConfig {
    fn default() -> Self {
        Self {
            data_type: DataType::General,
            hard_pin: false,
            soft_pin: false,
        }
    }
}

impl ReplicateConfig {
    /// An unpinned object of type `data_type`.
    pub fn of(data_type: DataType) -> Self {
        Self {
            data_type,
            ..Self::default()
        }
    }
}

/// An object's content: real bytes, or only a size (so a simulator can hold millions of
/// objects without their bytes). Both go through the same store code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// Real bytes.
    Bytes(Vec<u8>),
    /// A size in bytes and nothing else.
    SizeOnly(u64),
}

impl Payload {
    /// Size in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Bytes(b) => b.len() as u64,
            Payload::SizeOnly(n) => *n,
        }
    }

    /// True when the payload has zero bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Per-access information a driver may attach so policies and reports can weigh by cost
/// (Caffeine/libCacheSim style). Real Mooncake clients carry none of it: defaults apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessHints {
    /// Recompute cost of a miss on this object, in ns (0 = unknown).
    pub miss_penalty_ns: u64,
    /// Logical time (request sequence number) of this key's next access, from a backward
    /// pass over the trace; `u64::MAX` = never again or unknown. Only offline bounds read it.
    pub next_access: u64,
    /// Tenant id (hierarchical policies scope by it).
    pub tenant: u32,
    /// Priority class (higher = more important); hierarchical policies scope by it.
    pub priority: u8,
}

impl Default for AccessHints {
    fn default() -> Self {
        Self {
            miss_penalty_ns: 0,
            next_access: u64::MAX,
            tenant: 0,
            priority: 0,
        }
    }
}

/// Mooncake Store's client operation set. Keys are strings, as in Mooncake.
///
/// Every call takes `now`. Reads (`get_*`, `exists`, `batch_exists`) grant a lease of
/// `kv_lease_ttl` on the objects they find, as the real master does.
pub trait Store {
    /// Reserve space for `key` and mark it in progress (invisible to readers).
    fn put_start(
        &mut self,
        now: Nanos,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()>;
    /// Complete a put started with [`Store::put_start`]; `payload.len()` must equal the reserved size.
    fn put_end(&mut self, now: Nanos, key: &str, payload: Payload) -> StoreResult<()>;
    /// Abandon a put in progress and release its space.
    fn put_revoke(&mut self, now: Nanos, key: &str) -> StoreResult<()>;
    /// Copy the object into `buf`; returns its length. Grants a lease.
    fn get_into(&mut self, now: Nanos, key: &str, buf: &mut [u8]) -> StoreResult<u64>;
    /// Size of a complete object, read without moving bytes (size-only drivers). Grants a lease.
    fn get_size(&mut self, now: Nanos, key: &str) -> StoreResult<u64>;
    /// Whether a complete object exists. Grants a lease when it does.
    fn exists(&mut self, now: Nanos, key: &str) -> StoreResult<bool>;
    /// Remove an object; without `force`, a leased object is kept and `HasLease` returned.
    fn remove(&mut self, now: Nanos, key: &str, force: bool) -> StoreResult<()>;

    /// Put in one call (start then end; revoke if the end fails).
    fn put(
        &mut self,
        now: Nanos,
        key: &str,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        self.put_start(now, key, payload.len(), cfg)?;
        match self.put_end(now, key, payload) {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = self.put_revoke(now, key);
                Err(e)
            }
        }
    }

    /// [`Store::exists`] of a typed key (stores with compact keys skip the string; every
    /// other store formats it: the same key, test `store_kv_keys.rs`). The engine's
    /// prefix-KV lookups use it with `StoreKey::Kv(block)`.
    fn exists_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<bool> {
        self.exists(now, &key.to_string())
    }

    /// [`Store::get_into`] of a typed key (stores with compact keys skip the string; every
    /// other store formats it: the same key, test `store_typed_keys.rs`).
    fn get_into_key(&mut self, now: Nanos, key: &StoreKey, buf: &mut [u8]) -> StoreResult<u64> {
        self.get_into(now, &key.to_string(), buf)
    }

    /// [`Store::get_size`] of a typed key.
    fn get_size_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<u64> {
        self.get_size(now, &key.to_string())
    }

    /// [`Store::put`] under a typed key.
    fn put_key(
        &mut self,
        now: Nanos,
        key: &StoreKey,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        self.put(now, &key.to_string(), payload, cfg)
    }

    /// [`Store::remove`] of a typed key.
    fn remove_key(&mut self, now: Nanos, key: &StoreKey, force: bool) -> StoreResult<()> {
        self.remove(now, &key.to_string(), force)
    }

    /// Batch put: one result per item, in order.
    fn batch_put(
        &mut self,
        now: Nanos,
        items: Vec<(String, Payload)>,
        cfg: &ReplicateConfig,
    ) -> Vec<StoreResult<()>> {
        items
            .into_iter()
            .map(|(k, p)| self.put(now, &k, p, cfg))
            .collect()
    }

    /// Batch get into caller buffers: one result per key, in order.
    fn batch_get_into(
        &mut self,
        now: Nanos,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
    ) -> Vec<StoreResult<u64>> {
        keys.iter()
            .zip(bufs.iter_mut())
            .map(|(k, b)| self.get_into(now, k, b))
            .collect()
    }

    /// Batch exists: one result per key, in order.
    fn batch_exists(&mut self, now: Nanos, keys: &[&str]) -> Vec<StoreResult<bool>> {
        keys.iter().map(|k| self.exists(now, k)).collect()
    }

    /// Batch remove: one result per key, in order.
    fn batch_remove(&mut self, now: Nanos, keys: &[&str], force: bool) -> Vec<StoreResult<()>> {
        keys.iter().map(|k| self.remove(now, k, force)).collect()
    }

    /// Open a read that spans time (a transfer in flight): a lease-granting read of a
    /// complete object's size that also holds the object as being read until
    /// [`Store::end_read`], so that no eviction takes it meanwhile (INVARIANTS S2).
    /// The default is a plain [`Store::get_size`] (a store that cannot hold readers
    /// relies on the lease alone).
    fn begin_read(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        self.get_size(now, key)
    }

    /// Close a read opened by [`Store::begin_read`]. The default does nothing.
    fn end_read(&mut self, _now: Nanos, _key: &str) -> StoreResult<()> {
        Ok(())
    }

    /// [`Store::begin_read`] of a typed key.
    fn begin_read_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<u64> {
        self.begin_read(now, &key.to_string())
    }

    /// [`Store::end_read`] of a typed key.
    fn end_read_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<()> {
        self.end_read(now, &key.to_string())
    }

    /// A hint: `key` is about to be read (`exists_key`, `get_*_key`). A store may start
    /// fetching what that read touches; nothing else changes (no lease, no counter, no
    /// recorded operation). The default does nothing.
    fn prefetch_key(&self, _key: &StoreKey) {}

    /// A hint: `key` is about to be put, after `ahead` other puts. As
    /// [`Store::prefetch_key`], for a put (a store may also fetch the memory that put is
    /// likely to take).
    fn prefetch_put_key(&self, _key: &StoreKey, _ahead: usize) {}
}

/// A mutable reference to a store is a store, so drivers can lend one (`&mut dyn Store`)
/// to code that owns its store by value (e.g. `MmCache`).
impl<S: Store + ?Sized> Store for &mut S {
    fn put_start(
        &mut self,
        now: Nanos,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        (**self).put_start(now, key, size, cfg)
    }
    fn put_end(&mut self, now: Nanos, key: &str, payload: Payload) -> StoreResult<()> {
        (**self).put_end(now, key, payload)
    }
    fn put_revoke(&mut self, now: Nanos, key: &str) -> StoreResult<()> {
        (**self).put_revoke(now, key)
    }
    fn get_into(&mut self, now: Nanos, key: &str, buf: &mut [u8]) -> StoreResult<u64> {
        (**self).get_into(now, key, buf)
    }
    fn get_size(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        (**self).get_size(now, key)
    }
    fn exists(&mut self, now: Nanos, key: &str) -> StoreResult<bool> {
        (**self).exists(now, key)
    }
    fn remove(&mut self, now: Nanos, key: &str, force: bool) -> StoreResult<()> {
        (**self).remove(now, key, force)
    }
    fn put(
        &mut self,
        now: Nanos,
        key: &str,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        (**self).put(now, key, payload, cfg)
    }
    fn exists_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<bool> {
        (**self).exists_key(now, key)
    }
    fn begin_read(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        (**self).begin_read(now, key)
    }
    fn get_into_key(&mut self, now: Nanos, key: &StoreKey, buf: &mut [u8]) -> StoreResult<u64> {
        (**self).get_into_key(now, key, buf)
    }
    fn get_size_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<u64> {
        (**self).get_size_key(now, key)
    }
    fn put_key(
        &mut self,
        now: Nanos,
        key: &StoreKey,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        (**self).put_key(now, key, payload, cfg)
    }
    fn remove_key(&mut self, now: Nanos, key: &StoreKey, force: bool) -> StoreResult<()> {
        (**self).remove_key(now, key, force)
    }
    fn end_read(&mut self, now: Nanos, key: &str) -> StoreResult<()> {
        (**self).end_read(now, key)
    }
    fn begin_read_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<u64> {
        (**self).begin_read_key(now, key)
    }
    fn end_read_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<()> {
        (**self).end_read_key(now, key)
    }
    fn prefetch_key(&self, key: &StoreKey) {
        (**self).prefetch_key(key)
    }
    fn prefetch_put_key(&self, key: &StoreKey, ahead: usize) {
        (**self).prefetch_put_key(key, ahead)
    }
}

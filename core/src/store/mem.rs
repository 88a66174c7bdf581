//! `MemStore`: the embedded store, a sans-IO model of Mooncake's master and one segment.
//!
//! Objects live in a slab (`ObjId` = slot index) with a hash index from key to slot, so a
//! policy scans a dense `&[ObjectMeta]`. The index holds only slot numbers, filed under
//! each key's hash (kept in its meta, `ObjectMeta::key_hash`): a lookup hashes its key
//! once and compares keys in the slab, a free removes its slot without touching the key.
//! Keys are generic: the [`Store`] impl takes `&str` keys as Mooncake does, held as
//! `String`s or as their compact [`StoreKey`] form (the simulator's); the simulator and
//! replay also use their own keys through the same generic methods, so every driver runs
//! the same code.
//!
//! [`StoreKey`]: super::StoreKey
//!
//! The master's eviction thread wakes every `eviction_interval_ns` (10 ms on the real
//! master). Because nothing happens between two calls, the model runs the ticks that fell
//! due since the last call at the start of each call: if the trigger holds at a tick
//! (`used > high_watermark`, or a put failed for space since the last run), one
//! `BatchEvict` runs at that tick's time. Ticks at which nothing could be evicted are
//! collapsed into the last tick before `now` (between calls only leases expire, so this
//! changes no outcome except the time stamp of that run). `eviction_interval_ns = 0`
//! evicts synchronously at the end of the call that crossed the watermark.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use rustc_hash::FxBuildHasher;
use serde::{Deserialize, Serialize};

use super::key::{StoreKey, StrKey};
use super::keyindex::{KeyIndex, Probe, MAX_SLOT};
use super::policy::{EvictRequest, EvictionPolicy, ObjectMeta, PolicyConfig};
use super::vindex::VictimIndex;
use super::{
    AccessHints, Candidate, ConfigError, DataType, Nanos, Payload, ReplicateConfig, Store,
    StoreError, StoreResult, MS, SEC,
};
use crate::invariant::{violation, InvariantViolation};

/// Slot index of an object in a [`MemStore`]; valid until the object is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjId(pub u32);

impl ObjId {
    /// The slot index as `usize`.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// `MemStore` settings; defaults are Mooncake master's at HEAD.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemStoreConfig {
    /// Segment bytes (the memory all clients contribute).
    pub capacity_bytes: u64,
    /// `eviction_high_watermark_ratio` (0.90).
    pub high_watermark: f64,
    /// `eviction_ratio` (0.05).
    pub eviction_ratio: f64,
    /// `default_kv_lease_ttl` (10 s).
    pub kv_lease_ttl_ns: Nanos,
    /// `default_kv_soft_pin_ttl` (30 min).
    pub soft_pin_ttl_ns: Nanos,
    /// `allow_evict_soft_pinned_objects` (true).
    pub allow_evict_soft_pinned: bool,
    /// Eviction thread period (10 ms); 0 = evict synchronously.
    pub eviction_interval_ns: Nanos,
    /// `put_start_discard_timeout_sec` (30 s): a put still in progress after this may be
    /// replaced by a new put of the same key.
    pub put_start_discard_timeout_ns: Nanos,
}

impl Default for MemStoreConfig {
    fn default() -> Self {
        Self {
            capacity_bytes: 1 << 30,
            high_watermark: 0.90,
            eviction_ratio: 0.05,
            kv_lease_ttl_ns: 10 * SEC,
            soft_pin_ttl_ns: 1_800 * SEC,
            allow_evict_soft_pinned: true,
            eviction_interval_ns: 10 * MS,
            put_start_discard_timeout_ns: 30 * SEC,
        }
    }
}

impl MemStoreConfig {
    /// Defaults with the given capacity.
    pub fn with_capacity(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            ..Self::default()
        }
    }

    /// Check every field; the error names the field and what was expected.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity_bytes == 0 {
            return Err(ConfigError::field("capacity_bytes", "expected > 0"));
        }
        if !(self.high_watermark > 0.0 && self.high_watermark <= 1.0) {
            return Err(ConfigError::field(
                "high_watermark",
                format!("expected in (0, 1], got {}", self.high_watermark),
            ));
        }
        if !(0.0..=1.0).contains(&self.eviction_ratio) {
            return Err(ConfigError::field(
                "eviction_ratio",
                format!("expected in [0, 1], got {}", self.eviction_ratio),
            ));
        }
        Ok(())
    }
}

/// Counters for one data type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeStats {
    /// Completed puts.
    pub puts: u64,
    /// Bytes of completed puts.
    pub put_bytes: u64,
    /// Puts refused for space (-200).
    pub put_no_space: u64,
    /// Objects evicted.
    pub evicted: u64,
    /// Bytes evicted.
    pub evicted_bytes: u64,
    /// Objects resident now.
    pub resident: u64,
    /// Bytes resident now (in-progress included).
    pub resident_bytes: u64,
}

/// Store-wide counters. Deterministic: a function of the operation sequence only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreStats {
    /// Per data type, indexed by `DataType::index`.
    pub by_type: [TypeStats; DataType::COUNT],
    /// Puts refused because the key existed.
    pub put_exists: u64,
    /// Lease-granting reads that found a complete object.
    pub read_hits: u64,
    /// Reads that found nothing (or a put in progress).
    pub read_misses: u64,
    /// `BatchEvict` runs.
    pub eviction_runs: u64,
    /// Runs that evicted nothing.
    pub eviction_runs_empty: u64,
    /// Victims proposed by the policy that the store refused (must stay 0).
    pub policy_refused: u64,
    /// Objects removed by `remove`.
    pub removed: u64,
}

/// Whether slot `id` holds `key` (what the key index's probes ask on a tag match).
#[inline]
fn holds_key<K: Borrow<Q>, Q: Eq + ?Sized>(slots: &[Slot<K>], id: u32, key: &Q) -> bool {
    slots[id as usize]
        .key
        .as_ref()
        .is_some_and(|k| k.borrow() == key)
}

/// What a put brings: a reservation of so many bytes (a put start) or the whole payload.
enum Body {
    Reserve(u64),
    Whole(Payload),
}

/// How many victims ahead a batch eviction prefetches (see `MemStore::prefetch_slot`).
const PREFETCH_AHEAD: usize = 8;

struct Slot<K> {
    key: Option<K>,
    payload: Option<Payload>,
}

/// The embedded Mooncake-semantics store. Generic over the key type; see the module docs.
pub struct MemStore<K = String> {
    cfg: MemStoreConfig,
    policy: Box<dyn EvictionPolicy>,
    /// Live slots by key: each filed under its key's hash (`ObjectMeta::key_hash`).
    index: KeyIndex,
    slots: Vec<Slot<K>>,
    metas: Vec<ObjectMeta>,
    free: Vec<ObjId>,
    used_bytes: u64,
    objects: u64,
    seq: u64,
    need_eviction: bool,
    next_tick: Nanos,
    last_now: Nanos,
    stats: StoreStats,
    victims: Vec<ObjId>,
    /// Small payload buffers of freed objects, released one per later put of bytes
    /// (see [`MemStore::retire`]).
    retired: Vec<Vec<u8>>,
    /// Kept when the policy picks from it (`EvictionPolicy::uses_victim_index`).
    vindex: Option<VictimIndex>,
    /// Debug builds: the scan's victims, compared with the index's every run.
    #[cfg(debug_assertions)]
    scan_victims: Vec<ObjId>,
}

/// Most payload buffers [`MemStore::retire`] holds.
const RETIRED_MAX: usize = 8192;
/// Largest payload buffer (capacity, bytes) [`MemStore::retire`] holds; larger ones are
/// freed with their object.
const RETIRED_BYTES: usize = 4096;

impl<K> std::fmt::Debug for MemStore<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore")
            .field("policy", &self.policy.name())
            .field("objects", &self.objects)
            .field("used_bytes", &self.used_bytes)
            .field("capacity_bytes", &self.cfg.capacity_bytes)
            .finish()
    }
}

const EMPTY_META: ObjectMeta = ObjectMeta {
    live: false,
    size: 0,
    data_type: DataType::General,
    hard_pinned: false,
    soft_pin_until: None,
    lease_timeout: 0,
    complete: false,
    readers: 0,
    put_time: 0,
    insert_seq: 0,
    last_access: 0,
    last_access_seq: 0,
    access_count: 0,
    hints: AccessHints {
        miss_penalty_ns: 0,
        next_access: u64::MAX,
        tenant: 0,
        priority: 0,
    },
    key_hash: 0,
};

impl<K: Hash + Eq + Clone> MemStore<K> {
    /// A store with the `mooncake-default` policy.
    pub fn new(cfg: MemStoreConfig) -> Result<Self, ConfigError> {
        Self::with_policy(cfg, &PolicyConfig::default())
    }

    /// A store with the configured policy.
    pub fn with_policy(cfg: MemStoreConfig, policy: &PolicyConfig) -> Result<Self, ConfigError> {
        let p = policy.build()?;
        Self::with_policy_box(cfg, p)
    }

    /// A store with an already-built policy.
    pub fn with_policy_box(
        cfg: MemStoreConfig,
        policy: Box<dyn EvictionPolicy>,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let vindex = policy.uses_victim_index().then(VictimIndex::new);
        Ok(Self {
            cfg,
            policy,
            index: KeyIndex::default(),
            slots: Vec::new(),
            metas: Vec::new(),
            free: Vec::new(),
            used_bytes: 0,
            objects: 0,
            seq: 0,
            need_eviction: false,
            next_tick: 0,
            last_now: 0,
            stats: StoreStats::default(),
            victims: Vec::new(),
            retired: Vec::new(),
            vindex,
            #[cfg(debug_assertions)]
            scan_victims: Vec::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MemStoreConfig {
        &self.cfg
    }
    /// The policy's name.
    pub fn policy_name(&self) -> &str {
        self.policy.name()
    }
    /// Counters.
    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }
    /// Bytes allocated (in-progress puts included).
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }
    /// Objects held (in-progress puts included).
    pub fn len(&self) -> u64 {
        self.objects
    }
    /// True when the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.objects == 0
    }
    /// Every slot's meta, indexed by `ObjId` (free slots have `live == false`).
    pub fn metas(&self) -> &[ObjectMeta] {
        &self.metas
    }
    /// Meta of `key`, without granting a lease (an admin view, like `/query_key`).
    pub fn peek<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<&ObjectMeta>
    where
        K: Borrow<Q>,
    {
        self.find(key).map(|id| &self.metas[id.index()])
    }
    /// Key of a live slot.
    pub fn key_of(&self, id: ObjId) -> Option<&K> {
        self.slots.get(id.index()).and_then(|s| s.key.as_ref())
    }
    /// The victim index, when the policy uses one (see [`VictimIndex`]).
    pub fn victim_index(&self) -> Option<&VictimIndex> {
        self.vindex.as_ref()
    }
    /// Live keys, in slot order (an admin view, like `/get_all_keys`; grants no lease).
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.slots.iter().filter_map(|s| s.key.as_ref())
    }

    /// Check the key index (INVARIANTS S12): it holds exactly the live slots, once each,
    /// every one filed under its key's hash and found by its key. The property tests call
    /// it after every operation.
    pub fn check_index(&self) -> Result<(), InvariantViolation> {
        let live = self.slots.iter().filter(|s| s.key.is_some()).count();
        if self.index.len() != live || live as u64 != self.objects {
            return Err(violation!(
                "S12",
                "the index holds {} slots, {live} are live, {} objects",
                self.index.len(),
                self.objects
            ));
        }
        if let Err(e) = self.index.check() {
            return Err(violation!("S12", "the index's table: {e}"));
        }
        for id in self.index.slots() {
            if self.slots.get(id as usize).is_none_or(|s| s.key.is_none()) {
                return Err(violation!("S12", "slot {id} indexed but free"));
            }
        }
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(k) = &slot.key else { continue };
            let h = FxBuildHasher.hash_one(k);
            if self.metas[i].key_hash != h {
                return Err(violation!(
                    "S12",
                    "slot {i}: key hash {} != {h}",
                    self.metas[i].key_hash
                ));
            }
            if !self.index.holds(h, i as u32) {
                return Err(violation!(
                    "S12",
                    "slot {i} is not filed under its key's hash"
                ));
            }
            if self.find::<K>(k).map(|x| x.index()) != Some(i) {
                return Err(violation!("S12", "slot {i}'s key finds another slot"));
            }
        }
        Ok(())
    }

    /// The slot of `key`, if live: one hash, then keys compared in the slab.
    #[inline]
    fn find<Q: Hash + Eq + ?Sized>(&self, key: &Q) -> Option<ObjId>
    where
        K: Borrow<Q>,
    {
        self.find_hashed(FxBuildHasher.hash_one(key), key)
    }

    /// [`MemStore::find`] of a key whose hash is `h`.
    #[inline]
    fn find_hashed<Q: Hash + Eq + ?Sized>(&self, h: u64, key: &Q) -> Option<ObjId>
    where
        K: Borrow<Q>,
    {
        self.index
            .find(h, |id| holds_key(&self.slots, id, key))
            .map(ObjId)
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Run the eviction ticks due by `now`. Called at the start of every operation.
    pub fn advance(&mut self, now: Nanos) {
        let now = now.max(self.last_now);
        self.last_now = now;
        let iv = self.cfg.eviction_interval_ns;
        if iv == 0 {
            return;
        }
        if self.next_tick == 0 {
            // First call: ticks are aligned to multiples of the interval.
            self.next_tick = (now / iv) * iv + iv;
            return;
        }
        while self.next_tick <= now {
            let t = self.next_tick;
            if !self.trigger() {
                // Nothing changes until the next call: skip to the first tick after `now`.
                self.next_tick = (now / iv) * iv + iv;
                break;
            }
            let last_due = (now / iv) * iv;
            if self.batch_evict(t) == 0 {
                // Nothing evictable at `t`; only lease expiry changes that before `now`,
                // so run once more at the last due tick and stop.
                if last_due > t && self.trigger() {
                    self.batch_evict(last_due);
                }
                self.next_tick = last_due + iv;
                break;
            }
            self.next_tick = t + iv;
        }
    }

    /// End-of-call hook: synchronous mode evicts here.
    fn settle(&mut self, now: Nanos) {
        if self.cfg.eviction_interval_ns == 0 {
            while self.trigger() {
                if self.batch_evict(now) == 0 {
                    break;
                }
            }
        }
    }

    fn used_ratio(&self) -> f64 {
        self.used_bytes as f64 / self.cfg.capacity_bytes as f64
    }

    fn trigger(&self) -> bool {
        self.used_ratio() > self.cfg.high_watermark
            || (self.need_eviction && self.cfg.eviction_ratio > 0.0)
    }

    /// One run of the master's `BatchEvict` at `now`. Returns the number evicted.
    fn batch_evict(&mut self, now: Nanos) -> u64 {
        let used = self.used_ratio();
        let hwm = self.cfg.high_watermark;
        let ratio = self.cfg.eviction_ratio;
        let target = ratio.max(used - hwm + ratio);
        let lower = (target * 0.5).max(used - hwm);
        let n = self.objects as f64;
        let req = EvictRequest {
            now,
            target: (n * target).ceil() as u64,
            lower_bound: (n * lower).ceil() as u64,
            object_count: self.objects,
            used_bytes: self.used_bytes,
            capacity_bytes: self.cfg.capacity_bytes,
            allow_soft_pinned: self.cfg.allow_evict_soft_pinned,
        };
        let mut victims = std::mem::take(&mut self.victims);
        victims.clear();
        match &mut self.vindex {
            Some(ix) => {
                self.policy
                    .select_victims_indexed(&req, &self.metas, ix, &mut victims);
                // The scan is the reference (INVARIANTS S11): debug builds run it too.
                #[cfg(debug_assertions)]
                {
                    let mut scan = std::mem::take(&mut self.scan_victims);
                    scan.clear();
                    self.policy.select_victims(&req, &self.metas, &mut scan);
                    assert_eq!(victims, scan, "victim index and scan differ at {now}");
                    self.scan_victims = scan;
                }
            }
            None => self.policy.select_victims(&req, &self.metas, &mut victims),
        }
        let mut evicted = 0;
        for (i, &id) in victims.iter().enumerate() {
            // The victims are the oldest leases, cold and scattered over the slab: fetch
            // the lines a later free reads while this one is freed (hints only): the meta,
            // slot and index entries of the victim `2 * PREFETCH_AHEAD` on, and the key
            // index line of the one `PREFETCH_AHEAD` on, whose meta (its key's hash) the
            // first fetch brought in.
            if let Some(&ahead) = victims.get(i + 2 * PREFETCH_AHEAD) {
                self.prefetch_slot(ahead);
            }
            if let Some(&a) = victims.get(i + PREFETCH_AHEAD) {
                if let Some(m) = self.metas.get(a.index()) {
                    self.index.prefetch(m.key_hash);
                }
                // A payload of bytes `retire` does not keep is freed with the object: its
                // allocation's header, read by `free`, is as cold as the rest.
                if let Some(Some(Payload::Bytes(b))) = self.slots.get(a.index()).map(|s| &s.payload)
                {
                    if !Self::retires(&self.retired, b) {
                        if let Some(first) = b.first() {
                            crate::hint::prefetch(first);
                        }
                    }
                }
            }
            let ok = match self.metas.get(id.index()).map(|m| m.candidate(now)) {
                Some(Candidate::Unpinned) => true,
                Some(Candidate::SoftPinned) => self.cfg.allow_evict_soft_pinned,
                _ => false,
            };
            if !ok {
                self.stats.policy_refused += 1;
                continue;
            }
            let m = &self.metas[id.index()];
            let t = &mut self.stats.by_type[m.data_type.index()];
            t.evicted += 1;
            t.evicted_bytes += m.size;
            self.free_slot(id);
            evicted += 1;
        }
        self.victims = victims;
        self.stats.eviction_runs += 1;
        if evicted > 0 {
            self.need_eviction = false;
        } else {
            self.stats.eviction_runs_empty += 1;
            if self.objects == 0 {
                self.need_eviction = false;
            }
        }
        evicted
    }

    /// Keep a freed object's small payload buffer for release at a later put of bytes
    /// instead of freeing it here. A batch eviction frees thousands of cold payloads at
    /// once (the image cache's envelopes), which overflows glibc's per-thread cache (7
    /// chunks a size) into its bins; released one per put, they stay in the thread cache.
    /// Memory only: nothing the store reports depends on when a buffer is released. At
    /// most `RETIRED_MAX` buffers of at most `RETIRED_BYTES` each are held.
    #[inline]
    fn retire(retired: &mut Vec<Vec<u8>>, b: Vec<u8>) {
        if Self::retires(retired, &b) {
            retired.push(b);
        }
    }

    /// Whether [`MemStore::retire`] would keep `b` now (else it is freed at once).
    #[inline]
    fn retires(retired: &[Vec<u8>], b: &Vec<u8>) -> bool {
        b.capacity() <= RETIRED_BYTES && retired.len() < RETIRED_MAX
    }

    /// Hint the CPU to fetch what freeing `id` reads: its meta, slot and index entry.
    #[inline]
    fn prefetch_slot(&self, id: ObjId) {
        if let (Some(m), Some(s)) = (self.metas.get(id.index()), self.slots.get(id.index())) {
            crate::hint::prefetch(m);
            crate::hint::prefetch(s);
        }
        if let Some(ix) = &self.vindex {
            ix.prefetch(id);
        }
    }

    /// Re-file `id` in the victim index after its completion or lease changed.
    #[inline]
    fn reindex(&mut self, id: ObjId) {
        if let Some(ix) = &mut self.vindex {
            ix.update(id, &self.metas[id.index()]);
        }
    }

    #[inline]
    fn free_slot(&mut self, id: ObjId) {
        let i = id.index();
        let m = &self.metas[i];
        self.policy.on_remove(id, m);
        if let Some(ix) = &mut self.vindex {
            ix.on_free(id, m);
        }
        let (size, ty, key_hash) = (m.size, m.data_type.index(), m.key_hash);
        let slot = &mut self.slots[i];
        if let Some(Payload::Bytes(b)) = slot.payload.take() {
            Self::retire(&mut self.retired, b);
        }
        if slot.key.take().is_some() {
            // Filed under its key's hash: found by slot number, the key is not read.
            self.index.remove(key_hash, id.0);
        }
        let t = &mut self.stats.by_type[ty];
        t.resident -= 1;
        t.resident_bytes -= size;
        self.used_bytes -= size;
        self.objects -= 1;
        self.metas[i] = EMPTY_META;
        self.free.push(id);
    }

    /// Reserve space for `key` (put start) with driver hints.
    pub fn put_start_with(
        &mut self,
        now: Nanos,
        key: K,
        size: u64,
        cfg: &ReplicateConfig,
        hints: AccessHints,
    ) -> StoreResult<ObjId> {
        self.put_ref(now, &key, || key.clone(), Body::Reserve(size), cfg, hints)
    }

    /// Reserve `key` (a put start), or with a whole payload the whole put: the object is
    /// then complete from its first filing (its lease is its put time either way), so the
    /// victim index files it once. `owned()` makes the key the slot keeps.
    fn put_start_inner<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        owned: impl FnOnce() -> K,
        body: Body,
        cfg: &ReplicateConfig,
        hints: AccessHints,
    ) -> StoreResult<ObjId>
    where
        K: Borrow<Q>,
    {
        let (size, payload) = match body {
            Body::Reserve(size) => (size, None),
            Body::Whole(p) => (p.len(), Some(p)),
        };
        let key_hash = FxBuildHasher.hash_one(key);
        let slots = &self.slots;
        // One probe finds the key or the place its slot number goes.
        let vacant = match self.index.probe(key_hash, |id| holds_key(slots, id, key)) {
            Probe::Vacant { at } => Some(at),
            Probe::Found { slot, .. } => {
                let id = ObjId(slot);
                let m = &self.metas[id.index()];
                if m.complete
                    || now
                        < m.put_time
                            .saturating_add(self.cfg.put_start_discard_timeout_ns)
                {
                    self.stats.put_exists += 1;
                    return Err(StoreError::AlreadyExists);
                }
                // A put abandoned for longer than the discard timeout: replace it.
                self.free_slot(id);
                None
            }
        };
        if self.used_bytes.saturating_add(size) > self.cfg.capacity_bytes {
            self.need_eviction = true;
            self.stats.by_type[cfg.data_type.index()].put_no_space += 1;
            return Err(StoreError::NoAvailableHandle);
        }
        let id = match self.free.last() {
            Some(&id) => id,
            None => match u32::try_from(self.slots.len()) {
                Ok(n) if n < MAX_SLOT => ObjId(n),
                _ => return Err(StoreError::NoAvailableHandle),
            },
        };
        // The slot is taken: file it under its key (at the place the probe above found,
        // else by a fresh probe after the replaced put's removal).
        match vacant {
            Some(at) => self.index.insert_at(at, key_hash, id.0),
            None => self.index.insert(key_hash, id.0),
        }
        let seq = self.next_seq();
        let complete = payload.is_some();
        if matches!(payload, Some(Payload::Bytes(_))) {
            // Release one retired buffer per put of bytes: with the caller's next
            // allocation it makes a free-then-allocate pair the allocator's thread cache
            // serves.
            drop(self.retired.pop());
        }
        let i = id.index();
        if i < self.slots.len() {
            self.free.pop();
        } else {
            self.slots.push(Slot {
                key: None,
                payload: None,
            });
            self.metas.push(EMPTY_META);
        }
        // The meta and the slot are written field by field where they live: built on the
        // stack and copied, their small fields (bytes written one by one, read back four
        // at a time) stalled every put on store forwarding.
        let m = &mut self.metas[i];
        m.live = true;
        m.size = size;
        m.data_type = cfg.data_type;
        m.hard_pinned = cfg.hard_pin;
        m.soft_pin_until = cfg
            .soft_pin
            .then(|| now.saturating_add(self.cfg.soft_pin_ttl_ns));
        m.lease_timeout = now;
        m.complete = complete;
        m.readers = 0;
        m.put_time = now;
        m.insert_seq = seq;
        m.last_access = now;
        m.last_access_seq = seq;
        m.access_count = 0;
        m.hints = hints;
        m.key_hash = key_hash;
        let slot = &mut self.slots[i];
        // The owned key is made here, where it is stored (moved through the calls above,
        // it was written piecewise and read back whole: another stall).
        slot.key = Some(owned());
        slot.payload = payload;
        self.used_bytes += size;
        self.objects += 1;
        let t = &mut self.stats.by_type[cfg.data_type.index()];
        t.resident += 1;
        t.resident_bytes += size;
        if complete {
            t.puts += 1;
            t.put_bytes += size;
        }
        self.policy.on_insert(id, &self.metas[id.index()]);
        if let Some(ix) = &mut self.vindex {
            ix.on_live(id, &self.metas[id.index()]);
        }
        Ok(id)
    }

    /// Complete a put in progress.
    pub fn put_end_with<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        payload: Payload,
    ) -> StoreResult<()>
    where
        K: Borrow<Q>,
    {
        self.advance(now);
        let r = (|| {
            let id = self.find(key).ok_or(StoreError::NotFound)?;
            let m = &mut self.metas[id.index()];
            if m.complete {
                return Err(StoreError::AlreadyExists);
            }
            if payload.len() != m.size {
                return Err(StoreError::InvalidParams(format!(
                    "put_end of {} bytes for a put_start of {} bytes",
                    payload.len(),
                    m.size
                )));
            }
            m.complete = true;
            // The object takes no lease: its lease timeout is its completion time.
            m.lease_timeout = now;
            let t = &mut self.stats.by_type[m.data_type.index()];
            t.puts += 1;
            t.put_bytes += m.size;
            self.slots[id.index()].payload = Some(payload);
            self.reindex(id);
            Ok(())
        })();
        self.settle(now);
        r
    }

    /// Abandon a put in progress.
    pub fn put_revoke_with<Q: Hash + Eq + ?Sized>(&mut self, now: Nanos, key: &Q) -> StoreResult<()>
    where
        K: Borrow<Q>,
    {
        self.advance(now);
        let r = match self.find(key) {
            None => Err(StoreError::NotFound),
            Some(id) if self.metas[id.index()].complete => Err(StoreError::AlreadyExists),
            Some(id) => {
                self.free_slot(id);
                Ok(())
            }
        };
        self.settle(now);
        r
    }

    /// Put start + end in one call, with hints. Returns the slot.
    pub fn put_with(
        &mut self,
        now: Nanos,
        key: K,
        payload: Payload,
        cfg: &ReplicateConfig,
        hints: AccessHints,
    ) -> StoreResult<ObjId> {
        self.put_ref(now, &key, || key.clone(), Body::Whole(payload), cfg, hints)
    }

    /// A put start ([`MemStore::put_start_with`]) or a whole put ([`MemStore::put_with`])
    /// of a borrowed key; `owned()` makes the key the store keeps (called once, after the
    /// checks pass).
    #[inline]
    fn put_ref<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        owned: impl FnOnce() -> K,
        body: Body,
        cfg: &ReplicateConfig,
        hints: AccessHints,
    ) -> StoreResult<ObjId>
    where
        K: Borrow<Q>,
    {
        self.advance(now);
        let r = self.put_start_inner(now, key, owned, body, cfg, hints);
        self.settle(now);
        r
    }

    /// The lease-granting read all gets share: find a complete object and lease it.
    fn read<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        hints: Option<AccessHints>,
    ) -> StoreResult<ObjId>
    where
        K: Borrow<Q>,
    {
        self.advance(now);
        let Some(id) = self.find(key) else {
            self.stats.read_misses += 1;
            return Err(StoreError::NotFound);
        };
        if !self.metas[id.index()].complete {
            self.stats.read_misses += 1;
            return Err(StoreError::NotReady);
        }
        let seq = self.next_seq();
        let ttl = self.cfg.kv_lease_ttl_ns;
        let m = &mut self.metas[id.index()];
        m.lease_timeout = m.lease_timeout.max(now.saturating_add(ttl));
        m.last_access = now;
        m.last_access_seq = seq;
        m.access_count += 1;
        if let Some(h) = hints {
            m.hints = h;
        }
        self.stats.read_hits += 1;
        self.policy.on_access(id, &self.metas[id.index()]);
        self.reindex(id);
        Ok(id)
    }

    /// Read `key` into `buf` (grants a lease); returns the object size.
    pub fn get_into_with<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        buf: &mut [u8],
        hints: Option<AccessHints>,
    ) -> StoreResult<u64>
    where
        K: Borrow<Q>,
    {
        let id = self.read(now, key, hints)?;
        let size = self.metas[id.index()].size;
        let r = match &self.slots[id.index()].payload {
            Some(Payload::Bytes(b)) => {
                if (buf.len() as u64) < size {
                    Err(StoreError::BufferTooSmall {
                        needed: size,
                        capacity: buf.len() as u64,
                    })
                } else {
                    buf[..b.len()].copy_from_slice(b);
                    Ok(size)
                }
            }
            _ => Err(StoreError::SizeOnly),
        };
        self.settle(now);
        r
    }

    /// Read `key` without moving bytes (grants a lease); returns the object size.
    pub fn get_size_with<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        hints: Option<AccessHints>,
    ) -> StoreResult<u64>
    where
        K: Borrow<Q>,
    {
        let r = self
            .read(now, key, hints)
            .map(|id| self.metas[id.index()].size);
        self.settle(now);
        r
    }

    /// Whether a complete object exists (grants a lease when it does).
    pub fn exists_with<Q: Hash + Eq + ?Sized>(&mut self, now: Nanos, key: &Q) -> StoreResult<bool>
    where
        K: Borrow<Q>,
    {
        self.exists_hinted(now, key, None)
    }

    /// [`MemStore::exists_with`] that also records the driver's hints on a hit.
    pub fn exists_hinted<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        hints: Option<AccessHints>,
    ) -> StoreResult<bool>
    where
        K: Borrow<Q>,
    {
        let r = match self.read(now, key, hints) {
            Ok(_) => Ok(true),
            Err(StoreError::NotFound | StoreError::NotReady) => Ok(false),
            Err(e) => Err(e),
        };
        self.settle(now);
        r
    }

    /// Open a read that spans time: a lease-granting read (as [`MemStore::get_size_with`])
    /// that also counts a reader on the object until [`MemStore::end_read_with`]. An
    /// object with a reader is never an eviction candidate (`ObjectMeta::candidate`), so
    /// a transfer outliving its lease cannot lose its source (INVARIANTS S2).
    pub fn begin_read_with<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        hints: Option<AccessHints>,
    ) -> StoreResult<u64>
    where
        K: Borrow<Q>,
    {
        let r = self.read(now, key, hints).map(|id| {
            let m = &mut self.metas[id.index()];
            m.readers += 1;
            m.size
        });
        self.settle(now);
        r
    }

    /// Close a read opened by [`MemStore::begin_read_with`]. `NotFound` when the object
    /// is gone (a forced remove), `InvalidParams` when no read is open on it.
    pub fn end_read_with<Q: Hash + Eq + ?Sized>(&mut self, now: Nanos, key: &Q) -> StoreResult<()>
    where
        K: Borrow<Q>,
    {
        self.advance(now);
        let r = match self.find(key) {
            None => Err(StoreError::NotFound),
            Some(id) => {
                let m = &mut self.metas[id.index()];
                if m.readers == 0 {
                    Err(StoreError::InvalidParams(
                        "end_read without an open read".into(),
                    ))
                } else {
                    m.readers -= 1;
                    Ok(())
                }
            }
        };
        // The object may have become a candidate; a pending eviction runs now.
        self.settle(now);
        r
    }

    /// Remove `key`; without `force` a leased object stays and `HasLease` is returned.
    pub fn remove_with<Q: Hash + Eq + ?Sized>(
        &mut self,
        now: Nanos,
        key: &Q,
        force: bool,
    ) -> StoreResult<()>
    where
        K: Borrow<Q>,
    {
        self.advance(now);
        let r = match self.find(key) {
            None => Err(StoreError::NotFound),
            Some(id) => {
                let m = &self.metas[id.index()];
                if !m.complete {
                    Err(StoreError::NotReady)
                } else if !force && (now < m.lease_timeout || m.readers > 0) {
                    Err(StoreError::HasLease)
                } else {
                    self.free_slot(id);
                    self.stats.removed += 1;
                    Ok(())
                }
            }
        };
        self.settle(now);
        r
    }
}

/// One impl for every key type: `String` keys serve the `&str` as is, [`StoreKey`]s parse
/// it (no allocation for the compact forms); both run the same generic methods.
///
/// [`StoreKey`]: super::StoreKey
impl<K: StrKey> Store for MemStore<K> {
    fn put_start(
        &mut self,
        now: Nanos,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        K::with_lookup(key, |q| {
            let hints = AccessHints::default();
            self.put_ref(now, q, || K::owned(key), Body::Reserve(size), cfg, hints)
        })
        .map(|_| ())
    }
    fn put_end(&mut self, now: Nanos, key: &str, payload: Payload) -> StoreResult<()> {
        K::with_lookup(key, |k| self.put_end_with(now, k, payload))
    }
    fn put_revoke(&mut self, now: Nanos, key: &str) -> StoreResult<()> {
        K::with_lookup(key, |k| self.put_revoke_with(now, k))
    }
    fn put(
        &mut self,
        now: Nanos,
        key: &str,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        K::with_lookup(key, |q| {
            let hints = AccessHints::default();
            self.put_ref(now, q, || K::owned(key), Body::Whole(payload), cfg, hints)
        })
        .map(|_| ())
    }
    fn get_into(&mut self, now: Nanos, key: &str, buf: &mut [u8]) -> StoreResult<u64> {
        K::with_lookup(key, |k| self.get_into_with(now, k, buf, None))
    }
    fn get_size(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        K::with_lookup(key, |k| self.get_size_with(now, k, None))
    }
    fn exists(&mut self, now: Nanos, key: &str) -> StoreResult<bool> {
        K::with_lookup(key, |k| self.exists_with(now, k))
    }
    fn remove(&mut self, now: Nanos, key: &str, force: bool) -> StoreResult<()> {
        K::with_lookup(key, |k| self.remove_with(now, k, force))
    }
    fn exists_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<bool> {
        K::with_store_key(key, |k| self.exists_with(now, k))
    }
    fn get_into_key(&mut self, now: Nanos, key: &StoreKey, buf: &mut [u8]) -> StoreResult<u64> {
        K::with_store_key(key, |k| self.get_into_with(now, k, buf, None))
    }
    fn get_size_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<u64> {
        K::with_store_key(key, |k| self.get_size_with(now, k, None))
    }
    fn begin_read_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<u64> {
        K::with_store_key(key, |k| self.begin_read_with(now, k, None))
    }
    fn end_read_key(&mut self, now: Nanos, key: &StoreKey) -> StoreResult<()> {
        K::with_store_key(key, |k| self.end_read_with(now, k))
    }
    fn put_key(
        &mut self,
        now: Nanos,
        key: &StoreKey,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        K::with_store_key(key, |q| {
            let hints = AccessHints::default();
            self.put_ref(
                now,
                q,
                || K::of_store_key(key),
                Body::Whole(payload),
                cfg,
                hints,
            )
        })
        .map(|_| ())
    }
    fn remove_key(&mut self, now: Nanos, key: &StoreKey, force: bool) -> StoreResult<()> {
        K::with_store_key(key, |k| self.remove_with(now, k, force))
    }
    fn begin_read(&mut self, now: Nanos, key: &str) -> StoreResult<u64> {
        K::with_lookup(key, |k| self.begin_read_with(now, k, None))
    }
    fn end_read(&mut self, now: Nanos, key: &str) -> StoreResult<()> {
        K::with_lookup(key, |k| self.end_read_with(now, k))
    }
    #[inline]
    fn prefetch_key(&self, key: &StoreKey) {
        if let Some(h) = K::cheap_hash(key) {
            self.index.prefetch(h);
        }
    }
    #[inline]
    fn prefetch_put_key(&self, key: &StoreKey, ahead: usize) {
        self.prefetch_key(key);
        // The slot that put takes, if nothing frees or takes one before it.
        if let Some(&id) = self
            .free
            .len()
            .checked_sub(ahead + 1)
            .and_then(|i| self.free.get(i))
        {
            self.prefetch_slot(id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{DataType, ReplicateConfig, Store};

    fn put(s: &mut MemStore<String>, key: &str, len: usize) {
        let cfg = ReplicateConfig::of(DataType::EncoderOutput);
        s.put(0, key, Payload::Bytes(vec![7; len]), &cfg).unwrap();
    }

    /// Freed payload buffers are held up to the bounds, released one per put of bytes,
    /// and never change what the store holds or reports.
    #[test]
    fn retired_buffers_are_bounded_and_released_by_puts() {
        let mut s = MemStore::new(MemStoreConfig::with_capacity(1 << 40)).unwrap();
        let n = RETIRED_MAX + 10;
        for i in 0..n {
            put(&mut s, &format!("k{i}"), 700);
        }
        put(&mut s, "big", RETIRED_BYTES + 1);
        s.remove(1, "big", true).unwrap();
        assert!(s.retired.is_empty(), "a large buffer is freed at once");
        for i in 0..n {
            s.remove(1, &format!("k{i}"), true).unwrap();
        }
        assert_eq!(s.retired.len(), RETIRED_MAX);
        put(&mut s, "again", 700);
        assert_eq!(
            s.retired.len(),
            RETIRED_MAX - 1,
            "a put of bytes releases one"
        );
        assert!(s.exists(1, "again").unwrap());
        assert_eq!(
            s.stats().by_type[DataType::EncoderOutput.index()].resident,
            1
        );
    }
}

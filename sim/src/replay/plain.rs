//! The plain cache model (`moonagent replay --cache-model plain`): libCacheSim's semantics,
//! with the same [`EvictionPolicy`] objects the store runs.
//!
//! Per access, in trace order (libCacheSim's `cache_get_base`):
//! 1. a lookup: a hit if the object is resident (the policy's `on_access`); every access
//!    counts, KV blocks included (no prefix rule: a block after a missing one still hits);
//! 0. before the first access, the policy learns the capacity (`on_capacity`);
//! 2. on a miss, the policy's `on_lookup_miss` (S3-FIFO's ghost check), then, unless the
//!    object alone is larger than the cache, *evict before insert*: while `used + size >
//!    capacity`, one eviction step (an [`EvictRequest`] with target and lower bound 1),
//!    then the insert (`on_insert`).
//!
//! What differs from the default Mooncake-master model ([`replay_one`](super::replay_one)
//! on a `MemStore`): no leases (every resident object is a candidate at once), no pins, no
//! in-progress puts, no watermark or 10 ms eviction tick (eviction is synchronous and makes
//! exactly the room the insert needs), no batch eviction (`evict_ratio` target and lower
//! bound are 1 object, so the store's 5% batches do not apply), no failed puts (a put never
//! finds the cache full: it evicts first), every access is a lookup (a KV block is not
//! looked up with `exists` and then put; the prefix rule is not applied). With
//! [`CapacityUnit::Objects`] every object weighs 1 and the capacity is an object count
//! (libCacheSim with unit object sizes); with [`CapacityUnit::Bytes`] an object weighs
//! its bytes. Policies see the weight as `ObjectMeta::size`, so byte-share settings
//! (S3-FIFO's small queue) are shares of the object count in object mode.
//!
//! The policies agree with libCacheSim's hit counts exactly where their algorithms are the
//! same (see `tests/python/test_libcachesim_oracle.py` and INVARIANTS R7).

use moonagent_core::hint::prefetch;
use moonagent_core::store::{
    DataType, EvictRequest, EvictionPolicy, ObjId, ObjectMeta, StoreStats,
};
use serde::{Deserialize, Serialize};

use super::{count_lookup, hints, Compiled, LabelledPolicy, PolicyResult, ReplayError, TypeResult};

/// What the plain model's capacity counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityUnit {
    /// Bytes: an object weighs its size.
    Bytes,
    /// Objects: every object weighs 1 (libCacheSim with unit sizes).
    Objects,
}

/// A plain cache: capacity and its unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlainConfig {
    /// Capacity in `unit`s (> 0).
    pub capacity: u64,
    /// What the capacity counts.
    pub unit: CapacityUnit,
}

const NONE: u32 = u32::MAX;

/// How many accesses ahead the replay prefetches object slots.
const AHEAD: usize = 16;

struct PlainCache {
    policy: Box<dyn EvictionPolicy>,
    metas: Vec<ObjectMeta>,
    /// Object number held by each slot.
    obj_in_slot: Vec<u32>,
    /// Slot of each object number, or `NONE`.
    slot_of: Vec<u32>,
    free: Vec<u32>,
    used: u64,
    capacity: u64,
    live: u64,
    seq: u64,
    victims: Vec<ObjId>,
    stats: StoreStats,
}

impl PlainCache {
    fn evict_one(&mut self, now: u64) -> Result<(), ReplayError> {
        let req = EvictRequest {
            now,
            target: 1,
            lower_bound: 1,
            object_count: self.live,
            used_bytes: self.used,
            capacity_bytes: self.capacity,
            allow_soft_pinned: false,
        };
        self.victims.clear();
        self.policy
            .select_victims(&req, &self.metas, &mut self.victims);
        if self.victims.is_empty() {
            return Err(ReplayError::NoVictim {
                policy: self.policy.name().to_string(),
                resident: self.live,
            });
        }
        for k in 0..self.victims.len() {
            let s = self.victims[k].0;
            let m = &self.metas[s as usize];
            if !m.live {
                self.stats.policy_refused += 1;
                continue;
            }
            self.policy.on_remove(ObjId(s), m);
            let m = &mut self.metas[s as usize];
            m.live = false;
            let t = &mut self.stats.by_type[m.data_type.index()];
            t.evicted += 1;
            t.evicted_bytes += m.size;
            t.resident -= 1;
            t.resident_bytes -= m.size;
            self.used -= m.size;
            self.live -= 1;
            self.slot_of[self.obj_in_slot[s as usize] as usize] = NONE;
            self.free.push(s);
        }
        self.stats.eviction_runs += 1;
        Ok(())
    }
}

/// Replay `compiled` under one policy on a plain cache (see the module docs).
pub fn replay_plain(
    compiled: &Compiled,
    cfg: &PlainConfig,
    lp: &LabelledPolicy,
) -> Result<PolicyResult, ReplayError> {
    if cfg.capacity == 0 {
        return Err(ReplayError::PlainCapacity);
    }
    compiled.check_filled()?;
    let mut policy = lp.policy.build().map_err(|source| ReplayError::Policy {
        label: lp.label.clone(),
        source,
    })?;
    policy.on_capacity(cfg.capacity);
    let mut c = PlainCache {
        policy,
        metas: Vec::new(),
        obj_in_slot: Vec::new(),
        slot_of: vec![NONE; compiled.distinct as usize],
        free: Vec::new(),
        used: 0,
        capacity: cfg.capacity,
        live: 0,
        seq: 0,
        victims: Vec::new(),
        stats: StoreStats::default(),
    };
    let mut by = [TypeResult::default(); DataType::COUNT];
    let objects: &[u32] = &compiled.objects;
    for (i, a) in compiled.accesses.iter().enumerate() {
        // The object numbers are known ahead: fetch the slot of the access AHEAD on, and
        // the metadata of the one AHEAD / 2 on (its slot has arrived by then). Hints only:
        // what the replay reads and decides is unchanged.
        if let Some(&o) = objects.get(i + AHEAD) {
            prefetch(&c.slot_of[o as usize]);
        }
        if let Some(&o) = objects.get(i + AHEAD / 2) {
            if let Some(m) = c.metas.get(c.slot_of[o as usize] as usize) {
                prefetch(m);
            }
        }
        let obj = objects[i];
        let weight = match cfg.unit {
            CapacityUnit::Bytes => u64::from(a.size),
            CapacityUnit::Objects => 1,
        };
        c.seq += 1;
        let slot = c.slot_of[obj as usize];
        let hit = slot != NONE;
        count_lookup(&mut by[a.dtype as usize], a, hit);
        if hit {
            c.stats.read_hits += 1;
            let m = &mut c.metas[slot as usize];
            m.last_access = a.time;
            m.last_access_seq = c.seq;
            m.access_count += 1;
            m.hints = hints(a);
            c.policy.on_access(ObjId(slot), m);
            continue;
        }
        c.stats.read_misses += 1;
        let key_hash = u64::from(obj);
        c.policy.on_lookup_miss(key_hash);
        let t = a.dtype as usize;
        if weight > c.capacity {
            // Larger than the whole cache: never admitted (libCacheSim's `can_insert`).
            by[t].puts_no_space += 1;
            c.stats.by_type[t].put_no_space += 1;
            continue;
        }
        while c.used + weight > c.capacity {
            c.evict_one(a.time).map_err(|e| ReplayError::Access {
                index: i,
                time: a.time,
                source: Box::new(e),
            })?;
        }
        let meta = ObjectMeta {
            live: true,
            size: weight,
            data_type: DataType::ALL[t],
            hard_pinned: false,
            soft_pin_until: None,
            lease_timeout: 0,
            complete: true,
            readers: 0,
            put_time: a.time,
            insert_seq: c.seq,
            last_access: a.time,
            last_access_seq: c.seq,
            access_count: 0,
            hints: hints(a),
            key_hash,
        };
        let slot = match c.free.pop() {
            Some(s) => {
                c.metas[s as usize] = meta;
                c.obj_in_slot[s as usize] = obj;
                s
            }
            None => {
                c.metas.push(meta);
                c.obj_in_slot.push(obj);
                (c.metas.len() - 1) as u32
            }
        };
        c.slot_of[obj as usize] = slot;
        c.used += weight;
        c.live += 1;
        let st = &mut c.stats.by_type[t];
        st.puts += 1;
        st.put_bytes += weight;
        st.resident += 1;
        st.resident_bytes += weight;
        by[t].puts += 1;
        c.policy.on_insert(ObjId(slot), &c.metas[slot as usize]);
    }
    Ok(PolicyResult::assemble(lp, by, c.stats))
}

/// Replay every (plain cache, policy) pair in parallel (rayon): one row per cache, each
/// in the order of `policies`.
pub fn replay_plain_grid(
    compiled: &Compiled,
    cfgs: &[PlainConfig],
    policies: &[LabelledPolicy],
) -> Result<Vec<Vec<PolicyResult>>, ReplayError> {
    super::run::grid(cfgs, policies, |c, p| replay_plain(compiled, c, p), &|| {})
}

//! `s3-fifo`: S3-FIFO (Yang et al., "FIFO queues are all you need for cache eviction",
//! SOSP'23), with libCacheSim's defaults (small queue 10% of the bytes, ghost 90%,
//! move-to-main threshold 2: `S3FIFO.c`'s `DEFAULT_CACHE_PARAMS` in every libCacheSim
//! version).
//!
//! Three queues: a small FIFO `S` for new objects, a main FIFO `M` with 2-bit-clock
//! reinsertion, and a ghost FIFO `G` of key hashes recently evicted from `S`. A put whose
//! key is in `G` goes to `M`, else to `S`; a read adds 1 to the object's frequency (at most
//! 3). A run repeats eviction steps until it has `max(target, lower_bound)` victims or
//! nothing is left to try: a step evicts from `M` when `M` holds more than its share of
//! the capacity (or `S` has nothing left to try), else from `S`:
//! - `S` step: from the tail, an object read at least `move_threshold` times moves to `M`'s
//!   head (frequency cleared); else, if it is a candidate, it is evicted and its key hash
//!   goes to `G`;
//! - `M` step: from the tail, an object with frequency > 0 is reinserted at the head with
//!   frequency - 1; else, if it is a candidate, it is evicted.
//!
//! Adaptation to the store: objects that are not candidates now (leased, hard-pinned, in
//! progress, being read, or soft-pinned) are skipped in place: the walk moves past them
//! and they keep their position, so a leased hot object is not lost. Soft-pinned
//! candidates met on the way top up to `lower_bound` only if the unpinned ones run out
//! (Mooncake's pass structure). Queue moves are the policy's own state and are made while
//! planning; victims leave the queues while planning and reach `G` in `on_remove`, so a
//! user `remove` never feeds the ghost. The ghost holds key hashes (`ObjectMeta::key_hash`),
//! never `ObjId`s, so slot reuse cannot fake a ghost hit; each slot's frequency is reset by
//! `on_insert`. Hooks are O(1) (the ghost is a hash map plus a FIFO).
//!
//! The ghost holds at most `ghost_ratio` of the capacity in *live* entries: a ghost hit
//! takes the key out and frees its bytes at once, as libCacheSim's ghost FIFO does (its
//! `remove`); the entry's stale slot in the FIFO is skipped, never counted, when it pops.
//! (Until issue 15 the bytes stayed counted until the stale entry popped, so the live
//! ghost was smaller than configured.) A driver that sees lookups may call
//! [`EvictionPolicy::on_lookup_miss`] before evicting for the insertion, as libCacheSim's
//! `find` does: the ghost hit is then decided before the evictions that make room can push
//! the key out of the ghost. `MemStore` does not call it (the hit is decided at
//! `on_insert`); the plain replay (`moonagent replay --cache-model plain`) does.

use crate::store::ConfigError;
use std::collections::VecDeque;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::{soft_quota, unpinned_quota, Links, Queue, NIL};
use crate::invariant::{violation, InvariantViolation};
use crate::store::policy::{Candidate, EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// `s3-fifo` settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3FifoConfig {
    /// Share of the capacity (bytes) for the small queue, in (0, 1) (0.1).
    pub small_ratio: f64,
    /// Ghost size as a share of the capacity (bytes), in [0, 1] (0.9).
    pub ghost_ratio: f64,
    /// Reads (since insertion) that move an object from the small queue to main (2, as
    /// libCacheSim).
    pub move_threshold: u8,
}

impl Default for S3FifoConfig {
    fn default() -> Self {
        Self {
            small_ratio: 0.1,
            ghost_ratio: 0.9,
            move_threshold: 2,
        }
    }
}

const SMALL: u8 = 1;
const MAIN: u8 = 2;

/// Where a planned victim came from (the ghost takes only the small queue's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Planned {
    No,
    FromSmall,
    FromMain,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    freq: u8,
    planned: Planned,
    size: u64,
}

const FREE: Slot = Slot {
    freq: 0,
    planned: Planned::No,
    size: 0,
};

/// The `s3-fifo` policy (see the module docs).
#[derive(Debug, Clone)]
pub struct S3Fifo {
    cfg: S3FifoConfig,
    links: Links,
    small: Queue,
    main: Queue,
    slots: Vec<Slot>,
    ghost: VecDeque<(u64, u64)>,
    /// Live ghost entries: key hash -> (sequence of its FIFO entry, bytes).
    ghost_map: FxHashMap<u64, (u64, u64)>,
    /// Bytes of the live ghost entries only.
    ghost_bytes: u64,
    /// A key found in the ghost by `on_lookup_miss`, not inserted yet.
    ghost_hit: Option<u64>,
    /// Whether an eviction run has happened (libCacheSim's warm-up rule ends with it).
    has_evicted: bool,
    /// The capacity announced by `on_capacity` (0: not announced).
    announced: u64,
    ghost_seq: u64,
    capacity: u64,
    planned: Vec<ObjId>,
    soft: Vec<ObjId>,
}

impl S3Fifo {
    /// Build from a config, or say which field is invalid.
    pub fn new(cfg: &S3FifoConfig) -> Result<Self, ConfigError> {
        if !(cfg.small_ratio > 0.0 && cfg.small_ratio < 1.0) {
            return Err(ConfigError::field(
                "s3-fifo: small_ratio",
                format!("expected in (0, 1), got {}", cfg.small_ratio),
            ));
        }
        if !(0.0..=1.0).contains(&cfg.ghost_ratio) {
            return Err(ConfigError::field(
                "s3-fifo: ghost_ratio",
                format!("expected in [0, 1], got {}", cfg.ghost_ratio),
            ));
        }
        Ok(Self {
            cfg: *cfg,
            links: Links::default(),
            small: Queue::new(SMALL),
            main: Queue::new(MAIN),
            slots: Vec::new(),
            ghost: VecDeque::new(),
            ghost_map: FxHashMap::default(),
            ghost_bytes: 0,
            ghost_hit: None,
            has_evicted: false,
            announced: 0,
            ghost_seq: 0,
            capacity: 0,
            planned: Vec::new(),
            soft: Vec::new(),
        })
    }

    /// The small and main queues, newest first (a `Dump` for tests).
    pub fn dump(&self) -> (Vec<ObjId>, Vec<ObjId>) {
        let s = self
            .small
            .iter_newest_first(&self.links)
            .map(ObjId)
            .collect();
        let m = self
            .main
            .iter_newest_first(&self.links)
            .map(ObjId)
            .collect();
        (s, m)
    }

    /// Frequency counter of slot `id` (0 for an unknown slot).
    pub fn freq(&self, id: ObjId) -> u8 {
        self.slots.get(id.index()).map_or(0, |s| s.freq)
    }

    /// Whether `key_hash` is in the ghost queue.
    pub fn in_ghost(&self, key_hash: u64) -> bool {
        self.ghost_map.contains_key(&key_hash)
    }

    /// Bytes of the live ghost entries (at most `ghost_ratio` of the capacity).
    pub fn ghost_bytes(&self) -> u64 {
        self.ghost_bytes
    }

    /// Check that the queues hold exactly the live objects with their sizes, and that the
    /// small queue is in insertion order. For tests.
    pub fn check(&self, objects: &[ObjectMeta]) -> Result<(), InvariantViolation> {
        let live = objects.iter().filter(|m| m.live).count();
        if self.small.len + self.main.len != live {
            return Err(violation!(
                "P1",
                "queues hold {} + {}, store {live} live",
                self.small.len,
                self.main.len
            ));
        }
        for (q, name) in [(&self.small, "small"), (&self.main, "main")] {
            let mut bytes = 0;
            let mut n = 0;
            let mut prev_seq = u64::MAX;
            for i in q.iter_newest_first(&self.links) {
                n += 1;
                if n > q.len {
                    return Err(violation!("P1", "{name}: longer than its length"));
                }
                let Some(m) = objects.get(i as usize).filter(|m| m.live) else {
                    return Err(violation!("P1", "{name}: slot {i} queued but not live"));
                };
                if self.slots[i as usize].size != m.size {
                    return Err(violation!("P1", "{name}: slot {i} size mismatch"));
                }
                if self.slots[i as usize].planned != Planned::No {
                    return Err(violation!("P1", "{name}: slot {i} still planned"));
                }
                if q.tag == SMALL {
                    if m.insert_seq >= prev_seq {
                        return Err(violation!("P1", "small: slot {i} out of insertion order"));
                    }
                    prev_seq = m.insert_seq;
                }
                bytes += m.size;
            }
            if n != q.len || bytes != q.bytes {
                return Err(violation!("P1", "{name}: length or bytes mismatch"));
            }
        }
        if self.ghost_map.len() > self.ghost.len() {
            return Err(InvariantViolation::new(
                "P1",
                "ghost map larger than the ghost queue",
            ));
        }
        let live: u64 = self.ghost_map.values().map(|&(_, b)| b).sum();
        if live != self.ghost_bytes {
            return Err(violation!(
                "P1",
                "ghost bytes {} but live entries hold {live}",
                self.ghost_bytes
            ));
        }
        Ok(())
    }

    fn ghost_insert(&mut self, hash: u64, size: u64) {
        self.ghost_seq += 1;
        self.ghost.push_back((hash, self.ghost_seq));
        if let Some((_, old)) = self.ghost_map.insert(hash, (self.ghost_seq, size)) {
            self.ghost_bytes -= old;
        }
        self.ghost_bytes += size;
        let cap = (self.cfg.ghost_ratio * self.capacity as f64) as u64;
        while self.ghost_bytes > cap {
            let Some((h, seq)) = self.ghost.pop_front() else {
                break;
            };
            // A stale entry (its key was hit or re-ghosted since) holds no bytes.
            if let Some(&(s, b)) = self.ghost_map.get(&h) {
                if s == seq {
                    self.ghost_map.remove(&h);
                    self.ghost_bytes -= b;
                }
            }
        }
    }

    /// Take `hash` out of the ghost, freeing its bytes; whether it was there.
    fn ghost_take(&mut self, hash: u64) -> bool {
        match self.ghost_map.remove(&hash) {
            Some((_, b)) => {
                self.ghost_bytes -= b;
                true
            }
            None => false,
        }
    }

    fn unlink(&mut self, i: u32) {
        let size = self.slots[i as usize].size;
        match self.links.queue_of(i) {
            SMALL => self.small.unlink(&mut self.links, ObjId(i), size),
            MAIN => self.main.unlink(&mut self.links, ObjId(i), size),
            _ => {}
        }
    }

    /// Plan `i` as a victim: out of its queue now, into the ghost (if from `S`) on removal.
    fn plan(&mut self, i: u32, out: &mut Vec<ObjId>) {
        let from = match self.links.queue_of(i) {
            SMALL => Planned::FromSmall,
            _ => Planned::FromMain,
        };
        self.unlink(i);
        self.slots[i as usize].planned = from;
        self.planned.push(ObjId(i));
        out.push(ObjId(i));
    }

    fn move_to_main_head(&mut self, i: u32, m_cur: &mut u32) {
        self.unlink(i);
        let size = self.slots[i as usize].size;
        self.main.push_head(&mut self.links, ObjId(i), size);
        if *m_cur == NIL {
            // The main walk had passed the head: let it reach the newcomer.
            *m_cur = i;
        }
    }

    /// Note a soft-pinned candidate met by the walk (pass 2 material, in walk order).
    fn note(&mut self, i: u32, c: Candidate, soft_cap: usize) {
        if c == Candidate::SoftPinned && self.soft.len() < soft_cap {
            self.soft.push(ObjId(i));
        }
    }

    /// One `S` step; true if it planned a victim.
    fn small_step(
        &mut self,
        s_cur: &mut u32,
        m_cur: &mut u32,
        req: &EvictRequest,
        objects: &[ObjectMeta],
        soft_cap: usize,
        out: &mut Vec<ObjId>,
    ) -> bool {
        while *s_cur != NIL {
            let i = *s_cur;
            *s_cur = self.links.newer(i);
            if self.slots[i as usize].freq >= self.cfg.move_threshold {
                self.slots[i as usize].freq = 0;
                self.move_to_main_head(i, m_cur);
                continue;
            }
            match objects
                .get(i as usize)
                .map_or(Candidate::No, |m| m.candidate(req.now))
            {
                Candidate::Unpinned => {
                    self.plan(i, out);
                    return true;
                }
                c => self.note(i, c, soft_cap),
            }
        }
        false
    }

    /// One `M` step; true if it planned a victim.
    fn main_step(
        &mut self,
        m_cur: &mut u32,
        req: &EvictRequest,
        objects: &[ObjectMeta],
        soft_cap: usize,
        out: &mut Vec<ObjId>,
    ) -> bool {
        while *m_cur != NIL {
            let i = *m_cur;
            *m_cur = self.links.newer(i);
            let f = self.slots[i as usize].freq;
            if f > 0 {
                self.slots[i as usize].freq = f - 1;
                self.move_to_main_head(i, m_cur);
                continue;
            }
            match objects
                .get(i as usize)
                .map_or(Candidate::No, |m| m.candidate(req.now))
            {
                Candidate::Unpinned => {
                    self.plan(i, out);
                    return true;
                }
                c => self.note(i, c, soft_cap),
            }
        }
        false
    }
}

impl EvictionPolicy for S3Fifo {
    fn name(&self) -> &str {
        "s3-fifo"
    }

    fn on_insert(&mut self, id: ObjId, meta: &ObjectMeta) {
        if id.index() >= self.slots.len() {
            self.slots.resize(id.index() + 1, FREE);
        }
        self.links.ensure(id);
        // Defensive: a slot reused without `on_remove` (never by `MemStore`).
        self.unlink(id.0);
        self.slots[id.index()] = Slot {
            freq: 0,
            planned: Planned::No,
            size: meta.size,
        };
        let noted = self.ghost_hit.take() == Some(meta.key_hash);
        let small_full = !self.has_evicted
            && self.announced > 0
            && self.small.bytes >= (self.cfg.small_ratio * self.announced as f64) as u64;
        if noted || self.ghost_take(meta.key_hash) || small_full {
            self.main.push_head(&mut self.links, id, meta.size);
        } else {
            self.small.push_head(&mut self.links, id, meta.size);
        }
    }

    fn on_capacity(&mut self, capacity_bytes: u64) {
        self.announced = capacity_bytes;
        self.capacity = capacity_bytes;
    }

    fn on_lookup_miss(&mut self, key_hash: u64) {
        self.ghost_hit = self.ghost_take(key_hash).then_some(key_hash);
    }

    fn on_access(&mut self, id: ObjId, _meta: &ObjectMeta) {
        if let Some(s) = self.slots.get_mut(id.index()) {
            s.freq = (s.freq + 1).min(3);
        }
    }

    fn on_remove(&mut self, id: ObjId, meta: &ObjectMeta) {
        let Some(&s) = self.slots.get(id.index()) else {
            return;
        };
        self.unlink(id.0);
        if s.planned == Planned::FromSmall {
            self.ghost_insert(meta.key_hash, meta.size);
        }
        self.slots[id.index()] = FREE;
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.capacity = req.capacity_bytes;
        self.has_evicted = true;
        // Victims the store did not remove (it never refuses a candidate, but stay safe):
        // back into main.
        let mut leftover = std::mem::take(&mut self.planned);
        for id in leftover.drain(..) {
            let live = objects.get(id.index()).is_some_and(|m| m.live);
            if self.slots[id.index()].planned != Planned::No {
                self.slots[id.index()].planned = Planned::No;
                if live {
                    let mut dummy = 0;
                    self.move_to_main_head(id.0, &mut dummy);
                }
            }
        }
        self.planned = leftover;
        self.soft.clear();

        let quota = unpinned_quota(req);
        let soft_cap = if req.allow_soft_pinned {
            req.lower_bound as usize
        } else {
            0
        };
        let small_cap = (self.cfg.small_ratio * req.capacity_bytes as f64) as u64;
        let main_cap = req.capacity_bytes.saturating_sub(small_cap);
        let mut s_cur = self.small.tail;
        let mut m_cur = self.main.tail;
        let mut taken = 0;
        while taken < quota {
            let use_main = m_cur != NIL && (self.main.bytes > main_cap || s_cur == NIL);
            let got = if use_main {
                self.main_step(&mut m_cur, req, objects, soft_cap, out)
            } else if s_cur != NIL {
                self.small_step(&mut s_cur, &mut m_cur, req, objects, soft_cap, out)
            } else {
                break;
            };
            taken += usize::from(got);
        }
        let want = soft_quota(req, taken);
        let soft = std::mem::take(&mut self.soft);
        for &id in soft.iter().take(want) {
            self.plan(id.0, out);
        }
        self.soft = soft;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::policies::tests::live;

    #[test]
    fn check_rejects_queue_bytes_that_disagree_with_the_sizes() {
        let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
        let m = live(10, 1);
        p.on_insert(ObjId(0), &m);
        let objects = [m];
        p.check(&objects).unwrap();
        // Same length, same slots, but the byte count is off.
        p.small.bytes += 1;
        assert!(p.check(&objects).is_err());
    }
}

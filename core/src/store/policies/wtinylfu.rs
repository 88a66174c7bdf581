//! `w-tinylfu`: W-TinyLFU (Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache
//! Admission Policy", ToS 2017), as Caffeine builds it and with libCacheSim's `WTinyLFU.c`
//! order of events.
//!
//! A window LRU (1% of the capacity) takes every new object; the main cache (the rest) is a
//! segmented LRU: probation, and protected (80% of main) that a hit in probation promotes
//! to, its overflow demoted to probation's head. A frequency sketch (count-min, 4 rows of
//! 4-bit counters, no doorkeeper) counts the insert of each object, each hit in main and
//! each window victim considered (libCacheSim's increments), and halves every counter
//! after `10 x` its width of increments (Caffeine's aging). One eviction step: if the
//! window's oldest candidate fits in main beside what main holds, it moves to probation and
//! the step goes on; else it is compared with main's victim (probation's oldest, else
//! protected's): the one with the higher estimate stays (the window's only if strictly
//! higher, moving to probation), the other is evicted. With an empty window, main's victim
//! goes.
//!
//! Not libCacheSim's counts: its sketch is a counting Bloom filter with its own hashing
//! (`minimalIncrementCBF`), so estimates, and hence some admissions, differ; the oracle
//! test reports both side by side rather than requiring equality.
//!
//! Adaptation to the store: objects that are not unpinned candidates now are passed over
//! in every queue (they keep their place); soft-pinned candidates top up to `lower_bound`
//! only when no unpinned one is left (Mooncake's pass structure). The sketch is sized from
//! an announced capacity ([`EvictionPolicy::on_capacity`], the plain replay: at most 2^22
//! objects), else at the first eviction run from the store's object count; it is rebuilt
//! (cleared) when the store holds more than twice the objects it was sized for.

use crate::store::ConfigError;
use serde::{Deserialize, Serialize};

use super::{soft_quota, unpinned_quota, Links, Queue, NIL};
use crate::invariant::{violation, InvariantViolation};
use crate::store::policy::{Candidate, EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// `w-tinylfu` settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WTinyLfuConfig {
    /// Share of the capacity for the window LRU, in [0, 1) (0.01).
    pub window_ratio: f64,
    /// Share of the main cache for its protected segment, in [0, 1] (0.8).
    pub protected_ratio: f64,
}

impl Default for WTinyLfuConfig {
    fn default() -> Self {
        Self {
            window_ratio: 0.01,
            protected_ratio: 0.8,
        }
    }
}

const WINDOW: u8 = 1;
const PROBATION: u8 = 2;
const PROTECTED: u8 = 3;

/// Count-min sketch of 4-bit counters, 16 to a word, 4 rows; halves at `sample` increments.
#[derive(Debug, Clone, Default)]
struct Sketch {
    table: Vec<u64>,
    additions: u64,
    sample: u64,
}

const SEEDS: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x27D4_EB2F_1656_67C5,
];

impl Sketch {
    fn with_width(objects: u64) -> Self {
        let words = objects.max(16).next_power_of_two() / 4;
        Self {
            table: vec![0; words as usize],
            additions: 0,
            sample: 10 * objects.max(16),
        }
    }

    /// (word, shift) of row `r`'s counter for `h`.
    #[inline]
    fn slot(&self, h: u64, r: usize) -> (usize, u32) {
        let mut x = (h ^ SEEDS[r]).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 31;
        let counters = self.table.len() as u64 * 16;
        let i = x % counters;
        ((i / 16) as usize, ((i % 16) * 4) as u32)
    }

    fn estimate(&self, h: u64) -> u64 {
        if self.table.is_empty() {
            return 0;
        }
        (0..4)
            .map(|r| {
                let (w, s) = self.slot(h, r);
                (self.table[w] >> s) & 0xF
            })
            .min()
            .unwrap_or(0)
    }

    fn increment(&mut self, h: u64) {
        if self.table.is_empty() {
            return;
        }
        for r in 0..4 {
            let (w, s) = self.slot(h, r);
            if (self.table[w] >> s) & 0xF < 15 {
                self.table[w] += 1 << s;
            }
        }
        self.additions += 1;
        if self.additions >= self.sample {
            for w in &mut self.table {
                *w = (*w >> 1) & 0x7777_7777_7777_7777;
            }
            self.additions /= 2;
        }
    }
}

/// The `w-tinylfu` policy (see the module docs).
#[derive(Debug, Clone)]
pub struct WTinyLfu {
    cfg: WTinyLfuConfig,
    links: Links,
    window: Queue,
    probation: Queue,
    protected: Queue,
    sizes: Vec<u64>,
    hashes: Vec<u64>,
    sketch: Sketch,
    sketch_objects: u64,
    live: u64,
    capacity: u64,
    soft: Vec<ObjId>,
}

impl WTinyLfu {
    /// Build from a config, or say which field is invalid.
    pub fn new(cfg: &WTinyLfuConfig) -> Result<Self, ConfigError> {
        if !(0.0..1.0).contains(&cfg.window_ratio) {
            return Err(ConfigError::field(
                "w-tinylfu: window_ratio",
                format!("expected in [0, 1), got {}", cfg.window_ratio),
            ));
        }
        if !(0.0..=1.0).contains(&cfg.protected_ratio) {
            return Err(ConfigError::field(
                "w-tinylfu: protected_ratio",
                format!("expected in [0, 1], got {}", cfg.protected_ratio),
            ));
        }
        Ok(Self {
            cfg: *cfg,
            links: Links::default(),
            window: Queue::new(WINDOW),
            probation: Queue::new(PROBATION),
            protected: Queue::new(PROTECTED),
            sizes: Vec::new(),
            hashes: Vec::new(),
            sketch: Sketch::default(),
            sketch_objects: 0,
            live: 0,
            capacity: 0,
            soft: Vec::new(),
        })
    }

    /// The window, probation and protected queues, newest first (a `Dump` for tests).
    pub fn dump(&self) -> [Vec<ObjId>; 3] {
        [&self.window, &self.probation, &self.protected].map(|q| {
            q.iter_newest_first(&self.links)
                .map(ObjId)
                .collect::<Vec<_>>()
        })
    }

    /// The sketch's frequency estimate of a key hash.
    pub fn estimate(&self, key_hash: u64) -> u64 {
        self.sketch.estimate(key_hash)
    }

    /// Check that the queues hold exactly the live objects. For tests.
    pub fn check(&self, objects: &[ObjectMeta]) -> Result<(), InvariantViolation> {
        let live = objects.iter().filter(|m| m.live).count();
        let held = self.window.len + self.probation.len + self.protected.len;
        if held != live {
            return Err(violation!("P1", "queues hold {held}, store {live} live"));
        }
        for q in [&self.window, &self.probation, &self.protected] {
            let mut bytes = 0;
            for i in q.iter_newest_first(&self.links) {
                let Some(m) = objects.get(i as usize).filter(|m| m.live) else {
                    return Err(violation!("P1", "slot {i} queued but not live"));
                };
                bytes += m.size;
            }
            if bytes != q.bytes {
                return Err(violation!("P1", "queue {}: bytes mismatch", q.tag));
            }
        }
        Ok(())
    }

    fn window_cap(&self) -> u64 {
        (self.capacity as f64 * self.cfg.window_ratio) as u64
    }

    fn main_cap(&self) -> u64 {
        self.capacity - self.window_cap()
    }

    fn queue(&mut self, tag: u8) -> &mut Queue {
        match tag {
            WINDOW => &mut self.window,
            PROBATION => &mut self.probation,
            _ => &mut self.protected,
        }
    }

    fn unlink(&mut self, i: u32) {
        let tag = self.links.queue_of(i);
        if tag != 0 {
            let size = self.sizes[i as usize];
            let mut q = *self.queue(tag);
            q.unlink(&mut self.links, ObjId(i), size);
            *self.queue(tag) = q;
        }
    }

    fn push(&mut self, tag: u8, i: u32) {
        let size = self.sizes[i as usize];
        let mut q = *self.queue(tag);
        q.push_head(&mut self.links, ObjId(i), size);
        *self.queue(tag) = q;
    }

    /// Promote from probation; the protected overflow goes back to probation's head.
    fn promote(&mut self, i: u32) {
        self.unlink(i);
        self.push(PROTECTED, i);
        let cap = (self.main_cap() as f64 * self.cfg.protected_ratio) as u64;
        while self.protected.bytes > cap && self.protected.tail != i {
            let t = self.protected.tail;
            self.unlink(t);
            self.push(PROBATION, t);
        }
    }

    /// The oldest unpinned candidate of `q`, noting soft-pinned ones met on the way.
    fn first_candidate(&mut self, tag: u8, req: &EvictRequest, objects: &[ObjectMeta]) -> u32 {
        let mut cur = match tag {
            WINDOW => self.window.tail,
            PROBATION => self.probation.tail,
            _ => self.protected.tail,
        };
        while cur != NIL {
            match objects
                .get(cur as usize)
                .map_or(Candidate::No, |m| m.candidate(req.now))
            {
                Candidate::Unpinned => return cur,
                Candidate::SoftPinned
                    if req.allow_soft_pinned && !self.soft.contains(&ObjId(cur)) =>
                {
                    self.soft.push(ObjId(cur))
                }
                _ => {}
            }
            cur = self.links.newer(cur);
        }
        NIL
    }

    fn main_victim(&mut self, req: &EvictRequest, objects: &[ObjectMeta]) -> u32 {
        match self.first_candidate(PROBATION, req, objects) {
            NIL => self.first_candidate(PROTECTED, req, objects),
            v => v,
        }
    }

    /// One eviction step (libCacheSim's `WTinyLFU_evict`): a victim, or `None` when no
    /// unpinned candidate is left.
    fn step(&mut self, req: &EvictRequest, objects: &[ObjectMeta]) -> Option<u32> {
        loop {
            let w = self.first_candidate(WINDOW, req, objects);
            if w == NIL {
                return match self.main_victim(req, objects) {
                    NIL => None,
                    m => Some(m),
                };
            }
            let hw = self.hashes[w as usize];
            let size = self.sizes[w as usize];
            if self.probation.bytes + self.protected.bytes + size <= self.main_cap() {
                // Main has room: the window's oldest moves in, no victim yet.
                self.unlink(w);
                self.push(PROBATION, w);
                self.sketch.increment(hw);
                continue;
            }
            let m = self.main_victim(req, objects);
            let victim = if m != NIL
                && self.sketch.estimate(hw) > self.sketch.estimate(self.hashes[m as usize])
            {
                self.unlink(w);
                self.push(PROBATION, w);
                m
            } else {
                w
            };
            self.sketch.increment(hw);
            return Some(victim);
        }
    }
}

impl EvictionPolicy for WTinyLfu {
    fn name(&self) -> &str {
        "w-tinylfu"
    }

    fn on_capacity(&mut self, capacity_bytes: u64) {
        self.capacity = capacity_bytes;
        // Caffeine sizes its sketch from the maximum size; a byte capacity is bounded.
        self.sketch_objects = capacity_bytes.min(1 << 22);
        self.sketch = Sketch::with_width(self.sketch_objects);
    }

    fn on_insert(&mut self, id: ObjId, meta: &ObjectMeta) {
        let i = id.index();
        if i >= self.sizes.len() {
            self.sizes.resize(i + 1, 0);
            self.hashes.resize(i + 1, 0);
        }
        self.links.ensure(id);
        // Defensive: a slot reused without `on_remove` (never by `MemStore`).
        if self.links.queue_of(id.0) != 0 {
            self.unlink(id.0);
            self.live -= 1;
        }
        self.sizes[i] = meta.size;
        self.hashes[i] = meta.key_hash;
        self.push(WINDOW, id.0);
        self.live += 1;
        self.sketch.increment(meta.key_hash);
    }

    fn on_access(&mut self, id: ObjId, _meta: &ObjectMeta) {
        match self.links.queue_of(id.0) {
            WINDOW => {
                self.unlink(id.0);
                self.push(WINDOW, id.0);
            }
            PROBATION => {
                self.sketch.increment(self.hashes[id.index()]);
                self.promote(id.0);
            }
            PROTECTED => {
                self.sketch.increment(self.hashes[id.index()]);
                self.unlink(id.0);
                self.push(PROTECTED, id.0);
            }
            _ => {}
        }
    }

    fn on_remove(&mut self, id: ObjId, _meta: &ObjectMeta) {
        if self.links.queue_of(id.0) != 0 {
            self.unlink(id.0);
            self.live -= 1;
        }
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        if self.capacity == 0 {
            self.capacity = req.capacity_bytes;
        }
        if self.sketch.table.is_empty() || self.live > 2 * self.sketch_objects {
            self.sketch_objects = self.live.max(req.object_count);
            self.sketch = Sketch::with_width(self.sketch_objects);
        }
        self.soft.clear();
        let quota = unpinned_quota(req);
        let mut taken = 0;
        while taken < quota {
            let Some(v) = self.step(req, objects) else {
                break;
            };
            // Out of its queue now; `on_remove` then finds it unlinked.
            self.unlink(v);
            self.live -= 1;
            out.push(ObjId(v));
            taken += 1;
        }
        let want = soft_quota(req, taken);
        for k in 0..want.min(self.soft.len()) {
            let id = self.soft[k];
            self.unlink(id.0);
            self.live -= 1;
            out.push(id);
        }
    }
}

//! `VictimIndex`: the store's lease-ordered index of eviction candidates, so that the
//! lease-ordered policies (`mooncake-default`, `type-aware`) pick a round's `k` victims in
//! O((k + r) log n) instead of scanning all `n` objects (issue 15, item 4).
//!
//! What it holds: every live, complete, not hard-pinned object, in one ordered set per
//! *class* = (data type, soft pin active), ordered by the master's lease key
//! `(lease_timeout, insert_seq)`. Each object's soft pin is judged against a watermark time
//! (`pin_now`), moved to a round's `now` by [`VictimIndex::sync_pins`] before every
//! selection (in either direction, so a lagging `now` is exact too). The candidates of a
//! class at `now` are then a prefix of its set: the entries with `lease_timeout <= now`,
//! less the objects being read (`readers > 0`), which the walk skips (`r` above: objects
//! whose lease expired while a read is still open). It also keeps every type's resident
//! bytes (all live objects, in-progress, leased and pinned ones included), which
//! `type-aware`'s budgets read.
//!
//! Why per class and not one set: within one (type, pin) class `type-aware`'s adjusted age
//! is a non-increasing function of `lease_timeout` (a saturating subtraction, a monotone
//! `u64 -> f64` conversion and a multiplication and division by positive constants, all
//! monotone under IEEE rounding), and its ties fall back to the lease key, so each class
//! is already in `type-aware`'s order; a round merges at most three class streams.
//!
//! Upkeep is the store's ([`MemStore`](super::MemStore)): `on_live` at put start, `update`
//! whenever a lease, completion or pin changes, `on_free` before a slot is freed. The
//! scanning `select_victims` of each policy stays the reference; a store in a debug build
//! runs both and asserts the same victims, and `core/tests/store_victim_index.rs` compares
//! whole stores on random workloads (INVARIANTS S11).

use std::collections::btree_set;
use std::collections::BTreeSet;

use super::policy::{Candidate, ObjectMeta};
use super::{DataType, Nanos, ObjId};
use crate::invariant::{violation, InvariantViolation};

/// Classes: `type * 2 + soft`.
const CLASSES: usize = DataType::COUNT * 2;
/// A slot not in any set.
const NOT_INDEXED: u8 = u8::MAX;

/// Where one slot is indexed.
#[derive(Debug, Clone, Copy)]
struct Entry {
    class: u8,
    lease: Nanos,
    seq: u64,
    pin: Option<Nanos>,
}

const EMPTY: Entry = Entry {
    class: NOT_INDEXED,
    lease: 0,
    seq: 0,
    pin: None,
};

/// The store's index of eviction candidates (see the module docs).
#[derive(Debug, Clone)]
pub struct VictimIndex {
    sets: [BTreeSet<(Nanos, u64, u32)>; CLASSES],
    slots: Vec<Entry>,
    /// Indexed objects with a soft pin, by pin expiry.
    pins: BTreeSet<(Nanos, u32)>,
    pin_now: Nanos,
    resident_bytes: [u64; DataType::COUNT],
    scratch: Vec<u32>,
}

impl Default for VictimIndex {
    fn default() -> Self {
        Self {
            sets: Default::default(),
            slots: Vec::new(),
            pins: BTreeSet::new(),
            pin_now: 0,
            resident_bytes: [0; DataType::COUNT],
            scratch: Vec::new(),
        }
    }
}

/// Whether `m` belongs in the index at all (its candidacy then depends only on time,
/// readers and its pin).
#[inline]
fn indexable(m: &ObjectMeta) -> bool {
    m.live && m.complete && !m.hard_pinned
}

impl VictimIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Resident bytes per `DataType::index` (every live object).
    pub fn resident_bytes(&self) -> &[u64; DataType::COUNT] {
        &self.resident_bytes
    }

    /// The time soft pins are judged at (the last [`VictimIndex::sync_pins`]).
    pub fn pin_now(&self) -> Nanos {
        self.pin_now
    }

    #[inline]
    fn class_of(&self, ty: usize, pin: Option<Nanos>) -> u8 {
        let soft = pin.is_some_and(|t| self.pin_now < t);
        (ty * 2 + usize::from(soft)) as u8
    }

    /// A slot became live (put start).
    pub fn on_live(&mut self, id: ObjId, m: &ObjectMeta) {
        self.resident_bytes[m.data_type.index()] += m.size;
        if id.index() >= self.slots.len() {
            self.slots.resize(id.index() + 1, EMPTY);
        }
        debug_assert_eq!(
            self.slots[id.index()].class,
            NOT_INDEXED,
            "slot {id:?} reused"
        );
        self.update(id, m);
    }

    /// `m` (live) changed: completion, lease or pin. Re-files it; O(log n), O(1) when its
    /// key did not change.
    pub fn update(&mut self, id: ObjId, m: &ObjectMeta) {
        let i = id.index();
        let old = self.slots[i];
        if !indexable(m) {
            self.unfile(id);
            return;
        }
        let class = self.class_of(m.data_type.index(), m.soft_pin_until);
        if old.class == class
            && old.lease == m.lease_timeout
            && old.seq == m.insert_seq
            && old.pin == m.soft_pin_until
        {
            return;
        }
        self.unfile(id);
        self.sets[class as usize].insert((m.lease_timeout, m.insert_seq, id.0));
        if let Some(t) = m.soft_pin_until {
            self.pins.insert((t, id.0));
        }
        self.slots[i] = Entry {
            class,
            lease: m.lease_timeout,
            seq: m.insert_seq,
            pin: m.soft_pin_until,
        };
    }

    fn unfile(&mut self, id: ObjId) {
        let e = std::mem::replace(&mut self.slots[id.index()], EMPTY);
        if e.class == NOT_INDEXED {
            return;
        }
        let found = self.sets[e.class as usize].remove(&(e.lease, e.seq, id.0));
        debug_assert!(found, "slot {id:?} missing from class {}", e.class);
        if let Some(t) = e.pin {
            self.pins.remove(&(t, id.0));
        }
    }

    /// The slot is about to be freed (`m` is its meta before the free).
    pub fn on_free(&mut self, id: ObjId, m: &ObjectMeta) {
        self.resident_bytes[m.data_type.index()] -= m.size;
        self.unfile(id);
    }

    /// Judge soft pins at `now`: objects whose pin expired in `(pin_now, now]` move to the
    /// unpinned class, those whose pin holds again (a `now` before `pin_now`) move back.
    /// Amortised O(log n) per pin expiry when time only advances.
    pub fn sync_pins(&mut self, now: Nanos) {
        if now == self.pin_now {
            return;
        }
        let (lo, hi) = if now > self.pin_now {
            (self.pin_now, now)
        } else {
            (now, self.pin_now)
        };
        // Pins `t` with `lo < t <= hi` change side.
        let mut moved = std::mem::take(&mut self.scratch);
        moved.clear();
        moved.extend(
            self.pins
                .range((lo.saturating_add(1), 0)..=(hi, u32::MAX))
                .filter(|&&(t, _)| t > lo)
                .map(|&(_, id)| id),
        );
        self.pin_now = now;
        for &id in &moved {
            let e = self.slots[id as usize];
            let class = self.class_of(e.class as usize / 2, e.pin);
            if class != e.class {
                self.sets[e.class as usize].remove(&(e.lease, e.seq, id));
                self.sets[class as usize].insert((e.lease, e.seq, id));
                self.slots[id as usize].class = class;
            }
        }
        self.scratch = moved;
    }

    /// The candidates at `now` of type `ty` that are soft-pinned (`soft`) or not, in lease
    /// order: a class's entries with `lease_timeout <= now`, skipping objects being read.
    /// Exact only after [`VictimIndex::sync_pins`]`(now)`.
    pub fn candidates<'a>(
        &'a self,
        ty: usize,
        soft: bool,
        now: Nanos,
        objects: &'a [ObjectMeta],
    ) -> Candidates<'a> {
        debug_assert_eq!(self.pin_now, now, "sync_pins({now}) not called");
        Candidates {
            it: self.sets[ty * 2 + usize::from(soft)].iter(),
            now,
            objects,
            done: false,
        }
    }

    /// Check the index against `objects` (the store's metas): every indexable object is
    /// filed once under its current key and class, nothing else is, and the resident
    /// bytes add up. For the property tests; O(n log n).
    pub fn check(&self, objects: &[ObjectMeta]) -> Result<(), InvariantViolation> {
        let mut resident = [0u64; DataType::COUNT];
        let mut filed = 0usize;
        for (i, m) in objects.iter().enumerate() {
            let e = self.slots.get(i).copied().unwrap_or(EMPTY);
            if m.live {
                resident[m.data_type.index()] += m.size;
            }
            if !indexable(m) {
                if e.class != NOT_INDEXED {
                    return Err(violation!("S11", "slot {i} indexed but not indexable"));
                }
                continue;
            }
            filed += 1;
            let class = self.class_of(m.data_type.index(), m.soft_pin_until);
            if e.class != class || e.lease != m.lease_timeout || e.seq != m.insert_seq {
                return Err(violation!(
                    "S11",
                    "slot {i} filed as class {} lease {} seq {}, meta says class {class} \
                     lease {} seq {}",
                    e.class,
                    e.lease,
                    e.seq,
                    m.lease_timeout,
                    m.insert_seq
                ));
            }
            if !self.sets[class as usize].contains(&(e.lease, e.seq, i as u32)) {
                return Err(violation!("S11", "slot {i} missing from its class set"));
            }
        }
        let in_sets: usize = self.sets.iter().map(BTreeSet::len).sum();
        if in_sets != filed {
            return Err(violation!(
                "S11",
                "{in_sets} entries in the class sets for {filed} indexable objects"
            ));
        }
        let pinned = objects
            .iter()
            .filter(|m| indexable(m) && m.soft_pin_until.is_some())
            .count();
        if self.pins.len() != pinned {
            return Err(violation!(
                "S11",
                "{} pin entries for {pinned} soft-pinned indexable objects",
                self.pins.len()
            ));
        }
        if resident != self.resident_bytes {
            return Err(violation!(
                "S11",
                "resident bytes {:?}, objects say {resident:?}",
                self.resident_bytes
            ));
        }
        Ok(())
    }
}

/// The candidates of one class at one time, in lease order (see
/// [`VictimIndex::candidates`]): `(lease_timeout, insert_seq, id)`.
#[derive(Debug, Clone)]
pub struct Candidates<'a> {
    it: btree_set::Iter<'a, (Nanos, u64, u32)>,
    now: Nanos,
    objects: &'a [ObjectMeta],
    done: bool,
}

impl Iterator for Candidates<'_> {
    type Item = (Nanos, u64, ObjId);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        for &(lease, seq, id) in self.it.by_ref() {
            if lease > self.now {
                // Every later entry's lease is later still.
                break;
            }
            let m = &self.objects[id as usize];
            if m.readers > 0 {
                continue;
            }
            debug_assert_ne!(m.candidate(self.now), Candidate::No, "slot {id}");
            return Some((lease, seq, ObjId(id)));
        }
        self.done = true;
        None
    }
}

/// Merge the class streams of every data type (one each) by a key computed per
/// candidate, smallest first; yields `(type index, id)`.
pub(crate) struct Merge<'a, K, F> {
    streams: [Candidates<'a>; DataType::COUNT],
    heads: [Option<(K, ObjId)>; DataType::COUNT],
    key: F,
}

impl<'a, K: Ord + Copy, F: FnMut(usize, Nanos, u64, ObjId) -> K> Merge<'a, K, F> {
    /// Merge `streams` (indexed by type); `key(type, lease, seq, id)` ranks a candidate.
    /// Keys must be unique and each stream already in key order.
    pub(crate) fn new(streams: [Candidates<'a>; DataType::COUNT], key: F) -> Self {
        let mut m = Self {
            streams,
            heads: [None; DataType::COUNT],
            key,
        };
        for t in 0..DataType::COUNT {
            m.refill(t);
        }
        m
    }

    #[inline]
    fn refill(&mut self, t: usize) {
        self.heads[t] = self.streams[t]
            .next()
            .map(|(lease, seq, id)| ((self.key)(t, lease, seq, id), id));
    }
}

impl<K: Ord + Copy, F: FnMut(usize, Nanos, u64, ObjId) -> K> Iterator for Merge<'_, K, F> {
    type Item = (usize, ObjId);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let mut best: Option<(usize, K, ObjId)> = None;
        for (t, h) in self.heads.iter().enumerate() {
            if let Some((k, id)) = *h {
                if best.is_none_or(|(_, bk, _)| k < bk) {
                    best = Some((t, k, id));
                }
            }
        }
        let (t, _, id) = best?;
        self.refill(t);
        Some((t, id))
    }
}

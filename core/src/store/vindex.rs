//! `VictimIndex`: the store's lease-ordered index of eviction candidates, so that the
//! lease-ordered policies (`mooncake-default`, `type-aware`) pick a round's `k` victims in
//! O((k + r) log n) instead of scanning all `n` objects (issue 15, item 4).
//!
//! What it holds: every live, complete, not hard-pinned object, filed under one *class* =
//! (data type, soft pin active) and ordered within it by the master's lease key
//! `(lease_timeout, insert_seq)`. Each object's soft pin is judged against a watermark time
//! (`pin_now`), moved to a round's `now` by [`VictimIndex::sync_pins`] before every
//! selection (in either direction, so a lagging `now` is exact too). The candidates of a
//! class at `now` are then a prefix of its order: the entries with `lease_timeout <= now`,
//! less the objects being read (`readers > 0`), which the walk skips (`r` above: objects
//! whose lease expired while a read is still open). It also keeps every type's resident
//! bytes (all live objects, in-progress, leased and pinned ones included), which
//! `type-aware`'s budgets read.
//!
//! A class's order is kept in two intrusive sorted runs plus an ordered set: a new key is
//! appended to a run whose tail key is not larger, else it goes to the set. Time produces
//! keys in order on two tracks (a completion's lease is its time, a read's its time plus
//! the lease TTL), one run each, so upkeep is O(1) on the common path and O(log n)
//! otherwise (a lagging clock, a pin expiring on an old lease); a walk merges the three.
//!
//! Why per class and not one order: within one (type, pin) class `type-aware`'s adjusted
//! age is a non-increasing function of `lease_timeout` (a saturating subtraction, a
//! monotone `u64 -> f64` conversion and a multiplication and division by positive
//! constants, all monotone under IEEE rounding), and its ties fall back to the lease key,
//! so each class is already in `type-aware`'s order; a round merges three class streams.
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
/// A slot not in any class.
const NOT_INDEXED: u8 = u8::MAX;
/// No slot (end of a run).
const NIL: u32 = u32::MAX;
/// `Entry::place` of an entry in the class's ordered set (not in a run).
const IN_SET: u8 = 2;

/// Where one slot is indexed and under which key.
#[derive(Debug, Clone, Copy)]
struct Entry {
    class: u8,
    /// Run 0 or 1 of the class, or `IN_SET`.
    place: u8,
    lease: Nanos,
    seq: u64,
    pin: Option<Nanos>,
    /// Neighbours in its run (towards the head, towards the tail).
    prev: u32,
    next: u32,
}

const EMPTY: Entry = Entry {
    class: NOT_INDEXED,
    place: 0,
    lease: 0,
    seq: 0,
    pin: None,
    prev: NIL,
    next: NIL,
};

/// An intrusive list of slots in ascending key order.
#[derive(Debug, Clone, Copy)]
struct Run {
    head: u32,
    tail: u32,
}

/// One class: its entries, in key order within each of two runs and an ordered set.
#[derive(Debug, Clone, Default)]
struct Class {
    runs: [Option<Run>; 2],
    set: BTreeSet<(Nanos, u64, u32)>,
}

/// The store's index of eviction candidates (see the module docs).
#[derive(Debug, Clone)]
pub struct VictimIndex {
    classes: [Class; CLASSES],
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
            classes: Default::default(),
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

    #[inline]
    fn key(&self, id: u32) -> (Nanos, u64) {
        let e = &self.slots[id as usize];
        (e.lease, e.seq)
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

    /// `m` (live) changed: completion, lease or pin. Re-files it: O(1) when its key did not
    /// change or comes in time order, O(log n) otherwise.
    pub fn update(&mut self, id: ObjId, m: &ObjectMeta) {
        let old = self.slots[id.index()];
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
        if let Some(t) = m.soft_pin_until {
            self.pins.insert((t, id.0));
        }
        let e = &mut self.slots[id.index()];
        e.lease = m.lease_timeout;
        e.seq = m.insert_seq;
        e.pin = m.soft_pin_until;
        self.file(id.0, class);
    }

    /// Put `id` (its key already in its entry) into `class`: appended to the run whose
    /// tail key is the largest one not above it (an empty run when no tail qualifies),
    /// else into the set.
    fn file(&mut self, id: u32, class: u8) {
        let key = self.key(id);
        let c = &self.classes[class as usize];
        let mut best: Option<(usize, Option<(Nanos, u64)>)> = None;
        for (r, run) in c.runs.iter().enumerate() {
            let tail = run.map(|run| self.key(run.tail));
            if tail.is_some_and(|t| t > key) {
                continue;
            }
            if best.is_none_or(|(_, bt)| tail > bt) {
                best = Some((r, tail));
            }
        }
        let c = &mut self.classes[class as usize];
        let e = &mut self.slots[id as usize];
        e.class = class;
        e.next = NIL;
        e.prev = NIL;
        match best {
            Some((r, _)) => {
                e.place = r as u8;
                match &mut c.runs[r] {
                    Some(run) => {
                        e.prev = run.tail;
                        let tail = run.tail;
                        run.tail = id;
                        self.slots[tail as usize].next = id;
                    }
                    None => c.runs[r] = Some(Run { head: id, tail: id }),
                }
            }
            None => {
                e.place = IN_SET;
                c.set.insert((key.0, key.1, id));
            }
        }
    }

    /// Take `id` out of its class (the pin index untouched).
    fn unlink(&mut self, id: u32) {
        let e = self.slots[id as usize];
        let c = &mut self.classes[e.class as usize];
        if e.place == IN_SET {
            let found = c.set.remove(&(e.lease, e.seq, id));
            debug_assert!(found, "slot {id} missing from class {}", e.class);
            return;
        }
        let Some(run) = c.runs[e.place as usize].as_mut() else {
            debug_assert!(false, "slot {id} in an empty run");
            return;
        };
        if e.prev == NIL {
            run.head = e.next;
        } else {
            self.slots[e.prev as usize].next = e.next;
        }
        if e.next == NIL {
            run.tail = e.prev;
        } else {
            self.slots[e.next as usize].prev = e.prev;
        }
        if run.head == NIL {
            c.runs[e.place as usize] = None;
        }
    }

    fn unfile(&mut self, id: ObjId) {
        let e = self.slots[id.index()];
        if e.class == NOT_INDEXED {
            return;
        }
        self.unlink(id.0);
        if let Some(t) = e.pin {
            self.pins.remove(&(t, id.0));
        }
        self.slots[id.index()] = EMPTY;
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
                .map(|&(_, id)| id),
        );
        self.pin_now = now;
        for &id in &moved {
            let e = self.slots[id as usize];
            let class = self.class_of(e.class as usize / 2, e.pin);
            if class != e.class {
                self.unlink(id);
                self.file(id, class);
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
        let c = &self.classes[ty * 2 + usize::from(soft)];
        let mut set = c.set.iter();
        let set_head = set.next().copied();
        Candidates {
            index: self,
            runs: c.runs.map(|r| r.map_or(NIL, |r| r.head)),
            set,
            set_head,
            now,
            objects,
        }
    }

    /// Check the index against `objects` (the store's metas): every indexable object is
    /// filed once under its current key and class, nothing else is, every run and set is in
    /// key order with consistent links, and the resident bytes add up. For the property
    /// tests; O(n log n).
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
        }
        let mut in_classes = 0usize;
        for (k, c) in self.classes.iter().enumerate() {
            for (r, run) in c.runs.iter().enumerate() {
                let Some(run) = run else { continue };
                let (mut id, mut prev, mut last) = (run.head, NIL, None);
                while id != NIL {
                    let e = self.slots.get(id as usize).copied().unwrap_or(EMPTY);
                    if e.class as usize != k || e.place as usize != r || e.prev != prev {
                        return Err(violation!("S11", "slot {id} misfiled in run {r} of {k}"));
                    }
                    let key = (e.lease, e.seq);
                    if last.is_some_and(|l| l > key) {
                        return Err(violation!("S11", "run {r} of class {k} out of order"));
                    }
                    last = Some(key);
                    in_classes += 1;
                    if in_classes > filed {
                        return Err(violation!("S11", "more entries than indexable objects"));
                    }
                    (prev, id) = (id, e.next);
                }
                if prev != run.tail {
                    return Err(violation!("S11", "run {r} of class {k}: wrong tail"));
                }
            }
            for &(lease, seq, id) in &c.set {
                let e = self.slots.get(id as usize).copied().unwrap_or(EMPTY);
                if e.class as usize != k || e.place != IN_SET || (e.lease, e.seq) != (lease, seq) {
                    return Err(violation!("S11", "slot {id} misfiled in the set of {k}"));
                }
                in_classes += 1;
            }
        }
        if in_classes != filed {
            return Err(violation!(
                "S11",
                "{in_classes} entries in the classes for {filed} indexable objects"
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
/// [`VictimIndex::candidates`]): `(lease_timeout, insert_seq, id)`, merged from the
/// class's two runs and its set.
#[derive(Debug, Clone)]
pub struct Candidates<'a> {
    index: &'a VictimIndex,
    runs: [u32; 2],
    set: btree_set::Iter<'a, (Nanos, u64, u32)>,
    set_head: Option<(Nanos, u64, u32)>,
    now: Nanos,
    objects: &'a [ObjectMeta],
}

impl Iterator for Candidates<'_> {
    type Item = (Nanos, u64, ObjId);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            // The smallest of the three heads.
            let mut best = self.set_head;
            let mut from = 2;
            for (r, &id) in self.runs.iter().enumerate() {
                if id != NIL {
                    let (lease, seq) = self.index.key(id);
                    if best.is_none_or(|b| (lease, seq) < (b.0, b.1)) {
                        best = Some((lease, seq, id));
                        from = r;
                    }
                }
            }
            let (lease, seq, id) = best?;
            if lease > self.now {
                // Every later entry's lease is later still.
                self.runs = [NIL; 2];
                self.set_head = None;
                return None;
            }
            if from == 2 {
                self.set_head = self.set.next().copied();
            } else {
                self.runs[from] = self.index.slots[id as usize].next;
            }
            let m = &self.objects[id as usize];
            if m.readers > 0 {
                continue;
            }
            debug_assert_ne!(m.candidate(self.now), Candidate::No, "slot {id}");
            return Some((lease, seq, ObjId(id)));
        }
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

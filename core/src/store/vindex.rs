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
//! A class's order is kept in three intrusive sorted runs plus an ordered set: a new key
//! is appended to a run whose tail key is not larger, else it goes to the set. Time
//! produces keys in order on three tracks (a put complete at once has its time, a read its
//! time plus the lease TTL, a put that completes late its start time), one run each, so
//! upkeep is O(1) on the common path and O(log n) otherwise (a lagging clock, a pin
//! expiring on an old lease); a walk merges the four.
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
/// Sorted runs per class.
const RUNS: usize = 3;
/// How far ahead of a run's head the candidate walk prefetches.
const WALK_AHEAD: usize = 8;
/// `Entry::place` of an entry in the class's ordered set (not in a run).
const IN_SET: u8 = RUNS as u8;
/// A walk's head past a run's tail (see `VictimIndex::head`).
const PAST_TAIL: (Nanos, u64, u32) = (Nanos::MAX, u64::MAX, NIL);

/// Where one slot is indexed and under which key (24 bytes). Its run links and its pin
/// live in arrays of their own: a re-file rewrites the links of the slot's two run
/// neighbours, which are cold (the oldest leases), and 8-byte links keep that traffic to
/// one small array (issue 15: the index's upkeep was most of its cost over LRU).
#[derive(Debug, Clone, Copy)]
struct Entry {
    lease: Nanos,
    seq: u64,
    class: u8,
    /// Run `0..RUNS` of the class, or `IN_SET`.
    place: u8,
    /// Soft-pinned: the expiry is in `VictimIndex::pin_of`.
    pinned: bool,
}

const EMPTY: Entry = Entry {
    lease: 0,
    seq: 0,
    class: NOT_INDEXED,
    place: 0,
    pinned: false,
};

/// A slot's neighbours in its run (towards the head, towards the tail).
#[derive(Debug, Clone, Copy)]
struct Link {
    prev: u32,
    next: u32,
}

const UNLINKED: Link = Link {
    prev: NIL,
    next: NIL,
};

/// An intrusive list of slots in ascending key order; empty when `head == NIL`. The tail's
/// key is kept beside it, so that filing compares the runs' tails without reading their
/// entries.
#[derive(Debug, Clone, Copy)]
struct Run {
    head: u32,
    tail: u32,
    tail_key: (Nanos, u64),
}

const NO_RUN: Run = Run {
    head: NIL,
    tail: NIL,
    tail_key: (0, 0),
};

impl Run {
    #[inline]
    fn is_empty(&self) -> bool {
        self.head == NIL
    }
}

/// One class: its entries, in key order within each of its runs and an ordered set.
#[derive(Debug, Clone)]
struct Class {
    runs: [Run; RUNS],
    set: BTreeSet<(Nanos, u64, u32)>,
}

impl Default for Class {
    fn default() -> Self {
        Self {
            runs: [NO_RUN; RUNS],
            set: BTreeSet::new(),
        }
    }
}

/// The store's index of eviction candidates (see the module docs).
#[derive(Debug, Clone)]
pub struct VictimIndex {
    classes: [Class; CLASSES],
    slots: Vec<Entry>,
    /// Run links by slot (meaningful while the slot is in a run).
    links: Vec<Link>,
    /// Soft-pin expiry by slot (meaningful while its entry is `pinned`).
    pin_of: Vec<Nanos>,
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
            links: Vec::new(),
            pin_of: Vec::new(),
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

    /// The soft pin `id` is filed with.
    #[inline]
    fn pin(&self, id: u32) -> Option<Nanos> {
        self.slots[id as usize]
            .pinned
            .then(|| self.pin_of[id as usize])
    }

    #[inline]
    fn key(&self, id: u32) -> (Nanos, u64) {
        let e = &self.slots[id as usize];
        (e.lease, e.seq)
    }

    /// A run's head `id` with its key; past the run's tail (`NIL`) `PAST_TAIL`, which
    /// orders after every entry (its id, `NIL`, after every slot's on equal keys).
    #[inline]
    fn head(&self, id: u32) -> (Nanos, u64, u32) {
        if id == NIL {
            PAST_TAIL
        } else {
            let (lease, seq) = self.key(id);
            (lease, seq, id)
        }
    }

    /// A slot became live (put start).
    pub fn on_live(&mut self, id: ObjId, m: &ObjectMeta) {
        self.resident_bytes[m.data_type.index()] += m.size;
        if id.index() >= self.slots.len() {
            self.slots.resize(id.index() + 1, EMPTY);
            self.links.resize(id.index() + 1, UNLINKED);
            self.pin_of.resize(id.index() + 1, 0);
        }
        debug_assert_eq!(
            self.slots[id.index()].class,
            NOT_INDEXED,
            "slot {id:?} reused"
        );
        if self.slots[id.index()].class != NOT_INDEXED {
            // A slot filed twice (a caller's bug): `update` re-files it.
            return self.update(id, m);
        }
        // A fresh slot: what `update` does for an unfiled entry, without its comparisons.
        if !indexable(m) {
            return;
        }
        let class = self.class_of(m.data_type.index(), m.soft_pin_until);
        self.file_unfiled(id, m, class);
    }

    /// File `id`, not in the index, under `m`'s key and pin in `class`.
    #[inline]
    fn file_unfiled(&mut self, id: ObjId, m: &ObjectMeta, class: u8) {
        if let Some(t) = m.soft_pin_until {
            self.pins.insert((t, id.0));
            self.pin_of[id.index()] = t;
        }
        let e = &mut self.slots[id.index()];
        e.lease = m.lease_timeout;
        e.seq = m.insert_seq;
        e.pinned = m.soft_pin_until.is_some();
        self.file(id.0, class);
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
        let same_key = old.lease == m.lease_timeout && old.seq == m.insert_seq;
        if old.class == class && !old.pinned && m.soft_pin_until.is_none() {
            // The common path (a read's new lease, a completion): no pin before or after,
            // same class; only the place in the class's order may change.
            if !same_key {
                self.unlink(id.0);
                let e = &mut self.slots[id.index()];
                e.lease = m.lease_timeout;
                e.seq = m.insert_seq;
                self.file(id.0, class);
            }
            return;
        }
        if old.class == class && same_key && self.pin(id.0) == m.soft_pin_until {
            return;
        }
        self.unfile(id);
        self.file_unfiled(id, m, class);
    }

    /// Put `id` (its key already in its entry) into `class`: appended to the run whose
    /// tail key is the largest one not above it (the first such run on a tie; the first
    /// empty run when no tail qualifies), else into the set.
    #[inline]
    fn file(&mut self, id: u32, class: u8) {
        let key = self.key(id);
        let c = &mut self.classes[class as usize];
        let (mut best, mut best_tail, mut empty) = (RUNS, (0, 0), RUNS);
        for (r, run) in c.runs.iter().enumerate() {
            if run.is_empty() {
                if empty == RUNS {
                    empty = r;
                }
            } else if run.tail_key <= key && (best == RUNS || run.tail_key > best_tail) {
                (best, best_tail) = (r, run.tail_key);
            }
        }
        let r = if best < RUNS { best } else { empty };
        let e = &mut self.slots[id as usize];
        e.class = class;
        e.place = r as u8;
        let mut link = UNLINKED;
        match c.runs.get_mut(r) {
            Some(run) if !run.is_empty() => {
                link.prev = run.tail;
                self.links[run.tail as usize].next = id;
                run.tail = id;
                run.tail_key = key;
            }
            Some(run) => {
                *run = Run {
                    head: id,
                    tail: id,
                    tail_key: key,
                }
            }
            None => {
                c.set.insert((key.0, key.1, id));
            }
        }
        self.links[id as usize] = link;
    }

    /// Take `id` out of its class (the pin index untouched).
    #[inline]
    fn unlink(&mut self, id: u32) {
        let e = self.slots[id as usize];
        let c = &mut self.classes[e.class as usize];
        if e.place == IN_SET {
            let found = c.set.remove(&(e.lease, e.seq, id));
            debug_assert!(found, "slot {id} missing from class {}", e.class);
            return;
        }
        let run = &mut c.runs[e.place as usize];
        debug_assert!(!run.is_empty(), "slot {id} in an empty run");
        let l = self.links[id as usize];
        if l.prev == NIL {
            run.head = l.next;
        } else {
            self.links[l.prev as usize].next = l.next;
        }
        if l.next == NIL {
            run.tail = l.prev;
            if l.prev == NIL {
                *run = NO_RUN;
            } else {
                let p = &self.slots[l.prev as usize];
                run.tail_key = (p.lease, p.seq);
            }
        } else {
            self.links[l.next as usize].prev = l.prev;
        }
    }

    #[inline]
    fn unfile(&mut self, id: ObjId) {
        let e = self.slots[id.index()];
        if e.class == NOT_INDEXED {
            return;
        }
        self.unlink(id.0);
        if e.pinned {
            self.pins.remove(&(self.pin_of[id.index()], id.0));
        }
        self.slots[id.index()] = EMPTY;
        self.links[id.index()] = UNLINKED;
    }

    /// Hint the CPU to fetch `id`'s entry and run links (no effect on results).
    #[inline]
    pub fn prefetch(&self, id: ObjId) {
        if let (Some(e), Some(l)) = (self.slots.get(id.index()), self.links.get(id.index())) {
            crate::hint::prefetch(e);
            crate::hint::prefetch(l);
        }
    }

    /// Hint the CPU to fetch what the candidate walk reads of `id`: its entry and meta.
    #[inline]
    fn prefetch_walk(&self, id: u32, objects: &[ObjectMeta]) {
        if let (Some(e), Some(m)) = (self.slots.get(id as usize), objects.get(id as usize)) {
            crate::hint::prefetch(e);
            crate::hint::prefetch(m);
        }
    }

    /// The slot is about to be freed (`m` is its meta before the free).
    #[inline]
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
            let class = self.class_of(e.class as usize / 2, self.pin(id));
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
        let set_head = set.next().copied().unwrap_or(PAST_TAIL);
        let runs = c.runs.map(|r| r.head);
        // Start each run's lookahead `WALK_AHEAD` entries past its head, fetching the
        // entries and metadata on the way.
        let ahead = runs.map(|mut id| {
            for _ in 0..WALK_AHEAD {
                if id == NIL {
                    break;
                }
                self.prefetch_walk(id, objects);
                id = self.links[id as usize].next;
            }
            id
        });
        let h = runs.map(|id| self.head(id));
        Candidates {
            index: self,
            heads: [h[0], h[1], h[2], set_head],
            ahead,
            set,
            cur: 0,
            limit: (0, 0, 0),
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
            let pin = e.pinned.then(|| self.pin_of.get(i).copied()).flatten();
            if e.pinned != m.soft_pin_until.is_some() || pin != m.soft_pin_until {
                return Err(violation!(
                    "S11",
                    "slot {i} filed with pin {pin:?}, meta says {:?}",
                    m.soft_pin_until
                ));
            }
        }
        let mut in_classes = 0usize;
        for (k, c) in self.classes.iter().enumerate() {
            for (r, run) in c.runs.iter().enumerate() {
                if run.is_empty() {
                    continue;
                }
                let (mut id, mut prev, mut last) = (run.head, NIL, None);
                while id != NIL {
                    let e = self.slots.get(id as usize).copied().unwrap_or(EMPTY);
                    let l = self.links.get(id as usize).copied().unwrap_or(UNLINKED);
                    if e.class as usize != k || e.place as usize != r || l.prev != prev {
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
                    (prev, id) = (id, l.next);
                }
                if prev != run.tail {
                    return Err(violation!("S11", "run {r} of class {k}: wrong tail"));
                }
                if last != Some(run.tail_key) {
                    return Err(violation!(
                        "S11",
                        "run {r} of class {k}: tail key {:?}, its tail's key {last:?}",
                        run.tail_key
                    ));
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
        for &(t, id) in &self.pins {
            let e = self.slots.get(id as usize).copied().unwrap_or(EMPTY);
            if !e.pinned || self.pin_of.get(id as usize) != Some(&t) {
                return Err(violation!(
                    "S11",
                    "pin entry ({t}, {id}) not slot {id}'s pin"
                ));
            }
        }
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
/// class's runs and its set.
#[derive(Debug, Clone)]
pub struct Candidates<'a> {
    index: &'a VictimIndex,
    /// Per source (the runs, then the set at `RUNS`), its head with the head's key
    /// (`VictimIndex::head`; `PAST_TAIL` once exhausted), kept so that picking the smallest
    /// head reads no entry.
    heads: [(Nanos, u64, u32); RUNS + 1],
    /// Per run, the entry `WALK_AHEAD` places past its head (`NIL` past the tail).
    ahead: [u32; RUNS],
    set: btree_set::Iter<'a, (Nanos, u64, u32)>,
    /// The source the last pick chose and the smallest head of the others then: while
    /// `cur`'s head stays below `limit` it is still the smallest (only `cur` advanced), so
    /// a stream of victims from one run is taken without comparing heads. A `limit` of
    /// `(0, 0, 0)` forces a pick.
    cur: usize,
    limit: (Nanos, u64, u32),
    now: Nanos,
    objects: &'a [ObjectMeta],
}

impl Candidates<'_> {
    /// The source with the smallest head (runs before the set, lower runs first, on equal
    /// heads; a source past its tail only when every one is), remembered as `cur` with the
    /// smallest of the other heads as `limit`.
    #[inline]
    fn pick(&mut self) -> usize {
        let mut from = 0;
        for r in 1..=RUNS {
            if self.heads[r] < self.heads[from] {
                from = r;
            }
        }
        let mut limit = PAST_TAIL;
        for r in 0..=RUNS {
            if r != from && self.heads[r] < limit {
                limit = self.heads[r];
            }
        }
        self.cur = from;
        self.limit = limit;
        from
    }
}

impl Iterator for Candidates<'_> {
    type Item = (Nanos, u64, ObjId);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let from = if self.heads[self.cur] < self.limit {
                self.cur
            } else {
                self.pick()
            };
            let (lease, seq, id) = self.heads[from];
            if id == NIL {
                return None;
            }
            if lease > self.now {
                // Every later entry's lease is later still.
                self.heads = [PAST_TAIL; RUNS + 1];
                self.limit = PAST_TAIL;
                return None;
            }
            if from == RUNS {
                self.heads[RUNS] = self.set.next().copied().unwrap_or(PAST_TAIL);
            } else {
                self.heads[from] = self.index.head(self.index.links[id as usize].next);
                // The walk is over the oldest (coldest) entries: fetch the entry and
                // metadata `WALK_AHEAD` places on while this one is handled (hints only).
                let a = self.ahead[from];
                if a != NIL {
                    let a = self.index.links[a as usize].next;
                    self.ahead[from] = a;
                    if a != NIL {
                        self.index.prefetch_walk(a, self.objects);
                    }
                }
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
    /// As in [`Candidates`]: the stream the last pick chose and the smallest key of the
    /// others' heads then (`None`: all others exhausted); valid once `picked`.
    cur: usize,
    limit: Option<K>,
    picked: bool,
}

impl<'a, K: Ord + Copy, F: FnMut(usize, Nanos, u64, ObjId) -> K> Merge<'a, K, F> {
    /// Merge `streams` (indexed by type); `key(type, lease, seq, id)` ranks a candidate.
    /// Keys must be unique and each stream already in key order.
    pub(crate) fn new(streams: [Candidates<'a>; DataType::COUNT], key: F) -> Self {
        let mut m = Self {
            streams,
            heads: [None; DataType::COUNT],
            key,
            cur: 0,
            limit: None,
            picked: false,
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

    /// The stream with the smallest head (the lowest type on equal keys), remembered as
    /// `cur` with the smallest key of the other heads as `limit`; `None` when all are
    /// exhausted.
    #[inline]
    fn pick(&mut self) -> Option<usize> {
        let mut best: Option<(usize, K)> = None;
        for (t, h) in self.heads.iter().enumerate() {
            if let Some((k, _)) = *h {
                if best.is_none_or(|(_, bk)| k < bk) {
                    best = Some((t, k));
                }
            }
        }
        let (t, _) = best?;
        let mut limit: Option<K> = None;
        for (u, h) in self.heads.iter().enumerate() {
            if let Some((k, _)) = *h {
                if u != t && limit.is_none_or(|l| k < l) {
                    limit = Some(k);
                }
            }
        }
        (self.cur, self.limit, self.picked) = (t, limit, true);
        Some(t)
    }
}

impl<K: Ord + Copy, F: FnMut(usize, Nanos, u64, ObjId) -> K> Iterator for Merge<'_, K, F> {
    type Item = (usize, ObjId);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let fast = match self.heads[self.cur] {
            Some((k, _)) => self.picked && self.limit.is_none_or(|l| k < l),
            None => false,
        };
        let t = if fast { self.cur } else { self.pick()? };
        let (_, id) = self.heads[t]?;
        self.refill(t);
        Some((t, id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::policies::tests::live;

    const GEN: DataType = DataType::General;
    const KV: DataType = DataType::KvCache;

    /// A live, complete, unread object of `size` bytes.
    fn meta(ty: DataType, size: u64, lease: Nanos, seq: u64, pin: Option<Nanos>) -> ObjectMeta {
        ObjectMeta {
            data_type: ty,
            soft_pin_until: pin,
            lease_timeout: lease,
            ..live(size, seq)
        }
    }

    fn index_of(objects: &[ObjectMeta]) -> VictimIndex {
        let mut ix = VictimIndex::new();
        for (i, m) in objects.iter().enumerate() {
            ix.on_live(ObjId(i as u32), m);
        }
        ix
    }

    /// The ids a class yields at `now` (pins synced to `now` first).
    fn ids(
        ix: &mut VictimIndex,
        ty: DataType,
        soft: bool,
        now: Nanos,
        o: &[ObjectMeta],
    ) -> Vec<u32> {
        ix.sync_pins(now);
        ix.candidates(ty.index(), soft, now, o)
            .map(|(_, _, id)| id.0)
            .collect()
    }

    /// `(head, tail)` of each run of `c` (all of them open).
    fn run_ends(c: &Class) -> Vec<(u32, u32)> {
        c.runs
            .iter()
            .map(|r| {
                assert!(!r.is_empty(), "an open run");
                (r.head, r.tail)
            })
            .collect()
    }

    /// Class 0 (general, unpinned) with an entry in each place, by the filing rule of
    /// `file`: id 0 opens run 0, id 1 (smaller than run 0's tail) opens run 1, id 2
    /// (smaller than both tails) opens run 2, id 3 (after run 0's tail, the largest)
    /// extends run 0, id 6 (smaller than every tail) goes to the set. Id 4 is a
    /// soft-pinned KV object (class 3 at time 0), id 5 a put in progress (resident, not
    /// indexed).
    fn fixture() -> (VictimIndex, Vec<ObjectMeta>) {
        let mut objects = vec![
            meta(GEN, 10, 100, 0, None),
            meta(GEN, 11, 50, 1, None),
            meta(GEN, 12, 20, 2, None),
            meta(GEN, 13, 200, 3, None),
            meta(KV, 14, 0, 4, Some(1_000)),
            meta(DataType::EncoderOutput, 15, 0, 5, None),
            meta(GEN, 16, 10, 6, None),
        ];
        objects[5].complete = false;
        let ix = index_of(&objects);
        (ix, objects)
    }

    #[test]
    fn the_fixture_has_an_entry_in_every_place_and_checks() {
        let (ix, o) = fixture();
        let c = &ix.classes[0];
        assert_eq!(run_ends(c), [(0, 3), (1, 1), (2, 2)]);
        assert_eq!(ix.links[0].next, 3);
        assert_eq!(c.set.iter().copied().collect::<Vec<_>>(), [(10, 6, 6)]);
        assert_eq!(ix.slots[4].class, 3);
        assert_eq!(ix.slots[5].class, NOT_INDEXED);
        assert_eq!(ix.pins.len(), 1);
        assert_eq!(*ix.resident_bytes(), [10 + 11 + 12 + 13 + 16, 14, 15]);
        ix.check(&o).unwrap();
        // Lease order across the four places: 10 (set), 20 (run 2), 50 (run 1), 100, 200
        // (run 0).
        let mut ix = ix;
        assert_eq!(ids(&mut ix, GEN, false, 1_000, &o), [6, 2, 1, 0, 3]);
        assert_eq!(ids(&mut ix, GEN, false, 99, &o), [6, 2, 1]);
        assert_eq!(ids(&mut ix, KV, true, 0, &o), [4]);
    }

    /// `check` names every kind of disagreement between the index and the metas, each one
    /// on its own (the other parts consistent).
    #[test]
    fn check_rejects_every_kind_of_corruption() {
        let (ix0, o0) = fixture();
        type Corrupt = fn(&mut VictimIndex, &mut Vec<ObjectMeta>);
        let cases: [(&str, &str, Corrupt); 19] = [
            ("indexed but not indexable", "not indexable", |_, o| {
                o[0].complete = false
            }),
            (
                "indexable but not indexed",
                "slot 5 filed as class 255",
                |_, o| o[5].complete = true,
            ),
            // The pin expired before `pin_now`: the meta's class is 2, the entry's 3.
            ("class only", "slot 4 filed as class 3", |_, o| {
                o[4].soft_pin_until = Some(0)
            }),
            ("lease only", "slot 3 filed as class 0 lease 200", |_, o| {
                o[3].lease_timeout = 201
            }),
            ("seq only", "meta says class 0 lease 200 seq 99", |_, o| {
                o[3].insert_seq = 99
            }),
            (
                "run entry of another class",
                "slot 3 misfiled in run 0",
                |ix, o| {
                    // Id 3 re-typed as KV in both the entry and the metas (and the bytes),
                    // but still linked in general's run 0.
                    ix.slots[3].class = 2;
                    o[3].data_type = KV;
                    ix.resident_bytes[0] -= 13;
                    ix.resident_bytes[1] += 13;
                },
            ),
            (
                "run entry says the other run",
                "slot 3 misfiled in run 0",
                |ix, _| ix.slots[3].place = 1,
            ),
            (
                "run entry with a wrong prev",
                "slot 3 misfiled in run 0",
                |ix, _| ix.links[3].prev = NIL,
            ),
            ("run out of key order", "out of order", |ix, o| {
                ix.slots[3].lease = 60;
                o[3].lease_timeout = 60;
            }),
            ("run with a wrong tail", "wrong tail", |ix, _| {
                ix.classes[0].runs[0].tail = 0;
            }),
            ("run with a stale tail key", "tail key", |ix, _| {
                ix.classes[0].runs[0].tail_key = (199, 3);
            }),
            (
                "set entry of another class",
                "slot 6 misfiled in the set of 2",
                |ix, _| {
                    let t = ix.classes[0].set.pop_first().unwrap();
                    ix.classes[2].set.insert(t);
                },
            ),
            (
                "set entry says a run",
                "slot 6 misfiled in the set of 0",
                |ix, _| ix.slots[6].place = 0,
            ),
            (
                "set key differs from the entry",
                "slot 6 misfiled in the set of 0",
                |ix, _| {
                    let (l, s, id) = ix.classes[0].set.pop_first().unwrap();
                    ix.classes[0].set.insert((l + 1, s, id));
                },
            ),
            (
                "set entry missing",
                "5 entries in the classes for 6",
                |ix, _| {
                    ix.classes[0].set.clear();
                },
            ),
            ("pin entry missing", "0 pin entries for 1", |ix, _| {
                ix.pins.clear()
            }),
            // Still pinned at `pin_now` 0, so the class agrees; only the expiry differs.
            (
                "pin expiry differs from the meta",
                "slot 4 filed with pin Some(1000), meta says Some(1001)",
                |_, o| o[4].soft_pin_until = Some(1_001),
            ),
            (
                "pin entry under another expiry",
                "pin entry (999, 4) not slot 4's pin",
                |ix, _| {
                    ix.pins.clear();
                    ix.pins.insert((999, 4));
                },
            ),
            ("resident bytes", "resident bytes [62, 15, 15]", |ix, _| {
                ix.resident_bytes[1] += 1
            }),
        ];
        for (name, want, corrupt) in cases {
            let (mut ix, mut o) = (ix0.clone(), o0.clone());
            corrupt(&mut ix, &mut o);
            let e = ix.check(&o).expect_err(name);
            assert!(e.to_string().contains(want), "{name}: {e}");
        }
        ix0.check(&o0).unwrap();
    }

    /// The common path of the module docs: keys on three time tracks (a put complete at
    /// once at `t`, a read's lease at `t + ttl`, a put completing late with its start time,
    /// `t - d`), interleaved, each track in order, go to the three runs and never to the
    /// set, in whichever order the tracks come; a walk yields them in key order. With two
    /// runs the third track went to the set (9% of the filings of a W1 Full simulation).
    #[test]
    fn three_interleaved_time_tracks_fill_the_runs_and_never_the_set() {
        let orders = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        for order in orders {
            let mut objects = Vec::new();
            for i in 0..20u64 {
                let t = 5_000 + 10 * i;
                let tracks = [t, t + 1_000, t - 3_000];
                for k in order {
                    let seq = objects.len() as u64;
                    objects.push(meta(GEN, 1, tracks[k], seq, None));
                }
            }
            let mut ix = index_of(&objects);
            ix.check(&objects).unwrap();
            assert!(ix.classes[0].set.is_empty(), "order {order:?}: set used");
            let mut want: Vec<(Nanos, u64, u32)> = objects
                .iter()
                .enumerate()
                .map(|(i, m)| (m.lease_timeout, m.insert_seq, i as u32))
                .collect();
            want.sort();
            let all: Vec<u32> = want.iter().map(|w| w.2).collect();
            assert_eq!(ids(&mut ix, GEN, false, u64::MAX, &objects), all);
            let early: Vec<u32> = want.iter().filter(|w| w.0 <= 5_500).map(|w| w.2).collect();
            assert_eq!(early.len(), 40);
            assert_eq!(ids(&mut ix, GEN, false, 5_500, &objects), early);
        }
    }

    /// `file` appends to the run with the largest tail not above the key, not the first
    /// run that fits: here run 0 reopened (its only entry freed) with a small key, so the
    /// first fitting run is the loosest, and a key that only run 0 fits comes next. Taking
    /// the first fitting run would leave it nowhere but the set.
    #[test]
    fn file_appends_to_the_tightest_fitting_run() {
        let leases = [30, 20, 10, 5, 25, 7];
        let mut o: Vec<ObjectMeta> = leases
            .iter()
            .enumerate()
            .map(|(i, &l)| meta(GEN, 1, l, i as u64, None))
            .collect();
        let mut ix = VictimIndex::new();
        for (i, m) in o.iter().enumerate().take(3) {
            ix.on_live(ObjId(i as u32), m);
        }
        ix.on_free(ObjId(0), &o[0]);
        o[0].live = false;
        for (i, m) in o.iter().enumerate().skip(3) {
            ix.on_live(ObjId(i as u32), m);
        }
        ix.check(&o).unwrap();
        let c = &ix.classes[0];
        assert!(c.set.is_empty(), "a key spilled into the set");
        // Run 0: 5, 7; run 1: 20, 25; run 2: 10.
        assert_eq!(run_ends(c), [(3, 5), (1, 4), (2, 2)]);
        assert_eq!(ids(&mut ix, GEN, false, 100, &o), [3, 5, 2, 1, 4]);
    }

    /// A soft pin holds strictly before its expiry (`ObjectMeta::soft_pin_until` is
    /// exclusive); `sync_pins` moves the object across at the expiry in both directions,
    /// and `pin_now` reports the last synced time.
    #[test]
    fn sync_pins_moves_an_object_at_its_pin_expiry_both_ways() {
        let mut o = vec![meta(KV, 5, 0, 0, Some(1_000)), meta(KV, 6, 0, 1, None)];
        let mut ix = index_of(&o);
        assert_eq!(ix.pin_now(), 0);
        for (now, pinned) in [(999, true), (1_000, false), (5_000, false), (999, true)] {
            ix.sync_pins(now);
            assert_eq!(ix.pin_now(), now);
            let want_soft: &[u32] = if pinned { &[0] } else { &[] };
            let want_unpinned: &[u32] = if pinned { &[1] } else { &[0, 1] };
            assert_eq!(ids(&mut ix, KV, true, now, &o), want_soft, "now {now}");
            assert_eq!(ids(&mut ix, KV, false, now, &o), want_unpinned, "now {now}");
            ix.check(&o).unwrap();
        }
        // The pin moved later by an update alone (lease and seq unchanged) is followed.
        o[0].soft_pin_until = Some(2_000);
        ix.update(ObjId(0), &o[0]);
        ix.sync_pins(1_500);
        assert_eq!(ids(&mut ix, KV, true, 1_500, &o), [0]);
        ix.sync_pins(2_000);
        assert_eq!(ids(&mut ix, KV, true, 2_000, &o), [] as [u32; 0]);
        assert_eq!(ids(&mut ix, KV, false, 2_000, &o), [0, 1]);
        ix.check(&o).unwrap();
    }

    /// A pin removed by an update (the class unchanged: the pin had already expired at
    /// `pin_now`) leaves the pin index, so a later `sync_pins` over its old expiry moves
    /// nothing back. `MemStore` never clears a pin; the public index does not rely on that.
    #[test]
    fn update_clearing_an_expired_pin_drops_it_from_the_pin_index() {
        let mut o = vec![meta(KV, 5, 0, 0, Some(1_000))];
        let mut ix = index_of(&o);
        ix.sync_pins(2_000);
        o[0].soft_pin_until = None;
        ix.update(ObjId(0), &o[0]);
        ix.check(&o).unwrap();
        assert!(ix.pins.is_empty());
        ix.sync_pins(500);
        assert_eq!(ids(&mut ix, KV, true, 500, &o), [] as [u32; 0]);
        assert_eq!(ids(&mut ix, KV, false, 500, &o), [0]);
    }

    /// An object with the key `(0, 0)` and no pin (what an empty slot's entry also holds)
    /// is still filed, at `on_live` and when completed later. `MemStore` starts
    /// `insert_seq` at 1, so only other users of the public index can pass seq 0.
    #[test]
    fn a_first_put_at_time_zero_is_filed() {
        let mut o = vec![meta(GEN, 3, 0, 0, None), meta(GEN, 4, 0, 1, None)];
        o[1].complete = false;
        let mut ix = index_of(&o);
        ix.check(&o).unwrap();
        assert_eq!(ids(&mut ix, GEN, false, 0, &o), [0]);
        // Slot 0 freed and reused by an in-progress object of key `(0, 0)`, completed at
        // time 0.
        ix.on_free(ObjId(0), &o[0]);
        o[0].complete = false;
        ix.on_live(ObjId(0), &o[0]);
        o[0].complete = true;
        ix.update(ObjId(0), &o[0]);
        o[1].complete = true;
        ix.update(ObjId(1), &o[1]);
        ix.check(&o).unwrap();
        assert_eq!(ids(&mut ix, GEN, false, 0, &o), [0, 1]);
    }

    /// `update` re-files an object when any one part of its key or its pin changes, the
    /// others unchanged (`MemStore` never changes an indexed object's seq; the public
    /// index does not rely on that).
    #[test]
    fn update_follows_each_part_of_the_key_alone() {
        let base = vec![
            meta(GEN, 1, 10, 0, Some(5_000)),
            meta(GEN, 1, 20, 1, Some(5_000)),
            meta(GEN, 1, 20, 2, Some(5_000)),
        ];
        type Change = fn(&mut ObjectMeta);
        let changes: [(&str, Change, [u32; 3]); 3] = [
            ("lease", |m| m.lease_timeout = 25, [1, 2, 0]),
            ("seq", |m| m.insert_seq = 9, [0, 2, 1]),
            ("pin", |m| m.soft_pin_until = Some(6_000), [0, 1, 2]),
        ];
        for (name, change, want) in changes {
            let mut o = base.clone();
            let mut ix = index_of(&o);
            // Object 0 for the lease and the pin, 1 for the seq (its lease ties with 2's).
            let id = if name == "seq" { 1 } else { 0 };
            change(&mut o[id]);
            ix.update(ObjId(id as u32), &o[id]);
            ix.check(&o).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(ids(&mut ix, GEN, true, 100, &o), want, "{name}");
            // The pin expires at its new time only.
            ix.sync_pins(5_500);
            let soft: Vec<u32> = ids(&mut ix, GEN, true, 5_500, &o);
            let held = if name == "pin" { vec![0] } else { vec![] };
            assert_eq!(soft, held, "{name}");
        }
    }
}

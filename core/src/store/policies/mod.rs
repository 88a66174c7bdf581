//! Eviction policies beyond `mooncake-default` (issue 5): seed 002's type-aware and
//! hierarchical policies, the classic online baselines (LRU, FIFO, S3-FIFO, SIEVE, W-TinyLFU, GDSF) and two
//! offline references (Belady and a cost-aware oracle), each behind
//! [`EvictionPolicy`](super::policy::EvictionPolicy) and built from
//! [`PolicyConfig`](super::policy::PolicyConfig).
//!
//! Every policy keeps Mooncake's pass structure (see
//! [`MooncakeDefault`](super::policy::MooncakeDefault)): it plans up to
//! `max(target, lower_bound)` victims among the unpinned candidates in its own order, and
//! only if that leaves it short of `lower_bound` does it top up from soft-pinned
//! candidates (when the store allows). A policy only proposes objects that are
//! candidates at the request's `now` (`ObjectMeta::candidate`), so the store never refuses
//! one (`StoreStats::policy_refused` stays 0).
//!
//! Shared pieces live here: [`RankKey`] (a total order for ranked policies), the ranked
//! two-pass selection used by the scanning policies, and an intrusive queue over `ObjId`
//! slots used by the queue policies (LRU, FIFO, S3-FIFO, SIEVE), whose hooks are O(1).

pub mod belady;
pub mod belady_cost;
pub mod fifo;
pub mod gdsf;
pub mod hierarchical;
pub mod lru;
pub mod s3fifo;
pub mod sieve;
pub mod type_aware;
pub mod wtinylfu;

use std::cmp::Ordering;

use super::policy::{Candidate, EvictRequest, ObjectMeta};
use super::ObjId;
use crate::invariant::{violation, InvariantViolation};

pub use belady::Belady;
pub use belady_cost::BeladyCost;
pub use fifo::Fifo;
pub use gdsf::Gdsf;
pub use hierarchical::{Assign, Hierarchical, HierarchicalConfig, LeafRule, ScopeConfig, Selector};
pub use lru::Lru;
pub use s3fifo::{S3Fifo, S3FifoConfig};
pub use sieve::Sieve;
pub use type_aware::{TypeAware, TypeAwareConfig, TypeKnobs, TypeKnobsByType};
pub use wtinylfu::{WTinyLfu, WTinyLfuConfig};

/// A total order over candidates for ranked policies: the smallest key is evicted first.
/// Compared field by field, `a` by `f64::total_cmp` (callers never produce NaN).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankKey {
    /// Primary score (e.g. negated adjusted age, GDSF priority).
    pub a: f64,
    /// First tie-break (e.g. lease timeout).
    pub b: u64,
    /// Second tie-break (e.g. insertion sequence, unique per object).
    pub c: u64,
}

impl Eq for RankKey {}

impl PartialOrd for RankKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for RankKey {
    #[inline]
    fn cmp(&self, other: &Self) -> Ordering {
        self.a
            .total_cmp(&other.a)
            .then(self.b.cmp(&other.b))
            .then(self.c.cmp(&other.c))
    }
}

/// Objects a policy takes from unpinned candidates in one run: pass 1's `target` plus
/// pass 2's top-up to `lower_bound` when unpinned candidates remain (the master's order).
#[inline]
pub(crate) fn unpinned_quota(req: &EvictRequest) -> usize {
    req.target.max(req.lower_bound) as usize
}

/// Soft-pinned objects a policy may take after `taken` unpinned victims.
#[inline]
pub(crate) fn soft_quota(req: &EvictRequest, taken: usize) -> usize {
    if req.allow_soft_pinned {
        (req.lower_bound as usize).saturating_sub(taken)
    } else {
        0
    }
}

/// Move the `k` smallest entries (by `key`) of `v` to its front, sorted; returns `k`
/// clamped to `v.len()`. O(len + k log k): a selection, then a sort of the chosen only.
pub(crate) fn smallest_first<T, K: Ord>(v: &mut [T], k: usize, key: impl Fn(&T) -> K) -> usize {
    let k = k.min(v.len());
    if k == 0 {
        return 0;
    }
    if k < v.len() {
        v.select_nth_unstable_by_key(k - 1, &key);
    }
    v[..k].sort_unstable_by_key(key);
    k
}

/// Scratch for ranked policies: candidates split by pass, then Mooncake's two passes.
/// Keys must be unique per object so the victims do not depend on scan order.
#[derive(Debug, Clone)]
pub(crate) struct Ranked<K = RankKey> {
    unpinned: Vec<(K, ObjId)>,
    soft: Vec<(K, ObjId)>,
}

impl<K> Default for Ranked<K> {
    fn default() -> Self {
        Self {
            unpinned: Vec::new(),
            soft: Vec::new(),
        }
    }
}

impl<K: Ord + Copy> Ranked<K> {
    /// Scan `objects` and keep every candidate at `req.now` with its key.
    pub(crate) fn collect(
        &mut self,
        req: &EvictRequest,
        objects: &[ObjectMeta],
        mut key: impl FnMut(usize, &ObjectMeta) -> K,
    ) {
        self.unpinned.clear();
        self.soft.clear();
        for (i, m) in objects.iter().enumerate() {
            match m.candidate(req.now) {
                Candidate::No => {}
                Candidate::Unpinned => self.unpinned.push((key(i, m), ObjId(i as u32))),
                Candidate::SoftPinned => {
                    if req.allow_soft_pinned {
                        self.soft.push((key(i, m), ObjId(i as u32)))
                    }
                }
            }
        }
    }

    /// Push the victims (smallest keys first, unpinned before soft-pinned) onto `out`.
    pub(crate) fn select(&mut self, req: &EvictRequest, out: &mut Vec<ObjId>) {
        let k = smallest_first(&mut self.unpinned, unpinned_quota(req), |e| e.0);
        out.extend(self.unpinned[..k].iter().map(|e| e.1));
        let s = smallest_first(&mut self.soft, soft_quota(req, k), |e| e.0);
        out.extend(self.soft[..s].iter().map(|e| e.1));
    }
}

/// No slot (end of a queue).
pub(crate) const NIL: u32 = u32::MAX;

/// One slot's place in at most one intrusive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Link {
    /// Neighbour towards the head (newer), or `NIL`.
    pub newer: u32,
    /// Neighbour towards the tail (older), or `NIL`.
    pub older: u32,
    /// Which queue holds the slot (0 = none; the meaning of others is the policy's).
    pub queue: u8,
}

const UNLINKED: Link = Link {
    newer: NIL,
    older: NIL,
    queue: 0,
};

/// Links of every slot, indexed by `ObjId` (grown on demand).
#[derive(Debug, Default, Clone)]
pub(crate) struct Links(pub Vec<Link>);

impl Links {
    /// The link of `id`, growing the table if needed.
    #[inline]
    pub(crate) fn ensure(&mut self, id: ObjId) {
        if id.index() >= self.0.len() {
            self.0.resize(id.index() + 1, UNLINKED);
        }
    }
    /// Queue tag of `id` (0 when unknown or unlinked).
    #[inline]
    pub(crate) fn queue_of(&self, id: u32) -> u8 {
        self.0.get(id as usize).map_or(0, |l| l.queue)
    }
    /// Neighbour of `id` towards the head.
    #[inline]
    pub(crate) fn newer(&self, id: u32) -> u32 {
        self.0[id as usize].newer
    }
}

/// An intrusive FIFO of slots: push at the head, walk from the tail (oldest).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Queue {
    /// Newest slot, or `NIL`.
    pub head: u32,
    /// Oldest slot, or `NIL`.
    pub tail: u32,
    /// Slots held.
    pub len: usize,
    /// Sum of the sizes pushed (as given by the caller).
    pub bytes: u64,
    /// This queue's tag in `Link::queue` (non-zero).
    pub tag: u8,
}

impl Queue {
    /// An empty queue with tag `tag` (non-zero).
    pub(crate) const fn new(tag: u8) -> Self {
        Self {
            head: NIL,
            tail: NIL,
            len: 0,
            bytes: 0,
            tag,
        }
    }

    /// Insert `id` (which must be unlinked) at the head.
    pub(crate) fn push_head(&mut self, links: &mut Links, id: ObjId, size: u64) {
        links.ensure(id);
        let i = id.0;
        debug_assert_eq!(links.0[i as usize].queue, 0, "slot {i} already queued");
        links.0[i as usize] = Link {
            newer: NIL,
            older: self.head,
            queue: self.tag,
        };
        if self.head != NIL {
            links.0[self.head as usize].newer = i;
        } else {
            self.tail = i;
        }
        self.head = i;
        self.len += 1;
        self.bytes += size;
    }

    /// Remove `id` (which must be in this queue).
    pub(crate) fn unlink(&mut self, links: &mut Links, id: ObjId, size: u64) {
        let i = id.0;
        let l = links.0[i as usize];
        debug_assert_eq!(l.queue, self.tag, "slot {i} not in this queue");
        if l.newer != NIL {
            links.0[l.newer as usize].older = l.older;
        } else {
            self.head = l.older;
        }
        if l.older != NIL {
            links.0[l.older as usize].newer = l.newer;
        } else {
            self.tail = l.newer;
        }
        links.0[i as usize] = UNLINKED;
        self.len -= 1;
        self.bytes -= size;
    }

    /// Slots from the head (newest) to the tail, for checks and dumps.
    pub(crate) fn iter_newest_first<'a>(&self, links: &'a Links) -> impl Iterator<Item = u32> + 'a {
        let mut cur = self.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let i = cur;
            cur = links.0[i as usize].older;
            Some(i)
        })
    }
}

/// The state of a single-queue policy walked from the tail (`fifo`, `lru`): one
/// intrusive queue over `ObjId` slots and the soft-pinned scratch. The policies differ
/// only in which events move a slot to the head.
#[derive(Debug, Clone)]
pub(crate) struct TailQueue {
    links: Links,
    queue: Queue,
    soft: Vec<ObjId>,
}

impl Default for TailQueue {
    fn default() -> Self {
        Self {
            links: Links::default(),
            queue: Queue::new(1),
            soft: Vec::new(),
        }
    }
}

impl TailQueue {
    /// Move `id` to the head, linking it if it is not queued (O(1)).
    pub(crate) fn move_to_head(&mut self, id: ObjId) {
        self.unlink(id);
        self.queue.push_head(&mut self.links, id, 0);
    }

    /// Take `id` out of the queue if it is in it (O(1)).
    pub(crate) fn unlink(&mut self, id: ObjId) {
        if self.links.queue_of(id.0) != 0 {
            self.queue.unlink(&mut self.links, id, 0);
        }
    }

    /// Victims for `req`, from the tail (see [`take_from_tail`]).
    pub(crate) fn select(
        &mut self,
        req: &EvictRequest,
        objects: &[ObjectMeta],
        out: &mut Vec<ObjId>,
    ) {
        take_from_tail(&self.queue, &self.links, req, objects, &mut self.soft, out);
    }

    /// Slots from the head (newest) to the tail.
    pub(crate) fn dump(&self) -> Vec<ObjId> {
        self.queue
            .iter_newest_first(&self.links)
            .map(ObjId)
            .collect()
    }

    /// Check that the queue holds exactly the live objects, newest first by `order`.
    pub(crate) fn check(
        &self,
        objects: &[ObjectMeta],
        order: impl Fn(&ObjectMeta) -> u64,
    ) -> Result<(), InvariantViolation> {
        check_queue(&self.queue, &self.links, objects, order)
    }
}

/// Walk `q` from the tail (least recent / oldest) and take candidates in queue order:
/// up to `max(target, lower_bound)` unpinned, then soft-pinned ones (met on the way) up to
/// `lower_bound`. Stops as soon as the unpinned quota is met. `soft` is scratch.
pub(crate) fn take_from_tail(
    q: &Queue,
    links: &Links,
    req: &EvictRequest,
    objects: &[ObjectMeta],
    soft: &mut Vec<ObjId>,
    out: &mut Vec<ObjId>,
) {
    let quota = unpinned_quota(req);
    let soft_cap = if req.allow_soft_pinned {
        req.lower_bound as usize
    } else {
        0
    };
    soft.clear();
    let mut taken = 0;
    let mut cur = q.tail;
    while cur != NIL && taken < quota {
        let i = cur;
        cur = links.newer(i);
        match objects.get(i as usize).map(|m| m.candidate(req.now)) {
            Some(Candidate::Unpinned) => {
                out.push(ObjId(i));
                taken += 1;
            }
            Some(Candidate::SoftPinned) if soft.len() < soft_cap => soft.push(ObjId(i)),
            _ => {}
        }
    }
    // The next call starts where this one stopped: its slot's metadata and link are
    // likely cold (the least recently queued), so fetch them now (a hint only).
    if let Some(m) = objects.get(cur as usize) {
        crate::hint::prefetch(m);
        crate::hint::prefetch(&links.0[cur as usize]);
    }
    let want = soft_quota(req, taken);
    out.extend(soft.iter().take(want));
}

/// Check that `q` holds exactly the live slots of `objects`, ordered newest first by
/// `order` (strictly decreasing), with consistent links and length. For tests.
pub(crate) fn check_queue(
    q: &Queue,
    links: &Links,
    objects: &[ObjectMeta],
    order: impl Fn(&ObjectMeta) -> u64,
) -> Result<(), InvariantViolation> {
    let live = objects.iter().filter(|m| m.live).count();
    if q.len != live {
        return Err(violation!(
            "P1",
            "queue holds {} slots, store {live} live",
            q.len
        ));
    }
    let mut n = 0;
    let mut prev: Option<u64> = None;
    let mut last = NIL;
    for i in q.iter_newest_first(links) {
        n += 1;
        if n > q.len {
            return Err(InvariantViolation::new(
                "P1",
                "queue longer than its length (cycle?)",
            ));
        }
        let Some(m) = objects.get(i as usize).filter(|m| m.live) else {
            return Err(violation!("P1", "slot {i} queued but not live"));
        };
        let o = order(m);
        if prev.is_some_and(|p| p <= o) {
            return Err(violation!(
                "P1",
                "slot {i} out of order ({o} after {prev:?})"
            ));
        }
        if links.0[i as usize].newer != last {
            return Err(violation!("P1", "slot {i}: broken newer link"));
        }
        prev = Some(o);
        last = i;
    }
    if last != q.tail || n != q.len {
        return Err(InvariantViolation::new("P1", "tail or length mismatch"));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::store::{AccessHints, DataType};

    /// A live, complete object put `seq`-th.
    pub(crate) fn live(size: u64, seq: u64) -> ObjectMeta {
        ObjectMeta {
            live: true,
            size,
            data_type: DataType::General,
            hard_pinned: false,
            soft_pin_until: None,
            lease_timeout: 0,
            complete: true,
            readers: 0,
            put_time: 0,
            insert_seq: seq,
            last_access: 0,
            last_access_seq: seq,
            access_count: 0,
            hints: AccessHints::default(),
            key_hash: seq,
        }
    }

    #[test]
    fn check_queue_rejects_a_tail_that_is_not_the_oldest_slot() {
        let mut links = Links::default();
        let mut q = Queue::new(1);
        q.push_head(&mut links, ObjId(0), 0);
        let objects = [live(1, 1)];
        assert!(check_queue(&q, &links, &objects, |m| m.insert_seq).is_ok());
        // Same length, same slots, but the tail no longer names the last slot walked.
        q.tail = NIL;
        assert!(check_queue(&q, &links, &objects, |m| m.insert_seq).is_err());
    }
}

//! `sieve`: SIEVE (Zhang et al., "SIEVE is Simpler than LRU", NSDI'24), as libCacheSim's
//! `Sieve.c`.
//!
//! One FIFO queue by insertion and one visited bit per object. A put links the object at
//! the head with the bit clear; a read sets the bit (nothing moves). A hand walks from the
//! tail towards the head: a visited object has its bit cleared and stays where it is, the
//! first unvisited one is evicted, and the hand rests on its newer neighbour; past the
//! head it wraps to the tail. A removed object under the hand moves the hand to its newer
//! neighbour (libCacheSim's `Sieve_remove_obj`).
//!
//! Adaptation to the store: objects that are not candidates now (leased, hard-pinned, in
//! progress, being read, or soft-pinned) are passed by the hand like visited ones (their
//! bit is cleared too, so the walk ends), but never evicted; soft-pinned candidates met on
//! the way top up to `lower_bound` only if the unpinned ones run out (Mooncake's pass
//! structure). A run gives up once the hand has passed every object twice without a
//! victim. With every object a candidate and one victim per run (the plain replay), this
//! is libCacheSim's SIEVE exactly. Hooks are O(1).

use super::{soft_quota, unpinned_quota, Links, Queue, NIL};
use crate::invariant::{violation, InvariantViolation};
use crate::store::policy::{Candidate, EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// The `sieve` policy (see the module docs).
#[derive(Debug, Clone)]
pub struct Sieve {
    links: Links,
    queue: Queue,
    visited: Vec<bool>,
    /// Where the next walk starts, or `NIL` for the tail.
    hand: u32,
    soft: Vec<ObjId>,
}

impl Default for Sieve {
    fn default() -> Self {
        Self {
            links: Links::default(),
            queue: Queue::new(1),
            visited: Vec::new(),
            hand: NIL,
            soft: Vec::new(),
        }
    }
}

impl Sieve {
    /// An empty policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Slots from newest to oldest insertion, with their visited bits (a `Dump` for tests).
    pub fn dump(&self) -> Vec<(ObjId, bool)> {
        self.queue
            .iter_newest_first(&self.links)
            .map(|i| (ObjId(i), self.visited[i as usize]))
            .collect()
    }

    /// The slot the next walk starts from (`None`: the tail).
    pub fn hand(&self) -> Option<ObjId> {
        (self.hand != NIL).then_some(ObjId(self.hand))
    }

    /// Check that the queue holds exactly the live objects, by insertion. For tests.
    pub fn check(&self, objects: &[ObjectMeta]) -> Result<(), InvariantViolation> {
        if self.hand != NIL && self.links.queue_of(self.hand) == 0 {
            return Err(violation!(
                "P1",
                "hand on slot {} which is not queued",
                self.hand
            ));
        }
        super::check_queue(&self.queue, &self.links, objects, |m| m.insert_seq)
    }

    fn unlink(&mut self, i: u32) {
        if self.links.queue_of(i) != 0 {
            if self.hand == i {
                self.hand = self.links.newer(i);
            }
            self.queue.unlink(&mut self.links, ObjId(i), 0);
        }
    }
}

impl EvictionPolicy for Sieve {
    fn name(&self) -> &str {
        "sieve"
    }

    fn on_insert(&mut self, id: ObjId, _meta: &ObjectMeta) {
        if id.index() >= self.visited.len() {
            self.visited.resize(id.index() + 1, false);
        }
        // Defensive: a slot reused without `on_remove` (never by `MemStore`).
        self.unlink(id.0);
        self.visited[id.index()] = false;
        self.queue.push_head(&mut self.links, id, 0);
    }

    fn on_access(&mut self, id: ObjId, _meta: &ObjectMeta) {
        if let Some(v) = self.visited.get_mut(id.index()) {
            *v = true;
        }
    }

    fn on_remove(&mut self, id: ObjId, _meta: &ObjectMeta) {
        self.unlink(id.0);
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        let quota = unpinned_quota(req);
        let soft_cap = if req.allow_soft_pinned {
            req.lower_bound as usize
        } else {
            0
        };
        self.soft.clear();
        let mut taken = 0;
        while taken < quota && self.queue.len > 0 {
            // Every object is passed at most twice per victim: once to clear its bit, once
            // more to find it is not a candidate.
            let mut budget = 2 * self.queue.len + 1;
            let mut cur = if self.hand == NIL {
                self.queue.tail
            } else {
                self.hand
            };
            let mut victim = None;
            while budget > 0 {
                budget -= 1;
                let i = cur;
                let next = self.links.newer(i);
                let next = if next == NIL { self.queue.tail } else { next };
                let v = &mut self.visited[i as usize];
                if *v {
                    *v = false;
                    cur = next;
                    continue;
                }
                match objects
                    .get(i as usize)
                    .map_or(Candidate::No, |m| m.candidate(req.now))
                {
                    Candidate::Unpinned => {
                        victim = Some(i);
                        break;
                    }
                    Candidate::SoftPinned
                        if self.soft.len() < soft_cap && !self.soft.contains(&ObjId(i)) =>
                    {
                        self.soft.push(ObjId(i));
                    }
                    _ => {}
                }
                cur = next;
            }
            let Some(i) = victim else {
                self.hand = cur;
                break;
            };
            // Out of the queue now, the hand on its newer neighbour (the tail past the
            // head); `on_remove` then finds it unlinked.
            self.hand = i;
            self.unlink(i);
            out.push(ObjId(i));
            taken += 1;
        }
        let want = soft_quota(req, taken);
        for k in 0..want.min(self.soft.len()) {
            let id = self.soft[k];
            self.unlink(id.0);
            out.push(id);
        }
    }
}

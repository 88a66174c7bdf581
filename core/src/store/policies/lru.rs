//! `lru`: least recently used, by the store's access sequence (`last_access_seq`: the put
//! or the latest lease-granting read).
//!
//! An intrusive recency queue over `ObjId` slots: `on_insert` and `on_access` move the
//! slot to the head, `on_remove` unlinks it, all O(1) and allocation-free once the slot
//! table has grown. A run walks from the tail and takes candidates in order, skipping
//! objects that are not candidates now (leased, pinned, in progress, being read), up to
//! `max(target, lower_bound)`; soft-pinned candidates met on the way top up to
//! `lower_bound` only if the unpinned ones run out (Mooncake's pass structure). The walk
//! stops as soon as the quota is met, so a run costs the victims plus the skipped objects,
//! not a scan of the store. A reused slot is unlinked by `on_remove` before `on_insert`
//! links it again, so no state leaks between the objects that share a slot.

use super::TailQueue;
use crate::invariant::InvariantViolation;
use crate::store::policy::{EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// The `lru` policy (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Lru {
    q: TailQueue,
}

impl Lru {
    /// An empty policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Slots from most to least recently used (a `Dump` for tests).
    pub fn dump(&self) -> Vec<ObjId> {
        self.q.dump()
    }

    /// Check that the queue holds exactly the live objects, by `last_access_seq`. For tests.
    pub fn check(&self, objects: &[ObjectMeta]) -> Result<(), InvariantViolation> {
        self.q.check(objects, |m| m.last_access_seq)
    }
}

impl EvictionPolicy for Lru {
    fn name(&self) -> &str {
        "lru"
    }

    fn on_insert(&mut self, id: ObjId, _meta: &ObjectMeta) {
        // Same as an access; unlinking first is defensive (MemStore removes before reuse).
        self.q.move_to_head(id);
    }

    fn on_access(&mut self, id: ObjId, _meta: &ObjectMeta) {
        self.q.move_to_head(id);
    }

    fn on_remove(&mut self, id: ObjId, _meta: &ObjectMeta) {
        self.q.unlink(id);
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.q.select(req, objects, out);
    }
}

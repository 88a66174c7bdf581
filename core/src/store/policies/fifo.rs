//! `fifo`: first in, first out, by insertion (`insert_seq`: put start); reads change
//! nothing.
//!
//! An intrusive insertion queue over `ObjId` slots (`on_insert` links at the head,
//! `on_remove` unlinks, both O(1)). A run walks from the tail (oldest) and takes
//! candidates in order, skipping objects that are not candidates now, up to
//! `max(target, lower_bound)`; soft-pinned candidates top up to `lower_bound` only if the
//! unpinned ones run out (Mooncake's pass structure). Slot reuse is safe: `on_remove`
//! always unlinks before `on_insert` links the slot again.

use super::TailQueue;
use crate::invariant::InvariantViolation;
use crate::store::policy::{EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// The `fifo` policy (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Fifo {
    q: TailQueue,
}

impl Fifo {
    /// An empty policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Slots from newest to oldest insertion (a `Dump` for tests).
    pub fn dump(&self) -> Vec<ObjId> {
        self.q.dump()
    }

    /// Check that the queue holds exactly the live objects, by `insert_seq`. For tests.
    pub fn check(&self, objects: &[ObjectMeta]) -> Result<(), InvariantViolation> {
        self.q.check(objects, |m| m.insert_seq)
    }
}

impl EvictionPolicy for Fifo {
    fn name(&self) -> &str {
        "fifo"
    }

    fn on_insert(&mut self, id: ObjId, _meta: &ObjectMeta) {
        // Unlinking first is defensive: a slot reused without `on_remove` (never by
        // `MemStore`).
        self.q.move_to_head(id);
    }

    fn on_remove(&mut self, id: ObjId, _meta: &ObjectMeta) {
        self.q.unlink(id);
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.q.select(req, objects, out);
    }
}

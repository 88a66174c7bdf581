//! `fifo`: first in, first out, by insertion (`insert_seq`: put start); reads change
//! nothing.
//!
//! An intrusive insertion queue over `ObjId` slots (`on_insert` links at the head,
//! `on_remove` unlinks, both O(1)). A run walks from the tail (oldest) and takes
//! candidates in order, skipping objects that are not candidates now, up to
//! `max(target, lower_bound)`; soft-pinned candidates top up to `lower_bound` only if the
//! unpinned ones run out (Mooncake's pass structure). Slot reuse is safe: `on_remove`
//! always unlinks before `on_insert` links the slot again.

use super::{check_queue, take_from_tail, Links, Queue};
use crate::store::policy::{EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// The `fifo` policy (see the module docs).
#[derive(Debug, Clone)]
pub struct Fifo {
    links: Links,
    queue: Queue,
    soft: Vec<ObjId>,
}

impl Default for Fifo {
    fn default() -> Self {
        Self {
            links: Links::default(),
            queue: Queue::new(1),
            soft: Vec::new(),
        }
    }
}

impl Fifo {
    /// An empty policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Slots from newest to oldest insertion (a `Dump` for tests).
    pub fn dump(&self) -> Vec<ObjId> {
        self.queue
            .iter_newest_first(&self.links)
            .map(ObjId)
            .collect()
    }

    /// Check that the queue holds exactly the live objects, by `insert_seq`. For tests.
    pub fn check(&self, objects: &[ObjectMeta]) -> Result<(), String> {
        check_queue(&self.queue, &self.links, objects, |m| m.insert_seq)
    }
}

impl EvictionPolicy for Fifo {
    fn name(&self) -> &str {
        "fifo"
    }

    fn on_insert(&mut self, id: ObjId, _meta: &ObjectMeta) {
        if self.links.queue_of(id.0) != 0 {
            // Defensive: a slot reused without `on_remove` (never by `MemStore`).
            self.queue.unlink(&mut self.links, id, 0);
        }
        self.queue.push_head(&mut self.links, id, 0);
    }

    fn on_remove(&mut self, id: ObjId, _meta: &ObjectMeta) {
        if self.links.queue_of(id.0) != 0 {
            self.queue.unlink(&mut self.links, id, 0);
        }
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        take_from_tail(&self.queue, &self.links, req, objects, &mut self.soft, out);
    }
}

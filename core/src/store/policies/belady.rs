//! `belady`: Belady's MIN (1966), the offline optimum for hit count, as an eviction oracle.
//!
//! Each object's `hints.next_access` (the logical sequence number of its key's next
//! access, from one backward pass over the trace; `u64::MAX` = never) is read from the
//! hints of its latest access, so the driver must pass hints on every put and read. A run
//! evicts the candidates whose next access is furthest (never-again first; ties by oldest
//! insertion), unpinned before soft-pinned as in Mooncake.
//!
//! What it bounds: with unit sizes, no leases or pins and demand eviction of one object
//! (the store configured as a cache of `k` objects with bypass), its hit count is the
//! maximum any policy can reach on the same sequence, so it bounds every online policy
//! (`policy_belady_bound.rs`). With sizes it is not a bound on the same store (a policy
//! may keep several small objects where MIN keeps one large one); what holds there is
//! that MIN on a unit-size cache of `floor(capacity_bytes / smallest size)` objects bounds
//! the hit count of every policy on the sized store, because the sized store never holds
//! more objects than that.

//!
//! Victims come from an ordered index kept by the hooks (`on_insert`, `on_access`,
//! `on_remove` re-key the slot from its meta), walked from the furthest next access until
//! the run has its victims: O(victims + skipped non-candidates) per run instead of a scan
//! of every object. It selects exactly what a scan ranked by [`belady_key`] selects
//! (`core/tests/policy_properties.rs` `belady_index_matches_a_full_scan`), given that the
//! driver calls the hooks after every change of `insert_seq` or `hints` (as `MemStore`
//! and the plain replay do).

use std::collections::BTreeSet;

use super::{soft_quota, unpinned_quota, RankKey};
use crate::store::policy::{Candidate, EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// The ranking key: furthest next access first, then oldest insertion.
#[inline]
pub(crate) fn belady_key(m: &ObjectMeta) -> RankKey {
    RankKey {
        a: 0.0,
        b: u64::MAX - m.hints.next_access,
        c: m.insert_seq,
    }
}

/// `belady_key` without its constant first field: (b, c).
#[inline]
fn index_key(m: &ObjectMeta) -> (u64, u64) {
    let k = belady_key(m);
    (k.b, k.c)
}

/// The `belady` policy (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Belady {
    /// (key, slot) of every live slot, smallest key first.
    index: BTreeSet<((u64, u64), u32)>,
    /// The key each slot is indexed under, if it is.
    keyed: Vec<Option<(u64, u64)>>,
    soft: Vec<ObjId>,
}

impl Belady {
    /// A fresh policy.
    pub fn new() -> Self {
        Self::default()
    }

    fn unindex(&mut self, id: ObjId) {
        if let Some(k) = self.keyed.get_mut(id.index()).and_then(Option::take) {
            self.index.remove(&(k, id.0));
        }
    }

    fn reindex(&mut self, id: ObjId, m: &ObjectMeta) {
        self.unindex(id);
        if id.index() >= self.keyed.len() {
            self.keyed.resize(id.index() + 1, None);
        }
        let k = index_key(m);
        self.keyed[id.index()] = Some(k);
        self.index.insert((k, id.0));
    }
}

impl EvictionPolicy for Belady {
    fn name(&self) -> &str {
        "belady"
    }

    fn on_insert(&mut self, id: ObjId, meta: &ObjectMeta) {
        self.reindex(id, meta);
    }

    fn on_access(&mut self, id: ObjId, meta: &ObjectMeta) {
        self.reindex(id, meta);
    }

    fn on_remove(&mut self, id: ObjId, _meta: &ObjectMeta) {
        self.unindex(id);
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        let quota = unpinned_quota(req);
        self.soft.clear();
        let mut taken = 0;
        for &(_, i) in &self.index {
            if taken == quota {
                break;
            }
            match objects
                .get(i as usize)
                .map_or(Candidate::No, |m| m.candidate(req.now))
            {
                Candidate::Unpinned => {
                    out.push(ObjId(i));
                    taken += 1;
                }
                Candidate::SoftPinned if req.allow_soft_pinned => self.soft.push(ObjId(i)),
                _ => {}
            }
        }
        // Soft-pinned ones are wanted only when the walk saw every candidate.
        let want = soft_quota(req, taken);
        out.extend(self.soft.iter().take(want));
    }
}

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

use super::{RankKey, Ranked};
use crate::store::policy::{EvictRequest, EvictionPolicy, ObjectMeta};
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

/// The `belady` policy (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Belady {
    ranked: Ranked,
}

impl Belady {
    /// A fresh policy (stateless between runs).
    pub fn new() -> Self {
        Self::default()
    }
}

impl EvictionPolicy for Belady {
    fn name(&self) -> &str {
        "belady"
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.ranked.collect(req, objects, |_, m| belady_key(m));
        self.ranked.select(req, out);
    }
}

//! `belady-cost`: a cost-aware offline oracle built on Belady's next-access hints.
//!
//! A run evicts, unpinned before soft-pinned as in Mooncake:
//! 1. first, candidates never accessed again (`hints.next_access == u64::MAX`), oldest
//!    insertion first: evicting a dead object never costs a miss;
//! 2. then the candidates with the smallest cost density `miss_penalty_ns / size`
//!    (penalty 1 when unknown, size at least 1), furthest next access first among equal
//!    densities, then oldest insertion.
//!
//! What it bounds, precisely: when every object has unit size and the same miss penalty,
//! the densities tie and it makes exactly Belady's choices, so its hit count and its saved
//! recompute cost (hits x penalty) are the offline optimum on the textbook cache (unit
//! sizes, no leases or pins, one victim per miss, bypass allowed), an upper bound for every
//! online policy. With unequal sizes or penalties it is an offline *heuristic*, not a
//! bound: the weighted-paging optimum needs a min-cost-flow solution (and with sizes the
//! offline problem is NP-hard), and a greedy rank by density can be beaten by an online
//! policy on some sequences. Report it as the cost-aware oracle heuristic, not as the
//! headroom limit; use `belady` on the unit-size reduction for a true hit-count bound.

use super::{RankKey, Ranked};
use crate::store::policy::{EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// The ranking key: dead first, then smallest cost density, furthest next access, oldest.
#[inline]
fn key(m: &ObjectMeta) -> RankKey {
    let next = m.hints.next_access;
    let a = if next == u64::MAX {
        -1.0
    } else {
        m.hints.miss_penalty_ns.max(1) as f64 / m.size.max(1) as f64
    };
    RankKey {
        a,
        b: u64::MAX - next,
        c: m.insert_seq,
    }
}

/// The `belady-cost` policy (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct BeladyCost {
    ranked: Ranked,
}

impl BeladyCost {
    /// A fresh policy (stateless between runs).
    pub fn new() -> Self {
        Self::default()
    }
}

impl EvictionPolicy for BeladyCost {
    fn name(&self) -> &str {
        "belady-cost"
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.ranked.collect(req, objects, |_, m| key(m));
        self.ranked.select(req, out);
    }
}

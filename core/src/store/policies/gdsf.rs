//! `gdsf`: GreedyDual-Size-Frequency (Cherkasova 1998; Cao and Irani's GreedyDual-Size
//! with frequency), the recompute-cost-aware baseline.
//!
//! Each object has a priority `H = L + frequency * cost / size`, set when it is put
//! (frequency 1) and reset on every lease-granting read (frequency = reads + 1), where
//! `cost` is the access's `hints.miss_penalty_ns` (1 when the driver gives none, i.e. 0)
//! and `size` its bytes (at least 1). A run evicts the candidates with the smallest `H`
//! (ties: least recently accessed, then oldest insertion), unpinned before soft-pinned as
//! in Mooncake, and inflates the clock `L` to the largest evicted `H`, so objects not
//! touched for a long time age out. Hooks are O(1); a run scans the candidates once and
//! uses a selection, not a full sort.

use super::{RankKey, Ranked};
use crate::store::policy::{EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::ObjId;

/// GDSF's per-object priorities and clock, shared with the hierarchical policy's `gdsf`
/// leaf rule.
#[derive(Debug, Default, Clone)]
pub(crate) struct GdsfState {
    h: Vec<f64>,
    l: f64,
}

/// `frequency * cost / size` of the object's latest access.
#[inline]
fn value(m: &ObjectMeta) -> f64 {
    let cost = m.hints.miss_penalty_ns.max(1) as f64;
    let freq = m.access_count.saturating_add(1) as f64;
    freq * cost / m.size.max(1) as f64
}

impl GdsfState {
    /// Set the priority of `id` from its meta at the current clock.
    #[inline]
    pub(crate) fn touch(&mut self, id: ObjId, m: &ObjectMeta) {
        if id.index() >= self.h.len() {
            self.h.resize(id.index() + 1, 0.0);
        }
        self.h[id.index()] = self.l + value(m);
    }

    /// Priority of `id` (computed now if no hook ever saw it).
    #[inline]
    pub(crate) fn priority(&self, id: usize, m: &ObjectMeta) -> f64 {
        self.h.get(id).copied().unwrap_or_else(|| self.l + value(m))
    }

    /// The ranking key: smallest priority, then least recent access, then oldest.
    #[inline]
    pub(crate) fn key(&self, id: usize, m: &ObjectMeta) -> RankKey {
        RankKey {
            a: self.priority(id, m),
            b: m.last_access_seq,
            c: m.insert_seq,
        }
    }

    /// Raise the clock to `h` (an evicted priority); it never goes down.
    #[inline]
    pub(crate) fn inflate(&mut self, h: f64) {
        if h > self.l {
            self.l = h;
        }
    }

    /// The clock `L`.
    pub(crate) fn clock(&self) -> f64 {
        self.l
    }
}

/// The `gdsf` policy (see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Gdsf {
    state: GdsfState,
    ranked: Ranked,
}

impl Gdsf {
    /// A fresh policy with clock `L = 0`.
    pub fn new() -> Self {
        Self::default()
    }

    /// The clock `L` (the largest priority evicted so far).
    pub fn clock(&self) -> f64 {
        self.state.clock()
    }

    /// The priority `H` of slot `id` as the policy holds it.
    pub fn priority(&self, id: ObjId, m: &ObjectMeta) -> f64 {
        self.state.priority(id.index(), m)
    }
}

impl EvictionPolicy for Gdsf {
    fn name(&self) -> &str {
        "gdsf"
    }

    fn on_insert(&mut self, id: ObjId, meta: &ObjectMeta) {
        self.state.touch(id, meta);
    }

    fn on_access(&mut self, id: ObjId, meta: &ObjectMeta) {
        self.state.touch(id, meta);
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        let state = &self.state;
        self.ranked.collect(req, objects, |i, m| state.key(i, m));
        let start = out.len();
        self.ranked.select(req, out);
        for &id in &out[start..] {
            let h = self.state.priority(id.index(), &objects[id.index()]);
            self.state.inflate(h);
        }
    }
}

//! `type-aware`: seed 002's type-aware eviction (Mooncake PRs 2743-2746), one shared pool
//! with per-data-type ranking knobs and logical byte budgets.
//!
//! Each candidate gets an adjusted age
//!
//! ```text
//! adjusted_age = max(0, now - lease_timeout - eviction_grace) * w / reuse_scale
//! ```
//!
//! with `w = soft_pin_weight` for a soft-pinned object and 1 otherwise, all three knobs
//! taken from the object's data type. The largest adjusted age goes first; equal ages fall
//! back to the master's lease order (`lease_timeout`, then insertion sequence), so with
//! every knob at its default the victims (and their order) are exactly `mooncake-default`'s.
//!
//! Budgets: a type with `budget_ratio = r` is *over budget* when its resident bytes (every
//! live object of the type, leased and in-progress ones included) exceed
//! `floor(r * capacity_bytes)`. Each pass (unpinned candidates up to
//! `max(target, lower_bound)`, then soft-pinned ones up to `lower_bound`, as in Mooncake)
//! runs two phases over its candidates with quota `q`:
//! 1. *budget phase*: for each over-budget type `t`, `over_budget(t)` is the length of the
//!    shortest prefix of `t`'s candidates in this pass, in `t`'s own adjusted-age order,
//!    whose bytes bring `t` back to at most its budget (all of them if they do not
//!    suffice), capped at `q`. The union of these prefixes gives victims first: all of it
//!    if it has at most `q` objects, else its `q` largest adjusted ages.
//! 2. the rest of `q` from every remaining candidate of the pass, by adjusted age.
//!
//! Victims are pushed in that order (budget phase by adjusted age, then the rest). Budgets
//! are logical: nothing reserves space for a type; they only decide who goes first.
//! Soft-pinned objects stay in pass 2 (Mooncake's structure), so `soft_pin_weight` orders
//! soft-pinned objects of different types among themselves.
//!
//! `select_victims` scans every object (the reference). `select_victims_indexed` reads the
//! store's [`VictimIndex`] instead: within one (type, pin) class the adjusted age does not
//! increase with `lease_timeout` and ties fall back to the lease key, so each class stream
//! is already in this policy's order; a budget prefix is a walk of one stream, and the
//! rest merges the three type streams of the pass. Same victims, same order, in
//! O((k + r) log n) per run (INVARIANTS S11).

use crate::store::ConfigError;
use serde::{Deserialize, Serialize};

use super::{smallest_first, soft_quota, unpinned_quota, RankKey};
use crate::store::policy::{Candidate, EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::vindex::{Merge, VictimIndex};
use crate::store::{DataType, Nanos, ObjId, MS};

/// Knobs of one data type.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TypeKnobs {
    /// Divides the adjusted age: a larger scale keeps the type longer (must be > 0).
    pub reuse_scale: f64,
    /// Multiplies the adjusted age of soft-pinned objects (must be > 0).
    pub soft_pin_weight: f64,
    /// Extra protection after the lease expires, in milliseconds.
    pub eviction_grace_ms: u64,
    /// Logical share of the store's capacity in [0, 1]; none = no budget.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget_ratio: Option<f64>,
}

impl Default for TypeKnobs {
    fn default() -> Self {
        Self {
            reuse_scale: 1.0,
            soft_pin_weight: 1.0,
            eviction_grace_ms: 0,
            budget_ratio: None,
        }
    }
}

/// Knobs per data type, by the type's snake_case name.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TypeKnobsByType {
    /// `general` objects.
    pub general: TypeKnobs,
    /// `kv_cache` objects.
    pub kv_cache: TypeKnobs,
    /// `encoder_output` objects.
    pub encoder_output: TypeKnobs,
}

impl TypeKnobsByType {
    /// The knobs of `t`.
    pub fn get(&self, t: DataType) -> &TypeKnobs {
        match t {
            DataType::General => &self.general,
            DataType::KvCache => &self.kv_cache,
            DataType::EncoderOutput => &self.encoder_output,
        }
    }

    /// Check every knob; `ctx` prefixes the field path in errors. `budgets` says whether
    /// `budget_ratio` is allowed here.
    pub(crate) fn validate(&self, ctx: &str, budgets: bool) -> Result<(), ConfigError> {
        for t in DataType::ALL {
            let k = self.get(t);
            let f = |field: &str| format!("{ctx}types.{}.{field}", t.name());
            if !(k.reuse_scale.is_finite() && k.reuse_scale > 0.0) {
                return Err(ConfigError::field(
                    f("reuse_scale"),
                    format!("expected a finite number > 0, got {}", k.reuse_scale),
                ));
            }
            if !(k.soft_pin_weight.is_finite() && k.soft_pin_weight > 0.0) {
                return Err(ConfigError::field(
                    f("soft_pin_weight"),
                    format!("expected a finite number > 0, got {}", k.soft_pin_weight),
                ));
            }
            if let Some(r) = k.budget_ratio {
                if !budgets {
                    return Err(ConfigError::field(
                        f("budget_ratio"),
                        "not allowed in a leaf rule (budget a scope with its budget_ratio)",
                    ));
                }
                if !(0.0..=1.0).contains(&r) {
                    return Err(ConfigError::field(
                        f("budget_ratio"),
                        format!("expected in [0, 1], got {r}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The ranking knobs, per `DataType::index` (validated first).
    pub(crate) fn ages(&self) -> [AgeKnobs; DataType::COUNT] {
        DataType::ALL.map(|t| {
            let k = self.get(t);
            AgeKnobs {
                reuse_scale: k.reuse_scale,
                soft_pin_weight: k.soft_pin_weight,
                grace_ns: k.eviction_grace_ms.saturating_mul(MS),
            }
        })
    }
}

/// `type-aware` settings: `{"policy": "type-aware", "types": {"encoder_output": {...}}}`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TypeAwareConfig {
    /// Knobs per data type; a type left out keeps the defaults.
    pub types: TypeKnobsByType,
}

/// The adjusted-age knobs of one type, in store units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct AgeKnobs {
    reuse_scale: f64,
    soft_pin_weight: f64,
    grace_ns: Nanos,
}

impl AgeKnobs {
    /// `max(0, now - lease_timeout - grace) * w / reuse_scale`.
    #[inline]
    pub(crate) fn adjusted_age(&self, m: &ObjectMeta, now: Nanos, soft_pinned: bool) -> f64 {
        let age = now
            .saturating_sub(m.lease_timeout)
            .saturating_sub(self.grace_ns);
        let w = if soft_pinned {
            self.soft_pin_weight
        } else {
            1.0
        };
        age as f64 * w / self.reuse_scale
    }

    /// The ranking key: largest adjusted age first, then the master's lease order.
    #[inline]
    pub(crate) fn key(&self, m: &ObjectMeta, now: Nanos, soft_pinned: bool) -> RankKey {
        RankKey {
            // `+ 0.0` turns -0.0 into +0.0 so that zero ages tie exactly.
            a: -self.adjusted_age(m, now, soft_pinned) + 0.0,
            b: m.lease_timeout,
            c: m.insert_seq,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    key: RankKey,
    id: ObjId,
    size: u64,
    ty: u8,
    taken: bool,
}

/// The `type-aware` policy (see the module docs).
#[derive(Debug, Clone)]
pub struct TypeAware {
    ages: [AgeKnobs; DataType::COUNT],
    budget_ratio: [Option<f64>; DataType::COUNT],
    unpinned: Vec<Entry>,
    soft: Vec<Entry>,
    scratch: Vec<usize>,
    picks: Vec<usize>,
    /// Budget-phase picks of the indexed path: key, id, size, type.
    ipicks: Vec<(RankKey, ObjId, u64, usize)>,
}

impl TypeAware {
    /// Build from a config, or say which field is invalid.
    pub fn new(cfg: &TypeAwareConfig) -> Result<Self, ConfigError> {
        cfg.types.validate("type-aware: ", true)?;
        Ok(Self {
            ages: cfg.types.ages(),
            budget_ratio: DataType::ALL.map(|t| cfg.types.get(t).budget_ratio),
            unpinned: Vec::new(),
            soft: Vec::new(),
            scratch: Vec::new(),
            picks: Vec::new(),
            ipicks: Vec::new(),
        })
    }

    /// The adjusted age this policy gives `m` at `now` (0 for a non-candidate's negative age).
    pub fn adjusted_age(&self, m: &ObjectMeta, now: Nanos) -> f64 {
        let soft = m.candidate(now) == Candidate::SoftPinned;
        self.ages[m.data_type.index()].adjusted_age(m, now, soft)
    }

    /// One pass with quota `q`: budget phase, then the rest by adjusted age.
    fn pass(
        entries: &mut Vec<Entry>,
        scratch: &mut Vec<usize>,
        picks: &mut Vec<usize>,
        q: usize,
        budgets: &[Option<u64>; DataType::COUNT],
        resident: &mut [u64; DataType::COUNT],
        out: &mut Vec<ObjId>,
    ) -> usize {
        if q == 0 || entries.is_empty() {
            return 0;
        }
        picks.clear();
        for (t, b) in budgets.iter().enumerate() {
            let Some(b) = *b else { continue };
            let excess = resident[t].saturating_sub(b);
            if excess == 0 {
                continue;
            }
            scratch.clear();
            scratch.extend((0..entries.len()).filter(|&i| entries[i].ty as usize == t));
            let k = smallest_first(scratch, q, |&i| entries[i].key);
            let mut freed = 0;
            for &i in &scratch[..k] {
                if freed >= excess {
                    break;
                }
                freed += entries[i].size;
                picks.push(i);
            }
        }
        let p = smallest_first(picks, q, |&i| entries[i].key);
        for &i in &picks[..p] {
            let e = &mut entries[i];
            e.taken = true;
            out.push(e.id);
            resident[e.ty as usize] -= e.size;
        }
        if p > 0 {
            entries.retain(|e| !e.taken);
        }
        let r = smallest_first(entries, q - p, |e| e.key);
        for e in &entries[..r] {
            out.push(e.id);
            resident[e.ty as usize] -= e.size;
        }
        entries.drain(..r);
        p + r
    }
}

impl TypeAware {
    /// [`TypeAware::pass`] from the index: the candidates of the pass are the class streams
    /// `(t, soft)` of the three types.
    #[allow(clippy::too_many_arguments)]
    fn pass_indexed(
        &mut self,
        index: &VictimIndex,
        objects: &[ObjectMeta],
        now: Nanos,
        soft: bool,
        q: usize,
        budgets: &[Option<u64>; DataType::COUNT],
        resident: &mut [u64; DataType::COUNT],
        out: &mut Vec<ObjId>,
    ) -> usize {
        if q == 0 {
            return 0;
        }
        let ages = &self.ages;
        let key = |t: usize, id: ObjId| ages[t].key(&objects[id.index()], now, soft);
        // Budget phase: each over-budget type's shortest covering prefix (at most `q`).
        let picks = &mut self.ipicks;
        picks.clear();
        for (t, b) in budgets.iter().enumerate() {
            let Some(b) = *b else { continue };
            let excess = resident[t].saturating_sub(b);
            if excess == 0 {
                continue;
            }
            let mut freed = 0;
            for (_, _, id) in index.candidates(t, soft, now, objects).take(q) {
                if freed >= excess {
                    break;
                }
                let size = objects[id.index()].size;
                freed += size;
                picks.push((key(t, id), id, size, t));
            }
        }
        let p = smallest_first(picks, q, |e| e.0);
        // The picks taken of each type are a prefix of its stream: the rest skips them.
        let mut skip = [0usize; DataType::COUNT];
        for &(_, id, size, t) in &picks[..p] {
            out.push(id);
            resident[t] -= size;
            skip[t] += 1;
        }
        let streams = DataType::ALL.map(|ty| {
            let t = ty.index();
            let mut c = index.candidates(t, soft, now, objects);
            for _ in 0..skip[t] {
                c.next();
            }
            c
        });
        let mut r = 0;
        for (t, id) in Merge::new(streams, |t, _, _, id| key(t, id)).take(q - p) {
            out.push(id);
            resident[t] -= objects[id.index()].size;
            r += 1;
        }
        p + r
    }
}

impl EvictionPolicy for TypeAware {
    fn name(&self) -> &str {
        "type-aware"
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.unpinned.clear();
        self.soft.clear();
        let any_budget = self.budget_ratio.iter().any(Option::is_some);
        let mut resident = [0u64; DataType::COUNT];
        for (i, m) in objects.iter().enumerate() {
            if !m.live {
                continue;
            }
            let t = m.data_type.index();
            resident[t] += m.size;
            let c = m.candidate(req.now);
            let soft = match c {
                Candidate::No => continue,
                Candidate::Unpinned => false,
                Candidate::SoftPinned if req.allow_soft_pinned => true,
                Candidate::SoftPinned => continue,
            };
            let e = Entry {
                key: self.ages[t].key(m, req.now, soft),
                id: ObjId(i as u32),
                size: m.size,
                ty: t as u8,
                taken: false,
            };
            if soft {
                self.soft.push(e);
            } else {
                self.unpinned.push(e);
            }
        }
        let budgets = if any_budget {
            self.budget_ratio
                .map(|r| r.map(|r| (r * req.capacity_bytes as f64).floor() as u64))
        } else {
            [None; DataType::COUNT]
        };
        let taken = Self::pass(
            &mut self.unpinned,
            &mut self.scratch,
            &mut self.picks,
            unpinned_quota(req),
            &budgets,
            &mut resident,
            out,
        );
        Self::pass(
            &mut self.soft,
            &mut self.scratch,
            &mut self.picks,
            soft_quota(req, taken),
            &budgets,
            &mut resident,
            out,
        );
    }

    fn uses_victim_index(&self) -> bool {
        true
    }

    fn select_victims_indexed(
        &mut self,
        req: &EvictRequest,
        objects: &[ObjectMeta],
        index: &mut VictimIndex,
        out: &mut Vec<ObjId>,
    ) {
        index.sync_pins(req.now);
        let mut resident = *index.resident_bytes();
        let budgets = self
            .budget_ratio
            .map(|r| r.map(|r| (r * req.capacity_bytes as f64).floor() as u64));
        let taken = self.pass_indexed(
            index,
            objects,
            req.now,
            false,
            unpinned_quota(req),
            &budgets,
            &mut resident,
            out,
        );
        self.pass_indexed(
            index,
            objects,
            req.now,
            true,
            soft_quota(req, taken),
            &budgets,
            &mut resident,
            out,
        );
    }
}

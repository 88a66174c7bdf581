//! `hierarchical`: seed 002's Assign / Evict / Fallback abstraction (its follow-up to
//! Mooncake PR 2746 and issue 2791) as a recursive executor over a scope tree of any
//! depth, e.g. tenant -> data type -> priority.
//!
//! Every node of the tree is a *scope*. A child scope selects, among its parent's
//! objects, those matching its `select` key (a tenant, a data type, a priority, a list of
//! them, or `any`); an object belongs to the first child that matches, and a node whose
//! children match nobody has an implicit last child `<rest>` (select `any`, weight 1, no
//! budget, the node's own `evict` rule), so every object lands in exactly one leaf.
//! Planning works on candidate references only (`ObjId`s with their ranking keys); the
//! store re-validates and does the mutation. A run plans `max(target, lower_bound)`
//! victims among unpinned candidates from the root, then (only if short of `lower_bound`)
//! soft-pinned ones, the same tree walk on the soft-pinned candidates (Mooncake's passes).
//!
//! `plan(scope, quota)` at a node:
//! 1. **Assign, budgets first**: every child with a `budget_ratio` whose resident bytes
//!    (all its live objects) exceed `floor(budget_ratio * capacity_bytes)` gives victims
//!    first, most bytes over budget first, until it is back under budget (exactly at a
//!    leaf, in its eviction order; in rounds of `ceil(excess / mean candidate size)` objects
//!    at an inner node, which may overshoot by part of a round) or the quota is met.
//! 2. **Assign, split**: the rest of the quota is split among the children that still
//!    have candidates, by the node's `assign` rule: `bytes` (proportional to resident
//!    bytes), `objects` (to resident objects), `weights` (to the children's `weight`),
//!    `order` (all to the first child, in configuration order). Shares are integers by
//!    the largest-remainder method (ties to the earlier child); all-zero weights split
//!    equally, so a weight-0 child only gives victims through fallback.
//! 3. **Fallback**: a child that cannot meet its share (its subtree ran out of
//!    candidates) passes the shortfall back; the node re-splits it among the children
//!    that still have candidates, round after round, until the quota is met or the whole
//!    scope is exhausted; then its own shortfall goes back to its parent.
//! 4. **Evict** at a leaf: the leaf's `evict` rule ranks its candidates: `lease` (the
//!    master's lease order, the default), `lru`, `fifo`, `type-aware` (seed 002's adjusted
//!    age with per-type knobs, no budgets: budgets belong to scopes) or `gdsf`.
//!
//! Victims are pushed in planning order. Cost per run: one scan of the store (each object
//! is routed down the tree, O(depth x siblings)), then selections per leaf (no full sort).
//!
//! Example (`core/tests/data/hierarchical.toml` has the full tenant -> type -> priority
//! tree):
//!
//! ```toml
//! policy = "hierarchical"
//! [tree]
//! assign = "weights"
//! [[tree.children]]
//! name = "tenant-1"
//! select = { tenant = 1 }
//! weight = 3.0
//! assign = "order"
//! [[tree.children.children]]
//! select = { data_type = "kv_cache" }
//! evict = { rule = "lru" }
//! [[tree.children.children]]
//! select = { data_type = "encoder_output" }
//! budget_ratio = 0.1
//! ```

use crate::store::ConfigError;
use serde::{Deserialize, Serialize};

use super::gdsf::GdsfState;
use super::type_aware::{AgeKnobs, TypeKnobsByType};
use super::{smallest_first, soft_quota, unpinned_quota, RankKey, NIL};
use crate::store::policy::{Candidate, EvictRequest, EvictionPolicy, ObjectMeta};
use crate::store::{DataType, Nanos, ObjId};

/// Which objects of its parent's scope a scope takes.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Selector {
    /// Every object (catch-all).
    #[default]
    Any,
    /// Objects whose `hints.tenant` is this.
    Tenant(u32),
    /// Objects whose `hints.tenant` is one of these.
    Tenants(Vec<u32>),
    /// Objects of this data type.
    DataType(DataType),
    /// Objects of one of these data types.
    DataTypes(Vec<DataType>),
    /// Objects whose `hints.priority` is this.
    Priority(u8),
    /// Objects whose `hints.priority` is one of these.
    Priorities(Vec<u8>),
}

impl Selector {
    /// Whether `m` is in this scope.
    #[inline]
    pub fn matches(&self, m: &ObjectMeta) -> bool {
        match self {
            Selector::Any => true,
            Selector::Tenant(t) => m.hints.tenant == *t,
            Selector::Tenants(ts) => ts.contains(&m.hints.tenant),
            Selector::DataType(d) => m.data_type == *d,
            Selector::DataTypes(ds) => ds.contains(&m.data_type),
            Selector::Priority(p) => m.hints.priority == *p,
            Selector::Priorities(ps) => ps.contains(&m.hints.priority),
        }
    }

    fn is_empty_list(&self) -> bool {
        match self {
            Selector::Tenants(v) => v.is_empty(),
            Selector::DataTypes(v) => v.is_empty(),
            Selector::Priorities(v) => v.is_empty(),
            _ => false,
        }
    }
}

/// How a scope splits its eviction target among its children (after budgets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Assign {
    /// Proportional to each child's resident bytes.
    #[default]
    Bytes,
    /// Proportional to each child's resident objects.
    Objects,
    /// Proportional to each child's `weight`.
    Weights,
    /// Everything to the first child that still has candidates, in configuration order.
    Order,
}

/// How a leaf scope ranks its candidates (`{rule = "lru"}`; struct variants, so that
/// unknown fields are rejected).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "kebab-case", deny_unknown_fields)]
pub enum LeafRule {
    /// The master's lease order (smallest `lease_timeout`, then oldest insertion).
    Lease {},
    /// Least recently accessed first.
    Lru {},
    /// Oldest insertion first.
    Fifo {},
    /// Seed 002's adjusted age with per-type knobs (no `budget_ratio` here).
    TypeAware {
        /// Knobs per data type.
        #[serde(default)]
        types: TypeKnobsByType,
    },
    /// GreedyDual-Size-Frequency priority (one clock for the whole tree).
    Gdsf {},
}

impl Default for LeafRule {
    fn default() -> Self {
        LeafRule::Lease {}
    }
}

/// One scope of the tree (the root is `HierarchicalConfig::tree`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeConfig {
    /// Label for errors and reports.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Which of the parent's objects this scope takes (the root must be `any`).
    #[serde(default)]
    pub select: Selector,
    /// How this scope splits its target among its children.
    #[serde(default)]
    pub assign: Assign,
    /// Weight under a parent whose `assign` is `weights` (finite, >= 0; default 1).
    #[serde(default = "one")]
    pub weight: f64,
    /// Logical budget as a share of the store's capacity, in [0, 1]; none = no budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_ratio: Option<f64>,
    /// Ranking at a leaf (and in this scope's implicit `<rest>` child).
    #[serde(default)]
    pub evict: LeafRule,
    /// Child scopes; none = a leaf.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<ScopeConfig>,
}

fn one() -> f64 {
    1.0
}

impl Default for ScopeConfig {
    fn default() -> Self {
        Self {
            name: String::new(),
            select: Selector::Any,
            assign: Assign::Bytes,
            weight: 1.0,
            budget_ratio: None,
            evict: LeafRule::Lease {},
            children: Vec::new(),
        }
    }
}

/// `hierarchical` settings: `{"policy": "hierarchical", "tree": {...}}`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HierarchicalConfig {
    /// The root scope.
    pub tree: ScopeConfig,
}

#[derive(Debug, Clone, Copy)]
enum Rule {
    Lease,
    Lru,
    Fifo,
    TypeAware([AgeKnobs; DataType::COUNT]),
    Gdsf,
}

#[derive(Debug, Clone)]
struct Node {
    parent: u32,
    children: Vec<u32>,
    select: Selector,
    assign: Assign,
    weight_micro: u128,
    budget_ratio: Option<f64>,
    rule: Rule,
    path: String,
}

#[derive(Debug, Clone, Copy, Default)]
struct Stats {
    res_bytes: u64,
    res_objs: u64,
    cand_objs: [u64; 2],
    cand_bytes: [u64; 2],
}

#[derive(Debug, Clone, Copy)]
struct Cand {
    key: RankKey,
    id: ObjId,
    size: u64,
}

/// The `hierarchical` policy (see the module docs).
#[derive(Debug, Clone)]
pub struct Hierarchical {
    nodes: Vec<Node>,
    gdsf: Option<GdsfState>,
    stats: Vec<Stats>,
    buckets: Vec<[Vec<Cand>; 2]>,
    gdsf_max: f64,
    capacity: u64,
    now: Nanos,
}

fn build_rule(rule: &LeafRule, path: &str) -> Result<Rule, ConfigError> {
    Ok(match rule {
        LeafRule::Lease {} => Rule::Lease,
        LeafRule::Lru {} => Rule::Lru,
        LeafRule::Fifo {} => Rule::Fifo,
        LeafRule::Gdsf {} => Rule::Gdsf,
        LeafRule::TypeAware { types } => {
            types.validate(&format!("hierarchical: {path}.evict."), false)?;
            Rule::TypeAware(types.ages())
        }
    })
}

fn build_node(
    cfg: &ScopeConfig,
    parent: u32,
    path: String,
    nodes: &mut Vec<Node>,
) -> Result<u32, ConfigError> {
    if !(cfg.weight.is_finite() && cfg.weight >= 0.0) {
        return Err(ConfigError::field(
            format!("hierarchical: {path}.weight"),
            format!("expected a finite number >= 0, got {}", cfg.weight),
        ));
    }
    if let Some(r) = cfg.budget_ratio {
        if !(0.0..=1.0).contains(&r) {
            return Err(ConfigError::field(
                format!("hierarchical: {path}.budget_ratio"),
                format!("expected in [0, 1], got {r}"),
            ));
        }
    }
    if cfg.select.is_empty_list() {
        return Err(ConfigError::field(
            format!("hierarchical: {path}.select"),
            "expected a non-empty list",
        ));
    }
    let rule = build_rule(&cfg.evict, &path)?;
    let idx = nodes.len() as u32;
    nodes.push(Node {
        parent,
        children: Vec::new(),
        select: cfg.select.clone(),
        assign: cfg.assign,
        weight_micro: (cfg.weight * 1e6).round() as u128,
        budget_ratio: cfg.budget_ratio,
        rule,
        path: if cfg.name.is_empty() {
            path.clone()
        } else {
            format!("{path}({})", cfg.name)
        },
    });
    let mut has_any = false;
    for (j, c) in cfg.children.iter().enumerate() {
        let cpath = format!("{path}.children[{j}]");
        if has_any {
            return Err(ConfigError::field(
                format!("hierarchical: {cpath}"),
                "unreachable, an earlier sibling selects \"any\"",
            ));
        }
        let ci = build_node(c, idx, cpath, nodes)?;
        nodes[idx as usize].children.push(ci);
        has_any |= c.select == Selector::Any;
    }
    if !cfg.children.is_empty() && !has_any {
        let ci = nodes.len() as u32;
        nodes.push(Node {
            parent: idx,
            children: Vec::new(),
            select: Selector::Any,
            assign: Assign::Bytes,
            weight_micro: 1_000_000,
            budget_ratio: None,
            rule,
            path: format!("{path}.<rest>"),
        });
        nodes[idx as usize].children.push(ci);
    }
    Ok(idx)
}

/// Split `rem` in proportion to `w` (largest remainder; ties to the earlier entry).
/// All-zero weights split equally.
fn apportion(rem: u64, w: &[u128]) -> Vec<u64> {
    let total: u128 = w.iter().sum();
    let (w, total): (Vec<u128>, u128) = if total == 0 {
        (vec![1; w.len()], w.len() as u128)
    } else {
        (w.to_vec(), total)
    };
    let r = u128::from(rem);
    let mut shares: Vec<u64> = w.iter().map(|&x| (r * x / total) as u64).collect();
    let left = rem - shares.iter().sum::<u64>();
    if left > 0 {
        let mut idx: Vec<usize> = (0..w.len()).collect();
        idx.sort_by(|&a, &b| {
            ((r * w[b]) % total)
                .cmp(&((r * w[a]) % total))
                .then(a.cmp(&b))
        });
        for &i in idx.iter().take(left as usize) {
            shares[i] += 1;
        }
    }
    shares
}

impl Hierarchical {
    /// Build from a config, or say which field (by its path in the tree) is invalid.
    pub fn new(cfg: &HierarchicalConfig) -> Result<Self, ConfigError> {
        if cfg.tree.select != Selector::Any {
            return Err(ConfigError::field(
                "hierarchical: tree.select",
                "the root scope must select \"any\"",
            ));
        }
        let mut nodes = Vec::new();
        build_node(&cfg.tree, NIL, "tree".into(), &mut nodes)?;
        let gdsf = nodes
            .iter()
            .any(|n| n.children.is_empty() && matches!(n.rule, Rule::Gdsf))
            .then(GdsfState::default);
        let n = nodes.len();
        Ok(Self {
            nodes,
            gdsf,
            stats: vec![Stats::default(); n],
            buckets: (0..n).map(|_| [Vec::new(), Vec::new()]).collect(),
            gdsf_max: f64::NEG_INFINITY,
            capacity: 0,
            now: 0,
        })
    }

    /// Scope paths in tree order (pre-order), implicit `<rest>` leaves included.
    pub fn scopes(&self) -> Vec<&str> {
        self.nodes.iter().map(|n| n.path.as_str()).collect()
    }

    /// The path of the leaf scope `m` belongs to.
    pub fn leaf_path(&self, m: &ObjectMeta) -> &str {
        &self.nodes[self.leaf_of(m)].path
    }

    fn leaf_of(&self, m: &ObjectMeta) -> usize {
        let mut n = 0usize;
        loop {
            let node = &self.nodes[n];
            if node.children.is_empty() {
                return n;
            }
            n = node
                .children
                .iter()
                .copied()
                .find(|&c| self.nodes[c as usize].select.matches(m))
                .expect("every inner scope has a catch-all child") as usize;
        }
    }

    fn key(&self, leaf: usize, i: usize, m: &ObjectMeta, soft: bool) -> RankKey {
        match &self.nodes[leaf].rule {
            Rule::Lease => RankKey {
                a: 0.0,
                b: m.lease_timeout,
                c: m.insert_seq,
            },
            Rule::Lru => RankKey {
                a: 0.0,
                b: m.last_access_seq,
                c: m.insert_seq,
            },
            Rule::Fifo => RankKey {
                a: 0.0,
                b: m.insert_seq,
                c: 0,
            },
            Rule::TypeAware(k) => k[m.data_type.index()].key(m, self.now, soft),
            Rule::Gdsf => match &self.gdsf {
                Some(g) => g.key(i, m),
                None => RankKey {
                    a: 0.0,
                    b: m.last_access_seq,
                    c: m.insert_seq,
                },
            },
        }
    }

    fn budget_bytes(&self, node: usize) -> Option<u64> {
        self.nodes[node]
            .budget_ratio
            .map(|r| (r * self.capacity as f64).floor() as u64)
    }

    /// Take up to `k` candidates of leaf `node` in its order (or fewer, once `goal` bytes
    /// are reached), pushing them to `out` and updating the stats up to the root.
    fn take_leaf(
        &mut self,
        node: usize,
        pass: usize,
        k: u64,
        goal: Option<u64>,
        out: &mut Vec<ObjId>,
    ) -> (u64, u64) {
        let Self {
            nodes,
            stats,
            buckets,
            gdsf_max,
            ..
        } = self;
        let v = &mut buckets[node][pass];
        let k = smallest_first(v, k as usize, |c| c.key);
        let m = match goal {
            None => k,
            Some(g) => {
                let mut b = 0;
                let mut m = 0;
                for c in &v[..k] {
                    if b >= g {
                        break;
                    }
                    b += c.size;
                    m += 1;
                }
                m
            }
        };
        let is_gdsf = matches!(nodes[node].rule, Rule::Gdsf);
        let mut bytes = 0;
        for c in &v[..m] {
            out.push(c.id);
            bytes += c.size;
            if is_gdsf && c.key.a > *gdsf_max {
                *gdsf_max = c.key.a;
            }
            let mut n = node as u32;
            while n != NIL {
                let s = &mut stats[n as usize];
                s.res_bytes -= c.size;
                s.res_objs -= 1;
                s.cand_objs[pass] -= 1;
                s.cand_bytes[pass] -= c.size;
                n = nodes[n as usize].parent;
            }
        }
        v.drain(..m);
        (m as u64, bytes)
    }

    /// Plan up to `max_objs` victims in `node` until `goal` bytes are freed.
    fn plan_bytes(
        &mut self,
        node: usize,
        pass: usize,
        max_objs: u64,
        goal: u64,
        out: &mut Vec<ObjId>,
    ) -> (u64, u64) {
        if self.nodes[node].children.is_empty() {
            return self.take_leaf(node, pass, max_objs, Some(goal), out);
        }
        let (mut n, mut b) = (0, 0);
        while n < max_objs && b < goal && self.stats[node].cand_objs[pass] > 0 {
            let s = self.stats[node];
            let avg = (s.cand_bytes[pass] / s.cand_objs[pass]).max(1);
            let k = (goal - b).div_ceil(avg).clamp(1, max_objs - n);
            let (cn, cb) = self.plan(node, pass, k, out);
            if cn == 0 {
                break;
            }
            n += cn;
            b += cb;
        }
        (n, b)
    }

    /// Plan up to `quota` victims in `node`'s scope (see the module docs).
    fn plan(&mut self, node: usize, pass: usize, quota: u64, out: &mut Vec<ObjId>) -> (u64, u64) {
        if quota == 0 || self.stats[node].cand_objs[pass] == 0 {
            return (0, 0);
        }
        let nc = self.nodes[node].children.len();
        if nc == 0 {
            return self.take_leaf(node, pass, quota, None, out);
        }
        let (mut n, mut bytes) = (0, 0);
        // 1. Over-budget children first, most bytes over first.
        let mut over: Vec<(u64, usize)> = Vec::new();
        for j in 0..nc {
            let c = self.nodes[node].children[j] as usize;
            if let Some(b) = self.budget_bytes(c) {
                let excess = self.stats[c].res_bytes.saturating_sub(b);
                if excess > 0 && self.stats[c].cand_objs[pass] > 0 {
                    over.push((excess, j));
                }
            }
        }
        over.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, j) in &over {
            if n == quota {
                break;
            }
            let c = self.nodes[node].children[j] as usize;
            let b = self.budget_bytes(c).unwrap_or(u64::MAX);
            let excess = self.stats[c].res_bytes.saturating_sub(b);
            if excess > 0 {
                let (cn, cb) = self.plan_bytes(c, pass, quota - n, excess, out);
                n += cn;
                bytes += cb;
            }
        }
        // 2-3. Split the rest by the assign rule; re-split shortfalls among the others.
        let mut active: Vec<usize> = (0..nc)
            .filter(|&j| self.stats[self.nodes[node].children[j] as usize].cand_objs[pass] > 0)
            .collect();
        let assign = self.nodes[node].assign;
        let mut weights = Vec::with_capacity(nc);
        while n < quota && !active.is_empty() {
            weights.clear();
            for (k, &j) in active.iter().enumerate() {
                let c = self.nodes[node].children[j] as usize;
                weights.push(match assign {
                    Assign::Bytes => u128::from(self.stats[c].res_bytes),
                    Assign::Objects => u128::from(self.stats[c].res_objs),
                    Assign::Weights => self.nodes[c].weight_micro,
                    Assign::Order => u128::from(k == 0),
                });
            }
            let shares = apportion(quota - n, &weights);
            let mut progress = 0;
            for (k, &j) in active.iter().enumerate() {
                if shares[k] > 0 {
                    let c = self.nodes[node].children[j] as usize;
                    let (cn, cb) = self.plan(c, pass, shares[k], out);
                    n += cn;
                    bytes += cb;
                    progress += cn;
                }
            }
            active
                .retain(|&j| self.stats[self.nodes[node].children[j] as usize].cand_objs[pass] > 0);
            if progress == 0 {
                break;
            }
        }
        (n, bytes)
    }
}

impl EvictionPolicy for Hierarchical {
    fn name(&self) -> &str {
        "hierarchical"
    }

    fn on_insert(&mut self, id: ObjId, meta: &ObjectMeta) {
        if let Some(g) = &mut self.gdsf {
            g.touch(id, meta);
        }
    }

    fn on_access(&mut self, id: ObjId, meta: &ObjectMeta) {
        if let Some(g) = &mut self.gdsf {
            g.touch(id, meta);
        }
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.capacity = req.capacity_bytes;
        self.now = req.now;
        self.gdsf_max = f64::NEG_INFINITY;
        for s in &mut self.stats {
            *s = Stats::default();
        }
        for b in &mut self.buckets {
            b[0].clear();
            b[1].clear();
        }
        for (i, m) in objects.iter().enumerate() {
            if !m.live {
                continue;
            }
            let leaf = self.leaf_of(m);
            let pass = match m.candidate(req.now) {
                Candidate::Unpinned => Some(0),
                Candidate::SoftPinned if req.allow_soft_pinned => Some(1),
                _ => None,
            };
            let mut n = leaf as u32;
            while n != NIL {
                let s = &mut self.stats[n as usize];
                s.res_bytes += m.size;
                s.res_objs += 1;
                if let Some(p) = pass {
                    s.cand_objs[p] += 1;
                    s.cand_bytes[p] += m.size;
                }
                n = self.nodes[n as usize].parent;
            }
            if let Some(p) = pass {
                let key = self.key(leaf, i, m, p == 1);
                self.buckets[leaf][p].push(Cand {
                    key,
                    id: ObjId(i as u32),
                    size: m.size,
                });
            }
        }
        let (n1, _) = self.plan(0, 0, unpinned_quota(req) as u64, out);
        let want = soft_quota(req, n1 as usize) as u64;
        if want > 0 {
            self.plan(0, 1, want, out);
        }
        if let Some(g) = &mut self.gdsf {
            if self.gdsf_max.is_finite() {
                g.inflate(self.gdsf_max);
            }
        }
    }
}

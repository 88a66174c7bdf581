//! What a replay reports: per-type hit and cost counters ([`TypeResult`]), one policy's
//! result ([`PolicyResult`]) and the labelled policy it ran ([`LabelledPolicy`]).

use std::collections::BTreeMap;

use moonagent_core::store::{DataType, PolicyConfig, PolicyNameError, StoreStats};
use serde::{Deserialize, Serialize};

use super::policy_by_name;

/// Hit and cost counters of one data type under one policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TypeResult {
    /// Lookups (image reads, KV blocks looked up).
    pub lookups: u64,
    /// Lookups served from the store (KV: the leading prefix run only).
    pub hits: u64,
    /// Bytes looked up.
    pub lookup_bytes: u64,
    /// Bytes served from the store.
    pub hit_bytes: u64,
    /// Recompute time of all lookups, ns (the no-cache cost).
    pub penalty_ns: u64,
    /// Recompute time avoided by hits, ns.
    pub saved_ns: u64,
    /// Lookups of objects the trace touched before (first references excluded).
    pub reuse_lookups: u64,
    /// Hits among `reuse_lookups` (every hit is one: a first reference cannot hit).
    pub reuse_hits: u64,
    /// Recompute time of the re-referencing lookups, ns.
    pub reuse_penalty_ns: u64,
    /// Puts that succeeded.
    pub puts: u64,
    /// Puts refused for space (Mooncake's "no available handle"): the object stays uncached.
    pub puts_no_space: u64,
    /// Puts refused because the object was already there (found after the lookup missed).
    pub puts_exists: u64,
    /// Objects evicted.
    pub evicted: u64,
    /// Bytes evicted.
    pub evicted_bytes: u64,
}

impl TypeResult {
    /// The rates every report shows (the replay's tables, sweep metrics), in column
    /// order: the one column set of a type's result.
    pub fn rates(&self) -> [(&'static str, f64); 6] {
        [
            ("hit_rate", self.hit_rate()),
            ("reuse_hit_rate", self.reuse_hit_rate()),
            ("byte_hit_rate", self.byte_hit_rate()),
            ("saving_time_rate", self.saving_time_rate()),
            ("reuse_saving_time_rate", self.reuse_saving_time_rate()),
            (
                "recompute_s",
                self.penalty_ns.saturating_sub(self.saved_ns) as f64 / 1e9,
            ),
        ]
    }

    /// The counters every report shows, in column order.
    pub fn counts(&self) -> [(&'static str, u64); 14] {
        [
            ("lookups", self.lookups),
            ("hits", self.hits),
            ("reuse_lookups", self.reuse_lookups),
            ("reuse_hits", self.reuse_hits),
            ("lookup_bytes", self.lookup_bytes),
            ("hit_bytes", self.hit_bytes),
            ("penalty_ns", self.penalty_ns),
            ("saved_ns", self.saved_ns),
            ("reuse_penalty_ns", self.reuse_penalty_ns),
            ("puts", self.puts),
            ("puts_no_space", self.puts_no_space),
            ("puts_exists", self.puts_exists),
            ("evicted", self.evicted),
            ("evicted_bytes", self.evicted_bytes),
        ]
    }

    /// hits / lookups (0 when nothing was looked up).
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.lookups)
    }
    /// hit bytes / lookup bytes.
    pub fn byte_hit_rate(&self) -> f64 {
        ratio(self.hit_bytes, self.lookup_bytes)
    }
    /// saved recompute time / no-cache recompute time.
    pub fn saving_time_rate(&self) -> f64 {
        ratio(self.saved_ns, self.penalty_ns)
    }
    /// hits / re-referencing lookups: the hit rate with compulsory misses left out.
    pub fn reuse_hit_rate(&self) -> f64 {
        ratio(self.reuse_hits, self.reuse_lookups)
    }
    /// saved recompute time / recompute time of the re-referencing lookups.
    pub fn reuse_saving_time_rate(&self) -> f64 {
        ratio(self.saved_ns, self.reuse_penalty_ns)
    }

    pub(crate) fn add(&mut self, o: &TypeResult) {
        self.lookups += o.lookups;
        self.hits += o.hits;
        self.lookup_bytes += o.lookup_bytes;
        self.hit_bytes += o.hit_bytes;
        self.penalty_ns += o.penalty_ns;
        self.saved_ns += o.saved_ns;
        self.reuse_lookups += o.reuse_lookups;
        self.reuse_hits += o.reuse_hits;
        self.reuse_penalty_ns += o.reuse_penalty_ns;
        self.puts += o.puts;
        self.puts_no_space += o.puts_no_space;
        self.puts_exists += o.puts_exists;
        self.evicted += o.evicted;
        self.evicted_bytes += o.evicted_bytes;
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// One policy's replay result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// Label (policy name, or the name given with its config).
    pub label: String,
    /// The policy configuration.
    pub policy: PolicyConfig,
    /// Per data type (by snake_case name), only types that were looked up.
    pub by_type: BTreeMap<String, TypeResult>,
    /// All types together.
    pub total: TypeResult,
    /// The store's own counters.
    pub store: StoreStats,
}

impl PolicyResult {
    /// A policy's result from its per-type counters and its store's stats (evictions come
    /// from the stats; only types that were looked up are listed; `total` sums all).
    pub fn assemble(
        lp: &LabelledPolicy,
        mut by: [TypeResult; DataType::COUNT],
        stats: StoreStats,
    ) -> Self {
        let mut by_type = BTreeMap::new();
        let mut total = TypeResult::default();
        for t in DataType::ALL {
            let r = &mut by[t.index()];
            let s = &stats.by_type[t.index()];
            r.evicted = s.evicted;
            r.evicted_bytes = s.evicted_bytes;
            if r.lookups > 0 {
                by_type.insert(t.name().to_string(), *r);
            }
            total.add(r);
        }
        PolicyResult {
            label: lp.label.clone(),
            policy: lp.policy.clone(),
            by_type,
            total,
            store: stats,
        }
    }

    /// The counters of data type `t` (zeros when it was never looked up).
    pub fn of(&self, t: DataType) -> TypeResult {
        self.by_type.get(t.name()).copied().unwrap_or_default()
    }
}

/// A policy to replay, with a label for reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelledPolicy {
    /// Report label.
    pub label: String,
    /// Policy configuration.
    pub policy: PolicyConfig,
}

impl LabelledPolicy {
    /// A policy labelled with its configuration name.
    pub fn named(policy: PolicyConfig) -> Self {
        Self {
            label: policy.name().to_string(),
            policy,
        }
    }

    /// A policy by name with default settings, or an error listing the known names.
    pub fn by_name(name: &str) -> Result<Self, PolicyNameError> {
        let policy = policy_by_name(name)?;
        Ok(Self {
            label: name.to_string(),
            policy,
        })
    }
}

//! Seed 002's type-aware eviction ablation on its continuous multimodal session workload
//! (`moonagent repro eviction-ablation`): the four configurations, the seed's numbers and
//! the shape check.

use moonagent_core::store::{DataType, MemStoreConfig, PolicyConfig};
use serde::Serialize;

use super::{
    replay_grid, CompileOptions, Compiled, LabelledPolicy, ModelCost, PolicyResult, ReplayError,
};
use moonagent_core::store::policies::{TypeAwareConfig, TypeKnobs, TypeKnobsByType};
use moonagent_traces::gen::{Generated, GeneratorKind};

/// Seed 002's published rows: label, hidden (encoder-output) hit %, KV hit %,
/// saving-time rate %.
pub const SEED_002: [(&str, f64, f64, f64); 4] = [
    ("default", 33.94, 96.65, 87.80),
    ("grace-only", 67.89, 95.84, 92.42),
    ("reuse-scale-only", 84.71, 94.98, 94.38),
    ("balanced", 75.54, 95.74, 94.26),
];

/// Default store capacity, as a share of the workload's unique bytes: see
/// [`calibrate_capacity`] for how it was chosen (among 15%, 20% and 25%, the share at which
/// `default`'s KV re-reference hit rate, averaged over the workloads of generator seeds
/// 0-9, comes closest to the seed's 96.65%: 98.2% at 20%, per seed 97.6-99.0; on a finer
/// grid 18% would be closest, 96.7%). Checked by `sim/tests/replay_ablation.rs`.
pub const DEFAULT_CAPACITY_SHARE: f64 = 0.20;

fn type_aware(enc: TypeKnobs, kv: TypeKnobs) -> PolicyConfig {
    PolicyConfig::TypeAware(TypeAwareConfig {
        types: TypeKnobsByType {
            kv_cache: kv,
            encoder_output: enc,
            ..TypeKnobsByType::default()
        },
    })
}

/// The hierarchical row: a one-level data-type tree, target split by resident bytes,
/// the balanced budgets on the scopes, KV in lease order and encoder outputs by the
/// balanced adjusted age (`examples/policies/hierarchical-type.toml`).
pub const HIERARCHICAL_TOML: &str = r#"policy = "hierarchical"

[tree]
name = "store"
assign = "bytes"

[[tree.children]]
name = "kv"
select = { data_type = "kv_cache" }
budget_ratio = 0.80
evict = { rule = "lease" }

[[tree.children]]
name = "encoder"
select = { data_type = "encoder_output" }
budget_ratio = 0.12
evict = { rule = "type-aware", types = { encoder_output = { reuse_scale = 8.0, eviction_grace_ms = 10000 } } }
"#;

/// The four ablation rows in the seed's order: default, grace only (encoder outputs
/// 10 s), reuse scale only (encoder outputs 8), balanced (both, budgets KV 0.80 /
/// encoder outputs 0.12).
pub fn seed_policies() -> Vec<LabelledPolicy> {
    let d = TypeKnobs::default();
    vec![
        LabelledPolicy {
            label: "default".into(),
            policy: PolicyConfig::MooncakeDefault {},
        },
        LabelledPolicy {
            label: "grace-only".into(),
            policy: type_aware(
                TypeKnobs {
                    eviction_grace_ms: 10_000,
                    ..d
                },
                d,
            ),
        },
        LabelledPolicy {
            label: "reuse-scale-only".into(),
            policy: type_aware(
                TypeKnobs {
                    reuse_scale: 8.0,
                    ..d
                },
                d,
            ),
        },
        LabelledPolicy {
            label: "balanced".into(),
            policy: type_aware(
                TypeKnobs {
                    reuse_scale: 8.0,
                    eviction_grace_ms: 10_000,
                    budget_ratio: Some(0.12),
                    ..d
                },
                TypeKnobs {
                    budget_ratio: Some(0.80),
                    ..d
                },
            ),
        },
    ]
}

/// The hierarchical row's configuration.
pub fn hierarchical() -> PolicyConfig {
    // A constant checked by this module's tests.
    PolicyConfig::from_toml_str(HIERARCHICAL_TOML).expect("built-in hierarchical config")
}

/// Every row of the ablation: the seed's four, then gdsf, hierarchical, lru and the
/// two offline oracles (belady, belady-cost).
pub fn all_policies() -> Vec<LabelledPolicy> {
    let mut v = seed_policies();
    v.push(LabelledPolicy::named(PolicyConfig::Gdsf {}));
    v.push(LabelledPolicy {
        label: "hierarchical".into(),
        policy: hierarchical(),
    });
    v.push(LabelledPolicy::named(PolicyConfig::Lru {}));
    v.push(LabelledPolicy::named(PolicyConfig::Belady {}));
    v.push(LabelledPolicy::named(PolicyConfig::BeladyCost {}));
    v
}

/// The seed-002 session workload (`sessions` generator, defaults but `sessions`),
/// compiled with Qwen2.5-VL-7B sizes and H200 costs.
pub fn sessions_trace(sessions: u64, seed: u64) -> Result<Compiled, ReplayError> {
    let overrides = vec![("sessions".to_string(), sessions.to_string())];
    let g = Generated::new(GeneratorKind::Sessions, None, &overrides, seed)
        .map_err(ReplayError::Generator)?;
    let opts = CompileOptions {
        block_size: g.header.block_size_tokens,
        ..CompileOptions::default()
    };
    Compiled::compile(g.requests, &opts, &ModelCost::qwen25_vl_7b_h200())
}

/// One ablation row in the seed's terms (percent, re-references only) beside the
/// all-lookup rates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// Policy label.
    pub label: String,
    /// Encoder-output hit rate over re-references, %.
    pub hidden_reuse_hit: f64,
    /// KV hit rate over re-references, %.
    pub kv_reuse_hit: f64,
    /// Saving-time rate over re-references (both types), %.
    pub reuse_saving_time: f64,
    /// Encoder-output hit rate over all lookups, %.
    pub hidden_hit: f64,
    /// KV hit rate over all lookups, %.
    pub kv_hit: f64,
    /// Saving-time rate over all lookups, %.
    pub saving_time: f64,
    /// Objects evicted.
    pub evicted: u64,
    /// Puts refused for space.
    pub puts_no_space: u64,
}

impl Row {
    /// The row of one result.
    pub fn of(r: &PolicyResult) -> Self {
        let h = r.of(DataType::EncoderOutput);
        let k = r.of(DataType::KvCache);
        Self {
            label: r.label.clone(),
            hidden_reuse_hit: 100.0 * h.reuse_hit_rate(),
            kv_reuse_hit: 100.0 * k.reuse_hit_rate(),
            reuse_saving_time: 100.0 * r.total.reuse_saving_time_rate(),
            hidden_hit: 100.0 * h.hit_rate(),
            kv_hit: 100.0 * k.hit_rate(),
            saving_time: 100.0 * r.total.saving_time_rate(),
            evicted: r.total.evicted,
            puts_no_space: r.total.puts_no_space,
        }
    }
}

/// The seed's shape, checked on one capacity's results (`default` and `balanced`
/// rows): balanced raises the encoder-output hit rate by >= 30 points over default,
/// the KV hit rate drops by <= 2 points, the saving-time rate rises.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Shape {
    /// Which rates: `"reuse"` (re-references, the seed's terms) or `"all"` lookups.
    pub rates: &'static str,
    /// balanced - default, encoder-output hit rate, points.
    pub hidden_gain: f64,
    /// default - balanced, KV hit rate, points.
    pub kv_drop: f64,
    /// balanced - default, saving-time rate, points.
    pub saving_gain: f64,
}

impl Shape {
    /// Whether all three conditions hold.
    pub fn holds(&self) -> bool {
        self.hidden_gain >= 30.0 && self.kv_drop <= 2.0 && self.saving_gain > 0.0
    }

    /// The shape between two rows, on re-references (`reuse = true`) or all lookups.
    pub fn between(default: &Row, balanced: &Row, reuse: bool) -> Self {
        if reuse {
            Self {
                rates: "reuse",
                hidden_gain: balanced.hidden_reuse_hit - default.hidden_reuse_hit,
                kv_drop: default.kv_reuse_hit - balanced.kv_reuse_hit,
                saving_gain: balanced.reuse_saving_time - default.reuse_saving_time,
            }
        } else {
            Self {
                rates: "all",
                hidden_gain: balanced.hidden_hit - default.hidden_hit,
                kv_drop: default.kv_hit - balanced.kv_hit,
                saving_gain: balanced.saving_time - default.saving_time,
            }
        }
    }

    /// The shape in `rows` (needs rows labelled `default` and `balanced`).
    pub fn of(rows: &[Row], reuse: bool) -> Option<Self> {
        let d = rows.iter().find(|r| r.label == "default")?;
        let b = rows.iter().find(|r| r.label == "balanced")?;
        Some(Self::between(d, b, reuse))
    }
}

/// For each share of unique bytes, `default`'s KV re-reference hit rate (%): how
/// [`DEFAULT_CAPACITY_SHARE`] was picked (the share closest to the seed's 96.65%).
pub fn calibrate_capacity(
    compiled: &Compiled,
    shares: &[f64],
    base: &MemStoreConfig,
) -> Result<Vec<(f64, f64)>, ReplayError> {
    let unique = compiled.unique_total();
    let cfgs: Vec<MemStoreConfig> = shares
        .iter()
        .map(|s| MemStoreConfig {
            capacity_bytes: (unique as f64 * s).round() as u64,
            ..base.clone()
        })
        .collect();
    let d = vec![seed_policies().swap_remove(0)];
    let grid = replay_grid(compiled, &cfgs, &d)?;
    Ok(shares
        .iter()
        .zip(grid)
        .map(|(s, r)| (*s, 100.0 * r[0].of(DataType::KvCache).reuse_hit_rate()))
        .collect())
}

/// The policies of the capacity sweep: every online policy (type-aware and the type tree
/// reduce to mooncake-default with one data type) and the store-level offline oracles.
pub fn capacity_policies() -> Vec<LabelledPolicy> {
    let mut v: Vec<LabelledPolicy> = [
        PolicyConfig::MooncakeDefault {},
        PolicyConfig::TypeAware(Default::default()),
        PolicyConfig::Lru {},
        PolicyConfig::Fifo {},
        PolicyConfig::S3Fifo(Default::default()),
        PolicyConfig::Sieve {},
        PolicyConfig::Gdsf {},
    ]
    .into_iter()
    .map(LabelledPolicy::named)
    .collect();
    v.push(LabelledPolicy {
        label: "hierarchical".into(),
        policy: hierarchical(),
    });
    v.push(LabelledPolicy::named(PolicyConfig::Belady {}));
    v.push(LabelledPolicy::named(PolicyConfig::BeladyCost {}));
    v
}

//! Typed configuration of one point, built from the plan's JSON (base + axis values), and
//! the checks that run on every axis value and every point before anything runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use moonagent_core::store::{MemStoreConfig, PolicyConfig};
use moonagent_traces::gen::{Generated, GeneratorKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::plan::{canonical_json, hash128, hash_file, Kind, Plan, Prepared};
use super::{PlanError, Result, SweepError};
use crate::des::{SimConfig, Simulation};
use crate::replay::{Include, LinearCost, ObjectSizes};

/// Where a run's requests come from: a generator (seeded by the run's seed) or a trace
/// file (fixed; the seed changes nothing).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Generator kind: `w1`..`w4`, `sessions`, `servegen`.
    #[serde(default)]
    pub generator: Option<GeneratorKind>,
    /// Generator knobs over its defaults (what `moonagent trace generate` takes).
    #[serde(default)]
    pub config: Option<Value>,
    /// A trace file (.jsonl or .parquet), relative to the plan file.
    #[serde(default)]
    pub trace: Option<String>,
}

impl Workload {
    /// The trace file, resolved against `base_dir`.
    pub fn trace_path(&self, base_dir: &Path) -> Option<PathBuf> {
        self.trace.as_ref().map(|t| {
            let p = PathBuf::from(t);
            if p.is_absolute() {
                p
            } else {
                base_dir.join(p)
            }
        })
    }

    fn check(&self, base_dir: &Path, seeds: &[u64]) -> Result<(), PlanError> {
        match (&self.generator, &self.trace) {
            (Some(kind), None) => Generated::new(*kind, self.config.as_ref(), &[], seeds[0])
                .map(|_| ())
                .map_err(PlanError::Generator),
            (None, Some(_)) => {
                if self.config.is_some() {
                    return Err(PlanError::field(
                        "workload.config",
                        "only a generator takes a config",
                    ));
                }
                if seeds.len() > 1 {
                    return Err(PlanError::field(
                        "workload.trace",
                        format!(
                            "a trace file is fixed, so {} seeds would repeat one run; use seeds = 1",
                            seeds.len()
                        ),
                    ));
                }
                let p = self.trace_path(base_dir).expect("trace is set");
                moonagent_traces::TraceReader::open(&p)
                    .map(|_| ())
                    .map_err(PlanError::TraceFile)
            }
            _ => Err(PlanError::field(
                "workload",
                "expected exactly one of `generator` (with an optional `config`) or `trace`",
            )),
        }
    }
}

/// Store capacity as a plan writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    untagged,
    expecting = "a byte count (1073741824), a size with a unit (\"64GiB\") or a share of the trace's unique bytes (\"30%\")"
)]
pub enum Capacity {
    /// Bytes.
    Bytes(u64),
    /// Bytes written as a float (`1e9`).
    Float(f64),
    /// `"64GiB"`, `"2.5GB"`, `"30%"`.
    Text(String),
}

/// A capacity once parsed.
pub(crate) use crate::capacity::CapacitySpec;

impl Capacity {
    pub(crate) fn spec(&self) -> Result<CapacitySpec, PlanError> {
        let bad = |s: &dyn std::fmt::Display| {
            PlanError::field(format!("capacity {s}"), "expected a positive size")
        };
        match self {
            Capacity::Bytes(0) => Err(bad(&0)),
            Capacity::Bytes(b) => Ok(CapacitySpec::Bytes(*b)),
            Capacity::Float(f) if *f >= 1.0 && f.is_finite() => {
                Ok(CapacitySpec::Bytes(f.round() as u64))
            }
            Capacity::Float(f) => Err(bad(f)),
            Capacity::Text(s) => Ok(CapacitySpec::parse(s)?),
        }
    }
}

/// Resolve an optional capacity against the trace's unique bytes (for percentages).
pub(crate) fn resolve_capacity(
    c: &Option<Capacity>,
    unique: u64,
) -> Result<Option<u64>, PlanError> {
    match c.as_ref().map(Capacity::spec).transpose()? {
        None => Ok(None),
        Some(spec) => Ok(Some(spec.resolve(Some(unique), "")?)),
    }
}

/// A simulator point: `SimConfig` fields at the top of `[base]`, plus the workload and an
/// optional `capacity` (overrides `store.capacity_bytes`; a percentage is a share of the
/// trace's unique encoder-output + prefix-KV bytes under the configured model's sizes).
#[derive(Debug, Clone, PartialEq)]
pub struct SimRun {
    /// The simulator configuration.
    pub sim: SimConfig,
    /// The workload.
    pub workload: Workload,
    /// Store capacity, if given apart from `store.capacity_bytes`.
    pub capacity: Option<Capacity>,
}

/// A replay point: the store-level replay of one policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRun {
    /// The workload.
    pub workload: Workload,
    /// Store capacity (overrides `store.capacity_bytes`): bytes, a size, or a share of the
    /// trace's unique bytes (`"30%"`).
    #[serde(default)]
    pub capacity: Option<Capacity>,
    /// Store settings.
    #[serde(default)]
    pub store: MemStoreConfig,
    /// The eviction policy.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Recompute-cost model.
    #[serde(default)]
    pub cost: LinearCost,
    /// Object sizes.
    #[serde(default)]
    pub sizes: ObjectSizes,
    /// Object types replayed (`{ images = true, kv = true }`).
    #[serde(default)]
    pub include: Include,
}

/// Checks already done, by canonical JSON of what they depend on.
#[derive(Default)]
struct Memo {
    workloads: BTreeMap<String, Result<(), Arc<PlanError>>>,
    clusters: BTreeMap<String, Result<(), Arc<PlanError>>>,
}

/// One point's typed configuration.
#[derive(Debug, Clone, PartialEq)]
pub enum RunConfig {
    /// Simulator run.
    Simulate(SimRun),
    /// Replay run.
    Replay(ReplayRun),
}

fn typed<T: DeserializeOwned>(v: Value, prefix: &str) -> Result<T, PlanError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let at = match (prefix.is_empty(), path == ".") {
            (true, true) => String::new(),
            (true, false) => path,
            (false, true) => prefix.to_string(),
            (false, false) => format!("{prefix}.{path}"),
        };
        PlanError::Deserialize {
            at,
            source: e.into_inner(),
        }
    })
}

impl RunConfig {
    /// Build the typed configuration of `kind` from a JSON object (the base with a point's
    /// axis values set); the error names the field path.
    pub fn from_value(kind: Kind, v: Value) -> Result<Self, PlanError> {
        match kind {
            Kind::Simulate => {
                let Value::Object(mut m) = v else {
                    return Err(PlanError::Rule("[base] must be a table".into()));
                };
                let workload = m.remove("workload").ok_or_else(|| {
                    PlanError::field(
                        "workload",
                        "missing ([base.workload] with a generator or a trace)",
                    )
                })?;
                let workload: Workload = typed(workload, "workload")?;
                let capacity = m
                    .remove("capacity")
                    .map(|c| typed::<Capacity>(c, "capacity"))
                    .transpose()?;
                let sim: SimConfig = typed(Value::Object(m), "")?;
                Ok(RunConfig::Simulate(SimRun {
                    sim,
                    workload,
                    capacity,
                }))
            }
            Kind::Replay => Ok(RunConfig::Replay(typed(v, "")?)),
        }
    }

    /// The workload.
    pub fn workload(&self) -> &Workload {
        match self {
            RunConfig::Simulate(s) => &s.workload,
            RunConfig::Replay(r) => &r.workload,
        }
    }

    fn capacity(&self) -> &Option<Capacity> {
        match self {
            RunConfig::Simulate(s) => &s.capacity,
            RunConfig::Replay(r) => &r.capacity,
        }
    }

    /// Every check that does not need the trace.
    fn check(&self, base_dir: &Path, seeds: &[u64], memo: &mut Memo) -> Result<(), PlanError> {
        let w = self.workload();
        let key = canonical_json(&serde_json::to_value(w).unwrap_or(Value::Null));
        memo.workloads
            .entry(key)
            .or_insert_with(|| w.check(base_dir, seeds).map_err(Arc::new))
            .clone()
            .map_err(PlanError::Shared)?;
        let cap = match self.capacity().as_ref().map(Capacity::spec).transpose()? {
            Some(CapacitySpec::Bytes(b)) => Some(b),
            _ => None,
        };
        match self {
            RunConfig::Simulate(s) => {
                let mut sim = s.sim.clone();
                if let Some(b) = cap {
                    sim.store.capacity_bytes = b;
                }
                // The cluster's own constructor checks names of hardware, model and link
                // and sizes the KV pools, exactly as a run will; it takes ~1 ms (the pools),
                // so it runs once per cluster shape. Store and policy, which points vary
                // most, are checked for every point by `validate`.
                sim.validate()?;
                let mut shape = serde_json::to_value(&sim).unwrap_or(Value::Null);
                if let Value::Object(m) = &mut shape {
                    m.remove("store");
                    m.remove("policy");
                }
                memo.clusters
                    .entry(canonical_json(&shape))
                    .or_insert_with(|| {
                        Simulation::new(&sim, &[], 16)
                            .map(|_| ())
                            .map_err(|e| Arc::new(e.into()))
                    })
                    .clone()
                    .map_err(PlanError::Shared)
            }
            RunConfig::Replay(r) => {
                let mut store = r.store.clone();
                if let Some(b) = cap {
                    store.capacity_bytes = b;
                }
                store.validate().map_err(PlanError::Store)?;
                r.policy.validate().map_err(PlanError::Policy)?;
                if !(r.include.images || r.include.kv) {
                    return Err(PlanError::field(
                        "include",
                        "at least one of images and kv must be true",
                    ));
                }
                Ok(())
            }
        }
    }
}

impl Plan {
    /// Check every point against the typed configuration (unknown paths, bad values and
    /// invalid combinations fail here, before anything runs: the error names the axis
    /// when its value alone breaks the base, else the point), and hash the plan with the
    /// trace files it reads.
    pub fn prepare(&self) -> Result<Prepared> {
        let mut memo = Memo::default();
        let mut build = |v: Value| -> Result<RunConfig, PlanError> {
            let cfg = RunConfig::from_value(self.kind, v)?;
            cfg.check(&self.base_dir, &self.seeds, &mut memo)?;
            Ok(cfg)
        };
        // A value is the axis's fault when it breaks the base on its own; a value that is
        // only wrong beside another axis's (e.g. too many GPUs) is the point's.
        let base_ok = build(self.base.clone()).is_ok();
        let mut configs = Vec::with_capacity(self.points.len());
        let mut traces = BTreeSet::new();
        for p in &self.points {
            let cfg = match build(self.config_value(p)?) {
                Ok(cfg) => cfg,
                Err(msg) => {
                    if base_ok {
                        for (a, axis) in self.axes.iter().enumerate() {
                            let k = p.at[a] as usize;
                            let alone = self
                                .single_axis_value(a, k)
                                .and_then(|v| build(v).map(|_| ()));
                            if let Err(msg) = alone {
                                return Err(SweepError::Axis {
                                    axis: a + 1,
                                    name: axis.name.clone(),
                                    path: axis.path.clone(),
                                    value: format!(" = {}", canonical_json(&axis.values[k])),
                                    msg: Box::new(msg),
                                });
                            }
                        }
                    }
                    return Err(SweepError::Point {
                        index: p.index,
                        desc: self.describe(p),
                        msg: Box::new(msg),
                    });
                }
            };
            if let Some(t) = &cfg.workload().trace {
                traces.insert(t.clone());
            }
            configs.push(cfg);
        }
        let canonical = self.canonical();
        let mut parts: Vec<Vec<u8>> =
            vec![b"moonagent-sweep-plan".to_vec(), canonical.into_bytes()];
        for t in &traces {
            let w = Workload {
                trace: Some(t.clone()),
                ..Workload::default()
            };
            let path = w.trace_path(&self.base_dir).expect("trace is set");
            let h = hash_file(&path).map_err(SweepError::io(&path))?;
            parts.push(format!("trace {t} {h}").into_bytes());
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        Ok(Prepared {
            plan: self.clone(),
            hash: hash128(&refs),
            configs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_parse_units_and_shares() {
        let c = |s: &str| Capacity::Text(s.into()).spec();
        assert_eq!(c("64GiB").unwrap(), CapacitySpec::Bytes(64 << 30));
        assert_eq!(c("2.5 GB").unwrap(), CapacitySpec::Bytes(2_500_000_000));
        assert_eq!(c("30%").unwrap(), CapacitySpec::Share(0.3));
        assert!(c("-1GB").is_err());
        assert!(c("lots").is_err());
        assert!(Capacity::Bytes(0).spec().is_err());
        assert_eq!(
            Capacity::Float(1e9).spec().unwrap(),
            CapacitySpec::Bytes(1_000_000_000)
        );
        assert_eq!(
            resolve_capacity(&Some(Capacity::Text("25%".into())), 1000).unwrap(),
            Some(250)
        );
    }

    #[test]
    fn config_errors_name_the_field_path() {
        let v = serde_json::json!({
            "workload": {"generator": "w3"},
            "policy": {"policy": "type-aware", "types": {"encoder_output": {"reuse_scale": "big"}}}
        });
        let e = RunConfig::from_value(Kind::Replay, v)
            .unwrap_err()
            .to_string();
        assert!(e.contains("reuse_scale") || e.contains("policy"), "{e}");
        let v =
            serde_json::json!({"workload": {"generator": "w3"}, "store": {"capacity_bites": 1}});
        let e = RunConfig::from_value(Kind::Replay, v)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("store"), "{e}");
        assert!(e.contains("capacity_bites"), "{e}");
        let v = serde_json::json!({"workload": {"generator": "w3"}, "encoders": "two"});
        let e = RunConfig::from_value(Kind::Simulate, v)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("encoders"), "{e}");
        let v = serde_json::json!({"encoders": 2});
        assert!(RunConfig::from_value(Kind::Simulate, v)
            .unwrap_err()
            .to_string()
            .contains("workload"));
    }
}

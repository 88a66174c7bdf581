//! Running one (point, seed): load or generate the trace (shared between the runs that
//! read the same one, dropped once the last of them is done), then simulate or replay.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use moonagent_models::ModelSpec;
use moonagent_traces::gen::Generated;
use moonagent_traces::schema::Request;
use serde_json::{json, Value};

use super::config::{resolve_capacity, Capacity, RunConfig, Workload};
use super::metrics::{replay_metrics, sim_metrics, MetricValue, TraceFacts};
use super::plan::canonical_json;
use super::PlanError;
use crate::des::simulate;
use crate::replay::{replay_one, Compiled, Include, LabelledPolicy, LinearCost, ObjectSizes};

/// A trace made ready for runs.
pub(crate) enum Loaded {
    /// Requests for the simulator, with the prefix block size and (when a capacity is a
    /// percentage) the unique bytes under the model's object sizes.
    Requests {
        reqs: Vec<Request>,
        block: u32,
        unique: u64,
    },
    /// A trace compiled for the replay, with its facts.
    Compiled { c: Compiled, facts: TraceFacts },
}

type Slot = Arc<OnceLock<Result<Arc<Loaded>, Arc<PlanError>>>>;

/// Traces shared between runs, keyed by everything that shapes them.
pub(crate) struct Inputs {
    base_dir: PathBuf,
    slots: Mutex<HashMap<String, Slot>>,
    uses: Mutex<HashMap<String, usize>>,
}

fn is_share(c: &Option<Capacity>) -> bool {
    matches!(c, Some(Capacity::Text(s)) if s.trim().ends_with('%'))
}

impl Inputs {
    pub(crate) fn new(base_dir: &Path) -> Self {
        Self {
            base_dir: base_dir.to_path_buf(),
            slots: Mutex::new(HashMap::new()),
            uses: Mutex::new(HashMap::new()),
        }
    }

    /// The cache key of `cfg`'s trace at `seed`.
    pub(crate) fn key(cfg: &RunConfig, seed: u64) -> String {
        let w = cfg.workload();
        let seed = if w.generator.is_some() {
            json!(seed)
        } else {
            Value::Null
        };
        let v = match cfg {
            RunConfig::Simulate(s) => json!({
                "w": w,
                "seed": seed,
                "model": if is_share(&s.capacity) { json!(s.sim.model) } else { Value::Null },
            }),
            RunConfig::Replay(r) => json!({
                "w": w,
                "seed": seed,
                "cost": r.cost,
                "sizes": r.sizes,
                "include": r.include,
            }),
        };
        canonical_json(&v)
    }

    /// Count one more run that will read `key`.
    pub(crate) fn register(&self, key: &str) {
        *self
            .uses
            .lock()
            .expect("uses lock")
            .entry(key.to_string())
            .or_default() += 1;
    }

    /// One run that read `key` is done: drop the trace after the last one.
    pub(crate) fn release(&self, key: &str) {
        let mut uses = self.uses.lock().expect("uses lock");
        if let Some(n) = uses.get_mut(key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                uses.remove(key);
                self.slots.lock().expect("slots lock").remove(key);
            }
        }
    }

    fn get(
        &self,
        key: &str,
        load: impl FnOnce() -> Result<Loaded, PlanError>,
    ) -> Result<Arc<Loaded>, PlanError> {
        let slot = self
            .slots
            .lock()
            .expect("slots lock")
            .entry(key.to_string())
            .or_default()
            .clone();
        // Other runs needing the same trace wait here while the first one builds it.
        slot.get_or_init(|| load().map(Arc::new).map_err(Arc::new))
            .clone()
            .map_err(PlanError::Shared)
    }
}

fn requests(w: &Workload, seed: u64, base_dir: &Path) -> Result<(Vec<Request>, u32), PlanError> {
    if let Some(kind) = w.generator {
        let g = Generated::new(kind, w.config.as_ref(), &[], seed).map_err(PlanError::Generator)?;
        let block = g.header.block_size_tokens;
        let reqs = g
            .requests
            .collect::<Result<Vec<_>, _>>()
            .map_err(PlanError::Workload)?;
        Ok((reqs, block))
    } else {
        let path = w
            .trace_path(base_dir)
            .ok_or_else(|| PlanError::field("workload", "no generator and no trace"))?;
        let r = moonagent_traces::TraceReader::open(&path)?;
        let block = r.header().block_size_tokens;
        let reqs = r.collect::<Result<Vec<_>, _>>()?;
        Ok((reqs, block))
    }
}

fn unique_total(c: &Compiled) -> u64 {
    c.unique_bytes().iter().sum()
}

/// Run `cfg` at `seed`; returns every metric of its kind, in schema order.
pub(crate) fn run_one(
    cfg: &RunConfig,
    seed: u64,
    key: &str,
    inputs: &Inputs,
) -> Result<Vec<(String, MetricValue)>, PlanError> {
    let base_dir = inputs.base_dir.clone();
    match cfg {
        RunConfig::Simulate(s) => {
            let loaded = inputs.get(key, || {
                let (reqs, block) = requests(&s.workload, seed, &base_dir)?;
                let unique = if is_share(&s.capacity) {
                    let spec = ModelSpec::by_name(&s.sim.model).map_err(PlanError::Model)?;
                    let sizes = ObjectSizes {
                        kv_bytes_per_token: spec.kv_bytes_per_token(),
                        encoder_bytes_per_visual_token: spec.encoder_output_bytes_per_token(),
                    };
                    let c = Compiled::from_requests(
                        reqs.iter().cloned(),
                        block,
                        &sizes,
                        &LinearCost::default(),
                        Include::default(),
                    )?;
                    unique_total(&c)
                } else {
                    0
                };
                Ok(Loaded::Requests {
                    reqs,
                    block,
                    unique,
                })
            })?;
            let Loaded::Requests {
                reqs,
                block,
                unique,
            } = &*loaded
            else {
                return Err(PlanError::Internal(
                    "trace cache holds a compiled trace for a simulation".into(),
                ));
            };
            let mut sim = s.sim.clone();
            if let Some(b) = resolve_capacity(&s.capacity, *unique)? {
                sim.store.capacity_bytes = b;
            }
            let (summary, _) = simulate(&sim, reqs, *block)?;
            Ok(sim_metrics(&summary))
        }
        RunConfig::Replay(r) => {
            let loaded = inputs.get(key, || {
                let (reqs, block) = requests(&r.workload, seed, &base_dir)?;
                let mut c = Compiled::from_requests(reqs, block, &r.sizes, &r.cost, r.include)?;
                c.fill_next();
                let u = c.unique_bytes();
                let facts = TraceFacts {
                    requests: c.requests,
                    accesses: c.accesses.len() as u64,
                    unique_encoder_bytes: u[moonagent_core::store::DataType::EncoderOutput.index()],
                    unique_kv_bytes: u[moonagent_core::store::DataType::KvCache.index()],
                    capacity_bytes: 0,
                };
                Ok(Loaded::Compiled { c, facts })
            })?;
            let Loaded::Compiled { c, facts } = &*loaded else {
                return Err(PlanError::Internal(
                    "trace cache holds requests for a replay".into(),
                ));
            };
            let mut store = r.store.clone();
            if let Some(b) = resolve_capacity(&r.capacity, unique_total(c))? {
                store.capacity_bytes = b;
            }
            let lp = LabelledPolicy {
                label: r.policy.name().to_string(),
                policy: r.policy.clone(),
            };
            let res = replay_one(c, &store, &lp)?;
            let facts = TraceFacts {
                capacity_bytes: store.capacity_bytes,
                ..*facts
            };
            Ok(replay_metrics(&res, &facts))
        }
    }
}

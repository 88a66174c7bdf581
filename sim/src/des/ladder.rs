//! The B0 -> Full ladder on W1-W4 (seed 000's evaluation), and its gain decomposition.
//!
//! For each workload the ladder runs every mode twice on the same requests:
//! - **saturated**: every request arrives at once (rate `saturation_rate`), so throughput
//!   is the cluster's capacity for that workload (completed / makespan);
//! - **at load**: the same requests arriving at `load_factor` x the lowest saturated
//!   throughput among the modes, so latency (TTFT, TPOT) is compared at one offered load
//!   that every mode can carry (a mode past its capacity only shows its queue growing).
//!
//! Gains decompose as seed 000 defines them: EPD = B1 vs B0, cache = B2 - B1,
//! fork = B3 - B2, scheduling = Full - B3 (throughput ratios, P95 TTFT changes).

use crate::table::{Column, Table};
use moonagent_traces::gen::{Generated, GeneratorKind};
use moonagent_traces::schema::Request;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::cluster::simulate;
use super::config::{Mode, SimConfig};
use super::metrics::Summary;
use super::SimError;

/// One workload of the ladder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    /// Label in reports.
    pub name: String,
    /// Generator (`w1`..`w4`, `sessions`, `servegen`).
    pub generator: String,
    /// Generator knobs (JSON/TOML table), over its defaults.
    #[serde(default)]
    pub config: serde_json::Value,
}

/// The ladder's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LadderConfig {
    /// Cluster and store settings shared by every cell (its `mode` is ignored).
    pub base: SimConfig,
    /// Modes to run, in order.
    pub modes: Vec<Mode>,
    /// Workloads to run.
    pub workloads: Vec<Workload>,
    /// Requests per workload.
    pub requests: u64,
    /// Generator seed.
    pub seed: u64,
    /// Arrival rate of the saturated run (req/s): high enough that every request queues.
    pub saturation_rate: f64,
    /// Offered load of the latency run, as a share of the lowest saturated throughput.
    pub load_factor: f64,
}

impl Default for LadderConfig {
    fn default() -> Self {
        let w = |name: &str| Workload {
            name: name.to_uppercase(),
            generator: name.into(),
            config: serde_json::Value::Null,
        };
        Self {
            base: SimConfig::default(),
            modes: Mode::ALL.to_vec(),
            workloads: vec![w("w1"), w("w2"), w("w3"), w("w4")],
            requests: 1_000,
            seed: 1,
            saturation_rate: 1.0e6,
            load_factor: 0.8,
        }
    }
}

/// One (workload, mode) cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Workload label.
    pub workload: String,
    /// Mode.
    pub mode: Mode,
    /// Offered load of the latency run, req/s.
    pub load_rps: f64,
    /// Saturated run.
    pub saturated: Summary,
    /// Latency run.
    pub at_load: Summary,
}

/// Gains of one workload, each relative to the previous rung.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gains {
    /// Workload label.
    pub workload: String,
    /// B1 / B0 saturated throughput.
    pub epd_throughput_x: f64,
    /// B2 / B1, B3 / B2, Full / B3 saturated throughput.
    pub cache_throughput_x: f64,
    /// See `cache_throughput_x`.
    pub fork_throughput_x: f64,
    /// See `cache_throughput_x`.
    pub scheduling_throughput_x: f64,
    /// P95 TTFT change at load, percent: B1 vs B0.
    pub epd_p95_ttft_pct: f64,
    /// B2 vs B1.
    pub cache_p95_ttft_pct: f64,
    /// B3 vs B2.
    pub fork_p95_ttft_pct: f64,
    /// Full vs B3.
    pub scheduling_p95_ttft_pct: f64,
    /// P95 end-to-end change at load, percent: B3 vs B2 (the fork shortens agent requests).
    pub fork_p95_e2e_pct: f64,
}

/// Everything the ladder reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LadderResult {
    /// The configuration it ran.
    pub config: LadderConfig,
    /// Every cell, workload-major, in mode order.
    pub cells: Vec<Cell>,
    /// Gains per workload (only when all five modes ran).
    pub gains: Vec<Gains>,
}

/// Generate `n` requests of `w` at `rate` req/s.
pub fn generate(
    w: &Workload,
    n: u64,
    rate: f64,
    seed: u64,
) -> Result<(Vec<Request>, u32), SimError> {
    let bad = |what: String| SimError::Workload {
        workload: w.name.clone(),
        what,
    };
    let kind: GeneratorKind = w
        .generator
        .parse()
        .map_err(|e: moonagent_traces::TraceError| bad(e.to_string()))?;
    let mut cfg = if w.config.is_null() {
        serde_json::json!({})
    } else {
        w.config.clone()
    };
    let obj = cfg
        .as_object_mut()
        .ok_or_else(|| bad("config must be a table".into()))?;
    if matches!(
        kind,
        GeneratorKind::W1 | GeneratorKind::W2 | GeneratorKind::W3 | GeneratorKind::W4
    ) {
        obj.insert("requests".into(), n.into());
        obj.insert("rate".into(), rate.into());
    }
    let g = Generated::new(kind, Some(&cfg), &[], seed).map_err(|e| bad(e.to_string()))?;
    let bs = g.header.block_size_tokens;
    let reqs = g
        .requests
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    Ok((reqs, bs))
}

fn pct(new: f64, old: f64) -> f64 {
    if old == 0.0 {
        0.0
    } else {
        100.0 * (new - old) / old
    }
}

fn ratio(new: f64, old: f64) -> f64 {
    if old == 0.0 {
        0.0
    } else {
        new / old
    }
}

/// Run the ladder (cells in parallel with rayon; results in a fixed order).
pub fn run_ladder(cfg: &LadderConfig) -> Result<LadderResult, SimError> {
    if !(cfg.load_factor > 0.0 && cfg.saturation_rate > 0.0) {
        return Err(SimError::Config {
            field: "load_factor and saturation_rate",
            what: "expected > 0".into(),
        });
    }
    // Every mode of the ladder on one trace, in parallel; summaries in mode order.
    let run_modes = |trace: &[Request], bs: u32| -> Result<Vec<Summary>, SimError> {
        cfg.modes
            .par_iter()
            .map(|&m| {
                simulate(
                    &SimConfig {
                        mode: m,
                        ..cfg.base.clone()
                    },
                    trace,
                    bs,
                )
                .map(|r| r.0)
            })
            .collect()
    };
    let mut cells = Vec::new();
    for w in &cfg.workloads {
        let (sat_trace, bs) = generate(w, cfg.requests, cfg.saturation_rate, cfg.seed)?;
        let sat: Vec<(Mode, Summary)> = cfg
            .modes
            .iter()
            .copied()
            .zip(run_modes(&sat_trace, bs)?)
            .collect();
        let b0 = sat
            .iter()
            .find(|x| x.0 == Mode::B0)
            .map_or(sat[0].1.throughput_rps, |x| x.1.throughput_rps);
        let load = (b0 * cfg.load_factor).max(1e-3);
        let (load_trace, bs) = generate(w, cfg.requests, load, cfg.seed)?;
        let at: Vec<Summary> = run_modes(&load_trace, bs)?;
        for ((m, s), a) in sat.into_iter().zip(at) {
            cells.push(Cell {
                workload: w.name.clone(),
                mode: m,
                load_rps: load,
                saturated: s,
                at_load: a,
            });
        }
    }
    let mut gains = Vec::new();
    for w in &cfg.workloads {
        let get = |m: Mode| cells.iter().find(|c| c.workload == w.name && c.mode == m);
        if let (Some(b0), Some(b1), Some(b2), Some(b3), Some(f)) = (
            get(Mode::B0),
            get(Mode::B1),
            get(Mode::B2),
            get(Mode::B3),
            get(Mode::Full),
        ) {
            let thr = |c: &Cell| c.saturated.throughput_rps;
            let p95 = |c: &Cell| c.at_load.ttft_ms.p95;
            gains.push(Gains {
                workload: w.name.clone(),
                epd_throughput_x: ratio(thr(b1), thr(b0)),
                cache_throughput_x: ratio(thr(b2), thr(b1)),
                fork_throughput_x: ratio(thr(b3), thr(b2)),
                scheduling_throughput_x: ratio(thr(f), thr(b3)),
                epd_p95_ttft_pct: pct(p95(b1), p95(b0)),
                cache_p95_ttft_pct: pct(p95(b2), p95(b1)),
                fork_p95_ttft_pct: pct(p95(b3), p95(b2)),
                scheduling_p95_ttft_pct: pct(p95(f), p95(b3)),
                fork_p95_e2e_pct: pct(b3.at_load.e2e_ms.p95, b2.at_load.e2e_ms.p95),
            });
        }
    }
    Ok(LadderResult {
        config: cfg.clone(),
        cells,
        gains,
    })
}

impl LadderResult {
    /// The ladder's cells as a table.
    pub fn table(&self) -> Table {
        let r = self;
        let c = &r.cells;
        let s = |f: &dyn Fn(&Cell) -> String| Column::Str(c.iter().map(f).collect());
        let f = |f: &dyn Fn(&Cell) -> f64| Column::F64(c.iter().map(f).collect());
        let u = |f: &dyn Fn(&Cell) -> u64| Column::U64(c.iter().map(f).collect());
        Table::new()
            .with("workload", s(&|x| x.workload.clone()))
            .with("mode", s(&|x| x.mode.name().to_string()))
            .with("hardware", s(&|_| r.config.base.hardware.clone()))
            .with("throughput_rps", f(&|x| x.saturated.throughput_rps))
            .with("load_rps", f(&|x| x.load_rps))
            .with("ttft_p50_ms", f(&|x| x.at_load.ttft_ms.p50))
            .with("ttft_p95_ms", f(&|x| x.at_load.ttft_ms.p95))
            .with("ttft_p99_ms", f(&|x| x.at_load.ttft_ms.p99))
            .with("tpot_p50_ms", f(&|x| x.at_load.tpot_ms.p50))
            .with("e2e_p95_ms", f(&|x| x.at_load.e2e_ms.p95))
            .with("goodput_rps", f(&|x| x.at_load.goodput_rps))
            .with("image_hit_rate", f(&|x| x.at_load.image_hit_rate))
            .with("kv_block_hit_rate", f(&|x| x.at_load.kv_block_hit_rate))
            .with("encoder_gpu_s", f(&|x| x.at_load.encoder_gpu_s))
            .with("encoder_gpu_s_saved", f(&|x| x.at_load.encoder_gpu_s_saved))
            .with("forks", u(&|x| x.at_load.forks))
            .with(
                "fork_prefill_tokens_avoided",
                u(&|x| x.at_load.fork_prefill_tokens_avoided),
            )
            .with("preemptions", u(&|x| x.at_load.preemptions))
            .with("completed", u(&|x| x.at_load.completed))
    }
}

//! The whole cross-validation in one call (`moonagent validate all`): profile the
//! operators, fit, generate a trace the fit never saw, run it on the backend at two loads
//! (light, and ~70% of capacity) with repeats, simulate each run with the fitted profile
//! and compare request by request.
//!
//! Capacity (what the loads are fractions of) is by default the backend's own: a burst of
//! requests arriving at once, on a trace of its own, measured ([`CapacityBasis`]); the
//! simulator's saturated throughput on the same burst stands beside it as a prediction.
//! [`CapacityBasis::Simulated`] takes the simulator's instead (every figure before
//! 2026-12-07, night).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use moonagent_core::serve::Mode;
use moonagent_core::store::{MemStoreConfig, Store, SEC};
use moonagent_models::calibrate::Sample;
use moonagent_models::{
    DecodeContention, FormFit, Group, HardwareProfile, ModelSpec, Roofline, StepScale,
};
use moonagent_sim::des::{simulate, SimConfig};
use moonagent_traces::gen::workloads::{WorkloadConfig, WorkloadGen};
use moonagent_traces::schema::Request;
use serde::Serialize;

use crate::backend::{Executor, RunOptions};
use crate::compare::{compare, repeat_difference, sim_vs_sim, Comparison, SIM_TIMED};
use crate::cores::HostSched;
use crate::measure::{
    mem_store, read_lines, run_trace, write_lines, write_run, MeasureError, RunSummary,
};
use crate::profile::{self, ContentionPlan, Grid, Order, Profile};

/// The cluster the CPU backend runs: one encoder, one prefill and one decode worker (B0:
/// one colocated worker), the scaled model, loopback TCP.
pub fn cpu_config(mode: Mode) -> SimConfig {
    SimConfig {
        mode,
        hardware: "cpu".into(),
        model: "qwen2.5-vl-tiny".into(),
        tp: 1,
        gpus: 3,
        encoders: 1,
        prefills: 1,
        decodes: 1,
        link: "tcp".into(),
        encoder_max_batch_tokens: 1024,
        prefill_chunk_tokens: 512,
        decode_max_batch: 16,
        kv_block_tokens: 16,
        kv_mem_fraction: KV_MEM_FRACTION,
        kv_prefix_store: true,
        store: MemStoreConfig {
            capacity_bytes: 1 << 30,
            kv_lease_ttl_ns: 10 * SEC,
            ..MemStoreConfig::default()
        },
        ..SimConfig::default()
    }
}

/// The model the study runs unless told otherwise (a CPU runs it: `qwen2.5-vl-tiny`).
pub const STUDY_MODEL: &str = "qwen2.5-vl-tiny";

/// The share of a worker's memory the default model's KV pool gets in the study's runs.
const KV_MEM_FRACTION: f64 = 0.0005;

/// [`cpu_config`] on `model`: the default model as it is; another model gets the KV memory
/// fraction under which its pool holds as many tokens as the default model's pool on `hw`
/// (a real checkpoint's weights alone exceed the default fraction of any device), so the
/// same trace meets the same KV pressure whatever the model's size. Fails when that pool
/// and the model's weights do not fit `hw`.
pub fn model_config(
    mode: Mode,
    model: &str,
    hw: &HardwareProfile,
) -> Result<SimConfig, MeasureError> {
    let base = cpu_config(mode);
    if model == base.model {
        return Ok(base);
    }
    let resolve = |m: &str| ModelSpec::resolve(m).map_err(|e| sim_models("model", e));
    let (default, spec) = (resolve(&base.model)?, resolve(model)?);
    let hbm = hw.hbm_capacity_bytes as f64;
    let pool_tokens = ((hbm * KV_MEM_FRACTION - default.llm_resident_bytes() as f64).max(0.0)
        / default.kv_bytes_per_token() as f64)
        .floor();
    // One token more than the pool, so that rounding never leaves it a token short.
    let need =
        spec.llm_resident_bytes() as f64 + (pool_tokens + 1.0) * spec.kv_bytes_per_token() as f64;
    let fraction = need / hbm;
    if !(fraction > 0.0 && fraction <= 1.0) {
        return Err(MeasureError::Sim(moonagent_sim::des::SimError::Config {
            field: "model",
            what: format!(
                "`{model}`: its weights and a KV pool of {pool_tokens} tokens need {need:.3e} \
                 bytes; the hardware has {hbm:.3e}"
            ),
        }));
    }
    Ok(SimConfig {
        model: model.into(),
        kv_mem_fraction: fraction,
        ..base
    })
}

/// The validation workload: W3's shape (repeated images, a shared system prompt, some
/// agent forks) scaled to the CPU model: one 224x224 or 448x448 image (64 or 256 visual
/// tokens) per request, half of them repeats, 64-256 text tokens, 16-64 output tokens.
pub fn workload(requests: u64, rate: f64) -> WorkloadConfig {
    WorkloadConfig {
        requests,
        rate,
        images_min: 1,
        images_max: 1,
        repeat_rate: 0.5,
        repeat_pool: 32,
        branches_min: 1,
        branches_max: 2,
        image_sizes: vec![[224, 224], [448, 448]],
        text_tokens_min: 64,
        text_tokens_max: 256,
        output_tokens_min: 16,
        output_tokens_max: 64,
        branch_output_tokens_min: 16,
        branch_output_tokens_max: 32,
        system_prompt_tokens: 128,
        tenants: 1,
        block_size_tokens: 64,
    }
}

/// A generated trace and its block size.
pub fn generate(requests: u64, rate: f64, seed: u64) -> Result<(Vec<Request>, u32), MeasureError> {
    let gen = WorkloadGen::new("validate", workload(requests, rate), seed)?;
    let bs = gen.header().block_size_tokens;
    Ok((gen.collect(), bs))
}

/// What `validate all` does.
#[derive(Debug, Clone)]
pub struct StudyConfig {
    /// Modes run on the backend.
    pub modes: Vec<Mode>,
    /// Requests per run.
    pub requests: u64,
    /// Runs per (mode, load).
    pub repeats: u32,
    /// Loads as fractions of each mode's capacity ([`StudyConfig::capacity`]).
    pub loads: Vec<f64>,
    /// Whose capacity the loads are fractions of.
    pub capacity: CapacityBasis,
    /// Trace seed (the profile grid never sees this trace).
    pub seed: u64,
    /// The profile's design grid.
    pub grid: Grid,
    /// Hold-out shapes for the profile's error.
    pub holdout: usize,
    /// The contention run that fits the shared cores' weights per step kind (when the
    /// executor's workers share cores); `None` leaves them equal.
    pub contention: Option<ContentionPlan>,
    /// How every run's (and the contention run's) compute threads share the host's cores.
    pub host_sched: HostSched,
    /// The hardware profile whose parameters the fit adjusts (a name or a profile file):
    /// `cpu` for the CPU backend, the GPU's own (`h200`) for the CUDA one.
    pub base_hardware: String,
    /// What ran the operators, as the report names it (`cpu`, `cuda:0`).
    pub compute: String,
    /// The compute cost forms the profile fit may choose from ([`profile::fit`]).
    pub rooflines: Vec<Roofline>,
    /// The model the backend runs (the executor's) and the simulator prices
    /// ([`model_config`]).
    pub model: String,
    /// The calibration run before the study's runs ([`CalibrationPlan`]); `None`: the runs
    /// are compared with the operator profile alone.
    pub calibration: Option<CalibrationPlan>,
}

/// A study's calibration run: one run of `mode` at `load` of the operator profile's
/// capacity, `requests` requests of the study's workload on a trace of its own (the
/// study's seed + 1, never one the study is judged on). Its compute steps that ran alone
/// (mean concurrency over the step at most [`ALONE_BUSY`]) give each kind's
/// measured / profiled time, the profile's `step_scale`: how a serving run's steps differ
/// from the profile's (which times each shape back to back, hot) on this host at this
/// hour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CalibrationPlan {
    /// Mode of the run (B3: every kind on a worker of its own, so most steps run alone at
    /// light load).
    pub mode: Mode,
    /// Load as a fraction of the operator profile's simulated capacity.
    pub load: f64,
    /// Requests.
    pub requests: u64,
}

impl Default for CalibrationPlan {
    fn default() -> Self {
        Self {
            mode: Mode::B3,
            load: 0.2,
            requests: 100,
        }
    }
}

/// Whose saturated throughput a study's loads are fractions of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CapacityBasis {
    /// The backend's: one burst per mode of at most [`CAPACITY_REQUESTS`] of the study's
    /// requests arriving at once, on a trace of its own (the study's seed + 2), completed
    /// requests per second ([`CapacityRun`]). The default since 2026-12-07: the simulator
    /// overestimated the 2-core host's capacity by 14-22% (it does not know that steps
    /// run slower on their cores while more steps than cores share them), so its "70%"
    /// was the host's 85-98%.
    #[default]
    Measured,
    /// The simulator's with the operator profile, the study's workload arriving at once.
    Simulated,
}

/// The most requests of a measured capacity burst ([`CapacityBasis::Measured`]).
pub const CAPACITY_REQUESTS: u64 = 100;

/// A mode's capacity measured on the backend ([`CapacityBasis::Measured`]).
#[derive(Debug, Clone, Serialize)]
pub struct CapacityRun {
    /// Mode.
    pub mode: String,
    /// Requests of the burst.
    pub requests: u64,
    /// Trace seed.
    pub seed: u64,
    /// Completed requests per second of the measured run.
    pub measured_rps: f64,
    /// The simulator's throughput on the same burst with the operator profile.
    pub simulated_rps: f64,
    /// The simulator's throughput on the same burst with each round's calibrated profile
    /// (the study's headline profile: `step_scale` and `oversubscribed`), by round; empty
    /// without calibration runs. The `oversubscribed` factors are fitted on the bursts
    /// themselves: in sample.
    pub calibrated_rps: Vec<f64>,
    /// The same with each round's `step_scale` alone (out of sample: the calibration
    /// runs' trace, seed + 1 at light load, is not the burst's, seed + 2).
    pub alone_calibrated_rps: Vec<f64>,
    /// Per kind, measured / profiled (operator profile) time of the burst's steps that ran
    /// with every worker busy ([`all_busy_ratios`]).
    #[serde(skip)]
    all_busy: [Vec<f64>; 3],
    /// The burst's decode iterations that ran with every worker busy
    /// ([`all_busy_decode`]): what `decode_contention` is fitted on.
    #[serde(skip)]
    all_busy_decode: Vec<AllBusyDecode>,
    /// The run's summary.
    pub run: RunSummary,
    /// The burst and the mode's configuration, to simulate it again with each round's
    /// calibrated profile.
    #[serde(skip)]
    burst: (SimConfig, Vec<Request>, u32),
}

/// A step ran alone when the mean number of compute steps running over its span (itself
/// included) is at most this.
pub const ALONE_BUSY: f64 = 1.05;

/// A kind with fewer steps that ran alone keeps the factor 1 (too few to take a median).
pub const MIN_ALONE_STEPS: usize = 5;

/// The calibration run's result ([`CalibrationPlan`]).
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    /// The round it opened (its factors price that round's runs).
    pub round: u32,
    /// Mode.
    pub mode: String,
    /// Load as a fraction of the operator profile's capacity.
    pub load: f64,
    /// Offered rate, requests per second.
    pub rate: f64,
    /// Trace seed.
    pub seed: u64,
    /// Requests.
    pub requests: u64,
    /// The run's summary.
    pub run: RunSummary,
    /// Compute steps per kind `[encode, prefill, decode]`.
    pub steps: [usize; 3],
    /// Steps per kind that ran alone.
    pub alone: [usize; 3],
    /// The factors that went into the profile.
    pub step_scale: StepScale,
    /// The profile's `oversubscribed` factors for the round ([`oversubscribed_factors`]
    /// of the capacity bursts over this round's `step_scale`); `None` without bursts or
    /// when the workers do not outnumber the cores.
    pub oversubscribed: Option<StepScale>,
    /// The bursts' steps per kind that ran with every worker busy (what those factors are
    /// medians of).
    pub all_busy_steps: [usize; 3],
    /// The profile's `decode_contention` for the round ([`decode_contention_fit`] of the
    /// bursts' all-busy decode iterations over this round's alone decode factor); `None`
    /// where `oversubscribed` is.
    pub decode_contention: Option<DecodeContention>,
}

/// Each kind's median measured / profiled time over the steps of `timed` that ran alone
/// ([`ALONE_BUSY`]), priced by `hw` (its own `step_scale` included), with the count of
/// steps and of steps alone per kind; a kind with fewer than [`MIN_ALONE_STEPS`] alone
/// gets 1.
pub fn alone_stretch(
    timed: &[crate::backend::Timed],
    hw: &HardwareProfile,
    spec: &ModelSpec,
) -> Result<(StepScale, [usize; 3], [usize; 3]), MeasureError> {
    let mut r: [Vec<f64>; 3] = Default::default();
    let mut steps = [0usize; 3];
    for (_, k, busy, ratio) in busy_ratios(timed, hw, spec)? {
        steps[k] += 1;
        if busy <= ALONE_BUSY {
            r[k].extend(ratio);
        }
    }
    let alone = [r[0].len(), r[1].len(), r[2].len()];
    let f = r.map(|v| {
        if v.len() < MIN_ALONE_STEPS {
            1.0
        } else {
            median(v).unwrap_or(1.0)
        }
    });
    Ok((
        StepScale {
            encode: f[0],
            prefill: f[1],
            decode: f[2],
        },
        steps,
        alone,
    ))
}

/// Per kind, how much slower its steps ran while every one of `workers` compute workers
/// had a step running (mean concurrency over the step at least `workers` less the slack
/// of [`ALONE_BUSY`]) than the run's steps of that kind that ran alone: the median
/// measured / profiled time of the first over that of the second, so the host's speed in
/// that run cancels out. Equal processor sharing (the simulator's model without
/// contention weights, INVARIANTS D9) predicts `workers / cores` for every kind. `None`
/// for a kind with fewer than [`MIN_ALONE_STEPS`] steps in either set.
pub fn contended_stretch(
    timed: &[crate::backend::Timed],
    hw: &HardwareProfile,
    spec: &ModelSpec,
    workers: usize,
) -> Result<[Option<f64>; 3], MeasureError> {
    let [alone, all] = alone_and_all_busy(timed, hw, spec, workers)?;
    let mut out = [None; 3];
    for (k, (a, b)) in alone.into_iter().zip(all).enumerate() {
        if a.len() >= MIN_ALONE_STEPS && b.len() >= MIN_ALONE_STEPS {
            if let (Some(a), Some(b)) = (median(a), median(b)) {
                out[k] = (a > 0.0).then(|| b / a);
            }
        }
    }
    Ok(out)
}

/// Per kind, the measured / profiled (`hw`) time of each step of `timed` that ran while
/// every one of `workers` compute workers had a step running (as [`contended_stretch`]
/// counts them).
pub fn all_busy_ratios(
    timed: &[crate::backend::Timed],
    hw: &HardwareProfile,
    spec: &ModelSpec,
    workers: usize,
) -> Result<[Vec<f64>; 3], MeasureError> {
    let [_, all] = alone_and_all_busy(timed, hw, spec, workers)?;
    Ok(all)
}

/// Per kind, the measured / profiled (`hw`) times of the steps of `timed` that ran alone
/// (mean concurrency at most [`ALONE_BUSY`]) and of those that ran while all `workers` had
/// a step running (at least `workers` less the same slack).
fn alone_and_all_busy(
    timed: &[crate::backend::Timed],
    hw: &HardwareProfile,
    spec: &ModelSpec,
    workers: usize,
) -> Result<[KindRatios; 2], MeasureError> {
    let mut alone: [Vec<f64>; 3] = Default::default();
    let mut all: [Vec<f64>; 3] = Default::default();
    for (_, k, busy, ratio) in busy_ratios(timed, hw, spec)? {
        if busy <= ALONE_BUSY {
            alone[k].extend(ratio);
        }
        if all_busy(busy, workers) {
            all[k].extend(ratio);
        }
    }
    Ok([alone, all])
}

/// Measured / profiled times, per kind `[encode, prefill, decode]`.
type KindRatios = [Vec<f64>; 3];

/// Whether a step whose mean concurrency was `busy` ran with every one of `workers` busy
/// (at least `workers` less the slack of [`ALONE_BUSY`]).
fn all_busy(busy: f64, workers: usize) -> bool {
    busy >= workers as f64 - (ALONE_BUSY - 1.0)
}

/// Processor sharing's stretch `workers / cores` when the workers outnumber the cores
/// (`None` otherwise, NaN included: nothing is ever oversubscribed).
fn oversubscribed_share(workers: usize, cores: f64) -> Option<f64> {
    let share = workers as f64 / cores;
    (share.partial_cmp(&1.0) == Some(std::cmp::Ordering::Greater)).then_some(share)
}

/// The profile's `oversubscribed` factors: per kind, the median measured / profiled time
/// of the steps that ran with every worker busy (`all_busy`, pooled over the capacity
/// bursts), over what the simulator already prices for them: processor sharing's stretch
/// `workers / cores` times the kind's `alone` factor (`step_scale`). A kind with fewer
/// than [`MIN_ALONE_STEPS`] such steps keeps 1. `None` when the workers do not outnumber
/// the cores (nothing is ever oversubscribed). With the counts per kind.
pub fn oversubscribed_factors(
    all_busy: &[Vec<f64>; 3],
    workers: usize,
    cores: f64,
    alone: StepScale,
) -> (Option<StepScale>, [usize; 3]) {
    let counts = [all_busy[0].len(), all_busy[1].len(), all_busy[2].len()];
    let Some(share) = oversubscribed_share(workers, cores) else {
        return (None, counts);
    };
    let a = alone.as_array();
    let f: Vec<f64> = (0..3)
        .map(|k| match median(all_busy[k].clone()) {
            Some(m) if counts[k] >= MIN_ALONE_STEPS && a[k] > 0.0 => m / (share * a[k]),
            _ => 1.0,
        })
        .collect();
    (
        Some(StepScale {
            encode: f[0],
            prefill: f[1],
            decode: f[2],
        }),
        counts,
    )
}

/// A decode iteration that ran with every worker busy: its measured / profiled time, the
/// KV share of its bytes (`CostModel::decode_kv_share`) and the encoder batches beside it
/// (the time other workers ran encoder batches during its span, over the span:
/// [`corunners`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllBusyDecode {
    /// Measured / profiled time.
    pub ratio: f64,
    /// KV share of the bytes it read.
    pub kv_share: f64,
    /// Encoder batches beside it, time-averaged over its span.
    pub encoders: f64,
}

/// The decode iterations of `timed` (without extras) that ran while all `workers` had a
/// step running, as [`alone_and_all_busy`] counts them, priced by `hw`.
pub fn all_busy_decode(
    timed: &[crate::backend::Timed],
    hw: &HardwareProfile,
    spec: &ModelSpec,
    workers: usize,
) -> Result<Vec<AllBusyDecode>, MeasureError> {
    use crate::backend::{Step, Work};
    let cost =
        moonagent_models::CostModel::new(hw, spec, 1).map_err(|e| sim_models("cost model", e))?;
    let beside = corunners(timed);
    Ok(busy_ratios(timed, hw, spec)?
        .into_iter()
        .filter_map(|(i, k, busy, ratio)| {
            let Work::Step(Step::Decode { batch, ctx_sum, .. }) = &timed[i].what else {
                return None;
            };
            (k == 2 && all_busy(busy, workers)).then_some(AllBusyDecode {
                ratio: ratio?,
                kv_share: cost.decode_kv_share(*batch, *ctx_sum),
                encoders: beside[i][0],
            })
        })
        .collect())
}

/// The profile's `decode_contention`: least squares, without intercept, of each all-busy
/// decode iteration's loss beyond what the simulator already prices (`ratio / (workers /
/// cores x alone) - 1`) on its KV share and the encoder batches beside it; a negative
/// coefficient is set to 0 and the other fitted alone. `None` when the workers do not
/// outnumber the cores or fewer than [`MIN_ALONE_STEPS`] iterations are given.
pub fn decode_contention_fit(
    steps: &[AllBusyDecode],
    workers: usize,
    cores: f64,
    alone: f64,
) -> Option<DecodeContention> {
    let share = oversubscribed_share(workers, cores)?;
    if steps.len() < MIN_ALONE_STEPS || alone.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
    {
        return None;
    }
    let (mut saa, mut sbb, mut sab, mut say, mut sby) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for s in steps {
        let y = s.ratio / (share * alone) - 1.0;
        let (a, b) = (s.kv_share, s.encoders);
        saa += a * a;
        sbb += b * b;
        sab += a * b;
        say += a * y;
        sby += b * y;
    }
    let one = |sxy: f64, sxx: f64| if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
    let det = saa * sbb - sab * sab;
    let (mut kv, mut encoder) = if det > 0.0 {
        ((say * sbb - sby * sab) / det, (sby * saa - say * sab) / det)
    } else {
        (one(say, saa), 0.0)
    };
    if kv < 0.0 {
        (kv, encoder) = (0.0, one(sby, sbb));
    } else if encoder < 0.0 {
        (kv, encoder) = (one(say, saa), 0.0);
    }
    (kv.is_finite() && encoder.is_finite()).then_some(DecodeContention { kv, encoder })
}

/// Per step of `timed` (by index; 0 for what is not a compute step), the time other
/// workers ran a compute step of each kind `[encode, prefill, decode]` during its span,
/// over the span. A worker's steps do not overlap, so per worker they are in start order
/// and those overlapping a span are found by a binary search and a short walk.
pub fn corunners(timed: &[crate::backend::Timed]) -> Vec<[f64; 3]> {
    use crate::backend::{Step, Work};
    let kind = |t: &crate::backend::Timed| match &t.what {
        Work::Step(Step::Encode { .. }) => Some(0),
        Work::Step(Step::Prefill(_)) => Some(1),
        Work::Step(Step::Decode { .. }) => Some(2),
        _ => None,
    };
    let span = |t: &crate::backend::Timed| (t.start_ns, t.start_ns.saturating_add(t.measured_ns));
    let mut by_worker: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (i, t) in timed.iter().enumerate() {
        if kind(t).is_some() {
            by_worker.entry(t.worker).or_default().push(i);
        }
    }
    for v in by_worker.values_mut() {
        v.sort_by_key(|&i| timed[i].start_ns);
    }
    timed
        .iter()
        .map(|t| {
            let (a0, a1) = span(t);
            let mut with = [0.0; 3];
            if kind(t).is_none() || a1 == a0 {
                return with;
            }
            for (&w, v) in &by_worker {
                if w == t.worker {
                    continue;
                }
                let first = v.partition_point(|&j| span(&timed[j]).1 <= a0);
                for &j in &v[first..] {
                    let (b0, b1) = span(&timed[j]);
                    if b0 >= a1 {
                        break;
                    }
                    if let Some(k) = kind(&timed[j]) {
                        with[k] += (b1.min(a1) - b0.max(a0)) as f64;
                    }
                }
            }
            with.map(|x| x / (a1 - a0) as f64)
        })
        .collect()
}

/// `(index in timed, kind, mean concurrency, measured / profiled time)` of a step.
type BusyRatio = (usize, usize, f64, Option<f64>);

/// Every compute step of `timed` that `hw` prices alone ([`step_ratios`]): its index in
/// `timed`, its kind, its mean concurrency ([`step_concurrency`]) and its measured /
/// profiled time.
fn busy_ratios(
    timed: &[crate::backend::Timed],
    hw: &HardwareProfile,
    spec: &ModelSpec,
) -> Result<Vec<BusyRatio>, MeasureError> {
    let mut busy = vec![f64::NAN; timed.len()];
    for (i, b) in step_concurrency(timed) {
        busy[i] = b;
    }
    Ok(step_ratios(timed, hw, spec)?
        .into_iter()
        .map(|(i, k, ratio)| (i, k, busy[i], ratio))
        .collect())
}

impl Default for StudyConfig {
    fn default() -> Self {
        Self {
            modes: vec![Mode::B0, Mode::B3],
            requests: 200,
            repeats: 3,
            loads: vec![0.2, 0.7],
            capacity: CapacityBasis::default(),
            seed: 17,
            grid: Grid::cpu_default(),
            holdout: 8,
            contention: Some(ContentionPlan::cpu_default()),
            host_sched: HostSched::default(),
            base_hardware: "cpu".into(),
            compute: "cpu".into(),
            rooflines: Roofline::ALL.to_vec(),
            model: STUDY_MODEL.into(),
            calibration: Some(CalibrationPlan::default()),
        }
    }
}

/// How long each half of the host probe before and after every run takes (one thread,
/// then every core).
pub const HOST_PROBE: std::time::Duration = std::time::Duration::from_millis(250);

/// Median of measured / predicted time of a run's compute steps with the fitted profile,
/// per kind: `[encode, prefill, decode]` (decode iterations without extras). 1 when the
/// steps ran as fast as when profiled alone; above 1 they ran slower in the run, e.g.
/// because more workers were busy than the machine has cores. 0 for a kind that never ran.
pub fn step_stretch(
    timed: &[crate::backend::Timed],
    hw: &HardwareProfile,
    spec: &ModelSpec,
) -> Result<[f64; 3], MeasureError> {
    let mut r: [Vec<f64>; 3] = Default::default();
    for (_, k, ratio) in step_ratios(timed, hw, spec)? {
        r[k].extend(ratio);
    }
    Ok(r.map(|v| median(v).unwrap_or(0.0)))
}

/// Every compute step of `timed` that `hw` prices alone ([`alone_ns`]): its index in
/// `timed`, its kind, and its measured / priced time (`None` when priced at 0).
fn step_ratios(
    timed: &[crate::backend::Timed],
    hw: &HardwareProfile,
    spec: &ModelSpec,
) -> Result<Vec<(usize, usize, Option<f64>)>, MeasureError> {
    use crate::backend::Work;
    let cost =
        moonagent_models::CostModel::new(hw, spec, 1).map_err(|e| sim_models("cost model", e))?;
    Ok(timed
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let Work::Step(step) = &t.what else {
                return None;
            };
            let (k, p) = alone_ns(&cost, step)?;
            Some((i, k, (p > 0).then(|| t.measured_ns as f64 / p as f64)))
        })
        .collect())
}

/// For each compute step of `timed`, in order, its index in `timed` and the mean number
/// of compute steps running over its span, itself included (1.0: it ran alone). Steps
/// are counted from their measured start and duration; transfers and fingerprints are
/// not compute steps and get no entry.
pub fn step_concurrency(timed: &[crate::backend::Timed]) -> Vec<(usize, f64)> {
    use crate::backend::Work;
    let steps: Vec<(usize, u64, u64)> = timed
        .iter()
        .enumerate()
        .filter(|(_, t)| matches!(t.what, Work::Step(_)))
        .map(|(i, t)| (i, t.start_ns, t.start_ns.saturating_add(t.measured_ns)))
        .collect();
    // Busy-step count as a step function of time: +1 at each start, -1 at each end (an
    // end sorts before a start at the same instant).
    let mut edges: Vec<(u64, i64)> = steps
        .iter()
        .flat_map(|&(_, a, b)| [(a, 1), (b, -1)])
        .collect();
    edges.sort_unstable();
    let mut level = Vec::with_capacity(edges.len());
    let mut n = 0i64;
    for &(_, d) in &edges {
        n += d;
        level.push(n);
    }
    steps
        .iter()
        .map(|&(i, a, b)| {
            if b <= a {
                return (i, 1.0);
            }
            // The level just after the last edge at or before `a`, then every edge to `b`.
            let mut j = edges.partition_point(|e| e.0 <= a);
            let mut cur = if j == 0 { 0 } else { level[j - 1] };
            let (mut last, mut area) = (a, 0f64);
            while j < edges.len() && edges[j].0 < b {
                area += cur as f64 * (edges[j].0 - last) as f64;
                last = edges[j].0;
                cur = level[j];
                j += 1;
            }
            area += cur as f64 * (b - last) as f64;
            (i, area / (b - a) as f64)
        })
        .collect()
}

/// What a run's compute steps add up to: how long each number of them ran at once, and per
/// kind how many ran, for how long and how large. From a measured run's `timed.jsonl` or a
/// simulated one's (`compare::sim_timed`), so the two set side by side.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StepTotals {
    /// Share of the span from the first step's start to the last step's end during which
    /// `k` compute steps were running, `k = 0, 1, ...` (sums to 1; empty without steps).
    pub busy: Vec<f64>,
    /// Steps per kind (encode, prefill, decode).
    pub steps: [u64; 3],
    /// Their summed spans per kind, seconds (start to end, waiting for a core included).
    pub seconds: [f64; 3],
    /// Mean batch per kind: images per encoder batch, chunks per prefill, sequences per
    /// decode iteration.
    pub mean_batch: [f64; 3],
}

/// [`StepTotals`] of the compute steps in `timed` (transfers and fingerprints left out).
pub fn step_totals(timed: &[crate::backend::Timed]) -> StepTotals {
    use crate::backend::{Step, Work};
    let mut t = StepTotals::default();
    let (mut batch, mut ns) = ([0u64; 3], [0u64; 3]);
    let mut edges: Vec<(u64, i64)> = Vec::new();
    for x in timed {
        let Work::Step(step) = &x.what else { continue };
        let (k, b) = match step {
            Step::Encode { tokens, .. } => (0, tokens.len() as u64),
            Step::Prefill(chunks) => (1, chunks.len() as u64),
            Step::Decode { batch, .. } => (2, u64::from(*batch)),
        };
        t.steps[k] += 1;
        ns[k] += x.measured_ns;
        batch[k] += b;
        let end = x.start_ns.saturating_add(x.measured_ns);
        edges.extend([(x.start_ns, 1), (end, -1)]);
    }
    for k in 0..3 {
        t.mean_batch[k] = batch[k] as f64 / t.steps[k].max(1) as f64;
        t.seconds[k] = ns[k] as f64 / 1e9;
    }
    // An end sorts before a start at the same instant.
    edges.sort_unstable();
    let (Some(first), Some(last)) = (edges.first(), edges.last()) else {
        return t;
    };
    let span = (last.0 - first.0) as f64;
    let mut n = 0i64;
    let mut at = first.0;
    for &(time, d) in &edges {
        let level = n.max(0) as usize;
        if t.busy.len() <= level {
            t.busy.resize(level + 1, 0.0);
        }
        t.busy[level] += (time - at) as f64;
        at = time;
        n += d;
    }
    for v in &mut t.busy {
        *v = if span > 0.0 { *v / span } else { 0.0 };
    }
    t
}

impl StepTotals {
    /// A Markdown table of a measured run's totals beside a simulated one's (what
    /// `validate compare` prints): time with each number of steps running, step time,
    /// steps and mean batch per kind.
    pub fn markdown_pair(measured: &StepTotals, simulated: &StepTotals) -> String {
        let levels = measured.busy.len().max(simulated.busy.len());
        let row = |name: &str, t: &StepTotals| {
            let busy: Vec<String> = (0..levels)
                .map(|k| format!("{:.3}", t.busy.get(k).copied().unwrap_or(0.0)))
                .collect();
            format!(
                "| {name} | {} | {:.2} / {:.2} / {:.2} | {} / {} / {} | {:.2} / {:.2} / {:.2} |\n",
                busy.join(" / "),
                t.seconds[0],
                t.seconds[1],
                t.seconds[2],
                t.steps[0],
                t.steps[1],
                t.steps[2],
                t.mean_batch[0],
                t.mean_batch[1],
                t.mean_batch[2],
            )
        };
        format!(
            "## Compute steps\n\n| run | time with 0..{} steps running | step time E/P/D s | steps E/P/D | mean batch E/P/D |\n|---|---|---|---|---|\n{}{}",
            levels.saturating_sub(1),
            row("measured", measured),
            row("simulated", simulated)
        )
    }
}

/// A compute step's kind (`0` encode, `1` prefill, `2` decode) and its time alone by
/// `cost`, as [`step_stretch`] judges it; `None` for a decode iteration with extras
/// (recomputes, fork copies), which the cost model does not price alone.
pub fn alone_ns(
    cost: &moonagent_models::CostModel,
    step: &crate::backend::Step,
) -> Option<(usize, u64)> {
    use crate::backend::Step;
    match step {
        Step::Encode { tokens, .. } => Some((0, cost.encoder_time_ns(tokens))),
        Step::Prefill(chunks) => Some((1, cost.prefill_batch_time_ns(chunks))),
        Step::Decode {
            batch,
            ctx_sum,
            extra,
        } if extra.is_empty() => Some((2, cost.decode_iter_time_ns(*batch, *ctx_sum))),
        _ => None,
    }
}

/// One measured run, compared.
#[derive(Debug, Clone, Serialize)]
pub struct StudyRun {
    /// Mode.
    pub mode: String,
    /// Load as a fraction of the simulated capacity.
    pub load: f64,
    /// Offered rate, requests per second.
    pub rate: f64,
    /// Repeat index: the round the run was measured in (after that round's calibration
    /// run).
    pub repeat: u32,
    /// Median measured / profiled compute step time per kind ([`step_stretch`]).
    pub step_stretch: [f64; 3],
    /// Per kind, the stretch of the steps that ran while every worker was busy over the
    /// run's steps that ran alone ([`contended_stretch`]); `None` with too few of either.
    pub contended_stretch: [Option<f64>; 3],
    /// The run's summary.
    pub run: RunSummary,
    /// Simulated against measured: with the round's calibrated profile (the operator
    /// profile with its calibration run's `step_scale`) when the study has calibration
    /// runs, else with the operator profile.
    pub comparison: Comparison,
    /// Simulated with the operator profile alone (no `step_scale`) against measured, when
    /// `comparison` is the calibrated one; `None` in a study without calibration runs.
    pub operator: Option<Comparison>,
    /// The run's compute steps added up ([`step_totals`] of its `timed.jsonl`).
    pub steps_measured: StepTotals,
    /// The same of `comparison`'s simulated run (its `simulated-timed.jsonl`).
    pub steps_simulated: StepTotals,
}

/// The result of `validate all`.
#[derive(Debug, Clone, Serialize)]
pub struct Study {
    /// Cores this machine offers (`available_parallelism`).
    pub cores: usize,
    /// Compute workers of each run (each a thread).
    pub workers: u32,
    /// How the runs' compute threads shared the cores.
    pub host_sched: HostSched,
    /// What ran the operators (`cpu`, `cuda:0`).
    pub compute: String,
    /// The model spec the backend ran and the simulator priced.
    pub model: String,
    /// The profile fit.
    pub profile: Profile,
    /// The calibration runs, one opening each round, when the study has them: every run
    /// is compared with the operator profile plus its round's `step_scale`
    /// (`profile/profile-calibrated-<round>.toml`: the headline) and with the operator
    /// profile alone.
    pub calibrations: Vec<Calibration>,
    /// Simulated saturated throughput per mode (the study's workload at once, operator
    /// profile), requests per second.
    pub capacity_rps: Vec<(String, f64)>,
    /// Whose capacity the loads are fractions of.
    pub capacity_basis: CapacityBasis,
    /// The measured capacity bursts, one per mode ([`CapacityBasis::Measured`]).
    pub capacity_runs: Vec<CapacityRun>,
    /// Every run.
    pub runs: Vec<StudyRun>,
    /// Per mode and load: how close any simulator could come ([`Floor`]).
    pub floors: Vec<Floor>,
    /// Runs the study planned (modes x loads x repeats); more than `runs.len()` in the
    /// report written after each run while the study goes on.
    pub runs_planned: usize,
}

/// What bounds the per-request error of one mode and load from below, measured beside its
/// runs: how far the repeats differ from each other, and how far the simulator moves
/// when every compute step is [`STEP_ERROR`] slower.
#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// Mode.
    pub mode: String,
    /// Load as a fraction of the simulated capacity.
    pub load: f64,
    /// Median over pairs of repeats of the per-request TTFT median |difference|, percent
    /// (a later repeat against an earlier one; `None` with one repeat).
    pub repeat_ttft_pct: Option<f64>,
    /// The same for E2E.
    pub repeat_e2e_pct: Option<f64>,
    /// Per-request TTFT median |error| of the simulator against itself with every compute
    /// step `STEP_ERROR` times as long, on the first repeat's arrivals, percent.
    pub step_error_ttft_pct: f64,
    /// The same for E2E.
    pub step_error_e2e_pct: f64,
}

/// The step-time error of [`Floor`]'s sensitivity: every compute step 5% slower.
pub const STEP_ERROR: f64 = 1.05;

/// Where each measured run of a study keeps encoder outputs and prefix KV: called once per
/// run with the run's configuration and a label unique within the study (e.g. `b3-70-0`),
/// it returns a fresh, empty store (a real store namespaces its keys by the label).
pub type StoreFactory<'a> =
    dyn FnMut(&SimConfig, &str) -> Result<Box<dyn Store>, MeasureError> + 'a;

/// The embedded store `cfg` describes, for every run ([`StoreFactory`]).
pub fn embedded_stores(cfg: &SimConfig, _label: &str) -> Result<Box<dyn Store>, MeasureError> {
    Ok(Box::new(mem_store(cfg)?))
}

/// Run the study, writing every file under `out` (`profile/`, `calibration-<k>/`,
/// `runs/<mode>-<load>-<k>/`, `compare.*`, `report.md`); each run's store comes from
/// `stores`. The runs go by rounds: round `k` is calibration run `k`, then run `k` of every
/// mode and load. `say` is told what is happening.
pub fn run_study(
    cfg: &StudyConfig,
    exec: Arc<dyn Executor>,
    stores: &mut StoreFactory<'_>,
    out: &Path,
    mut say: impl FnMut(&str),
) -> Result<Study, MeasureError> {
    let spec = ModelSpec::resolve(&cfg.model).map_err(|e| sim_models("model", e))?;
    let hw0 =
        HardwareProfile::resolve(&cfg.base_hardware).map_err(|e| sim_models("hardware", e))?;
    let grid = cfg.grid.clone().covering(&spec);
    say("profiling operators (design grid)");
    let samples = profile::measure(&grid, exec.as_ref(), |_| {})?;
    say("profiling operators (hold-out set)");
    let hold = profile::measure(&grid.holdout(cfg.seed, cfg.holdout), exec.as_ref(), |_| {})?;
    let mut said = false;
    let plan = cfg.contention.clone().map(|p| ContentionPlan {
        host_sched: cfg.host_sched,
        ..p
    });
    let contention = profile::contention_if_shared(plan.as_ref(), exec.as_ref(), |_| {
        if !std::mem::replace(&mut said, true) {
            say("measuring how concurrent steps share the cores");
        }
    })?;
    let mut fitted = profile::fit(
        &hw0,
        &spec,
        &samples,
        &hold,
        exec.shared_cores(),
        contention,
        &cfg.rooflines,
    )?;
    fitted.order = Some(grid.order);
    let profile_path = write_profile(&out.join("profile"), &fitted, &samples, &hold)?;
    let hw_arg = profile_path.display().to_string();
    let slow = fitted.hardware.with_steps_scaled(STEP_ERROR);
    let slow_arg = write_hardware(
        &out.join("profile")
            .join(format!("profile-steps-x{STEP_ERROR}.toml")),
        &slow,
    )?;
    let base_cfg = cpu_config(Mode::B3);
    // What every report of this study says besides its runs.
    let mut study = Study {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        workers: base_cfg.encoders + base_cfg.prefills + base_cfg.decodes,
        host_sched: cfg.host_sched,
        compute: cfg.compute.clone(),
        model: spec.name.clone(),
        profile: fitted.clone(),
        calibrations: Vec::new(),
        capacity_rps: Vec::new(),
        capacity_basis: cfg.capacity,
        capacity_runs: Vec::new(),
        runs: Vec::new(),
        floors: Vec::new(),
        runs_planned: cfg.modes.len() * cfg.loads.len() * cfg.repeats as usize,
    };
    // Every request arriving at once: the simulated capacity of each mode; then each
    // (mode, load) group's configuration and trace, the same in every round.
    let (sat_trace, sat_bs) = generate(cfg.requests, 1e9, cfg.seed)?;
    let mut groups = Vec::new();
    for &mode in &cfg.modes {
        let mcfg = SimConfig {
            hardware: hw_arg.clone(),
            ..model_config(mode, &cfg.model, &fitted.hardware)?
        };
        let (sat, _) = simulate(&mcfg, &sat_trace, sat_bs)?;
        study
            .capacity_rps
            .push((mode.name().to_string(), sat.throughput_rps));
        let capacity = match cfg.capacity {
            CapacityBasis::Simulated => sat.throughput_rps,
            CapacityBasis::Measured => {
                let requests = cfg.requests.min(CAPACITY_REQUESTS);
                say(&format!(
                    "measuring {}'s capacity ({requests} requests at once)",
                    mode.name()
                ));
                let (mut c, timed) =
                    capacity_run(mode, requests, &mcfg, cfg, Arc::clone(&exec), stores, out)?;
                c.all_busy =
                    all_busy_ratios(&timed, &fitted.hardware, &spec, study.workers as usize)?;
                c.all_busy_decode =
                    all_busy_decode(&timed, &fitted.hardware, &spec, study.workers as usize)?;
                let rps = c.measured_rps;
                study.capacity_runs.push(c);
                write_report(out, &study)?;
                rps
            }
        };
        for &load in &cfg.loads {
            let rate = (load * capacity).max(1e-3);
            let (trace, bs) = generate(cfg.requests, rate, cfg.seed)?;
            groups.push(StudyPoint {
                mode,
                load,
                rate,
                cfg: mcfg.clone(),
                trace,
                bs,
            });
        }
    }
    // By rounds: round k is the calibration run k (when the study has one), then run k of
    // every (mode, load), so each calibration is minutes from the runs it is judged with
    // and every group's repeats are spread over the study alike.
    let mut first_inputs = vec![Vec::new(); groups.len()];
    for k in 0..cfg.repeats {
        let cal_arg = match cfg.calibration {
            None => None,
            Some(plan) => {
                say(&format!(
                    "round {}/{}: calibration run ({} at {:.0}% of capacity, {} requests)",
                    k + 1,
                    cfg.repeats,
                    plan.mode.name(),
                    100.0 * plan.load,
                    plan.requests
                ));
                let mut c = calibration_run(
                    &plan,
                    k,
                    cfg,
                    &spec,
                    &fitted.hardware,
                    &hw_arg,
                    Arc::clone(&exec),
                    stores,
                    out,
                )?;
                // Steps with every worker busy in the capacity bursts, pooled over modes:
                // how much slower than processor sharing and the alone factors predict.
                let mut pooled: [Vec<f64>; 3] = Default::default();
                for cap in &study.capacity_runs {
                    for (p, v) in pooled.iter_mut().zip(&cap.all_busy) {
                        p.extend_from_slice(v);
                    }
                }
                if let (Some(cores), false) =
                    (fitted.hardware.shared_cores, study.capacity_runs.is_empty())
                {
                    (c.oversubscribed, c.all_busy_steps) = oversubscribed_factors(
                        &pooled,
                        study.workers as usize,
                        cores,
                        c.step_scale,
                    );
                    let decode: Vec<AllBusyDecode> = study
                        .capacity_runs
                        .iter()
                        .flat_map(|cap| cap.all_busy_decode.iter().copied())
                        .collect();
                    c.decode_contention = decode_contention_fit(
                        &decode,
                        study.workers as usize,
                        cores,
                        c.step_scale.decode,
                    );
                }
                let alone_hw = HardwareProfile {
                    step_scale: Some(c.step_scale),
                    ..fitted.hardware.clone()
                };
                let hw = HardwareProfile {
                    oversubscribed: c.oversubscribed,
                    decode_contention: c.decode_contention,
                    ..alone_hw.clone()
                };
                let p = write_hardware(&out.join("profile").join(calibrated_profile_name(k)), &hw)?;
                study.calibrations.push(c);
                // The bursts again, priced with this round's factors, and with its
                // alone factors only.
                let alone_p = if study.capacity_runs.is_empty() {
                    String::new()
                } else {
                    write_hardware(
                        &out.join("profile")
                            .join(format!("profile-calibrated-{k}-alone-factors.toml")),
                        &alone_hw,
                    )?
                };
                for c in &mut study.capacity_runs {
                    let (mcfg, trace, bs) = &c.burst;
                    let ccfg = SimConfig {
                        hardware: p.clone(),
                        ..mcfg.clone()
                    };
                    c.calibrated_rps
                        .push(simulate(&ccfg, trace, *bs)?.0.throughput_rps);
                    let acfg = SimConfig {
                        hardware: alone_p.clone(),
                        ..mcfg.clone()
                    };
                    c.alone_calibrated_rps
                        .push(simulate(&acfg, trace, *bs)?.0.throughput_rps);
                }
                write_report(out, &study)?;
                Some(p)
            }
        };
        for (g, pt) in groups.iter().enumerate() {
            let StudyPoint {
                mode,
                load,
                rate,
                cfg: ref mcfg,
                ref trace,
                bs,
            } = *pt;
            say(&format!(
                "round {}/{}: {} at {:.0}% of capacity ({rate:.2} req/s)",
                k + 1,
                cfg.repeats,
                mode.name(),
                100.0 * load,
            ));
            let label = format!("{}-{:.0}-{}", mode.name(), 100.0 * load, k);
            let runs = out.join("runs");
            let exec = Arc::clone(&exec);
            let (m, s) = stored_run(mcfg, trace, bs, &runs, &label, exec, cfg, stores)?;
            let stretch = step_stretch(&m.timed, &fitted.hardware, &spec)?;
            let contended =
                contended_stretch(&m.timed, &fitted.hardware, &spec, study.workers as usize)?;
            // The headline is the round's calibrated profile when there is one; the
            // operator profile alone is kept beside it.
            let ops = compare(mcfg, trace, bs, &m.inputs, &hw_arg)?;
            let (mut c, mut operator) = match &cal_arg {
                Some(p) => (compare(mcfg, trace, bs, &m.inputs, p)?, Some(ops)),
                None => (ops, None),
            };
            if k == 0 {
                first_inputs[g] = m.inputs;
            }
            // The headline's simulated steps beside the run's measured ones.
            write_lines(&runs.join(&label).join(SIM_TIMED), &c.sim_steps)?;
            c.label = format!("{} {:.0}% #{}", mode.name(), 100.0 * load, k + 1);
            if let Some(o) = &mut operator {
                o.label = format!("{} (operator profile alone)", c.label);
            }
            study.runs.push(StudyRun {
                mode: mode.name().into(),
                load,
                rate,
                repeat: k,
                step_stretch: stretch,
                contended_stretch: contended,
                run: s,
                steps_measured: step_totals(&m.timed),
                steps_simulated: step_totals(&c.sim_steps),
                comparison: c,
                operator,
            });
            // The report so far, so a study stopped part-way still says what it measured.
            write_report(out, &study)?;
        }
    }
    for (g, pt) in groups.iter().enumerate() {
        let group: Vec<&StudyRun> = study
            .runs
            .iter()
            .filter(|r| r.mode == pt.mode.name() && r.load == pt.load)
            .collect();
        let mut repeat = (Vec::new(), Vec::new());
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                let (t, e) = repeat_difference(&a.comparison, &b.comparison);
                repeat.0.push(t.median_abs_pct);
                repeat.1.push(e.median_abs_pct);
            }
        }
        let (t, e) = sim_vs_sim(
            &pt.cfg,
            &pt.trace,
            pt.bs,
            &first_inputs[g],
            &hw_arg,
            &slow_arg,
        )?;
        study.floors.push(Floor {
            mode: pt.mode.name().into(),
            load: pt.load,
            repeat_ttft_pct: median(repeat.0),
            repeat_e2e_pct: median(repeat.1),
            step_error_ttft_pct: t.median_abs_pct,
            step_error_e2e_pct: e.median_abs_pct,
        });
    }
    let cs: Vec<Comparison> = study.runs.iter().map(|r| r.comparison.clone()).collect();
    crate::compare::write(out, "simulated vs measured", &cs, "")?;
    write_report(out, &study)?;
    Ok(study)
}

/// One (mode, load) point of a study: its configuration and trace, the same in every
/// round.
struct StudyPoint {
    mode: Mode,
    load: f64,
    rate: f64,
    cfg: SimConfig,
    trace: Vec<Request>,
    bs: u32,
}

/// Write `hw` as a profile file at `path`; the path as the simulator's `hardware`
/// argument.
fn write_hardware(path: &Path, hw: &HardwareProfile) -> Result<String, MeasureError> {
    let text = hw
        .to_toml_string()
        .map_err(|e| MeasureError::writing(path, e))?;
    std::fs::write(path, text).map_err(|e| MeasureError::writing(path, e))?;
    Ok(path.display().to_string())
}

/// The file name, under the study's `profile/`, of the operator profile with round `k`'s
/// calibration factors.
pub fn calibrated_profile_name(k: u32) -> String {
    format!("profile-calibrated-{k}.toml")
}

/// Run `plan` on the backend as the opening of `round` (a trace of its own: the study's
/// seed + 1, the same in every round, at `plan.load` of the capacity `ops` simulates),
/// write it under `out/calibration-<round>/`, and measure its
/// [`alone_stretch`] against the operator profile `hw` (written at `ops`).
#[allow(clippy::too_many_arguments)]
fn calibration_run(
    plan: &CalibrationPlan,
    round: u32,
    cfg: &StudyConfig,
    spec: &ModelSpec,
    hw: &HardwareProfile,
    ops: &str,
    exec: Arc<dyn Executor>,
    stores: &mut StoreFactory<'_>,
    out: &Path,
) -> Result<Calibration, MeasureError> {
    let seed = cfg.seed.wrapping_add(1);
    let mcfg = SimConfig {
        hardware: ops.to_string(),
        ..model_config(plan.mode, &cfg.model, hw)?
    };
    let (sat_trace, sat_bs) = generate(plan.requests, 1e9, seed)?;
    let (sat, _) = simulate(&mcfg, &sat_trace, sat_bs)?;
    let rate = (plan.load * sat.throughput_rps).max(1e-3);
    let (trace, bs) = generate(plan.requests, rate, seed)?;
    let label = format!("calibration-{round}");
    let (m, s) = stored_run(&mcfg, &trace, bs, out, &label, exec, cfg, stores)?;
    let (step_scale, steps, alone) = alone_stretch(&m.timed, hw, spec)?;
    Ok(Calibration {
        round,
        mode: plan.mode.name().into(),
        load: plan.load,
        rate,
        seed,
        requests: plan.requests,
        run: s,
        steps,
        alone,
        step_scale,
        oversubscribed: None,
        all_busy_steps: [0; 3],
        decode_contention: None,
    })
}

/// `mode`'s capacity on the backend: `requests` requests arriving at once on a trace of
/// their own (the study's seed + 2), written under `out/capacity-<mode>/`, with the
/// simulator's throughput on the same burst (`mcfg`: the operator profile).
#[allow(clippy::too_many_arguments)]
fn capacity_run(
    mode: Mode,
    requests: u64,
    mcfg: &SimConfig,
    cfg: &StudyConfig,
    exec: Arc<dyn Executor>,
    stores: &mut StoreFactory<'_>,
    out: &Path,
) -> Result<(CapacityRun, Vec<crate::backend::Timed>), MeasureError> {
    let seed = cfg.seed.wrapping_add(2);
    let (trace, bs) = generate(requests, 1e9, seed)?;
    let (sim, _) = simulate(mcfg, &trace, bs)?;
    let label = format!("capacity-{}", mode.name());
    let (m, s) = stored_run(mcfg, &trace, bs, out, &label, exec, cfg, stores)?;
    Ok((
        CapacityRun {
            mode: mode.name().into(),
            requests,
            seed,
            measured_rps: s.summary.throughput_rps,
            simulated_rps: sim.throughput_rps,
            calibrated_rps: Vec::new(),
            alone_calibrated_rps: Vec::new(),
            all_busy: Default::default(),
            all_busy_decode: Vec::new(),
            run: s,
            burst: (mcfg.clone(), trace, bs),
        },
        m.timed,
    ))
}

/// [`study_run`] on a fresh store of `stores` named `label`, written to `under/label`.
#[allow(clippy::too_many_arguments)]
fn stored_run(
    mcfg: &SimConfig,
    trace: &[Request],
    bs: u32,
    under: &Path,
    label: &str,
    exec: Arc<dyn Executor>,
    cfg: &StudyConfig,
    stores: &mut StoreFactory<'_>,
) -> Result<(crate::backend::Measured, RunSummary), MeasureError> {
    let mut store = stores(mcfg, label)?;
    let (m, s) = study_run(mcfg, trace, bs, &mut *store, exec, cfg)?;
    write_run(&under.join(label), &m, &s)?;
    Ok((m, s))
}

/// One measured run of a study: [`run_trace`] with the study's host scheduling and the
/// host probe around it.
fn study_run(
    mcfg: &SimConfig,
    trace: &[Request],
    bs: u32,
    store: &mut dyn Store,
    exec: Arc<dyn Executor>,
    cfg: &StudyConfig,
) -> Result<(crate::backend::Measured, RunSummary), MeasureError> {
    run_trace(
        mcfg,
        trace,
        bs,
        store,
        exec,
        1.0,
        RunOptions {
            host_sched: cfg.host_sched,
            probe_host: Some(HOST_PROBE),
            ..RunOptions::default()
        },
    )
}

/// `report.md` and `study.json` of `st` in `out`.
fn write_report(out: &Path, st: &Study) -> Result<(), MeasureError> {
    let p = out.join("report.md");
    std::fs::write(&p, report(st)).map_err(|e| MeasureError::writing(&p, e))?;
    let p = out.join("study.json");
    let text = serde_json::to_string_pretty(st).map_err(|e| MeasureError::writing(&p, e))?;
    std::fs::write(&p, text).map_err(|e| MeasureError::writing(&p, e))
}

/// The median of `v` (the upper one of an even count); `None` when empty.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

fn sim_models(what: &'static str, e: moonagent_models::ModelError) -> MeasureError {
    MeasureError::Sim(moonagent_sim::des::SimError::Models(what, e))
}

/// Write `profile.toml` (the fitted profile), `profile.json` (fit and errors) and
/// `samples.jsonl` / `holdout.jsonl` into `dir`; returns the profile's path.
pub fn write_profile(
    dir: &Path,
    p: &Profile,
    samples: &[moonagent_models::calibrate::Sample],
    holdout: &[moonagent_models::calibrate::Sample],
) -> Result<PathBuf, MeasureError> {
    let file = |path: &Path, e: &dyn std::fmt::Display| MeasureError::writing(path, e);
    std::fs::create_dir_all(dir).map_err(|e| file(dir, &e))?;
    let toml_path = dir.join("profile.toml");
    let text = p
        .hardware
        .to_toml_string()
        .map_err(|e| file(&toml_path, &e))?;
    let header = format!(
        "# Fitted by `moonagent validate profile` for {} ({} samples); see profile.json.\n",
        p.hardware.description,
        samples.len()
    );
    std::fs::write(&toml_path, header + &text).map_err(|e| file(&toml_path, &e))?;
    let j = dir.join("profile.json");
    let text = serde_json::to_string_pretty(p).map_err(|e| file(&j, &e))?;
    std::fs::write(&j, text).map_err(|e| file(&j, &e))?;
    for (name, set) in [("samples.jsonl", samples), ("holdout.jsonl", holdout)] {
        let path = dir.join(name);
        let text: String = set
            .iter()
            .filter_map(|s| serde_json::to_string(s).ok())
            .map(|l| l + "\n")
            .collect();
        std::fs::write(&path, text).map_err(|e| file(&path, &e))?;
    }
    Ok(toml_path)
}

/// Refit the samples a previous profile wrote into `dir` ([`write_profile`]:
/// `samples.jsonl`, `holdout.jsonl`, `profile.toml`) without measuring: `base` fitted on
/// them in the `forms` offered. The host facts the old profile recorded (`shared_cores`,
/// and `core_weights` when its contention run adopted them) carry over; the contention
/// run itself is not in the files, so the new profile's report has none. Returns the
/// profile and the two sample sets.
pub fn refit(
    dir: &Path,
    base: &HardwareProfile,
    spec: &ModelSpec,
    forms: &[Roofline],
) -> Result<(Profile, Vec<Sample>, Vec<Sample>), MeasureError> {
    let what = "a calibration sample such as {\"kind\":\"decode\",\"batch\":1,\"context_tokens\":128,\"measured_ns\":4228251}";
    let samples: Vec<Sample> = read_lines(&dir.join("samples.jsonl"), what)?;
    let holdout: Vec<Sample> = read_lines(&dir.join("holdout.jsonl"), what)?;
    let old_path = dir.join("profile.toml");
    let old = HardwareProfile::from_path(&old_path).map_err(|e| MeasureError::File {
        path: old_path.display().to_string(),
        what: format!("expected the profile written beside the samples: {e}"),
    })?;
    let mut p = profile::fit(
        base,
        spec,
        &samples,
        &holdout,
        old.shared_cores,
        None,
        forms,
    )?;
    p.hardware.core_weights = old.core_weights.filter(|_| old.shared_cores.is_some());
    Ok((p, samples, holdout))
}

/// The per-operator error table of a profile, as Markdown.
pub fn profile_markdown(p: &Profile) -> String {
    let mut s = String::from("| operator | fit samples | fit median abs err % | hold-out samples | hold-out median abs err % | hold-out max % | prior (base profile) median abs err % |\n|---|---|---|---|---|---|---|\n");
    for f in &p.fit_errors {
        let h = p.holdout_errors.iter().find(|h| h.group == f.group);
        let pr = p.prior_errors.iter().find(|h| h.group == f.group);
        s.push_str(&format!(
            "| {} | {} | {:.1} | {} | {} | {} | {} |\n",
            f.group,
            f.samples,
            f.median_abs_pct,
            h.map_or(0, |h| h.samples),
            h.map_or("-".into(), |h| format!("{:.1}", h.median_abs_pct)),
            h.map_or("-".into(), |h| format!("{:.1}", h.max_abs_pct)),
            pr.map_or("-".into(), |h| format!("{:.1}", h.median_abs_pct)),
        ));
    }
    s.push_str(&forms_markdown(&p.fit.forms));
    match p.order {
        Some(Order::Grouped) => s.push_str("\nCompute operators timed grouped: each shape's runs back to back (hot caches).\n"),
        Some(Order::Interleaved) => s.push_str("\nCompute operators timed interleaved: shuffled rounds, each run after another operator's.\n"),
        None => {}
    }
    if let Some(c) = &p.contention {
        let w = c.weights;
        s.push_str(&format!(
            "\nShared cores ({} cores): steps looping on their own threads, alone and all at once. Fitted weights (the rate each kind kept in the fit mix, decode = 1): encode {:.2}, prefill {:.2}, decode {:.2}. Stretch = time together / time alone; predicted by weighted and by equal processor sharing.\n\n| mix | kind | alone ms | together ms | steps together | measured stretch | weighted | equal |\n|---|---|---|---|---|---|---|---|\n",
            c.cores, w.encode, w.prefill, w.decode
        ));
        for (mix, rows) in [("fit", &c.fit), ("hold-out", &c.holdout)] {
            for r in rows.iter() {
                s.push_str(&format!(
                    "| {mix} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {:.2} |\n",
                    r.kind,
                    r.alone_ns as f64 / 1e6,
                    r.together_ns as f64 / 1e6,
                    r.together_runs,
                    r.measured_stretch,
                    r.weighted_stretch,
                    r.equal_stretch
                ));
            }
        }
        s.push_str(&format!(
            "\nHold-out mean |error| of the stretch: weighted {:.1}%, equal {:.1}%: the weights {}.\n",
            c.weighted_holdout_err_pct,
            c.equal_holdout_err_pct,
            if c.adopted {
                "predict better and go into the profile"
            } else {
                "do not predict better and stay out of the profile (the simulator shares the cores equally)"
            }
        ));
    }
    s
}

/// One line per compute operator: the cost form it kept, and each form's mean |error|
/// on the fit samples (what [`moonagent_models::calibrate_select`] chose by).
fn forms_markdown(forms: &[FormFit]) -> String {
    let mut groups: Vec<Group> = forms.iter().map(|f| f.group).collect();
    groups.dedup();
    if groups.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\nCost form per operator (`max`: compute and memory overlap, the roofline; `sum`: they do not), chosen by mean |error| on the fit samples:",
    );
    for g in groups {
        let tried: Vec<&FormFit> = forms.iter().filter(|f| f.group == g).collect();
        let kept = tried
            .iter()
            .find(|f| f.kept)
            .map_or("-", |f| f.roofline.as_str());
        let each: Vec<String> = tried
            .iter()
            .map(|f| match f.mean_abs_pct_error {
                Some(e) => format!("{} {e:.1}%", f.roofline),
                None => format!("{} failed", f.roofline),
            })
            .collect();
        s.push_str(&format!(" {g} **{kept}** ({});", each.join(", ")));
    }
    s.pop();
    s.push_str(".\n");
    s
}

/// The report's section on the calibration runs (empty without them).
fn calibration_markdown(cs: &[Calibration]) -> String {
    let Some(c) = cs.first() else {
        return String::new();
    };
    let mut s = format!(
        "\n## Calibration runs\n\nEach round opens with a calibration run: {} at {:.0}% of the operator profile's capacity ({:.2} req/s), {} requests on a trace of its own (seed {}, the same in every round). Its compute steps that ran alone (mean concurrency over the step at most {ALONE_BUSY}) give per kind the median measured / profiled time (a kind with fewer than {MIN_ALONE_STEPS} steps alone keeps 1): the `step_scale` of `profile/profile-calibrated-<k>.toml` for round k. Where the workers outnumber the cores and the study measured its capacity, the same profile's `oversubscribed` factors say how much slower than processor sharing (times the alone factor) each kind ran while every worker was busy: per kind, the median measured / profiled time of such steps in the capacity bursts (pooled over modes; a kind with fewer than {MIN_ALONE_STEPS} keeps 1) over (workers / cores) x its alone factor. The simulator applies them while more steps run than there are cores (INVARIANTS D9); for decode iterations the profile's `decode_contention` replaces the flat factor: least squares, on the same bursts' all-busy decode iterations, of their loss beyond sharing and the alone factor on each iteration's KV share of its bytes and the encoder batches beside it (`1 + kv x share + encoder x encoders`). Every run of a round is simulated with its round's factors: the headline errors below. The column *operator profile alone* simulates the same runs with `profile/profile.toml` (no calibration: the headline of studies before the calibration runs existed).\n\n| round | wall s | factor encode / prefill / decode | steps alone E / P / D | steps E / P / D | oversubscribed E / P / D | all-busy burst steps E / P / D | decode contention kv / encoder |\n|---|---|---|---|---|---|---|---|\n",
        c.mode,
        100.0 * c.load,
        c.rate,
        c.requests,
        c.seed,
    );
    for c in cs {
        let k = c.step_scale;
        s.push_str(&format!(
            "| {} | {:.1} | **{:.3} / {:.3} / {:.3}** | {} / {} / {} | {} / {} / {} | {} | {} / {} / {} | {} |\n",
            c.round,
            c.run.wall_s,
            k.encode,
            k.prefill,
            k.decode,
            c.alone[0],
            c.alone[1],
            c.alone[2],
            c.steps[0],
            c.steps[1],
            c.steps[2],
            c.oversubscribed.map_or("-".to_string(), |o| format!(
                "**{:.3} / {:.3} / {:.3}**",
                o.encode, o.prefill, o.decode
            )),
            c.all_busy_steps[0],
            c.all_busy_steps[1],
            c.all_busy_steps[2],
            c.decode_contention
                .map_or("-".to_string(), |d| format!("{:.3} / {:.3}", d.kv, d.encoder)),
        ));
    }
    s
}

/// The report's capacity section: what the loads are fractions of, and the simulator's
/// throughput at saturation against the backend's.
fn capacity_markdown(st: &Study) -> String {
    let sims = st
        .capacity_rps
        .iter()
        .map(|(m, r)| format!("{m} {r:.2} req/s"))
        .collect::<Vec<_>>()
        .join(", ");
    if st.capacity_runs.is_empty() {
        return format!(
            "\n## Capacity\n\nLoads are fractions of the simulated capacity (the study's workload arriving at once, operator profile): {sims}.\n"
        );
    }
    let mut s = format!(
        "\n## Capacity\n\nLoads are fractions of each mode's capacity measured on the backend: a burst of requests arriving at once on a trace of its own (`capacity-<mode>/`), completed requests per second. Beside it the simulator's throughput on the same burst, with the operator profile alone, with each round's alone factors only (fitted on the calibration runs' trace, not this one: out of sample) and with each round's whole calibrated profile (the headline profile, whose `oversubscribed` factors are fitted on these bursts: in sample): the throughput error at saturation, which the runs cannot show (at 20% and 70% both sides serve the offered rate). The simulator's capacity on the study's workload (what loads were fractions of before 2026-12-07): {sims}.\n\n| mode | requests | seed | measured req/s | operator profile alone req/s | vs measured | alone factors by round vs measured | calibrated by round req/s | vs measured by round | wall s |\n|---|---|---|---|---|---|---|---|---|---|\n"
    );
    for c in &st.capacity_runs {
        let by_round = |v: &[f64], f: &dyn Fn(f64) -> String| match v.is_empty() {
            true => "-".to_string(),
            false => v.iter().map(|&r| f(r)).collect::<Vec<_>>().join(" / "),
        };
        let pct = |r: f64| format!("{:+.1}%", rel_pct(c.measured_rps, r));
        s.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:+.1}% | {} | {} | {} | {:.1} |\n",
            c.mode,
            c.requests,
            c.seed,
            c.measured_rps,
            c.simulated_rps,
            rel_pct(c.measured_rps, c.simulated_rps),
            by_round(&c.alone_calibrated_rps, &pct),
            by_round(&c.calibrated_rps, &|r| format!("{r:.3}")),
            by_round(&c.calibrated_rps, &pct),
            c.run.wall_s
        ));
    }
    s
}

/// Each (mode, load in thousandths) of the study once, in the order of its first run (the
/// rounds interleave them), with its runs.
fn groups(st: &Study) -> Vec<(String, u64, Vec<&StudyRun>)> {
    let mut out: Vec<(String, u64, Vec<&StudyRun>)> = Vec::new();
    for r in &st.runs {
        let load = (r.load * 1000.0) as u64;
        match out.iter_mut().find(|g| g.0 == r.mode && g.1 == load) {
            Some(g) => g.2.push(r),
            None => out.push((r.mode.clone(), load, vec![r])),
        }
    }
    out
}

/// The report's steps section: per (mode, load), the measured and the headline-simulated
/// runs' compute steps added up ([`StepTotals`]), median over repeats.
fn steps_markdown(st: &Study) -> String {
    let levels = st.workers as usize + 1;
    let mut s = format!(
        "\n## Steps, measured vs simulated\n\nPer mode and load, median over repeats: the share of the run during which 0, 1, ..., {} compute steps were running (measured from `timed.jsonl`, simulated from `simulated-timed.jsonl` beside it, the headline profile's), and per kind the steps' summed time, simulated over measured (waiting for a core included), with the decode iterations and their mean batch on both sides. Where the simulated run differs in how busy the cores were or in which kind took the time, the per-request errors above follow from it.\n\n| mode | load | time with 0..{} steps running, measured | simulated | step time sim / meas E/P/D | decode iterations meas / sim | decode batch meas / sim |\n|---|---|---|---|---|---|---|\n",
        st.workers, st.workers
    );
    for (mode, load, rs) in groups(st) {
        let med = |f: &dyn Fn(&StudyRun) -> f64| median(rs.iter().map(|r| f(r)).collect());
        let num = |v: Option<f64>, p: usize| v.map_or("-".to_string(), |v| format!("{v:.p$}"));
        let busy = |f: &dyn Fn(&StudyRun) -> &StepTotals| {
            (0..levels)
                .map(|k| num(med(&|r| f(r).busy.get(k).copied().unwrap_or(0.0)), 2))
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let ratio = (0..3)
            .map(|k| {
                let ratios = rs
                    .iter()
                    .filter(|r| r.steps_measured.seconds[k] > 0.0)
                    .map(|r| r.steps_simulated.seconds[k] / r.steps_measured.seconds[k]);
                num(median(ratios.collect()), 2)
            })
            .collect::<Vec<_>>()
            .join(" / ");
        s.push_str(&format!(
            "| {mode} | {:.0}% | {} | {} | {ratio} | {} / {} | {} / {} |\n",
            load as f64 / 10.0,
            busy(&|r| &r.steps_measured),
            busy(&|r| &r.steps_simulated),
            num(med(&|r| r.steps_measured.steps[2] as f64), 0),
            num(med(&|r| r.steps_simulated.steps[2] as f64), 0),
            num(med(&|r| r.steps_measured.mean_batch[2]), 2),
            num(med(&|r| r.steps_simulated.mean_batch[2]), 2),
        ));
    }
    s
}

/// `simulated` against `measured`, percent (0 when nothing was measured).
fn rel_pct(measured: f64, simulated: f64) -> f64 {
    if measured > 0.0 {
        100.0 * (simulated - measured) / measured
    } else {
        0.0
    }
}

fn stretch_text(s: [f64; 3]) -> String {
    format!("{:.2} / {:.2} / {:.2}", s[0], s[1], s[2])
}

/// The study's report.
pub fn report(st: &Study) -> String {
    let mut s = String::from("# moonagent validate: simulated vs measured\n\n");
    if st.runs.len() < st.runs_planned {
        s.push_str(&format!(
            "**Partial: {} of {} runs**, written while the study was running (a study \
             stopped part-way leaves this).\n\n",
            st.runs.len(),
            st.runs_planned
        ));
    }
    s.push_str("## Operator profile\n\n");
    s.push_str(&profile_markdown(&st.profile));
    s.push_str(&calibration_markdown(&st.calibrations));
    s.push_str(&capacity_markdown(st));
    s.push_str(&format!(
        "\n## Runs\n\nModel `{}`; operators on `{}`; {} compute workers (threads) on {} cores, scheduled by {}{}. Step stretch E/P/D: median measured / profiled time of the run's encode, prefill and decode steps (1.00: as fast as profiled alone).\n\n",
        st.model,
        st.compute,
        st.workers,
        st.cores,
        match st.host_sched {
            HostSched::Os => "the kernel (`--host-sched os`)".to_string(),
            HostSched::RoundRobin { quantum_us } => format!(
                "the backend's round robin over the cores (a step waits for a core in turn and hands it over at the first operator boundary after {quantum_us} us when another waits)"
            ),
        },
        match (st.workers as usize > st.cores, st.profile.hardware.shared_cores) {
            (true, Some(c)) => format!(
                ": when more workers are busy than there are cores, steps stretch (up to workers / cores); the fitted profile says the workers share {c} cores, so the simulator time-shares them by processor sharing, {}",
                match st.profile.hardware.core_weights {
                    Some(w) => format!("weighted by step kind as measured (encode {:.2}, prefill {:.2}, decode {:.2})", w.encode, w.prefill, w.decode),
                    None => "every step an equal share (no contention weights adopted)".to_string(),
                }
            ),
            (true, None) => ": when more workers are busy than there are cores, steps stretch (up to workers / cores) and the simulator, which gives every worker its own device, predicts too fast".to_string(),
            _ => String::new(),
        }
    ));
    s.push_str("Host before / after: what the host's cores delivered just before and just after the run, all cores at once as a share of the cores times one thread alone (1.00: every core at full speed); a run whose host changed under it measures the host as much as the backend.\n\n");
    if st.workers as usize > st.cores {
        s.push_str(&format!("All busy E/P/D: per kind, the median measured / profiled time of the steps that ran while all {} workers had a step running, over that of the run's steps of the kind that ran alone (the host's speed in the run cancels out); equal processor sharing, the simulator's model, predicts {:.2} (workers / cores) for every kind; `-`: fewer than {MIN_ALONE_STEPS} steps of the kind in either set.\n\n", st.workers, st.workers as f64 / st.cores.max(1) as f64));
    }
    s.push_str("| mode | load | rate req/s | run | wall s | same decisions | host before / after | step stretch E/P/D | all busy E/P/D | TTFT median abs err % | TTFT bias % | E2E median abs err % | throughput meas / sim | img hit meas / sim | KV hit meas / sim |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in &st.runs {
        let c = &r.comparison;
        s.push_str(&format!(
            "| {} | {:.0}% | {:.2} | {} | {:.1} | {} | {} | {} | {} | {:.1} | {:+.1} | {:.1} | {:.3} / {:.3} | {:.1}% / {:.1}% | {:.1}% / {:.1}% |\n",
            r.mode,
            100.0 * r.load,
            r.rate,
            r.repeat,
            r.run.wall_s,
            if r.run.same_decisions { "yes" } else { "NO" },
            match (r.run.host_before, r.run.host_after) {
                (Some(b), Some(a)) => format!(
                    "{:.2} / {:.2} (x{:.2})",
                    b.parallel_share(),
                    a.parallel_share(),
                    a.all_per_ms / b.all_per_ms.max(f64::MIN_POSITIVE)
                ),
                _ => "-".into(),
            },
            stretch_text(r.step_stretch),
            r.contended_stretch
                .map(|v| v.map_or("-".to_string(), |v| format!("{v:.2}")))
                .join(" / "),
            c.ttft.median_abs_pct,
            c.ttft.bias_pct,
            c.e2e.median_abs_pct,
            c.throughput_rps.0,
            c.throughput_rps.1,
            100.0 * c.image_hit_rate.0,
            100.0 * c.image_hit_rate.1,
            100.0 * c.kv_block_hit_rate.0,
            100.0 * c.kv_block_hit_rate.1,
        ));
    }
    s.push_str(&format!("\n## Per mode and load, median over repeats\n\nRepeat to repeat: the measured runs against each other, request by request (median over pairs of repeats of the TTFT / E2E median abs difference): the machine's own repeatability. A deterministic prediction cannot come much closer to one run than that (were each run its requests' expected times plus independent noise, an exact prediction of the expected times would be off by about 0.7 times the repeat-to-repeat figure). Step error {:.0}%: the simulator against itself with every compute step {:.0}% slower, on the first repeat's arrivals: what a profile that far off does with no other error.{}\n\n| mode | load | runs | TTFT median abs err % | E2E median abs err % | TTFT / E2E repeat to repeat % | TTFT / E2E from step error % | TTFT / E2E operator profile alone % | throughput err % | image hit diff pt | KV hit diff pt | step stretch E/P/D |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n", 100.0 * (STEP_ERROR - 1.0), 100.0 * (STEP_ERROR - 1.0), if st.calibrations.is_empty() { "" } else { " The TTFT and E2E errors are the round's calibrated profile's (`profile/profile-calibrated-<round>.toml`); operator profile alone: the same runs simulated with `profile/profile.toml`." }));
    for (mode, load, rs) in groups(st) {
        // A group has at least one run.
        let med = |f: &dyn Fn(&StudyRun) -> f64| {
            median(rs.iter().map(|r| f(r)).collect()).unwrap_or(f64::NAN)
        };

        let floor = st
            .floors
            .iter()
            .find(|f| f.mode == mode && (f.load * 1000.0) as u64 == load);
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        // Over the runs compared with the operator profile alone too.
        let ops_only = |f: &dyn Fn(&Comparison) -> f64| {
            median(
                rs.iter()
                    .filter_map(|r| r.operator.as_ref().map(f))
                    .collect(),
            )
        };
        s.push_str(&format!(
            "| {mode} | {:.0}% | {} | {:.1} | {:.1} | {} / {} | {} / {} | {} / {} | {:+.1} | {:+.1} | {:+.1} | {} |\n",
            load as f64 / 10.0,
            rs.len(),
            med(&|r| r.comparison.ttft.median_abs_pct),
            med(&|r| r.comparison.e2e.median_abs_pct),
            pct(floor.and_then(|f| f.repeat_ttft_pct)),
            pct(floor.and_then(|f| f.repeat_e2e_pct)),
            pct(floor.map(|f| f.step_error_ttft_pct)),
            pct(floor.map(|f| f.step_error_e2e_pct)),
            pct(ops_only(&|c| c.ttft.median_abs_pct)),
            pct(ops_only(&|c| c.e2e.median_abs_pct)),
            med(&|r| rel_pct(r.comparison.throughput_rps.0, r.comparison.throughput_rps.1)),
            med(&|r| 100.0 * (r.comparison.image_hit_rate.1 - r.comparison.image_hit_rate.0)),
            med(&|r| 100.0 * (r.comparison.kv_block_hit_rate.1 - r.comparison.kv_block_hit_rate.0)),
            stretch_text([0, 1, 2].map(|k| med(&|r| r.step_stretch[k]))),
        ));
    }
    s.push_str("\nAt light load the throughput is the offered rate on both sides; it tests nothing there.\n");
    s.push_str(&steps_markdown(st));
    s.push_str("\n## Per run, every metric\n\n");
    for r in &st.runs {
        s.push_str(&r.comparison.markdown(&format!(
            "{:.0}% load, run {}",
            100.0 * r.load,
            r.repeat
        )));
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use moonagent_models::CostModel;

    fn pool_tokens(cfg: &SimConfig, hw: &HardwareProfile) -> u64 {
        let spec = ModelSpec::resolve(&cfg.model).unwrap();
        CostModel::new(hw, &spec, 1)
            .unwrap()
            .kv_capacity_tokens(cfg.kv_mem_fraction)
    }

    fn step(start_ns: u64, measured_ns: u64, what: crate::backend::Step) -> crate::backend::Timed {
        crate::backend::Timed {
            worker: 0,
            what: crate::backend::Work::Step(what),
            start_ns,
            measured_ns,
            waited_ns: 0,
        }
    }

    /// The oversubscribed factors: per kind, the all-busy median over processor sharing's
    /// stretch times the alone factor; a kind with too few all-busy steps keeps 1; none
    /// when the workers do not outnumber the cores.
    #[test]
    fn oversubscribed_factors_divide_out_sharing_and_the_alone_factor() {
        let all = [
            vec![1.98, 1.0, 1.98, 9.0, 1.98],
            vec![1.5; MIN_ALONE_STEPS - 1],
            vec![3.0, 3.3, 2.7, 3.0, 3.0, 3.0],
        ];
        let alone = StepScale {
            encode: 1.1,
            prefill: 1.0,
            decode: 1.0,
        };
        let (f, n) = oversubscribed_factors(&all, 3, 2.0, alone);
        let f = f.expect("three workers on two cores").as_array();
        assert_eq!(n, [5, MIN_ALONE_STEPS - 1, 6]);
        for (a, b) in f.iter().zip([1.98 / (1.5 * 1.1), 1.0, 2.0]) {
            assert!((a - b).abs() < 1e-12, "{f:?}");
        }
        assert_eq!(oversubscribed_factors(&all, 2, 2.0, alone).0, None);
    }

    /// The decode contention fit recovers known coefficients from iterations priced by
    /// them (over sharing and the alone factor), sets a negative one to 0 and refits the
    /// other, and gives nothing without oversubscription or with too few iterations.
    #[test]
    fn decode_contention_fit_recovers_its_coefficients() {
        let (share, alone) = (1.5, 0.9);
        let priced = |kv: f64, enc: f64, s: f64, e: f64| AllBusyDecode {
            ratio: share * alone * (1.0 + kv * s + enc * e),
            kv_share: s,
            encoders: e,
        };
        let grid: Vec<(f64, f64)> = [0.05, 0.2, 0.4, 0.7]
            .iter()
            .flat_map(|&s| [0.0, 0.5, 1.0].map(|e| (s, e)))
            .collect();
        let steps: Vec<AllBusyDecode> = grid.iter().map(|&(s, e)| priced(0.8, 0.3, s, e)).collect();
        let c = decode_contention_fit(&steps, 3, 2.0, alone).expect("fitted");
        assert!(
            (c.kv - 0.8).abs() < 1e-9 && (c.encoder - 0.3).abs() < 1e-9,
            "{c:?}"
        );
        // An encoder term that would come out negative is 0, and kv is refitted alone.
        let steps: Vec<AllBusyDecode> =
            grid.iter().map(|&(s, e)| priced(0.5, -0.4, s, e)).collect();
        let c = decode_contention_fit(&steps, 3, 2.0, alone).expect("fitted");
        assert_eq!(c.encoder, 0.0);
        assert!(c.kv >= 0.0);
        assert_eq!(decode_contention_fit(&steps, 2, 2.0, alone), None);
        assert_eq!(
            decode_contention_fit(&steps[..MIN_ALONE_STEPS - 1], 3, 2.0, alone),
            None
        );
    }

    /// What ran beside each step: per kind, the other workers' step time inside its span
    /// over the span; its own worker's steps and transfers do not count.
    #[test]
    fn corunners_are_the_other_workers_steps_inside_a_span() {
        use crate::backend::{Step, Timed, Work};
        let on = |worker: u32, t: Timed| Timed { worker, ..t };
        let dec = || Step::Decode {
            batch: 1,
            ctx_sum: 10,
            extra: vec![],
        };
        let enc = || Step::Encode {
            tokens: vec![4],
            contents: vec![1],
        };
        let timed = vec![
            on(0, step(0, 100, dec())),
            on(1, step(50, 100, enc())),
            on(2, step(0, 25, Step::Prefill(vec![(8, 0)]))),
            on(2, step(75, 50, dec())),
            on(0, step(100, 40, dec())),
            Timed {
                worker: 1,
                what: Work::Fingerprint { bytes: 9 },
                start_ns: 0,
                measured_ns: 500,
                waited_ns: 0,
            },
        ];
        let w = corunners(&timed);
        assert_eq!(w[0], [0.5, 0.25, 0.25]);
        assert_eq!(w[1], [0.0, 0.0, (50.0 + 40.0 + 50.0) / 100.0]);
        assert_eq!(w[4], [1.0, 0.0, 25.0 / 40.0]);
        assert_eq!(w[5], [0.0; 3]);
    }

    /// Step totals: the share of the span at each number of steps running (back-to-back
    /// steps do not overlap, a gap counts as 0), and per kind the count, summed spans and
    /// mean batch; transfers are not steps.
    #[test]
    fn step_totals_add_up_the_steps_and_how_many_ran_at_once() {
        use crate::backend::{Step, Timed, Work};
        let steps = vec![
            step(
                0,
                10,
                Step::Encode {
                    tokens: vec![64],
                    contents: vec![1],
                },
            ),
            step(5, 10, decode(2)),
            Timed {
                worker: 3,
                what: Work::Fingerprint { bytes: 9 },
                start_ns: 0,
                measured_ns: 40,
                waited_ns: 0,
            },
            step(20, 10, Step::Prefill(vec![(8, 0), (8, 4)])),
            step(30, 5, decode(4)),
        ];
        let t = step_totals(&steps);
        // Span 0..35: 0 running over 15..20, 1 over 0..5, 10..15, 20..35, 2 over 5..10.
        let want = [5.0 / 35.0, 25.0 / 35.0, 5.0 / 35.0];
        assert_eq!(t.busy.len(), 3, "{t:?}");
        for (a, b) in t.busy.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{t:?}");
        }
        assert_eq!(t.steps, [1, 1, 2]);
        assert_eq!(t.seconds, [10e-9, 10e-9, 15e-9]);
        assert_eq!(t.mean_batch, [1.0, 2.0, 3.0]);
        assert_eq!(step_totals(&[]), StepTotals::default());
    }

    fn decode(batch: u32) -> crate::backend::Step {
        crate::backend::Step::Decode {
            batch,
            ctx_sum: 128 * u64::from(batch),
            extra: Vec::new(),
        }
    }

    /// The mean number of steps over a step's span: 1 alone, 2 fully overlapped, the
    /// time-weighted mean in between; back-to-back steps (one ends where the next starts)
    /// do not overlap; transfers are not steps.
    #[test]
    fn step_concurrency_is_the_mean_busy_count_over_each_step() {
        let transfer = crate::backend::Timed {
            worker: 9,
            what: crate::backend::Work::Transfer {
                flow: moonagent_models::Flow::Put,
                bytes: 1,
                path: Default::default(),
            },
            start_ns: 0,
            measured_ns: 1_000,
            waited_ns: 0,
        };
        let timed = vec![
            step(0, 100, decode(1)),   // alone
            step(100, 100, decode(1)), // starts as the first ends
            transfer,
            step(300, 100, decode(1)), // [300, 400) under [300, 500)
            step(300, 200, decode(2)), // half with the previous one, half alone
            step(600, 100, decode(1)), // [600, 700) with three others over [650, 700)
            step(650, 50, decode(1)),
            step(650, 50, decode(1)),
            step(650, 50, decode(1)),
        ];
        let c = step_concurrency(&timed);
        let idx: Vec<usize> = c.iter().map(|x| x.0).collect();
        assert_eq!(idx, vec![0, 1, 3, 4, 5, 6, 7, 8]);
        let busy: Vec<f64> = c.iter().map(|x| x.1).collect();
        assert_eq!(busy, vec![1.0, 1.0, 2.0, 1.5, 2.5, 4.0, 4.0, 4.0]);
    }

    /// The study's model, the base CPU profile and its cost model.
    fn study_model_on_cpu() -> (ModelSpec, HardwareProfile, CostModel) {
        let spec = ModelSpec::resolve(STUDY_MODEL).unwrap();
        let hw = HardwareProfile::by_name("cpu").unwrap();
        let cost = CostModel::new(&hw, &spec, 1).unwrap();
        (spec, hw, cost)
    }

    /// Each kind's factor is the median measured / profiled time of its steps that ran
    /// alone; overlapped steps and kinds with too few alone steps do not move it.
    #[test]
    fn alone_stretch_takes_the_median_of_the_steps_that_ran_alone() {
        let (spec, hw, cost) = study_model_on_cpu();
        let d1 = cost.decode_iter_time_ns(1, 128);
        let d2 = cost.decode_iter_time_ns(2, 256);
        let p = cost.prefill_batch_time_ns(&[(256, 0)]);
        let mut timed = Vec::new();
        let mut t = 0;
        // Seven decode iterations alone at 1.1, 1.2, ..., 1.7 times their price.
        for i in 0..7u64 {
            let d = if i % 2 == 0 { d1 } else { d2 };
            let m = d * (11 + i) / 10;
            timed.push(step(t, m, decode(if i % 2 == 0 { 1 } else { 2 })));
            t += m + 10;
        }
        // Two decode iterations fully overlapped at 5 times: not alone.
        timed.push(step(t, 5 * d1, decode(1)));
        timed.push(step(t, 5 * d1, decode(1)));
        t += 5 * d1 + 10;
        // Four prefills alone at 3 times: fewer than MIN_ALONE_STEPS.
        for _ in 0..MIN_ALONE_STEPS - 1 {
            timed.push(step(
                t,
                3 * p,
                crate::backend::Step::Prefill(vec![(256, 0)]),
            ));
            t += 3 * p + 10;
        }
        let (k, steps, alone) = alone_stretch(&timed, &hw, &spec).unwrap();
        assert_eq!(steps, [0, MIN_ALONE_STEPS - 1, 9]);
        assert_eq!(alone, [0, MIN_ALONE_STEPS - 1, 7]);
        assert_eq!((k.encode, k.prefill), (1.0, 1.0));
        assert!((k.decode - 1.4).abs() < 1e-3, "{k:?}");
        // One more prefill alone and the kind gets its own factor.
        timed.push(step(
            t,
            3 * p,
            crate::backend::Step::Prefill(vec![(256, 0)]),
        ));
        let (k, _, _) = alone_stretch(&timed, &hw, &spec).unwrap();
        assert!((k.prefill - 3.0).abs() < 1e-3, "{k:?}");
    }

    /// A kind's contended stretch is the median of its steps that ran with every worker
    /// busy over the median of those that ran alone; steps with fewer busy do not count,
    /// and a kind short of either set gets none.
    #[test]
    fn contended_stretch_divides_the_all_busy_median_by_the_alone_median() {
        let (spec, hw, cost) = study_model_on_cpu();
        let d = cost.decode_iter_time_ns(1, 128);
        let p = cost.prefill_batch_time_ns(&[(256, 0)]);
        let e = cost.encoder_time_ns(&[64]);
        let mut timed = Vec::new();
        let mut t = 0;
        // Five decode iterations alone at 1.1 times their price.
        for _ in 0..MIN_ALONE_STEPS {
            timed.push(step(t, d * 11 / 10, decode(1)));
            t += d * 11 / 10 + 10;
        }
        // Five prefills alone at 1.0.
        for _ in 0..MIN_ALONE_STEPS {
            timed.push(step(t, p, crate::backend::Step::Prefill(vec![(256, 0)])));
            t += p + 10;
        }
        // Three workers busy: an encode and a prefill spanning five decode iterations
        // at 2.2 times (twice their alone ratio), each decode fully inside both.
        let span = 5 * (d * 22 / 10 + 10) + 20;
        timed.push(step(
            t,
            span.max(e),
            crate::backend::Step::Encode {
                tokens: vec![64],
                contents: vec![1],
            },
        ));
        timed.push(step(
            t,
            span.max(e),
            crate::backend::Step::Prefill(vec![(256, 0)]),
        ));
        let mut u = t + 10;
        for _ in 0..MIN_ALONE_STEPS {
            timed.push(step(u, d * 22 / 10, decode(1)));
            u += d * 22 / 10 + 10;
        }
        t += span.max(e) + 10;
        // Two busy (not all three): does not count.
        timed.push(step(t, 9 * d, decode(1)));
        timed.push(step(t, 9 * d, decode(1)));
        let s = contended_stretch(&timed, &hw, &spec, 3).unwrap();
        assert!((s[2].unwrap() - 2.0).abs() < 1e-2, "{s:?}");
        // Encode: no step alone; prefill: one step with all busy, fewer than the minimum.
        assert_eq!((s[0], s[1]), (None, None), "{s:?}");
        // With two workers the two-busy iterations count too: median of 2.2 x5 and 9 x2.
        let s2 = contended_stretch(&timed, &hw, &spec, 2).unwrap();
        assert!((s2[2].unwrap() - 2.0).abs() < 1e-2, "{s2:?}");
        assert!(s2[1].is_none(), "{s2:?}");
    }

    #[test]
    fn the_profile_grid_measures_a_larger_models_transfers() {
        let tiny = ModelSpec::resolve(STUDY_MODEL).unwrap();
        let big = ModelSpec::resolve("qwen2.5-vl-7b").unwrap();
        for grid in [Grid::cpu_default(), Grid::quick()] {
            // The scaled model's grid already reaches its transfers.
            assert_eq!(grid.clone().covering(&tiny), grid);
            let g = grid.clone().covering(&big);
            let longest = grid.prefill.iter().map(|&(n, c)| u64::from(n + c)).max();
            let need = longest.unwrap() * big.kv_bytes_per_token();
            let top = *g.transfer.iter().max().unwrap();
            assert!(2 * top >= need && top < need, "{top} for {need}");
            assert_eq!(g.transfer[..grid.transfer.len()], grid.transfer[..]);
            assert_eq!((g.prefill, g.decode), (grid.prefill, grid.decode));
        }
    }

    #[test]
    fn another_model_gets_the_default_models_kv_pool_in_tokens() {
        for base in ["cpu", "h200"] {
            let hw = HardwareProfile::resolve(base).unwrap();
            let default = model_config(Mode::B3, STUDY_MODEL, &hw).unwrap();
            // The default model is the study's configuration as it was.
            assert_eq!(default.kv_mem_fraction, KV_MEM_FRACTION);
            assert_eq!(default.model, cpu_config(Mode::B3).model);
            let want = pool_tokens(&default, &hw);
            assert!(want > 1000, "{base}: {want}");
            let cfg = model_config(Mode::B0, "qwen2.5-vl-7b", &hw).unwrap();
            assert_eq!((cfg.model.as_str(), cfg.mode), ("qwen2.5-vl-7b", Mode::B0));
            let got = pool_tokens(&cfg, &hw);
            assert!((want..=want + 1).contains(&got), "{base}: {got} vs {want}");
        }
        // 72B's bf16 weights alone exceed one H200.
        let h200 = HardwareProfile::resolve("h200").unwrap();
        let err = model_config(Mode::B3, "qwen2.5-vl-72b", &h200).unwrap_err();
        assert!(err.to_string().contains("qwen2.5-vl-72b"), "{err}");
    }
}

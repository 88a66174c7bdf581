//! `moonagent validate profile`: measure every operator the cost model prices on the
//! backend, fit the hardware profile with `moonagent_models::calibrate`, and judge the fit
//! on shapes it was not fitted on.
//!
//! Operators: encoder batches by visual tokens, prefill chunks by new and cached tokens,
//! decode iterations by batch and context, transfers by flow and size over the backend's
//! link (loopback TCP), fingerprints by bytes. Each point of the design grid is run
//! `repeats` times after one warm-up run; its median is one calibration sample. The
//! compute points are timed back to back (`Order::Grouped`) or in shuffled rounds
//! (`Order::Interleaved`), so that each run follows another operator's. The
//! hold-out set is a second, seeded random set of shapes inside the grid's range,
//! measured the same way and never used by the fit: the per-operator error on it is the
//! profile's honest error.

use std::time::Instant;

use moonagent_core::cores::CoresError;
use moonagent_core::rng::Rng;
use moonagent_core::serve::{Flow, WorkerId};
use moonagent_models::calibrate::{
    calibrate_select, CalibrationError, CalibrationReport, Group, Residual, Sample,
};
use moonagent_models::{
    CoreWeights, CostModel, HardwareProfile, LinkKind, ModelError, ModelSpec, Roofline,
};
use serde::Serialize;

use crate::backend::link::{LinkError, Sink};
use crate::backend::{ExecError, Executor, Step};
use crate::cores::{on_core, HostCores, HostSched};

/// The shapes to measure.
#[derive(Debug, Clone, PartialEq)]
pub struct Grid {
    /// Encoder batches: visual tokens of each image.
    pub encode: Vec<Vec<u32>>,
    /// Prefill chunks: `(new, cached)`.
    pub prefill: Vec<(u32, u32)>,
    /// Decode iterations: `(batch, context per sequence)`.
    pub decode: Vec<(u32, u32)>,
    /// Transfer sizes, bytes (every flow).
    pub transfer: Vec<u64>,
    /// Fingerprint sizes, bytes.
    pub fingerprint: Vec<u64>,
    /// Timed runs per point (after one warm-up); the median is the sample.
    pub repeats: usize,
    /// In what order the compute points (encoder, prefill, decode) are timed.
    pub order: Order,
}

/// In what order the compute points of a grid are timed (transfers and fingerprints are
/// always timed back to back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Each point's runs back to back, one point after the other: a point is timed with its
    /// own weights and buffers hot in the caches.
    #[default]
    Grouped,
    /// One warm-up pass over every compute point, then `repeats` rounds, each timing every
    /// point once in a seeded shuffled order: each run follows another operator's, as a
    /// serving run's steps follow other work.
    Interleaved,
}

impl Grid {
    /// The design grid for a small CPU model (`qwen2.5-vl-tiny`): a few seconds per
    /// operator on one core.
    pub fn cpu_default() -> Self {
        let mut prefill = Vec::new();
        for new in [32, 128, 256, 512] {
            for cached in [0, 256, 1024] {
                prefill.push((new, cached));
            }
        }
        let mut decode = Vec::new();
        for batch in [1, 4, 8, 16] {
            for ctx in [128, 512, 1024] {
                decode.push((batch, ctx));
            }
        }
        Grid {
            encode: vec![
                vec![64],
                vec![128],
                vec![256],
                vec![512],
                vec![256, 256],
                vec![128, 128, 128, 128],
            ],
            prefill,
            decode,
            // The sizes the scaled model moves: encoder outputs (512 B a visual token, up
            // to 256 KiB), prefix-KV blocks (96 KiB) and prefill-to-decode handoffs (1,536
            // B a token, up to ~2 MiB). Loopback TCP is not linear far past them: 4 MiB
            // moved at 2.1 GB/s where 512 KiB moved at 9 GB/s (2026-12-03).
            transfer: vec![16 << 10, 64 << 10, 256 << 10, 1 << 20, 2 << 20],
            fingerprint: vec![256 << 10, 4 << 20, 16 << 20],
            repeats: 3,
            order: Order::Grouped,
        }
    }

    /// This grid with transfer sizes doubling past its largest until they reach half of
    /// `spec`'s largest transfer (the KV of the grid's longest prefill, `new + cached`
    /// tokens), so a larger model's transfers are measured rather than extrapolated from
    /// the scaled model's. A grid that already reaches that far is returned as it is.
    pub fn covering(mut self, spec: &ModelSpec) -> Self {
        let longest = self
            .prefill
            .iter()
            .map(|&(n, c)| u64::from(n) + u64::from(c));
        let largest = longest
            .max()
            .unwrap_or(0)
            .saturating_mul(spec.kv_bytes_per_token());
        while let Some(&last) = self.transfer.iter().max() {
            if last == 0 || last.saturating_mul(2) >= largest {
                break;
            }
            self.transfer.push(last * 2);
        }
        self
    }

    /// A small grid for tests: the corners of each operator's range, three repeats.
    pub fn quick() -> Self {
        Grid {
            encode: vec![vec![64], vec![256], vec![64, 64]],
            prefill: vec![
                (128, 0),
                (256, 0),
                (512, 0),
                (128, 256),
                (256, 512),
                (512, 1024),
            ],
            decode: vec![(1, 128), (16, 128), (1, 1024), (16, 1024)],
            transfer: vec![64 << 10, 1 << 20, 4 << 20],
            fingerprint: vec![256 << 10, 4 << 20],
            repeats: 3,
            order: Order::Grouped,
        }
    }

    /// A seeded random set of shapes inside this grid's range (the hold-out set).
    pub fn holdout(&self, seed: u64, n: usize) -> Self {
        let mut r = Rng::stream(seed, "validate-profile-holdout");
        let span = |r: &mut Rng, lo: u64, hi: u64| lo + r.below(hi - lo + 1);
        let (elo, ehi) = bounds(self.encode.iter().flatten().map(|&t| u64::from(t)));
        let (plo, phi) = bounds(self.prefill.iter().map(|p| u64::from(p.0)));
        let (clo, chi) = bounds(self.prefill.iter().map(|p| u64::from(p.1)));
        let (blo, bhi) = bounds(self.decode.iter().map(|d| u64::from(d.0)));
        let (xlo, xhi) = bounds(self.decode.iter().map(|d| u64::from(d.1)));
        let (tlo, thi) = bounds(self.transfer.iter().copied());
        let (flo, fhi) = bounds(self.fingerprint.iter().copied());
        Grid {
            encode: (0..n)
                .map(|_| {
                    let k = 1 + r.below(3);
                    (0..k).map(|_| span(&mut r, elo, ehi / k) as u32).collect()
                })
                .collect(),
            prefill: (0..n)
                .map(|_| (span(&mut r, plo, phi) as u32, span(&mut r, clo, chi) as u32))
                .collect(),
            decode: (0..n)
                .map(|_| (span(&mut r, blo, bhi) as u32, span(&mut r, xlo, xhi) as u32))
                .collect(),
            transfer: (0..n).map(|_| log_span(&mut r, tlo, thi)).collect(),
            fingerprint: (0..n).map(|_| log_span(&mut r, flo, fhi)).collect(),
            repeats: self.repeats,
            order: self.order,
        }
    }
}

/// A size in `[lo, hi]` spread evenly over octaves rather than bytes (sizes that span
/// decades would otherwise all land near `hi`): an octave `[lo 2^k, lo 2^(k+1))` picked
/// uniformly, then a size uniformly inside it. Integer arithmetic only.
fn log_span(r: &mut Rng, lo: u64, hi: u64) -> u64 {
    let lo = lo.max(1);
    if hi <= lo {
        return lo;
    }
    let o = (hi / lo).ilog2();
    // Octaves that start at or below `hi`, less a last one that would hold `hi` alone.
    let octaves = u64::from(o) + u64::from(lo << o != hi);
    let k = r.below(octaves) as u32;
    let a = lo << k;
    let b = (a.saturating_mul(2) - 1).min(hi);
    a + r.below(b - a + 1)
}

fn bounds(v: impl Iterator<Item = u64>) -> (u64, u64) {
    v.fold((u64::MAX, 0), |(lo, hi), x| (lo.min(x), hi.max(x)))
}

/// Why profiling failed.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// An operator failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A transfer failed.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The fit failed.
    #[error(transparent)]
    Fit(#[from] CalibrationError),
    /// The base profile or model is unusable.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The host-core gate of a contention plan is unusable.
    #[error("contention plan: {0}")]
    Cores(#[from] CoresError),
}

/// Measure every point of `grid` (one warm-up, then `repeats` timed runs, median; the
/// compute points in `grid.order`). `progress` is told after each point.
pub fn measure(
    grid: &Grid,
    exec: &dyn Executor,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Sample>, ProfileError> {
    const W: WorkerId = 0;
    let time = |f: &mut dyn FnMut() -> Result<(), ProfileError>| -> Result<u64, ProfileError> {
        f()?;
        let mut v = Vec::with_capacity(grid.repeats);
        for _ in 0..grid.repeats.max(1) {
            v.push(timed(f)?);
        }
        Ok(median_run(v))
    };
    let mut steps: Vec<Step> = Vec::new();
    steps.extend(grid.encode.iter().map(|tokens| Step::Encode {
        tokens: tokens.clone(),
        contents: (0..tokens.len() as u64).collect(),
    }));
    steps.extend(
        grid.prefill
            .iter()
            .map(|&(new, cached)| Step::Prefill(vec![(new, cached)])),
    );
    steps.extend(grid.decode.iter().map(|&(batch, ctx)| Step::Decode {
        batch,
        ctx_sum: u64::from(batch) * u64::from(ctx),
        extra: Vec::new(),
    }));
    let run = |i: usize| exec.run(W, &steps[i]).map(drop).map_err(ProfileError::from);
    let ns: Vec<u64> = match grid.order {
        Order::Grouped => {
            let mut ns = Vec::with_capacity(steps.len());
            for (i, step) in steps.iter().enumerate() {
                ns.push(time(&mut || run(i))?);
                progress(step_name(step));
            }
            ns
        }
        Order::Interleaved => {
            for i in 0..steps.len() {
                run(i)?;
            }
            let mut v = vec![Vec::with_capacity(grid.repeats); steps.len()];
            let mut rng = Rng::stream(0, "validate-profile-order");
            let rounds = grid.repeats.max(1);
            for round in 0..rounds {
                let mut order: Vec<usize> = (0..steps.len()).collect();
                for k in (1..order.len()).rev() {
                    order.swap(k, rng.below(k as u64 + 1) as usize);
                }
                for &i in &order {
                    v[i].push(timed(&mut || run(i))?);
                    if round + 1 == rounds {
                        progress(step_name(&steps[i]));
                    }
                }
            }
            v.into_iter().map(median_run).collect()
        }
    };
    let mut out: Vec<Sample> = steps
        .iter()
        .zip(ns)
        .map(|(step, ns)| match step {
            Step::Encode { tokens, .. } => Sample::Encoder {
                visual_tokens: tokens.clone(),
                measured_ns: ns,
            },
            Step::Prefill(c) => Sample::Prefill {
                new_tokens: c[0].0,
                cached_tokens: c[0].1,
                measured_ns: ns,
            },
            Step::Decode { batch, ctx_sum, .. } => Sample::Decode {
                batch: *batch,
                context_tokens: *ctx_sum,
                measured_ns: ns,
            },
        })
        .collect();
    let sink = Sink::start(1)?;
    let mut nic = sink.connect()?;
    for &bytes in &grid.transfer {
        for flow in Flow::ALL {
            let ns = time(&mut || Ok(nic.send(bytes)?))?;
            out.push(Sample::Transfer {
                link: LinkKind::Tcp,
                flow,
                bytes,
                measured_ns: ns,
            });
        }
        progress("transfer");
    }
    for &bytes in &grid.fingerprint {
        let ns = time(&mut || Ok(exec.fingerprint(bytes)?))?;
        out.push(Sample::Fingerprint {
            bytes,
            measured_ns: ns,
        });
        progress("fingerprint");
    }
    Ok(out)
}

/// How well a profile predicts one operator on a set of samples.
#[derive(Debug, Clone, Serialize)]
pub struct OperatorError {
    /// The operator.
    pub group: Group,
    /// Samples.
    pub samples: usize,
    /// Median |predicted - measured| / measured, percent.
    pub median_abs_pct: f64,
    /// Largest of them, percent.
    pub max_abs_pct: f64,
    /// Mean signed error, percent (positive: the profile predicts too slow).
    pub bias_pct: f64,
}

/// Per-operator error of `hw` predicting `samples`.
pub fn errors(
    hw: &HardwareProfile,
    spec: &ModelSpec,
    tp: u32,
    samples: &[Sample],
) -> Result<Vec<OperatorError>, ModelError> {
    let cost = CostModel::new(hw, spec, tp)?;
    let mut by: std::collections::BTreeMap<Group, Vec<f64>> = Default::default();
    for s in samples {
        let p = s.predict_ns(&cost, hw)? as f64;
        let m = s.measured_ns() as f64;
        by.entry(s.group()).or_default().push(100.0 * (p - m) / m);
    }
    Ok(by
        .into_iter()
        .map(|(group, errs)| {
            let mut abs: Vec<f64> = errs.iter().map(|e| e.abs()).collect();
            abs.sort_by(f64::total_cmp);
            OperatorError {
                group,
                samples: errs.len(),
                median_abs_pct: median_sorted(&abs),
                max_abs_pct: abs.last().copied().unwrap_or(0.0),
                bias_pct: errs.iter().sum::<f64>() / errs.len() as f64,
            }
        })
        .collect())
}

/// Per-sample prediction of `hw` for `samples`, in input order (as the fit's residuals).
pub fn residuals(
    hw: &HardwareProfile,
    spec: &ModelSpec,
    tp: u32,
    samples: &[Sample],
) -> Result<Vec<Residual>, ModelError> {
    let cost = CostModel::new(hw, spec, tp)?;
    samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let m = s.measured_ns();
            let p = s.predict_ns(&cost, hw)?;
            let e = p as f64 - m as f64;
            Ok(Residual {
                sample: i,
                group: s.group(),
                measured_ns: m,
                predicted_ns: p,
                error_ns: e as i64,
                pct_error: 100.0 * e / m as f64,
            })
        })
        .collect()
}

/// One run of `f`, timed (at least 1 ns).
fn timed(f: &mut dyn FnMut() -> Result<(), ProfileError>) -> Result<u64, ProfileError> {
    let t = Instant::now();
    f()?;
    Ok((t.elapsed().as_nanos() as u64).max(1))
}

/// The median of a point's timed runs ([`median_u64`]); every point has at least one, and
/// a run takes at least 1 ns.
fn median_run(v: Vec<u64>) -> u64 {
    median_u64(v).unwrap_or(1)
}

/// The progress name of a compute step's operator.
fn step_name(step: &Step) -> &'static str {
    KIND_NAMES[kind_of(step)]
}

fn median_sorted(v: &[f64]) -> f64 {
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A fitted profile and how good it is.
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    /// The fitted profile (named `<base>-fitted`).
    #[serde(skip)]
    pub hardware: HardwareProfile,
    /// The fit (parameters, in-sample residuals).
    pub fit: CalibrationReport,
    /// Per-operator error on the samples it was fitted on.
    pub fit_errors: Vec<OperatorError>,
    /// Per-operator error on the hold-out samples.
    pub holdout_errors: Vec<OperatorError>,
    /// The fitted profile's prediction of each hold-out sample, in `holdout.jsonl` order.
    pub holdout_residuals: Vec<Residual>,
    /// The base profile's error on the hold-out samples, before fitting.
    pub prior_errors: Vec<OperatorError>,
    /// How concurrent steps shared the host's cores ([`contention`]), when measured: its
    /// weights are the profile's `core_weights` when it adopted them.
    pub contention: Option<ContentionReport>,
    /// How the compute samples were timed (`None`: refitted from stored samples, order
    /// not recorded).
    pub order: Option<Order>,
}

/// Fit `base` to `fit_samples` for `spec`, and judge it on `holdout`. `shared_cores`
/// (a measured fact of the host, not fitted: [`crate::backend::Executor::shared_cores`])
/// goes into the profile, so the simulator time-shares the steps of a CPU backend's
/// workers as the host does; with a `contention` run whose weights beat equal sharing on
/// its hold-out mix ([`ContentionReport::adopted`]), by those weights.
pub fn fit(
    base: &HardwareProfile,
    spec: &ModelSpec,
    fit_samples: &[Sample],
    holdout: &[Sample],
    shared_cores: Option<f64>,
    contention: Option<ContentionReport>,
    forms: &[Roofline],
) -> Result<Profile, ProfileError> {
    let report = calibrate_select(base, spec, 1, fit_samples, forms)?;
    let mut hardware = report.calibration.apply(base);
    hardware.shared_cores = shared_cores;
    hardware.core_weights = contention
        .as_ref()
        .filter(|c| shared_cores.is_some() && c.adopted)
        .map(|c| c.weights);
    hardware.name = format!("{}-fitted", base.name);
    hardware.description = format!(
        "{} fitted by `moonagent validate profile` on {} samples for {}",
        base.name,
        fit_samples.len(),
        spec.name
    );
    Ok(Profile {
        fit_errors: errors(&hardware, spec, 1, fit_samples)?,
        holdout_errors: errors(&hardware, spec, 1, holdout)?,
        holdout_residuals: residuals(&hardware, spec, 1, holdout)?,
        prior_errors: errors(base, spec, 1, holdout)?,
        contention,
        hardware,
        fit: report,
        order: None,
    })
}

/// The contention run ([`contention`]): which steps run at once, and for how long.
#[derive(Debug, Clone, PartialEq)]
pub struct ContentionPlan {
    /// The mix the weights are fitted on: one encode, one prefill and one decode step,
    /// each looping on a worker thread of its own.
    pub fit: [Step; 3],
    /// A different mix the fitted weights are judged on (any kinds, one thread each).
    pub holdout: Vec<Step>,
    /// How long each mix runs (each step also runs alone this long).
    pub window: std::time::Duration,
    /// How the looping steps share the host's cores: the runs' discipline, so the weights
    /// describe what the runs will see.
    pub host_sched: HostSched,
}

impl ContentionPlan {
    /// Mid-grid shapes of the CPU model, three workers as the CPU clusters have.
    pub fn cpu_default() -> Self {
        let encode = |t: Vec<u32>| Step::Encode {
            contents: (0..t.len() as u64).collect(),
            tokens: t,
        };
        let decode = |batch: u32, ctx: u64| Step::Decode {
            batch,
            ctx_sum: u64::from(batch) * ctx,
            extra: Vec::new(),
        };
        ContentionPlan {
            fit: [
                encode(vec![256]),
                Step::Prefill(vec![(256, 256)]),
                decode(8, 512),
            ],
            holdout: vec![
                encode(vec![128, 128]),
                Step::Prefill(vec![(512, 0)]),
                decode(4, 1024),
            ],
            window: std::time::Duration::from_millis(2500),
            host_sched: HostSched::default(),
        }
    }

    /// The default shapes with a shorter window (the quick study, tests).
    pub fn quick() -> Self {
        let mut p = Self::cpu_default();
        p.window = std::time::Duration::from_millis(600);
        p
    }
}

/// One step of a contention mix.
#[derive(Debug, Clone, Serialize)]
pub struct Contended {
    /// `encode`, `prefill` or `decode`.
    pub kind: &'static str,
    /// Median time alone, ns (the same loop, one thread).
    pub alone_ns: u64,
    /// Median time while every step of the mix ran at once, ns.
    pub together_ns: u64,
    /// Steps timed together.
    pub together_runs: usize,
    /// `together_ns / alone_ns`.
    pub measured_stretch: f64,
    /// What weighted processor sharing with the fitted weights predicts.
    pub weighted_stretch: f64,
    /// What plain (equal-weight) processor sharing predicts.
    pub equal_stretch: f64,
}

/// The contention run's result: the fitted weights and how well they predict.
#[derive(Debug, Clone, Serialize)]
pub struct ContentionReport {
    /// Cores the steps share.
    pub cores: f64,
    /// Fitted weights (`1 / stretch` of each kind in the fit mix, normalised to decode 1).
    pub weights: CoreWeights,
    /// The fit mix (the weighted prediction reproduces it by construction when the
    /// stretches fill the cores).
    pub fit: Vec<Contended>,
    /// The hold-out mix, never used by the fit.
    pub holdout: Vec<Contended>,
    /// Mean |predicted - measured| / measured stretch over the hold-out mix, %, with the
    /// fitted weights.
    pub weighted_holdout_err_pct: f64,
    /// The same with equal weights (plain processor sharing).
    pub equal_holdout_err_pct: f64,
    /// Whether the weights go into the profile: only when they predict the hold-out mix
    /// better than equal sharing does (a calibration is judged on data it was not fitted
    /// on; weights that do not generalise would only add noise to the simulator).
    pub adopted: bool,
}

/// The contention run when there is something to weigh: a `plan` and an executor whose
/// workers share the host's cores ([`Executor::shared_cores`]); otherwise `None`, and the
/// cores (if any) are shared equally.
pub fn contention_if_shared(
    plan: Option<&ContentionPlan>,
    exec: &dyn Executor,
    progress: impl FnMut(&str),
) -> Result<Option<ContentionReport>, ProfileError> {
    match (plan, exec.shared_cores()) {
        (Some(plan), Some(cores)) => contention(plan, exec, cores, progress).map(Some),
        _ => Ok(None),
    }
}

/// Mean absolute % error of the weighted and of the equal-share prediction over `mix`.
pub fn stretch_errors(mix: &[Contended]) -> (f64, f64) {
    let err = |pred: fn(&Contended) -> f64| {
        let n = mix.len().max(1) as f64;
        mix.iter()
            .map(|c| 100.0 * (pred(c) - c.measured_stretch).abs() / c.measured_stretch)
            .sum::<f64>()
            / n
    };
    (err(|c| c.weighted_stretch), err(|c| c.equal_stretch))
}

fn kind_of(step: &Step) -> usize {
    match step {
        Step::Encode { .. } => 0,
        Step::Prefill(_) => 1,
        Step::Decode { .. } => 2,
    }
}

const KIND_NAMES: [&str; 3] = CoreWeights::KINDS;

/// Run `steps` at once, one looping worker thread each, for `window`: a driver thread
/// hands each worker its next step when it reports the last one done, as the real
/// backend's main thread does (so a worker sleeps and wakes between steps as in a run).
/// Returns each thread's step times (ns) while every thread was busy: its first step
/// (warm-up) and any step ending after the first thread went idle are dropped. Past the
/// window the threads go on until each has a step after its warm-up.
fn co_run(
    exec: &dyn Executor,
    steps: &[Step],
    window: std::time::Duration,
    cores: Option<&HostCores>,
) -> Result<Vec<Vec<u64>>, ProfileError> {
    use std::sync::mpsc;
    type Report = (usize, Result<(Instant, Instant), ExecError>);
    let n = steps.len();
    std::thread::scope(|s| -> Result<Vec<Vec<u64>>, ProfileError> {
        let (done_tx, done_rx) = mpsc::channel::<Report>();
        let mut go = Vec::with_capacity(n);
        for (i, step) in steps.iter().enumerate() {
            let (tx, rx) = mpsc::channel::<()>();
            go.push(tx);
            let done = done_tx.clone();
            s.spawn(move || {
                for () in rx {
                    let t0 = Instant::now();
                    let r = on_core(cores, || exec.run(i as WorkerId, step))
                        .map(|_| (t0, Instant::now()));
                    if done.send((i, r)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let start = Instant::now();
        for tx in &go {
            let _ = tx.send(());
        }
        let mut runs: Vec<Vec<(Instant, Instant)>> = vec![Vec::new(); n];
        let mut first_idle: Option<Instant> = None;
        let mut busy = n;
        let mut failed = None;
        while busy > 0 {
            let Ok((i, r)) = done_rx.recv() else { break };
            match r {
                Ok((t0, t1)) => {
                    runs[i].push((t0, t1));
                    // Past the window, every thread still runs until each has timed one
                    // step after its warm-up.
                    if failed.is_none()
                        && first_idle.is_none()
                        && (t1.duration_since(start) < window || runs.iter().any(|r| r.len() < 2))
                    {
                        let _ = go[i].send(());
                        continue;
                    }
                    first_idle.get_or_insert(t1);
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
            busy -= 1;
        }
        drop(go);
        if let Some(e) = failed {
            return Err(e.into());
        }
        let end = first_idle.unwrap_or_else(Instant::now);
        Ok(runs
            .into_iter()
            .map(|v| {
                v.into_iter()
                    .skip(1)
                    .filter(|&(_, t1)| t1 <= end)
                    .map(|(t0, t1)| (t1.duration_since(t0).as_nanos() as u64).max(1))
                    .collect()
            })
            .collect())
    })
}

/// The median (the upper one of an even count); `None` when empty.
fn median_u64(mut v: Vec<u64>) -> Option<u64> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// The stretch each of `kinds` gets from sharing `cores` by `weights`, all running.
fn predicted_stretch(cores: f64, weights: [f64; 3], kinds: &[usize]) -> Vec<f64> {
    let w: Vec<f64> = kinds.iter().map(|&k| weights[k]).collect();
    let mut rates = Vec::new();
    moonagent_models::shared_core_rates(cores, &w, &mut rates);
    rates.into_iter().map(|r| 1.0 / r).collect()
}

/// Measure how the host's scheduler divides `cores` among concurrent steps of different
/// kinds, and fit [`CoreWeights`] for the simulator's weighted processor sharing: each
/// step of `plan.fit` runs alone, then all three at once ([`co_run`]); a kind's weight is
/// the rate it kept together (`alone / together`), normalised to decode's. The hold-out
/// mix is measured the same way and predicted with the fitted weights and with equal
/// ones, so the report says whether the weights help on steps they were not fitted on.
pub fn contention(
    plan: &ContentionPlan,
    exec: &dyn Executor,
    cores: f64,
    mut progress: impl FnMut(&str),
) -> Result<ContentionReport, ProfileError> {
    let gate = plan.host_sched.gate(Some(cores))?;
    let measure_mix = |steps: &[Step],
                       progress: &mut dyn FnMut(&str)|
     -> Result<Vec<(usize, u64, u64, usize)>, ProfileError> {
        let mut alone = Vec::with_capacity(steps.len());
        for s in steps {
            let t = co_run(
                exec,
                std::slice::from_ref(s),
                plan.window / 2,
                gate.as_ref(),
            )?;
            alone.push(median_u64(t.into_iter().flatten().collect()));
            progress("contention (alone)");
        }
        let together = co_run(exec, steps, plan.window, gate.as_ref())?;
        progress("contention (together)");
        steps
            .iter()
            .zip(alone)
            .zip(together)
            .map(|((s, a), t)| {
                let runs = t.len();
                match (a, median_u64(t)) {
                    (Some(a), Some(t)) => Ok((kind_of(s), a, t, runs)),
                    _ => Err(ProfileError::Exec(ExecError {
                        what: format!(
                            "contention run: no {} step completed within {:?}; lengthen the window",
                            KIND_NAMES[kind_of(s)],
                            plan.window
                        ),
                    })),
                }
            })
            .collect()
    };
    let mut kinds: Vec<usize> = plan.fit.iter().map(kind_of).collect();
    kinds.sort_unstable();
    if kinds != [0, 1, 2] {
        return Err(ProfileError::Exec(ExecError {
            what: "contention plan: the fit mix needs one encode, one prefill and one decode step"
                .into(),
        }));
    }
    let fit = measure_mix(&plan.fit, &mut progress)?;
    let mut w = [1.0; 3];
    for &(k, a, t, _) in &fit {
        w[k] = a as f64 / t as f64;
    }
    let d = w[2];
    let w = w.map(|x| x / d);
    let weights = CoreWeights {
        encode: w[0],
        prefill: w[1],
        decode: w[2],
    };
    let hold = measure_mix(&plan.holdout, &mut progress)?;
    let describe = |m: Vec<(usize, u64, u64, usize)>| -> Vec<Contended> {
        let kinds: Vec<usize> = m.iter().map(|x| x.0).collect();
        let weighted = predicted_stretch(cores, w, &kinds);
        let equal = predicted_stretch(cores, [1.0; 3], &kinds);
        m.into_iter()
            .enumerate()
            .map(|(i, (k, a, t, runs))| Contended {
                kind: KIND_NAMES[k],
                alone_ns: a,
                together_ns: t,
                together_runs: runs,
                measured_stretch: t as f64 / a as f64,
                weighted_stretch: weighted[i],
                equal_stretch: equal[i],
            })
            .collect()
    };
    let holdout = describe(hold);
    let (weighted_holdout_err_pct, equal_holdout_err_pct) = stretch_errors(&holdout);
    Ok(ContentionReport {
        cores,
        weights,
        fit: describe(fit),
        holdout,
        weighted_holdout_err_pct,
        equal_holdout_err_pct,
        adopted: weighted_holdout_err_pct < equal_holdout_err_pct,
    })
}

#[cfg(test)]
mod log_span_tests {
    use super::log_span;
    use moonagent_core::rng::Rng as Stream;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_log_span_stays_in_its_bounds(lo in 0u64..1 << 40, wide in 0u64..1 << 40, seed: u64) {
            let hi = lo + wide;
            let mut r = Stream::stream(seed, "t");
            for _ in 0..32 {
                let x = log_span(&mut r, lo, hi);
                prop_assert!(x >= lo.max(1).min(hi.max(1)) && x <= hi.max(1), "{x} outside [{lo}, {hi}]");
            }
        }
    }

    #[test]
    fn a_log_span_fills_every_octave_about_equally() {
        let (lo, hi) = (16u64 << 10, 2 << 20);
        let mut r = Stream::stream(7, "t");
        let mut per = [0u32; 7];
        for _ in 0..7000 {
            let x = log_span(&mut r, lo, hi);
            per[(x / lo).ilog2() as usize] += 1;
        }
        for (k, n) in per.iter().enumerate() {
            assert!((800..1200).contains(n), "octave {k}: {n} of 7000 ({per:?})");
        }
    }
}

#[cfg(test)]
mod median_tests {
    use super::median_u64;

    #[test]
    fn a_sample_is_the_middle_run_or_the_upper_of_two() {
        assert_eq!(median_u64(vec![5, 1, 3]), Some(3));
        assert_eq!(median_u64(vec![4, 1, 3, 2]), Some(3));
        assert_eq!(median_u64(vec![7]), Some(7));
        assert_eq!(median_u64(Vec::new()), None);
    }
}

//! `moonagent validate profile`: measure every operator the cost model prices on the
//! backend, fit the hardware profile with `moonagent_models::calibrate`, and judge the fit
//! on shapes it was not fitted on.
//!
//! Operators: encoder batches by visual tokens, prefill chunks by new and cached tokens,
//! decode iterations by batch and context, transfers by flow and size over the backend's
//! link (loopback TCP), fingerprints by bytes. Each point of the design grid is run
//! `repeats` times after one warm-up run; its median is one calibration sample. The
//! hold-out set is a second, seeded random set of shapes inside the grid's range,
//! measured the same way and never used by the fit: the per-operator error on it is the
//! profile's honest error.

use std::time::Instant;

use moonagent_core::rng::Rng;
use moonagent_core::serve::{Flow, WorkerId};
use moonagent_models::calibrate::{
    calibrate, CalibrationError, CalibrationReport, Group, Residual, Sample,
};
use moonagent_models::{CostModel, HardwareProfile, LinkKind, ModelError, ModelSpec};
use serde::Serialize;

use crate::backend::link::{LinkError, Sink};
use crate::backend::{ExecError, Executor, Step};

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
            transfer: vec![64 << 10, 512 << 10, 4 << 20, 16 << 20],
            fingerprint: vec![256 << 10, 4 << 20, 16 << 20],
            repeats: 3,
        }
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
            transfer: (0..n).map(|_| span(&mut r, tlo, thi)).collect(),
            fingerprint: (0..n).map(|_| span(&mut r, flo, fhi)).collect(),
            repeats: self.repeats,
        }
    }
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
}

/// Measure every point of `grid` (one warm-up, then `repeats` timed runs, median).
/// `progress` is told after each point.
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
            let t = Instant::now();
            f()?;
            v.push((t.elapsed().as_nanos() as u64).max(1));
        }
        v.sort_unstable();
        Ok(v[v.len() / 2])
    };
    let mut out = Vec::new();
    for tokens in &grid.encode {
        let step = Step::Encode {
            tokens: tokens.clone(),
            contents: (0..tokens.len() as u64).collect(),
        };
        let ns = time(&mut || exec.run(W, &step).map(drop).map_err(Into::into))?;
        out.push(Sample::Encoder {
            visual_tokens: tokens.clone(),
            measured_ns: ns,
        });
        progress("encode");
    }
    for &(new, cached) in &grid.prefill {
        let step = Step::Prefill(vec![(new, cached)]);
        let ns = time(&mut || exec.run(W, &step).map(drop).map_err(Into::into))?;
        out.push(Sample::Prefill {
            new_tokens: new,
            cached_tokens: cached,
            measured_ns: ns,
        });
        progress("prefill");
    }
    for &(batch, ctx) in &grid.decode {
        let step = Step::Decode {
            batch,
            ctx_sum: u64::from(batch) * u64::from(ctx),
            extra: Vec::new(),
        };
        let ns = time(&mut || exec.run(W, &step).map(drop).map_err(Into::into))?;
        out.push(Sample::Decode {
            batch,
            context_tokens: u64::from(batch) * u64::from(ctx),
            measured_ns: ns,
        });
        progress("decode");
    }
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
}

/// Fit `base` to `fit_samples` for `spec`, and judge it on `holdout`. `shared_cores`
/// (a measured fact of the host, not fitted: [`crate::backend::Executor::shared_cores`])
/// goes into the profile, so the simulator time-shares the steps of a CPU backend's
/// workers as the host does.
pub fn fit(
    base: &HardwareProfile,
    spec: &ModelSpec,
    fit_samples: &[Sample],
    holdout: &[Sample],
    shared_cores: Option<f64>,
) -> Result<Profile, ProfileError> {
    let report = calibrate(base, spec, 1, fit_samples)?;
    let mut hardware = report.calibration.apply(base);
    hardware.shared_cores = shared_cores;
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
        hardware,
        fit: report,
    })
}

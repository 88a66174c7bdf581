//! Calibration: fit a profile's efficiency factors, overheads, link and CPU figures from
//! measured samples, and say how well the fitted model explains them.
//!
//! Every cost is linear in its calibratable parameters once the roofline side is known:
//! `t = max(X * u, Y * v) + C + b`, where `X` is the compute time at 100% MFU, `Y` the
//! memory time at 100% bandwidth, `C` the all-reduce time (all from the spec sheet and the
//! model), `u = 1 / mfu`, `v = 1 / hbm_efficiency` and `b` the fixed overhead. The fit
//! alternates two steps until no sample changes side (a Gauss-Newton iteration on the
//! piecewise-linear roofline): classify each sample as compute- or memory-bound with the
//! current parameters, then solve the linear least-squares problem for that split. A side
//! with no sample on it is not identifiable: its parameter keeps its prior value and the
//! report marks it `fitted: false`. A profile whose `roofline` is `sum` prices
//! `t = X * u + Y * v + C + b` instead, one linear solve; [`calibrate_select`] fits each
//! form it is given and keeps the one with the lower error on the compute samples. Transfers fit `t = bytes / bandwidth + latency` per
//! link (one latency, one bandwidth per flow present), fingerprints
//! `t = bytes / throughput + overhead`.
//!
//! Groups are fitted in dependency order: links first (NVLink feeds the all-reduce term),
//! then fingerprints, decode (which fixes `hbm_efficiency`), prefill and the encoder (which
//! use it for their memory side). Intercepts are constrained to be >= 0. A group with fewer
//! samples than parameters, samples that cannot separate two parameters (all the same
//! size), or a fit that lands outside the physical range (efficiency above 1, a negative
//! bandwidth) is an error that names the group and the parameter, never a panic.

use std::fmt;

use serde::{Deserialize, Serialize, Serializer};

use crate::cost::CostModel;
use crate::error::ModelError;
use crate::hardware::{
    Efficiency, Flow, HardwareProfile, Host, LinkKind, Links, Overheads, Roofline, Rooflines,
};
use crate::lsq::{self, Singular};
use crate::model::ModelSpec;

/// Alternations of classify-and-solve before the best split seen is taken.
const MAX_ITERATIONS: usize = 32;

/// One measurement: what ran, and how long it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Sample {
    /// A vision-encoder batch, one entry of visual tokens per image.
    Encoder {
        /// Visual tokens of each image of the batch.
        visual_tokens: Vec<u32>,
        /// Measured time, ns.
        measured_ns: u64,
    },
    /// A prefill chunk of one sequence.
    Prefill {
        /// Tokens computed.
        new_tokens: u32,
        /// Tokens already in the KV cache.
        cached_tokens: u32,
        /// Measured time, ns.
        measured_ns: u64,
    },
    /// A decode iteration.
    Decode {
        /// Sequences in the batch.
        batch: u32,
        /// Tokens in their KV caches, summed over the batch.
        context_tokens: u64,
        /// Measured time, ns.
        measured_ns: u64,
    },
    /// A transfer over one link.
    Transfer {
        /// The link used.
        link: LinkKind,
        /// Direction and payload.
        flow: Flow,
        /// Bytes moved.
        bytes: u64,
        /// Measured time, ns.
        measured_ns: u64,
    },
    /// A content fingerprint on the host CPU.
    Fingerprint {
        /// Bytes hashed.
        bytes: u64,
        /// Measured time, ns.
        measured_ns: u64,
    },
}

impl Sample {
    /// The measured time, ns.
    pub fn measured_ns(&self) -> u64 {
        match self {
            Sample::Encoder { measured_ns, .. }
            | Sample::Prefill { measured_ns, .. }
            | Sample::Decode { measured_ns, .. }
            | Sample::Transfer { measured_ns, .. }
            | Sample::Fingerprint { measured_ns, .. } => *measured_ns,
        }
    }

    /// The group of parameters this sample informs.
    pub fn group(&self) -> Group {
        match self {
            Sample::Encoder { .. } => Group::Encoder,
            Sample::Prefill { .. } => Group::Prefill,
            Sample::Decode { .. } => Group::Decode,
            Sample::Transfer { link, .. } => Group::Transfer(*link),
            Sample::Fingerprint { .. } => Group::Fingerprint,
        }
    }

    /// What the cost model predicts for this sample, ns.
    pub fn predict_ns(&self, cost: &CostModel, hw: &HardwareProfile) -> Result<u64, ModelError> {
        Ok(match self {
            Sample::Encoder { visual_tokens, .. } => cost.encoder_time_ns(visual_tokens),
            Sample::Prefill {
                new_tokens,
                cached_tokens,
                ..
            } => cost.prefill_time_ns(*new_tokens, *cached_tokens),
            Sample::Decode {
                batch,
                context_tokens,
                ..
            } => cost.decode_iter_time_ns(*batch, *context_tokens),
            Sample::Transfer {
                link, flow, bytes, ..
            } => hw.link(*link)?.transfer_time_ns(*flow, *bytes),
            Sample::Fingerprint { bytes, .. } => hw.host.fingerprint_time_ns(*bytes),
        })
    }

    fn problem(&self) -> Option<&'static str> {
        match self {
            _ if self.measured_ns() == 0 => Some("measured_ns must be > 0"),
            Sample::Encoder { visual_tokens, .. } if visual_tokens.iter().all(|&t| t == 0) => {
                Some("an encoder sample needs at least one image with visual tokens")
            }
            Sample::Prefill { new_tokens: 0, .. } => Some("a prefill sample needs new_tokens > 0"),
            Sample::Decode { batch: 0, .. } => Some("a decode sample needs batch > 0"),
            _ => None,
        }
    }
}

/// A set of parameters fitted together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Group {
    /// Links: latency and one bandwidth per flow present.
    Transfer(LinkKind),
    /// Host fingerprint throughput and overhead.
    Fingerprint,
    /// Decode MFU, HBM efficiency and iteration overhead.
    Decode,
    /// Prefill MFU and chunk overhead.
    Prefill,
    /// Encoder MFU and batch overhead.
    Encoder,
}

impl fmt::Display for Group {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Group::Transfer(kind) => write!(f, "transfer {}", kind.as_str()),
            Group::Fingerprint => f.write_str("fingerprint"),
            Group::Decode => f.write_str("decode"),
            Group::Prefill => f.write_str("prefill"),
            Group::Encoder => f.write_str("encoder"),
        }
    }
}

impl Serialize for Group {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// A calibratable parameter; displays as its dotted path in the profile TOML.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Param {
    /// `efficiency.encoder_mfu`.
    EncoderMfu,
    /// `efficiency.prefill_mfu`.
    PrefillMfu,
    /// `efficiency.decode_mfu`.
    DecodeMfu,
    /// `efficiency.hbm_efficiency`.
    HbmEfficiency,
    /// `overheads.encoder_batch_ns`.
    EncoderBatchNs,
    /// `overheads.prefill_chunk_ns`.
    PrefillChunkNs,
    /// `overheads.decode_iter_ns`.
    DecodeIterNs,
    /// `links.<kind>.latency_ns`.
    LinkLatencyNs(LinkKind),
    /// `links.<kind>.<flow>_bytes_per_s`.
    LinkBytesPerS(LinkKind, Flow),
    /// `host.fingerprint_bytes_per_s`.
    FingerprintBytesPerS,
    /// `host.fingerprint_overhead_ns`.
    FingerprintOverheadNs,
}

impl fmt::Display for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Param::EncoderMfu => f.write_str("efficiency.encoder_mfu"),
            Param::PrefillMfu => f.write_str("efficiency.prefill_mfu"),
            Param::DecodeMfu => f.write_str("efficiency.decode_mfu"),
            Param::HbmEfficiency => f.write_str("efficiency.hbm_efficiency"),
            Param::EncoderBatchNs => f.write_str("overheads.encoder_batch_ns"),
            Param::PrefillChunkNs => f.write_str("overheads.prefill_chunk_ns"),
            Param::DecodeIterNs => f.write_str("overheads.decode_iter_ns"),
            Param::LinkLatencyNs(k) => write!(f, "links.{}.latency_ns", k.as_str()),
            Param::LinkBytesPerS(k, flow) => write!(f, "links.{}.{}", k.as_str(), flow.field()),
            Param::FingerprintBytesPerS => f.write_str("host.fingerprint_bytes_per_s"),
            Param::FingerprintOverheadNs => f.write_str("host.fingerprint_overhead_ns"),
        }
    }
}

impl Serialize for Param {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The calibratable part of a hardware profile: every parameter a calibration can set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Fractions of peak FLOP/s and bandwidth.
    pub efficiency: Efficiency,
    /// Fixed costs per call.
    pub overheads: Overheads,
    /// Link latencies and bandwidths.
    pub links: Links,
    /// Host fingerprint throughput and overhead.
    pub host: Host,
    /// How compute and memory times combine, per step kind (the forms fitted in).
    #[serde(default, skip_serializing_if = "Rooflines::is_default")]
    pub roofline: Rooflines,
}

impl Calibration {
    /// The calibratable part of `hw`.
    pub fn of(hw: &HardwareProfile) -> Self {
        Calibration {
            efficiency: hw.efficiency,
            overheads: hw.overheads,
            links: hw.links,
            host: hw.host,
            roofline: hw.roofline,
        }
    }

    /// `hw` with its calibratable part replaced by this one.
    pub fn apply(&self, hw: &HardwareProfile) -> HardwareProfile {
        HardwareProfile {
            efficiency: self.efficiency,
            overheads: self.overheads,
            links: self.links,
            host: self.host,
            roofline: self.roofline,
            ..hw.clone()
        }
    }

    /// The value of one parameter (`None` for a link the profile does not have).
    pub fn get(&self, param: Param) -> Option<f64> {
        Some(match param {
            Param::EncoderMfu => self.efficiency.encoder_mfu,
            Param::PrefillMfu => self.efficiency.prefill_mfu,
            Param::DecodeMfu => self.efficiency.decode_mfu,
            Param::HbmEfficiency => self.efficiency.hbm_efficiency,
            Param::EncoderBatchNs => self.overheads.encoder_batch_ns as f64,
            Param::PrefillChunkNs => self.overheads.prefill_chunk_ns as f64,
            Param::DecodeIterNs => self.overheads.decode_iter_ns as f64,
            Param::LinkLatencyNs(k) => self.links.get(k)?.latency_ns as f64,
            Param::LinkBytesPerS(k, flow) => self.links.get(k)?.bytes_per_s(flow),
            Param::FingerprintBytesPerS => self.host.fingerprint_bytes_per_s,
            Param::FingerprintOverheadNs => self.host.fingerprint_overhead_ns as f64,
        })
    }
}

/// One parameter after the fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FittedParam {
    /// Which parameter.
    pub param: Param,
    /// Its value in the profile before the fit.
    pub prior: f64,
    /// Its value after the fit (the prior when not fitted).
    pub value: f64,
    /// False when no sample could inform it (e.g. decode MFU from memory-bound samples).
    pub fitted: bool,
}

/// How well one group's fitted parameters explain its samples.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GroupFit {
    /// The group.
    pub group: Group,
    /// Samples in the group.
    pub samples: usize,
    /// Root mean square of predicted - measured, ns.
    pub rmse_ns: f64,
    /// Mean of |predicted - measured| / measured, percent.
    pub mean_abs_pct_error: f64,
    /// Largest |predicted - measured| / measured, percent.
    pub max_abs_pct_error: f64,
    /// Coefficient of determination `1 - SSE / SST` (1 when all measured times are equal
    /// and predicted exactly, 0 when they are equal and not).
    pub r2: f64,
}

/// One sample after the fit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Residual {
    /// Index of the sample in the input.
    pub sample: usize,
    /// Its group.
    pub group: Group,
    /// Measured time, ns.
    pub measured_ns: u64,
    /// Time the calibrated model predicts, ns.
    pub predicted_ns: u64,
    /// `predicted - measured`, ns.
    pub error_ns: i64,
    /// `(predicted - measured) / measured`, percent.
    pub pct_error: f64,
}

/// The outcome of [`calibrate()`]: fitted parameters and the fit error, overall, per
/// group and per sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrationReport {
    /// The fitted calibratable part; apply it with [`Calibration::apply`].
    pub calibration: Calibration,
    /// Every parameter of every group that had samples, in fit order.
    pub params: Vec<FittedParam>,
    /// Fit error per group, in fit order.
    pub groups: Vec<GroupFit>,
    /// Fit error per sample, in input order.
    pub residuals: Vec<Residual>,
    /// Root mean square error over all samples, ns.
    pub rmse_ns: f64,
    /// Mean absolute percentage error over all samples, percent.
    pub mean_abs_pct_error: f64,
    /// Every (compute group, roofline form) fitted, in fit order: the form each group
    /// kept is in `calibration.roofline` ([`calibrate_select`] tries several).
    pub forms: Vec<FormFit>,
}

/// One compute group fitted in one roofline form.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FormFit {
    /// The group (encoder, prefill or decode).
    pub group: Group,
    /// The form.
    pub roofline: Roofline,
    /// Mean absolute percentage error over the group's samples in this form, percent;
    /// `None` when the fit failed.
    pub mean_abs_pct_error: Option<f64>,
    /// Why the fit failed in this form.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The form the group kept (one per group).
    pub kept: bool,
}

impl CalibrationReport {
    /// The fitted value of a parameter, if its group had samples.
    pub fn param(&self, param: Param) -> Option<&FittedParam> {
        self.params.iter().find(|p| p.param == param)
    }

    /// Fit error of one group, if it had samples.
    pub fn group(&self, group: Group) -> Option<&GroupFit> {
        self.groups.iter().find(|g| g.group == group)
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Only f64, integers and strings: serialisation cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// Why a calibration could not be done.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// The sample list is empty.
    #[error("no samples to calibrate from")]
    NoSamples,
    /// One sample is unusable.
    #[error("sample {index}: {problem}")]
    BadSample {
        /// Index of the sample in the input.
        index: usize,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A group has fewer samples than parameters.
    #[error(
        "{group}: {samples} sample(s) for {params} parameter(s) ({names}); need at least one sample per parameter"
    )]
    TooFewSamples {
        /// The group.
        group: Group,
        /// Samples it has.
        samples: usize,
        /// Parameters it fits.
        params: usize,
        /// Their names.
        names: String,
    },
    /// The samples cannot tell a parameter apart from the others.
    #[error("{group}: cannot fit `{param}`: {why}")]
    Degenerate {
        /// The group.
        group: Group,
        /// The parameter that cannot be separated.
        param: Param,
        /// What to change in the samples.
        why: &'static str,
    },
    /// The best fit is outside the physical range.
    #[error("{group}: the fit gives `{param}` = {value}, which is impossible: {why}")]
    NonPhysical {
        /// The group.
        group: Group,
        /// The parameter.
        param: Param,
        /// Its fitted value.
        value: f64,
        /// What it means and what to check.
        why: &'static str,
    },
    /// The profile, model or tensor-parallel degree is unusable, or a sample names a link
    /// the profile does not have.
    #[error(transparent)]
    Model(#[from] ModelError),
}

/// Fit every calibratable parameter that `samples` inform, for `model` on `hw` with
/// tensor-parallel degree `tp`; parameters without samples keep their values in `hw`.
pub fn calibrate(
    hw: &HardwareProfile,
    model: &ModelSpec,
    tp: u32,
    samples: &[Sample],
) -> Result<CalibrationReport, CalibrationError> {
    calibrate_select(hw, model, tp, samples, &[])
}

/// [`calibrate`], fitting each compute group (decode, then prefill, then the encoder) in
/// every form of `forms` and keeping, per group, the one with the lowest mean |%| error
/// on that group's samples (the first of equals; a form whose fit fails is skipped, and
/// the group fails only if every form does). Later groups are fitted on the bandwidth
/// factor the kept decode form settled on. Empty `forms`: each group in `hw`'s form, as
/// [`calibrate`] does.
pub fn calibrate_select(
    hw: &HardwareProfile,
    model: &ModelSpec,
    tp: u32,
    samples: &[Sample],
    forms: &[Roofline],
) -> Result<CalibrationReport, CalibrationError> {
    if samples.is_empty() {
        return Err(CalibrationError::NoSamples);
    }
    CostModel::new(hw, model, tp)?;
    for (index, s) in samples.iter().enumerate() {
        if let Some(problem) = s.problem() {
            return Err(CalibrationError::BadSample { index, problem });
        }
        if let Sample::Transfer { link, .. } = s {
            hw.link(*link)?;
        }
    }
    let mut cal = Calibration::of(hw);
    let mut params = Vec::new();

    for kind in LinkKind::ALL {
        let idx = indices(
            samples,
            |s| matches!(s, Sample::Transfer { link, .. } if *link == kind),
        );
        if !idx.is_empty() {
            fit_link(kind, samples, &idx, &mut cal, &mut params)?;
        }
    }
    let idx = indices(samples, |s| matches!(s, Sample::Fingerprint { .. }));
    if !idx.is_empty() {
        fit_fingerprint(samples, &idx, &mut cal, &mut params)?;
    }
    // FLOPs and bytes do not depend on the efficiencies; the all-reduce term does depend
    // on NVLink, which is now final.
    let cost = CostModel::unchecked(&cal.apply(hw), model, tp);
    let mut tried = Vec::new();
    for group in [Group::Decode, Group::Prefill, Group::Encoder] {
        let idx = indices(samples, |s| s.group() == group);
        if idx.is_empty() {
            continue;
        }
        let own = [*form_of(&mut cal.roofline, group)];
        let candidates = if forms.is_empty() { &own[..] } else { forms };
        let mut best: Option<(f64, Calibration, Vec<FittedParam>, usize)> = None;
        let mut first_err = None;
        for &form in candidates {
            let mut c = cal;
            *form_of(&mut c.roofline, group) = form;
            let mut p = Vec::new();
            let fitted = fit_gpu(group, &cost, samples, &idx, &mut c, &mut p)
                .and_then(|()| group_error(&c.apply(hw), model, tp, samples, &idx));
            match fitted {
                Ok(e) => {
                    tried.push(FormFit {
                        group,
                        roofline: form,
                        mean_abs_pct_error: Some(e),
                        error: None,
                        kept: false,
                    });
                    if best.as_ref().is_none_or(|(b, _, _, _)| e < *b) {
                        best = Some((e, c, p, tried.len() - 1));
                    }
                }
                Err(err) => {
                    tried.push(FormFit {
                        group,
                        roofline: form,
                        mean_abs_pct_error: None,
                        error: Some(err.to_string()),
                        kept: false,
                    });
                    first_err.get_or_insert(err);
                }
            }
        }
        match (best, first_err) {
            (Some((_, c, p, at)), _) => {
                cal = c;
                params.extend(p);
                tried[at].kept = true;
            }
            (None, Some(e)) => return Err(e),
            (None, None) => unreachable!("at least one candidate form"),
        }
    }

    let fitted = cal.apply(hw);
    fitted.validate()?;
    let mut r = report(cal, params, &fitted, model, tp, samples)?;
    r.forms = tried;
    Ok(r)
}

/// The form of one compute group's steps.
fn form_of(r: &mut Rooflines, group: Group) -> &mut Roofline {
    match group {
        Group::Decode => &mut r.decode,
        Group::Prefill => &mut r.prefill,
        _ => &mut r.encoder,
    }
}

/// Mean |%| error of `fitted` on the samples `idx`.
fn group_error(
    fitted: &HardwareProfile,
    model: &ModelSpec,
    tp: u32,
    samples: &[Sample],
    idx: &[usize],
) -> Result<f64, CalibrationError> {
    let cost = CostModel::unchecked(fitted, model, tp);
    let mut sum = 0.0;
    for &i in idx {
        let m = samples[i].measured_ns() as f64;
        let p = samples[i].predict_ns(&cost, fitted)? as f64;
        sum += ((p - m) / m).abs() * 100.0;
    }
    Ok(sum / idx.len() as f64)
}

fn indices(samples: &[Sample], pick: impl Fn(&Sample) -> bool) -> Vec<usize> {
    (0..samples.len()).filter(|&i| pick(&samples[i])).collect()
}

/// A least-squares solve with a non-negative intercept in the last column: if the free
/// intercept comes out negative, refit through the origin. Row `i` is weighted by
/// `1 / measured[i]`, so the fit minimises relative, not absolute, errors.
fn solve_with_intercept(
    group: Group,
    cols: &[Vec<f64>],
    names: &[Param],
    rhs: &[f64],
    measured: &[f64],
) -> Result<(Vec<f64>, f64), CalibrationError> {
    let weigh = |v: &[f64]| -> Vec<f64> { v.iter().zip(measured).map(|(x, t)| x / t).collect() };
    let cols: Vec<Vec<f64>> = cols.iter().map(|c| weigh(c)).collect();
    let rhs = weigh(rhs);
    let singular = |e: Singular| {
        let j = match e {
            Singular::Zero(j) | Singular::Dependent(j) => j,
        };
        CalibrationError::Degenerate {
            group,
            param: names[j],
            why: "the samples are (nearly) all the same size, so this parameter cannot be told \
                  apart from the others; measure a wider range of sizes",
        }
    };
    let sol = lsq::solve(&cols, &rhs).map_err(singular)?;
    let (slopes, b) = sol.split_at(sol.len() - 1);
    if b[0] >= 0.0 {
        return Ok((slopes.to_vec(), b[0]));
    }
    let k = cols.len() - 1;
    if k == 0 {
        return Ok((Vec::new(), 0.0));
    }
    let sol = lsq::solve(&cols[..k], &rhs).map_err(singular)?;
    Ok((sol, 0.0))
}

fn too_few(group: Group, samples: usize, names: &[Param]) -> CalibrationError {
    CalibrationError::TooFewSamples {
        group,
        samples,
        params: names.len(),
        names: names
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

fn fit_link(
    kind: LinkKind,
    samples: &[Sample],
    idx: &[usize],
    cal: &mut Calibration,
    params: &mut Vec<FittedParam>,
) -> Result<(), CalibrationError> {
    let group = Group::Transfer(kind);
    let rows: Vec<(Flow, f64, f64)> = idx
        .iter()
        .filter_map(|&i| match &samples[i] {
            Sample::Transfer {
                flow,
                bytes,
                measured_ns,
                ..
            } => Some((*flow, *bytes as f64, *measured_ns as f64)),
            _ => None,
        })
        .collect();
    let flows: Vec<Flow> = Flow::ALL
        .into_iter()
        .filter(|f| rows.iter().any(|r| r.0 == *f))
        .collect();
    let mut names: Vec<Param> = flows
        .iter()
        .map(|&f| Param::LinkBytesPerS(kind, f))
        .collect();
    names.push(Param::LinkLatencyNs(kind));
    if rows.len() < names.len() {
        return Err(too_few(group, rows.len(), &names));
    }
    let mut cols: Vec<Vec<f64>> = flows
        .iter()
        .map(|&f| {
            rows.iter()
                .map(|r| if r.0 == f { r.1 } else { 0.0 })
                .collect()
        })
        .collect();
    cols.push(vec![1.0; rows.len()]);
    let rhs: Vec<f64> = rows.iter().map(|r| r.2).collect();
    let (ns_per_byte, latency) = solve_with_intercept(group, &cols, &names, &rhs, &rhs)?;
    let link = cal.links.get_mut(kind).ok_or_else(|| {
        ModelError::invalid(
            "calibration",
            format!("links.{}", kind.as_str()),
            "this profile has no such link",
        )
    })?;
    let before = *link;
    for (&flow, &u) in flows.iter().zip(&ns_per_byte) {
        let param = Param::LinkBytesPerS(kind, flow);
        if !(u > 0.0 && u.is_finite()) {
            return Err(CalibrationError::NonPhysical {
                group,
                param,
                value: if u == 0.0 { f64::INFINITY } else { 1e9 / u },
                why: "transfer time does not grow with bytes; check the measurements",
            });
        }
        link.set_bytes_per_s(flow, 1e9 / u);
        params.push(FittedParam {
            param,
            prior: before.bytes_per_s(flow),
            value: 1e9 / u,
            fitted: true,
        });
    }
    link.latency_ns = round_ns(latency);
    params.push(FittedParam {
        param: Param::LinkLatencyNs(kind),
        prior: before.latency_ns as f64,
        value: link.latency_ns as f64,
        fitted: true,
    });
    Ok(())
}

fn fit_fingerprint(
    samples: &[Sample],
    idx: &[usize],
    cal: &mut Calibration,
    params: &mut Vec<FittedParam>,
) -> Result<(), CalibrationError> {
    let group = Group::Fingerprint;
    let names = [Param::FingerprintBytesPerS, Param::FingerprintOverheadNs];
    if idx.len() < names.len() {
        return Err(too_few(group, idx.len(), &names));
    }
    let bytes: Vec<f64> = idx
        .iter()
        .map(|&i| match &samples[i] {
            Sample::Fingerprint { bytes, .. } => *bytes as f64,
            _ => 0.0,
        })
        .collect();
    let rhs: Vec<f64> = idx
        .iter()
        .map(|&i| samples[i].measured_ns() as f64)
        .collect();
    let cols = [bytes, vec![1.0; idx.len()]];
    let (u, b) = solve_with_intercept(group, &cols, &names, &rhs, &rhs)?;
    let u = u[0];
    if !(u > 0.0 && u.is_finite()) {
        return Err(CalibrationError::NonPhysical {
            group,
            param: names[0],
            value: if u == 0.0 { f64::INFINITY } else { 1e9 / u },
            why: "fingerprint time does not grow with bytes; check the measurements",
        });
    }
    let before = cal.host;
    cal.host.fingerprint_bytes_per_s = 1e9 / u;
    cal.host.fingerprint_overhead_ns = round_ns(b);
    params.push(FittedParam {
        param: names[0],
        prior: before.fingerprint_bytes_per_s,
        value: cal.host.fingerprint_bytes_per_s,
        fitted: true,
    });
    params.push(FittedParam {
        param: names[1],
        prior: before.fingerprint_overhead_ns as f64,
        value: cal.host.fingerprint_overhead_ns as f64,
        fitted: true,
    });
    Ok(())
}

/// The piecewise-linear roofline fit of one GPU group (see the module docs).
fn fit_gpu(
    group: Group,
    cost: &CostModel,
    samples: &[Sample],
    idx: &[usize],
    cal: &mut Calibration,
    params: &mut Vec<FittedParam>,
) -> Result<(), CalibrationError> {
    let (mfu_param, overhead_param, mfu, overhead) = match group {
        Group::Decode => (
            Param::DecodeMfu,
            Param::DecodeIterNs,
            cal.efficiency.decode_mfu,
            cal.overheads.decode_iter_ns,
        ),
        Group::Prefill => (
            Param::PrefillMfu,
            Param::PrefillChunkNs,
            cal.efficiency.prefill_mfu,
            cal.overheads.prefill_chunk_ns,
        ),
        _ => (
            Param::EncoderMfu,
            Param::EncoderBatchNs,
            cal.efficiency.encoder_mfu,
            cal.overheads.encoder_batch_ns,
        ),
    };
    // Only decode moves the bandwidth factor; the others use the one decode settled on.
    let free_v = group == Group::Decode;
    let names: Vec<Param> = if free_v {
        vec![mfu_param, Param::HbmEfficiency, overhead_param]
    } else {
        vec![mfu_param, overhead_param]
    };
    let n = idx.len();
    if n < names.len() {
        return Err(too_few(group, n, &names));
    }
    let (mut x, mut y, mut c, mut t) = (
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    );
    for &i in idx {
        let w = match &samples[i] {
            Sample::Encoder { visual_tokens, .. } => cost.encoder_work(visual_tokens),
            Sample::Prefill {
                new_tokens,
                cached_tokens,
                ..
            } => cost.prefill_work(*new_tokens, *cached_tokens),
            Sample::Decode {
                batch,
                context_tokens,
                ..
            } => cost.decode_work(*batch, *context_tokens),
            _ => continue,
        };
        x.push(cost.compute_ns_at_peak(&w));
        y.push(cost.memory_ns_at_peak(&w));
        c.push(w.comm_ns);
        t.push(samples[i].measured_ns() as f64);
    }
    let prior = Roof {
        u: 1.0 / mfu,
        v: 1.0 / cal.efficiency.hbm_efficiency,
        b: overhead as f64,
        fitted_u: false,
        fitted_v: false,
    };
    let fit = match *form_of(&mut cal.roofline, group) {
        Roofline::Max => fit_roofline(group, &names, &x, &y, &c, &t, prior, free_v)?,
        Roofline::Sum => fit_sum(group, &names, &x, &y, &c, &t, prior, free_v)?,
    };

    let new_mfu = 1.0 / fit.u;
    check_fraction(group, mfu_param, new_mfu)?;
    let new_overhead = round_ns(fit.b);
    params.push(FittedParam {
        param: mfu_param,
        prior: mfu,
        value: new_mfu,
        fitted: fit.fitted_u,
    });
    if free_v {
        let new_eff = 1.0 / fit.v;
        check_fraction(group, Param::HbmEfficiency, new_eff)?;
        params.push(FittedParam {
            param: Param::HbmEfficiency,
            prior: cal.efficiency.hbm_efficiency,
            value: new_eff,
            fitted: fit.fitted_v,
        });
        cal.efficiency.hbm_efficiency = new_eff;
    }
    params.push(FittedParam {
        param: overhead_param,
        prior: overhead as f64,
        value: new_overhead as f64,
        fitted: true,
    });
    match group {
        Group::Decode => {
            cal.efficiency.decode_mfu = new_mfu;
            cal.overheads.decode_iter_ns = new_overhead;
        }
        Group::Prefill => {
            cal.efficiency.prefill_mfu = new_mfu;
            cal.overheads.prefill_chunk_ns = new_overhead;
        }
        _ => {
            cal.efficiency.encoder_mfu = new_mfu;
            cal.overheads.encoder_batch_ns = new_overhead;
        }
    }
    Ok(())
}

/// Roofline parameters: `u = 1/mfu`, `v = 1/hbm_efficiency`, `b` = overhead (ns).
#[derive(Debug, Clone, Copy)]
struct Roof {
    u: f64,
    v: f64,
    b: f64,
    fitted_u: bool,
    fitted_v: bool,
}

#[allow(clippy::too_many_arguments)]
fn fit_roofline(
    group: Group,
    names: &[Param],
    x: &[f64],
    y: &[f64],
    c: &[f64],
    t: &[f64],
    prior: Roof,
    free_v: bool,
) -> Result<Roof, CalibrationError> {
    let n = t.len();
    let (u_name, v_name, b_name) = roof_names(names, free_v);
    let mut cur = prior;
    let mut best: Option<(f64, Roof)> = None;
    let mut prev: Vec<bool> = Vec::new();
    for _ in 0..MAX_ITERATIONS {
        // true: compute-bound under the current parameters.
        let side: Vec<bool> = (0..n).map(|i| x[i] * cur.u >= y[i] * cur.v).collect();
        if side == prev {
            break;
        }
        let use_u = (0..n).any(|i| side[i] && x[i] > 0.0);
        let use_v = free_v && (0..n).any(|i| !side[i] && y[i] > 0.0);
        let mut cols: Vec<Vec<f64>> = Vec::with_capacity(3);
        let mut col_names: Vec<Param> = Vec::with_capacity(3);
        if use_u {
            cols.push((0..n).map(|i| if side[i] { x[i] } else { 0.0 }).collect());
            col_names.push(u_name);
        }
        if use_v {
            cols.push((0..n).map(|i| if side[i] { 0.0 } else { y[i] }).collect());
            col_names.push(v_name);
        }
        cols.push(vec![1.0; n]);
        col_names.push(b_name);
        let rhs: Vec<f64> = (0..n)
            .map(|i| {
                let fixed = match (side[i], use_u, use_v) {
                    (true, false, _) => x[i] * cur.u,
                    (false, _, false) => y[i] * cur.v,
                    _ => 0.0,
                };
                t[i] - c[i] - fixed
            })
            .collect();
        let (slopes, b) = solve_with_intercept(group, &cols, &col_names, &rhs, t)?;
        take_solution(
            group,
            &mut cur,
            &slopes,
            b,
            [use_u, use_v],
            [u_name, v_name],
        )?;
        let sse: f64 = (0..n)
            .map(|i| {
                let roof = (x[i] * cur.u).max(y[i] * cur.v);
                let e = (roof + c[i] + cur.b - t[i]) / t[i];
                e * e
            })
            .sum();
        if best.as_ref().is_none_or(|(s, _)| sse < *s) {
            best = Some((sse, cur));
        }
        prev = side;
    }
    Ok(best.map_or(cur, |(_, r)| r))
}

/// The no-overlap form `t = X * u + Y * v + C + b`: one linear least-squares solve (`v`
/// fixed at its prior unless `free_v`). A parameter whose regressor is zero on every
/// sample keeps its prior (`fitted: false`).
#[allow(clippy::too_many_arguments)]
fn fit_sum(
    group: Group,
    names: &[Param],
    x: &[f64],
    y: &[f64],
    c: &[f64],
    t: &[f64],
    prior: Roof,
    free_v: bool,
) -> Result<Roof, CalibrationError> {
    let n = t.len();
    let (u_name, v_name, b_name) = roof_names(names, free_v);
    let use_u = x.iter().any(|&v| v > 0.0);
    let use_v = free_v && y.iter().any(|&v| v > 0.0);
    let mut cols: Vec<Vec<f64>> = Vec::with_capacity(3);
    let mut col_names: Vec<Param> = Vec::with_capacity(3);
    if use_u {
        cols.push(x.to_vec());
        col_names.push(u_name);
    }
    if use_v {
        cols.push(y.to_vec());
        col_names.push(v_name);
    }
    cols.push(vec![1.0; n]);
    col_names.push(b_name);
    let rhs: Vec<f64> = (0..n)
        .map(|i| {
            let fixed =
                if use_u { 0.0 } else { x[i] * prior.u } + if use_v { 0.0 } else { y[i] * prior.v };
            t[i] - c[i] - fixed
        })
        .collect();
    let (slopes, b) = solve_with_intercept(group, &cols, &col_names, &rhs, t)?;
    let mut cur = prior;
    take_solution(
        group,
        &mut cur,
        &slopes,
        b,
        [use_u, use_v],
        [u_name, v_name],
    )?;
    Ok(cur)
}

/// The names of a group's `(u, v, b)`: `names` lists the fitted ones, `v` (the bandwidth
/// factor) among them only for decode (`free_v`).
fn roof_names(names: &[Param], free_v: bool) -> (Param, Param, Param) {
    if free_v {
        (names[0], names[1], names[2])
    } else {
        (names[0], Param::HbmEfficiency, names[1])
    }
}

/// Take a solve's slopes (`u` first when `used[0]`, then `v` when `used[1]`) and its
/// intercept into `cur`; a slope that is not positive and finite is an error naming its
/// parameter.
fn take_solution(
    group: Group,
    cur: &mut Roof,
    slopes: &[f64],
    b: f64,
    used: [bool; 2],
    names: [Param; 2],
) -> Result<(), CalibrationError> {
    let mut k = 0;
    if used[0] {
        cur.u = slopes.get(k).copied().unwrap_or(cur.u);
        k += 1;
    }
    if used[1] {
        cur.v = slopes.get(k).copied().unwrap_or(cur.v);
    }
    cur.b = b;
    cur.fitted_u = used[0];
    cur.fitted_v = used[1];
    for (param, value) in [(names[0], cur.u), (names[1], cur.v)] {
        if !(value > 0.0 && value.is_finite()) {
            return Err(CalibrationError::NonPhysical {
                group,
                param,
                value: 1.0 / value,
                why: "measured time does not grow with the work; check the samples",
            });
        }
    }
    Ok(())
}

fn check_fraction(group: Group, param: Param, value: f64) -> Result<(), CalibrationError> {
    if value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(CalibrationError::NonPhysical {
            group,
            param,
            value,
            why: "an efficiency must be in (0, 1]; above 1 the measurements are faster than \
                  the spec-sheet peak allows: check peak_bf16_flops_per_s / hbm_bytes_per_s, \
                  the model spec and the tensor-parallel degree",
        })
    }
}

fn round_ns(x: f64) -> u64 {
    if x > 0.0 {
        x.round() as u64
    } else {
        0
    }
}

fn report(
    calibration: Calibration,
    params: Vec<FittedParam>,
    fitted: &HardwareProfile,
    model: &ModelSpec,
    tp: u32,
    samples: &[Sample],
) -> Result<CalibrationReport, CalibrationError> {
    let cost = CostModel::unchecked(fitted, model, tp);
    let mut residuals = Vec::with_capacity(samples.len());
    for (i, s) in samples.iter().enumerate() {
        let measured = s.measured_ns();
        let predicted = s.predict_ns(&cost, fitted)?;
        let error = predicted as f64 - measured as f64;
        residuals.push(Residual {
            sample: i,
            group: s.group(),
            measured_ns: measured,
            predicted_ns: predicted,
            error_ns: error as i64,
            pct_error: error / measured as f64 * 100.0,
        });
    }
    let mut groups_seen: Vec<Group> = residuals.iter().map(|r| r.group).collect();
    groups_seen.sort();
    groups_seen.dedup();
    let groups = groups_seen
        .into_iter()
        .map(|g| {
            let rs: Vec<&Residual> = residuals.iter().filter(|r| r.group == g).collect();
            stats(g, &rs)
        })
        .collect();
    let all: Vec<&Residual> = residuals.iter().collect();
    let overall = stats(Group::Encoder, &all);
    Ok(CalibrationReport {
        calibration,
        params,
        groups,
        rmse_ns: overall.rmse_ns,
        mean_abs_pct_error: overall.mean_abs_pct_error,
        forms: Vec::new(),
        residuals,
    })
}

fn stats(group: Group, rs: &[&Residual]) -> GroupFit {
    let n = rs.len() as f64;
    let mean = rs.iter().map(|r| r.measured_ns as f64).sum::<f64>() / n;
    let sse: f64 = rs
        .iter()
        .map(|r| (r.error_ns as f64) * (r.error_ns as f64))
        .sum();
    let sst: f64 = rs
        .iter()
        .map(|r| (r.measured_ns as f64 - mean) * (r.measured_ns as f64 - mean))
        .sum();
    let r2 = if sst > 0.0 {
        1.0 - sse / sst
    } else if sse == 0.0 {
        1.0
    } else {
        0.0
    };
    GroupFit {
        group,
        samples: rs.len(),
        rmse_ns: (sse / n).sqrt(),
        mean_abs_pct_error: rs.iter().map(|r| r.pct_error.abs()).sum::<f64>() / n,
        max_abs_pct_error: rs.iter().map(|r| r.pct_error.abs()).fold(0.0, f64::max),
        r2,
    }
}

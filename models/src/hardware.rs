//! Hardware profiles: what one accelerator (or a CPU host) can do, as data.
//!
//! A profile has two parts. The spec-sheet part (`peak_bf16_flops_per_s`,
//! `hbm_bytes_per_s`, `hbm_capacity_bytes`) is copied from vendor datasheets and is never
//! fitted. The calibratable part ([`Efficiency`], [`Overheads`], [`Links`], [`Host`]) holds
//! every factor the cost model multiplies those peaks by; the defaults in the built-in
//! files are either measurements (TCP bandwidths, from seed 002) or stated guesses, and
//! [`crate::calibrate()`] replaces them with values fitted from measured samples.
//!
//! Built-in profiles are embedded in the binary (`b200`, `h200`, `h100`, `cpu`); a user
//! file with the same fields loads through [`HardwareProfile::from_path`]. Unknown fields
//! and impossible values are errors that name the field.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::catalog;
use crate::error::{check_fraction, check_nonzero, check_positive, FieldError, ModelError};
use crate::to_ns;

/// Built-in profiles: (name, file under `data/hardware/`, text).
const BUILTIN: [(&str, &str, &str); 4] = [
    (
        "b200",
        "b200.toml",
        include_str!("../data/hardware/b200.toml"),
    ),
    (
        "h200",
        "h200.toml",
        include_str!("../data/hardware/h200.toml"),
    ),
    (
        "h100",
        "h100.toml",
        include_str!("../data/hardware/h100.toml"),
    ),
    ("cpu", "cpu.toml", include_str!("../data/hardware/cpu.toml")),
];

/// One accelerator (or a CPU host): spec-sheet peaks plus calibratable efficiency factors.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    /// Short name used by [`HardwareProfile::by_name`] (`h200`).
    pub name: String,
    /// One line saying which SKU this is and where the numbers come from.
    pub description: String,
    /// Peak dense (no sparsity) BF16 tensor throughput of one device, FLOP/s.
    pub peak_bf16_flops_per_s: f64,
    /// Peak memory bandwidth of one device (HBM; host DRAM for a CPU profile), bytes/s.
    pub hbm_bytes_per_s: f64,
    /// Memory capacity of one device, bytes.
    pub hbm_capacity_bytes: u64,
    /// Fractions of the peaks that real kernels reach.
    pub efficiency: Efficiency,
    /// Fixed time per batch, chunk or iteration on top of the rooflines.
    pub overheads: Overheads,
    /// How each step kind's compute and memory times combine: `max` (they overlap, the
    /// default: a GPU streaming weights while its tensor cores run) or `sum` (they do
    /// not: a CPU whose small-batch GEMMs stall on loads). Calibratable: `moonagent
    /// validate profile` fits both per kind and keeps the one that explains its samples
    /// better. In a profile file: `[roofline]` with `decode = "sum"`; absent, all `max`.
    #[serde(default, skip_serializing_if = "Rooflines::is_default")]
    pub roofline: Rooflines,
    /// Interconnects this device can use, each optional.
    pub links: Links,
    /// The host CPU, for work done before the GPU (content fingerprints).
    pub host: Host,
    /// The workers' compute shares this many host cores (a CPU backend running every
    /// worker as a thread of one host): concurrent steps share them by processor
    /// sharing. Absent (the default) when every worker has a device of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_cores: Option<f64>,
    /// How the host's scheduler divides `shared_cores` among step kinds (weighted
    /// processor sharing), measured by `moonagent validate profile`'s contention run.
    /// Absent: every running step gets an equal share. Requires `shared_cores`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub core_weights: Option<CoreWeights>,
    /// Each compute step kind's time in a serving run against its time in the operator
    /// profile, for steps that ran alone: `moonagent validate all` measures it on a
    /// calibration run (a trace of its own, never one it is judged on) and the cost model
    /// multiplies every step of that kind by it. A profile times each shape back to back,
    /// hot; in a run, encode and prefill steps follow other work and decode iterations
    /// follow each other. Absent: every factor 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_scale: Option<StepScale>,
    /// While more compute steps run than there are `shared_cores`, each kind's step
    /// advances this many times slower than its processor share (on top of `step_scale`):
    /// on a host whose cores are all busy and time-sliced, a step runs slower on its core
    /// than it does alone. `moonagent validate all` measures it on its capacity bursts,
    /// where every worker is busy nearly all the time. Absent: every factor 1 (plain
    /// processor sharing). Requires `shared_cores`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oversubscribed: Option<StepScale>,
    /// While more compute steps run than `shared_cores`, a decode iteration advances
    /// `1 + kv * s + encoder * e` times slower than its processor share (on top of
    /// `step_scale`), where `s` is the KV share of the bytes it reads (the cost model's
    /// KV bytes over weights plus KV) and `e` the number of encoder batches running beside
    /// it: on a host, all workers' LLM steps share one copy of the weights in the caches,
    /// while each sequence's KV is its own and an encoder's weights displace the LLM's.
    /// When present it replaces `oversubscribed.decode`. `moonagent validate all` fits it
    /// on its capacity bursts. Absent: decode takes `oversubscribed.decode`. Requires
    /// `shared_cores`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_contention: Option<DecodeContention>,
}

/// [`HardwareProfile::decode_contention`]: how much slower than its processor share an
/// oversubscribed decode iteration runs, per unit of KV share and per encoder batch beside.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeContention {
    /// Loss per unit of the iteration's KV share of its bytes (0 to 1).
    pub kv: f64,
    /// Loss per encoder batch running beside it.
    pub encoder: f64,
}

impl DecodeContention {
    /// The factor a decode iteration with KV share `kv_share` runs slower by while
    /// `encoders` encoder batches run beside it.
    #[inline]
    pub fn slow(&self, kv_share: f64, encoders: usize) -> f64 {
        1.0 + self.kv * kv_share + self.encoder * encoders as f64
    }
}

/// Per compute step kind, the factor [`HardwareProfile::step_scale`] multiplies its time
/// by.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepScale {
    /// Encoder batches.
    pub encode: f64,
    /// Prefill chunks.
    pub prefill: f64,
    /// Decode iterations.
    pub decode: f64,
}

impl StepScale {
    /// Factors in `[encode, prefill, decode]` order.
    pub fn as_array(&self) -> [f64; 3] {
        [self.encode, self.prefill, self.decode]
    }
}

/// Relative shares of shared cores per compute step kind: with steps of weights `w_i`
/// running on `c` cores, each runs at `min(1, λ w_i)` of its own speed, `λ` such that the
/// rates sum to `min(c, n)` (water-filling). Equal weights are plain processor sharing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoreWeights {
    /// Encoder batches.
    pub encode: f64,
    /// Prefill chunks.
    pub prefill: f64,
    /// Decode iterations.
    pub decode: f64,
}

impl CoreWeights {
    /// Equal shares (plain processor sharing).
    pub const EQUAL: CoreWeights = CoreWeights {
        encode: 1.0,
        prefill: 1.0,
        decode: 1.0,
    };

    /// The step kinds, in the order of [`CoreWeights::as_array`].
    pub const KINDS: [&'static str; 3] = ["encode", "prefill", "decode"];

    /// Weights in `[encode, prefill, decode]` order.
    pub fn as_array(&self) -> [f64; 3] {
        [self.encode, self.prefill, self.decode]
    }
}

/// The rate of each of `weights.len()` steps sharing `cores` cores by weight, as a
/// fraction of its own full speed, into `rates` (water-filling): steps whose weighted
/// share would exceed one core run at full speed, and the cores left are shared among the
/// rest by weight, until no share exceeds one core. The rates sum to
/// `min(cores, steps)`; with equal weights each is `min(1, cores / steps)` exactly.
pub fn shared_core_rates(cores: f64, weights: &[f64], rates: &mut Vec<f64>) {
    let n = weights.len();
    rates.clear();
    rates.resize(n, 0.0);
    let mut open: Vec<usize> = (0..n).collect();
    let mut cap = cores;
    while !open.is_empty() {
        let wsum: f64 = open.iter().map(|&i| weights[i]).sum();
        let lambda = cap / wsum;
        let before = open.len();
        open.retain(|&i| {
            let full = lambda * weights[i] >= 1.0;
            if full {
                rates[i] = 1.0;
            }
            !full
        });
        if open.len() == before {
            for &i in &open {
                rates[i] = lambda * weights[i];
            }
            break;
        }
        cap -= (before - open.len()) as f64;
    }
}

/// How a compute step's time at its efficiencies, `compute = X / mfu` and `memory = Y /
/// hbm_efficiency`, becomes one time (before the all-reduce and the fixed overhead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Roofline {
    /// `max(compute, memory)`: memory traffic overlaps compute (the roofline model).
    #[default]
    Max,
    /// `compute + memory`: no overlap (a lower bound on overlap; fits CPU GEMMs at small
    /// batch, whose time grows with the batch while the weights are still streamed).
    Sum,
}

impl Roofline {
    /// Both forms, the default first.
    pub const ALL: [Roofline; 2] = [Roofline::Max, Roofline::Sum];

    /// True for the default form (so a profile file leaves it out).
    pub fn is_max(&self) -> bool {
        *self == Roofline::Max
    }

    /// The form's name as in a profile file (`max`, `sum`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Roofline::Max => "max",
            Roofline::Sum => "sum",
        }
    }

    /// Combine a step's compute and memory times, ns.
    #[inline]
    pub fn combine(&self, compute: f64, memory: f64) -> f64 {
        match self {
            Roofline::Max => {
                if compute >= memory {
                    compute
                } else {
                    memory
                }
            }
            Roofline::Sum => compute + memory,
        }
    }
}

/// The [`Roofline`] form of each compute step kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rooflines {
    /// Vision-encoder batches.
    #[serde(default, skip_serializing_if = "Roofline::is_max")]
    pub encoder: Roofline,
    /// Prefill chunks.
    #[serde(default, skip_serializing_if = "Roofline::is_max")]
    pub prefill: Roofline,
    /// Decode iterations.
    #[serde(default, skip_serializing_if = "Roofline::is_max")]
    pub decode: Roofline,
}

impl Rooflines {
    /// Every kind `max` (so a profile file leaves the table out).
    pub fn is_default(&self) -> bool {
        *self == Rooflines::default()
    }
}

impl std::fmt::Display for Roofline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Fractions of peak that kernels reach; each in (0, 1]. All calibratable.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Model FLOP utilisation of the vision encoder (ViT + merger).
    pub encoder_mfu: f64,
    /// Model FLOP utilisation of LLM prefill (linear layers and attention).
    pub prefill_mfu: f64,
    /// Model FLOP utilisation of a decode iteration when it is compute-bound.
    pub decode_mfu: f64,
    /// Fraction of peak memory bandwidth reached when streaming weights and KV.
    pub hbm_efficiency: f64,
}

/// Fixed costs per unit of work (kernel launches, scheduling, sampling), ns. Calibratable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overheads {
    /// Per vision-encoder batch, ns.
    pub encoder_batch_ns: u64,
    /// Per prefill chunk (one forward pass), ns.
    pub prefill_chunk_ns: u64,
    /// Per decode iteration (one forward pass of the whole batch), ns.
    pub decode_iter_ns: u64,
}

/// The interconnects of a device; a missing one cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Links {
    /// GPU-to-GPU inside a node (also carries tensor-parallel all-reduces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<Link>,
    /// Node-to-node RDMA (one NIC per GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<Link>,
    /// TCP through Mooncake's transfer engine (what seed 002 measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<Link>,
    /// Host-to-device and device-to-host copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie: Option<Link>,
}

/// One interconnect: a fixed latency plus bytes over a per-direction bandwidth.
///
/// `put` is the sender-to-store (or sender-to-peer) direction and `get` the reverse.
/// KV cache can have its own bandwidths because it moves as many page-sized pieces where
/// an encoder output moves as one blob (seed 002 measured KV puts at under half the
/// encoder-output put bandwidth over the same TCP path); absent, KV uses `put`/`get`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Link {
    /// Fixed time per transfer (software + wire), ns.
    pub latency_ns: u64,
    /// Bandwidth of a put (encoder outputs and general objects), bytes/s.
    pub put_bytes_per_s: f64,
    /// Bandwidth of a get (encoder outputs and general objects), bytes/s.
    pub get_bytes_per_s: f64,
    /// Bandwidth of a KV-cache put, bytes/s; `put_bytes_per_s` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_put_bytes_per_s: Option<f64>,
    /// Bandwidth of a KV-cache get, bytes/s; `get_bytes_per_s` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_get_bytes_per_s: Option<f64>,
}

/// The host CPU of a node. Calibratable.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Single-thread BLAKE2b throughput over the processed pixel tensor, bytes/s.
    pub fingerprint_bytes_per_s: f64,
    /// Fixed cost per fingerprint (hashing the model fingerprint, grid, shape), ns.
    pub fingerprint_overhead_ns: u64,
}

/// Which interconnect a transfer uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkKind {
    /// GPU-to-GPU inside a node.
    Nvlink,
    /// Node-to-node RDMA.
    Rdma,
    /// TCP.
    Tcp,
    /// Host-device copies.
    Pcie,
}

impl LinkKind {
    /// Every link kind, in file order.
    pub const ALL: [LinkKind; 4] = [
        LinkKind::Nvlink,
        LinkKind::Rdma,
        LinkKind::Tcp,
        LinkKind::Pcie,
    ];

    /// The TOML key of this link (`nvlink`).
    pub const fn as_str(self) -> &'static str {
        match self {
            LinkKind::Nvlink => "nvlink",
            LinkKind::Rdma => "rdma",
            LinkKind::Tcp => "tcp",
            LinkKind::Pcie => "pcie",
        }
    }
}

/// Direction and payload of a transfer; selects one of a [`Link`]'s bandwidths (the
/// serving engine's vocabulary, defined once in the core).
pub use moonagent_core::serve::Flow;

impl Link {
    /// The bandwidth a transfer of this flow gets, bytes/s.
    #[inline]
    pub fn bytes_per_s(&self, flow: Flow) -> f64 {
        match flow {
            Flow::Put => self.put_bytes_per_s,
            Flow::Get => self.get_bytes_per_s,
            Flow::KvPut => self.kv_put_bytes_per_s.unwrap_or(self.put_bytes_per_s),
            Flow::KvGet => self.kv_get_bytes_per_s.unwrap_or(self.get_bytes_per_s),
        }
    }

    /// Time to move `bytes` of `flow`: `latency_ns + ceil(bytes / bandwidth)`, ns.
    #[inline]
    pub fn transfer_time_ns(&self, flow: Flow, bytes: u64) -> u64 {
        let wire = to_ns(bytes as f64 * 1e9 / self.bytes_per_s(flow));
        self.latency_ns.saturating_add(wire)
    }

    pub(crate) fn set_bytes_per_s(&mut self, flow: Flow, value: f64) {
        match flow {
            Flow::Put => self.put_bytes_per_s = value,
            Flow::Get => self.get_bytes_per_s = value,
            Flow::KvPut => self.kv_put_bytes_per_s = Some(value),
            Flow::KvGet => self.kv_get_bytes_per_s = Some(value),
        }
    }

    fn check(&self, prefix: &str) -> Result<(), FieldError> {
        check_positive(&format!("{prefix}.put_bytes_per_s"), self.put_bytes_per_s)?;
        check_positive(&format!("{prefix}.get_bytes_per_s"), self.get_bytes_per_s)?;
        if let Some(v) = self.kv_put_bytes_per_s {
            check_positive(&format!("{prefix}.kv_put_bytes_per_s"), v)?;
        }
        if let Some(v) = self.kv_get_bytes_per_s {
            check_positive(&format!("{prefix}.kv_get_bytes_per_s"), v)?;
        }
        Ok(())
    }
}

impl Links {
    /// The link of this kind, if the device has one.
    #[inline]
    pub fn get(&self, kind: LinkKind) -> Option<&Link> {
        match kind {
            LinkKind::Nvlink => self.nvlink.as_ref(),
            LinkKind::Rdma => self.rdma.as_ref(),
            LinkKind::Tcp => self.tcp.as_ref(),
            LinkKind::Pcie => self.pcie.as_ref(),
        }
    }

    pub(crate) fn get_mut(&mut self, kind: LinkKind) -> Option<&mut Link> {
        match kind {
            LinkKind::Nvlink => self.nvlink.as_mut(),
            LinkKind::Rdma => self.rdma.as_mut(),
            LinkKind::Tcp => self.tcp.as_mut(),
            LinkKind::Pcie => self.pcie.as_mut(),
        }
    }
}

impl Host {
    /// Time to fingerprint `bytes` of processed pixels: overhead + bytes / throughput, ns.
    #[inline]
    pub fn fingerprint_time_ns(&self, bytes: u64) -> u64 {
        let hash = to_ns(bytes as f64 * 1e9 / self.fingerprint_bytes_per_s);
        self.fingerprint_overhead_ns.saturating_add(hash)
    }
}

impl HardwareProfile {
    /// This profile with every compute step (encoder batch, prefill chunk, decode
    /// iteration) `s` times as long: peak FLOP/s and memory bandwidth divided by `s`, the
    /// per-step overheads multiplied by it (rounded to the nanosecond). Links, the host's
    /// fingerprinting and the cores are unchanged. A sensitivity probe: how much a
    /// systematic step-time error of `s - 1` moves a simulation on its own.
    pub fn with_steps_scaled(&self, s: f64) -> Self {
        let o = &self.overheads;
        let ns = |v: u64| (v as f64 * s).round() as u64;
        Self {
            name: format!("{}-steps-x{s}", self.name),
            description: format!(
                "{} with every compute step {s} times as long",
                self.description
            ),
            peak_bf16_flops_per_s: self.peak_bf16_flops_per_s / s,
            hbm_bytes_per_s: self.hbm_bytes_per_s / s,
            overheads: Overheads {
                encoder_batch_ns: ns(o.encoder_batch_ns),
                prefill_chunk_ns: ns(o.prefill_chunk_ns),
                decode_iter_ns: ns(o.decode_iter_ns),
            },
            ..self.clone()
        }
    }

    /// Names of the built-in profiles.
    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(name, _, _)| *name)
    }

    /// A built-in profile by name (case-insensitive: `h200`, `H200`).
    pub fn by_name(name: &str) -> Result<Self, ModelError> {
        catalog::by_name(
            &BUILTIN,
            "data/hardware",
            "hardware profile",
            name,
            Self::from_toml_str,
        )
    }

    /// A built-in profile by name, or a profile file (a path, or a name ending in
    /// `.toml`): what `--hardware` and the simulator's `hardware` field accept, so a
    /// profile fitted by `moonagent validate profile` is used like a built-in one.
    pub fn resolve(name_or_path: &str) -> Result<Self, ModelError> {
        catalog::resolve(name_or_path, Self::by_name, Self::from_toml_str)
    }

    /// Every built-in profile, in the order of [`HardwareProfile::builtin_names`].
    pub fn builtins() -> Result<Vec<Self>, ModelError> {
        Self::builtin_names().map(Self::by_name).collect()
    }

    /// Load and validate a profile from a TOML file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        catalog::from_path(path.as_ref(), Self::from_toml_str)
    }

    /// Parse and validate a profile from TOML text; `origin` names the text in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ModelError> {
        let profile: HardwareProfile = catalog::parse_toml(text, origin)?;
        profile.validate_as(origin)?;
        Ok(profile)
    }

    /// The profile as TOML that [`HardwareProfile::from_toml_str`] reads back unchanged.
    pub fn to_toml_string(&self) -> Result<String, ModelError> {
        toml::to_string(self).map_err(|e| ModelError::Write(e.to_string()))
    }

    /// Check every value; the error names the first impossible field.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.validate_as(&format!("hardware profile `{}`", self.name))
    }

    fn validate_as(&self, origin: &str) -> Result<(), ModelError> {
        self.check().map_err(|e| e.at(origin))
    }

    fn check(&self) -> Result<(), FieldError> {
        if self.name.trim().is_empty() {
            return Err(FieldError::new("name", "expected a non-empty name"));
        }
        check_positive("peak_bf16_flops_per_s", self.peak_bf16_flops_per_s)?;
        check_positive("hbm_bytes_per_s", self.hbm_bytes_per_s)?;
        check_nonzero("hbm_capacity_bytes", self.hbm_capacity_bytes)?;
        let e = &self.efficiency;
        check_fraction("efficiency.encoder_mfu", e.encoder_mfu)?;
        check_fraction("efficiency.prefill_mfu", e.prefill_mfu)?;
        check_fraction("efficiency.decode_mfu", e.decode_mfu)?;
        check_fraction("efficiency.hbm_efficiency", e.hbm_efficiency)?;
        for kind in LinkKind::ALL {
            if let Some(link) = self.links.get(kind) {
                link.check(&format!("links.{}", kind.as_str()))?;
            }
        }
        check_positive(
            "host.fingerprint_bytes_per_s",
            self.host.fingerprint_bytes_per_s,
        )?;
        if let Some(c) = self.shared_cores {
            check_positive("shared_cores", c)?;
        }
        if let Some(w) = self.core_weights {
            if self.shared_cores.is_none() {
                return Err(FieldError::new(
                    "core_weights",
                    "expected together with shared_cores (they divide the shared cores)",
                ));
            }
            check_positive("core_weights.encode", w.encode)?;
            check_positive("core_weights.prefill", w.prefill)?;
            check_positive("core_weights.decode", w.decode)?;
        }
        if let Some(k) = self.step_scale {
            check_positive("step_scale.encode", k.encode)?;
            check_positive("step_scale.prefill", k.prefill)?;
            check_positive("step_scale.decode", k.decode)?;
        }
        if let Some(k) = self.oversubscribed {
            if self.shared_cores.is_none() {
                return Err(FieldError::new(
                    "oversubscribed",
                    "expected together with shared_cores (it slows steps sharing them)",
                ));
            }
            check_positive("oversubscribed.encode", k.encode)?;
            check_positive("oversubscribed.prefill", k.prefill)?;
            check_positive("oversubscribed.decode", k.decode)?;
        }
        if let Some(c) = self.decode_contention {
            if self.shared_cores.is_none() {
                return Err(FieldError::new(
                    "decode_contention",
                    "expected together with shared_cores (it slows steps sharing them)",
                ));
            }
            for (field, v) in [
                ("decode_contention.kv", c.kv),
                ("decode_contention.encoder", c.encoder),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(FieldError::new(
                        field,
                        format!("expected a finite number >= 0, got {v}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The link of this kind, or an error naming the missing `links.<kind>` table.
    pub fn link(&self, kind: LinkKind) -> Result<&Link, ModelError> {
        self.links.get(kind).ok_or_else(|| {
            ModelError::invalid(
                format!("hardware profile `{}`", self.name),
                format!("links.{}", kind.as_str()),
                "this profile has no such link",
            )
        })
    }
}

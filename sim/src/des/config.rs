//! Simulator configuration: one serde struct, TOML-overridable field by field.

use moonagent_core::store::{MemStoreConfig, PolicyConfig, SEC};
use serde::{Deserialize, Serialize};

use super::SimError;

pub use moonagent_core::serve::Mode;

/// Service-level objective for goodput.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Slo {
    /// Time to first token, ms.
    pub ttft_ms: f64,
    /// Time per output token, ms.
    pub tpot_ms: f64,
}

impl Default for Slo {
    fn default() -> Self {
        Self {
            ttft_ms: 2_000.0,
            tpot_ms: 100.0,
        }
    }
}

/// Everything a simulation run depends on (with the trace and the seed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConfig {
    /// Ladder mode.
    pub mode: Mode,
    /// Hardware profile: a built-in name (`h200`, `b200`, `h100`, `cpu`) or a profile
    /// file (a path, or a name ending in `.toml`), e.g. one `moonagent validate profile` fitted.
    pub hardware: String,
    /// Model spec: a built-in name (`qwen2.5-vl-7b`, ...) or a spec file.
    pub model: String,
    /// Tensor-parallel degree of every instance.
    pub tp: u32,
    /// GPUs in the cluster (B0: one colocated instance per `tp` GPUs).
    pub gpus: u32,
    /// Encoder instances in EPD modes.
    pub encoders: u32,
    /// Prefill instances in EPD modes.
    pub prefills: u32,
    /// Decode instances in EPD modes (`encoders + prefills + decodes` GPUs x tp <= gpus).
    pub decodes: u32,
    /// Link between roles and the store: `nvlink`, `rdma`, `tcp`, `pcie`.
    pub link: String,
    /// Largest encoder batch, in visual tokens.
    pub encoder_max_batch_tokens: u32,
    /// Prefill chunk budget, in new tokens per iteration (chunked prefill).
    pub prefill_chunk_tokens: u32,
    /// Largest decode batch, in sequences.
    pub decode_max_batch: u32,
    /// KV page size, tokens.
    pub kv_block_tokens: u32,
    /// Share of HBM left for KV after weights.
    pub kv_mem_fraction: f64,
    /// Use the store for prefix KV blocks when the trace carries prefix block ids.
    pub kv_prefix_store: bool,
    /// The shared store (capacity, watermarks, leases) for encoder outputs and prefix KV.
    pub store: MemStoreConfig,
    /// Its eviction policy.
    pub policy: PolicyConfig,
    /// SLO for goodput.
    pub slo: Slo,
    /// Stop at this virtual time (ns); 0 = run until every request finishes.
    pub horizon_ns: u64,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Full,
            hardware: "h200".into(),
            model: "qwen2.5-vl-7b".into(),
            tp: 1,
            gpus: 8,
            encoders: 2,
            prefills: 3,
            decodes: 3,
            link: "rdma".into(),
            encoder_max_batch_tokens: 16_384,
            prefill_chunk_tokens: 8_192,
            decode_max_batch: 256,
            kv_block_tokens: 16,
            kv_mem_fraction: 0.9,
            kv_prefix_store: true,
            store: MemStoreConfig {
                capacity_bytes: 256 << 30,
                kv_lease_ttl_ns: 10 * SEC,
                ..MemStoreConfig::default()
            },
            policy: PolicyConfig::default(),
            slo: Slo::default(),
            horizon_ns: 0,
        }
    }
}

impl SimConfig {
    /// Check the fields that models and stores do not check themselves.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |field: &'static str, what: String| Err(SimError::Config { field, what });
        let nonzero = [
            ("tp", self.tp),
            ("gpus", self.gpus),
            ("encoder_max_batch_tokens", self.encoder_max_batch_tokens),
            ("prefill_chunk_tokens", self.prefill_chunk_tokens),
            ("decode_max_batch", self.decode_max_batch),
            ("kv_block_tokens", self.kv_block_tokens),
        ];
        for (name, v) in nonzero {
            if v == 0 {
                return bad(name, "expected > 0".into());
            }
        }
        if self.mode.disaggregated() {
            for (name, v) in [
                ("encoders", self.encoders),
                ("prefills", self.prefills),
                ("decodes", self.decodes),
            ] {
                if v == 0 {
                    return bad(
                        name,
                        format!("expected > 0 in EPD mode {}", self.mode.name()),
                    );
                }
            }
            let used = (self.encoders + self.prefills + self.decodes) * self.tp;
            if used > self.gpus {
                return bad(
                    "encoders + prefills + decodes",
                    format!("{used} GPUs at tp {} exceed gpus = {}", self.tp, self.gpus),
                );
            }
        } else if self.gpus < self.tp {
            return bad(
                "gpus",
                format!("{} is fewer than tp = {}", self.gpus, self.tp),
            );
        }
        if !(self.kv_mem_fraction > 0.0 && self.kv_mem_fraction <= 1.0) {
            return bad(
                "kv_mem_fraction",
                format!("expected in (0, 1], got {}", self.kv_mem_fraction),
            );
        }
        if !(self.slo.ttft_ms > 0.0 && self.slo.tpot_ms > 0.0) {
            return bad("slo", "ttft_ms and tpot_ms must be > 0".into());
        }
        self.store.validate().map_err(SimError::Store)?;
        self.policy.build().map_err(SimError::Policy)?;
        Ok(())
    }
}

//! Miss penalties and object sizes: what a missed object costs to recompute ([`MissCost`]:
//! the roofline [`ModelCost`] or fixed [`LinearCost`] constants) and how many bytes it takes.

use moonagent_models::{CostModel, HardwareProfile, ModelError, ModelSpec};
use serde::{Deserialize, Serialize};

use super::ReplayError;

fn model_err(what: &'static str) -> impl Fn(ModelError) -> ReplayError {
    move |source| ReplayError::Model { what, source }
}

/// Recompute cost of a missed object, in ns.
pub trait MissCost: Sync {
    /// Encoder time for one image of `visual_tokens` tokens.
    fn image_ns(&self, visual_tokens: u32) -> u64;
    /// Prefill time for one KV block of `tokens` tokens after `prefix_tokens` cached tokens.
    fn kv_block_ns(&self, tokens: u32, prefix_tokens: u64) -> u64;
}

/// Miss penalties from `moonagent-models`' roofline cost model (the single source of
/// truth the simulator uses too): an image costs one encoder call on it alone; a KV block
/// of `t` tokens starting at token `p` costs `T(p + t) - T(p)`, `T(n)` being the prefill
/// time of `n` tokens with nothing cached (so a prompt's blocks add up to `T(prompt)`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelCost {
    model: CostModel,
}

impl ModelCost {
    /// Built-in hardware profile and model by name (`h200`, `qwen2.5-vl-7b`), tensor-parallel `tp`.
    pub fn new(hardware: &str, model: &str, tp: u32) -> Result<Self, ReplayError> {
        let hw = HardwareProfile::by_name(hardware).map_err(model_err("hardware"))?;
        let spec = ModelSpec::by_name(model).map_err(model_err("model"))?;
        let model = CostModel::new(&hw, &spec, tp).map_err(model_err("cost model"))?;
        Ok(Self { model })
    }

    /// Qwen2.5-VL-7B on one H200, the default of every replay.
    pub fn qwen25_vl_7b_h200() -> Self {
        // Built-in data, checked by this crate's tests: failing here is a build defect.
        Self::new("h200", "qwen2.5-vl-7b", 1).expect("built-in h200 / qwen2.5-vl-7b cost model")
    }

    /// Wrap an existing cost model.
    pub fn from_model(model: CostModel) -> Self {
        Self { model }
    }

    fn prefill_from_scratch(&self, tokens: u64) -> u64 {
        self.model
            .prefill_time_ns(u32::try_from(tokens).unwrap_or(u32::MAX), 0)
    }
}

impl MissCost for ModelCost {
    fn image_ns(&self, visual_tokens: u32) -> u64 {
        self.model.encoder_time_ns(&[visual_tokens])
    }
    fn kv_block_ns(&self, tokens: u32, prefix_tokens: u64) -> u64 {
        let end = prefix_tokens.saturating_add(u64::from(tokens));
        self.prefill_from_scratch(end)
            .saturating_sub(self.prefill_from_scratch(prefix_tokens))
    }
}

/// A linear recompute-cost model: `a + b * tokens (+ c * tokens * prefix)` per object, for
/// configs that want fixed constants. `Default` is a fit of [`ModelCost`]'s Qwen2.5-VL-7B
/// on one H200 (see [`LinearCost::fit`]), so both give about the same penalties.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinearCost {
    /// Fixed cost per image (ns).
    pub image_fixed_ns: f64,
    /// Encoder cost per visual token (ns).
    pub image_ns_per_token: f64,
    /// Prefill cost per token (ns), the linear layers.
    pub kv_ns_per_token: f64,
    /// Prefill attention cost per token per cached prefix token (ns).
    pub kv_ns_per_token_prefix: f64,
}

impl Default for LinearCost {
    fn default() -> Self {
        Self::fit(&ModelCost::qwen25_vl_7b_h200())
    }
}

impl LinearCost {
    /// Fit the constants to a cost model: the encoder line through 256 and 2,304 visual
    /// tokens; prefill `T(n) ~ c + a n + b n^2 / 2` through 1k, 4k and 16k tokens, whose
    /// marginal cost of `t` tokens after `p` is `a t + b t p` (plus `b t^2 / 2`, dropped).
    pub fn fit(m: &dyn MissCost) -> Self {
        let (v0, v1) = (256u32, 2304u32);
        let (e0, e1) = (m.image_ns(v0) as f64, m.image_ns(v1) as f64);
        let slope = (e1 - e0) / f64::from(v1 - v0);
        let t = |n: u64| m.kv_block_ns(n as u32, 0) as f64;
        let (n1, n2, n3) = (1024.0, 4096.0, 16384.0);
        let (t1, t2, t3) = (t(1024), t(4096), t(16384));
        // Second differences give b; then a from the first.
        let s12 = (t2 - t1) / (n2 - n1);
        let s23 = (t3 - t2) / (n3 - n2);
        let b = (2.0 * (s23 - s12) / (n3 - n1)).max(0.0);
        let a = (s12 - b * (n1 + n2) / 2.0).max(0.0);
        Self {
            image_fixed_ns: (e0 - slope * f64::from(v0)).max(0.0),
            image_ns_per_token: slope.max(0.0),
            kv_ns_per_token: a,
            kv_ns_per_token_prefix: b,
        }
    }
}

impl MissCost for LinearCost {
    fn image_ns(&self, visual_tokens: u32) -> u64 {
        (self.image_fixed_ns + self.image_ns_per_token * f64::from(visual_tokens)).ceil() as u64
    }
    fn kv_block_ns(&self, tokens: u32, prefix_tokens: u64) -> u64 {
        let t = f64::from(tokens);
        (self.kv_ns_per_token * t + self.kv_ns_per_token_prefix * t * prefix_tokens as f64).ceil()
            as u64
    }
}

/// Sizes of the objects the replay stores: the traces crate's, so replay and trace
/// statistics count bytes the same way.
pub use moonagent_traces::stats::ObjectSizes;

/// The object sizes of a built-in model (`qwen2.5-vl-7b`, ...).
pub fn sizes_for_model(model: &str) -> Result<ObjectSizes, ReplayError> {
    let spec = ModelSpec::by_name(model).map_err(model_err("model"))?;
    Ok(ObjectSizes {
        kv_bytes_per_token: spec.kv_bytes_per_token(),
        encoder_bytes_per_visual_token: spec.encoder_output_bytes_per_token(),
    })
}

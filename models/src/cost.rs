//! Cost functions: how long a piece of GPU, link or CPU work takes, in integer ns.
//!
//! Each GPU cost is a roofline: `max(flops / (peak * mfu), bytes / (bandwidth * eff))`
//! (or their sum, for a step kind whose `roofline` is `sum`: compute and memory traffic
//! that do not overlap), plus the tensor-parallel all-reduce time when `tp > 1`, plus a fixed
//! overhead per call.
//! FLOPs and bytes come from the model spec ([`Work`] shows them); peaks from the hardware
//! profile; `mfu`, `eff` and overheads are the calibratable factors. A [`CostModel`] folds
//! a profile, a spec and a tensor-parallel degree into a small `Copy` value once, so each
//! call is a few dozen float operations and no allocation. Results round up (`ceil`) to
//! whole nanoseconds, with only `+ - * /` in between, so they are the same on every
//! machine; empty work (no tokens, no batch) costs 0 ns.
//!
//! What is approximated, and how:
//! - Linear layers cost `2 * params` FLOPs per token (biases and norms included).
//! - Attention costs `4 * heads * head_dim` FLOPs per (query, key) pair per layer:
//!   `2*d` for `QK^T` and `2*d` for `AV`; causal prefill counts `new * cached +
//!   new * (new + 1) / 2` pairs, decode `context + 1` per sequence.
//! - The ViT's window attention: each patch attends to `min(patches of its image,
//!   (window_size / patch_size)^2)` patches (64 for Qwen2.5-VL); edge windows are smaller
//!   in reality, so this slightly overestimates. Full-attention blocks attend to every
//!   patch of the same image. Each entry of the batch is one image (or video frame).
//! - Memory traffic is weights once per call plus KV read (cached prefix or context) and
//!   written (new tokens); activations are ignored (the GEMMs are compute-bound).
//! - Prefill computes logits for the last token of each sequence only; decode for every
//!   sequence of the batch.
//! - Tensor parallelism divides FLOPs and bytes over `tp` devices and adds, per layer, two
//!   ring all-reduces over NVLink: `latency + 2 (tp-1)/tp * tokens * hidden * dtype / bw`.

use crate::error::{FieldError, ModelError};
use crate::hardware::{Flow, HardwareProfile, Host, Link, Roofline, Rooflines};
use crate::model::ModelSpec;
use crate::to_ns;

/// The work of one call, before the hardware turns it into time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Work {
    /// Floating-point operations, summed over the tensor-parallel group.
    pub flops: f64,
    /// Bytes read or written in device memory, summed over the group.
    pub hbm_bytes: f64,
    /// Tensor-parallel all-reduce time, ns (0 when `tp == 1`).
    pub comm_ns: f64,
}

/// A hardware profile, a model spec and a tensor-parallel degree, folded into the
/// constants every cost call needs. Cheap to copy; build once per instance type.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    tp: u32,
    // Peak rates of the whole tensor-parallel group, as ns per unit.
    ns_per_flop_at_peak: f64,
    ns_per_byte_at_peak: f64,
    encoder_mfu: f64,
    prefill_mfu: f64,
    decode_mfu: f64,
    hbm_efficiency: f64,
    rooflines: Rooflines,
    encoder_overhead_ns: u64,
    prefill_overhead_ns: u64,
    decode_overhead_ns: u64,
    // `[encode, prefill, decode]` step-time factors (`HardwareProfile::step_scale`).
    step_scale: [f64; 3],
    // Ring all-reduce: per call latency, and ns per byte of the reduced tensor.
    allreduce_latency_ns: f64,
    allreduce_ns_per_byte: f64,
    // Vision encoder.
    vit_flops_per_patch: f64,
    vit_merger_flops_per_token: f64,
    vit_attn_flops_per_pair: f64,
    vit_window_blocks: f64,
    vit_full_blocks: f64,
    vit_window_patches: f64,
    vit_patches_per_token: f64,
    vit_weight_bytes: f64,
    vit_allreduces: f64,
    vit_activation_bytes_per_patch: f64,
    // Language model.
    llm_flops_per_token: f64,
    lm_head_flops_per_logit: f64,
    llm_attn_flops_per_pair: f64,
    llm_weight_bytes: f64,
    llm_allreduces: f64,
    llm_activation_bytes_per_token: f64,
    kv_bytes_per_token: f64,
    // Memory.
    hbm_capacity_bytes: f64,
    llm_resident_bytes: f64,
}

impl CostModel {
    /// Fold `hw` and `model` for a group of `tp` devices. Checks both inputs, and that
    /// `tp >= 1` divides the attention heads of the LLM and of the ViT; `tp > 1` needs
    /// `links.nvlink` for its all-reduces.
    pub fn new(hw: &HardwareProfile, model: &ModelSpec, tp: u32) -> Result<Self, ModelError> {
        hw.validate()?;
        model.validate()?;
        let origin = format!("cost model {} on {} with tp {tp}", model.name, hw.name);
        check_tp(hw, model, tp).map_err(|e| e.at(&origin))?;
        Ok(Self::unchecked(hw, model, tp))
    }

    /// Fold without checking (the free functions use this with `tp = 1`).
    pub(crate) fn unchecked(hw: &HardwareProfile, model: &ModelSpec, tp: u32) -> Self {
        let tp = tp.max(1);
        let tpf = f64::from(tp);
        let dtype = model.dtype_bytes() as f64;
        let v = &model.vision;
        let l = &model.llm;
        let (allreduce_latency_ns, allreduce_ns_per_byte) = match (&hw.links.nvlink, tp) {
            (Some(link), 2..) => (
                link.latency_ns as f64,
                2.0 * (tpf - 1.0) / tpf * 1e9 / link.bytes_per_s(Flow::Put),
            ),
            _ => (0.0, 0.0),
        };
        let full_blocks = v.fullatt_block_indexes.len() as f64;
        let llm_heads_dim = f64::from(l.num_attention_heads) * model.head_dim() as f64;
        CostModel {
            tp,
            ns_per_flop_at_peak: 1e9 / (hw.peak_bf16_flops_per_s * tpf),
            ns_per_byte_at_peak: 1e9 / (hw.hbm_bytes_per_s * tpf),
            encoder_mfu: hw.efficiency.encoder_mfu,
            prefill_mfu: hw.efficiency.prefill_mfu,
            decode_mfu: hw.efficiency.decode_mfu,
            hbm_efficiency: hw.efficiency.hbm_efficiency,
            rooflines: hw.roofline,
            encoder_overhead_ns: hw.overheads.encoder_batch_ns,
            prefill_overhead_ns: hw.overheads.prefill_chunk_ns,
            decode_overhead_ns: hw.overheads.decode_iter_ns,
            step_scale: hw.step_scale.map_or([1.0; 3], |k| k.as_array()),
            allreduce_latency_ns,
            allreduce_ns_per_byte,
            vit_flops_per_patch: 2.0
                * (model.vision_patch_embed_params()
                    + u64::from(v.depth) * model.vision_block_params()) as f64,
            vit_merger_flops_per_token: 2.0 * model.vision_merger_params() as f64,
            vit_attn_flops_per_pair: 4.0 * f64::from(v.hidden_size),
            vit_window_blocks: f64::from(v.depth) - full_blocks,
            vit_full_blocks: full_blocks,
            vit_window_patches: model.vision_window_patches() as f64,
            vit_patches_per_token: model.patches_per_visual_token() as f64,
            vit_weight_bytes: model.vision_weight_bytes() as f64,
            vit_allreduces: 2.0 * f64::from(v.depth),
            vit_activation_bytes_per_patch: f64::from(v.hidden_size) * dtype,
            llm_flops_per_token: 2.0
                * (u64::from(l.num_hidden_layers) * model.llm_layer_params()) as f64,
            lm_head_flops_per_logit: 2.0 * model.lm_head_params() as f64,
            llm_attn_flops_per_pair: 4.0 * f64::from(l.num_hidden_layers) * llm_heads_dim,
            llm_weight_bytes: model.llm_streamed_weight_bytes() as f64,
            llm_allreduces: 2.0 * f64::from(l.num_hidden_layers),
            llm_activation_bytes_per_token: f64::from(l.hidden_size) * dtype,
            kv_bytes_per_token: model.kv_bytes_per_token() as f64,
            hbm_capacity_bytes: hw.hbm_capacity_bytes as f64 * tpf,
            llm_resident_bytes: model.llm_resident_bytes() as f64,
        }
    }

    /// The tensor-parallel degree.
    pub fn tp(&self) -> u32 {
        self.tp
    }

    /// FLOPs, bytes and all-reduce time of encoding a batch of images, one entry of
    /// `visual_tokens` per image (tokens after the spatial merge).
    pub fn encoder_work(&self, visual_tokens: &[u32]) -> Work {
        let mut flops = 0.0;
        let mut patches = 0.0;
        for &tokens in visual_tokens {
            let t = f64::from(tokens);
            let p = t * self.vit_patches_per_token;
            let window = if p < self.vit_window_patches {
                p
            } else {
                self.vit_window_patches
            };
            let pairs = p * (self.vit_window_blocks * window + self.vit_full_blocks * p);
            flops += p * self.vit_flops_per_patch
                + t * self.vit_merger_flops_per_token
                + pairs * self.vit_attn_flops_per_pair;
            patches += p;
        }
        if patches == 0.0 {
            return Work::default();
        }
        Work {
            flops,
            hbm_bytes: self.vit_weight_bytes,
            comm_ns: self.allreduce_ns(
                self.vit_allreduces,
                patches * self.vit_activation_bytes_per_patch,
            ),
        }
    }

    /// Time to encode a batch of images, one entry per image (visual tokens), ns.
    #[inline]
    pub fn encoder_time_ns(&self, visual_tokens: &[u32]) -> u64 {
        let w = self.encoder_work(visual_tokens);
        self.time_ns(
            &w,
            self.encoder_mfu,
            self.encoder_overhead_ns,
            self.rooflines.encoder,
            self.step_scale[0],
        )
    }

    /// FLOPs, bytes and all-reduce time of a prefill chunk of `new_tokens` after
    /// `cached_tokens` already in the KV cache (one sequence).
    pub fn prefill_work(&self, new_tokens: u32, cached_tokens: u32) -> Work {
        self.prefill_batch_work(&[(new_tokens, cached_tokens)])
    }

    /// FLOPs, bytes and all-reduce time of one forward pass over several prefill chunks,
    /// each `(new_tokens, cached_tokens)`: weights are read once for all of them.
    pub fn prefill_batch_work(&self, chunks: &[(u32, u32)]) -> Work {
        let mut flops = 0.0;
        let mut kv_tokens = 0.0;
        let mut new_total = 0.0;
        for &(new, cached) in chunks {
            if new == 0 {
                continue;
            }
            let n = f64::from(new);
            let c = f64::from(cached);
            let pairs = n * c + n * (n + 1.0) / 2.0;
            flops += n * self.llm_flops_per_token
                + self.lm_head_flops_per_logit
                + pairs * self.llm_attn_flops_per_pair;
            kv_tokens += c + n;
            new_total += n;
        }
        if new_total == 0.0 {
            return Work::default();
        }
        Work {
            flops,
            hbm_bytes: self.llm_weight_bytes + kv_tokens * self.kv_bytes_per_token,
            comm_ns: self.allreduce_ns(
                self.llm_allreduces,
                new_total * self.llm_activation_bytes_per_token,
            ),
        }
    }

    /// Time to prefill `new_tokens` after a cached prefix of `cached_tokens`, ns.
    #[inline]
    pub fn prefill_time_ns(&self, new_tokens: u32, cached_tokens: u32) -> u64 {
        let w = self.prefill_work(new_tokens, cached_tokens);
        self.time_ns(
            &w,
            self.prefill_mfu,
            self.prefill_overhead_ns,
            self.rooflines.prefill,
            self.step_scale[1],
        )
    }

    /// Time of one forward pass over several `(new_tokens, cached_tokens)` chunks, ns.
    #[inline]
    pub fn prefill_batch_time_ns(&self, chunks: &[(u32, u32)]) -> u64 {
        let w = self.prefill_batch_work(chunks);
        self.time_ns(
            &w,
            self.prefill_mfu,
            self.prefill_overhead_ns,
            self.rooflines.prefill,
            self.step_scale[1],
        )
    }

    /// FLOPs, bytes and all-reduce time of one decode iteration: `batch` sequences whose
    /// KV caches hold `context_tokens` tokens in total (each produces one token).
    pub fn decode_work(&self, batch: u32, context_tokens: u64) -> Work {
        if batch == 0 {
            return Work::default();
        }
        let b = f64::from(batch);
        let pairs = context_tokens as f64 + b;
        Work {
            flops: b * (self.llm_flops_per_token + self.lm_head_flops_per_logit)
                + pairs * self.llm_attn_flops_per_pair,
            hbm_bytes: self.llm_weight_bytes + pairs * self.kv_bytes_per_token,
            comm_ns: self
                .allreduce_ns(self.llm_allreduces, b * self.llm_activation_bytes_per_token),
        }
    }

    /// The KV share of the bytes a decode iteration of `batch` sequences with
    /// `context_tokens` in total reads: KV bytes over weights plus KV (0 for an empty
    /// batch). What [`crate::DecodeContention::kv`] scales.
    pub fn decode_kv_share(&self, batch: u32, context_tokens: u64) -> f64 {
        if batch == 0 {
            return 0.0;
        }
        let kv = (context_tokens as f64 + f64::from(batch)) * self.kv_bytes_per_token;
        let all = self.llm_weight_bytes + kv;
        if all > 0.0 {
            kv / all
        } else {
            0.0
        }
    }

    /// Time of one decode iteration for `batch` sequences with `context_tokens` in total, ns.
    #[inline]
    pub fn decode_iter_time_ns(&self, batch: u32, context_tokens: u64) -> u64 {
        let w = self.decode_work(batch, context_tokens);
        self.time_ns(
            &w,
            self.decode_mfu,
            self.decode_overhead_ns,
            self.rooflines.decode,
            self.step_scale[2],
        )
    }

    /// KV-cache capacity in tokens when `mem_fraction` of the group's memory is usable and
    /// the LLM's weights are resident (0 if they do not fit).
    pub fn kv_capacity_tokens(&self, mem_fraction: f64) -> u64 {
        let free = self.hbm_capacity_bytes * mem_fraction - self.llm_resident_bytes;
        if free > 0.0 && self.kv_bytes_per_token > 0.0 {
            (free / self.kv_bytes_per_token) as u64
        } else {
            0
        }
    }

    /// Compute-side time at 100% MFU, ns (the calibration's compute regressor).
    pub(crate) fn compute_ns_at_peak(&self, w: &Work) -> f64 {
        w.flops * self.ns_per_flop_at_peak
    }

    /// Memory-side time at 100% bandwidth, ns (the calibration's memory regressor).
    pub(crate) fn memory_ns_at_peak(&self, w: &Work) -> f64 {
        w.hbm_bytes * self.ns_per_byte_at_peak
    }

    #[inline]
    fn allreduce_ns(&self, count: f64, bytes_each: f64) -> f64 {
        if self.tp <= 1 {
            return 0.0;
        }
        count * (self.allreduce_latency_ns + bytes_each * self.allreduce_ns_per_byte)
    }

    #[inline]
    fn time_ns(&self, w: &Work, mfu: f64, overhead_ns: u64, form: Roofline, scale: f64) -> u64 {
        if w.flops == 0.0 && w.hbm_bytes == 0.0 {
            return 0;
        }
        let compute = self.compute_ns_at_peak(w) / mfu;
        let memory = self.memory_ns_at_peak(w) / self.hbm_efficiency;
        let roof = form.combine(compute, memory);
        if scale == 1.0 {
            // Exactly today's integer sum when unscaled (no rounding moves).
            to_ns(roof + w.comm_ns).saturating_add(overhead_ns)
        } else {
            to_ns((roof + w.comm_ns + overhead_ns as f64) * scale)
        }
    }
}

fn check_tp(hw: &HardwareProfile, model: &ModelSpec, tp: u32) -> Result<(), FieldError> {
    if tp == 0 {
        return Err(FieldError::new(
            "tp",
            "expected a tensor-parallel degree >= 1, found 0",
        ));
    }
    let heads = model.llm.num_attention_heads;
    if heads % tp != 0 {
        return Err(FieldError::new(
            "tp",
            format!("expected a divisor of llm.num_attention_heads ({heads}), found {tp}"),
        ));
    }
    let vheads = model.vision.num_heads;
    if vheads % tp != 0 {
        return Err(FieldError::new(
            "tp",
            format!("expected a divisor of vision.num_heads ({vheads}), found {tp}"),
        ));
    }
    if tp > 1 && hw.links.nvlink.is_none() {
        return Err(FieldError::new(
            "links.nvlink",
            format!("tp {tp} needs an NVLink link for its all-reduces; the profile has none"),
        ));
    }
    Ok(())
}

/// Time to encode a batch of images (one entry of visual tokens per image) on one device, ns.
pub fn encoder_time_ns(hw: &HardwareProfile, model: &ModelSpec, visual_tokens: &[u32]) -> u64 {
    CostModel::unchecked(hw, model, 1).encoder_time_ns(visual_tokens)
}

/// Time to prefill `new_tokens` after `cached_tokens` of cached prefix on one device, ns.
pub fn prefill_time_ns(
    hw: &HardwareProfile,
    model: &ModelSpec,
    new_tokens: u32,
    cached_tokens: u32,
) -> u64 {
    CostModel::unchecked(hw, model, 1).prefill_time_ns(new_tokens, cached_tokens)
}

/// Time of one decode iteration of `batch` sequences with `context_tokens` in total, ns.
pub fn decode_iter_time_ns(
    hw: &HardwareProfile,
    model: &ModelSpec,
    batch: u32,
    context_tokens: u64,
) -> u64 {
    CostModel::unchecked(hw, model, 1).decode_iter_time_ns(batch, context_tokens)
}

/// Time to move `bytes` of `flow` over `link`: latency + bytes / bandwidth, ns.
#[inline]
pub fn transfer_time_ns(link: &Link, flow: Flow, bytes: u64) -> u64 {
    link.transfer_time_ns(flow, bytes)
}

/// Time for the host CPU to fingerprint `bytes` of processed pixels, ns.
#[inline]
pub fn fingerprint_time_ns(host: &Host, bytes: u64) -> u64 {
    host.fingerprint_time_ns(bytes)
}

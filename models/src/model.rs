//! Model specs: the architecture numbers of a vision-language model, as data.
//!
//! Field names follow the model's Hugging Face `config.json` (`num_hidden_layers`,
//! `num_key_value_heads`, `vision_config.spatial_merge_size`, ...) so a spec can be
//! checked against the checkpoint line by line. Everything the cost model needs (parameter
//! counts, weight bytes, KV bytes per token, encoder-output bytes per visual token) is
//! derived from those numbers here, exactly, in integers; nothing is typed in twice.
//!
//! Built-in specs are embedded (`qwen2.5-vl-7b`, `qwen2.5-vl-3b`, `qwen2.5-vl-72b`, and
//! `qwen2.5-vl-tiny`, a scaled stand-in with no checkpoint for validating the simulator on
//! CPU); a user file loads through [`ModelSpec::from_path`].

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::catalog;
use crate::error::{check_nonzero, FieldError, ModelError};

/// Built-in specs: (name, file under `data/models/`, text).
const BUILTIN: [(&str, &str, &str); 4] = [
    (
        "qwen2.5-vl-7b",
        "qwen2.5-vl-7b.toml",
        include_str!("../data/models/qwen2.5-vl-7b.toml"),
    ),
    (
        "qwen2.5-vl-3b",
        "qwen2.5-vl-3b.toml",
        include_str!("../data/models/qwen2.5-vl-3b.toml"),
    ),
    (
        "qwen2.5-vl-72b",
        "qwen2.5-vl-72b.toml",
        include_str!("../data/models/qwen2.5-vl-72b.toml"),
    ),
    (
        "qwen2.5-vl-tiny",
        "qwen2.5-vl-tiny.toml",
        include_str!("../data/models/qwen2.5-vl-tiny.toml"),
    ),
];

/// Element type of weights, activations, KV cache or pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// bfloat16, 2 bytes.
    Bf16,
    /// IEEE half, 2 bytes.
    Fp16,
    /// IEEE single, 4 bytes.
    Fp32,
    /// 8-bit float (e4m3 or e5m2), 1 byte.
    Fp8,
}

impl Dtype {
    /// Bytes per element.
    pub const fn bytes(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp32 => 4,
            Dtype::Fp8 => 1,
        }
    }
}

/// A vision-language model: the language model, its vision encoder and the dtype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// Short name used by [`ModelSpec::by_name`] (`qwen2.5-vl-7b`).
    pub name: String,
    /// The Hugging Face repository the numbers were read from.
    pub hf_repo: String,
    /// Dtype of weights, activations, KV cache and encoder outputs.
    pub dtype: Dtype,
    /// The language model (`config.json` top level / `text_config`).
    pub llm: LlmSpec,
    /// The vision encoder (`config.json` `vision_config`).
    pub vision: VisionSpec,
}

/// A decoder-only transformer with grouped-query attention and a gated (SwiGLU) MLP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmSpec {
    /// Transformer layers.
    pub num_hidden_layers: u32,
    /// Model width.
    pub hidden_size: u32,
    /// Query heads.
    pub num_attention_heads: u32,
    /// Key/value heads (GQA groups).
    pub num_key_value_heads: u32,
    /// Width of one head; `hidden_size / num_attention_heads` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u32>,
    /// Width of the MLP's gate/up projections.
    pub intermediate_size: u32,
    /// Vocabulary size (rows of the embedding and of the LM head).
    pub vocab_size: u32,
    /// Whether the LM head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections carry a bias (Qwen2 does; not in `config.json`).
    pub qkv_bias: bool,
}

/// A Qwen2.5-VL style ViT: patch embedding, blocks with window and full attention, and a
/// patch merger that turns `spatial_merge_size^2` patches into one LLM token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VisionSpec {
    /// ViT blocks.
    pub depth: u32,
    /// ViT width.
    pub hidden_size: u32,
    /// ViT attention heads.
    pub num_heads: u32,
    /// Width of the ViT MLP's gate/up projections.
    pub intermediate_size: u32,
    /// Side of a square patch, pixels.
    pub patch_size: u32,
    /// Frames per temporal patch (an image is repeated to fill it).
    pub temporal_patch_size: u32,
    /// Input channels (RGB).
    pub in_channels: u32,
    /// Side of the square of patches merged into one visual token.
    pub spatial_merge_size: u32,
    /// Side of an attention window, pixels (window-attention blocks).
    pub window_size: u32,
    /// Blocks that attend over the whole image instead of a window (0-based).
    pub fullatt_block_indexes: Vec<u32>,
    /// Width of a visual token handed to the LLM; must equal `llm.hidden_size`.
    pub out_hidden_size: u32,
    /// Dtype of the processed pixel tensor that is fingerprinted and fed to the ViT.
    pub pixel_dtype: Dtype,
}

impl ModelSpec {
    /// Names of the built-in specs.
    pub fn builtin_names() -> impl Iterator<Item = &'static str> {
        BUILTIN.iter().map(|(name, _, _)| *name)
    }

    /// A built-in spec by name (case-insensitive).
    pub fn by_name(name: &str) -> Result<Self, ModelError> {
        catalog::by_name(&BUILTIN, "data/models", "model", name, Self::from_toml_str)
    }

    /// A built-in spec by name, or a spec file (a path, or a name ending in `.toml`).
    pub fn resolve(name_or_path: &str) -> Result<Self, ModelError> {
        catalog::resolve(name_or_path, Self::by_name, Self::from_toml_str)
    }

    /// Every built-in spec, in the order of [`ModelSpec::builtin_names`].
    pub fn builtins() -> Result<Vec<Self>, ModelError> {
        Self::builtin_names().map(Self::by_name).collect()
    }

    /// Load and validate a spec from a TOML file.
    pub fn from_path(path: impl AsRef<Path>) -> Result<Self, ModelError> {
        catalog::from_path(path.as_ref(), Self::from_toml_str)
    }

    /// Parse and validate a spec from TOML text; `origin` names the text in errors.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Self, ModelError> {
        let spec: ModelSpec = catalog::parse_toml(text, origin)?;
        spec.check().map_err(|e| e.at(origin))?;
        Ok(spec)
    }

    /// The spec as TOML that [`ModelSpec::from_toml_str`] reads back unchanged.
    pub fn to_toml_string(&self) -> Result<String, ModelError> {
        toml::to_string(self).map_err(|e| ModelError::Write(e.to_string()))
    }

    /// Check every value; the error names the first impossible field.
    pub fn validate(&self) -> Result<(), ModelError> {
        self.check()
            .map_err(|e| e.at(&format!("model `{}`", self.name)))
    }

    fn check(&self) -> Result<(), FieldError> {
        if self.name.trim().is_empty() {
            return Err(FieldError::new("name", "expected a non-empty name"));
        }
        let l = &self.llm;
        check_nonzero("llm.num_hidden_layers", l.num_hidden_layers.into())?;
        check_nonzero("llm.hidden_size", l.hidden_size.into())?;
        check_nonzero("llm.num_attention_heads", l.num_attention_heads.into())?;
        check_nonzero("llm.num_key_value_heads", l.num_key_value_heads.into())?;
        check_nonzero("llm.intermediate_size", l.intermediate_size.into())?;
        check_nonzero("llm.vocab_size", l.vocab_size.into())?;
        if l.num_key_value_heads > l.num_attention_heads
            || l.num_attention_heads % l.num_key_value_heads != 0
        {
            return Err(FieldError::new(
                "llm.num_key_value_heads",
                format!(
                    "expected a divisor of num_attention_heads ({}), found {}",
                    l.num_attention_heads, l.num_key_value_heads
                ),
            ));
        }
        match l.head_dim {
            Some(d) => check_nonzero("llm.head_dim", d.into())?,
            None if l.hidden_size % l.num_attention_heads != 0 => {
                return Err(FieldError::new(
                    "llm.head_dim",
                    format!(
                    "missing, and hidden_size ({}) is not a multiple of num_attention_heads ({})",
                    l.hidden_size, l.num_attention_heads
                ),
                ))
            }
            None => {}
        }
        let v = &self.vision;
        check_nonzero("vision.depth", v.depth.into())?;
        check_nonzero("vision.hidden_size", v.hidden_size.into())?;
        check_nonzero("vision.num_heads", v.num_heads.into())?;
        check_nonzero("vision.intermediate_size", v.intermediate_size.into())?;
        check_nonzero("vision.patch_size", v.patch_size.into())?;
        check_nonzero("vision.temporal_patch_size", v.temporal_patch_size.into())?;
        check_nonzero("vision.in_channels", v.in_channels.into())?;
        check_nonzero("vision.spatial_merge_size", v.spatial_merge_size.into())?;
        check_nonzero("vision.window_size", v.window_size.into())?;
        if v.hidden_size % v.num_heads != 0 {
            return Err(FieldError::new(
                "vision.num_heads",
                format!(
                    "expected a divisor of vision.hidden_size ({}), found {}",
                    v.hidden_size, v.num_heads
                ),
            ));
        }
        let unit = u64::from(v.patch_size) * u64::from(v.spatial_merge_size);
        if u64::from(v.window_size) % unit != 0 {
            return Err(FieldError::new(
                "vision.window_size",
                format!(
                    "expected a multiple of patch_size * spatial_merge_size ({unit}), found {}",
                    v.window_size
                ),
            ));
        }
        let mut prev: Option<u32> = None;
        for (i, &b) in v.fullatt_block_indexes.iter().enumerate() {
            if b >= v.depth || prev.is_some_and(|p| b <= p) {
                return Err(FieldError::new(
                    format!("vision.fullatt_block_indexes[{i}]"),
                    format!(
                        "expected strictly increasing block indexes below depth ({}), found {b}",
                        v.depth
                    ),
                ));
            }
            prev = Some(b);
        }
        if v.out_hidden_size != l.hidden_size {
            return Err(FieldError::new(
                "vision.out_hidden_size",
                format!(
                    "expected llm.hidden_size ({}), found {}",
                    l.hidden_size, v.out_hidden_size
                ),
            ));
        }
        Ok(())
    }

    /// Bytes per element of weights, activations and KV.
    pub fn dtype_bytes(&self) -> u64 {
        self.dtype.bytes()
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> u64 {
        let l = &self.llm;
        match l.head_dim {
            Some(d) => d.into(),
            None => u64::from(l.hidden_size) / u64::from(l.num_attention_heads.max(1)),
        }
    }

    /// KV-cache bytes per token: `2 (K and V) * layers * kv_heads * head_dim * dtype`.
    pub fn kv_bytes_per_token(&self) -> u64 {
        let l = &self.llm;
        2 * u64::from(l.num_hidden_layers)
            * u64::from(l.num_key_value_heads)
            * self.head_dim()
            * self.dtype_bytes()
    }

    /// Encoder-output bytes per visual token: `out_hidden_size * dtype`.
    pub fn encoder_output_bytes_per_token(&self) -> u64 {
        u64::from(self.vision.out_hidden_size) * self.dtype_bytes()
    }

    /// ViT patches per visual token: `spatial_merge_size^2`.
    pub fn patches_per_visual_token(&self) -> u64 {
        let m = u64::from(self.vision.spatial_merge_size);
        m * m
    }

    /// Visual tokens of a processed (already resized) image of `height` x `width` pixels:
    /// `(height / patch) * (width / patch) / merge^2`, integer division.
    pub fn visual_tokens(&self, height: u32, width: u32) -> u64 {
        let p = u64::from(self.vision.patch_size.max(1));
        (u64::from(height) / p) * (u64::from(width) / p) / self.patches_per_visual_token().max(1)
    }

    /// Bytes of the processed pixel tensor per visual token (what is fingerprinted):
    /// `merge^2 * in_channels * temporal_patch * patch^2 * pixel dtype`.
    pub fn pixel_bytes_per_visual_token(&self) -> u64 {
        let v = &self.vision;
        let p = u64::from(v.patch_size);
        self.patches_per_visual_token()
            * u64::from(v.in_channels)
            * u64::from(v.temporal_patch_size)
            * p
            * p
            * v.pixel_dtype.bytes()
    }

    /// Parameters of one LLM layer: q/k/v/o projections (q/k/v bias if any), gated MLP,
    /// two RMSNorms.
    pub fn llm_layer_params(&self) -> u64 {
        let l = &self.llm;
        let h = u64::from(l.hidden_size);
        let q = u64::from(l.num_attention_heads) * self.head_dim();
        let kv = u64::from(l.num_key_value_heads) * self.head_dim();
        let bias = if l.qkv_bias { q + 2 * kv } else { 0 };
        let attn = h * q + 2 * h * kv + q * h + bias;
        let mlp = 3 * h * u64::from(l.intermediate_size);
        attn + mlp + 2 * h
    }

    /// Parameters of the LM head (`vocab * hidden`), shared with the embedding when tied.
    pub fn lm_head_params(&self) -> u64 {
        u64::from(self.llm.vocab_size) * u64::from(self.llm.hidden_size)
    }

    /// All LLM parameters: embedding, layers, final norm, LM head unless tied.
    pub fn llm_params(&self) -> u64 {
        let l = &self.llm;
        let embed = self.lm_head_params();
        let head = if l.tie_word_embeddings {
            0
        } else {
            self.lm_head_params()
        };
        embed
            + u64::from(l.num_hidden_layers) * self.llm_layer_params()
            + u64::from(l.hidden_size)
            + head
    }

    /// LLM weight bytes every forward pass streams from memory: all layers, the final
    /// norm and the LM head. The embedding table is only gathered (unless it is the head).
    pub fn llm_streamed_weight_bytes(&self) -> u64 {
        let l = &self.llm;
        (u64::from(l.num_hidden_layers) * self.llm_layer_params()
            + u64::from(l.hidden_size)
            + self.lm_head_params())
            * self.dtype_bytes()
    }

    /// Bytes the LLM's weights occupy in memory.
    pub fn llm_resident_bytes(&self) -> u64 {
        self.llm_params() * self.dtype_bytes()
    }

    /// Parameters of the patch embedding (a bias-free Conv3d over one patch).
    pub fn vision_patch_embed_params(&self) -> u64 {
        let v = &self.vision;
        let p = u64::from(v.patch_size);
        u64::from(v.in_channels)
            * u64::from(v.temporal_patch_size)
            * p
            * p
            * u64::from(v.hidden_size)
    }

    /// Parameters of one ViT block: fused qkv and output projection (with bias), gated
    /// MLP (with bias), two RMSNorms.
    pub fn vision_block_params(&self) -> u64 {
        let v = &self.vision;
        let h = u64::from(v.hidden_size);
        let i = u64::from(v.intermediate_size);
        let attn = (h * 3 * h + 3 * h) + (h * h + h);
        let mlp = 2 * (h * i + i) + (i * h + h);
        attn + mlp + 2 * h
    }

    /// Parameters of the patch merger: RMSNorm, then `merge^2 * hidden` -> same -> out.
    pub fn vision_merger_params(&self) -> u64 {
        let v = &self.vision;
        let h = u64::from(v.hidden_size);
        let m = self.patches_per_visual_token() * h;
        let out = u64::from(v.out_hidden_size);
        h + (m * m + m) + (m * out + out)
    }

    /// All vision-encoder parameters.
    pub fn vision_params(&self) -> u64 {
        self.vision_patch_embed_params()
            + u64::from(self.vision.depth) * self.vision_block_params()
            + self.vision_merger_params()
    }

    /// Bytes of the vision encoder's weights (streamed once per encoder batch).
    pub fn vision_weight_bytes(&self) -> u64 {
        self.vision_params() * self.dtype_bytes()
    }

    /// Patches in one attention window: `(window_size / patch_size)^2`.
    pub fn vision_window_patches(&self) -> u64 {
        let side = u64::from(self.vision.window_size) / u64::from(self.vision.patch_size.max(1));
        side * side
    }
}

//! Importers: public traces into the schema, streaming.
//!
//! - [`mooncake`]: Mooncake FAST'25 JSONL (`timestamp` ms, `input_length`,
//!   `output_length`, `hash_ids` at 512 tokens a block), optionally with images attached
//!   by a seeded generator;
//! - [`azure`]: Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`) and
//!   Azure multimodal CSV (`TIMESTAMP,NumImages,ContextTokens,GeneratedTokens`).
//!
//! Every importer checks each record as it reads it and names file, line and field on
//! error; imported requests are numbered from 0, each its own session, tenant 0.

pub mod azure;
pub mod mooncake;

use moonagent_core::rng::Rng;
use serde::{Deserialize, Serialize};

use std::path::Path;

use crate::error::{Location, TraceError};
use crate::gen::{check_prob, check_range, default_image_sizes, uniform, ImageSource};
use crate::schema::{Image, Request, Validator};

/// An imported record as a request: number `id`, its own session, one turn, tenant 0, no
/// fork.
pub(crate) fn one_turn(
    id: u64,
    arrival_ns: u64,
    prompt_tokens: u32,
    prompt_blocks: Vec<u64>,
    images: Vec<Image>,
    output_tokens: u32,
) -> Request {
    Request {
        id,
        arrival_ns,
        session: id,
        turn: 0,
        tenant: 0,
        prompt_tokens,
        prompt_blocks,
        images,
        output_tokens,
        fork: None,
    }
}

/// Check an imported request; an error names `file`, `at` and the source's field (its
/// time column `time_column` for `arrival_ns`).
pub(crate) fn check_imported(
    validator: &mut Validator,
    req: &Request,
    file: &Path,
    at: Location,
    time_column: &str,
) -> Result<(), TraceError> {
    validator.check(req).map_err(|e| {
        let field = if e.field == "arrival_ns" {
            time_column.to_string()
        } else {
            e.field
        };
        TraceError::invalid(file, at, field, e.problem)
    })
}

/// How to attach images to records that have none (or only a count): a seeded image
/// generator in the manner of W1-W4. Visual tokens are counted *inside* the record's
/// prompt length, which stays exact; images that would not fit are dropped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttachImages {
    /// Seed of the image stream (recorded in the header).
    pub seed: u64,
    /// Chance a request gets images at all (default 1).
    pub probability: f64,
    /// Fewest images per request (default 1).
    pub images_min: u32,
    /// Most images per request (default 4).
    pub images_max: u32,
    /// Chance an image reference repeats a recent image (default 0.5).
    pub repeat_rate: f64,
    /// Distinct recent images repeats are drawn from (default 4,096).
    pub repeat_pool: u32,
    /// Image sizes `[width, height]` in pixels, drawn uniformly.
    pub image_sizes: Vec<[u32; 2]>,
}

impl Default for AttachImages {
    fn default() -> Self {
        Self {
            seed: 0,
            probability: 1.0,
            images_min: 1,
            images_max: 4,
            repeat_rate: 0.5,
            repeat_pool: 4096,
            image_sizes: default_image_sizes(),
        }
    }
}

impl AttachImages {
    /// A one-line description for the trace header's notes.
    pub fn describe(&self) -> String {
        format!(
            "images attached by a seeded generator (seed {}, p {}, {}..={} per request, repeat rate {}); visual tokens counted inside the prompt",
            self.seed, self.probability, self.images_min, self.images_max, self.repeat_rate
        )
    }
}

/// The running image attacher.
pub(crate) struct Attacher {
    cfg: AttachImages,
    rng: Rng,
    src: ImageSource,
}

impl Attacher {
    pub(crate) fn new(cfg: AttachImages) -> Result<Self, TraceError> {
        check_prob("attach.probability", cfg.probability)?;
        check_range("attach.images_min", cfg.images_min, cfg.images_max)?;
        let src = ImageSource::new(&cfg.image_sizes, cfg.repeat_rate, cfg.repeat_pool, 1)?;
        Ok(Self {
            rng: Rng::stream(cfg.seed, "import.attach"),
            src,
            cfg,
        })
    }

    /// Images for a prompt of `prompt_tokens`: `count` of them if given, else drawn from
    /// the config; drops those that would overflow the prompt.
    pub(crate) fn images(&mut self, prompt_tokens: u32, count: Option<u32>) -> Vec<Image> {
        let n = match count {
            Some(n) => n,
            None => {
                if !self.rng.chance(self.cfg.probability) {
                    return Vec::new();
                }
                uniform(&mut self.rng, self.cfg.images_min, self.cfg.images_max)
            }
        };
        let mut out: Vec<Image> = Vec::with_capacity(n.min(64) as usize);
        let mut used: u64 = 0;
        for _ in 0..n {
            let img = self.src.next(&mut self.rng, &out, |s, r| s.fresh(r));
            if used + u64::from(img.visual_tokens) <= u64::from(prompt_tokens) {
                used += u64::from(img.visual_tokens);
                out.push(img);
            }
        }
        out
    }

    /// Exactly `n` images sharing `prompt_tokens`: drawn from the config, or, when they
    /// would not fit, token-only images of `prompt_tokens / n` visual tokens each.
    pub(crate) fn exact(&mut self, prompt_tokens: u32, n: u32) -> Option<Vec<Image>> {
        let mut out: Vec<Image> = Vec::with_capacity(n.min(64) as usize);
        for _ in 0..n {
            let img = self.src.next(&mut self.rng, &out, |s, r| s.fresh(r));
            out.push(img);
        }
        let total: u64 = out.iter().map(|i| u64::from(i.visual_tokens)).sum();
        if total <= u64::from(prompt_tokens) {
            return Some(out);
        }
        let each = prompt_tokens / n.max(1);
        if each == 0 {
            return None;
        }
        Some((0..n).map(|_| self.src.fresh_tokens(each)).collect())
    }
}

/// The importers `moonagent trace import` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportKind {
    /// Mooncake FAST'25 JSONL.
    Mooncake,
    /// Azure LLM inference CSV.
    AzureLlm,
    /// Azure multimodal inference CSV.
    AzureMm,
}

impl ImportKind {
    /// The importer's name on the command line (`moonagent trace import NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Mooncake => "mooncake",
            Self::AzureLlm => "azure-llm",
            Self::AzureMm => "azure-mm",
        }
    }

    /// What a file of this kind is, in words.
    pub fn describe(self) -> &'static str {
        match self {
            Self::Mooncake => "a raw Mooncake FAST'25 trace (timestamp, input_length, output_length, hash_ids)",
            Self::AzureLlm => "a raw Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens)",
            Self::AzureMm => "a raw Azure multimodal inference CSV (TIMESTAMP,NumImages,ContextTokens,GeneratedTokens)",
        }
    }
}

impl std::str::FromStr for ImportKind {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, TraceError> {
        match s.to_ascii_lowercase().as_str() {
            "mooncake" => Ok(Self::Mooncake),
            "azure-llm" => Ok(Self::AzureLlm),
            "azure-mm" => Ok(Self::AzureMm),
            other => Err(TraceError::config(
                "importer",
                format!("unknown importer {other:?}; expected mooncake, azure-llm or azure-mm"),
            )),
        }
    }
}

/// An imported trace: its header and a stream of checked requests.
pub struct Imported {
    /// The header (importer, source, attach config).
    pub header: crate::schema::TraceHeader,
    /// The requests, in file order.
    pub requests: Box<dyn Iterator<Item = Result<crate::schema::Request, TraceError>>>,
}

impl Imported {
    /// Open `path` with importer `kind`; `attach` adds images (required semantics per kind
    /// are in [`mooncake`] and [`azure`]).
    pub fn open(
        kind: ImportKind,
        path: impl AsRef<std::path::Path>,
        attach: Option<AttachImages>,
    ) -> Result<Self, TraceError> {
        match kind {
            ImportKind::Mooncake => {
                let r = mooncake::MooncakeImport::open(path, attach)?;
                Ok(Self {
                    header: r.header().clone(),
                    requests: Box::new(r),
                })
            }
            ImportKind::AzureLlm | ImportKind::AzureMm => {
                let k = if kind == ImportKind::AzureLlm {
                    azure::AzureKind::Llm
                } else {
                    azure::AzureKind::Multimodal
                };
                let r = azure::AzureImport::open(path, k, attach)?;
                Ok(Self {
                    header: r.header().clone(),
                    requests: Box::new(r),
                })
            }
        }
    }
}

impl AttachImages {
    /// The default attach config with `seed`, then `key=value` overrides (as for generators).
    pub fn with_overrides(seed: u64, overrides: &[(String, String)]) -> Result<Self, TraceError> {
        let mut v = serde_json::to_value(AttachImages {
            seed,
            ..Default::default()
        })
        .map_err(|e| TraceError::config("attach", e.to_string()))?;
        crate::gen::apply_overrides(&mut v, overrides)?;
        crate::gen::config_from_value(v)
    }
}

//! Seeded, deterministic trace generators.
//!
//! Every generator is a pure function of (config, seed) and streams its requests as an
//! iterator, so a million-request trace never sits in memory. Configs are serde structs
//! with documented defaults (`deny_unknown_fields`, so a misspelt knob is an error);
//! [`Generated::new`] builds any of them from a kind, a JSON config and `key=value`
//! overrides, which is what `moonagent trace generate` calls.
//!
//! - [`workloads`]: W1-W4 of seed 000 (images per request, repeat rate, branches);
//! - [`sessions`]: the continuous multimodal sessions of seed 002;
//! - [`servegen`]: arrivals and lengths from ServeGen's multimodal client distributions.

pub mod dist;
pub mod servegen;
pub mod sessions;
pub mod workloads;

use std::str::FromStr;

use moonagent_core::rng::Rng;
use serde::{Deserialize, Serialize};

use crate::error::TraceError;
use crate::schema::{Image, Request, TraceHeader};

/// Default image sizes (width, height) in pixels, drawn uniformly: 256 to 2,304
/// Qwen2.5-VL visual tokens (1280x720 gives the 1,196 seen in the seed material), mean
/// about 1,018.
pub fn default_image_sizes() -> Vec<[u32; 2]> {
    vec![
        [448, 448],
        [640, 480],
        [800, 600],
        [1024, 768],
        [1280, 720],
        [1024, 1024],
        [1344, 1344],
    ]
}

/// Uniform integer in `[lo, hi]` (hi < lo gives lo).
pub(crate) fn uniform(rng: &mut Rng, lo: u32, hi: u32) -> u32 {
    rng.range_inclusive(u64::from(lo), u64::from(hi)) as u32
}

/// Hands out images: new ones with fresh content ids, or repeats drawn uniformly from a
/// bounded pool of the most recent distinct images (constant memory).
#[derive(Debug, Clone)]
pub struct ImageSource {
    sizes: Vec<Image>,
    repeat_rate: f64,
    pool: Vec<Image>,
    pool_next: usize,
    pool_cap: usize,
    next_id: u64,
}

impl ImageSource {
    /// Images of the given pixel sizes (Qwen2.5-VL grids); `repeat_rate` is the chance that
    /// a reference repeats a pooled image; ids start at `first_id`.
    pub fn new(
        sizes: &[[u32; 2]],
        repeat_rate: f64,
        pool_cap: u32,
        first_id: u64,
    ) -> Result<Self, TraceError> {
        if sizes.is_empty() {
            return Err(TraceError::config(
                "image_sizes",
                "expected at least one [width, height]",
            ));
        }
        let mut protos = Vec::with_capacity(sizes.len());
        for &[w, h] in sizes {
            let img = Image::qwen25vl(0, w, h).ok_or_else(|| {
                TraceError::config(
                    "image_sizes",
                    format!(
                        "{w}x{h} cannot be processed; expected positive sides, aspect ratio <= 200"
                    ),
                )
            })?;
            protos.push(img);
        }
        check_prob("repeat_rate", repeat_rate)?;
        Ok(Self {
            sizes: protos,
            repeat_rate,
            pool: Vec::new(),
            pool_next: 0,
            pool_cap: pool_cap.max(1) as usize,
            next_id: first_id,
        })
    }

    /// A brand-new image (fresh content id), added to the pool.
    pub fn fresh(&mut self, rng: &mut Rng) -> Image {
        let mut img = self.sizes[rng.below(self.sizes.len() as u64) as usize].clone();
        img.content_id = self.next_id;
        self.next_id += 1;
        self.remember(img.clone());
        img
    }

    /// A fresh image with only a visual-token count (no pixel size).
    pub fn fresh_tokens(&mut self, visual_tokens: u32) -> Image {
        let img = Image::tokens_only(self.next_id, visual_tokens);
        self.next_id += 1;
        self.remember(img.clone());
        img
    }

    fn remember(&mut self, img: Image) {
        if self.pool.len() < self.pool_cap {
            self.pool.push(img);
        } else {
            self.pool[self.pool_next] = img;
            self.pool_next = (self.pool_next + 1) % self.pool_cap;
        }
    }

    /// A repeat from the pool avoiding ids in `avoid`, if one can be found.
    pub fn repeat(&mut self, rng: &mut Rng, avoid: &[Image]) -> Option<Image> {
        if self.pool.is_empty() {
            return None;
        }
        for _ in 0..8 {
            let c = &self.pool[rng.below(self.pool.len() as u64) as usize];
            if !avoid.iter().any(|a| a.content_id == c.content_id) {
                return Some(c.clone());
            }
        }
        None
    }

    /// One image reference: a repeat with probability `repeat_rate` (when the pool has
    /// one), else a fresh image.
    pub fn next(
        &mut self,
        rng: &mut Rng,
        avoid: &[Image],
        fresh: impl FnOnce(&mut Self, &mut Rng) -> Image,
    ) -> Image {
        if rng.chance(self.repeat_rate) {
            if let Some(img) = self.repeat(rng, avoid) {
                return img;
            }
        }
        fresh(self, rng)
    }
}

/// Allocates prefix-block ids.
#[derive(Debug, Clone, Default)]
pub struct BlockIds {
    next: u64,
}

impl BlockIds {
    /// `n` fresh ids appended to `out`.
    pub fn extend(&mut self, out: &mut Vec<u64>, n: u64) {
        out.extend(self.next..self.next + n);
        self.next += n;
    }
}

/// The header of a generated trace: generator `name`, block size, seed and the knobs.
pub(crate) fn generated_header<C: Serialize>(
    name: &str,
    block_size_tokens: u32,
    seed: u64,
    cfg: &C,
) -> TraceHeader {
    let mut header = TraceHeader::new(name, block_size_tokens);
    header.seed = Some(seed);
    header.config = serde_json::to_value(cfg).ok();
    header
}

/// Each tenant's shared system-prompt blocks (the whole blocks of `system_prompt_tokens`),
/// fresh ids from `blocks`.
pub(crate) fn system_blocks(
    blocks: &mut BlockIds,
    tenants: u32,
    system_prompt_tokens: u32,
    block_size_tokens: u32,
) -> Vec<Vec<u64>> {
    let shared = u64::from(system_prompt_tokens / block_size_tokens);
    (0..tenants)
        .map(|_| {
            let mut v = Vec::new();
            blocks.extend(&mut v, shared);
            v
        })
        .collect()
}

pub(crate) fn check_prob(field: &str, p: f64) -> Result<(), TraceError> {
    if (0.0..=1.0).contains(&p) {
        Ok(())
    } else {
        Err(TraceError::config(
            field,
            format!("expected a probability in [0, 1], found {p}"),
        ))
    }
}

pub(crate) fn check_range(field: &str, lo: u32, hi: u32) -> Result<(), TraceError> {
    if lo <= hi {
        Ok(())
    } else {
        Err(TraceError::config(
            field,
            format!("min {lo} exceeds max {hi}"),
        ))
    }
}

pub(crate) fn check_at_least_one(field: &str, n: u32) -> Result<(), TraceError> {
    if n >= 1 {
        Ok(())
    } else {
        Err(TraceError::config(field, "expected at least 1"))
    }
}

pub(crate) fn check_positive(field: &str, x: f64) -> Result<(), TraceError> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(TraceError::config(
            field,
            format!("expected a positive number, found {x}"),
        ))
    }
}

/// The generators `moonagent trace generate` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GeneratorKind {
    /// Single-image VQA.
    W1,
    /// Multi-image.
    W2,
    /// Repeated-image stream.
    W3,
    /// Agent fork.
    W4,
    /// Continuous multimodal sessions (the type-aware eviction proposal's workload).
    Sessions,
    /// ServeGen multimodal client distributions.
    ServeGen,
}

impl FromStr for GeneratorKind {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, TraceError> {
        match s.to_ascii_lowercase().as_str() {
            "w1" => Ok(Self::W1),
            "w2" => Ok(Self::W2),
            "w3" => Ok(Self::W3),
            "w4" => Ok(Self::W4),
            "sessions" => Ok(Self::Sessions),
            "servegen" => Ok(Self::ServeGen),
            other => Err(TraceError::config(
                "generator",
                format!(
                    "unknown generator {other:?}; expected w1, w2, w3, w4, sessions or servegen"
                ),
            )),
        }
    }
}

impl GeneratorKind {
    /// The kind's name as written in headers.
    pub fn name(self) -> &'static str {
        match self {
            Self::W1 => "w1",
            Self::W2 => "w2",
            Self::W3 => "w3",
            Self::W4 => "w4",
            Self::Sessions => "sessions",
            Self::ServeGen => "servegen",
        }
    }

    /// The default configuration as JSON (every knob with its default).
    pub fn default_config(self) -> serde_json::Value {
        let v = match self {
            Self::W1 | Self::W2 | Self::W3 | Self::W4 => {
                serde_json::to_value(workloads::WorkloadConfig::preset(self))
            }
            Self::Sessions => serde_json::to_value(sessions::SessionsConfig::default()),
            Self::ServeGen => serde_json::to_value(servegen::ServeGenConfig::default()),
        };
        v.unwrap_or(serde_json::Value::Null)
    }
}

/// Apply `key=value` overrides to a JSON config. The value is parsed as JSON when it can
/// be (`0.7`, `[1,2]`, `true`), else taken as a string; dotted keys reach nested objects.
pub fn apply_overrides(
    config: &mut serde_json::Value,
    overrides: &[(String, String)],
) -> Result<(), TraceError> {
    for (key, raw) in overrides {
        let value: serde_json::Value =
            serde_json::from_str(raw).unwrap_or_else(|_| serde_json::Value::String(raw.clone()));
        let mut cur = &mut *config;
        let parts: Vec<&str> = key.split('.').collect();
        for (i, p) in parts.iter().enumerate() {
            let obj = cur.as_object_mut().ok_or_else(|| {
                TraceError::config(key.as_str(), "expected an object to set a field in")
            })?;
            if i + 1 == parts.len() {
                obj.insert((*p).to_string(), value.clone());
                break;
            }
            cur = obj
                .entry((*p).to_string())
                .or_insert_with(|| serde_json::Value::Object(Default::default()));
        }
    }
    Ok(())
}

/// Merge `patch` (e.g. a config file) over `base`, key by key.
pub fn merge_config(base: &mut serde_json::Value, patch: &serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                match b.get_mut(k) {
                    Some(bv) if bv.is_object() && v.is_object() => merge_config(bv, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, p) => *b = p.clone(),
    }
}

pub(crate) fn config_from_value<T: for<'de> Deserialize<'de>>(
    v: serde_json::Value,
) -> Result<T, TraceError> {
    let text = v.to_string();
    crate::jsonl::parse_line::<T>(text.as_bytes()).map_err(|e| {
        // The column is into JSON we built ourselves: meaningless to the user.
        let problem = match e.problem.rfind(" (column ") {
            Some(i) => format!(
                "{}{}",
                &e.problem[..i],
                &e.problem[i..].split_once(')').map(|x| x.1).unwrap_or("")
            ),
            None => e.problem,
        };
        TraceError::config(e.field, problem)
    })
}

/// A generated trace: its header and a stream of requests.
pub struct Generated {
    /// The header (generator, seed, full config).
    pub header: TraceHeader,
    /// The requests, in arrival order.
    pub requests: Box<dyn Iterator<Item = Result<Request, TraceError>>>,
}

impl Generated {
    /// Build generator `kind` from its defaults, then `config` (a JSON object of knobs),
    /// then `overrides`, with `seed`.
    pub fn new(
        kind: GeneratorKind,
        config: Option<&serde_json::Value>,
        overrides: &[(String, String)],
        seed: u64,
    ) -> Result<Self, TraceError> {
        let mut v = kind.default_config();
        if let Some(c) = config {
            merge_config(&mut v, c);
        }
        apply_overrides(&mut v, overrides)?;
        match kind {
            GeneratorKind::W1 | GeneratorKind::W2 | GeneratorKind::W3 | GeneratorKind::W4 => {
                let cfg: workloads::WorkloadConfig = config_from_value(v)?;
                let g = workloads::WorkloadGen::new(kind.name(), cfg, seed)?;
                Ok(Self {
                    header: g.header().clone(),
                    requests: Box::new(g.map(Ok)),
                })
            }
            GeneratorKind::Sessions => {
                let cfg: sessions::SessionsConfig = config_from_value(v)?;
                let g = sessions::SessionsGen::new(cfg, seed)?;
                Ok(Self {
                    header: g.header().clone(),
                    requests: Box::new(g.map(Ok)),
                })
            }
            GeneratorKind::ServeGen => {
                let cfg: servegen::ServeGenConfig = config_from_value(v)?;
                let g = servegen::ServeGenGen::new(cfg, seed)?;
                Ok(Self {
                    header: g.header().clone(),
                    requests: Box::new(g.map(Ok)),
                })
            }
        }
    }
}

//! W1-W4, the workload ladder of seed 000.
//!
//! | preset | images/request | repeat rate | branches |
//! |---|---|---|---|
//! | w1 single-image VQA | 1 | 0% | 1 |
//! | w2 multi-image | 4-8 | 0% | 1 |
//! | w3 repeated-image stream | 1-4 | 70% | 1 |
//! | w4 agent fork | 2 | 50% | 4-8 |
//!
//! Arrivals are Poisson at `rate`. Each image reference is, with probability
//! `repeat_rate`, a repeat drawn uniformly from the last `repeat_pool` distinct images
//! (never one already in the same request), else a fresh image of a size drawn from
//! `image_sizes`. The measured repeat rate (stats) is therefore `repeat_rate` less a
//! cold-start deficit of order `1/requests`. A request's prompt is its text plus its
//! images' visual tokens; its prefix blocks are fresh except the first
//! `system_prompt_tokens / block_size_tokens` blocks, shared by every request of a tenant.
//! With more than one branch the request forks after its prompt: trunk output is 0 and
//! each branch decodes `branch_output_tokens_min..=max` tokens.

use moonagent_core::rng::Rng;
use serde::{Deserialize, Serialize};

use super::dist::secs_to_ns;
use super::{
    check_at_least_one, check_positive, check_prob, check_range, default_image_sizes,
    generated_header, system_blocks, uniform, BlockIds, GeneratorKind, ImageSource,
};
use crate::error::TraceError;
use crate::schema::{blocks_for_tokens, Fork, Request, TraceHeader};

/// Knobs of W1-W4 (defaults are W3's; [`WorkloadConfig::preset`] gives each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadConfig {
    /// Requests to generate (default 10,000).
    pub requests: u64,
    /// Poisson arrival rate in requests per second (default 10).
    pub rate: f64,
    /// Fewest images per request.
    pub images_min: u32,
    /// Most images per request.
    pub images_max: u32,
    /// Chance an image reference repeats an earlier image (W3 0.7, W4 0.5, else 0).
    pub repeat_rate: f64,
    /// Distinct recent images repeats are drawn from (default 4,096).
    pub repeat_pool: u32,
    /// Fewest branches (1 = no fork).
    pub branches_min: u32,
    /// Most branches.
    pub branches_max: u32,
    /// Image sizes `[width, height]` in pixels, drawn uniformly.
    pub image_sizes: Vec<[u32; 2]>,
    /// Fewest text tokens per prompt (default 32).
    pub text_tokens_min: u32,
    /// Most text tokens per prompt (default 256).
    pub text_tokens_max: u32,
    /// Fewest output tokens of an unforked request (default 32).
    pub output_tokens_min: u32,
    /// Most output tokens of an unforked request (default 256).
    pub output_tokens_max: u32,
    /// Fewest output tokens per branch (default 64).
    pub branch_output_tokens_min: u32,
    /// Most output tokens per branch (default 256).
    pub branch_output_tokens_max: u32,
    /// System-prompt tokens shared by every request of a tenant (default 0).
    pub system_prompt_tokens: u32,
    /// Tenants, drawn uniformly per request (default 1).
    pub tenants: u32,
    /// Tokens per prefix block (default 64).
    pub block_size_tokens: u32,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self::preset(GeneratorKind::W3)
    }
}

impl WorkloadConfig {
    /// The preset of W1-W4 (any other kind gives W3's).
    pub fn preset(kind: GeneratorKind) -> Self {
        let (images_min, images_max, repeat_rate, branches_min, branches_max) = match kind {
            GeneratorKind::W1 => (1, 1, 0.0, 1, 1),
            GeneratorKind::W2 => (4, 8, 0.0, 1, 1),
            GeneratorKind::W4 => (2, 2, 0.5, 4, 8),
            _ => (1, 4, 0.7, 1, 1),
        };
        Self {
            requests: 10_000,
            rate: 10.0,
            images_min,
            images_max,
            repeat_rate,
            repeat_pool: 4096,
            branches_min,
            branches_max,
            image_sizes: default_image_sizes(),
            text_tokens_min: 32,
            text_tokens_max: 256,
            output_tokens_min: 32,
            output_tokens_max: 256,
            branch_output_tokens_min: 64,
            branch_output_tokens_max: 256,
            system_prompt_tokens: 0,
            tenants: 1,
            block_size_tokens: 64,
        }
    }

    fn check(&self) -> Result<(), TraceError> {
        check_positive("rate", self.rate)?;
        check_prob("repeat_rate", self.repeat_rate)?;
        check_range("images_min", self.images_min, self.images_max)?;
        check_range("branches_min", self.branches_min, self.branches_max)?;
        if self.branches_min == 0 {
            return Err(TraceError::config(
                "branches_min",
                "expected at least 1 branch",
            ));
        }
        check_range(
            "text_tokens_min",
            self.text_tokens_min,
            self.text_tokens_max,
        )?;
        check_range(
            "output_tokens_min",
            self.output_tokens_min,
            self.output_tokens_max,
        )?;
        check_range(
            "branch_output_tokens_min",
            self.branch_output_tokens_min,
            self.branch_output_tokens_max,
        )?;
        check_at_least_one("block_size_tokens", self.block_size_tokens)?;
        check_at_least_one("tenants", self.tenants)?;
        Ok(())
    }
}

/// The W1-W4 generator: an iterator of requests.
pub struct WorkloadGen {
    cfg: WorkloadConfig,
    header: TraceHeader,
    arrivals: Rng,
    content: Rng,
    images: ImageSource,
    blocks: BlockIds,
    system_blocks: Vec<Vec<u64>>,
    t_ns: u64,
    next_id: u64,
}

impl WorkloadGen {
    /// A generator named `name` (written to the header) from `cfg` and `seed`.
    pub fn new(name: &str, cfg: WorkloadConfig, seed: u64) -> Result<Self, TraceError> {
        cfg.check()?;
        let images = ImageSource::new(&cfg.image_sizes, cfg.repeat_rate, cfg.repeat_pool, 1)?;
        let header = generated_header(name, cfg.block_size_tokens, seed, &cfg);
        let mut blocks = BlockIds::default();
        let system_blocks = system_blocks(
            &mut blocks,
            cfg.tenants,
            cfg.system_prompt_tokens,
            cfg.block_size_tokens,
        );
        Ok(Self {
            arrivals: Rng::stream(seed, "workload.arrivals"),
            content: Rng::stream(seed, "workload.content"),
            images,
            blocks,
            system_blocks,
            t_ns: 0,
            next_id: 0,
            header,
            cfg,
        })
    }

    /// The header of the trace this generator produces.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }
}

impl Iterator for WorkloadGen {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        if self.next_id >= self.cfg.requests {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        if id > 0 {
            self.t_ns = self
                .t_ns
                .saturating_add(secs_to_ns(self.arrivals.exp(1.0 / self.cfg.rate)));
        }
        let c = &self.cfg;
        let rng = &mut self.content;
        let tenant = rng.below(u64::from(c.tenants)) as u32;
        let n_images = uniform(rng, c.images_min, c.images_max);
        let mut images = Vec::with_capacity(n_images as usize);
        for _ in 0..n_images {
            let img = self.images.next(rng, &images, |s, r| s.fresh(r));
            images.push(img);
        }
        let text = uniform(rng, c.text_tokens_min, c.text_tokens_max);
        let visual: u64 = images.iter().map(|i| u64::from(i.visual_tokens)).sum();
        let prompt = (u64::from(c.system_prompt_tokens) + u64::from(text) + visual)
            .min(u64::from(u32::MAX)) as u32;
        let branches = uniform(rng, c.branches_min, c.branches_max);
        let (output_tokens, fork) = if branches > 1 {
            let outs = (0..branches)
                .map(|_| uniform(rng, c.branch_output_tokens_min, c.branch_output_tokens_max))
                .collect();
            (
                0,
                Some(Fork {
                    branches,
                    output_tokens: outs,
                }),
            )
        } else {
            (uniform(rng, c.output_tokens_min, c.output_tokens_max), None)
        };
        let shared = &self.system_blocks[tenant as usize];
        let total = blocks_for_tokens(prompt, c.block_size_tokens);
        let mut prompt_blocks = Vec::with_capacity(total as usize);
        prompt_blocks.extend_from_slice(&shared[..shared.len().min(total as usize)]);
        let fresh = total - prompt_blocks.len() as u64;
        self.blocks.extend(&mut prompt_blocks, fresh);
        Some(Request {
            id,
            arrival_ns: self.t_ns,
            session: id,
            turn: 0,
            tenant,
            prompt_tokens: prompt,
            prompt_blocks,
            images,
            output_tokens,
            fork,
        })
    }
}

//! Continuous multimodal sessions, the store-level workload of seed 002.
//!
//! `sessions` conversations start as a Poisson process (`session_rate`). Each runs
//! `turns_min..=turns_max` turns separated by `min_turn_gap_s` plus an exponential think
//! time (mean `think_time_s`). A turn's prompt is the previous turn's whole context
//! (prompt and output) followed by the new user message: `text_tokens_min..=max` text
//! tokens and its images (turn 0: `first_turn_images_min..=max`; later turns, with
//! probability `image_turn_prob`, `later_turn_images_min..=max`), fresh images of a size
//! drawn from `image_sizes`. Prefix blocks of the previous prompt are reused (same ids),
//! so KV is reused on every turn; the last, partial block and everything after it is new.
//!
//! Encoder outputs are reused sparsely and over long intervals: with probability
//! `reref_prob` a turn re-attaches one earlier image first seen at least `reref_min_gap_s`
//! ago, from another session's recent images (a bounded pool of `pool_size`, with
//! probability `reref_cross_session`) or else from the session's own history. The request
//! lists only the images whose encoder outputs it needs (new and re-attached), never those
//! already inside the reused prefix.
//!
//! The unique-byte shares follow from these knobs: each image adds `v` visual tokens of
//! encoder output (7,168 B each) and the same `v` tokens of KV (57,344 B each), while text,
//! outputs, re-attached images and the re-written partial block per turn add KV only. So
//! the encoder share is `E / (8 K + E)` with `E` the unique visual tokens and `K` the
//! unique KV tokens; the defaults (images on the first turn and half the others, short
//! text, 64-token blocks) give about 91% KV / 9% encoder under Qwen2.5-VL-7B sizes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use moonagent_core::rng::Rng;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use super::dist::secs_to_ns;
use super::{
    check_at_least_one, check_positive, check_prob, check_range, default_image_sizes,
    generated_header, system_blocks, uniform, BlockIds, ImageSource,
};
use crate::error::TraceError;
use crate::schema::{blocks_for_tokens, Image, Request, TraceHeader};

/// Knobs of the sessions generator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Number of sessions (default 600).
    pub sessions: u64,
    /// Session starts per second, Poisson (default 0.5).
    pub session_rate: f64,
    /// Fewest turns per session (default 3).
    pub turns_min: u32,
    /// Most turns per session (default 10).
    pub turns_max: u32,
    /// Mean exponential think time between turns, seconds (default 30).
    pub think_time_s: f64,
    /// Fixed part of the gap between turns, seconds (default 2).
    pub min_turn_gap_s: f64,
    /// Fewest images on the first turn (default 1).
    pub first_turn_images_min: u32,
    /// Most images on the first turn (default 2).
    pub first_turn_images_max: u32,
    /// Chance a later turn brings new images (default 0.5).
    pub image_turn_prob: f64,
    /// Fewest images on such a turn (default 1).
    pub later_turn_images_min: u32,
    /// Most images on such a turn (default 2).
    pub later_turn_images_max: u32,
    /// Image sizes `[width, height]` in pixels, drawn uniformly.
    pub image_sizes: Vec<[u32; 2]>,
    /// Fewest user text tokens per turn (default 16).
    pub text_tokens_min: u32,
    /// Most user text tokens per turn (default 96).
    pub text_tokens_max: u32,
    /// Fewest output tokens per turn (default 16).
    pub output_tokens_min: u32,
    /// Most output tokens per turn (default 128).
    pub output_tokens_max: u32,
    /// System-prompt tokens at the start of every session of a tenant (default 128).
    pub system_prompt_tokens: u32,
    /// Chance a turn re-attaches an earlier image (default 0.08).
    pub reref_prob: f64,
    /// Only images first seen at least this long ago are re-attached, seconds (default 120).
    pub reref_min_gap_s: f64,
    /// Share of re-attachments drawn from other sessions' images (default 0.5).
    pub reref_cross_session: f64,
    /// Recent images kept for cross-session re-attachment (default 2,048).
    pub pool_size: u32,
    /// A session ends before a turn whose prompt would exceed this (default 32,768).
    pub max_context_tokens: u32,
    /// Tenants, one drawn per session (default 1).
    pub tenants: u32,
    /// Tokens per prefix block (default 64).
    pub block_size_tokens: u32,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            sessions: 600,
            session_rate: 0.5,
            turns_min: 3,
            turns_max: 10,
            think_time_s: 30.0,
            min_turn_gap_s: 2.0,
            first_turn_images_min: 1,
            first_turn_images_max: 2,
            image_turn_prob: 0.5,
            later_turn_images_min: 1,
            later_turn_images_max: 2,
            image_sizes: default_image_sizes(),
            text_tokens_min: 16,
            text_tokens_max: 96,
            output_tokens_min: 16,
            output_tokens_max: 128,
            system_prompt_tokens: 128,
            reref_prob: 0.08,
            reref_min_gap_s: 120.0,
            reref_cross_session: 0.5,
            pool_size: 2048,
            max_context_tokens: 32_768,
            tenants: 1,
            block_size_tokens: 64,
        }
    }
}

impl SessionsConfig {
    fn check(&self) -> Result<(), TraceError> {
        check_positive("session_rate", self.session_rate)?;
        check_range("turns_min", self.turns_min, self.turns_max)?;
        if self.turns_min == 0 {
            return Err(TraceError::config("turns_min", "expected at least 1 turn"));
        }
        if !(self.think_time_s >= 0.0 && self.min_turn_gap_s >= 0.0 && self.reref_min_gap_s >= 0.0)
        {
            return Err(TraceError::config(
                "think_time_s",
                "expected non-negative times",
            ));
        }
        check_range(
            "first_turn_images_min",
            self.first_turn_images_min,
            self.first_turn_images_max,
        )?;
        check_range(
            "later_turn_images_min",
            self.later_turn_images_min,
            self.later_turn_images_max,
        )?;
        check_prob("image_turn_prob", self.image_turn_prob)?;
        check_prob("reref_prob", self.reref_prob)?;
        check_prob("reref_cross_session", self.reref_cross_session)?;
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
        check_at_least_one("block_size_tokens", self.block_size_tokens)?;
        check_at_least_one("tenants", self.tenants)?;
        Ok(())
    }
}

struct Session {
    tenant: u32,
    rng: Rng,
    turns: u32,
    turn: u32,
    prev_prompt: u32,
    prev_output: u32,
    prev_blocks: Vec<u64>,
    seen: Vec<(Image, u64)>,
}

/// The sessions generator: an iterator of requests in arrival order.
pub struct SessionsGen {
    cfg: SessionsConfig,
    header: TraceHeader,
    seed: u64,
    starts: Rng,
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    active: FxHashMap<u64, Session>,
    started: u64,
    images: ImageSource,
    blocks: BlockIds,
    system_blocks: Vec<Vec<u64>>,
    pool: VecDeque<(Image, u64, u64)>,
    next_id: u64,
}

impl SessionsGen {
    /// A generator from `cfg` and `seed`.
    pub fn new(cfg: SessionsConfig, seed: u64) -> Result<Self, TraceError> {
        cfg.check()?;
        let images = ImageSource::new(&cfg.image_sizes, 0.0, 1, 1)?;
        let header = generated_header("sessions", cfg.block_size_tokens, seed, &cfg);
        let mut blocks = BlockIds::default();
        let system_blocks = system_blocks(
            &mut blocks,
            cfg.tenants,
            cfg.system_prompt_tokens,
            cfg.block_size_tokens,
        );
        let mut g = Self {
            starts: Rng::stream(seed, "sessions.starts"),
            seed,
            heap: BinaryHeap::new(),
            active: FxHashMap::default(),
            started: 0,
            images,
            blocks,
            system_blocks,
            pool: VecDeque::new(),
            next_id: 0,
            header,
            cfg,
        };
        g.start_session(0);
        Ok(g)
    }

    /// The header of the trace this generator produces.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    fn start_session(&mut self, at_ns: u64) {
        if self.started >= self.cfg.sessions {
            return;
        }
        let idx = self.started;
        self.started += 1;
        let mut rng = Rng::stream(self.seed, "sessions.content").child(idx);
        let tenant = rng.below(u64::from(self.cfg.tenants)) as u32;
        let turns = uniform(&mut rng, self.cfg.turns_min, self.cfg.turns_max);
        self.active.insert(
            idx,
            Session {
                tenant,
                rng,
                turns,
                turn: 0,
                prev_prompt: 0,
                prev_output: 0,
                prev_blocks: Vec::new(),
                seen: Vec::new(),
            },
        );
        self.heap.push(Reverse((at_ns, idx)));
    }

    /// Generate the turn of session `idx` at `t`; `None` if the session ends instead.
    fn turn(&mut self, idx: u64, t: u64) -> Option<Request> {
        let c = &self.cfg;
        let s = self.active.get_mut(&idx)?;
        let rng = &mut s.rng;
        let text = uniform(rng, c.text_tokens_min, c.text_tokens_max);
        let n_new = if s.turn == 0 {
            uniform(rng, c.first_turn_images_min, c.first_turn_images_max)
        } else if rng.chance(c.image_turn_prob) {
            uniform(rng, c.later_turn_images_min, c.later_turn_images_max)
        } else {
            0
        };
        let mut images: Vec<Image> = (0..n_new).map(|_| self.images.fresh(rng)).collect();
        let gap = secs_to_ns(c.reref_min_gap_s);
        if rng.chance(c.reref_prob) {
            let old_enough = t.saturating_sub(gap);
            let pick = if rng.chance(c.reref_cross_session) {
                let k = self
                    .pool
                    .partition_point(|(_, seen, _)| *seen <= old_enough);
                let mut found = None;
                for _ in 0..8 {
                    if k == 0 {
                        break;
                    }
                    let (img, _, owner) = &self.pool[rng.below(k as u64) as usize];
                    if *owner != idx {
                        found = Some(img.clone());
                        break;
                    }
                }
                found
            } else {
                let k = s.seen.partition_point(|(_, seen)| *seen <= old_enough);
                (k > 0).then(|| s.seen[rng.below(k as u64) as usize].0.clone())
            };
            if let Some(img) = pick {
                if !images.iter().any(|i| i.content_id == img.content_id) {
                    images.push(img);
                }
            }
        }
        let output = uniform(rng, c.output_tokens_min, c.output_tokens_max);
        let visual: u64 = images.iter().map(|i| u64::from(i.visual_tokens)).sum();
        let context = if s.turn == 0 {
            u64::from(c.system_prompt_tokens)
        } else {
            u64::from(s.prev_prompt) + u64::from(s.prev_output)
        };
        let prompt = context + u64::from(text) + visual;
        if prompt > u64::from(c.max_context_tokens) {
            return None;
        }
        let prompt = prompt as u32;
        let bs = c.block_size_tokens;
        let total = blocks_for_tokens(prompt, bs) as usize;
        let mut blocks = Vec::with_capacity(total);
        if s.turn == 0 {
            let sys = &self.system_blocks[s.tenant as usize];
            blocks.extend_from_slice(&sys[..sys.len().min(total)]);
        } else {
            let full = (s.prev_prompt / bs) as usize;
            blocks.extend_from_slice(&s.prev_blocks[..full.min(total)]);
        }
        let fresh = (total - blocks.len()) as u64;
        self.blocks.extend(&mut blocks, fresh);
        for img in images.iter().take(n_new as usize) {
            s.seen.push((img.clone(), t));
            self.pool.push_back((img.clone(), t, idx));
            if self.pool.len() > c.pool_size.max(1) as usize {
                self.pool.pop_front();
            }
        }
        let req = Request {
            id: self.next_id,
            arrival_ns: t,
            session: idx,
            turn: s.turn,
            tenant: s.tenant,
            prompt_tokens: prompt,
            prompt_blocks: blocks.clone(),
            images,
            output_tokens: output,
            fork: None,
        };
        self.next_id += 1;
        s.prev_prompt = prompt;
        s.prev_output = output;
        s.prev_blocks = blocks;
        s.turn += 1;
        Some(req)
    }
}

impl Iterator for SessionsGen {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        loop {
            let Reverse((t, idx)) = self.heap.pop()?;
            let first_turn = self.active.get(&idx).is_some_and(|s| s.turn == 0);
            if first_turn {
                let gap = secs_to_ns(self.starts.exp(1.0 / self.cfg.session_rate));
                self.start_session(t.saturating_add(gap));
            }
            let req = self.turn(idx, t);
            let more = req.is_some() && self.active.get(&idx).is_some_and(|s| s.turn < s.turns);
            if more {
                if let Some(s) = self.active.get_mut(&idx) {
                    let think = self.cfg.min_turn_gap_s + s.rng.exp(self.cfg.think_time_s);
                    self.heap
                        .push(Reverse((t.saturating_add(secs_to_ns(think)), idx)));
                }
            } else {
                self.active.remove(&idx);
            }
            if let Some(r) = req {
                return Some(r);
            }
        }
    }
}

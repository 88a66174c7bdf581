//! `moonagent trace stats`: one streaming pass over a trace.
//!
//! Counts requests, arrival rate over time, tokens, images and forks, and measures reuse:
//! the *repeat rate* of images (of prefix blocks) is the fraction of image (block)
//! references whose content id (block id) was already referenced earlier in the trace,
//! and the *reuse interval* is the time since that id's previous reference. Unique bytes by
//! object type follow a model's sizes: KV = tokens of each distinct prefix block (its
//! first occurrence; a request without blocks counts all its prompt tokens as unique)
//! times bytes per token; encoder output = visual tokens of each distinct image times bytes
//! per visual token. Remembering ids takes memory that grows with the distinct ids (the
//! readers stay constant-memory).

use std::collections::BTreeMap;
use std::fmt;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::error::TraceError;
use crate::schema::{tokens_in_block, Request, TraceHeader};

/// Qwen2.5-VL-7B KV cache bytes per token in bf16 (28 layers x 2 x 4 KV heads x 128 x 2 B).
pub const QWEN25VL_7B_KV_BYTES_PER_TOKEN: u64 = 57_344;
/// Qwen2.5-VL-7B encoder output bytes per visual token (hidden 3584 x 2 B).
pub const QWEN25VL_7B_ENCODER_BYTES_PER_TOKEN: u64 = 7_168;

/// Object sizes of a model, for unique-byte accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectSizes {
    /// KV cache bytes per prompt token (default Qwen2.5-VL-7B: 57,344).
    pub kv_bytes_per_token: u64,
    /// Encoder-output bytes per visual token (default Qwen2.5-VL-7B: 7,168).
    pub encoder_bytes_per_visual_token: u64,
}

impl Default for ObjectSizes {
    fn default() -> Self {
        Self {
            kv_bytes_per_token: QWEN25VL_7B_KV_BYTES_PER_TOKEN,
            encoder_bytes_per_visual_token: QWEN25VL_7B_ENCODER_BYTES_PER_TOKEN,
        }
    }
}

/// Options of a stats pass.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatsConfig {
    /// Width of a rate-over-time bucket in seconds (default 60).
    pub bucket_s: f64,
    /// Model object sizes.
    pub sizes: ObjectSizes,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self {
            bucket_s: 60.0,
            sizes: ObjectSizes::default(),
        }
    }
}

/// Sum, mean, min and max of a per-request count.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Sum over requests.
    pub total: u64,
    /// Mean per request.
    pub mean: f64,
    /// Smallest value.
    pub min: u64,
    /// Largest value.
    pub max: u64,
}

/// Reuse of one kind of object (images or prefix blocks).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReuseStats {
    /// References in the trace.
    pub references: u64,
    /// Distinct ids.
    pub unique: u64,
    /// References to an id seen earlier.
    pub repeats: u64,
    /// `repeats / references`.
    pub repeat_rate: f64,
    /// Mean seconds since the previous reference of the same id, over repeats.
    pub mean_reuse_interval_s: f64,
}

/// Unique bytes by object type.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UniqueBytes {
    /// Tokens of distinct KV blocks.
    pub kv_tokens: u64,
    /// Bytes of distinct KV blocks.
    pub kv_bytes: u64,
    /// Visual tokens of distinct images.
    pub encoder_tokens: u64,
    /// Bytes of distinct encoder outputs.
    pub encoder_bytes: u64,
    /// KV share of all unique bytes.
    pub kv_share: f64,
    /// Encoder-output share of all unique bytes.
    pub encoder_share: f64,
    /// The sizes used.
    pub sizes: ObjectSizes,
}

/// Fork statistics.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForkStats {
    /// Requests with a fork.
    pub forked_requests: u64,
    /// Branches over all forks.
    pub branches_total: u64,
    /// Requests by branch count (1 for requests without a fork).
    pub branch_histogram: BTreeMap<u32, u64>,
    /// Tokens decoded by branches.
    pub branch_output_tokens: u64,
}

/// Everything `trace stats` reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceStats {
    /// The header's generator.
    pub generator: String,
    /// The header's seed, if any.
    pub seed: Option<u64>,
    /// The header's source, if any.
    pub source: Option<String>,
    /// Block size of the prefix blocks.
    pub block_size_tokens: u32,
    /// Requests.
    pub requests: u64,
    /// Distinct sessions.
    pub sessions: u64,
    /// Distinct tenants.
    pub tenants: u64,
    /// First arrival (s).
    pub first_arrival_s: f64,
    /// Last arrival (s).
    pub last_arrival_s: f64,
    /// Last minus first arrival (s).
    pub duration_s: f64,
    /// Requests per second over the duration.
    pub mean_rate: f64,
    /// Width of a rate bucket (s); doubled as needed to keep at most 100,000 buckets.
    pub rate_bucket_s: f64,
    /// Requests per second in each bucket from the first arrival.
    pub rate_over_time: Vec<f64>,
    /// Prompt tokens per request (text and visual).
    pub prompt_tokens: Summary,
    /// Output tokens per request (shared part plus branches).
    pub output_tokens: Summary,
    /// Images per request.
    pub images_per_request: Summary,
    /// Visual tokens per image reference.
    pub visual_tokens_per_image: f64,
    /// Requests with at least one image.
    pub requests_with_images: u64,
    /// Image reuse.
    pub images: ReuseStats,
    /// Prefix-block reuse.
    pub blocks: ReuseStats,
    /// Forks.
    pub forks: ForkStats,
    /// Unique bytes by object type.
    pub unique_bytes: UniqueBytes,
}

#[derive(Default)]
struct Acc {
    total: u64,
    min: u64,
    max: u64,
}

impl Acc {
    fn add(&mut self, v: u64, first: bool) {
        self.total += v;
        if first || v < self.min {
            self.min = v;
        }
        if first || v > self.max {
            self.max = v;
        }
    }
    fn summary(&self, n: u64) -> Summary {
        Summary {
            total: self.total,
            mean: if n == 0 {
                0.0
            } else {
                self.total as f64 / n as f64
            },
            min: self.min,
            max: self.max,
        }
    }
}

#[derive(Default)]
struct Reuse {
    last_seen: FxHashMap<u64, u64>,
    references: u64,
    repeats: u64,
    interval_sum_ns: u128,
}

impl Reuse {
    /// Record a reference; `true` if the id is new.
    fn touch(&mut self, id: u64, now: u64) -> bool {
        self.references += 1;
        match self.last_seen.insert(id, now) {
            Some(prev) => {
                self.repeats += 1;
                self.interval_sum_ns += u128::from(now.saturating_sub(prev));
                false
            }
            None => true,
        }
    }
    fn stats(&self) -> ReuseStats {
        ReuseStats {
            references: self.references,
            unique: self.last_seen.len() as u64,
            repeats: self.repeats,
            repeat_rate: ratio(self.repeats, self.references),
            mean_reuse_interval_s: if self.repeats == 0 {
                0.0
            } else {
                self.interval_sum_ns as f64 / self.repeats as f64 / 1e9
            },
        }
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

const MAX_BUCKETS: usize = 100_000;

/// Accumulates [`TraceStats`] one request at a time.
pub struct StatsBuilder {
    cfg: StatsConfig,
    header: TraceHeader,
    n: u64,
    first_ns: u64,
    last_ns: u64,
    bucket_ns: u64,
    buckets: Vec<u64>,
    sessions: rustc_hash::FxHashSet<u64>,
    tenants: rustc_hash::FxHashSet<u32>,
    prompt: Acc,
    output: Acc,
    images_per_req: Acc,
    visual_refs: u64,
    with_images: u64,
    images: Reuse,
    blocks: Reuse,
    kv_tokens: u64,
    encoder_tokens: u64,
    forks: ForkStats,
}

impl StatsBuilder {
    /// A builder for a trace with `header`.
    pub fn new(header: &TraceHeader, cfg: StatsConfig) -> Self {
        let bucket_ns = if cfg.bucket_s.is_finite() && cfg.bucket_s > 0.0 {
            ((cfg.bucket_s * 1e9).round() as u64).max(1)
        } else {
            60_000_000_000
        };
        Self {
            cfg,
            header: header.clone(),
            n: 0,
            first_ns: 0,
            last_ns: 0,
            bucket_ns,
            buckets: Vec::new(),
            sessions: Default::default(),
            tenants: Default::default(),
            prompt: Acc::default(),
            output: Acc::default(),
            images_per_req: Acc::default(),
            visual_refs: 0,
            with_images: 0,
            images: Reuse::default(),
            blocks: Reuse::default(),
            kv_tokens: 0,
            encoder_tokens: 0,
            forks: ForkStats::default(),
        }
    }

    /// Add one request (in file order).
    pub fn add(&mut self, r: &Request) {
        let first = self.n == 0;
        if first {
            self.first_ns = r.arrival_ns;
        }
        self.n += 1;
        self.last_ns = self.last_ns.max(r.arrival_ns);
        let mut idx = (r.arrival_ns.saturating_sub(self.first_ns) / self.bucket_ns) as usize;
        while idx >= MAX_BUCKETS {
            // Coarsen: merge bucket pairs and double the width.
            let merged: Vec<u64> = self.buckets.chunks(2).map(|c| c.iter().sum()).collect();
            self.buckets = merged;
            self.bucket_ns *= 2;
            idx = (r.arrival_ns.saturating_sub(self.first_ns) / self.bucket_ns) as usize;
        }
        if self.buckets.len() <= idx {
            self.buckets.resize(idx + 1, 0);
        }
        self.buckets[idx] += 1;
        self.sessions.insert(r.session);
        self.tenants.insert(r.tenant);
        self.prompt.add(u64::from(r.prompt_tokens), first);
        self.output.add(r.total_output_tokens(), first);
        self.images_per_req.add(r.images.len() as u64, first);
        if !r.images.is_empty() {
            self.with_images += 1;
        }
        for img in &r.images {
            self.visual_refs += u64::from(img.visual_tokens);
            if self.images.touch(img.content_id, r.arrival_ns) {
                self.encoder_tokens += u64::from(img.visual_tokens);
            }
        }
        if r.prompt_blocks.is_empty() {
            self.kv_tokens += u64::from(r.prompt_tokens);
        } else {
            let bs = self.header.block_size_tokens;
            for (i, &b) in r.prompt_blocks.iter().enumerate() {
                if self.blocks.touch(b, r.arrival_ns) {
                    self.kv_tokens += tokens_in_block(r.prompt_tokens, bs, i as u64);
                }
            }
        }
        let branches = r.fork.as_ref().map(|f| f.branches).unwrap_or(1);
        *self.forks.branch_histogram.entry(branches).or_insert(0) += 1;
        if let Some(f) = &r.fork {
            self.forks.forked_requests += 1;
            self.forks.branches_total += u64::from(f.branches);
            self.forks.branch_output_tokens +=
                f.output_tokens.iter().map(|&t| u64::from(t)).sum::<u64>();
        }
    }

    /// The statistics so far.
    pub fn finish(&self) -> TraceStats {
        let duration_ns = self.last_ns.saturating_sub(self.first_ns);
        let bucket_s = self.bucket_ns as f64 / 1e9;
        let sizes = self.cfg.sizes;
        let kv_bytes = self.kv_tokens.saturating_mul(sizes.kv_bytes_per_token);
        let enc_bytes = self
            .encoder_tokens
            .saturating_mul(sizes.encoder_bytes_per_visual_token);
        let all = kv_bytes as f64 + enc_bytes as f64;
        let share = |x: u64| if all > 0.0 { x as f64 / all } else { 0.0 };
        TraceStats {
            generator: self.header.generator.clone(),
            seed: self.header.seed,
            source: self.header.source.clone(),
            block_size_tokens: self.header.block_size_tokens,
            requests: self.n,
            sessions: self.sessions.len() as u64,
            tenants: self.tenants.len() as u64,
            first_arrival_s: self.first_ns as f64 / 1e9,
            last_arrival_s: self.last_ns as f64 / 1e9,
            duration_s: duration_ns as f64 / 1e9,
            mean_rate: if duration_ns == 0 {
                0.0
            } else {
                self.n as f64 / (duration_ns as f64 / 1e9)
            },
            rate_bucket_s: bucket_s,
            rate_over_time: self.buckets.iter().map(|&c| c as f64 / bucket_s).collect(),
            prompt_tokens: self.prompt.summary(self.n),
            output_tokens: self.output.summary(self.n),
            images_per_request: self.images_per_req.summary(self.n),
            visual_tokens_per_image: ratio(self.visual_refs, self.images.references),
            requests_with_images: self.with_images,
            images: self.images.stats(),
            blocks: self.blocks.stats(),
            forks: self.forks.clone(),
            unique_bytes: UniqueBytes {
                kv_tokens: self.kv_tokens,
                kv_bytes,
                encoder_tokens: self.encoder_tokens,
                encoder_bytes: enc_bytes,
                kv_share: share(kv_bytes),
                encoder_share: share(enc_bytes),
                sizes,
            },
        }
    }
}

/// Compute stats over a request stream in one pass.
pub fn compute<I>(
    header: &TraceHeader,
    requests: I,
    cfg: StatsConfig,
) -> Result<TraceStats, TraceError>
where
    I: IntoIterator<Item = Result<Request, TraceError>>,
{
    let mut b = StatsBuilder::new(header, cfg);
    for r in requests {
        b.add(&r?);
    }
    Ok(b.finish())
}

/// Compute stats of a trace file (either format).
pub fn stats_of_file(
    path: impl AsRef<std::path::Path>,
    cfg: StatsConfig,
) -> Result<TraceStats, TraceError> {
    let reader = crate::io::TraceReader::open(path)?;
    let header = reader.header().clone();
    compute(&header, reader, cfg)
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

impl fmt::Display for TraceStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "generator          {}", self.generator)?;
        if let Some(s) = self.seed {
            writeln!(f, "seed               {s}")?;
        }
        if let Some(s) = &self.source {
            writeln!(f, "source             {s}")?;
        }
        writeln!(f, "requests           {}", self.requests)?;
        writeln!(
            f,
            "sessions           {}   tenants {}",
            self.sessions, self.tenants
        )?;
        writeln!(
            f,
            "duration           {:.1} s   mean rate {:.3} req/s",
            self.duration_s, self.mean_rate
        )?;
        let peak = self.rate_over_time.iter().cloned().fold(0.0, f64::max);
        writeln!(
            f,
            "rate over time     {} buckets of {:.0} s, peak {:.3} req/s",
            self.rate_over_time.len(),
            self.rate_bucket_s,
            peak
        )?;
        // At most 48 numbers on screen: average groups of buckets (--json has them all).
        let group = self.rate_over_time.len().div_ceil(48).max(1);
        let shown: Vec<String> = self
            .rate_over_time
            .chunks(group)
            .map(|c| format!("{:.2}", c.iter().sum::<f64>() / c.len() as f64))
            .collect();
        if !shown.is_empty() {
            writeln!(
                f,
                "  req/s per {:.0} s  {}",
                self.rate_bucket_s * group as f64,
                shown.join(" ")
            )?;
        }
        let s = |x: &Summary| {
            format!(
                "avg {:.1}  min {}  max {}  total {}",
                x.mean, x.min, x.max, x.total
            )
        };
        writeln!(f, "prompt tokens      {}", s(&self.prompt_tokens))?;
        writeln!(f, "output tokens      {}", s(&self.output_tokens))?;
        writeln!(f, "images/request     {}", s(&self.images_per_request))?;
        writeln!(
            f,
            "images             {} refs, {} unique, repeat rate {:.2}%, mean reuse interval {:.1} s, {:.1} visual tokens/image",
            self.images.references,
            self.images.unique,
            100.0 * self.images.repeat_rate,
            self.images.mean_reuse_interval_s,
            self.visual_tokens_per_image
        )?;
        writeln!(
            f,
            "prefix blocks      {} refs, {} unique, repeat rate {:.2}%, mean reuse interval {:.1} s (block {} tokens)",
            self.blocks.references,
            self.blocks.unique,
            100.0 * self.blocks.repeat_rate,
            self.blocks.mean_reuse_interval_s,
            self.block_size_tokens
        )?;
        let hist: Vec<String> = self
            .forks
            .branch_histogram
            .iter()
            .map(|(b, n)| format!("{b}:{n}"))
            .collect();
        writeln!(
            f,
            "forks              {} forked requests, {} branches, by branch count {{{}}}",
            self.forks.forked_requests,
            self.forks.branches_total,
            hist.join(", ")
        )?;
        let u = &self.unique_bytes;
        writeln!(
            f,
            "unique bytes       KV {:.3} GiB ({:.2}%), encoder output {:.3} GiB ({:.2}%)  [{} B/token KV, {} B/visual token]",
            gib(u.kv_bytes),
            100.0 * u.kv_share,
            gib(u.encoder_bytes),
            100.0 * u.encoder_share,
            u.sizes.kv_bytes_per_token,
            u.sizes.encoder_bytes_per_visual_token
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Image;

    fn req(id: u64, t_s: u64, prompt: u32, blocks: Vec<u64>, images: Vec<u64>) -> Request {
        Request {
            id,
            arrival_ns: t_s * 1_000_000_000,
            session: 0,
            turn: 0,
            tenant: 0,
            prompt_tokens: prompt,
            prompt_blocks: blocks,
            images: images
                .into_iter()
                .map(|c| Image::tokens_only(c, 10))
                .collect(),
            output_tokens: 1,
            fork: None,
        }
    }

    #[test]
    fn repeat_rates_intervals_and_unique_bytes_on_a_hand_made_trace() {
        let h = TraceHeader::new("t", 16);
        let mut b = StatsBuilder::new(&h, StatsConfig::default());
        // Blocks: 1,2 then 1,2,3 (a 20-token prompt: block 3 holds 4 tokens).
        b.add(&req(0, 0, 32, vec![1, 2], vec![7]));
        b.add(&req(1, 10, 36, vec![1, 2, 3], vec![7, 8]));
        b.add(&req(2, 70, 12, vec![], vec![]));
        let s = b.finish();
        assert_eq!(s.requests, 3);
        assert_eq!(
            (s.blocks.references, s.blocks.unique, s.blocks.repeats),
            (5, 3, 2)
        );
        assert!((s.blocks.repeat_rate - 0.4).abs() < 1e-12);
        assert!((s.blocks.mean_reuse_interval_s - 10.0).abs() < 1e-12);
        assert_eq!(
            (s.images.references, s.images.unique, s.images.repeats),
            (3, 2, 1)
        );
        // KV tokens: 16 + 16 + 4 from blocks, 12 from the blockless request.
        assert_eq!(s.unique_bytes.kv_tokens, 48);
        assert_eq!(s.unique_bytes.encoder_tokens, 20);
        assert_eq!(s.unique_bytes.kv_bytes, 48 * 57_344);
        assert_eq!(s.unique_bytes.encoder_bytes, 20 * 7_168);
        assert_eq!(s.rate_over_time.len(), 2);
        assert!((s.duration_s - 70.0).abs() < 1e-12);
    }
}

//! The seed's `multi_image_agent` example, built in: a multi-image agent session whose
//! turns re-use images, a deterministic toy encoder, and a replay that reports counters.
//!
//! Session: four distinct images (two screenshots, a chart, a photo) over three turns,
//! `[A, B]`, `[A, C]`, `[B, D, B]`. Replayed through an empty cache, the first pass makes
//! 3 encoder calls (one per turn, each on that turn's misses) and commits 4 cache objects
//! (pairs), as the seed reports (`{'encoder_calls': 3, 'cache_objects': 4}`); the repeated
//! `B` in the last turn is de-duplicated. A second pass encodes nothing: 3 encoder calls
//! in two passes instead of 6. Every returned segment is checked against the toy
//! encoder, whose output is a pure function of the image fingerprint.

use super::{CacheError, EncodeJob, ImageInput, MmCache, ModelCtx};
use crate::fingerprint::{Dtype, GridThw, ImageFp, ImageHasher, ModelParts};
use crate::rng::Rng;
use crate::store::{Nanos, Store, MS};
use serde::{Deserialize, Serialize};

/// How big the demo's tensors are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoScale {
    /// Qwen2.5-VL-7B-like: hidden 3584 bf16 (7168 B per visual token), pixel rows of
    /// 1176 f32 (the largest image is 1196 tokens, 8.6 MB of embedding).
    Full,
    /// Tiny tensors for tests: hidden 8, pixel rows of 2 f32.
    Tiny,
}

/// One image of the session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoImage {
    /// Name (also the seed of its synthetic pixels).
    pub name: &'static str,
    /// Fingerprint and grid.
    pub input: ImageInput,
    /// Processed pixel tensor shape `[patches, row]` (f32).
    pub pixel_shape: [u64; 2],
}

/// A multi-image agent session: the model context, its images and the turns.
#[derive(Debug, Clone)]
pub struct AgentSession {
    /// Model context (tenant `demo`).
    pub ctx: ModelCtx,
    /// The distinct images.
    pub images: Vec<DemoImage>,
    /// Turns: each a request's images in prompt order.
    pub turns: Vec<Vec<ImageInput>>,
}

const IMAGES: [(&str, GridThw); 4] = [
    ("screenshot_0", GridThw::new(1, 36, 52)),
    ("chart", GridThw::new(1, 46, 104)),
    ("photo", GridThw::new(1, 28, 28)),
    ("screenshot_1", GridThw::new(1, 40, 60)),
];
const TURNS: [&[usize]; 3] = [&[0, 1], &[0, 2], &[1, 3, 1]];

/// The session at full scale.
pub fn multi_image_agent_session() -> Result<AgentSession, CacheError> {
    multi_image_agent_session_with(DemoScale::Full)
}

/// The session at `scale`.
pub fn multi_image_agent_session_with(scale: DemoScale) -> Result<AgentSession, CacheError> {
    let (hidden, row) = match scale {
        DemoScale::Full => (3584, 1176),
        DemoScale::Tiny => (8, 2),
    };
    let ctx = ModelCtx::new(ModelParts::example("demo"), hidden)?;
    let mut images = Vec::with_capacity(IMAGES.len());
    for (name, grid) in IMAGES {
        let patches = grid
            .patches()
            .ok_or_else(|| CacheError::InvalidInput(format!("{name}: grid too large")))?;
        let shape = [patches, row];
        // Synthetic processed pixels, streamed row by row into the hasher (never held whole).
        let mut h = ImageHasher::new(&ctx.fp(), grid, &shape, Dtype::F32)?;
        let mut rng = Rng::stream(0, name);
        let mut line = vec![0u8; (row * 4) as usize];
        for _ in 0..patches {
            fill(&mut rng, &mut line);
            h.update(&line);
        }
        images.push(DemoImage {
            name,
            input: ImageInput {
                fp: h.finish()?,
                grid,
            },
            pixel_shape: shape,
        });
    }
    let turns = TURNS
        .iter()
        .map(|t| t.iter().map(|&i| images[i].input).collect())
        .collect();
    Ok(AgentSession { ctx, images, turns })
}

fn fill(rng: &mut Rng, out: &mut [u8]) {
    for chunk in out.chunks_mut(8) {
        let v = rng.next_u64().to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// The toy encoder's embedding of `fp`: a pure function of the fingerprint.
pub fn toy_embedding(fp: &ImageFp, out: &mut [u8]) {
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&fp.0[..8]);
    fill(&mut Rng::new(u64::from_le_bytes(seed)), out);
}

/// A deterministic encoder for [`MmCache::run_batch`]: fills each job with [`toy_embedding`].
pub fn toy_encoder(jobs: &[EncodeJob], outs: &mut [Vec<u8>]) -> Result<(), super::EncoderError> {
    for (j, out) in jobs.iter().zip(outs.iter_mut()) {
        toy_embedding(&j.fp, out);
    }
    Ok(())
}

/// What one replay pass did (counter deltas over the pass).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassReport {
    /// Encoder invocations.
    pub encoder_calls: u64,
    /// Images encoded.
    pub images_encoded: u64,
    /// Pairs committed.
    pub cache_objects: u64,
    /// Cache probes.
    pub lookups: u64,
    /// Probes that hit.
    pub hits: u64,
    /// Post-encode readbacks that validated (not hits).
    pub readbacks: u64,
    /// Readbacks that missed and fell back to the encoder's bytes.
    pub readback_fallbacks: u64,
    /// De-duplicated image references.
    pub dedup: u64,
    /// Corrupt meta objects found (and deleted).
    pub corrupt_meta: u64,
    /// Corrupt blobs found (and deleted).
    pub corrupt_blob: u64,
    /// Segments whose bytes equal the toy encoder's.
    pub verified_segments: u64,
    /// Segments whose bytes differ (always 0 unless something is badly wrong).
    pub wrong_segments: u64,
}

/// Replay the session once through `cache`, turn `i` at `start + i` ms.
pub fn replay_pass<S: Store>(
    cache: &mut MmCache<S>,
    session: &AgentSession,
    start: Nanos,
) -> Result<PassReport, CacheError> {
    let before = cache.counters().clone();
    let mut verified = 0;
    let mut wrong = 0;
    let mut want = Vec::new();
    for (i, turn) in session.turns.iter().enumerate() {
        let now = start.saturating_add((i as u64).saturating_mul(MS));
        let plan = cache.run_request(now, &session.ctx, turn, toy_encoder)?;
        for (k, s) in plan.segments.iter().enumerate() {
            want.resize(s.byte_len as usize, 0);
            toy_embedding(&s.fp, &mut want);
            if plan.segment_bytes(k) == Some(want.as_slice()) {
                verified += 1;
            } else {
                wrong += 1;
            }
        }
    }
    let a = cache.counters();
    Ok(PassReport {
        encoder_calls: a.encoder_calls - before.encoder_calls,
        images_encoded: a.images_encoded - before.images_encoded,
        cache_objects: a.commits - before.commits,
        lookups: a.lookups - before.lookups,
        hits: a.hits - before.hits,
        readbacks: a.readback_hits - before.readback_hits,
        readback_fallbacks: a.readback_fallbacks - before.readback_fallbacks,
        dedup: a.dedup - before.dedup,
        corrupt_meta: a.misses.corrupt_meta - before.misses.corrupt_meta,
        corrupt_blob: a.misses.corrupt_blob - before.misses.corrupt_blob,
        verified_segments: verified,
        wrong_segments: wrong,
    })
}

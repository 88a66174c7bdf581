//! Multi-image planning: offsets, in-batch de-duplication, lookups, encode-and-commit.
//!
//! A request carries images in prompt order. [`MmCache::plan_batch`] lays out every
//! request: patch-domain offsets (cumulative `t*h*w`, where the processed pixels of each
//! image start) and post-merge offsets (cumulative visual tokens and bytes, where each
//! embedding lands in the request's concatenated embedding). Identical fingerprints inside
//! a request or across the requests of one batch are looked up and encoded once; the
//! other references are [`SegmentSource::Duplicate`] and counted as `dedup`. Each distinct
//! image is probed through the validated lookup, straight into its place in the output;
//! the misses become [`EncodeJob`]s, the only work that goes to the encoder.
//!
//! Sans-IO: the driver runs the encoder. [`MmCache::complete`] then commits each encoded
//! embedding (two-key) and reads it back through the same validated lookup (counted as a
//! readback, not a hit); if the readback misses (store full, a fault), the encoder's bytes
//! are used for that segment and counted as a `readback_fallback`. Duplicates are filled
//! last. [`MmCache::run_batch`] does all of it with an encoder closure.

use rustc_hash::FxHashMap;

use super::{CacheError, Lookup, MissReason, MmCache, ModelCtx};
use crate::fingerprint::{GridThw, ImageFp};
use crate::store::{Nanos, Store};

/// One image of a request: its fingerprint and grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageInput {
    /// Image fingerprint.
    pub fp: ImageFp,
    /// Grid in patches.
    pub grid: GridThw,
}

/// Whether the plan moves bytes or only sizes (simulator).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlanMode {
    /// Real bytes: lookups validate checksums and fill the outputs.
    Bytes,
    /// Sizes only: envelopes are validated, blobs checked by size.
    SizeOnly,
}

/// Where a segment's embedding comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentSource {
    /// A validated cache hit.
    Hit,
    /// A miss: encoded by job `job` (index into [`Plan::jobs`]).
    Encode {
        /// Job index.
        job: usize,
    },
    /// The same image as segment `of` (earlier in the batch): copied from it.
    Duplicate {
        /// Segment index of the first occurrence.
        of: usize,
    },
}

/// One image reference's place in its request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    /// Request index in the batch.
    pub request: usize,
    /// Position in the request.
    pub index: usize,
    /// Image fingerprint.
    pub fp: ImageFp,
    /// Grid.
    pub grid: GridThw,
    /// First pixel patch of this image in the request's patch sequence.
    pub patch_offset: u64,
    /// Pixel patches (`t*h*w`).
    pub patches: u64,
    /// First visual token in the request's concatenated embedding.
    pub token_offset: u64,
    /// Visual tokens after merge.
    pub tokens: u64,
    /// First byte in the request's concatenated embedding.
    pub byte_offset: u64,
    /// Embedding bytes.
    pub byte_len: u64,
    /// Where the embedding comes from.
    pub source: SegmentSource,
    /// Why the probe missed (for `Encode` segments).
    pub miss: Option<MissReason>,
    /// The readback's outcome, after [`MmCache::complete`] (for `Encode` segments).
    pub readback: Option<Lookup>,
}

/// Per-request totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestSpan {
    /// First segment of the request.
    pub first_segment: usize,
    /// Number of images.
    pub images: usize,
    /// Total pixel patches.
    pub patches: u64,
    /// Total visual tokens.
    pub tokens: u64,
    /// Total embedding bytes.
    pub bytes: u64,
}

/// One distinct missed image for the encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeJob {
    /// The segment it fills.
    pub segment: usize,
    /// Image fingerprint.
    pub fp: ImageFp,
    /// Grid.
    pub grid: GridThw,
    /// Visual tokens.
    pub tokens: u64,
    /// Embedding bytes the encoder must produce.
    pub byte_len: u64,
}

/// A batch's plan: segments, encoder jobs and (bytes mode) the per-request outputs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Bytes or sizes.
    pub mode: PlanMode,
    /// Every image reference, requests in order.
    pub segments: Vec<Segment>,
    /// Per-request spans and totals.
    pub requests: Vec<RequestSpan>,
    /// Distinct misses for the encoder, in segment order.
    pub jobs: Vec<EncodeJob>,
    outputs: Vec<Vec<u8>>,
    completed: bool,
}

impl Plan {
    /// The concatenated embedding of request `r` (bytes mode; complete after [`MmCache::complete`]).
    pub fn output(&self, r: usize) -> Option<&[u8]> {
        self.outputs.get(r).map(Vec::as_slice)
    }

    /// Take the per-request outputs.
    pub fn take_outputs(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.outputs)
    }

    /// Whether [`MmCache::complete`] has run.
    pub fn is_complete(&self) -> bool {
        self.completed
    }

    /// Segments that hit.
    pub fn hits(&self) -> usize {
        self.count(|s| matches!(s.source, SegmentSource::Hit))
    }

    /// Segments served by an identical image in the batch.
    pub fn duplicates(&self) -> usize {
        self.count(|s| matches!(s.source, SegmentSource::Duplicate { .. }))
    }

    fn count(&self, f: impl Fn(&Segment) -> bool) -> usize {
        self.segments.iter().filter(|s| f(s)).count()
    }

    /// The bytes of segment `i` in its request's output (bytes mode).
    pub fn segment_bytes(&self, i: usize) -> Option<&[u8]> {
        let s = self.segments.get(i)?;
        let (a, b) = range(s)?;
        self.outputs.get(s.request)?.get(a..b)
    }
}

fn range(s: &Segment) -> Option<(usize, usize)> {
    let a = usize::try_from(s.byte_offset).ok()?;
    let b = a.checked_add(usize::try_from(s.byte_len).ok()?)?;
    Some((a, b))
}

fn too_large(what: &str) -> CacheError {
    CacheError::InvalidInput(format!("{what}: too large for this platform"))
}

impl<S: Store> MmCache<S> {
    /// Plan one request (see [`MmCache::plan_batch`]).
    pub fn plan_request(
        &mut self,
        now: Nanos,
        ctx: &ModelCtx,
        images: &[ImageInput],
        mode: PlanMode,
    ) -> Result<Plan, CacheError> {
        self.plan_batch(now, ctx, &[images], mode)
    }

    /// Lay out a batch, de-duplicate identical images, and probe each distinct image once.
    pub fn plan_batch(
        &mut self,
        now: Nanos,
        ctx: &ModelCtx,
        requests: &[&[ImageInput]],
        mode: PlanMode,
    ) -> Result<Plan, CacheError> {
        let mut segments = Vec::new();
        let mut spans = Vec::with_capacity(requests.len());
        for (r, images) in requests.iter().enumerate() {
            let (mut patches, mut tokens, mut bytes) = (0u64, 0u64, 0u64);
            let first_segment = segments.len();
            for (index, img) in images.iter().enumerate() {
                let exp = ctx.expect(img.grid)?;
                let p = img
                    .grid
                    .patches()
                    .ok_or_else(|| too_large("grid_thw patches"))?;
                segments.push(Segment {
                    request: r,
                    index,
                    fp: img.fp,
                    grid: img.grid,
                    patch_offset: patches,
                    patches: p,
                    token_offset: tokens,
                    tokens: exp.tokens,
                    byte_offset: bytes,
                    byte_len: exp.byte_len,
                    source: SegmentSource::Hit,
                    miss: None,
                    readback: None,
                });
                patches = patches.checked_add(p).ok_or_else(|| too_large("patches"))?;
                tokens = tokens
                    .checked_add(exp.tokens)
                    .ok_or_else(|| too_large("tokens"))?;
                bytes = bytes
                    .checked_add(exp.byte_len)
                    .ok_or_else(|| too_large("bytes"))?;
            }
            spans.push(RequestSpan {
                first_segment,
                images: images.len(),
                patches,
                tokens,
                bytes,
            });
        }
        let mut outputs = Vec::new();
        if mode == PlanMode::Bytes {
            for s in &spans {
                let n = usize::try_from(s.bytes).map_err(|_| too_large("request bytes"))?;
                outputs.push(vec![0u8; n]);
            }
        }
        let mut plan = Plan {
            mode,
            segments,
            requests: spans,
            jobs: Vec::new(),
            outputs,
            completed: false,
        };
        self.counters.images_planned += plan.segments.len() as u64;

        let mut first: FxHashMap<ImageFp, usize> = FxHashMap::default();
        for i in 0..plan.segments.len() {
            let (fp, grid) = (plan.segments[i].fp, plan.segments[i].grid);
            if let Some(&of) = first.get(&fp) {
                if plan.segments[of].grid != grid {
                    return Err(CacheError::InvalidInput(format!(
                        "image {fp} appears with grids {:?} and {grid:?}",
                        plan.segments[of].grid
                    )));
                }
                plan.segments[i].source = SegmentSource::Duplicate { of };
                self.counters.dedup += 1;
                continue;
            }
            first.insert(fp, i);
            let exp = ctx.expect(grid)?;
            let outcome = match mode {
                PlanMode::SizeOnly => self.lookup_size_only(now, &fp, &exp)?,
                PlanMode::Bytes => {
                    let s = &plan.segments[i];
                    let (a, b) = range(s).ok_or_else(|| too_large("segment"))?;
                    let out = plan
                        .outputs
                        .get_mut(s.request)
                        .and_then(|o| o.get_mut(a..b))
                        .ok_or_else(|| too_large("segment"))?;
                    self.lookup(now, &fp, &exp, out)?
                }
            };
            if let Lookup::Miss(reason) = outcome {
                let job = plan.jobs.len();
                let s = &mut plan.segments[i];
                s.source = SegmentSource::Encode { job };
                s.miss = Some(reason);
                plan.jobs.push(EncodeJob {
                    segment: i,
                    fp,
                    grid,
                    tokens: s.tokens,
                    byte_len: s.byte_len,
                });
            }
        }
        Ok(plan)
    }

    /// Commit the encoder's outputs (one per job, in job order; none in size-only mode),
    /// read each back through the validated path, and fill duplicates.
    pub fn complete(
        &mut self,
        now: Nanos,
        ctx: &ModelCtx,
        plan: &mut Plan,
        encoded: &[Vec<u8>],
    ) -> Result<(), CacheError> {
        if plan.completed {
            return Err(CacheError::InvalidInput("plan already completed".into()));
        }
        let want = match plan.mode {
            PlanMode::Bytes => plan.jobs.len(),
            PlanMode::SizeOnly => 0,
        };
        if encoded.len() != want {
            return Err(CacheError::InvalidInput(format!(
                "encoded: expected {want} embeddings, got {}",
                encoded.len()
            )));
        }
        for (job, bytes) in plan.jobs.iter().zip(encoded) {
            if bytes.len() as u64 != job.byte_len {
                return Err(CacheError::InvalidInput(format!(
                    "encoded embedding of {}: expected {} bytes, got {}",
                    job.fp,
                    job.byte_len,
                    bytes.len()
                )));
            }
        }
        if !plan.jobs.is_empty() {
            self.counters.encoder_calls += 1;
            self.counters.images_encoded += plan.jobs.len() as u64;
        }
        let jobs = plan.jobs.clone();
        for (j, job) in jobs.iter().enumerate() {
            let exp = ctx.expect(job.grid)?;
            let outcome = match plan.mode {
                PlanMode::SizeOnly => {
                    self.commit_size_only(now, ctx, job.fp, job.grid)?;
                    self.readback_size_only(now, &job.fp, &exp)?
                }
                PlanMode::Bytes => {
                    let bytes = encoded.get(j).map(Vec::as_slice).unwrap_or_default();
                    self.commit(now, ctx, job.fp, job.grid, bytes)?;
                    let s = &plan.segments[job.segment];
                    let (a, b) = range(s).ok_or_else(|| too_large("segment"))?;
                    let out = plan
                        .outputs
                        .get_mut(s.request)
                        .and_then(|o| o.get_mut(a..b))
                        .ok_or_else(|| too_large("segment"))?;
                    let r = self.readback(now, &job.fp, &exp, out)?;
                    if let Lookup::Miss(_) = r {
                        // Transport failed: the encoder's own bytes are still right here.
                        out.copy_from_slice(bytes);
                    }
                    r
                }
            };
            if let Lookup::Miss(_) = outcome {
                self.counters.readback_fallbacks += 1;
            }
            plan.segments[job.segment].readback = Some(outcome);
        }
        if plan.mode == PlanMode::Bytes {
            fill_duplicates(plan)?;
        }
        plan.completed = true;
        Ok(())
    }

    /// Plan a batch, run `encoder` once on its misses (if any), and complete it.
    ///
    /// `encoder(jobs, outs)` must fill `outs[i]` (already `jobs[i].byte_len` long).
    pub fn run_batch<F>(
        &mut self,
        now: Nanos,
        ctx: &ModelCtx,
        requests: &[&[ImageInput]],
        mut encoder: F,
    ) -> Result<Plan, CacheError>
    where
        F: FnMut(&[EncodeJob], &mut [Vec<u8>]) -> Result<(), super::EncoderError>,
    {
        let mut plan = self.plan_batch(now, ctx, requests, PlanMode::Bytes)?;
        let mut staging = Vec::with_capacity(plan.jobs.len());
        for j in &plan.jobs {
            let n = usize::try_from(j.byte_len).map_err(|_| too_large("embedding"))?;
            staging.push(vec![0u8; n]);
        }
        if !plan.jobs.is_empty() {
            encoder(&plan.jobs, &mut staging).map_err(CacheError::Encoder)?;
        }
        self.complete(now, ctx, &mut plan, &staging)?;
        Ok(plan)
    }

    /// [`MmCache::run_batch`] for one request.
    pub fn run_request<F>(
        &mut self,
        now: Nanos,
        ctx: &ModelCtx,
        images: &[ImageInput],
        encoder: F,
    ) -> Result<Plan, CacheError>
    where
        F: FnMut(&[EncodeJob], &mut [Vec<u8>]) -> Result<(), super::EncoderError>,
    {
        self.run_batch(now, ctx, &[images], encoder)
    }
}

/// Copy each duplicate's bytes from its first occurrence (always an earlier segment).
fn fill_duplicates(plan: &mut Plan) -> Result<(), CacheError> {
    for i in 0..plan.segments.len() {
        let SegmentSource::Duplicate { of } = plan.segments[i].source else {
            continue;
        };
        let (src, dst) = (&plan.segments[of], &plan.segments[i]);
        let (sa, sb) = range(src).ok_or_else(|| too_large("segment"))?;
        let (da, _) = range(dst).ok_or_else(|| too_large("segment"))?;
        let (rs, rd) = (src.request, dst.request);
        let bad = || CacheError::InvalidInput("duplicate segment out of range".into());
        if rs == rd {
            let out = plan.outputs.get_mut(rd).ok_or_else(bad)?;
            if sb > out.len() || da + (sb - sa) > out.len() {
                return Err(bad());
            }
            out.copy_within(sa..sb, da);
        } else {
            // The first occurrence is in an earlier request: split the outputs there.
            let (head, tail) = plan.outputs.split_at_mut(rd);
            let s = head.get(rs).and_then(|o| o.get(sa..sb)).ok_or_else(bad)?;
            let d = tail
                .first_mut()
                .and_then(|o| o.get_mut(da..da + s.len()))
                .ok_or_else(bad)?;
            d.copy_from_slice(s);
        }
    }
    Ok(())
}

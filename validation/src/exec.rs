//! The backend's [`Executor`] over a [`Compute`]: each engine step runs the model's real
//! operators at the step's shape.
//!
//! What is real: every GEMM, attention over the full context read back through page
//! tables, the MLPs, the merger; KV written into pages of a per-worker host arena; the
//! fingerprint is BLAKE2b over as many processed-pixel bytes as the router would hash.
//!
//! The encoder's outputs are the images' own: an encode step names its images, their
//! pixels are a function of the image's content id, and the outputs go back to the
//! engine, which commits exactly those bytes to the embedding cache (a later hit reads
//! them back through the validated path).
//!
//! What is shape-only: prefill and decode steps carry shapes, not identities (the
//! engine's `Action`s say "a prefill chunk of 512 new tokens over 256 cached", not which
//! request's pages), so each worker computes over its own scratch page region sized for
//! the step, and a decode iteration of `batch` sequences holding `ctx_sum` tokens runs
//! `batch` sequences of `ctx_sum / batch` tokens each. Times are those of the real
//! operators at those shapes; KV pages are not yet the block pool's pages.

use std::sync::Mutex;

use moonagent_core::fingerprint::{Dtype, GridThw, ImageHasher, ModelFp};
use moonagent_core::serve::{Extra, WorkerId};

use crate::backend::{ExecError, Executor, Step};
use crate::compute::{Compute, DecodeSeq, ImageInput, KvPages, PrefillChunk, Rows};

/// Tokens per scratch KV page.
const PAGE_TOKENS: u32 = 16;

/// Runs engine steps on `C`, one scratch KV arena per worker.
pub struct ComputeExecutor<C: Compute> {
    compute: C,
    kv: Vec<Mutex<Option<C::Kv>>>,
    pixels: Vec<u8>,
}

impl<C: Compute> ComputeExecutor<C> {
    /// An executor for `workers` workers.
    pub fn new(compute: C, workers: u32) -> Self {
        Self {
            compute,
            kv: (0..workers).map(|_| Mutex::new(None)).collect(),
            pixels: (0..1u32 << 20)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
        }
    }

    /// The model's operators.
    pub fn compute(&self) -> &C {
        &self.compute
    }
}

fn err(e: impl std::fmt::Display) -> ExecError {
    ExecError {
        what: e.to_string(),
    }
}

/// Page tables for sequences of `lens` tokens, side by side from page 0.
fn tables(lens: &[u32]) -> (Vec<Vec<u32>>, u32) {
    let mut next = 0u32;
    let t = lens
        .iter()
        .map(|&l| {
            let n = l.div_ceil(PAGE_TOKENS).max(1);
            let v = (next..next + n).collect();
            next += n;
            v
        })
        .collect();
    (t, next)
}

impl<C: Compute> ComputeExecutor<C> {
    /// The worker's arena, grown to at least `pages` pages.
    fn with_kv<T>(
        &self,
        worker: WorkerId,
        pages: u32,
        f: impl FnOnce(&mut C::Kv) -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        let slot = self
            .kv
            .get(worker as usize)
            .ok_or_else(|| err(format!("no worker {worker}")))?;
        let mut g = slot.lock().map_err(|_| err("KV arena lock poisoned"))?;
        if g.as_ref().is_none_or(|kv| kv.pages() < pages) {
            // Grow by doubling so a run settles on one arena per worker.
            let want = pages.max(g.as_ref().map_or(0, |kv| kv.pages() * 2)).max(64);
            *g = Some(self.compute.new_kv(want, PAGE_TOKENS).map_err(err)?);
        }
        let kv = g.as_mut().ok_or_else(|| err("no KV arena"))?;
        f(kv)
    }

    fn prefill(&self, worker: WorkerId, chunks: &[(u32, u32)], seed: u64) -> Result<(), ExecError> {
        let lens: Vec<u32> = chunks.iter().map(|&(n, c)| n + c).collect();
        let (tables, pages) = tables(&lens);
        let inputs: Vec<[Rows<'_>; 1]> = chunks
            .iter()
            .enumerate()
            .map(|(i, &(n, _))| {
                [Rows::Text {
                    seed: seed ^ i as u64,
                    count: n,
                }]
            })
            .collect();
        let batch: Vec<PrefillChunk<'_>> = chunks
            .iter()
            .zip(&tables)
            .zip(&inputs)
            .map(|((&(_, cached), pages), inputs)| PrefillChunk {
                pages,
                cached,
                inputs,
            })
            .collect();
        self.with_kv(worker, pages, |kv| {
            self.compute.prefill(kv, &batch).map(drop).map_err(err)
        })
    }
}

impl<C: Compute> Executor for ComputeExecutor<C> {
    fn encoder_outputs(&self) -> bool {
        true
    }

    fn run(&self, worker: WorkerId, step: &Step) -> Result<Vec<Vec<u8>>, ExecError> {
        match step {
            Step::Encode { tokens, contents } => {
                if contents.len() != tokens.len() {
                    return Err(err(format!(
                        "encode step with {} images but {} content ids",
                        tokens.len(),
                        contents.len()
                    )));
                }
                // The pixels are a function of the image's content id alone, so the same
                // image encodes to the same bytes on every worker and in every request:
                // what a cache hit reads back is what the encoder would have produced.
                let images: Vec<ImageInput> = tokens
                    .iter()
                    .zip(contents)
                    .map(|(&t, &c)| ImageInput {
                        visual_tokens: t,
                        seed: c,
                    })
                    .collect();
                self.compute.encode(&images).map_err(err)
            }
            Step::Prefill(chunks) => self
                .prefill(worker, chunks, u64::from(worker))
                .map(|()| Vec::new()),
            Step::Decode {
                batch,
                ctx_sum,
                extra,
            } => {
                for x in extra {
                    match *x {
                        Extra::Recompute { tokens } => {
                            self.prefill(worker, &[(tokens.max(1), 0)], 7)?;
                        }
                        Extra::TailCopy { bytes } => {
                            let page_bytes = self.with_kv(worker, 2, |kv| Ok(kv.page_bytes()))?;
                            let n = (bytes as usize).div_ceil(page_bytes.max(1)) as u32;
                            let src: Vec<u32> = (0..n).collect();
                            let dst: Vec<u32> = (n..2 * n).collect();
                            self.with_kv(worker, 2 * n, |kv| {
                                self.compute.copy_pages(kv, &src, &dst).map_err(err)
                            })?;
                        }
                    }
                }
                let b = (*batch).max(1);
                let per = (ctx_sum / u64::from(b)) as u32;
                let extra_one = (ctx_sum % u64::from(b)) as u32;
                // Each sequence holds `len` tokens and appends one.
                let lens: Vec<u32> = (0..b)
                    .map(|i| per.saturating_sub(1) + u32::from(i < extra_one))
                    .collect();
                let (tables, pages) = tables(&lens.iter().map(|l| l + 1).collect::<Vec<_>>());
                let seqs: Vec<DecodeSeq<'_>> = tables
                    .iter()
                    .zip(&lens)
                    .map(|(pages, &len)| DecodeSeq {
                        pages,
                        len,
                        token: len % 97,
                    })
                    .collect();
                self.with_kv(worker, pages, |kv| {
                    self.compute.decode(kv, &seqs).map(drop).map_err(err)
                })?;
                Ok(Vec::new())
            }
        }
    }

    fn fingerprint(&self, bytes: u64) -> Result<(), ExecError> {
        let grid = GridThw::new(1, 2, 2);
        let mut h = ImageHasher::new(&ModelFp([7; 32]), grid, &[bytes], Dtype::U8).map_err(err)?;
        let mut left = bytes;
        while left > 0 {
            let n = left.min(self.pixels.len() as u64) as usize;
            h.update(&self.pixels[..n]);
            left -= n as u64;
        }
        h.finish().map(drop).map_err(err)
    }
}

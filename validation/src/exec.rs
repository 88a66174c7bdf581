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
//! KV pages (with the engine's `kv_tables`, as every measured run has it): each job's
//! KV lives in pages of a host arena whose ids come from the core's block pool.
//! - A prefill worker keeps each job's KV in pages of its own [`PoolCore`] (allocated at
//!   the job's first chunk, grown by each further chunk). When the job's last chunk is
//!   done, its KV (`prompt * kv_bytes_per_token` bytes) is read out into the worker's
//!   outbox and the pages are released.
//! - The KV handoff moves exactly those bytes ([`Executor::kv_take`] on the sender's NIC,
//!   over TCP or the Transfer Engine, [`Executor::kv_give`] to the receiver's inbox); a
//!   colocated worker takes them from its own outbox.
//! - A decode worker's pages are the engine's decode pool: a sequence admitted into fresh
//!   pages gets the handed-off KV written into them (or recomputes its context after a
//!   preemption); fork branches share the parent's pages by id (the pool's refcounts) and
//!   the fork's tail copies are executed as real page copies. Each iteration computes
//!   the K/V of every sequence's token at position `len` over its own page table. The
//!   pool appends that token at the end of the iteration, allocating its page or copying
//!   a shared tail then; so a write into a page that does not exist yet or that another
//!   table holds goes to a scratch page (a copy of the shared tail: the copy-on-write)
//!   and lands in the sequence's own page at the start of the next iteration.
//!
//! Left out: the positions of a job's cached prefix (prefix KV loaded from the store)
//! hold whatever its fresh prefill pages held (the store's prefix blocks carry the
//! engine's pattern, not this model's K/V), and the slot of the first output token
//! (which the engine counts written when it admits the sequence) is never computed.
//!
//! Without page identities (the profile, a shape-only step), each worker computes over
//! its own scratch page region sized for the step, and a decode iteration of `batch`
//! sequences holding `ctx_sum` tokens runs `batch` sequences of `ctx_sum / batch` tokens
//! each.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use moonagent_core::fingerprint::{Dtype, GridThw, ImageHasher, ModelFp};
use moonagent_core::fork::{PoolConfig, PoolCore, SeqId};
use moonagent_core::serve::{DecodeSeqRef, EngineConfig, Extra, JobId, WorkerId};

use crate::backend::{ExecError, Executor, Step, StepKv};
use crate::compute::{text_token, Compute, DecodeSeq, ImageInput, KvPages, PrefillChunk, Rows};
use crate::warm::WarmKeeper;

/// Tokens per scratch KV page.
const PAGE_TOKENS: u32 = 16;

/// The engine's KV page geometry ([`Executor::prepare`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Geometry {
    page_tokens: u32,
    pool_pages: u32,
    /// Scratch pages after the pool's made at first (one per sequence of the largest
    /// decode batch admission allows; a batch that forks past it grows them).
    scratch: u32,
    bytes_per_token: u64,
    /// Steps name their jobs and pages (the engine's `kv_tables`).
    tables: bool,
}

/// A write of the last decode iteration waiting for its page (see the module doc).
#[derive(Debug, Clone, Copy)]
struct Staged {
    seq: (u32, u64),
    scratch: u32,
    pos: u64,
}

/// One worker's real KV: its decode pool's pages, its prefill pool and pages.
struct RealKv<K> {
    decode: Option<K>,
    prefill: Option<(PoolCore, K)>,
    prefilling: HashMap<JobId, SeqId>,
    staged: Vec<Staged>,
}

impl<K> Default for RealKv<K> {
    fn default() -> Self {
        Self {
            decode: None,
            prefill: None,
            prefilling: HashMap::new(),
            staged: Vec::new(),
        }
    }
}

/// Runs engine steps on `C`: per worker, the pages of its KV pools (and a scratch arena
/// for shape-only steps).
pub struct ComputeExecutor<C: Compute> {
    compute: Arc<C>,
    /// Keeps the weights in the host's caches while the workers idle
    /// ([`ComputeExecutor::keep_warm`]).
    keeper: Option<WarmKeeper>,
    /// Steps running now (the keeper touches only while none is).
    busy: Arc<AtomicU32>,
    kv: Vec<Mutex<Option<C::Kv>>>,
    real: Vec<Mutex<RealKv<C::Kv>>>,
    /// Finished prefills' KV by job, per worker (taken by the handoff or a local admission).
    outbox: Vec<Mutex<HashMap<JobId, Vec<u8>>>>,
    /// Handed-off KV by job, per worker.
    inbox: Vec<Mutex<HashMap<JobId, Vec<u8>>>>,
    geometry: Mutex<Option<Geometry>>,
    pixels: Vec<u8>,
}

impl<C: Compute> ComputeExecutor<C> {
    /// An executor for `workers` workers.
    pub fn new(compute: C, workers: u32) -> Self {
        let per = |_| Mutex::default();
        Self {
            compute: Arc::new(compute),
            keeper: None,
            busy: Arc::new(AtomicU32::new(0)),
            kv: (0..workers).map(|_| Mutex::new(None)).collect(),
            real: (0..workers)
                .map(|_| Mutex::new(RealKv::default()))
                .collect(),
            outbox: (0..workers).map(per).collect(),
            inbox: (0..workers).map(per).collect(),
            geometry: Mutex::new(None),
            pixels: (0..1u32 << 20)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
        }
    }

    /// Keep the weights in the host's caches while the workers idle: a [`WarmKeeper`]
    /// reading them every `interval` at idle priority, for as long as this executor
    /// lives. No effect for a backend whose weights are not in host memory
    /// ([`Compute::touch_weights`] reads nothing).
    pub fn keep_warm(mut self, interval: Duration) -> std::io::Result<Self>
    where
        C: 'static,
    {
        let c = self.compute.clone();
        let busy = self.busy.clone();
        self.keeper = WarmKeeper::start(
            move |go: &dyn Fn() -> bool| c.touch_weights(go),
            move || busy.load(Ordering::Relaxed) == 0,
            interval,
        )?;
        Ok(self)
    }

    /// Count a step as running until the guard drops.
    fn running(&self) -> Running<'_> {
        self.busy.fetch_add(1, Ordering::Relaxed);
        Running(&self.busy)
    }

    /// The keeper, when one runs ([`ComputeExecutor::keep_warm`]).
    pub fn keeper(&self) -> Option<&WarmKeeper> {
        self.keeper.as_ref()
    }

    /// The K/V bytes of the first `len` tokens of the sequence whose page table is `pages`
    /// in `worker`'s decode pool (what a test compares with an unpaged computation).
    pub fn decode_tokens(
        &self,
        worker: WorkerId,
        pages: &[u32],
        len: u32,
    ) -> Result<Vec<u8>, ExecError> {
        let real = lock(&self.real, worker)?;
        let kv = real
            .decode
            .as_ref()
            .ok_or_else(|| err(format!("worker {worker} has no decode pages")))?;
        kv.read_tokens(pages, len).map_err(err)
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

fn lock<T>(v: &[Mutex<T>], worker: WorkerId) -> Result<std::sync::MutexGuard<'_, T>, ExecError> {
    v.get(worker as usize)
        .ok_or_else(|| err(format!("no worker {worker}")))?
        .lock()
        .map_err(|_| err(format!("worker {worker}: KV state lock poisoned")))
}

/// The text seed of a job's prompt (its tokens are `text_token(seed, position)`).
fn job_seed(job: JobId) -> u64 {
    0x6a6f_6200_0000_0000 | u64::from(job)
}

/// The text seed of a job's decoded tokens.
fn decode_seed(job: JobId) -> u64 {
    0x6465_6300_0000_0000 | u64::from(job)
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
        let seeds: Vec<u64> = (0..chunks.len() as u64).map(|i| seed ^ i).collect();
        self.with_kv(worker, pages, |kv| {
            self.prefill_text(kv, chunks, &tables, &seeds)
        })
    }

    /// Prefill `chunks` `(new, cached)` of text (`seeds[i]` the text of chunk `i`) over
    /// their page `tables`.
    fn prefill_text(
        &self,
        kv: &mut C::Kv,
        chunks: &[(u32, u32)],
        tables: &[Vec<u32>],
        seeds: &[u64],
    ) -> Result<(), ExecError> {
        let inputs: Vec<[Rows<'_>; 1]> = chunks
            .iter()
            .zip(seeds)
            .map(|(&(count, _), &seed)| [Rows::Text { seed, count }])
            .collect();
        let batch: Vec<PrefillChunk<'_>> = chunks
            .iter()
            .zip(tables)
            .zip(&inputs)
            .map(|((&(_, cached), pages), inputs)| PrefillChunk {
                pages,
                cached,
                inputs,
            })
            .collect();
        self.compute.prefill(kv, &batch).map(drop).map_err(err)
    }
}

impl<C: Compute> ComputeExecutor<C> {
    fn geometry(&self) -> Result<Geometry, ExecError> {
        self.geometry
            .lock()
            .map_err(|_| err("geometry lock poisoned"))?
            .ok_or_else(|| err("a step with KV pages before prepare() gave the page geometry"))
    }

    /// A prefill whose chunks name their jobs: each job's KV in pages of this worker's
    /// prefill pool; a finished job's KV goes to the outbox.
    fn prefill_kv(
        &self,
        worker: WorkerId,
        chunks: &[(u32, u32)],
        jobs: &[(JobId, u32)],
    ) -> Result<(), ExecError> {
        if jobs.len() != chunks.len() {
            return Err(err(format!(
                "prefill of {} chunks names {} jobs",
                chunks.len(),
                jobs.len()
            )));
        }
        let g = self.geometry()?;
        let mut real = lock(&self.real, worker)?;
        let RealKv {
            prefill,
            prefilling,
            ..
        } = &mut *real;
        if prefill.is_none() {
            let pool = PoolCore::new(PoolConfig::new(
                g.pool_pages,
                g.page_tokens,
                g.bytes_per_token,
            ))
            .map_err(err)?;
            let kv = self
                .compute
                .new_kv(g.pool_pages, g.page_tokens)
                .map_err(err)?;
            *prefill = Some((pool, kv));
        }
        let Some((pool, kv)) = prefill.as_mut() else {
            return Err(err("no prefill pages"));
        };
        // The engine bounds a prefill step by its new tokens, not by the prefill worker's
        // pages: a batch of jobs with long cached prefixes (fork branches) can need more
        // than the decode pool's size, and how many share a step depends on timing. The
        // pool is this executor's, in host memory, so it grows (doubling) instead of
        // failing the run; the jobs mid-prefill move into the new pages, bytes unchanged.
        let pt = u64::from(g.page_tokens);
        let mut need = 0u64;
        for (&(new, cached), &(job, _)) in chunks.iter().zip(jobs) {
            let held = match prefilling.get(&job) {
                Some(&s) => pool.table(s).map_err(err)?.len() as u64,
                None => 0,
            };
            need += (u64::from(cached) + u64::from(new))
                .div_ceil(pt)
                .saturating_sub(held);
        }
        let st = pool.stats();
        if need > u64::from(st.free) {
            let want = (u64::from(st.used) + need).max(2 * u64::from(st.capacity));
            let pages = u32::try_from(want)
                .map_err(|_| err(format!("worker {worker}: prefill KV of {want} pages")))?;
            let mut grown = PoolCore::new(PoolConfig::new(pages, g.page_tokens, g.bytes_per_token))
                .map_err(err)?;
            let mut grown_kv = self.compute.new_kv(pages, g.page_tokens).map_err(err)?;
            for s in prefilling.values_mut() {
                let len = pool.seq_len(*s).map_err(err)?;
                let tokens =
                    u32::try_from(len).map_err(|_| err(format!("a prefill of {len} tokens")))?;
                let bytes = kv
                    .read_tokens(pool.table(*s).map_err(err)?, tokens)
                    .map_err(err)?;
                let ns = grown.allocate(len).map_err(err)?;
                grown_kv
                    .write_tokens(grown.table(ns).map_err(err)?, &bytes)
                    .map_err(err)?;
                *s = ns;
            }
            *pool = grown;
            *kv = grown_kv;
        }
        let cap = pool.stats().capacity;
        let full = |e| {
            err(format!(
                "worker {worker}: prefill KV pool ({cap} pages): {e}"
            ))
        };
        let mut seqs = Vec::with_capacity(chunks.len());
        for (&(new, cached), &(job, _)) in chunks.iter().zip(jobs) {
            let seq = match prefilling.get(&job) {
                Some(&s) => {
                    let have = pool.seq_len(s).map_err(err)?;
                    if have != u64::from(cached) {
                        return Err(err(format!(
                            "job {job}: a chunk over {cached} cached tokens, but {have} are in its pages"
                        )));
                    }
                    pool.append(s, u64::from(new)).map_err(full)?;
                    s
                }
                None => {
                    let s = pool
                        .allocate(u64::from(cached) + u64::from(new))
                        .map_err(full)?;
                    prefilling.insert(job, s);
                    s
                }
            };
            seqs.push(seq);
        }
        let tables: Vec<Vec<u32>> = seqs
            .iter()
            .map(|&s| pool.table(s).map(<[u32]>::to_vec))
            .collect::<Result<_, _>>()
            .map_err(err)?;
        let seeds: Vec<u64> = jobs.iter().map(|&(job, _)| job_seed(job)).collect();
        self.prefill_text(kv, chunks, &tables, &seeds)?;
        // Finished prefills: their KV is the handoff's payload; the pages go back.
        for ((&(new, cached), &(job, prompt)), (seq, table)) in
            chunks.iter().zip(jobs).zip(seqs.iter().zip(&tables))
        {
            if u64::from(new) + u64::from(cached) < u64::from(prompt) {
                continue;
            }
            let bytes = kv.read_tokens(table, prompt).map_err(err)?;
            pool.release(*seq).map_err(err)?;
            prefilling.remove(&job);
            lock(&self.outbox, worker)?.insert(job, bytes);
        }
        Ok(())
    }

    /// A decode iteration over the sequences' own pages (see the module doc).
    fn decode_kv(
        &self,
        worker: WorkerId,
        extra: &[Extra],
        seqs: &[DecodeSeqRef],
        copies: &[(u32, u32)],
    ) -> Result<(), ExecError> {
        let g = self.geometry()?;
        let pt = u64::from(g.page_tokens);
        let mut real = lock(&self.real, worker)?;
        let RealKv { decode, staged, .. } = &mut *real;
        if decode.is_none() {
            *decode = Some(
                self.compute
                    .new_kv(g.pool_pages + g.scratch, g.page_tokens)
                    .map_err(err)?,
            );
        }
        let Some(kv) = decode.as_mut() else {
            return Err(err("no decode pages"));
        };
        // One scratch page per sequence of the batch. Admission stops at the engine's
        // `decode_max_batch` (the scratch pages made at first), but a fork admits its
        // branches past it (INVARIANTS E16), so the scratch grows with the batch.
        let need = u32::try_from(seqs.len())
            .ok()
            .and_then(|n| g.pool_pages.checked_add(n))
            .ok_or_else(|| err(format!("a decode batch of {} sequences", seqs.len())))?;
        kv.grow(need).map_err(err)?;
        let copy = |kv: &mut C::Kv, src: u32, dst: u32| {
            self.compute.copy_pages(kv, &[src], &[dst]).map_err(err)
        };
        // 1. Last iteration's writes that waited for the pool's pages (a sequence that
        //    left the batch since, finished or preempted, keeps nothing).
        for st in staged.drain(..) {
            if let Some(s) = seqs.iter().find(|s| s.seq == st.seq) {
                let dst = *s.pages.get((st.pos / pt) as usize).ok_or_else(|| {
                    err(format!(
                        "job {}: the pool gave no page for position {}",
                        s.job, st.pos
                    ))
                })?;
                copy(kv, st.scratch, dst)?;
            }
        }
        // 2. The fork tail copies decided since, in order.
        let (src, dst): (Vec<u32>, Vec<u32>) = copies.iter().copied().unzip();
        self.compute.copy_pages(kv, &src, &dst).map_err(err)?;
        // 3. Sequences admitted into fresh pages: recompute a preempted context, or write
        //    the KV the prefill produced.
        let find = |job: JobId| {
            seqs.iter()
                .find(|s| s.job == job && s.admitted)
                .ok_or_else(|| err(format!("job {job}: recomputed but not admitted")))
        };
        let mut recomputed = Vec::new();
        for x in extra {
            if let Extra::Recompute { tokens, job } = *x {
                let s = find(job)?;
                let pages = std::slice::from_ref(&s.pages);
                self.prefill_text(kv, &[(tokens, 0)], pages, &[job_seed(job)])?;
                recomputed.push(job);
            }
        }
        for s in seqs
            .iter()
            .filter(|s| s.admitted && !recomputed.contains(&s.job))
        {
            let handed = lock(&self.inbox, worker)?.remove(&s.job);
            let bytes = match handed {
                Some(b) => Some(b),
                None => lock(&self.outbox, worker)?.remove(&s.job),
            }
            .ok_or_else(|| {
                    err(format!(
                        "job {} admitted to decode on worker {worker} with no KV (neither handed off nor prefilled here)",
                        s.job
                    ))
                })?;
            if bytes.len() as u64 > s.len * g.bytes_per_token {
                return Err(err(format!(
                    "job {}: {} bytes of KV for a {}-token context",
                    s.job,
                    bytes.len(),
                    s.len
                )));
            }
            kv.write_tokens(&s.pages, &bytes).map_err(err)?;
        }
        // 4. The iteration: position `len` of each sequence, in its page or a scratch page.
        let vocab = self.compute.spec().llm.vocab_size;
        // A sequence writing into its own page reads its table in place; one staging its
        // write gets a copy ending in its scratch page.
        let mut tables: Vec<Cow<'_, [u32]>> = Vec::with_capacity(seqs.len());
        for (i, s) in seqs.iter().enumerate() {
            let at = (s.len / pt) as usize;
            if at < s.pages.len() && !s.shared_tail {
                tables.push(Cow::Borrowed(&s.pages[..=at]));
                continue;
            }
            let scratch = g.pool_pages + i as u32;
            if let Some(&shared) = s.pages.get(at) {
                // Copy-on-write: the sequence's own copy of the tail it shares.
                copy(kv, shared, scratch)?;
            }
            let mut t = s.pages[..at.min(s.pages.len())].to_vec();
            t.push(scratch);
            tables.push(Cow::Owned(t));
            if s.appends {
                staged.push(Staged {
                    seq: s.seq,
                    scratch,
                    pos: s.len,
                });
            }
        }
        let batch: Vec<DecodeSeq<'_>> = seqs
            .iter()
            .zip(&tables)
            .map(|(s, pages)| {
                let len = u32::try_from(s.len)
                    .map_err(|_| err(format!("job {}: context of {} tokens", s.job, s.len)))?;
                Ok(DecodeSeq {
                    pages,
                    len,
                    token: text_token(decode_seed(s.job), s.len, vocab),
                })
            })
            .collect::<Result<_, ExecError>>()?;
        self.compute.decode(kv, &batch).map(drop).map_err(err)
    }
}

/// A step running on a [`ComputeExecutor`] ([`ComputeExecutor::running`]).
struct Running<'a>(&'a AtomicU32);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<C: Compute> Executor for ComputeExecutor<C> {
    fn encoder_outputs(&self) -> bool {
        true
    }

    fn prepare(&self, cfg: &EngineConfig) -> Result<(), ExecError> {
        let per = self.compute.spec().kv_bytes_per_token();
        if cfg.kv_bytes_per_token != per {
            return Err(err(format!(
                "the engine's KV is {} bytes per token, the model's {per}",
                cfg.kv_bytes_per_token
            )));
        }
        let g = Geometry {
            page_tokens: cfg.kv_block_tokens,
            pool_pages: cfg.kv_pages,
            scratch: cfg.decode_max_batch,
            bytes_per_token: per,
            tables: cfg.kv_tables,
        };
        g.pool_pages
            .checked_add(g.scratch)
            .ok_or_else(|| err("KV pages overflow u32"))?;
        let mut geo = self
            .geometry
            .lock()
            .map_err(|_| err("geometry lock poisoned"))?;
        // A new run starts from empty pools (the pages of a same-shaped arena are reused).
        for w in 0..self.real.len() as WorkerId {
            let mut r = lock(&self.real, w)?;
            if *geo != Some(g) {
                *r = RealKv::default();
            }
            r.prefilling.clear();
            r.staged.clear();
            if let Some((pool, _)) = r.prefill.as_mut() {
                *pool = PoolCore::new(PoolConfig::new(g.pool_pages, g.page_tokens, per))
                    .map_err(err)?;
            }
            lock(&self.outbox, w)?.clear();
            lock(&self.inbox, w)?.clear();
        }
        *geo = Some(g);
        Ok(())
    }

    fn shared_cores(&self) -> Option<f64> {
        self.compute.shared_cores()
    }

    fn run_kv(
        &self,
        worker: WorkerId,
        step: &Step,
        kv: &StepKv,
    ) -> Result<Vec<Vec<u8>>, ExecError> {
        let _running = self.running();
        match (step, kv) {
            // A prefill always names its jobs; its KV is kept only when decodes will name
            // their pages to take it (the engine's `kv_tables`), else nothing would take it.
            (Step::Prefill(chunks), StepKv::Prefill(jobs)) if self.geometry()?.tables => {
                self.prefill_kv(worker, chunks, jobs).map(|()| Vec::new())
            }
            (Step::Decode { extra, .. }, StepKv::Decode { seqs, copies }) => self
                .decode_kv(worker, extra, seqs, copies)
                .map(|()| Vec::new()),
            (_, StepKv::None) | (Step::Prefill(_), StepKv::Prefill(_)) => self.run(worker, step),
            _ => Err(err("a step's KV identities do not match its kind")),
        }
    }

    fn kv_take(&self, worker: WorkerId, job: JobId) -> Result<Option<Vec<u8>>, ExecError> {
        let bytes = lock(&self.outbox, worker)?.remove(&job);
        if bytes.is_none() && self.geometry()?.tables {
            return Err(err(format!(
                "worker {worker} holds no finished prefill of job {job}"
            )));
        }
        Ok(bytes)
    }

    fn kv_give(&self, worker: WorkerId, job: JobId, bytes: Vec<u8>) -> Result<(), ExecError> {
        lock(&self.inbox, worker)?.insert(job, bytes);
        Ok(())
    }

    fn run(&self, worker: WorkerId, step: &Step) -> Result<Vec<Vec<u8>>, ExecError> {
        let _running = self.running();
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
                        Extra::Recompute { tokens, .. } => {
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

#[cfg(test)]
mod tests {
    use moonagent_core::fork::TailPolicy;
    use moonagent_core::serve::toy::toy_config;
    use moonagent_core::serve::{Mode, Payloads};
    use moonagent_models::ModelSpec;

    use super::*;
    use crate::compute::{CpuCompute, KvArena};

    const PT: u32 = 4;

    fn spec() -> ModelSpec {
        ModelSpec::resolve("qwen2.5-vl-tiny").unwrap()
    }

    fn cfg(spec: &ModelSpec) -> EngineConfig {
        EngineConfig {
            kv_block_tokens: PT,
            kv_pages: 64,
            decode_max_batch: 4,
            kv_bytes_per_token: spec.kv_bytes_per_token(),
            kv_tables: true,
            ..toy_config(Mode::B3, Payloads::Bytes)
        }
    }

    /// The same computation without pages shared, staged or handed off: each sequence
    /// in its own contiguous pages of one arena.
    struct Reference {
        compute: CpuCompute,
        kv: KvArena,
    }

    impl Reference {
        fn table(slot: u32) -> Vec<u32> {
            (slot * 16..slot * 16 + 16).collect()
        }
        fn prefill(&mut self, slot: u32, job: JobId, chunks: &[(u32, u32)]) {
            let t = Self::table(slot);
            for &(new, cached) in chunks {
                let inputs = [Rows::Text {
                    seed: job_seed(job),
                    count: new,
                }];
                let c = PrefillChunk {
                    pages: &t,
                    cached,
                    inputs: &inputs,
                };
                self.compute.prefill(&mut self.kv, &[c]).unwrap();
            }
        }
        /// One batched iteration: `(slot, job, len)` per sequence.
        fn decode(&mut self, seqs: &[(u32, JobId, u64)]) {
            let vocab = self.compute.spec().llm.vocab_size;
            let tables: Vec<Vec<u32>> = seqs.iter().map(|s| Self::table(s.0)).collect();
            let batch: Vec<DecodeSeq<'_>> = seqs
                .iter()
                .zip(&tables)
                .map(|(&(_, job, len), pages)| DecodeSeq {
                    pages,
                    len: len as u32,
                    token: text_token(decode_seed(job), len, vocab),
                })
                .collect();
            self.compute.decode(&mut self.kv, &batch).unwrap();
        }
        fn tokens(&self, slot: u32, len: u64) -> Vec<u8> {
            self.kv.read_tokens(&Self::table(slot), len as u32).unwrap()
        }
    }

    /// One engine-shaped decode iteration on worker 1 over `seqs` `(job, seq, appends,
    /// admitted)`, then the pool's appends (one token per appending sequence, in order,
    /// as the engine's batch does at the iteration's end).
    fn iterate(
        ex: &ComputeExecutor<CpuCompute>,
        pool: &mut PoolCore,
        seqs: &[(JobId, SeqId, bool)],
        copies: &[(u32, u32)],
    ) {
        let refs: Vec<DecodeSeqRef> = seqs
            .iter()
            .map(|&(job, seq, admitted)| {
                let pages = pool.table(seq).unwrap().to_vec();
                let len = pool.seq_len(seq).unwrap();
                let shared_tail = pages
                    .get((len / u64::from(PT)) as usize)
                    .is_some_and(|&p| pool.refcount(p).unwrap() > 1);
                DecodeSeqRef {
                    job,
                    seq: (seq.index(), seq.generation()),
                    pages,
                    len,
                    shared_tail,
                    appends: true,
                    admitted,
                }
            })
            .collect();
        let step = Step::Decode {
            batch: seqs.len() as u32,
            ctx_sum: refs.iter().map(|r| r.len).sum(),
            extra: Vec::new(),
        };
        let kv = StepKv::Decode {
            seqs: refs,
            copies: copies.to_vec(),
        };
        ex.run_kv(1, &step, &kv).unwrap();
        for &(_, seq, _) in seqs {
            pool.append(seq, 1).unwrap();
        }
    }

    /// The keeper only reads (INVARIANTS V4): with it running, an encoder batch's outputs
    /// and a prefill's KV are the same bytes as without it.
    #[test]
    fn keeping_the_weights_warm_changes_no_byte() {
        let spec = spec();
        let run = |warm: bool| {
            let mut ex = ComputeExecutor::new(CpuCompute::new(&spec, 3).unwrap(), 1);
            if warm {
                ex = ex.keep_warm(Duration::from_millis(1)).unwrap();
                let k = ex.keeper().expect("the CPU model has weights to keep warm");
                assert!(k.bytes() > 1 << 20, "{} bytes a pass", k.bytes());
            }
            ex.prepare(&cfg(&spec)).unwrap();
            let encode = Step::Encode {
                tokens: vec![64, 16],
                contents: vec![1, 2],
            };
            let outputs = ex.run(0, &encode).unwrap();
            let kv = StepKv::Prefill(vec![(1, 10)]);
            ex.run_kv(0, &Step::Prefill(vec![(10, 0)]), &kv).unwrap();
            let bytes = ex.kv_take(0, 1).unwrap().expect("a finished prefill's KV");
            (outputs, bytes)
        };
        let warm = run(true);
        assert_eq!(warm.0.len(), 2, "one output per image");
        assert!(warm.0.iter().all(|o| !o.is_empty()));
        assert_eq!(run(false), warm);
    }

    /// The keeper reads only while no step runs: with a step's guard held its passes stop,
    /// once the guard drops they go on.
    #[test]
    fn the_keeper_waits_while_a_step_runs() {
        let spec = spec();
        let ex = ComputeExecutor::new(CpuCompute::new(&spec, 3).unwrap(), 1)
            .keep_warm(Duration::from_millis(1))
            .unwrap();
        let passes = || ex.keeper().unwrap().passes();
        let wait_for = |n: u64| {
            let t0 = std::time::Instant::now();
            while passes() < n && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(1));
            }
            passes()
        };
        assert!(wait_for(3) >= 3, "passes while idle");
        let running = ex.running();
        // A pass under way when the step started stops at its next piece.
        std::thread::sleep(Duration::from_millis(50));
        let during = passes();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(passes(), during, "a pass began while a step ran");
        drop(running);
        assert!(wait_for(during + 2) >= during + 2, "no pass after the step");
    }

    /// A prefill step needing more pages than the pool has (a job mid-prefill plus a new
    /// one, 14 pages against 8): the pool grows, the job mid-prefill moves to the new
    /// pages, and both jobs' KV is byte for byte what a pool large enough from the start
    /// gives.
    #[test]
    fn a_prefill_step_larger_than_the_pool_grows_it_and_keeps_every_byte() {
        let spec = spec();
        let run = |pages: u32| {
            let ex = ComputeExecutor::new(CpuCompute::new(&spec, 3).unwrap(), 1);
            ex.prepare(&EngineConfig {
                kv_pages: pages,
                ..cfg(&spec)
            })
            .unwrap();
            // Job 1 (40 tokens) prefills 24, then its last 16 beside all 40 of job 2.
            let one = StepKv::Prefill(vec![(1, 40)]);
            ex.run_kv(0, &Step::Prefill(vec![(24, 0)]), &one).unwrap();
            let both = StepKv::Prefill(vec![(1, 40), (2, 40)]);
            ex.run_kv(0, &Step::Prefill(vec![(16, 24), (40, 0)]), &both)
                .unwrap();
            let kv1 = ex.kv_take(0, 1).unwrap().expect("job 1's KV");
            let kv2 = ex.kv_take(0, 2).unwrap().expect("job 2's KV");
            (kv1, kv2)
        };
        let (small, large) = (run(8), run(64));
        assert_eq!(small.0.len() as u64, 40 * spec.kv_bytes_per_token());
        assert!(small.0 != small.1, "two jobs' KV differ");
        assert_eq!(small, large);
    }

    /// A fork admits its branches past `decode_max_batch` (INVARIANTS E16): a decode
    /// iteration of 6 sequences, each writing into its own copy of the shared tail, with
    /// scratch pages made for 4, grows the scratch and leaves every branch's KV byte for
    /// byte what it is without paging or sharing.
    #[test]
    fn a_batch_forked_past_the_largest_decode_batch_gets_scratch_pages_for_all() {
        let spec = spec();
        let ex = ComputeExecutor::new(CpuCompute::new(&spec, 3).unwrap(), 2);
        let c = cfg(&spec);
        assert_eq!(c.decode_max_batch, 4);
        ex.prepare(&c).unwrap();
        let mut r = Reference {
            compute: CpuCompute::new(&spec, 3).unwrap(),
            kv: KvArena::new(&spec, 96, PT).unwrap(),
        };
        let kv = StepKv::Prefill(vec![(1, 10)]);
        ex.run_kv(0, &Step::Prefill(vec![(10, 0)]), &kv).unwrap();
        r.prefill(0, 1, &[(10, 0)]);
        let bytes = ex.kv_take(0, 1).unwrap().expect("a finished prefill's KV");
        ex.kv_give(1, 1, bytes).unwrap();
        let mut pool = PoolCore::new(
            PoolConfig::new(c.kv_pages, PT, c.kv_bytes_per_token)
                .with_tail(TailPolicy::CopyOnWrite),
        )
        .unwrap();
        let a = pool.allocate(11).unwrap();
        iterate(&ex, &mut pool, &[(1, a, true)], &[]);
        r.decode(&[(0, 1, 11)]);
        // Fork at 12 tokens into 6 branches (jobs 2..=7), the tail shared by all.
        let f = pool.fork(a, 6).unwrap();
        assert!(
            f.copies.is_empty(),
            "copy on write copies nothing at the fork"
        );
        for slot in 1..6 {
            for p in 0..16 {
                r.kv.copy_page(p, slot * 16 + p).unwrap();
            }
        }
        let seqs: Vec<(JobId, SeqId, bool)> = f
            .branches
            .iter()
            .enumerate()
            .map(|(i, &b)| (2 + i as JobId, b, false))
            .collect();
        for len in 12..15u64 {
            iterate(&ex, &mut pool, &seqs, &[]);
            let refs: Vec<(u32, JobId, u64)> =
                (0..6).map(|i| (i as u32, 2 + i as JobId, len)).collect();
            r.decode(&refs);
        }
        let len = pool.seq_len(a).unwrap() - 1;
        for (i, &(_, seq, _)) in seqs.iter().enumerate() {
            let table = pool.table(seq).unwrap().to_vec();
            let got = ex.decode_tokens(1, &table, len as u32).unwrap();
            assert_eq!(got, r.tokens(i as u32, len), "branch {i}");
        }
    }

    /// A job prefilled in two chunks on worker 0, handed off to worker 1, decoded, forked
    /// into two branches that decode different tokens: each branch's KV, read through its
    /// page table, is byte for byte the KV of the same tokens computed without paging,
    /// sharing or handoff, under both tail policies (copy at fork: the fork's copies
    /// executed; copy on write: the shared tail staged and copied).
    #[test]
    fn forked_branches_read_exactly_the_kv_of_their_own_tokens() {
        for tail in [TailPolicy::CopyAtFork, TailPolicy::CopyOnWrite] {
            let spec = spec();
            let ex = ComputeExecutor::new(CpuCompute::new(&spec, 3).unwrap(), 2);
            let c = cfg(&spec);
            ex.prepare(&c).unwrap();
            let mut r = Reference {
                compute: CpuCompute::new(&spec, 3).unwrap(),
                kv: KvArena::new(&spec, 48, PT).unwrap(),
            };
            // Prefill of job 1: a 10-token prompt in chunks of 6 and 4.
            let chunks = [(6u32, 0u32), (4, 6)];
            for &ch in &chunks {
                let kv = StepKv::Prefill(vec![(1, 10)]);
                ex.run_kv(0, &Step::Prefill(vec![ch]), &kv).unwrap();
            }
            r.prefill(0, 1, &chunks);
            let bytes = ex.kv_take(0, 1).unwrap().expect("a finished prefill's KV");
            assert_eq!(bytes.len() as u64, 10 * spec.kv_bytes_per_token());
            assert_eq!(bytes, r.tokens(0, 10), "{tail:?}: the handoff's payload");
            ex.kv_give(1, 1, bytes).unwrap();

            let mut pool = PoolCore::new(
                PoolConfig::new(c.kv_pages, PT, c.kv_bytes_per_token).with_tail(tail),
            )
            .unwrap();
            // Admitted with prompt + 1 tokens, as the engine admits.
            let a = pool.allocate(11).unwrap();
            iterate(&ex, &mut pool, &[(1, a, true)], &[]);
            for len in 11..14 {
                if len > 11 {
                    iterate(&ex, &mut pool, &[(1, a, false)], &[]);
                }
                r.decode(&[(0, 1, len)]);
            }
            // Fork at 14 tokens (a partial tail of 2): branch 0 is `a` (job 2), `b` job 3.
            let f = pool.fork(a, 2).unwrap();
            let b = f.branches[1];
            let copies: Vec<(u32, u32)> = f.copies.iter().map(|c| (c.src, c.dst)).collect();
            assert_eq!(copies.is_empty(), tail == TailPolicy::CopyOnWrite);
            r.kv.copy_page(0, 16).unwrap();
            for p in 1..16 {
                r.kv.copy_page(p, 16 + p).unwrap();
            }
            for (k, len) in (14..21u64).enumerate() {
                let cp = if k == 0 { copies.as_slice() } else { &[] };
                iterate(&ex, &mut pool, &[(2, a, false), (3, b, false)], cp);
                r.decode(&[(0, 2, len), (1, 3, len)]);
            }
            // Every position written and flushed: all but the last iteration's.
            let len = pool.seq_len(a).unwrap() - 1;
            for (seq, slot) in [(a, 0), (b, 1)] {
                let table = pool.table(seq).unwrap().to_vec();
                let got = ex.decode_tokens(1, &table, len as u32).unwrap();
                assert_eq!(got, r.tokens(slot, len), "{tail:?}: branch {slot}");
            }
            assert_ne!(
                r.tokens(0, len),
                r.tokens(1, len),
                "the branches decoded different tokens"
            );
        }
    }
}

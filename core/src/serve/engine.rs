//! [`Engine`]: the request path's state machine (see the module docs of `serve`).

use std::collections::VecDeque;

use crate::fingerprint::{Dtype, ImageFp, ImageHasher, ModelParts};
use crate::fork::{
    fork_request, AdmissionInput, BranchState, PoolConfig, PoolCore, PoolStats, SeqId,
};
use crate::mm_cache::{CacheConfig, CommitOutcome, Lookup, MmCache, ModelCtx};
use crate::store::{DataType, Payload, ReplicateConfig, Store, StoreError, StoreKey, StoreResult};

use super::decode::{DecodeBatch, Leaving, StepOutcome};
use super::kv_prefix::{self, BlockStore};
use super::memo::Memo;
use super::record::{RequestRecord, NONE};
use super::request::{image_iter, Img, RequestView};
use super::{
    Action, DecodeSeqRef, Done, EncoderOutputs, EngineConfig, Extra, Flow, ImageRef, JobId,
    Payloads, Pricing, Role, ServeError, WorkerId,
};

type Nanos = u64;

/// An image of a job, with its content-addressed fingerprint once its lookup computed it
/// (cache modes; its commit reuses it instead of hashing the image again).
#[derive(Debug, Clone, Copy)]
struct JobImg {
    img: Img,
    fp: Option<ImageFp>,
}

/// A request's images as a job holds them (one allocation, at their count).
fn job_images<R: RequestView + ?Sized>(r: &R) -> Vec<JobImg> {
    image_iter(r).map(|img| JobImg { img, fp: None }).collect()
}

#[derive(Debug, Clone)]
struct JobState {
    top: u32,
    trace_idx: u32,
    branch: Option<u32>,
    prompt: u32,
    decode_left: u32,
    images: Vec<JobImg>,
    pending_images: u32,
    load_bytes: u64,
    cached_prefix: u32,
    prefill_done: u32,
    prefill_worker: WorkerId,
    decode_worker: WorkerId,
    seq: Option<SeqId>,
    fork_after: bool,
    preempted: bool,
    kv_missing: Vec<u64>,
    /// Priced work this job brings to its worker before it is queued there (load
    /// signal; 0 when not smart scheduling).
    incoming_ns: u64,
    /// Priced remaining prefill while queued (load signal).
    queued_ns: u64,
    /// Store objects this job reads over time (its embeddings and prefix KV blocks, from
    /// the lookup until they are loaded): held open with `begin_read` so no eviction takes
    /// them meanwhile (INVARIANTS S2/E12), closed by `end_read` when the load completes.
    held: Vec<StoreKey>,
}

#[derive(Debug)]
enum Inflight {
    Idle,
    Encode(Vec<(JobId, u32)>),
    Prefill(Vec<(JobId, u32)>),
    Decode,
}

struct Worker {
    enc: bool,
    pre: bool,
    dec: bool,
    inflight: Inflight,
    enc_q: VecDeque<(JobId, u32)>,
    pre_q: VecDeque<JobId>,
    dec_wait: VecDeque<JobId>,
    batch: DecodeBatch,
    pool: Option<PoolCore>,
    extra: Vec<Extra>,
    /// Fork tail copies `(src, dst)` for the next decode iteration (with `kv_tables`).
    copies: Vec<(u32, u32)>,
    /// Sequences admitted into fresh pages since the last decode iteration (with
    /// `kv_tables`).
    admitted: Vec<SeqId>,
    /// The load signal's parts (maintained under smart scheduling only).
    load: WorkerLoad,
}

/// What three-point scheduling knows of a worker, in predicted nanoseconds of work (see
/// [`Engine::load_ns`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerLoad {
    /// Predicted end of the batch in flight.
    pub busy_until: u64,
    /// Priced encoder queue (each image alone).
    pub encode_queued_ns: u64,
    /// Priced remaining prefill of the queued jobs.
    pub prefill_queued_ns: u64,
    /// Priced work assigned here and still in transit (loads, KV transfers, the
    /// prefill of jobs still loading).
    pub incoming_ns: u64,
    /// Sequences waiting for or moving to this decode worker, and their context tokens.
    pub decode_pending: (u32, u64),
}

/// A top-level request's record and whether it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Its record.
    pub rec: RequestRecord,
    /// Every branch finished.
    pub done: bool,
    branches_left: u32,
}

/// Counts of what the engine decided, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Image references (duplicates inside a request included).
    pub image_refs: u64,
    /// Images served by the embedding cache.
    pub images_hit: u64,
    /// Images encoded.
    pub images_encoded: u64,
    /// Images de-duplicated inside requests.
    pub images_dedup: u64,
    /// Prefix KV blocks looked up.
    pub kv_lookups: u64,
    /// Prefix KV blocks served (leading runs).
    pub kv_hits: u64,
    /// Forks executed.
    pub forks: u64,
    /// Forks refused by admission (branches fell back to independent prefill).
    pub forks_refused: u64,
    /// Pages shared by forks.
    pub fork_pages_shared: u64,
    /// Tail bytes copied by forks and copy-on-write.
    pub fork_copy_bytes: u64,
    /// Per-branch states cloned by forks.
    pub fork_state_clones: u64,
    /// Bytes those clones copied.
    pub fork_state_bytes: u64,
    /// Prefill tokens avoided by forking.
    pub fork_prefill_tokens_avoided: u64,
    /// Decode preemptions.
    pub preemptions: u64,
    /// Bytes encoder -> store, store -> prefill, prefill -> decode.
    pub link_bytes: [u64; 3],
    /// Store reads held open across a load (embeddings and prefix KV blocks).
    pub reads_held: u64,
    /// Held reads the store could not open (the object was gone or the store refused):
    /// the load goes ahead on the lease alone (fail-open).
    pub reads_unheld: u64,
    /// Commits left out because another load was reading the same embedding (same
    /// fingerprint, same bytes) at that moment.
    pub commits_held: u64,
}

/// The serving engine over a trace of `R` and a store `S` (see the module docs).
pub struct Engine<'a, S: Store, R: RequestView> {
    cfg: EngineConfig,
    trace: &'a [R],
    workers: Vec<Worker>,
    encoders: Vec<WorkerId>,
    prefills: Vec<WorkerId>,
    decodes: Vec<WorkerId>,
    rr: [usize; 3],
    jobs: Vec<JobState>,
    tops: Vec<Served>,
    cache: MmCache<S>,
    ctxs: Vec<ModelCtx>,
    counters: Counters,
    /// The decode step's outcome buffers, reused.
    step_out: StepOutcome,
    fp_memo: FpMemo,
    /// Decided actions in order; reversed while the driver drains them (so a poll is a
    /// `pop`), put back in order before the next input.
    actions: Vec<Action>,
    draining: bool,
    blocks_missing: Vec<usize>,
    recv: Vec<u8>,
    pricing: Option<Box<dyn Pricing + 'a>>,
    outputs: Option<Box<dyn EncoderOutputs + 'a>>,
    /// Open reads per key across all jobs ([`JobState::held`]).
    holding: rustc_hash::FxHashMap<StoreKey, u32>,
    /// Encoders to start after a dispatch (scratch, reused).
    to_kick: Vec<WorkerId>,
    /// Image hashers with the header of (model, grid) already absorbed (see [`image_fp`]).
    fp_starts: FpStarts,
}

/// Image fingerprints by (model, content, grid) for content-addressed keys, the last of
/// each slot kept ([`Memo`]: bounded, so a long trace does not grow it).
type FpMemo = Memo<([u8; 32], u64, u64, u64, u64), ImageFp>;

/// Slots of [`FpMemo`] (2^12 = 4,096: ~400 KiB, within a core's L2 next to the store's
/// hot lines).
const FP_MEMO_BITS: u32 = 12;

/// Started image hashers by (model, grid): the header every fingerprint of that model and
/// grid begins with, hashed once and cloned per image.
type FpStarts = rustc_hash::FxHashMap<([u8; 32], u64, u64, u64), ImageHasher>;

/// Entries [`FpStarts`] keeps before it starts afresh (one per model and grid in use).
const FP_STARTS_CAP: usize = 4096;

/// The fingerprint of `img` under `ctx`, salted by `scope` for request-scoped keys (B1).
/// A pure function of its inputs: content-addressed ones are memoised so the engine pays
/// BLAKE2b once per distinct image, not once per reference (scoped ones never repeat, so
/// they are not kept).
fn image_fp(
    memo: &mut FpMemo,
    starts: &mut FpStarts,
    ctx: &ModelCtx,
    img: &Img,
    scope: Option<u64>,
) -> Result<ImageFp, ServeError> {
    let key = (ctx.fp().0, img.content, img.grid.t, img.grid.h, img.grid.w);
    if scope.is_none() {
        if let Some(fp) = memo.get(&key) {
            return Ok(*fp);
        }
    }
    // The same bytes as `ImageHasher::new` then the two updates: the started state is a
    // pure function of (model, grid).
    let start = (ctx.fp().0, img.grid.t, img.grid.h, img.grid.w);
    let mut h = match starts.get(&start) {
        Some(h) => h.clone(),
        None => {
            let h = ImageHasher::new(&ctx.fp(), img.grid, &[16], Dtype::U8)
                .map_err(|e| ServeError::Cache("image fingerprint", e.into()))?;
            if starts.len() >= FP_STARTS_CAP {
                starts.clear();
            }
            starts.insert(start, h.clone());
            h
        }
    };
    h.update(&img.content.to_le_bytes());
    h.update(&scope.unwrap_or(u64::MAX).to_le_bytes());
    let fp = h
        .finish()
        .map_err(|e| ServeError::Cache("image fingerprint", e.into()))?;
    if scope.is_none() {
        memo.insert(key, fp);
    }
    Ok(fp)
}

/// A deterministic stand-in embedding for `fp` ([`Payloads::Bytes`]): what an encoder
/// would write, until a real one reports its output.
fn synthetic_bytes(seed: &[u8], len: u64) -> Vec<u8> {
    let mut s = seed.iter().fold(0x9E37_79B9_7F4A_7C15u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
    });
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// Prefix KV blocks of one request under `kv:<block id>` keys.
struct KvBlocks<'s, S: Store> {
    store: &'s mut S,
    now: Nanos,
    ids: &'s [u64],
    block_bytes: u64,
    payloads: Payloads,
}

impl<S: Store> BlockStore for KvBlocks<'_, S> {
    fn block_exists(&mut self, i: usize) -> StoreResult<bool> {
        self.store.exists_key(self.now, &StoreKey::Kv(self.ids[i]))
    }
    #[inline]
    fn block_prefetch(&self, i: usize, put: bool, ahead: usize) {
        kv_prefix::prefetch_kv_block(&*self.store, self.ids, i, put, ahead);
    }
    fn block_put(&mut self, i: usize) -> StoreResult<()> {
        let payload = match self.payloads {
            Payloads::SizeOnly => Payload::SizeOnly(self.block_bytes),
            Payloads::Bytes => Payload::Bytes(synthetic_bytes(
                &self.ids[i].to_le_bytes(),
                self.block_bytes,
            )),
        };
        self.store.put_key(
            self.now,
            &StoreKey::Kv(self.ids[i]),
            payload,
            &ReplicateConfig::of(DataType::KvCache),
        )
    }
}

impl<'a, S: Store, R: RequestView> Engine<'a, S, R> {
    /// A cluster for `cfg` over `trace`, with `store` holding encoder outputs and prefix KV.
    /// Three-point scheduling (`Mode::Full`) ranks workers by predicted drain time and
    /// needs `pricing`; other modes never read it.
    pub fn new(
        cfg: EngineConfig,
        store: S,
        trace: &'a [R],
        pricing: Option<Box<dyn Pricing + 'a>>,
    ) -> Result<Self, ServeError> {
        if cfg.mode.smart_scheduling() && pricing.is_none() {
            return Err(ServeError::Config {
                field: "pricing",
                what: format!(
                    "mode {} schedules by predicted load and needs a pricing",
                    cfg.mode.name()
                ),
            });
        }
        let nonzero = [
            ("encoder_max_batch_tokens", cfg.encoder_max_batch_tokens),
            ("prefill_chunk_tokens", cfg.prefill_chunk_tokens),
            ("decode_max_batch", cfg.decode_max_batch),
            ("kv_block_tokens", cfg.kv_block_tokens),
            ("kv_pages", cfg.kv_pages),
        ];
        for (field, v) in nonzero {
            if v == 0 {
                return Err(ServeError::Config {
                    field,
                    what: "expected > 0".into(),
                });
            }
        }
        let roles: &[(&'static str, u32)] = if cfg.mode.disaggregated() {
            &[
                ("encoders", cfg.encoders),
                ("prefills", cfg.prefills),
                ("decodes", cfg.decodes),
            ]
        } else {
            &[("colocated", cfg.colocated)]
        };
        for &(field, v) in roles {
            if v == 0 {
                return Err(ServeError::Config {
                    field,
                    what: format!("expected > 0 in mode {}", cfg.mode.name()),
                });
            }
        }
        let pool = || {
            PoolCore::new(PoolConfig::new(
                cfg.kv_pages,
                cfg.kv_block_tokens,
                cfg.kv_bytes_per_token,
            ))
            .map_err(|e| ServeError::Pool("kv pool", e))
        };
        let mut workers = Vec::new();
        let (mut encoders, mut prefills, mut decodes) = (Vec::new(), Vec::new(), Vec::new());
        let mk = |enc, pre, dec, pool: Option<PoolCore>| Worker {
            enc,
            pre,
            dec,
            inflight: Inflight::Idle,
            enc_q: VecDeque::new(),
            pre_q: VecDeque::new(),
            dec_wait: VecDeque::new(),
            batch: DecodeBatch::new(cfg.kv_block_tokens),
            pool,
            extra: Vec::new(),
            copies: Vec::new(),
            admitted: Vec::new(),
            load: WorkerLoad::default(),
        };
        if cfg.mode.disaggregated() {
            for _ in 0..cfg.encoders {
                encoders.push(workers.len() as u32);
                workers.push(mk(true, false, false, None));
            }
            for _ in 0..cfg.prefills {
                prefills.push(workers.len() as u32);
                workers.push(mk(false, true, false, None));
            }
            for _ in 0..cfg.decodes {
                decodes.push(workers.len() as u32);
                workers.push(mk(false, false, true, Some(pool()?)));
            }
        } else {
            for _ in 0..cfg.colocated {
                let id = workers.len() as u32;
                encoders.push(id);
                prefills.push(id);
                decodes.push(id);
                workers.push(mk(true, true, true, Some(pool()?)));
            }
        }
        Ok(Self {
            cfg,
            trace,
            workers,
            encoders,
            prefills,
            decodes,
            rr: [0; 3],
            // Every request is at least one job.
            jobs: Vec::with_capacity(trace.len()),
            tops: Vec::with_capacity(trace.len()),
            cache: MmCache::with_config(store, CacheConfig::default()),
            ctxs: Vec::new(),
            counters: Counters::default(),
            step_out: StepOutcome::default(),
            fp_memo: Memo::new(FP_MEMO_BITS),
            actions: Vec::new(),
            draining: false,
            blocks_missing: Vec::new(),
            recv: Vec::new(),
            pricing,
            outputs: None,
            holding: Default::default(),
            to_kick: Vec::new(),
            fp_starts: Default::default(),
        })
    }

    /// Commit what the driver's encoder produced (real payloads only): every image the
    /// engine stores is then taken from `outputs`, and a missing or mis-sized output is an
    /// error ([`ServeError::EncoderOutput`]) instead of a stand-in.
    pub fn set_encoder_outputs(&mut self, outputs: Box<dyn EncoderOutputs + 'a>) {
        self.outputs = Some(outputs);
    }

    /// The next action the driver must run, in the order decided.
    #[inline]
    pub fn poll_action(&mut self) -> Option<Action> {
        if !self.draining {
            self.actions.reverse();
            self.draining = true;
        }
        self.actions.pop()
    }

    /// Before an input: actions the driver left undrained go back in decision order.
    #[inline]
    fn undrain(&mut self) {
        if self.draining {
            self.actions.reverse();
            self.draining = false;
        }
    }

    /// Workers in the cluster (ids `0..n`).
    pub fn workers(&self) -> u32 {
        self.workers.len() as u32
    }

    /// Worker `w`'s role (`None`: no such worker).
    pub fn role(&self, w: WorkerId) -> Option<Role> {
        self.workers
            .get(w as usize)
            .map(|k| match (k.enc, k.pre, k.dec) {
                (true, false, false) => Role::Encoder,
                (false, true, false) => Role::Prefill,
                (false, false, true) => Role::Decode,
                _ => Role::Colocated,
            })
    }

    /// Top-level requests so far, in arrival order.
    pub fn served(&self) -> &[Served] {
        &self.tops
    }

    /// The request job `job` serves: its index in [`Engine::served`], and its branch
    /// (`None`: the request's own prompt and output). `None` for a job not yet created.
    pub fn job_request(&self, job: JobId) -> Option<(usize, Option<u32>)> {
        self.jobs
            .get(job as usize)
            .map(|j| (j.top as usize, j.branch))
    }

    /// The configuration it decides with.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Counts of the engine's decisions.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The embedding cache (its counters, its store).
    pub fn cache(&self) -> &MmCache<S> {
        &self.cache
    }

    /// KV pool statistics of every worker that has a pool.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.workers
            .iter()
            .filter_map(|w| w.pool.as_ref().map(|p| p.stats()))
            .collect()
    }

    /// Credit the tokens of completed decode iterations that the batches have not
    /// reported yet (a run cut off before every request finished), and hand back the
    /// records.
    pub fn into_served(mut self) -> (Vec<Served>, Counters, MmCache<S>) {
        for wk in &self.workers {
            for (job, n) in wk.batch.unreported() {
                let top = self.jobs[job as usize].top as usize;
                self.tops[top].rec.output_tokens += n;
            }
        }
        (self.tops, self.counters, self.cache)
    }

    /// Build the model contexts up to `tenant`'s (`ctxs[tenant]`) on first use.
    fn ensure_ctx(&mut self, tenant: u32) -> Result<(), ServeError> {
        while self.ctxs.len() <= tenant as usize {
            let parts = ModelParts::example(&format!("tenant-{}", self.ctxs.len()));
            self.ctxs.push(
                ModelCtx::new(parts, self.cfg.hidden)
                    .map_err(|e| ServeError::Cache("model context", e))?,
            );
        }
        Ok(())
    }

    /// A worker for `role` (0 encode, 1 prefill, 2 decode): round robin, or under
    /// smart scheduling the one with the least predicted drain time ([`Engine::load_ns`]),
    /// ties to the first at or after the round-robin cursor (so idle workers share work).
    fn pick(&mut self, now: Nanos, role: usize) -> WorkerId {
        let pool = match role {
            0 => &self.encoders,
            1 => &self.prefills,
            _ => &self.decodes,
        };
        let n = pool.len();
        let start = self.rr[role] % n;
        let w = match (&self.pricing, self.cfg.mode.smart_scheduling()) {
            (Some(p), true) => {
                let mut best = (u64::MAX, pool[start]);
                for k in 0..n {
                    let w = pool[(start + k) % n];
                    let l = Self::drain_ns(p.as_ref(), &self.workers[w as usize], now, role);
                    if l < best.0 {
                        best = (l, w);
                    }
                }
                best.1
            }
            _ => pool[start],
        };
        self.rr[role] = match self.cfg.mode.smart_scheduling() {
            // The cursor moves past the chosen worker.
            true => pool.iter().position(|&x| x == w).map_or(0, |i| i + 1),
            false => self.rr[role] + 1,
        };
        w
    }

    /// Predicted time for worker `w` to drain the work of `role` it has or is about to
    /// get, at `now`: the rest of its batch in flight, its queue priced item by item, and
    /// work assigned to it that is still in transit; for decode, the next iteration's
    /// time with every waiting and arriving sequence admitted (what a new sequence would
    /// see per token). `None` unless smart scheduling with a pricing.
    pub fn load_ns(&self, now: Nanos, w: WorkerId, role: usize) -> Option<u64> {
        if !self.cfg.mode.smart_scheduling() {
            return None;
        }
        let p = self.pricing.as_ref()?;
        let wk = self.workers.get(w as usize)?;
        Some(Self::drain_ns(p.as_ref(), wk, now, role))
    }

    fn drain_ns(p: &dyn Pricing, wk: &Worker, now: Nanos, role: usize) -> u64 {
        let l = &wk.load;
        let inflight = l.busy_until.saturating_sub(now);
        match role {
            0 => inflight + l.encode_queued_ns,
            1 => inflight + l.prefill_queued_ns + l.incoming_ns,
            _ => {
                let (seqs, ctx) = l.decode_pending;
                let batch = wk.batch.len() + seqs;
                let demand = wk.batch.ctx_sum() + ctx;
                let next = if batch == 0 {
                    0
                } else {
                    p.decode_ns(batch, demand)
                };
                // KV pressure: context beyond the pool's pages is preempted and
                // recomputed later; price that recompute.
                let overflow = wk.pool.as_ref().map_or(0, |pool| {
                    let cfg = pool.config();
                    let cap = u64::from(cfg.capacity_pages) * u64::from(cfg.block_size_tokens);
                    demand.saturating_sub(cap)
                });
                let spill = if overflow > 0 {
                    p.prefill_ns(&[(u32::try_from(overflow).unwrap_or(u32::MAX), 0)])
                } else {
                    0
                };
                inflight + l.incoming_ns + next + spill
            }
        }
    }

    /// Price with the load signal's model when smart scheduling maintains it.
    fn priced(&self, f: impl FnOnce(&dyn Pricing) -> u64) -> u64 {
        match (&self.pricing, self.cfg.mode.smart_scheduling()) {
            (Some(p), true) => f(p.as_ref()),
            _ => 0,
        }
    }

    /// Under smart scheduling, when worker `w`'s batch starting at `now` is predicted to
    /// end (`price` of the batch); nothing otherwise (no other mode reads it).
    fn mark_busy(&mut self, w: WorkerId, now: Nanos, price: impl FnOnce(&dyn Pricing) -> u64) {
        if let (Some(p), true) = (&self.pricing, self.cfg.mode.smart_scheduling()) {
            self.workers[w as usize].load.busy_until = now + price(p.as_ref());
        }
    }

    /// The load signal's price of `job`'s prefill once `done` of its uncached tokens have
    /// run: the tokens left, after the cached ones and those done; 0 when none are left.
    fn prefill_left_ns(&self, job: JobId, done: u32) -> u64 {
        let j = &self.jobs[job as usize];
        let left = j.prompt - j.cached_prefix - done;
        if left == 0 {
            return 0;
        }
        self.priced(|p| p.prefill_ns(&[(left, j.cached_prefix + done)]))
    }

    /// Queue `job` for prefill on `w` (its uncached tokens priced for the load signal). A
    /// job is queued once, before any of its chunks ran.
    fn queue_prefill(&mut self, w: WorkerId, job: JobId) {
        debug_assert_eq!(
            self.jobs[job as usize].prefill_done, 0,
            "job {job} queued twice"
        );
        let ns = self.prefill_left_ns(job, 0);
        self.jobs[job as usize].queued_ns = ns;
        let wk = &mut self.workers[w as usize];
        wk.pre_q.push_back(job);
        wk.load.prefill_queued_ns += ns;
    }

    /// Request `idx` of the trace arrives at `now` (requests arrive in trace order).
    pub fn arrive(&mut self, now: Nanos, idx: usize) -> Result<(), ServeError> {
        self.undrain();
        let r = self.trace.get(idx).ok_or(ServeError::NoSuchRequest(idx))?;
        let outs = r.branch_output_tokens();
        let branches = outs.len() as u32;
        let rec = RequestRecord {
            id: r.id(),
            session: r.session(),
            arrival_ns: now,
            encode_start_ns: NONE,
            encode_end_ns: NONE,
            prefill_start_ns: NONE,
            prefill_end_ns: NONE,
            first_token_ns: NONE,
            finish_ns: NONE,
            output_tokens: 0,
            // Every generation, a request or a branch, yields at least its first token.
            path_tokens: u64::from(r.output_tokens().max(1))
                + outs
                    .iter()
                    .copied()
                    .max()
                    .map_or(0, |m| u64::from(m.max(1))),
            images: 0,
            images_hit: 0,
            images_encoded: 0,
            images_dedup: 0,
            branches,
            prefix_hit_tokens: 0,
            bytes_encoder_store: 0,
            bytes_store_prefill: 0,
            bytes_prefill_decode: 0,
        };
        let top = self.tops.len() as u32;
        self.tops.push(Served {
            rec,
            done: false,
            branches_left: branches,
        });
        let images = job_images(r);
        let (prompt, decode_left) = (
            r.prompt_tokens().max(1),
            r.output_tokens().saturating_sub(1),
        );
        let job = self.new_job(
            top,
            idx as u32,
            None,
            prompt,
            decode_left,
            images,
            branches > 0,
        );
        self.route(now, job)
    }

    #[allow(clippy::too_many_arguments)]
    fn new_job(
        &mut self,
        top: u32,
        trace_idx: u32,
        branch: Option<u32>,
        prompt: u32,
        decode_left: u32,
        images: Vec<JobImg>,
        fork_after: bool,
    ) -> JobId {
        self.jobs.push(JobState {
            top,
            trace_idx,
            branch,
            prompt,
            decode_left,
            images,
            pending_images: 0,
            load_bytes: 0,
            cached_prefix: 0,
            prefill_done: 0,
            prefill_worker: 0,
            decode_worker: 0,
            seq: None,
            fork_after,
            preempted: false,
            kv_missing: Vec::new(),
            incoming_ns: 0,
            queued_ns: 0,
            held: Vec::new(),
        });
        (self.jobs.len() - 1) as JobId
    }

    /// Send a job to its first stage: fingerprinting then dispatch (EPD), or a colocated GPU.
    fn route(&mut self, now: Nanos, job: JobId) -> Result<(), ServeError> {
        if self.cfg.mode.disaggregated() {
            let pixel_bytes: u64 = self.jobs[job as usize]
                .images
                .iter()
                .map(|i| u64::from(i.img.tokens) * self.cfg.pixel_bytes_per_token)
                .sum();
            self.actions.push(Action::Fingerprint { job, pixel_bytes });
            Ok(())
        } else {
            let w = self.pick(now, 0);
            let j = &mut self.jobs[job as usize];
            j.prefill_worker = w;
            j.decode_worker = w;
            self.dispatch_images(now, job, Some(w))
        }
    }

    /// A unit of work finished at `now`.
    pub fn complete(&mut self, now: Nanos, done: Done) -> Result<(), ServeError> {
        self.undrain();
        match done {
            Done::Fingerprinted(job) => {
                self.check_job(job, done)?;
                self.dispatch_images(now, job, None)
            }
            Done::Step(w) => {
                if w as usize >= self.workers.len() {
                    return Err(ServeError::Unexpected(done));
                }
                self.step_done(now, w)
            }
            Done::Stored(job, img) => {
                self.check_job(job, done)?;
                self.image_stored(now, job, img)
            }
            Done::Loaded(job) => {
                self.check_job(job, done)?;
                self.release(now, job)?;
                let w = self.jobs[job as usize].prefill_worker;
                let arrived = std::mem::take(&mut self.jobs[job as usize].incoming_ns);
                self.workers[w as usize].load.incoming_ns -= arrived;
                self.queue_prefill(w, job);
                self.kick(now, w)
            }
            Done::KvArrived(job) => {
                self.check_job(job, done)?;
                let w = self.jobs[job as usize].decode_worker;
                let arrived = std::mem::take(&mut self.jobs[job as usize].incoming_ns);
                let wk = &mut self.workers[w as usize];
                wk.load.incoming_ns -= arrived;
                wk.dec_wait.push_back(job);
                self.kick(now, w)
            }
        }
    }

    fn check_job(&self, job: JobId, done: Done) -> Result<(), ServeError> {
        if (job as usize) < self.jobs.len() {
            Ok(())
        } else {
            Err(ServeError::Unexpected(done))
        }
    }

    fn dispatch_images(
        &mut self,
        now: Nanos,
        job: JobId,
        colo: Option<WorkerId>,
    ) -> Result<(), ServeError> {
        // The images kept (every first reference of a content) are compacted to the front
        // of the job's own list, in order: `images[..kept]`.
        let mut images = std::mem::take(&mut self.jobs[job as usize].images);
        let mut kept = 0;
        let top = self.jobs[job as usize].top as usize;
        let tenant = self.trace[self.jobs[job as usize].trace_idx as usize].tenant();
        self.prefetch_prompt_blocks(job);
        let mut to_kick = std::mem::take(&mut self.to_kick);
        to_kick.clear();
        let cache = self.cfg.mode.cache() && !images.is_empty();
        if cache {
            self.ensure_ctx(tenant)?;
        }
        for r in 0..images.len() {
            let img = images[r].img;
            self.counters.image_refs += 1;
            self.tops[top].rec.images += 1;
            if images[..kept].iter().any(|k| k.img.content == img.content) {
                self.tops[top].rec.images_dedup += 1;
                self.counters.images_dedup += 1;
                continue;
            }
            let bytes = u64::from(img.tokens) * self.cfg.encoder_bytes_per_token;
            let mut fp = None;
            let hit = if cache {
                let (f, hit) = self.lookup(now, tenant, &img)?;
                fp = Some(f);
                hit.then_some(f)
            } else {
                None
            };
            if let Some(fp) = hit {
                self.hold(now, job, StoreKey::MmBlob(fp.0));
                self.tops[top].rec.images_hit += 1;
                self.counters.images_hit += 1;
                self.actions
                    .push(Action::EncodeAvoided { tokens: img.tokens });
                self.jobs[job as usize].load_bytes += bytes;
                images[kept] = JobImg { img, fp: Some(fp) };
                kept += 1;
                continue;
            }
            let w = match colo {
                Some(w) => w,
                None => self.pick(now, 0),
            };
            let idx = kept as u32;
            images[kept] = JobImg { img, fp };
            kept += 1;
            let ns = self.priced(|p| p.encode_ns(&[img.tokens]));
            let wk = &mut self.workers[w as usize];
            wk.enc_q.push_back((job, idx));
            wk.load.encode_queued_ns += ns;
            self.jobs[job as usize].pending_images += 1;
            if !to_kick.contains(&w) {
                to_kick.push(w);
            }
        }
        images.truncate(kept);
        self.jobs[job as usize].images = images;
        for &w in &to_kick {
            self.kick(now, w)?;
        }
        self.to_kick = to_kick;
        if self.jobs[job as usize].pending_images == 0 {
            self.images_ready(now, job)?;
        }
        Ok(())
    }

    /// A validated lookup of `img`'s embedding (a probe: counted as hit or miss): its
    /// fingerprint, and whether it hit.
    fn lookup(
        &mut self,
        now: Nanos,
        tenant: u32,
        img: &Img,
    ) -> Result<(ImageFp, bool), ServeError> {
        let ctx = &self.ctxs[tenant as usize];
        let fp = image_fp(&mut self.fp_memo, &mut self.fp_starts, ctx, img, None)?;
        let exp = ctx
            .expect(img.grid)
            .map_err(|e| ServeError::Cache("image grid", e))?;
        let r = match self.cfg.payloads {
            Payloads::SizeOnly => self.cache.lookup_size_only(now, &fp, &exp),
            Payloads::Bytes => {
                self.recv.resize(exp.byte_len as usize, 0);
                self.cache.lookup(now, &fp, &exp, &mut self.recv)
            }
        };
        let r = r.map_err(|e| ServeError::Cache("cache lookup", e))?;
        Ok((fp, matches!(r, Lookup::Hit { .. })))
    }

    /// Open a read of `key` for `job` that lasts until its load completes (S2 at the
    /// engine: what a transfer in flight reads is not evicted under it).
    fn hold(&mut self, now: Nanos, job: JobId, key: StoreKey) {
        match self.cache.store_mut().begin_read_key(now, &key) {
            Ok(_) => {
                *self.holding.entry(key.clone()).or_default() += 1;
                self.jobs[job as usize].held.push(key);
                self.counters.reads_held += 1;
            }
            Err(_) => self.counters.reads_unheld += 1,
        }
    }

    /// Close every read `job` holds. An object removed meanwhile (a forced remove) has
    /// nothing left to close; any other refusal is an error.
    fn release(&mut self, now: Nanos, job: JobId) -> Result<(), ServeError> {
        let held = std::mem::take(&mut self.jobs[job as usize].held);
        for key in held {
            if let Some(n) = self.holding.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.holding.remove(&key);
                }
            }
            match self.cache.store_mut().end_read_key(now, &key) {
                Ok(()) | Err(StoreError::NotFound) => {}
                Err(e) => return Err(ServeError::Store("end_read", e)),
            }
        }
        Ok(())
    }

    fn image_stored(&mut self, now: Nanos, job: JobId, idx: u32) -> Result<(), ServeError> {
        let JobImg { img, fp: looked_up } = *self.jobs[job as usize]
            .images
            .get(idx as usize)
            .ok_or(ServeError::Unexpected(Done::Stored(job, idx)))?;
        let tenant = self.trace[self.jobs[job as usize].trace_idx as usize].tenant();
        if self.jobs[job as usize].pending_images == 1 {
            // The last image: `images_ready` follows.
            self.prefetch_prompt_blocks(job);
        }
        self.ensure_ctx(tenant)?;
        let ctx = &self.ctxs[tenant as usize];
        // B1 keys are request-scoped (no cross-request reuse); B2+ are content-addressed,
        // and the image's lookup computed its fingerprint already.
        let fp = match looked_up {
            Some(fp) if self.cfg.mode.cache() => fp,
            _ => {
                let scope = (!self.cfg.mode.cache()).then_some(u64::from(job));
                image_fp(&mut self.fp_memo, &mut self.fp_starts, ctx, &img, scope)?
            }
        };
        let exp = ctx
            .expect(img.grid)
            .map_err(|e| ServeError::Cache("image grid", e))?;
        let cache = &mut self.cache;
        // A commit retracts the pair it replaces (a forced remove). While another job's load
        // reads that very blob, the engine leaves it: the key is the content's fingerprint,
        // so the object there is this output already, and replacing it would pull it from
        // under the transfer (and leave that read's `end_read` to a stranger).
        let held = self.holding.contains_key(&StoreKey::MmBlob(fp.0));
        // Every encoder output is asked for once, whether or not it is committed.
        let output = self.outputs.as_mut().map(|src| src.take(job, idx));
        if held {
            self.counters.commits_held += 1;
        }
        let r = match self.cfg.payloads {
            _ if held => Ok(CommitOutcome::Committed),
            Payloads::SizeOnly => cache.commit_size_only(now, ctx, fp, img.grid),
            Payloads::Bytes => {
                let bytes = match output {
                    None => synthetic_bytes(&fp.0, exp.byte_len),
                    Some(Some(b)) if b.len() as u64 == exp.byte_len => b,
                    Some(other) => {
                        return Err(ServeError::EncoderOutput {
                            job,
                            idx,
                            what: format!(
                                "expected {} bytes ({} visual tokens), got {}",
                                exp.byte_len,
                                img.tokens,
                                other.map_or("none".into(), |b| b.len().to_string())
                            ),
                        });
                    }
                };
                cache.commit(now, ctx, fp, img.grid, &bytes)
            }
        };
        r.map_err(|e| ServeError::Cache("cache commit", e))?;
        // Cache is transport: the prefill side reads the fresh output back through the
        // validated path (counted as a readback, not a hit). If the store refused or lost
        // it, the output still reaches the prefill worker directly (fail-open).
        let r = match self.cfg.payloads {
            Payloads::SizeOnly => cache.readback_size_only(now, &fp, &exp),
            Payloads::Bytes => {
                self.recv.resize(exp.byte_len as usize, 0);
                cache.readback(now, &fp, &exp, &mut self.recv)
            }
        };
        let r = r.map_err(|e| ServeError::Cache("cache readback", e))?;
        if matches!(r, Lookup::Hit { .. }) {
            self.hold(now, job, StoreKey::MmBlob(fp.0));
        }
        let j = &mut self.jobs[job as usize];
        j.load_bytes += u64::from(img.tokens) * self.cfg.encoder_bytes_per_token;
        j.pending_images -= 1;
        if j.pending_images == 0 {
            self.images_ready(now, job)?;
        }
        Ok(())
    }

    /// Hint the CPU to fetch the per-job state that completing `done` reads first (a
    /// driver calls it for the next event while it handles the current one; no effect on
    /// results).
    pub fn prefetch(&self, done: &Done) {
        match *done {
            Done::Step(w) => {
                if let Some(Inflight::Prefill(chunks)) =
                    self.workers.get(w as usize).map(|wk| &wk.inflight)
                {
                    for &(job, _) in chunks {
                        self.prefetch_job(job, true);
                    }
                }
            }
            Done::Fingerprinted(job)
            | Done::Stored(job, _)
            | Done::Loaded(job)
            | Done::KvArrived(job) => self.prefetch_job(job, false),
        }
    }

    /// [`Engine::prefetch`] of one job: its request record, and either its own state or
    /// (a finished prefill, `publishing`) the prefix blocks it publishes.
    #[inline]
    fn prefetch_job(&self, job: JobId, publishing: bool) {
        if let Some(j) = self.jobs.get(job as usize) {
            if !publishing {
                crate::hint::prefetch(j);
            }
            if let Some(t) = self.tops.get(j.top as usize) {
                crate::hint::prefetch(t);
            }
            if publishing {
                crate::hint::prefetch_lines(&j.kv_missing, 3);
            }
        }
    }

    /// Hint the CPU to fetch the prefix-block ids that `images_ready` looks up next: the
    /// trace keeps them in one allocation per request, untouched since the trace was read,
    /// and the image work before the lookup hides the fetch (no effect on results).
    #[inline]
    fn prefetch_prompt_blocks(&self, job: JobId) {
        if self.cfg.kv_prefix_store && self.cfg.mode.disaggregated() {
            let ids = self.trace[self.jobs[job as usize].trace_idx as usize].prompt_blocks();
            crate::hint::prefetch_lines(ids, 4);
        }
    }

    /// All images of `job` are available: place its prefill, look up its prefix KV, load.
    fn images_ready(&mut self, now: Nanos, job: JobId) -> Result<(), ServeError> {
        if !self.cfg.mode.disaggregated() {
            // Colocated: nothing crosses a link, so nothing is read over time.
            self.release(now, job)?;
            let w = self.jobs[job as usize].prefill_worker;
            self.queue_prefill(w, job);
            return self.kick(now, w);
        }
        let w = self.pick(now, 1);
        self.jobs[job as usize].prefill_worker = w;
        let mut hit_blocks = 0u64;
        let mut missing = Vec::new();
        if self.cfg.kv_prefix_store {
            let trace = self.trace;
            let tr = &trace[self.jobs[job as usize].trace_idx as usize];
            let ids = tr.prompt_blocks();
            let mut blocks = KvBlocks {
                store: self.cache.store_mut(),
                now,
                ids,
                block_bytes: 0,
                payloads: self.cfg.payloads,
            };
            let hit =
                kv_prefix::lookup(&mut blocks, ids.len(), &mut self.blocks_missing, |_, _| {})
                    .map_err(|e| ServeError::Store("lookup", e))?;
            self.counters.kv_lookups += ids.len() as u64;
            self.counters.kv_hits += hit as u64;
            for &id in &ids[..hit] {
                self.hold(now, job, StoreKey::Kv(id));
            }
            hit_blocks = hit as u64;
            missing.extend(self.blocks_missing.iter().map(|&i| ids[i]));
        }
        let j = &mut self.jobs[job as usize];
        j.cached_prefix = ((hit_blocks * u64::from(self.cfg.prefix_block_tokens)) as u32)
            .min(j.prompt.saturating_sub(1));
        j.kv_missing = missing;
        let kv_bytes = u64::from(j.cached_prefix) * self.cfg.kv_bytes_per_token;
        let embed_bytes = j.load_bytes;
        let top = j.top as usize;
        let chunk = (j.prompt - j.cached_prefix, j.cached_prefix);
        let rec = &mut self.tops[top].rec;
        rec.prefix_hit_tokens += u64::from(chunk.1);
        rec.bytes_store_prefill += embed_bytes + kv_bytes;
        let ns = self.priced(|p| {
            p.transfer_ns(Flow::Get, embed_bytes)
                + p.transfer_ns(Flow::KvGet, kv_bytes)
                + p.prefill_ns(&[chunk])
        });
        self.jobs[job as usize].incoming_ns = ns;
        self.workers[w as usize].load.incoming_ns += ns;
        self.counters.link_bytes[1] += embed_bytes + kv_bytes;
        self.actions.push(Action::Load {
            job,
            worker: w,
            embed_bytes,
            kv_bytes,
        });
        Ok(())
    }

    /// Start the next batch on an idle worker: encode, then prefill, then decode.
    fn kick(&mut self, now: Nanos, w: WorkerId) -> Result<(), ServeError> {
        let wk = &self.workers[w as usize];
        if !matches!(wk.inflight, Inflight::Idle) {
            return Ok(());
        }
        if wk.enc && !wk.enc_q.is_empty() {
            self.start_encode(now, w);
            return Ok(());
        }
        if wk.pre && !wk.pre_q.is_empty() {
            self.start_prefill(now, w);
            return Ok(());
        }
        if wk.dec && (!wk.batch.is_empty() || !wk.dec_wait.is_empty()) {
            return self.start_decode(now, w);
        }
        Ok(())
    }

    fn start_encode(&mut self, now: Nanos, w: WorkerId) {
        let budget = u64::from(self.cfg.encoder_max_batch_tokens);
        let mut batch = Vec::new();
        let mut sum = 0u64;
        while let Some(&(job, idx)) = self.workers[w as usize].enc_q.front() {
            let t = self.jobs[job as usize].images[idx as usize].img.tokens;
            if !batch.is_empty() && sum + u64::from(t) > budget {
                break;
            }
            let ns = self.priced(|p| p.encode_ns(&[t]));
            let wk = &mut self.workers[w as usize];
            wk.enc_q.pop_front();
            wk.load.encode_queued_ns -= ns;
            sum += u64::from(t);
            batch.push((job, idx));
            let top = self.jobs[job as usize].top as usize;
            let rec = &mut self.tops[top].rec;
            // Stage times are the request's own path; re-run branches do not move them.
            if rec.encode_start_ns == NONE && self.jobs[job as usize].branch.is_none() {
                rec.encode_start_ns = now;
            }
        }
        // The action's lists follow the batch (each allocated once, at its size).
        let img = |&(job, idx): &(JobId, u32)| self.jobs[job as usize].images[idx as usize].img;
        let tokens: Vec<u32> = batch.iter().map(|b| img(b).tokens).collect();
        let images: Vec<ImageRef> = batch
            .iter()
            .map(|b| ImageRef {
                job: b.0,
                idx: b.1,
                content: img(b).content,
            })
            .collect();
        self.mark_busy(w, now, |p| p.encode_ns(&tokens));
        self.workers[w as usize].inflight = Inflight::Encode(batch);
        self.actions.push(Action::Encode {
            worker: w,
            tokens,
            images,
        });
    }

    fn start_prefill(&mut self, now: Nanos, w: WorkerId) {
        let mut budget = self.cfg.prefill_chunk_tokens;
        let mut chunks = Vec::new();
        let n = self.workers[w as usize].pre_q.len();
        for k in 0..n {
            if budget == 0 {
                break;
            }
            let job = self.workers[w as usize].pre_q[k];
            let j = &self.jobs[job as usize];
            let left = j.prompt - j.cached_prefix - j.prefill_done;
            let take = left.min(budget);
            budget -= take;
            chunks.push((job, take));
            let top = j.top as usize;
            if j.branch.is_none() && self.tops[top].rec.prefill_start_ns == NONE {
                self.tops[top].rec.prefill_start_ns = now;
            }
            // The chunk now runs: the batch's predicted end (`busy_until`) prices it, so
            // the queue keeps only the tokens left after it (INVARIANTS E8).
            let ns = self.prefill_left_ns(job, j.prefill_done + take);
            let queued = std::mem::replace(&mut self.jobs[job as usize].queued_ns, ns);
            let l = &mut self.workers[w as usize].load;
            l.prefill_queued_ns = l.prefill_queued_ns - queued + ns;
        }
        // The action's lists follow the chunks (each allocated once, at its size).
        let shapes: Vec<(u32, u32)> = chunks
            .iter()
            .map(|&(job, take)| {
                let j = &self.jobs[job as usize];
                (take, j.cached_prefix + j.prefill_done)
            })
            .collect();
        let jobs: Vec<(JobId, u32)> = chunks
            .iter()
            .map(|&(job, _)| (job, self.jobs[job as usize].prompt))
            .collect();
        self.mark_busy(w, now, |p| p.prefill_ns(&shapes));
        self.workers[w as usize].inflight = Inflight::Prefill(chunks);
        self.actions.push(Action::Prefill {
            worker: w,
            chunks: shapes,
            jobs,
        });
    }

    fn start_decode(&mut self, now: Nanos, w: WorkerId) -> Result<(), ServeError> {
        // Admit waiting sequences while the batch and the KV pool allow.
        while self.workers[w as usize].batch.len() < self.cfg.decode_max_batch {
            let Some(&job) = self.workers[w as usize].dec_wait.front() else {
                break;
            };
            let ctx = u64::from(self.jobs[job as usize].prompt) + 1;
            let wk = &mut self.workers[w as usize];
            let pool = wk.pool.as_mut().ok_or_else(|| ServeError::Config {
                field: "decode worker",
                what: "has no KV pool".into(),
            })?;
            let expect = ctx + u64::from(self.jobs[job as usize].decode_left);
            match pool.allocate_for(ctx, expect) {
                Ok(seq) => {
                    wk.dec_wait.pop_front();
                    wk.load.decode_pending.0 -= 1;
                    wk.load.decode_pending.1 -= ctx - 1;
                    let j = &mut self.jobs[job as usize];
                    if j.preempted {
                        // Recompute the lost KV before the sequence decodes again.
                        wk.extra.push(Extra::Recompute {
                            tokens: ctx as u32,
                            job,
                        });
                        j.preempted = false;
                    }
                    j.seq = Some(seq);
                    if self.cfg.kv_tables {
                        wk.admitted.push(seq);
                    }
                    wk.batch
                        .admit(pool, job, seq, ctx, u64::from(j.decode_left))?;
                }
                Err(_) => break,
            }
        }
        let wk = &mut self.workers[w as usize];
        if wk.batch.is_empty() {
            if wk.dec_wait.is_empty() {
                return Ok(());
            }
            return Err(ServeError::DoesNotFit {
                worker: w,
                tokens: self.jobs[wk.dec_wait[0] as usize].prompt,
            });
        }
        let (batch, ctx_sum) = (wk.batch.len(), wk.batch.ctx_sum());
        self.mark_busy(w, now, |p| p.decode_ns(batch, ctx_sum));
        let wk = &mut self.workers[w as usize];
        wk.inflight = Inflight::Decode;
        let seqs = if self.cfg.kv_tables {
            Self::seq_refs(wk)?
        } else {
            Vec::new()
        };
        self.actions.push(Action::Decode {
            worker: w,
            batch,
            ctx_sum,
            extra: std::mem::take(&mut wk.extra),
            seqs,
            copies: std::mem::take(&mut wk.copies),
        });
        Ok(())
    }

    /// The batch's sequences with their pages, for the next iteration (`kv_tables`).
    fn seq_refs(wk: &mut Worker) -> Result<Vec<DecodeSeqRef>, ServeError> {
        let pool = wk.pool.as_ref().ok_or_else(|| ServeError::Config {
            field: "decode worker",
            what: "has no KV pool".into(),
        })?;
        let admitted = std::mem::take(&mut wk.admitted);
        let bad = |e| ServeError::Pool("decode pages", e);
        wk.batch
            .live()
            .into_iter()
            .map(|(job, seq, len, appends)| {
                let pages = pool.table(seq).map_err(bad)?.to_vec();
                let bt = u64::from(pool.config().block_size_tokens);
                let at = (len / bt) as usize;
                let shared_tail = pages
                    .get(at)
                    .and_then(|&p| pool.refcount(p))
                    .is_some_and(|r| r > 1);
                Ok(DecodeSeqRef {
                    job,
                    seq: (seq.index(), seq.generation()),
                    pages,
                    len,
                    shared_tail,
                    appends,
                    admitted: admitted.contains(&seq),
                })
            })
            .collect()
    }

    fn step_done(&mut self, now: Nanos, w: WorkerId) -> Result<(), ServeError> {
        match std::mem::replace(&mut self.workers[w as usize].inflight, Inflight::Idle) {
            Inflight::Idle => return Err(ServeError::Unexpected(Done::Step(w))),
            Inflight::Encode(batch) => {
                for (job, idx) in batch {
                    let top = self.jobs[job as usize].top as usize;
                    if self.jobs[job as usize].branch.is_none() {
                        self.tops[top].rec.encode_end_ns = now;
                    }
                    self.tops[top].rec.images_encoded += 1;
                    self.counters.images_encoded += 1;
                    if self.cfg.mode.disaggregated() {
                        let bytes =
                            u64::from(self.jobs[job as usize].images[idx as usize].img.tokens)
                                * self.cfg.encoder_bytes_per_token;
                        self.tops[top].rec.bytes_encoder_store += bytes;
                        self.counters.link_bytes[0] += bytes;
                        self.actions.push(Action::Transfer {
                            from: w,
                            to: None,
                            flow: Flow::Put,
                            bytes,
                            done: Some(Done::Stored(job, idx)),
                        });
                    } else {
                        let j = &mut self.jobs[job as usize];
                        j.pending_images -= 1;
                        if j.pending_images == 0 {
                            self.images_ready(now, job)?;
                        }
                    }
                }
            }
            Inflight::Prefill(chunks) => {
                for (job, n) in chunks {
                    let j = &mut self.jobs[job as usize];
                    j.prefill_done += n;
                    if j.prefill_done + j.cached_prefix < j.prompt {
                        // Still queued; `start_prefill` priced what is left.
                        continue;
                    }
                    // Done: leave the queue (it is at the front part of the queue).
                    let q = &mut self.workers[w as usize].pre_q;
                    if let Some(pos) = q.iter().position(|&x| x == job) {
                        q.remove(pos);
                    }
                    self.prefill_finished(now, w, job)?;
                }
            }
            Inflight::Decode => self.decode_done(now, w)?,
        }
        self.kick(now, w)
    }

    fn prefill_finished(&mut self, now: Nanos, w: WorkerId, job: JobId) -> Result<(), ServeError> {
        let top = self.jobs[job as usize].top as usize;
        // The prefill's last chunk produces the job's first output token.
        self.tops[top].rec.output_tokens += 1;
        if self.jobs[job as usize].branch.is_none() {
            let rec = &mut self.tops[top].rec;
            rec.prefill_end_ns = now;
            rec.first_token_ns = now;
        }
        // Publish the freshly computed prefix blocks (off the critical path).
        let missing = std::mem::take(&mut self.jobs[job as usize].kv_missing);
        if !missing.is_empty() && self.cfg.mode.disaggregated() {
            let block_bytes = u64::from(self.cfg.prefix_block_tokens) * self.cfg.kv_bytes_per_token;
            let mut blocks = KvBlocks {
                store: self.cache.store_mut(),
                now,
                ids: &missing,
                block_bytes,
                payloads: self.cfg.payloads,
            };
            let stored = kv_prefix::publish_all(&mut blocks, missing.len())
                .map_err(|e| ServeError::Store("put", e))?;
            if stored > 0 {
                self.actions.push(Action::PutBlocks {
                    from: w,
                    bytes_each: block_bytes,
                    count: stored,
                });
            }
        }
        let dec = if self.cfg.mode.disaggregated() {
            self.pick(now, 2)
        } else {
            w
        };
        self.jobs[job as usize].decode_worker = dec;
        if self.cfg.mode.disaggregated() {
            let bytes = u64::from(self.jobs[job as usize].prompt) * self.cfg.kv_bytes_per_token;
            self.tops[top].rec.bytes_prefill_decode += bytes;
            self.counters.link_bytes[2] += bytes;
            let ns = self.priced(|p| p.transfer_ns(Flow::KvPut, bytes));
            let ctx = u64::from(self.jobs[job as usize].prompt);
            self.jobs[job as usize].incoming_ns = ns;
            let l = &mut self.workers[dec as usize].load;
            l.incoming_ns += ns;
            l.decode_pending.0 += 1;
            l.decode_pending.1 += ctx;
            self.actions.push(Action::Transfer {
                from: w,
                to: Some(dec),
                flow: Flow::KvPut,
                bytes,
                done: Some(Done::KvArrived(job)),
            });
        } else {
            let ctx = u64::from(self.jobs[job as usize].prompt);
            let wk = &mut self.workers[dec as usize];
            wk.load.decode_pending.0 += 1;
            wk.load.decode_pending.1 += ctx;
            wk.dec_wait.push_back(job);
        }
        Ok(())
    }

    fn decode_done(&mut self, now: Nanos, w: WorkerId) -> Result<(), ServeError> {
        let wk = &mut self.workers[w as usize];
        let Some(pool) = wk.pool.as_mut() else {
            return Err(ServeError::Unexpected(Done::Step(w)));
        };
        // The outcome stays in its reused buffers; its entries are `Copy`, read by index,
        // since finishing a job needs the whole engine.
        wk.batch.step(pool, &mut self.step_out)?;
        let out = &self.step_out;
        self.counters.fork_copy_bytes += out.cow_bytes;
        for &(job, n) in &out.credits {
            let j = &mut self.jobs[job as usize];
            j.decode_left = j.decode_left.saturating_sub(n as u32);
            self.tops[j.top as usize].rec.output_tokens += n;
        }
        for r in &out.preempted {
            // KV pool full: drop this sequence's KV; it recomputes on re-admission.
            if let Some(pool) = self.workers[w as usize].pool.as_mut() {
                let _ = pool.release(r.seq);
            }
            self.counters.preemptions += 1;
            let j = &mut self.jobs[r.job as usize];
            j.preempted = true;
            j.seq = None;
            // The sequence re-enters with its context as the new prompt.
            j.prompt = r.ctx as u32;
            let wk = &mut self.workers[w as usize];
            wk.load.decode_pending.0 += 1;
            wk.load.decode_pending.1 += u64::from(j.prompt);
            wk.dec_wait.push_front(r.job);
        }
        for i in 0..self.step_out.finished.len() {
            let r = self.step_out.finished[i];
            self.job_finished(now, w, r)?;
        }
        Ok(())
    }

    fn job_finished(&mut self, now: Nanos, w: WorkerId, r: Leaving) -> Result<(), ServeError> {
        let job = r.job;
        let top = self.jobs[job as usize].top as usize;
        let trace_idx = self.jobs[job as usize].trace_idx;
        if self.jobs[job as usize].fork_after {
            self.jobs[job as usize].fork_after = false;
            let trace = self.trace;
            let outs = trace[trace_idx as usize].branch_output_tokens();
            if self.cfg.mode.fork() && self.fork(w, top, trace_idx, r, outs)? {
                return Ok(());
            }
            if let Some(pool) = self.workers[w as usize].pool.as_mut() {
                let _ = pool.release(r.seq);
            }
            let images = job_images(&trace[trace_idx as usize]);
            for (i, &tokens) in outs.iter().enumerate() {
                let b = self.new_job(
                    top as u32,
                    trace_idx,
                    Some(i as u32),
                    r.ctx as u32,
                    tokens.saturating_sub(1),
                    images.clone(),
                    false,
                );
                self.route(now, b)?;
            }
            return Ok(());
        }
        if let Some(pool) = self.workers[w as usize].pool.as_mut() {
            let _ = pool.release(r.seq);
        }
        self.jobs[job as usize].seq = None;
        let is_branch = self.jobs[job as usize].branch.is_some();
        let t = &mut self.tops[top];
        if is_branch {
            t.branches_left = t.branches_left.saturating_sub(1);
        }
        if (is_branch && t.branches_left == 0) || (!is_branch && t.rec.branches == 0) {
            t.rec.finish_ns = now;
            t.done = true;
        }
        Ok(())
    }

    /// Fork the finished shared part `r` into its branches on worker `w` through the
    /// core's fail-closed admission. False when admission refused (or the pool had no
    /// room): the caller falls back to independent prefill of every branch.
    fn fork(
        &mut self,
        w: WorkerId,
        top: usize,
        trace_idx: u32,
        r: Leaving,
        outs: &[u32],
    ) -> Result<bool, ServeError> {
        let n = outs.len() as u32;
        let Some(pool) = self.workers[w as usize].pool.as_mut() else {
            return Ok(false);
        };
        // The decode pool keeps no text-prefix (radix) cache: prefix KV loaded from the
        // store is copied into private pages, so nothing outside this request shares them.
        let state = BranchState::new(Vec::new(), self.tops[top].rec.id);
        let forked = match fork_request(pool, r.seq, &state, n, AdmissionInput::default()) {
            Ok(f) => f,
            Err(_) => {
                self.counters.forks_refused += 1;
                return Ok(false);
            }
        };
        let c = &mut self.counters;
        c.forks += 1;
        c.fork_pages_shared += forked.cost.pages_shared;
        c.fork_copy_bytes += forked.cost.tail_copy_bytes;
        c.fork_state_clones += u64::from(forked.cost.state_clones);
        c.fork_state_bytes += forked.cost.state_bytes;
        c.fork_prefill_tokens_avoided += r.ctx * u64::from(n);
        let wk = &mut self.workers[w as usize];
        wk.extra.push(Extra::TailCopy {
            bytes: forked.cost.tail_copy_bytes,
        });
        if self.cfg.kv_tables {
            wk.copies
                .extend(forked.copies.iter().map(|c| (c.src, c.dst)));
        }
        for (i, b) in forked.branches.iter().enumerate() {
            // A forked branch only decodes; it yields at least one token, as a re-prefilled
            // branch does (its prefill emits the first).
            let tokens = outs.get(i).copied().unwrap_or(0).max(1);
            let job = self.new_job(
                top as u32,
                trace_idx,
                Some(i as u32),
                r.ctx as u32,
                tokens,
                Vec::new(),
                false,
            );
            self.jobs[job as usize].seq = Some(b.seq);
            self.jobs[job as usize].decode_worker = w;
            let wk = &mut self.workers[w as usize];
            let Some(pool) = wk.pool.as_ref() else {
                return Err(ServeError::Unexpected(Done::Step(w)));
            };
            wk.batch.admit(pool, job, b.seq, r.ctx, u64::from(tokens))?;
        }
        Ok(true)
    }
}

#[cfg(test)]
mod synthetic_tests {
    use super::synthetic_bytes;

    /// The stand-in embedding: xorshift64 (Marsaglia's 13/7/17) seeded by an FNV-style
    /// fold of the seed bytes, low byte of each state. A pure function of the seed,
    /// different for different seeds and spread over the byte values, so an object read
    /// back under the wrong key cannot pass its checksum. The known answer was computed by
    /// an independent Python implementation of that definition.
    #[test]
    fn synthetic_bytes_are_xorshift_of_the_seed() {
        let a = synthetic_bytes(b"image-a", 4096);
        assert_eq!(&a[..8], &[0xd4, 0x89, 0xca, 0x25, 0x37, 0xb1, 0xb6, 0xcf]);
        assert_eq!(a, synthetic_bytes(b"image-a", 4096));
        assert_ne!(a, synthetic_bytes(b"image-b", 4096));
        let mut seen = [false; 256];
        for &x in &a {
            seen[x as usize] = true;
        }
        assert!(seen.iter().filter(|&&s| s).count() > 240);
        assert!(synthetic_bytes(b"image-a", 0).is_empty());
    }
}

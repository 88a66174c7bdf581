//! The EPD cluster model: router, encoder pool, prefill and decode instances, the store and
//! the links between them, driven by the event queue in virtual time.
//!
//! Every decision about cache, fork and eviction is the core's: encoder outputs go through
//! `MmCache` (size-only commit, validated lookup, readback), prefix KV blocks through the same
//! `MemStore` with the configured eviction policy (keyed by `StoreKey`, the compact form of
//! the string keys `kv:<block>` and `mc:mm{meta,blob}:<fp>`), decode KV through the fork `PoolCore`
//! (allocation, append, copy-on-write, fork, release). The model here decides only time:
//! queueing, batching, and the cost model's durations.
//!
//! Simplifications, stated: each worker's NIC is one FIFO resource (concurrent transfers
//! on it share bandwidth by queueing, not by fluid sharing); the store's own NICs are not
//! modelled; a preempted decode sequence loses its KV and pays a recompute prefill of its
//! context on re-admission; B0 runs one kind of work at a time per GPU (encode, then a
//! prefill chunk, then a decode iteration).

use std::collections::VecDeque;

use moonagent_core::fingerprint::{Dtype, GridThw, ImageFp, ImageHasher, ModelParts};
use moonagent_core::fork::{PoolConfig, PoolCore, SeqId};
use moonagent_core::mm_cache::{CacheConfig, Lookup, MmCache, ModelCtx};
use moonagent_core::store::{
    AccessHints, DataType, MemStore, Payload, ReplicateConfig, StoreError, StoreKey,
};
use moonagent_models::{CostModel, Flow, HardwareProfile, Link, LinkKind, ModelSpec};
use moonagent_traces::schema::Request;

use super::config::SimConfig;
use super::decode::{DecodeBatch, Leaving, StepOutcome};
use super::engine::{EventQueue, Time};
use super::metrics::{Percentiles, RequestRecord, Summary, NONE};

type Job = u32;
type WorkerId = u32;

#[derive(Debug, Clone, Copy)]
enum Ev {
    StepDone(WorkerId),
    ImageStored(Job, u32),
    ImagesLoaded(Job),
    KvArrived(Job),
    Dispatch(Job),
}

const P_STEP: u8 = 0;
const P_STORED: u8 = 1;
const P_LOADED: u8 = 2;
const P_KV: u8 = 3;
const P_DISPATCH: u8 = 4;

#[derive(Debug, Clone, Copy)]
struct Img {
    content: u64,
    tokens: u32,
    grid: GridThw,
}

#[derive(Debug, Clone)]
struct JobState {
    top: u32,
    trace_idx: u32,
    branch: Option<u32>,
    prompt: u32,
    decode_left: u32,
    images: Vec<Img>,
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
}

#[derive(Debug)]
enum Inflight {
    Idle,
    Encode(Vec<(Job, u32)>),
    Prefill(Vec<(Job, u32)>),
    Decode,
}

struct Worker {
    enc: bool,
    pre: bool,
    dec: bool,
    inflight: Inflight,
    enc_q: VecDeque<(Job, u32)>,
    enc_q_tokens: u64,
    pre_q: VecDeque<Job>,
    pre_q_tokens: u64,
    dec_wait: VecDeque<Job>,
    batch: DecodeBatch,
    pool: Option<PoolCore>,
    nic_free: Time,
    extra_ns: u64,
}

impl Worker {
    fn load(&self) -> u64 {
        self.enc_q_tokens
            + self.pre_q_tokens
            + self.dec_wait.len() as u64
            + u64::from(self.batch.len())
    }
}

struct Top {
    rec: RequestRecord,
    branches_left: u32,
    done: bool,
}

/// A simulation over one trace under one configuration.
pub struct Simulation<'a> {
    cfg: SimConfig,
    trace: &'a [Request],
    block_size: u32,
    cost: CostModel,
    hw: HardwareProfile,
    spec: ModelSpec,
    link: Link,
    q: EventQueue<Ev>,
    workers: Vec<Worker>,
    encoders: Vec<WorkerId>,
    prefills: Vec<WorkerId>,
    decodes: Vec<WorkerId>,
    rr: [usize; 3],
    jobs: Vec<JobState>,
    tops: Vec<Top>,
    cache: MmCache<MemStore<StoreKey>>,
    ctxs: Vec<ModelCtx>,
    s: Summary,
    encoder_gpu_ns: u64,
    encoder_saved_ns: u64,
    kv_lookups: u64,
    kv_hits: u64,
    image_refs: u64,
    step_out: StepOutcome,
    fp_memo: FpMemo,
}

/// Image fingerprints by (model, content, grid) for content-addressed keys.
type FpMemo = rustc_hash::FxHashMap<([u8; 32], u64, u64, u64, u64), ImageFp>;

/// The fingerprint of `img` under `ctx`, salted by `scope` for request-scoped keys (B1).
/// A pure function of its inputs: content-addressed ones are memoised so the simulator
/// pays BLAKE2b once per distinct image, not once per reference (scoped ones never
/// repeat, so they are not kept).
fn image_fp(
    memo: &mut FpMemo,
    ctx: &ModelCtx,
    img: &Img,
    scope: Option<u64>,
) -> Result<ImageFp, String> {
    let key = (ctx.fp().0, img.content, img.grid.t, img.grid.h, img.grid.w);
    if scope.is_none() {
        if let Some(fp) = memo.get(&key) {
            return Ok(*fp);
        }
    }
    let mut h = ImageHasher::new(&ctx.fp(), img.grid, &[16], Dtype::U8)
        .map_err(err("image fingerprint"))?;
    h.update(&img.content.to_le_bytes());
    h.update(&scope.unwrap_or(u64::MAX).to_le_bytes());
    let fp = h.finish().map_err(err("image fingerprint"))?;
    if scope.is_none() {
        memo.insert(key, fp);
    }
    Ok(fp)
}

/// The images of `r` as the simulator carries them (at least one visual token; a grid
/// of `1 x 2 x 2n` patches when the trace gives none).
fn images_of(r: &Request) -> Vec<Img> {
    r.images
        .iter()
        .map(|i| {
            let tokens = i.visual_tokens.max(1);
            Img {
                content: i.content_id,
                tokens,
                grid: i
                    .grid_thw
                    .map_or(GridThw::new(1, 2, 2 * u64::from(tokens)), |g| {
                        GridThw::new(u64::from(g[0]), u64::from(g[1]), u64::from(g[2]))
                    }),
            }
        })
        .collect()
}

fn err<E: std::fmt::Display>(what: &str) -> impl FnOnce(E) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl<'a> Simulation<'a> {
    /// Build the cluster for `cfg` over `trace` (prefix blocks of `block_size` tokens).
    pub fn new(cfg: &SimConfig, trace: &'a [Request], block_size: u32) -> Result<Self, String> {
        cfg.validate()?;
        let hw = HardwareProfile::by_name(&cfg.hardware).map_err(err("hardware"))?;
        let spec = ModelSpec::by_name(&cfg.model).map_err(err("model"))?;
        let cost = CostModel::new(&hw, &spec, cfg.tp).map_err(err("cost model"))?;
        let kind: LinkKind = serde_json::from_value(serde_json::Value::String(cfg.link.clone()))
            .map_err(|_| {
                format!(
                    "link: expected nvlink, rdma, tcp or pcie, got {:?}",
                    cfg.link
                )
            })?;
        let link = *hw.link(kind).map_err(err("link"))?;
        let kv_tokens = cost.kv_capacity_tokens(cfg.kv_mem_fraction);
        let pages = u32::try_from(kv_tokens / u64::from(cfg.kv_block_tokens)).unwrap_or(u32::MAX);
        if pages == 0 {
            return Err(format!(
                "kv_mem_fraction: leaves no KV pages on {} for {}",
                hw.name, spec.name
            ));
        }
        let pool = || {
            PoolCore::new(PoolConfig::new(
                pages,
                cfg.kv_block_tokens,
                spec.kv_bytes_per_token(),
            ))
            .map_err(err("kv pool"))
        };
        let mut workers = Vec::new();
        let (mut encoders, mut prefills, mut decodes) = (Vec::new(), Vec::new(), Vec::new());
        let mk = |enc, pre, dec, pool: Option<PoolCore>| Worker {
            enc,
            pre,
            dec,
            inflight: Inflight::Idle,
            enc_q: VecDeque::new(),
            enc_q_tokens: 0,
            pre_q: VecDeque::new(),
            pre_q_tokens: 0,
            dec_wait: VecDeque::new(),
            batch: DecodeBatch::new(cfg.kv_block_tokens),
            pool,
            nic_free: 0,
            extra_ns: 0,
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
            for _ in 0..cfg.gpus / cfg.tp {
                let id = workers.len() as u32;
                encoders.push(id);
                prefills.push(id);
                decodes.push(id);
                workers.push(mk(true, true, true, Some(pool()?)));
            }
        }
        let store: MemStore<StoreKey> = MemStore::with_policy(cfg.store.clone(), &cfg.policy)?;
        let cache = MmCache::with_config(store, CacheConfig::default());
        let mut s = Summary {
            mode: cfg.mode.name().into(),
            ..Summary::default()
        };
        s.injected = trace.len() as u64;
        Ok(Self {
            cfg: cfg.clone(),
            trace,
            block_size: block_size.max(1),
            cost,
            hw,
            spec,
            link,
            q: EventQueue::new(),
            workers,
            encoders,
            prefills,
            decodes,
            rr: [0; 3],
            jobs: Vec::new(),
            tops: Vec::with_capacity(trace.len()),
            cache,
            ctxs: Vec::new(),
            s,
            encoder_gpu_ns: 0,
            encoder_saved_ns: 0,
            kv_lookups: 0,
            kv_hits: 0,
            image_refs: 0,
            step_out: StepOutcome::default(),
            fp_memo: Default::default(),
        })
    }

    /// Build the model contexts up to `tenant`'s (`ctxs[tenant]`) on first use.
    fn ensure_ctx(&mut self, tenant: u32) -> Result<(), String> {
        while self.ctxs.len() <= tenant as usize {
            let parts = ModelParts::example(&format!("tenant-{}", self.ctxs.len()));
            let hidden = self.spec.encoder_output_bytes_per_token() / self.spec.dtype_bytes();
            self.ctxs
                .push(ModelCtx::new(parts, hidden).map_err(err("model context"))?);
        }
        Ok(())
    }

    /// Run to completion (or the horizon); per-request records in trace order and the summary.
    pub fn run(mut self) -> Result<(Summary, Vec<RequestRecord>), String> {
        let mut cursor = 0usize;
        loop {
            let next_arrival = self.trace.get(cursor).map(|r| r.arrival_ns);
            let next_event = self.q.peek_key();
            // Arrivals sort after every other kind at equal times.
            let take_arrival = match (next_arrival, next_event) {
                (Some(a), Some((t, _))) => a < t,
                (Some(_), None) => true,
                (None, _) => false,
            };
            let now = if take_arrival {
                next_arrival.unwrap_or(0)
            } else {
                next_event.map_or(0, |k| k.0)
            };
            if next_arrival.is_none() && next_event.is_none() {
                break;
            }
            if self.cfg.horizon_ns > 0 && now > self.cfg.horizon_ns {
                break;
            }
            if take_arrival {
                let t = self.q.advance_to(now);
                self.s.events_by_kind[0] += 1;
                self.arrive(t, cursor)?;
                cursor += 1;
            } else if let Some((t, ev)) = self.q.pop() {
                self.handle(t, ev)?;
            }
        }
        Ok(self.finish(cursor))
    }

    /// A worker for `role` (0 encode, 1 prefill, 2 decode): least loaded under smart
    /// scheduling, else round robin.
    fn pick(&mut self, role: usize) -> WorkerId {
        let pool = match role {
            0 => &self.encoders,
            1 => &self.prefills,
            _ => &self.decodes,
        };
        if self.cfg.mode.smart_scheduling() {
            // Least loaded; ties to the lowest id (deterministic).
            let workers = &self.workers;
            *pool
                .iter()
                .min_by_key(|&&w| (workers[w as usize].load(), w))
                .unwrap_or(&pool[0])
        } else {
            let w = pool[self.rr[role] % pool.len()];
            self.rr[role] += 1;
            w
        }
    }

    fn arrive(&mut self, now: Time, idx: usize) -> Result<(), String> {
        let r = &self.trace[idx];
        let branches = r.fork.as_ref().map_or(0, |f| f.branches);
        let rec = RequestRecord {
            id: r.id,
            session: r.session,
            arrival_ns: now,
            encode_start_ns: NONE,
            encode_end_ns: NONE,
            prefill_start_ns: NONE,
            prefill_end_ns: NONE,
            first_token_ns: NONE,
            finish_ns: NONE,
            output_tokens: 0,
            path_tokens: u64::from(r.output_tokens.max(1))
                + r.fork.as_ref().map_or(0, |f| {
                    f.output_tokens.iter().copied().max().map_or(0, u64::from)
                }),
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
        self.tops.push(Top {
            rec,
            branches_left: branches,
            done: false,
        });
        let images = images_of(r);
        let job = self.new_job(
            top,
            idx as u32,
            None,
            r.prompt_tokens.max(1),
            r.output_tokens.saturating_sub(1),
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
        images: Vec<Img>,
        fork_after: bool,
    ) -> Job {
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
        });
        (self.jobs.len() - 1) as Job
    }

    /// Send a job to its first stage: fingerprinting then dispatch (EPD), or a colocated GPU.
    fn route(&mut self, now: Time, job: Job) -> Result<(), String> {
        if self.cfg.mode.disaggregated() {
            let pixel_bytes: u64 = self.jobs[job as usize]
                .images
                .iter()
                .map(|i| u64::from(i.tokens) * self.spec.pixel_bytes_per_visual_token())
                .sum();
            let fp_ns = if pixel_bytes > 0 {
                moonagent_models::fingerprint_time_ns(&self.hw.host, pixel_bytes)
            } else {
                0
            };
            self.q.push(now + fp_ns, P_DISPATCH, Ev::Dispatch(job));
            Ok(())
        } else {
            let w = self.pick(0);
            let j = &mut self.jobs[job as usize];
            j.prefill_worker = w;
            j.decode_worker = w;
            self.dispatch_images(now, job, Some(w))
        }
    }

    fn dispatch_images(
        &mut self,
        now: Time,
        job: Job,
        colo: Option<WorkerId>,
    ) -> Result<(), String> {
        let images = std::mem::take(&mut self.jobs[job as usize].images);
        let top = self.jobs[job as usize].top as usize;
        let tenant = self.trace[self.jobs[job as usize].trace_idx as usize].tenant;
        let mut seen: Vec<u64> = Vec::with_capacity(images.len());
        let mut kept = Vec::with_capacity(images.len());
        let mut to_kick: Vec<WorkerId> = Vec::new();
        let cache = self.cfg.mode.cache() && !images.is_empty();
        if cache {
            self.ensure_ctx(tenant)?;
        }
        for img in images {
            self.image_refs += 1;
            self.tops[top].rec.images += 1;
            if seen.contains(&img.content) {
                self.tops[top].rec.images_dedup += 1;
                self.s.images_dedup += 1;
                continue;
            }
            seen.push(img.content);
            let bytes = u64::from(img.tokens) * self.spec.encoder_output_bytes_per_token();
            if cache {
                let ctx = &self.ctxs[tenant as usize];
                let fp = image_fp(&mut self.fp_memo, ctx, &img, None)?;
                let exp = ctx.expect(img.grid).map_err(err("image grid"))?;
                if let Lookup::Hit { .. } = self
                    .cache
                    .lookup_size_only(now, &fp, &exp)
                    .map_err(err("cache lookup"))?
                {
                    self.tops[top].rec.images_hit += 1;
                    self.s.images_hit += 1;
                    self.encoder_saved_ns += self.cost.encoder_time_ns(&[img.tokens]);
                    self.jobs[job as usize].load_bytes += bytes;
                    kept.push(img);
                    continue;
                }
            }
            let w = match colo {
                Some(w) => w,
                None => self.pick(0),
            };
            let idx = kept.len() as u32;
            kept.push(img);
            let wk = &mut self.workers[w as usize];
            wk.enc_q.push_back((job, idx));
            wk.enc_q_tokens += u64::from(img.tokens);
            self.jobs[job as usize].pending_images += 1;
            if !to_kick.contains(&w) {
                to_kick.push(w);
            }
        }
        self.jobs[job as usize].images = kept;
        for w in to_kick {
            self.kick(now, w)?;
        }
        if self.jobs[job as usize].pending_images == 0 {
            self.images_ready(now, job)?;
        }
        Ok(())
    }

    fn transfer(
        &mut self,
        now: Time,
        a: WorkerId,
        b: Option<WorkerId>,
        flow: Flow,
        bytes: u64,
    ) -> Time {
        let mut start = now.max(self.workers[a as usize].nic_free);
        if let Some(b) = b {
            start = start.max(self.workers[b as usize].nic_free);
        }
        let end = start + moonagent_models::transfer_time_ns(&self.link, flow, bytes);
        self.workers[a as usize].nic_free = end;
        if let Some(b) = b {
            self.workers[b as usize].nic_free = end;
        }
        end
    }

    fn handle(&mut self, now: Time, ev: Ev) -> Result<(), String> {
        let kind = match ev {
            Ev::Dispatch(_) => 1,
            Ev::StepDone(_) => 2,
            Ev::ImageStored(..) => 3,
            Ev::ImagesLoaded(_) => 4,
            Ev::KvArrived(_) => 5,
        };
        self.s.events_by_kind[kind] += 1;
        match ev {
            Ev::Dispatch(job) => self.dispatch_images(now, job, None),
            Ev::StepDone(w) => self.step_done(now, w),
            Ev::ImageStored(job, img) => self.image_stored(now, job, img),
            Ev::ImagesLoaded(job) => {
                let j = &self.jobs[job as usize];
                let w = j.prefill_worker;
                let new = j.prompt - j.cached_prefix;
                let wk = &mut self.workers[w as usize];
                wk.pre_q.push_back(job);
                wk.pre_q_tokens += u64::from(new);
                self.kick(now, w)
            }
            Ev::KvArrived(job) => {
                let w = self.jobs[job as usize].decode_worker;
                self.workers[w as usize].dec_wait.push_back(job);
                self.kick(now, w)
            }
        }
    }

    fn image_stored(&mut self, now: Time, job: Job, idx: u32) -> Result<(), String> {
        let img = self.jobs[job as usize].images[idx as usize];
        let tenant = self.trace[self.jobs[job as usize].trace_idx as usize].tenant;
        self.ensure_ctx(tenant)?;
        let ctx = &self.ctxs[tenant as usize];
        // B1 keys are request-scoped (no cross-request reuse); B2+ are content-addressed.
        let scope = if self.cfg.mode.cache() {
            None
        } else {
            Some(u64::from(job))
        };
        let fp = image_fp(&mut self.fp_memo, ctx, &img, scope)?;
        let exp = ctx.expect(img.grid).map_err(err("image grid"))?;
        self.cache
            .commit_size_only(now, ctx, fp, img.grid)
            .map_err(err("cache commit"))?;
        // Cache is transport: the prefill side reads the fresh output back through the
        // validated path (counted as a readback, not a hit). If the store refused or lost
        // it, the output still reaches the prefill worker directly (fail-open).
        let _ = self
            .cache
            .readback_size_only(now, &fp, &exp)
            .map_err(err("cache readback"))?;
        let j = &mut self.jobs[job as usize];
        j.load_bytes += u64::from(img.tokens) * self.spec.encoder_output_bytes_per_token();
        j.pending_images -= 1;
        if j.pending_images == 0 {
            self.images_ready(now, job)?;
        }
        Ok(())
    }

    /// All images of `job` are available: place its prefill, look up its prefix KV, load.
    fn images_ready(&mut self, now: Time, job: Job) -> Result<(), String> {
        if !self.cfg.mode.disaggregated() {
            let j = &self.jobs[job as usize];
            let (w, new) = (j.prefill_worker, j.prompt);
            let wk = &mut self.workers[w as usize];
            wk.pre_q.push_back(job);
            wk.pre_q_tokens += u64::from(new);
            return self.kick(now, w);
        }
        let w = self.pick(1);
        self.jobs[job as usize].prefill_worker = w;
        // Prefix KV from the store: the leading run of present blocks is reused.
        let mut hit_blocks = 0u64;
        let mut missing = Vec::new();
        if self.cfg.kv_prefix_store {
            let tr = &self.trace[self.jobs[job as usize].trace_idx as usize];
            let mut prefix = true;
            for &b in &tr.prompt_blocks {
                self.kv_lookups += 1;
                // The key `kv:<b>`, in its compact form.
                let found = self
                    .cache
                    .store_mut()
                    .exists_hinted(now, &StoreKey::Kv(b), Some(AccessHints::default()))
                    .map_err(err("kv lookup"))?;
                if found && prefix {
                    hit_blocks += 1;
                    self.kv_hits += 1;
                } else {
                    prefix = false;
                    if !found {
                        missing.push(b);
                    }
                }
            }
        }
        let j = &mut self.jobs[job as usize];
        j.cached_prefix =
            ((hit_blocks * u64::from(self.block_size)) as u32).min(j.prompt.saturating_sub(1));
        j.kv_missing = missing;
        let kv_bytes = u64::from(j.cached_prefix) * self.spec.kv_bytes_per_token();
        let img_bytes = j.load_bytes;
        let top = j.top as usize;
        self.tops[top].rec.prefix_hit_tokens += u64::from(self.jobs[job as usize].cached_prefix);
        let mut t = now;
        if img_bytes > 0 {
            t = self.transfer(now, w, None, Flow::Get, img_bytes);
        }
        if kv_bytes > 0 {
            t = self.transfer(t, w, None, Flow::KvGet, kv_bytes);
        }
        self.tops[top].rec.bytes_store_prefill += img_bytes + kv_bytes;
        self.s.link_bytes[1] += img_bytes + kv_bytes;
        self.q.push(t, P_LOADED, Ev::ImagesLoaded(job));
        Ok(())
    }

    /// Start the next batch on an idle worker: encode, then prefill, then decode.
    fn kick(&mut self, now: Time, w: WorkerId) -> Result<(), String> {
        let wk = &self.workers[w as usize];
        if !matches!(wk.inflight, Inflight::Idle) {
            return Ok(());
        }
        if wk.enc && !wk.enc_q.is_empty() {
            return self.start_encode(now, w);
        }
        if wk.pre && !wk.pre_q.is_empty() {
            return self.start_prefill(now, w);
        }
        if wk.dec && (!wk.batch.is_empty() || !wk.dec_wait.is_empty()) {
            return self.start_decode(now, w);
        }
        Ok(())
    }

    fn start_encode(&mut self, now: Time, w: WorkerId) -> Result<(), String> {
        let budget = u64::from(self.cfg.encoder_max_batch_tokens);
        let mut batch = Vec::new();
        let mut tokens = Vec::new();
        let mut sum = 0u64;
        while let Some(&(job, idx)) = self.workers[w as usize].enc_q.front() {
            let t = self.jobs[job as usize].images[idx as usize].tokens;
            if !batch.is_empty() && sum + u64::from(t) > budget {
                break;
            }
            self.workers[w as usize].enc_q.pop_front();
            self.workers[w as usize].enc_q_tokens -= u64::from(t);
            sum += u64::from(t);
            batch.push((job, idx));
            tokens.push(t);
            let top = self.jobs[job as usize].top as usize;
            let rec = &mut self.tops[top].rec;
            // Stage times are the request's own path; re-run branches do not move them.
            if rec.encode_start_ns == NONE && self.jobs[job as usize].branch.is_none() {
                rec.encode_start_ns = now;
            }
        }
        let dur = self.cost.encoder_time_ns(&tokens);
        self.encoder_gpu_ns += dur * u64::from(self.cfg.tp);
        self.workers[w as usize].inflight = Inflight::Encode(batch);
        self.q.push(now + dur, P_STEP, Ev::StepDone(w));
        Ok(())
    }

    fn start_prefill(&mut self, now: Time, w: WorkerId) -> Result<(), String> {
        let mut budget = self.cfg.prefill_chunk_tokens;
        let mut chunks = Vec::new();
        let mut shapes = Vec::new();
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
            shapes.push((take, j.cached_prefix + j.prefill_done));
            let top = j.top as usize;
            if j.branch.is_none() && self.tops[top].rec.prefill_start_ns == NONE {
                self.tops[top].rec.prefill_start_ns = now;
            }
        }
        let dur = self.cost.prefill_batch_time_ns(&shapes);
        self.workers[w as usize].inflight = Inflight::Prefill(chunks);
        self.q.push(now + dur, P_STEP, Ev::StepDone(w));
        Ok(())
    }

    fn start_decode(&mut self, now: Time, w: WorkerId) -> Result<(), String> {
        // Admit waiting sequences while the batch and the KV pool allow.
        while self.workers[w as usize].batch.len() < self.cfg.decode_max_batch {
            let Some(&job) = self.workers[w as usize].dec_wait.front() else {
                break;
            };
            let ctx = u64::from(self.jobs[job as usize].prompt) + 1;
            let wk = &mut self.workers[w as usize];
            let pool = wk.pool.as_mut().ok_or("decode worker without a KV pool")?;
            match pool.allocate(ctx) {
                Ok(seq) => {
                    wk.dec_wait.pop_front();
                    let j = &mut self.jobs[job as usize];
                    if j.preempted {
                        // Recompute the lost KV before the sequence decodes again.
                        wk.extra_ns += self.cost.prefill_time_ns(ctx as u32, 0);
                        j.preempted = false;
                    }
                    j.seq = Some(seq);
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
            return Err(format!(
                "decode worker {w}: a sequence of {} tokens does not fit the KV pool (raise kv_mem_fraction or use a larger GPU)",
                self.jobs[wk.dec_wait[0] as usize].prompt
            ));
        }
        let dur = self
            .cost
            .decode_iter_time_ns(wk.batch.len(), wk.batch.ctx_sum())
            + std::mem::take(&mut wk.extra_ns);
        wk.inflight = Inflight::Decode;
        self.q.push(now + dur, P_STEP, Ev::StepDone(w));
        Ok(())
    }

    fn step_done(&mut self, now: Time, w: WorkerId) -> Result<(), String> {
        match std::mem::replace(&mut self.workers[w as usize].inflight, Inflight::Idle) {
            Inflight::Idle => {}
            Inflight::Encode(batch) => {
                for (job, idx) in batch {
                    let top = self.jobs[job as usize].top as usize;
                    if self.jobs[job as usize].branch.is_none() {
                        self.tops[top].rec.encode_end_ns = now;
                    }
                    self.tops[top].rec.images_encoded += 1;
                    self.s.images_encoded += 1;
                    if self.cfg.mode.disaggregated() {
                        let bytes = u64::from(self.jobs[job as usize].images[idx as usize].tokens)
                            * self.spec.encoder_output_bytes_per_token();
                        let t = self.transfer(now, w, None, Flow::Put, bytes);
                        self.tops[top].rec.bytes_encoder_store += bytes;
                        self.s.link_bytes[0] += bytes;
                        self.q.push(t, P_STORED, Ev::ImageStored(job, idx));
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
                    self.workers[w as usize].pre_q_tokens -= u64::from(n);
                    let j = &mut self.jobs[job as usize];
                    j.prefill_done += n;
                    if j.prefill_done + j.cached_prefix < j.prompt {
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

    fn prefill_finished(&mut self, now: Time, w: WorkerId, job: Job) -> Result<(), String> {
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
            let block_bytes = u64::from(self.block_size) * self.spec.kv_bytes_per_token();
            for b in missing {
                match self.cache.store_mut().put_with(
                    now,
                    StoreKey::Kv(b),
                    Payload::SizeOnly(block_bytes),
                    &ReplicateConfig::of(DataType::KvCache),
                    AccessHints::default(),
                ) {
                    Ok(_) => {
                        let _ = self.transfer(now, w, None, Flow::KvPut, block_bytes);
                    }
                    Err(StoreError::NoAvailableHandle | StoreError::AlreadyExists) => {}
                    Err(e) => return Err(format!("kv put: {e}")),
                }
            }
        }
        let dec = if self.cfg.mode.disaggregated() {
            self.pick(2)
        } else {
            w
        };
        self.jobs[job as usize].decode_worker = dec;
        if self.cfg.mode.disaggregated() {
            let bytes = u64::from(self.jobs[job as usize].prompt) * self.spec.kv_bytes_per_token();
            let t = self.transfer(now, w, Some(dec), Flow::KvPut, bytes);
            self.tops[top].rec.bytes_prefill_decode += bytes;
            self.s.link_bytes[2] += bytes;
            self.q.push(t, P_KV, Ev::KvArrived(job));
        } else {
            self.workers[dec as usize].dec_wait.push_back(job);
        }
        Ok(())
    }

    fn decode_done(&mut self, now: Time, w: WorkerId) -> Result<(), String> {
        let mut out = std::mem::take(&mut self.step_out);
        let wk = &mut self.workers[w as usize];
        let pool = wk.pool.as_mut().ok_or("decode worker without a KV pool")?;
        wk.batch.step(pool, &mut out)?;
        self.s.fork_copy_bytes += out.cow_bytes;
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
            self.s.preemptions += 1;
            let j = &mut self.jobs[r.job as usize];
            j.preempted = true;
            j.seq = None;
            // The sequence re-enters with its context as the new prompt.
            j.prompt = r.ctx as u32;
            self.workers[w as usize].dec_wait.push_front(r.job);
        }
        let mut res = Ok(());
        for &r in &out.finished {
            res = self.job_finished(now, w, r);
            if res.is_err() {
                break;
            }
        }
        self.step_out = out;
        res
    }

    fn job_finished(&mut self, now: Time, w: WorkerId, r: Leaving) -> Result<(), String> {
        let job = r.job;
        let top = self.jobs[job as usize].top as usize;
        if self.jobs[job as usize].fork_after {
            self.jobs[job as usize].fork_after = false;
            let tr = &self.trace[self.jobs[job as usize].trace_idx as usize];
            let Some(f) = tr.fork.clone() else {
                return Err("fork without a fork spec".into());
            };
            if self.cfg.mode.fork() {
                let pool = self.workers[w as usize]
                    .pool
                    .as_mut()
                    .ok_or("decode worker without a KV pool")?;
                match pool.fork(r.seq, f.branches) {
                    Ok(out) => {
                        self.s.forks += 1;
                        self.s.fork_pages_shared += out.cost.pages_shared;
                        self.s.fork_copy_bytes += out.cost.tail_copy_bytes;
                        self.s.fork_prefill_tokens_avoided += r.ctx * u64::from(f.branches);
                        let copy_ns = (out.cost.tail_copy_bytes as f64
                            / (self.hw.hbm_bytes_per_s * self.hw.efficiency.hbm_efficiency)
                            * 1e9)
                            .ceil() as u64;
                        self.workers[w as usize].extra_ns += copy_ns;
                        for (i, seq) in out.branches.iter().enumerate() {
                            let tokens = f.output_tokens.get(i).copied().unwrap_or(0);
                            let b = self.new_job(
                                top as u32,
                                self.jobs[job as usize].trace_idx,
                                Some(i as u32),
                                r.ctx as u32,
                                tokens,
                                Vec::new(),
                                false,
                            );
                            self.jobs[b as usize].seq = Some(*seq);
                            self.jobs[b as usize].decode_worker = w;
                            let wk = &mut self.workers[w as usize];
                            let pool = wk.pool.as_ref().ok_or("decode worker without a KV pool")?;
                            wk.batch.admit(pool, b, *seq, r.ctx, u64::from(tokens))?;
                        }
                        return Ok(());
                    }
                    Err(_) => {
                        // Fail-closed admission (or no room): branches fall back to
                        // independent prefill below.
                    }
                }
            }
            if let Some(pool) = self.workers[w as usize].pool.as_mut() {
                let _ = pool.release(r.seq);
            }
            let images = images_of(&self.trace[self.jobs[job as usize].trace_idx as usize]);
            for (i, &tokens) in f.output_tokens.iter().enumerate() {
                let b = self.new_job(
                    top as u32,
                    self.jobs[job as usize].trace_idx,
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

    fn finish(mut self, arrived: usize) -> (Summary, Vec<RequestRecord>) {
        // Tokens of completed decode iterations the batches have not reported yet (a run
        // cut off by its horizon).
        for wk in &self.workers {
            for (job, n) in wk.batch.unreported() {
                let top = self.jobs[job as usize].top as usize;
                self.tops[top].rec.output_tokens += n;
            }
        }
        let mut s = std::mem::take(&mut self.s);
        s.events = self.q.popped();
        s.kv_pages_in_use = self
            .workers
            .iter()
            .filter_map(|w| w.pool.as_ref())
            .map(|p| u64::from(p.stats().used))
            .sum();
        s.dropped = (self.trace.len() - arrived) as u64;
        let mut ttft = Vec::new();
        let mut tpot = Vec::new();
        let mut e2e = Vec::new();
        let mut good = 0u64;
        let mut tokens = 0u64;
        for t in &self.tops {
            if t.done {
                s.completed += 1;
                s.makespan_ns = s.makespan_ns.max(t.rec.finish_ns);
                ttft.push(t.rec.ttft_ns());
                tpot.push(t.rec.tpot_ns());
                e2e.push(t.rec.e2e_ns());
                tokens += t.rec.output_tokens;
                if (t.rec.ttft_ns() as f64) <= s_ms(self.cfg.slo.ttft_ms)
                    && (t.rec.tpot_ns() as f64) <= s_ms(self.cfg.slo.tpot_ms)
                {
                    good += 1;
                }
            } else if t.rec.first_token_ns != NONE {
                s.running += 1;
            } else {
                s.queued += 1;
            }
        }
        let span = s.makespan_ns.max(1) as f64 / 1e9;
        s.throughput_rps = s.completed as f64 / span;
        s.token_throughput = tokens as f64 / span;
        s.goodput_rps = good as f64 / span;
        s.ttft_ms = Percentiles::of_ns(ttft);
        s.tpot_ms = Percentiles::of_ns(tpot);
        s.e2e_ms = Percentiles::of_ns(e2e);
        s.encoder_gpu_s = self.encoder_gpu_ns as f64 / 1e9;
        s.encoder_gpu_s_saved = self.encoder_saved_ns as f64 / 1e9;
        s.image_hit_rate = if self.image_refs == 0 {
            0.0
        } else {
            s.images_hit as f64 / self.image_refs as f64
        };
        s.cache_readbacks = self.cache.counters().readbacks;
        s.kv_block_hit_rate = if self.kv_lookups == 0 {
            0.0
        } else {
            self.kv_hits as f64 / self.kv_lookups as f64
        };
        (s, self.tops.into_iter().map(|t| t.rec).collect())
    }

    /// KV pages in use and free on every decode worker (pool conservation checks).
    pub fn pool_stats(&self) -> Vec<moonagent_core::fork::PoolStats> {
        self.workers
            .iter()
            .filter_map(|w| w.pool.as_ref().map(|p| p.stats()))
            .collect()
    }
}

fn s_ms(ms: f64) -> f64 {
    ms * 1e6
}

/// Simulate `trace` under `cfg`.
pub fn simulate(
    cfg: &SimConfig,
    trace: &[Request],
    block_size: u32,
) -> Result<(Summary, Vec<RequestRecord>), String> {
    Simulation::new(cfg, trace, block_size)?.run()
}

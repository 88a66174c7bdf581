//! The simulator's driver of the core's serving engine: it prices every action the engine
//! emits with `moonagent-models` in virtual time and reports each completion back; it
//! decides nothing else (routing, batching, cache, prefix KV, fork and the block pools are
//! all `moonagent_core::serve::Engine`'s).
//!
//! What the driver owns is time: the event queue, each worker's NIC as one FIFO resource
//! (concurrent transfers on it share bandwidth by queueing, not by fluid sharing; the
//! store's own NICs are not modelled), and the durations of encoder batches, prefill
//! chunks and decode iterations from the cost model. A preempted decode sequence pays a
//! recompute prefill of its context on re-admission; a fork's tail copies are priced at
//! HBM bandwidth; B0 runs one kind of work at a time per GPU (the engine's batching).
//! With a hardware profile's `shared_cores` (a CPU backend's workers as threads of one
//! host), the compute steps of all workers share those cores by processor sharing.

use moonagent_core::serve::{Action, Done, Engine, EngineConfig, Extra, Flow, Payloads, Pricing};
use moonagent_core::store::{MemStore, StoreKey};
use moonagent_models::{
    shared_core_rates, CoreWeights, CostModel, DecodeContention, HardwareProfile, Link, LinkKind,
    ModelSpec,
};
use moonagent_traces::schema::Request;

use super::config::SimConfig;
use super::engine::{EventQueue, Time};
use super::metrics::{RequestRecord, Summary, WorkerRecord};
use super::SimError;

// Kind priorities at equal times: a worker's step first, then arrivals of data, then
// dispatches; trace arrivals sort after every kind.
const P_STEP: u8 = 0;
const P_STORED: u8 = 1;
const P_LOADED: u8 = 2;
const P_KV: u8 = 3;
const P_DISPATCH: u8 = 4;

/// The queue priority and `Summary::events_by_kind` slot of a completion.
fn kind(d: Done) -> (u8, usize) {
    match d {
        Done::Fingerprinted(_) => (P_DISPATCH, 1),
        Done::Step(_) => (P_STEP, 2),
        Done::Stored(..) => (P_STORED, 3),
        Done::Loaded(_) => (P_LOADED, 4),
        Done::KvArrived(_) => (P_KV, 5),
    }
}

/// The engine's configuration for `cfg` on its hardware and model.
pub fn engine_config(
    cfg: &SimConfig,
    cost: &CostModel,
    hw: &HardwareProfile,
    spec: &ModelSpec,
    block_size: u32,
) -> Result<EngineConfig, SimError> {
    let kv_tokens = cost.kv_capacity_tokens(cfg.kv_mem_fraction);
    let pages = u32::try_from(kv_tokens / u64::from(cfg.kv_block_tokens)).unwrap_or(u32::MAX);
    if pages == 0 {
        return Err(SimError::Config {
            field: "kv_mem_fraction",
            what: format!("leaves no KV pages on {} for {}", hw.name, spec.name),
        });
    }
    Ok(EngineConfig {
        mode: cfg.mode,
        encoders: cfg.encoders,
        prefills: cfg.prefills,
        decodes: cfg.decodes,
        colocated: cfg.gpus / cfg.tp,
        encoder_max_batch_tokens: cfg.encoder_max_batch_tokens,
        prefill_chunk_tokens: cfg.prefill_chunk_tokens,
        decode_max_batch: cfg.decode_max_batch,
        kv_block_tokens: cfg.kv_block_tokens,
        kv_pages: pages,
        prefix_block_tokens: block_size.max(1),
        kv_prefix_store: cfg.kv_prefix_store,
        kv_bytes_per_token: spec.kv_bytes_per_token(),
        encoder_bytes_per_token: spec.encoder_output_bytes_per_token(),
        pixel_bytes_per_token: spec.pixel_bytes_per_visual_token(),
        hidden: spec.encoder_output_bytes_per_token() / spec.dtype_bytes(),
        payloads: Payloads::SizeOnly,
        kv_tables: false,
    })
}

/// The load signal's prices: the same cost model and link that price every action.
#[derive(Debug, Clone, Copy)]
pub struct CostPricing {
    /// The roofline.
    pub cost: CostModel,
    /// The link between roles and the store.
    pub link: Link,
}

impl Pricing for CostPricing {
    fn encode_ns(&self, tokens: &[u32]) -> u64 {
        self.cost.encoder_time_ns(tokens)
    }
    fn prefill_ns(&self, chunks: &[(u32, u32)]) -> u64 {
        self.cost.prefill_batch_time_ns(chunks)
    }
    fn decode_ns(&self, batch: u32, ctx_sum: u64) -> u64 {
        self.cost.decode_iter_time_ns(batch, ctx_sum)
    }
    fn transfer_ns(&self, flow: Flow, bytes: u64) -> u64 {
        moonagent_models::transfer_time_ns(&self.link, flow, bytes)
    }
}

/// The hardware profile, model spec and prices (cost model and link) `cfg` names: what the
/// simulator prices with, and what the real backend builds its engine's pricing from.
pub fn models_of(cfg: &SimConfig) -> Result<(HardwareProfile, ModelSpec, CostPricing), SimError> {
    let hw =
        HardwareProfile::resolve(&cfg.hardware).map_err(|e| SimError::Models("hardware", e))?;
    let spec = ModelSpec::resolve(&cfg.model).map_err(|e| SimError::Models("model", e))?;
    let cost = CostModel::new(&hw, &spec, cfg.tp).map_err(|e| SimError::Models("cost model", e))?;
    let kind: LinkKind = serde_json::from_value(serde_json::Value::String(cfg.link.clone()))
        .map_err(|_| SimError::Config {
            field: "link",
            what: format!("expected nvlink, rdma, tcp or pcie, got {:?}", cfg.link),
        })?;
    let link = *hw.link(kind).map_err(|e| SimError::Models("link", e))?;
    Ok((hw, spec, CostPricing { cost, link }))
}

/// Compute steps sharing a host's cores by (weighted) processor sharing: with steps of
/// weights `w_i` running on `cores` cores, each advances at `min(1, λ w_i)` of its own
/// speed, `λ` chosen so the rates sum to `min(cores, n)` (water-filling; equal weights
/// give every step `min(1, cores / n)`). The queue holds one valid step completion at a
/// time, the earliest; completions scheduled before the rates last changed are stale and
/// skipped.
#[derive(Debug)]
struct SharedCores {
    cores: f64,
    /// Weight of each step kind, `[encode, prefill, decode]`.
    weights: [f64; 3],
    /// How many times slower than its share each kind advances while more steps run than
    /// there are cores (the profile's `oversubscribed`; all 1: plain processor sharing).
    slow: [f64; 3],
    /// The profile's `decode_contention`: when set, a decode iteration's factor while
    /// oversubscribed is its own (KV share, encoder batches beside), not `slow`'s.
    contention: Option<DecodeContention>,
    /// `(worker, work left in ns at full speed, kind, KV share of a decode iteration's
    /// bytes (0 for other steps))`, in start order.
    running: Vec<(u32, f64, usize, f64)>,
    /// The rate of each running step, as of the last change.
    rates: Vec<f64>,
    /// The weight of each running step (scratch for [`SharedCores::rerate`]).
    wts: Vec<f64>,
    /// When `running` was last advanced.
    at: Time,
    /// The completion the queue holds as valid.
    next: Option<(Time, u32)>,
}

/// Step kinds, the index into [`SharedCores::weights`].
const K_ENCODE: usize = 0;
const K_PREFILL: usize = 1;
const K_DECODE: usize = 2;

impl SharedCores {
    fn new(cores: f64, weights: [f64; 3]) -> Self {
        Self {
            cores,
            weights,
            slow: [1.0; 3],
            contention: None,
            running: Vec::new(),
            rates: Vec::new(),
            wts: Vec::new(),
            at: 0,
            next: None,
        }
    }

    /// Each running step's rate ([`shared_core_rates`]).
    fn rerate(&mut self) {
        self.wts.clear();
        self.wts
            .extend(self.running.iter().map(|r| self.weights[r.2]));
        shared_core_rates(self.cores, &self.wts, &mut self.rates);
        if self.running.len() as f64 > self.cores {
            let encoders = self.running.iter().filter(|r| r.2 == K_ENCODE).count();
            for (rate, r) in self.rates.iter_mut().zip(&self.running) {
                *rate /= match self.contention {
                    Some(c) if r.2 == K_DECODE => c.slow(r.3, encoders),
                    _ => self.slow[r.2],
                };
            }
        }
    }

    fn advance(&mut self, now: Time) {
        let dt = now.saturating_sub(self.at) as f64;
        for (r, rate) in self.running.iter_mut().zip(&self.rates) {
            r.1 -= dt * rate;
        }
        self.at = now;
    }

    fn start(&mut self, now: Time, worker: u32, ns: u64, kind: usize, kv_share: f64) {
        self.advance(now);
        self.running.push((worker, ns as f64, kind, kv_share));
        self.rerate();
    }

    /// The earliest completion, when it differs from the one the queue holds. Work left is
    /// as of the last advance (`at`), so times count from there, not from `now`.
    fn schedule(&mut self) -> Option<(Time, u32)> {
        let at = self.at;
        // Ties go to the step that started first, as the queue orders equal times.
        let next = self
            .running
            .iter()
            .zip(&self.rates)
            .enumerate()
            .map(|(i, (&(w, left, _, _), &rate))| (at + (left.max(0.0) / rate).ceil() as u64, i, w))
            .min()
            .map(|(t, _, w)| (t, w));
        if next == self.next {
            return None;
        }
        self.next = next;
        next
    }

    /// Whether the step completion `(t, worker)` popped from the queue is the valid one
    /// (then its step leaves the cores).
    fn finish(&mut self, t: Time, worker: u32) -> bool {
        if self.next != Some((t, worker)) {
            return false;
        }
        self.advance(t);
        if let Some(i) = self.running.iter().position(|r| r.0 == worker) {
            self.running.remove(i);
            self.rerate();
        }
        self.next = None;
        true
    }
}

/// A simulation over one trace under one configuration.
pub struct Simulation<'a> {
    cfg: SimConfig,
    trace: &'a [Request],
    engine: Engine<'a, MemStore<StoreKey>, Request>,
    cost: CostModel,
    hw: HardwareProfile,
    link: Link,
    q: EventQueue<Done>,
    nic_free: Vec<Time>,
    cores: Option<SharedCores>,
    encoder_gpu_ns: u64,
    encoder_saved_ns: u64,
    events_by_kind: [u64; 6],
    /// Step completions popped after the shared cores' rate changed (not events).
    stale: u64,
    workers: Vec<WorkerRecord>,
    /// Every compute step, when asked for ([`Simulation::log_steps`]).
    steps: Option<Vec<StepLog>>,
    /// Per worker, the index in `steps` of its running step.
    open: Vec<Option<usize>>,
}

/// One simulated compute step: what the real backend's `timed.jsonl` records of a measured
/// one, so the two runs' steps can be set side by side.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLog {
    /// The action that started it (an `Encode`, `Prefill` or `Decode`).
    pub action: Action,
    /// When it started, ns of simulated time.
    pub start_ns: Time,
    /// When it completed (on shared cores: later than `start_ns + priced_ns` while more
    /// steps ran than there are cores).
    pub end_ns: Time,
    /// Its priced time alone, extras included.
    pub priced_ns: u64,
}

/// Everything a run reports.
#[derive(Debug, Clone)]
pub struct Run {
    /// The run's summary.
    pub summary: Summary,
    /// One record per request that arrived, in trace order.
    pub requests: Vec<RequestRecord>,
    /// One record per worker, by id.
    pub workers: Vec<WorkerRecord>,
    /// Every compute step in start order, if [`Simulation::log_steps`] asked for them
    /// (else empty).
    pub steps: Vec<StepLog>,
}

impl<'a> Simulation<'a> {
    /// Build the cluster for `cfg` over `trace` (prefix blocks of `block_size` tokens).
    pub fn new(cfg: &SimConfig, trace: &'a [Request], block_size: u32) -> Result<Self, SimError> {
        cfg.validate()?;
        let (hw, spec, CostPricing { cost, link }) = models_of(cfg)?;
        let ecfg = engine_config(cfg, &cost, &hw, &spec, block_size)?;
        let store: MemStore<StoreKey> =
            MemStore::with_policy(cfg.store.clone(), &cfg.policy).map_err(SimError::Policy)?;
        let pricing = Box::new(CostPricing { cost, link });
        let engine = Engine::new(ecfg, store, trace, Some(pricing))?;
        let workers = engine.workers() as usize;
        let records = (0..engine.workers())
            .filter_map(|w| engine.role(w).map(|r| WorkerRecord::new(w, r)))
            .collect();
        let weights = hw.core_weights.unwrap_or(CoreWeights::EQUAL).as_array();
        let cores = hw.shared_cores.map(|c| SharedCores {
            slow: hw.oversubscribed.map_or([1.0; 3], |k| k.as_array()),
            contention: hw.decode_contention,
            ..SharedCores::new(c, weights)
        });
        Ok(Self {
            cfg: cfg.clone(),
            trace,
            engine,
            cost,
            hw,
            link,
            q: EventQueue::new(),
            nic_free: vec![0; workers],
            cores,
            encoder_gpu_ns: 0,
            encoder_saved_ns: 0,
            events_by_kind: [0; 6],
            stale: 0,
            workers: records,
            steps: None,
            open: vec![None; workers],
        })
    }

    /// Keep every compute step ([`Run::steps`]); off by default (it clones each action).
    pub fn log_steps(mut self) -> Self {
        self.steps = Some(Vec::new());
        self
    }

    /// Run to completion (or the horizon); per-request records in trace order and the summary.
    pub fn run(self) -> Result<(Summary, Vec<RequestRecord>), SimError> {
        self.run_all().map(|r| (r.summary, r.requests))
    }

    /// Run to completion (or the horizon); the summary, per-request and per-worker records.
    pub fn run_all(mut self) -> Result<Run, SimError> {
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
                self.events_by_kind[0] += 1;
                self.engine.arrive(t, cursor)?;
                cursor += 1;
                self.execute(t);
            } else if let Some((t, done)) = self.q.pop() {
                if let Some(next) = self.q.peek() {
                    self.engine.prefetch(next);
                }
                if let (Some(c), Done::Step(w)) = (self.cores.as_mut(), done) {
                    if !c.finish(t, w) {
                        self.stale += 1;
                        continue;
                    }
                }
                self.events_by_kind[kind(done).1] += 1;
                if let (Some(steps), Done::Step(w)) = (self.steps.as_mut(), done) {
                    if let Some(i) = self.open.get_mut(w as usize).and_then(Option::take) {
                        steps[i].end_ns = t;
                    }
                }
                self.engine.complete(t, done)?;
                self.execute(t);
            }
        }
        Ok(self.finish(cursor))
    }

    /// Price every action the engine decided at `now` and schedule its completion.
    fn execute(&mut self, now: Time) {
        while let Some(a) = self.engine.poll_action() {
            if let Some(steps) = self.steps.as_mut() {
                if let Action::Encode { worker, .. }
                | Action::Prefill { worker, .. }
                | Action::Decode { worker, .. } = a
                {
                    self.open[worker as usize] = Some(steps.len());
                    steps.push(StepLog {
                        action: a.clone(),
                        start_ns: now,
                        end_ns: now,
                        priced_ns: 0,
                    });
                }
            }
            match a {
                Action::Fingerprint { job, pixel_bytes } => {
                    let ns = if pixel_bytes > 0 {
                        moonagent_models::fingerprint_time_ns(&self.hw.host, pixel_bytes)
                    } else {
                        0
                    };
                    self.q.push(now + ns, P_DISPATCH, Done::Fingerprinted(job));
                }
                Action::Encode { worker, tokens, .. } => {
                    let dur = self.cost.encoder_time_ns(&tokens);
                    self.encoder_gpu_ns += dur * u64::from(self.cfg.tp);
                    let w = &mut self.workers[worker as usize];
                    w.encode_steps += 1;
                    w.encode_ns += dur;
                    self.step(now, worker, dur, K_ENCODE, 0.0);
                }
                Action::Prefill { worker, chunks, .. } => {
                    let dur = self.cost.prefill_batch_time_ns(&chunks);
                    let w = &mut self.workers[worker as usize];
                    w.prefill_steps += 1;
                    w.prefill_ns += dur;
                    self.step(now, worker, dur, K_PREFILL, 0.0);
                }
                Action::Decode {
                    worker,
                    batch,
                    ctx_sum,
                    extra,
                    ..
                } => {
                    let mut dur = self.cost.decode_iter_time_ns(batch, ctx_sum);
                    let w = &mut self.workers[worker as usize];
                    for &x in &extra {
                        dur += match x {
                            Extra::Recompute { tokens, .. } => {
                                let ns = self.cost.prefill_time_ns(tokens, 0);
                                w.recomputes += 1;
                                w.recompute_tokens += u64::from(tokens);
                                w.recompute_ns += ns;
                                ns
                            }
                            Extra::TailCopy { bytes } => {
                                let ns = (bytes as f64
                                    / (self.hw.hbm_bytes_per_s * self.hw.efficiency.hbm_efficiency)
                                    * 1e9)
                                    .ceil() as u64;
                                w.tail_copy_bytes += bytes;
                                w.tail_copy_ns += ns;
                                ns
                            }
                        };
                    }
                    w.decode_steps += 1;
                    w.decode_ns += dur;
                    w.decode_seqs += u64::from(batch);
                    // Only a profile with decode_contention prices by it.
                    let priced = self.cores.as_ref().is_some_and(|c| c.contention.is_some());
                    let kv = if priced {
                        self.cost.decode_kv_share(batch, ctx_sum)
                    } else {
                        0.0
                    };
                    self.step(now, worker, dur, K_DECODE, kv);
                }
                Action::Transfer {
                    from,
                    to,
                    flow,
                    bytes,
                    done,
                } => {
                    let t = self.transfer(now, from, to, flow, bytes);
                    if let Some(d) = done {
                        self.q.push(t, kind(d).0, d);
                    }
                }
                Action::PutBlocks {
                    from,
                    bytes_each,
                    count,
                } => {
                    for _ in 0..count {
                        self.transfer(now, from, None, Flow::KvPut, bytes_each);
                    }
                }
                Action::Load {
                    job,
                    worker,
                    embed_bytes,
                    kv_bytes,
                } => {
                    let mut t = now;
                    if embed_bytes > 0 {
                        t = self.transfer(now, worker, None, Flow::Get, embed_bytes);
                    }
                    if kv_bytes > 0 {
                        t = self.transfer(t, worker, None, Flow::KvGet, kv_bytes);
                    }
                    self.q.push(t, P_LOADED, Done::Loaded(job));
                }
                Action::EncodeAvoided { tokens } => {
                    self.encoder_saved_ns += self.cost.encoder_time_ns(&[tokens]);
                }
            }
        }
        if let Some(c) = self.cores.as_mut() {
            if let Some((t, w)) = c.schedule() {
                self.q.push(t, P_STEP, Done::Step(w));
            }
        }
    }

    /// A compute step of `dur` ns on `worker` from `now`: on its own device, or on the
    /// shared cores.
    fn step(&mut self, now: Time, worker: u32, dur: u64, kind: usize, kv_share: f64) {
        if let Some(steps) = self.steps.as_mut() {
            if let Some(&Some(i)) = self.open.get(worker as usize) {
                steps[i].priced_ns = dur;
            }
        }
        match self.cores.as_mut() {
            Some(c) => c.start(now, worker, dur, kind, kv_share),
            None => self.q.push(now + dur, P_STEP, Done::Step(worker)),
        }
    }

    /// Occupy the NICs of `a` (and `b`) for a transfer starting no earlier than `now`;
    /// returns its end.
    fn transfer(&mut self, now: Time, a: u32, b: Option<u32>, flow: Flow, bytes: u64) -> Time {
        let mut start = now.max(self.nic_free[a as usize]);
        if let Some(b) = b {
            start = start.max(self.nic_free[b as usize]);
        }
        let ns = moonagent_models::transfer_time_ns(&self.link, flow, bytes);
        let end = start + ns;
        for w in std::iter::once(a).chain(b) {
            self.nic_free[w as usize] = end;
            let r = &mut self.workers[w as usize];
            r.nic_transfers += 1;
            r.nic_bytes += bytes;
            r.nic_ns += ns;
        }
        end
    }

    fn finish(self, arrived: usize) -> Run {
        let kv_pages_in_use = self
            .engine
            .pool_stats()
            .iter()
            .map(|p| u64::from(p.used))
            .sum();
        let events = self.q.popped() - self.stale;
        let (served, c, cache) = self.engine.into_served();
        let done: Vec<bool> = served.iter().map(|t| t.done).collect();
        let recs: Vec<RequestRecord> = served.into_iter().map(|t| t.rec).collect();
        let mut s = Summary::of_run(
            self.cfg.mode,
            &self.cfg.slo,
            &recs,
            &done,
            &c,
            cache.counters().readbacks,
        );
        // `recs` holds the requests that arrived; the rest of the trace was never admitted.
        s.injected = self.trace.len() as u64;
        s.dropped = (self.trace.len() - arrived) as u64;
        s.events = events;
        s.events_by_kind = self.events_by_kind;
        s.kv_pages_in_use = kv_pages_in_use;
        s.encoder_gpu_s = self.encoder_gpu_ns as f64 / 1e9;
        s.encoder_gpu_s_saved = self.encoder_saved_ns as f64 / 1e9;
        Run {
            summary: s,
            requests: recs,
            workers: self.workers,
            steps: self.steps.unwrap_or_default(),
        }
    }
}

/// Simulate `trace` under `cfg`: everything the run reports.
pub fn simulate_all(cfg: &SimConfig, trace: &[Request], block_size: u32) -> Result<Run, SimError> {
    Simulation::new(cfg, trace, block_size)?.run_all()
}

/// Simulate `trace` under `cfg`.
pub fn simulate(
    cfg: &SimConfig,
    trace: &[Request],
    block_size: u32,
) -> Result<(Summary, Vec<RequestRecord>), SimError> {
    Simulation::new(cfg, trace, block_size)?.run()
}

#[cfg(test)]
mod tests {
    use super::{DecodeContention, SharedCores, K_DECODE, K_ENCODE, K_PREFILL};

    /// Run steps `(start, worker, ns)` on `cores` shared cores; their completions in order.
    fn finishes(cores: f64, steps: &[(u64, u32, u64)]) -> Vec<(u64, u32)> {
        weighted(
            cores,
            [1.0; 3],
            &steps
                .iter()
                .map(|&(t, w, ns)| (t, w, ns, 0))
                .collect::<Vec<_>>(),
        )
    }

    /// Run steps `(start, worker, ns, kind)` on `cores` cores shared by kind `weights`.
    fn weighted(
        cores: f64,
        weights: [f64; 3],
        steps: &[(u64, u32, u64, usize)],
    ) -> Vec<(u64, u32)> {
        let mut c = SharedCores::new(cores, weights);
        let mut out = Vec::new();
        let mut i = 0;
        loop {
            let next = c.next;
            match (steps.get(i), next) {
                (Some(&(t, w, ns, k)), n) if n.is_none_or(|(tn, _)| t < tn) => {
                    c.start(t, w, ns, k, 0.0);
                    c.schedule();
                    i += 1;
                }
                (_, Some((t, w))) => {
                    assert!(c.finish(t, w));
                    out.push((t, w));
                    c.schedule();
                }
                (None, None) => return out,
                _ => unreachable!(),
            }
        }
    }

    #[test]
    fn steps_share_the_cores_in_proportion() {
        // Alone: its own time.
        assert_eq!(finishes(1.0, &[(0, 0, 100)]), vec![(100, 0)]);
        // Two on one core: half speed each.
        assert_eq!(
            finishes(1.0, &[(0, 0, 100), (0, 1, 100)]),
            vec![(200, 0), (200, 1)]
        );
        // Two on two cores: no slowdown; three on two: two thirds speed.
        assert_eq!(
            finishes(2.0, &[(0, 0, 100), (0, 1, 100)]),
            vec![(100, 0), (100, 1)]
        );
        assert_eq!(
            finishes(2.0, &[(0, 0, 100), (0, 1, 100), (0, 2, 100)]),
            vec![(150, 0), (150, 1), (150, 2)]
        );
        // A late start slows the first: 50 done alone by 50, then 50 left at half speed.
        assert_eq!(
            finishes(1.0, &[(0, 0, 100), (50, 1, 100)]),
            vec![(150, 0), (200, 1)]
        );
    }

    #[test]
    fn a_completion_scheduled_before_the_rate_changed_is_stale() {
        let mut c = SharedCores::new(1.0, [1.0; 3]);
        c.start(0, 0, 100, K_ENCODE, 0.0);
        assert_eq!(c.schedule(), Some((100, 0)));
        c.start(10, 1, 100, K_ENCODE, 0.0);
        // Worker 0 has 90 left at half speed.
        assert_eq!(c.schedule(), Some((190, 0)));
        assert!(!c.finish(100, 0), "the old completion is stale");
        assert_eq!(c.schedule(), None, "nothing changed");
        assert!(c.finish(190, 0));
    }

    /// Weighted sharing: a step whose weighted share exceeds a core runs at full speed and
    /// the rest share what is left by weight (water-filling); equal weights are the plain
    /// rates above.
    #[test]
    fn weighted_steps_share_by_weight_and_none_exceeds_a_core() {
        let w = [1.0, 1.0, 3.0];
        // E, P, D on two cores: D's share 2 * 3/5 > 1, so D runs alone on one core and E
        // and P halve the other; after D ends at 100 they have 50 left each, at full speed.
        assert_eq!(
            weighted(
                2.0,
                w,
                &[
                    (0, 0, 100, K_ENCODE),
                    (0, 1, 100, K_PREFILL),
                    (0, 2, 100, K_DECODE)
                ]
            ),
            vec![(100, 2), (150, 0), (150, 1)]
        );
        // E and D on one core: rates 1/4 and 3/4; D ends at ceil(100 / 0.75) = 134, when E
        // has 100 - 134 / 4 = 66.5 left, alone: ends at 134 + 67 = 201.
        assert_eq!(
            weighted(1.0, w, &[(0, 0, 100, K_ENCODE), (0, 1, 100, K_DECODE)]),
            vec![(134, 1), (201, 0)]
        );
        // Weights are relative: scaling them changes nothing.
        let steps = [
            (0, 0, 300, K_ENCODE),
            (5, 1, 70, K_DECODE),
            (9, 2, 200, K_PREFILL),
        ];
        assert_eq!(
            weighted(2.0, w, &steps),
            weighted(2.0, w.map(|x| x * 7.5), &steps)
        );
        // Equal weights of any size are plain processor sharing.
        assert_eq!(
            weighted(2.0, [4.0; 3], &steps),
            finishes(2.0, &steps.map(|(t, w, ns, _)| (t, w, ns)))
        );
    }

    /// Start every step `(start, worker, ns, kind, KV share)` on `c` (all before the first
    /// completion), then the completions in order.
    fn drain(mut c: SharedCores, steps: &[(u64, u32, u64, usize, f64)]) -> Vec<(u64, u32)> {
        for &(t, w, ns, k, kv) in steps {
            c.start(t, w, ns, k, kv);
        }
        let mut out = Vec::new();
        while let Some((t, w)) = c.schedule().or(c.next) {
            assert!(c.finish(t, w));
            out.push((t, w));
        }
        out
    }

    /// A profile's `oversubscribed` factors slow each kind's share only while more steps
    /// run than there are cores; with as many steps as cores, or fewer, nothing changes.
    #[test]
    fn oversubscribed_steps_run_slower_than_their_share_and_only_then() {
        let run = |slow: [f64; 3], steps: &[(u64, u32, u64, usize)]| {
            let c = SharedCores {
                slow,
                ..SharedCores::new(2.0, [1.0; 3])
            };
            let steps: Vec<_> = steps
                .iter()
                .map(|&(t, w, ns, k)| (t, w, ns, k, 0.0))
                .collect();
            drain(c, &steps)
        };
        let three = [
            (0, 0, 100, K_ENCODE),
            (0, 1, 100, K_PREFILL),
            (0, 2, 100, K_DECODE),
        ];
        // Three on two cores: 2/3 each, decode at half that. Encode and prefill end at
        // 150 (100 done); decode has done 50 by then and, alone, runs at full speed.
        assert_eq!(
            run([1.0, 1.0, 2.0], &three),
            vec![(150, 0), (150, 1), (200, 2)]
        );
        assert_eq!(run([1.0; 3], &three), vec![(150, 0), (150, 1), (150, 2)]);
        // Two on two cores are not oversubscribed: the factors do nothing.
        assert_eq!(run([3.0, 3.0, 3.0], &three[..2]), vec![(100, 0), (100, 1)]);
    }

    /// With `decode_contention`, an oversubscribed decode iteration's factor is its own:
    /// `1 + kv * share + encoder * (encoder batches beside it)`, in place of
    /// `oversubscribed.decode`; other kinds keep theirs, and nothing changes while the
    /// steps do not outnumber the cores.
    #[test]
    fn decode_contention_prices_each_iteration_by_its_kv_share_and_the_encoders_beside() {
        let run = |contention: DecodeContention, steps: &[(u64, u32, u64, usize, f64)]| {
            let c = SharedCores {
                slow: [1.0, 1.0, 5.0],
                contention: Some(contention),
                ..SharedCores::new(2.0, [1.0; 3])
            };
            drain(c, steps)
        };
        let c = DecodeContention {
            kv: 2.0,
            encoder: 0.5,
        };
        // Encode, prefill and a decode of KV share 0.25 on two cores: 2/3 each, decode
        // slowed by 1 + 2 * 0.25 + 0.5 * 1 = 2 (not oversubscribed.decode's 5). At 150
        // encode and prefill end; decode has done 50 and runs the rest alone.
        let with_encoder = [
            (0, 0, 100, K_ENCODE, 0.0),
            (0, 1, 100, K_PREFILL, 0.0),
            (0, 2, 100, K_DECODE, 0.25),
        ];
        assert_eq!(run(c, &with_encoder), vec![(150, 0), (150, 1), (200, 2)]);
        // Two prefills beside it instead: no encoder, factor 1.5, so the decode advances
        // at (2/3) / 1.5; by 150 it has done 66.67 and runs the rest alone: ends at 184
        // (183.33 rounded up).
        let no_encoder = [
            (0, 0, 100, K_PREFILL, 0.0),
            (0, 1, 100, K_PREFILL, 0.0),
            (0, 2, 100, K_DECODE, 0.25),
        ];
        assert_eq!(run(c, &no_encoder), vec![(150, 0), (150, 1), (184, 2)]);
        // KV share 0 and no encoder: plain processor sharing for the decode.
        let plain = [
            (0, 0, 100, K_PREFILL, 0.0),
            (0, 1, 100, K_PREFILL, 0.0),
            (0, 2, 100, K_DECODE, 0.0),
        ];
        assert_eq!(run(c, &plain), vec![(150, 0), (150, 1), (150, 2)]);
        // Not oversubscribed: nothing slows.
        assert_eq!(run(c, &with_encoder[1..]), vec![(100, 1), (100, 2)]);
    }
}

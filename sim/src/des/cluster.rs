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

use moonagent_core::serve::{Action, Done, Engine, EngineConfig, Extra, Flow, Payloads, Pricing};
use moonagent_core::store::{MemStore, StoreKey};
use moonagent_models::{CostModel, HardwareProfile, Link, LinkKind, ModelSpec};
use moonagent_traces::schema::Request;

use super::config::SimConfig;
use super::engine::{EventQueue, Time};
use super::metrics::{RequestRecord, Summary};
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
    encoder_gpu_ns: u64,
    encoder_saved_ns: u64,
    events_by_kind: [u64; 6],
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
        Ok(Self {
            cfg: cfg.clone(),
            trace,
            engine,
            cost,
            hw,
            link,
            q: EventQueue::new(),
            nic_free: vec![0; workers],
            encoder_gpu_ns: 0,
            encoder_saved_ns: 0,
            events_by_kind: [0; 6],
        })
    }

    /// Run to completion (or the horizon); per-request records in trace order and the summary.
    pub fn run(mut self) -> Result<(Summary, Vec<RequestRecord>), SimError> {
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
                self.events_by_kind[kind(done).1] += 1;
                self.engine.complete(t, done)?;
                self.execute(t);
            }
        }
        Ok(self.finish(cursor))
    }

    /// Price every action the engine decided at `now` and schedule its completion.
    fn execute(&mut self, now: Time) {
        while let Some(a) = self.engine.poll_action() {
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
                    self.q.push(now + dur, P_STEP, Done::Step(worker));
                }
                Action::Prefill { worker, chunks } => {
                    let dur = self.cost.prefill_batch_time_ns(&chunks);
                    self.q.push(now + dur, P_STEP, Done::Step(worker));
                }
                Action::Decode {
                    worker,
                    batch,
                    ctx_sum,
                    extra,
                } => {
                    let mut dur = self.cost.decode_iter_time_ns(batch, ctx_sum);
                    for &x in &extra {
                        dur += match x {
                            Extra::Recompute { tokens } => self.cost.prefill_time_ns(tokens, 0),
                            Extra::TailCopy { bytes } => (bytes as f64
                                / (self.hw.hbm_bytes_per_s * self.hw.efficiency.hbm_efficiency)
                                * 1e9)
                                .ceil()
                                as u64,
                        };
                    }
                    self.q.push(now + dur, P_STEP, Done::Step(worker));
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
    }

    /// Occupy the NICs of `a` (and `b`) for a transfer starting no earlier than `now`;
    /// returns its end.
    fn transfer(&mut self, now: Time, a: u32, b: Option<u32>, flow: Flow, bytes: u64) -> Time {
        let mut start = now.max(self.nic_free[a as usize]);
        if let Some(b) = b {
            start = start.max(self.nic_free[b as usize]);
        }
        let end = start + moonagent_models::transfer_time_ns(&self.link, flow, bytes);
        self.nic_free[a as usize] = end;
        if let Some(b) = b {
            self.nic_free[b as usize] = end;
        }
        end
    }

    fn finish(self, arrived: usize) -> (Summary, Vec<RequestRecord>) {
        let kv_pages_in_use = self
            .engine
            .pool_stats()
            .iter()
            .map(|p| u64::from(p.used))
            .sum();
        let events = self.q.popped();
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
        (s, recs)
    }
}

/// Simulate `trace` under `cfg`.
pub fn simulate(
    cfg: &SimConfig,
    trace: &[Request],
    block_size: u32,
) -> Result<(Summary, Vec<RequestRecord>), SimError> {
    Simulation::new(cfg, trace, block_size)?.run()
}

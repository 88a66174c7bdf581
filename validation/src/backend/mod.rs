//! The thin real backend: the core's serving engine driven in wall time.
//!
//! The engine (`moonagent_core::serve::Engine`) decides everything: routing, batching,
//! the embedding cache, prefix KV, fork, the block pools. This driver executes each
//! [`Action`] for real and reports its completion at the wall-clock time it happened; it
//! decides nothing. Every worker (GPU instance) is a thread that runs its compute steps
//! through an [`Executor`]; every worker's NIC is a thread that moves real bytes over
//! loopback TCP ([`link`]), except that the prefill-to-decode KV handoff can take
//! Mooncake's Transfer Engine instead ([`RunOptions::kv_path`], [`crate::te`]); the router's fingerprinting is a thread that hashes real
//! pixel bytes. The main thread owns the engine: it feeds arrivals at their trace times
//! and completions as they come back, logs every input and action, and never blocks on
//! bytes.
//!
//! Times given to the engine are nanoseconds since the run started, read on the main
//! thread when it takes each input: the engine's view of time is monotone by construction,
//! and a recorded input log replays through a fresh engine to the very same action log
//! ([`moonagent_core::serve::toy::replay_inputs`]), which is how a measured run proves it
//! made its decisions through the core.
//!
//! Faults: a worker's failure stops the run with its error; if work is in flight and
//! nothing completes for [`RunOptions::stall_timeout`], the run stops with
//! [`BackendError::Stalled`] instead of hanging.

pub mod link;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use moonagent_core::serve::toy::Input;
use moonagent_core::serve::{
    Action, Counters, DecodeSeqRef, Done, EncoderOutputs, Engine, EngineConfig, Extra, Flow,
    ImageRef, JobId, RequestRecord, RequestView, ServeError, WorkerId,
};
use moonagent_core::store::Store;
use serde::{Deserialize, Serialize};

use crate::cores::{on_core_waited, HostCores, HostSched};
use crate::te::{self, TeCluster, TeNic};
use link::{LinkError, Nic, Sink};

/// Bytes of one Transfer Engine slot: a larger KV handoff moves in slot-sized writes, one
/// after another.
pub const TE_SLOT_BYTES: usize = 8 << 20;

/// One compute step of a worker, as the engine asked for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Step {
    /// A vision-encoder batch.
    Encode {
        /// Visual tokens of each image.
        tokens: Vec<u32>,
        /// Content id of each image (equal contents, equal pixels: equal outputs).
        contents: Vec<u64>,
    },
    /// A prefill iteration: `(new, cached)` tokens of each chunk.
    Prefill(Vec<(u32, u32)>),
    /// A decode iteration.
    Decode {
        /// Sequences.
        batch: u32,
        /// Their summed context.
        ctx_sum: u64,
        /// Work before the tokens (recompute, fork tail copies).
        extra: Vec<Extra>,
    },
}

impl Step {
    /// The worker an engine action asks to run a step, and the step (`None` for actions
    /// that are not compute steps): what the backend executes and times, and what the
    /// simulator's step log is recorded as (one shape for both).
    pub fn of_action(a: &Action) -> Option<(WorkerId, Step)> {
        Some(match a {
            Action::Encode {
                worker,
                tokens,
                images,
            } => (
                *worker,
                Step::Encode {
                    tokens: tokens.clone(),
                    contents: images.iter().map(|i| i.content).collect(),
                },
            ),
            Action::Prefill { worker, chunks, .. } => (*worker, Step::Prefill(chunks.clone())),
            Action::Decode {
                worker,
                batch,
                ctx_sum,
                extra,
                ..
            } => (
                *worker,
                Step::Decode {
                    batch: *batch,
                    ctx_sum: *ctx_sum,
                    extra: extra.clone(),
                },
            ),
            _ => return None,
        })
    }
}

/// Which jobs and KV pages a step works on (the engine's `kv_tables`): what lets an
/// executor keep each sequence's KV in the pages the core's block pool gave it. Kept out
/// of [`Step`], which is the step's shape (what the measured records keep).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StepKv {
    /// Shapes only.
    #[default]
    None,
    /// A prefill's chunks: `(job, prompt tokens)` of each, in order.
    Prefill(Vec<(JobId, u32)>),
    /// A decode iteration's sequences with their pages, and the page copies
    /// `(src, dst)` to execute first.
    Decode {
        /// The batch, in admission order.
        seqs: Vec<DecodeSeqRef>,
        /// Fork tail copies decided since the last iteration.
        copies: Vec<(u32, u32)>,
    },
}

/// Runs compute steps for real. One call at a time per worker; different workers call
/// concurrently from their own threads.
pub trait Executor: Send + Sync {
    /// Called once before a run with the engine's configuration (the KV page geometry).
    fn prepare(&self, _cfg: &EngineConfig) -> Result<(), ExecError> {
        Ok(())
    }
    /// [`Executor::run`] with the step's jobs and pages; an executor that keeps real KV
    /// pages uses them (the default ignores them).
    fn run_kv(
        &self,
        worker: WorkerId,
        step: &Step,
        _kv: &StepKv,
    ) -> Result<Vec<Vec<u8>>, ExecError> {
        self.run(worker, step)
    }
    /// Take the KV bytes of `job`'s finished prefill from `worker` (a KV handoff's
    /// payload), or `None` when the executor keeps no real KV.
    fn kv_take(&self, _worker: WorkerId, _job: JobId) -> Result<Option<Vec<u8>>, ExecError> {
        Ok(None)
    }
    /// Deliver `job`'s KV bytes to `worker` (a KV handoff's payload, landed).
    fn kv_give(&self, _worker: WorkerId, _job: JobId, _bytes: Vec<u8>) -> Result<(), ExecError> {
        Ok(())
    }
    /// Run `step` on `worker` and return when its results exist: for an encode step of an
    /// executor whose [`Executor::encoder_outputs`] is true, one output per image, in
    /// order (what the engine commits to the embedding cache); otherwise nothing.
    fn run(&self, worker: WorkerId, step: &Step) -> Result<Vec<Vec<u8>>, ExecError>;
    /// Whether encode steps return the encoder's real outputs for the engine to commit
    /// (otherwise the engine commits its deterministic stand-in of the right size).
    fn encoder_outputs(&self) -> bool {
        false
    }
    /// Hash `bytes` of processed pixels on the router.
    fn fingerprint(&self, bytes: u64) -> Result<(), ExecError>;
    /// The host cores every worker's steps share (a fitted profile's `shared_cores`), or
    /// `None` when each worker has a device of its own.
    fn shared_cores(&self) -> Option<f64> {
        None
    }
}

/// A compute step that failed.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct ExecError {
    /// What failed, and why.
    pub what: String,
}

/// Why a measured run stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The engine refused an input.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// A worker's compute failed.
    #[error("worker {worker}: {source}")]
    Exec {
        /// The worker.
        worker: WorkerId,
        /// The failure.
        #[source]
        source: ExecError,
    },
    /// A transfer failed.
    #[error("worker {worker} NIC: {source}")]
    Link {
        /// The worker whose NIC failed.
        worker: WorkerId,
        /// The failure.
        #[source]
        source: LinkError,
    },
    /// Work was in flight and nothing completed for this long.
    #[error("stalled: {inflight} completions outstanding and none for {waited:?} (a worker or the store hangs)")]
    Stalled {
        /// Completions outstanding.
        inflight: usize,
        /// How long the driver waited.
        waited: Duration,
    },
    /// A thread could not be started or died.
    #[error("backend thread: {0}")]
    Thread(String),
    /// The host-core gate of [`RunOptions::host_sched`] is unusable.
    #[error("host cores: {0}")]
    Cores(#[from] moonagent_core::cores::CoresError),
}

/// The link a transfer took.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum KvPath {
    /// The NIC's loopback TCP connection to the sink ([`link`]): every transfer but a
    /// KV handoff over the Transfer Engine.
    #[default]
    Tcp,
    /// Mooncake's Transfer Engine, worker to worker ([`crate::te`]; the
    /// `transfer-engine` feature): prefill-to-decode KV handoffs only.
    TransferEngine,
    /// The store's own client: the engine's puts of prefix KV blocks as real bytes (the
    /// Mooncake bridge with `--store mooncake`, `MemStore`'s copy otherwise), timed on the
    /// engine's thread by [`crate::measure::TimedStore`]. Never a handoff link (as
    /// [`RunOptions::kv_path`] it means `Tcp`).
    Store,
}

impl KvPath {
    /// The name the CLI and the run summary use (`tcp`, `transfer_engine`).
    pub const fn name(self) -> &'static str {
        match self {
            KvPath::Tcp => "tcp",
            KvPath::TransferEngine => "transfer_engine",
            KvPath::Store => "store",
        }
    }
}

/// How a run is paced and guarded.
#[derive(Debug, Clone, Copy)]
pub struct RunOptions {
    /// Stop with [`BackendError::Stalled`] when work is in flight and nothing completes
    /// for this long.
    pub stall_timeout: Duration,
    /// The link of prefill-to-decode KV handoffs (`Action::Transfer` of `Flow::KvPut` to
    /// a worker); every other transfer goes over TCP.
    pub kv_path: KvPath,
    /// After each Transfer Engine handoff, compare the bytes that landed at the receiver
    /// with what was sent (outside the measured time); a difference stops the run with
    /// [`LinkError::Corrupt`].
    pub verify_kv: bool,
    /// How the compute threads share the host's cores ([`Executor::shared_cores`]; no
    /// effect when the executor's compute is not the host's).
    pub host_sched: HostSched,
    /// Probe the host's cores for this long (one thread, then every core) before and
    /// after the run ([`crate::cores::probe`]), recorded in the run's summary.
    pub probe_host: Option<Duration>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            stall_timeout: Duration::from_secs(60),
            kv_path: KvPath::Tcp,
            verify_kv: false,
            host_sched: HostSched::default(),
            probe_host: None,
        }
    }
}

/// What a worker thread measured for one unit of work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timed {
    /// The worker (for transfers: the NIC's worker; for fingerprints: `u32::MAX`).
    pub worker: WorkerId,
    /// What ran.
    pub what: Work,
    /// When it started, ns since the run started.
    pub start_ns: u64,
    /// How long it took, ns.
    pub measured_ns: u64,
    /// Of `measured_ns`, the time a compute step waited for a host core under the round
    /// robin (before it started and at its hand-overs; [`crate::cores::on_core_waited`]):
    /// 0 for everything else, and absent from the JSON when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub waited_ns: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// A unit of measured work.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Work {
    /// A compute step.
    Step(Step),
    /// One transfer.
    Transfer {
        /// Direction and payload.
        flow: Flow,
        /// Bytes.
        bytes: u64,
        /// The link it took (absent in files written before there was a choice: TCP).
        #[serde(default)]
        path: KvPath,
    },
    /// A fingerprint over processed pixels.
    Fingerprint {
        /// Bytes hashed.
        bytes: u64,
    },
}

/// What a measured run saw and produced.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Every engine input with its time (replay it with `toy::replay_inputs`).
    pub inputs: Vec<(u64, Input)>,
    /// Every action the engine decided, with its time.
    pub actions: Vec<(u64, Action)>,
    /// Per-request records in trace order (wall-clock ns since the run started).
    pub records: Vec<RequestRecord>,
    /// Whether each request finished.
    pub done: Vec<bool>,
    /// The engine's counters.
    pub counters: Counters,
    /// Every unit of work the threads timed, in completion order.
    pub timed: Vec<Timed>,
    /// Wall time of the whole run, ns.
    pub wall_ns: u64,
    /// Wall time the main thread spent inside the engine (its decisions, including every
    /// store operation of the decision plane: lookups, commits, readbacks, prefix-KV
    /// `exists` and puts), ns. The simulator prices none of it; with a real store over the
    /// network it is what delays dispatch.
    pub engine_ns: u64,
    /// Times a compute step handed its host core to a waiting step at a checkpoint
    /// ([`HostSched::RoundRobin`]; 0 otherwise).
    pub core_rotations: u64,
}

/// A completion (or failure) reported by a backend thread.
enum Event {
    /// A worker's encoder outputs, sent just before its step's completion.
    Outputs(WorkerId, Vec<Vec<u8>>),
    Done(Option<Done>, Timed),
    Failed(BackendError),
}

/// Encoder outputs by (job, image).
type OutputMap = HashMap<(JobId, u32), Vec<u8>>;

/// Encoder outputs waiting for the engine to commit them (the main thread's only).
#[derive(Default, Clone)]
struct Outputs(Rc<RefCell<OutputMap>>);

impl EncoderOutputs for Outputs {
    fn take(&mut self, job: JobId, idx: u32) -> Option<Vec<u8>> {
        self.0.borrow_mut().remove(&(job, idx))
    }
}

/// Work for a NIC thread: transfers in order, then the completion.
struct NicJob {
    xfers: Vec<(Flow, u64)>,
    done: Option<Done>,
    /// A KV handoff to this worker: over the Transfer Engine when the NIC has one.
    handoff: Option<WorkerId>,
}

/// The KV times of one link and flow over a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvLinkStats {
    /// The link.
    pub path: KvPath,
    /// The flow (`kv_put`: handoffs and prefix blocks to the store; `kv_get`: loads).
    pub flow: Flow,
    /// Transfers with bytes.
    pub transfers: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Median bytes per transfer.
    pub bytes_p50: u64,
    /// Median measured time per transfer, ns.
    pub ns_p50: u64,
    /// Median of each transfer's bytes / time, GB/s (1e9 bytes per second).
    pub gb_s_p50: f64,
}

/// The KV transfers of `timed` (flows `KvPut`, `KvGet`, with bytes) grouped by link and
/// flow, in `(path, flow)` order: what the simulator's link model is calibrated from.
pub fn kv_link_stats(timed: &[Timed]) -> Vec<KvLinkStats> {
    let mut groups: std::collections::BTreeMap<(KvPath, Flow), Vec<(u64, u64)>> =
        std::collections::BTreeMap::new();
    for t in timed {
        if let Work::Transfer { flow, bytes, path } = t.what {
            if bytes > 0 && matches!(flow, Flow::KvPut | Flow::KvGet) {
                groups
                    .entry((path, flow))
                    .or_default()
                    .push((bytes, t.measured_ns.max(1)));
            }
        }
    }
    groups
        .into_iter()
        .map(|((path, flow), v)| {
            let mut bytes: Vec<u64> = v.iter().map(|x| x.0).collect();
            let mut ns: Vec<u64> = v.iter().map(|x| x.1).collect();
            let mut rate: Vec<f64> = v.iter().map(|&(b, t)| b as f64 / t as f64).collect();
            bytes.sort_unstable();
            ns.sort_unstable();
            rate.sort_by(f64::total_cmp);
            KvLinkStats {
                path,
                flow,
                transfers: v.len() as u64,
                bytes: bytes.iter().sum(),
                bytes_p50: bytes[bytes.len() / 2],
                ns_p50: ns[ns.len() / 2],
                gb_s_p50: rate[rate.len() / 2],
            }
        })
        .collect()
}

/// Run `engine` over `trace` in wall time: request `i` arrives `arrivals[i]` ns after the
/// start (ascending). Returns when every request finished, or with the first error.
pub fn run<S: Store, R: RequestView>(
    engine: &mut Engine<'_, S, R>,
    arrivals: &[u64],
    exec: Arc<dyn Executor>,
    opts: RunOptions,
) -> Result<Measured, BackendError> {
    let workers = engine.workers() as usize;
    let start = Instant::now();
    let (tx, rx) = mpsc::channel::<Event>();
    let sink = Sink::start(workers).map_err(|source| BackendError::Link { worker: 0, source })?;
    // The Transfer Engine's NICs, one per worker, when handoffs take it. The cluster (its
    // engines and buffers) lives until every NIC thread has exited (each NIC holds it).
    let mut te_nics: Vec<Option<TeNic>> = match opts.kv_path {
        KvPath::Tcp | KvPath::Store => (0..workers).map(|_| None).collect(),
        KvPath::TransferEngine => TeCluster::start(workers, TE_SLOT_BYTES)
            .map_err(|e| BackendError::Link {
                worker: 0,
                source: e.into(),
            })?
            .take_nics()
            .into_iter()
            .map(Some)
            .collect(),
    };

    exec.prepare(engine.config())
        .map_err(|source| BackendError::Exec { worker: 0, source })?;
    let host_cores = opts.host_sched.gate(exec.shared_cores())?;
    let mut compute: Vec<Sender<(Step, StepKv)>> = Vec::with_capacity(workers);
    let mut nics: Vec<Sender<NicJob>> = Vec::with_capacity(workers);
    let mut handles: Vec<JoinHandle<()>> = Vec::new();
    for w in 0..workers as WorkerId {
        let (stx, srx) = mpsc::channel::<(Step, StepKv)>();
        let (events, ex, cores) = (tx.clone(), Arc::clone(&exec), host_cores.clone());
        handles.push(spawn(format!("worker-{w}"), move || {
            compute_thread(w, srx, ex, cores, events, start)
        })?);
        compute.push(stx);
        let nic = sink
            .connect()
            .map_err(|source| BackendError::Link { worker: w, source })?;
        let (ntx, nrx) = mpsc::channel::<NicJob>();
        let events = tx.clone();
        let te_nic = te_nics.get_mut(w as usize).and_then(Option::take);
        let verify = opts.verify_kv;
        let ex = Arc::clone(&exec);
        handles.push(spawn(format!("nic-{w}"), move || {
            nic_thread(w, nic, te_nic, verify, nrx, ex, events, start)
        })?);
        nics.push(ntx);
    }
    let (ftx, frx) = mpsc::channel::<(u32, u64)>();
    {
        let (events, ex) = (tx.clone(), Arc::clone(&exec));
        handles.push(spawn("router".into(), move || {
            router_thread(frx, ex, events, start)
        })?);
    }
    drop(tx);

    // Real encoder outputs go to the engine, which commits them (and a hit later reads
    // back those very bytes); `encoding[w]` names the images of worker w's batch.
    let outputs = Outputs::default();
    let real_outputs = exec.encoder_outputs();
    if real_outputs {
        engine.set_encoder_outputs(Box::new(outputs.clone()));
    }
    let mut encoding: Vec<Vec<ImageRef>> = vec![Vec::new(); workers];
    let mut m = Measured::default();
    let mut inflight = 0usize;
    let mut cursor = 0usize;
    let elapsed = |start: Instant| start.elapsed().as_nanos() as u64;
    let result = (|| -> Result<(), BackendError> {
        loop {
            // Completions already reported come first: they happened before now.
            let event = match rx.try_recv() {
                Ok(ev) => Some(ev),
                Err(_) => {
                    if cursor == arrivals.len() && inflight == 0 {
                        return Ok(());
                    }
                    let now = elapsed(start);
                    match arrivals.get(cursor) {
                        Some(&a) if a <= now => None,
                        next => {
                            let wait = next.map_or(opts.stall_timeout, |&a| {
                                Duration::from_nanos(a - now).min(opts.stall_timeout)
                            });
                            match rx.recv_timeout(wait) {
                                Ok(ev) => Some(ev),
                                Err(RecvTimeoutError::Timeout) => {
                                    // A full stall timeout with work in flight, not
                                    // just the wait for the next arrival.
                                    if wait == opts.stall_timeout && inflight > 0 {
                                        return Err(BackendError::Stalled {
                                            inflight,
                                            waited: wait,
                                        });
                                    }
                                    continue;
                                }
                                Err(RecvTimeoutError::Disconnected) => {
                                    return Err(BackendError::Thread(
                                        "every backend thread exited".into(),
                                    ))
                                }
                            }
                        }
                    }
                }
            };
            let now = elapsed(start);
            let t_engine = Instant::now();
            let input = match event {
                Some(Event::Failed(e)) => return Err(e),
                Some(Event::Outputs(w, outs)) => {
                    let refs = std::mem::take(&mut encoding[w as usize]);
                    if !real_outputs {
                        continue;
                    }
                    if refs.len() != outs.len() {
                        return Err(BackendError::Exec {
                            worker: w,
                            source: ExecError {
                                what: format!(
                                    "the encoder returned {} outputs for a batch of {} images",
                                    outs.len(),
                                    refs.len()
                                ),
                            },
                        });
                    }
                    let mut map = outputs.0.borrow_mut();
                    for (r, out) in refs.iter().zip(outs) {
                        map.insert((r.job, r.idx), out);
                    }
                    continue;
                }
                Some(Event::Done(done, timed)) => {
                    m.timed.push(timed);
                    match done {
                        Some(d) => {
                            inflight -= 1;
                            engine.complete(now, d)?;
                            Input::Complete(d)
                        }
                        None => continue,
                    }
                }
                None => {
                    engine.arrive(now, cursor)?;
                    cursor += 1;
                    Input::Arrive(cursor - 1)
                }
            };
            m.inputs.push((now, input));
            while let Some(a) = engine.poll_action() {
                if let Action::Encode { worker, images, .. } = &a {
                    if let Some(slot) = encoding.get_mut(*worker as usize) {
                        slot.clone_from(images);
                    }
                }
                inflight += dispatch(&a, &compute, &nics, &ftx)?;
                m.actions.push((now, a));
            }
            m.engine_ns += t_engine.elapsed().as_nanos() as u64;
        }
    })();
    m.wall_ns = elapsed(start);
    drop((compute, nics, ftx, rx));
    // On success every thread is idle and exits at once. On an error a thread may be
    // stuck in the step that caused it: leave it; it exits when it next reports.
    if result.is_ok() {
        for h in handles {
            let _ = h.join();
        }
    }
    result?;
    m.counters = *engine.counters();
    m.core_rotations = host_cores.as_ref().map_or(0, HostCores::rotations);
    m.records = engine.served().iter().map(|s| s.rec).collect();
    m.done = engine.served().iter().map(|s| s.done).collect();
    Ok(m)
}

/// Hand `a` to its thread; returns the completions it will report.
fn dispatch(
    a: &Action,
    compute: &[Sender<(Step, StepKv)>],
    nics: &[Sender<NicJob>],
    router: &Sender<(u32, u64)>,
) -> Result<usize, BackendError> {
    let gone = |what: &str| BackendError::Thread(format!("{what} thread is gone"));
    let to_nic = |w: WorkerId, job: NicJob| {
        nics.get(w as usize)
            .ok_or_else(|| gone("nic"))?
            .send(job)
            .map_err(|_| gone("nic"))
    };
    let to_worker = |w: WorkerId, step: Step, kv: StepKv| {
        compute
            .get(w as usize)
            .ok_or_else(|| gone("worker"))?
            .send((step, kv))
            .map_err(|_| gone("worker"))
    };
    Ok(match a {
        Action::Fingerprint { job, pixel_bytes } => {
            router
                .send((*job, *pixel_bytes))
                .map_err(|_| gone("router"))?;
            1
        }
        Action::Encode { .. } | Action::Prefill { .. } | Action::Decode { .. } => {
            let kv = match a {
                Action::Prefill { jobs, .. } => StepKv::Prefill(jobs.clone()),
                Action::Decode { seqs, copies, .. } if !(seqs.is_empty() && copies.is_empty()) => {
                    StepKv::Decode {
                        seqs: seqs.clone(),
                        copies: copies.clone(),
                    }
                }
                _ => StepKv::None,
            };
            let (worker, step) = Step::of_action(a).ok_or_else(|| gone("compute step"))?;
            to_worker(worker, step, kv)?;
            1
        }
        Action::Transfer {
            from,
            to,
            flow,
            bytes,
            done,
        } => {
            to_nic(
                *from,
                NicJob {
                    xfers: vec![(*flow, *bytes)],
                    done: *done,
                    handoff: to.filter(|_| *flow == Flow::KvPut),
                },
            )?;
            usize::from(done.is_some())
        }
        Action::PutBlocks {
            from,
            bytes_each,
            count,
        } => {
            to_nic(
                *from,
                NicJob {
                    xfers: vec![(Flow::KvPut, *bytes_each); *count as usize],
                    done: None,
                    handoff: None,
                },
            )?;
            0
        }
        Action::Load {
            job,
            worker,
            embed_bytes,
            kv_bytes,
        } => {
            let xfers = [(Flow::Get, *embed_bytes), (Flow::KvGet, *kv_bytes)]
                .into_iter()
                .filter(|&(_, b)| b > 0)
                .collect();
            to_nic(
                *worker,
                NicJob {
                    xfers,
                    done: Some(Done::Loaded(*job)),
                    handoff: None,
                },
            )?;
            1
        }
        Action::EncodeAvoided { .. } => 0,
    })
}

fn spawn(name: String, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, BackendError> {
    std::thread::Builder::new()
        .name(name)
        .spawn(f)
        .map_err(|e| BackendError::Thread(e.to_string()))
}

fn compute_thread(
    w: WorkerId,
    steps: Receiver<(Step, StepKv)>,
    exec: Arc<dyn Executor>,
    cores: Option<HostCores>,
    events: Sender<Event>,
    start: Instant,
) {
    for (step, kv) in steps {
        let t0 = Instant::now();
        // The wait for a host core is part of the step's time, as its stretch under
        // shared cores is part of the simulated time.
        let (r, waited_ns) = on_core_waited(cores.as_ref(), || exec.run_kv(w, &step, &kv));
        let measured_ns = t0.elapsed().as_nanos() as u64;
        let ev = match r {
            Ok(outs) => {
                if matches!(step, Step::Encode { .. })
                    && events.send(Event::Outputs(w, outs)).is_err()
                {
                    return;
                }
                Event::Done(
                    Some(Done::Step(w)),
                    Timed {
                        worker: w,
                        what: Work::Step(step),
                        start_ns: t0.duration_since(start).as_nanos() as u64,
                        measured_ns,
                        waited_ns,
                    },
                )
            }
            Err(source) => Event::Failed(BackendError::Exec { worker: w, source }),
        };
        if events.send(ev).is_err() {
            return;
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn nic_thread(
    w: WorkerId,
    mut nic: Nic,
    mut te_nic: Option<TeNic>,
    verify: bool,
    jobs: Receiver<NicJob>,
    exec: Arc<dyn Executor>,
    events: Sender<Event>,
    start: Instant,
) {
    if let Some(t) = te_nic.as_mut() {
        te::fill_pattern(t.outbox(), w as usize);
    }
    let fail = |events: &Sender<Event>, source: ExecError| {
        let _ = events.send(Event::Failed(BackendError::Exec { worker: w, source }));
    };
    let mut seq = 0u64;
    for job in jobs {
        let n = job.xfers.len();
        // A KV handoff moves the job's real KV when the executor keeps it: taken from
        // the prefill worker here, handed to the decode worker once the bytes are across.
        let handoff = match (job.handoff, job.done) {
            (Some(to), Some(Done::KvArrived(j))) => Some((to, j)),
            _ => None,
        };
        let mut payload = match handoff.map(|(_, j)| exec.kv_take(w, j)) {
            Some(Ok(p)) => p,
            Some(Err(e)) => return fail(&events, e),
            None => None,
        };
        for (k, (flow, bytes)) in job.xfers.into_iter().enumerate() {
            if let (Some(p), Some((to, j))) = (&payload, handoff) {
                if p.len() as u64 != bytes {
                    return fail(
                        &events,
                        ExecError {
                            what: format!(
                                "KV handoff of job {j} to worker {to}: the executor holds {} bytes, the engine moves {bytes}",
                                p.len()
                            ),
                        },
                    );
                }
            }
            let over_te = te_nic.as_mut().zip(job.handoff);
            let path = if over_te.is_some() {
                KvPath::TransferEngine
            } else {
                KvPath::Tcp
            };
            let r = match over_te {
                Some((t, to)) => te_handoff(t, w, to, bytes, payload.as_deref(), &mut seq, verify),
                None => {
                    let t0 = Instant::now();
                    match payload.as_deref() {
                        Some(p) => nic.send_payload(p),
                        None => nic.send(bytes),
                    }
                    .map(|()| (t0, t0.elapsed().as_nanos() as u64))
                }
            };
            let (t0, measured_ns) = match r {
                Ok(x) => x,
                Err(source) => {
                    let _ = events.send(Event::Failed(BackendError::Link { worker: w, source }));
                    return;
                }
            };
            let timed = Timed {
                worker: w,
                what: Work::Transfer { flow, bytes, path },
                start_ns: t0.duration_since(start).as_nanos() as u64,
                measured_ns,
                waited_ns: 0,
            };
            // The job's completion rides on its last transfer; a handoff's bytes are the
            // receiver's before it completes.
            let done = if k + 1 == n { job.done } else { None };
            if k + 1 == n {
                if let (Some((to, j)), Some(p)) = (handoff, payload.take()) {
                    if let Err(e) = exec.kv_give(to, j, p) {
                        return fail(&events, e);
                    }
                }
            }
            if events.send(Event::Done(done, timed)).is_err() {
                return;
            }
        }
        if n == 0 {
            if let Some(d) = job.done {
                let timed = Timed {
                    worker: w,
                    what: Work::Transfer {
                        flow: Flow::Get,
                        bytes: 0,
                        path: KvPath::Tcp,
                    },
                    start_ns: start.elapsed().as_nanos() as u64,
                    measured_ns: 0,
                    waited_ns: 0,
                };
                if events.send(Event::Done(Some(d), timed)).is_err() {
                    return;
                }
            }
        }
    }
}

/// Move a `bytes` KV handoff from `w` to `to` over the Transfer Engine, in slot-sized
/// writes, each stamped with its own transfer number. Returns when it started and the
/// time the writes took (stamping and verification excluded).
fn te_handoff(
    t: &mut TeNic,
    w: WorkerId,
    to: WorkerId,
    bytes: u64,
    payload: Option<&[u8]>,
    seq: &mut u64,
    verify: bool,
) -> Result<(Instant, u64), LinkError> {
    let slot = t.slot_bytes() as u64;
    let t_start = Instant::now();
    let mut ns = 0u64;
    let mut left = bytes;
    while left > 0 {
        let len = left.min(slot) as usize;
        *seq += 1;
        match payload {
            // The real KV: this slot's part of it.
            Some(p) => {
                let off = (bytes - left) as usize;
                t.outbox()[..len].copy_from_slice(&p[off..off + len]);
            }
            None => te::stamp(&mut t.outbox()[..len], *seq),
        }
        let t0 = Instant::now();
        t.write(to as usize, 0, len)?;
        ns += t0.elapsed().as_nanos() as u64;
        if verify {
            if let Some(at) = t.first_difference(to as usize, 0, len)? {
                return Err(LinkError::Corrupt {
                    from: w,
                    to,
                    seq: *seq,
                    bytes: len,
                    at,
                });
            }
        }
        left -= len as u64;
    }
    Ok((t_start, ns))
}

fn router_thread(
    jobs: Receiver<(u32, u64)>,
    exec: Arc<dyn Executor>,
    events: Sender<Event>,
    start: Instant,
) {
    for (job, bytes) in jobs {
        let t0 = Instant::now();
        let ev = match exec.fingerprint(bytes) {
            Ok(()) => Event::Done(
                Some(Done::Fingerprinted(job)),
                Timed {
                    worker: u32::MAX,
                    what: Work::Fingerprint { bytes },
                    start_ns: t0.duration_since(start).as_nanos() as u64,
                    measured_ns: t0.elapsed().as_nanos() as u64,
                    waited_ns: 0,
                },
            ),
            Err(source) => Event::Failed(BackendError::Exec {
                worker: u32::MAX,
                source,
            }),
        };
        if events.send(ev).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;

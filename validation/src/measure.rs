//! Measured runs: a trace on the real backend under a simulator configuration, and the
//! files they leave (the same per-request table as the simulator's, the engine's input and
//! action logs, every timed unit of work).
//!
//! The backend's engine is built exactly as the simulator builds its own
//! ([`moonagent_sim::des::cluster::engine_config`], the same `SimConfig`, model spec and
//! hardware profile), except that payloads are real bytes. Three-point scheduling prices
//! workers with the profile given (a fitted one, after `moonagent validate profile`).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use moonagent_core::serve::toy::{replay_inputs, Input};
use moonagent_core::serve::Flow;
use moonagent_core::serve::{Action, Engine, Payloads};
use moonagent_core::store::{MemStore, Payload, ReplicateConfig, Store, StoreKey, StoreResult};
use moonagent_sim::des::cluster::{engine_config, models_of};
use moonagent_sim::des::metrics::records_table;
use moonagent_sim::des::{SimConfig, SimError, Summary};
use moonagent_traces::schema::Request;
use serde::{Deserialize, Serialize};

use crate::backend::{
    self, BackendError, Executor, KvLinkStats, KvPath, Measured, RunOptions, Timed, Work,
};
use crate::cores::{HostProbe, HostSched};

/// Why a measured run could not be set up, run or written.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The configuration, model or profile is unusable.
    #[error(transparent)]
    Sim(#[from] SimError),
    /// The run stopped.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A result file could not be written or read.
    #[error("{path}: {what}")]
    File {
        /// The file.
        path: String,
        /// Why.
        what: String,
    },
    /// Profiling or the profile's fit failed.
    #[error(transparent)]
    Profile(#[from] crate::profile::ProfileError),
    /// The validation workload could not be generated.
    #[error("validation workload: {0}")]
    Workload(#[from] moonagent_traces::error::TraceError),
    /// A run's store could not be opened (e.g. the real Mooncake Store is unreachable).
    #[error("store: {0}")]
    Store(String),
    /// The input log did not replay to the run's action log.
    #[error("the input log replays to different decisions: {0}")]
    Diverged(String),
    /// The trace given for a run is not the one it ran: every request of a run's trace
    /// arrives in its input log, once.
    #[error("the run's input log has {arrivals} arrivals (of requests 0..{max_seen}) and the trace {requests} requests: the trace is not the run's")]
    NotTheRunsTrace {
        /// Arrivals in the input log.
        arrivals: usize,
        /// One past the largest request index that arrived.
        max_seen: usize,
        /// Requests in the trace given.
        requests: usize,
    },
}

impl MeasureError {
    /// Writing `path` failed with `e`.
    pub fn writing(path: &Path, e: impl std::fmt::Display) -> Self {
        MeasureError::File {
            path: path.display().to_string(),
            what: format!("writing: {e}"),
        }
    }
}

/// A measured run's summary: the simulator's summary fields, measured, plus the wall time
/// and the same-decisions check.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunSummary {
    /// The simulator's summary fields, computed from measured records.
    pub summary: Summary,
    /// Wall time of the run, s.
    pub wall_s: f64,
    /// Wall time the engine's decisions took on the driver's thread (store operations of
    /// the decision plane included), s.
    pub engine_s: f64,
    /// Actions the engine decided.
    pub actions: u64,
    /// The input log replayed through a fresh engine gave the same action log.
    pub same_decisions: bool,
    /// KV transfer times measured on each link (`backend::kv_link_stats`).
    #[serde(default)]
    pub kv_links: Vec<KvLinkStats>,
    /// How the compute threads shared the host's cores (absent in summaries written
    /// before the choice existed: the kernel's scheduler).
    #[serde(default = "host_sched_os")]
    pub host_sched: HostSched,
    /// Times a step handed its host core to a waiting step ([`Measured::core_rotations`]).
    #[serde(default)]
    pub core_rotations: u64,
    /// What the host's cores delivered just before the run ([`RunOptions::probe_host`]).
    #[serde(default)]
    pub host_before: Option<HostProbe>,
    /// ... and just after it.
    #[serde(default)]
    pub host_after: Option<HostProbe>,
}

impl RunSummary {
    /// The host's all-core rate after the run over the rate before it (1.0: unchanged),
    /// when both were probed.
    pub fn host_drift(&self) -> Option<f64> {
        let (b, a) = (self.host_before?, self.host_after?);
        Some(a.all_per_ms / b.all_per_ms.max(f64::MIN_POSITIVE))
    }
}

fn host_sched_os() -> HostSched {
    HostSched::Os
}

/// A fresh engine for `cfg` over `trace` on `store`, with real payloads and decode page
/// tables (`kv_tables`).
pub fn engine<'a, S: Store>(
    cfg: &SimConfig,
    trace: &'a [Request],
    block_size: u32,
    store: S,
) -> Result<Engine<'a, S, Request>, SimError> {
    cfg.validate()?;
    let (hw, spec, pricing) = models_of(cfg)?;
    let mut ecfg = engine_config(cfg, &pricing.cost, &hw, &spec, block_size)?;
    ecfg.payloads = Payloads::Bytes;
    ecfg.kv_tables = true;
    Ok(Engine::new(ecfg, store, trace, Some(Box::new(pricing)))?)
}

/// The embedded store `cfg` describes.
pub fn mem_store(cfg: &SimConfig) -> Result<MemStore<StoreKey>, SimError> {
    MemStore::with_policy(cfg.store.clone(), &cfg.policy).map_err(SimError::Policy)
}

/// Run `trace` on the backend under `cfg` with `store`; request `i` arrives at its trace
/// time divided by `speedup`. Checks that the input log replays (through a fresh engine on
/// a fresh embedded store) to the run's action log.
pub fn run_trace<S: Store>(
    cfg: &SimConfig,
    trace: &[Request],
    block_size: u32,
    store: S,
    exec: Arc<dyn Executor>,
    speedup: f64,
    opts: RunOptions,
) -> Result<(Measured, RunSummary), MeasureError> {
    let mut e = engine(cfg, trace, block_size, TimedStore::new(store))?;
    let arrivals: Vec<u64> = trace
        .iter()
        .map(|r| (r.arrival_ns as f64 / speedup.max(1e-9)) as u64)
        .collect();
    let host_before = opts.probe_host.map(crate::cores::probe);
    let mut m = backend::run(&mut e, &arrivals, exec, opts)?;
    let host_after = opts.probe_host.map(crate::cores::probe);
    // The store client's KV puts, timed on the engine's thread, after the threads' records.
    m.timed.extend_from_slice(e.cache().store().timed());
    let readbacks = e.cache().counters().readbacks;
    drop(e);
    let mut fresh = engine(cfg, trace, block_size, mem_store(cfg)?)?;
    let replayed = replay_inputs(&mut fresh, &m.inputs).map_err(|e| {
        MeasureError::Diverged(format!(
            "a fresh engine on a fresh embedded store refused the log: {e} (did the run's store hold objects before it started? runs on a real store use a fresh namespace)"
        ))
    })?;
    let same = first_difference(&replayed, &m.actions);
    if let Some(d) = &same {
        return Err(MeasureError::Diverged(d.clone()));
    }
    let summary = RunSummary {
        summary: Summary::of_run(
            cfg.mode,
            &cfg.slo,
            &m.records,
            &m.done,
            &m.counters,
            readbacks,
        ),
        wall_s: m.wall_ns as f64 / 1e9,
        engine_s: m.engine_ns as f64 / 1e9,
        actions: m.actions.len() as u64,
        same_decisions: same.is_none(),
        kv_links: backend::kv_link_stats(&m.timed),
        host_sched: opts.host_sched,
        core_rotations: m.core_rotations,
        host_before,
        host_after,
    };
    Ok((m, summary))
}

/// A store that times the engine's puts of prefix KV blocks (real bytes under
/// `kv:<block>` keys) as transfers over [`KvPath::Store`], so a run reports the KV path
/// through the store's client (the Mooncake bridge, or `MemStore`) beside the NIC's and
/// the Transfer Engine's. Every call goes to the inner store unchanged; only the timing is
/// added (wall-clock, kept apart from every decision).
pub struct TimedStore<S> {
    inner: S,
    origin: std::time::Instant,
    timed: Vec<Timed>,
}

impl<S: Store> TimedStore<S> {
    /// Time `inner`'s KV puts; `start_ns` of each record counts from now.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            origin: std::time::Instant::now(),
            timed: Vec::new(),
        }
    }

    /// The KV puts timed so far.
    pub fn timed(&self) -> &[Timed] {
        &self.timed
    }
}

impl<S: Store> Store for TimedStore<S> {
    fn put_start(
        &mut self,
        now: u64,
        key: &str,
        size: u64,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        self.inner.put_start(now, key, size, cfg)
    }
    fn put_end(&mut self, now: u64, key: &str, payload: Payload) -> StoreResult<()> {
        self.inner.put_end(now, key, payload)
    }
    fn put_revoke(&mut self, now: u64, key: &str) -> StoreResult<()> {
        self.inner.put_revoke(now, key)
    }
    fn get_into(&mut self, now: u64, key: &str, buf: &mut [u8]) -> StoreResult<u64> {
        self.inner.get_into(now, key, buf)
    }
    fn get_size(&mut self, now: u64, key: &str) -> StoreResult<u64> {
        self.inner.get_size(now, key)
    }
    fn exists(&mut self, now: u64, key: &str) -> StoreResult<bool> {
        self.inner.exists(now, key)
    }
    fn remove(&mut self, now: u64, key: &str, force: bool) -> StoreResult<()> {
        self.inner.remove(now, key, force)
    }
    fn put(
        &mut self,
        now: u64,
        key: &str,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        self.inner.put(now, key, payload, cfg)
    }
    fn exists_key(&mut self, now: u64, key: &StoreKey) -> StoreResult<bool> {
        self.inner.exists_key(now, key)
    }
    fn get_into_key(&mut self, now: u64, key: &StoreKey, buf: &mut [u8]) -> StoreResult<u64> {
        self.inner.get_into_key(now, key, buf)
    }
    fn get_size_key(&mut self, now: u64, key: &StoreKey) -> StoreResult<u64> {
        self.inner.get_size_key(now, key)
    }
    fn put_key(
        &mut self,
        now: u64,
        key: &StoreKey,
        payload: Payload,
        cfg: &ReplicateConfig,
    ) -> StoreResult<()> {
        let bytes = match (&payload, key) {
            (Payload::Bytes(b), StoreKey::Kv(_)) => b.len() as u64,
            _ => 0,
        };
        let t0 = std::time::Instant::now();
        let r = self.inner.put_key(now, key, payload, cfg);
        if bytes > 0 && r.is_ok() {
            self.timed.push(Timed {
                worker: u32::MAX,
                what: Work::Transfer {
                    flow: Flow::KvPut,
                    bytes,
                    path: KvPath::Store,
                },
                start_ns: t0.duration_since(self.origin).as_nanos() as u64,
                measured_ns: t0.elapsed().as_nanos() as u64,
                waited_ns: 0,
            });
        }
        r
    }
    fn remove_key(&mut self, now: u64, key: &StoreKey, force: bool) -> StoreResult<()> {
        self.inner.remove_key(now, key, force)
    }
    fn begin_read(&mut self, now: u64, key: &str) -> StoreResult<u64> {
        self.inner.begin_read(now, key)
    }
    fn end_read(&mut self, now: u64, key: &str) -> StoreResult<()> {
        self.inner.end_read(now, key)
    }
    fn begin_read_key(&mut self, now: u64, key: &StoreKey) -> StoreResult<u64> {
        self.inner.begin_read_key(now, key)
    }
    fn end_read_key(&mut self, now: u64, key: &StoreKey) -> StoreResult<()> {
        self.inner.end_read_key(now, key)
    }
    fn prefetch_key(&self, key: &StoreKey) {
        self.inner.prefetch_key(key)
    }
    fn prefetch_put_key(&self, key: &StoreKey, ahead: usize) {
        self.inner.prefetch_put_key(key, ahead)
    }
}

/// Where two action logs first differ, if they do.
pub fn first_difference(a: &[(u64, Action)], b: &[(u64, Action)]) -> Option<String> {
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
        return Some(format!("action {i}: {:?} vs {:?}", a[i], b[i]));
    }
    (a.len() != b.len()).then(|| format!("{} vs {} actions", a.len(), b.len()))
}

/// Write a run's files into `dir`: `requests.parquet` (the simulator's per-request
/// columns), `inputs.jsonl` and `actions.jsonl` (`[t_ns, ...]` per line), `timed.jsonl`
/// (every unit of work the threads timed) and `summary.json`.
pub fn write_run(dir: &Path, m: &Measured, s: &RunSummary) -> Result<(), MeasureError> {
    std::fs::create_dir_all(dir).map_err(|e| MeasureError::writing(dir, e))?;
    let p = dir.join("requests.parquet");
    records_table(&m.records)
        .write_parquet(&p)
        .map_err(|e| MeasureError::writing(&p, e))?;
    write_lines(&dir.join("inputs.jsonl"), &m.inputs)?;
    write_lines(&dir.join("actions.jsonl"), &m.actions)?;
    write_lines(&dir.join("timed.jsonl"), &m.timed)?;
    let p = dir.join("summary.json");
    let text = serde_json::to_string_pretty(s).map_err(|e| MeasureError::writing(&p, e))?;
    std::fs::write(&p, text).map_err(|e| MeasureError::writing(&p, e))?;
    Ok(())
}

pub(crate) fn write_lines<T: Serialize>(path: &Path, rows: &[T]) -> Result<(), MeasureError> {
    let werr = |e: &dyn std::fmt::Display| MeasureError::writing(path, e);
    let f = std::fs::File::create(path).map_err(|e| werr(&e))?;
    let mut w = std::io::BufWriter::new(f);
    for r in rows {
        serde_json::to_writer(&mut w, r).map_err(|e| werr(&e))?;
        w.write_all(b"\n").map_err(|e| werr(&e))?;
    }
    w.flush().map_err(|e| werr(&e))
}

/// Read an input log written by [`write_run`].
pub fn read_inputs(path: &Path) -> Result<Vec<(u64, Input)>, MeasureError> {
    read_lines(path, "[t_ns, input]")
}

/// Read a JSON-lines file of `T` (blank lines skipped); an error names the file, the line
/// and `expected`.
pub fn read_lines<T: serde::de::DeserializeOwned>(
    path: &Path,
    expected: &str,
) -> Result<Vec<T>, MeasureError> {
    let text = std::fs::read_to_string(path).map_err(|e| MeasureError::File {
        path: path.display().to_string(),
        what: format!("reading: {e}"),
    })?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| MeasureError::File {
                path: format!("{}:{}", path.display(), i + 1),
                what: format!("expected {expected}: {e}"),
            })
        })
        .collect()
}

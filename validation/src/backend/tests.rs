//! The driver on toy traces: every request finishes, the input log replays to the same
//! action log, and faults stop the run with a clear error instead of hanging.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use moonagent_core::serve::toy::{replay_inputs, toy_config, toy_trace, ToyPricing};
use moonagent_core::serve::{Engine, Mode, Payloads, WorkerId};
use moonagent_core::store::{MemStore, MemStoreConfig};

use super::{run, BackendError, ExecError, Executor, RunOptions, Step};

/// Busy-waits a few microseconds per unit of work, or fails / hangs when told to.
struct Spin {
    fail: bool,
    hang: AtomicBool,
}

impl Spin {
    fn new() -> Self {
        Self {
            fail: false,
            hang: AtomicBool::new(false),
        }
    }
}

fn spin(us: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_micros(us) {
        std::hint::spin_loop();
    }
}

impl Executor for Spin {
    fn run(&self, _w: WorkerId, step: &Step) -> Result<Vec<Vec<u8>>, ExecError> {
        if self.fail {
            return Err(ExecError {
                what: "injected failure".into(),
            });
        }
        if self.hang.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_secs(3));
        }
        spin(match step {
            Step::Encode { tokens, .. } => 5 + tokens.len() as u64,
            Step::Prefill(c) => 5 + c.len() as u64,
            Step::Decode { batch, .. } => 5 + u64::from(*batch),
        });
        Ok(Vec::new())
    }
    fn fingerprint(&self, _bytes: u64) -> Result<(), ExecError> {
        spin(2);
        Ok(())
    }
}

fn store() -> MemStore<String> {
    MemStore::new(MemStoreConfig::with_capacity(256 << 20)).unwrap()
}

#[test]
fn every_request_finishes_and_the_input_log_replays_to_the_same_actions() {
    let trace = toy_trace(5, 30, 16);
    let arrivals: Vec<u64> = (0..trace.len() as u64).map(|i| i * 200_000).collect();
    for mode in Mode::ALL {
        let cfg = toy_config(mode, Payloads::Bytes);
        let mut e = Engine::new(cfg.clone(), store(), &trace, Some(Box::new(ToyPricing))).unwrap();
        let m = run(
            &mut e,
            &arrivals,
            Arc::new(Spin::new()),
            RunOptions::default(),
        )
        .unwrap();
        assert!(
            m.done.iter().all(|&d| d),
            "{mode:?}: not every request finished"
        );
        assert_eq!(m.records.len(), trace.len());
        assert!(m.actions.len() > trace.len(), "{mode:?}: too few actions");
        // Times are the driver's, monotone.
        assert!(m.inputs.windows(2).all(|w| w[0].0 <= w[1].0));
        let mut fresh = Engine::new(cfg, store(), &trace, Some(Box::new(ToyPricing))).unwrap();
        let replayed = replay_inputs(&mut fresh, &m.inputs).unwrap();
        assert_eq!(replayed, m.actions, "{mode:?}: replay decided differently");
        assert!(m.timed.len() >= m.inputs.len() - trace.len());
    }
}

#[test]
fn a_failing_worker_stops_the_run_with_its_error() {
    let trace = toy_trace(6, 10, 16);
    let arrivals = vec![0; trace.len()];
    let mut e = size_only(Mode::B1, &trace);
    let exec = Spin {
        fail: true,
        hang: AtomicBool::new(false),
    };
    let err = run(&mut e, &arrivals, Arc::new(exec), RunOptions::default()).unwrap_err();
    assert!(
        matches!(err, BackendError::Exec { .. }),
        "expected a worker error, got {err}"
    );
    assert!(err.to_string().contains("injected failure"), "{err}");
}

#[test]
fn a_hanging_worker_is_reported_as_a_stall_within_the_timeout() {
    let trace = toy_trace(7, 5, 16);
    let arrivals = vec![0; trace.len()];
    let mut e = size_only(Mode::B0, &trace);
    let exec = Spin::new();
    exec.hang.store(true, Ordering::Relaxed);
    let t = Instant::now();
    let opts = RunOptions {
        stall_timeout: Duration::from_millis(300),
        ..RunOptions::default()
    };
    let err = run(&mut e, &arrivals, Arc::new(exec), opts).unwrap_err();
    assert!(matches!(err, BackendError::Stalled { .. }), "{err}");
    // Reported after the stall timeout, without waiting for the hung step (3 s).
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

/// `mode` with size-only payloads on the embedded store, round robin (no pricing).
fn size_only(
    mode: Mode,
    trace: &[moonagent_core::serve::toy::ToyRequest],
) -> Engine<'_, MemStore<String>, moonagent_core::serve::toy::ToyRequest> {
    Engine::new(toy_config(mode, Payloads::SizeOnly), store(), trace, None).unwrap()
}

/// B3 with real bytes over `store`.
fn b3_bytes<'a, S: moonagent_core::store::Store>(
    store: S,
    trace: &'a [moonagent_core::serve::toy::ToyRequest],
) -> Engine<'a, S, moonagent_core::serve::toy::ToyRequest> {
    let cfg = toy_config(Mode::B3, Payloads::Bytes);
    Engine::new(cfg, store, trace, Some(Box::new(ToyPricing))).unwrap()
}

#[test]
fn corrupt_and_lost_objects_are_misses_and_the_run_finishes() {
    use moonagent_core::faulty::{FaultKind, FaultyStore};
    let trace = toy_trace(8, 40, 16);
    let arrivals: Vec<u64> = (0..trace.len() as u64).map(|i| i * 100_000).collect();
    let mut store = FaultyStore::new(store(), 3);
    for k in [
        FaultKind::DropBlob,
        FaultKind::CorruptBlob,
        FaultKind::TruncateBlob,
        FaultKind::DropMeta,
        FaultKind::CorruptMeta,
    ] {
        store.set_rate(k, 0.3);
    }
    let mut e = b3_bytes(store, &trace);
    let m = run(
        &mut e,
        &arrivals,
        Arc::new(Spin::new()),
        RunOptions::default(),
    )
    .unwrap();
    assert!(m.done.iter().all(|&d| d), "not every request finished");
    // Fail open: the bad objects were misses (recomputed), counted by reason.
    let misses = e.cache().counters().misses;
    let bad = misses.corrupt_blob + misses.blob_missing + misses.not_found + misses.corrupt_meta;
    assert!(bad > 0, "no fault surfaced as a miss: {misses:?}");
}

#[test]
fn an_unreachable_store_stops_the_run_with_its_error_at_once() {
    use moonagent_core::faulty::{FaultKind, FaultyStore};
    let trace = toy_trace(9, 40, 16);
    let arrivals: Vec<u64> = (0..trace.len() as u64).map(|i| i * 100_000).collect();
    let mut store = FaultyStore::new(store(), 4);
    store.set_rate(FaultKind::Unavailable, 0.05);
    let mut e = b3_bytes(store, &trace);
    let t = Instant::now();
    let err = run(
        &mut e,
        &arrivals,
        Arc::new(Spin::new()),
        RunOptions::default(),
    )
    .unwrap_err();
    assert!(
        matches!(err, BackendError::Serve(_)),
        "expected the store's error, got {err}"
    );
    assert!(err.to_string().contains("unavailable"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

/// A timed record without `waited_ns` (written before it existed, or by a run without a
/// gate) reads as 0, and 0 is left out of the JSON.
#[test]
fn waited_ns_defaults_to_zero_and_zero_is_not_written() {
    let old = r#"{"worker":0,"what":{"Step":{"Encode":{"tokens":[64],"contents":[1]}}},"start_ns":5,"measured_ns":9}"#;
    let t: super::Timed = serde_json::from_str(old).unwrap();
    assert_eq!(t.waited_ns, 0);
    assert_eq!(serde_json::to_string(&t).unwrap(), old);
    let waited = super::Timed { waited_ns: 4, ..t };
    let text = serde_json::to_string(&waited).unwrap();
    assert!(text.ends_with(r#","waited_ns":4}"#), "{text}");
    assert_eq!(serde_json::from_str::<super::Timed>(&text).unwrap(), waited);
}

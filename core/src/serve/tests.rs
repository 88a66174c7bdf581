//! Unit tests of the engine's decisions (see also `core/tests/serve_prop.rs`).

use super::toy::{toy_config, ToyPricing, ToyRequest};
use super::{Action, Done, Engine, EngineConfig, Mode, Payloads};
use crate::store::{MemStore, MemStoreConfig};

fn req(id: u64, prompt: u32) -> ToyRequest {
    ToyRequest {
        id,
        prompt,
        output: 2,
        blocks: Vec::new(),
        images: Vec::new(),
        branches: Vec::new(),
    }
}

/// Two prefill workers, no prefix store, one chunk per prompt.
fn two_prefills(mode: Mode) -> EngineConfig {
    EngineConfig {
        prefills: 2,
        prefill_chunk_tokens: 1 << 20,
        kv_prefix_store: false,
        kv_pages: 4096,
        ..toy_config(mode, Payloads::SizeOnly)
    }
}

type E<'a> = Engine<'a, MemStore<String>, ToyRequest>;

fn engine<'a>(cfg: EngineConfig, trace: &'a [ToyRequest]) -> E<'a> {
    let store = MemStore::new(MemStoreConfig::with_capacity(1 << 20)).unwrap();
    Engine::new(cfg, store, trace, Some(Box::new(ToyPricing))).unwrap()
}

fn actions(e: &mut E<'_>) -> Vec<Action> {
    std::iter::from_fn(|| e.poll_action()).collect()
}

/// Arrive request `i` and fingerprint it; returns the prefill worker its load goes to.
fn place(e: &mut E<'_>, now: u64, i: usize) -> u32 {
    e.arrive(now, i).unwrap();
    let a = actions(e);
    let Some(Action::Fingerprint { job, .. }) = a.first().cloned() else {
        panic!("expected a fingerprint first, got {a:?}");
    };
    e.complete(now, Done::Fingerprinted(job)).unwrap();
    match actions(e).as_slice() {
        [Action::Load { worker, .. }] => *worker,
        other => panic!("expected one load, got {other:?}"),
    }
}

/// Finish job `job`'s load on `worker` at `now` and its prefill right after; returns
/// whether a prefill started.
fn load_and_prefill(e: &mut E<'_>, now: u64, job: u32, worker: u32, finish: bool) {
    e.complete(now, Done::Loaded(job)).unwrap();
    let a = actions(e);
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Prefill { worker: w, .. } if *w == worker)),
        "{a:?}"
    );
    if finish {
        e.complete(now + 1, Done::Step(worker)).unwrap();
        actions(e);
    }
}

#[test]
fn a_busy_prefill_worker_with_an_empty_queue_loses_to_an_idle_one() {
    // 0: a 12k-token prompt; 1: a tiny one that moves the round-robin cursor back to the
    // busy worker; 2: the request to place.
    let trace = [req(0, 12_000), req(1, 10), req(2, 100)];
    let mut e = engine(two_prefills(Mode::Full), &trace);
    let p = place(&mut e, 0, 0);
    // Its whole prompt is one chunk, in flight: nothing is waiting in its queue.
    load_and_prefill(&mut e, 10, 0, p, false);
    let q = place(&mut e, 20, 1);
    assert_ne!(q, p, "the tiny request goes to the idle worker");
    load_and_prefill(&mut e, 30, 1, q, true);
    // The cursor now points at the busy worker; the signal must still pick the idle one.
    let busy = e.load_ns(40, p, 1).unwrap();
    let idle = e.load_ns(40, q, 1).unwrap();
    assert!(busy > idle, "busy {busy} ns vs idle {idle} ns");
    assert_eq!(place(&mut e, 40, 2), q);
}

#[test]
fn work_still_in_transit_counts_against_its_worker() {
    // The pathology of the Mooncake conversation trace: a long prompt's KV is still
    // loading into worker p (not yet queued there) when the next request is placed.
    let trace = [req(0, 12_000), req(1, 10), req(2, 100)];
    let mut e = engine(two_prefills(Mode::Full), &trace);
    let p = place(&mut e, 0, 0);
    let q = place(&mut e, 5, 1);
    assert_ne!(q, p);
    load_and_prefill(&mut e, 6, 1, q, true);
    // Request 0 is still in transit to p, and the cursor points at p.
    assert!(e.load_ns(10, p, 1).unwrap() > e.load_ns(10, q, 1).unwrap());
    assert_eq!(place(&mut e, 10, 2), q);
}

#[test]
fn round_robin_modes_ignore_load() {
    // B3 places by round robin: the third request goes back to the first worker even
    // though it is the busy one (what Full improves on).
    let trace = [req(0, 12_000), req(1, 10), req(2, 100)];
    let mut e = engine(two_prefills(Mode::B3), &trace);
    let p = place(&mut e, 0, 0);
    let q = place(&mut e, 5, 1);
    assert_ne!(q, p);
    assert_eq!(place(&mut e, 10, 2), p);
    assert_eq!(
        e.load_ns(10, p, 1),
        None,
        "no signal without smart scheduling"
    );
}

#[test]
fn smart_scheduling_needs_a_pricing() {
    let trace = [req(0, 10)];
    let store = MemStore::<String>::new(MemStoreConfig::with_capacity(1 << 20)).unwrap();
    let r = Engine::new(two_prefills(Mode::Full), store, &trace, None);
    assert!(r.is_err());
}

/// Readers the store counts on `key` (0 when absent).
fn readers(e: &E<'_>, key: &str) -> u32 {
    e.cache().store().peek(key).map_or(0, |m| m.readers)
}

#[test]
fn a_load_holds_the_prefix_blocks_it_reads_until_it_completes() {
    // Request 0 computes and publishes blocks 11 and 12; request 1 shares them, so its
    // load reads them from the store over time (INVARIANTS E12).
    let mut a = req(0, 40);
    a.blocks = vec![11, 12];
    let mut b = req(1, 40);
    b.blocks = vec![11, 12];
    let trace = [a, b];
    let cfg = EngineConfig {
        kv_prefix_store: true,
        ..two_prefills(Mode::B3)
    };
    let mut e = engine(cfg, &trace);
    let p = place(&mut e, 0, 0);
    load_and_prefill(&mut e, 10, 0, p, true);
    assert!(
        e.cache().store().peek("kv:11").is_some(),
        "block 11 published"
    );
    assert_eq!(readers(&e, "kv:11"), 0, "nothing reads it yet");
    let q = place(&mut e, 20, 1);
    assert_eq!(e.counters().kv_hits, 2);
    assert_eq!((readers(&e, "kv:11"), readers(&e, "kv:12")), (1, 1));
    assert_eq!(e.counters().reads_held, 2);
    load_and_prefill(&mut e, 30, 1, q, false);
    assert_eq!((readers(&e, "kv:11"), readers(&e, "kv:12")), (0, 0));
}

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

/// The job of a fingerprint action (every arrival's first action).
fn fingerprinted(a: Option<Action>) -> u32 {
    match a {
        Some(Action::Fingerprint { job, .. }) => job,
        other => panic!("expected a fingerprint, got {other:?}"),
    }
}

/// Actions leave in the order decided, also when an input comes before the driver drained
/// the earlier ones: those stay first, in their order, and the new input's follow.
#[test]
fn actions_come_out_in_decision_order_across_inputs() {
    let trace: Vec<_> = (0..4).map(|i| req(i, 64)).collect();
    let mut e = engine(two_prefills(Mode::B3), &trace);
    for i in 0..3 {
        e.arrive(0, i).unwrap();
    }
    assert_eq!(fingerprinted(e.poll_action()), 0);
    e.arrive(0, 3).unwrap();
    let rest: Vec<u32> = std::iter::from_fn(|| e.poll_action())
        .map(|a| fingerprinted(Some(a)))
        .collect();
    assert_eq!(rest, vec![1, 2, 3]);
}

/// One worker per role instance (disaggregated) or per colocated instance, and a KV pool
/// of `kv_pages` on every worker that decodes.
#[test]
fn workers_and_kv_pools_follow_the_config() {
    let trace = vec![req(0, 64)];
    let epd = EngineConfig {
        encoders: 2,
        prefills: 3,
        decodes: 2,
        ..two_prefills(Mode::B3)
    };
    let e = engine(epd.clone(), &trace);
    assert_eq!(e.workers(), 7);
    let pools = e.pool_stats();
    assert_eq!(pools.len(), 2, "one pool per decode worker");
    assert!(pools
        .iter()
        .all(|p| p.capacity == epd.kv_pages && p.free == epd.kv_pages && p.used == 0));
    let b0 = EngineConfig {
        colocated: 3,
        ..two_prefills(Mode::B0)
    };
    let e = engine(b0, &trace);
    assert_eq!(e.workers(), 3);
    assert_eq!(e.pool_stats().len(), 3);
}

/// Under smart scheduling, workers with the same predicted drain time take turns: a tie
/// goes to the first at or after the cursor, and the cursor moves past the chosen one.
#[test]
fn tied_workers_take_turns_under_smart_scheduling() {
    let trace: Vec<_> = (0..4).map(|i| req(i, 100)).collect();
    let cfg = EngineConfig {
        prefills: 3,
        ..two_prefills(Mode::Full)
    };
    let mut e = engine(cfg, &trace);
    let placed: Vec<u32> = (0..4).map(|i| place(&mut e, 0, i)).collect();
    // Worker 0 encodes; 1, 2 and 3 prefill. The fourth request ties all three again.
    assert_eq!(placed, vec![1, 2, 3, 1]);
}

/// A run cut off mid-decode hands back every token produced: the prefill's first one and
/// one per completed decode iteration, reported by the batch only at the cut.
#[test]
fn a_cut_off_run_counts_the_tokens_of_completed_iterations() {
    let trace = [ToyRequest {
        output: 10,
        ..req(0, 64)
    }];
    let mut e = engine(two_prefills(Mode::B3), &trace);
    let mut decodes = 0;
    // Stop when the third iteration is decided: two have completed by then.
    let stopped = super::toy::drive(
        &mut e,
        &[0],
        |_, _| 5,
        |seen| match seen {
            super::toy::Seen::Action(_, Action::Decode { .. }) => {
                decodes += 1;
                if decodes == 3 {
                    Err("cut".into())
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        },
    );
    assert!(stopped.is_err());
    let (served, _, _) = e.into_served();
    assert_eq!(served[0].rec.output_tokens, 1 + 2);
}

/// An encoder that answers every image with `len` bytes.
struct FixedOutputs(usize);

impl super::EncoderOutputs for FixedOutputs {
    fn take(&mut self, _job: u32, _idx: u32) -> Option<Vec<u8>> {
        Some(vec![7; self.0])
    }
}

/// With real payloads the engine commits what the driver's encoder produced: an output of
/// the wrong size stops the run with [`super::ServeError::EncoderOutput`] instead of
/// being replaced by stand-in bytes.
#[test]
fn real_payloads_commit_the_drivers_encoder_outputs() {
    let trace = [ToyRequest {
        images: vec![(42, 64)],
        ..req(0, 64)
    }];
    let cfg = || EngineConfig {
        payloads: Payloads::Bytes,
        ..two_prefills(Mode::B1)
    };
    let run = |outputs: Option<usize>| {
        let mut e = engine(cfg(), &trace);
        if let Some(len) = outputs {
            e.set_encoder_outputs(Box::new(FixedOutputs(len)));
        }
        super::toy::drive(&mut e, &[0], |_, _| 5, |_| Ok(()))
    };
    // Stand-in bytes without an encoder's outputs; a wrong-sized output is refused.
    assert!(run(None).is_ok());
    assert!(matches!(
        run(Some(3)),
        Err(super::toy::DriveError::Engine(
            super::ServeError::EncoderOutput { job: 0, idx: 0, .. }
        ))
    ));
}

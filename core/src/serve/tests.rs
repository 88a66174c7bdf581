//! Unit tests of the engine's decisions (see also `core/tests/serve_prop.rs`).

use super::toy::{toy_config, ToyPricing, ToyRequest};
use super::{Action, Done, Engine, EngineConfig, Mode, Payloads};
use crate::faulty::{FaultKind, FaultyStore};
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

/// A request whose prompt begins with the prefix blocks `blocks`.
fn with_blocks(id: u64, prompt: u32, blocks: &[u64]) -> ToyRequest {
    ToyRequest {
        blocks: blocks.to_vec(),
        ..req(id, prompt)
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
    let trace = [with_blocks(0, 40, &[11, 12]), with_blocks(1, 40, &[11, 12])];
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
    // Stand-in bytes without an encoder's outputs; the encoder's own bytes when they are
    // the image's size (64 visual tokens x 8 bytes); a wrong-sized output is refused.
    assert!(run(None).is_ok());
    assert!(run(Some(64 * 8)).is_ok());
    assert!(matches!(
        run(Some(3)),
        Err(super::toy::DriveError::Engine(
            super::ServeError::EncoderOutput { job: 0, idx: 0, .. }
        ))
    ));
}

/// The one action of kind `pick` in `a` (panics with the list otherwise).
fn only<T>(a: &[Action], pick: impl Fn(&Action) -> Option<T>) -> T {
    let mut found = a.iter().filter_map(pick);
    match (found.next(), found.next()) {
        (Some(x), None) => x,
        _ => panic!("expected exactly one such action in {a:?}"),
    }
}

/// E8's arithmetic, by hand from `ToyPricing` (encode 10 ns per visual token; prefill
/// `5 n + n c / 100` for `n` new tokens after `c` cached; decode `2000 + batch + ctx / 100`;
/// 1 ns per byte moved): one request through every stage of a Full run, the signal read
/// at each step. Every item of work is counted once: the batch in flight by its predicted
/// end, the queue by what is left after it (a running chunk is not also queued).
#[test]
fn the_load_signal_prices_each_stage_once() {
    let trace = [
        ToyRequest {
            images: vec![(7, 100)],
            ..req(0, 200)
        },
        ToyRequest {
            images: vec![(8, 100)],
            ..req(1, 10)
        },
    ];
    let cfg = EngineConfig {
        kv_prefix_store: false,
        ..toy_config(Mode::Full, Payloads::SizeOnly)
    };
    let mut e = engine(cfg, &trace);
    // One worker per role, numbered encoders first.
    let (enc, pre, dec) = (0, 1, 2);
    let step = |e: &mut E<'_>, now, w| {
        e.complete(now, Done::Step(w)).unwrap();
        actions(e)
    };

    // Encode: image 0 (100 tokens, 1,000 ns) runs; image 1 waits behind it (the 128-token
    // batch budget cannot take both).
    e.arrive(0, 0).unwrap();
    let a = actions(&mut e);
    // The fingerprint reads the image's pixels: 100 tokens x 12 bytes.
    only(&a, |x| {
        matches!(
            x,
            Action::Fingerprint {
                job: 0,
                pixel_bytes: 1_200
            }
        )
        .then_some(())
    });
    e.complete(0, Done::Fingerprinted(0)).unwrap();
    let a = actions(&mut e);
    only(&a, |x| {
        matches!(x, Action::Encode { worker, .. } if *worker == enc).then_some(())
    });
    assert_eq!(e.load_ns(0, enc, 0), Some(1_000));
    e.arrive(10, 1).unwrap();
    actions(&mut e);
    e.complete(10, Done::Fingerprinted(1)).unwrap();
    assert!(actions(&mut e).is_empty(), "image 1 queues");
    assert_eq!(e.load_ns(10, enc, 0), Some(990 + 1_000));
    // Image 0 done: image 1 runs, nothing is queued.
    let a = step(&mut e, 1_000, enc);
    only(&a, |x| matches!(x, Action::Encode { .. }).then_some(()));
    assert_eq!(e.load_ns(1_000, enc, 0), Some(1_000));
    assert_eq!(e.load_ns(1_500, enc, 0), Some(500));

    // Job 0's embedding (100 x 8 = 800 bytes) is stored, then loads into the prefill
    // worker: in transit, it brings its read (800 ns) and its whole prefill (200 new
    // tokens: 1,000 ns).
    e.complete(1_100, Done::Stored(0, 0)).unwrap();
    let a = actions(&mut e);
    assert_eq!(
        only(&a, |x| match x {
            Action::Load {
                worker,
                embed_bytes,
                kv_bytes,
                ..
            } => Some((*worker, *embed_bytes, *kv_bytes)),
            _ => None,
        }),
        (pre, 800, 0)
    );
    assert_eq!(e.load_ns(1_100, pre, 1), Some(800 + 1_000));

    // Loaded: chunk 1 (96 new: 480 ns) runs; queued is only the rest (104 new after 96:
    // 520 + 99 = 619 ns), not the whole prompt again.
    e.complete(1_200, Done::Loaded(0)).unwrap();
    let a = actions(&mut e);
    only(&a, |x| {
        matches!(x, Action::Prefill { chunks, .. } if chunks == &[(96, 0)]).then_some(())
    });
    assert_eq!(e.load_ns(1_200, pre, 1), Some(480 + 619));
    assert_eq!(e.load_ns(1_400, pre, 1), Some(280 + 619));
    // Chunk 2 (96 after 96: 480 + 92 = 572 ns); left: 8 after 192 (40 + 15 = 55 ns).
    step(&mut e, 1_680, pre);
    assert_eq!(e.load_ns(1_680, pre, 1), Some(572 + 55));
    // Chunk 3, the last: nothing queued behind it.
    step(&mut e, 2_252, pre);
    assert_eq!(e.load_ns(2_252, pre, 1), Some(55));

    // Prefill done: the KV (200 x 16 = 3,200 bytes) moves to the decode worker, which
    // sees it in transit and prices its next iteration with the sequence admitted
    // (batch 1, 200 tokens: 2,000 + 1 + 2).
    let a = step(&mut e, 2_307, pre);
    only(&a, |x| {
        matches!(x, Action::Transfer { to: Some(w), bytes: 3_200, .. } if *w == dec).then_some(())
    });
    assert_eq!(e.load_ns(2_307, pre, 1), Some(0));
    assert_eq!(e.load_ns(2_307, dec, 2), Some(3_200 + 2_003));
    // The KV arrives: the first decode iteration (batch 1, 201 tokens: 2,003 ns) runs,
    // and the next one is priced the same.
    e.complete(5_507, Done::KvArrived(0)).unwrap();
    let a = actions(&mut e);
    only(&a, |x| {
        matches!(
            x,
            Action::Decode {
                batch: 1,
                ctx_sum: 201,
                ..
            }
        )
        .then_some(())
    });
    assert_eq!(e.load_ns(5_507, dec, 2), Some(2_003 + 2_003));
    assert_eq!(e.load_ns(6_000, dec, 2), Some(1_510 + 2_003));
    // Its second and last output token: the decode worker drains to nothing.
    step(&mut e, 7_510, dec);
    assert!(e.served()[0].done);
    assert_eq!(e.load_ns(7_510, dec, 2), Some(0));
    // The record: prefill started with the first chunk; one image encoded and its 800
    // bytes put, the only encoder output on the link (image 1 is still encoding).
    let r = &e.served()[0].rec;
    assert_eq!(r.prefill_start_ns, 1_200);
    assert_eq!((r.images_encoded, r.bytes_encoder_store), (1, 800));
    assert_eq!(e.counters().images_encoded, 1);
    assert_eq!(e.counters().link_bytes[0], 800);
}

/// Full mode on the toy cluster, no prefix store, one chunk per prompt.
fn one_chunk_full() -> EngineConfig {
    EngineConfig {
        kv_prefix_store: false,
        prefill_chunk_tokens: 1 << 20,
        ..toy_config(Mode::Full, Payloads::SizeOnly)
    }
}

/// A toy pricing with a fixed cost per prefill iteration, so that pricing an empty
/// remainder (zero tokens) shows up in the signal.
struct PrefillOverhead;

impl super::Pricing for PrefillOverhead {
    fn encode_ns(&self, tokens: &[u32]) -> u64 {
        ToyPricing.encode_ns(tokens)
    }
    fn prefill_ns(&self, chunks: &[(u32, u32)]) -> u64 {
        1_000 + ToyPricing.prefill_ns(chunks)
    }
    fn decode_ns(&self, batch: u32, ctx_sum: u64) -> u64 {
        ToyPricing.decode_ns(batch, ctx_sum)
    }
    fn transfer_ns(&self, flow: super::Flow, bytes: u64) -> u64 {
        ToyPricing.transfer_ns(flow, bytes)
    }
}

/// E8: nothing left is priced as nothing, even where an iteration has a fixed cost: a
/// prompt whose one chunk runs leaves no queued price, and a context that fits the pool
/// adds no recompute.
#[test]
fn nothing_left_is_priced_as_nothing() {
    let trace = [req(0, 100)];
    let store = MemStore::new(MemStoreConfig::with_capacity(1 << 20)).unwrap();
    let cfg = one_chunk_full();
    let mut e: E<'_> = Engine::new(cfg, store, &trace, Some(Box::new(PrefillOverhead))).unwrap();
    let pre = place(&mut e, 0, 0);
    // The one chunk: 1,000 + 5 x 100 ns, nothing queued behind it.
    load_and_prefill(&mut e, 10, 0, pre, false);
    assert_eq!(e.load_ns(10, pre, 1), Some(1_500));
    // Done: the KV (1,600 bytes) in transit and the next iteration (2,000 + 1 + 1), no
    // recompute (100 tokens fit 2,048).
    e.complete(1_510, Done::Step(pre)).unwrap();
    actions(&mut e);
    assert_eq!(e.load_ns(1_510, 2, 2), Some(1_600 + 2_002));
}

/// E8: a queued prompt is priced by its tokens not found in the prefix store, after the
/// cached ones.
#[test]
fn a_queued_prompt_is_priced_after_its_cached_prefix() {
    // 0 publishes blocks 11 and 12 (32 tokens); 1 keeps the one prefill worker busy; 2
    // shares 0's blocks and waits behind 1.
    let trace = [
        with_blocks(0, 40, &[11, 12]),
        req(1, 1_000),
        with_blocks(2, 40, &[11, 12]),
    ];
    let cfg = EngineConfig {
        prefill_chunk_tokens: 1 << 20,
        ..toy_config(Mode::Full, Payloads::SizeOnly)
    };
    let mut e = engine(cfg, &trace);
    let pre = place(&mut e, 0, 0);
    load_and_prefill(&mut e, 10, 0, pre, true);
    assert_eq!(place(&mut e, 20, 1), pre);
    // 1,000 new tokens: 5,000 ns, busy until 5,030.
    load_and_prefill(&mut e, 30, 1, pre, false);
    assert_eq!(place(&mut e, 40, 2), pre);
    assert_eq!(e.counters().kv_hits, 2);
    // In transit: busy until 5,030; 32 cached tokens of KV (512 bytes) and the prefill of
    // the other 8 (40 + 8 x 32 / 100 = 42 ns).
    assert_eq!(e.load_ns(40, pre, 1), Some(4_990 + 512 + 42));
    e.complete(50, Done::Loaded(2)).unwrap();
    assert!(actions(&mut e).is_empty(), "job 2 waits behind job 1");
    // 8 new tokens after 32 cached: 40 + 8 x 32 / 100 = 42 ns.
    assert_eq!(e.load_ns(50, pre, 1), Some(4_980 + 42));
}

/// E8: context beyond a decode worker's KV pool is priced as its recompute (a prefill of
/// the overflow), on top of the transfer and the next iteration.
#[test]
fn decode_overflow_beyond_the_pool_is_priced_as_recompute() {
    // 256 pages of 8 tokens hold 2,048 tokens; a 3,000-token prompt overflows by 952.
    let trace = [req(0, 3_000)];
    let mut e = engine(one_chunk_full(), &trace);
    assert_eq!(e.pool_stats().iter().map(|p| p.free).max(), Some(256));
    let pre = place(&mut e, 0, 0);
    load_and_prefill(&mut e, 10, 0, pre, true);
    let dec = 2;
    // KV: 3,000 x 16 = 48,000 bytes; next iteration 2,000 + 1 + 30; recompute of 952
    // tokens 5 x 952 = 4,760.
    assert_eq!(e.load_ns(11, dec, 2), Some(48_000 + 2_031 + 4_760));
}

#[test]
fn a_completion_naming_no_job_or_worker_is_refused_not_a_panic() {
    // One request in, so job 0 exists and job 1 does not (the first id past the end).
    let trace = [req(0, 40)];
    let mut e = engine(toy_config(Mode::Full, Payloads::SizeOnly), &trace);
    e.arrive(0, 0).unwrap();
    actions(&mut e);
    for done in [
        Done::Fingerprinted(1),
        Done::Stored(1, 0),
        Done::Loaded(1),
        Done::KvArrived(1),
        Done::Step(e.workers()),
        // A worker with nothing in flight.
        Done::Step(0),
    ] {
        assert!(
            matches!(e.complete(5, done), Err(super::ServeError::Unexpected(d)) if d == done),
            "{done:?}"
        );
    }
    assert!(matches!(
        e.arrive(6, 1),
        Err(super::ServeError::NoSuchRequest(1))
    ));
    // Nothing was decided on the way: the engine goes on with job 0.
    assert_eq!(actions(&mut e), Vec::new());
    e.complete(7, Done::Fingerprinted(0)).unwrap();
    assert!(matches!(
        actions(&mut e).as_slice(),
        [Action::Load { job: 0, .. }]
    ));
}

/// Encoder batching: images join the running batch while their visual tokens fit the
/// budget (128 in the toy cluster), an exact fit included; the next image waits.
#[test]
fn an_encoder_batch_takes_images_while_they_fit_the_budget() {
    let trace = [ToyRequest {
        images: vec![(1, 64), (2, 64), (3, 1)],
        ..req(0, 200)
    }];
    let mut e = engine(toy_config(Mode::B2, Payloads::SizeOnly), &trace);
    e.arrive(0, 0).unwrap();
    actions(&mut e);
    e.complete(0, Done::Fingerprinted(0)).unwrap();
    let encoded = |a: &[Action]| {
        only(a, |x| match x {
            Action::Encode { tokens, .. } => Some(tokens.clone()),
            _ => None,
        })
    };
    assert_eq!(encoded(&actions(&mut e)), vec![64, 64]);
    e.complete(640, Done::Step(0)).unwrap();
    assert_eq!(encoded(&actions(&mut e)), vec![1]);
}

/// E8: a decode worker's waiting sequence is priced by its own context: once the first
/// of two sequences is admitted, the next iteration counts the running one and the one
/// whose KV is still in transit, nothing of the admitted one twice.
#[test]
fn a_waiting_sequence_is_priced_by_its_own_context() {
    let trace = [req(0, 1_000), req(1, 500)];
    let mut e = engine(one_chunk_full(), &trace);
    let pre = place(&mut e, 0, 0);
    load_and_prefill(&mut e, 10, 0, pre, false);
    assert_eq!(place(&mut e, 20, 1), pre);
    // Job 0's prefill (5,000 ns) ends; job 1's (2,500 ns) runs and ends.
    e.complete(5_010, Done::Step(pre)).unwrap();
    actions(&mut e);
    e.complete(5_020, Done::Loaded(1)).unwrap();
    actions(&mut e);
    e.complete(7_520, Done::Step(pre)).unwrap();
    actions(&mut e);
    // Job 0's KV (16,000 bytes) lands: it runs alone (2,000 + 1 + 1,001 / 100 = 2,011
    // ns) while job 1's (8,000 bytes) is in transit; the next iteration holds both
    // (2,000 + 2 + 1,501 / 100 = 2,017 ns).
    e.complete(21_010, Done::KvArrived(0)).unwrap();
    let dec = 2;
    assert!(actions(&mut e).iter().any(
        |a| matches!(a, Action::Decode { worker, batch: 1, ctx_sum: 1_001, .. } if *worker == dec)
    ));
    assert_eq!(e.load_ns(21_010, dec, 2), Some(2_011 + 8_000 + 2_017));
}

/// E12: a read the store cannot hold goes ahead on the lease and is counted unheld; the
/// run finishes as it would with holds.
#[test]
fn reads_the_store_cannot_hold_go_ahead_unheld() {
    // 0 encodes image 5 and publishes blocks 11 and 12; 2 (the same tenant) hits all
    // three.
    let trace = [
        ToyRequest {
            images: vec![(5, 16)],
            ..with_blocks(0, 40, &[11, 12])
        },
        ToyRequest {
            images: vec![(5, 16)],
            ..with_blocks(2, 40, &[11, 12])
        },
    ];
    let cfg = toy_config(Mode::Full, Payloads::SizeOnly);
    // A store that cannot hold readers: every `begin_read` is refused.
    let mut store = FaultyStore::new(
        MemStore::<String>::new(MemStoreConfig::with_capacity(1 << 20)).unwrap(),
        1,
    );
    store.set_rate(FaultKind::HoldRefused, 1.0);
    let mut e = Engine::new(cfg, store, &trace, Some(Box::new(ToyPricing))).unwrap();
    super::toy::drive(&mut e, &[0, 100_000], |_, _| 5, |_| Ok(())).unwrap();
    assert!(e.served().iter().all(|s| s.done));
    let c = e.counters();
    assert_eq!((c.images_hit, c.kv_hits), (1, 2));
    // Refused: request 0's readback of its fresh embedding, request 2's hit and its two
    // prefix blocks.
    assert_eq!((c.reads_held, c.reads_unheld), (0, 1 + 1 + 2));
    assert_eq!(e.cache().store().injected(FaultKind::HoldRefused), 4);
}

/// E13: a commit is left in place only while a load reads that blob. Once the reads of
/// an embedding have closed and it was evicted, the next encode of it commits again.
#[test]
fn an_embedding_evicted_after_its_reads_closed_is_committed_again() {
    // One at a time: 0 encodes image 5, 2 encodes image 6 (which evicts 5), 4 misses 5
    // and encodes it again. All of tenant 0.
    let img = |id, content| ToyRequest {
        images: vec![(content, 64)],
        ..req(id, 100)
    };
    let trace = [img(0, 5), img(2, 6), img(4, 5)];
    let cfg = EngineConfig {
        kv_prefix_store: false,
        ..toy_config(Mode::Full, Payloads::SizeOnly)
    };
    // Reads lease for 1 us and eviction runs at once past half the store: by the time 2
    // commits, 5's reads have closed and 5 is the victim (2,800 bytes: 5 and 6 together
    // go past the watermark).
    let store = MemStore::new(MemStoreConfig {
        kv_lease_ttl_ns: 1_000,
        eviction_interval_ns: 0,
        high_watermark: 0.5,
        eviction_ratio: 0.3,
        ..MemStoreConfig::with_capacity(2_800)
    })
    .unwrap();
    let mut e: E<'_> = Engine::new(cfg, store, &trace, Some(Box::new(ToyPricing))).unwrap();
    super::toy::drive(&mut e, &[0, 1_000_000, 2_000_000], |_, _| 5, |_| Ok(())).unwrap();
    let c = e.counters();
    assert_eq!((c.images_hit, c.images_encoded), (0, 3), "{c:?}");
    assert_eq!(c.commits_held, 0, "{c:?}");
    // Every fresh output was committed and read back.
    assert_eq!(e.cache().counters().readback_hits, 3);
}

/// Workers are numbered encoders, then prefills, then decodes (colocated GPUs in B0), and
/// each says its role.
#[test]
fn each_worker_says_its_role() {
    use super::Role;
    let trace = [req(0, 10)];
    let roles = |cfg: EngineConfig| {
        let store = MemStore::<String>::new(MemStoreConfig::with_capacity(1 << 20)).unwrap();
        let e = Engine::new(cfg, store, &trace, Some(Box::new(ToyPricing))).unwrap();
        (0..=e.workers()).map(|w| e.role(w)).collect::<Vec<_>>()
    };
    let b3 = EngineConfig {
        encoders: 1,
        prefills: 2,
        decodes: 1,
        ..toy_config(Mode::B3, Payloads::SizeOnly)
    };
    assert_eq!(
        roles(b3),
        [
            Some(Role::Encoder),
            Some(Role::Prefill),
            Some(Role::Prefill),
            Some(Role::Decode),
            None
        ]
    );
    let b0 = EngineConfig {
        colocated: 2,
        ..toy_config(Mode::B0, Payloads::SizeOnly)
    };
    assert_eq!(
        roles(b0),
        [Some(Role::Colocated), Some(Role::Colocated), None]
    );
    assert_eq!(Role::Colocated.name(), "colocated");
}

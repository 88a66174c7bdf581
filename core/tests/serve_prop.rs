//! The serving engine driven by a toy driver with random durations (not the simulator):
//! random traces, modes, cluster shapes and completion orders. Checks (INVARIANTS E1-E4):
//! every request finishes exactly once; no work starts before its inputs exist; KV block
//! refcounts balance (free + used = capacity at every step, nothing held at the end);
//! every store object a request reads was committed before; the input log replays to
//! the same action log; decode page tables (`kv_tables`) name the priced batch and
//! change no decision (E15); the load signal drains to nothing with the work (E8); every
//! request record and counter equals its recomputation from the trace, the configuration
//! and the action log alone (E16).

use std::collections::{BTreeMap, BTreeSet};

use moonagent_core::faulty::{FaultKind, FaultyStore};
use moonagent_core::fork::BranchState;
use moonagent_core::rng::Rng;
use moonagent_core::serve::toy::{
    drive, replay_inputs, toy_config, toy_trace, Input, Log, Seen, ToyPricing, ToyRequest,
};
use moonagent_core::serve::{
    Action, Counters, Done, Engine, EngineConfig, Extra, Flow, Mode, Payloads, NONE,
};
use moonagent_core::store::{MemStore, MemStoreConfig, OpKind, Recorded};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Case {
    seed: u64,
    mode: Mode,
    requests: usize,
    workers: (u32, u32, u32),
    pages: u32,
    store_kb: u64,
    /// Reads lease for 1 us and eviction runs at every put (else Mooncake's 10 s lease
    /// and 10 ms eviction thread, under which nothing a toy run read is ever evicted).
    short_lease: bool,
    /// The store refuses a third of the reads the engine asks it to hold (E12's unheld
    /// reads, mixed with held ones).
    refuse_holds: bool,
    bytes: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        any::<u64>(),
        prop::sample::select(Mode::ALL.to_vec()),
        1usize..40,
        (1u32..3, 1u32..3, 1u32..3),
        0u32..200,
        prop_oneof![Just(1u64), Just(64)],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                seed,
                mode,
                requests,
                workers,
                extra_pages,
                store_kb,
                bytes,
                short_lease,
                refuse_holds,
            )| Case {
                seed,
                mode,
                requests,
                workers,
                // Room for the largest sequence (300 prompt + 30 + 20 output tokens, 8-token
                // pages) so nothing is refused outright; preemption still happens.
                pages: 48 + extra_pages,
                store_kb,
                short_lease,
                refuse_holds,
                bytes,
            },
        )
}

type ToyStore = FaultyStore<MemStore<String>>;

/// The case's store, with its hold refusals on their own seeded schedule.
fn case_store(c: &Case) -> ToyStore {
    let cfg = MemStoreConfig::with_capacity(c.store_kb << 10);
    let cfg = if c.short_lease {
        MemStoreConfig {
            kv_lease_ttl_ns: 1_000,
            eviction_interval_ns: 0,
            ..cfg
        }
    } else {
        cfg
    };
    let mut s = FaultyStore::new(MemStore::new(cfg).unwrap(), c.seed);
    if c.refuse_holds {
        s.set_rate(FaultKind::HoldRefused, 0.3);
    }
    s
}

/// The action without the page tables `kv_tables` adds (the decisions alone).
fn decisions(a: &Action) -> Action {
    let mut a = a.clone();
    if let Action::Decode { seqs, copies, .. } = &mut a {
        seqs.clear();
        copies.clear();
    }
    a
}

/// Run `c` with or without decode page tables; returns the counters, the reads and the
/// action log.
fn run(c: &Case, kv_tables: bool) -> Result<(Counters, u64, Vec<Action>), TestCaseError> {
    let tr = toy_trace(c.seed, c.requests, 16);
    let payloads = if c.bytes {
        Payloads::Bytes
    } else {
        Payloads::SizeOnly
    };
    let cfg = EngineConfig {
        encoders: c.workers.0,
        prefills: c.workers.1,
        decodes: c.workers.2,
        colocated: c.workers.0,
        kv_pages: c.pages,
        kv_tables,
        ..toy_config(c.mode, payloads)
    };
    let block = u64::from(cfg.kv_block_tokens);
    // E15: per decode worker, the sequences of its last iteration.
    let mut last_seqs: BTreeMap<u32, BTreeSet<(u32, u64)>> = BTreeMap::new();
    let store = Recorded::new(case_store(c));
    let mut e = Engine::new(cfg.clone(), store, &tr, Some(Box::new(ToyPricing))).unwrap();
    let capacity: Vec<u32> = e.pool_stats().iter().map(|p| p.free + p.used).collect();
    let mut rng = Rng::stream(c.seed, "serve-prop-durations");
    // Inputs that must exist before work starts.
    let mut stored_pending: BTreeMap<u32, u32> = BTreeMap::new();
    let mut loaded: BTreeSet<u32> = BTreeSet::new();
    let mut busy: BTreeSet<u32> = BTreeSet::new();
    let mut finished_seen = vec![None; tr.len()];
    // A commit left in place for a reader (E13): the input, and the ops and count before it.
    let (mut storing, mut ops_before, mut held_before) = (false, 0usize, 0u64);
    // Reads open per key (`BeginRead` ok minus `EndRead`), as of the ops seen so far.
    let mut open_reads: BTreeMap<String, i64> = BTreeMap::new();
    let arrivals: Vec<u64> = (0..tr.len() as u64).map(|i| i * 50).collect();
    let check = |ok: bool, what: &dyn Fn() -> String| if ok { Ok(()) } else { Err(what()) };
    let log = drive(
        &mut e,
        &arrivals,
        |_, _| 1 + rng.below(400),
        |seen| match seen {
            Seen::Input(_, Input::Complete(d)) => match *d {
                Done::Step(w) => check(busy.remove(&w), &|| format!("step of idle worker {w}")),
                Done::Stored(job, _) => {
                    *stored_pending.entry(job).or_insert(0) -= 1;
                    storing = true;
                    Ok(())
                }
                Done::Loaded(job) => {
                    loaded.insert(job);
                    Ok(())
                }
                _ => Ok(()),
            },
            Seen::Input(..) => Ok(()),
            Seen::Action(_, a) => {
                // E15: the page tables name exactly the batch the iteration prices; each
                // covers its context; a sequence named admitted is new to the batch.
                if let Action::Decode {
                    worker,
                    batch,
                    ctx_sum,
                    seqs,
                    ..
                } = a
                {
                    if kv_tables {
                        check(seqs.len() == *batch as usize, &|| {
                            format!("{} tables for a batch of {batch}", seqs.len())
                        })?;
                        let sum: u64 = seqs.iter().map(|s| s.len).sum();
                        check(sum == *ctx_sum, &|| {
                            format!("tables hold {sum}, priced {ctx_sum}")
                        })?;
                        let before = last_seqs.remove(worker).unwrap_or_default();
                        // Every holder of a page is in its worker's batch, so a page is
                        // shared exactly when two tables of the iteration name it.
                        let mut holders: BTreeMap<u32, u32> = BTreeMap::new();
                        for p in seqs.iter().flat_map(|s| &s.pages) {
                            *holders.entry(*p).or_default() += 1;
                        }
                        for s in seqs {
                            let next = s.pages.get((s.len / block) as usize);
                            let shared = next.is_some_and(|p| holders[p] > 1);
                            check(s.shared_tail == shared, &|| {
                                format!(
                                    "job {}: shared tail {} but the page its next token \
                                     writes, {next:?}, is held by {:?} tables",
                                    s.job,
                                    s.shared_tail,
                                    next.map(|p| holders[p])
                                )
                            })?;
                            check(s.pages.len() as u64 * block >= s.len, &|| {
                                format!(
                                    "job {}: {} pages for {} tokens",
                                    s.job,
                                    s.pages.len(),
                                    s.len
                                )
                            })?;
                            check(!(s.admitted && before.contains(&s.seq)), &|| {
                                format!("job {} admitted twice", s.job)
                            })?;
                        }
                        last_seqs.insert(*worker, seqs.iter().map(|s| s.seq).collect());
                        // Admission stops at the batch limit (a fork may go past it).
                        check(
                            !seqs.iter().any(|s| s.admitted)
                                || *batch as usize <= cfg.decode_max_batch as usize,
                            &|| format!("admitted into a batch of {batch}"),
                        )?;
                    } else {
                        check(seqs.is_empty(), &|| "page tables without kv_tables".into())?;
                    }
                }
                // An encoder batch stays within its token budget unless it is one image.
                if let Action::Encode { tokens, .. } = a {
                    let sum: u64 = tokens.iter().map(|&t| u64::from(t)).sum();
                    let budget = u64::from(cfg.encoder_max_batch_tokens);
                    check(tokens.len() == 1 || sum <= budget, &|| {
                        format!("encode batch {tokens:?} over {budget}")
                    })?;
                }
                // A prefill batch stays within its token budget and runs no empty chunk.
                if let Action::Prefill { chunks, .. } = a {
                    let tokens: u32 = chunks.iter().map(|c| c.0).sum();
                    check(
                        tokens <= cfg.prefill_chunk_tokens && chunks.iter().all(|c| c.0 > 0),
                        &|| {
                            format!(
                                "prefill batch {chunks:?}: over {} or an empty chunk",
                                cfg.prefill_chunk_tokens
                            )
                        },
                    )?;
                }
                match a {
                    // One batch at a time per worker.
                    Action::Encode { worker, .. }
                    | Action::Prefill { worker, .. }
                    | Action::Decode { worker, .. } => check(busy.insert(*worker), &|| {
                        format!("worker {worker} started twice")
                    }),
                    Action::Transfer {
                        done: Some(Done::Stored(job, _)),
                        ..
                    } => {
                        *stored_pending.entry(*job).or_insert(0) += 1;
                        Ok(())
                    }
                    // The KV goes to decode only after the job's prefill loaded its inputs.
                    Action::Transfer {
                        done: Some(Done::KvArrived(job)),
                        ..
                    } => check(loaded.contains(job), &|| {
                        format!("KV of job {job} moved before its load")
                    }),
                    // Every embedding of the job reached the store first.
                    Action::Load { job, .. } => {
                        check(stored_pending.get(job).copied().unwrap_or(0) == 0, &|| {
                            format!("job {job} loaded before its embeddings were stored")
                        })
                    }
                    _ => Ok(()),
                }
            }
            Seen::After(e) => {
                // E13: a commit is left in place only while a load reads that blob: a
                // read of it opened before this step and not yet closed. (Its meta is
                // not held, so the readback that follows may still miss.)
                let ops = e.cache().store().ops();
                let held = e.counters().commits_held;
                if std::mem::take(&mut storing) && held > held_before {
                    let fp = ops[ops_before..].iter().find_map(|op| {
                        op.key
                            .strip_prefix("mc:mmblob:")
                            .or_else(|| op.key.strip_prefix("mc:mmmeta:"))
                    });
                    let blob = fp.map(|h| format!("mc:mmblob:{h}"));
                    let open = blob.as_ref().and_then(|b| open_reads.get(b)).copied();
                    check(open.is_some_and(|n| n > 0), &|| {
                        format!("a commit of {blob:?} left in place with {open:?} reads open")
                    })?;
                }
                for op in &ops[ops_before..] {
                    match op.kind {
                        OpKind::BeginRead if op.ok => {
                            *open_reads.entry(op.key.clone()).or_default() += 1
                        }
                        OpKind::EndRead => *open_reads.entry(op.key.clone()).or_default() -= 1,
                        _ => {}
                    }
                }
                (ops_before, held_before) = (ops.len(), held);
                // E3: pages are conserved at every step.
                for (p, cap) in e.pool_stats().iter().zip(&capacity) {
                    check(p.free + p.used == *cap, &|| format!("pages {p:?} of {cap}"))?;
                }
                // E1: a request finishes once, and stays finished: its record does not
                // change after that (every branch of it has finished).
                for (i, s) in e.served().iter().enumerate() {
                    match &finished_seen[i] {
                        Some(r) => check(s.done && s.rec == *r, &|| {
                            format!("request {i} changed after it finished: {r:?} -> {s:?}")
                        })?,
                        None if s.done => finished_seen[i] = Some(s.rec),
                        None => {}
                    }
                }
                Ok(())
            }
        },
    );
    let log = match log {
        Ok(l) => l,
        Err(err) => return Err(TestCaseError::fail(err.to_string())),
    };
    // Same decisions: the input log alone, fed to a fresh engine, gives the same actions.
    let fresh = case_store(c);
    let mut again = Engine::new(cfg.clone(), fresh, &tr, Some(Box::new(ToyPricing))).unwrap();
    prop_assert_eq!(
        &replay_inputs(&mut again, &log.inputs).unwrap(),
        &log.actions
    );
    prop_assert!(busy.is_empty());
    prop_assert_eq!(e.served().len(), tr.len());
    for s in e.served() {
        let r = &s.rec;
        prop_assert!(s.done, "request {} never finished", r.id);
        // E2: causality of the stamped times.
        prop_assert!(r.prefill_start_ns != NONE && r.first_token_ns != NONE && r.finish_ns != NONE);
        if r.encode_start_ns != NONE {
            prop_assert!(r.arrival_ns <= r.encode_start_ns && r.encode_start_ns <= r.encode_end_ns);
            prop_assert!(r.encode_end_ns <= r.prefill_start_ns);
        }
        prop_assert!(r.arrival_ns <= r.prefill_start_ns);
        prop_assert!(r.prefill_start_ns <= r.prefill_end_ns);
        prop_assert_eq!(r.prefill_end_ns, r.first_token_ns);
        prop_assert!(r.first_token_ns <= r.finish_ns);
    }
    for (p, cap) in e.pool_stats().iter().zip(&capacity) {
        prop_assert_eq!(p.used, 0, "pages still held at the end");
        prop_assert_eq!(p.free, *cap);
    }
    // E8: the load signal drains with the work: once every batch has ended, no worker
    // has anything queued, in transit or waiting (the signal exists under Full only).
    let drained = (c.mode == Mode::Full).then_some(0);
    for w in 0..e.workers() {
        for role in 0..3 {
            prop_assert_eq!(
                e.load_ns(u64::MAX, w, role),
                drained,
                "worker {} role {}",
                w,
                role
            );
        }
    }
    // E4: every object read was committed (a completed put) before the read.
    // E12: every read held open across a load is closed by the end of the run.
    let mut committed = BTreeSet::new();
    let mut reads = 0u64;
    for op in e.cache().store().ops() {
        if op.kind == OpKind::EndRead {
            prop_assert!(op.ok, "end_read of {} refused: {}", op.key, op.outcome);
        }
        match op.kind {
            OpKind::PutEnd if op.ok => {
                committed.insert(op.key.as_str());
            }
            OpKind::Get | OpKind::GetSize | OpKind::Exists | OpKind::BeginRead if op.ok => {
                reads += 1;
                prop_assert!(
                    committed.contains(op.key.as_str()),
                    "read of uncommitted {}",
                    op.key
                );
            }
            _ => {}
        }
    }
    for (key, n) in &open_reads {
        prop_assert_eq!(*n, 0, "reads of {} left open", key);
    }
    prop_assert!(
        e.cache()
            .store()
            .inner()
            .inner()
            .metas()
            .iter()
            .all(|m| m.readers == 0),
        "an object is still held as being read after the run"
    );
    check_accounting(&cfg, &tr, &e, &log)?;
    Ok((
        *e.counters(),
        reads,
        log.actions.into_iter().map(|(_, a)| a).collect(),
    ))
}

type ToyEngine<'a> = Engine<'a, Recorded<ToyStore>, ToyRequest>;

/// What the action log says one job did.
#[derive(Debug, Default)]
struct JobSeen {
    /// Its prompt and the cached prefix its first prefill chunk started after.
    prefill: Option<(u32, u32)>,
    /// First prefill start, last prefill batch end.
    prefill_span: (u64, u64),
    /// Visual tokens of each image encoded for it.
    encoded: Vec<u32>,
    /// First encode start, last encode batch end (`NONE`: nothing encoded).
    encode_span: (u64, u64),
    /// Its load: embedding and prefix KV bytes.
    load: Option<(u64, u64)>,
    /// Bytes it put encoder -> store and moved prefill -> decode.
    put_bytes: u64,
    kv_put_bytes: u64,
    /// End of the last decode iteration that named it (`kv_tables`).
    last_decode_end: Option<u64>,
}

/// E16: every request record and every counter, recomputed from the trace, the
/// configuration, the action log and the store's operations, none of them read from the
/// engine's own bookkeeping. Each job's share is found by what the actions name (its
/// encodes, load, prefill chunks and decode iterations); the engine only says which
/// request and branch a job serves.
fn check_accounting(
    cfg: &EngineConfig,
    tr: &[ToyRequest],
    e: &ToyEngine<'_>,
    log: &Log,
) -> Result<(), TestCaseError> {
    let disagg = cfg.mode.disaggregated();
    let (ebpt, kvbpt) = (cfg.encoder_bytes_per_token, cfg.kv_bytes_per_token);
    // A batch ends at its worker's next step completion (one batch at a time per worker,
    // every duration at least 1 ns).
    let mut steps: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for &(t, input) in &log.inputs {
        if let Input::Complete(Done::Step(w)) = input {
            steps.entry(w).or_default().push(t);
        }
    }
    let end = |w: u32, t: u64| -> Result<u64, TestCaseError> {
        let ts = steps.get(&w).map_or(&[][..], |v| v.as_slice());
        let i = ts.partition_point(|&x| x <= t);
        ts.get(i)
            .copied()
            .ok_or_else(|| TestCaseError::fail(format!("batch of worker {w} at {t} never ended")))
    };
    let mut jobs: BTreeMap<u32, JobSeen> = BTreeMap::new();
    let (mut stored, mut tail_copies, mut recomputes) = (0u64, 0u64, 0u64);
    let (mut blocks_put, block_bytes) = (0u64, u64::from(cfg.prefix_block_tokens) * kvbpt);
    for (t, a) in &log.actions {
        let t = *t;
        match a {
            Action::Encode {
                worker,
                images,
                tokens,
            } => {
                let done = end(*worker, t)?;
                for (img, &tok) in images.iter().zip(tokens) {
                    let j = jobs.entry(img.job).or_default();
                    if j.encoded.is_empty() {
                        j.encode_span.0 = t;
                    }
                    j.encoded.push(tok);
                    j.encode_span.1 = j.encode_span.1.max(done);
                }
            }
            Action::Prefill {
                worker,
                chunks,
                jobs: js,
            } => {
                let done = end(*worker, t)?;
                for (&(job, prompt), &(_, before)) in js.iter().zip(chunks) {
                    let j = jobs.entry(job).or_default();
                    if j.prefill.is_none() {
                        j.prefill = Some((prompt, before));
                        j.prefill_span.0 = t;
                    }
                    j.prefill_span.1 = j.prefill_span.1.max(done);
                }
            }
            Action::Load {
                job,
                embed_bytes,
                kv_bytes,
                ..
            } => {
                let j = jobs.entry(*job).or_default();
                prop_assert!(j.load.is_none(), "job {} loaded twice", job);
                j.load = Some((*embed_bytes, *kv_bytes));
            }
            Action::Transfer {
                bytes,
                done: Some(Done::Stored(job, _)),
                flow,
                ..
            } => {
                prop_assert_eq!(*flow, Flow::Put);
                jobs.entry(*job).or_default().put_bytes += bytes;
                stored += 1;
            }
            Action::Transfer {
                bytes,
                done: Some(Done::KvArrived(job)),
                flow,
                ..
            } => {
                prop_assert_eq!(*flow, Flow::KvPut);
                jobs.entry(*job).or_default().kv_put_bytes += bytes;
            }
            Action::PutBlocks {
                bytes_each, count, ..
            } => {
                prop_assert!(disagg && *count > 0, "{:?}", a);
                prop_assert_eq!(*bytes_each, block_bytes);
                blocks_put += u64::from(*count);
            }
            Action::Decode {
                worker,
                seqs,
                extra,
                ..
            } => {
                let done = end(*worker, t)?;
                for s in seqs {
                    jobs.entry(s.job).or_default().last_decode_end = Some(done);
                }
                for x in extra {
                    match x {
                        Extra::TailCopy { bytes } => tail_copies += bytes,
                        Extra::Recompute { .. } => recomputes += 1,
                    }
                }
            }
            _ => {}
        }
    }
    let mut of_top: Vec<Vec<(u32, Option<u32>)>> = vec![Vec::new(); tr.len()];
    for job in 0u32.. {
        let Some((top, branch)) = e.job_request(job) else {
            break;
        };
        of_top[top].push((job, branch));
    }
    let none = JobSeen::default();
    let seen = |job: u32| jobs.get(&job).unwrap_or(&none);
    let c = e.counters();
    let mut sum = Counters::default();
    let (mut forks, mut forkable, mut avoided, mut clones) = (0u64, 0u64, 0u64, 0u64);
    let (mut shared_pages, mut tail_bytes, mut lookups) = (0u64, 0u64, 0u64);
    let state_bytes = std::mem::size_of::<BranchState>() as u64;
    for (top, r) in tr.iter().enumerate() {
        let rec = &e.served()[top].rec;
        let js = &of_top[top];
        // The jobs that prefilled: the request's own, and its branches unless forked.
        let routed: Vec<(u32, Option<u32>)> = js
            .iter()
            .copied()
            .filter(|&(j, _)| seen(j).prefill.is_some())
            .collect();
        let forked = js
            .iter()
            .any(|&(j, b)| b.is_some() && seen(j).prefill.is_none());
        let (n, nr) = (r.branches.len() as u64, routed.len() as u64);
        prop_assert!(
            js[0].1.is_none() && routed.first() == Some(&js[0]),
            "request {}",
            top
        );
        prop_assert!(
            nr == 1 + if forked { 0 } else { n } && js.len() as u64 == 1 + n,
            "request {}: {} jobs, {} prefilled, forked: {}",
            top,
            js.len(),
            nr,
            forked
        );
        let mut distinct: Vec<(u64, u32)> = Vec::new();
        for &img in &r.images {
            if !distinct.iter().any(|d| d.0 == img.0) {
                distinct.push(img);
            }
        }
        let distinct_tokens: u64 = distinct.iter().map(|d| u64::from(d.1)).sum();
        let refs = r.images.len() as u64;
        // The context the shared part ends with: what a branch re-prefills or forks from.
        let shared = r.prompt.max(1) + r.output.max(1);
        let encoded: Vec<u32> = js
            .iter()
            .flat_map(|&(j, _)| seen(j).encoded.clone())
            .collect();
        let enc_tokens: u64 = encoded.iter().map(|&t| u64::from(t)).sum();
        let msg = |what: &str| format!("request {top}: {what}");
        prop_assert_eq!(u64::from(rec.images), nr * refs, "{}", msg("images"));
        prop_assert_eq!(
            u64::from(rec.images_dedup),
            nr * (refs - distinct.len() as u64),
            "{}",
            msg("images de-duplicated")
        );
        prop_assert_eq!(
            rec.images_encoded as usize,
            encoded.len(),
            "{}",
            msg("encoded")
        );
        prop_assert_eq!(
            rec.images_hit + rec.images_encoded + rec.images_dedup,
            rec.images,
            "{}",
            msg("hit + encoded + de-duplicated")
        );
        if !cfg.mode.cache() {
            prop_assert_eq!(rec.images_hit, 0, "{}", msg("a hit without the cache"));
        }
        let put: u64 = js.iter().map(|&(j, _)| seen(j).put_bytes).sum();
        prop_assert_eq!(
            put,
            if disagg { ebpt * enc_tokens } else { 0 },
            "{}",
            msg("puts")
        );
        prop_assert_eq!(rec.bytes_encoder_store, put, "{}", msg("encoder -> store"));
        // Prefills: the prompt each ran, the prefix it skipped, what it loaded.
        let (mut cached, mut loaded, mut to_decode) = (0u64, 0u64, 0u64);
        for &(j, b) in &routed {
            let (prompt, before) = seen(j).prefill.unwrap_or_default();
            if b.is_none() {
                prop_assert_eq!(prompt, r.prompt.max(1), "{}", msg("prompt"));
            } else {
                // A branch re-prefills the shared part's whole context.
                prop_assert_eq!(prompt, shared, "{}", msg("branch prompt"));
            }
            prop_assert!(before < prompt, "{}", msg("cached the whole prompt"));
            cached += u64::from(before);
            to_decode += u64::from(prompt) * kvbpt;
            prop_assert_eq!(
                seen(j).kv_put_bytes,
                if disagg { u64::from(prompt) * kvbpt } else { 0 }
            );
            match seen(j).load {
                Some((embed, kv)) => {
                    prop_assert!(disagg, "{}", msg("a load when colocated"));
                    prop_assert_eq!(embed, ebpt * distinct_tokens, "{}", msg("embedding load"));
                    prop_assert_eq!(kv, kvbpt * u64::from(before), "{}", msg("prefix load"));
                    prop_assert!(
                        u64::from(before) % u64::from(cfg.prefix_block_tokens) == 0
                            || before + 1 == prompt,
                        "{}",
                        msg("a cached prefix of part of a block")
                    );
                    loaded += embed + kv;
                    lookups += r.blocks.len() as u64;
                }
                None => {
                    prop_assert!(!disagg && before == 0, "{}", msg("no load"));
                }
            }
        }
        prop_assert_eq!(
            rec.prefix_hit_tokens,
            cached,
            "{}",
            msg("prefix hit tokens")
        );
        prop_assert_eq!(
            rec.bytes_store_prefill,
            loaded,
            "{}",
            msg("store -> prefill")
        );
        prop_assert_eq!(
            rec.bytes_prefill_decode,
            if disagg { to_decode } else { 0 },
            "{}",
            msg("prefill -> decode")
        );
        // Tokens: one from each prefill, the rest decoded; forked branches only decode.
        // Every generation yields at least one token, forked or re-prefilled.
        let out = u64::from(r.output.max(1));
        let branch_tokens = r.branches.iter().map(|&b| u64::from(b.max(1)));
        let branch_out: u64 = branch_tokens.clone().sum();
        prop_assert_eq!(
            rec.output_tokens,
            out + branch_out,
            "{}",
            msg("output tokens")
        );
        let longest = branch_tokens.max().unwrap_or(0);
        prop_assert_eq!(rec.path_tokens, out + longest, "{}", msg("path tokens"));
        prop_assert_eq!(u64::from(rec.branches), n, "{}", msg("branches"));
        // Stage times: the request's own job; the finish: its last job's last iteration.
        let own = seen(js[0].0);
        let enc = if own.encoded.is_empty() {
            (NONE, NONE)
        } else {
            own.encode_span
        };
        prop_assert_eq!(
            (rec.encode_start_ns, rec.encode_end_ns),
            enc,
            "{}",
            msg("encode span")
        );
        prop_assert_eq!(
            (rec.prefill_start_ns, rec.prefill_end_ns),
            own.prefill_span,
            "{}",
            msg("prefill span")
        );
        if cfg.kv_tables {
            let last = js
                .iter()
                .filter_map(|&(j, _)| seen(j).last_decode_end)
                .max();
            prop_assert_eq!(Some(rec.finish_ns), last, "{}", msg("finish"));
        }
        // Forks: every branch on its parent's pages, the tail copied for all but one.
        if forked {
            prop_assert!(cfg.mode.fork(), "{}", msg("forked without fork mode"));
            let ctx = u64::from(shared);
            let block = u64::from(cfg.kv_block_tokens);
            let tail = ctx % block;
            forks += 1;
            clones += n;
            avoided += ctx * n;
            shared_pages += if n > 1 {
                ctx.div_ceil(block) - u64::from(tail > 0)
            } else {
                0
            };
            tail_bytes += (n - 1) * tail * kvbpt;
        }
        forkable += u64::from(n > 0 && cfg.mode.fork());
        sum.image_refs += u64::from(rec.images);
        sum.images_hit += u64::from(rec.images_hit);
        sum.images_encoded += u64::from(rec.images_encoded);
        sum.images_dedup += u64::from(rec.images_dedup);
        for (s, b) in sum.link_bytes.iter_mut().zip([
            rec.bytes_encoder_store,
            rec.bytes_store_prefill,
            rec.bytes_prefill_decode,
        ]) {
            *s += b;
        }
    }
    // The counters are the records' sums and what the actions and the store saw.
    prop_assert_eq!(
        (
            c.image_refs,
            c.images_hit,
            c.images_encoded,
            c.images_dedup,
            c.link_bytes
        ),
        (
            sum.image_refs,
            sum.images_hit,
            sum.images_encoded,
            sum.images_dedup,
            sum.link_bytes
        )
    );
    prop_assert_eq!(c.kv_lookups, if cfg.kv_prefix_store { lookups } else { 0 });
    prop_assert_eq!(stored, if disagg { c.images_encoded } else { 0 });
    prop_assert_eq!((c.forks, c.forks + c.forks_refused), (forks, forkable));
    // Every preempted sequence came back with its context recomputed.
    prop_assert_eq!(c.preemptions, recomputes);
    prop_assert_eq!(c.fork_state_clones, clones);
    prop_assert_eq!(c.fork_state_bytes, clones * state_bytes);
    prop_assert_eq!(c.fork_prefill_tokens_avoided, avoided);
    prop_assert_eq!(c.fork_pages_shared, shared_pages);
    prop_assert_eq!(tail_copies, tail_bytes);
    // Branch 0 keeps the parent's private tail, the others their copies: no write lands
    // on a shared page.
    prop_assert_eq!(c.fork_copy_bytes, tail_bytes);
    // Reads held across loads: every hit block and every embedding served or read back.
    let (mut held, mut unheld, mut kv_holds, mut blob_puts) = (0u64, 0u64, 0u64, 0u64);
    let (mut kv_stored, mut blob_keys) = (0u64, BTreeSet::new());
    for op in e.cache().store().ops() {
        match op.kind {
            OpKind::BeginRead => {
                if op.ok {
                    held += 1;
                } else {
                    unheld += 1;
                }
                kv_holds += u64::from(op.key.starts_with("kv:"));
            }
            OpKind::PutStart if op.key.starts_with("mc:mmblob:") => {
                blob_puts += 1;
                blob_keys.insert(op.key.as_str());
            }
            OpKind::PutEnd if op.ok && op.key.starts_with("kv:") => kv_stored += 1,
            _ => {}
        }
    }
    prop_assert_eq!((c.reads_held, c.reads_unheld), (held, unheld));
    prop_assert_eq!(c.kv_hits, kv_holds);
    let mc = e.cache().counters();
    prop_assert_eq!(held + unheld, c.images_hit + c.kv_hits + mc.readback_hits);
    prop_assert_eq!(blob_puts + c.commits_held, stored, "{:?}", c);
    // The embedding cache: one lookup per distinct image of a job, in cache modes only;
    // one readback per stored output.
    let probes = c.image_refs - c.images_dedup;
    prop_assert_eq!(
        (mc.lookups, mc.hits, mc.readbacks),
        (
            if cfg.mode.cache() { probes } else { 0 },
            c.images_hit,
            stored
        )
    );
    if !cfg.mode.cache() {
        // B1's keys are scoped to the job: no key is written twice, no commit waits.
        prop_assert_eq!(blob_keys.len() as u64, blob_puts);
        prop_assert_eq!(c.commits_held, 0);
    }
    // Published prefix blocks: the ones the puts stored.
    prop_assert_eq!(blocks_put, kv_stored);
    Ok(())
}

/// E15: page tables change no decision: the same case with and without them gives the
/// same actions, once the tables are left out.
fn same_decisions_with_tables(c: &Case) -> Result<(), TestCaseError> {
    let (_, _, with) = run(c, true)?;
    let (_, _, without) = run(c, false)?;
    let with: Vec<Action> = with.iter().map(decisions).collect();
    prop_assert_eq!(with, without);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn engine_serves_every_request_once_causally_with_balanced_pages(c in case()) {
        if c.bytes {
            same_decisions_with_tables(&c)?;
        } else {
            run(&c, false)?;
        }
    }
}

#[test]
fn forks_run_and_reads_are_of_committed_objects() {
    // A fixed case that forks and hits the cache, so the checks above have work to see.
    let c = Case {
        seed: 7,
        mode: Mode::Full,
        requests: 30,
        workers: (2, 2, 2),
        pages: 200,
        store_kb: 64,
        short_lease: false,
        refuse_holds: false,
        bytes: true,
    };
    let (n, reads, actions) = run(&c, true).unwrap();
    assert!(n.forks > 0, "{n:?}");
    // The tables saw forks: some iteration names fork tail copies, and some sequence
    // shares pages with another (the same page id in two tables of one iteration).
    let mut copies = 0;
    let mut shared = false;
    for a in &actions {
        if let Action::Decode {
            seqs, copies: c, ..
        } = a
        {
            copies += c.len();
            let mut seen = BTreeSet::new();
            shared |= seqs.iter().flat_map(|s| &s.pages).any(|p| !seen.insert(*p));
        }
    }
    assert!(
        copies > 0 && shared,
        "{copies} copies, shared pages: {shared}"
    );
    same_decisions_with_tables(&c).unwrap();
    assert!(n.images_hit > 0 && n.kv_hits > 0, "{n:?}");
    assert!(reads > n.images_hit + n.kv_hits, "{reads} reads, {n:?}");
}

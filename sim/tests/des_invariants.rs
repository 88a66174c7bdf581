//! Simulator invariants (INVARIANTS.md D1-D6, D11), each checked on every mode of the ladder
//! over the four workloads of seed 000, at a load high enough to queue.

use moonagent_core::serve::Role;
use moonagent_sim::des::ladder::{generate, Workload};
use moonagent_sim::des::metrics::{records_table, workers_table, NONE};
use moonagent_sim::des::{simulate, simulate_all, Mode, RequestRecord, SimConfig, Summary};
use moonagent_traces::schema::Request;

fn workload(name: &str, n: u64, rate: f64) -> (Vec<Request>, u32) {
    let w = Workload {
        name: name.into(),
        generator: name.into(),
        config: serde_json::Value::Null,
    };
    generate(&w, n, rate, 3).expect("generator")
}

fn runs() -> Vec<(String, Mode, Summary, Vec<RequestRecord>)> {
    let mut out = Vec::new();
    for (w, rate) in [("w1", 150.0), ("w2", 30.0), ("w3", 60.0), ("w4", 12.0)] {
        let (trace, bs) = workload(w, 150, rate);
        for mode in Mode::ALL {
            let cfg = SimConfig {
                mode,
                ..SimConfig::default()
            };
            let (s, r) = simulate(&cfg, &trace, bs).expect("simulate");
            out.push((w.to_string(), mode, s, r));
        }
    }
    out
}

/// D1 request conservation, D2 causality, D4 KV block conservation, D6 image accounting
/// (D3 clock monotonicity is asserted by the event queue on every pop in debug builds,
/// which is how this test runs).
#[test]
fn conservation_causality_kv_blocks_and_image_accounting_hold_on_every_mode() {
    for (w, mode, s, recs) in runs() {
        let tag = format!("{w} {}", mode.name());
        // D1: injected = completed + queued + running + dropped.
        assert_eq!(
            s.injected,
            s.completed + s.queued + s.running + s.dropped,
            "{tag}: conservation"
        );
        assert_eq!(
            s.completed, s.injected,
            "{tag}: without a horizon every request completes"
        );
        // D4: every KV page is back on the free list once every request finished.
        assert_eq!(s.kv_pages_in_use, 0, "{tag}: KV pages leaked");
        for r in &recs {
            // D2: arrival <= encode <= prefill <= first token <= finish.
            let mut t = r.arrival_ns;
            for (name, x) in [
                ("encode_start", r.encode_start_ns),
                ("encode_end", r.encode_end_ns),
                ("prefill_start", r.prefill_start_ns),
                ("first_token", r.first_token_ns),
                ("finish", r.finish_ns),
            ] {
                if x == NONE {
                    assert!(
                        name.starts_with("encode"),
                        "{tag}: request {} has no {name}",
                        r.id
                    );
                    continue;
                }
                assert!(
                    x >= t,
                    "{tag}: request {}: {name} {x} before the previous stage {t}",
                    r.id
                );
                t = x;
            }
            // D6: every image reference is a hit, an encode or an in-request duplicate.
            assert_eq!(
                r.images,
                r.images_hit + r.images_encoded + r.images_dedup,
                "{tag}: request {} images",
                r.id
            );
            assert!(
                r.output_tokens >= r.path_tokens.min(1),
                "{tag}: request {} produced no token",
                r.id
            );
        }
        let encoded: u64 = recs.iter().map(|r| u64::from(r.images_encoded)).sum();
        assert_eq!(encoded, s.images_encoded, "{tag}: encoded images add up");
    }
}

/// A horizon stops the run early; conservation still holds and nothing is lost.
#[test]
fn conservation_holds_when_the_run_stops_at_a_horizon() {
    let (trace, bs) = workload("w4", 200, 50.0);
    for mode in Mode::ALL {
        let cfg = SimConfig {
            mode,
            horizon_ns: 2_000_000_000,
            ..SimConfig::default()
        };
        let (s, _) = simulate(&cfg, &trace, bs).expect("simulate");
        assert_eq!(
            s.injected,
            s.completed + s.queued + s.running + s.dropped,
            "{}",
            mode.name()
        );
        assert!(
            s.completed < s.injected,
            "{}: the horizon cut the run",
            mode.name()
        );
    }
}

/// D5: the same seed and config give byte-identical Parquet.
#[test]
fn same_seed_and_config_give_byte_identical_parquet() {
    let dir = std::env::temp_dir().join(format!("moonagent-des-det-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for i in 0..2 {
        let (trace, bs) = workload("w4", 120, 10.0);
        let (_, recs) = simulate(&SimConfig::default(), &trace, bs).expect("simulate");
        let p = dir.join(format!("run{i}.parquet"));
        records_table(&recs).write_parquet(&p).unwrap();
        files.push(std::fs::read(&p).unwrap());
    }
    assert!(!files[0].is_empty());
    assert_eq!(
        files[0], files[1],
        "two runs of the same seed and config differ"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Bad configuration is a clear error naming the field, never a panic.
#[test]
fn bad_config_names_the_field() {
    let (trace, bs) = workload("w1", 5, 1.0);
    let cases: Vec<(SimConfig, &str)> = vec![
        (
            SimConfig {
                encoders: 0,
                mode: Mode::B1,
                ..SimConfig::default()
            },
            "encoders",
        ),
        (
            SimConfig {
                gpus: 4,
                ..SimConfig::default()
            },
            "gpus",
        ),
        (
            SimConfig {
                hardware: "tpu9".into(),
                ..SimConfig::default()
            },
            "hardware",
        ),
        (
            SimConfig {
                model: "gpt-9".into(),
                ..SimConfig::default()
            },
            "model",
        ),
        (
            SimConfig {
                link: "carrier-pigeon".into(),
                ..SimConfig::default()
            },
            "link",
        ),
        (
            SimConfig {
                kv_mem_fraction: 1.5,
                ..SimConfig::default()
            },
            "kv_mem_fraction",
        ),
        (
            SimConfig {
                decode_max_batch: 0,
                ..SimConfig::default()
            },
            "decode_max_batch",
        ),
    ];
    for (cfg, field) in cases {
        let e = simulate(&cfg, &trace, bs).expect_err(field);
        assert!(
            e.to_string().contains(field),
            "error {e:?} does not name {field}"
        );
    }
    let toml_err =
        toml::from_str::<SimConfig>("mode = \"b2\"\nencoderz = 3\n").expect_err("unknown field");
    assert!(toml_err.to_string().contains("encoderz"), "{toml_err}");
}

/// H200's profile with `shared_cores = cores`, written into `dir`; its path.
fn cores_profile(dir: &std::path::Path, cores: Option<f64>) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let mut hw = moonagent_models::HardwareProfile::by_name("h200").unwrap();
    hw.name = format!("h200-cores-{cores:?}");
    hw.shared_cores = cores;
    let p = dir.join(format!("{}.toml", hw.name));
    std::fs::write(&p, toml::to_string(&hw).unwrap()).unwrap();
    p.display().to_string()
}

/// D9: shared cores are processor sharing. With as many cores as workers no step ever
/// waits, so every record equals the run on devices of their own (the shared-cores event
/// path changes nothing by itself); with one core for three workers the same decisions
/// take longer and every request still finishes. The exact rates are
/// `des::cluster` unit tests.
#[test]
fn shared_cores_are_processor_sharing() {
    let dir = std::env::temp_dir().join(format!("moonagent-des-cores-{}", std::process::id()));
    let profile = |cores| cores_profile(&dir, cores);
    for (w, rate) in [("w2", 30.0), ("w4", 12.0)] {
        let (trace, bs) = workload(w, 120, rate);
        for mode in [Mode::B0, Mode::B3, Mode::Full] {
            let run = |cores| {
                let cfg = SimConfig {
                    mode,
                    hardware: profile(cores),
                    ..SimConfig::default()
                };
                simulate(&cfg, &trace, bs).expect("simulate")
            };
            let (s_own, own) = run(None);
            let (s_many, many) = run(Some(64.0));
            // Completions rescheduled by the shared cores are not events.
            assert_eq!(s_own.events, s_many.events, "{w} {}", mode.name());
            if let Some(i) = (0..own.len()).find(|&i| own[i] != many[i]) {
                panic!(
                    "{w} {}: 64 shared cores for few workers changed request {i}:\n{:?}\n{:?}",
                    mode.name(),
                    own[i],
                    many[i]
                );
            }
            assert_eq!(own.len(), many.len());
            let (s_one, one) = run(Some(1.0));
            let tag = format!("{w} {}", mode.name());
            assert_eq!(s_one.completed, s_own.completed, "{tag}");
            let last = |r: &[RequestRecord]| r.iter().map(|x| x.finish_ns).max().unwrap();
            assert!(
                last(&one) > last(&own),
                "{tag}: one core for every worker is no slower"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// D11: the per-worker records account for every step, recompute, tail copy and transfer
/// the run priced, and agree with the engine's own counters: each worker does only its
/// role's work; the steps are the step completions; decode workers' recomputes are the
/// preemptions and their tail copies the fork copy bytes; the encoders' NIC bytes are the
/// encoder -> store link's and the decode workers' the prefill -> decode link's. On W4
/// with a tight KV pool (forks and preemptions) and W2 (images), every mode.
#[test]
fn worker_records_account_for_every_step_and_agree_with_the_counters() {
    for (w, rate, frac) in [("w4", 12.0, 0.115), ("w2", 30.0, 0.9)] {
        let (trace, bs) = workload(w, 150, rate);
        for mode in Mode::ALL {
            let cfg = SimConfig {
                mode,
                kv_mem_fraction: frac,
                ..SimConfig::default()
            };
            let tag = format!("{w} {}", mode.name());
            let run = simulate_all(&cfg, &trace, bs).expect("simulate");
            let (s, ws) = (&run.summary, &run.workers);
            assert_eq!(s.completed, s.injected, "{tag}");
            let n = |r: Role| ws.iter().filter(|x| x.role == r).count() as u32;
            if mode.disaggregated() {
                assert_eq!(
                    (n(Role::Encoder), n(Role::Prefill), n(Role::Decode)),
                    (cfg.encoders, cfg.prefills, cfg.decodes),
                    "{tag}: roles"
                );
            } else {
                assert_eq!(n(Role::Colocated), cfg.gpus / cfg.tp, "{tag}: roles");
            }
            for (i, x) in ws.iter().enumerate() {
                assert_eq!(x.worker as usize, i, "{tag}: ids in order");
                let (e, p, d) = (x.encode_steps > 0, x.prefill_steps > 0, x.decode_steps > 0);
                match x.role {
                    Role::Encoder => assert!(!p && !d, "{tag}: encoder {i} ran {x:?}"),
                    Role::Prefill => assert!(!e && !d, "{tag}: prefill {i} ran {x:?}"),
                    Role::Decode => assert!(!e && !p, "{tag}: decode {i} ran {x:?}"),
                    Role::Colocated => {}
                }
                assert!(x.decode_seqs >= x.decode_steps, "{tag}: empty iterations");
                assert!(
                    x.recompute_ns + x.tail_copy_ns <= x.decode_ns,
                    "{tag}: extras are part of the decode time"
                );
                assert_eq!(x.nic_transfers == 0, x.nic_bytes == 0, "{tag}: {x:?}");
            }
            let sum = |f: &dyn Fn(&moonagent_sim::des::WorkerRecord) -> u64| -> u64 {
                ws.iter().map(f).sum()
            };
            assert_eq!(
                sum(&|x| x.encode_steps + x.prefill_steps + x.decode_steps),
                s.events_by_kind[2],
                "{tag}: steps"
            );
            assert_eq!(sum(&|x| x.recomputes), s.preemptions, "{tag}: recomputes");
            assert_eq!(
                sum(&|x| x.tail_copy_bytes),
                s.fork_copy_bytes,
                "{tag}: tail copies"
            );
            assert_eq!(
                sum(&|x| x.encode_ns) * u64::from(cfg.tp),
                (s.encoder_gpu_s * 1e9).round() as u64,
                "{tag}: encoder time"
            );
            if mode.disaggregated() {
                let nic = |r: Role| {
                    ws.iter()
                        .filter(|x| x.role == r)
                        .map(|x| x.nic_bytes)
                        .sum::<u64>()
                };
                assert_eq!(nic(Role::Encoder), s.link_bytes[0], "{tag}: encoder NICs");
                assert_eq!(nic(Role::Decode), s.link_bytes[2], "{tag}: decode NICs");
            }
            if w == "w4" && mode == Mode::Full {
                assert!(
                    s.preemptions > 0 && s.forks > 0,
                    "{tag}: the tight pool preempts"
                );
            }
            if w == "w2" && mode.disaggregated() {
                assert!(s.link_bytes[0] > 0, "{tag}: images travel");
            }
            let t = workers_table(ws);
            assert_eq!(t.rows(), ws.len(), "{tag}: one row per worker");
        }
    }
}

/// D12: the step log is what ran. `Simulation::log_steps` changes no record, summary or
/// per-worker account; it holds one entry per step the workers ran (per worker and kind the
/// counts and priced time of `WorkerRecord`), each worker's steps one after another, and a
/// step's span is its priced time on a device of its own and at least that on shared
/// cores (where the steps of a worker never overlap either).
#[test]
fn the_step_log_is_every_step_that_ran_and_changes_nothing() {
    use moonagent_core::serve::Action;
    use moonagent_sim::des::Simulation;
    let dir = std::env::temp_dir().join(format!("moonagent-des-steplog-{}", std::process::id()));
    let profile = |cores| cores_profile(&dir, cores);
    for (w, rate) in [("w2", 30.0), ("w4", 12.0)] {
        let (trace, bs) = workload(w, 120, rate);
        for mode in [Mode::B0, Mode::B3, Mode::Full] {
            for cores in [None, Some(2.0), Some(1.0)] {
                let tag = format!("{w} {} cores {cores:?}", mode.name());
                let cfg = SimConfig {
                    mode,
                    hardware: profile(cores),
                    ..SimConfig::default()
                };
                let plain = simulate_all(&cfg, &trace, bs).expect("simulate");
                let run = Simulation::new(&cfg, &trace, bs)
                    .expect("build")
                    .log_steps()
                    .run_all()
                    .expect("simulate");
                assert!(plain.steps.is_empty(), "{tag}: logged without asking");
                assert_eq!(run.requests, plain.requests, "{tag}: records");
                assert_eq!(run.summary, plain.summary, "{tag}: summary");
                assert_eq!(run.workers, plain.workers, "{tag}: workers");
                let mut acct = vec![[(0u64, 0u64); 3]; run.workers.len()];
                let mut free = vec![0u64; run.workers.len()];
                for s in &run.steps {
                    let (worker, k) = match s.action {
                        Action::Encode { worker, .. } => (worker, 0),
                        Action::Prefill { worker, .. } => (worker, 1),
                        Action::Decode { worker, .. } => (worker, 2),
                        ref a => panic!("{tag}: {a:?} is not a step"),
                    };
                    let i = worker as usize;
                    acct[i][k].0 += 1;
                    acct[i][k].1 += s.priced_ns;
                    assert!(s.start_ns >= free[i], "{tag}: worker {i} overlaps: {s:?}");
                    let span = s.end_ns - s.start_ns;
                    match cores {
                        None => assert_eq!(span, s.priced_ns, "{tag}: {s:?}"),
                        Some(_) => assert!(span >= s.priced_ns, "{tag}: faster than priced: {s:?}"),
                    }
                    free[i] = s.end_ns;
                }
                if let Some(c) = cores {
                    // Processor sharing, read back from the log alone: over its span each
                    // step advanced at min(1, c / n(t)), n(t) the logged steps running.
                    let mut ev: Vec<(u64, i64)> = run
                        .steps
                        .iter()
                        .flat_map(|s| [(s.start_ns, 1), (s.end_ns, -1)])
                        .collect();
                    ev.sort_unstable();
                    let mut segs: Vec<(u64, i64)> = Vec::new();
                    let mut n = 0;
                    for (t, d) in ev {
                        n += d;
                        match segs.last_mut() {
                            Some(l) if l.0 == t => l.1 = n,
                            _ => segs.push((t, n)),
                        }
                    }
                    let mut stretched = 0;
                    for s in &run.steps {
                        let from = segs.partition_point(|x| x.0 <= s.start_ns) - 1;
                        let (mut work, mut pieces) = (0.0, 0.0);
                        for (i, &(t, n)) in segs.iter().enumerate().skip(from) {
                            if t >= s.end_ns {
                                break;
                            }
                            let end = segs.get(i + 1).map_or(s.end_ns, |x| x.0.min(s.end_ns));
                            let a = t.max(s.start_ns);
                            work += (end - a) as f64 * (c / n as f64).min(1.0);
                            pieces += 1.0;
                        }
                        assert!(
                            (work - s.priced_ns as f64).abs() <= 2.0 * pieces + 2.0,
                            "{tag}: {s:?} did {work} ns of work over {pieces} pieces"
                        );
                        stretched += usize::from(s.end_ns - s.start_ns > s.priced_ns);
                    }
                    assert!(stretched > 0, "{tag}: no step ever shared a core");
                }
                for (x, a) in run.workers.iter().zip(&acct) {
                    assert_eq!(
                        [a[0], a[1], a[2]],
                        [
                            (x.encode_steps, x.encode_ns),
                            (x.prefill_steps, x.prefill_ns),
                            (x.decode_steps, x.decode_ns)
                        ],
                        "{tag}: worker {}",
                        x.worker
                    );
                }
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

//! Plans are checked before anything runs (errors name the axis or the point); resume
//! refuses a changed plan or shard; merge wants every run exactly once; trace files enter
//! the plan hash; `best` reads a results table back.

mod sweep_common;

use moonagent_sim::sweep::{self, Constraint, Objective, Plan, RunOptions, Shard, SweepError};
use sweep_common::*;

fn err(dir: &std::path::Path, text: &str) -> SweepError {
    let path = dir.join("bad.toml");
    std::fs::write(&path, text).unwrap();
    match Plan::from_file(&path, &[]) {
        Err(e) => e,
        Ok(p) => p.prepare().expect_err("plan should be rejected"),
    }
}

#[test]
fn invalid_paths_and_values_are_rejected_before_anything_runs_naming_the_axis() {
    let dir = scratch("plans-invalid");
    let with_axis = |axis: &str| {
        REPLAY_PLAN.replace(
            "[[axis]]\nname = \"capacity\"",
            &format!("{axis}\n[[axis]]\nname = \"capacity\""),
        )
    };

    let e = err(
        &dir,
        &with_axis("[[axis]]\npath = \"policy.types.encoder_output.reuse_scal\"\nvalues = [2.0]"),
    );
    let m = e.to_string();
    assert!(matches!(e, SweepError::Axis { axis: 1, .. }), "{m}");
    assert!(
        m.contains("reuse_scal") && m.contains("unknown field"),
        "{m}"
    );

    let e = err(&dir, &with_axis("[[axis]]\nname = \"w\"\npath = \"policy.types.encoder_output.soft_pin_weight\"\nvalues = [2.0, -1.0]"));
    let m = e.to_string();
    assert!(
        m.starts_with("axis 1 `w` (path policy.types.encoder_output.soft_pin_weight) = -1.0"),
        "{m}"
    );

    let e = err(
        &dir,
        &with_axis("[[axis]]\npath = \"workload.config.repeat_rat\"\nvalues = [0.5]"),
    );
    assert!(e.to_string().contains("repeat_rat"), "{e}");

    let e = err(
        &dir,
        &with_axis("[[axis]]\npath = \"capacity.x\"\nvalues = [1]"),
    );
    assert!(e.to_string().contains("not a table"), "{e}");

    let e = err(
        &dir,
        &with_axis("[[axis]]\npath = \"store.capacity_bytes\"\nvalues = [\"lots\"]"),
    );
    assert!(matches!(e, SweepError::Axis { .. }), "{e}");

    // Valid alone, invalid together: the point is named, with its axis values.
    let e = err(
        &dir,
        &SIM_PLAN
            .replace("values = [4, 3]", "values = [4, 4]")
            .replace("gpus = 8", "gpus = 8\nencoders = 1"),
    );
    let m = e.to_string();
    assert!(matches!(e, SweepError::Point { index: 2, .. }), "{m}");
    assert!(
        m.contains("encoders=2, prefills=4") && m.contains("exceed gpus"),
        "{m}"
    );

    // Nothing was created: checks happen before any folder is touched.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "only bad.toml");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn resume_skips_finished_runs_and_refuses_a_changed_plan_or_shard() {
    let dir = scratch("plans-resume");
    let prep = prepare(&dir, REPLAY_PLAN);
    let out = dir.join("out");
    let opts = |resume: bool, shard: Option<Shard>| RunOptions {
        out: out.clone(),
        threads: 2,
        shard,
        resume,
        progress: false,
        fsync: false,
    };
    // --resume on an empty folder starts afresh (a retried batch job can always pass it).
    let first = sweep::run(&prep, &opts(true, None)).unwrap();
    assert_eq!(first.executed, 8);
    let table = bytes(&out.join(sweep::RESULTS_FILE));

    let e = sweep::run(&prep, &opts(false, None)).unwrap_err();
    assert!(e.to_string().contains("--resume"), "{e}");

    let again = sweep::run(&prep, &opts(true, None)).unwrap();
    assert_eq!((again.executed, again.skipped), (0, 8));
    assert_eq!(bytes(&out.join(sweep::RESULTS_FILE)), table);

    // A point file torn by a power loss (here: truncated) is not a result: its run reruns.
    let torn = std::fs::read_dir(out.join("points"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "json"))
        .unwrap();
    let text = bytes(&torn);
    std::fs::write(&torn, &text[..text.len() / 2]).unwrap();
    let e = sweep::merge(std::slice::from_ref(&out), &dir.join("m.parquet"), None).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    let healed = sweep::run(&prep, &opts(true, None)).unwrap();
    assert_eq!((healed.executed, healed.skipped), (1, 7));
    assert_eq!(bytes(&out.join(sweep::RESULTS_FILE)), table);

    let changed = prepare(
        &dir,
        &REPLAY_PLAN.replace("values = [1.0, 8.0]", "values = [1.0, 4.0]"),
    );
    assert_ne!(changed.hash, prep.hash);
    let e = sweep::run(&changed, &opts(true, None)).unwrap_err();
    assert!(e.to_string().contains("plan changed"), "{e}");

    let e = sweep::run(&prep, &opts(true, Some(Shard { index: 0, count: 2 }))).unwrap_err();
    assert!(e.to_string().contains("same --shard"), "{e}");

    // Comments and formatting are not the plan: the hash holds.
    let reformatted = prepare(
        &dir,
        &format!("# a comment\n{}", REPLAY_PLAN.replace(" = ", "=")),
    );
    assert_eq!(reformatted.hash, prep.hash);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn merge_wants_every_run_exactly_once_and_names_what_is_missing() {
    let dir = scratch("plans-merge");
    let prep = prepare(&dir, REPLAY_PLAN);
    let s0 = dir.join("s0");
    let s1 = dir.join("s1");
    run(&prep, &s0, 1, Some(Shard { index: 0, count: 2 }));
    run(&prep, &s1, 1, Some(Shard { index: 1, count: 2 }));
    let out = dir.join("m.parquet");

    let e = sweep::merge(std::slice::from_ref(&s0), &out, None).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("4 of 8 runs are missing") && m.contains("shard(s) 1 of 2"),
        "{m}"
    );
    let e = sweep::merge(&[s0.clone(), s1.clone(), s0.clone()], &out, None).unwrap_err();
    assert!(e.to_string().contains("present twice"), "{e}");

    let other = prepare(&dir, &REPLAY_PLAN.replace("seeds = 2", "seeds = 3"));
    let s2 = dir.join("other");
    run(&other, &s2, 1, Some(Shard { index: 1, count: 2 }));
    let e = sweep::merge(&[s0.clone(), s2], &out, None).unwrap_err();
    assert!(e.to_string().contains("another plan"), "{e}");

    let r = sweep::merge(&[s1, s0], &out, None).unwrap();
    assert_eq!(r.runs, 8);
    assert!(dir.join("m_summary.parquet").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_trace_file_workload_enters_the_plan_hash_and_takes_one_seed() {
    use moonagent_traces::gen::{Generated, GeneratorKind};
    let dir = scratch("plans-trace");
    let write = |requests: u64| {
        let g = Generated::new(
            GeneratorKind::W3,
            Some(&serde_json::json!({ "requests": requests })),
            &[],
            3,
        )
        .unwrap();
        moonagent_traces::write_trace(dir.join("w3.jsonl"), &g.header, g.requests, |_| {}).unwrap();
    };
    write(100);
    let plan = "kind = \"replay\"\n[base]\nworkload = { trace = \"w3.jsonl\" }\n[[axis]]\npath = \"capacity\"\nvalues = [\"10%\", \"50%\"]\n";
    let a = prepare(&dir, plan);
    let r = run(&a, &dir.join("out"), 2, None);
    assert_eq!(r.runs, 2);
    write(120);
    let b = prepare(&dir, plan);
    assert_ne!(a.hash, b.hash, "a changed trace file changes the plan hash");
    let e = err(&dir, &format!("seeds = 2\n{plan}"));
    assert!(e.to_string().contains("seeds = 1"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn best_gives_the_pareto_front_and_the_best_point_under_an_slo() {
    let dir = scratch("plans-best");
    let prep = prepare(&dir, REPLAY_PLAN);
    let out = dir.join("out");
    run(&prep, &out, 2, None);
    let x: Objective = "encoder_output.recompute_s".parse().unwrap();
    let y: Objective = "kv_cache.hit_rate:max".parse().unwrap();
    let all = sweep::best(&out, &x, &y, &[]).unwrap();
    assert_eq!((all.total, all.feasible), (4, 4));
    assert!(!all.front.is_empty());
    let xs: Vec<f64> = all.front.iter().map(|p| p.means[&x.metric]).collect();
    assert!(
        xs.windows(2).all(|w| w[0] <= w[1]),
        "front in increasing x: {xs:?}"
    );
    let best = all.best.unwrap();
    assert!(
        all.front.iter().any(|p| p.point == best.point),
        "the best on y is on the front"
    );

    let slo: Constraint = "capacity_bytes<=1".parse().unwrap();
    let none = sweep::best(&out, &x, &y, &[slo]).unwrap();
    assert_eq!((none.feasible, none.best), (0, None));
    let e = sweep::best(&out, &"nope".parse().unwrap(), &y, &[]).unwrap_err();
    assert!(e.to_string().contains("no metric `nope`"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

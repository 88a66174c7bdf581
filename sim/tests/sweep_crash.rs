//! Crash safety: a sweep killed with SIGKILL mid-run, twice, then resumed, ends with every
//! run exactly once and tables byte-identical to an uninterrupted run.
//!
//! The sweep runs in a child process: this test binary re-executed with only
//! `child_runs_the_sweep_when_asked` selected and the plan named in an environment
//! variable, so the kill lands on a real process with runs in flight.

mod sweep_common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use moonagent_sim::sweep::{self, Plan, RunOptions, RESULTS_FILE, SUMMARY_FILE};
use sweep_common::*;

const CHILD: &str = "MOONAGENT_SWEEP_CRASH_CHILD";

/// 12 runs of a few hundred ms each (debug build): slow enough that a kill after the
/// first finished run always lands mid-sweep.
const PLAN: &str = r#"
kind = "replay"
seeds = 2
metrics = ["encoder_output.*", "kv_cache.hit_rate", "total.saving_time_rate"]

[base]
workload = { generator = "sessions", config = { sessions = 150, turns_max = 6 } }
policy = { policy = "type-aware", types = { kv_cache = { budget_ratio = 0.8 } } }

[[axis]]
name = "capacity"
path = "capacity"
values = ["5%", "15%", "40%"]

[[axis]]
name = "grace_ms"
path = "policy.types.encoder_output.eviction_grace_ms"
values = [0, 10000]
"#;

/// In the child: resume the sweep named by `CHILD` (`<plan>|<out>`) on 2 threads.
#[test]
fn child_runs_the_sweep_when_asked() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let (plan, out) = spec.split_once('|').expect("plan|out");
    let prep = Plan::from_file(Path::new(plan), &[])
        .unwrap()
        .prepare()
        .unwrap();
    sweep::run(
        &prep,
        &RunOptions {
            out: out.into(),
            threads: 2,
            shard: None,
            resume: true,
            progress: false,
            fsync: true,
        },
    )
    .unwrap();
}

/// Start the child, wait until `at_least` point files exist, SIGKILL it; returns how
/// many point files there are after the kill.
fn kill_after(plan: &Path, out: &Path, at_least: usize) -> usize {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "child_runs_the_sweep_when_asked",
            "--exact",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{}|{}", plan.display(), out.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    while point_files(out) < at_least {
        assert!(
            child.try_wait().unwrap().is_none(),
            "child ended before the kill"
        );
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "no progress in 120 s"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
    point_files(out)
}

#[test]
fn sigkill_mid_sweep_then_resume_gives_every_run_once_and_identical_tables() {
    let dir = scratch("crash");
    let prep = prepare(&dir, PLAN);
    let total = prep.plan.runs();
    assert_eq!(total, 12);

    let reference = dir.join("reference");
    run(&prep, &reference, 2, None);

    let out = dir.join("killed");
    let plan_path = dir.join("plan.toml");
    let after_first = kill_after(&plan_path, &out, 1);
    assert!(
        (1..total).contains(&after_first),
        "first kill mid-sweep: {after_first} of {total} runs on disk"
    );
    assert!(
        !out.join(RESULTS_FILE).exists(),
        "no table before the sweep ends"
    );
    let after_second = kill_after(&plan_path, &out, after_first + 1);
    assert!(
        (after_first + 1..total).contains(&after_second),
        "second kill mid-sweep: {after_second} of {total} runs on disk"
    );

    // Resume to the end, in this process this time.
    let r = sweep::run(
        &prep,
        &RunOptions {
            out: out.clone(),
            threads: 2,
            shard: None,
            resume: true,
            progress: false,
            fsync: false,
        },
    )
    .unwrap();
    assert_eq!(r.skipped, after_second, "finished runs are not run again");
    assert_eq!(r.executed, total - after_second);
    assert_eq!(point_files(&out), total, "every run exactly once on disk");
    let leftovers = std::fs::read_dir(out.join("points"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count();
    assert_eq!(
        leftovers, 0,
        "temporary files of killed runs are cleaned up"
    );
    for file in [RESULTS_FILE, SUMMARY_FILE] {
        assert_eq!(
            bytes(&out.join(file)),
            bytes(&reference.join(file)),
            "{file}: killed twice and resumed vs uninterrupted"
        );
    }
    let t = sweep::table::read_results(&out).unwrap();
    let mut keys: Vec<(u32, u64)> = t
        .point
        .iter()
        .copied()
        .zip(t.seed.iter().copied())
        .collect();
    keys.dedup();
    assert_eq!(keys.len(), total);
    std::fs::remove_dir_all(&dir).ok();
}

//! Sweep scaling: one 64-point plan run on 1 thread and on 2 threads (alternating,
//! `SWEEP_BENCH_ROUNDS` times each, default 3, the fastest of each kept), in one process; prints the speed-up and the
//! sweep's own overhead per point (plan expansion and checks, folder setup, point-file
//! writes, table building) against a typical point's run time.
//!
//! ```sh
//! cargo bench -p moonagent-sim --bench sweep_scaling
//! SWEEP_BENCH_KIND=replay cargo bench -p moonagent-sim --bench sweep_scaling
//! ```
//!
//! Targets (issue 7): speed-up >= 1.8x on 2 threads; overhead per point < 1% of a point.
//! The default plan is the daily question of the issue: the EPD simulator on W3
//! (`SWEEP_BENCH_REQUESTS` requests, default 2,000) over encoder count (zipped with prefill
//! count) x image repeat rate x store capacity, 4 x 4 x 4 points, type-aware policy.
//! `SWEEP_BENCH_KIND=replay` runs the store-level replay of seed 002's 600 sessions
//! instead (reuse scale x grace x capacity; ~50 ms points). Each trace is generated once
//! per run and counted in the run's time. Both runs must produce byte-identical tables.
//! Exits 1 when a target is missed. The speed-up needs two otherwise idle cores: the load
//! average is printed before and after, and a control (a pure CPU loop on 1, then 2
//! threads, once per round) shows what the machine itself gives at the time.

// What the CLI runs: its allocator too.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::path::Path;
use std::time::Instant;

use moonagent_sim::sweep::{self, Plan, RunOptions, RunReport, RESULTS_FILE};

fn simulate_plan(requests: u64) -> String {
    format!(
        r#"
kind = "simulate"
metrics = ["ttft_ms.*", "encoder_gpu_s", "image_hit_rate", "throughput_rps"]

[base]
gpus = 8
decodes = 3
workload = {{ generator = "w3", config = {{ requests = {requests}, rate = 30.0 }} }}
policy = {{ policy = "type-aware", types = {{ encoder_output = {{ reuse_scale = 8.0 }}, kv_cache = {{ budget_ratio = 0.8 }} }} }}

[[axis]]
path = "encoders"
values = [1, 2, 3, 4]
zip = "roles"

[[axis]]
path = "prefills"
values = [4, 3, 2, 1]
zip = "roles"

[[axis]]
name = "repeat_rate"
path = "workload.config.repeat_rate"
values = [0.3, 0.5, 0.7, 0.9]

[[axis]]
name = "capacity"
path = "capacity"
values = ["1GiB", "4GiB", "16GiB", "64GiB"]
"#
    )
}

fn replay_plan() -> String {
    r#"
kind = "replay"
metrics = ["encoder_output.*", "kv_cache.*", "total.*"]

[base]
workload = { generator = "sessions" }
[base.policy]
policy = "type-aware"
types.encoder_output = { budget_ratio = 0.12 }
types.kv_cache = { budget_ratio = 0.80 }

[[axis]]
name = "reuse_scale"
path = "policy.types.encoder_output.reuse_scale"
values = [1.0, 2.0, 4.0, 8.0]

[[axis]]
name = "grace_ms"
path = "policy.types.encoder_output.eviction_grace_ms"
values = [0, 5000, 10000, 30000]

[[axis]]
name = "capacity"
path = "capacity"
values = ["10%", "20%", "30%", "50%"]
"#
    .to_string()
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "n/a".into())
}

/// CPU seconds this process has used (user + system, from /proc; Linux's 100 Hz ticks).
fn cpu_s() -> f64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
            let ticks: u64 =
                rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
            Some(ticks as f64 / 100.0)
        })
        .unwrap_or(f64::NAN)
}

/// A pure CPU loop: what the machine gives one thread, with no memory traffic.
fn spin(n: u64) -> u64 {
    let mut x = 0u64;
    for i in 0..n {
        x = x.wrapping_add(std::hint::black_box(i).wrapping_mul(i) >> 3);
    }
    x
}

/// The machine's own 1 -> 2 thread speed-up on `spin` (the control for the sweep's).
fn control(n: u64) -> f64 {
    let t = Instant::now();
    std::hint::black_box(spin(n));
    let one = t.elapsed().as_secs_f64();
    let t = Instant::now();
    std::thread::scope(|s| {
        let a = s.spawn(|| spin(n));
        std::hint::black_box(spin(n));
        std::hint::black_box(a.join().expect("spin thread"));
    });
    2.0 * one / t.elapsed().as_secs_f64()
}

fn run(prep: &sweep::Prepared, out: &Path, threads: usize) -> (RunReport, f64) {
    let _ = std::fs::remove_dir_all(out);
    let c0 = cpu_s();
    let r = sweep::run(
        prep,
        &RunOptions {
            out: out.to_path_buf(),
            threads,
            shard: None,
            resume: false,
            progress: false,
            fsync: false,
        },
    )
    .expect("sweep runs");
    // Cores this process had on average: 2.0 when two idle cores were ours.
    let cores = (cpu_s() - c0) / r.wall_s;
    (r, cores)
}

fn main() {
    // `cargo bench` passes `--bench`; settings come from the environment.
    let requests: u64 = std::env::var("SWEEP_BENCH_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let replay = std::env::var("SWEEP_BENCH_KIND").is_ok_and(|k| k == "replay");
    let (text, what) = if replay {
        (
            replay_plan(),
            "replay sweep, seed 002 sessions (600)".to_string(),
        )
    } else {
        (
            simulate_plan(requests),
            format!("simulate sweep, W3 ({requests} requests)"),
        )
    };
    let dir = std::env::temp_dir().join(format!("moonagent-sweep-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch folder");
    let plan_path = dir.join("plan.toml");
    std::fs::write(&plan_path, text).expect("plan file");

    println!("sweep_scaling: 64-point {what}");
    println!("load average before: {}", load_average());
    let t = Instant::now();
    let plan = Plan::from_file(&plan_path, &[]).expect("plan parses");
    let prep = plan.prepare().expect("plan checks");
    let expand_s = t.elapsed().as_secs_f64();
    assert_eq!(prep.plan.points.len(), 64);

    // Alternate 1 and 2 threads and keep each one's fastest run: the vCPUs of a shared
    // machine change speed by +-20% from one second to the next.
    let rounds: usize = std::env::var("SWEEP_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut one: Option<RunReport> = None;
    let mut two: Option<(RunReport, f64)> = None;
    let mut controls = Vec::new();
    for _ in 0..rounds.max(1) {
        controls.push(control(400_000_000));
        let (r1, _) = run(&prep, &dir.join("t1"), 1);
        if one.as_ref().is_none_or(|o| r1.wall_s < o.wall_s) {
            one = Some(r1);
        }
        let r2 = run(&prep, &dir.join("t2"), 2);
        if two.as_ref().is_none_or(|t| r2.0.wall_s < t.0.wall_s) {
            two = Some(r2);
        }
    }
    let one = one.expect("ran");
    let (two, cores) = two.expect("ran");
    println!("load average after:  {}", load_average());
    let identical = std::fs::read(dir.join("t1").join(RESULTS_FILE)).ok()
        == std::fs::read(dir.join("t2").join(RESULTS_FILE)).ok();

    let speedup = one.wall_s / two.wall_s;
    let points = one.points as f64;
    let point_s = one.compute_s / one.executed as f64;
    let per_point = |r: &RunReport| {
        (
            expand_s / points,
            r.setup_s / points,
            r.write_s / r.executed as f64,
            r.table_s / points,
        )
    };
    let (e, s, w, tb) = per_point(&one);
    let overhead = e + s + w + tb;
    println!();
    println!(
        "1 thread : {:>8.3} s wall ({:.3} s in runs)",
        one.wall_s, one.compute_s
    );
    println!(
        "2 threads: {:>8.3} s wall ({:.3} s in runs)",
        two.wall_s, two.compute_s
    );
    println!("speed-up 1 -> 2 threads: {speedup:.3}x (target >= 1.8x)");
    controls.sort_by(f64::total_cmp);
    let machine = controls[controls.len() / 2];
    println!(
        "control, same rounds: a pure CPU loop speeds up {machine:.3}x on 2 threads (median of {:?}); the sweep reaches {:.0}% of that",
        controls.iter().map(|c| (c * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        100.0 * speedup / machine
    );
    println!(
        "cores used on average by the 2-thread run: {cores:.2}{}",
        if cores < 1.8 {
            " (the machine was busy: the speed-up is a lower bound)"
        } else {
            ""
        }
    );
    println!(
        "typical point (mean run time on 1 thread): {:.3} ms",
        point_s * 1e3
    );
    println!(
        "overhead per point: {:.3} ms = expansion+checks {:.3} + setup {:.3} + point file {:.3} + tables {:.3} ms",
        overhead * 1e3,
        e * 1e3,
        s * 1e3,
        w * 1e3,
        tb * 1e3
    );
    let share = overhead / point_s;
    println!(
        "overhead / typical point: {:.3}% (target < 1%)",
        share * 100.0
    );
    println!("tables identical on 1 and 2 threads: {identical}");
    let _ = std::fs::remove_dir_all(&dir);
    let ok = speedup >= 1.8 && share < 0.01 && identical;
    println!("{}", if ok { "OK" } else { "BELOW TARGET" });
    if !ok {
        std::process::exit(1);
    }
}

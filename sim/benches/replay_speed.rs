//! Replay speed: LRU on a 10M-request Zipf(1.0) trace over 1M objects, one thread, with
//! mooncake-default, type-aware and the other policies measured in the same run as ratios
//! to LRU, then the parallel fan-out of 8 policies on 1 thread vs all threads.
//!
//! `cargo bench -p moonagent-sim --bench replay_speed` (REPLAY_REQUESTS, REPLAY_OBJECTS
//! and REPLAY_RUNS shrink it; REPLAY_POLICIES=lru,fifo picks the single-thread rows;
//! REPLAY_FANOUT=0 skips the fan-out).
//! Rounds interleave the policies (medians and bests of REPLAY_RUNS, default 3); the
//! load average is printed because a shared machine is noisy.
//!
//! The store is the replay's own `MemStore` with every Mooncake rule on except the two
//! that would make the policy comparison meaningless on a unit-size Zipf trace with one
//! request per microsecond: leases (10 s would pin every object) and the 10 ms eviction
//! tick (eviction runs synchronously when a put crosses the watermark instead).
//!
//! A second table runs the replay's default store config (`moonagent replay
//! --cache-model mooncake`: `MemStoreConfig::default()`, 10 s read leases, the 10 ms tick,
//! the 0.90 watermark and 5% batches) on a Zipf(1.0) trace of the same size with one
//! request every REPLAY_GAP_US (default 100) microseconds and the three data types by
//! object, so that `type-aware` merges three class streams (REPLAY_DEFAULT=0 skips it).
//! The ratios LRU/this there are what issue 15 item 4 asks of `mooncake-default` and
//! `type-aware` (time within 1.5x of LRU's, i.e. LRU/this >= 0.67).

// What the CLI runs: its allocator too.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::time::Instant;

use moonagent_core::rng::Rng;
use moonagent_core::store::{DataType, MemStoreConfig};
use moonagent_sim::replay::{replay_all, replay_one, Compiled, LabelledPolicy};
use rand_distr::Distribution;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Zipf(s) over `objects` ranks (`rand_distr::Zipf`), one request every `gap_ns`; with
/// `typed` each object gets one of the three data types by its id.
fn zipf_trace(
    requests: u64,
    objects: u64,
    s: f64,
    seed: u64,
    gap_ns: u64,
    typed: bool,
) -> Compiled {
    let zipf = rand_distr::Zipf::new(objects as f64, s).expect("Zipf parameters");
    let mut rng = Rng::stream(seed, "zipf");
    let mut c = Compiled::default();
    c.accesses.reserve(requests as usize);
    for i in 0..requests {
        let rank = zipf.sample(&mut rng) as u64 - 1;
        // Ids are scrambled ranks, so popularity is not correlated with hash order.
        let id = moonagent_core::rng::mix64(rank);
        let dt = if typed {
            DataType::ALL[(id % DataType::COUNT as u64) as usize]
        } else {
            DataType::General
        };
        c.push(i * gap_ns, id, 1, 1, dt, 0, 0).expect("fits");
    }
    c.requests = requests;
    c.fill_next();
    c
}

fn policy(name: &str) -> LabelledPolicy {
    LabelledPolicy::by_name(name).unwrap_or_else(|e| panic!("{e}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The host's load average, so a reader can judge how noisy a run was.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU seconds this process has used (user + system, Linux `/proc/self/stat`, 100 Hz
/// ticks), to show how many cores a parallel section really got.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start at field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn main() {
    let requests = env("REPLAY_REQUESTS", 10_000_000);
    let objects = env("REPLAY_OBJECTS", 1_000_000);
    let runs = env("REPLAY_RUNS", 3).max(1);
    let t = Instant::now();
    let trace = zipf_trace(requests, objects, 1.0, 42, 1_000, false);
    eprintln!(
        "generated {requests} Zipf(1.0) requests over {objects} objects in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Capacity: 10% of the objects (unit sizes).
    let cfg = MemStoreConfig {
        capacity_bytes: objects / 10,
        kv_lease_ttl_ns: 0,
        eviction_interval_ns: 0,
        ..MemStoreConfig::default()
    };
    let names = std::env::var("REPLAY_POLICIES").unwrap_or_else(|_| {
        "lru,mooncake-default,type-aware,fifo,s3-fifo,gdsf,belady,belady-cost".into()
    });
    println!(
        "single thread, {runs} interleaved rounds, capacity {} objects (load average {}):",
        cfg.capacity_bytes,
        load()
    );
    let pols: Vec<LabelledPolicy> = names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(policy)
        .collect();
    table(&trace, &cfg, &pols, runs, requests);
    if env("REPLAY_DEFAULT", 1) != 0 {
        let gap_us = env("REPLAY_GAP_US", 100).max(1);
        let typed = zipf_trace(requests, objects, 1.0, 42, gap_us * 1_000, true);
        let dcfg = MemStoreConfig {
            capacity_bytes: objects / 10,
            ..MemStoreConfig::default()
        };
        let three: Vec<LabelledPolicy> = ["lru", "mooncake-default", "type-aware"]
            .iter()
            .map(|n| policy(n))
            .collect();
        println!(
            "the replay's default store config (10 s leases, 10 ms tick), one request every \
             {gap_us} us, three data types, single thread, {runs} interleaved rounds, \
             capacity {} objects (load average {}):",
            dcfg.capacity_bytes,
            load()
        );
        table(&typed, &dcfg, &three, runs, requests);
    }
    if env("REPLAY_FANOUT", 1) == 0 {
        return;
    }
    fanout(&trace, &cfg, runs);
}

/// Replay `trace` under each policy, `runs` interleaved rounds; print medians and ratios
/// to LRU.
fn table(
    trace: &Compiled,
    cfg: &MemStoreConfig,
    pols: &[LabelledPolicy],
    runs: u64,
    requests: u64,
) {
    // Rounds interleave the policies so that load from other processes hits them alike.
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); pols.len()];
    let mut last = Vec::new();
    for _ in 0..runs {
        last.clear();
        for (k, p) in pols.iter().enumerate() {
            let t = Instant::now();
            let r = replay_one(trace, cfg, p).expect("replay");
            rates[k].push(requests as f64 / t.elapsed().as_secs_f64());
            last.push(r);
        }
    }
    println!(
        "{:<18} {:>10} {:>10} {:>8} {:>9} {:>14}",
        "policy", "median M/s", "best M/s", "hit %", "evictions", "LRU/this (med)"
    );
    let lru = pols
        .iter()
        .position(|p| p.label == "lru")
        .map(|k| median(rates[k].clone()));
    for (k, p) in pols.iter().enumerate() {
        let med = median(rates[k].clone());
        let best = rates[k].iter().copied().fold(0.0, f64::max);
        let vs = lru.map_or("-".to_string(), |l| format!("{:.2}x", l / med));
        println!(
            "{:<18} {:>10.2} {:>10.2} {:>8.2} {:>9} {:>14}",
            p.label,
            med / 1e6,
            best / 1e6,
            100.0 * last[k].total.hit_rate(),
            last[k].total.evicted,
            vs
        );
    }
}

/// The parallel fan-out of eight policies, one thread against all.
fn fanout(trace: &Compiled, cfg: &MemStoreConfig, runs: u64) {
    let eight: Vec<LabelledPolicy> = [
        "lru",
        "fifo",
        "s3-fifo",
        "gdsf",
        "mooncake-default",
        "type-aware",
        "belady",
        "belady-cost",
    ]
    .iter()
    .map(|n| policy(n))
    .collect();
    let mut cores_used = Vec::new();
    let mut time_with = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        let cpu = cpu_seconds();
        let t = Instant::now();
        pool.install(|| replay_all(trace, cfg, &eight))
            .expect("replay");
        let wall = t.elapsed().as_secs_f64();
        if let (Some(a), Some(b)) = (cpu, cpu_seconds()) {
            if threads > 1 {
                cores_used.push((b - a) / wall);
            }
        }
        wall
    };
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Interleaved rounds, as above: 1 thread, then all, and again.
    let (mut one, mut many) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        one.push(time_with(1));
        many.push(time_with(all));
    }
    let (one, many) = (median(one), median(many));
    let cores = if cores_used.is_empty() {
        "unknown".to_string()
    } else {
        format!("{:.2}", median(cores_used))
    };
    println!(
        "fan-out of {} policies, median of {runs} interleaved rounds: 1 thread {:.2} s, {} threads {:.2} s, speed-up {:.2}x; cores busy during the parallel runs (CPU s / wall s) {cores} (load average {})",
        eight.len(),
        one,
        all,
        many,
        one / many,
        load()
    );
}

//! Replay speed: LRU on a 10M-request Zipf(1.0) trace over 1M objects, one thread, with
//! mooncake-default and type-aware measured in the same run as ratios to LRU, then the
//! parallel fan-out of 8 policies on 1 thread vs all threads.
//!
//! `cargo bench -p moonagent-sim --bench replay_speed` (REPLAY_REQUESTS / REPLAY_OBJECTS
//! shrink it). Medians of 3 runs; the machine is noisy.

use std::time::Instant;

use moonagent_core::rng::Rng;
use moonagent_core::store::{DataType, MemStoreConfig, PolicyConfig};
use moonagent_sim::replay::{replay_all, replay_one, Compiled, LabelledPolicy};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Zipf(s) over `n` ranks by inverse CDF (binary search on the cumulative weights).
fn zipf_trace(requests: u64, objects: u64, s: f64, seed: u64) -> Compiled {
    let mut cdf = Vec::with_capacity(objects as usize);
    let mut acc = 0.0;
    for k in 1..=objects {
        acc += 1.0 / (k as f64).powf(s);
        cdf.push(acc);
    }
    let total = acc;
    let mut rng = Rng::stream(seed, "zipf");
    let mut c = Compiled::default();
    c.accesses.reserve(requests as usize);
    for i in 0..requests {
        let u = rng.next_f64() * total;
        let rank = cdf.partition_point(|&x| x < u) as u64;
        // Ids are scrambled ranks, so popularity is not correlated with hash order.
        let id = moonagent_core::rng::mix64(rank);
        c.push(i * 1_000, id, 1, 1, DataType::General, 0, 0).expect("fits");
    }
    c.requests = requests;
    c.fill_next();
    c
}

fn policy(name: &str) -> LabelledPolicy {
    let policy: PolicyConfig = serde_json::from_value(serde_json::json!({ "policy": name })).unwrap_or_else(|e| panic!("policy {name}: {e}"));
    LabelledPolicy { label: name.into(), policy }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let requests = env("REPLAY_REQUESTS", 10_000_000);
    let objects = env("REPLAY_OBJECTS", 1_000_000);
    let t = Instant::now();
    let trace = zipf_trace(requests, objects, 1.0, 42);
    eprintln!("generated {requests} Zipf(1.0) requests over {objects} objects in {:.1} s", t.elapsed().as_secs_f64());
    // Capacity: 10% of the objects (unit sizes); leases off so the policy alone decides.
    let cfg = MemStoreConfig {
        capacity_bytes: objects / 10,
        kv_lease_ttl_ns: 0,
        eviction_interval_ns: 0,
        ..MemStoreConfig::default()
    };
    println!("single thread, median of 3 runs:");
    println!("{:<18} {:>12} {:>10} {:>12}", "policy", "Mreq/s", "hit %", "vs LRU");
    let mut lru_rate = 0.0;
    for name in ["lru", "mooncake-default", "type-aware", "fifo"] {
        let p = policy(name);
        let mut rates = Vec::new();
        let mut hit = 0.0;
        for _ in 0..3 {
            let t = Instant::now();
            let r = replay_one(&trace, &cfg, &p).expect("replay");
            rates.push(requests as f64 / t.elapsed().as_secs_f64());
            hit = r.total.hit_rate();
        }
        let rate = median(rates);
        if name == "lru" {
            lru_rate = rate;
        }
        println!("{:<18} {:>12.2} {:>10.2} {:>11.2}x", name, rate / 1e6, 100.0 * hit, lru_rate / rate);
    }
    let eight: Vec<LabelledPolicy> = ["lru", "fifo", "s3-fifo", "gdsf", "mooncake-default", "type-aware", "belady", "cost-bound"]
        .iter()
        .map(|n| policy(n))
        .collect();
    let time_with = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
        let t = Instant::now();
        pool.install(|| replay_all(&trace, &cfg, &eight)).expect("replay");
        t.elapsed().as_secs_f64()
    };
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let one = time_with(1);
    let many = time_with(all);
    println!("fan-out of {} policies: 1 thread {:.2} s, {} threads {:.2} s, speed-up {:.2}x", eight.len(), one, all, many, one / many);
}

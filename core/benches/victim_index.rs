//! Store time per request of `mooncake-default` and `type-aware`, with the victim index
//! (what `MemStore` runs) and with the full scan (the reference, `select_victims`, forced
//! by a wrapper that hides the index), as ratios to LRU measured in the same process
//! (issue 15 item 4: the indexed policies within 1.5x of LRU's time).
//!
//! `cargo bench -p moonagent-core --bench victim_index`. The driver is the replay's loop on
//! the replay's default store config (`MemStoreConfig::default()`: 10 s read leases, the
//! 10 ms tick, the 0.90 watermark, 5% batches): per request one lease-granting lookup
//! (`exists`), and on a miss a put of the object. Objects are Zipf(1.0) ranks over
//! VI_OBJECTS (default 1,000,000), one of three data types each, unit size; VI_REQUESTS
//! (default 4,000,000) requests, one every VI_GAP_US (default 100) microseconds; the
//! capacity is 10% of the objects. A second workload does the same with leases off and
//! synchronous eviction (the `replay_speed` bench's store). VI_RUNS (default 3)
//! interleaved rounds; medians; the host's load average is printed (a shared machine).
//! VI_ONLY=<row label prefix> runs only the matching rows (for `perf record`; the ratio
//! column then needs the LRU row among them).

use std::time::Instant;

use moonagent_core::rng::{mix64, Rng};
use moonagent_core::store::{
    AccessHints, DataType, EvictRequest, EvictionPolicy, MemStore, MemStoreConfig, ObjId,
    ObjectMeta, Payload, PolicyConfig, ReplicateConfig,
};

#[path = "common/mod.rs"]
mod common;
use common::{env, load, median};

/// A policy with its index hidden: the store scans (`select_victims`).
#[derive(Debug)]
struct ScanOnly(Box<dyn EvictionPolicy>);

impl EvictionPolicy for ScanOnly {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn on_insert(&mut self, id: ObjId, m: &ObjectMeta) {
        self.0.on_insert(id, m)
    }
    fn on_access(&mut self, id: ObjId, m: &ObjectMeta) {
        self.0.on_access(id, m)
    }
    fn on_remove(&mut self, id: ObjId, m: &ObjectMeta) {
        self.0.on_remove(id, m)
    }
    fn select_victims(&mut self, req: &EvictRequest, o: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.0.select_victims(req, o, out)
    }
}

/// Zipf(1.0) ranks over `n` objects by inverse CDF, scrambled to ids.
fn zipf(requests: u64, n: u64, seed: u64) -> Vec<u64> {
    let mut cdf = Vec::with_capacity(n as usize);
    let mut acc = 0.0;
    for k in 1..=n {
        acc += 1.0 / k as f64;
        cdf.push(acc);
    }
    let mut rng = Rng::stream(seed, "zipf");
    (0..requests)
        .map(|_| {
            let u = rng.next_f64() * acc;
            let rank = cdf.partition_point(|&c| c < u) as u64;
            mix64(rank)
        })
        .collect()
}

/// One replay; returns (seconds, hits, evicted).
fn replay(
    ids: &[u64],
    cfg: &MemStoreConfig,
    policy: Box<dyn EvictionPolicy>,
    gap: u64,
) -> (f64, u64, u64) {
    let mut s: MemStore<u64> = MemStore::with_policy_box(cfg.clone(), policy).expect("store");
    let t = Instant::now();
    let mut hits = 0;
    for (i, &id) in ids.iter().enumerate() {
        let now = (i as u64 + 1) * gap;
        if s.exists_with(now, &id).expect("exists") {
            hits += 1;
            continue;
        }
        let rc = ReplicateConfig {
            data_type: DataType::ALL[(id % DataType::COUNT as u64) as usize],
            ..ReplicateConfig::default()
        };
        // A put that finds no room fails at once and the object stays uncached.
        let _ = s.put_with(now, id, Payload::SizeOnly(1), &rc, AccessHints::default());
    }
    let secs = t.elapsed().as_secs_f64();
    let evicted = s.stats().by_type.iter().map(|t| t.evicted).sum();
    (secs, hits, evicted)
}

fn table(title: &str, ids: &[u64], cfg: &MemStoreConfig, gap: u64, runs: u64) {
    let rows: [(&str, &str, bool); 5] = [
        ("lru", "lru", false),
        ("mooncake-default (index)", "mooncake-default", false),
        ("mooncake-default (scan)", "mooncake-default", true),
        ("type-aware (index)", "type-aware", false),
        ("type-aware (scan)", "type-aware", true),
    ];
    let only = std::env::var("VI_ONLY").ok();
    let keep = |label: &str| only.as_deref().is_none_or(|o| label.starts_with(o));
    println!("{title} (load average {}):", load());
    let mut secs: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut last = vec![(0, 0); rows.len()];
    for _ in 0..runs {
        for (k, &(label, name, scan)) in rows.iter().enumerate() {
            if !keep(label) {
                continue;
            }
            let p = PolicyConfig::by_name(name)
                .expect("policy")
                .build()
                .expect("build");
            let p: Box<dyn EvictionPolicy> = if scan { Box::new(ScanOnly(p)) } else { p };
            let (t, hits, ev) = replay(ids, cfg, p, gap);
            secs[k].push(t);
            last[k] = (hits, ev);
        }
    }
    if secs.iter().any(Vec::is_empty) {
        for (k, &(label, _, _)) in rows.iter().enumerate() {
            if !secs[k].is_empty() {
                let m = median(secs[k].clone());
                println!("{label:<26} {m:>10.3} s median (VI_ONLY set: no ratio)");
            }
        }
        return;
    }
    let lru = median(secs[0].clone());
    println!(
        "{:<26} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "policy", "median s", "ns/req", "hits", "evicted", "this / LRU"
    );
    for (k, &(label, _, _)) in rows.iter().enumerate() {
        let m = median(secs[k].clone());
        println!(
            "{:<26} {:>10.3} {:>10.0} {:>10} {:>10} {:>11.2}x",
            label,
            m,
            m * 1e9 / ids.len() as f64,
            last[k].0,
            last[k].1,
            m / lru
        );
    }
    // Same victims: the index and the scan give the same hits and evictions.
    assert_eq!(last[1], last[2], "mooncake-default: index and scan differ");
    assert_eq!(last[3], last[4], "type-aware: index and scan differ");
}

fn main() {
    let requests = env("VI_REQUESTS", 4_000_000);
    let objects = env("VI_OBJECTS", 1_000_000);
    let runs = env("VI_RUNS", 3).max(1);
    let gap = env("VI_GAP_US", 100).max(1) * 1_000;
    let ids = zipf(requests, objects, 42);
    let cfg = MemStoreConfig::with_capacity(objects / 10);
    table(
        &format!(
            "default store config, {requests} Zipf(1.0) requests over {objects} objects, \
             one every {} us, capacity {} objects, {runs} interleaved rounds, medians",
            gap / 1_000,
            cfg.capacity_bytes
        ),
        &ids,
        &cfg,
        gap,
        runs,
    );
    let bare = MemStoreConfig {
        kv_lease_ttl_ns: 0,
        eviction_interval_ns: 0,
        ..cfg
    };
    table(
        "no leases, synchronous eviction (replay_speed's store), one request every 1 us",
        &ids,
        &bare,
        1_000,
        runs,
    );
}

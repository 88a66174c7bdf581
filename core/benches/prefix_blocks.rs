//! Store time per prefix KV block in the simulator's W1 pattern, beside a bare FIFO cache
//! of the same keys measured in the same process (the floor of any hash-indexed store).
//!
//! `cargo bench -p moonagent-core --bench prefix_blocks`. What a W1 Full simulation does
//! with its 1.68 M prefix blocks, and nearly half of its loop's time (issue 15): each
//! request looks up its `PB_BLOCKS` (default 19) blocks, all new (`kv_prefix::lookup`: one
//! `exists` each), and publishes them `PB_LAG` (default 2,000) requests later, when its
//! prefill ends (`kv_prefix::publish_all`: one `put_key` each), with the engine's prefetch
//! hints (`BlockStore::block_prefetch`); one request every `PB_GAP_US`
//! (default 10,500) microseconds of virtual time, the store holding `PB_LIVE` (default
//! 70,000) blocks (the W1 run's), with the simulator's store settings (leases, the 10 ms
//! eviction tick, 5% batches: ~3,500 victims a run). `PB_REQUESTS` (default 90,000)
//! requests, `PB_RUNS` (default 5) interleaved rounds, medians; the load average is printed.

use std::collections::{HashSet, VecDeque};
use std::time::Instant;

use moonagent_core::rng::mix64;
use moonagent_core::serve::kv_prefix::{self, BlockStore};
use moonagent_core::store::{
    DataType, MemStore, MemStoreConfig, Payload, ReplicateConfig, Store, StoreKey, StoreResult, SEC,
};
use rustc_hash::FxBuildHasher;

#[path = "common/mod.rs"]
mod common;
use common::{env, load, median};

/// Bytes of one block: 64 tokens of Qwen2.5-VL-7B's KV (57,344 bytes a token).
const BLOCK_BYTES: u64 = 64 * 57_344;

/// One request's blocks in the store, as the engine's `KvBlocks` addresses them.
struct Blocks<'s> {
    store: &'s mut MemStore<StoreKey>,
    now: u64,
    ids: &'s [u64],
}

impl BlockStore for Blocks<'_> {
    fn block_exists(&mut self, i: usize) -> StoreResult<bool> {
        self.store.exists_key(self.now, &StoreKey::Kv(self.ids[i]))
    }
    fn block_prefetch(&self, i: usize, put: bool, ahead: usize) {
        kv_prefix::prefetch_kv_block(&*self.store, self.ids, i, put, ahead);
    }
    fn block_put(&mut self, i: usize) -> StoreResult<()> {
        self.store.put_key(
            self.now,
            &StoreKey::Kv(self.ids[i]),
            Payload::SizeOnly(BLOCK_BYTES),
            &ReplicateConfig::of(DataType::KvCache),
        )
    }
}

struct Workload {
    requests: u64,
    blocks: u64,
    lag: u64,
    gap_ns: u64,
    live: u64,
}

impl Workload {
    /// The block ids of request `r` (all distinct: W1 has no repeats).
    fn ids(&self, r: u64, out: &mut Vec<u64>) {
        out.clear();
        out.extend((0..self.blocks).map(|b| mix64(r * self.blocks + b)));
    }
}

/// The store as the simulator drives it; returns (seconds, blocks stored, evicted).
fn store_run(w: &Workload) -> (f64, u64, u64) {
    let cfg = MemStoreConfig {
        // The watermark at 0.9: `live` blocks resident at the high watermark.
        capacity_bytes: w.live * BLOCK_BYTES * 10 / 9,
        kv_lease_ttl_ns: 10 * SEC,
        ..MemStoreConfig::default()
    };
    let mut s = MemStore::<StoreKey>::new(cfg).expect("store");
    let mut missing = Vec::new();
    let mut pending: VecDeque<Vec<u64>> = VecDeque::new();
    let mut ids = Vec::new();
    let t = Instant::now();
    for r in 0..w.requests + w.lag {
        let now = (r + 1) * w.gap_ns;
        if r < w.requests {
            w.ids(r, &mut ids);
            let mut b = Blocks {
                store: &mut s,
                now,
                ids: &ids,
            };
            kv_prefix::lookup(&mut b, ids.len(), &mut missing, |_, _| {}).expect("lookup");
            pending.push_back(missing.iter().map(|&i| ids[i]).collect());
        }
        if r >= w.lag {
            let todo = pending.pop_front().expect("a pending request");
            let mut b = Blocks {
                store: &mut s,
                now,
                ids: &todo,
            };
            kv_prefix::publish_all(&mut b, todo.len()).expect("publish");
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let st = s.stats().by_type[DataType::KvCache.index()];
    (secs, st.puts, st.evicted)
}

/// The floor: a FIFO cache of the same keys in a hash set, the oldest `live` kept.
fn fifo_run(w: &Workload) -> (f64, u64, u64) {
    let mut set: HashSet<u64, FxBuildHasher> = HashSet::default();
    let mut order: VecDeque<u64> = VecDeque::new();
    let mut pending: VecDeque<Vec<u64>> = VecDeque::new();
    let mut ids = Vec::new();
    let (mut puts, mut evicted) = (0, 0);
    let t = Instant::now();
    for r in 0..w.requests + w.lag {
        if r < w.requests {
            w.ids(r, &mut ids);
            pending.push_back(ids.iter().copied().filter(|k| !set.contains(k)).collect());
        }
        if r >= w.lag {
            for k in pending.pop_front().expect("a pending request") {
                if set.insert(k) {
                    order.push_back(k);
                    puts += 1;
                }
                while order.len() as u64 > w.live {
                    let old = order.pop_front().expect("an entry");
                    set.remove(&old);
                    evicted += 1;
                }
            }
        }
    }
    (t.elapsed().as_secs_f64(), puts, evicted)
}

fn main() {
    let w = Workload {
        requests: env("PB_REQUESTS", 90_000),
        blocks: env("PB_BLOCKS", 19).max(1),
        lag: env("PB_LAG", 2_000),
        gap_ns: env("PB_GAP_US", 10_500).max(1) * 1_000,
        live: env("PB_LIVE", 70_000).max(1),
    };
    let runs = env("PB_RUNS", 5).max(1);
    println!(
        "{} requests x {} new blocks, published {} requests later, one every {} us, \
         ~{} blocks resident; {runs} interleaved rounds, medians (load average {})",
        w.requests,
        w.blocks,
        w.lag,
        w.gap_ns / 1_000,
        w.live,
        load()
    );
    let (mut store, mut fifo) = (Vec::new(), Vec::new());
    let (mut s_last, mut f_last) = ((0, 0), (0, 0));
    for _ in 0..runs {
        let (t, p, e) = store_run(&w);
        store.push(t);
        s_last = (p, e);
        let (t, p, e) = fifo_run(&w);
        fifo.push(t);
        f_last = (p, e);
    }
    let n = (w.requests * w.blocks) as f64;
    let (s, f) = (median(store), median(fifo));
    println!(
        "{:<34} {:>10} {:>10} {:>10} {:>10}",
        "", "median s", "ns/block", "stored", "evicted"
    );
    println!(
        "{:<34} {:>10.3} {:>10.1} {:>10} {:>10}",
        "MemStore (exists, put, evict)",
        s,
        s * 1e9 / n,
        s_last.0,
        s_last.1
    );
    println!(
        "{:<34} {:>10.3} {:>10.1} {:>10} {:>10}",
        "FIFO hash set (floor)",
        f,
        f * 1e9 / n,
        f_last.0,
        f_last.1
    );
    println!("MemStore / floor: {:.2}x", s / f);
}

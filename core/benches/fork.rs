//! Fork benchmarks, each against a baseline measured in the same run.
//!
//! 1. `fork_8way_32k`: an 8-way fork of a 32,768-token prefix (2,048 pages of 16 tokens)
//!    through the locked [`BlockPool`], against the physical floor: copying the 2,048-entry
//!    block-id table once per extra branch (7 copies, the tables the fork must produce),
//!    and, for reference, a single table copy.
//! 2. `kv_copy_vs_fork`: the same 8-way fork against copying the KV bytes the prefix pages
//!    hold (57,344 B/token, Qwen2.5-VL-7B bf16) into 7 new branches, at a prefix that fits
//!    in memory (1,024 tokens: 58.7 MB per branch, 411 MB per iteration).
//!
//! Every routine uses `iter_custom`, so setup, releases and drops stay outside the timed
//! region, and records its samples; after criterion has run, a summary prints the medians
//! of those very samples and the ratios between them.

use criterion::{black_box, BenchmarkId, Criterion};
use moonagent_core::fork::{BlockPool, PoolConfig, QWEN25_VL_7B_BYTES_PER_TOKEN};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BLOCK: u32 = 16;
const PREFIX_TOKENS: u64 = 32_768;
const SMALL_PREFIX_TOKENS: u64 = 1_024;
const BRANCHES: u32 = 8;

/// Samples recorded per benchmark: (iterations, total time) per criterion call.
static SAMPLES: Mutex<BTreeMap<String, Vec<(u64, Duration)>>> = Mutex::new(BTreeMap::new());

fn record(name: &str, iters: u64, total: Duration) -> Duration {
    if let Ok(mut s) = SAMPLES.lock() {
        s.entry(name.to_owned()).or_default().push((iters, total));
    }
    total
}

/// A long-lived pool with room for a `tokens`-token prefix, as a decode worker keeps one.
fn pool_for(tokens: u64) -> BlockPool {
    let pages = (tokens / u64::from(BLOCK)) as u32;
    let cfg = PoolConfig::new(2 * pages + 16, BLOCK, QWEN25_VL_7B_BYTES_PER_TOKEN);
    BlockPool::new(cfg).expect("config")
}

/// Times `BRANCHES`-way forks of a `tokens`-token prefix in a long-lived pool (steady
/// state: the allocator reuses the tables the previous iteration released). Allocating
/// the prefix and releasing the branches are untimed.
fn time_fork(name: &str, pool: &BlockPool, tokens: u64, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let parent = pool.allocate(tokens).expect("capacity");
        let start = Instant::now();
        let out = black_box(pool.fork(black_box(parent), BRANCHES).expect("admitted"));
        total += start.elapsed();
        for b in out.branches {
            pool.release(b).expect("live");
        }
    }
    record(name, iters, total)
}

/// Times `copies` plain clones of a block-id table; drops untimed.
fn time_table_copies(name: &str, table: &[u32], copies: usize, iters: u64) -> Duration {
    let mut total = Duration::ZERO;
    let mut out: Vec<Vec<u32>> = Vec::with_capacity(copies);
    for _ in 0..iters {
        let start = Instant::now();
        for _ in 0..copies {
            out.push(black_box(table).to_vec());
        }
        black_box(&out);
        total += start.elapsed();
        out.clear();
    }
    record(name, iters, total)
}

/// KV memory of `pages` pages plus room for `branches` private copies of them.
struct KvBytes {
    page_bytes: usize,
    src: Vec<u8>,
    dst: Vec<Vec<u8>>,
}

impl KvBytes {
    fn new(pages: usize, branches: usize) -> Self {
        let page_bytes = BLOCK as usize * QWEN25_VL_7B_BYTES_PER_TOKEN as usize;
        // Filled, not zeroed, so every page is really backed before timing starts.
        Self {
            page_bytes,
            src: vec![0x5a; pages * page_bytes],
            dst: (0..branches)
                .map(|_| vec![0xa5; pages * page_bytes])
                .collect(),
        }
    }

    /// Copies every page of `table` into each branch's region, page by page.
    fn copy_prefix(&mut self, table: &[u32]) {
        let pb = self.page_bytes;
        for dst in &mut self.dst {
            for (i, &page) in table.iter().enumerate() {
                let s = page as usize * pb;
                dst[i * pb..(i + 1) * pb].copy_from_slice(&self.src[s..s + pb]);
            }
            black_box(&dst[0]);
        }
    }
}

fn benches(c: &mut Criterion) {
    let pool = pool_for(PREFIX_TOKENS);
    let parent = pool.allocate(PREFIX_TOKENS).expect("capacity");
    let table = pool.table(parent).expect("live");
    assert_eq!(table.len(), 2_048);
    pool.release(parent).expect("live");
    let extra = (BRANCHES - 1) as usize;

    let mut g = c.benchmark_group("fork_8way_32k");
    g.bench_function("fork", |b| {
        b.iter_custom(|iters| time_fork("fork_8way_32k/fork", &pool, PREFIX_TOKENS, iters))
    });
    g.bench_function(BenchmarkId::new("table_copy_floor", "7_copies"), |b| {
        b.iter_custom(|iters| time_table_copies("fork_8way_32k/floor_7", &table, extra, iters))
    });
    g.bench_function(BenchmarkId::new("table_copy_floor", "1_copy"), |b| {
        b.iter_custom(|iters| time_table_copies("fork_8way_32k/floor_1", &table, 1, iters))
    });
    g.finish();

    let small_pool = pool_for(SMALL_PREFIX_TOKENS);
    let small_parent = small_pool.allocate(SMALL_PREFIX_TOKENS).expect("capacity");
    let small_table = small_pool.table(small_parent).expect("live");
    small_pool.release(small_parent).expect("live");
    let mut kv = KvBytes::new(small_table.len(), extra);
    let mut g = c.benchmark_group("kv_copy_vs_fork_1k");
    g.sample_size(10);
    g.bench_function("fork", |b| {
        b.iter_custom(|iters| time_fork("kv_1k/fork", &small_pool, SMALL_PREFIX_TOKENS, iters))
    });
    g.bench_function("kv_byte_copy_7_branches", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                kv.copy_prefix(black_box(&small_table));
            }
            record("kv_1k/kv_copy", iters, start.elapsed())
        })
    });
    g.finish();
}

/// Median per-iteration time over the last `n` recorded samples (criterion's measurement
/// phase comes after warm-up, so the last samples are the measured ones).
fn median_ns(name: &str, n: usize) -> Option<f64> {
    let samples = SAMPLES.lock().ok()?;
    let all = samples.get(name)?;
    let mut per: Vec<f64> = all[all.len().saturating_sub(n)..]
        .iter()
        .filter(|(i, _)| *i > 0)
        .map(|(i, d)| d.as_nanos() as f64 / *i as f64)
        .collect();
    per.sort_by(f64::total_cmp);
    per.get(per.len() / 2).copied()
}

fn summary() {
    let m = |name: &str, n: usize| median_ns(name, n).unwrap_or(f64::NAN);
    let fork = m("fork_8way_32k/fork", 100);
    let floor7 = m("fork_8way_32k/floor_7", 100);
    let floor1 = m("fork_8way_32k/floor_1", 100);
    let fork_small = m("kv_1k/fork", 10);
    let kv = m("kv_1k/kv_copy", 10);
    let kv_bytes = 7.0 * SMALL_PREFIX_TOKENS as f64 * QWEN25_VL_7B_BYTES_PER_TOKEN as f64;
    let gbps = kv_bytes / kv;
    let kv_32k = 7.0 * PREFIX_TOKENS as f64 * QWEN25_VL_7B_BYTES_PER_TOKEN as f64 / gbps;
    println!("\n== fork summary (medians of this run's samples) ==");
    println!(
        "8-way fork, 32k prefix (2,048 pages):      {:>14.0} ns",
        fork
    );
    println!(
        "table copy floor, 7 copies of 2,048 ids:   {:>14.0} ns",
        floor7
    );
    println!(
        "table copy, 1 copy of 2,048 ids:           {:>14.0} ns",
        floor1
    );
    println!(
        "  fork / 7-copy floor:                     {:>14.2}x  (target <= 3x)",
        fork / floor7
    );
    println!(
        "  fork / 1-copy floor:                     {:>14.2}x",
        fork / floor1
    );
    println!(
        "8-way fork, 1k prefix (64 pages):          {:>14.0} ns",
        fork_small
    );
    println!(
        "KV byte copy, 1k prefix into 7 branches:   {:>14.0} ns  ({:.1} GB/s)",
        kv, gbps
    );
    println!(
        "  KV copy / fork at 1k (measured):         {:>14.0}x  (target >= 1000x)",
        kv / fork_small
    );
    println!(
        "  KV copy / fork at 32k (KV time extrapolated at the measured GB/s): {:.0}x",
        kv_32k / fork
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    summary();
}

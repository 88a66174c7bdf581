//! Simulator speed: events per second on runs of at least 1M events, with the event mix,
//! the mean decode batch and the per-request cost, against the bare event queue measured
//! in the same process as the floor; the 600-session seed-002 workload's wall time; peak
//! memory.
//!
//! `cargo bench -p moonagent-sim --bench sim_speed` (medians of 3 runs per row;
//! `MOONAGENT_BENCH_QUICK=1` runs each row once; `SIM_SPEED_ROW=TEXT` runs only the rows
//! whose label contains TEXT, e.g. `SIM_SPEED_ROW="200 req/s"` for W1 Full at 200 req/s,
//! and skips the sessions run).
//!
//! What an event costs depends on the model work it carries, so the rows span regimes:
//! - a decode iteration advances every sequence of its batch by one token; it calls the
//!   core's KV pool once per sequence per *page* (see `des::decode`), so it costs
//!   O(batch / kv_block_tokens): cheap at low load, ~10 pool calls at a batch of 160;
//! - an arrival or a prefill completion carries per-request work that is O(prompt pages)
//!   in the KV pool (allocate, release, fork) and, in EPD modes, every store and
//!   embedding-cache operation of the request (validated lookups, commits, prefix-block
//!   lookups and puts, eviction rounds over the store's objects).

// What the CLI runs: its allocator too.
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use std::time::Instant;

use moonagent_sim::des::engine::EventQueue;
use moonagent_sim::des::ladder::{generate, Workload};
use moonagent_sim::des::{simulate, Mode, SimConfig};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// 1M pushes and pops with the simulator's key layout (a mixed-time heap).
fn bare_queue_rate() -> f64 {
    let mut q = EventQueue::new();
    let t = Instant::now();
    let mut x = 1u64;
    for i in 0..1_000_000u64 {
        x = moonagent_core::rng::mix64(x);
        q.push(i * 1000 + (x % 50_000), (x % 5) as u8, i);
        if i % 4 == 3 {
            for _ in 0..4 {
                q.pop();
            }
        }
    }
    while q.pop().is_some() {}
    1_000_000.0 / t.elapsed().as_secs_f64()
}

struct Row {
    label: &'static str,
    generator: &'static str,
    config: serde_json::Value,
    requests: u64,
    rate: f64,
    modes: &'static [Mode],
}

const KINDS: [&str; 6] = [
    "arrival",
    "dispatch",
    "step",
    "image_stored",
    "images_loaded",
    "kv_arrived",
];

fn main() {
    let reps = if std::env::var_os("MOONAGENT_BENCH_QUICK").is_some() {
        1
    } else {
        3
    };
    let only = std::env::var("SIM_SPEED_ROW").ok();
    if only.is_none() {
        sessions();
    }
    let floor = median((0..3).map(|_| bare_queue_rate()).collect());
    println!("bare event queue: {:.2} M events/s (floor)", floor / 1e6);
    rows(reps, floor, only.as_deref());
    println!(
        "peak RSS of the whole bench (largest: the 80,000-request trace and its records): {:.0} MiB",
        peak_rss_mib()
    );
}

/// The 600-session seed-002 workload's wall time and the peak RSS after it.
fn sessions() {
    let wl = Workload {
        name: "sessions".into(),
        generator: "sessions".into(),
        config: serde_json::Value::Null,
    };
    let (trace, bs) = generate(&wl, 0, 1.0, 1).expect("sessions trace");
    let secs = median(
        (0..3)
            .map(|_| {
                let t = Instant::now();
                simulate(&SimConfig::default(), &trace, bs).expect("simulate");
                t.elapsed().as_secs_f64()
            })
            .collect(),
    );
    println!(
        "seed-002 sessions (600 sessions, {} requests), Full mode: {:.3} s",
        trace.len(),
        secs
    );
    println!(
        "peak RSS after the seed-002 sessions runs: {:.0} MiB",
        peak_rss_mib()
    );
}

/// The rows (those whose label contains `only`, when given).
fn rows(reps: usize, floor: f64, only: Option<&str>) {
    let long = serde_json::json!({"output_tokens_min": 1000, "output_tokens_max": 3000});
    let rows = [
        Row {
            label: "chat, long outputs, 2 req/s (decode-bound, small batches)",
            generator: "w1",
            config: long.clone(),
            requests: 3_000,
            rate: 2.0,
            modes: &[Mode::B0, Mode::Full],
        },
        Row {
            label: "chat, long outputs, 50 req/s (decode-bound, batches ~170)",
            generator: "w1",
            config: long,
            requests: 80_000,
            rate: 50.0,
            modes: &[Mode::B0, Mode::Full],
        },
        Row {
            label: "W4 agent forks, 20 req/s",
            generator: "w4",
            config: serde_json::Value::Null,
            requests: 30_000,
            rate: 20.0,
            modes: &[Mode::B0, Mode::B1, Mode::Full],
        },
        Row {
            label: "W1 default (short outputs), 200 req/s (per-request work dominates)",
            generator: "w1",
            config: serde_json::Value::Null,
            requests: 90_000,
            rate: 200.0,
            modes: &[Mode::Full],
        },
    ];
    for row in rows {
        if only.is_some_and(|o| !row.label.contains(o)) {
            continue;
        }
        let wl = Workload {
            name: row.generator.into(),
            generator: row.generator.into(),
            config: row.config.clone(),
        };
        let (trace, bs) = generate(&wl, row.requests, row.rate, 1).expect("trace");
        println!("{} ({} requests):", row.label, row.requests);
        for &mode in row.modes {
            let cfg = SimConfig {
                mode,
                ..SimConfig::default()
            };
            let mut rates = Vec::new();
            let mut secs_v = Vec::new();
            let mut last = None;
            for _ in 0..reps {
                let t = Instant::now();
                let (s, recs) = simulate(&cfg, &trace, bs).expect("simulate");
                let secs = t.elapsed().as_secs_f64();
                rates.push(s.events as f64 / secs);
                secs_v.push(secs);
                let tokens: u64 = recs.iter().map(|r| r.output_tokens).sum();
                last = Some((s, tokens));
            }
            let (s, tokens) = last.expect("ran");
            let r = median(rates);
            let secs = median(secs_v);
            let steps = s.events_by_kind[2].max(1);
            let mix: Vec<String> = KINDS
                .iter()
                .zip(s.events_by_kind)
                .filter(|(_, c)| *c > 0)
                .map(|(n, c)| format!("{n} {:.0}%", 100.0 * c as f64 / s.events as f64))
                .collect();
            println!(
                "  {:>4}: {:.2} M events, {:.2} M events/s ({:.0} ns/event, {:.1}% of the bare queue), \
                 {:.1} us/request, {:.0} M token-steps/s, {:.0} output tokens per step event; mix: {}",
                mode.name(),
                s.events as f64 / 1e6,
                r / 1e6,
                1e9 / r,
                100.0 * r / floor,
                secs * 1e6 / row.requests as f64,
                tokens as f64 / secs / 1e6,
                tokens as f64 / steps as f64,
                mix.join(", ")
            );
        }
    }
}

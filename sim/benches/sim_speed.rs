//! Simulator speed: events per second on runs of over 1M events (with the event mix), the
//! bare event queue as the floor measured in the same run, the 600-session seed-002
//! workload's wall time, and peak memory.
//!
//! `cargo bench -p moonagent-sim --bench sim_speed`. Medians of 3 runs.

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

fn main() {
    // Floor: the bare queue, 1M pushes and pops with the simulator's key layout.
    let floor = median(
        (0..3)
            .map(|_| {
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
            })
            .collect(),
    );
    println!("bare event queue: {:.2} M events/s (floor)", floor / 1e6);
    let names = [
        "arrival",
        "dispatch",
        "step",
        "image_stored",
        "images_loaded",
        "kv_arrived",
    ];
    for (w, n, rate) in [("w1", 60_000u64, 200.0), ("w4", 8_000, 20.0)] {
        let wl = Workload {
            name: w.into(),
            generator: w.into(),
            config: serde_json::Value::Null,
        };
        let (trace, bs) = generate(&wl, n, rate, 1).expect("trace");
        for mode in [Mode::B0, Mode::Full] {
            let cfg = SimConfig {
                mode,
                ..SimConfig::default()
            };
            let mut rates = Vec::new();
            let mut tok_rates = Vec::new();
            let mut last = None;
            for _ in 0..3 {
                let t = Instant::now();
                let (s, recs) = simulate(&cfg, &trace, bs).expect("simulate");
                let secs = t.elapsed().as_secs_f64();
                rates.push(s.events as f64 / secs);
                // Each decode-iteration event advances every sequence of its batch by a token.
                let tokens: u64 = recs.iter().map(|r| r.output_tokens).sum();
                tok_rates.push(tokens as f64 / secs);
                last = Some(s);
            }
            let s = last.expect("ran");
            let r = median(rates);
            let tok = median(tok_rates);
            let mix: Vec<String> = names
                .iter()
                .zip(s.events_by_kind)
                .map(|(n, c)| format!("{n} {:.0}%", 100.0 * c as f64 / s.events as f64))
                .collect();
            println!(
                "{w} {:>4}: {} requests, {:.2} M events, {:.2} M events/s ({:.1}% of the bare queue), {:.1} M token-steps/s; mix: {}",
                mode.name(),
                n,
                s.events as f64 / 1e6,
                r / 1e6,
                100.0 * r / floor,
                tok / 1e6,
                mix.join(", ")
            );
        }
    }
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
    println!("peak RSS: {:.0} MiB", peak_rss_mib());
}

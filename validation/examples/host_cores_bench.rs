//! How much work three CPU-bound threads get done on this host's cores, and how evenly,
//! under the kernel's scheduler (the baseline, measured in the same process) and under the
//! backend's round robin (`validation::cores`), with and without pinning each thread to
//! its core. Rounds alternate the disciplines; medians over rounds.
//!
//! `cargo run --release -p moonagent-validation --example host_cores_bench [ROUNDS] [THREADS] [QUANTUM_US]`
//! (defaults 5, one more than the host's cores, 1000). No assertions: it measures.
use std::time::{Duration, Instant};

use moonagent_validation::cores::{checkpoint, on_core, probe_unit, HostCores};

/// One unit of integer work (the host probe's), then an operator boundary.
fn chunk() {
    probe_unit();
    checkpoint();
}

/// Chunks each of `threads` threads did in `window`, every thread inside one long step.
fn round(threads: usize, cores: Option<&HostCores>, window: Duration) -> Vec<u64> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || {
                    let t0 = Instant::now();
                    on_core(cores, || {
                        let mut n = 0u64;
                        while t0.elapsed() < window {
                            chunk();
                            n += 1;
                        }
                        n
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let arg = |i: usize, d: u64| std::env::args().nth(i).map_or(d, |a| a.parse().unwrap());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rounds = arg(1, 5) as usize;
    let threads = arg(2, cores as u64 + 1) as usize;
    let quantum = arg(3, 1000);
    let window = Duration::from_millis(1000);
    let pinned = HostCores::new(cores, quantum, true).unwrap();
    let unpinned = HostCores::new(cores, quantum, false).unwrap();
    let alone = round(1, None, window)[0] as f64;
    println!(
        "{threads} threads on {cores} cores, quantum {quantum} us, {rounds} rounds of {window:?}; one thread alone: {alone} chunks"
    );
    let kinds: [(&str, Option<&HostCores>); 3] = [
        ("kernel", None),
        ("round robin, unpinned", Some(&unpinned)),
        ("round robin, pinned", Some(&pinned)),
    ];
    // Per kind: work per round as a fraction of the cores' capacity (cores x alone), its
    // ratio to the kernel's in the same round, and the spread of the threads' shares.
    let mut util = vec![Vec::new(); 3];
    let mut ratio = vec![Vec::new(); 3];
    let mut spread = vec![Vec::new(); 3];
    for _ in 0..rounds {
        let mut base = 0.0;
        for (k, (_, c)) in kinds.iter().enumerate() {
            let r = round(threads, *c, window);
            let total: u64 = r.iter().sum();
            let u = total as f64 / (cores as f64 * alone);
            if k == 0 {
                base = total as f64;
            }
            let (lo, hi) = (*r.iter().min().unwrap(), *r.iter().max().unwrap());
            util[k].push(u);
            ratio[k].push(total as f64 / base);
            spread[k].push((hi - lo) as f64 / (total as f64 / threads as f64));
        }
    }
    println!("| discipline | work / capacity | work / kernel's | thread spread (max-min)/mean |");
    println!("|---|---|---|---|");
    for (k, (name, _)) in kinds.iter().enumerate() {
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} |",
            median(util[k].clone()),
            median(ratio[k].clone()),
            median(spread[k].clone())
        );
    }
    println!(
        "hand-overs: unpinned {}, pinned {}",
        unpinned.rotations(),
        pinned.rotations()
    );
}

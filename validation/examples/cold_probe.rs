//! How much longer a compute step takes after its thread idled than back to back: for a
//! few shapes of each kind, the median of 7 runs after sleeping `g` ms, minus the median
//! of 7 back to back (the evidence for `--keep-warm`, `validation/src/warm.rs`).
//!
//! `cargo run --release -p moonagent-validation --example cold_probe`; `KEEP=1` runs the
//! backend's `WarmKeeper` beside it, `SPIN=n` starts `n` idle-priority threads that keep
//! the cores busy without touching memory (to tell cache loss from the cores' idle states).
use std::time::{Duration, Instant};

use moonagent_core::serve::Mode;
use moonagent_models::ModelSpec;
use moonagent_validation::backend::{Executor, Step};
use moonagent_validation::compute::CpuCompute;
use moonagent_validation::exec::ComputeExecutor;
use moonagent_validation::study::cpu_config;
use moonagent_validation::warm::{idle_priority, DEFAULT_INTERVAL};

fn main() {
    let spec = ModelSpec::resolve(&cpu_config(Mode::B0).model).expect("the runs' model");
    let mut ex = ComputeExecutor::new(CpuCompute::new(&spec, 7).expect("model"), 1);
    if std::env::var_os("KEEP").is_some() {
        ex = ex.keep_warm(DEFAULT_INTERVAL).expect("keeper");
        let k = ex.keeper().expect("the CPU backend has weights to keep");
        println!("keeper: {} MB a pass", k.bytes() >> 20);
    }
    let spin: usize = std::env::var("SPIN")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    for _ in 0..spin {
        std::thread::spawn(|| {
            idle_priority();
            loop {
                std::hint::spin_loop();
            }
        });
    }
    let decode = |batch: u32, ctx: u64| Step::Decode {
        batch,
        ctx_sum: u64::from(batch) * ctx,
        extra: vec![],
    };
    let steps = [
        (
            "encode 256",
            Step::Encode {
                tokens: vec![256],
                contents: vec![0],
            },
        ),
        (
            "encode 64",
            Step::Encode {
                tokens: vec![64],
                contents: vec![0],
            },
        ),
        ("prefill 256", Step::Prefill(vec![(256, 0)])),
        ("prefill 64", Step::Prefill(vec![(64, 0)])),
        ("decode 1x256", decode(1, 256)),
        ("decode 4x256", decode(4, 256)),
    ];
    let gaps = [0u64, 2, 5, 10, 20, 50, 100, 300];
    println!("step: back to back ms | after an idle gap: extra ms");
    for (name, s) in &steps {
        let mut row = vec![];
        for &g in &gaps {
            ex.run(0, s).expect("step");
            let mut v: Vec<f64> = (0..7)
                .map(|_| {
                    std::thread::sleep(Duration::from_millis(g));
                    let t = Instant::now();
                    ex.run(0, s).expect("step");
                    t.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            v.sort_by(f64::total_cmp);
            row.push(v[3]);
        }
        print!("{name:12} {:7.2} |", row[0]);
        for (g, x) in gaps.iter().zip(&row).skip(1) {
            print!(" {g} ms: {:+6.2}", x - row[0]);
        }
        println!();
    }
}

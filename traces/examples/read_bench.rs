//! Read a trace and print its read throughput: `cargo run --release -p moonagent-traces
//! --example read_bench -- FILE [FILE ...]`. Measure peak memory around it with
//! `/usr/bin/time -v`. Wall-clock figures go to stdout here because this is a benchmark,
//! not a result that must be byte-identical.

use std::time::Instant;

use moonagent_traces::TraceReader;

fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: read_bench FILE [FILE ...]");
        std::process::exit(2);
    }
    for f in files {
        let t0 = Instant::now();
        let reader = match TraceReader::open(&f) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let (mut n, mut tokens, mut blocks, mut images) = (0u64, 0u64, 0u64, 0u64);
        for r in reader {
            match r {
                Ok(r) => {
                    n += 1;
                    tokens += u64::from(r.prompt_tokens);
                    blocks += r.prompt_blocks.len() as u64;
                    images += r.images.len() as u64;
                }
                Err(e) => {
                    eprintln!("{e}");
                    std::process::exit(1);
                }
            }
        }
        let s = t0.elapsed().as_secs_f64();
        println!(
            "{f}: {n} requests in {s:.3} s = {:.0} requests/s ({tokens} prompt tokens, {blocks} block refs, {images} images)",
            n as f64 / s
        );
    }
}

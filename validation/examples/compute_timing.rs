//! Wall-clock timing of `CpuCompute` on the tiny spec (release build; best of N runs, N
//! the first argument, default 10): prefill of 256 new tokens over 0, 512 and 1024 cached,
//! a decode iteration of batch 8 at context 512, the encode of a 256-token image, and the
//! LLM attention's marginal rate (its FLOPs over the extra prefill time of cached context),
//! and the time of a long prefill and an encode with attention on every core over serial.
//! No assertions: timings depend on the machine.
//!
//! `cargo run --release -p moonagent-validation --example compute_timing`
use std::time::Instant;

use moonagent_models::ModelSpec;
use moonagent_validation::compute::{
    Compute, CpuCompute, DecodeSeq, ImageInput, PrefillChunk, Rows,
};

fn best<F: FnMut()>(reps: usize, mut f: F) -> f64 {
    let mut b = f64::INFINITY;
    for _ in 0..reps {
        let t = Instant::now();
        f();
        b = b.min(t.elapsed().as_secs_f64() * 1e3);
    }
    b
}

fn main() {
    let reps: usize = std::env::args().nth(1).map_or(10, |a| a.parse().unwrap());
    let spec = ModelSpec::by_name("qwen2.5-vl-tiny").unwrap();
    let c = CpuCompute::new(&spec, 7).unwrap();
    let pt = 16u32;
    let pages: Vec<u32> = (0..100).collect();
    let mut kv = c.new_kv(1000, pt).unwrap();
    // Fill 1024 cached tokens.
    c.prefill(
        &mut kv,
        &[PrefillChunk {
            pages: &pages,
            cached: 0,
            inputs: &[Rows::Text {
                seed: 1,
                count: 1024,
            }],
        }],
    )
    .unwrap();
    let mut times = Vec::new();
    for cached in [0u32, 512, 1024] {
        let ms = best(reps, || {
            c.prefill(
                &mut kv,
                &[PrefillChunk {
                    pages: &pages,
                    cached,
                    inputs: &[Rows::Text {
                        seed: 2,
                        count: 256,
                    }],
                }],
            )
            .unwrap();
        });
        println!("prefill 256 over {cached}: {ms:.2} ms");
        times.push((cached, ms));
    }
    // LLM attention FLOPs of 256 new rows over `cached`: two GEMMs of 2 FLOPs per
    // (query head, visible key, head dimension).
    let l = &spec.llm;
    let per_key =
        4.0 * f64::from(l.num_hidden_layers * l.num_attention_heads) * spec.head_dim() as f64;
    let visible = |cached: u32| 256.0 * f64::from(cached) + 256.0 * 257.0 / 2.0;
    let (_, t0) = times[0];
    for &(cached, ms) in &times[1..] {
        let extra = per_key * (visible(cached) - visible(0));
        println!(
            "  attention over {cached} cached: {:.2} GFLOP more in {:.2} ms more: {:.1} GFLOP/s",
            extra / 1e9,
            ms - t0,
            extra / 1e6 / (ms - t0)
        );
    }
    c.prefill(
        &mut kv,
        &[PrefillChunk {
            pages: &pages,
            cached: 0,
            inputs: &[Rows::Text {
                seed: 1,
                count: 1024,
            }],
        }],
    )
    .unwrap();
    let tables: Vec<Vec<u32>> = (0..8)
        .map(|i| (100 + i * 40..100 + (i + 1) * 40).collect())
        .collect();
    for t in &tables {
        c.prefill(
            &mut kv,
            &[PrefillChunk {
                pages: t,
                cached: 0,
                inputs: &[Rows::Text {
                    seed: 3,
                    count: 512,
                }],
            }],
        )
        .unwrap();
    }
    let batch: Vec<DecodeSeq> = tables
        .iter()
        .map(|t| DecodeSeq {
            pages: t,
            len: 512,
            token: 5,
        })
        .collect();
    let ms = best(4 * reps, || {
        c.decode(&mut kv, &batch).unwrap();
    });
    println!("decode batch 8 at 512: {ms:.2} ms");
    let ms = best(reps, || {
        c.encode(&[ImageInput {
            visual_tokens: 256,
            seed: 4,
        }])
        .unwrap();
    });
    println!("encode 256-token image: {ms:.2} ms");

    // Attention on every core (the CUDA backend's host side) against one head after another,
    // alternating, medians: the whole call's time, so the GEMMs (here on the host too)
    // dilute the attention's speed-up.
    let par = CpuCompute::new(&spec, 7)
        .unwrap()
        .with_parallel_attention(true);
    let prefill = |m: &CpuCompute, kv: &mut moonagent_validation::compute::KvArena| {
        m.prefill(
            kv,
            &[PrefillChunk {
                pages: &pages,
                cached: 1024,
                inputs: &[Rows::Text {
                    seed: 2,
                    count: 256,
                }],
            }],
        )
        .unwrap();
    };
    let encode = |m: &CpuCompute| {
        m.encode(&[ImageInput {
            visual_tokens: 256,
            seed: 4,
        }])
        .unwrap();
    };
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        f();
        t.elapsed().as_secs_f64() * 1e3
    };
    let (mut ps, mut pp, mut es, mut ep) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        ps.push(time(&mut || prefill(&c, &mut kv)));
        pp.push(time(&mut || prefill(&par, &mut kv)));
        es.push(time(&mut || encode(&c)));
        ep.push(time(&mut || encode(&par)));
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (ps, pp, es, ep) = (median(ps), median(pp), median(es), median(ep));
    println!(
        "parallel attention on {cores} cores, median of {reps}: prefill 256 over 1024 \
         {pp:.2} ms vs {ps:.2} serial ({:.2}x), encode 256-token image {ep:.2} vs {es:.2} ({:.2}x)",
        pp / ps,
        ep / es
    );
}

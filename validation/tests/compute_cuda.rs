//! The `cuda` feature's `CudaCompute`: on a machine without an NVIDIA driver (or GPU),
//! construction is a `NoDevice` error, not a panic; with one, it computes what the CPU
//! backend computes, up to GEMM rounding, also from several threads at once.
#![cfg(feature = "cuda")]

use moonagent_models::ModelSpec;
use moonagent_validation::compute::{
    Compute, ComputeError, CpuCompute, CudaCompute, ImageInput, PrefillChunk, Rows,
};

fn bf16s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(2)
        .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect()
}

#[test]
fn cuda_compute_is_a_clear_error_without_a_gpu_or_matches_the_cpu() {
    let spec = ModelSpec::by_name("qwen2.5-vl-tiny").unwrap();
    let gpu = match CudaCompute::new(&spec, 7, 0) {
        Err(ComputeError::NoDevice(msg)) => {
            let shown = ComputeError::NoDevice(msg.clone()).to_string();
            assert!(shown.starts_with("no GPU available: "), "{shown}");
            assert!(!msg.is_empty());
            // The error path is what this machine can check; the comparison needs a GPU.
            eprintln!("CudaCompute::new: {shown}");
            return;
        }
        Err(e) => panic!("expected NoDevice or a device, got {e}"),
        Ok(gpu) => gpu,
    };
    let cpu = CpuCompute::new(&spec, 7).unwrap();
    let img = [ImageInput {
        visual_tokens: 16,
        seed: 3,
    }];
    let c = cpu.encode(&img).unwrap();
    let close = |g: &[Vec<u8>]| {
        assert_eq!(g[0].len(), c[0].len());
        for (a, b) in bf16s(&g[0]).iter().zip(bf16s(&c[0])) {
            assert!((a - b).abs() <= 0.05 * b.abs().max(0.1), "{a} vs {b}");
        }
    };
    close(&gpu.encode(&img).unwrap());
    // Callers at once each take a stream and cuBLAS handle of their own: the same results.
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..4).map(|_| s.spawn(|| gpu.encode(&img))).collect();
        for r in runs {
            close(&r.join().unwrap().unwrap());
        }
    });
    let pages = [0u32, 1];
    let inputs = [Rows::Text { seed: 1, count: 20 }];
    let chunk = [PrefillChunk {
        pages: &pages,
        cached: 0,
        inputs: &inputs,
    }];
    let mut kv = gpu.new_kv(2, 16).unwrap();
    let t = gpu.prefill(&mut kv, &chunk).unwrap();
    assert_eq!(t.len(), 1);
    assert!(t[0] < spec.llm.vocab_size);
}

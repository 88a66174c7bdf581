//! The embedding cache holds the encoder's own outputs (issue 12, item 2): on the real
//! backend an encode step names its images, the CPU encoder computes each from the image's
//! content, the engine commits exactly those bytes, and a later hit reads them back
//! through the validated path (checksum over the real bytes).

use std::collections::HashSet;
use std::sync::Arc;

use moonagent_core::serve::{images_of, Mode};
use moonagent_core::store::{Store, StoreKey};
use moonagent_models::ModelSpec;
use moonagent_validation::backend::{self, RunOptions};
use moonagent_validation::compute::{Compute, CpuCompute, ImageInput};
use moonagent_validation::exec::ComputeExecutor;
use moonagent_validation::measure::{engine, mem_store};
use moonagent_validation::study::{cpu_config, generate};

#[test]
fn the_cache_holds_the_encoders_own_outputs_and_hits_read_them_back_validated() {
    let spec = ModelSpec::resolve("qwen2.5-vl-tiny").unwrap();
    let (trace, bs) = generate(6, 10.0, 11).unwrap();
    let arrivals: Vec<u64> = trace.iter().map(|r| r.arrival_ns).collect();
    let cfg = cpu_config(Mode::B3);
    let exec = |workers| {
        Arc::new(ComputeExecutor::new(
            CpuCompute::new(&spec, 0).unwrap(),
            workers,
        ))
    };

    // Run 1 encodes every image and commits the outputs.
    let mut e = engine(&cfg, &trace, bs, mem_store(&cfg).unwrap()).unwrap();
    let w = e.workers();
    let m = backend::run(&mut e, &arrivals, exec(w), RunOptions::default()).unwrap();
    assert!(m.done.iter().all(|&d| d));
    assert!(m.counters.images_encoded > 0, "{:?}", m.counters);
    let (_, _, cache) = e.into_served();
    let c = cache.counters().clone();
    // Every committed output was read back through the validated path (checksum over the
    // real bytes) and validated.
    assert!(c.readback_hits > 0, "{c:?}");
    assert_eq!(c.readback_hits, c.readbacks, "a readback failed: {c:?}");
    assert_eq!(c.pairs_deleted, 0, "a pair failed validation: {c:?}");

    // What the encoder makes of every distinct image of the trace, computed directly.
    let direct = CpuCompute::new(&spec, 0).unwrap();
    let mut expected: HashSet<Vec<u8>> = HashSet::new();
    let mut distinct = HashSet::new();
    for r in &trace {
        for img in images_of(r) {
            if distinct.insert((img.content, img.tokens)) {
                let out = direct
                    .encode(&[ImageInput {
                        visual_tokens: img.tokens,
                        seed: img.content,
                    }])
                    .unwrap();
                expected.extend(out);
            }
        }
    }
    let mut store = cache.into_store();
    let blobs: Vec<StoreKey> = store
        .keys()
        .filter(|k| matches!(k, StoreKey::MmBlob(_)))
        .cloned()
        .collect();
    assert_eq!(blobs.len(), distinct.len(), "one blob per distinct image");
    for k in &blobs {
        let size = store.get_size_key(m.wall_ns, k).unwrap();
        let mut buf = vec![0u8; size as usize];
        store.get_into_key(m.wall_ns, k, &mut buf).unwrap();
        assert!(
            expected.contains(&buf),
            "blob {k} ({size} bytes) is not the encoder's output for any image of the trace"
        );
    }

    // Run 2, the same trace on that store: every image is a hit, read back validated.
    let mut e = engine(&cfg, &trace, bs, store).unwrap();
    let m2 = backend::run(&mut e, &arrivals, exec(w), RunOptions::default()).unwrap();
    assert!(m2.done.iter().all(|&d| d));
    assert_eq!(m2.counters.images_encoded, 0, "{:?}", m2.counters);
    assert_eq!(
        m2.counters.images_hit,
        m.counters.images_encoded + m.counters.images_hit,
        "{:?}",
        m2.counters
    );
}

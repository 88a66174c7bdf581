//! Embedding-cache benchmarks, each against a baseline measured in the same run.
//!
//! - `image_fp`: the image fingerprint of a processed pixel tensor (one-shot, and streamed
//!   row by row) vs a plain BLAKE2b-512 over the same bytes. Target: >= 0.95x throughput.
//! - `validated_hit`: a validated hit of an 8.6 MB embedding (1196 visual tokens x 7168 B)
//!   from a `MemStore` (meta read, envelope decode and checks, blob copy into the receive
//!   buffer, checksum) with XXH3-64 and with BLAKE2b-64, vs a plain copy of the same bytes.
//!   Target: <= 1.2x the copy with XXH3-64. `lookup_mac`: the same hit with keyed
//!   fingerprints and the envelope MAC on (keyed BLAKE2b-256 over the envelope's fields
//!   and the 8.6 MB blob), priced against the unkeyed hit in the summary.
//!
//! - `size_only`: the simulator's per-image calls (over a `MemStore<String>` here; the
//!   simulator uses `MemStore<StoreKey>`), per call:
//!   `lookup_size_only` hits (cycling over 256 committed images), `readback_size_only`
//!   of those, `commit_size_only` re-commits, and a commit of a never-seen image followed
//!   by its readback (request-scoped keys); each with the envelope memo on (`memo`, the
//!   default) and off (`no_memo`).
//!
//! After the groups run, the medians are read back from criterion's estimates and the
//! ratios printed (`cargo bench -p moonagent-core --bench mm_cache`).

use std::hint::black_box;
use std::path::PathBuf;

use blake2::{Blake2b512, Digest};
use criterion::{BenchmarkId, Criterion, Throughput};
use moonagent_core::fingerprint::{
    image_fingerprint, Dtype, GridThw, ImageHasher, ModelParts, TenantSecret,
};
use moonagent_core::mm_cache::demo::toy_embedding;
use moonagent_core::mm_cache::{ChecksumAlgo, Lookup, MmCache, ModelCtx};
use moonagent_core::rng::Rng;
use moonagent_core::store::{MemStore, MemStoreConfig};
use xxhash_rust::xxh3::Xxh3Default;

/// The chart image of the demo session: grid 1x46x104, 1196 visual tokens after merge.
const GRID: GridThw = GridThw::new(1, 46, 104);
/// A screenshot's processed pixels for the fingerprint bench (1872 patches, 8.8 MB).
const PIXEL_GRID: GridThw = GridThw::new(1, 36, 52);
/// Qwen2-VL processed pixels: one row of 3*2*14*14 f32 per patch.
const ROW: u64 = 1176;
const HIDDEN: u64 = 3584;

fn pixels() -> Vec<u8> {
    let patches = PIXEL_GRID.patches().unwrap_or(0);
    let mut rng = Rng::new(1);
    (0..patches * ROW * 4)
        .map(|_| rng.next_u64() as u8)
        .collect()
}

fn bench_image_fp(c: &mut Criterion) {
    let parts = ModelParts::example("bench");
    let model = parts.fingerprint().expect("valid parts");
    let px = pixels();
    let shape = [PIXEL_GRID.patches().unwrap_or(0), ROW];
    let row_bytes = (ROW * 4) as usize;
    let mut g = c.benchmark_group("image_fp");
    g.throughput(Throughput::Bytes(px.len() as u64));
    g.bench_function("blake2b512_plain", |b| {
        b.iter(|| black_box(Blake2b512::digest(black_box(&px))))
    });
    g.bench_function("image_fingerprint", |b| {
        b.iter(|| {
            black_box(image_fingerprint(
                &model,
                PIXEL_GRID,
                &shape,
                Dtype::F32,
                black_box(&px),
            ))
        })
    });
    g.bench_function("image_hasher_by_row", |b| {
        b.iter(|| {
            let mut h = ImageHasher::new(&model, PIXEL_GRID, &shape, Dtype::F32).expect("valid");
            for row in black_box(&px).chunks(row_bytes) {
                h.update(row);
            }
            black_box(h.finish())
        })
    });
    g.finish();
}

fn bench_validated_hit(c: &mut Criterion) {
    let mut g = c.benchmark_group("validated_hit");
    let base = ModelCtx::new(ModelParts::example("bench"), HIDDEN).expect("valid ctx");
    let exp_len = base.expect(GRID).expect("grid").byte_len as usize;
    g.throughput(Throughput::Bytes(exp_len as u64));
    let fp = moonagent_core::fingerprint::ImageFp([3; 32]);
    let mut src = vec![0u8; exp_len];
    toy_embedding(&fp, &mut src);
    let mut dst = vec![0u8; exp_len];
    g.bench_function("plain_copy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    // Diagnostics: the checksum alone, and a chunked copy that hashes each chunk while it
    // is still in cache (what a streaming store read would allow; see the report).
    g.bench_function("xxh3_64_only", |b| {
        b.iter(|| black_box(ChecksumAlgo::Xxh3_64.compute(black_box(&src))))
    });
    g.bench_function("fused_copy_xxh3_64k", |b| {
        b.iter(|| {
            let mut h = Xxh3Default::new();
            for (d, s) in dst
                .chunks_mut(64 << 10)
                .zip(black_box(&src).chunks(64 << 10))
            {
                d.copy_from_slice(s);
                h.update(d);
            }
            black_box(h.digest())
        })
    });
    for algo in [ChecksumAlgo::Xxh3_64, ChecksumAlgo::Blake2b64] {
        let ctx = base.clone().with_checksum(algo);
        let store: MemStore<String> =
            MemStore::new(MemStoreConfig::with_capacity(64 << 20)).expect("cfg");
        let mut cache = MmCache::new(store);
        cache.commit(0, &ctx, fp, GRID, &src).expect("commit");
        let exp = ctx.expect(GRID).expect("grid");
        let mut recv = vec![0u8; exp_len];
        // Checked up front, so the check holds when a filter skips the benchmark.
        let r = cache.lookup(0, &fp, &exp, &mut recv);
        assert!(matches!(r, Ok(Lookup::Hit { .. })));
        assert_eq!(recv, src);
        g.bench_with_input(BenchmarkId::new("lookup", algo.name()), &algo, |b, _| {
            b.iter(|| {
                let r = cache.lookup(0, &fp, &exp, black_box(&mut recv));
                assert!(matches!(r, Ok(Lookup::Hit { .. })));
                black_box(&recv);
            })
        });
    }
    // The authenticated hit: keyed fingerprints and MAC on, XXH3-64 checksum as above.
    let secret = TenantSecret::new([7; 32]);
    let ctx = base
        .clone()
        .with_keyed_fingerprints(secret.clone())
        .with_mac(secret);
    let store: MemStore<String> =
        MemStore::new(MemStoreConfig::with_capacity(64 << 20)).expect("cfg");
    let mut cache = MmCache::new(store);
    cache.commit(0, &ctx, fp, GRID, &src).expect("commit");
    let exp = ctx.expect(GRID).expect("grid");
    let mut recv = vec![0u8; exp_len];
    let r = cache.lookup(0, &fp, &exp, &mut recv);
    assert!(matches!(r, Ok(Lookup::Hit { .. })));
    assert_eq!(recv, src);
    g.bench_function(BenchmarkId::new("lookup_mac", "xxh3_64"), |b| {
        b.iter(|| {
            let r = cache.lookup(0, &fp, &exp, black_box(&mut recv));
            assert!(matches!(r, Ok(Lookup::Hit { .. })));
            black_box(&recv);
        })
    });
    g.finish();
}

fn bench_size_only(c: &mut Criterion) {
    use moonagent_core::fingerprint::ImageFp;
    let mut g = c.benchmark_group("size_only");
    let ctx = ModelCtx::new(ModelParts::example("bench"), HIDDEN).expect("valid ctx");
    let exp = ctx.expect(GRID).expect("grid");
    let fp_of = |i: u64| {
        let mut b = [0u8; 32];
        b[..8].copy_from_slice(&i.to_le_bytes());
        b[8..16].copy_from_slice(&i.wrapping_mul(0x9e37_79b9_7f4a_7c15).to_le_bytes());
        ImageFp(b)
    };
    const N: u64 = 256;
    // With the envelope memo (the default) and without it (JSON on every call).
    for (memo, name) in [(true, "memo"), (false, "no_memo")] {
        let store: MemStore<String> =
            MemStore::new(MemStoreConfig::with_capacity(1 << 50)).expect("cfg");
        let mut cache = MmCache::new(store);
        cache.set_envelope_memo(memo);
        for i in 0..N {
            cache
                .commit_size_only(0, &ctx, fp_of(i), GRID)
                .expect("commit");
        }
        let mut i = 0u64;
        g.bench_function(BenchmarkId::new("lookup_hit", name), |b| {
            b.iter(|| {
                i = (i + 1) % N;
                let r = cache.lookup_size_only(0, &fp_of(i), &exp);
                assert!(matches!(r, Ok(Lookup::Hit { .. })));
            })
        });
        g.bench_function(BenchmarkId::new("readback", name), |b| {
            b.iter(|| {
                i = (i + 1) % N;
                let r = cache.readback_size_only(0, &fp_of(i), &exp);
                assert!(matches!(r, Ok(Lookup::Hit { .. })));
            })
        });
        g.bench_function(BenchmarkId::new("commit", name), |b| {
            b.iter(|| {
                i = (i + 1) % N;
                black_box(
                    cache
                        .commit_size_only(0, &ctx, fp_of(i), GRID)
                        .expect("commit"),
                );
            })
        });
        // Request-scoped keys: a never-seen image committed, then read back.
        let store: MemStore<String> =
            MemStore::new(MemStoreConfig::with_capacity(1 << 62)).expect("cfg");
        let mut fresh = MmCache::new(store);
        fresh.set_envelope_memo(memo);
        let mut j = 1u64 << 40;
        g.bench_function(BenchmarkId::new("commit_new_then_readback", name), |b| {
            b.iter(|| {
                j += 1;
                let fp = fp_of(j);
                black_box(fresh.commit_size_only(0, &ctx, fp, GRID).expect("commit"));
                let r = fresh.readback_size_only(0, &fp, &exp);
                assert!(matches!(r, Ok(Lookup::Hit { .. })));
            })
        });
    }
    g.finish();
}

/// Where criterion writes (its own rule, made explicit so the summary can read it back).
fn output_dir() -> PathBuf {
    if let Some(h) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(h);
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(t).join("criterion");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/criterion")
}

fn median_ns(dir: &std::path::Path, id: &str) -> Option<f64> {
    let text = std::fs::read_to_string(dir.join(id).join("new/estimates.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn summary(dir: &std::path::Path) {
    let m = |id: &str| median_ns(dir, id);
    println!("\nmm_cache bench summary (medians from this run)");
    let pairs = [
        (
            "image_fp/image_fingerprint",
            "image_fp/blake2b512_plain",
            "throughput vs BLAKE2b-512 (target >= 0.95)",
            true,
        ),
        (
            "image_fp/image_hasher_by_row",
            "image_fp/blake2b512_plain",
            "streamed by row vs BLAKE2b-512",
            true,
        ),
        (
            "validated_hit/lookup/xxh3_64",
            "validated_hit/plain_copy",
            "time vs plain copy, XXH3-64 (target <= 1.2)",
            false,
        ),
        (
            "validated_hit/lookup/blake2b_64",
            "validated_hit/plain_copy",
            "time vs plain copy, BLAKE2b-64",
            false,
        ),
        (
            "validated_hit/lookup_mac/xxh3_64",
            "validated_hit/lookup/xxh3_64",
            "MAC'd (keyed fp + BLAKE2b-256 MAC) vs unkeyed validated hit",
            false,
        ),
        (
            "validated_hit/xxh3_64_only",
            "validated_hit/plain_copy",
            "XXH3-64 alone vs plain copy",
            false,
        ),
        (
            "validated_hit/fused_copy_xxh3_64k",
            "validated_hit/plain_copy",
            "chunked copy+XXH3-64 vs plain copy",
            false,
        ),
    ];
    for (a, b, what, inverse) in pairs {
        match (m(a), m(b)) {
            (Some(x), Some(y)) if x > 0.0 => {
                let ratio = if inverse { y / x } else { x / y };
                println!(
                    "  {a}: {:.3} ms, {b}: {:.3} ms -> {what}: {ratio:.3}x",
                    x / 1e6,
                    y / 1e6
                );
            }
            _ => println!("  {a} / {b}: not measured in this run"),
        }
    }
}

fn main() {
    let dir = output_dir();
    let mut c = Criterion::default()
        .output_directory(&dir)
        .configure_from_args();
    bench_image_fp(&mut c);
    bench_validated_hit(&mut c);
    bench_size_only(&mut c);
    c.final_summary();
    // Without `--bench` (e.g. under `cargo test`) criterion only smoke-tests each
    // benchmark and writes no estimates: a summary would show a previous run's numbers.
    if std::env::args().any(|a| a == "--bench") {
        summary(&dir);
    }
}

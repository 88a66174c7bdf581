//! Fingerprints: every part matters, nothing else does, and inputs are validated.

use moonagent_core::fingerprint::{
    image_fingerprint, image_fingerprint_keyed, Dtype, FingerprintError, GridThw, ImageFp,
    ImageHasher, ModelFp, ModelParts, TenantSecret,
};
use proptest::prelude::*;

const GRID: GridThw = GridThw::new(1, 4, 6);
const SHAPE: [u64; 2] = [24, 6];

fn pixels() -> Vec<u8> {
    (0..24 * 6 * 4)
        .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect()
}

fn model(p: &ModelParts) -> ModelFp {
    p.fingerprint().expect("valid parts")
}

fn image(p: &ModelParts) -> ImageFp {
    image_fingerprint(&model(p), GRID, &SHAPE, Dtype::F32, &pixels()).expect("valid")
}

fn base() -> ModelParts {
    ModelParts::example("alice")
}

/// Changing `edit` changes both the model and the image fingerprint.
fn assert_part_matters(what: &str, edit: impl Fn(&mut ModelParts)) {
    let a = base();
    let mut b = base();
    edit(&mut b);
    assert_ne!(model(&a), model(&b), "{what}: model fp unchanged");
    assert_ne!(image(&a), image(&b), "{what}: image fp unchanged");
}

#[test]
fn changing_tenant_changes_fingerprint() {
    assert_part_matters("tenant", |p| p.tenant = "bob".into());
}

#[test]
fn changing_dtype_changes_fingerprint() {
    assert_part_matters("dtype", |p| p.dtype = Dtype::F16);
}

#[test]
fn changing_quantization_changes_fingerprint() {
    assert_part_matters("quantization", |p| p.quantization = "fp8".into());
}

#[test]
fn changing_revision_changes_fingerprint() {
    assert_part_matters("model_snapshot", |p| {
        p.model_snapshot = "0000000000000000000000000000000000000001".into()
    });
}

#[test]
fn changing_grid_changes_fingerprint() {
    let m = model(&base());
    let px = pixels();
    let a = image_fingerprint(&m, GRID, &SHAPE, Dtype::F32, &px).expect("valid");
    for g in [
        GridThw::new(1, 6, 4),
        GridThw::new(2, 2, 6),
        GridThw::new(1, 4, 7),
    ] {
        let b = image_fingerprint(&m, g, &SHAPE, Dtype::F32, &px).expect("valid");
        assert_ne!(a, b, "grid {g:?}");
    }
}

#[test]
fn changing_one_pixel_byte_changes_fingerprint() {
    let m = model(&base());
    let px = pixels();
    let a = image_fingerprint(&m, GRID, &SHAPE, Dtype::F32, &px).expect("valid");
    for i in [0, 1, px.len() / 2, px.len() - 1] {
        let mut q = px.clone();
        q[i] ^= 1;
        let b = image_fingerprint(&m, GRID, &SHAPE, Dtype::F32, &q).expect("valid");
        assert_ne!(a, b, "pixel byte {i}");
    }
}

#[test]
fn changing_any_other_model_part_changes_fingerprint() {
    type Edit = fn(&mut ModelParts);
    let edits: [(&str, Edit); 10] = [
        ("processor_version", |p| p.processor_version.push('1')),
        ("visual_adapter", |p| p.visual_adapter = "lora-7".into()),
        ("spatial_merge_size", |p| p.spatial_merge_size = 1),
        ("patch_size", |p| p.patch_size = 16),
        ("min_pixels", |p| p.min_pixels += 1),
        ("max_pixels", |p| p.max_pixels += 1),
        ("parallel.tp", |p| p.parallel.tp = 2),
        ("parallel.dp", |p| p.parallel.dp = 2),
        ("storage_layout", |p| p.storage_layout = "paged".into()),
        ("tensor_layout", |p| p.tensor_layout = "col_major".into()),
    ];
    for (what, edit) in edits {
        assert_part_matters(what, edit);
    }
}

#[test]
fn pixel_shape_and_dtype_are_part_of_the_image_fingerprint() {
    let m = model(&base());
    let px = pixels();
    let a = image_fingerprint(&m, GRID, &SHAPE, Dtype::F32, &px).expect("valid");
    let b = image_fingerprint(&m, GRID, &[6, 24], Dtype::F32, &px).expect("valid");
    let c = image_fingerprint(&m, GRID, &[48, 6], Dtype::Bf16, &px).expect("valid");
    let d = image_fingerprint(&m, GRID, &[24 * 6 * 4], Dtype::U8, &px).expect("valid");
    let e = image_fingerprint(&m, GRID, &[24 * 6 * 4], Dtype::I8, &px).expect("valid");
    let all = [a, b, c, d, e];
    for i in 0..all.len() {
        for j in i + 1..all.len() {
            assert_ne!(all[i], all[j], "{i} vs {j}");
        }
    }
}

#[test]
fn length_prefixes_keep_adjacent_fields_apart() {
    let mut a = base();
    a.quantization = "ab".into();
    a.visual_adapter = "c".into();
    let mut b = base();
    b.quantization = "a".into();
    b.visual_adapter = "bc".into();
    assert_ne!(model(&a), model(&b));
}

#[test]
fn snapshot_must_be_40_hex_and_case_does_not_matter() {
    for bad in [
        "",
        "abc",
        &"a".repeat(39),
        &"a".repeat(41),
        &format!("{}g", "a".repeat(39)),
    ] {
        let mut p = base();
        p.model_snapshot = bad.to_string();
        match p.fingerprint() {
            Err(FingerprintError::InvalidField { field, .. }) => {
                assert_eq!(field, "model_snapshot")
            }
            other => panic!("{bad:?}: expected an error naming model_snapshot, got {other:?}"),
        }
    }
    let mut upper = base();
    upper.model_snapshot = upper.model_snapshot.to_uppercase();
    assert_eq!(model(&upper), model(&base()));
    assert_eq!(upper.normalized().expect("valid"), base());
}

#[test]
fn other_invalid_parts_name_their_field() {
    type Edit = fn(&mut ModelParts);
    let cases: [(&str, Edit); 5] = [
        ("spatial_merge_size", |p| p.spatial_merge_size = 0),
        ("patch_size", |p| p.patch_size = 0),
        ("min_pixels", |p| p.min_pixels = p.max_pixels + 1),
        ("parallel.tp", |p| p.parallel.tp = 0),
        ("parallel.dp", |p| p.parallel.dp = 0),
    ];
    for (name, edit) in cases {
        let mut p = base();
        edit(&mut p);
        match p.fingerprint() {
            Err(FingerprintError::InvalidField { field, .. }) => assert_eq!(field, name),
            other => panic!("{name}: got {other:?}"),
        }
    }
    // Each bound's edge is valid: one pixel range, and sizes and degrees of 1.
    let mut edge = base();
    edge.min_pixels = edge.max_pixels;
    edge.spatial_merge_size = 1;
    edge.patch_size = 1;
    edge.parallel = moonagent_core::fingerprint::ParallelLayout { tp: 1, dp: 1 };
    assert!(edge.fingerprint().is_ok(), "{edge:?}");
}

/// Keyed fingerprints' test secret: bytes 0, 1, ..., 31.
const KEY: [u8; 32] = {
    let mut k = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        k[i] = i as u8;
        i += 1;
    }
    k
};

#[test]
fn fingerprints_are_pinned() {
    // Pins the canonical encoding: a change here invalidates every cached embedding.
    // `scripts/check_fingerprints.py` (run by scripts/test.sh) derives the same three
    // values with Python's hashlib from the documented encoding.
    assert_eq!(model(&base()).to_string(), PINNED_MODEL_FP);
    assert_eq!(image(&base()).to_string(), PINNED_IMAGE_FP);
    let keyed = image_fingerprint_keyed(
        &TenantSecret::new(KEY),
        &model(&base()),
        GRID,
        &SHAPE,
        Dtype::F32,
        &pixels(),
    )
    .expect("valid");
    assert_eq!(keyed.to_string(), PINNED_KEYED_IMAGE_FP);
}

const PINNED_MODEL_FP: &str = "d4e26167b178b45268009f14dbbd16a4b40b77b3edae9e8329cad2156f2d3326";
const PINNED_IMAGE_FP: &str = "00862aae28ebf2093d031d91749336aa958c8d13a037b21758627b0526f6f7f9";
const PINNED_KEYED_IMAGE_FP: &str =
    "cc870012d09ec6e6d95952e3eb9acccaa2a2405f6a723578b0adec815972d17f";

#[test]
fn keyed_fingerprints_depend_on_the_secret_and_stream_like_plain_ones() {
    let m = model(&base());
    let px = pixels();
    let a = image_fingerprint_keyed(&TenantSecret::new(KEY), &m, GRID, &SHAPE, Dtype::F32, &px)
        .expect("valid");
    let mut other = KEY;
    other[31] ^= 1;
    let b = image_fingerprint_keyed(&TenantSecret::new(other), &m, GRID, &SHAPE, Dtype::F32, &px)
        .expect("valid");
    assert_ne!(a, b, "one key bit changes the fingerprint");
    assert_ne!(a, image(&base()), "keyed differs from plain");
    let mut h = ImageHasher::new_keyed(&TenantSecret::new(KEY), &m, GRID, &SHAPE, Dtype::F32)
        .expect("valid");
    for c in px.chunks(5) {
        h.update(c);
    }
    assert_eq!(h.finish(), Ok(a));
    assert_eq!(
        format!("{:?}", TenantSecret::new(KEY)),
        "TenantSecret(..)",
        "Debug never prints the secret"
    );
}

#[test]
fn streamed_length_must_match_the_declared_shape() {
    let m = model(&base());
    let mut h = ImageHasher::new(&m, GRID, &SHAPE, Dtype::F32).expect("valid");
    h.update(&pixels()[..10]);
    assert_eq!(
        h.finish(),
        Err(FingerprintError::PixelLength {
            expected: 576,
            got: 10
        })
    );
    assert!(ImageHasher::new(&m, GRID, &[u64::MAX, 2], Dtype::F32).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None, ..ProptestConfig::default() })]

    /// Chunking does not matter; flipping any single bit does.
    #[test]
    fn streaming_is_chunk_invariant_and_any_bit_flip_changes_the_fp(
        px in proptest::collection::vec(any::<u8>(), 1..600),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        flip in any::<prop::sample::Index>(),
        bit in 0u8..8,
    ) {
        let m = model(&base());
        let shape = [px.len() as u64];
        let one = image_fingerprint(&m, GRID, &shape, Dtype::U8, &px).expect("valid");
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(px.len())).collect();
        at.sort();
        let mut h = ImageHasher::new(&m, GRID, &shape, Dtype::U8).expect("valid");
        let mut prev = 0;
        for a in at.into_iter().chain([px.len()]) {
            h.update(&px[prev..a]);
            prev = a;
        }
        prop_assert_eq!(h.finish().expect("valid"), one);
        let mut q = px.clone();
        q[flip.index(px.len())] ^= 1 << bit;
        let other = image_fingerprint(&m, GRID, &shape, Dtype::U8, &q).expect("valid");
        prop_assert_ne!(other, one);
    }
}

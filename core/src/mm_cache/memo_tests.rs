//! The envelope memo is a pure speed-up: with it on, every result, counter, store
//! operation and stored byte is what the memo-off path (plain `Envelope::encode` /
//! `Envelope::decode` on every call) gives, on valid, foreign and corrupt meta alike; and a
//! memo hit is still validated against the reader's [`Expected`].

use proptest::prelude::*;

use super::envelope::HEADER_LEN;
use super::*;
use crate::store::{MemStore, MemStoreConfig, MS};

type Cache = MmCache<MemStore<String>>;

const GRID: GridThw = GridThw::new(1, 4, 8);
const GRID2: GridThw = GridThw::new(1, 8, 8);
const HIDDEN: u64 = 16;
const FP: ImageFp = ImageFp([0x5a; 32]);
const OTHER: ImageFp = ImageFp([0x17; 32]);

fn ctx(tenant: &str) -> ModelCtx {
    ModelCtx::new(ModelParts::example(tenant), HIDDEN).expect("valid ctx")
}

fn cache(memo: bool) -> Cache {
    let store = MemStore::new(MemStoreConfig::with_capacity(1 << 30)).expect("valid config");
    let mut c = MmCache::new(store);
    c.set_envelope_memo(memo);
    c
}

/// Commit size-only pairs of `OTHER` for both tenants and grids (teaches the memo their
/// templates), then `FP` under `alice`/`GRID`; returns the stored meta of each, in order.
fn warm(c: &mut Cache) -> Vec<Vec<u8>> {
    let mut metas = Vec::new();
    for (tenant, grid, fp) in [
        ("alice", GRID, OTHER),
        ("alice", GRID2, OTHER),
        ("bob", GRID, OTHER),
        ("alice", GRID, FP),
    ] {
        let r = c.commit_size_only(0, &ctx(tenant), fp, grid);
        assert_eq!(r, Ok(CommitOutcome::Committed));
        metas.push(stored_meta(c, &fp).expect("meta committed"));
    }
    metas
}

fn stored_meta(c: &mut Cache, fp: &ImageFp) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; MAX_META_BYTES];
    let n = c.store_mut().get_into(0, &meta_key(fp), &mut buf).ok()?;
    buf.truncate(n as usize);
    Some(buf)
}

/// Replace the meta of `FP` with `meta` (its size-only blob stays).
fn plant(c: &mut Cache, meta: Vec<u8>) {
    let cfg = ReplicateConfig::of(DataType::EncoderOutput);
    let s = c.store_mut();
    let _ = s.remove(0, &meta_key(&FP), true);
    s.put(0, &meta_key(&FP), Payload::Bytes(meta), &cfg)
        .expect("put meta");
}

/// The lookup outcome `Envelope::decode` and `Expected::check` define for `meta` (blob
/// present, size-only, of the committed length).
fn reference(meta: &[u8], exp: &Expected<'_>, blob_len: u64) -> Lookup {
    match Envelope::decode(meta) {
        Err(EnvelopeError::SchemaMismatch { .. }) => Lookup::Miss(MissReason::SchemaMismatch),
        Err(_) => Lookup::Miss(MissReason::CorruptMeta),
        Ok(env) => match exp.check(&FP, &env) {
            Some(r) => Lookup::Miss(r),
            None if env.byte_len == blob_len => Lookup::Hit { len: blob_len },
            None => Lookup::Miss(MissReason::CorruptBlob),
        },
    }
}

type Observed = (
    Vec<Result<Lookup, CacheError>>,
    CacheCounters,
    crate::store::StoreStats,
    Option<Vec<u8>>,
);

/// Warm, plant `meta`, look it up four ways (twice size-only, a readback, a bytes
/// lookup), and report everything observable.
fn run(memo: bool, meta: &[u8], reader: &ModelCtx, grid: GridThw) -> (Vec<Vec<u8>>, Observed) {
    let mut c = cache(memo);
    let committed = warm(&mut c);
    plant(&mut c, meta.to_vec());
    let exp = reader.expect(grid).expect("grid");
    let mut recv = vec![0u8; exp.byte_len as usize];
    let outs = vec![
        c.lookup_size_only(MS, &FP, &exp),
        c.lookup_size_only(MS, &FP, &exp),
        c.readback_size_only(MS, &FP, &exp),
        c.lookup(MS, &FP, &exp, &mut recv),
    ];
    let meta_left = stored_meta(&mut c, &FP);
    let stats = c.store().stats().clone();
    (committed, (outs, c.counters().clone(), stats, meta_left))
}

#[derive(Debug, Clone)]
enum Edit {
    Flip(prop::sample::Index, u8),
    Truncate(prop::sample::Index),
    /// Overwrite a digit of the envelope's fingerprint hex.
    FpDigit(prop::sample::Index, prop::sample::Index),
    /// Recompute the frame checksum.
    Reframe,
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<prop::sample::Index>(), 1u8..=255).prop_map(|(i, x)| Edit::Flip(i, x)),
        1 => any::<prop::sample::Index>().prop_map(Edit::Truncate),
        3 => (any::<prop::sample::Index>(), any::<prop::sample::Index>())
            .prop_map(|(i, d)| Edit::FpDigit(i, d)),
        3 => Just(Edit::Reframe),
    ]
}

fn apply(m: &mut Vec<u8>, e: &Edit) {
    // `{"schema_version":1,"fp":"` then 64 hex digits.
    const FP_AT: usize = HEADER_LEN + 26;
    match e {
        Edit::Flip(i, x) if !m.is_empty() => {
            let i = i.index(m.len());
            m[i] ^= x;
        }
        Edit::Truncate(i) => {
            let n = i.index(m.len() + 1);
            m.truncate(n);
        }
        Edit::FpDigit(i, d) => {
            const DIGITS: &[u8] = b"0123456789abcdefABCDEFx";
            if let Some(b) = m.get_mut(FP_AT + i.index(64)) {
                *b = DIGITS[d.index(DIGITS.len())];
            }
        }
        Edit::Reframe if m.len() >= HEADER_LEN => {
            let sum = xxhash_rust::xxh3::xxh3_64(&m[HEADER_LEN..]);
            m[4..HEADER_LEN].copy_from_slice(&sum.to_le_bytes());
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, failure_persistence: None, ..ProptestConfig::default() })]

    /// Valid size-only meta (of `FP`, of `OTHER`, of another grid or tenant), mutated
    /// arbitrarily, read by a right or wrong reader: the memo-on cache behaves exactly as
    /// the memo-off one (results, counters, store statistics, what is left stored, bytes
    /// committed), and the first lookup is what a fresh `Envelope::decode` defines.
    #[test]
    fn memo_on_and_off_are_indistinguishable(
        source in 0usize..4,
        reader in 0usize..4,
        edits in proptest::collection::vec(edit(), 0..4),
    ) {
        let (tenant, grid, fp) = [
            ("alice", GRID, FP),
            ("alice", GRID, OTHER),
            ("alice", GRID2, FP),
            ("bob", GRID, FP),
        ][source];
        let src = ctx(tenant);
        let mut meta = src.expect(grid).expect("grid").envelope(fp, None).encode().expect("encode");
        for e in &edits {
            apply(&mut meta, e);
        }
        let (reader, rgrid) = [
            (ctx("alice"), GRID),
            (ctx("alice"), GRID2),
            (ctx("bob"), GRID),
            (ctx("alice").with_embed_dtype(Dtype::F32), GRID),
        ][reader].clone();
        let (committed_on, on) = run(true, &meta, &reader, rgrid);
        let (committed_off, off) = run(false, &meta, &reader, rgrid);
        prop_assert_eq!(&committed_on, &committed_off);
        prop_assert_eq!(&on, &off);
        let exp = reader.expect(rgrid).expect("grid");
        let blob_len = ctx("alice").expect(GRID).expect("grid").byte_len;
        prop_assert_eq!(on.0[0].clone(), Ok(reference(&meta, &exp, blob_len)));
    }
}

#[test]
fn size_only_commits_store_exactly_the_encoded_envelope_and_hit_through_the_memo() {
    let mut c = cache(true);
    let alice = ctx("alice");
    let exp = alice.expect(GRID).expect("grid");
    for i in 0..20u8 {
        let fp = ImageFp([i; 32]);
        let r = c.commit_size_only(0, &alice, fp, GRID);
        assert_eq!(r, Ok(CommitOutcome::Committed));
        let want = exp.envelope(fp, None).encode().expect("encode");
        assert_eq!(stored_meta(&mut c, &fp), Some(want.clone()));
        // The memo knows this family and recognizes the frame: hits skip JSON.
        let t = c.memo.templates.get(&exp.template_key()).expect("template");
        assert_eq!(t.recognize(&want, &FpHex::of(&fp)), Some(true));
        assert_eq!(
            c.lookup_size_only(MS, &fp, &exp),
            Ok(Lookup::Hit { len: exp.byte_len })
        );
        assert_eq!(
            c.readback_size_only(MS, &fp, &exp),
            Ok(Lookup::Hit { len: exp.byte_len })
        );
    }
    assert_eq!(c.memo.templates.len(), 1);
    assert_eq!(c.counters().hits, 20);
    assert_eq!(c.counters().readback_hits, 20);
}

#[test]
fn a_memo_hit_is_still_validated_against_the_expectation() {
    let alice = ctx("alice");
    let exp = alice.expect(GRID).expect("grid");
    let exp2 = alice.expect(GRID2).expect("grid");
    let mut c = cache(true);
    warm(&mut c);
    // Same family, another fingerprint under FP's key: recognized by the template, and
    // still a key mismatch (which does not delete the pair).
    let foreign = exp.envelope(OTHER, None).encode().expect("encode");
    let t = c.memo.templates.get(&exp.template_key()).expect("template");
    assert_eq!(t.recognize(&foreign, &FpHex::of(&FP)), Some(false));
    plant(&mut c, foreign);
    for _ in 0..2 {
        assert_eq!(
            c.lookup_size_only(MS, &FP, &exp),
            Ok(Lookup::Miss(MissReason::KeyMismatch))
        );
    }
    // A reader of another grid (whose family the memo also knows) misses on the grid.
    plant(&mut c, exp.envelope(FP, None).encode().expect("encode"));
    assert!(c.memo.templates.contains_key(&exp2.template_key()));
    assert_eq!(
        c.lookup_size_only(MS, &FP, &exp2),
        Ok(Lookup::Miss(MissReason::GridMismatch))
    );
    // Another tenant's reader misses on the tenant; the right reader still hits.
    let bob = ctx("bob");
    assert_eq!(
        c.lookup_size_only(MS, &FP, &bob.expect(GRID).expect("grid")),
        Ok(Lookup::Miss(MissReason::TenantMismatch))
    );
    assert_eq!(
        c.lookup_size_only(MS, &FP, &exp),
        Ok(Lookup::Hit { len: exp.byte_len })
    );
    assert_eq!(c.counters().misses.key_mismatch, 2);
    assert_eq!(c.counters().pairs_deleted, 0);
}

#[test]
fn the_memo_is_bounded() {
    let alice = ctx("alice");
    let mut c = cache(true);
    for h in 0..(MEMO_CAP as u64 + 10) {
        let grid = GridThw::new(1, 2, 2 * (h + 1));
        let r = c.commit_size_only(0, &alice, FP, grid);
        assert_eq!(r, Ok(CommitOutcome::Committed));
        assert!(c.memo.templates.len() <= MEMO_CAP);
    }
    assert_eq!(c.memo.templates.len(), 10);
}

#[test]
fn keys_are_the_display_text() {
    let fp = ImageFp(std::array::from_fn(|i| (i * 41 + 3) as u8));
    assert_eq!(blob_key(&fp), format!("{BLOB_PREFIX}{fp}"));
    assert_eq!(meta_key(&fp), format!("{META_PREFIX}{fp}"));
}

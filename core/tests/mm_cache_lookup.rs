//! Validated lookup: every miss reason on a hand-made case, each fault kind in its own
//! counter, readbacks apart from hits, size-only mode, and malformed meta as a counted miss.

use moonagent_core::faulty::{FaultKind, FaultyStore};
use moonagent_core::fingerprint::{Dtype, GridThw, ImageFp, ModelParts};
use moonagent_core::mm_cache::{
    blob_key, meta_key, CacheCounters, CacheError, Checksum, ChecksumAlgo, CommitOutcome, Envelope,
    Lookup, MissReason, MmCache, ModelCtx, BLOB_PREFIX, META_PREFIX,
};
use moonagent_core::store::{
    DataType, MemStore, MemStoreConfig, Payload, ReplicateConfig, Store, StoreError, MS,
};
use proptest::prelude::*;

type Cache = MmCache<FaultyStore<MemStore<String>>>;

const GRID: GridThw = GridThw::new(1, 4, 8);
const HIDDEN: u64 = 16;
const FP: ImageFp = ImageFp([0x5a; 32]);

fn ctx() -> ModelCtx {
    ModelCtx::new(ModelParts::example("alice"), HIDDEN).expect("valid ctx")
}

fn cache() -> Cache {
    let store = MemStore::new(MemStoreConfig::with_capacity(1 << 20)).expect("valid config");
    MmCache::new(FaultyStore::new(store, 1))
}

fn embedding(len: u64, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

/// A cache holding one committed pair for `FP`, and its bytes.
fn committed(algo: ChecksumAlgo) -> (Cache, ModelCtx, Vec<u8>) {
    let ctx = ctx().with_checksum(algo);
    let mut c = cache();
    let len = ctx.expect(GRID).expect("grid").byte_len;
    let bytes = embedding(len, 7);
    let r = c.commit(0, &ctx, FP, GRID, &bytes).expect("commit");
    assert_eq!(r, CommitOutcome::Committed);
    (c, ctx, bytes)
}

fn lookup_as(c: &mut Cache, ctx: &ModelCtx, grid: GridThw, cap: usize) -> Lookup {
    let exp = ctx.expect(grid).expect("grid");
    let mut buf = vec![0u8; cap];
    c.lookup(MS, &FP, &exp, &mut buf)
        .expect("no client failure")
}

fn lookup(c: &mut Cache, ctx: &ModelCtx) -> Lookup {
    let len = ctx.expect(GRID).expect("grid").byte_len as usize;
    lookup_as(c, ctx, GRID, len)
}

/// Write `env` directly under the meta key (replacing what is there).
fn put_meta(c: &mut Cache, env: &Envelope) {
    let s = c.store_mut().inner_mut();
    let _ = s.remove(0, &meta_key(&FP), true);
    let cfg = ReplicateConfig::of(DataType::EncoderOutput);
    s.put(
        0,
        &meta_key(&FP),
        Payload::Bytes(env.encode().expect("encode")),
        &cfg,
    )
    .expect("put meta");
}

fn stored_envelope(c: &mut Cache) -> Envelope {
    let mut buf = vec![0u8; 8192];
    let n = c
        .store_mut()
        .inner_mut()
        .get_into(0, &meta_key(&FP), &mut buf)
        .expect("meta present");
    Envelope::decode(&buf[..n as usize]).expect("valid envelope")
}

/// Assert exactly one miss, of `reason`, and nothing else counted as a miss.
fn only_miss(c: &CacheCounters, reason: MissReason) {
    assert_eq!(c.misses.get(reason), 1, "{reason:?}: {c:?}");
    assert_eq!(c.misses.total(), 1, "{reason:?}: {c:?}");
}

#[test]
fn committed_bytes_round_trip_with_either_checksum() {
    for algo in [ChecksumAlgo::Xxh3_64, ChecksumAlgo::Blake2b64] {
        let (mut c, ctx, bytes) = committed(algo);
        let exp = ctx.expect(GRID).expect("grid");
        let mut buf = vec![0u8; bytes.len() + 100];
        let r = c.lookup(MS, &FP, &exp, &mut buf).expect("lookup");
        assert_eq!(
            r,
            Lookup::Hit {
                len: bytes.len() as u64
            }
        );
        assert_eq!(&buf[..bytes.len()], &bytes[..]);
        assert_eq!(stored_envelope(&mut c).checksum.map(|s| s.algo), Some(algo));
        assert_eq!(c.counters().hits, 1);
        assert_eq!(c.counters().lookups, 1);
    }
}

#[test]
fn readback_is_counted_apart_from_hits() {
    let (mut c, ctx, bytes) = committed(ChecksumAlgo::Xxh3_64);
    let exp = ctx.expect(GRID).expect("grid");
    let mut buf = vec![0u8; bytes.len()];
    assert!(matches!(
        c.readback(MS, &FP, &exp, &mut buf),
        Ok(Lookup::Hit { .. })
    ));
    assert_eq!(buf, bytes);
    let k = c.counters();
    assert_eq!(
        (k.hits, k.lookups, k.readbacks, k.readback_hits),
        (0, 0, 1, 1)
    );
    assert_eq!(k.hit_rate(), 0.0);
}

#[test]
fn readback_verifies_the_checksum_and_deletes_a_corrupt_pair() {
    // Deterministic: the blob put of the commit stores one flipped byte (FaultyStore).
    for algo in [ChecksumAlgo::Xxh3_64, ChecksumAlgo::Blake2b64] {
        let ctx = ctx().with_checksum(algo);
        let mut c = cache();
        let len = ctx.expect(GRID).expect("grid").byte_len;
        let bytes = embedding(len, 9);
        c.store_mut()
            .push_fault_for(FaultKind::CorruptBlob, BLOB_PREFIX);
        assert_eq!(
            c.commit(0, &ctx, FP, GRID, &bytes),
            Ok(CommitOutcome::Committed)
        );
        assert_eq!(c.store().injected(FaultKind::CorruptBlob), 1);
        let exp = ctx.expect(GRID).expect("grid");
        let mut buf = vec![0u8; bytes.len()];
        let r = c.readback(MS, &FP, &exp, &mut buf);
        assert_eq!(r, Ok(Lookup::Miss(MissReason::CorruptBlob)), "{algo:?}");
        only_miss(c.counters(), MissReason::CorruptBlob);
        let k = c.counters();
        assert_eq!((k.readbacks, k.readback_misses, k.hits), (1, 1, 0));
        assert_eq!(k.pairs_deleted, 1);
        let s = c.store_mut().inner_mut();
        assert!(!s.exists(0, &blob_key(&FP)).expect("exists"));
        assert!(!s.exists(0, &meta_key(&FP)).expect("exists"));
    }
}

#[test]
fn every_miss_reason_is_counted_under_its_own_name() {
    let base = ctx();
    // not_found: nothing committed.
    {
        let mut c = cache();
        assert_eq!(lookup(&mut c, &base), Lookup::Miss(MissReason::NotFound));
        only_miss(c.counters(), MissReason::NotFound);
    }
    // not_ready: meta put in progress.
    {
        let mut c = cache();
        let cfg = ReplicateConfig::of(DataType::EncoderOutput);
        c.store_mut()
            .inner_mut()
            .put_start(0, &meta_key(&FP), 10, &cfg)
            .expect("start");
        assert_eq!(lookup(&mut c, &base), Lookup::Miss(MissReason::NotReady));
        only_miss(c.counters(), MissReason::NotReady);
    }
    // blob_missing: meta without blob.
    {
        let (mut c, ctx, _) = committed(ChecksumAlgo::Xxh3_64);
        c.store_mut()
            .inner_mut()
            .remove(0, &blob_key(&FP), true)
            .expect("remove");
        assert_eq!(lookup(&mut c, &ctx), Lookup::Miss(MissReason::BlobMissing));
        only_miss(c.counters(), MissReason::BlobMissing);
    }
    // Envelope edits: (edit, expected reason).
    type Edit = fn(&mut Envelope);
    let edits: [(Edit, MissReason); 8] = [
        (|e| e.schema_version = 2, MissReason::SchemaMismatch),
        (|e| e.fp = ImageFp([1; 32]), MissReason::KeyMismatch),
        (|e| e.tenant = "bob".into(), MissReason::TenantMismatch),
        (|e| e.model_fp.0[0] ^= 1, MissReason::ModelFpMismatch),
        (
            |e| e.model_parts.visual_adapter = "lora-x".into(),
            MissReason::ModelPartsMismatch,
        ),
        (|e| e.dtype = Dtype::F16, MissReason::DtypeMismatch),
        (
            |e| e.grid_thw = GridThw::new(1, 8, 4),
            MissReason::GridMismatch,
        ),
        (|e| e.byte_len += 2, MissReason::ByteLenMismatch),
    ];
    for (edit, reason) in edits {
        let (mut c, ctx, _) = committed(ChecksumAlgo::Xxh3_64);
        let mut env = stored_envelope(&mut c);
        edit(&mut env);
        put_meta(&mut c, &env);
        assert_eq!(lookup(&mut c, &ctx), Lookup::Miss(reason), "{reason:?}");
        only_miss(c.counters(), reason);
        // A mismatch is not corruption: the pair stays.
        assert!(c
            .store_mut()
            .inner_mut()
            .exists(0, &blob_key(&FP))
            .expect("exists"));
    }
    // shape_mismatch: a reader with another hidden size (same dtype and grid).
    {
        let (mut c, _, _) = committed(ChecksumAlgo::Xxh3_64);
        let wide = ModelCtx::new(ModelParts::example("alice"), HIDDEN * 2).expect("ctx");
        assert_eq!(
            lookup(&mut c, &wide),
            Lookup::Miss(MissReason::ShapeMismatch)
        );
        only_miss(c.counters(), MissReason::ShapeMismatch);
    }
    // tenant and model revision seen from the reader's side.
    {
        let (mut c, _, _) = committed(ChecksumAlgo::Xxh3_64);
        let bob = ModelCtx::new(ModelParts::example("bob"), HIDDEN).expect("ctx");
        assert_eq!(
            lookup(&mut c, &bob),
            Lookup::Miss(MissReason::TenantMismatch)
        );
        let mut p = ModelParts::example("alice");
        p.model_snapshot = "0".repeat(40);
        let rev = ModelCtx::new(p, HIDDEN).expect("ctx");
        assert_eq!(
            lookup(&mut c, &rev),
            Lookup::Miss(MissReason::ModelFpMismatch)
        );
        let f16 = ctx().with_embed_dtype(Dtype::F16);
        assert_eq!(
            lookup(&mut c, &f16),
            Lookup::Miss(MissReason::DtypeMismatch)
        );
        let other_grid = lookup_as(&mut c, &base, GridThw::new(2, 4, 8), 1 << 12);
        assert_eq!(other_grid, Lookup::Miss(MissReason::GridMismatch));
    }
    // recv_buffer_too_small.
    {
        let (mut c, ctx, bytes) = committed(ChecksumAlgo::Xxh3_64);
        let r = lookup_as(&mut c, &ctx, GRID, bytes.len() - 1);
        assert_eq!(r, Lookup::Miss(MissReason::RecvBufferTooSmall));
        only_miss(c.counters(), MissReason::RecvBufferTooSmall);
    }
    // size_only: a bytes lookup of a pair committed size-only.
    {
        let mut c = cache();
        c.commit_size_only(0, &base, FP, GRID).expect("commit");
        assert_eq!(lookup(&mut c, &base), Lookup::Miss(MissReason::SizeOnly));
        only_miss(c.counters(), MissReason::SizeOnly);
    }
    // store_error: an unexpected store error on a read is a counted miss.
    {
        let (c, ctx, _) = committed(ChecksumAlgo::Xxh3_64);
        let mut c = MmCache::new(Odd(c.into_store().into_inner()));
        let exp = ctx.expect(GRID).expect("grid");
        let mut buf = vec![0u8; exp.byte_len as usize];
        let r = c.lookup(MS, &FP, &exp, &mut buf).expect("lookup");
        assert_eq!(r, Lookup::Miss(MissReason::StoreError));
        only_miss(c.counters(), MissReason::StoreError);
    }
}

/// A store whose blob reads fail with an error the cache does not expect.
struct Odd(MemStore<String>);

impl Store for Odd {
    fn put_start(
        &mut self,
        n: u64,
        k: &str,
        s: u64,
        c: &ReplicateConfig,
    ) -> Result<(), StoreError> {
        self.0.put_start(n, k, s, c)
    }
    fn put_end(&mut self, n: u64, k: &str, p: Payload) -> Result<(), StoreError> {
        self.0.put_end(n, k, p)
    }
    fn put_revoke(&mut self, n: u64, k: &str) -> Result<(), StoreError> {
        self.0.put_revoke(n, k)
    }
    fn get_into(&mut self, n: u64, k: &str, b: &mut [u8]) -> Result<u64, StoreError> {
        if k.starts_with(BLOB_PREFIX) {
            return Err(StoreError::InvalidParams("odd".into()));
        }
        self.0.get_into(n, k, b)
    }
    fn get_size(&mut self, n: u64, k: &str) -> Result<u64, StoreError> {
        self.0.get_size(n, k)
    }
    fn exists(&mut self, n: u64, k: &str) -> Result<bool, StoreError> {
        self.0.exists(n, k)
    }
    fn remove(&mut self, n: u64, k: &str, f: bool) -> Result<(), StoreError> {
        self.0.remove(n, k, f)
    }
}

/// Each injected fault ends in exactly the counter that names it (or in an error for a
/// broken client), and corrupt pairs are deleted.
#[test]
fn every_fault_kind_lands_in_its_own_counter() {
    // (fault, strikes at commit?, expected outcome, pair deleted?)
    let table: [(FaultKind, bool, Option<MissReason>, bool); 10] = [
        (FaultKind::DropMeta, true, Some(MissReason::NotFound), false),
        (
            FaultKind::CorruptMeta,
            true,
            Some(MissReason::CorruptMeta),
            true,
        ),
        (
            FaultKind::StaleSchema,
            true,
            Some(MissReason::SchemaMismatch),
            false,
        ),
        (
            FaultKind::SwapTenant,
            true,
            Some(MissReason::TenantMismatch),
            false,
        ),
        (
            FaultKind::DropBlob,
            true,
            Some(MissReason::BlobMissing),
            false,
        ),
        (
            FaultKind::CorruptBlob,
            true,
            Some(MissReason::CorruptBlob),
            true,
        ),
        (
            FaultKind::TruncateBlob,
            true,
            Some(MissReason::CorruptBlob),
            true,
        ),
        (
            FaultKind::LeaseExpired,
            false,
            Some(MissReason::LeaseExpired),
            false,
        ),
        (FaultKind::BufferRegistration, false, None, false),
        (FaultKind::Unavailable, false, None, false),
    ];
    for (kind, at_commit, want, deleted) in table {
        let ctx = ctx();
        let mut c = cache();
        let len = ctx.expect(GRID).expect("grid").byte_len;
        let bytes = embedding(len, 3);
        let target = match kind {
            FaultKind::DropBlob | FaultKind::CorruptBlob | FaultKind::TruncateBlob => BLOB_PREFIX,
            _ => META_PREFIX,
        };
        if at_commit {
            c.store_mut().push_fault_for(kind, target);
        }
        assert_eq!(
            c.commit(0, &ctx, FP, GRID, &bytes),
            Ok(CommitOutcome::Committed)
        );
        if !at_commit {
            c.store_mut().push_fault(kind);
        }
        let exp = ctx.expect(GRID).expect("grid");
        let mut buf = vec![0u8; bytes.len()];
        let r = c.lookup(MS, &FP, &exp, &mut buf);
        assert_eq!(c.store().injected(kind), 1, "{kind:?} not injected");
        assert_eq!(c.store().injected_all().iter().sum::<u64>(), 1);
        match want {
            Some(reason) => {
                assert_eq!(r, Ok(Lookup::Miss(reason)), "{kind:?}");
                only_miss(c.counters(), reason);
                assert_eq!(c.counters().client_errors, 0);
            }
            None => {
                assert!(
                    matches!(r, Err(CacheError::Store(ref e)) if e.is_client_failure()),
                    "{kind:?}: {r:?}"
                );
                assert_eq!(c.counters().misses.total(), 0);
                assert_eq!(c.counters().client_errors, 1);
            }
        }
        let s = c.store_mut().inner_mut();
        let present = s.exists(0, &meta_key(&FP)).expect("exists")
            || s.exists(0, &blob_key(&FP)).expect("exists");
        assert_eq!(c.counters().pairs_deleted, u64::from(deleted), "{kind:?}");
        if deleted {
            assert!(!present, "{kind:?}: corrupt pair not deleted");
        }
        // Recommitting always heals the pair.
        assert_eq!(
            c.commit(2 * MS, &ctx, FP, GRID, &bytes),
            Ok(CommitOutcome::Committed)
        );
        let r = c.lookup(3 * MS, &FP, &exp, &mut buf);
        assert_eq!(r, Ok(Lookup::Hit { len }), "{kind:?} after recommit");
        assert_eq!(buf, bytes);
    }
}

#[test]
fn commit_with_unavailable_store_is_an_error_not_a_silent_success() {
    let ctx = ctx();
    let mut c = cache();
    let bytes = embedding(ctx.expect(GRID).expect("grid").byte_len, 1);
    c.store_mut()
        .push_fault_for(FaultKind::Unavailable, META_PREFIX);
    let r = c.commit(0, &ctx, FP, GRID, &bytes);
    assert!(
        matches!(r, Err(CacheError::Store(StoreError::Unavailable(_)))),
        "{r:?}"
    );
    assert_eq!(c.counters().commits, 0);
    assert_eq!(c.counters().client_errors, 1);
}

#[test]
fn commit_that_finds_no_space_fails_cleanly_and_leaves_no_orphan() {
    let ctx = ctx();
    let len = ctx.expect(GRID).expect("grid").byte_len;
    // Room for the blob, not for the meta.
    let store: MemStore<String> =
        MemStore::new(MemStoreConfig::with_capacity(len + 100)).expect("cfg");
    let mut c = MmCache::new(store);
    let r = c
        .commit(0, &ctx, FP, GRID, &embedding(len, 0))
        .expect("no client failure");
    assert_eq!(r, CommitOutcome::Failed(StoreError::NoAvailableHandle));
    assert_eq!(c.counters().commit_failures, 1);
    assert!(c.store().is_empty(), "orphan blob left behind");
}

#[test]
fn size_only_lookup_validates_envelope_and_blob_size() {
    let ctx = ctx();
    let exp = ctx.expect(GRID).expect("grid");
    let mut c = cache();
    assert_eq!(
        c.lookup_size_only(0, &FP, &exp),
        Ok(Lookup::Miss(MissReason::NotFound))
    );
    c.commit_size_only(0, &ctx, FP, GRID).expect("commit");
    assert_eq!(
        c.lookup_size_only(MS, &FP, &exp),
        Ok(Lookup::Hit { len: exp.byte_len })
    );
    assert_eq!(
        c.readback_size_only(MS, &FP, &exp),
        Ok(Lookup::Hit { len: exp.byte_len })
    );
    // The same envelope checks as a bytes lookup.
    let bob = ModelCtx::new(ModelParts::example("bob"), HIDDEN).expect("ctx");
    let bexp = bob.expect(GRID).expect("grid");
    assert_eq!(
        c.lookup_size_only(MS, &FP, &bexp),
        Ok(Lookup::Miss(MissReason::TenantMismatch))
    );
    // A truncated size-only blob is corrupt (and deleted); a dropped one is missing.
    c.store_mut().push_fault(FaultKind::TruncateBlob);
    c.commit_size_only(2 * MS, &ctx, FP, GRID).expect("commit");
    assert_eq!(
        c.lookup_size_only(3 * MS, &FP, &exp),
        Ok(Lookup::Miss(MissReason::CorruptBlob))
    );
    assert_eq!(c.counters().pairs_deleted, 1);
    c.store_mut().push_fault(FaultKind::DropBlob);
    c.commit_size_only(4 * MS, &ctx, FP, GRID).expect("commit");
    assert_eq!(
        c.lookup_size_only(5 * MS, &FP, &exp),
        Ok(Lookup::Miss(MissReason::BlobMissing))
    );
    // A size-only lookup also accepts a pair committed with bytes (sizes match).
    let bytes = embedding(exp.byte_len, 9);
    c.commit(6 * MS, &ctx, FP, GRID, &bytes).expect("commit");
    assert_eq!(
        c.lookup_size_only(7 * MS, &FP, &exp),
        Ok(Lookup::Hit { len: exp.byte_len })
    );
}

#[test]
fn large_meta_still_validates() {
    // An envelope over the initial 4 KiB meta buffer (long processor version string).
    let mut p = ModelParts::example("alice");
    p.processor_version = "v".repeat(6000);
    let ctx = ModelCtx::new(p, HIDDEN).expect("ctx");
    let mut c = cache();
    let bytes = embedding(ctx.expect(GRID).expect("grid").byte_len, 5);
    c.commit(0, &ctx, FP, GRID, &bytes).expect("commit");
    assert_eq!(
        lookup(&mut c, &ctx),
        Lookup::Hit {
            len: bytes.len() as u64
        }
    );
}

#[test]
fn commit_rejects_wrong_sized_embeddings_and_bad_grids() {
    let ctx = ctx();
    let mut c = cache();
    let r = c.commit(0, &ctx, FP, GRID, &[0u8; 3]);
    assert!(matches!(r, Err(CacheError::InvalidInput(_))));
    let r = c.commit(0, &ctx, FP, GridThw::new(1, 3, 4), &[0u8; 3]);
    assert!(matches!(r, Err(CacheError::InvalidInput(_))));
    assert!(c.store().inner().is_empty());
}

fn with_meta_bytes(bytes: Vec<u8>) -> (Cache, Result<Lookup, CacheError>) {
    let ctx = ctx();
    let mut c = cache();
    let cfg = ReplicateConfig::of(DataType::EncoderOutput);
    let s = c.store_mut().inner_mut();
    s.put(0, &meta_key(&FP), Payload::Bytes(bytes), &cfg)
        .expect("put meta");
    let len = ctx.expect(GRID).expect("grid").byte_len;
    s.put(0, &blob_key(&FP), Payload::Bytes(embedding(len, 1)), &cfg)
        .expect("put blob");
    let exp = ctx.expect(GRID).expect("grid");
    let mut buf = vec![0u8; len as usize];
    let r = c.lookup(MS, &FP, &exp, &mut buf);
    (c, r)
}

fn valid_meta() -> Vec<u8> {
    let ctx = ctx();
    let exp = ctx.expect(GRID).expect("grid");
    let bytes = embedding(exp.byte_len, 1);
    let env = exp.envelope(FP, Some(Checksum::of(ChecksumAlgo::Xxh3_64, &bytes)));
    env.encode().expect("encode")
}

#[test]
fn the_valid_meta_used_by_the_fuzzers_hits() {
    let (_, r) = with_meta_bytes(valid_meta());
    assert!(matches!(r, Ok(Lookup::Hit { .. })), "{r:?}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    /// Arbitrary bytes under the meta key: a counted corrupt-meta miss that deletes the
    /// pair, never a panic, never a hit.
    #[test]
    fn arbitrary_meta_bytes_are_a_counted_miss_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let (mut c, r) = with_meta_bytes(bytes);
        prop_assert_eq!(r, Ok(Lookup::Miss(MissReason::CorruptMeta)));
        prop_assert_eq!(c.counters().misses.corrupt_meta, 1);
        prop_assert_eq!(c.counters().pairs_deleted, 1);
        prop_assert!(!c.store_mut().inner_mut().exists(0, &blob_key(&FP)).expect("exists"));
    }

    /// A valid envelope truncated or with bytes overwritten: a counted miss, never a panic.
    #[test]
    fn mutated_or_truncated_envelopes_are_a_counted_miss(
        cut in any::<prop::sample::Index>(),
        edits in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 0..4),
        truncate in any::<bool>(),
    ) {
        let mut m = valid_meta();
        for (i, x) in &edits {
            let i = i.index(m.len());
            m[i] ^= x;
        }
        if truncate || edits.is_empty() {
            let n = cut.index(m.len());
            m.truncate(n);
        }
        let (c, r) = with_meta_bytes(m);
        prop_assert_eq!(r, Ok(Lookup::Miss(MissReason::CorruptMeta)));
        prop_assert_eq!(c.counters().misses.total(), 1);
    }

    /// The decoder alone, on arbitrary bytes behind a valid frame header: an error or an
    /// envelope, never a panic (the body is arbitrary, the frame checksum right).
    #[test]
    fn decoder_never_panics_on_framed_arbitrary_bodies(body in proptest::collection::vec(any::<u8>(), 0..1024)) {
        let mut framed = b"MMEV".to_vec();
        framed.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
        framed.extend_from_slice(&body);
        let _ = Envelope::decode(&framed);
    }
}

/// The small views a report reads: every miss reason has its own snake_case name; the
/// hit rate is hits over lookups (0 with no lookup); the `unauthenticated` counter is
/// written only when non-zero; a context is keyed with either option; a context reports
/// its tenant and width. Written for survivors of `scripts/mutants.sh run mm_cache`
/// shard 1 of 3 (each replaced by a constant, `||` by `&&`, `/` by `*` or `%`).
#[test]
fn the_reports_views_of_the_cache_say_what_they_name() {
    use moonagent_core::fingerprint::TenantSecret;
    let names: std::collections::BTreeSet<&str> =
        MissReason::ALL.iter().map(|r| r.name()).collect();
    assert_eq!(names.len(), MissReason::ALL.len(), "names are distinct");
    for n in &names {
        assert!(
            !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{n}"
        );
    }
    assert_eq!(MissReason::NotFound.name(), "not_found");
    assert_eq!(MissReason::CorruptBlob.name(), "corrupt_blob");

    let mut c = CacheCounters::default();
    assert_eq!(c.hit_rate(), 0.0);
    c.lookups = 8;
    c.hits = 6;
    assert_eq!(c.hit_rate(), 0.75);
    let json = |c: &CacheCounters| serde_json::to_string(c).unwrap();
    assert!(!json(&c).contains("unauthenticated"), "{}", json(&c));
    c.misses.unauthenticated = 2;
    assert!(json(&c).contains("\"unauthenticated\":2"), "{}", json(&c));

    let plain = ctx();
    assert!(!plain.is_keyed());
    assert!(ctx().with_mac(TenantSecret::new([1; 32])).is_keyed());
    assert!(ctx()
        .with_keyed_fingerprints(TenantSecret::new([2; 32]))
        .is_keyed());
    assert_eq!(plain.tenant(), "alice");
    assert_eq!(plain.hidden(), HIDDEN);

    // A driver resets the counters between passes through `counters_mut`.
    let mut m = cache();
    m.counters_mut().lookups = 3;
    assert_eq!(m.counters().lookups, 3);
    *m.counters_mut() = CacheCounters::default();
    assert_eq!(m.counters().lookups, 0);
}

/// A meta stored without bytes (a size-only object under the meta key) is no envelope: a
/// lookup with bytes counts it as corrupt meta, not as a store error. Written for a
/// survivor of mm_cache shard 2 of 3 (`StoreError::SizeOnly => CorruptMeta` deleted).
#[test]
fn a_size_only_object_under_the_meta_key_is_corrupt_meta() {
    let (mut c, ctx, _) = committed(ChecksumAlgo::Xxh3_64);
    let s = c.store_mut().inner_mut();
    let _ = s.remove(0, &meta_key(&FP), true);
    let cfg = ReplicateConfig::of(DataType::EncoderOutput);
    s.put(0, &meta_key(&FP), Payload::SizeOnly(64), &cfg)
        .expect("put size-only meta");
    let before = c.counters().clone();
    assert_eq!(lookup(&mut c, &ctx), Lookup::Miss(MissReason::CorruptMeta));
    assert_eq!(
        c.counters().misses.get(MissReason::CorruptMeta),
        before.misses.get(MissReason::CorruptMeta) + 1
    );
}

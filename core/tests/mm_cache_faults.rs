//! The embedding cache under injected faults, against a trivially correct model.
//!
//! Random sequences of commits, lookups (as the owner, as another tenant, as another
//! model revision, with a too-small buffer), readbacks, removals and queued faults run
//! through `MmCache<FaultyStore<MemStore>>` with random per-kind fault rates. The model
//! keeps, per image, the bytes last committed and what the faults did to the stored pair.
//! For every operation it walks the cache's store calls in order, consuming the faults the
//! `FaultyStore` logged for that operation, and predicts the exact outcome; every outcome
//! and, at the end of each case, every counter must match. On a hit, the returned bytes
//! must equal the bytes committed last for that fingerprint, tenant and model.
//!
//! More than 100k operations run across the cases (asserted at the end).

use std::sync::atomic::{AtomicU64, Ordering};

use moonagent_core::faulty::{FaultKind, FaultRates, FaultyStore, Injection, Op as SOp};
use moonagent_core::fingerprint::{image_fingerprint, Dtype, GridThw, ImageFp, ModelParts};
use moonagent_core::mm_cache::{
    blob_key, meta_key, CacheError, ChecksumAlgo, CommitOutcome, Lookup, MissCounts, MissReason,
    MmCache, ModelCtx, BLOB_PREFIX, META_PREFIX,
};
use moonagent_core::rng::Rng;
use moonagent_core::store::{MemStore, MemStoreConfig, MS};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const CASES: u32 = 64;
const OPS_PER_CASE: usize = 1600;
const IMAGES: usize = 6;
const HIDDEN: u64 = 16;

#[derive(Debug, Clone)]
enum Op {
    Commit { img: usize, gen: u8, blake: bool },
    Lookup { img: usize, who: u8, small: bool },
    Readback { img: usize },
    Remove { img: usize },
    Queue { kind: usize },
    Advance { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..IMAGES, 0u8..4, any::<bool>()).prop_map(|(img, gen, blake)| Op::Commit { img, gen, blake }),
        8 => (0..IMAGES, 0u8..8, 0u8..16).prop_map(|(img, w, s)| Op::Lookup {
            img,
            // Mostly the owner; sometimes another tenant or another model revision.
            who: match w { 0 => 1, 1 => 2, _ => 0 },
            small: s == 0,
        }),
        2 => (0..IMAGES).prop_map(|img| Op::Readback { img }),
        1 => (0..IMAGES).prop_map(|img| Op::Remove { img }),
        1 => (0..CACHE_KINDS).prop_map(|kind| Op::Queue { kind }),
        1 => (0u16..500).prop_map(|ms| Op::Advance { ms }),
    ]
}

/// The kinds that can strike the cache's operations: every kind before
/// [`FaultKind::HoldRefused`], which strikes only `begin_read` (the serving engine's held
/// loads; the cache opens no held reads).
const CACHE_KINDS: usize = FaultKind::HoldRefused as usize;
// `rates` draws one rate per cache kind.
const _: () = assert!(CACHE_KINDS == 10);

fn rates() -> impl Strategy<Value = [f64; FaultKind::COUNT]> {
    // A quarter of the cases run fault-free; the rest draw each cache kind's rate in
    // [0, 0.08).
    (0u8..4, proptest::array::uniform10(0u32..80)).prop_map(|(z, a)| {
        let mut r = [0.0; FaultKind::COUNT];
        if z != 0 {
            for (r, x) in r.iter_mut().zip(a) {
                *r = f64::from(x) / 1000.0;
            }
        }
        r
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MetaSt {
    Valid,
    Dropped,
    Corrupt,
    Stale,
    Swapped,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlobSt {
    Valid,
    Dropped,
    Corrupt,
}

#[derive(Debug, Clone)]
struct Pair {
    bytes: Vec<u8>,
    meta: MetaSt,
    blob: BlobSt,
}

/// What the model expects of one call.
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Hit,
    Miss(MissReason),
    ClientError,
}

#[derive(Default)]
struct Tally {
    lookups: u64,
    hits: u64,
    readbacks: u64,
    readback_hits: u64,
    readback_misses: u64,
    misses: MissCounts,
    commits: u64,
    client_errors: u64,
    pairs_deleted: u64,
    /// Observations per fault kind (a lookup that met a faulty pair or a faulty read).
    observed: [u64; FaultKind::COUNT],
}

/// Faults logged during one cache call, consumed in store-call order.
struct Faults {
    log: Vec<Injection>,
    next: usize,
}

impl Faults {
    /// The fault on the next store call if it is `(op, key)`.
    fn take(&mut self, op: SOp, key: &str) -> Option<FaultKind> {
        let f = self.log.get(self.next)?;
        if f.op == op && f.key == key {
            self.next += 1;
            Some(f.kind)
        } else {
            None
        }
    }

    fn done(&self) -> bool {
        self.next == self.log.len()
    }
}

fn is_client(k: FaultKind) -> bool {
    matches!(k, FaultKind::Unavailable | FaultKind::BufferRegistration)
}

struct World {
    cache: MmCache<FaultyStore<MemStore<String>>>,
    owner_xxh: ModelCtx,
    owner_blake: ModelCtx,
    other_tenant: ModelCtx,
    other_rev: ModelCtx,
    fps: Vec<ImageFp>,
    grids: Vec<GridThw>,
    state: Vec<Option<Pair>>,
    tally: Tally,
    now: u64,
}

fn parts(tenant: &str, rev: char) -> ModelParts {
    let mut p = ModelParts::example(tenant);
    p.model_snapshot = std::iter::repeat_n(rev, 40).collect();
    p
}

impl World {
    fn new(seed: u64, rates: [f64; FaultKind::COUNT]) -> Self {
        let store = MemStore::new(MemStoreConfig::with_capacity(64 << 20)).expect("valid config");
        let faulty = FaultyStore::new(store, seed)
            .with_rates(FaultRates::from_array(rates))
            .with_log(true);
        let owner = ModelCtx::new(parts("alice", 'a'), HIDDEN).expect("valid ctx");
        let grids = [
            GridThw::new(1, 4, 4),
            GridThw::new(1, 4, 8),
            GridThw::new(1, 8, 8),
            GridThw::new(2, 4, 4),
            GridThw::new(1, 2, 6),
            GridThw::new(1, 6, 4),
        ];
        let mut rng = Rng::stream(seed, "pixels");
        let fps = grids
            .iter()
            .map(|g| {
                let px: Vec<u8> = (0..32).map(|_| rng.next_u64() as u8).collect();
                image_fingerprint(&owner.fp(), *g, &[8, 4], Dtype::U8, &px).expect("valid")
            })
            .collect();
        Self {
            cache: MmCache::new(faulty),
            owner_blake: owner.clone().with_checksum(ChecksumAlgo::Blake2b64),
            owner_xxh: owner,
            other_tenant: ModelCtx::new(parts("bob", 'a'), HIDDEN).expect("valid ctx"),
            other_rev: ModelCtx::new(parts("alice", 'b'), HIDDEN).expect("valid ctx"),
            fps,
            grids: grids.to_vec(),
            state: vec![None; IMAGES],
            tally: Tally::default(),
            now: 0,
        }
    }

    fn faults(&mut self) -> Faults {
        Faults {
            log: self.cache.store_mut().take_log(),
            next: 0,
        }
    }

    fn byte_len(&self, img: usize) -> usize {
        let e = self.owner_xxh.expect(self.grids[img]).expect("valid grid");
        e.byte_len as usize
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.now += MS;
        match *op {
            Op::Advance { ms } => self.now += u64::from(ms) * MS,
            Op::Queue { kind } => self.cache.store_mut().push_fault(FaultKind::ALL[kind]),
            Op::Commit { img, gen, blake } => self.commit(img, gen, blake)?,
            Op::Lookup { img, who, small } => self.lookup(img, who, small, false)?,
            Op::Readback { img } => self.lookup(img, 0, false, true)?,
            Op::Remove { img } => self.remove(img)?,
        }
        Ok(())
    }

    fn commit(&mut self, img: usize, gen: u8, blake: bool) -> Result<(), TestCaseError> {
        let fp = self.fps[img];
        let mut bytes = vec![0u8; self.byte_len(img)];
        let mut r = Rng::new((img as u64) << 8 | u64::from(gen));
        bytes.iter_mut().for_each(|b| *b = r.next_u64() as u8);
        let ctx = if blake {
            &self.owner_blake
        } else {
            &self.owner_xxh
        };
        let got = self
            .cache
            .commit(self.now, ctx, fp, self.grids[img], &bytes);
        let mut f = self.faults();
        let (mk, bk) = (meta_key(&fp), blob_key(&fp));
        // Store calls: remove meta, remove blob, put blob, put meta.
        let expect = 'calls: {
            if let Some(k) = f.take(SOp::Remove, &mk) {
                prop_assert_eq!(k, FaultKind::Unavailable);
                break 'calls Outcome::ClientError;
            }
            self.state[img] = None;
            if let Some(k) = f.take(SOp::Remove, &bk) {
                prop_assert_eq!(k, FaultKind::Unavailable);
                break 'calls Outcome::ClientError;
            }
            let blob = match f.take(SOp::Put, &bk) {
                None => BlobSt::Valid,
                Some(FaultKind::Unavailable) => break 'calls Outcome::ClientError,
                Some(FaultKind::DropBlob) => BlobSt::Dropped,
                Some(FaultKind::CorruptBlob | FaultKind::TruncateBlob) => BlobSt::Corrupt,
                Some(k) => return Err(TestCaseError::fail(format!("{k:?} on blob put"))),
            };
            let meta = match f.take(SOp::Put, &mk) {
                None => MetaSt::Valid,
                Some(FaultKind::Unavailable) => break 'calls Outcome::ClientError,
                Some(FaultKind::DropMeta) => MetaSt::Dropped,
                Some(FaultKind::CorruptMeta) => MetaSt::Corrupt,
                Some(FaultKind::StaleSchema) => MetaSt::Stale,
                Some(FaultKind::SwapTenant) => MetaSt::Swapped,
                Some(k) => return Err(TestCaseError::fail(format!("{k:?} on meta put"))),
            };
            self.state[img] = Some(Pair { bytes, meta, blob });
            Outcome::Hit
        };
        prop_assert!(f.done(), "unconsumed faults {:?}", &f.log[f.next..]);
        match (expect, got) {
            (Outcome::ClientError, Err(CacheError::Store(e))) => {
                prop_assert!(e.is_client_failure());
                self.tally.client_errors += 1;
            }
            (Outcome::Hit, Ok(CommitOutcome::Committed)) => self.tally.commits += 1,
            (e, g) => {
                return Err(TestCaseError::fail(format!(
                    "commit: expected {e:?}, got {g:?}"
                )))
            }
        }
        Ok(())
    }

    fn remove(&mut self, img: usize) -> Result<(), TestCaseError> {
        let fp = self.fps[img];
        let got = self.cache.remove_pair(self.now, &fp);
        let mut f = self.faults();
        let expect_err = self.deletion(&mut f, img);
        prop_assert!(f.done());
        prop_assert_eq!(expect_err, got.is_err(), "remove: got {:?}", got);
        if expect_err {
            self.tally.client_errors += 1;
        }
        Ok(())
    }

    /// Remove meta then blob; true when a client failure stopped it.
    fn deletion(&mut self, f: &mut Faults, img: usize) -> bool {
        let fp = self.fps[img];
        if f.take(SOp::Remove, &meta_key(&fp)).is_some() {
            return true;
        }
        self.state[img] = None;
        f.take(SOp::Remove, &blob_key(&fp)).is_some()
    }

    fn lookup(
        &mut self,
        img: usize,
        who: u8,
        small: bool,
        readback: bool,
    ) -> Result<(), TestCaseError> {
        let fp = self.fps[img];
        let ctx = match who {
            0 => &self.owner_xxh,
            1 => &self.other_tenant,
            _ => &self.other_rev,
        };
        let exp = ctx.expect(self.grids[img]).expect("valid grid");
        let len = exp.byte_len as usize;
        let mut buf = vec![0u8; if small { len - 1 } else { len + 7 }];
        let got = if readback {
            self.cache.readback(self.now, &fp, &exp, &mut buf)
        } else {
            self.cache.lookup(self.now, &fp, &exp, &mut buf)
        };
        let mut f = self.faults();
        let (mk, bk) = (meta_key(&fp), blob_key(&fp));
        let pair = self.state[img].clone();
        let obs = &mut self.tally.observed;
        let mut deletes = false;
        let expect = 'calls: {
            // Meta read.
            let stored_meta = pair.as_ref().filter(|p| p.meta != MetaSt::Dropped);
            match f.take(SOp::GetInto, &mk) {
                Some(k) if is_client(k) => break 'calls Outcome::ClientError,
                Some(FaultKind::LeaseExpired) => {
                    prop_assert!(stored_meta.is_some(), "lease fault on an absent meta");
                    obs[FaultKind::LeaseExpired.index()] += 1;
                    break 'calls Outcome::Miss(MissReason::LeaseExpired);
                }
                Some(k) => return Err(TestCaseError::fail(format!("{k:?} on meta read"))),
                None => {}
            }
            let Some(p) = pair.as_ref() else {
                break 'calls Outcome::Miss(MissReason::NotFound);
            };
            match p.meta {
                MetaSt::Dropped => {
                    obs[FaultKind::DropMeta.index()] += 1;
                    break 'calls Outcome::Miss(MissReason::NotFound);
                }
                MetaSt::Corrupt => {
                    obs[FaultKind::CorruptMeta.index()] += 1;
                    deletes = true;
                    break 'calls Outcome::Miss(MissReason::CorruptMeta);
                }
                MetaSt::Stale => {
                    obs[FaultKind::StaleSchema.index()] += 1;
                    break 'calls Outcome::Miss(MissReason::SchemaMismatch);
                }
                MetaSt::Swapped => {
                    obs[FaultKind::SwapTenant.index()] += 1;
                    break 'calls Outcome::Miss(MissReason::TenantMismatch);
                }
                MetaSt::Valid => {}
            }
            match who {
                0 => {}
                1 => break 'calls Outcome::Miss(MissReason::TenantMismatch),
                _ => break 'calls Outcome::Miss(MissReason::ModelFpMismatch),
            }
            if small {
                break 'calls Outcome::Miss(MissReason::RecvBufferTooSmall);
            }
            // Blob read.
            match f.take(SOp::GetInto, &bk) {
                Some(k) if is_client(k) => break 'calls Outcome::ClientError,
                Some(FaultKind::LeaseExpired) => {
                    prop_assert!(p.blob != BlobSt::Dropped, "lease fault on an absent blob");
                    obs[FaultKind::LeaseExpired.index()] += 1;
                    break 'calls Outcome::Miss(MissReason::LeaseExpired);
                }
                Some(k) => return Err(TestCaseError::fail(format!("{k:?} on blob read"))),
                None => {}
            }
            match p.blob {
                BlobSt::Dropped => {
                    obs[FaultKind::DropBlob.index()] += 1;
                    Outcome::Miss(MissReason::BlobMissing)
                }
                BlobSt::Corrupt => {
                    // Corrupt and truncated blobs both end here; FaultyStore tells them apart.
                    obs[FaultKind::CorruptBlob.index()] += 1;
                    deletes = true;
                    Outcome::Miss(MissReason::CorruptBlob)
                }
                BlobSt::Valid => Outcome::Hit,
            }
        };
        let mut expect = expect;
        if let Outcome::Miss(r) = expect {
            self.tally.misses.add(r);
        }
        if deletes {
            if self.deletion(&mut f, img) {
                expect = Outcome::ClientError;
            } else {
                self.tally.pairs_deleted += 1;
            }
        }
        prop_assert!(f.done(), "unconsumed faults {:?}", &f.log[f.next..]);
        match (&expect, &got) {
            (Outcome::ClientError, Err(CacheError::Store(e))) => {
                prop_assert!(e.is_client_failure());
                self.tally.client_errors += 1;
            }
            (Outcome::Hit, Ok(Lookup::Hit { len: n })) => {
                let p = pair.as_ref().expect("a hit needs a pair");
                prop_assert_eq!(*n as usize, p.bytes.len());
                // The invariant: a hit returns exactly the bytes committed last.
                prop_assert!(buf[..p.bytes.len()] == p.bytes[..], "hit returned other bytes");
                if readback {
                    self.tally.readbacks += 1;
                    self.tally.readback_hits += 1;
                } else {
                    self.tally.lookups += 1;
                    self.tally.hits += 1;
                }
            }
            (Outcome::Miss(a), Ok(Lookup::Miss(b))) if a == b => {
                if readback {
                    self.tally.readbacks += 1;
                    self.tally.readback_misses += 1;
                } else {
                    self.tally.lookups += 1;
                }
            }
            (e, g) => {
                return Err(TestCaseError::fail(format!(
                    "lookup of img {img} (who {who}, small {small}, state {:?}): expected {e:?}, got {g:?}",
                    pair.map(|p| (p.meta, p.blob))
                )))
            }
        }
        Ok(())
    }

    fn check_counters(&self) -> Result<(), TestCaseError> {
        let c = self.cache.counters();
        let t = &self.tally;
        prop_assert_eq!(c.lookups, t.lookups);
        prop_assert_eq!(c.hits, t.hits);
        prop_assert_eq!(c.readbacks, t.readbacks);
        prop_assert_eq!(c.readback_hits, t.readback_hits);
        prop_assert_eq!(c.readback_misses, t.readback_misses);
        prop_assert_eq!(c.misses, t.misses);
        prop_assert_eq!(c.commits, t.commits);
        prop_assert_eq!(c.client_errors, t.client_errors);
        prop_assert_eq!(c.pairs_deleted, t.pairs_deleted);
        let s = self.cache.store();
        // Transient faults map one to one onto their counters.
        prop_assert_eq!(s.injected(FaultKind::LeaseExpired), c.misses.lease_expired);
        prop_assert_eq!(
            s.injected(FaultKind::Unavailable) + s.injected(FaultKind::BufferRegistration),
            c.client_errors
        );
        Ok(())
    }
}

static OPS_RUN: AtomicU64 = AtomicU64::new(0);
static INJECTED: [AtomicU64; FaultKind::COUNT] = [const { AtomicU64::new(0) }; FaultKind::COUNT];
static OBSERVED: [AtomicU64; FaultKind::COUNT] = [const { AtomicU64::new(0) }; FaultKind::COUNT];

#[test]
fn lookup_never_returns_bytes_other_than_committed_and_every_fault_is_counted() {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        max_shrink_iters: 2000,
        ..Config::default()
    });
    let strategy = (
        any::<u64>(),
        rates(),
        proptest::collection::vec(op(), OPS_PER_CASE),
    );
    let result = runner.run(&strategy, |(seed, rates, ops)| {
        let mut w = World::new(seed, rates);
        for op in &ops {
            w.step(op)?;
        }
        w.check_counters()?;
        OPS_RUN.fetch_add(ops.len() as u64, Ordering::Relaxed);
        for k in FaultKind::ALL {
            INJECTED[k.index()].fetch_add(w.cache.store().injected(k), Ordering::Relaxed);
            OBSERVED[k.index()].fetch_add(w.tally.observed[k.index()], Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let ops = OPS_RUN.load(Ordering::Relaxed);
    assert!(ops >= 100_000, "only {ops} operations ran");
    // Coverage: every fault kind was injected, and every data or lease fault was seen by
    // a lookup (client faults are checked one to one against `client_errors` per case).
    for k in &FaultKind::ALL[..CACHE_KINDS] {
        let k = *k;
        let inj = INJECTED[k.index()].load(Ordering::Relaxed);
        assert!(inj > 0, "{} never injected", k.name());
        if !is_client(k) && k != FaultKind::TruncateBlob {
            let obs = OBSERVED[k.index()].load(Ordering::Relaxed);
            assert!(obs > 0, "{} never observed by a lookup", k.name());
        }
    }
}

/// A client failure on either read of a lookup is an error, never a miss.
#[test]
fn broken_client_surfaces_as_error_never_as_silent_miss() {
    for kind in [FaultKind::BufferRegistration, FaultKind::Unavailable] {
        for prefix in [META_PREFIX, BLOB_PREFIX] {
            let mut w = World::new(7, [0.0; FaultKind::COUNT]);
            w.commit(0, 0, false).expect("commit");
            let exp = w.owner_xxh.expect(w.grids[0]).expect("grid");
            let mut buf = vec![0u8; exp.byte_len as usize];
            w.cache.store_mut().push_fault_for(kind, prefix);
            match w.cache.lookup(MS, &w.fps[0], &exp, &mut buf) {
                Err(CacheError::Store(e)) => assert!(e.is_client_failure()),
                other => panic!("{kind:?} on {prefix}: expected a client error, got {other:?}"),
            }
            let c = w.cache.counters();
            assert_eq!(c.misses.total(), 0);
            assert_eq!(c.lookups, 0);
            assert_eq!(c.client_errors, 1);
            // The pair is intact: the next lookup hits.
            let r = w.cache.lookup(2 * MS, &w.fps[0], &exp, &mut buf);
            assert!(matches!(r, Ok(Lookup::Hit { .. })), "{r:?}");
        }
    }
}

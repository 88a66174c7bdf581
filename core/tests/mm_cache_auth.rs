//! Tenant isolation and integrity: keyed fingerprints and MAC'd envelopes (INVARIANTS C10,
//! C11). Hand-made cases for each forgery, the default path unchanged, and a property:
//! several tenants' commits and lookups interleaved with a writer that holds no secret
//! never yield another tenant's entry nor a forged one (>= 100k operations per run,
//! asserted at the end).

use std::sync::atomic::{AtomicU64, Ordering};

use moonagent_core::fingerprint::{
    image_fingerprint, Dtype, FpScheme, GridThw, ImageFp, ModelParts, TenantSecret,
};
use moonagent_core::mm_cache::{
    blob_key, meta_key, Auth, Checksum, CommitOutcome, Envelope, EnvelopeMac, Lookup, MacAlgo,
    MissReason, MmCache, ModelCtx,
};
use moonagent_core::store::{DataType, MemStore, MemStoreConfig, Payload, ReplicateConfig, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const GRID: GridThw = GridThw::new(1, 2, 4);
const HIDDEN: u64 = 8;
/// Processed pixels of an image: `[patches, 4]` u8 (tiny; the encoding is what matters).
const SHAPE: [u64; 2] = [8, 4];
const TENANTS: usize = 3;
const IMAGES: usize = 4;

type Cache = MmCache<MemStore<String>>;

fn secret(t: usize) -> TenantSecret {
    TenantSecret::new([0x40 + t as u8; 32])
}

fn parts(t: usize) -> ModelParts {
    ModelParts::example(&format!("tenant-{t}"))
}

fn plain_ctx(t: usize) -> ModelCtx {
    ModelCtx::new(parts(t), HIDDEN).expect("valid ctx")
}

fn keyed_ctx(t: usize) -> ModelCtx {
    plain_ctx(t)
        .with_keyed_fingerprints(secret(t))
        .with_mac(secret(t))
}

fn pixels(img: usize) -> Vec<u8> {
    (0..32).map(|i| (i * 7 + img * 131) as u8).collect()
}

/// The deterministic embedding a tenant's encoder produces for an image (content
/// addressed: the same image under the same model always gives the same bytes).
fn embedding(t: usize, img: usize, len: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ (t as u8 * 17) ^ (img as u8 * 5))
        .collect()
}

fn fp_of(ctx: &ModelCtx, img: usize) -> ImageFp {
    ctx.image_fingerprint(GRID, &SHAPE, Dtype::U8, &pixels(img))
        .expect("valid")
}

fn cache() -> Cache {
    MmCache::new(MemStore::new(MemStoreConfig::with_capacity(1 << 22)).expect("valid config"))
}

fn len() -> u64 {
    plain_ctx(0).expect(GRID).expect("grid").byte_len
}

fn lookup(c: &mut Cache, ctx: &ModelCtx, fp: &ImageFp, now: u64) -> (Lookup, Vec<u8>) {
    let exp = ctx.expect(GRID).expect("grid");
    let mut buf = vec![0u8; exp.byte_len as usize];
    let r = c
        .lookup(now, fp, &exp, &mut buf)
        .expect("no client failure");
    (r, buf)
}

fn raw_get(c: &mut Cache, key: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 1 << 16];
    let n = c.store_mut().get_into(0, key, &mut buf).ok()?;
    buf.truncate(n as usize);
    Some(buf)
}

fn raw_put(c: &mut Cache, key: &str, bytes: Vec<u8>) {
    let s = c.store_mut();
    let _ = s.remove(0, key, true);
    let cfg = ReplicateConfig::of(DataType::EncoderOutput);
    s.put(0, key, Payload::Bytes(bytes), &cfg).expect("raw put");
}

fn envelope_at(c: &mut Cache, fp: &ImageFp) -> Envelope {
    Envelope::decode(&raw_get(c, &meta_key(fp)).expect("meta present")).expect("valid envelope")
}

#[test]
fn default_envelopes_and_fingerprints_carry_no_auth_and_keyed_ones_name_it() {
    let (plain, keyed) = (plain_ctx(0), keyed_ctx(0));
    // A keyed fingerprint is not the plain one, and differs per secret.
    let p = fp_of(&plain, 0);
    let k = fp_of(&keyed, 0);
    assert_eq!(
        p,
        image_fingerprint(&plain.fp(), GRID, &SHAPE, Dtype::U8, &pixels(0)).expect("valid")
    );
    assert_ne!(p, k);
    let other = plain_ctx(0).with_keyed_fingerprints(secret(1));
    assert_ne!(k, fp_of(&other, 0));
    let mut c = cache();
    let bytes = embedding(0, 0, len());
    for (ctx, fp) in [(&plain, p), (&keyed, k)] {
        assert_eq!(
            c.commit(0, ctx, fp, GRID, &bytes),
            Ok(CommitOutcome::Committed)
        );
    }
    let meta = raw_get(&mut c, &meta_key(&p)).expect("meta");
    assert!(
        !String::from_utf8_lossy(&meta).contains("auth"),
        "a default envelope must not mention auth"
    );
    assert_eq!(envelope_at(&mut c, &p).auth, None);
    let a = envelope_at(&mut c, &k)
        .auth
        .expect("keyed envelope names its auth");
    assert_eq!(a.fp, FpScheme::Keyed);
    assert_eq!(a.mac.map(|m| m.algo), Some(MacAlgo::Blake2b256Keyed));
    // Each reader hits its own entry.
    assert_eq!(lookup(&mut c, &plain, &p, 1).0, Lookup::Hit { len: len() });
    assert_eq!(lookup(&mut c, &keyed, &k, 1).0, Lookup::Hit { len: len() });
    assert_eq!(c.counters().misses.total(), 0);
}

/// Commit tenant 0's image 0 keyed; returns the cache, the context and the key.
fn keyed_pair() -> (Cache, ModelCtx, ImageFp) {
    let ctx = keyed_ctx(0);
    let fp = fp_of(&ctx, 0);
    let mut c = cache();
    let r = c.commit(0, &ctx, fp, GRID, &embedding(0, 0, len()));
    assert_eq!(r, Ok(CommitOutcome::Committed));
    (c, ctx, fp)
}

fn assert_unauthenticated(c: &mut Cache, ctx: &ModelCtx, fp: &ImageFp, what: &str) {
    let before = c.counters().misses.unauthenticated;
    let (r, _) = lookup(c, ctx, fp, 5);
    assert_eq!(r, Lookup::Miss(MissReason::Unauthenticated), "{what}");
    assert_eq!(c.counters().misses.unauthenticated, before + 1, "{what}");
}

#[test]
fn every_forgery_without_the_secret_is_an_unauthenticated_miss() {
    let len = len();
    // 1. Other blob bytes, with their checksum recomputed in the envelope.
    let (mut c, ctx, fp) = keyed_pair();
    let mut env = envelope_at(&mut c, &fp);
    let evil = embedding(2, 3, len);
    env.checksum = Some(Checksum::of(env.checksum.expect("sum").algo, &evil));
    raw_put(&mut c, &meta_key(&fp), env.encode().expect("encode"));
    raw_put(&mut c, &blob_key(&fp), evil);
    assert_unauthenticated(&mut c, &ctx, &fp, "tampered blob");

    // 2. The authentication stripped (a plain envelope over forged bytes).
    let (mut c, ctx, fp) = keyed_pair();
    let mut env = envelope_at(&mut c, &fp);
    env.auth = None;
    raw_put(&mut c, &meta_key(&fp), env.encode().expect("encode"));
    assert_unauthenticated(&mut c, &ctx, &fp, "auth stripped");

    // 3. The MAC dropped, the fingerprint scheme kept.
    let (mut c, ctx, fp) = keyed_pair();
    let mut env = envelope_at(&mut c, &fp);
    env.auth = Some(Auth {
        fp: FpScheme::Keyed,
        mac: None,
    });
    raw_put(&mut c, &meta_key(&fp), env.encode().expect("encode"));
    assert_unauthenticated(&mut c, &ctx, &fp, "mac dropped");

    // 4. A whole pair planted by a writer with its own secret, under the victim's key,
    // claiming the victim's tenant and model.
    let (mut c, ctx, fp) = keyed_pair();
    let forger = plain_ctx(0)
        .with_keyed_fingerprints(secret(9))
        .with_mac(secret(9));
    let r = c.commit(1, &forger, fp, GRID, &embedding(9, 0, len));
    assert_eq!(r, Ok(CommitOutcome::Committed));
    assert_unauthenticated(&mut c, &ctx, &fp, "planted with another secret");

    // 5. A random tag.
    let (mut c, ctx, fp) = keyed_pair();
    let mut env = envelope_at(&mut c, &fp);
    env.auth = Some(Auth {
        fp: FpScheme::Keyed,
        mac: Some(EnvelopeMac {
            algo: MacAlgo::Blake2b256Keyed,
            tag: [0x11; 32],
        }),
    });
    raw_put(&mut c, &meta_key(&fp), env.encode().expect("encode"));
    assert_unauthenticated(&mut c, &ctx, &fp, "random tag");

    // 6. Another tenant's genuine pair copied under this tenant's key (envelope fp
    // rewritten to match): its tenant and MAC are another's.
    let (mut c, ctx, fp) = keyed_pair();
    let other = keyed_ctx(1);
    let ofp = fp_of(&other, 0);
    let r = c.commit(0, &other, ofp, GRID, &embedding(1, 0, len));
    assert_eq!(r, Ok(CommitOutcome::Committed));
    let mut env = envelope_at(&mut c, &ofp);
    env.fp = fp;
    let blob = raw_get(&mut c, &blob_key(&ofp)).expect("blob");
    raw_put(&mut c, &meta_key(&fp), env.encode().expect("encode"));
    raw_put(&mut c, &blob_key(&fp), blob);
    let (r, _) = lookup(&mut c, &ctx, &fp, 5);
    assert!(
        matches!(
            r,
            Lookup::Miss(MissReason::TenantMismatch | MissReason::Unauthenticated)
        ),
        "{r:?}"
    );

    // 7. Readers whose authentication differs from the writer's miss as unauthenticated
    // both ways: an unkeyed reader of a keyed pair and a keyed reader of a plain pair.
    let (mut c, _, fp) = keyed_pair();
    assert_unauthenticated(&mut c, &plain_ctx(0), &fp, "plain reader of a keyed pair");
    let plain = plain_ctx(0);
    let pfp = fp_of(&plain, 1);
    let r = c.commit(0, &plain, pfp, GRID, &embedding(0, 1, len));
    assert_eq!(r, Ok(CommitOutcome::Committed));
    assert_unauthenticated(&mut c, &keyed_ctx(0), &pfp, "keyed reader of a plain pair");

    // 8. Same fingerprint secret, MAC presence differing: a reader that keys its
    // fingerprints but holds no MAC secret does not take a MAC'd pair (it cannot verify
    // the tag), and a reader with a MAC secret does not take a pair without one. (Kills
    // `auth_matches`' `&&` -> `||`, which accepts on the fingerprint scheme alone.)
    let fp_only = plain_ctx(0).with_keyed_fingerprints(secret(0));
    let (mut c, _, fp) = keyed_pair();
    assert_eq!(fp_of(&fp_only, 0), fp, "same fingerprint secret, same key");
    assert_unauthenticated(
        &mut c,
        &fp_only,
        &fp,
        "fingerprint-only reader of a MAC'd pair",
    );
    let mut c2 = cache();
    let r = c2.commit(0, &fp_only, fp, GRID, &embedding(0, 0, len));
    assert_eq!(r, Ok(CommitOutcome::Committed));
    assert_unauthenticated(&mut c2, &keyed_ctx(0), &fp, "MAC reader of a MAC-less pair");
    // Unauthenticated misses do not delete the pair (only corruption does).
    assert_eq!(c.counters().pairs_deleted, 0);
    assert_eq!(c2.counters().pairs_deleted, 0);
}

#[test]
fn size_only_pairs_are_maced_too_and_keyed_contexts_skip_the_memo() {
    let ctx = keyed_ctx(0);
    let fp = fp_of(&ctx, 0);
    let mut c = cache();
    for _ in 0..2 {
        // Twice: the second commit would come from a template if keyed contexts used one.
        let r = c.commit_size_only(0, &ctx, fp, GRID);
        assert_eq!(r, Ok(CommitOutcome::Committed));
        let exp = ctx.expect(GRID).expect("grid");
        let r = c.lookup_size_only(1, &fp, &exp).expect("lookup");
        assert_eq!(r, Lookup::Hit { len: len() });
    }
    let env = envelope_at(&mut c, &fp);
    assert!(env.auth.and_then(|a| a.mac).is_some());
    // The envelope's byte length is bound by the MAC: a forger that rewrites it and the
    // blob's size is refused (here the reader expects the length, so it is a mismatch
    // first; with the length kept and the tag replaced it is unauthenticated).
    let mut forged = env.clone();
    if let Some(a) = forged.auth.as_mut() {
        a.mac = Some(EnvelopeMac {
            algo: MacAlgo::Blake2b256Keyed,
            tag: [0; 32],
        });
    }
    raw_put(&mut c, &meta_key(&fp), forged.encode().expect("encode"));
    let exp = ctx.expect(GRID).expect("grid");
    let r = c.lookup_size_only(2, &fp, &exp).expect("lookup");
    assert_eq!(r, Lookup::Miss(MissReason::Unauthenticated));
}

// ------------------------------------------------------------------ the property

#[derive(Debug, Clone)]
enum Op {
    /// Tenant commits its embedding of an image.
    Commit { t: usize, img: usize },
    /// Tenant looks up an image with its own keyed context.
    Lookup { t: usize, img: usize },
    /// Tenant `t` probes for `v`'s image: the plain fingerprint under `v`'s model parts,
    /// looked up with an unkeyed context naming `v` (all `t` can compute without `v`'s
    /// secret).
    Probe { t: usize, v: usize, img: usize },
    /// Forger copies the pair under one key to another key (envelope fp rewritten or not).
    Copy {
        from: (usize, usize),
        to: (usize, usize),
        rewrite_fp: bool,
    },
    /// Forger replaces a blob (checksum recomputed in the envelope).
    Tamper { at: (usize, usize), salt: u8 },
    /// Forger plants a whole pair under a tenant's key with its own secret.
    Plant { at: (usize, usize) },
    /// Forger strips the envelope's authentication.
    Strip { at: (usize, usize) },
}

fn op() -> impl Strategy<Value = Op> {
    let ti = (0..TENANTS, 0..IMAGES);
    prop_oneof![
        4 => ti.clone().prop_map(|(t, img)| Op::Commit { t, img }),
        6 => ti.clone().prop_map(|(t, img)| Op::Lookup { t, img }),
        2 => (0..TENANTS, 0..TENANTS, 0..IMAGES).prop_map(|(t, v, img)| Op::Probe { t, v, img }),
        2 => (ti.clone(), ti.clone(), any::<bool>())
            .prop_map(|(from, to, rewrite_fp)| Op::Copy { from, to, rewrite_fp }),
        1 => (ti.clone(), any::<u8>()).prop_map(|(at, salt)| Op::Tamper { at, salt }),
        1 => ti.clone().prop_map(|at| Op::Plant { at }),
        1 => ti.prop_map(|at| Op::Strip { at }),
    ]
}

struct World {
    cache: Cache,
    ctxs: Vec<ModelCtx>,
    /// `fps[t][img]`: tenant t's keyed fingerprint of the image.
    fps: Vec<Vec<ImageFp>>,
    /// Whether tenant t ever committed the image (content addressed: bytes never change).
    committed: [[bool; IMAGES]; TENANTS],
    len: u64,
    now: u64,
    hits: u64,
    unauthenticated: u64,
}

impl World {
    fn new() -> Self {
        let ctxs: Vec<ModelCtx> = (0..TENANTS).map(keyed_ctx).collect();
        let fps = ctxs
            .iter()
            .map(|c| (0..IMAGES).map(|i| fp_of(c, i)).collect())
            .collect();
        Self {
            cache: cache(),
            ctxs,
            fps,
            committed: [[false; IMAGES]; TENANTS],
            len: len(),
            now: 0,
            hits: 0,
            unauthenticated: 0,
        }
    }

    fn key(&self, (t, img): (usize, usize)) -> ImageFp {
        self.fps[t][img]
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        self.now += 1000;
        let now = self.now;
        match *op {
            Op::Commit { t, img } => {
                let bytes = embedding(t, img, self.len);
                let fp = self.fps[t][img];
                let r = self.cache.commit(now, &self.ctxs[t], fp, GRID, &bytes);
                prop_assert_eq!(r, Ok(CommitOutcome::Committed));
                self.committed[t][img] = true;
            }
            Op::Lookup { t, img } => {
                let fp = self.fps[t][img];
                let (r, buf) = lookup(&mut self.cache, &self.ctxs[t], &fp, now);
                match r {
                    Lookup::Hit { len } => {
                        self.hits += 1;
                        prop_assert!(
                            self.committed[t][img],
                            "hit on a pair tenant {t} never committed"
                        );
                        prop_assert_eq!(len, self.len);
                        prop_assert!(
                            buf == embedding(t, img, self.len),
                            "tenant {t} image {img}: foreign or forged bytes"
                        );
                    }
                    Lookup::Miss(MissReason::Unauthenticated) => self.unauthenticated += 1,
                    Lookup::Miss(_) => {}
                }
            }
            Op::Probe { t, v, img } => {
                // The prober knows the victim's tenant name, model and image, not its
                // secret.
                let ctx = plain_ctx(v);
                let fp = fp_of(&ctx, img);
                prop_assert!(
                    !self.fps[v].contains(&fp),
                    "a plain fingerprint equals a keyed key"
                );
                let (r, _) = lookup(&mut self.cache, &ctx, &fp, now);
                prop_assert!(
                    matches!(r, Lookup::Miss(_)),
                    "tenant {t} found tenant {v}'s image {img}: {r:?}"
                );
            }
            Op::Copy {
                from,
                to,
                rewrite_fp,
            } => {
                let (src, dst) = (self.key(from), self.key(to));
                let meta = raw_get(&mut self.cache, &meta_key(&src));
                let blob = raw_get(&mut self.cache, &blob_key(&src));
                if let (Some(meta), Some(blob)) = (meta, blob) {
                    let meta = match (rewrite_fp, Envelope::decode(&meta)) {
                        (true, Ok(mut env)) => {
                            env.fp = dst;
                            env.encode().expect("encode")
                        }
                        _ => meta,
                    };
                    raw_put(&mut self.cache, &meta_key(&dst), meta);
                    raw_put(&mut self.cache, &blob_key(&dst), blob);
                }
            }
            Op::Tamper { at, salt } => {
                let fp = self.key(at);
                if let Some(Ok(mut env)) =
                    raw_get(&mut self.cache, &meta_key(&fp)).map(|m| Envelope::decode(&m))
                {
                    let evil: Vec<u8> = embedding(at.0, at.1, self.len)
                        .iter()
                        .map(|b| b ^ salt.max(1))
                        .collect();
                    if let Some(sum) = env.checksum {
                        env.checksum = Some(Checksum::of(sum.algo, &evil));
                    }
                    raw_put(
                        &mut self.cache,
                        &meta_key(&fp),
                        env.encode().expect("encode"),
                    );
                    raw_put(&mut self.cache, &blob_key(&fp), evil);
                }
            }
            Op::Plant { at } => {
                let fp = self.key(at);
                let forger = plain_ctx(at.0)
                    .with_keyed_fingerprints(secret(7))
                    .with_mac(secret(7));
                let bytes = embedding(TENANTS, at.1, self.len);
                let r = self.cache.commit(now, &forger, fp, GRID, &bytes);
                prop_assert_eq!(r, Ok(CommitOutcome::Committed));
            }
            Op::Strip { at } => {
                let fp = self.key(at);
                if let Some(Ok(mut env)) =
                    raw_get(&mut self.cache, &meta_key(&fp)).map(|m| Envelope::decode(&m))
                {
                    env.auth = None;
                    raw_put(
                        &mut self.cache,
                        &meta_key(&fp),
                        env.encode().expect("encode"),
                    );
                }
            }
        }
        Ok(())
    }
}

const CASES: u32 = 64;
const OPS_PER_CASE: usize = 1600;

static OPS_RUN: AtomicU64 = AtomicU64::new(0);
static HITS: AtomicU64 = AtomicU64::new(0);
static UNAUTHENTICATED: AtomicU64 = AtomicU64::new(0);

#[test]
fn no_tenant_ever_gets_another_tenants_or_a_forged_entry() {
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        max_shrink_iters: 500,
        ..Config::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), OPS_PER_CASE), |ops| {
        let mut w = World::new();
        for op in &ops {
            w.step(op)?;
        }
        prop_assert_eq!(
            w.cache.counters().misses.unauthenticated,
            w.unauthenticated,
            "every unauthenticated miss is counted under its own name"
        );
        OPS_RUN.fetch_add(ops.len() as u64, Ordering::Relaxed);
        HITS.fetch_add(w.hits, Ordering::Relaxed);
        UNAUTHENTICATED.fetch_add(w.unauthenticated, Ordering::Relaxed);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let ops = OPS_RUN.load(Ordering::Relaxed);
    assert!(ops >= 100_000, "only {ops} operations ran");
    // Coverage: genuine hits happened and forgeries reached lookups.
    assert!(HITS.load(Ordering::Relaxed) > 1000);
    assert!(UNAUTHENTICATED.load(Ordering::Relaxed) > 100);
    eprintln!(
        "{ops} operations, {} hits, {} unauthenticated misses",
        HITS.load(Ordering::Relaxed),
        UNAUTHENTICATED.load(Ordering::Relaxed)
    );
}

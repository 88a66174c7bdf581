//! The store, not the policy, guarantees safety: a rogue policy that proposes every slot
//! (leased, hard-pinned, in-progress, soft-pinned when that is not allowed, being read,
//! free, and one past the end) gets exactly the candidates and nothing else, and every
//! refusal is counted (INVARIANTS S2). Also the lease rule of S4 under a caller whose
//! clock lags: a read never shortens a lease.
//!
//! Each test here kills a mutation the model-based properties do not (a conforming policy
//! never proposes a non-candidate, and the model's clock never runs backwards).

use moonagent_core::store::{
    EvictRequest, EvictionPolicy, MemStore, MemStoreConfig, ObjId, ObjectMeta, Payload,
    ReplicateConfig, Store, StoreError, SEC,
};

/// Proposes every slot index, then one past the end: what a buggy plug-in might do.
#[derive(Debug, Default)]
struct Rogue;

impl EvictionPolicy for Rogue {
    fn name(&self) -> &str {
        "rogue"
    }
    fn select_victims(
        &mut self,
        _req: &EvictRequest,
        objects: &[ObjectMeta],
        out: &mut Vec<ObjId>,
    ) {
        out.extend((0..=objects.len() as u32).map(ObjId));
    }
}

fn rogue_store(allow_soft: bool) -> MemStore<String> {
    let cfg = MemStoreConfig {
        capacity_bytes: 100,
        // Synchronous eviction: the run happens at the end of the call that crosses 90%.
        eviction_interval_ns: 0,
        allow_evict_soft_pinned: allow_soft,
        ..MemStoreConfig::default()
    };
    MemStore::with_policy_box(cfg, Box::new(Rogue)).expect("valid config")
}

fn put(s: &mut MemStore<String>, now: u64, key: &str, size: u64, cfg: ReplicateConfig) {
    s.put(now, key, Payload::SizeOnly(size), &cfg)
        .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
}

/// Present (complete or in progress) without granting a lease.
fn present(s: &MemStore<String>, key: &str) -> bool {
    s.peek(key).is_some()
}

/// When the rogue runs (the put that crosses the watermark).
const RUN: u64 = 20 * SEC;

/// Builds the store every refusal test starts from, 85 of 100 bytes used, each object
/// protected by exactly one rule at [`RUN`]: `hard` (hard-pinned), `leased` (read at 15 s,
/// lease to 25 s), `writing` (put in progress), `soft` (soft-pinned), `reading` (a read
/// opened at 0 s and still open; its lease ended at 10 s), and one free slot. The
/// caller's next put crosses the watermark.
fn protected_store(allow_soft: bool) -> MemStore<String> {
    let mut s = rogue_store(allow_soft);
    let plain = ReplicateConfig::default();
    let hard = ReplicateConfig {
        hard_pin: true,
        ..plain
    };
    let soft = ReplicateConfig {
        soft_pin: true,
        ..plain
    };
    put(&mut s, 0, "hard", 20, hard);
    put(&mut s, 0, "leased", 20, plain);
    s.put_start(0, "writing", 20, &plain).expect("put start");
    put(&mut s, 0, "soft", 15, soft);
    put(&mut s, 0, "reading", 10, plain);
    assert_eq!(s.begin_read(0, "reading"), Ok(10));
    // A freed slot: the rogue proposes it too.
    put(&mut s, 0, "gone", 1, plain);
    s.remove(0, "gone", true).expect("remove");
    assert!(s.exists(15 * SEC, "leased").expect("exists"));
    assert_eq!(s.used_bytes(), 85);
    assert_eq!(s.stats().eviction_runs, 0);
    s
}

#[test]
fn rogue_policy_gets_only_candidates_and_every_refusal_is_counted() {
    let mut s = protected_store(false);
    // The victim takes the free slot; 85 + 7 = 92 > 90 triggers one run at the end of
    // this put.
    put(&mut s, RUN, "victim", 7, ReplicateConfig::default());
    // Slots: hard, leased, writing, soft, reading, victim (the freed slot reused), and
    // one past the end: six proposals refused, one evicted; after it 85 <= 90.
    assert!(!present(&s, "victim"), "the one candidate goes");
    for k in ["hard", "leased", "writing", "soft", "reading"] {
        assert!(present(&s, k), "{k} was evicted although protected");
    }
    let st = s.stats();
    assert_eq!(st.eviction_runs, 1);
    assert_eq!(st.policy_refused, 6, "{st:?}");
    assert_eq!(st.by_type.iter().map(|t| t.evicted).sum::<u64>(), 1);
    assert_eq!(s.used_bytes(), 85);
}

#[test]
fn rogue_policy_takes_soft_pinned_only_where_allowed_and_protection_ends_on_time() {
    let mut s = protected_store(true);
    put(&mut s, RUN, "victim", 7, ReplicateConfig::default());
    // Soft-pinned objects may go here: the store lets the policy order them.
    assert!(!present(&s, "victim") && !present(&s, "soft"));
    assert_eq!(s.stats().policy_refused, 5, "{:?}", s.stats());
    // Once the lease has expired and the read has ended, those objects are candidates like
    // any other: the refusals above were for protection, not for the slots.
    assert_eq!(s.end_read(RUN, "reading"), Ok(()));
    put(&mut s, 26 * SEC, "filler", 30, ReplicateConfig::default());
    assert!(!present(&s, "leased") && !present(&s, "reading"));
    assert!(present(&s, "hard") && present(&s, "writing"));
}

#[test]
fn a_read_with_a_lagging_clock_never_shortens_the_lease() {
    // Callers stamp `now` before they reach the store (two clients, two threads), so a
    // read may arrive with an earlier `now` than the one before it; the store tolerates
    // that (`advance` clamps its own clock) and the lease is `max(old, now + ttl)`.
    let ttl = MemStoreConfig::default().kv_lease_ttl_ns;
    let mut s: MemStore<String> =
        MemStore::new(MemStoreConfig::with_capacity(1 << 20)).expect("valid config");
    put(&mut s, 0, "k", 10, ReplicateConfig::default());
    assert!(s.exists(5 * SEC, "k").expect("exists"));
    assert!(s.exists(4 * SEC, "k").expect("exists"));
    assert_eq!(s.peek("k").map(|m| m.lease_timeout), Some(5 * SEC + ttl));
    // Behaviourally: between the two candidate expiries the object is still leased.
    let between = 4 * SEC + ttl + SEC / 2;
    assert_eq!(s.remove(between, "k", false), Err(StoreError::HasLease));
    assert_eq!(s.remove(5 * SEC + ttl, "k", false), Ok(()));
}

#[test]
fn an_open_read_holds_the_object_past_its_lease_under_the_default_policy() {
    let cfg = MemStoreConfig {
        capacity_bytes: 100,
        eviction_interval_ns: 0,
        ..MemStoreConfig::default()
    };
    let mut s: MemStore<String> = MemStore::new(cfg).expect("valid config");
    let plain = ReplicateConfig::default();
    put(&mut s, 0, "read", 50, plain);
    assert_eq!(s.begin_read(0, "read"), Ok(50));
    assert_eq!(s.peek("read").map(|m| m.readers), Some(1));
    // At 20 s the lease (10 s) is long gone but the transfer is still open: the put that
    // crosses the watermark evicts the only candidate, the new object, not the one read.
    put(&mut s, 20 * SEC, "new", 45, plain);
    assert!(present(&s, "read") && !present(&s, "new"));
    assert_eq!(s.stats().policy_refused, 0);
    // A remove without force waits for the reader too; a forced one does not.
    assert_eq!(s.remove(20 * SEC, "read", false), Err(StoreError::HasLease));
    assert_eq!(s.end_read(20 * SEC, "read"), Ok(()));
    assert!(matches!(
        s.end_read(20 * SEC, "read"),
        Err(StoreError::InvalidParams(_))
    ));
    // Closed: the next crossing takes it (it is now the oldest lease).
    put(&mut s, 21 * SEC, "next", 45, plain);
    assert!(!present(&s, "read") && present(&s, "next"));
    assert_eq!(s.end_read(21 * SEC, "read"), Err(StoreError::NotFound));
}

//! Offline bounds against online policies, on the same access sequence.
//!
//! Invariants held (for INVARIANTS.md):
//! - `belady_is_min_and_bounds_every_online_policy_unit_sizes`: with unit sizes, no leases
//!   or pins and one victim per miss (the store configured as a cache of `k` objects with
//!   bypass), `belady` on the store scores exactly the textbook MIN's hits, and no policy
//!   scores more; `belady-cost` with uniform penalties scores exactly Belady's hits.
//! - `unit_size_min_bounds_every_policy_with_sizes`: with sizes (and leases, pins off,
//!   the master's default watermark and tick), every policy's hit count is at most MIN's
//!   on a unit-size cache of `floor(capacity_bytes / smallest size)` objects, the bound
//!   that holds with sizes (Belady on the sized store itself is not a bound).
//! - `belady_cost_is_a_heuristic_not_a_bound_with_unequal_penalties`: an exact sequence
//!   on which LRU saves more recompute cost than `belady-cost`.
//!
//! Driver: each access is a `get_size_with` (a hit when it returns Ok); a miss puts the
//! object. Every access carries `next_access` from one backward pass over the sequence.

use moonagent_core::store::{
    AccessHints, MemStore, MemStoreConfig, Payload, PolicyConfig, ReplicateConfig, MS,
};
use proptest::prelude::*;
use rustc_hash::FxHashMap;

/// `next[i]` = index of the next access to `keys[i]`, `u64::MAX` if none (backward pass).
fn next_accesses(keys: &[u32]) -> Vec<u64> {
    let mut last: FxHashMap<u32, u64> = FxHashMap::default();
    let mut next = vec![u64::MAX; keys.len()];
    for i in (0..keys.len()).rev() {
        next[i] = last.insert(keys[i], i as u64).unwrap_or(u64::MAX);
    }
    next
}

/// Textbook MIN (Belady 1966) with bypass on a cache of `k` unit objects: on a miss the
/// new object joins and, if that overflows, the one (new one included) whose next use is
/// furthest leaves. Returns the hit count.
fn min_hits(keys: &[u32], k: usize) -> u64 {
    let next = next_accesses(keys);
    let mut cache: FxHashMap<u32, u64> = FxHashMap::default();
    let mut hits = 0;
    for (i, &key) in keys.iter().enumerate() {
        if let Some(n) = cache.get_mut(&key) {
            hits += 1;
            *n = next[i];
            continue;
        }
        cache.insert(key, next[i]);
        if cache.len() > k {
            let (&victim, _) = cache.iter().max_by_key(|(&k, &n)| (n, k)).unwrap();
            cache.remove(&victim);
        }
    }
    hits
}

/// The textbook store: `k + 1` unit slots, synchronous eviction of exactly one object
/// when the `(k+1)`-th arrives (`used > hwm` only then; target = lower bound =
/// `ceil((k+1) * 0.5 / (k+1)) = 1`), no leases (`kv_lease_ttl = 0`).
fn textbook(k: u64) -> MemStoreConfig {
    let cap = k + 1;
    MemStoreConfig {
        capacity_bytes: cap,
        high_watermark: (cap as f64 - 0.5) / cap as f64,
        eviction_ratio: 0.0,
        kv_lease_ttl_ns: 0,
        eviction_interval_ns: 0,
        ..MemStoreConfig::default()
    }
}

/// Replay `keys` on a store; returns (hits, recompute cost saved by hits).
fn replay(
    cfg: &MemStoreConfig,
    policy: &PolicyConfig,
    keys: &[u32],
    size: impl Fn(u32) -> u64,
    penalty: impl Fn(u32) -> u64,
    max_resident: Option<u64>,
) -> (u64, u64) {
    let next = next_accesses(keys);
    let mut s: MemStore<u32> = MemStore::with_policy(cfg.clone(), policy).unwrap();
    let (mut hits, mut saved) = (0, 0);
    for (i, &key) in keys.iter().enumerate() {
        let now = 1000 * MS + i as u64 * MS;
        let h = AccessHints {
            miss_penalty_ns: penalty(key),
            next_access: next[i],
            tenant: key % 3,
            priority: (key % 2) as u8,
        };
        if s.get_size_with(now, &key, Some(h)).is_ok() {
            hits += 1;
            saved += penalty(key);
        } else {
            let r = s.put_with(
                now,
                key,
                Payload::SizeOnly(size(key)),
                &ReplicateConfig::default(),
                h,
            );
            if max_resident.is_some() {
                assert!(r.is_ok(), "{}: textbook put failed: {r:?}", policy.name());
            }
        }
        if let Some(m) = max_resident {
            assert!(
                s.len() <= m,
                "{}: {} resident > {m}",
                policy.name(),
                s.len()
            );
        }
        assert_eq!(s.stats().policy_refused, 0);
    }
    (hits, saved)
}

fn online() -> Vec<PolicyConfig> {
    [
        r#"{"policy":"mooncake-default"}"#,
        r#"{"policy":"type-aware"}"#,
        r#"{"policy":"type-aware","types":{"general":{"reuse_scale":8.0,"eviction_grace_ms":3}}}"#,
        r#"{"policy":"lru"}"#,
        r#"{"policy":"fifo"}"#,
        r#"{"policy":"s3-fifo"}"#,
        r#"{"policy":"gdsf"}"#,
    ]
    .iter()
    .map(|j| PolicyConfig::from_json_str(j).unwrap())
    .chain(std::iter::once(
        PolicyConfig::from_toml_str(include_str!("data/hierarchical.toml")).unwrap(),
    ))
    .collect()
}

/// Skewed keys: a few hot ones and a tail.
fn keys() -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(
        prop_oneof![3 => 0u32..4, 2 => 0u32..12, 1 => 0u32..40],
        1..300,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn belady_is_min_and_bounds_every_online_policy_unit_sizes(
        keys in keys(),
        k in 1u64..8,
    ) {
        let cfg = textbook(k);
        let unit = |_| 1;
        let flat = |_| 1000;
        let (bh, _) = replay(&cfg, &PolicyConfig::Belady {}, &keys, unit, flat, Some(k));
        prop_assert_eq!(bh, min_hits(&keys, k as usize), "store + belady != textbook MIN");
        let (ch, _) = replay(&cfg, &PolicyConfig::BeladyCost {}, &keys, unit, flat, Some(k));
        prop_assert_eq!(ch, bh, "belady-cost with uniform penalties != belady");
        for p in online() {
            let (h, _) = replay(&cfg, &p, &keys, unit, flat, Some(k));
            prop_assert!(h <= bh, "{} scored {} hits > Belady's {}", p.name(), h, bh);
        }
    }

    #[test]
    fn unit_size_min_bounds_every_policy_with_sizes(
        keys in keys(),
        cap in 40u64..200,
        tick in any::<bool>(),
    ) {
        let cfg = MemStoreConfig {
            capacity_bytes: cap,
            kv_lease_ttl_ns: 3 * MS,
            eviction_interval_ns: if tick { 10 * MS } else { 0 },
            ..MemStoreConfig::default()
        };
        let size = |key: u32| 4 + u64::from(key * 7 % 13); // 4..=16 bytes
        let penalty = |key: u32| 100 + u64::from(key % 5) * 1000;
        let bound = min_hits(&keys, (cap / 4) as usize);
        let mut all = online();
        all.push(PolicyConfig::Belady {});
        all.push(PolicyConfig::BeladyCost {});
        for p in all {
            let (h, _) = replay(&cfg, &p, &keys, size, penalty, None);
            prop_assert!(h <= bound, "{} scored {} hits > the unit-size MIN bound {}", p.name(), h, bound);
        }
    }
}

#[test]
fn belady_cost_is_a_heuristic_not_a_bound_with_unequal_penalties() {
    // k = 1; A costs 1, B costs 2. A B A A A A A B.
    let keys = [0, 1, 0, 0, 0, 0, 0, 1];
    let cfg = textbook(1);
    let penalty = |key: u32| if key == 0 { 1 } else { 2 };
    let run = |p: PolicyConfig| replay(&cfg, &p, &keys, |_| 1, penalty, Some(1));
    // Belady keeps A: 5 hits.
    assert_eq!(run(PolicyConfig::Belady {}), (5, 5));
    // belady-cost keeps the dearer B and bypasses A every time: it saves 2.
    assert_eq!(run(PolicyConfig::BeladyCost {}), (1, 2));
    // LRU keeps A after its second access: it saves 4, more than belady-cost.
    assert_eq!(run(PolicyConfig::Lru {}), (4, 4));
}

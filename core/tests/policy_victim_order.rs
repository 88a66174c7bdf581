//! Exact victim order of every policy on small hand-made cases (foyer's `Dump` style):
//! each test builds a tiny object table, drives the policy's hooks as `MemStore` does,
//! and asserts the victims, in order, that one eviction run plans.

mod common;

use common::{meta, Table};
use moonagent_core::store::policies::{
    Belady, BeladyCost, Fifo, Gdsf, Hierarchical, Lru, S3Fifo, S3FifoConfig, Sieve, TypeAware,
    TypeAwareConfig, TypeKnobs, WTinyLfu, WTinyLfuConfig,
};
use moonagent_core::store::{
    AccessHints, DataType, EvictionPolicy, MooncakeDefault, ObjId, ObjectMeta, PolicyConfig, MS,
    SEC,
};

const KV: DataType = DataType::KvCache;
const EO: DataType = DataType::EncoderOutput;
const GEN: DataType = DataType::General;

fn type_aware(f: impl FnOnce(&mut TypeAwareConfig)) -> TypeAware {
    let mut c = TypeAwareConfig::default();
    f(&mut c);
    TypeAware::new(&c).expect("valid config")
}

fn ids(v: &[ObjId]) -> Vec<u32> {
    v.iter().map(|i| i.0).collect()
}

fn soft(mut m: ObjectMeta) -> ObjectMeta {
    m.soft_pin_until = Some(u64::MAX);
    m
}

// ---------------------------------------------------------------- mooncake-default

#[test]
fn mooncake_default_evicts_by_lease_then_insertion() {
    let mut p = MooncakeDefault::new();
    let mut t = Table::new(1000);
    for lease in [30, 10, 20, 10, 200] {
        t.insert(&mut p, meta(10, GEN, lease * MS));
    }
    // Slot 4 is still leased at 100 ms.
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 3, 2)), [1, 3, 2]);
}

// ---------------------------------------------------------------- type-aware

#[test]
fn type_aware_defaults_rank_like_mooncake_default() {
    let mut p = type_aware(|_| {});
    let mut q = MooncakeDefault::new();
    let mut t = Table::new(1000);
    for lease in [30, 10, 20, 10, 200] {
        t.insert(&mut p, meta(10, GEN, lease * MS));
    }
    let req = t.req(100 * MS, 3, 2);
    let (mut a, mut b) = (Vec::new(), Vec::new());
    p.select_victims(&req, &t.metas, &mut a);
    q.select_victims(&req, &t.metas, &mut b);
    assert_eq!(ids(&a), [1, 3, 2]);
    assert_eq!(a, b);
}

#[test]
fn type_aware_adjusted_age_formula_at_its_edges() {
    let p = type_aware(|c| {
        c.types.encoder_output = TypeKnobs {
            reuse_scale: 4.0,
            soft_pin_weight: 2.0,
            eviction_grace_ms: 30,
            budget_ratio: None,
        };
    });
    let now = 100 * MS;
    // (100 - 0 - 30) ms * 1 / 4
    assert_eq!(p.adjusted_age(&meta(1, EO, 0), now), 17.5 * MS as f64);
    // soft-pinned: weight 2 applies
    assert_eq!(p.adjusted_age(&soft(meta(1, EO, 0)), now), 35.0 * MS as f64);
    // grace larger than the age since lease expiry: 0, not negative
    assert_eq!(p.adjusted_age(&meta(1, EO, 80 * MS), now), 0.0);
    // grace equal to that age: 0
    assert_eq!(p.adjusted_age(&meta(1, EO, 70 * MS), now), 0.0);
    // one ns past the grace
    assert_eq!(p.adjusted_age(&meta(1, EO, 70 * MS - 4), now), 1.0);
    // other types keep the defaults: the plain age
    assert_eq!(p.adjusted_age(&meta(1, KV, 0), now), 100.0 * MS as f64);
    // soft_pin_weight touches soft-pinned objects only
    assert_eq!(
        p.adjusted_age(&soft(meta(1, KV, 0)), now),
        100.0 * MS as f64
    );
    // still leased: age clamps to 0
    assert_eq!(p.adjusted_age(&meta(1, KV, 150 * MS), now), 0.0);
}

#[test]
fn type_aware_reuse_scale_and_grace_reorder_types() {
    let mut p = type_aware(|c| {
        c.types.encoder_output.reuse_scale = 8.0;
        c.types.encoder_output.eviction_grace_ms = 10;
    });
    let mut t = Table::new(1000);
    t.insert(&mut p, meta(10, EO, 0)); // (100-10)/8 = 11.25
    t.insert(&mut p, meta(10, KV, 80 * MS)); // 20
    t.insert(&mut p, meta(10, KV, 95 * MS)); // 5
    t.insert(&mut p, meta(10, EO, 85 * MS)); // (15-10)/8 = 0.625
    t.insert(&mut p, meta(10, EO, 95 * MS)); // grace > age: 0, lease 95
    t.insert(&mut p, meta(10, KV, 100 * MS)); // age 0, lease 100
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 6, 3)), [1, 0, 2, 3, 4, 5]);
}

#[test]
fn type_aware_grace_alone_reverses_the_order_of_two_types() {
    // Same reuse scale and weight: only the grace separates the types, so a policy that
    // ignores `eviction_grace_ms` plans the other order.
    let plan = |grace_ms: u64, target: u64, lower: u64| {
        let mut p = type_aware(|c| c.types.encoder_output.eviction_grace_ms = grace_ms);
        let mut t = Table::new(1000);
        t.insert(&mut p, meta(10, EO, 0)); // 100 - 0 - 50 = 50 ms (100 without grace)
        t.insert(&mut p, meta(10, KV, 30 * MS)); // 70 ms
        t.insert(&mut p, meta(10, EO, 20 * MS)); // 80 - 50 = 30 ms (80 without grace)
        t.insert(&mut p, meta(10, KV, 60 * MS)); // 40 ms
        t.evict(&mut p, &t.req(100 * MS, target, lower))
    };
    assert_eq!(plan(50, 4, 2), [1, 0, 3, 2]);
    // A quota of one takes the KV object, not the older encoder output.
    assert_eq!(plan(50, 1, 1), [1]);
    // Without the grace the encoder outputs go first (the baseline this test separates).
    assert_eq!(plan(0, 4, 2), [0, 2, 1, 3]);
    assert_eq!(plan(0, 1, 1), [0]);
}

#[test]
fn type_aware_rejects_invalid_knobs_naming_the_field() {
    for (json, field) in [
        (
            r#"{"policy":"type-aware","types":{"encoder_output":{"reuse_scale":0}}}"#,
            "types.encoder_output.reuse_scale",
        ),
        (
            r#"{"policy":"type-aware","types":{"kv_cache":{"reuse_scale":-1.5}}}"#,
            "types.kv_cache.reuse_scale",
        ),
        (
            r#"{"policy":"type-aware","types":{"general":{"soft_pin_weight":0}}}"#,
            "types.general.soft_pin_weight",
        ),
        (
            r#"{"policy":"type-aware","types":{"kv_cache":{"budget_ratio":1.5}}}"#,
            "types.kv_cache.budget_ratio",
        ),
        (
            r#"{"policy":"type-aware","types":{"kv_cache":{"budget_ratio":-0.1}}}"#,
            "types.kv_cache.budget_ratio",
        ),
    ] {
        let e = PolicyConfig::from_json_str(json).expect_err(json);
        assert!(e.to_string().contains(field), "{e} should name {field}");
    }
    // Unknown type names and fields are parse errors naming them.
    let e = PolicyConfig::from_json_str(r#"{"policy":"type-aware","types":{"hidden":{}}}"#)
        .unwrap_err();
    assert!(e.to_string().contains("hidden"), "{e}");
    let e = PolicyConfig::from_json_str(
        r#"{"policy":"type-aware","types":{"kv_cache":{"eviction_grace":5}}}"#,
    )
    .unwrap_err();
    assert!(e.to_string().contains("eviction_grace"), "{e}");
}

#[test]
fn type_aware_budget_zero_puts_the_type_first_and_budget_one_never_triggers() {
    let table = |p: &mut TypeAware| {
        let mut t = Table::new(1000);
        t.insert(p, meta(10, EO, 0)); // age 100
        t.insert(p, meta(10, KV, 50 * MS)); // 50
        t.insert(p, meta(10, KV, 60 * MS)); // 40
        t.insert(p, meta(10, EO, 10 * MS)); // 90
        t.insert(p, meta(10, KV, 500 * MS)); // leased: resident, not a candidate
        t
    };
    // Budget 0: KV is over budget by all its 30 resident bytes; its two candidates (20
    // bytes) cannot cover that, so both go first; the third victim by age.
    let mut p = type_aware(|c| c.types.kv_cache.budget_ratio = Some(0.0));
    let mut t = table(&mut p);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 3, 2)), [1, 2, 0]);
    // The budget phase is capped by the quota.
    let mut p = type_aware(|c| c.types.kv_cache.budget_ratio = Some(0.0));
    let mut t = table(&mut p);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 1, 1)), [1]);
    // Budget 1 (the whole capacity) can never be exceeded: plain adjusted-age order.
    let mut p = type_aware(|c| {
        c.types.kv_cache.budget_ratio = Some(1.0);
        c.types.encoder_output.budget_ratio = Some(1.0);
    });
    let mut t = table(&mut p);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 3, 2)), [0, 3, 1]);
}

#[test]
fn type_aware_soft_pass_sees_the_bytes_the_unpinned_pass_freed() {
    // One run, two passes: resident bytes per type carry from the unpinned pass into the
    // soft-pinned one. EO has a 300-byte budget; KV none. One unpinned candidate, and a
    // lower bound of 2, so the soft pass takes one.
    let run = |eo_leased: u64| {
        let mut p = type_aware(|c| c.types.encoder_output.budget_ratio = Some(0.3));
        let mut t = Table::new(1000);
        t.insert(&mut p, meta(100, EO, 50 * MS)); // 0: unpinned EO, age 50
        t.insert(&mut p, soft(meta(100, EO, 60 * MS))); // 1: soft EO, age 40
        t.insert(&mut p, soft(meta(100, KV, 10 * MS))); // 2: soft KV, age 90
        t.insert(&mut p, meta(eo_leased, EO, 500 * MS)); // 3: leased EO, resident only
        t.evict(&mut p, &t.req(100 * MS, 1, 2))
    };
    // EO resident 400 > 300: the unpinned pass takes the EO by budget (-100 -> 300), so
    // in the soft pass EO is within budget and the soft victim is the oldest, the KV.
    assert_eq!(run(200), [0, 2]);
    // EO resident 300 = budget: the unpinned pass takes the EO by age (-100 -> 200); the
    // soft pass again goes by age.
    assert_eq!(run(100), [0, 2]);
    // EO resident 500: 400 after the unpinned pass, still over: the soft EO goes first.
    assert_eq!(run(300), [0, 1]);
}

#[test]
fn every_policy_evicts_zero_size_objects() {
    // A put of an empty payload is legal, so a zero-size object can be a victim: no
    // policy may divide by its size or treat it as absent.
    for c in all_configs() {
        let mut p = c.build().expect("valid");
        let mut t = Table::new(1000);
        t.insert(p.as_mut(), meta(0, KV, 0));
        t.insert(p.as_mut(), meta(0, EO, 0));
        t.insert(p.as_mut(), meta(10, GEN, 0));
        let v = t.evict(p.as_mut(), &t.req(100 * MS, 3, 3));
        assert_eq!(v.len(), 3, "{}: {v:?}", p.name());
    }
}

#[test]
fn every_policy_is_named_as_its_config() {
    // Names label every report and replay column: each built policy says its config tag.
    for c in all_configs() {
        let tag = serde_json::to_value(&c).expect("serializes")["policy"]
            .as_str()
            .expect("tagged")
            .to_owned();
        assert_eq!(c.build().expect("valid").name(), tag);
    }
}

#[test]
fn type_aware_over_budget_takes_the_shortest_prefix_that_fits_the_budget() {
    let table = |p: &mut TypeAware, leased_eo: bool| {
        let mut t = Table::new(1000);
        t.insert(p, meta(100, EO, 0)); // age 100
        t.insert(p, meta(100, EO, 20 * MS)); // 80
        t.insert(p, meta(50, EO, 40 * MS)); // 60
        t.insert(p, meta(300, KV, 10 * MS)); // 90
        t.insert(p, meta(300, KV, 30 * MS)); // 70
        if leased_eo {
            t.insert(p, meta(60, EO, 500 * MS)); // leased: counts as resident
        }
        t
    };
    let budget = |c: &mut TypeAwareConfig| c.types.encoder_output.budget_ratio = Some(0.1);
    // Encoder outputs hold 250 bytes, budget 100: over by 150, covered by the first two
    // (200 bytes); the third stays. Then the rest by age: KV 3 (90), KV 4 (70).
    let mut p = type_aware(budget);
    let mut t = table(&mut p, false);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 4, 2)), [0, 1, 3, 4]);
    // With a leased 60-byte encoder output resident, over by 210: all three go first.
    let mut p = type_aware(budget);
    let mut t = table(&mut p, true);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 4, 2)), [0, 1, 2, 3]);
    // A quota smaller than the prefix takes the prefix's largest ages.
    let mut p = type_aware(budget);
    let mut t = table(&mut p, true);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 2, 1)), [0, 1]);
}

#[test]
fn type_aware_two_types_over_budget_share_the_quota_by_adjusted_age() {
    let mut p = type_aware(|c| {
        c.types.encoder_output.budget_ratio = Some(0.1);
        c.types.kv_cache.budget_ratio = Some(0.5);
    });
    let fill = |p: &mut TypeAware| {
        let mut t = Table::new(100);
        for lease in [0, 50, 70] {
            t.insert(p, meta(10, EO, lease * MS)); // 0..=2: ages 100, 50, 30
        }
        for lease in [10, 20, 30, 40, 60, 80] {
            t.insert(p, meta(10, KV, lease * MS)); // 3..=8: ages 90 .. 20
        }
        t
    };
    // EO over by 20 -> prefix {0, 1}; KV over by 10 -> prefix {3}. Union by age: 0, 3, 1.
    let mut t = fill(&mut p);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 2, 1)), [0, 3]);
    let mut t = fill(&mut p);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 5, 2)), [0, 3, 1, 4, 5]);
}

#[test]
fn type_aware_soft_pinned_go_after_unpinned_ranked_by_weight() {
    let mut p = type_aware(|c| {
        c.types.kv_cache.soft_pin_weight = 0.5;
        c.types.encoder_output.soft_pin_weight = 2.0;
    });
    let fill = |p: &mut TypeAware| {
        let mut t = Table::new(1000);
        t.insert(p, soft(meta(10, KV, 0))); // 100 * 0.5 = 50
        t.insert(p, soft(meta(10, EO, 50 * MS))); // 50 * 2 = 100
        t.insert(p, meta(10, KV, 90 * MS)); // 10
        t.insert(p, meta(10, EO, 95 * MS)); // 5
        t
    };
    let mut t = fill(&mut p);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 1, 1)), [2]);
    let mut t = fill(&mut p);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 4, 3)), [2, 3, 1]);
    let mut t = fill(&mut p);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 4, 4)), [2, 3, 1, 0]);
    let mut t = fill(&mut p);
    let mut req = t.req(100 * MS, 4, 4);
    req.allow_soft_pinned = false;
    assert_eq!(t.evict(&mut p, &req), [2, 3]);
}

// ---------------------------------------------------------------- lru / fifo

#[test]
fn lru_evicts_least_recent_skipping_leased_and_survives_slot_reuse() {
    let mut p = Lru::new();
    let mut t = Table::new(100);
    for _ in 0..5 {
        t.insert(&mut p, meta(1, GEN, 0)); // a..e = 0..4
    }
    t.access(&mut p, ObjId(1), MS, MS);
    t.access(&mut p, ObjId(0), 2 * MS, 2 * MS);
    t.access(&mut p, ObjId(3), 3 * MS, 500 * MS); // leased until 500 ms
    assert_eq!(ids(&p.dump()), [3, 0, 1, 4, 2]);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 3, 1)), [2, 4, 1]);
    assert_eq!(ids(&p.dump()), [3, 0]);
    // The freed slots are reused (last freed first): the new object is the most recent.
    let f = t.insert(&mut p, meta(1, GEN, 0));
    assert_eq!(f, ObjId(1));
    assert_eq!(ids(&p.dump()), [1, 3, 0]);
    p.check(&t.metas).unwrap();
    // Slot 3 is skipped while leased, taken after.
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 2, 1)), [0, 1]);
    assert_eq!(t.evict(&mut p, &t.req(600 * MS, 1, 1)), [3]);
    p.check(&t.metas).unwrap();
}

#[test]
fn fifo_evicts_oldest_insertion_and_ignores_reads() {
    let mut p = Fifo::new();
    let mut t = Table::new(100);
    for _ in 0..5 {
        t.insert(&mut p, meta(1, GEN, 0));
    }
    t.access(&mut p, ObjId(1), MS, MS);
    t.access(&mut p, ObjId(0), 2 * MS, 2 * MS);
    t.access(&mut p, ObjId(3), 3 * MS, 500 * MS);
    assert_eq!(ids(&p.dump()), [4, 3, 2, 1, 0]);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 3, 1)), [0, 1, 2]);
    // Only 4 is left as a candidate (3 is leased): the run falls short, as it must.
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 3, 1)), [4]);
    p.check(&t.metas).unwrap();
}

// ---------------------------------------------------------------- s3-fifo

#[test]
fn s3fifo_small_main_and_ghost_queues() {
    // Threshold 1 (one read moves an object to M), so that both read objects move.
    let mut p = S3Fifo::new(&S3FifoConfig {
        move_threshold: 1,
        ..S3FifoConfig::default()
    })
    .unwrap();
    let mut t = Table::new(100); // small queue: 10 bytes, main: 90
    for _ in 0..4 {
        t.insert(&mut p, meta(10, GEN, 0)); // a b c d = 0..3, all into S
    }
    let hash_a = t.metas[0].key_hash;
    t.access(&mut p, ObjId(1), MS, MS);
    t.access(&mut p, ObjId(1), MS, MS);
    t.access(&mut p, ObjId(2), MS, MS);
    assert_eq!((p.freq(ObjId(1)), p.freq(ObjId(2))), (2, 1));
    assert_eq!(
        p.dump(),
        (vec![ObjId(3), ObjId(2), ObjId(1), ObjId(0)], vec![])
    );
    // a was never read: evicted from S, its key goes to the ghost.
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 1, 1)), [0]);
    assert!(p.in_ghost(hash_a));
    // b and c were read: moved to M (frequency cleared); d evicted from S; S is then
    // empty, so the next step evicts M's tail, b.
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 2, 1)), [3, 1]);
    assert_eq!(p.dump(), (vec![], vec![ObjId(2)]));
    // a comes back: a ghost hit, so straight into M (in a reused slot).
    let mut m = meta(10, GEN, 100 * MS);
    m.key_hash = hash_a;
    let a2 = t.insert(&mut p, m);
    assert_eq!(a2, ObjId(1));
    assert!(!p.in_ghost(hash_a));
    let e = t.insert(&mut p, meta(10, GEN, 100 * MS));
    assert_eq!(e, ObjId(3));
    assert_eq!(p.dump(), (vec![ObjId(3)], vec![ObjId(1), ObjId(2)]));
    p.check(&t.metas).unwrap();
    // c is read once more and leased: it is reinserted (frequency 1 -> 0), a2 goes.
    t.access(&mut p, ObjId(2), 100 * MS, 300 * MS);
    assert_eq!(t.evict(&mut p, &t.req(200 * MS, 1, 1)), [3]); // S first: e
    assert_eq!(t.evict(&mut p, &t.req(200 * MS, 1, 1)), [1]);
    assert_eq!(p.dump(), (vec![], vec![ObjId(2)]));
    // c is leased at 200 ms: nothing to evict; at 300 ms it goes.
    assert_eq!(t.evict(&mut p, &t.req(200 * MS, 1, 1)), Vec::<u32>::new());
    assert_eq!(t.evict(&mut p, &t.req(300 * MS, 1, 1)), [2]);
    p.check(&t.metas).unwrap();
}

#[test]
fn s3fifo_user_remove_does_not_feed_the_ghost() {
    let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
    let mut t = Table::new(100);
    let a = t.insert(&mut p, meta(10, GEN, 0));
    let h = t.metas[a.index()].key_hash;
    t.remove(&mut p, a);
    assert!(!p.in_ghost(h));
    p.check(&t.metas).unwrap();
}

/// Put `n` objects of 10 bytes one at a time, each evicted from `S` at once (never read),
/// so that their key hashes fill the ghost in order; returns the hashes, oldest first.
fn s3fifo_fill_ghost(p: &mut S3Fifo, t: &mut Table, n: usize) -> Vec<u64> {
    (0..n)
        .map(|_| {
            let id = t.insert(p, meta(10, GEN, 0));
            let h = t.metas[id.index()].key_hash;
            assert_eq!(t.evict(p, &t.req(MS, 1, 1)), [id.0]);
            h
        })
        .collect()
}

#[test]
fn s3fifo_default_move_threshold_is_two_reads_as_in_libcachesim() {
    assert_eq!(S3FifoConfig::default().move_threshold, 2);
    let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
    let mut t = Table::new(100); // small queue: 10 bytes
    let a = t.insert(&mut p, meta(10, GEN, 0));
    let b = t.insert(&mut p, meta(10, GEN, 0));
    let hash_a = t.metas[a.index()].key_hash;
    t.access(&mut p, a, MS, MS);
    t.access(&mut p, b, MS, MS);
    t.access(&mut p, b, MS, MS);
    // a was read once: below the threshold, evicted from S into the ghost; b (read twice)
    // would move to M, but the run already has its victim.
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [a.0]);
    assert!(p.in_ghost(hash_a));
    assert_eq!(p.dump(), (vec![b], vec![]));
    // Next run: b moves to M (frequency cleared), S is then empty, so M's tail goes: b.
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [b.0]);
    p.check(&t.metas).unwrap();
}

#[test]
fn s3fifo_ghost_hit_frees_its_bytes_so_the_ghost_keeps_its_full_share() {
    let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
    let mut t = Table::new(100); // ghost: 90 bytes = 9 keys of 10 bytes
    let h = s3fifo_fill_ghost(&mut p, &mut t, 9);
    assert_eq!(p.ghost_bytes(), 90);
    // h[4] comes back: a ghost hit, into M; its 10 bytes leave the ghost at once.
    let mut m = meta(10, GEN, 0);
    m.key_hash = h[4];
    let back = t.insert(&mut p, m);
    assert_eq!(p.dump(), (vec![], vec![back]));
    assert!(!p.in_ghost(h[4]));
    assert_eq!(p.ghost_bytes(), 80);
    // One more key into the ghost: 8 live keys + 1 fit in 90 bytes, so the oldest stays
    // (with the hit's bytes still counted, h[0] would be pushed out here).
    let new = s3fifo_fill_ghost(&mut p, &mut t, 1);
    assert!(p.in_ghost(h[0]) && p.in_ghost(new[0]));
    assert_eq!(p.ghost_bytes(), 90);
    // The tenth key pushes out the oldest live one, h[0]; the stale h[4] entry counts nothing.
    s3fifo_fill_ghost(&mut p, &mut t, 1);
    assert!(!p.in_ghost(h[0]) && p.in_ghost(h[1]));
    assert_eq!(p.ghost_bytes(), 90);
    p.check(&t.metas).unwrap();
}

#[test]
fn s3fifo_lookup_miss_decides_the_ghost_hit_before_the_evictions_that_make_room() {
    for early in [false, true] {
        let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
        let mut t = Table::new(100);
        let h = s3fifo_fill_ghost(&mut p, &mut t, 9);
        let x = t.insert(&mut p, meta(10, GEN, 0));
        if early {
            // libCacheSim's order: the lookup of h[0] misses and takes it from the ghost ...
            p.on_lookup_miss(h[0]);
        }
        // ... then making room evicts x into the ghost, which would push h[0] out.
        assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [x.0]);
        let mut m = meta(10, GEN, 0);
        m.key_hash = h[0];
        let back = t.insert(&mut p, m);
        let want = if early {
            (vec![], vec![back])
        } else {
            (vec![back], vec![])
        };
        assert_eq!(p.dump(), want, "early lookup: {early}");
        p.check(&t.metas).unwrap();
    }
}

#[test]
fn s3fifo_warm_up_fills_main_once_small_is_full_only_before_the_first_eviction() {
    for announce in [false, true] {
        let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
        if announce {
            p.on_capacity(100); // small queue: 10 bytes
        }
        let mut t = Table::new(100);
        let a = t.insert(&mut p, meta(10, GEN, 0));
        let b = t.insert(&mut p, meta(10, GEN, 0));
        let want = if announce {
            // libCacheSim's S3FIFO.c: S is full, nothing evicted yet, so b goes to M.
            (vec![a], vec![b])
        } else {
            // `MemStore` never announces: the paper's warm-up, everything into S.
            (vec![b, a], vec![])
        };
        assert_eq!(p.dump(), want, "announced: {announce}");
        assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [a.0]);
        // After the first eviction, new objects go to S whatever its fill.
        let c = t.insert(&mut p, meta(10, GEN, 0));
        let d = t.insert(&mut p, meta(10, GEN, 0));
        assert_eq!(p.dump().0[..2], [d, c]);
        p.check(&t.metas).unwrap();
    }
}

// ---------------------------------------------------------------- sieve

#[test]
fn sieve_hand_clears_visited_bits_and_stays_where_it_evicted() {
    let mut p = Sieve::new();
    let mut t = Table::new(1000);
    for _ in 0..5 {
        t.insert(&mut p, meta(10, GEN, 0)); // 0..=4, 0 oldest
    }
    t.access(&mut p, ObjId(0), MS, MS);
    t.access(&mut p, ObjId(1), MS, MS);
    t.access(&mut p, ObjId(3), MS, MS);
    // From the tail: 0 and 1 visited (bits cleared, kept in place), 2 goes; the hand rests
    // on 3.
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [2]);
    assert_eq!(p.hand(), Some(ObjId(3)));
    // From the hand, not the tail: 3 visited (cleared), 4 goes; the hand wraps to the tail.
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [4]);
    assert_eq!(p.hand(), None);
    // 0 and 1 lost their bits on the first pass: the oldest goes now, then the next.
    assert_eq!(t.evict(&mut p, &t.req(MS, 2, 2)), [0, 1]);
    // A new object goes in at the head; nothing moved on a hit.
    let n = t.insert(&mut p, meta(10, GEN, 0));
    t.access(&mut p, n, MS, MS);
    assert_eq!(p.dump(), [(n, true), (ObjId(3), false)]);
    p.check(&t.metas).unwrap();
}

#[test]
fn sieve_passes_leased_objects_and_a_removed_hand_moves_to_the_newer_one() {
    let mut p = Sieve::new();
    let mut t = Table::new(1000);
    t.insert(&mut p, meta(10, GEN, 500 * MS)); // 0: leased until 500 ms
    for _ in 0..3 {
        t.insert(&mut p, meta(10, GEN, 0)); // 1..=3
    }
    // 0 is leased: passed, not evicted; 1 goes, the hand rests on 2.
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 1, 1)), [1]);
    assert_eq!(p.hand(), Some(ObjId(2)));
    // A user remove of the object under the hand moves the hand to its newer neighbour.
    t.remove(&mut p, ObjId(2));
    assert_eq!(p.hand(), Some(ObjId(3)));
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 1, 1)), [3]);
    // Only the leased object is left: nothing to evict until its lease ends.
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 1, 1)), Vec::<u32>::new());
    assert_eq!(t.evict(&mut p, &t.req(500 * MS, 1, 1)), [0]);
    p.check(&t.metas).unwrap();
}

// ---------------------------------------------------------------- w-tinylfu

#[test]
fn wtinylfu_window_moves_to_main_then_the_sketch_decides_admission() {
    // 10 objects of 1 byte: window 10% = 1, main 9 (protected 7).
    let cfg = WTinyLfuConfig {
        window_ratio: 0.1,
        ..WTinyLfuConfig::default()
    };
    let mut p = WTinyLfu::new(&cfg).unwrap();
    p.on_capacity(10);
    let mut t = Table::new(10);
    let x: Vec<ObjId> = (0..10).map(|_| t.insert(&mut p, meta(1, GEN, 0))).collect();
    let h = |t: &Table, id: ObjId| t.metas[id.index()].key_hash;
    // Main has room for x0..x8, which move to probation; then x9 (estimate 1: its insert)
    // meets main's victim x0 (2: insert + once a window victim): not higher, x9 goes.
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [x[9].0]);
    let probation: Vec<ObjId> = x[..9].iter().rev().copied().collect();
    assert_eq!(p.dump(), [vec![], probation, vec![]]);
    assert_eq!((p.estimate(h(&t, x[0])), p.estimate(h(&t, x[9]))), (2, 2));
    // A hit in probation promotes to protected (and counts).
    t.access(&mut p, x[1], MS, MS);
    assert_eq!(p.dump()[2], [x[1]]);
    // z comes, is refused (1 vs x0's 2) and counted as a window victim (2); it comes
    // back (3 > 2): admitted to probation, and main's victim x0 goes.
    let mut zm = meta(1, GEN, 0);
    zm.key_hash = 0x2A;
    let z = t.insert(&mut p, zm.clone());
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [z.0]);
    assert_eq!(p.estimate(0x2A), 2);
    let z = t.insert(&mut p, zm);
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [x[0].0]);
    assert_eq!(p.dump()[1][0], z);
    p.check(&t.metas).unwrap();
}

#[test]
fn wtinylfu_a_tie_keeps_main_victim_and_evicts_the_candidate() {
    let cfg = WTinyLfuConfig {
        window_ratio: 0.1,
        ..WTinyLfuConfig::default()
    };
    let mut p = WTinyLfu::new(&cfg).unwrap();
    p.on_capacity(10);
    let mut t = Table::new(10);
    let x: Vec<ObjId> = (0..10).map(|_| t.insert(&mut p, meta(1, GEN, 0))).collect();
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [x[9].0]);
    // A candidate sharing main's victim's key hash has exactly its estimate: a tie, which
    // admission (strictly higher) refuses.
    let mut m = meta(1, GEN, 0);
    m.key_hash = t.metas[x[0].index()].key_hash;
    let y = t.insert(&mut p, m);
    assert_eq!(p.estimate(t.metas[y.index()].key_hash), 3);
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [y.0]);
}

// ---------------------------------------------------------------- gdsf

fn with_cost(size: u64, penalty: u64) -> ObjectMeta {
    let mut m = meta(size, GEN, 0);
    m.hints.miss_penalty_ns = penalty;
    m
}

#[test]
fn gdsf_evicts_lowest_priority_and_inflates_the_clock() {
    let mut p = Gdsf::new();
    let mut t = Table::new(1000);
    t.insert(&mut p, with_cost(100, 1000)); // 0: H = 10
    t.insert(&mut p, with_cost(10, 50)); // 1: H = 5
    t.insert(&mut p, with_cost(1, 0)); // 2: cost unknown -> 1: H = 1
    t.insert(&mut p, with_cost(50, 500)); // 3: H = 10 ...
    t.access(&mut p, ObjId(3), MS, MS);
    t.access(&mut p, ObjId(3), MS, MS); // ... read twice: H = 3 * 10 = 30
    t.insert(&mut p, with_cost(10, 100)); // 4: H = 10, ties with 0; 0 is less recent
    assert_eq!(p.priority(ObjId(3), &t.metas[3]), 30.0);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 2, 1)), [2, 1]);
    assert_eq!(p.clock(), 5.0);
    // New insertions start from the clock: 5 + 10 / 10 = 6.
    let e = t.insert(&mut p, with_cost(10, 10));
    assert_eq!(p.priority(e, &t.metas[e.index()]), 6.0);
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 3, 1)), [e.0, 0, 4]);
    assert_eq!(p.clock(), 10.0);
}

// ---------------------------------------------------------------- offline

fn with_next(size: u64, next: u64, penalty: u64) -> ObjectMeta {
    let mut m = meta(size, GEN, 0);
    m.hints = AccessHints {
        next_access: next,
        miss_penalty_ns: penalty,
        ..AccessHints::default()
    };
    m
}

#[test]
fn belady_evicts_furthest_next_access_never_first() {
    let mut p = Belady::new();
    let mut t = Table::new(1000);
    t.insert(&mut p, with_next(1, 5, 1));
    t.insert(&mut p, with_next(1, u64::MAX, 1));
    t.insert(&mut p, with_next(1, 9, 1));
    t.insert(&mut p, with_next(1, u64::MAX, 1));
    t.insert(&mut p, with_next(1, 7, 1));
    assert_eq!(t.evict(&mut p, &t.req(SEC, 4, 1)), [1, 3, 2, 4]);
}

#[test]
fn belady_cost_evicts_dead_then_cheapest_per_byte_then_furthest() {
    let mut p = BeladyCost::new();
    let mut t = Table::new(1000);
    t.insert(&mut p, with_next(10, 5, 100)); // 0: density 10
    t.insert(&mut p, with_next(10, u64::MAX, 1000)); // 1: dead
    t.insert(&mut p, with_next(10, 9, 10)); // 2: density 1, next 9
    t.insert(&mut p, with_next(10, 3, 10)); // 3: density 1, next 3
    t.insert(&mut p, with_next(1, 4, 0)); // 4: penalty unknown -> 1: density 1, next 4
    assert_eq!(t.evict(&mut p, &t.req(SEC, 5, 1)), [1, 2, 4, 3, 0]);
}

// ---------------------------------------------------------------- pass structure, all

/// Every policy: soft-pinned objects go only after every unpinned candidate, only up to
/// the lower bound, and never when the store disallows it, however attractive they are.
#[test]
fn every_policy_takes_soft_pinned_only_after_unpinned_up_to_lower_bound() {
    for cfg in all_configs() {
        let fill = |p: &mut dyn EvictionPolicy| {
            let mut t = Table::new(1000);
            // Soft-pinned: oldest, never read, never needed again, cheapest.
            t.insert(p, soft(with_next(10, u64::MAX, 1)));
            t.insert(p, soft(with_next(10, u64::MAX, 1)));
            for i in 0..3 {
                let mut m = with_next(10, 10 + i, 1_000_000);
                m.lease_timeout = 50 * MS;
                t.insert(p, m); // 2..=4
            }
            t.access(p, ObjId(4), 60 * MS, 60 * MS);
            t.access(p, ObjId(3), 60 * MS, 60 * MS);
            t.access(p, ObjId(2), 60 * MS, 60 * MS);
            t
        };
        let name = cfg.name();
        let mut p = cfg.build().unwrap();
        let mut t = fill(&mut *p);
        let v = t.evict(&mut *p, &t.req(SEC, 2, 1));
        assert_eq!(v.len(), 2, "{name}: {v:?}");
        assert!(v.iter().all(|&i| i >= 2), "{name}: {v:?}");
        let mut p = cfg.build().unwrap();
        let mut t = fill(&mut *p);
        let v = t.evict(&mut *p, &t.req(SEC, 5, 4));
        assert_eq!(v.len(), 4, "{name}: {v:?}");
        assert!(v[..3].iter().all(|&i| i >= 2), "{name}: {v:?}");
        assert!(v[3] < 2, "{name}: {v:?}");
        let mut p = cfg.build().unwrap();
        let mut t = fill(&mut *p);
        let mut req = t.req(SEC, 5, 5);
        req.allow_soft_pinned = false;
        let v = t.evict(&mut *p, &req);
        assert_eq!(v.len(), 3, "{name}: {v:?}");
    }
}

fn all_configs() -> Vec<PolicyConfig> {
    let tree = PolicyConfig::from_toml_str(include_str!("data/hierarchical.toml")).unwrap();
    vec![
        PolicyConfig::MooncakeDefault {},
        PolicyConfig::from_json_str(r#"{"policy":"type-aware"}"#).unwrap(),
        PolicyConfig::from_json_str(
            r#"{"policy":"type-aware","types":{"general":{"reuse_scale":8.0,"eviction_grace_ms":10,"budget_ratio":0.0}}}"#,
        )
        .unwrap(),
        tree,
        PolicyConfig::Lru {},
        PolicyConfig::Fifo {},
        PolicyConfig::S3Fifo(S3FifoConfig::default()),
        PolicyConfig::Sieve {},
        PolicyConfig::WTinyLfu(WTinyLfuConfig::default()),
        PolicyConfig::Gdsf {},
        PolicyConfig::Belady {},
        PolicyConfig::BeladyCost {},
    ]
}

// ---------------------------------------------------------------- hierarchical

fn obj(tenant: u32, dt: DataType, priority: u8, lease_s: u64) -> ObjectMeta {
    let mut m = meta(10, dt, lease_s * SEC);
    m.hints.tenant = tenant;
    m.hints.priority = priority;
    m
}

/// The 3-level tree of `data/hierarchical.toml` on 14 objects of 10 bytes:
/// tenant 1: KV low 0..=2, KV high 3..=4, encoder 5..=7, general 8 (its `<rest>`);
/// tenant 2: 9..=11; tenant 3 ("others", weight 0): 12..=13.
fn hier_table(p: &mut dyn EvictionPolicy) -> Table {
    let mut t = Table::new(1000);
    for _ in 0..3 {
        t.insert(p, obj(1, KV, 0, 1));
    }
    for _ in 0..2 {
        t.insert(p, obj(1, KV, 1, 1));
    }
    for lease_s in [0, 50, 95] {
        t.insert(p, obj(1, EO, 0, lease_s)); // adjusted ages 11.25 s, 5 s, 0
    }
    t.insert(p, obj(1, GEN, 0, 1));
    for _ in 0..3 {
        t.insert(p, obj(2, KV, 0, 1));
    }
    for _ in 0..2 {
        t.insert(p, obj(3, GEN, 0, 1));
    }
    t.access(p, ObjId(0), 2 * SEC, 2 * SEC); // LRU order in "low": 1, 2, 0
    t
}

fn hier() -> Box<dyn EvictionPolicy> {
    PolicyConfig::from_toml_str(include_str!("data/hierarchical.toml"))
        .unwrap()
        .build()
        .unwrap()
}

#[test]
fn hierarchical_example_file_routes_objects_to_the_expected_scopes() {
    let PolicyConfig::Hierarchical(c) =
        PolicyConfig::from_toml_str(include_str!("data/hierarchical.toml")).unwrap()
    else {
        panic!("not hierarchical")
    };
    let h = Hierarchical::new(&c).unwrap();
    assert_eq!(
        h.scopes(),
        [
            "tree(store)",
            "tree.children[0](tenant-1)",
            "tree.children[0].children[0](kv)",
            "tree.children[0].children[0].children[0](low)",
            "tree.children[0].children[0].children[1](high)",
            "tree.children[0].children[1](encoder)",
            "tree.children[0].<rest>",
            "tree.children[1](tenant-2)",
            "tree.children[2](others)",
        ]
    );
    let t = hier_table(&mut *hier());
    let leaf = |i: usize| h.leaf_path(&t.metas[i]).to_string();
    assert_eq!(leaf(0), "tree.children[0].children[0].children[0](low)");
    assert_eq!(leaf(4), "tree.children[0].children[0].children[1](high)");
    assert_eq!(leaf(6), "tree.children[0].children[1](encoder)");
    assert_eq!(leaf(8), "tree.children[0].<rest>");
    assert_eq!(leaf(10), "tree.children[1](tenant-2)");
    assert_eq!(leaf(13), "tree.children[2](others)");
}

#[test]
fn hierarchical_three_levels_assign_evict_fallback_exact() {
    let now = 100 * SEC;
    // Target 8. Root (weights 3:1:0) -> tenant-1 gets 6, tenant-2 2, others 0.
    // Tenant-1: encoder is over budget (30 > 20 bytes) by 10: gives 5 first (largest
    // adjusted age). The other 5 split by bytes (kv 50, encoder 20, rest 10) = 3, 1, 1
    // (largest remainder to <rest>). kv (order): low gives 3 in LRU order 1, 2, 0;
    // encoder 6; rest 8. Tenant-2 (fifo): 9, 10.
    let mut p = hier();
    let mut t = hier_table(&mut *p);
    assert_eq!(
        t.evict(&mut *p, &t.req(now, 8, 4)),
        [5, 1, 2, 0, 6, 8, 9, 10]
    );

    // Target 12: tenant-1 gets 9. After the budget victim 5, the 8 left split 5, 2, 1;
    // kv's low tier runs out after 3, so fallback moves kv's shortfall to high (3, 4).
    // Tenant-2 gives all 3.
    let mut p = hier();
    let mut t = hier_table(&mut *p);
    assert_eq!(
        t.evict(&mut *p, &t.req(now, 12, 6)),
        [5, 1, 2, 0, 3, 4, 6, 7, 8, 9, 10, 11]
    );

    // Target 14: shares 11 (largest remainder tie to the earlier child), 3, 0; tenant-1
    // can give only 9, tenant-2 3; the root's fallback takes the shortfall of 2 from the
    // weight-0 scope.
    let mut p = hier();
    let mut t = hier_table(&mut *p);
    assert_eq!(
        t.evict(&mut *p, &t.req(now, 14, 7)),
        [5, 1, 2, 0, 3, 4, 6, 7, 8, 9, 10, 11, 12, 13]
    );
}

#[test]
fn hierarchical_inner_scope_over_budget_gives_first_in_rounds() {
    // Tenant 1 (an inner scope, kv and encoder leaves) over a 3% budget (30 of its 90
    // bytes allowed): it gives 6 victims before tenant 2 gets its share.
    let toml = r#"
policy = "hierarchical"
[tree]
assign = "objects"
[[tree.children]]
select = { tenant = 1 }
budget_ratio = 0.03
assign = "order"
[[tree.children.children]]
select = { data_type = "kv_cache" }
[[tree.children.children]]
select = { data_type = "encoder_output" }
[[tree.children]]
select = { tenant = 2 }
"#;
    let mut p = PolicyConfig::from_toml_str(toml).unwrap().build().unwrap();
    let mut t = hier_table(&mut *p);
    // Tenant 1 holds 0..=8; KV first (lease order 0..=4, lease 2 s for 0 after its read),
    // then encoder (lease order 5, 6, 7). After 6 victims it is at 30 bytes; the
    // remaining 2 of the target split by objects: tenant-1 has 3 left, tenant-2 3,
    // <rest> 2 -> 1, 1, 0 (ties to the earlier).
    assert_eq!(
        t.evict(&mut *p, &t.req(100 * SEC, 8, 4)),
        [1, 2, 3, 4, 0, 5, 6, 9]
    );
}

#[test]
fn hierarchical_rejects_invalid_trees_naming_the_path() {
    for (toml, field) in [
        (
            "policy = \"hierarchical\"\n[tree]\n[[tree.children]]\nweight = -1.0\n",
            "tree.children[0].weight",
        ),
        (
            "policy = \"hierarchical\"\n[tree]\n[[tree.children]]\nselect = \"any\"\n[[tree.children]]\nselect = { tenant = 1 }\n",
            "tree.children[1]: unreachable",
        ),
        (
            "policy = \"hierarchical\"\n[tree]\n[[tree.children]]\nselect = { tenant = 1 }\nbudget_ratio = 2.0\n",
            "tree.children[0].budget_ratio",
        ),
        (
            "policy = \"hierarchical\"\n[tree]\nselect = { tenant = 1 }\n",
            "tree.select",
        ),
        (
            "policy = \"hierarchical\"\n[tree]\nevict = { rule = \"type-aware\", types = { kv_cache = { budget_ratio = 0.5 } } }\n",
            "tree.evict.types.kv_cache.budget_ratio",
        ),
        (
            "policy = \"hierarchical\"\n[tree]\nevict = { rule = \"type-aware\", types = { kv_cache = { reuse_scale = 0.0 } } }\n",
            "tree.evict.types.kv_cache.reuse_scale",
        ),
        (
            "policy = \"hierarchical\"\n[tree]\n[[tree.children]]\nselect = { tenants = [] }\n",
            "tree.children[0].select",
        ),
        ("policy = \"hierarchical\"\n[tree]\nwieght = 1.0\n", "wieght"),
    ] {
        let e = PolicyConfig::from_toml_str(toml).expect_err(toml);
        assert!(e.to_string().contains(field), "{e} should name {field}");
    }
}

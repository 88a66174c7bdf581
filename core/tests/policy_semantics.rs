//! Small exact cases that pin the eviction policies' stated semantics at the edges the
//! other policy tests leave open (each found as a cargo-mutants survivor): boundary
//! comparisons, counters that only matter on a second pass, and the `check()` functions
//! that must reject a policy state that disagrees with the store.

mod common;

use common::{meta, Table};
use moonagent_core::store::policies::{
    Assign, Belady, BeladyCost, Fifo, Gdsf, Hierarchical, HierarchicalConfig, LeafRule, Lru,
    S3Fifo, S3FifoConfig, ScopeConfig, Selector, Sieve, TypeKnobsByType, WTinyLfu, WTinyLfuConfig,
};
use moonagent_core::store::{
    AccessHints, Candidate, DataType, EvictionPolicy, MooncakeDefault, ObjId, ObjectMeta,
    PolicyConfig, VictimIndex, MS,
};

const GEN: DataType = DataType::General;

fn ids(v: &[ObjId]) -> Vec<u32> {
    v.iter().map(|i| i.0).collect()
}

fn soft(mut m: ObjectMeta) -> ObjectMeta {
    m.soft_pin_until = Some(u64::MAX);
    m
}

fn with_next(size: u64, next: u64, penalty: u64) -> ObjectMeta {
    let mut m = meta(size, GEN, 0);
    m.hints = AccessHints {
        next_access: next,
        miss_penalty_ns: penalty,
        ..AccessHints::default()
    };
    m
}

/// A live object the policy was never told about (no `on_insert`).
fn sneak_in(t: &mut Table) {
    t.seq += 1;
    let mut m = meta(10, GEN, 0);
    m.insert_seq = t.seq;
    m.last_access_seq = t.seq;
    t.metas.push(m);
}

// ---------------------------------------------------------------- ObjectMeta / config

#[test]
fn soft_pin_holds_until_its_time_exclusive() {
    let mut m = meta(1, GEN, 0);
    m.soft_pin_until = Some(100);
    assert_eq!(m.candidate(99), Candidate::SoftPinned);
    assert_eq!(m.candidate(100), Candidate::Unpinned);
}

#[test]
fn policy_config_by_name_name_and_offline_flag() {
    for n in PolicyConfig::NAMES {
        if n == "hierarchical" {
            continue; // needs a tree
        }
        let p = PolicyConfig::by_name(n).unwrap();
        assert_eq!(p.name(), n);
        assert_eq!(p.build().unwrap().name(), n);
        assert_eq!(p.is_offline(), n == "belady" || n == "belady-cost", "{n}");
    }
    assert_eq!(PolicyConfig::by_name("lru"), Ok(PolicyConfig::Lru {}));
    assert!(matches!(
        PolicyConfig::by_name("xyzzy"),
        Err(moonagent_core::store::policy::PolicyNameError::Unknown { .. })
    ));
}

// ---------------------------------------------------------------- indexed selection

#[test]
fn only_mooncake_default_asks_for_a_victim_index() {
    assert!(MooncakeDefault::new().uses_victim_index());
    assert!(!Lru::new().uses_victim_index());
}

#[test]
fn default_indexed_selection_is_the_scan() {
    let mut p = Lru::new();
    let mut t = Table::new(100);
    for _ in 0..3 {
        t.insert(&mut p, meta(1, GEN, 0));
    }
    let req = t.req(MS, 2, 2);
    let mut out = Vec::new();
    p.select_victims_indexed(&req, &t.metas, &mut VictimIndex::new(), &mut out);
    assert_eq!(ids(&out), [0, 1]);
}

#[test]
fn mooncake_indexed_counts_only_its_own_victims_onto_a_non_empty_out() {
    // One unpinned and one soft-pinned candidate, lower bound 2: pass 1 takes the unpinned
    // one, so pass 2 tops up with the soft-pinned one, whatever `out` held before.
    let mut t = Table::new(100);
    let mut p = MooncakeDefault::new();
    t.insert(&mut p, meta(1, GEN, 0));
    t.insert(&mut p, soft(meta(1, GEN, 0)));
    let mut ix = VictimIndex::new();
    for (i, m) in t.metas.iter().enumerate() {
        ix.on_live(ObjId(i as u32), m);
    }
    let req = t.req(MS, 1, 2);
    let mut scan = vec![ObjId(99)];
    p.select_victims(&req, &t.metas, &mut scan);
    let mut indexed = vec![ObjId(99)];
    p.select_victims_indexed(&req, &t.metas, &mut ix, &mut indexed);
    assert_eq!(ids(&indexed), [99, 0, 1]);
    assert_eq!(indexed, scan);
}

// ---------------------------------------------------------------- check()

#[test]
fn queue_policies_check_rejects_a_live_object_they_never_saw() {
    let mut t = Table::new(100);
    let mut fifo = Fifo::new();
    let mut lru = Lru::new();
    let mut sieve = Sieve::new();
    let mut s3 = S3Fifo::new(&S3FifoConfig::default()).unwrap();
    for _ in 0..2 {
        let id = t.insert(&mut fifo, meta(10, GEN, 0));
        let m = t.metas[id.index()].clone();
        lru.on_insert(id, &m);
        sieve.on_insert(id, &m);
        s3.on_insert(id, &m);
    }
    fifo.check(&t.metas).unwrap();
    lru.check(&t.metas).unwrap();
    sieve.check(&t.metas).unwrap();
    s3.check(&t.metas).unwrap();
    sneak_in(&mut t);
    assert!(fifo.check(&t.metas).is_err());
    assert!(lru.check(&t.metas).is_err());
    assert!(sieve.check(&t.metas).is_err());
    assert!(s3.check(&t.metas).is_err());
}

#[test]
fn lru_check_rejects_a_read_it_was_not_told_about() {
    let mut p = Lru::new();
    let mut t = Table::new(100);
    t.insert(&mut p, meta(1, GEN, 0));
    t.insert(&mut p, meta(1, GEN, 0));
    p.check(&t.metas).unwrap();
    // The older object read without `on_access`: the queue is now out of recency order.
    t.seq += 1;
    t.metas[0].last_access_seq = t.seq;
    assert!(p.check(&t.metas).is_err());
}

// ---------------------------------------------------------------- belady / belady-cost

#[test]
fn belady_orders_far_next_accesses_exactly() {
    // Both next accesses lie past u64::MAX / 2: the further one (inserted later) goes first.
    let mut p = Belady::new();
    let mut t = Table::new(100);
    t.insert(&mut p, with_next(1, u64::MAX / 2 + 1, 1));
    t.insert(&mut p, with_next(1, u64::MAX / 2 + 2, 1));
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [1]);
}

#[test]
fn belady_cost_orders_far_next_accesses_exactly_at_equal_density() {
    let mut p = BeladyCost::new();
    let mut t = Table::new(100);
    t.insert(&mut p, with_next(1, u64::MAX / 2 + 1, 1));
    t.insert(&mut p, with_next(1, u64::MAX / 2 + 2, 1));
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [1]);
}

#[test]
fn belady_cost_evicts_a_dead_object_before_any_density() {
    let mut p = BeladyCost::new();
    let mut t = Table::new(100);
    t.insert(&mut p, with_next(10, 5, 1)); // density 0.1
    t.insert(&mut p, with_next(1, u64::MAX, 1000)); // never read again
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [1]);
}

// ---------------------------------------------------------------- gdsf

#[test]
fn gdsf_priority_of_an_unhooked_slot_is_clock_plus_value() {
    let mut p = Gdsf::new();
    let mut t = Table::new(1000);
    let mut m = meta(10, GEN, 0);
    m.hints.miss_penalty_ns = 50;
    t.insert(&mut p, m); // H = 5
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [0]);
    assert_eq!(p.clock(), 5.0);
    let mut m = meta(10, GEN, 0);
    m.hints.miss_penalty_ns = 20; // value 2
    assert_eq!(p.priority(ObjId(7), &m), 7.0);
}

// ---------------------------------------------------------------- sieve

#[test]
fn sieve_on_an_empty_queue_plans_nothing() {
    let mut p = Sieve::new();
    let t = Table::new(100);
    let mut out = Vec::new();
    p.select_victims(&t.req(MS, 1, 1), &t.metas, &mut out);
    assert!(out.is_empty());
}

#[test]
fn sieve_a_lone_visited_object_is_cleared_then_evicted() {
    let mut p = Sieve::new();
    let mut t = Table::new(100);
    let a = t.insert(&mut p, meta(1, GEN, 0));
    t.access(&mut p, a, MS, MS);
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [a.0]);
}

#[test]
fn sieve_a_walk_without_victim_leaves_the_hand_one_past_its_start() {
    // Three leased objects: the walk passes each at most twice plus one step (2 * 3 + 1),
    // so it ends one past where it started (the tail, 0): the hand rests on 1.
    let mut p = Sieve::new();
    let mut t = Table::new(100);
    for _ in 0..3 {
        t.insert(&mut p, meta(1, GEN, 500 * MS));
    }
    assert_eq!(t.evict(&mut p, &t.req(100 * MS, 1, 1)), Vec::<u32>::new());
    assert_eq!(p.hand(), Some(ObjId(1)));
    assert_eq!(t.evict(&mut p, &t.req(600 * MS, 1, 1)), [1]);
}

#[test]
fn sieve_takes_a_soft_pinned_object_once_however_often_the_walk_meets_it() {
    let mut p = Sieve::new();
    let mut t = Table::new(100);
    t.insert(&mut p, soft(meta(1, GEN, 0)));
    let mut out = Vec::new();
    p.select_victims(&t.req(MS, 2, 2), &t.metas, &mut out);
    assert_eq!(ids(&out), [0]);
}

// ---------------------------------------------------------------- s3-fifo

/// Put one 10-byte object with `key_hash` `h` (0: a fresh one) and evict it from `S` at once.
fn s3_ghost_one(p: &mut S3Fifo, t: &mut Table, h: u64) -> u64 {
    let mut m = meta(10, GEN, 0);
    m.key_hash = h;
    let id = t.insert(p, m);
    let h = t.metas[id.index()].key_hash;
    assert_eq!(p.dump(), (vec![id], vec![]));
    assert_eq!(t.evict(p, &t.req(MS, 1, 1)), [id.0]);
    h
}

#[test]
fn s3fifo_a_stale_ghost_entry_of_a_re_ghosted_key_does_not_push_it_out() {
    let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
    let mut t = Table::new(100); // ghost: 90 bytes = 9 keys
    let h: Vec<u64> = (0..9).map(|_| s3_ghost_one(&mut p, &mut t, 0)).collect();
    // h[0] comes back (ghost hit, into M), is removed by the user, comes back again (not
    // in the ghost now: into S) and is evicted from S: its key is ghosted a second time,
    // behind h[8]; its first ghost entry is stale.
    let mut m = meta(10, GEN, 0);
    m.key_hash = h[0];
    let back = t.insert(&mut p, m);
    assert_eq!(p.dump(), (vec![], vec![back]));
    t.remove(&mut p, back);
    s3_ghost_one(&mut p, &mut t, h[0]);
    assert_eq!(p.ghost_bytes(), 90);
    // A new key: the ghost is over by 10 bytes; the stale h[0] entry frees nothing, so
    // the oldest live key, h[1], goes.
    let x = s3_ghost_one(&mut p, &mut t, 0);
    assert!(p.in_ghost(h[0]) && p.in_ghost(x) && !p.in_ghost(h[1]) && p.in_ghost(h[2]));
    assert_eq!(p.ghost_bytes(), 90);
    p.check(&t.metas).unwrap();
}

#[test]
fn s3fifo_ghosting_a_live_ghost_key_again_counts_its_bytes_once() {
    // Two objects whose keys share a hash: both evicted from S, the second ghost insert
    // replaces the first entry.
    let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
    let mut t = Table::new(100);
    let mut m = meta(10, GEN, 0);
    m.key_hash = 0xABC;
    t.insert(&mut p, m.clone());
    t.insert(&mut p, m);
    assert_eq!(t.evict(&mut p, &t.req(MS, 2, 2)), [0, 1]);
    assert!(p.in_ghost(0xABC));
    assert_eq!(p.ghost_bytes(), 10);
    p.check(&t.metas).unwrap();
}

#[test]
fn s3fifo_main_reinserts_a_read_object_and_evicts_the_next() {
    let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
    p.on_capacity(100); // small queue: 10 bytes
    let mut t = Table::new(100);
    let a = t.insert(&mut p, meta(10, GEN, 0)); // S
    let b = t.insert(&mut p, meta(10, GEN, 0)); // S full: M
    let c = t.insert(&mut p, meta(10, GEN, 0)); // M
    assert_eq!(p.dump(), (vec![a], vec![c, b]));
    t.access(&mut p, b, MS, MS);
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [a.0]);
    // S is empty: M's tail b has frequency 1, so it is reinserted (frequency 0); c goes.
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [c.0]);
    assert_eq!(p.dump(), (vec![], vec![b]));
    assert_eq!(p.freq(b), 0);
}

#[test]
fn s3fifo_evicts_from_main_only_when_main_holds_more_than_its_share() {
    // Capacity 100: S's share 10 bytes, M's 90. M holds 95 (over) or 90 (not over).
    for (m2, from_main) in [(45, true), (40, false)] {
        let mut p = S3Fifo::new(&S3FifoConfig::default()).unwrap();
        p.on_capacity(100);
        let mut t = Table::new(100);
        let s1 = t.insert(&mut p, meta(10, GEN, 0)); // S
        let m1 = t.insert(&mut p, meta(50, GEN, 0)); // S full: M
        t.insert(&mut p, meta(m2, GEN, 0)); // M
        assert_eq!(p.dump().0, [s1]);
        let want = if from_main { m1 } else { s1 };
        assert_eq!(
            t.evict(&mut p, &t.req(MS, 1, 1)),
            [want.0],
            "M holds {}",
            50 + m2
        );
    }
}

// ---------------------------------------------------------------- w-tinylfu

fn wtinylfu(window_ratio: f64, capacity: u64) -> WTinyLfu {
    let mut p = WTinyLfu::new(&WTinyLfuConfig {
        window_ratio,
        ..WTinyLfuConfig::default()
    })
    .unwrap();
    p.on_capacity(capacity);
    p
}

/// Count `key_hash` once in the sketch (an insert, then a user remove).
fn count_once(p: &mut WTinyLfu, t: &mut Table, key_hash: u64) {
    let mut m = meta(1, GEN, 0);
    m.key_hash = key_hash;
    let id = t.insert(p, m);
    t.remove(p, id);
}

const K: u64 = 0x5EED_0001;
const J: u64 = 0x5EED_0002;

/// The key hash `Table::insert` gives its `seq`-th object.
fn table_hash(seq: u64) -> u64 {
    0x9E37_79B9_7F4A_7C15 ^ seq
}

#[test]
fn wtinylfu_check_rejects_a_live_object_it_never_saw() {
    let mut p = wtinylfu(0.1, 10);
    let mut t = Table::new(10);
    t.insert(&mut p, meta(1, GEN, 0));
    p.check(&t.metas).unwrap();
    sneak_in(&mut t);
    assert!(p.check(&t.metas).is_err());
}

#[test]
fn wtinylfu_sketch_counter_saturates_at_15() {
    let mut p = wtinylfu(0.1, 16); // sample 160: no aging here
    let mut t = Table::new(16);
    for _ in 0..20 {
        count_once(&mut p, &mut t, K);
    }
    assert_eq!(p.estimate(K), 15);
}

#[test]
fn wtinylfu_sketch_halves_every_ten_times_its_width_of_increments() {
    // Width 16: every counter halves at the 160th increment, and the count restarts at
    // half the sample (80), so the next halving comes 80 increments later.
    let mut p = wtinylfu(0.1, 16);
    let mut t = Table::new(16);
    for _ in 0..10 {
        count_once(&mut p, &mut t, K);
    }
    for _ in 0..149 {
        count_once(&mut p, &mut t, J);
    }
    assert_eq!(p.estimate(K), 10);
    count_once(&mut p, &mut t, J); // the 160th
    assert_eq!(p.estimate(K), 5);
    count_once(&mut p, &mut t, J);
    assert_eq!(p.estimate(K), 5);
    for _ in 0..78 {
        count_once(&mut p, &mut t, J);
    }
    assert_eq!(p.estimate(K), 5);
    count_once(&mut p, &mut t, J); // 80 since the halving
    assert_eq!(p.estimate(K), 2);
}

#[test]
fn wtinylfu_sketch_of_width_16_has_64_well_spread_counters() {
    // Count-min with 4 rows over 4 x 16 = 64 four-bit counters, hashed uniformly: after n
    // distinct keys a fresh key reads non-zero with probability about (1 - e^(-4n/64))^4:
    // 2.4% for n = 8, 93% for n = 64. Out of 100 fresh keys, allow a wide margin.
    let fresh_non_zero = |n: u64| {
        let mut p = wtinylfu(0.1, 16);
        let mut t = Table::new(16);
        for s in 1..=n {
            count_once(&mut p, &mut t, table_hash(s));
        }
        (1000..1100)
            .filter(|&s| p.estimate(table_hash(s)) > 0)
            .count()
    };
    let light = fresh_non_zero(8);
    assert!(
        light <= 10,
        "{light} of 100 fresh keys read non-zero after 8 keys"
    );
    let loaded = fresh_non_zero(64);
    assert!(
        loaded >= 70,
        "{loaded} of 100 fresh keys read non-zero after 64 keys"
    );
}

#[test]
fn wtinylfu_sketch_is_created_at_the_first_run_when_no_capacity_was_announced() {
    let mut p = WTinyLfu::new(&WTinyLfuConfig::default()).unwrap();
    let mut t = Table::new(100);
    let mut out = Vec::new();
    p.select_victims(&t.req(MS, 1, 1), &t.metas, &mut out);
    assert!(out.is_empty());
    for _ in 0..3 {
        count_once(&mut p, &mut t, K);
    }
    assert_eq!(p.estimate(K), 3);
}

#[test]
fn wtinylfu_sketch_is_rebuilt_only_when_the_store_holds_more_than_twice_its_width() {
    let mut p = wtinylfu(0.1, 3); // sized for 3 objects
    let mut t = Table::new(3);
    let mut k = meta(1, GEN, 0);
    k.key_hash = K;
    t.insert(&mut p, k);
    for _ in 0..5 {
        t.insert(&mut p, meta(1, GEN, 0));
    }
    // 6 objects: twice the width, not more. A run with nothing to evict keeps the counts.
    assert_eq!(t.evict(&mut p, &t.req(MS, 0, 0)), Vec::<u32>::new());
    assert!(p.estimate(K) >= 1);
    t.insert(&mut p, meta(1, GEN, 0));
    // 7: the sketch is rebuilt, cleared.
    assert_eq!(t.evict(&mut p, &t.req(MS, 0, 0)), Vec::<u32>::new());
    assert_eq!(p.estimate(K), 0);
}

/// After `churn` (which must leave the live count where it was), a run must not rebuild
/// the sketch: `K`, inserted once and leased, keeps its count.
fn wtinylfu_churn_keeps_the_sketch(churn: impl Fn(&mut WTinyLfu, &mut Table)) {
    let mut p = wtinylfu(0.1, 10); // rebuilt above 20 live objects
    let mut t = Table::new(10);
    let mut k = meta(1, GEN, u64::MAX);
    k.key_hash = K;
    t.insert(&mut p, k);
    for _ in 0..25 {
        churn(&mut p, &mut t);
    }
    assert_eq!(t.evict(&mut p, &t.req(MS, 0, 0)), Vec::<u32>::new());
    assert!(p.estimate(K) >= 1);
    p.check(&t.metas).unwrap();
}

#[test]
fn wtinylfu_live_count_follows_user_removes() {
    wtinylfu_churn_keeps_the_sketch(|p, t| count_once(p, t, J));
}

#[test]
fn wtinylfu_live_count_follows_slot_reuse_without_remove() {
    wtinylfu_churn_keeps_the_sketch(|p, t| {
        // Slot 1 put again and again, `on_remove` never called (the defensive path).
        let mut m = meta(1, GEN, 0);
        m.insert_seq = 2;
        m.last_access_seq = 2;
        m.key_hash = J;
        if t.metas.len() < 2 {
            t.metas.push(m.clone());
        }
        p.on_insert(ObjId(1), &m);
    });
}

#[test]
fn wtinylfu_live_count_follows_evictions() {
    wtinylfu_churn_keeps_the_sketch(|p, t| {
        let x = t.insert(p, meta(1, GEN, 0));
        assert_eq!(t.evict(p, &t.req(MS, 1, 1)), [x.0]);
    });
}

#[test]
fn wtinylfu_live_count_follows_soft_pinned_evictions() {
    wtinylfu_churn_keeps_the_sketch(|p, t| {
        let x = t.insert(p, soft(meta(1, GEN, 0)));
        assert_eq!(t.evict(p, &t.req(MS, 0, 1)), [x.0]);
    });
}

#[test]
fn wtinylfu_capacity_comes_from_the_first_run_when_never_announced() {
    // Capacity 10, window 10%: main has room for all three, which move to probation.
    let mut p = WTinyLfu::new(&WTinyLfuConfig {
        window_ratio: 0.1,
        ..WTinyLfuConfig::default()
    })
    .unwrap();
    let mut t = Table::new(10);
    let x: Vec<ObjId> = (0..3).map(|_| t.insert(&mut p, meta(1, GEN, 0))).collect();
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [x[0].0]);
    assert_eq!(p.dump(), [vec![], vec![x[2], x[1]], vec![]]);
}

#[test]
fn wtinylfu_main_takes_only_its_share_beside_the_window() {
    // Capacity 10, window 50%: main holds 5 bytes, the window the rest.
    let mut p = wtinylfu(0.5, 10);
    let mut t = Table::new(10);
    let x: Vec<ObjId> = (0..7).map(|_| t.insert(&mut p, meta(1, GEN, 0))).collect();
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)).len(), 1);
    let d = p.dump();
    assert_eq!(d[0], [x[6]]);
    assert_eq!(d[1].len(), 5);
}

#[test]
fn wtinylfu_window_hit_moves_to_the_window_head() {
    let mut p = wtinylfu(0.5, 10);
    let mut t = Table::new(10);
    let a = t.insert(&mut p, meta(1, GEN, 0));
    let b = t.insert(&mut p, meta(1, GEN, 0));
    assert_eq!(p.dump()[0], [b, a]);
    t.access(&mut p, a, MS, MS);
    assert_eq!(p.dump()[0], [a, b]);
}

#[test]
fn wtinylfu_protected_holds_80_percent_of_main_and_demotes_its_oldest() {
    // Capacity 10, window 10%: main 9 bytes, protected floor(0.8 * 9) = 7.
    let mut p = wtinylfu(0.1, 10);
    let mut t = Table::new(10);
    let x: Vec<ObjId> = (0..10).map(|_| t.insert(&mut p, meta(1, GEN, 0))).collect();
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [x[9].0]);
    for &id in &x[..7] {
        t.access(&mut p, id, MS, MS);
    }
    let d = p.dump();
    assert_eq!(d[2], x[..7].iter().rev().copied().collect::<Vec<_>>());
    assert_eq!(d[1], [x[8], x[7]]);
    // The eighth promotion overflows: protected's oldest, x0, goes to probation's head.
    t.access(&mut p, x[7], MS, MS);
    let d = p.dump();
    assert_eq!(d[2], x[1..8].iter().rev().copied().collect::<Vec<_>>());
    assert_eq!(d[1], [x[0], x[8]]);
    // A hit in protected moves to its head.
    t.access(&mut p, x[3], MS, MS);
    assert_eq!(p.dump()[2], [x[3], x[7], x[6], x[5], x[4], x[2], x[1]]);
    p.check(&t.metas).unwrap();
}

#[test]
fn wtinylfu_takes_a_soft_pinned_object_once_however_often_the_walks_meet_it() {
    let mut p = wtinylfu(0.0, 10);
    let mut t = Table::new(10);
    let s = t.insert(&mut p, soft(meta(1, GEN, 0)));
    let u = t.insert(&mut p, meta(1, GEN, 0));
    let mut out = Vec::new();
    p.select_victims(&t.req(MS, 1, 3), &t.metas, &mut out);
    assert_eq!(out, [u, s]);
}

// ---------------------------------------------------------------- hierarchical

fn hierarchical(tree: ScopeConfig) -> Hierarchical {
    Hierarchical::new(&HierarchicalConfig { tree }).expect("valid tree")
}

fn scope(select: Selector) -> ScopeConfig {
    ScopeConfig {
        select,
        ..ScopeConfig::default()
    }
}

/// An object of `tenant` with `size` bytes (general data, lease expired at 0).
fn tenant_obj(tenant: u32, size: u64) -> ObjectMeta {
    let mut m = meta(size, GEN, 0);
    m.hints.tenant = tenant;
    m
}

fn tenant_cost(tenant: u32, penalty: u64) -> ObjectMeta {
    let mut m = tenant_obj(tenant, 1);
    m.hints.miss_penalty_ns = penalty;
    m
}

#[test]
fn hierarchical_rejects_empty_selector_lists_of_every_kind() {
    for select in [
        Selector::Tenants(vec![]),
        Selector::DataTypes(vec![]),
        Selector::Priorities(vec![]),
    ] {
        let tree = ScopeConfig {
            children: vec![scope(select.clone())],
            ..ScopeConfig::default()
        };
        let err = Hierarchical::new(&HierarchicalConfig { tree }).unwrap_err();
        assert!(
            err.to_string().contains("tree.children[0].select"),
            "{select:?}: {err}"
        );
    }
}

#[test]
fn hierarchical_weight_defaults_to_one() {
    let PolicyConfig::Hierarchical(c) = PolicyConfig::from_toml_str(
        "policy = \"hierarchical\"\n[tree]\nassign = \"weights\"\n\
         [[tree.children]]\nselect = { tenant = 1 }\n",
    )
    .unwrap() else {
        panic!("not hierarchical")
    };
    assert_eq!(c.tree.weight, 1.0);
    assert_eq!(c.tree.children[0].weight, 1.0);
}

#[test]
fn hierarchical_gdsf_clock_rises_to_the_largest_priority_evicted_in_any_leaf() {
    // Two GDSF leaves (tenant 1 and the root's `<rest>`), all to the first, then fallback.
    let mut p = hierarchical(ScopeConfig {
        assign: Assign::Order,
        evict: LeafRule::Gdsf {},
        children: vec![ScopeConfig {
            evict: LeafRule::Gdsf {},
            ..scope(Selector::Tenant(1))
        }],
        ..ScopeConfig::default()
    });
    let mut t = Table::new(100);
    t.insert(&mut p, tenant_cost(1, 10)); // 0: H = 10
    t.insert(&mut p, tenant_cost(0, 2)); // 1: H = 2
    t.insert(&mut p, tenant_cost(0, 6)); // 2: H = 6
                                         // Tenant 1's only object, then the shortfall from `<rest>`: its lowest, 1.
    assert_eq!(t.evict(&mut p, &t.req(MS, 2, 2)), [0, 1]);
    // The clock is now 10 (not 2, the last one evicted): a newcomer of value 1 has H = 11,
    // above 2's H = 6 set at its insertion.
    t.insert(&mut p, tenant_cost(0, 1));
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [2]);
}

#[test]
fn hierarchical_gdsf_read_raises_the_priority() {
    let mut p = hierarchical(ScopeConfig {
        evict: LeafRule::Gdsf {},
        ..ScopeConfig::default()
    });
    let mut t = Table::new(100);
    let a = t.insert(&mut p, tenant_cost(0, 10)); // H = 10
    let b = t.insert(&mut p, tenant_cost(0, 5)); // H = 5 ...
    t.access(&mut p, b, MS, MS);
    t.access(&mut p, b, MS, MS); // ... read twice: 3 * 5 = 15
    assert_eq!(t.evict(&mut p, &t.req(MS, 1, 1)), [a.0]);
}

#[test]
fn hierarchical_type_aware_leaf_weighs_only_soft_pinned_objects() {
    let mut types = TypeKnobsByType::default();
    types.encoder_output.soft_pin_weight = 2.0;
    let mut p = hierarchical(ScopeConfig {
        evict: LeafRule::TypeAware { types },
        ..ScopeConfig::default()
    });
    let mut t = Table::new(100);
    let eo = t.insert(&mut p, meta(1, DataType::EncoderOutput, 100 * MS)); // age 100 ms
    let kv = t.insert(&mut p, meta(1, DataType::KvCache, 50 * MS)); // age 150 ms
    assert_eq!(t.evict(&mut p, &t.req(200 * MS, 1, 1)), [kv.0]);
    assert_eq!(t.evict(&mut p, &t.req(200 * MS, 1, 1)), [eo.0]);
}

#[test]
fn hierarchical_second_over_budget_child_gets_only_the_rest_of_the_quota() {
    let over = |tenant: u32| ScopeConfig {
        weight: 0.0,
        budget_ratio: Some(0.02), // 2 bytes of 100
        ..scope(Selector::Tenant(tenant))
    };
    let mut p = hierarchical(ScopeConfig {
        assign: Assign::Weights,
        children: vec![over(1), over(2)],
        ..ScopeConfig::default()
    });
    let mut t = Table::new(100);
    for _ in 0..4 {
        t.insert(&mut p, tenant_obj(1, 1)); // 0..=3: 2 bytes over
    }
    for _ in 0..5 {
        t.insert(&mut p, tenant_obj(2, 1)); // 4..=8: 3 bytes over, goes first
    }
    for _ in 0..2 {
        t.insert(&mut p, tenant_obj(0, 1)); // 9, 10
    }
    assert_eq!(t.evict(&mut p, &t.req(MS, 4, 4)), [4, 5, 6, 0]);
}

#[test]
fn hierarchical_split_by_objects_counts_what_the_budget_pass_took() {
    let mut p = hierarchical(ScopeConfig {
        assign: Assign::Objects,
        children: vec![ScopeConfig {
            budget_ratio: Some(0.03), // 3 bytes of 100
            ..scope(Selector::Tenant(1))
        }],
        ..ScopeConfig::default()
    });
    let mut t = Table::new(100);
    for _ in 0..5 {
        t.insert(&mut p, tenant_obj(1, 1)); // 0..=4: 2 bytes over
    }
    for _ in 0..3 {
        t.insert(&mut p, tenant_obj(0, 1)); // 5..=7
    }
    // Budget: 0, 1. Then 4 split 3 : 3 by resident objects: 2 each.
    assert_eq!(t.evict(&mut p, &t.req(MS, 6, 6)), [0, 1, 2, 3, 5, 6]);
}

#[test]
fn hierarchical_fallback_passes_an_exhausted_childs_share_on() {
    let mut p = hierarchical(ScopeConfig {
        assign: Assign::Order,
        children: vec![scope(Selector::Tenant(1))],
        ..ScopeConfig::default()
    });
    let mut t = Table::new(100);
    t.insert(&mut p, tenant_obj(1, 1));
    t.insert(&mut p, tenant_obj(0, 1));
    t.insert(&mut p, tenant_obj(0, 1));
    assert_eq!(t.evict(&mut p, &t.req(MS, 2, 2)), [0, 1]);
}

/// Root (`weights`) -> inner scope tenant 1 (weight 0, `budget_ratio`, children: an empty
/// `kv_cache` leaf and `<rest>`) and the root's `<rest>`. Tenant 1 holds objects of `sizes`
/// (ids 0.., in lease order), the root's `<rest>` three 1-byte objects after them. With
/// weight 0, tenant 1 gives victims only through its budget rounds; the rest of the quota
/// comes from the root's `<rest>`.
fn inner_budget_victims(budget_ratio: f64, sizes: &[u64], quota: u64) -> Vec<u32> {
    let mut p = hierarchical(ScopeConfig {
        assign: Assign::Weights,
        children: vec![ScopeConfig {
            weight: 0.0,
            budget_ratio: Some(budget_ratio),
            children: vec![scope(Selector::DataType(DataType::KvCache))],
            ..scope(Selector::Tenant(1))
        }],
        ..ScopeConfig::default()
    });
    let mut t = Table::new(100);
    for &s in sizes {
        t.insert(&mut p, tenant_obj(1, s));
    }
    for _ in 0..3 {
        t.insert(&mut p, tenant_obj(0, 1));
    }
    t.evict(&mut p, &t.req(MS, quota, quota))
}

#[test]
fn hierarchical_inner_budget_rounds_stop_once_the_excess_is_freed() {
    // 4 bytes, budget 2: mean size 1, one round of 2 frees exactly the excess.
    assert_eq!(inner_budget_victims(0.02, &[1, 1, 1, 1], 3), [0, 1, 4]);
}

#[test]
fn hierarchical_inner_budget_round_is_excess_over_mean_candidate_size() {
    // 5 bytes in 3, budget 3: mean floor(5 / 3) = 1, so a round of 2 (3 + 1 bytes,
    // overshooting the 2-byte excess).
    assert_eq!(inner_budget_victims(0.03, &[3, 1, 1], 3), [0, 1, 3]);
}

#[test]
fn hierarchical_inner_budget_next_round_covers_only_what_is_still_over() {
    // 6 bytes in 3, budget 4: mean 2, a round of ceil(2 / 2) = 1 frees 1 byte; then mean
    // floor(5 / 2) = 2, a round of ceil(1 / 2) = 1.
    assert_eq!(inner_budget_victims(0.04, &[1, 1, 4], 3), [0, 1, 3]);
}

#[test]
fn hierarchical_inner_budget_mean_is_over_the_candidates_left() {
    // 18 bytes in 6, budget 9: mean 3, a round of 3 frees 3 bytes; the 3 left hold 15
    // bytes, mean 5, so the next round is ceil(6 / 5) = 2 (10 + 1 bytes).
    assert_eq!(
        inner_budget_victims(0.09, &[1, 1, 1, 10, 1, 4], 5),
        [0, 1, 2, 3, 4]
    );
}

#[test]
fn hierarchical_inner_budget_rounds_never_exceed_the_quota() {
    // 25 bytes in 5, budget 15: mean 5, a round of 2 frees 2 of 10 bytes; the next would
    // be ceil(8 / 7) = 2, but only 1 is left of the quota of 3.
    assert_eq!(inner_budget_victims(0.15, &[1, 1, 1, 2, 20], 3), [0, 1, 2]);
}

#[test]
fn hierarchical_inner_scope_counts_the_bytes_its_own_budget_pass_freed() {
    // Tenant 1 (budget 1 byte, weight 0) holds leaf Y (budget 1 byte) with 3 objects:
    // Y's budget pass frees 2 bytes, which is also tenant 1's excess, so tenant 1 gives
    // no more; the root's `<rest>` gives the third victim.
    let mut p = hierarchical(ScopeConfig {
        assign: Assign::Weights,
        children: vec![ScopeConfig {
            weight: 0.0,
            budget_ratio: Some(0.01),
            children: vec![ScopeConfig {
                budget_ratio: Some(0.01),
                ..scope(Selector::DataType(GEN))
            }],
            ..scope(Selector::Tenant(1))
        }],
        ..ScopeConfig::default()
    });
    let mut t = Table::new(100);
    for _ in 0..3 {
        t.insert(&mut p, tenant_obj(1, 1)); // 0..=2
    }
    for _ in 0..3 {
        t.insert(&mut p, tenant_obj(0, 1)); // 3..=5
    }
    assert_eq!(t.evict(&mut p, &t.req(MS, 3, 3)), [0, 1, 3]);
}

//! The plain cache model (`--cache-model plain`) against trivially correct models: LRU,
//! FIFO and SIEVE written out in a few lines each on a `Vec`, Belady bounded by MIN, on
//! random traces (INVARIANTS R7; libCacheSim itself is the oracle in
//! `tests/python/test_libcachesim_oracle.py`).

use moonagent_core::store::{DataType, PolicyConfig};
use moonagent_sim::replay::{
    min_bound, replay_plain, CapacityUnit, Compiled, LabelledPolicy, PlainConfig,
};
use proptest::prelude::*;

fn compile(ids: &[u64]) -> Compiled {
    let mut c = Compiled::default();
    for (i, &id) in ids.iter().enumerate() {
        c.push(i as u64, id, 1 + id % 3, 0, DataType::General, 0, 0)
            .unwrap();
    }
    c.fill_next();
    c
}

fn plain_hits(c: &Compiled, k: u64, policy: PolicyConfig) -> u64 {
    let cfg = PlainConfig {
        capacity: k,
        unit: CapacityUnit::Objects,
    };
    let r = replay_plain(c, &cfg, &LabelledPolicy::named(policy)).unwrap();
    assert_eq!(r.total.lookups, c.accesses.len() as u64);
    // Every miss is put (evict before insert never fails); what is not evicted is resident.
    assert_eq!(r.total.puts, r.total.lookups - r.total.hits);
    let resident = r.total.puts - r.total.evicted;
    assert!(resident <= k, "{resident} resident > {k}");
    assert_eq!(r.store.policy_refused, 0);
    r.total.hits
}

/// LRU (`lru = true`) or FIFO on a vector, most recent last.
fn queue_model(ids: &[u64], k: usize, lru: bool) -> u64 {
    let mut q: Vec<u64> = Vec::new();
    let mut hits = 0;
    for &id in ids {
        if let Some(p) = q.iter().position(|&x| x == id) {
            hits += 1;
            if lru {
                q.remove(p);
                q.push(id);
            }
            continue;
        }
        if q.len() == k {
            q.remove(0);
        }
        q.push(id);
    }
    hits
}

/// SIEVE as the NSDI'24 paper's pseudocode: a FIFO (oldest first) with visited bits and
/// a hand that moves from old to new and wraps.
fn sieve_model(ids: &[u64], k: usize) -> u64 {
    let mut q: Vec<(u64, bool)> = Vec::new();
    let mut hand: Option<usize> = None; // index in q, None = oldest
    let mut hits = 0;
    for &id in ids {
        if let Some(e) = q.iter_mut().find(|e| e.0 == id) {
            e.1 = true;
            hits += 1;
            continue;
        }
        if q.len() == k {
            let mut h = hand.unwrap_or(0);
            while q[h].1 {
                q[h].1 = false;
                h = if h + 1 == q.len() { 0 } else { h + 1 };
            }
            q.remove(h);
            // The hand rests on the next newer object (the same index after the removal).
            hand = (h < q.len()).then_some(h);
        }
        q.push((id, false));
    }
    hits
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn plain_lru_fifo_and_sieve_equal_their_models_and_min_bounds_belady(
        ids in proptest::collection::vec(0u64..24, 1..400),
        k in 1usize..12,
    ) {
        let c = compile(&ids);
        prop_assert_eq!(plain_hits(&c, k as u64, PolicyConfig::Lru {}), queue_model(&ids, k, true));
        prop_assert_eq!(plain_hits(&c, k as u64, PolicyConfig::Fifo {}), queue_model(&ids, k, false));
        prop_assert_eq!(plain_hits(&c, k as u64, PolicyConfig::Sieve {}), sieve_model(&ids, k));
        let (min, _) = min_bound(&c, DataType::General, k as u64);
        let belady = plain_hits(&c, k as u64, PolicyConfig::Belady {});
        prop_assert!(belady <= min, "belady {} > MIN {}", belady, min);
        for p in PolicyConfig::NAMES {
            if let Ok(p) = PolicyConfig::by_name(p) {
                prop_assert!(plain_hits(&c, k as u64, p) <= min);
            }
        }
    }
}

#[test]
fn byte_capacity_weighs_objects_by_size_and_never_admits_one_larger_than_the_cache() {
    // Sizes 1 + id % 3: object 2 weighs 3 bytes, 0 weighs 1.
    let c = compile(&[2, 0, 2, 0, 5]);
    let cfg = PlainConfig {
        capacity: 2,
        unit: CapacityUnit::Bytes,
    };
    let r = replay_plain(&c, &cfg, &LabelledPolicy::named(PolicyConfig::Lru {})).unwrap();
    // 2 (3 bytes) never fits; 0 (1 byte) hits on its second access; 5 (3 bytes) never fits.
    assert_eq!(
        (r.total.hits, r.total.puts, r.total.puts_no_space),
        (1, 1, 3)
    );
}

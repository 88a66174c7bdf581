//! `min_bound` is Belady's MIN: checked against an exhaustive search over every caching
//! schedule on tiny random traces, and on a textbook sequence.

use moonagent_core::store::DataType;
use moonagent_sim::replay::{min_bound, Compiled};
use proptest::prelude::*;

fn trace(ids: &[u64]) -> Compiled {
    let mut c = Compiled::default();
    for (i, &id) in ids.iter().enumerate() {
        c.push(i as u64, id, 1, 1, DataType::KvCache, 0, 0)
            .expect("push");
    }
    c.fill_next();
    c
}

/// The best hit count over every schedule of a `k`-object cache (demand insertion,
/// bypass allowed, any eviction), by exhaustive search.
fn brute(ids: &[u64], k: usize) -> u64 {
    fn go(ids: &[u64], k: usize, cache: &mut Vec<u64>) -> u64 {
        let Some((&x, rest)) = ids.split_first() else {
            return 0;
        };
        if cache.contains(&x) {
            // Keeping everything on a hit is never worse (evicting can be deferred).
            return 1 + go(rest, k, cache);
        }
        // Bypass.
        let mut best = go(rest, k, cache);
        if cache.len() < k {
            cache.push(x);
            best = best.max(go(rest, k, cache));
            cache.pop();
        } else {
            for i in 0..cache.len() {
                let old = std::mem::replace(&mut cache[i], x);
                best = best.max(go(rest, k, cache));
                cache[i] = old;
            }
        }
        best
    }
    go(ids, k, &mut Vec::new())
}

#[test]
fn min_bound_textbook_sequence() {
    // k = 3 on 7,0,1,2,0,3,0,4,2,3,0,3,2,1,2,0,1,7,0,1: demand-paging OPT has 9 faults
    // (11 hits); with bypass allowed (an object used later than every cached one is not
    // cached), one fault fewer: 12 hits.
    let ids = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];
    let c = trace(&ids);
    assert_eq!(min_bound(&c, DataType::KvCache, 3), (12, 20));
    assert_eq!(brute(&ids, 3), 12);
    assert_eq!(min_bound(&c, DataType::EncoderOutput, 3), (0, 0));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn min_bound_equals_the_best_schedule(
        ids in proptest::collection::vec(0u64..5, 0..11),
        k in 0usize..4,
    ) {
        let c = trace(&ids);
        let (hits, lookups) = min_bound(&c, DataType::KvCache, k as u64);
        prop_assert_eq!(lookups, ids.len() as u64);
        prop_assert_eq!(hits, brute(&ids, k));
    }
}

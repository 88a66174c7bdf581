//! Belady's MIN on an ideal cache: the hit-count bound of the store-level replay.

use std::collections::BTreeSet;

use moonagent_core::store::DataType;

use super::{Compiled, NEVER};

/// Belady's MIN hit count for the accesses of data type `dtype` on an ideal cache of `k`
/// objects (unit sizes, demand insertion, bypass allowed, no leases): returns `(hits,
/// lookups)`. `compiled.fill_next()` must have run.
///
/// Why it bounds the store: when every object of `dtype` has the same size `s` and the
/// replay includes only that type, the store never holds more than `k = floor(capacity /
/// s)` of them and inserts an object only right after a lookup of it, so its resident sets
/// form a valid schedule of a `k`-object cache; MIN's hit count is the maximum over all
/// such schedules, and a store hit (for KV: a block in the leading prefix run) needs the
/// object resident. Leases, batch eviction, failed puts and the prefix rule only remove
/// hits. The store-level `belady` policy has none of this guarantee: leases keep objects
/// it would evict, and it evicts in batches of the master's target.
pub fn min_bound(compiled: &Compiled, dtype: DataType, k: u64) -> (u64, u64) {
    let t = dtype.index() as u8;
    // The cache is the set of its objects' next-access indices (unique per object).
    let mut cache: BTreeSet<u32> = BTreeSet::new();
    let (mut hits, mut lookups) = (0u64, 0u64);
    for (i, a) in compiled.accesses.iter().enumerate() {
        if a.dtype != t {
            continue;
        }
        lookups += 1;
        if cache.remove(&(i as u32)) {
            hits += 1;
        }
        if a.next == NEVER || k == 0 {
            continue;
        }
        if (cache.len() as u64) < k {
            cache.insert(a.next);
        } else if let Some(&far) = cache.last() {
            if far > a.next {
                cache.remove(&far);
                cache.insert(a.next);
            }
        }
    }
    (hits, lookups)
}

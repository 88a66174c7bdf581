//! [`Memo`]: a bounded memo of a pure function, as a direct-mapped cache.
//!
//! The engine memoises image fingerprints (BLAKE2b per distinct image) and the hasher
//! states every fingerprint of a model and grid starts from. A map that keeps every key
//! grows with the trace (a 10 M-image trace would keep ~1 GB of fingerprints) and, once
//! larger than the caches, costs a miss per lookup whether or not it hits. A memo only has
//! to be right when it answers: this one keeps one entry per slot (`2^bits` slots, the
//! slot chosen by the key's hash), a new key replaces whatever held its slot, and a lookup
//! that finds another key there is a miss, so the caller recomputes. Results never depend
//! on what it holds; only the work does.

use std::hash::{BuildHasher, Hash};

use rustc_hash::FxBuildHasher;

/// A direct-mapped memo of `2^bits` entries (allocated on the first insert).
#[derive(Debug, Clone)]
pub(crate) struct Memo<K, V> {
    slots: Vec<Option<(K, V)>>,
    bits: u32,
}

impl<K: Hash + Eq, V> Memo<K, V> {
    /// An empty memo of `2^bits` entries, `1 <= bits <= 24`.
    pub(crate) fn new(bits: u32) -> Self {
        assert!((1..=24).contains(&bits), "memo of 2^{bits} entries");
        Self {
            slots: Vec::new(),
            bits,
        }
    }

    /// The slot of `key`: the top `bits` of its hash (FxHash mixes best into its top bits).
    #[inline]
    fn slot(&self, key: &K) -> usize {
        (FxBuildHasher.hash_one(key) >> (64 - self.bits)) as usize
    }

    /// The value memoised for `key`, if its slot holds it.
    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        match self.slots.get(self.slot(key)) {
            Some(Some((k, v))) if k == key => Some(v),
            _ => None,
        }
    }

    /// Memoise `value` for `key`, replacing whatever held its slot.
    #[inline]
    pub(crate) fn insert(&mut self, key: K, value: V) {
        if self.slots.is_empty() {
            self.slots.resize_with(1 << self.bits, || None);
        }
        let i = self.slot(&key);
        self.slots[i] = Some((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The memoised function of the tests.
    fn f(k: u64) -> u64 {
        k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 7
    }

    proptest! {
        /// Whatever the sequence of lookups and inserts, a hit is the function's value,
        /// and a key just inserted is found.
        #[test]
        fn a_hit_is_always_the_value_and_a_fresh_insert_hits(
            bits in 1u32..6,
            ops in proptest::collection::vec((any::<bool>(), 0u64..64), 1..300),
        ) {
            let mut m = Memo::new(bits);
            for (insert, k) in ops {
                if insert {
                    m.insert(k, f(k));
                    prop_assert_eq!(m.get(&k), Some(&f(k)));
                } else if let Some(&v) = m.get(&k) {
                    prop_assert_eq!(v, f(k));
                }
            }
        }
    }

    #[test]
    fn it_holds_at_most_its_slots_and_a_colliding_key_replaces_the_other() {
        let mut m = Memo::new(1);
        for k in 0..100u64 {
            m.insert(k, f(k));
        }
        assert_eq!(m.slots.len(), 2);
        assert_eq!((0..100u64).filter(|k| m.get(k).is_some()).count(), 2);
        // Two keys in one slot: the later one is kept.
        let (a, b) = {
            let s = |k: &u64| m.slot(k);
            let a = 0u64;
            let b = (1..100u64)
                .find(|k| s(k) == s(&a))
                .expect("a collision in 2 slots");
            (a, b)
        };
        m.insert(a, 1);
        m.insert(b, 2);
        assert_eq!(m.get(&a), None);
        assert_eq!(m.get(&b), Some(&2));
    }

    #[test]
    fn an_empty_memo_allocates_nothing_and_misses() {
        let m: Memo<u64, u64> = Memo::new(12);
        assert!(m.slots.is_empty());
        assert_eq!(m.get(&3), None);
    }
}

//! `KeyIndex`: the store's table from key hashes to slot numbers (INVARIANTS S12).
//!
//! Open addressing with linear probing over 8-byte entries, each a slot number beside the
//! top 32 bits of its key's hash (the tag). A key's probe starts at its *home*, the top
//! `log2(capacity)` bits of its hash, which the tag holds too, so the table moves its
//! entries (growth, deletion) without asking for any key's hash again. A probe compares
//! tags in the table and reads a key in the slab only on a tag match (a false match: one
//! in 2^(32 - log2 capacity) entries compared), so a lookup of an absent key (every prefix
//! block of a workload without reuse) reads no slab line, and a removal by slot number
//! reads none either. Deletion shifts the entries after it back (no tombstones, so probes
//! stay short however long the store churns). The table doubles when it would pass half
//! full.
//!
//! Because a probe starts at a pure function of the hash and the table's size, a caller
//! that knows a key (or a slot's key hash) ahead can fetch that line early
//! ([`KeyIndex::prefetch`]): the store does for eviction victims and for the prefix blocks
//! a request is about to look up or publish. (hashbrown's table, used before, has no such
//! handle; its 7-bit tags also sent ~10% of absent-key probes to the slab.)
//!
//! The table only files and finds slot numbers; which key a slot holds is the caller's
//! (`eq` closures), and a slot number is filed at most once (the store's invariant,
//! checked by `MemStore::check_index`).

/// An empty entry (ends a probe). No live entry equals it: slots stay below [`MAX_SLOT`].
const EMPTY: u64 = u64::MAX;
/// Slot numbers the table files are below this (2^31), so that at most half full it never
/// needs more than 2^32 entries, the most a 32-bit tag can place.
pub(crate) const MAX_SLOT: u32 = 1 << 31;
/// The largest table, in entries (the home is taken from the 32-bit tag).
const MAX_CAP_BITS: u32 = 32;

#[inline]
fn pack(hash: u64, slot: u32) -> u64 {
    (hash & !0xFFFF_FFFF) | u64::from(slot)
}

#[inline]
fn slot_of(e: u64) -> u32 {
    e as u32
}

/// Where a probe for a key ended: its entry, or the place an insert of it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// The key's slot and the entry's position.
    Found { slot: u32, at: usize },
    /// Absent; an insert goes at `at` (the empty entry that ended the probe).
    Vacant { at: usize },
}

/// The table (see the module docs).
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyIndex {
    entries: Vec<u64>,
    /// `log2(entries.len())`, 0 while the table is empty.
    bits: u32,
    len: usize,
}

impl KeyIndex {
    /// Live entries.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every live slot number, in table order.
    pub(crate) fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries
            .iter()
            .filter(|&&e| e != EMPTY)
            .map(|&e| slot_of(e))
    }

    #[inline]
    fn mask(&self) -> usize {
        self.entries.len().wrapping_sub(1)
    }

    /// The home of a hash (or of an entry, whose top bits are its hash's).
    #[inline]
    fn home(&self, hash: u64) -> usize {
        if self.bits == 0 {
            0
        } else {
            (hash >> (64 - self.bits)) as usize
        }
    }

    /// Hint the CPU to fetch the line where a probe for `hash` starts (no effect on
    /// results).
    #[inline]
    pub(crate) fn prefetch(&self, hash: u64) {
        if let Some(e) = self.entries.get(self.home(hash)) {
            crate::hint::prefetch(e);
        }
    }

    /// Probe for the key whose hash is `hash`: `eq(slot)` says whether a slot whose tag
    /// matches holds the key.
    #[inline]
    pub(crate) fn probe(&self, hash: u64, mut eq: impl FnMut(u32) -> bool) -> Probe {
        if self.entries.is_empty() {
            return Probe::Vacant { at: 0 };
        }
        let mask = self.mask();
        let t = hash >> 32;
        let mut i = self.home(hash);
        loop {
            let e = self.entries[i];
            if e == EMPTY {
                return Probe::Vacant { at: i };
            }
            if e >> 32 == t && eq(slot_of(e)) {
                return Probe::Found {
                    slot: slot_of(e),
                    at: i,
                };
            }
            i = (i + 1) & mask;
        }
    }

    /// The slot of the key whose hash is `hash`, if filed.
    #[inline]
    pub(crate) fn find(&self, hash: u64, eq: impl FnMut(u32) -> bool) -> Option<u32> {
        match self.probe(hash, eq) {
            Probe::Found { slot, .. } => Some(slot),
            Probe::Vacant { .. } => None,
        }
    }

    /// File `slot` under `hash` at `at`, the place a [`KeyIndex::probe`] that found the
    /// key absent returned, with nothing filed or removed since.
    #[inline]
    pub(crate) fn insert_at(&mut self, at: usize, hash: u64, slot: u32) {
        if (self.len + 1) * 2 > self.entries.len() {
            self.grow();
            self.insert(hash, slot);
            return;
        }
        debug_assert_eq!(self.entries[at], EMPTY, "insert at a filled entry");
        self.entries[at] = pack(hash, slot);
        self.len += 1;
    }

    /// File `slot` under `hash`, the key known absent.
    pub(crate) fn insert(&mut self, hash: u64, slot: u32) {
        if (self.len + 1) * 2 > self.entries.len() {
            self.grow();
        }
        match self.probe(hash, |_| false) {
            Probe::Vacant { at } => {
                self.entries[at] = pack(hash, slot);
                self.len += 1;
            }
            Probe::Found { .. } => unreachable!("a probe that matches nothing finds nothing"),
        }
    }

    /// Remove the entry of `slot`, filed under `hash`; false if it is not there.
    #[inline]
    pub(crate) fn remove(&mut self, hash: u64, slot: u32) -> bool {
        match self.probe(hash, |s| s == slot) {
            Probe::Found { at, .. } => {
                self.remove_at(at);
                true
            }
            Probe::Vacant { .. } => false,
        }
    }

    /// Remove the entry at `at`, shifting back the entries after it whose probes pass it.
    #[inline]
    fn remove_at(&mut self, mut at: usize) {
        let mask = self.mask();
        self.len -= 1;
        let mut j = at;
        loop {
            j = (j + 1) & mask;
            let e = self.entries[j];
            if e == EMPTY {
                self.entries[at] = EMPTY;
                return;
            }
            // `e` stays when its home lies cyclically in (at, j]: its probe does not pass
            // the hole. Otherwise it moves into the hole, which moves to `j`.
            let k = self.home(e);
            let stays = if at <= j {
                at < k && k <= j
            } else {
                at < k || k <= j
            };
            if !stays {
                self.entries[at] = e;
                at = j;
            }
        }
    }

    /// Double the table (re-filing every entry from its tag).
    #[cold]
    fn grow(&mut self) {
        let bits = if self.bits == 0 { 4 } else { self.bits + 1 };
        // Unreachable while slots stay below `MAX_SLOT` (the store refuses more).
        assert!(
            bits <= MAX_CAP_BITS,
            "key index past 2^{MAX_CAP_BITS} entries"
        );
        let old = std::mem::replace(&mut self.entries, vec![EMPTY; 1 << bits]);
        self.bits = bits;
        let mask = self.mask();
        for e in old {
            if e != EMPTY {
                let mut i = self.home(e);
                while self.entries[i] != EMPTY {
                    i = (i + 1) & mask;
                }
                self.entries[i] = e;
            }
        }
    }

    /// Whether `slot` is filed where a probe for `hash` finds it (the tag included).
    pub(crate) fn holds(&self, hash: u64, slot: u32) -> bool {
        matches!(self.probe(hash, |s| s == slot), Probe::Found { .. })
    }

    /// Check the table's own bookkeeping: the count, the load, and no live entry
    /// unreachable from its home (an empty entry between them).
    pub(crate) fn check(&self) -> Result<(), String> {
        let live = self.entries.iter().filter(|&&e| e != EMPTY).count();
        if live != self.len {
            return Err(format!("count {}, the table holds {live}", self.len));
        }
        if self.len * 2 > self.entries.len() {
            return Err(format!(
                "{} entries in a table of {}: over half full",
                self.len,
                self.entries.len()
            ));
        }
        if self.entries.len() != if self.bits == 0 { 0 } else { 1 << self.bits } {
            return Err(format!(
                "{} entries for 2^{}",
                self.entries.len(),
                self.bits
            ));
        }
        let mask = self.mask();
        for (i, &e) in self.entries.iter().enumerate() {
            if e == EMPTY {
                continue;
            }
            let mut j = self.home(e);
            while j != i {
                if self.entries[j] == EMPTY {
                    return Err(format!("entry {i}: slot {} unreachable", slot_of(e)));
                }
                j = (j + 1) & mask;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A key's hash in the tests: keys `>= 1000` share their top 16 bits with key
    /// `k % 1000`, so probes collide, wrap and shift.
    fn h(key: u64) -> u64 {
        let base = (key % 1000).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        if key >= 1000 {
            (base & 0xFFFF_0000_0000_0000) | (key.wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 16)
        } else {
            base
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Remove(u64),
        Find(u64),
    }

    fn key() -> impl Strategy<Value = u64> {
        prop_oneof![0u64..40, 1000u64..1040, 2000u64..2040]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => key().prop_map(Op::Insert),
            2 => key().prop_map(Op::Remove),
            2 => (0u64..3000).prop_map(Op::Find),
        ]
    }

    proptest! {
        /// Random inserts, removals and lookups against a map: the same answers, and the
        /// table's bookkeeping checks after every step.
        #[test]
        fn it_behaves_as_a_map(ops in proptest::collection::vec(op(), 1..400)) {
            let mut ix = KeyIndex::default();
            // key -> slot, slot -> key (slots are reused as the store reuses them)
            let mut model: HashMap<u64, u32> = HashMap::new();
            let mut keys: HashMap<u32, u64> = HashMap::new();
            let mut free: Vec<u32> = Vec::new();
            let mut next = 0u32;
            for o in ops {
                match o {
                    Op::Insert(k) => {
                        let p = ix.probe(h(k), |s| keys.get(&s) == Some(&k));
                        match (p, model.get(&k)) {
                            (Probe::Found { slot, .. }, Some(&s)) => prop_assert_eq!(slot, s),
                            (Probe::Vacant { at }, None) => {
                                let s = free.pop().unwrap_or_else(|| { next += 1; next - 1 });
                                keys.insert(s, k);
                                model.insert(k, s);
                                ix.insert_at(at, h(k), s);
                            }
                            (p, m) => prop_assert!(false, "probe {:?}, model {:?}", p, m),
                        }
                    }
                    Op::Remove(k) => match model.remove(&k) {
                        Some(s) => {
                            prop_assert!(ix.remove(h(k), s));
                            keys.remove(&s);
                            free.push(s);
                        }
                        // Nothing is filed for a slot that holds no key.
                        None => prop_assert!(!ix.remove(h(k), u32::MAX - 2)),
                    },
                    Op::Find(k) => {
                        let got = ix.find(h(k), |s| keys.get(&s) == Some(&k));
                        prop_assert_eq!(got, model.get(&k).copied());
                    }
                }
                prop_assert_eq!(ix.len(), model.len());
                ix.check().map_err(TestCaseError::fail)?;
                for (&k, &s) in &model {
                    prop_assert!(ix.holds(h(k), s));
                }
                let mut filed: Vec<u32> = ix.slots().collect();
                filed.sort_unstable();
                let mut want: Vec<u32> = model.values().copied().collect();
                want.sort_unstable();
                prop_assert_eq!(filed, want);
            }
        }
    }

    /// `holds` is true only for a slot filed under that hash (what `check_index` asks).
    #[test]
    fn holds_names_only_the_slot_filed_under_the_hash() {
        let mut ix = KeyIndex::default();
        ix.insert(h(1), 7);
        ix.insert(h(2), 8);
        assert!(ix.holds(h(1), 7) && ix.holds(h(2), 8));
        assert!(!ix.holds(h(1), 8));
        assert!(!ix.holds(h(3), 7));
        assert!(!KeyIndex::default().holds(h(1), 7));
    }

    /// The table doubles when an insert would pass half full, not before: exactly half
    /// full is allowed, through either insert.
    #[test]
    fn it_grows_past_half_full_only() {
        let (mut a, mut b) = (KeyIndex::default(), KeyIndex::default());
        for k in 0..8u32 {
            let h = h(u64::from(k));
            a.insert(h, k);
            match b.probe(h, |_| false) {
                Probe::Vacant { at } => b.insert_at(at, h, k),
                Probe::Found { .. } => unreachable!(),
            }
        }
        assert_eq!((a.entries.len(), b.entries.len()), (16, 16));
        a.insert(h(8), 8);
        assert_eq!(a.entries.len(), 32);
    }

    #[test]
    fn it_grows_and_keeps_every_entry() {
        let mut ix = KeyIndex::default();
        for k in 0..10_000u32 {
            ix.insert(h(u64::from(k)), k);
        }
        assert_eq!(ix.len(), 10_000);
        assert_eq!(ix.entries.len(), 32_768);
        for k in 0..10_000u32 {
            assert_eq!(ix.find(h(u64::from(k)), |s| s == k), Some(k));
        }
        ix.check().unwrap();
    }

    #[test]
    fn churn_at_a_steady_size_keeps_the_table_small_and_probes_short() {
        // A FIFO of 1,000 live keys, 100,000 filed in all: the store's steady state.
        let mut ix = KeyIndex::default();
        for k in 0..100_000u64 {
            ix.insert(k.wrapping_mul(0x9E37_79B9_7F4A_7C15), k as u32);
            if k >= 1_000 {
                let old = k - 1_000;
                assert!(ix.remove(old.wrapping_mul(0x9E37_79B9_7F4A_7C15), old as u32));
            }
        }
        assert_eq!(ix.len(), 1_000);
        assert_eq!(ix.entries.len(), 2_048);
        ix.check().unwrap();
        // The longest run of filled entries stays short.
        let (mut run, mut longest) = (0, 0);
        for &e in ix.entries.iter().chain(ix.entries.iter()) {
            run = if e == EMPTY { 0 } else { run + 1 };
            longest = longest.max(run);
        }
        assert!(longest < 64, "a cluster of {longest}");
    }

    #[test]
    fn check_names_what_is_wrong() {
        let mut ix = KeyIndex::default();
        for k in 0..10u32 {
            ix.insert(h(u64::from(k)), k);
        }
        ix.check().unwrap();
        let mut bad = ix.clone();
        bad.len += 1;
        assert!(bad.check().unwrap_err().contains("count"));
        let mut bad = ix.clone();
        bad.len = 9;
        let i = bad.entries.iter().position(|&e| e != EMPTY).unwrap();
        bad.entries[i] = EMPTY;
        bad.check().unwrap();
        // An entry moved past an empty place after its home is unreachable.
        let mut bad = KeyIndex::default();
        bad.insert(h(3), 3);
        let at = bad.home(h(3));
        let e = bad.entries[at];
        bad.entries[at] = EMPTY;
        let next = (at + 1) & bad.mask();
        bad.entries[next] = e;
        assert!(bad.check().unwrap_err().contains("unreachable"));
        // Over half full: entries added at their own homes.
        let mut bad = ix.clone();
        let n = bad.entries.len();
        for i in 0..n {
            if bad.len * 2 > n {
                break;
            }
            if bad.entries[i] == EMPTY {
                bad.entries[i] = ((i as u64) << (64 - bad.bits)) | (100 + i as u64);
                bad.len += 1;
            }
        }
        assert!(bad.check().unwrap_err().contains("half full"));
    }

    /// A probe for an absent key reads no key in the slab when no tag matches (the point
    /// of keeping the tags in the table), and a present key's probe reads exactly its own.
    #[test]
    fn a_probe_asks_for_keys_only_on_a_tag_match() {
        let mut ix = KeyIndex::default();
        let hash = |k: u64| k.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for k in 0..1_000u32 {
            ix.insert(hash(u64::from(k)), k);
        }
        let mut asked = 0;
        for k in 1_000..2_000u64 {
            assert_eq!(
                ix.find(hash(k), |_| {
                    asked += 1;
                    false
                }),
                None
            );
        }
        assert_eq!(asked, 0);
        for k in 0..1_000u32 {
            let mut asked = vec![];
            let got = ix.find(hash(u64::from(k)), |s| {
                asked.push(s);
                s == k
            });
            assert_eq!((got, asked), (Some(k), vec![k]));
        }
    }
}

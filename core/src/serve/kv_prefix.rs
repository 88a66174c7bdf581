//! The prefix-KV rule, once: how a request reuses the KV blocks of its prompt's prefix.
//!
//! As Mooncake's KV connectors do it: one `exists` per prefix block (the batch lookup;
//! each found block is leased by the read), the **leading run** of found blocks is the
//! prefix hit (a block after the first missing one must be recomputed anyway, since its
//! KV depends on everything before it), and every block that was not found is put once
//! its KV exists. A put that finds no space fails at once and the block simply stays
//! uncached (Mooncake's "no available handle"); a put of a block that another request
//! stored in the meantime is refused ("already exists"). Both are outcomes, not errors.
//!
//! The serving engine (prefill, then publish: [`publish_all`]) and the store-level replay
//! (publish at once, block by block) both call [`lookup`] and [`publish`]; they differ
//! only in how a block becomes a key ([`BlockStore`]).

use crate::store::{Store, StoreError, StoreKey, StoreResult};

/// A store of prefix KV blocks, addressed by a block's position in the request's prompt.
pub trait BlockStore {
    /// Whether block `i` exists (a read: it grants a lease when it does).
    fn block_exists(&mut self, i: usize) -> StoreResult<bool>;
    /// Put block `i`.
    fn block_put(&mut self, i: usize) -> StoreResult<()>;
    /// A hint: block `i` is about to be looked up, or (`put`) put after `ahead` other
    /// puts ([`Store::prefetch_key`](crate::store::Store::prefetch_key)). No effect on
    /// results; the default does nothing.
    fn block_prefetch(&self, _i: usize, _put: bool, _ahead: usize) {}
}

/// How many blocks ahead [`lookup`] and [`publish_all`] hint the store: a request's block
/// keys are known up front, their index lines are not in cache, and one block's operation
/// takes about as long as a fetch.
pub const BLOCKS_AHEAD: usize = 4;

/// [`BlockStore::block_prefetch`] of a store whose blocks are `kv:<id>` keys (the engine's
/// and the `prefix_blocks` bench's): the hint for block `i` of `ids`.
#[inline]
pub fn prefetch_kv_block<S: Store + ?Sized>(
    store: &S,
    ids: &[u64],
    i: usize,
    put: bool,
    ahead: usize,
) {
    if let Some(&id) = ids.get(i) {
        if put {
            store.prefetch_put_key(&StoreKey::Kv(id), ahead);
        } else {
            store.prefetch_key(&StoreKey::Kv(id));
        }
    }
}

/// Hint the store about block `i + BLOCKS_AHEAD` of `n` (at `i == 0`, about the first
/// ones too).
#[inline]
fn hint<S: BlockStore + ?Sized>(store: &S, i: usize, n: usize, put: bool) {
    if i == 0 {
        for j in 0..BLOCKS_AHEAD.min(n) {
            store.block_prefetch(j, put, j);
        }
    }
    if i + BLOCKS_AHEAD < n {
        store.block_prefetch(i + BLOCKS_AHEAD, put, BLOCKS_AHEAD);
    }
}

/// What a [`publish`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Publish {
    /// The block is stored.
    Stored,
    /// No space: the block stays uncached.
    NoSpace,
    /// The block was there after all.
    Exists,
}

/// Look up the `n` prefix blocks in order. Returns the hit (the leading run of found
/// blocks); `missing` gets (after a clear) the positions of blocks that were not found,
/// which the caller publishes once their KV exists. `on_block(i, hit)` sees every block,
/// `hit` true for blocks inside the leading run.
pub fn lookup<S: BlockStore + ?Sized>(
    store: &mut S,
    n: usize,
    missing: &mut Vec<usize>,
    mut on_block: impl FnMut(usize, bool),
) -> StoreResult<usize> {
    missing.clear();
    let mut hit = 0;
    let mut prefix = true;
    for i in 0..n {
        hint(store, i, n, false);
        let found = store.block_exists(i)?;
        prefix &= found;
        if prefix {
            hit += 1;
        }
        on_block(i, prefix);
        if !found {
            missing.push(i);
        }
    }
    Ok(hit)
}

/// Put blocks `0..n` in order ([`publish`] each); the number stored.
pub fn publish_all<S: BlockStore + ?Sized>(store: &mut S, n: usize) -> StoreResult<u32> {
    let mut stored = 0;
    for i in 0..n {
        hint(store, i, n, true);
        if publish(store, i)? == Publish::Stored {
            stored += 1;
        }
    }
    Ok(stored)
}

/// Put block `i`; a refusal for space or an existing block is an outcome, any other
/// store error is returned.
pub fn publish<S: BlockStore + ?Sized>(store: &mut S, i: usize) -> StoreResult<Publish> {
    match store.block_put(i) {
        Ok(()) => Ok(Publish::Stored),
        Err(StoreError::NoAvailableHandle) => Ok(Publish::NoSpace),
        Err(StoreError::AlreadyExists) => Ok(Publish::Exists),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks present by position, puts recorded, one put refused for space.
    struct Fake {
        present: Vec<bool>,
        puts: Vec<usize>,
        full_at: Option<usize>,
        hints: std::cell::RefCell<Vec<(usize, bool, usize)>>,
    }

    impl BlockStore for Fake {
        fn block_exists(&mut self, i: usize) -> StoreResult<bool> {
            Ok(self.present[i])
        }
        fn block_put(&mut self, i: usize) -> StoreResult<()> {
            if Some(i) == self.full_at {
                return Err(StoreError::NoAvailableHandle);
            }
            if self.present[i] {
                return Err(StoreError::AlreadyExists);
            }
            self.present[i] = true;
            self.puts.push(i);
            Ok(())
        }
        fn block_prefetch(&self, i: usize, put: bool, ahead: usize) {
            self.hints.borrow_mut().push((i, put, ahead));
        }
    }

    #[test]
    fn the_hit_is_the_leading_run_and_every_absent_block_is_missing() {
        let mut s = Fake {
            present: vec![true, true, false, true, false],
            puts: vec![],
            full_at: None,
            hints: Default::default(),
        };
        let mut missing = vec![99];
        let mut seen = vec![];
        let hit = lookup(&mut s, 5, &mut missing, |i, h| seen.push((i, h))).unwrap();
        assert_eq!(hit, 2);
        // Block 3 is present but after a gap: looked up, not a hit, not missing.
        assert_eq!(missing, vec![2, 4]);
        assert_eq!(
            seen,
            vec![(0, true), (1, true), (2, false), (3, false), (4, false)]
        );
    }

    #[test]
    fn refusals_for_space_or_existence_are_outcomes() {
        let mut s = Fake {
            present: vec![false, true, false],
            puts: vec![],
            full_at: Some(2),
            hints: Default::default(),
        };
        assert_eq!(publish(&mut s, 0).unwrap(), Publish::Stored);
        assert_eq!(publish(&mut s, 1).unwrap(), Publish::Exists);
        assert_eq!(publish(&mut s, 2).unwrap(), Publish::NoSpace);
        assert_eq!(s.puts, vec![0]);
    }

    /// Every block is hinted once, `BLOCKS_AHEAD` blocks before its operation (the first
    /// ones at the start), and the hints change no outcome.
    #[test]
    fn every_block_is_hinted_once_and_ahead() {
        for n in [0, 1, BLOCKS_AHEAD, BLOCKS_AHEAD + 1, 3 * BLOCKS_AHEAD + 2] {
            let mut s = Fake {
                present: vec![false; n],
                puts: vec![],
                full_at: None,
                hints: Default::default(),
            };
            let mut missing = vec![];
            assert_eq!(lookup(&mut s, n, &mut missing, |_, _| {}).unwrap(), 0);
            let want = |put: bool| -> Vec<(usize, bool, usize)> {
                (0..n).map(|j| (j, put, j.min(BLOCKS_AHEAD))).collect()
            };
            assert_eq!(*s.hints.borrow(), want(false), "lookup of {n}");
            s.hints.borrow_mut().clear();
            assert_eq!(publish_all(&mut s, n).unwrap(), n as u32);
            assert_eq!(s.puts, (0..n).collect::<Vec<_>>());
            assert_eq!(*s.hints.borrow(), want(true), "publish of {n}");
        }
    }
}

//! The refcounted block pool: the only place in the fork module that owns refcounts, the
//! free list and the sequence slab, and the only one that touches a lock.
//!
//! [`PoolCore`] is the unsynchronised state machine (`&mut self` methods); the simulator
//! can drive it directly. [`BlockPool`] wraps it in one mutex so a scheduler thread can
//! fork while completion threads release. We chose a single mutex over atomic refcounts
//! because a release must decrement and push onto the free list as one step with respect
//! to allocation: with atomic refcounts a page reaching zero would still need a
//! synchronised free list, and "no page both free and referenced" would hold only
//! eventually. Uncontended, the lock costs two atomic operations per call (tens of ns),
//! small next to an 8-way fork of 2,048 pages. Under `cfg(loom)` the mutex is loom's, so
//! the loom tests explore every interleaving of fork, append and release.
//!
//! Release is idempotent by construction: a sequence lives in a slab slot stamped with a
//! generation, and release *takes* the table out of the slot (under the lock) and bumps
//! the generation. A second release of the same handle finds a newer generation and
//! returns [`Release::AlreadyReleased`] without touching a refcount. Every refcount
//! decrement goes through one function, [`PoolCore::dec_ref`].
//!
//! Every operation is all-or-nothing: it checks everything it needs (handle, admission,
//! free pages, overflow) before it changes anything, so an error leaves the pool as it was.

use super::admission::Reason;
use super::table::{
    AppendOutcome, CopyAction, ForkCost, ForkOutcome, PoolConfig, PoolSnapshot, PoolStats, Release,
    SeqId, TailPolicy, TruncateOutcome,
};
use super::ForkError;

/// Lock type aliases: loom's under `cfg(loom)`, std's otherwise.
mod sync {
    #[cfg(loom)]
    pub(super) use loom::sync::{Mutex, MutexGuard};
    #[cfg(not(loom))]
    pub(super) use std::sync::{Mutex, MutexGuard};
}

/// One sequence: its block table and length.
#[derive(Debug, Clone)]
struct Seq {
    table: Vec<u32>,
    len: u64,
    /// Produced by a fork or already forked: a second fork is rejected.
    forked: bool,
    /// Some page may be held by another table. Pages only become shared by copying block
    /// ids out of a table (fork, `share_prefix`), so a sequence with neither `forked` nor
    /// this flag provably holds every page alone and a fork can skip the O(pages) scan.
    may_share: bool,
}

#[derive(Debug, Clone)]
struct Slot {
    generation: u64,
    seq: Option<Seq>,
}

/// The unsynchronised block pool: refcounted pages, block tables, fork, copy-on-write.
#[derive(Debug, Clone)]
pub struct PoolCore {
    cfg: PoolConfig,
    refcounts: Vec<u32>,
    /// Stack of free page ids; popped from the end.
    free: Vec<u32>,
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    live: u32,
}

/// How `lookup` saw a handle.
enum Found {
    Live,
    Released,
    Unknown,
}

impl PoolCore {
    /// An empty pool; fails on a zero block size or a capacity that does not fit `u32` ids.
    pub fn new(cfg: PoolConfig) -> Result<Self, ForkError> {
        if cfg.block_size_tokens == 0 {
            return Err(ForkError::InvalidConfig("block_size_tokens must be > 0"));
        }
        if cfg.capacity_pages == u32::MAX {
            return Err(ForkError::InvalidConfig(
                "capacity_pages must be < u32::MAX",
            ));
        }
        Ok(Self {
            cfg,
            refcounts: vec![0; cfg.capacity_pages as usize],
            // Reversed so pages are handed out 0, 1, 2, ...: deterministic and readable.
            free: (0..cfg.capacity_pages).rev().collect(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            live: 0,
        })
    }

    /// The configuration this pool was built with.
    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    fn classify(&self, id: SeqId) -> Found {
        match self.slots.get(id.index as usize) {
            Some(s) if s.generation == id.generation && s.seq.is_some() => Found::Live,
            Some(s) if id.generation < s.generation => Found::Released,
            _ => Found::Unknown,
        }
    }

    fn seq(&self, id: SeqId) -> Result<&Seq, ForkError> {
        match self.slots.get(id.index as usize) {
            Some(Slot {
                generation,
                seq: Some(seq),
            }) if *generation == id.generation => Ok(seq),
            _ => Err(ForkError::UnknownSequence(id)),
        }
    }

    /// Slots available without overflowing `u32` indices.
    fn can_insert(&self, k: u64) -> bool {
        let grow = k.saturating_sub(self.free_slots.len() as u64);
        self.slots.len() as u64 + grow <= u64::from(u32::MAX)
    }

    /// Stores a sequence; the caller checked [`Self::can_insert`].
    fn insert(&mut self, seq: Seq) -> SeqId {
        self.live += 1;
        if let Some(index) = self.free_slots.pop() {
            let slot = &mut self.slots[index as usize];
            slot.seq = Some(seq);
            SeqId {
                index,
                generation: slot.generation,
            }
        } else {
            let index = self.slots.len() as u32;
            self.slots.push(Slot {
                generation: 0,
                seq: Some(seq),
            });
            SeqId {
                index,
                generation: 0,
            }
        }
    }

    fn check_free(&self, needed: u64) -> Result<(), ForkError> {
        let free = self.free.len() as u64;
        if needed > free {
            return Err(ForkError::PoolExhausted { needed, free });
        }
        Ok(())
    }

    /// Pops a free page with refcount 1; the caller checked there are enough.
    fn alloc_page(free: &mut Vec<u32>, refcounts: &mut [u32]) -> u32 {
        let b = free.pop().unwrap_or_default();
        debug_assert_eq!(refcounts[b as usize], 0, "allocated a referenced page");
        refcounts[b as usize] = 1;
        b
    }

    /// Drops one reference to `b`; returns whether the page became free. The only
    /// decrement in the pool.
    fn dec_ref(free: &mut Vec<u32>, refcounts: &mut [u32], b: u32) -> bool {
        let rc = &mut refcounts[b as usize];
        debug_assert!(*rc > 0, "decrement of a free page {b}");
        *rc = rc.saturating_sub(1);
        if *rc == 0 {
            free.push(b);
            true
        } else {
            false
        }
    }

    fn copy_action(cfg: &PoolConfig, src: u32, dst: u32, tokens: u64) -> CopyAction {
        // tokens < block_size_tokens <= u32::MAX, so the cast is lossless.
        CopyAction {
            src,
            dst,
            tokens: tokens as u32,
            bytes: tokens.saturating_mul(cfg.bytes_per_token),
        }
    }

    /// A new sequence holding `tokens` tokens of prefill in fresh private pages.
    pub fn allocate(&mut self, tokens: u64) -> Result<SeqId, ForkError> {
        self.allocate_for(tokens, tokens)
    }

    /// [`PoolCore::allocate`] of a sequence expected to grow to `expect_tokens`: the same
    /// pages and state, its block table's memory reserved for that length at once (a
    /// decode that appends page by page then never reallocates it). Only memory differs.
    pub fn allocate_for(&mut self, tokens: u64, expect_tokens: u64) -> Result<SeqId, ForkError> {
        let needed = self.cfg.pages_for(tokens);
        self.check_free(needed)?;
        if !self.can_insert(1) {
            return Err(ForkError::Overflow("sequence slots"));
        }
        let reserve = self.cfg.pages_for(expect_tokens.max(tokens)).min(1 << 20);
        let mut table = Vec::with_capacity(reserve as usize);
        for _ in 0..needed {
            table.push(Self::alloc_page(&mut self.free, &mut self.refcounts));
        }
        Ok(self.insert(Seq {
            table,
            len: tokens,
            forked: false,
            may_share: false,
        }))
    }

    /// Appends `tokens` tokens to `seq`, allocating pages as needed; copies the tail page
    /// first if the append writes into it while another table still holds it.
    pub fn append(&mut self, id: SeqId, tokens: u64) -> Result<AppendOutcome, ForkError> {
        let cfg = self.cfg;
        let seq = self.seq(id)?;
        if tokens == 0 {
            return Ok(AppendOutcome {
                headroom: self.append_headroom(id)?,
                ..AppendOutcome::default()
            });
        }
        let new_len = seq
            .len
            .checked_add(tokens)
            .ok_or(ForkError::Overflow("sequence length"))?;
        let tail_tokens = cfg.tail_tokens(seq.len);
        // A sequence that never shared a page holds its tail alone: skip the refcount
        // read (a cache miss in a large pool) on this hot path.
        let cow_src = match (tail_tokens > 0 && seq.may_share)
            .then(|| seq.table.last())
            .flatten()
        {
            Some(&b) if self.refcounts[b as usize] > 1 => Some(b),
            _ => None,
        };
        let new_pages = cfg.pages_for(new_len) - seq.table.len() as u64;
        self.check_free(new_pages + u64::from(cow_src.is_some()))?;

        let cow = cow_src.map(|src| {
            let dst = Self::alloc_page(&mut self.free, &mut self.refcounts);
            // src had refcount > 1, so this never frees it: the copy source stays valid.
            Self::dec_ref(&mut self.free, &mut self.refcounts, src);
            Self::copy_action(&cfg, src, dst, tail_tokens)
        });
        let PoolCore {
            free,
            refcounts,
            slots,
            ..
        } = self;
        let seq = slots[id.index as usize]
            .seq
            .as_mut()
            .ok_or(ForkError::UnknownSequence(id))?;
        if let (Some(c), Some(last)) = (cow, seq.table.last_mut()) {
            *last = c.dst;
        }
        seq.table.reserve(new_pages as usize);
        for _ in 0..new_pages {
            seq.table.push(Self::alloc_page(free, refcounts));
        }
        seq.len = new_len;
        // The tail is private now (copied or fresh), so the headroom is the room left.
        let headroom = (seq.table.len() as u64)
            .saturating_mul(u64::from(cfg.block_size_tokens))
            .saturating_sub(new_len);
        Ok(AppendOutcome {
            cow,
            pages_allocated: new_pages as u32,
            headroom,
        })
    }

    /// Tokens `seq` can take by [`Self::append`] without allocating or copying a page: the
    /// room left in its tail page, or 0 when the next token writes into a partial tail
    /// page another table still holds (that append copies it first). A simulator that
    /// advances many sequences a token at a time may batch appends up to this headroom
    /// and call `append` only when a page is needed: the pool's pages, refcounts and free
    /// list then go through the same states, at the same tokens, as one call per token.
    pub fn append_headroom(&self, id: SeqId) -> Result<u64, ForkError> {
        let seq = self.seq(id)?;
        let tail = self.cfg.tail_tokens(seq.len);
        if tail > 0 && seq.may_share {
            if let Some(&b) = seq.table.last() {
                if self.refcounts[b as usize] > 1 {
                    return Ok(0);
                }
            }
        }
        let room = (seq.table.len() as u64)
            .saturating_mul(u64::from(self.cfg.block_size_tokens))
            .saturating_sub(seq.len);
        Ok(room)
    }

    /// Shortens `seq` to `len` tokens (a rollback), dropping the pages past it. A later
    /// append into a page still shared copies it first.
    pub fn truncate(&mut self, id: SeqId, len: u64) -> Result<TruncateOutcome, ForkError> {
        let keep = self.cfg.pages_for(len) as usize;
        let PoolCore {
            free,
            refcounts,
            slots,
            ..
        } = self;
        let seq = match slots.get_mut(id.index as usize) {
            Some(Slot {
                generation,
                seq: Some(seq),
            }) if *generation == id.generation => seq,
            _ => return Err(ForkError::UnknownSequence(id)),
        };
        if len > seq.len {
            return Err(ForkError::InvalidLength {
                len: seq.len,
                requested: len,
            });
        }
        let mut out = TruncateOutcome::default();
        for b in seq.table.drain(keep..) {
            out.pages_dropped += 1;
            out.pages_freed += u32::from(Self::dec_ref(free, refcounts, b));
        }
        seq.len = len;
        Ok(out)
    }

    /// Checks that `parent` may be forked (live, not already forked, no page shared with
    /// another table such as a text-prefix cache) without changing anything.
    pub fn check_fork(&self, parent: SeqId) -> Result<(), ForkError> {
        let seq = self.seq(parent)?;
        if seq.forked {
            return Err(ForkError::AdmissionRejected(Reason::AlreadyForked));
        }
        if !seq.may_share {
            debug_assert!(seq.table.iter().all(|&b| self.refcounts[b as usize] == 1));
            return Ok(());
        }
        let shared = seq
            .table
            .iter()
            .filter(|&&b| self.refcounts[b as usize] > 1)
            .count();
        if shared > 0 {
            return Err(ForkError::AdmissionRejected(Reason::SharedPages {
                pages: shared as u64,
            }));
        }
        Ok(())
    }

    /// Forks `parent` into `n` branches. Whole pages are shared (block ids copied, one
    /// reference added per extra branch); a partial tail is copied per
    /// [`TailPolicy`]. `branches[0]` is `parent` itself.
    pub fn fork(&mut self, parent: SeqId, n: u32) -> Result<ForkOutcome, ForkError> {
        if n == 0 {
            return Err(ForkError::InvalidBranchCount(n));
        }
        self.check_fork(parent)?;
        let cfg = self.cfg;
        let extra = n - 1;
        let (len, pages) = {
            let seq = self.seq(parent)?;
            (seq.len, seq.table.len())
        };
        let tail_tokens = cfg.tail_tokens(len);
        let copy_tail = cfg.tail == TailPolicy::CopyAtFork && tail_tokens > 0;
        // Pages whose block ids the branches share.
        let shared = if copy_tail { pages - 1 } else { pages };
        let tail_pages = if copy_tail { u64::from(extra) } else { 0 };
        self.check_free(tail_pages)?;
        if !self.can_insert(u64::from(extra)) {
            return Err(ForkError::Overflow("sequence slots"));
        }

        let PoolCore {
            free,
            refcounts,
            slots,
            ..
        } = self;
        let parent_seq = slots[parent.index as usize]
            .seq
            .as_mut()
            .ok_or(ForkError::UnknownSequence(parent))?;
        parent_seq.forked = true;
        parent_seq.may_share = true;
        // Admission guaranteed refcount 1 on every page, so this cannot overflow.
        for &b in &parent_seq.table[..shared] {
            refcounts[b as usize] += extra;
        }
        let mut tables = Vec::with_capacity(extra as usize);
        let mut copies = Vec::new();
        let tail_src = parent_seq.table.last().copied();
        for _ in 0..extra {
            let mut t = Vec::with_capacity(pages);
            t.extend_from_slice(&parent_seq.table[..shared]);
            if let (true, Some(src)) = (copy_tail, tail_src) {
                // The source stays held by branch 0, so it cannot be reallocated (and
                // overwritten) before the driver has executed this copy.
                let dst = Self::alloc_page(free, refcounts);
                t.push(dst);
                copies.push(Self::copy_action(&cfg, src, dst, tail_tokens));
            }
            tables.push(t);
        }

        let mut branches = Vec::with_capacity(n as usize);
        branches.push(parent);
        for table in tables {
            branches.push(self.insert(Seq {
                table,
                len,
                forked: true,
                may_share: true,
            }));
        }
        let cost = ForkCost {
            table_clones: extra,
            table_entries_cloned: u64::from(extra) * shared as u64,
            pages_shared: if extra > 0 { shared as u64 } else { 0 },
            state_clones: 0,
            state_bytes: 0,
            tail_copies: copies.len() as u32,
            tail_copy_bytes: copies.iter().map(|c| c.bytes).sum(),
        };
        Ok(ForkOutcome {
            branches,
            copies,
            cost,
        })
    }

    /// A new read-only holder of `seq`'s whole pages, as a text-prefix (radix) cache
    /// takes when it caches a request's prefix. While it lives, `seq` cannot be forked.
    pub fn share_prefix(&mut self, id: SeqId) -> Result<SeqId, ForkError> {
        let bs = u64::from(self.cfg.block_size_tokens);
        let seq = self.seq(id)?;
        let whole = (seq.len / bs) as usize;
        let table = seq.table[..whole].to_vec();
        if table
            .iter()
            .any(|&b| self.refcounts[b as usize] == u32::MAX)
        {
            return Err(ForkError::Overflow("page refcount"));
        }
        if !self.can_insert(1) {
            return Err(ForkError::Overflow("sequence slots"));
        }
        for &b in &table {
            self.refcounts[b as usize] += 1;
        }
        if let Some(src) = self.slots[id.index as usize].seq.as_mut() {
            src.may_share = true;
        }
        Ok(self.insert(Seq {
            table,
            len: whole as u64 * bs,
            forked: false,
            may_share: true,
        }))
    }

    /// Releases `seq`: takes its table out of the slab and drops one reference per page.
    /// A second release of the same handle returns [`Release::AlreadyReleased`] and
    /// decrements nothing.
    pub fn release(&mut self, id: SeqId) -> Result<Release, ForkError> {
        match self.classify(id) {
            Found::Live => {}
            Found::Released => return Ok(Release::AlreadyReleased),
            Found::Unknown => return Err(ForkError::UnknownSequence(id)),
        }
        let slot = &mut self.slots[id.index as usize];
        let Some(seq) = slot.seq.take() else {
            return Ok(Release::AlreadyReleased);
        };
        slot.generation += 1;
        self.free_slots.push(id.index);
        self.live -= 1;
        let mut pages_freed = 0;
        for &b in &seq.table {
            pages_freed += u32::from(Self::dec_ref(&mut self.free, &mut self.refcounts, b));
        }
        Ok(Release::Released {
            pages_dropped: seq.table.len() as u32,
            pages_freed,
        })
    }

    /// The memory reserved for `id`'s block table, in pages (tests of `allocate_for`).
    #[cfg(test)]
    pub(crate) fn table_capacity(&self, id: SeqId) -> Result<usize, ForkError> {
        Ok(self.seq(id)?.table.capacity())
    }

    /// The block table of `seq`.
    pub fn table(&self, id: SeqId) -> Result<&[u32], ForkError> {
        Ok(&self.seq(id)?.table)
    }

    /// Length of `seq` in tokens.
    pub fn seq_len(&self, id: SeqId) -> Result<u64, ForkError> {
        Ok(self.seq(id)?.len)
    }

    /// Whether `seq` was produced by a fork or has been forked.
    pub fn is_forked(&self, id: SeqId) -> Result<bool, ForkError> {
        Ok(self.seq(id)?.forked)
    }

    /// Whether `seq` is live.
    pub fn is_live(&self, id: SeqId) -> bool {
        matches!(self.classify(id), Found::Live)
    }

    /// Refcount of page `block`, `None` if out of range.
    pub fn refcount(&self, block: u32) -> Option<u32> {
        self.refcounts.get(block as usize).copied()
    }

    /// Occupancy counters.
    pub fn stats(&self) -> PoolStats {
        let free = self.free.len() as u32;
        PoolStats {
            capacity: self.cfg.capacity_pages,
            free,
            used: self.cfg.capacity_pages - free,
            live_sequences: self.live,
        }
    }

    /// A copy of all bookkeeping (O(pages + table entries)); for checkers, not hot paths.
    pub fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            refcounts: self.refcounts.clone(),
            free: self.free.clone(),
            tables: self
                .slots
                .iter()
                .enumerate()
                .filter_map(|(i, s)| {
                    s.seq.as_ref().map(|q| {
                        let id = SeqId {
                            index: i as u32,
                            generation: s.generation,
                        };
                        (id, q.len, q.table.clone())
                    })
                })
                .collect(),
        }
    }
}

/// The thread-safe block pool: a [`PoolCore`] behind one mutex. `Send + Sync`.
#[derive(Debug)]
pub struct BlockPool {
    /// Immutable copy of the core's configuration, readable without the lock.
    cfg: PoolConfig,
    inner: sync::Mutex<PoolCore>,
}

impl BlockPool {
    /// An empty pool; fails on a zero block size or a capacity that does not fit `u32` ids.
    pub fn new(cfg: PoolConfig) -> Result<Self, ForkError> {
        Ok(Self {
            cfg,
            inner: sync::Mutex::new(PoolCore::new(cfg)?),
        })
    }

    fn lock(&self) -> Result<sync::MutexGuard<'_, PoolCore>, ForkError> {
        // Operations never panic while holding the lock, so poison means a bug elsewhere
        // (or an allocation failure mid-operation): refuse rather than trust the state.
        self.inner.lock().map_err(|_| ForkError::Poisoned)
    }

    /// Runs `f` on the locked core (several operations as one atomic step).
    pub fn with_core<R>(&self, f: impl FnOnce(&mut PoolCore) -> R) -> Result<R, ForkError> {
        Ok(f(&mut *self.lock()?))
    }

    /// The configuration this pool was built with.
    pub fn config(&self) -> &PoolConfig {
        &self.cfg
    }

    /// See [`PoolCore::allocate`].
    pub fn allocate(&self, tokens: u64) -> Result<SeqId, ForkError> {
        self.lock()?.allocate(tokens)
    }

    /// See [`PoolCore::append`].
    pub fn append(&self, seq: SeqId, tokens: u64) -> Result<AppendOutcome, ForkError> {
        self.lock()?.append(seq, tokens)
    }

    /// See [`PoolCore::append_headroom`].
    pub fn append_headroom(&self, seq: SeqId) -> Result<u64, ForkError> {
        self.lock()?.append_headroom(seq)
    }

    /// See [`PoolCore::truncate`].
    pub fn truncate(&self, seq: SeqId, len: u64) -> Result<TruncateOutcome, ForkError> {
        self.lock()?.truncate(seq, len)
    }

    /// See [`PoolCore::check_fork`].
    pub fn check_fork(&self, parent: SeqId) -> Result<(), ForkError> {
        self.lock()?.check_fork(parent)
    }

    /// See [`PoolCore::fork`].
    pub fn fork(&self, parent: SeqId, n: u32) -> Result<ForkOutcome, ForkError> {
        self.lock()?.fork(parent, n)
    }

    /// See [`PoolCore::share_prefix`].
    pub fn share_prefix(&self, seq: SeqId) -> Result<SeqId, ForkError> {
        self.lock()?.share_prefix(seq)
    }

    /// See [`PoolCore::release`].
    pub fn release(&self, seq: SeqId) -> Result<Release, ForkError> {
        self.lock()?.release(seq)
    }

    /// A copy of `seq`'s block table.
    pub fn table(&self, seq: SeqId) -> Result<Vec<u32>, ForkError> {
        self.lock()?.table(seq).map(<[u32]>::to_vec)
    }

    /// See [`PoolCore::seq_len`].
    pub fn seq_len(&self, seq: SeqId) -> Result<u64, ForkError> {
        self.lock()?.seq_len(seq)
    }

    /// See [`PoolCore::refcount`].
    pub fn refcount(&self, block: u32) -> Result<Option<u32>, ForkError> {
        Ok(self.lock()?.refcount(block))
    }

    /// See [`PoolCore::stats`].
    pub fn stats(&self) -> Result<PoolStats, ForkError> {
        Ok(self.lock()?.stats())
    }

    /// See [`PoolCore::snapshot`].
    pub fn snapshot(&self) -> Result<PoolSnapshot, ForkError> {
        Ok(self.lock()?.snapshot())
    }
}

// The pool is shared between a scheduler thread and completion threads.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<BlockPool>();
};

//! Block-table vocabulary: pool configuration, sequence handles, the copy actions the
//! driver executes, and the counts a fork costs.
//!
//! Everything here is plain data with no synchronisation; the pool that owns tables and
//! refcounts lives in [`super::pool`]. Page arithmetic is kept here so the pool and the
//! tests compute "how many pages does this length need" the same way.

use crate::invariant::{violation, InvariantViolation};
use serde::{Deserialize, Serialize};
use std::fmt;

/// How a fork at a length that is not a multiple of the page size treats the partial
/// tail page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TailPolicy {
    /// Copy the tail at fork time so that every branch owns a private tail (seed 000's
    /// design). Branch 0 keeps the parent's tail, which is already private, so an
    /// `n`-way fork costs `n - 1` copies.
    #[default]
    CopyAtFork,
    /// Share the tail like any other page and copy it lazily, on the first write by a
    /// branch that still shares it (vLLM's block manager). At most `n - 1` copies, all
    /// on the writing side; the last holder writes in place.
    CopyOnWrite,
}

/// Configuration of a [`super::BlockPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PoolConfig {
    /// Number of KV pages in the pool.
    pub capacity_pages: u32,
    /// Tokens per page (vLLM's and SGLang's `page_size`; 16 is common).
    pub block_size_tokens: u32,
    /// KV bytes one token occupies across all layers (57,344 for Qwen2.5-VL-7B in bf16:
    /// 28 layers x 2 (K, V) x 4 KV heads x 128 dims x 2 bytes).
    pub bytes_per_token: u64,
    /// What a non-page-aligned fork does with the partial tail page.
    pub tail: TailPolicy,
}

/// KV bytes per token of Qwen2.5-VL-7B in bf16 (28 layers, 4 KV heads of 128 dims, K and V).
pub const QWEN25_VL_7B_BYTES_PER_TOKEN: u64 = 28 * 2 * 4 * 128 * 2;

impl PoolConfig {
    /// A configuration with the default tail policy ([`TailPolicy::CopyAtFork`]).
    pub fn new(capacity_pages: u32, block_size_tokens: u32, bytes_per_token: u64) -> Self {
        Self {
            capacity_pages,
            block_size_tokens,
            bytes_per_token,
            tail: TailPolicy::default(),
        }
    }

    /// The same configuration with another tail policy.
    pub fn with_tail(mut self, tail: TailPolicy) -> Self {
        self.tail = tail;
        self
    }

    /// Pages needed to hold `tokens` tokens.
    #[inline]
    pub fn pages_for(&self, tokens: u64) -> u64 {
        // A zero block size is rejected when the pool is built; max(1) keeps this total.
        tokens.div_ceil(u64::from(self.block_size_tokens.max(1)))
    }

    /// Tokens held in the last, partial page of a sequence of `tokens` tokens (0 when the
    /// length is page-aligned).
    #[inline]
    pub fn tail_tokens(&self, tokens: u64) -> u64 {
        tokens % u64::from(self.block_size_tokens.max(1))
    }

    /// Bytes of KV that one full page holds.
    #[inline]
    pub fn page_bytes(&self) -> u64 {
        u64::from(self.block_size_tokens).saturating_mul(self.bytes_per_token)
    }
}

/// A handle to one sequence (one request or one branch) in a pool.
///
/// The generation makes handles single-use: once a sequence is released its slot's
/// generation moves on, so the old handle can never reach the slot's next occupant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId {
    pub(crate) index: u32,
    pub(crate) generation: u64,
}

impl SeqId {
    /// Slot index inside the pool (stable while the sequence lives; reused afterwards).
    pub fn index(self) -> u32 {
        self.index
    }

    /// Generation of the slot when this handle was issued.
    pub fn generation(self) -> u64 {
        self.generation
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seq#{}.{}", self.index, self.generation)
    }
}

/// A page copy the driver must perform before it next reads or writes `dst`.
///
/// `bytes` counts only the valid tokens of the source page (`tokens * bytes_per_token`),
/// not the whole page: attention never reads past a sequence's length and the branch
/// overwrites the rest before reading it, so copying the valid prefix is sufficient, and
/// the count reflects the traffic a careful backend moves. A backend that copies whole
/// pages for kernel simplicity can use [`PoolConfig::page_bytes`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CopyAction {
    /// Page to read.
    pub src: u32,
    /// Page to write; freshly allocated and private to the branch that asked for it.
    pub dst: u32,
    /// Valid tokens at the start of `src` to copy.
    pub tokens: u32,
    /// `tokens * bytes_per_token`.
    pub bytes: u64,
}

/// What a fork cost, counted apart so a driver can attribute wall time to each part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct ForkCost {
    /// New block tables built (one per branch beyond the first).
    pub table_clones: u32,
    /// Block ids copied from the parent's table into the new tables.
    pub table_entries_cloned: u64,
    /// Pages whose refcount went up (each by `n - 1`): the shared prefix.
    pub pages_shared: u64,
    /// Per-branch states cloned (filled by [`super::fork_request`]; 0 from the pool).
    pub state_clones: u32,
    /// Bytes those state clones copied, as reported by [`super::CloneForFork::fork_bytes`].
    pub state_bytes: u64,
    /// Tail pages copied at fork time.
    pub tail_copies: u32,
    /// Bytes those tail copies move (sum of [`CopyAction::bytes`]).
    pub tail_copy_bytes: u64,
}

/// Result of appending tokens to a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AppendOutcome {
    /// A copy-on-write of the shared tail page, present only when the append writes into
    /// a page another table still holds.
    pub cow: Option<CopyAction>,
    /// Fresh pages allocated for the new tokens (not counting the copy-on-write page).
    pub pages_allocated: u32,
    /// The sequence's [`PoolCore::append_headroom`](super::PoolCore::append_headroom)
    /// after this append (saves a second lookup in per-token loops).
    pub headroom: u64,
}

/// Result of truncating a sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TruncateOutcome {
    /// Pages dropped from the table.
    pub pages_dropped: u32,
    /// Of those, pages that no other table held and so returned to the free list.
    pub pages_freed: u32,
}

/// Result of forking a sequence into branches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkOutcome {
    /// One handle per branch; `branches[0]` is the parent's own handle, which stays valid.
    pub branches: Vec<SeqId>,
    /// Tail copies to execute (empty for a page-aligned fork or under copy-on-write).
    pub copies: Vec<CopyAction>,
    /// Counts for this fork (state fields are zero here).
    pub cost: ForkCost,
}

/// Result of a release; releasing is idempotent, so a second release is not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The sequence was live and is gone now.
    Released {
        /// Pages in its table.
        pages_dropped: u32,
        /// Of those, pages no other table held, now free.
        pages_freed: u32,
    },
    /// The handle had already been released; nothing was decremented.
    AlreadyReleased,
}

/// Occupancy counters of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Total pages.
    pub capacity: u32,
    /// Pages on the free list.
    pub free: u32,
    /// Pages with a nonzero refcount.
    pub used: u32,
    /// Live sequences (tables).
    pub live_sequences: u32,
}

/// A consistent copy of a pool's bookkeeping, for checkers and diagnostics.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolSnapshot {
    /// Refcount of every page, indexed by page id.
    pub refcounts: Vec<u32>,
    /// The free list, in pop order reversed (last element is allocated next).
    pub free: Vec<u32>,
    /// Every live sequence with its length in tokens and block table, by slot index.
    pub tables: Vec<(SeqId, u64, Vec<u32>)>,
}

impl PoolSnapshot {
    /// Checks the pool invariants on this snapshot: refcount = number of live tables
    /// holding the page, free + used = capacity, no page both free and referenced, no
    /// page twice on the free list, every table as long as its length needs.
    pub fn check(&self, cfg: &PoolConfig) -> Result<(), InvariantViolation> {
        let cap = self.refcounts.len();
        if cap != cfg.capacity_pages as usize {
            return Err(violation!(
                "F1",
                "{cap} refcounts for capacity {}",
                cfg.capacity_pages
            ));
        }
        let mut holders = vec![0u64; cap];
        for (id, len, table) in &self.tables {
            if table.len() as u64 != cfg.pages_for(*len) {
                return Err(violation!(
                    "F1",
                    "{id}: {} pages for {len} tokens (block {})",
                    table.len(),
                    cfg.block_size_tokens
                ));
            }
            for &b in table {
                match holders.get_mut(b as usize) {
                    Some(h) => *h += 1,
                    None => return Err(violation!("F1", "{id}: page {b} out of range")),
                }
            }
        }
        for (b, (&rc, &h)) in self.refcounts.iter().zip(&holders).enumerate() {
            if u64::from(rc) != h {
                return Err(violation!(
                    "F1",
                    "page {b}: refcount {rc} but {h} live holders"
                ));
            }
        }
        let mut on_free = vec![false; cap];
        for &b in &self.free {
            match on_free.get_mut(b as usize) {
                Some(seen) if *seen => {
                    return Err(violation!("F1", "page {b} twice on the free list"))
                }
                Some(seen) => *seen = true,
                None => return Err(violation!("F1", "free page {b} out of range")),
            }
            if self.refcounts[b as usize] != 0 {
                return Err(violation!("F1", "page {b} is free and referenced"));
            }
        }
        let used = self.refcounts.iter().filter(|&&rc| rc > 0).count();
        if used + self.free.len() != cap {
            return Err(violation!(
                "F1",
                "free {} + used {used} != capacity {cap}",
                self.free.len()
            ));
        }
        Ok(())
    }
}

//! Same-worker agent fork (seed 000 pillar 2): a refcounted KV block pool with
//! copy-on-write, per-branch state cloning, and fail-closed admission.
//!
//! An agent request that fans out into `n` branches on one decode worker shares its
//! prefix KV instead of re-prefilling it: [`BlockPool::fork`] copies the parent's block
//! ids into each new branch table and adds `n - 1` references to every whole page; no KV
//! byte moves. A partial tail page is either copied at fork time ([`TailPolicy::CopyAtFork`],
//! the design default) or shared and copied on the first write by a branch that still
//! shares it ([`TailPolicy::CopyOnWrite`], vLLM's behaviour). Either way a branch never
//! writes a page another table holds. Copies come back as [`CopyAction`]s (sans-IO): the
//! simulator counts them, a real backend performs them, in order, before the branch's
//! next step. Per-branch decode state is cloned through [`CloneForFork`] with a salted
//! sampler seed ([`branch_seed`]). [`fork_request`] ties admission, state cloning and the
//! page fork together and reports table, state and tail costs apart ([`ForkCost`]).
//!
//! Module map: `table` (config, handles, actions, costs, snapshot checker), `pool` (the
//! refcounts, free list and idempotent release; the only code that locks, and the code
//! loom checks), `state` (branch state and seed salting), `admission` (reasons and
//! [`fork_request`]), `toy` (a reference KV memory and decoder for token-identity tests).
//!
//! Deviation from the seed's wording, on purpose: the seed says a non-page-aligned fork
//! gives *each* branch a private tail copy and then releases the parent's tail. Here
//! branch 0 is the parent and keeps its tail (admission guarantees it is private), and
//! only branches `1..n` get copies. The end state is the same (every branch owns a
//! private tail), it costs one copy fewer, and no copy ever reads a page that the same
//! call has already put back on the free list, where a concurrent allocation could
//! overwrite it before the driver executes the copy.

mod admission;
mod pool;
mod state;
mod table;
mod toy;

#[cfg(all(test, not(loom)))]
mod tests;

pub use admission::{fork_request, AdmissionInput, Branch, ForkPool, ForkedRequest, Reason};
pub use pool::{BlockPool, PoolCore};
pub use state::{
    branch_seed, BranchState, CloneForFork, FinishReason, FinishState, GrammarState, MRope,
    MmAnchor, NotCloneable, Positions, SamplerState,
};
pub use table::{
    AppendOutcome, CopyAction, ForkCost, ForkOutcome, PoolConfig, PoolSnapshot, PoolStats, Release,
    SeqId, TailPolicy, TruncateOutcome, QWEN25_VL_7B_BYTES_PER_TOKEN,
};
pub use toy::{toy_next_token, ToyKv};

/// Errors of the fork module. No operation panics on misuse; each returns one of these
/// and leaves the pool unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ForkError {
    /// Not enough free pages for the operation.
    #[error("block pool exhausted: {needed} pages needed, {free} free")]
    PoolExhausted {
        /// Pages the operation needed.
        needed: u64,
        /// Pages free at the time.
        free: u64,
    },
    /// The handle is not live in this pool (released, retired, or never issued).
    #[error("unknown or released sequence {0}")]
    UnknownSequence(SeqId),
    /// Admission refused the fork; prefill the branches independently.
    #[error("fork rejected: {0}")]
    AdmissionRejected(Reason),
    /// A fork needs at least one branch.
    #[error("a fork needs at least one branch, got {0}")]
    InvalidBranchCount(u32),
    /// Truncation past the end of a sequence.
    #[error("cannot truncate a {len}-token sequence to {requested} tokens")]
    InvalidLength {
        /// Current length.
        len: u64,
        /// Requested length.
        requested: u64,
    },
    /// A count would overflow its integer type.
    #[error("{0} would overflow")]
    Overflow(&'static str),
    /// The pool configuration is unusable.
    #[error("invalid pool config: {0}")]
    InvalidConfig(&'static str),
    /// The pool's lock was poisoned by a panic elsewhere; the pool refuses to continue.
    #[error("block pool lock poisoned")]
    Poisoned,
}

impl ForkError {
    /// Whether the caller should fall back to independent prefill (an admission reject).
    pub fn falls_back_to_prefill(&self) -> bool {
        matches!(self, Self::AdmissionRejected(_))
    }
}

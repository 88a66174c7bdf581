//! Fail-closed fork admission and the full request fork (pages plus per-branch state).
//!
//! A fork is admitted only when nothing else can observe its pages or its state: the
//! request has not been forked already, no page is shared with another table (a
//! text-prefix cache holder), the caller reports no text-prefix cache hit, and every
//! branch's state clones. Any rejection carries a [`Reason`] and leaves the pool
//! untouched; the caller falls back to independent prefill for that request.

use super::pool::{BlockPool, PoolCore};
use super::state::CloneForFork;
use super::table::{CopyAction, ForkCost, ForkOutcome, SeqId};
use super::ForkError;

/// Why a fork was refused; the caller prefills each branch independently instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum Reason {
    /// The request is a branch of an earlier fork, or was forked already.
    #[error("request already forked")]
    AlreadyForked,
    /// Some pages are held by another table (e.g. a text-prefix cache entry).
    #[error("{pages} pages shared with another table (text-prefix cache)")]
    SharedPages {
        /// How many of the request's pages are shared.
        pages: u64,
    },
    /// The scheduler matched the request against a text-prefix (radix) cache.
    #[error("request shares a text-prefix cache")]
    TextPrefixCache,
    /// A per-branch state field has no way to be cloned.
    #[error("state field `{field}` cannot be cloned")]
    StateNotCloneable {
        /// Which field.
        field: &'static str,
    },
}

/// What the caller knows that the pool cannot see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdmissionInput {
    /// The request's prefix came from (or is registered in) a text-prefix cache outside
    /// this pool.
    pub text_prefix_cache_hit: bool,
}

/// One branch of a forked request.
#[derive(Debug, Clone, PartialEq)]
pub struct Branch<S> {
    /// Its sequence in the pool.
    pub seq: SeqId,
    /// Its own state.
    pub state: S,
}

/// A forked request: branches with their states, copies to execute, and the cost.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkedRequest<S> {
    /// `branches[i].state` is `clone_for_fork(i)` of the parent's state; `branches[0].seq`
    /// is the parent's handle.
    pub branches: Vec<Branch<S>>,
    /// Tail-page copies the driver must execute.
    pub copies: Vec<CopyAction>,
    /// Table, state and tail costs, apart.
    pub cost: ForkCost,
}

/// A pool that can fork: the locked [`BlockPool`] or a bare [`PoolCore`].
pub trait ForkPool {
    /// See [`PoolCore::check_fork`].
    fn check_fork(&mut self, parent: SeqId) -> Result<(), ForkError>;
    /// See [`PoolCore::fork`].
    fn fork(&mut self, parent: SeqId, n: u32) -> Result<ForkOutcome, ForkError>;
}

impl ForkPool for &BlockPool {
    fn check_fork(&mut self, parent: SeqId) -> Result<(), ForkError> {
        BlockPool::check_fork(self, parent)
    }
    fn fork(&mut self, parent: SeqId, n: u32) -> Result<ForkOutcome, ForkError> {
        BlockPool::fork(self, parent, n)
    }
}

impl ForkPool for &mut PoolCore {
    fn check_fork(&mut self, parent: SeqId) -> Result<(), ForkError> {
        PoolCore::check_fork(self, parent)
    }
    fn fork(&mut self, parent: SeqId, n: u32) -> Result<ForkOutcome, ForkError> {
        PoolCore::fork(self, parent, n)
    }
}

/// Admits and forks a request into `n` branches: checks admission, clones the state once
/// per branch, then forks the pages. On any error nothing in the pool has changed.
pub fn fork_request<P: ForkPool, S: CloneForFork>(
    mut pool: P,
    parent: SeqId,
    state: &S,
    n: u32,
    input: AdmissionInput,
) -> Result<ForkedRequest<S>, ForkError> {
    if n == 0 {
        return Err(ForkError::InvalidBranchCount(n));
    }
    if input.text_prefix_cache_hit {
        return Err(ForkError::AdmissionRejected(Reason::TextPrefixCache));
    }
    // Cheap page checks first so a doomed fork does not clone n states.
    pool.check_fork(parent)?;
    let mut states = Vec::with_capacity(n as usize);
    let mut state_bytes = 0u64;
    for i in 0..n {
        let s = state.clone_for_fork(i).map_err(|e| {
            ForkError::AdmissionRejected(Reason::StateNotCloneable { field: e.field })
        })?;
        state_bytes = state_bytes.saturating_add(s.fork_bytes());
        states.push(s);
    }
    // Re-checks admission under the pool's lock, so a concurrent fork cannot slip in.
    let out = pool.fork(parent, n)?;
    let mut cost = out.cost;
    cost.state_clones = n;
    cost.state_bytes = state_bytes;
    Ok(ForkedRequest {
        branches: out
            .branches
            .into_iter()
            .zip(states)
            .map(|(seq, state)| Branch { seq, state })
            .collect(),
        copies: out.copies,
        cost,
    })
}

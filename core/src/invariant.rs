//! A broken internal invariant, as the debug checkers report it (`check` functions that
//! the property tests call after every operation: the eviction policies' queues,
//! [`PoolSnapshot::check`](crate::fork::PoolSnapshot::check)).

/// An invariant found broken: which one (its INVARIANTS.md number where it has one, such
/// as `P1` or `F1`) and what was seen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invariant {invariant} broken: {detail}")]
pub struct InvariantViolation {
    /// The invariant's name (`P1`, `F1`, ...).
    pub invariant: &'static str,
    /// What the checker saw.
    pub detail: String,
}

impl InvariantViolation {
    /// A violation of `invariant`.
    pub fn new(invariant: &'static str, detail: impl Into<String>) -> Self {
        Self {
            invariant,
            detail: detail.into(),
        }
    }
}

/// `violation!("P1", "fmt", args..)`: an [`InvariantViolation`] with a formatted detail.
macro_rules! violation {
    ($inv:literal, $($fmt:tt)+) => {
        $crate::invariant::InvariantViolation::new($inv, format!($($fmt)+))
    };
}
pub(crate) use violation;

//! Store errors, mirroring Mooncake's `ErrorCode`s.

use thiserror::Error;

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// A store operation's failure. [`StoreError::code`] gives Mooncake's numeric code.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum StoreError {
    /// No object under this key (-704).
    #[error("object not found")]
    NotFound,
    /// The object's put is still in progress (-703).
    #[error("object not ready (put in progress)")]
    NotReady,
    /// A put of a key that already exists (-705).
    #[error("object already exists")]
    AlreadyExists,
    /// Remove without force of an object holding a read lease (-706).
    #[error("object has lease")]
    HasLease,
    /// No space for a put; eviction was requested, the put is not retried (-200).
    #[error("no available handle (store full)")]
    NoAvailableHandle,
    /// The read lease expired while the transfer was in flight (-707).
    #[error("lease expired during transfer")]
    LeaseExpired,
    /// Transferred bytes did not match the store's checksum (-801).
    #[error("checksum mismatch")]
    ChecksumMismatch,
    /// The caller's buffer is smaller than the object (-10).
    #[error("buffer too small: object is {needed} bytes, buffer holds {capacity}")]
    BufferTooSmall {
        /// Object size.
        needed: u64,
        /// Buffer capacity.
        capacity: u64,
    },
    /// A bytes read of an object stored size-only (a driver mixing payload modes).
    #[error("object is stored size-only; it has no bytes to read")]
    SizeOnly,
    /// Invalid arguments (-600), e.g. a put_end whose size differs from its put_start.
    #[error("invalid params: {0}")]
    InvalidParams(String),
    /// The client could not register its transfer buffer: a broken client, not a miss.
    #[error("buffer registration failed: {0}")]
    BufferRegistration(String),
    /// The store could not be reached (-900, RPC failure).
    #[error("store unavailable: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// Mooncake's numeric error code for this error.
    pub fn code(&self) -> i32 {
        match self {
            StoreError::NotFound => -704,
            StoreError::NotReady => -703,
            StoreError::AlreadyExists => -705,
            StoreError::HasLease => -706,
            StoreError::NoAvailableHandle => -200,
            StoreError::LeaseExpired => -707,
            StoreError::ChecksumMismatch => -801,
            StoreError::BufferTooSmall { .. } => -10,
            StoreError::SizeOnly | StoreError::InvalidParams(_) => -600,
            StoreError::BufferRegistration(_) => -1,
            StoreError::Unavailable(_) => -900,
        }
    }

    /// True for errors that mean the client or store is broken (surface them), as opposed
    /// to an ordinary miss or contention outcome.
    pub fn is_client_failure(&self) -> bool {
        matches!(
            self,
            StoreError::BufferRegistration(_) | StoreError::Unavailable(_)
        )
    }
}

/// A store or policy configuration that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// A field is out of range or not allowed where it is; `field` is its path.
    #[error("{field}: {what}")]
    Field {
        /// The field's path (`s3-fifo: small_ratio`, `type-aware: types.kv_cache.reuse_scale`).
        field: String,
        /// What was expected, and what was given.
        what: String,
    },
    /// The configuration text does not parse.
    #[error("policy config ({format}): {what}")]
    Parse {
        /// `JSON` or `TOML`.
        format: &'static str,
        /// The parser's message (with its line and column).
        what: String,
    },
}

impl ConfigError {
    /// A field error.
    pub fn field(field: impl Into<String>, what: impl Into<String>) -> Self {
        ConfigError::Field {
            field: field.into(),
            what: what.into(),
        }
    }
}

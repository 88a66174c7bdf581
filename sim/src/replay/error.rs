//! What can go wrong compiling or replaying a trace. Each error keeps its cause (the
//! trace reader's, the store's, the cost model's) as its source, and its message says
//! where: the file, the request, the access, the policy.

use std::path::PathBuf;

use moonagent_core::store::{ConfigError, StoreError};
use moonagent_models::ModelError;
use moonagent_traces::TraceError;

/// Why a trace could not be compiled or replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace reader (or generator) refused a request.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A Mooncake trace could not be opened.
    #[error("opening Mooncake trace {}: {source}", path.display())]
    Open {
        /// The trace file.
        path: PathBuf,
        /// The importer's error.
        source: TraceError,
    },
    /// The sessions generator refused its settings.
    #[error("sessions generator: {0}")]
    Generator(#[source] TraceError),
    /// A compile error in a file.
    #[error("{}: {source}", path.display())]
    File {
        /// The trace file.
        path: PathBuf,
        /// What went wrong in it.
        source: Box<ReplayError>,
    },
    /// `block_size` is 0.
    #[error("block_size: expected at least 1 token per block")]
    BlockSize,
    /// A request's accesses could not be compiled.
    #[error("request {id}: {source}")]
    Request {
        /// The request's id.
        id: u64,
        /// What is wrong with it.
        source: Box<ReplayError>,
    },
    /// More accesses than one replay indexes.
    #[error("trace too long for one replay: more than {max} accesses")]
    TooLong {
        /// The most accesses a replay takes.
        max: u32,
    },
    /// An object over the replay's 4 GiB size field.
    #[error("object of {bytes} bytes is over the replay's 4 GiB object limit")]
    ObjectTooLarge {
        /// The object's size.
        bytes: u64,
    },
    /// Accesses out of arrival order.
    #[error("access at t={time} ns after one at t={last} ns: a trace must be in arrival order")]
    OutOfOrder {
        /// The access's time.
        time: u64,
        /// The previous access's time.
        last: u64,
    },
    /// A compiled trace replayed before `Compiled::fill_next`.
    #[error("compiled trace not finished: call Compiled::fill_next after the last push")]
    NotFilled,
    /// The store configuration is not valid.
    #[error("store config: {0}")]
    StoreConfig(#[source] ConfigError),
    /// A policy could not be built.
    #[error("policy {label}: {source}")]
    Policy {
        /// The policy's label.
        label: String,
        /// Why.
        source: ConfigError,
    },
    /// A store operation failed for a reason other than a miss or no space.
    #[error("{op} at t={time} of object {id}: {source}")]
    Store {
        /// `get` or `put`.
        op: &'static str,
        /// The access's time.
        time: u64,
        /// The object's trace id.
        id: u64,
        /// The store's error.
        source: StoreError,
    },
    /// A prefix lookup (`exists` per block) failed.
    #[error("exists at t={time}: {source}")]
    Exists {
        /// The request's time.
        time: u64,
        /// The store's error.
        source: StoreError,
    },
    /// A plain cache of capacity 0.
    #[error("plain cache: capacity: expected > 0")]
    PlainCapacity,
    /// A policy of the plain cache chose no victim while objects were resident.
    #[error("policy {policy} planned no victim with {resident} objects resident")]
    NoVictim {
        /// The policy's name.
        policy: String,
        /// Objects resident.
        resident: u64,
    },
    /// A plain-cache access failed.
    #[error("access {index} (t={time}): {source}")]
    Access {
        /// The access's index in the compiled trace.
        index: usize,
        /// Its time.
        time: u64,
        /// What failed.
        source: Box<ReplayError>,
    },
    /// A built-in hardware profile or model name, or the cost model built from them.
    #[error("{what}: {source}")]
    Model {
        /// `hardware`, `model` or `cost model`.
        what: &'static str,
        /// The models crate's error.
        source: ModelError,
    },
}

impl From<std::convert::Infallible> for ReplayError {
    fn from(e: std::convert::Infallible) -> Self {
        match e {}
    }
}

//! moonagent-sim: drivers that run the core's semantics in virtual time.
//!
//! - [`replay`]: the store-level trace replay. Each request becomes store operations
//!   (encoder-output get-or-put per image, prefix KV blocks looked up and put), time comes
//!   from the trace, and every listed eviction policy runs over the same compiled access
//!   sequence in parallel.

pub mod capacity;
pub mod des;
pub mod plot;
pub mod progress;
pub mod replay;
pub mod sweep;
pub mod table;

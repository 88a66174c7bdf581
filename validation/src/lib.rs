//! moonagent-validation: real backends that run the core's semantics against real systems.
//!
//! [`mooncake::BridgeStore`] implements the core's `Store` trait against a real Mooncake
//! Store (master + a client holding the memory segment) through `scripts/mooncake_bridge.py`,
//! so the embedding cache, eviction experiments and (later) measured runs execute the very
//! same core code on a real store as on the embedded `MemStore`.

pub mod backend;
pub mod compare;
pub mod measure;
pub mod profile;
pub mod mooncake;

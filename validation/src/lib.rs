//! moonagent-validation: real backends that run the core's semantics against real systems.
//!
//! [`mooncake::BridgeStore`] implements the core's `Store` trait against a real Mooncake
//! Store (master + a client holding the memory segment) through `scripts/mooncake_bridge.py`,
//! so the embedding cache, eviction experiments and (later) measured runs execute the very
//! same core code on a real store as on the embedded `MemStore`.
//!
//! [`compute`] is the other seam: the [`compute::Compute`] trait (encode, prefill, decode,
//! KV-page copy over a model spec) and its CPU implementation, [`compute::CpuCompute`],
//! which runs a scaled spec's real operator sequence with bf16 KV pages in a host arena.
//!
//! [`te`] is Mooncake's Transfer Engine between workers (the `transfer-engine` feature):
//! the backend's prefill-to-decode KV handoff can take it instead of loopback TCP.

pub mod backend;
pub mod compare;
pub mod compute;
pub mod cores;
pub mod exec;
pub mod measure;
pub mod mooncake;
pub mod profile;
pub mod study;
pub mod te;
pub mod warm;

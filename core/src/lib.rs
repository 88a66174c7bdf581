//! moonagent-core: the semantics of moonagent, implemented once.
//!
//! Sans-IO and deterministic: nothing here reads a clock, spawns a thread or opens a
//! socket, and nothing sleeps but [`cores::CoreGate::acquire`] (a compute thread of the
//! real backend waiting its turn for a host core; the simulator never calls it). Time comes in as an argument (`now`, integer nanoseconds), bytes move
//! through the [`store::Store`] trait, and work the driver must do (encode an image, copy
//! a KV page) comes back as data. The simulator drives this crate in virtual time with
//! size-only payloads; the real backend drives it in wall time with real bytes.

pub mod cores;
pub mod faulty;
pub mod fingerprint;
pub mod fork;
pub mod hint;
pub mod invariant;
pub mod mm_cache;
pub mod rng;
pub mod serve;
pub mod store;

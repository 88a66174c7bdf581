//! Store-level trace replay: every request becomes store operations on a `MemStore`, and
//! every listed policy replays the same compiled access sequence (read the trace once, fan
//! out to all policies in parallel, Caffeine-simulator / libCacheSim style).
//!
//! Per request, in order, at the request's arrival time, on a store with Mooncake
//! master's semantics (`MemStoreConfig`'s defaults: reads grant a 10 s lease, a put that
//! finds no room fails at once and the object stays uncached, eviction runs on the 10 ms
//! tick above the 0.90 watermark):
//! 1. each image the request lists: a read of its encoder output (`get`, grants a lease);
//!    on a miss the output is recomputed and put (size = visual tokens x bytes per visual
//!    token). The trace lists the encoder outputs a request needs (new and re-attached
//!    images); images inside a reused prefix are not looked up again (see "Limits");
//! 2. its prefix KV blocks, as Mooncake's KV connectors do: one `exists` per block (the
//!    batch lookup; each found block is leased), the leading run of found blocks is the
//!    prefix hit (blocks after the first missing one must be recomputed anyway), then every
//!    missing block is put.
//!
//! Every access carries a weight (bytes) and a miss penalty (the recompute time a
//! [`MissCost`] gives; [`ModelCost`], the roofline of `moonagent-models`, by default), so
//! hit rates are reported by count, by bytes and by time saved: the saving-time rate is
//! recompute time avoided by hits / recompute time with no cache. A KV block's penalty is
//! its marginal prefill time, `T(end of block) - T(start of block)` with `T(n)` the prefill
//! time of `n` tokens from scratch, so a request's blocks sum to its full prefill time.
//!
//! Each counter is also kept over *re-references* only (accesses to an object the trace
//! touched before): the first reference of an object misses under every policy and every
//! capacity, so the `reuse_*` rates show what a policy controls on the scale of what it can
//! win. Offline policies read each access's next-access index (logical time = access
//! index), filled by one backward pass, which also marks the re-references and numbers
//! the objects densely: the store is keyed by that 4-byte number, which keeps its index
//! small (the replay is memory-bound). [`min_bound`] gives Belady's MIN on an ideal
//! cache of `k` equal-size objects, the hit-count bound that holds for the store whatever
//! its leases and batch eviction do (see its docs).
//!
//! A second cache model, [`plain`] (`--cache-model plain`), replays the same compiled
//! trace with libCacheSim's semantics (evict before insert, every access a lookup, no
//! leases or watermarks, object-count or byte capacity); [`oracle_general`] and [`csv`]
//! read libCacheSim's binary and csv traces.
//!
//! [`trace_cache`] keeps each compiled trace as a flat file named by the trace's content
//! hash and compile options; a second replay of the same trace maps it instead of reading
//! and compiling again ([`Compiled`]'s arrays are [`Slab`]s, owned or mapped).
//!
//! Limits: the replay does not model that a KV prefix lost to eviction also needs the
//! encoder outputs of the images inside it (the trace does not say where images sit in
//! the prompt); a lost prefix is charged its prefill time only.

pub mod ablation;
mod compile;
mod costs;
pub mod csv;
mod error;
mod min_bound;
mod names;
pub mod oracle_general;
pub mod plain;
mod report;
mod results;
mod run;
mod slab;
pub mod trace_cache;

pub use compile::{Access, CompileOptions, Compiled, Include, FIRST_KV, NEVER, REUSE};
pub use costs::{sizes_for_model, LinearCost, MissCost, ModelCost, ObjectSizes};
pub use csv::{CsvError, CsvParams};
pub use error::ReplayError;
pub use min_bound::min_bound;
pub use names::{policy_by_name, POLICY_NAMES};
pub use oracle_general::OracleGeneralError;
pub use plain::{replay_plain, replay_plain_grid, CapacityUnit, PlainConfig};
pub use report::{
    capacities, min_bounds, min_bounds_objects, results_table, uniform_sizes, CapacityRun,
};
pub use results::{LabelledPolicy, PolicyResult, TypeResult};
pub use run::{grid, replay_all, replay_grid, replay_one};
pub use slab::Slab;
pub use trace_cache::{TraceCache, TraceKey};

use run::{count_lookup, hints};

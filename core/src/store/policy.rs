//! Eviction policies: which objects a store evicts once it has decided to evict.
//!
//! The split follows Mooncake's master and seed 002's hierarchical follow-up: the store
//! decides *when* and *how many* (the watermark trigger and Mooncake's target / lower-bound
//! object counts), a policy plans *which* by returning candidate references, and the store
//! re-validates every victim and does the mutation. A policy can never evict a leased,
//! hard-pinned or in-progress object: the store refuses such victims and counts the refusal
//! (`StoreStats::policy_refused`), which tests require to stay zero.
//!
//! Policies see every object's [`ObjectMeta`] in a dense slice indexed by [`ObjId`] and may
//! keep state of their own through the `on_*` hooks (LRU lists, GDSF priorities, ...).

use std::fmt::Debug;

use serde::{Deserialize, Serialize};

use super::policies::{soft_quota, unpinned_quota};
use super::policies::{
    Belady, BeladyCost, Fifo, Gdsf, Hierarchical, HierarchicalConfig, Lru, Ranked, S3Fifo,
    S3FifoConfig, Sieve, TypeAware, TypeAwareConfig, WTinyLfu, WTinyLfuConfig,
};
use super::vindex::{Merge, VictimIndex};
use super::{AccessHints, ConfigError, DataType, Nanos, ObjId};

/// What a policy knows about one object slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// False for a free slot (ignore it).
    pub live: bool,
    /// Size in bytes.
    pub size: u64,
    /// Object data type.
    pub data_type: DataType,
    /// Hard-pinned: never evicted.
    pub hard_pinned: bool,
    /// Soft pin holds until this time (exclusive), if the object was put soft-pinned.
    pub soft_pin_until: Option<Nanos>,
    /// The read lease holds until this time (exclusive). A fresh put has `lease_timeout = put time`:
    /// it takes no lease and is evictable at once, as on the real master.
    pub lease_timeout: Nanos,
    /// False while the put is in progress.
    pub complete: bool,
    /// Reads in flight (a real backend's get between start and end); evictable only at 0.
    pub readers: u32,
    /// Time of put start.
    pub put_time: Nanos,
    /// Global insertion sequence (total order of puts; ties on time broken by it).
    pub insert_seq: u64,
    /// Time of the last lease-granting read (or of the put).
    pub last_access: Nanos,
    /// Global sequence number of the last access (put or read).
    pub last_access_seq: u64,
    /// Lease-granting reads so far.
    pub access_count: u64,
    /// Driver hints of the latest access.
    pub hints: AccessHints,
    /// A 64-bit hash of the key (FxHash), so that policies can recognise a key that comes
    /// back after eviction (S3-FIFO's ghost queue) although its `ObjId` slot was reused.
    pub key_hash: u64,
}

/// Whether an object may be evicted now, and in which pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidate {
    /// Not evictable: free slot, in progress, hard-pinned, being read or leased.
    No,
    /// Evictable in the first pass.
    Unpinned,
    /// Evictable only after every unpinned candidate, and only if allowed.
    SoftPinned,
}

impl ObjectMeta {
    /// The master's eviction predicate: complete, not hard-pinned, not being read, lease
    /// expired (`now >= lease_timeout`); soft-pinned while `now < soft_pin_until`.
    #[inline]
    pub fn candidate(&self, now: Nanos) -> Candidate {
        if !self.live
            || !self.complete
            || self.hard_pinned
            || self.readers > 0
            || now < self.lease_timeout
        {
            return Candidate::No;
        }
        match self.soft_pin_until {
            Some(t) if now < t => Candidate::SoftPinned,
            _ => Candidate::Unpinned,
        }
    }
}

/// One eviction run as decided by the store.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EvictRequest {
    /// Time of the run.
    pub now: Nanos,
    /// Objects the master aims to evict: `ceil(object_count * evict_ratio_target)`.
    pub target: u64,
    /// Objects it must reach before giving up: `ceil(object_count * evict_ratio_lowerbound)`.
    pub lower_bound: u64,
    /// Objects in the store, in progress included (the master counts its whole metadata).
    pub object_count: u64,
    /// Bytes allocated, in-progress puts included.
    pub used_bytes: u64,
    /// Bytes the store holds at most.
    pub capacity_bytes: u64,
    /// Whether soft-pinned objects may be evicted at all.
    pub allow_soft_pinned: bool,
}

/// An eviction policy: plans victims; the store validates and evicts them.
pub trait EvictionPolicy: Send + Debug {
    /// The policy's configuration name (e.g. `mooncake-default`).
    fn name(&self) -> &str;
    /// A slot became live (put start).
    fn on_insert(&mut self, _id: ObjId, _meta: &ObjectMeta) {}
    /// A lease-granting read hit the object (its meta already updated).
    fn on_access(&mut self, _id: ObjId, _meta: &ObjectMeta) {}
    /// A lookup of a key that is not resident, before any eviction that makes room for it
    /// (libCacheSim's `find` on a miss): policies with a history of evicted keys
    /// (S3-FIFO's ghost) may consult it here. Optional: `MemStore` does not call it, and a
    /// policy must behave sensibly when it is never called.
    fn on_lookup_miss(&mut self, _key_hash: u64) {}
    /// The cache's capacity, announced once by a driver before the first insert (the
    /// plain replay does; `MemStore` does not, so a policy learns it from the first
    /// [`EvictRequest`] there). Policies that size queues before any eviction read it.
    fn on_capacity(&mut self, _capacity_bytes: u64) {}
    /// The slot is about to be freed (evicted, removed or revoked).
    fn on_remove(&mut self, _id: ObjId, _meta: &ObjectMeta) {}
    /// Push victims for `req` onto `out` (each at most once). `objects` is indexed by `ObjId`.
    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>);
    /// Whether the policy can pick its victims from a [`VictimIndex`]
    /// ([`EvictionPolicy::select_victims_indexed`]); `MemStore` then keeps one for it.
    fn uses_victim_index(&self) -> bool {
        false
    }
    /// Push exactly the victims [`EvictionPolicy::select_victims`] would, in the same
    /// order, reading `index` (kept in step with `objects` by the caller) instead of
    /// scanning `objects`. The default scans.
    fn select_victims_indexed(
        &mut self,
        req: &EvictRequest,
        objects: &[ObjectMeta],
        _index: &mut VictimIndex,
        out: &mut Vec<ObjId>,
    ) {
        self.select_victims(req, objects, out)
    }
}

/// Sort key of the master's lease order: smallest `lease_timeout` first; equal times
/// (common in virtual time, where a request's puts share one `now`) broken by insertion
/// order, as distinct wall-clock nanoseconds would on the real master.
#[inline]
fn lease_key(m: &ObjectMeta) -> (Nanos, u64) {
    (m.lease_timeout, m.insert_seq)
}

/// Mooncake master's `BatchEvict`, as at HEAD, on one metadata shard.
///
/// Pass 1 evicts every non-soft-pinned candidate whose lease key is at most the
/// `target`-th smallest. If fewer than `lower_bound` went, pass 2 evicts up to the
/// shortfall: from the remaining unpinned candidates in lease order when they suffice,
/// else all of them plus soft-pinned ones in lease order (when allowed).
///
/// Difference from the real master, on purpose: the master splits pass 1 over 1,024
/// hash shards (each shard evicts its share of the target in its own lease order), so its
/// victims are only approximately the globally oldest; this model uses one shard and the
/// exact global order. Ties are broken by insertion order (see [`lease_key`]).
///
/// `select_victims` scans every object (the reference); `select_victims_indexed` merges
/// the store's per-type lease-ordered [`VictimIndex`] streams and takes the same victims in
/// O((k + r) log n) (INVARIANTS S11).
#[derive(Debug, Default, Clone)]
pub struct MooncakeDefault {
    ranked: Ranked<(Nanos, u64)>,
}

impl MooncakeDefault {
    /// A fresh policy (it keeps no state between runs beyond scratch buffers).
    pub fn new() -> Self {
        Self::default()
    }
}

impl EvictionPolicy for MooncakeDefault {
    fn name(&self) -> &str {
        "mooncake-default"
    }

    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        // Pass 1 takes the `target` oldest unpinned leases, pass 2 tops up to the lower
        // bound from the next oldest, then from soft-pinned ones: together the
        // `max(target, lower_bound)` oldest unpinned, then soft-pinned up to the bound.
        self.ranked.collect(req, objects, |_, m| lease_key(m));
        self.ranked.select(req, out);
    }

    fn uses_victim_index(&self) -> bool {
        true
    }

    fn select_victims_indexed(
        &mut self,
        req: &EvictRequest,
        objects: &[ObjectMeta],
        index: &mut VictimIndex,
        out: &mut Vec<ObjId>,
    ) {
        index.sync_pins(req.now);
        let index = &*index;
        let pass = |soft: bool, q: usize, out: &mut Vec<ObjId>| {
            if q == 0 {
                return 0;
            }
            let streams =
                DataType::ALL.map(|t| index.candidates(t.index(), soft, req.now, objects));
            let before = out.len();
            out.extend(
                Merge::new(streams, |_, lease, seq, _| (lease, seq))
                    .take(q)
                    .map(|(_, id)| id),
            );
            out.len() - before
        };
        let k = pass(false, unpinned_quota(req), out);
        pass(true, soft_quota(req, k), out);
    }
}

/// A policy by name with its settings: serde's internally tagged form,
/// `{"policy": "<name>", <settings>...}` in JSON or `policy = "<name>"` at the top of a TOML
/// document. Unknown fields are errors everywhere. This enum is the one home of the
/// policy names: serde maps names to variants, [`PolicyConfig::NAMES`] lists them (checked
/// against serde by a test), [`PolicyConfig::by_name`] builds one with default settings,
/// and `build` maps variants to types, saying which field is invalid (by its path) when one
/// is. Adding a policy touches this enum, `NAMES`, `build` and `name` only; the replay, the
/// CLI and the sweeps take their names from here.
///
/// ```
/// use moonagent_core::store::PolicyConfig;
/// let p = PolicyConfig::from_json_str(
///     r#"{"policy": "type-aware", "types": {"encoder_output":
///         {"reuse_scale": 8.0, "eviction_grace_ms": 10000, "budget_ratio": 0.12},
///         "kv_cache": {"budget_ratio": 0.8}}}"#,
/// )
/// .unwrap();
/// assert_eq!(p.build().unwrap().name(), "type-aware");
/// assert!(PolicyConfig::from_toml_str("policy = \"s3-fifo\"\nsmall_ratio = 0.2").is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PolicyConfig {
    /// Mooncake master's default two-pass lease-ordered `BatchEvict`.
    MooncakeDefault {},
    /// Seed 002's type-aware ranking and budgets
    /// ([`type_aware`](crate::store::policies::type_aware)).
    TypeAware(TypeAwareConfig),
    /// Assign / Evict / Fallback over a scope tree
    /// ([`hierarchical`](crate::store::policies::hierarchical)).
    Hierarchical(HierarchicalConfig),
    /// Least recently used ([`lru`](crate::store::policies::lru)).
    Lru {},
    /// First in, first out ([`fifo`](crate::store::policies::fifo)).
    Fifo {},
    /// S3-FIFO, SOSP'23 ([`s3fifo`](crate::store::policies::s3fifo)).
    S3Fifo(S3FifoConfig),
    /// SIEVE, NSDI'24 ([`sieve`](crate::store::policies::sieve)).
    Sieve {},
    /// W-TinyLFU, Caffeine's ([`wtinylfu`](crate::store::policies::wtinylfu)).
    #[serde(rename = "w-tinylfu")]
    WTinyLfu(WTinyLfuConfig),
    /// GreedyDual-Size-Frequency with cost = miss penalty ([`gdsf`](crate::store::policies::gdsf)).
    Gdsf {},
    /// Offline: Belady's MIN from next-access hints ([`belady`](crate::store::policies::belady)).
    Belady {},
    /// Offline: cost-aware oracle heuristic ([`belady_cost`](crate::store::policies::belady_cost)).
    BeladyCost {},
}

/// Why [`PolicyConfig::by_name`] could not give a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyNameError {
    /// Not a policy name.
    #[error("unknown policy {name:?}; expected one of {known}")]
    Unknown {
        /// The name given.
        name: String,
        /// Every known name, comma-separated.
        known: String,
    },
    /// A policy with required settings and no defaults.
    #[error("policy {name:?} needs settings (give it a config file, `policy = \"{name}\"` ...): {reason}")]
    NeedsSettings {
        /// The name given.
        name: String,
        /// What serde found missing.
        reason: String,
    },
    /// Default settings that do not validate (a defect of the defaults).
    #[error("policy {name:?}: {reason}")]
    Invalid {
        /// The name given.
        name: String,
        /// The failed check.
        reason: String,
    },
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig::MooncakeDefault {}
    }
}

impl PolicyConfig {
    /// Every policy name, in the enum's order (`name()` of each variant; a test checks
    /// that serde knows exactly these).
    pub const NAMES: [&'static str; 11] = [
        "mooncake-default",
        "type-aware",
        "hierarchical",
        "lru",
        "fifo",
        "s3-fifo",
        "sieve",
        "w-tinylfu",
        "gdsf",
        "belady",
        "belady-cost",
    ];

    /// A policy by name with its default settings, or an error listing the known names
    /// (`hierarchical` has no default tree: it needs a config file).
    pub fn by_name(name: &str) -> Result<Self, PolicyNameError> {
        if !Self::NAMES.contains(&name) {
            return Err(PolicyNameError::Unknown {
                name: name.to_string(),
                known: Self::NAMES.join(", "),
            });
        }
        let p: Self =
            serde_json::from_value(serde_json::json!({ "policy": name })).map_err(|e| {
                PolicyNameError::NeedsSettings {
                    name: name.to_string(),
                    reason: e.to_string(),
                }
            })?;
        p.validate().map_err(|reason| PolicyNameError::Invalid {
            name: name.to_string(),
            reason: reason.to_string(),
        })?;
        Ok(p)
    }

    /// Build the configured policy, or say which setting is invalid.
    pub fn build(&self) -> Result<Box<dyn EvictionPolicy>, ConfigError> {
        Ok(match self {
            PolicyConfig::MooncakeDefault {} => Box::new(MooncakeDefault::new()),
            PolicyConfig::TypeAware(c) => Box::new(TypeAware::new(c)?),
            PolicyConfig::Hierarchical(c) => Box::new(Hierarchical::new(c)?),
            PolicyConfig::Lru {} => Box::new(Lru::new()),
            PolicyConfig::Fifo {} => Box::new(Fifo::new()),
            PolicyConfig::S3Fifo(c) => Box::new(S3Fifo::new(c)?),
            PolicyConfig::Sieve {} => Box::new(Sieve::new()),
            PolicyConfig::WTinyLfu(c) => Box::new(WTinyLfu::new(c)?),
            PolicyConfig::Gdsf {} => Box::new(Gdsf::new()),
            PolicyConfig::Belady {} => Box::new(Belady::new()),
            PolicyConfig::BeladyCost {} => Box::new(BeladyCost::new()),
        })
    }

    /// The policy's configuration name (`mooncake-default`, `type-aware`, ...).
    pub fn name(&self) -> &'static str {
        match self {
            PolicyConfig::MooncakeDefault {} => "mooncake-default",
            PolicyConfig::TypeAware(_) => "type-aware",
            PolicyConfig::Hierarchical(_) => "hierarchical",
            PolicyConfig::Lru {} => "lru",
            PolicyConfig::Fifo {} => "fifo",
            PolicyConfig::S3Fifo(_) => "s3-fifo",
            PolicyConfig::Sieve {} => "sieve",
            PolicyConfig::WTinyLfu(_) => "w-tinylfu",
            PolicyConfig::Gdsf {} => "gdsf",
            PolicyConfig::Belady {} => "belady",
            PolicyConfig::BeladyCost {} => "belady-cost",
        }
    }

    /// Whether the policy reads `hints.next_access` (an offline oracle, not a deployable policy).
    pub fn is_offline(&self) -> bool {
        matches!(self, PolicyConfig::Belady {} | PolicyConfig::BeladyCost {})
    }

    /// Check every setting (as `build` does, without keeping the policy).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.build().map(|_| ())
    }

    /// Parse and validate a JSON policy config.
    pub fn from_json_str(s: &str) -> Result<Self, ConfigError> {
        let p: Self = serde_json::from_str(s).map_err(|e| ConfigError::Parse {
            format: "JSON",
            what: e.to_string(),
        })?;
        p.validate()?;
        Ok(p)
    }

    /// Parse and validate a TOML policy config (the file the CLI reads).
    pub fn from_toml_str(s: &str) -> Result<Self, ConfigError> {
        let p: Self = toml::from_str(s).map_err(|e| ConfigError::Parse {
            format: "TOML",
            what: e.to_string(),
        })?;
        p.validate()?;
        Ok(p)
    }
}

//! Store-level trace replay: every request becomes store operations on a `MemStore`, and
//! every listed policy replays the same compiled access sequence (read the trace once, fan
//! out to all policies in parallel, Caffeine-simulator / libCacheSim style).
//!
//! Per request, in order, at the request's arrival time:
//! 1. each image: a read of its encoder output (`get`, grants a lease); on a miss the output
//!    is recomputed and put (`put`, size = visual tokens x bytes per visual token);
//! 2. its prefix KV blocks, as Mooncake's KV connectors do: one `exists` per block (the
//!    batch lookup; each found block is leased), the leading run of found blocks is the
//!    prefix hit (blocks after the first missing one must be recomputed anyway), then every
//!    missing block is put.
//!
//! Every access carries a weight (bytes) and a miss penalty (the recompute time the
//! [`MissCost`] gives), so hit rates are reported by count, by bytes and by time saved:
//! the saving-time rate is recompute time avoided by hits / recompute time with no cache.
//! Offline policies read each access's next-access index, filled by one backward pass.

use std::collections::BTreeMap;

use moonagent_core::store::{
    AccessHints, DataType, MemStore, MemStoreConfig, Payload, PolicyConfig, ReplicateConfig,
    StoreError, StoreStats,
};
use moonagent_traces::schema::Request;
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

/// Never accessed again (offline policies' oracle value).
pub const NEVER: u32 = u32::MAX;

/// Recompute cost of a missed object, in ns.
pub trait MissCost: Sync {
    /// Encoder time for one image of `visual_tokens` tokens.
    fn image_ns(&self, visual_tokens: u32) -> u64;
    /// Prefill time for one KV block of `tokens` tokens after `prefix_tokens` cached tokens.
    fn kv_block_ns(&self, tokens: u32, prefix_tokens: u64) -> u64;
}

/// A linear recompute-cost model: `a + b * tokens (+ c * tokens * prefix)` per object.
/// The defaults approximate Qwen2.5-VL-7B on one H200 (see `moonagent-models` for the
/// roofline model these constants summarise); any `MissCost` can replace it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinearCost {
    /// Fixed cost per image (ns).
    pub image_fixed_ns: f64,
    /// Encoder cost per visual token (ns).
    pub image_ns_per_token: f64,
    /// Prefill cost per token (ns), the linear layers.
    pub kv_ns_per_token: f64,
    /// Prefill attention cost per token per cached prefix token (ns).
    pub kv_ns_per_token_prefix: f64,
}

impl Default for LinearCost {
    fn default() -> Self {
        // 7B dense at ~40% of an H200's 989 TFLOP/s: 2 * 7.6e9 FLOP/token / 4e14 FLOP/s
        // ~ 38 ns/token; the 0.67B ViT at ~30% MFU with its patch count 4x the visual
        // tokens: 2 * 0.67e9 * 4 / 3e14 ~ 18 ns per visual token plus launch overhead.
        Self {
            image_fixed_ns: 2.0e6,
            image_ns_per_token: 18.0,
            kv_ns_per_token: 38.0,
            kv_ns_per_token_prefix: 0.0016,
        }
    }
}

impl MissCost for LinearCost {
    fn image_ns(&self, visual_tokens: u32) -> u64 {
        (self.image_fixed_ns + self.image_ns_per_token * f64::from(visual_tokens)).ceil() as u64
    }
    fn kv_block_ns(&self, tokens: u32, prefix_tokens: u64) -> u64 {
        let t = f64::from(tokens);
        (self.kv_ns_per_token * t + self.kv_ns_per_token_prefix * t * prefix_tokens as f64).ceil()
            as u64
    }
}

/// Sizes of the objects the replay stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ObjectSizes {
    /// KV bytes per token (Qwen2.5-VL-7B bf16: 57,344).
    pub kv_bytes_per_token: u64,
    /// Encoder-output bytes per visual token (Qwen2.5-VL-7B: 3584 x 2 = 7,168).
    pub encoder_bytes_per_visual_token: u64,
}

impl Default for ObjectSizes {
    fn default() -> Self {
        Self {
            kv_bytes_per_token: 57_344,
            encoder_bytes_per_visual_token: 7_168,
        }
    }
}

/// One store access of the compiled trace (32 bytes, so 10M accesses fit in 320 MB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// Time of the access (the request's arrival).
    pub time: u64,
    /// Object id within its data type (image content id or prefix-block id).
    pub id: u64,
    /// Object bytes.
    pub size: u32,
    /// Recompute time on a miss, ns (saturated at u32::MAX ~ 4.3 s).
    pub penalty_ns: u32,
    /// Index of the next access to the same object, or [`NEVER`].
    pub next: u32,
    /// `DataType::index()` of the object.
    pub dtype: u8,
    /// Tenant (hierarchical policies scope by it), truncated to 8 bits.
    pub tenant: u8,
    /// 1 on the first KV block of a request's prefix lookup.
    pub flags: u8,
    _pad: u8,
}

const FIRST_KV: u8 = 1;

/// A trace compiled to accesses, shared read-only by every policy's replay.
#[derive(Debug, Default, Clone)]
pub struct Compiled {
    /// All accesses in replay order.
    pub accesses: Vec<Access>,
    /// Requests compiled.
    pub requests: u64,
}

impl Compiled {
    /// Compile requests (images, then prefix blocks of `block_size` tokens) into accesses.
    pub fn from_requests<I>(
        reqs: I,
        block_size: u32,
        sizes: &ObjectSizes,
        cost: &dyn MissCost,
        include: Include,
    ) -> Result<Self, String>
    where
        I: IntoIterator<Item = Request>,
    {
        let mut c = Compiled::default();
        for r in reqs {
            c.requests += 1;
            if include.images {
                for img in &r.images {
                    let bytes = u64::from(img.visual_tokens) * sizes.encoder_bytes_per_visual_token;
                    c.push(
                        r.arrival_ns,
                        img.content_id,
                        bytes,
                        cost.image_ns(img.visual_tokens),
                        DataType::EncoderOutput,
                        r.tenant,
                        0,
                    )?;
                }
            }
            if include.kv {
                for (i, &b) in r.prompt_blocks.iter().enumerate() {
                    let i = i as u64;
                    let tokens =
                        moonagent_traces::schema::tokens_in_block(r.prompt_tokens, block_size, i)
                            as u32;
                    // A block id names a full block (Mooncake hashes full blocks); the last,
                    // partial block of a prompt is charged its own tokens.
                    let bytes = u64::from(tokens.max(1)) * sizes.kv_bytes_per_token;
                    let pen = cost.kv_block_ns(tokens, i * u64::from(block_size));
                    c.push(
                        r.arrival_ns,
                        b,
                        bytes,
                        pen,
                        DataType::KvCache,
                        r.tenant,
                        if i == 0 { FIRST_KV } else { 0 },
                    )?;
                }
            }
        }
        Ok(c)
    }

    /// Append one access.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        time: u64,
        id: u64,
        bytes: u64,
        penalty_ns: u64,
        dtype: DataType,
        tenant: u32,
        flags: u8,
    ) -> Result<(), String> {
        if self.accesses.len() >= NEVER as usize - 1 {
            return Err(format!(
                "trace too long for one replay: more than {} accesses",
                NEVER - 1
            ));
        }
        let size = u32::try_from(bytes).map_err(|_| {
            format!("object of {bytes} bytes is over the replay's 4 GiB object limit")
        })?;
        self.accesses.push(Access {
            time,
            id,
            size,
            penalty_ns: u32::try_from(penalty_ns).unwrap_or(u32::MAX),
            next: NEVER,
            dtype: dtype.index() as u8,
            tenant: tenant.min(255) as u8,
            flags,
            _pad: 0,
        });
        Ok(())
    }

    /// Fill every access's `next` (one backward pass).
    pub fn fill_next(&mut self) {
        let mut seen: FxHashMap<(u8, u64), u32> = FxHashMap::default();
        for i in (0..self.accesses.len()).rev() {
            let a = &mut self.accesses[i];
            a.next = seen.insert((a.dtype, a.id), i as u32).unwrap_or(NEVER);
        }
    }

    /// Total bytes of distinct objects, per data type (the working set).
    pub fn unique_bytes(&self) -> [u64; DataType::COUNT] {
        let mut seen: rustc_hash::FxHashSet<(u8, u64)> = Default::default();
        let mut out = [0u64; DataType::COUNT];
        for a in &self.accesses {
            if seen.insert((a.dtype, a.id)) {
                out[a.dtype as usize] += u64::from(a.size);
            }
        }
        out
    }
}

/// Which object types a replay includes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Include {
    /// Encoder outputs of images.
    pub images: bool,
    /// Prefix KV blocks.
    pub kv: bool,
}

impl Default for Include {
    fn default() -> Self {
        Self {
            images: true,
            kv: true,
        }
    }
}

/// Hit and cost counters of one data type under one policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeResult {
    /// Lookups (image reads, KV blocks looked up).
    pub lookups: u64,
    /// Lookups served from the store (KV: the leading prefix run only).
    pub hits: u64,
    /// Bytes looked up.
    pub lookup_bytes: u64,
    /// Bytes served from the store.
    pub hit_bytes: u64,
    /// Recompute time of all lookups, ns (the no-cache cost).
    pub penalty_ns: u64,
    /// Recompute time avoided by hits, ns.
    pub saved_ns: u64,
    /// Puts that succeeded.
    pub puts: u64,
    /// Puts refused for space (-200): the object stays uncached.
    pub puts_no_space: u64,
    /// Objects evicted.
    pub evicted: u64,
    /// Bytes evicted.
    pub evicted_bytes: u64,
}

impl TypeResult {
    /// hits / lookups (0 when nothing was looked up).
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.lookups)
    }
    /// hit bytes / lookup bytes.
    pub fn byte_hit_rate(&self) -> f64 {
        ratio(self.hit_bytes, self.lookup_bytes)
    }
    /// saved recompute time / no-cache recompute time.
    pub fn saving_time_rate(&self) -> f64 {
        ratio(self.saved_ns, self.penalty_ns)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// One policy's replay result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// Label (policy name, or the name given with its config).
    pub label: String,
    /// The policy configuration.
    pub policy: PolicyConfig,
    /// Per data type (by snake_case name), only types that were looked up.
    pub by_type: BTreeMap<String, TypeResult>,
    /// All types together.
    pub total: TypeResult,
    /// The store's own counters.
    pub store: StoreStats,
}

/// A policy to replay, with a label for reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelledPolicy {
    /// Report label.
    pub label: String,
    /// Policy configuration.
    pub policy: PolicyConfig,
}

/// Replay `compiled` under one policy on a store built from `store_cfg`.
pub fn replay_one(
    compiled: &Compiled,
    store_cfg: &MemStoreConfig,
    lp: &LabelledPolicy,
) -> Result<PolicyResult, String> {
    let mut store: MemStore<(u8, u64)> = MemStore::with_policy(store_cfg.clone(), &lp.policy)?;
    let mut by = [TypeResult::default(); DataType::COUNT];
    let acc = &compiled.accesses;
    let mut missing = Vec::new();
    let mut i = 0;
    while i < acc.len() {
        let a = acc[i];
        if a.dtype == DataType::KvCache as u8 {
            // One request's prefix lookup: the run of KV accesses starting here.
            let mut j = i + 1;
            while j < acc.len()
                && acc[j].dtype == a.dtype
                && acc[j].flags & FIRST_KV == 0
                && acc[j].time == a.time
            {
                j += 1;
            }
            kv_lookup(
                &mut store,
                &acc[i..j],
                &mut by[a.dtype as usize],
                &mut missing,
            )?;
            i = j;
        } else {
            get_or_put(&mut store, &a, &mut by[a.dtype as usize])?;
            i += 1;
        }
    }
    let stats = store.stats().clone();
    let mut by_type = BTreeMap::new();
    let mut total = TypeResult::default();
    for t in DataType::ALL {
        let r = &mut by[t.index()];
        let s = &stats.by_type[t.index()];
        r.evicted = s.evicted;
        r.evicted_bytes = s.evicted_bytes;
        r.puts_no_space = s.put_no_space;
        if r.lookups > 0 {
            by_type.insert(t.name().to_string(), *r);
        }
        total.lookups += r.lookups;
        total.hits += r.hits;
        total.lookup_bytes += r.lookup_bytes;
        total.hit_bytes += r.hit_bytes;
        total.penalty_ns += r.penalty_ns;
        total.saved_ns += r.saved_ns;
        total.puts += r.puts;
        total.puts_no_space += r.puts_no_space;
        total.evicted += r.evicted;
        total.evicted_bytes += r.evicted_bytes;
    }
    Ok(PolicyResult {
        label: lp.label.clone(),
        policy: lp.policy.clone(),
        by_type,
        total,
        store: stats,
    })
}

fn hints(a: &Access) -> AccessHints {
    AccessHints {
        miss_penalty_ns: u64::from(a.penalty_ns),
        next_access: if a.next == NEVER {
            u64::MAX
        } else {
            u64::from(a.next)
        },
        tenant: u32::from(a.tenant),
        priority: 0,
    }
}

fn dtype_of(a: &Access) -> DataType {
    DataType::ALL[a.dtype as usize]
}

fn count_lookup(r: &mut TypeResult, a: &Access, hit: bool) {
    r.lookups += 1;
    r.lookup_bytes += u64::from(a.size);
    r.penalty_ns += u64::from(a.penalty_ns);
    if hit {
        r.hits += 1;
        r.hit_bytes += u64::from(a.size);
        r.saved_ns += u64::from(a.penalty_ns);
    }
}

fn put(store: &mut MemStore<(u8, u64)>, a: &Access, r: &mut TypeResult) -> Result<(), String> {
    match store.put_with(
        a.time,
        (a.dtype, a.id),
        Payload::SizeOnly(u64::from(a.size)),
        &ReplicateConfig::of(dtype_of(a)),
        hints(a),
    ) {
        Ok(_) => {
            r.puts += 1;
            Ok(())
        }
        // No space: the object simply stays uncached, as on the real master. A concurrent
        // put of the same object (an earlier request of the same batch) is not an error.
        Err(StoreError::NoAvailableHandle | StoreError::AlreadyExists) => Ok(()),
        Err(e) => Err(format!("put at t={} of object {}: {e}", a.time, a.id)),
    }
}

fn get_or_put(
    store: &mut MemStore<(u8, u64)>,
    a: &Access,
    r: &mut TypeResult,
) -> Result<(), String> {
    let hit = match store.get_size_with(a.time, &(a.dtype, a.id), Some(hints(a))) {
        Ok(_) => true,
        Err(StoreError::NotFound | StoreError::NotReady) => false,
        Err(e) => return Err(format!("get at t={} of object {}: {e}", a.time, a.id)),
    };
    count_lookup(r, a, hit);
    if !hit {
        put(store, a, r)?;
    }
    Ok(())
}

fn kv_lookup(
    store: &mut MemStore<(u8, u64)>,
    run: &[Access],
    r: &mut TypeResult,
    missing: &mut Vec<usize>,
) -> Result<(), String> {
    missing.clear();
    let mut prefix = true;
    for (k, a) in run.iter().enumerate() {
        let found = store
            .exists_hinted(a.time, &(a.dtype, a.id), Some(hints(a)))
            .map_err(|e| format!("exists at t={}: {e}", a.time))?;
        prefix &= found;
        count_lookup(r, a, prefix);
        if !found {
            missing.push(k);
        }
    }
    for &k in missing.iter() {
        put(store, &run[k], r)?;
    }
    Ok(())
}

/// Replay every policy over the same compiled trace, in parallel (rayon), results in the
/// order given.
pub fn replay_all(
    compiled: &Compiled,
    store_cfg: &MemStoreConfig,
    policies: &[LabelledPolicy],
) -> Result<Vec<PolicyResult>, String> {
    policies
        .par_iter()
        .map(|lp| replay_one(compiled, store_cfg, lp))
        .collect()
}

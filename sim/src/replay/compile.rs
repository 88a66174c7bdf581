//! The compiled trace: requests become 32-byte [`Access`]es once (images, then prefix
//! blocks), with next accesses, re-reference marks and dense object numbers from one
//! backward pass ([`Compiled::fill_next`]); every policy's replay reads it shared.

use moonagent_core::store::DataType;
use moonagent_traces::schema::Request;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{MissCost, ModelCost, ObjectSizes, ReplayError, Slab};

/// Never accessed again (offline policies' oracle value).
pub const NEVER: u32 = u32::MAX;

/// One store access of the compiled trace (32 bytes, so 10M accesses fit in 320 MB).
///
/// `repr(C)` with no padding: the compiled-trace cache ([`super::trace_cache`]) stores
/// accesses as these 32 bytes (little-endian) and maps them back without a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
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
    /// [`FIRST_KV`] on the first KV block of a request's prefix lookup; [`REUSE`] on a
    /// re-reference (set by [`Compiled::fill_next`]).
    pub flags: u8,
    pub(crate) _pad: u8,
}

/// `Access::flags`: the first KV block of a request's prefix lookup.
pub const FIRST_KV: u8 = 1;
/// `Access::flags`: the object was accessed before in the trace (a re-reference).
pub const REUSE: u8 = 2;

impl Access {
    /// An access with no next access filled (`Compiled::push` without its checks).
    #[inline]
    pub(crate) fn new(
        time: u64,
        id: u64,
        size: u32,
        penalty_ns: u32,
        dtype: u8,
        tenant: u8,
        flags: u8,
    ) -> Self {
        Self {
            time,
            id,
            size,
            penalty_ns,
            next: NEVER,
            dtype,
            tenant,
            flags: flags & FIRST_KV,
            _pad: 0,
        }
    }

    /// Whether this access re-references an object seen earlier in the trace.
    #[inline]
    pub fn is_reuse(&self) -> bool {
        self.flags & REUSE != 0
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

/// How requests become accesses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompileOptions {
    /// Tokens per prefix block (the trace header's `block_size_tokens`).
    pub block_size: u32,
    /// Object sizes.
    pub sizes: ObjectSizes,
    /// Object types replayed.
    pub include: Include,
    /// Charge every KV block a full block of bytes, the last partial one included (Mooncake
    /// allocates whole blocks); otherwise a partial block is charged its own tokens.
    pub kv_full_blocks: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        Self {
            block_size: 64,
            sizes: ObjectSizes::default(),
            include: Include::default(),
            kv_full_blocks: false,
        }
    }
}

/// A trace compiled to accesses, shared read-only by every policy's replay. Its arrays are
/// [`Slab`]s: owned, or mapped from the compiled-trace cache.
#[derive(Debug, Default, Clone)]
pub struct Compiled {
    /// All accesses in replay order.
    pub accesses: Slab<Access>,
    /// Requests compiled.
    pub requests: u64,
    /// Per access, a dense object number (unique per `(dtype, id)`), the store's key:
    /// a 4-byte key keeps the store's index small. Filled by [`Compiled::fill_next`].
    pub objects: Slab<u32>,
    /// Distinct objects (the object numbers are `0..distinct`).
    pub distinct: u32,
}

impl Compiled {
    /// Compile requests (images, then prefix blocks of `block_size` tokens) into accesses,
    /// next accesses and re-references filled.
    pub fn from_requests<I>(
        reqs: I,
        block_size: u32,
        sizes: &ObjectSizes,
        cost: &dyn MissCost,
        include: Include,
    ) -> Result<Self, ReplayError>
    where
        I: IntoIterator<Item = Request>,
    {
        let opts = CompileOptions {
            block_size,
            sizes: *sizes,
            include,
            kv_full_blocks: false,
        };
        Self::compile(reqs.into_iter().map(Ok::<_, ReplayError>), &opts, cost)
    }

    /// Mooncake's FAST'25 JSONL trace at `path` (`moonagent repro mooncake-capacity`'s
    /// input): KV blocks only, every block 512 tokens x Qwen2.5-VL-7B's KV bytes per token,
    /// H200 miss costs.
    pub fn mooncake_kv(path: &std::path::Path) -> Result<Self, ReplayError> {
        let import = moonagent_traces::import::mooncake::MooncakeImport::open(path, None).map_err(
            |source| ReplayError::Open {
                path: path.to_path_buf(),
                source,
            },
        )?;
        let opts = CompileOptions {
            block_size: import.header().block_size_tokens,
            sizes: ObjectSizes::default(),
            include: Include {
                images: false,
                kv: true,
            },
            kv_full_blocks: true,
        };
        Self::compile(import, &opts, &ModelCost::qwen25_vl_7b_h200()).map_err(|e| {
            ReplayError::File {
                path: path.to_path_buf(),
                source: Box::new(e),
            }
        })
    }

    /// Compile a stream of requests (a trace reader's `Result`s: the first error stops it,
    /// with the request's position) under `opts`; next accesses and re-references filled.
    pub fn compile<I, E>(
        reqs: I,
        opts: &CompileOptions,
        cost: &dyn MissCost,
    ) -> Result<Self, ReplayError>
    where
        I: IntoIterator<Item = Result<Request, E>>,
        E: Into<ReplayError>,
    {
        if opts.block_size == 0 {
            return Err(ReplayError::BlockSize);
        }
        let mut c = Compiled::default();
        for r in reqs {
            let r = r.map_err(Into::into)?;
            c.add_request(&r, opts, cost)?;
        }
        c.fill_next();
        Ok(c)
    }

    /// Append one request's accesses (call [`Compiled::fill_next`] once all are in).
    pub fn add_request(
        &mut self,
        r: &Request,
        opts: &CompileOptions,
        cost: &dyn MissCost,
    ) -> Result<(), ReplayError> {
        self.requests += 1;
        let in_request = |e| ReplayError::Request {
            id: r.id,
            source: Box::new(e),
        };
        let sizes = &opts.sizes;
        if opts.include.images {
            for img in &r.images {
                let bytes = u64::from(img.visual_tokens) * sizes.encoder_bytes_per_visual_token;
                self.push(
                    r.arrival_ns,
                    img.content_id,
                    bytes,
                    cost.image_ns(img.visual_tokens),
                    DataType::EncoderOutput,
                    r.tenant,
                    0,
                )
                .map_err(in_request)?;
            }
        }
        if opts.include.kv {
            let bs = opts.block_size;
            for (i, &b) in r.prompt_blocks.iter().enumerate() {
                let i = i as u64;
                let tokens =
                    moonagent_traces::schema::tokens_in_block(r.prompt_tokens, bs, i) as u32;
                let charged = if opts.kv_full_blocks {
                    bs
                } else {
                    tokens.max(1)
                };
                let bytes = u64::from(charged) * sizes.kv_bytes_per_token;
                let pen = cost.kv_block_ns(tokens, i * u64::from(bs));
                self.push(
                    r.arrival_ns,
                    b,
                    bytes,
                    pen,
                    DataType::KvCache,
                    r.tenant,
                    if i == 0 { FIRST_KV } else { 0 },
                )
                .map_err(in_request)?;
            }
        }
        Ok(())
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
    ) -> Result<(), ReplayError> {
        if self.accesses.len() >= NEVER as usize - 1 {
            return Err(ReplayError::TooLong { max: NEVER - 1 });
        }
        let size = u32::try_from(bytes).map_err(|_| ReplayError::ObjectTooLarge { bytes })?;
        if let Some(last) = self.accesses.last() {
            if time < last.time {
                return Err(ReplayError::OutOfOrder {
                    time,
                    last: last.time,
                });
            }
        }
        self.accesses.push(Access {
            time,
            id,
            size,
            penalty_ns: u32::try_from(penalty_ns).unwrap_or(u32::MAX),
            next: NEVER,
            dtype: dtype.index() as u8,
            tenant: tenant.min(255) as u8,
            flags: flags & FIRST_KV,
            _pad: 0,
        });
        Ok(())
    }

    /// Fill every access's `next`, mark re-references and number the objects (one
    /// backward pass; idempotent). Must run before a replay (the compile functions run it).
    pub fn fill_next(&mut self) {
        // One data type (oracleGeneral, KV-only traces): key by the id alone, which halves
        // the map's entries and hashing; the same objects, numbers and links either way.
        let first = self.accesses.first().map_or(0, |a| a.dtype);
        if self.accesses.iter().all(|a| a.dtype == first) {
            self.fill_next_by(|a| a.id);
        } else {
            self.fill_next_by(|a| (a.dtype, a.id));
        }
    }

    fn fill_next_by<K: std::hash::Hash + Eq>(&mut self, key: impl Fn(&Access) -> K) {
        // object key -> (next access index, object number)
        let mut seen: FxHashMap<K, (u32, u32)> = FxHashMap::default();
        let accesses = self.accesses.to_mut();
        let n = accesses.len();
        let mut objects = vec![0u32; n];
        for i in (0..n).rev() {
            let a = &mut accesses[i];
            // Every access is marked a re-reference here, and each object's first access
            // is unmarked below: one write per object instead of one random write into
            // the accesses per re-reference (two thirds of this pass's time on 10M).
            a.flags |= REUSE;
            let fresh = seen.len() as u32;
            let e = seen.entry(key(a)).or_insert((NEVER, fresh));
            let next = std::mem::replace(&mut e.0, i as u32);
            a.next = next;
            objects[i] = e.1;
        }
        // After the backward pass each entry holds its object's first access.
        for &(first, _) in seen.values() {
            accesses[first as usize].flags &= !REUSE;
        }
        self.objects = objects.into();
        self.distinct = seen.len() as u32;
    }

    pub(crate) fn check_filled(&self) -> Result<(), ReplayError> {
        if self.objects.len() != self.accesses.len() {
            return Err(ReplayError::NotFilled);
        }
        Ok(())
    }

    /// Total bytes of distinct objects, per data type (the working set).
    pub fn unique_bytes(&self) -> [u64; DataType::COUNT] {
        let mut out = [0u64; DataType::COUNT];
        for a in &self.accesses {
            if !a.is_reuse() {
                out[a.dtype as usize] += u64::from(a.size);
            }
        }
        out
    }

    /// Distinct objects, per data type.
    pub fn unique_objects(&self) -> [u64; DataType::COUNT] {
        let mut out = [0u64; DataType::COUNT];
        for a in &self.accesses {
            if !a.is_reuse() {
                out[a.dtype as usize] += 1;
            }
        }
        out
    }

    /// Sum of all unique bytes.
    pub fn unique_total(&self) -> u64 {
        self.unique_bytes().iter().sum()
    }
}

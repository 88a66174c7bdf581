//! The visual-embedding cache over a [`Store`]: two-key commit, validated fail-open lookup.
//!
//! For an image fingerprint `fp`, `mc:mmblob:{fp}` holds the embedding bytes (row-major
//! `(visual_tokens, hidden)`) and `mc:mmmeta:{fp}` holds the [`Envelope`]. A commit
//! retracts any old pair (meta first), writes the blob, then the meta: the meta is the
//! commit marker, so a blob without meta is simply a miss. A lookup reads the meta,
//! validates it against what the reader expects ([`Expected`]), reads the blob straight
//! into the caller's receive buffer and verifies the checksum the envelope names. Any
//! disagreement is a miss with its own [`MissReason`] and counter, never a wrong
//! embedding; malformed meta and bad blobs also delete the pair. The path is fail-open
//! and asserts nothing, but a broken store client ([`StoreError::is_client_failure`]:
//! buffer registration failing, store unavailable) surfaces as [`CacheError::Store`],
//! never as a silent miss.
//!
//! The cache is also the transport: a freshly encoded embedding is committed and read back
//! through the same validated path ([`MmCache::readback`]); readbacks are counted apart
//! from hits. Multi-image planning with in-batch de-duplication lives in [`plan`], the
//! seed's `multi_image_agent` example in [`demo`].
//!
//! Size-only mode (the simulator holds objects without bytes): [`MmCache::commit_size_only`]
//! stores a size-only blob and an envelope without checksum; [`MmCache::lookup_size_only`]
//! validates the envelope exactly as a bytes lookup does, then checks the blob's size
//! with `get_size` (no bytes, so no checksum). A bytes lookup of a size-only pair is a
//! miss ([`MissReason::SizeOnly`]), never a hit on unchecked bytes.
//!
//! Tenant isolation and integrity (both off by default; default keys, envelopes and
//! counters are byte-identical to a build without them): [`ModelCtx::with_keyed_fingerprints`]
//! makes image fingerprints keyed with a [`TenantSecret`], so no other tenant can compute
//! (find or probe) this tenant's keys; [`ModelCtx::with_mac`] adds a keyed BLAKE2b MAC over
//! the envelope and the blob ([`envelope::mac_of`]), so a writer without the secret cannot
//! plant a pair any lookup accepts. Both are named in the envelope ([`Auth`]); a reader
//! accepts a pair only when the envelope's authentication is exactly its own and the MAC
//! verifies, and counts every other outcome as [`MissReason::Unauthenticated`]. Keyed
//! contexts bypass the envelope memo (a template is a family of envelopes that differ only
//! in the fingerprint; MACs differ per pair), so the unkeyed hot path is unchanged.

pub mod demo;

/// The failure an encoder callback of [`MmCache::run_batch`] reports: the driver's own
/// message (its encoder is outside the core, so the core keeps what it said).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EncoderError(pub String);

impl From<&str> for EncoderError {
    fn from(s: &str) -> Self {
        EncoderError(s.to_string())
    }
}
pub mod envelope;
#[cfg(test)]
mod memo_tests;
pub mod plan;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::fingerprint::{
    image_fingerprint, image_fingerprint_keyed, Dtype, FingerprintError, FpScheme, GridThw,
    ImageFp, ModelFp, ModelParts, TenantSecret,
};
use crate::store::{DataType, Nanos, Payload, ReplicateConfig, Store, StoreError, StoreKey};
use envelope::{mac_of, mac_verifies, FpHex, MacBlob, Template};

pub use envelope::{
    Auth, Checksum, ChecksumAlgo, Envelope, EnvelopeError, EnvelopeMac, MacAlgo, MAX_META_BYTES,
    SCHEMA_VERSION,
};
pub use plan::{EncodeJob, ImageInput, Plan, PlanMode, Segment, SegmentSource};

/// Key prefix of embedding blobs.
pub const BLOB_PREFIX: &str = "mc:mmblob:";
/// Key prefix of meta envelopes.
pub const META_PREFIX: &str = "mc:mmmeta:";

/// The blob key of `fp`.
pub fn blob_key(fp: &ImageFp) -> String {
    let mut k = String::new();
    write_key(&mut k, BLOB_PREFIX, &FpHex::of(fp));
    k
}

/// The meta key of `fp`.
pub fn meta_key(fp: &ImageFp) -> String {
    let mut k = String::new();
    write_key(&mut k, META_PREFIX, &FpHex::of(fp));
    k
}

/// Overwrite `buf` with `prefix` and the fingerprint's hex: the text of
/// `format!("{prefix}{fp}")`, without the formatter (the hot path builds its keys into
/// reused buffers).
fn write_key(buf: &mut String, prefix: &str, hex: &FpHex) {
    buf.clear();
    buf.push_str(prefix);
    hex.push_to(buf);
}

/// Envelope templates kept before the memo starts over (each about 1 KiB).
const MEMO_CAP: usize = 4096;

/// Initial meta receive buffer; envelopes are well under 1 KiB.
const META_BUF: usize = 4096;

/// A cache operation that could not be carried out (as opposed to a miss).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CacheError {
    /// The store client is broken (buffer registration failed, store unavailable).
    #[error("store client failure: {0}")]
    Store(StoreError),
    /// The caller's input is invalid (grid, sizes, model parts).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Model parts failed validation.
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    /// The driver's encoder failed.
    #[error("encoder failed: {0}")]
    Encoder(EncoderError),
    /// An envelope could not be encoded.
    #[error(transparent)]
    Envelope(#[from] EnvelopeError),
}

/// Why a lookup missed. Each reason has its own counter in [`MissCounts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissReason {
    /// No meta: never committed, evicted, or a partial commit.
    NotFound,
    /// Meta or blob is still being written.
    NotReady,
    /// Meta present, blob absent (evicted or lost).
    BlobMissing,
    /// The envelope is of another schema version.
    SchemaMismatch,
    /// The envelope names another image fingerprint than its key.
    KeyMismatch,
    /// The envelope's tenant differs from the reader's.
    TenantMismatch,
    /// The envelope's model fingerprint differs.
    ModelFpMismatch,
    /// The envelope's model parts differ.
    ModelPartsMismatch,
    /// The embedding dtype differs.
    DtypeMismatch,
    /// `grid_thw` differs.
    GridMismatch,
    /// Shape `[visual_tokens, hidden]` differs.
    ShapeMismatch,
    /// Byte length differs from the reader's expectation.
    ByteLenMismatch,
    /// The receive buffer is smaller than the embedding.
    RecvBufferTooSmall,
    /// The meta is undecodable (malformed, truncated, bad frame checksum, oversized).
    /// The pair is deleted.
    CorruptMeta,
    /// The blob fails its checksum, is short or long. The pair is deleted.
    CorruptBlob,
    /// A read lease expired while the transfer was in flight.
    LeaseExpired,
    /// A bytes lookup found a pair committed size-only (no bytes to verify).
    SizeOnly,
    /// Any other store error on a read (counted, treated as a miss).
    StoreError,
    /// The envelope's authentication is not exactly the reader's (keyed fingerprints, MAC
    /// on or off), or its MAC does not verify under the reader's secret: a pair another
    /// tenant or a writer without the secret planted. Not deleted (the owner's next
    /// commit replaces it).
    Unauthenticated,
}

impl MissReason {
    /// Every reason, in counter order.
    pub const ALL: [MissReason; 19] = [
        MissReason::NotFound,
        MissReason::NotReady,
        MissReason::BlobMissing,
        MissReason::SchemaMismatch,
        MissReason::KeyMismatch,
        MissReason::TenantMismatch,
        MissReason::ModelFpMismatch,
        MissReason::ModelPartsMismatch,
        MissReason::DtypeMismatch,
        MissReason::GridMismatch,
        MissReason::ShapeMismatch,
        MissReason::ByteLenMismatch,
        MissReason::RecvBufferTooSmall,
        MissReason::CorruptMeta,
        MissReason::CorruptBlob,
        MissReason::LeaseExpired,
        MissReason::SizeOnly,
        MissReason::StoreError,
        MissReason::Unauthenticated,
    ];

    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            MissReason::NotFound => "not_found",
            MissReason::NotReady => "not_ready",
            MissReason::BlobMissing => "blob_missing",
            MissReason::SchemaMismatch => "schema_mismatch",
            MissReason::KeyMismatch => "key_mismatch",
            MissReason::TenantMismatch => "tenant_mismatch",
            MissReason::ModelFpMismatch => "model_fp_mismatch",
            MissReason::ModelPartsMismatch => "model_parts_mismatch",
            MissReason::DtypeMismatch => "dtype_mismatch",
            MissReason::GridMismatch => "grid_mismatch",
            MissReason::ShapeMismatch => "shape_mismatch",
            MissReason::ByteLenMismatch => "byte_len_mismatch",
            MissReason::RecvBufferTooSmall => "recv_buffer_too_small",
            MissReason::CorruptMeta => "corrupt_meta",
            MissReason::CorruptBlob => "corrupt_blob",
            MissReason::LeaseExpired => "lease_expired",
            MissReason::SizeOnly => "size_only",
            MissReason::StoreError => "store_error",
            MissReason::Unauthenticated => "unauthenticated",
        }
    }

    /// Whether this miss deletes the pair.
    pub fn deletes_pair(self) -> bool {
        matches!(self, MissReason::CorruptMeta | MissReason::CorruptBlob)
    }
}

/// Misses by reason (probes and readbacks together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MissCounts {
    /// [`MissReason::NotFound`].
    pub not_found: u64,
    /// [`MissReason::NotReady`].
    pub not_ready: u64,
    /// [`MissReason::BlobMissing`].
    pub blob_missing: u64,
    /// [`MissReason::SchemaMismatch`].
    pub schema_mismatch: u64,
    /// [`MissReason::KeyMismatch`].
    pub key_mismatch: u64,
    /// [`MissReason::TenantMismatch`].
    pub tenant_mismatch: u64,
    /// [`MissReason::ModelFpMismatch`].
    pub model_fp_mismatch: u64,
    /// [`MissReason::ModelPartsMismatch`].
    pub model_parts_mismatch: u64,
    /// [`MissReason::DtypeMismatch`].
    pub dtype_mismatch: u64,
    /// [`MissReason::GridMismatch`].
    pub grid_mismatch: u64,
    /// [`MissReason::ShapeMismatch`].
    pub shape_mismatch: u64,
    /// [`MissReason::ByteLenMismatch`].
    pub byte_len_mismatch: u64,
    /// [`MissReason::RecvBufferTooSmall`].
    pub recv_buffer_too_small: u64,
    /// [`MissReason::CorruptMeta`].
    pub corrupt_meta: u64,
    /// [`MissReason::CorruptBlob`].
    pub corrupt_blob: u64,
    /// [`MissReason::LeaseExpired`].
    pub lease_expired: u64,
    /// [`MissReason::SizeOnly`].
    pub size_only: u64,
    /// [`MissReason::StoreError`].
    pub store_error: u64,
    /// [`MissReason::Unauthenticated`] (serialized only when non-zero, so unkeyed runs
    /// write the counters they always wrote).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unauthenticated: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl MissCounts {
    fn slot(&mut self, r: MissReason) -> &mut u64 {
        match r {
            MissReason::NotFound => &mut self.not_found,
            MissReason::NotReady => &mut self.not_ready,
            MissReason::BlobMissing => &mut self.blob_missing,
            MissReason::SchemaMismatch => &mut self.schema_mismatch,
            MissReason::KeyMismatch => &mut self.key_mismatch,
            MissReason::TenantMismatch => &mut self.tenant_mismatch,
            MissReason::ModelFpMismatch => &mut self.model_fp_mismatch,
            MissReason::ModelPartsMismatch => &mut self.model_parts_mismatch,
            MissReason::DtypeMismatch => &mut self.dtype_mismatch,
            MissReason::GridMismatch => &mut self.grid_mismatch,
            MissReason::ShapeMismatch => &mut self.shape_mismatch,
            MissReason::ByteLenMismatch => &mut self.byte_len_mismatch,
            MissReason::RecvBufferTooSmall => &mut self.recv_buffer_too_small,
            MissReason::CorruptMeta => &mut self.corrupt_meta,
            MissReason::CorruptBlob => &mut self.corrupt_blob,
            MissReason::LeaseExpired => &mut self.lease_expired,
            MissReason::SizeOnly => &mut self.size_only,
            MissReason::StoreError => &mut self.store_error,
            MissReason::Unauthenticated => &mut self.unauthenticated,
        }
    }

    /// The count for `reason`.
    pub fn get(&self, reason: MissReason) -> u64 {
        // `slot` is the one reason-to-field map; it needs `&mut`, so read through a copy.
        let mut c = *self;
        *c.slot(reason)
    }

    /// Add one miss of `reason`.
    pub fn add(&mut self, reason: MissReason) {
        *self.slot(reason) += 1;
    }

    /// All misses.
    pub fn total(&self) -> u64 {
        MissReason::ALL.iter().map(|&r| self.get(r)).sum()
    }
}

/// The cache's counters. Deterministic: a function of the operation sequence only.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheCounters {
    /// Cache probes ([`MmCache::lookup`], [`MmCache::lookup_size_only`]) that returned.
    pub lookups: u64,
    /// Probes that hit (`mm_hit_rate = hits / lookups`).
    pub hits: u64,
    /// Post-commit readbacks through the validated path that returned ("cache is transport").
    pub readbacks: u64,
    /// Readbacks that validated (`mm_store_readback`; never counted as hits).
    pub readback_hits: u64,
    /// Readbacks that missed (their reasons are in `misses` too).
    pub readback_misses: u64,
    /// Segments whose readback missed and that used the encoder's bytes directly.
    pub readback_fallbacks: u64,
    /// Misses by reason, probes and readbacks together. A miss that deletes a pair is
    /// counted even when the deletion then fails with a client error (the call errs).
    pub misses: MissCounts,
    /// Pairs committed (meta written).
    pub commits: u64,
    /// Commits the store refused without a client failure (no space, a concurrent put).
    pub commit_failures: u64,
    /// Corrupt pairs deleted.
    pub pairs_deleted: u64,
    /// Calls that returned a broken-client error.
    pub client_errors: u64,
    /// Encoder invocations (one per plan with at least one miss; the batch of its misses).
    pub encoder_calls: u64,
    /// Images encoded.
    pub images_encoded: u64,
    /// Image references served by an identical image earlier in the same request or batch.
    pub dedup: u64,
    /// Image references planned.
    pub images_planned: u64,
}

impl CacheCounters {
    /// `hits / lookups` (0 when there were none).
    pub fn hit_rate(&self) -> f64 {
        if self.lookups == 0 {
            0.0
        } else {
            self.hits as f64 / self.lookups as f64
        }
    }
}

/// A lookup's outcome. Errors (broken client) are the `Err` side of the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// A validated embedding of `len` bytes is at the start of the receive buffer.
    Hit {
        /// Embedding length in bytes.
        len: u64,
    },
    /// Nothing usable; recompute.
    Miss(MissReason),
}

/// A commit's outcome (a client failure is the `Err` side of the call).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Blob and meta written.
    Committed,
    /// The store refused a put (no space, a concurrent put); nothing is committed.
    Failed(StoreError),
}

/// The reader's model context: normalized parts, their fingerprint, embedding geometry
/// and the checksum algorithm used for commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelCtx {
    parts: ModelParts,
    fp: ModelFp,
    embed_dtype: Dtype,
    hidden: u64,
    checksum: ChecksumAlgo,
    /// Keys image fingerprints ([`ModelCtx::with_keyed_fingerprints`]).
    fp_secret: Option<TenantSecret>,
    /// MACs envelopes and blobs ([`ModelCtx::with_mac`]).
    mac_secret: Option<TenantSecret>,
}

impl ModelCtx {
    /// Validate and fingerprint `parts`; embeddings are `parts.dtype`, `hidden` wide,
    /// checksummed with XXH3-64.
    pub fn new(parts: ModelParts, hidden: u64) -> Result<Self, CacheError> {
        if hidden == 0 {
            return Err(CacheError::InvalidInput(
                "hidden: expected >= 1, got 0".into(),
            ));
        }
        let parts = parts.normalized()?;
        let fp = parts.fingerprint()?;
        Ok(Self {
            embed_dtype: parts.dtype,
            parts,
            fp,
            hidden,
            checksum: ChecksumAlgo::Xxh3_64,
            fp_secret: None,
            mac_secret: None,
        })
    }

    /// Key image fingerprints with `secret` ([`ModelCtx::image_fingerprint`]); named in
    /// the envelopes this context commits and required of those it accepts.
    pub fn with_keyed_fingerprints(mut self, secret: TenantSecret) -> Self {
        self.fp_secret = Some(secret);
        self
    }

    /// MAC every envelope and blob this context commits with `secret`, and accept only
    /// pairs whose MAC verifies under it.
    pub fn with_mac(mut self, secret: TenantSecret) -> Self {
        self.mac_secret = Some(secret);
        self
    }

    /// Whether either option is on (such contexts bypass the envelope memo).
    pub fn is_keyed(&self) -> bool {
        self.fp_secret.is_some() || self.mac_secret.is_some()
    }

    /// The authentication this context writes and requires (`None` when unkeyed).
    fn auth(&self) -> Option<Auth> {
        self.is_keyed().then(|| Auth {
            fp: if self.fp_secret.is_some() {
                FpScheme::Keyed
            } else {
                FpScheme::Plain
            },
            mac: None,
        })
    }

    /// The image fingerprint of a processed pixel tensor under this context: keyed when
    /// [`ModelCtx::with_keyed_fingerprints`] is on, plain otherwise.
    pub fn image_fingerprint(
        &self,
        grid: GridThw,
        shape: &[u64],
        dtype: Dtype,
        pixels: &[u8],
    ) -> Result<ImageFp, FingerprintError> {
        match &self.fp_secret {
            Some(k) => image_fingerprint_keyed(k, &self.fp, grid, shape, dtype, pixels),
            None => image_fingerprint(&self.fp, grid, shape, dtype, pixels),
        }
    }

    /// Use `dtype` for embeddings (e.g. bf16 outputs of an fp8 encoder).
    pub fn with_embed_dtype(mut self, dtype: Dtype) -> Self {
        self.embed_dtype = dtype;
        self
    }

    /// Checksum commits with `algo`.
    pub fn with_checksum(mut self, algo: ChecksumAlgo) -> Self {
        self.checksum = algo;
        self
    }

    /// Normalized model parts.
    pub fn parts(&self) -> &ModelParts {
        &self.parts
    }

    /// Model fingerprint.
    pub fn fp(&self) -> ModelFp {
        self.fp
    }

    /// Tenant.
    pub fn tenant(&self) -> &str {
        &self.parts.tenant
    }

    /// Embedding dtype.
    pub fn embed_dtype(&self) -> Dtype {
        self.embed_dtype
    }

    /// Embedding width (elements per visual token).
    pub fn hidden(&self) -> u64 {
        self.hidden
    }

    /// Checksum algorithm for commits.
    pub fn checksum(&self) -> ChecksumAlgo {
        self.checksum
    }

    /// Bytes per visual token.
    pub fn token_bytes(&self) -> u64 {
        self.hidden.saturating_mul(self.embed_dtype.size_bytes())
    }

    /// What a reader expects for an image of `grid`.
    pub fn expect(&self, grid: GridThw) -> Result<Expected<'_>, CacheError> {
        let merge = u64::from(self.parts.spatial_merge_size);
        let tokens = grid.visual_tokens(merge).ok_or_else(|| {
            CacheError::InvalidInput(format!(
                "grid_thw {grid:?}: h and w must be multiples of spatial_merge_size {merge}"
            ))
        })?;
        let byte_len = tokens
            .checked_mul(self.token_bytes())
            .ok_or_else(|| CacheError::InvalidInput(format!("grid_thw {grid:?}: too large")))?;
        Ok(Expected {
            ctx: self,
            grid,
            tokens,
            byte_len,
        })
    }
}

/// What a reader expects of one image's cached embedding.
#[derive(Debug, Clone, Copy)]
pub struct Expected<'a> {
    /// The reader's model context.
    pub ctx: &'a ModelCtx,
    /// The image's grid.
    pub grid: GridThw,
    /// Visual tokens after merge.
    pub tokens: u64,
    /// Embedding bytes (`tokens x hidden x dtype size`).
    pub byte_len: u64,
}

impl Expected<'_> {
    /// The envelope a writer with this context commits for `fp`.
    pub fn envelope(&self, fp: ImageFp, checksum: Option<Checksum>) -> Envelope {
        Envelope {
            schema_version: SCHEMA_VERSION,
            fp,
            tenant: self.ctx.parts.tenant.clone(),
            model_fp: self.ctx.fp,
            model_parts: self.ctx.parts.clone(),
            dtype: self.ctx.embed_dtype,
            shape: [self.tokens, self.ctx.hidden],
            grid_thw: self.grid,
            byte_len: self.byte_len,
            checksum,
            auth: self.ctx.auth(),
        }
    }

    /// The first field of `env` that disagrees, as a miss reason.
    fn check(&self, fp: &ImageFp, env: &Envelope) -> Option<MissReason> {
        if env.fp != *fp {
            Some(MissReason::KeyMismatch)
        } else if !self.auth_matches(env) {
            Some(MissReason::Unauthenticated)
        } else {
            self.check_rest(env)
        }
    }

    /// Whether `env` names exactly this reader's authentication: the same fingerprint
    /// scheme, and a MAC of the named algorithm exactly when the reader has a MAC secret
    /// (the tag itself is verified with the blob).
    fn auth_matches(&self, env: &Envelope) -> bool {
        match (self.ctx.auth(), env.auth) {
            (None, None) => true,
            (Some(want), Some(got)) => {
                want.fp == got.fp && got.mac.is_some() == self.ctx.mac_secret.is_some()
            }
            _ => false,
        }
    }

    /// [`Expected::check`] after the image fingerprint: every field but `fp`,
    /// `schema_version` and `checksum`, in the same order.
    fn check_rest(&self, env: &Envelope) -> Option<MissReason> {
        let c = self.ctx;
        if env.tenant != c.parts.tenant {
            Some(MissReason::TenantMismatch)
        } else if env.model_fp != c.fp {
            Some(MissReason::ModelFpMismatch)
        } else if env.model_parts != c.parts {
            Some(MissReason::ModelPartsMismatch)
        } else if env.dtype != c.embed_dtype {
            Some(MissReason::DtypeMismatch)
        } else if env.grid_thw != self.grid {
            Some(MissReason::GridMismatch)
        } else if env.shape != [self.tokens, c.hidden] {
            Some(MissReason::ShapeMismatch)
        } else if env.byte_len != self.byte_len {
            Some(MissReason::ByteLenMismatch)
        } else {
            None
        }
    }

    /// Whether `env`, with its `fp` replaced, is exactly `self.envelope(fp, None)`.
    fn is_size_only_envelope(&self, env: &Envelope) -> bool {
        env.schema_version == SCHEMA_VERSION
            && env.checksum.is_none()
            && self.check_rest(env).is_none()
    }

    /// What, besides the image fingerprint, determines `self.envelope(_, None)`, up to the
    /// model parts behind the model fingerprint (compared in full on use).
    fn template_key(&self) -> TemplateKey {
        TemplateKey {
            model_fp: self.ctx.fp,
            dtype: self.ctx.embed_dtype,
            shape: [self.tokens, self.ctx.hidden],
            grid: self.grid,
            byte_len: self.byte_len,
        }
    }
}

/// The envelope template memo's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct TemplateKey {
    model_fp: ModelFp,
    dtype: Dtype,
    shape: [u64; 2],
    grid: GridThw,
    byte_len: u64,
}

/// Envelope templates by expectation: a pure speed-up. A size-only commit whose template
/// is known splices the fingerprint into its bytes instead of serializing JSON; a lookup
/// whose meta is exactly a template's frame skips JSON parsing. Every other input takes
/// [`Envelope::encode`] / [`Envelope::decode`], and results are the same either way
/// (see [`Template`]); bounded, and deterministic.
#[derive(Debug)]
struct Memo {
    on: bool,
    templates: FxHashMap<TemplateKey, Template>,
}

impl Memo {
    fn learn(&mut self, key: TemplateKey, env: &Envelope, frame: Option<&[u8]>) {
        let t = match frame {
            Some(f) => Template::from_frame(env, f),
            None => Template::learn(env),
        };
        if let Some(t) = t {
            if self.templates.len() >= MEMO_CAP {
                self.templates.clear();
            }
            self.templates.insert(key, t);
        }
    }
}

/// An envelope's fields a lookup needs after validation.
struct Validated {
    miss: Option<MissReason>,
    byte_len: u64,
    checksum: Option<Checksum>,
    /// The decoded envelope, kept only when the reader verifies a MAC (boxed so the hot
    /// path moves a pointer, not an envelope).
    mac_env: Option<Box<Envelope>>,
}

/// Store options for cache objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Replicate config of blob and meta puts (data type `encoder_output` by default).
    pub replicate: ReplicateConfig,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            replicate: ReplicateConfig::of(DataType::EncoderOutput),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Probe {
    Lookup,
    Readback,
}

/// Where a lookup puts the blob.
enum Sink<'b> {
    Bytes(&'b mut [u8]),
    SizeOnly,
}

/// The embedding cache over a store `S`.
#[derive(Debug)]
pub struct MmCache<S: Store> {
    store: S,
    cfg: CacheConfig,
    counters: CacheCounters,
    meta_buf: Vec<u8>,
    /// The current call's image fingerprint in hex (envelope templates write it), and its
    /// meta and blob keys in their compact typed form (`mc:mmmeta:<hex>`,
    /// `mc:mmblob:<hex>`: a compact store uses them as they are, others format them).
    hex: FpHex,
    mk: StoreKey,
    bk: StoreKey,
    memo: Memo,
}

impl<S: Store> MmCache<S> {
    /// A cache over `store` with default options.
    pub fn new(store: S) -> Self {
        Self::with_config(store, CacheConfig::default())
    }

    /// A cache over `store` with `cfg`.
    pub fn with_config(store: S, cfg: CacheConfig) -> Self {
        Self {
            store,
            cfg,
            counters: CacheCounters::default(),
            meta_buf: vec![0; META_BUF],
            hex: FpHex::of(&ImageFp([0; 32])),
            mk: StoreKey::MmMeta([0; 32]),
            bk: StoreKey::MmBlob([0; 32]),
            memo: Memo {
                on: true,
                templates: FxHashMap::default(),
            },
        }
    }

    /// Whether lookups and size-only commits reuse envelope templates (on by default).
    /// Results, counters and store operations are identical either way; off runs
    /// [`Envelope::encode`] and [`Envelope::decode`] on every call (tests, benchmarks).
    pub fn set_envelope_memo(&mut self, on: bool) {
        self.memo.on = on;
        self.memo.templates.clear();
    }

    /// Point the hex and key buffers at `fp`.
    fn set_keys(&mut self, fp: &ImageFp) {
        self.hex = FpHex::of(fp);
        self.mk = StoreKey::MmMeta(fp.0);
        self.bk = StoreKey::MmBlob(fp.0);
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store, mutably (drivers advance time, inject faults, inspect).
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// The store back.
    pub fn into_store(self) -> S {
        self.store
    }

    /// Counters so far.
    pub fn counters(&self) -> &CacheCounters {
        &self.counters
    }

    /// Counters, mutably (drivers reset them between passes).
    pub fn counters_mut(&mut self) -> &mut CacheCounters {
        &mut self.counters
    }

    /// Commit `bytes` as the embedding of `fp` (an image of `grid` under `ctx`): retract
    /// any old pair, put the blob, then the meta.
    pub fn commit(
        &mut self,
        now: Nanos,
        ctx: &ModelCtx,
        fp: ImageFp,
        grid: GridThw,
        bytes: &[u8],
    ) -> Result<CommitOutcome, CacheError> {
        let exp = ctx.expect(grid)?;
        if bytes.len() as u64 != exp.byte_len {
            return Err(CacheError::InvalidInput(format!(
                "embedding of {fp}: expected {} bytes, got {}",
                exp.byte_len,
                bytes.len()
            )));
        }
        let sum = Checksum::of(ctx.checksum, bytes);
        let mut env = exp.envelope(fp, Some(sum));
        seal(ctx, &mut env, MacBlob::Bytes(bytes));
        let r = match env.encode() {
            Ok(meta) => {
                self.set_keys(&fp);
                self.commit_pair(now, meta, Payload::Bytes(bytes.to_vec()))
            }
            Err(e) => Err(e.into()),
        };
        self.count_client_error(r)
    }

    /// Commit a size-only embedding of `fp` (simulator): a size-only blob and an envelope
    /// without checksum.
    pub fn commit_size_only(
        &mut self,
        now: Nanos,
        ctx: &ModelCtx,
        fp: ImageFp,
        grid: GridThw,
    ) -> Result<CommitOutcome, CacheError> {
        let exp = ctx.expect(grid)?;
        self.set_keys(&fp);
        let r = match self.size_only_meta(&exp, &fp) {
            Ok(meta) => self.commit_pair(now, meta, Payload::SizeOnly(exp.byte_len)),
            Err(e) => Err(e.into()),
        };
        self.count_client_error(r)
    }

    /// `exp.envelope(fp, None).encode()`, from the memo's template when it has one (the
    /// keys must point at `fp`).
    fn size_only_meta(
        &mut self,
        exp: &Expected<'_>,
        fp: &ImageFp,
    ) -> Result<Vec<u8>, EnvelopeError> {
        if !self.memo.on || exp.ctx.is_keyed() {
            let mut env = exp.envelope(*fp, None);
            seal(exp.ctx, &mut env, MacBlob::SizeOnly(exp.byte_len));
            return env.encode();
        }
        let key = exp.template_key();
        if let Some(t) = self.memo.templates.get(&key) {
            if exp.is_size_only_envelope(t.envelope()) {
                return Ok(t.encode(&self.hex));
            }
        }
        let env = exp.envelope(*fp, None);
        let meta = env.encode()?;
        self.memo.learn(key, &env, Some(&meta));
        Ok(meta)
    }

    /// Count a broken-client error on its way out of a public call (once per call).
    fn count_client_error<T>(&mut self, r: Result<T, CacheError>) -> Result<T, CacheError> {
        if let Err(CacheError::Store(_)) = &r {
            self.counters.client_errors += 1;
        }
        r
    }

    /// Commit `meta` and `blob` under the current keys ([`MmCache::set_keys`]).
    fn commit_pair(
        &mut self,
        now: Nanos,
        meta: Vec<u8>,
        blob: Payload,
    ) -> Result<CommitOutcome, CacheError> {
        // Retract the commit marker before touching the blob, so no reader ever pairs an
        // old meta with a new blob (or the reverse).
        remove_quiet(&mut self.store, now, &self.mk)?;
        remove_quiet(&mut self.store, now, &self.bk)?;
        let cfg = self.cfg.replicate;
        if let Err(e) = self.store.put_key(now, &self.bk, blob, &cfg) {
            return self.commit_failed(e);
        }
        if let Err(e) = self
            .store
            .put_key(now, &self.mk, Payload::Bytes(meta), &cfg)
        {
            if !e.is_client_failure() {
                // Free the orphan blob (it would only ever be a miss).
                remove_quiet(&mut self.store, now, &self.bk)?;
            }
            return self.commit_failed(e);
        }
        self.counters.commits += 1;
        Ok(CommitOutcome::Committed)
    }

    fn commit_failed(&mut self, e: StoreError) -> Result<CommitOutcome, CacheError> {
        if e.is_client_failure() {
            return Err(CacheError::Store(e));
        }
        self.counters.commit_failures += 1;
        Ok(CommitOutcome::Failed(e))
    }

    /// Remove the pair of `fp` (meta first). Returns an error only for a broken client.
    pub fn remove_pair(&mut self, now: Nanos, fp: &ImageFp) -> Result<(), CacheError> {
        self.set_keys(fp);
        let r = self.remove_pair_inner(now);
        self.count_client_error(r)
    }

    /// Remove the pair under the current keys ([`MmCache::set_keys`]), meta first.
    fn remove_pair_inner(&mut self, now: Nanos) -> Result<(), CacheError> {
        remove_quiet(&mut self.store, now, &self.mk)?;
        remove_quiet(&mut self.store, now, &self.bk)
    }

    /// Validated lookup of `fp` into `recv` (a cache probe: counted as a hit or a miss).
    pub fn lookup(
        &mut self,
        now: Nanos,
        fp: &ImageFp,
        expect: &Expected<'_>,
        recv: &mut [u8],
    ) -> Result<Lookup, CacheError> {
        self.run(now, fp, expect, Sink::Bytes(recv), Probe::Lookup)
    }

    /// The same validated lookup, right after a commit ("cache is transport"): counted
    /// as a readback, never as a hit.
    pub fn readback(
        &mut self,
        now: Nanos,
        fp: &ImageFp,
        expect: &Expected<'_>,
        recv: &mut [u8],
    ) -> Result<Lookup, CacheError> {
        self.run(now, fp, expect, Sink::Bytes(recv), Probe::Readback)
    }

    /// Size-only probe: full envelope validation, then the blob's size (no checksum).
    pub fn lookup_size_only(
        &mut self,
        now: Nanos,
        fp: &ImageFp,
        expect: &Expected<'_>,
    ) -> Result<Lookup, CacheError> {
        self.run(now, fp, expect, Sink::SizeOnly, Probe::Lookup)
    }

    /// Size-only readback (see [`MmCache::readback`]).
    pub fn readback_size_only(
        &mut self,
        now: Nanos,
        fp: &ImageFp,
        expect: &Expected<'_>,
    ) -> Result<Lookup, CacheError> {
        self.run(now, fp, expect, Sink::SizeOnly, Probe::Readback)
    }

    fn run(
        &mut self,
        now: Nanos,
        fp: &ImageFp,
        expect: &Expected<'_>,
        sink: Sink<'_>,
        probe: Probe,
    ) -> Result<Lookup, CacheError> {
        let r = self.lookup_inner(now, fp, expect, sink);
        let c = &mut self.counters;
        match (&r, probe) {
            (Err(CacheError::Store(_)), _) => c.client_errors += 1,
            (Err(_), _) => {}
            (Ok(Lookup::Hit { .. }), Probe::Lookup) => {
                c.lookups += 1;
                c.hits += 1;
            }
            (Ok(Lookup::Hit { .. }), Probe::Readback) => {
                c.readbacks += 1;
                c.readback_hits += 1;
            }
            (Ok(Lookup::Miss(_)), Probe::Lookup) => c.lookups += 1,
            (Ok(Lookup::Miss(_)), Probe::Readback) => {
                c.readbacks += 1;
                c.readback_misses += 1;
            }
        }
        r
    }

    /// A miss of `reason`: counted, and for corruption the pair under the current keys
    /// is deleted.
    fn miss(&mut self, now: Nanos, reason: MissReason) -> Result<Lookup, CacheError> {
        self.counters.misses.add(reason);
        if reason.deletes_pair() {
            self.remove_pair_inner(now)?;
            self.counters.pairs_deleted += 1;
        }
        Ok(Lookup::Miss(reason))
    }

    /// A read error that is not a clean outcome: a client failure surfaces, the rest miss.
    fn read_error(
        &mut self,
        now: Nanos,
        e: StoreError,
        on_blob: bool,
    ) -> Result<Lookup, CacheError> {
        let reason = match e {
            e if e.is_client_failure() => return Err(CacheError::Store(e)),
            StoreError::NotFound if on_blob => MissReason::BlobMissing,
            StoreError::NotFound => MissReason::NotFound,
            StoreError::NotReady => MissReason::NotReady,
            StoreError::LeaseExpired => MissReason::LeaseExpired,
            StoreError::SizeOnly if on_blob => MissReason::SizeOnly,
            // A meta stored without bytes is not an envelope.
            StoreError::SizeOnly => MissReason::CorruptMeta,
            StoreError::BufferTooSmall { .. } if on_blob => MissReason::CorruptBlob,
            StoreError::BufferTooSmall { .. } => MissReason::CorruptMeta,
            StoreError::ChecksumMismatch if on_blob => MissReason::CorruptBlob,
            _ => MissReason::StoreError,
        };
        self.miss(now, reason)
    }

    /// Read the meta at the current meta key into `meta_buf` (growing it once, up to
    /// [`MAX_META_BYTES`]); returns its length.
    fn read_meta(&mut self, now: Nanos) -> Result<usize, StoreError> {
        match self.store.get_into_key(now, &self.mk, &mut self.meta_buf) {
            Err(StoreError::BufferTooSmall { needed, .. })
                if needed as usize <= MAX_META_BYTES && needed as usize > self.meta_buf.len() =>
            {
                self.meta_buf.resize(needed as usize, 0);
                self.store
                    .get_into_key(now, &self.mk, &mut self.meta_buf)
                    .map(|n| n as usize)
            }
            r => r.map(|n| n as usize),
        }
    }

    /// Decode and validate the meta read (`n` bytes of `meta_buf`) against `expect`: a
    /// meta that is exactly a known template's frame skips JSON; everything else is
    /// [`Envelope::decode`]d. `Err` is the decode's miss reason.
    fn validate_meta(
        &mut self,
        n: usize,
        fp: &ImageFp,
        expect: &Expected<'_>,
    ) -> Result<Validated, MissReason> {
        let bytes = self.meta_buf.get(..n);
        // Keyed contexts never use templates (see the module docs).
        let key = (self.memo.on && !expect.ctx.is_keyed()).then(|| expect.template_key());
        if let (Some(b), Some(key)) = (bytes, key) {
            if let Some(t) = self.memo.templates.get(&key) {
                if let Some(same) = t.recognize(b, &self.hex) {
                    // `Envelope::decode(b)` is `t`'s envelope with some fingerprint, `fp`
                    // exactly when `same`.
                    let env = t.envelope();
                    let miss = if same {
                        expect.check_rest(env)
                    } else {
                        Some(MissReason::KeyMismatch)
                    };
                    return Ok(Validated {
                        miss,
                        byte_len: env.byte_len,
                        checksum: env.checksum,
                        mac_env: None,
                    });
                }
            }
        }
        let decoded = match bytes {
            Some(b) => Envelope::decode(b),
            None => Err(EnvelopeError::TooLarge { len: n }),
        };
        let env = match decoded {
            Ok(env) => env,
            Err(EnvelopeError::SchemaMismatch { .. }) => return Err(MissReason::SchemaMismatch),
            Err(_) => return Err(MissReason::CorruptMeta),
        };
        let miss = expect.check(fp, &env);
        if let Some(key) = key {
            // A valid size-only envelope of this expectation: learn its family.
            if miss.is_none() && env.checksum.is_none() && !self.memo.templates.contains_key(&key) {
                self.memo.learn(key, &env, None);
            }
        }
        let (byte_len, checksum) = (env.byte_len, env.checksum);
        let mac_env = (expect.ctx.mac_secret.is_some() && miss.is_none()).then(|| Box::new(env));
        Ok(Validated {
            miss,
            byte_len,
            checksum,
            mac_env,
        })
    }

    /// A blob that passed its checks is a hit, unless the reader verifies MACs and the
    /// envelope's tag is not the MAC of the envelope and `blob` under its secret.
    fn authenticated(
        &mut self,
        now: Nanos,
        expect: &Expected<'_>,
        env: &Validated,
        blob: MacBlob<'_>,
        len: u64,
    ) -> Result<Lookup, CacheError> {
        let Some(secret) = &expect.ctx.mac_secret else {
            return Ok(Lookup::Hit { len });
        };
        let ok = env.mac_env.as_ref().is_some_and(|e| {
            e.auth
                .and_then(|a| a.mac)
                .is_some_and(|m| mac_verifies(secret, e, blob, &m.tag))
        });
        if ok {
            Ok(Lookup::Hit { len })
        } else {
            self.miss(now, MissReason::Unauthenticated)
        }
    }

    fn lookup_inner(
        &mut self,
        now: Nanos,
        fp: &ImageFp,
        expect: &Expected<'_>,
        sink: Sink<'_>,
    ) -> Result<Lookup, CacheError> {
        self.set_keys(fp);
        let n = match self.read_meta(now) {
            Ok(n) => n,
            Err(e) => return self.read_error(now, e, false),
        };
        let env = match self.validate_meta(n, fp, expect) {
            Ok(v) => v,
            Err(reason) => return self.miss(now, reason),
        };
        if let Some(reason) = env.miss {
            return self.miss(now, reason);
        }
        match sink {
            Sink::SizeOnly => match self.store.get_size_key(now, &self.bk) {
                Ok(n) if n == env.byte_len => {
                    self.authenticated(now, expect, &env, MacBlob::SizeOnly(n), n)
                }
                Ok(_) => self.miss(now, MissReason::CorruptBlob),
                Err(e) => self.read_error(now, e, true),
            },
            Sink::Bytes(recv) => {
                let Some(sum) = env.checksum else {
                    return self.miss(now, MissReason::SizeOnly);
                };
                let dst = match usize::try_from(env.byte_len)
                    .ok()
                    .and_then(|len| recv.get_mut(..len))
                {
                    Some(d) => d,
                    None => return self.miss(now, MissReason::RecvBufferTooSmall),
                };
                match self.store.get_into_key(now, &self.bk, dst) {
                    Ok(n) if n == env.byte_len && sum.verify(dst) => {
                        self.authenticated(now, expect, &env, MacBlob::Bytes(dst), n)
                    }
                    Ok(_) => self.miss(now, MissReason::CorruptBlob),
                    Err(e) => self.read_error(now, e, true),
                }
            }
        }
    }
}

/// Add the MAC of `env` and `blob` when `ctx` has a MAC secret.
fn seal(ctx: &ModelCtx, env: &mut Envelope, blob: MacBlob<'_>) {
    if let Some(secret) = &ctx.mac_secret {
        let tag = mac_of(secret, env, blob);
        if let Some(a) = env.auth.as_mut() {
            a.mac = Some(EnvelopeMac {
                algo: MacAlgo::Blake2b256Keyed,
                tag,
            });
        }
    }
}

/// Force-remove `key`; absent or in-progress objects are fine, a client failure is not.
fn remove_quiet<S: Store>(store: &mut S, now: Nanos, key: &StoreKey) -> Result<(), CacheError> {
    match store.remove_key(now, key, true) {
        Err(e) if e.is_client_failure() => Err(CacheError::Store(e)),
        _ => Ok(()),
    }
}

//! The serving engine: the EPD cluster's decisions as one sans-IO state machine.
//!
//! In the style of quinn-proto's `Connection`: events go in, actions come out, and the
//! engine never reads a clock, sleeps, spawns or does I/O. Inputs are
//! [`Engine::arrive`] (request `i` of the trace arrives at `now`) and
//! [`Engine::complete`] (a unit of work the engine asked for finished at `now`, a
//! [`Done`]). Outputs are [`Action`]s, taken with [`Engine::poll_action`] in the order they
//! were decided: run this encoder batch on worker `w`, this prefill chunk, this decode
//! iteration; move these bytes from `a` to `b`; fingerprint these pixels. A driver prices
//! (the simulator, in virtual time, with `moonagent-models`) or executes (a real backend,
//! in wall time) each action and reports its completion; it decides nothing else. So the
//! same trace makes the same decisions on both sides whenever completions arrive in the
//! same order, and a recorded input log replays to the same action log.
//!
//! The engine owns: routing (round robin, or least predicted drain time under
//! three-point scheduling), batching (encoder batches by a visual-token budget, chunked
//! prefill by a token budget, continuous decode batching with preemption), the
//! embedding-cache plan/commit/readback through [`MmCache`](crate::mm_cache::MmCache),
//! the KV prefix rule ([`kv_prefix`]), fork admission through
//! [`fork_request`](crate::fork::fork_request) with fallback to independent prefill,
//! and every decode worker's KV block pool.
//!
//! Store work. The engine reaches the store only through the [`Store`](crate::store::Store)
//! trait, and only for the decision plane: validated size-only lookups and commits of
//! encoder outputs, `exists` and puts of prefix KV blocks ([`Payloads::SizeOnly`]), or
//! the same calls with synthetic real bytes ([`Payloads::Bytes`]). These are small,
//! ordered operations whose outcome is a decision (hit or miss, stored or refused). The
//! data plane, moving an embedding or a KV prefix between a worker and the store or
//! between two workers, is an [`Action::Transfer`] / [`Action::Load`] that the driver
//! runs concurrently with everything else and completes later; the engine never waits
//! on bytes, so a 40 MB read never stalls another worker's scheduling.

pub mod decode;
mod engine;
pub mod kv_prefix;
mod memo;
mod record;
mod request;
pub mod toy;

pub use engine::{Counters, Engine, Served, WorkerLoad};
pub use record::{RequestRecord, NONE};
pub use request::{images_of, Img, RequestView};

use serde::{Deserialize, Serialize};

use crate::fork::ForkError;
use crate::mm_cache::CacheError;
use crate::store::StoreError;

/// A worker (GPU instance) of the cluster, numbered from 0.
pub type WorkerId = u32;
/// A unit of service: a top-level request, or one branch of an agent request.
pub type JobId = u32;

/// The B0 -> Full ladder: each mode adds one mechanism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Encoder and LLM colocated on every GPU, no cross-request cache.
    B0,
    /// EPD disaggregation; encoder outputs travel through the store under request-scoped
    /// keys (no cross-request reuse); agent branches re-run as independent requests.
    B1,
    /// + the content-addressed embedding cache (cross-request and cross-branch reuse).
    B2,
    /// + same-worker agent fork (branches share prefix KV pages on the decode worker).
    B3,
    /// + three-point scheduling (load-aware encoder dispatch and prefill placement,
    ///   decode placement by load with branch affinity).
    Full,
}

impl Mode {
    /// Every mode, in ladder order.
    pub const ALL: [Mode; 5] = [Mode::B0, Mode::B1, Mode::B2, Mode::B3, Mode::Full];

    /// Display name (`B0`, ..., `Full`).
    pub fn name(self) -> &'static str {
        match self {
            Mode::B0 => "B0",
            Mode::B1 => "B1",
            Mode::B2 => "B2",
            Mode::B3 => "B3",
            Mode::Full => "Full",
        }
    }
    /// Encoder, prefill and decode on separate workers.
    pub fn disaggregated(self) -> bool {
        self != Mode::B0
    }
    /// Cross-request embedding reuse.
    pub fn cache(self) -> bool {
        matches!(self, Mode::B2 | Mode::B3 | Mode::Full)
    }
    /// Same-worker fork of agent branches.
    pub fn fork(self) -> bool {
        matches!(self, Mode::B3 | Mode::Full)
    }
    /// Load-aware three-point scheduling.
    pub fn smart_scheduling(self) -> bool {
        self == Mode::Full
    }
}

/// What a worker does: one EPD role, or all three on one GPU (B0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Vision encoder.
    Encoder,
    /// Prefill.
    Prefill,
    /// Decode (holds a KV pool).
    Decode,
    /// Encoder, prefill and decode on one GPU (holds a KV pool).
    Colocated,
}

impl Role {
    /// Stable snake_case name.
    pub const fn name(self) -> &'static str {
        match self {
            Role::Encoder => "encoder",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Colocated => "colocated",
        }
    }
}

/// Direction and payload of a transfer; a link has one bandwidth per flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flow {
    /// Encoder output or general object, towards the store or peer.
    Put,
    /// Encoder output or general object, from the store or peer.
    Get,
    /// KV cache towards the store or peer.
    KvPut,
    /// KV cache from the store or peer.
    KvGet,
}

impl Flow {
    /// Every flow, in file order.
    pub const ALL: [Flow; 4] = [Flow::Put, Flow::Get, Flow::KvPut, Flow::KvGet];

    /// The TOML key of this flow's bandwidth (`kv_put_bytes_per_s`).
    pub const fn field(self) -> &'static str {
        match self {
            Flow::Put => "put_bytes_per_s",
            Flow::Get => "get_bytes_per_s",
            Flow::KvPut => "kv_put_bytes_per_s",
            Flow::KvGet => "kv_get_bytes_per_s",
        }
    }
}

/// What the engine stores: sizes only (simulation), or real bytes (a synthetic,
/// deterministic embedding per fingerprint and a pattern per KV block, validated with a
/// checksum on every read) so a real store sees real objects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Payloads {
    /// Size-only payloads and size-only validated lookups.
    #[default]
    SizeOnly,
    /// Real bytes.
    Bytes,
}

/// The cluster's shape and the batching budgets: everything the engine decides with.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Ladder mode.
    pub mode: Mode,
    /// Encoder, prefill and decode instances (EPD modes).
    pub encoders: u32,
    /// Prefill instances (EPD modes).
    pub prefills: u32,
    /// Decode instances (EPD modes).
    pub decodes: u32,
    /// Colocated instances (B0).
    pub colocated: u32,
    /// Largest encoder batch, in visual tokens.
    pub encoder_max_batch_tokens: u32,
    /// Prefill chunk budget, in new tokens per iteration.
    pub prefill_chunk_tokens: u32,
    /// Largest decode batch, in sequences.
    pub decode_max_batch: u32,
    /// KV page size of the decode pools, tokens.
    pub kv_block_tokens: u32,
    /// KV pages per decode pool.
    pub kv_pages: u32,
    /// Tokens per prefix block (the trace's `block_size_tokens`).
    pub prefix_block_tokens: u32,
    /// Reuse prefix KV blocks through the store.
    pub kv_prefix_store: bool,
    /// KV bytes per token.
    pub kv_bytes_per_token: u64,
    /// Encoder-output bytes per visual token.
    pub encoder_bytes_per_token: u64,
    /// Processed-pixel bytes per visual token (what the router fingerprints).
    pub pixel_bytes_per_token: u64,
    /// Encoder output elements per visual token (the hidden size).
    pub hidden: u64,
    /// Size-only or real payloads.
    pub payloads: Payloads,
    /// Name each decode sequence's KV pages in [`Action::Decode`] (`seqs`, `copies`): a
    /// real backend computes over those very pages. Off in the simulator (it prices
    /// shapes); the decisions are the same either way.
    pub kv_tables: bool,
}

/// A unit of work the driver finished (the engine's second input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Done {
    /// The router fingerprinted the job's images.
    Fingerprinted(JobId),
    /// The worker's batch (encode, prefill chunk or decode iteration) finished.
    Step(WorkerId),
    /// Image `idx` of the job reached the store.
    Stored(JobId, u32),
    /// The job's embeddings and prefix KV reached its prefill worker.
    Loaded(JobId),
    /// The job's KV reached its decode worker.
    KvArrived(JobId),
}

/// One image of an encoder batch: image `idx` of job `job`, with the trace's content id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ImageRef {
    /// The job.
    pub job: JobId,
    /// The image's index in the job.
    pub idx: u32,
    /// The image's content id (equal contents give equal pixels, so equal outputs).
    pub content: u64,
}

/// Where the engine takes the encoder outputs it commits to the embedding cache when
/// payloads are real ([`Payloads::Bytes`]): a real backend hands over what its encoder
/// produced. Without one, the engine commits a deterministic stand-in of the right size.
pub trait EncoderOutputs {
    /// The output of image `idx` of `job` (taken: asked once per image), or `None` when
    /// the encoder produced none.
    fn take(&mut self, job: JobId, idx: u32) -> Option<Vec<u8>>;
}

/// Extra work a decode iteration carries before its tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Extra {
    /// Recompute the KV of a preempted sequence's `tokens`-token context.
    Recompute {
        /// Context tokens.
        tokens: u32,
        /// The job whose sequence it is.
        job: JobId,
    },
    /// Copy a fork's partial tail pages.
    TailCopy {
        /// Bytes copied.
        bytes: u64,
    },
}

/// One sequence of a decode iteration, named down to its KV pages (a real backend's view).
///
/// The iteration computes the K/V of the sequence's token at position `len` (attending
/// over `0..=len`); the pool appends it at the end of the iteration, which is when it
/// allocates the page for it (when `len` starts a page) or copies a tail page another
/// table still holds (`shared_tail`). So a write at `len` into a page that does not
/// exist yet or is shared must stay off the pool's pages until the next iteration names
/// the sequence's pages again, and a sequence that `appends` nothing keeps nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeSeqRef {
    /// The job.
    pub job: JobId,
    /// The pool's sequence (index and generation): stable across iterations while it lives.
    pub seq: (u32, u64),
    /// Its page table (page ids of the worker's pool).
    pub pages: Vec<u32>,
    /// Tokens in its context before this iteration's token.
    pub len: u64,
    /// The page holding position `len` exists and another table holds it too.
    pub shared_tail: bool,
    /// The iteration's token is appended to the sequence (false: a sequence with nothing
    /// to decode, in the batch for one iteration).
    pub appends: bool,
    /// Admitted into fresh pages by this iteration (from a prefill, or re-admitted after
    /// preemption, then with an [`Extra::Recompute`]); forked branches are not.
    pub admitted: bool,
}

/// What the driver must do (the engine's output).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Fingerprint `pixel_bytes` of the job's images on the router, then report
    /// [`Done::Fingerprinted`].
    Fingerprint {
        /// The job.
        job: JobId,
        /// Processed-pixel bytes to hash.
        pixel_bytes: u64,
    },
    /// Run the vision encoder on a batch of images, then report [`Done::Step`].
    Encode {
        /// Where.
        worker: WorkerId,
        /// Visual tokens of each image in the batch.
        tokens: Vec<u32>,
        /// Which image each one is, in the same order (a real encoder's outputs are
        /// handed back through [`EncoderOutputs`] under these identities).
        images: Vec<ImageRef>,
    },
    /// Run one prefill iteration, then report [`Done::Step`].
    Prefill {
        /// Where.
        worker: WorkerId,
        /// `(new tokens, cached tokens before them)` of each chunk in the batch.
        chunks: Vec<(u32, u32)>,
        /// The job of each chunk and its prompt's tokens (the chunk with `new + cached ==
        /// prompt` finishes the job's prefill), in the same order.
        jobs: Vec<(JobId, u32)>,
    },
    /// Run one decode iteration, then report [`Done::Step`].
    Decode {
        /// Where.
        worker: WorkerId,
        /// Sequences in the batch.
        batch: u32,
        /// Sum of their context lengths.
        ctx_sum: u64,
        /// Work to do first (recompute of preempted sequences, fork tail copies).
        extra: Vec<Extra>,
        /// With [`EngineConfig::kv_tables`]: every sequence of the batch with its pages,
        /// in admission order (otherwise empty).
        seqs: Vec<DecodeSeqRef>,
        /// With [`EngineConfig::kv_tables`]: page copies `(src, dst)` to execute first,
        /// in order (fork tail copies decided since the last iteration).
        copies: Vec<(u32, u32)>,
    },
    /// Move `bytes` from `from` to `to` (`None`: the store) and report `done`, if any.
    Transfer {
        /// Source worker.
        from: WorkerId,
        /// Destination worker, or the store.
        to: Option<WorkerId>,
        /// Direction and payload kind.
        flow: Flow,
        /// Bytes.
        bytes: u64,
        /// Completion to report when the bytes have arrived.
        done: Option<Done>,
    },
    /// Move `count` prefix KV blocks of `bytes_each` from `from` to the store, one after
    /// another (the blocks a prefill published); nothing waits on them.
    PutBlocks {
        /// Source worker.
        from: WorkerId,
        /// Bytes of each block.
        bytes_each: u64,
        /// Blocks.
        count: u32,
    },
    /// Load the job's embeddings (`embed_bytes`, then `kv_bytes` of prefix KV) from the
    /// store into `worker`, then report [`Done::Loaded`].
    Load {
        /// The job.
        job: JobId,
        /// Its prefill worker.
        worker: WorkerId,
        /// Embedding bytes.
        embed_bytes: u64,
        /// Prefix KV bytes.
        kv_bytes: u64,
    },
    /// Accounting only: a cache hit saved encoding an image of `tokens` visual tokens.
    EncodeAvoided {
        /// Visual tokens.
        tokens: u32,
    },
}

/// Predicted durations, for the load signal of three-point scheduling: the driver's cost
/// model (the simulator's roofline, a real backend's fitted profile). The engine only
/// compares workers with it; it never waits on these numbers.
pub trait Pricing {
    /// An encoder batch of images with these visual tokens.
    fn encode_ns(&self, tokens: &[u32]) -> u64;
    /// A prefill iteration over these `(new, cached)` chunks.
    fn prefill_ns(&self, chunks: &[(u32, u32)]) -> u64;
    /// A decode iteration of `batch` sequences holding `ctx_sum` tokens in all.
    fn decode_ns(&self, batch: u32, ctx_sum: u64) -> u64;
    /// Moving `bytes` of `flow` over one worker's link.
    fn transfer_ns(&self, flow: Flow, bytes: u64) -> u64;
}

/// Why the engine stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration cannot build a cluster.
    #[error("{field}: {what}")]
    Config {
        /// The field.
        field: &'static str,
        /// What was expected.
        what: String,
    },
    /// A block-pool operation failed where the engine's own bookkeeping says it cannot.
    #[error("{0}: {1}")]
    Pool(&'static str, ForkError),
    /// The embedding cache failed (a broken store client, or invalid input).
    #[error("{0}: {1}")]
    Cache(&'static str, CacheError),
    /// A prefix-KV store operation failed with an error that is not a decision.
    #[error("kv {0}: {1}")]
    Store(&'static str, StoreError),
    /// A waiting sequence can never be admitted.
    #[error("decode worker {worker}: a sequence of {tokens} tokens does not fit the KV pool (raise kv_mem_fraction or use a larger GPU)")]
    DoesNotFit {
        /// The worker.
        worker: WorkerId,
        /// The sequence's context.
        tokens: u32,
    },
    /// A decode batch's lazy append allocated inside its headroom (a pool bug).
    #[error("decode finish: {tokens} tokens within the headroom allocated a page")]
    HeadroomAllocated {
        /// Tokens appended.
        tokens: u64,
    },
    /// A completion the engine did not ask for.
    #[error("unexpected completion {0:?}")]
    Unexpected(Done),
    /// Request `index` is not in the trace.
    #[error("request {0} is not in the trace")]
    NoSuchRequest(usize),
    /// The driver's encoder produced no output, or one of the wrong size, for an image.
    #[error("encoder output of job {job} image {idx}: {what}")]
    EncoderOutput {
        /// The job.
        job: JobId,
        /// The image.
        idx: u32,
        /// What was wrong (expected and found sizes).
        what: String,
    },
}

#[cfg(test)]
mod tests;

//! The `Compute` seam of the real backend: the three GPU operators of EPD serving
//! (encode, prefill, decode) and the KV-page copy, run as the real operator sequence of a
//! [`ModelSpec`] on real tensors.
//!
//! The core decides (which images to encode together, which chunk to prefill, which
//! sequences decode this iteration, which pages a sequence owns); a driver executes those
//! decisions through [`Compute`]. The simulator prices the same operators with
//! `moonagent-models`' cost model; running them for real on a scaled spec
//! (`qwen2.5-vl-tiny`) is how the simulator's structure is validated on a machine without
//! a GPU.
//!
//! Backends: [`CpuCompute`] (host, `matrixmultiply`), and with the `cuda` feature
//! `CudaCompute` (the same operators with cuBLAS GEMMs on device-resident weights; norms,
//! attention (the CPU backend's GEMM attention) and KV pages still on the host).
//!
//! # What is modelled
//! - **Encoder** (Qwen2.5-VL's ViT): deterministic processed pixels per image (from its
//!   content seed), the patch-embedding GEMM (Conv3d over one patch, no bias), `depth`
//!   blocks (RMSNorm, fused QKV GEMM with bias, multi-head attention, output projection
//!   with bias, RMSNorm, gated SiLU MLP with bias), then the patch merger (RMSNorm,
//!   `spatial_merge_size^2` neighbouring patch vectors concatenated, Linear-GELU-Linear to
//!   `out_hidden_size`). Blocks listed in `fullatt_block_indexes` attend over the whole
//!   image; the others attend within windows of `vision_window_patches()` patches. The
//!   image's patches are taken to be already in merge-group and window order (Qwen2.5-VL
//!   reorders them with `window_index` so each window is a contiguous run); windows are
//!   contiguous runs of that many patches, so only the last window of an image can be
//!   partial (the real model has partial windows along the right and bottom edges).
//! - **LLM** (Qwen2 decoder): RMSNorm, fused QKV GEMM with bias, rotary embedding,
//!   grouped-query attention of the new rows over the sequence's cached and new keys with a
//!   causal mask, output projection, RMSNorm, SwiGLU MLP; final RMSNorm and the LM head on
//!   the **last row only** (as serving engines do), whose argmax is the next token.
//! - **Attention as batched GEMM**, as serving kernels run it (so its cost scales like the
//!   simulator's, which prices attention FLOPs at GEMM efficiency). LLM (prefill and
//!   decode): per sequence and KV head, the sequence's keys and values (positions
//!   `0..len`) are gathered from its pages into contiguous f32 scratch once (bf16 -> f32
//!   once per key), then for blocks of new tokens `S = Q K^T` is one sgemm whose rows are
//!   (token, query head of the group) and whose columns are the keys, the causal mask and
//!   a max-subtracted softmax run per row in f32, and `O = P V` is a second sgemm; decode
//!   is the same with one row per query head. ViT: per window (or whole image) and head,
//!   `S = Q K^T` and `O = P V` as sgemm. The softmax's exponential is a branch-free
//!   polynomial `2^x` (Cephes' `expf`, about 2 ulp) so it vectorises, as GPU kernels use a
//!   fast `exp2`. Scratch buffers are reused, never allocated per row.
//! - **KV cache** in fixed-size pages of a host arena ([`KvArena`]) addressed through a
//!   page table (a vLLM block table). K/V are written to the pages before attention and
//!   attention reads them back through the page table, so prefill, chunked prefill and
//!   decode see the same (stored) keys and values.
//!
//! # What is not
//! - **No real checkpoint**: weights are deterministic random numbers, N(0, 0.02) for
//!   matrices and biases and 1 for norm scales, drawn from the project's RNG
//!   (`moonagent_core::rng`) in streams named after the spec and the tensor, under a seed.
//!   Outputs are real tensors of the right shapes and sizes, not meaningful text.
//! - **Numerics**: compute is f32 (GEMMs through `matrixmultiply`'s sgemm); the KV cache
//!   and encoder outputs are stored as bf16 (round to nearest even), so their byte counts
//!   are the spec's (`kv_bytes_per_token`, `encoder_output_bytes_per_token`). GELU is the
//!   tanh approximation.
//! - **Positions**: the LLM uses plain 1-D RoPE (θ = 10^6) over consecutive positions; the
//!   multimodal 3-D M-RoPE of Qwen2.5-VL is not modelled, nor the ViT's 2-D rotary
//!   embedding.
//! - No sampling (greedy argmax), no tensor parallelism, single-threaded per call (a
//!   serving worker is a thread).
//!
//! # Determinism
//! Every output is a pure function of (spec, seed, inputs). A row's result does not depend
//! on which other rows share its GEMMs (the sgemm kernel evaluates each output element the
//! same way whatever the matrix shape: edge tiles run the same kernel into a buffer), nor,
//! in attention, on how many keys past its own the GEMMs span: its scores are the same dot
//! products, its masked probabilities are exact zeros, and `P V` sums over keys in blocks
//! at fixed offsets from key 0 (`matrixmultiply`'s `kc` of 256), sequentially within a
//! block, so trailing zeros add nothing. So an image encodes to the same bytes alone or in
//! a batch and a sequence gets the same KV bytes and next token from one prefill, from
//! chunked prefill, or from prefill followed by decode, whatever its page ids (checked
//! across the 256-key block boundary in `tests/compute.rs`). The results do depend on the
//! sgemm kernel `matrixmultiply` selects for the CPU (FMA or not).

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod kv;
mod ops;

pub use cpu::CpuCompute;
#[cfg(feature = "cuda")]
pub use cuda::CudaCompute;
pub use kv::KvArena;

use moonagent_core::rng::mix64;
use moonagent_models::{ModelError, ModelSpec};

/// Why a [`Compute`] call (or constructing one) failed. Inputs never panic.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    /// The spec does not validate.
    #[error(transparent)]
    Spec(#[from] ModelError),
    /// The spec is valid but this backend cannot run it.
    #[error("model `{model}`: {reason}")]
    Unsupported {
        /// The spec's name.
        model: String,
        /// What is not supported.
        reason: String,
    },
    /// A page id outside the arena.
    #[error("page {page} is outside the arena's {pages} pages")]
    PageOutOfRange {
        /// The page id.
        page: u32,
        /// Pages in the arena.
        pages: u32,
    },
    /// A sequence longer than its page table covers.
    #[error(
        "a sequence of {tokens} tokens needs {need} pages of {page_tokens} tokens; \
         its page table has {have}"
    )]
    PageTableTooShort {
        /// Tokens the sequence will hold after the call.
        tokens: u64,
        /// Pages needed.
        need: u64,
        /// Tokens per page.
        page_tokens: u32,
        /// Pages in the page table.
        have: usize,
    },
    /// A page buffer of the wrong size.
    #[error("page buffer of {found} bytes; a page is {expected} bytes")]
    PageSize {
        /// Bytes of a page.
        expected: usize,
        /// Bytes given.
        found: usize,
    },
    /// `copy_pages` with source and destination lists of different lengths.
    #[error("copy_pages: {src} source pages but {dst} destination pages")]
    CopyLengths {
        /// Source pages.
        src: usize,
        /// Destination pages.
        dst: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// The token id.
        token: u32,
        /// Vocabulary size.
        vocab: u32,
    },
    /// An encoder output that is not a whole number of rows.
    #[error("encoder output of {bytes} bytes is not a whole number of {row_bytes}-byte rows")]
    EncoderOutputShape {
        /// Bytes given.
        bytes: usize,
        /// Bytes of one visual token.
        row_bytes: usize,
    },
    /// Rows asked of an encoder output beyond its end.
    #[error("rows {first}..{end} of an encoder output with {rows} rows")]
    ImageRows {
        /// First row asked.
        first: u64,
        /// One past the last row asked.
        end: u64,
        /// Rows in the output.
        rows: usize,
    },
    /// A prefill chunk with no new rows (it has no last position to predict from).
    #[error("prefill chunk {chunk} has no new rows")]
    EmptyChunk {
        /// Index of the chunk in the call.
        chunk: usize,
    },
    /// A KV arena whose page layout is not this model's.
    #[error("KV arena for {found} bytes/token, this model needs {expected}")]
    ArenaMismatch {
        /// The model's KV bytes per token.
        expected: u64,
        /// The arena's.
        found: u64,
    },
    /// A size that does not fit in memory arithmetic.
    #[error("{what} is too large")]
    TooLarge {
        /// What overflowed.
        what: &'static str,
    },
    /// No accelerator (or no driver) for a device backend.
    #[error("no GPU available: {0}")]
    NoDevice(String),
    /// A device backend's call failed (CUDA driver or cuBLAS error).
    #[error("device error: {0}")]
    Device(String),
}

/// One image to encode: its size in visual tokens and the seed of its (processed) pixels.
///
/// The pixels are `visual_tokens * patches_per_visual_token` patches of
/// `in_channels * temporal_patch_size * patch_size^2` values, uniform in [-1, 1), generated
/// from `seed` alone: two images with the same seed are the same image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageInput {
    /// Visual tokens (LLM rows) the image becomes.
    pub visual_tokens: u32,
    /// Content seed of the image's pixels.
    pub seed: u64,
}

/// A run of input rows of a prefill chunk, in position order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows<'a> {
    /// `count` text tokens whose ids are [`text_token`]`(seed, position, vocab)` at their
    /// absolute positions in the sequence.
    Text {
        /// Seed of the request's text.
        seed: u64,
        /// Tokens in the run.
        count: u32,
    },
    /// Explicit token ids (each below the vocabulary size).
    Tokens(&'a [u32]),
    /// Rows `first..first + count` of an image's encoder output (bf16 bytes, as
    /// [`Compute::encode`] returns them), used as the input embeddings of those positions.
    Image {
        /// The image's whole encoder output.
        encoder_output: &'a [u8],
        /// First row used.
        first: u32,
        /// Rows used.
        count: u32,
    },
}

impl Rows<'_> {
    /// Rows in the run.
    pub fn len(&self) -> u64 {
        match self {
            Rows::Text { count, .. } | Rows::Image { count, .. } => u64::from(*count),
            Rows::Tokens(ids) => ids.len() as u64,
        }
    }

    /// Whether the run has no rows.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The token id of a text position: `mix64(seed ^ mix64(position)) % vocab`.
pub fn text_token(seed: u64, position: u64, vocab: u32) -> u32 {
    (mix64(seed ^ mix64(position)) % u64::from(vocab.max(1))) as u32
}

/// One prefill chunk of one sequence: `inputs` are its new rows, at positions
/// `cached..cached + new`; the first `cached` positions are already in its KV pages.
#[derive(Debug, Clone, Copy)]
pub struct PrefillChunk<'a> {
    /// The sequence's page table (page ids into the arena, in position order); it must
    /// cover `cached + new` tokens.
    pub pages: &'a [u32],
    /// Tokens already in the KV pages.
    pub cached: u32,
    /// The new rows, in order.
    pub inputs: &'a [Rows<'a>],
}

/// One sequence of a decode iteration: `len` tokens are in its KV pages and `token` is the
/// input of position `len` (normally the token the previous step returned).
#[derive(Debug, Clone, Copy)]
pub struct DecodeSeq<'a> {
    /// The sequence's page table; it must cover `len + 1` tokens.
    pub pages: &'a [u32],
    /// Tokens already in the KV pages.
    pub len: u32,
    /// The input token of this step.
    pub token: u32,
}

/// KV pages a [`Compute`] reads and writes: a fixed number of fixed-size pages, addressed by
/// id. Page ids come from the core's block pool; the pages themselves never allocate.
pub trait KvPages {
    /// Pages in the arena.
    fn pages(&self) -> u32;
    /// Tokens per page.
    fn page_tokens(&self) -> u32;
    /// Bytes per page: `page_tokens * kv_bytes_per_token`.
    fn page_bytes(&self) -> usize;
    /// Copy page `page`'s bytes into `out` (exactly [`KvPages::page_bytes`] long).
    fn read_page(&self, page: u32, out: &mut [u8]) -> Result<(), ComputeError>;
    /// Overwrite page `page` with `bytes` (exactly [`KvPages::page_bytes`] long).
    fn write_page(&mut self, page: u32, bytes: &[u8]) -> Result<(), ComputeError>;
    /// A sequence's first `len` tokens of K/V through its page table, independent of its
    /// page ids (`len * kv_bytes_per_token` bytes): what a KV handoff moves.
    fn read_tokens(&self, table: &[u32], len: u32) -> Result<Vec<u8>, ComputeError>;
    /// The inverse of [`KvPages::read_tokens`]: write the K/V of the sequence's first
    /// `bytes.len() / kv_bytes_per_token` tokens into its pages.
    fn write_tokens(&mut self, table: &[u32], bytes: &[u8]) -> Result<(), ComputeError>;
    /// KV bytes per token of the layout.
    fn kv_bytes_per_token(&self) -> u64;
    /// At least `pages` pages: new pages are zeroed, existing ones keep their bytes; never
    /// shrinks.
    fn grow(&mut self, pages: u32) -> Result<(), ComputeError>;
}

/// The operators of EPD serving over a [`ModelSpec`]: what a worker's GPU does.
///
/// Object-safe once the KV type is fixed (`dyn Compute<Kv = KvArena>`); `Send + Sync` so
/// one instance (its weights) is shared by every worker thread, each with its own KV
/// pages. Every method validates its inputs and returns an error rather than panicking;
/// a failed call may have written some KV pages of the sequences it was given.
pub trait Compute: Send + Sync {
    /// Where this backend keeps KV pages (host memory for the CPU backend).
    type Kv: KvPages + Send;

    /// The model run.
    fn spec(&self) -> &ModelSpec;

    /// How many host cores the workers' steps share when every worker computes on this
    /// one instance (the CPU backend: its threads run on the host's cores), or `None`
    /// when each worker has a device of its own.
    fn shared_cores(&self) -> Option<f64> {
        None
    }

    /// Read every weight once (a load per cache line), in pieces, stopping early once `go`
    /// turns false; returns how many bytes it read. What [`crate::warm::WarmKeeper`] calls
    /// while the workers idle, so that the weights stay in the host's caches as a GPU's
    /// stay in its memory. `0`: nothing to keep warm (the default; a GPU's weights are in
    /// device memory).
    fn touch_weights(&self, _go: &dyn Fn() -> bool) -> u64 {
        0
    }

    /// An arena of `pages` pages of `page_tokens` tokens for this model.
    fn new_kv(&self, pages: u32, page_tokens: u32) -> Result<Self::Kv, ComputeError>;

    /// Encode a batch of images; one encoder output per image, in order, each exactly
    /// `visual_tokens * encoder_output_bytes_per_token` bytes of bf16.
    fn encode(&self, images: &[ImageInput]) -> Result<Vec<Vec<u8>>, ComputeError>;

    /// Prefill a batch of chunks, writing their new tokens' K/V into their pages; returns,
    /// per chunk, the argmax token of its last position's logits.
    fn prefill(
        &self,
        kv: &mut Self::Kv,
        chunks: &[PrefillChunk<'_>],
    ) -> Result<Vec<u32>, ComputeError>;

    /// One decode iteration: one token per sequence, its K/V appended at position `len`;
    /// returns the next token per sequence.
    fn decode(&self, kv: &mut Self::Kv, batch: &[DecodeSeq<'_>]) -> Result<Vec<u32>, ComputeError>;

    /// Copy page `src[i]` to page `dst[i]` for every `i` (copy-on-write of forked
    /// sequences), in order.
    fn copy_pages(&self, kv: &mut Self::Kv, src: &[u32], dst: &[u32]) -> Result<(), ComputeError>;
}

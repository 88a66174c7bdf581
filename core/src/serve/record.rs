//! One record per top-level request: the times the engine stamped and what it served.

use serde::{Deserialize, Serialize};

/// Sentinel for "did not happen" in per-request times.
pub const NONE: u64 = u64::MAX;

/// One top-level request of the trace (agent branches folded into it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Trace request id.
    pub id: u64,
    /// Session id.
    pub session: u64,
    /// Arrival, ns.
    pub arrival_ns: u64,
    /// First encode start of its images, ns (`NONE` if nothing was encoded).
    pub encode_start_ns: u64,
    /// Last encode end, ns (`NONE` if nothing was encoded).
    pub encode_end_ns: u64,
    /// Prefill start, ns.
    pub prefill_start_ns: u64,
    /// Prefill end, ns.
    pub prefill_end_ns: u64,
    /// First output token, ns (produced by the prefill's last chunk).
    pub first_token_ns: u64,
    /// Last token of the request and of all its branches, ns.
    pub finish_ns: u64,
    /// Output tokens produced (shared part plus every branch).
    pub output_tokens: u64,
    /// Output tokens on the critical path: the shared part plus the longest branch.
    pub path_tokens: u64,
    /// Images referenced (after in-request de-duplication, plus duplicates).
    pub images: u32,
    /// Images served from the embedding cache.
    pub images_hit: u32,
    /// Images encoded.
    pub images_encoded: u32,
    /// Images de-duplicated inside the request (encoded or loaded once for all copies).
    pub images_dedup: u32,
    /// Agent branches (0 when the request does not fork).
    pub branches: u32,
    /// Prompt tokens served from the store's prefix KV.
    pub prefix_hit_tokens: u64,
    /// Bytes moved encoder -> store.
    pub bytes_encoder_store: u64,
    /// Bytes moved store -> prefill (embeddings and prefix KV).
    pub bytes_store_prefill: u64,
    /// Bytes moved prefill -> decode (KV).
    pub bytes_prefill_decode: u64,
}

impl RequestRecord {
    /// Time to first token, ns.
    pub fn ttft_ns(&self) -> u64 {
        self.first_token_ns.saturating_sub(self.arrival_ns)
    }
    /// End to end, ns.
    pub fn e2e_ns(&self) -> u64 {
        self.finish_ns.saturating_sub(self.arrival_ns)
    }
    /// Time per output token after the first, along the critical path (shared part plus
    /// the longest branch; parallel branches do not shorten it), ns.
    pub fn tpot_ns(&self) -> u64 {
        if self.path_tokens <= 1 {
            0
        } else {
            self.finish_ns.saturating_sub(self.first_token_ns) / (self.path_tokens - 1)
        }
    }
}

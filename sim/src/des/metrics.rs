//! What a simulation run reports: one record per request, one per worker and a run
//! summary.

use serde::{Deserialize, Serialize};

use moonagent_core::serve::Role;
pub use moonagent_core::serve::{RequestRecord, NONE};

/// What one worker did over a run: the simulator's own account of the steps and transfers
/// it priced for that worker. Compute times are each step's priced duration on its own
/// device (with `shared_cores` a step's wall time is longer: its share of the cores).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WorkerRecord {
    /// Worker id (encoders, then prefills, then decodes; B0's GPUs in order).
    pub worker: u32,
    /// Its role.
    pub role: Role,
    /// Encoder batches run.
    pub encode_steps: u64,
    /// Their priced time.
    pub encode_ns: u64,
    /// Prefill batches (chunks of one or more prompts) run.
    pub prefill_steps: u64,
    /// Their priced time.
    pub prefill_ns: u64,
    /// Decode iterations run.
    pub decode_steps: u64,
    /// Their priced time, the recompute and tail-copy extras below included.
    pub decode_ns: u64,
    /// Sequences over all decode iterations (`/ decode_steps`: the mean batch).
    pub decode_seqs: u64,
    /// Preempted sequences re-admitted, each recomputing its context.
    pub recomputes: u64,
    /// The tokens they recomputed.
    pub recompute_tokens: u64,
    /// The recomputes' priced time (part of `decode_ns`).
    pub recompute_ns: u64,
    /// Bytes of fork tails copied.
    pub tail_copy_bytes: u64,
    /// The copies' priced time (part of `decode_ns`).
    pub tail_copy_ns: u64,
    /// Transfers on this worker's NIC (sent or received).
    pub nic_transfers: u64,
    /// Their bytes.
    pub nic_bytes: u64,
    /// The NIC's busy time (each transfer's priced duration).
    pub nic_ns: u64,
}

impl WorkerRecord {
    /// An idle worker.
    pub fn new(worker: u32, role: Role) -> Self {
        Self {
            worker,
            role,
            encode_steps: 0,
            encode_ns: 0,
            prefill_steps: 0,
            prefill_ns: 0,
            decode_steps: 0,
            decode_ns: 0,
            decode_seqs: 0,
            recomputes: 0,
            recompute_tokens: 0,
            recompute_ns: 0,
            tail_copy_bytes: 0,
            tail_copy_ns: 0,
            nic_transfers: 0,
            nic_bytes: 0,
            nic_ns: 0,
        }
    }
}

/// Per-worker records as a table (one row per worker, times in ns).
pub fn workers_table(ws: &[WorkerRecord]) -> crate::table::Table {
    use crate::table::{Column, Table};
    let u = |f: &dyn Fn(&WorkerRecord) -> u64| Column::U64(ws.iter().map(f).collect());
    Table::new()
        .with("worker", u(&|w| u64::from(w.worker)))
        .with(
            "role",
            Column::Str(ws.iter().map(|w| w.role.name().to_owned()).collect()),
        )
        .with("encode_steps", u(&|w| w.encode_steps))
        .with("encode_ns", u(&|w| w.encode_ns))
        .with("prefill_steps", u(&|w| w.prefill_steps))
        .with("prefill_ns", u(&|w| w.prefill_ns))
        .with("decode_steps", u(&|w| w.decode_steps))
        .with("decode_ns", u(&|w| w.decode_ns))
        .with("decode_seqs", u(&|w| w.decode_seqs))
        .with("recomputes", u(&|w| w.recomputes))
        .with("recompute_tokens", u(&|w| w.recompute_tokens))
        .with("recompute_ns", u(&|w| w.recompute_ns))
        .with("tail_copy_bytes", u(&|w| w.tail_copy_bytes))
        .with("tail_copy_ns", u(&|w| w.tail_copy_ns))
        .with("nic_transfers", u(&|w| w.nic_transfers))
        .with("nic_bytes", u(&|w| w.nic_bytes))
        .with("nic_ns", u(&|w| w.nic_ns))
}

/// P50 / P95 / P99 and mean of a sample, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

impl Percentiles {
    /// Nearest-rank percentiles of `ns` values, reported in ms.
    pub fn of_ns(mut v: Vec<u64>) -> Self {
        if v.is_empty() {
            return Self::default();
        }
        v.sort_unstable();
        let at = |q: f64| {
            let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
            v[rank - 1] as f64 / 1e6
        };
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64 / 1e6;
        Self {
            mean,
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
        }
    }
}

/// Run-level results. Deterministic: a function of config, trace and seed only.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Mode name.
    pub mode: String,
    /// Requests injected (top-level).
    pub injected: u64,
    /// Requests completed.
    pub completed: u64,
    /// Requests waiting for a resource at the end.
    pub queued: u64,
    /// Requests in service at the end.
    pub running: u64,
    /// Requests dropped (never admitted).
    pub dropped: u64,
    /// Virtual time of the last completion, ns.
    pub makespan_ns: u64,
    /// Completed requests per second of makespan.
    pub throughput_rps: f64,
    /// Output tokens per second of makespan.
    pub token_throughput: f64,
    /// Completed requests meeting both SLOs, per second of makespan.
    pub goodput_rps: f64,
    /// TTFT, ms.
    pub ttft_ms: Percentiles,
    /// TPOT, ms.
    pub tpot_ms: Percentiles,
    /// End to end, ms.
    pub e2e_ms: Percentiles,
    /// Encoder GPU time spent, s.
    pub encoder_gpu_s: f64,
    /// Encoder GPU time the cache saved (what hits would have cost to encode), s.
    pub encoder_gpu_s_saved: f64,
    /// Image references served by the embedding cache / all image references.
    pub image_hit_rate: f64,
    /// Images encoded.
    pub images_encoded: u64,
    /// Images served by the cache.
    pub images_hit: u64,
    /// Images de-duplicated within requests.
    pub images_dedup: u64,
    /// Embedding-cache readbacks (cache as transport), counted apart from hits.
    pub cache_readbacks: u64,
    /// Prefix-KV block hit rate in the store.
    pub kv_block_hit_rate: f64,
    /// Forks executed on decode workers.
    pub forks: u64,
    /// Prefill tokens avoided by forking instead of re-prefilling each branch.
    pub fork_prefill_tokens_avoided: u64,
    /// KV pages shared by forks instead of copied.
    pub fork_pages_shared: u64,
    /// Tail-page bytes copied by forks and copy-on-write.
    pub fork_copy_bytes: u64,
    /// Decode preemptions (KV pool full).
    pub preemptions: u64,
    /// Events processed.
    pub events: u64,
    /// Events by kind: arrival, dispatch, worker step done, image stored, images loaded,
    /// KV arrived at decode.
    pub events_by_kind: [u64; 6],
    /// KV pages still held on decode workers at the end (0 when every request finished).
    pub kv_pages_in_use: u64,
    /// Bytes over each link kind: encoder->store, store->prefill, prefill->decode.
    pub link_bytes: [u64; 3],
}

impl Summary {
    /// What every driver of the engine reports the same way (the simulator in virtual
    /// time, the real backend in wall time): completions, makespan, throughput, latency
    /// percentiles, goodput under `slo`, hit rates and the engine's counters, from the
    /// per-request records of the requests that arrived (`done[i]`: request `i` finished)
    /// and counters. `injected` counts those records; a driver that stopped before every
    /// request arrived sets `injected` and `dropped` itself. Driver-specific fields
    /// (events, encoder GPU time, pages in use) are left at zero.
    pub fn of_run(
        mode: super::Mode,
        slo: &super::config::Slo,
        recs: &[RequestRecord],
        done: &[bool],
        c: &moonagent_core::serve::Counters,
        cache_readbacks: u64,
    ) -> Self {
        let mut s = Summary {
            mode: mode.name().into(),
            injected: recs.len() as u64,
            images_encoded: c.images_encoded,
            images_hit: c.images_hit,
            images_dedup: c.images_dedup,
            forks: c.forks,
            fork_prefill_tokens_avoided: c.fork_prefill_tokens_avoided,
            fork_pages_shared: c.fork_pages_shared,
            fork_copy_bytes: c.fork_copy_bytes,
            preemptions: c.preemptions,
            link_bytes: c.link_bytes,
            cache_readbacks,
            ..Summary::default()
        };
        let (mut ttft, mut tpot, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
        let (mut good, mut tokens) = (0u64, 0u64);
        for (r, &fin) in recs.iter().zip(done) {
            if fin {
                s.completed += 1;
                s.makespan_ns = s.makespan_ns.max(r.finish_ns);
                ttft.push(r.ttft_ns());
                tpot.push(r.tpot_ns());
                e2e.push(r.e2e_ns());
                tokens += r.output_tokens;
                if (r.ttft_ns() as f64) <= slo.ttft_ms * 1e6
                    && (r.tpot_ns() as f64) <= slo.tpot_ms * 1e6
                {
                    good += 1;
                }
            } else if r.first_token_ns != NONE {
                s.running += 1;
            } else {
                s.queued += 1;
            }
        }
        let span = s.makespan_ns.max(1) as f64 / 1e9;
        s.throughput_rps = s.completed as f64 / span;
        s.token_throughput = tokens as f64 / span;
        s.goodput_rps = good as f64 / span;
        s.ttft_ms = Percentiles::of_ns(ttft);
        s.tpot_ms = Percentiles::of_ns(tpot);
        s.e2e_ms = Percentiles::of_ns(e2e);
        s.image_hit_rate = if c.image_refs == 0 {
            0.0
        } else {
            s.images_hit as f64 / c.image_refs as f64
        };
        s.kv_block_hit_rate = if c.kv_lookups == 0 {
            0.0
        } else {
            c.kv_hits as f64 / c.kv_lookups as f64
        };
        s
    }
}

/// Per-request records as a table (one row per top-level request, times in ns).
pub fn records_table(recs: &[RequestRecord]) -> crate::table::Table {
    use crate::table::{Column, Table};
    let u = |f: &dyn Fn(&RequestRecord) -> u64| Column::U64(recs.iter().map(f).collect());
    Table::new()
        .with("id", u(&|r| r.id))
        .with("session", u(&|r| r.session))
        .with("arrival_ns", u(&|r| r.arrival_ns))
        .with("encode_start_ns", u(&|r| r.encode_start_ns))
        .with("encode_end_ns", u(&|r| r.encode_end_ns))
        .with("prefill_start_ns", u(&|r| r.prefill_start_ns))
        .with("prefill_end_ns", u(&|r| r.prefill_end_ns))
        .with("first_token_ns", u(&|r| r.first_token_ns))
        .with("finish_ns", u(&|r| r.finish_ns))
        .with(
            "ttft_ns",
            u(&|r| {
                if r.first_token_ns == NONE {
                    NONE
                } else {
                    r.ttft_ns()
                }
            }),
        )
        .with(
            "tpot_ns",
            u(&|r| {
                if r.finish_ns == NONE {
                    NONE
                } else {
                    r.tpot_ns()
                }
            }),
        )
        .with(
            "e2e_ns",
            u(&|r| {
                if r.finish_ns == NONE {
                    NONE
                } else {
                    r.e2e_ns()
                }
            }),
        )
        .with("output_tokens", u(&|r| r.output_tokens))
        .with("path_tokens", u(&|r| r.path_tokens))
        .with("images", u(&|r| u64::from(r.images)))
        .with("images_hit", u(&|r| u64::from(r.images_hit)))
        .with("images_encoded", u(&|r| u64::from(r.images_encoded)))
        .with("images_dedup", u(&|r| u64::from(r.images_dedup)))
        .with("branches", u(&|r| u64::from(r.branches)))
        .with("prefix_hit_tokens", u(&|r| r.prefix_hit_tokens))
        .with("bytes_encoder_store", u(&|r| r.bytes_encoder_store))
        .with("bytes_store_prefill", u(&|r| r.bytes_store_prefill))
        .with("bytes_prefill_decode", u(&|r| r.bytes_prefill_decode))
}

//! A toy driver of the [`Engine`]: durations from a closure, completions in (time,
//! issue order), every input and action logged. For tests (property tests, the real-store
//! cross-check) and for replaying a recorded input log ([`replay_inputs`]): the engine is
//! a function of its inputs, so the same input log gives the same action log.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use super::{Action, Done, Engine, RequestView, ServeError};
use crate::store::Store;

/// One input of the engine, as logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Input {
    /// Request `i` of the trace arrived.
    Arrive(usize),
    /// A unit of work finished.
    Complete(Done),
}

/// What a toy run saw, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Log {
    /// Inputs with their times.
    pub inputs: Vec<(u64, Input)>,
    /// Actions with the time they were decided.
    pub actions: Vec<(u64, Action)>,
}

/// What a hook sees.
pub enum Seen<'e, 'a, S: Store, R: RequestView> {
    /// An input, before the engine takes it.
    Input(u64, &'e Input),
    /// An action, as the driver takes it.
    Action(u64, &'e Action),
    /// The engine after an input and all its actions.
    After(&'e Engine<'a, S, R>),
}

/// Run `engine` over its trace: request `i` arrives at `arrivals[i]`, each action with a
/// completion finishes `duration(now, action)` later (ties in issue order); `hook` sees
/// every input, action and state and may stop the run with an error message.
pub fn drive<'a, S: Store, R: RequestView>(
    engine: &mut Engine<'a, S, R>,
    arrivals: &[u64],
    mut duration: impl FnMut(u64, &Action) -> u64,
    mut hook: impl FnMut(Seen<'_, 'a, S, R>) -> Result<(), String>,
) -> Result<Log, DriveError> {
    let mut log = Log::default();
    let mut q: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::new();
    let mut pending: Vec<Done> = Vec::new();
    let mut next = 0usize;
    loop {
        let arrival = arrivals.get(next).copied();
        let event = q.peek().map(|Reverse((t, _, _))| *t);
        let (now, input) = match (arrival, event) {
            (Some(a), Some(t)) if a < t => (a, Input::Arrive(next)),
            (Some(a), None) => (a, Input::Arrive(next)),
            (_, Some(_)) => {
                let Some(Reverse((t, _, slot))) = q.pop() else {
                    break;
                };
                (t, Input::Complete(pending[slot]))
            }
            (None, None) => break,
        };
        hook(Seen::Input(now, &input)).map_err(DriveError::Check)?;
        match input {
            Input::Arrive(i) => {
                engine.arrive(now, i)?;
                next += 1;
            }
            Input::Complete(d) => engine.complete(now, d)?,
        }
        log.inputs.push((now, input));
        while let Some(a) = engine.poll_action() {
            hook(Seen::Action(now, &a)).map_err(DriveError::Check)?;
            let done = match &a {
                Action::Fingerprint { job, .. } => Some(Done::Fingerprinted(*job)),
                Action::Encode { worker, .. }
                | Action::Prefill { worker, .. }
                | Action::Decode { worker, .. } => Some(Done::Step(*worker)),
                Action::Transfer { done, .. } => *done,
                Action::Load { job, .. } => Some(Done::Loaded(*job)),
                Action::EncodeAvoided { .. } | Action::PutBlocks { .. } => None,
            };
            if let Some(d) = done {
                let seq = pending.len();
                pending.push(d);
                q.push(Reverse((now + duration(now, &a), seq as u64, seq)));
            }
            log.actions.push((now, a));
        }
        hook(Seen::After(engine)).map_err(DriveError::Check)?;
    }
    Ok(log)
}

/// Feed a recorded input log to a fresh engine and return the actions it decides, with
/// their times: no driver, no durations.
pub fn replay_inputs<S: Store, R: RequestView>(
    engine: &mut Engine<'_, S, R>,
    inputs: &[(u64, Input)],
) -> Result<Vec<(u64, Action)>, ServeError> {
    let mut out = Vec::new();
    for &(now, input) in inputs {
        match input {
            Input::Arrive(i) => engine.arrive(now, i)?,
            Input::Complete(d) => engine.complete(now, d)?,
        }
        while let Some(a) = engine.poll_action() {
            out.push((now, a));
        }
    }
    Ok(out)
}

/// Why a toy run stopped.
#[derive(Debug, thiserror::Error)]
pub enum DriveError {
    /// The engine refused an input.
    #[error(transparent)]
    Engine(#[from] ServeError),
    /// A hook's check failed.
    #[error("check failed: {0}")]
    Check(String),
}

/// A small request for toy runs (see [`toy_trace`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToyRequest {
    /// Id (also its index).
    pub id: u64,
    /// Prompt tokens.
    pub prompt: u32,
    /// Output tokens before the fork.
    pub output: u32,
    /// Prefix block ids.
    pub blocks: Vec<u64>,
    /// `(content id, visual tokens)` of each image.
    pub images: Vec<(u64, u32)>,
    /// Output tokens of each branch (empty: no fork).
    pub branches: Vec<u32>,
}

impl RequestView for ToyRequest {
    fn id(&self) -> u64 {
        self.id
    }
    fn session(&self) -> u64 {
        self.id / 3
    }
    fn tenant(&self) -> u32 {
        (self.id % 2) as u32
    }
    fn prompt_tokens(&self) -> u32 {
        self.prompt
    }
    fn output_tokens(&self) -> u32 {
        self.output
    }
    fn prompt_blocks(&self) -> &[u64] {
        &self.blocks
    }
    fn image_count(&self) -> usize {
        self.images.len()
    }
    fn image(&self, i: usize) -> (u64, u32, Option<[u32; 3]>) {
        (self.images[i].0, self.images[i].1, None)
    }
    fn branch_output_tokens(&self) -> &[u32] {
        &self.branches
    }
}

/// `n` random requests that exercise every path: prompts of 1-300 tokens whose prefix
/// blocks (`block_tokens` each) share leading runs across four families, 0-3 images from
/// a pool of six (the same content always has the same visual tokens), two tenants, and
/// a fork into 1-3 branches for a third of them.
pub fn toy_trace(seed: u64, n: usize, block_tokens: u32) -> Vec<ToyRequest> {
    let mut r = crate::rng::Rng::stream(seed, "serve-prop-trace");
    (0..n)
        .map(|i| {
            let prompt = 1 + r.below(300) as u32;
            let nblocks = u64::from(prompt.div_ceil(block_tokens.max(1)));
            let family = r.below(4);
            let blocks = (0..nblocks)
                .map(|b| {
                    if r.below(4) == 0 {
                        1000 + i as u64 * 64 + b
                    } else {
                        family * 100 + b
                    }
                })
                .collect();
            let images = (0..r.below(4))
                .map(|_| {
                    let content = r.below(6);
                    (content, 1 + (content * 13 % 80) as u32)
                })
                .collect();
            let branches = if r.below(3) == 0 {
                (0..1 + r.below(3)).map(|_| r.below(20) as u32).collect()
            } else {
                Vec::new()
            };
            ToyRequest {
                id: i as u64,
                prompt,
                output: r.below(30) as u32,
                blocks,
                images,
                branches,
            }
        })
        .collect()
}

/// Toy prices: linear in tokens and bytes (encode 10 ns, prefill 5 ns per new token plus
/// 0.01 ns per new x cached token, decode 2 us plus 1 ns per sequence and per 100 context
/// tokens, 1 ns per byte moved).
#[derive(Debug, Clone, Copy, Default)]
pub struct ToyPricing;

impl super::Pricing for ToyPricing {
    fn encode_ns(&self, tokens: &[u32]) -> u64 {
        tokens.iter().map(|&t| 10 * u64::from(t)).sum()
    }
    fn prefill_ns(&self, chunks: &[(u32, u32)]) -> u64 {
        chunks
            .iter()
            .map(|&(n, c)| 5 * u64::from(n) + u64::from(n) * u64::from(c) / 100)
            .sum()
    }
    fn decode_ns(&self, batch: u32, ctx_sum: u64) -> u64 {
        2_000 + u64::from(batch) + ctx_sum / 100
    }
    fn transfer_ns(&self, _flow: super::Flow, bytes: u64) -> u64 {
        bytes
    }
}

/// A small cluster for toy runs: one worker per role (B0: one colocated), tiny budgets,
/// 8-token pages (256 of them), 16-token prefix blocks and byte sizes small enough that
/// a real store holds a whole run.
pub fn toy_config(mode: super::Mode, payloads: super::Payloads) -> super::EngineConfig {
    super::EngineConfig {
        mode,
        encoders: 1,
        prefills: 1,
        decodes: 1,
        colocated: 1,
        encoder_max_batch_tokens: 128,
        prefill_chunk_tokens: 96,
        decode_max_batch: 8,
        kv_block_tokens: 8,
        kv_pages: 256,
        prefix_block_tokens: 16,
        kv_prefix_store: true,
        kv_bytes_per_token: 16,
        encoder_bytes_per_token: 8,
        pixel_bytes_per_token: 12,
        hidden: 4,
        payloads,
        kv_tables: false,
    }
}

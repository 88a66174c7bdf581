//! Per-branch decode state and how it is cloned when a request forks.
//!
//! A fork shares KV pages but never shares mutable decode state: each branch gets its
//! own token ids, sampler (with a seed salted by branch index), grammar matcher, finish
//! flags, logprobs, positions (M-RoPE included) and multimodal anchors, through
//! [`CloneForFork`]. A state that cannot be cloned (a live grammar matcher with no
//! snapshot) says so, and admission rejects the fork instead of sharing it.
//!
//! Seed salting: branch `i` of a parent with seed `s` samples with
//! `mix64(s ^ mix64(i + 1))` ([`branch_seed`]). `mix64` is a bijection, so distinct
//! branches of one parent get distinct seeds, and the result depends only on `(s, i)`,
//! which is what lets an independent prefill reproduce a branch exactly. Branch 0 is
//! salted too (it does not keep the parent's seed): every branch is then a function of
//! its index alone, and no branch continues the parent's random stream, so a one-way
//! fork still draws fresh randomness rather than silently replaying the parent's.

use crate::rng::{mix64, Rng};
use serde::{Deserialize, Serialize};

/// The seed branch `branch` samples with after forking a parent seeded `parent_seed`.
#[inline]
pub fn branch_seed(parent_seed: u64, branch: u32) -> u64 {
    mix64(parent_seed ^ mix64(u64::from(branch) + 1))
}

/// A piece of per-branch state that cannot be cloned for a fork.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[error("state field `{field}` cannot be cloned for a fork")]
pub struct NotCloneable {
    /// Which field refused.
    pub field: &'static str,
}

/// Per-branch state that can be copied into a new branch of a fork.
pub trait CloneForFork: Sized {
    /// The state branch `branch` starts from, or which field cannot be cloned.
    fn clone_for_fork(&self, branch: u32) -> Result<Self, NotCloneable>;

    /// Bytes one clone copies (inline plus owned heap), for [`super::ForkCost`].
    fn fork_bytes(&self) -> u64;
}

/// Sampling parameters and the position in the branch's random stream.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Seed of this branch's random stream.
    pub seed: u64,
    /// Softmax temperature (0 = greedy).
    pub temperature: f32,
    /// Nucleus threshold.
    pub top_p: f32,
    /// Top-k cut (0 = off).
    pub top_k: u32,
    /// Random draws taken so far from the stream seeded by `seed`.
    pub draws: u64,
}

impl SamplerState {
    /// Temperature 1, no top-p or top-k cut, the given seed, no draws yet.
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            draws: 0,
        }
    }

    /// The sampler of branch `branch`: same parameters, salted seed, fresh stream.
    pub fn for_branch(&self, branch: u32) -> Self {
        Self {
            seed: branch_seed(self.seed, branch),
            draws: 0,
            ..*self
        }
    }

    /// The random stream at its current position.
    pub fn rng(&self) -> Rng {
        let mut r = Rng::new(self.seed);
        for _ in 0..self.draws {
            r.next_u64();
        }
        r
    }
}

/// Constrained-decoding state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GrammarState {
    /// Unconstrained.
    None,
    /// A matcher whose state is a byte snapshot (stack of automaton states): copyable.
    Snapshot(Vec<u8>),
    /// A live matcher in a backend that offers no fork or snapshot: cannot be cloned.
    Live {
        /// Backend name, for the rejection message.
        backend: String,
    },
}

/// Why a branch stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FinishReason {
    /// A stop token or string.
    Stop,
    /// `max_new_tokens` reached.
    Length,
    /// Aborted by the client or the scheduler.
    Abort,
}

/// Finish flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct FinishState {
    /// Set once the branch has stopped.
    pub finished: bool,
    /// Why, once finished.
    pub reason: Option<FinishReason>,
    /// Tokens generated so far (counts against `max_new_tokens`).
    pub generated: u32,
}

/// Multimodal rotary positions (Qwen2-VL M-RoPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MRope {
    /// `rope_deltas`: text position ids after the images are `index + delta`.
    pub delta: i64,
    /// (t, h, w) position ids of the last token; a text token advances all three by one.
    pub last_thw: [i64; 3],
}

/// Position state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Positions {
    /// Position id of the next token (1-D RoPE).
    pub next: u64,
    /// M-RoPE state for vision-language models.
    pub mrope: Option<MRope>,
}

/// Where an image's embeddings sit in the token stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MmAnchor {
    /// Token offset of the first image token.
    pub offset: u64,
    /// Number of image tokens.
    pub len: u32,
    /// Content fingerprint of the processed image.
    pub fingerprint: [u8; 16],
}

/// Everything a decoding branch owns besides its KV pages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BranchState {
    /// Prompt and generated token ids.
    pub tokens: Vec<u32>,
    /// Sampler.
    pub sampler: SamplerState,
    /// Grammar.
    pub grammar: GrammarState,
    /// Finish flags.
    pub finish: FinishState,
    /// Logprob of each generated token.
    pub logprobs: Vec<f32>,
    /// Positions, M-RoPE included.
    pub positions: Positions,
    /// Multimodal anchors.
    pub anchors: Vec<MmAnchor>,
}

impl BranchState {
    /// A fresh state for a prompt, unconstrained, with 1-D positions after the prompt.
    pub fn new(tokens: Vec<u32>, seed: u64) -> Self {
        let next = tokens.len() as u64;
        Self {
            tokens,
            sampler: SamplerState::seeded(seed),
            grammar: GrammarState::None,
            finish: FinishState::default(),
            logprobs: Vec::new(),
            positions: Positions { next, mrope: None },
            anchors: Vec::new(),
        }
    }
}

impl CloneForFork for BranchState {
    fn clone_for_fork(&self, branch: u32) -> Result<Self, NotCloneable> {
        let grammar = match &self.grammar {
            GrammarState::Live { .. } => return Err(NotCloneable { field: "grammar" }),
            g => g.clone(),
        };
        Ok(Self {
            tokens: self.tokens.clone(),
            sampler: self.sampler.for_branch(branch),
            grammar,
            finish: self.finish,
            logprobs: self.logprobs.clone(),
            positions: self.positions,
            anchors: self.anchors.clone(),
        })
    }

    fn fork_bytes(&self) -> u64 {
        let grammar = match &self.grammar {
            GrammarState::Snapshot(b) => b.len(),
            _ => 0,
        };
        (std::mem::size_of::<Self>()
            + self.tokens.len() * std::mem::size_of::<u32>()
            + self.logprobs.len() * std::mem::size_of::<f32>()
            + grammar
            + self.anchors.len() * std::mem::size_of::<MmAnchor>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rich_state() -> BranchState {
        let mut s = BranchState::new(vec![1, 2, 3, 4], 99);
        s.grammar = GrammarState::Snapshot(vec![7, 8, 9]);
        s.logprobs = vec![-0.5, -1.25];
        s.finish.generated = 2;
        // Two tokens generated: the parent's stream is two draws in, a branch's is fresh.
        s.sampler.draws = 2;
        s.positions.mrope = Some(MRope {
            delta: -12,
            last_thw: [40, 41, 42],
        });
        s.anchors = vec![MmAnchor {
            offset: 1,
            len: 2,
            fingerprint: [0xab; 16],
        }];
        s
    }

    #[test]
    fn branch_seeds_are_deterministic_distinct_and_salted() {
        let seeds: Vec<u64> = (0..64).map(|i| branch_seed(1234, i)).collect();
        let again: Vec<u64> = (0..64).map(|i| branch_seed(1234, i)).collect();
        assert_eq!(seeds, again);
        let mut uniq = seeds.clone();
        uniq.sort_unstable();
        uniq.dedup();
        assert_eq!(uniq.len(), seeds.len());
        assert!(!seeds.contains(&1234), "no branch keeps the parent's seed");
        assert_ne!(branch_seed(1234, 0), branch_seed(1235, 0));
    }

    #[test]
    fn clone_for_fork_copies_every_field_but_the_seed() {
        let s = rich_state();
        let c = s.clone_for_fork(3).expect("cloneable");
        assert_eq!(c.tokens, s.tokens);
        assert_eq!(c.grammar, s.grammar);
        assert_eq!(c.finish, s.finish);
        assert_eq!(c.logprobs, s.logprobs);
        assert_eq!(c.positions, s.positions);
        assert_eq!(c.anchors, s.anchors);
        assert_eq!(c.sampler.seed, branch_seed(99, 3));
        assert_eq!(c.sampler.draws, 0);
        assert_eq!(c.sampler.temperature, s.sampler.temperature);
    }

    #[test]
    fn live_grammar_is_not_cloneable() {
        let mut s = rich_state();
        s.grammar = GrammarState::Live {
            backend: "xgrammar".into(),
        };
        assert_eq!(s.clone_for_fork(0), Err(NotCloneable { field: "grammar" }));
    }

    #[test]
    fn fork_bytes_counts_owned_heap() {
        let s = rich_state();
        let base = std::mem::size_of::<BranchState>() as u64;
        assert_eq!(
            s.fork_bytes(),
            base + 4 * 4 + 2 * 4 + 3 + std::mem::size_of::<MmAnchor>() as u64
        );
    }

    #[test]
    fn sampler_rng_resumes_at_its_draw_count() {
        let mut s = SamplerState::seeded(5);
        let mut r = s.rng();
        r.next_u64();
        let expect = r.next_u64();
        s.draws = 1;
        assert_eq!(s.rng().next_u64(), expect);
    }
}

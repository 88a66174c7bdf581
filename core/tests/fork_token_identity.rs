//! Token identity: every branch of a fork decodes exactly the tokens an independently
//! prefilled sequence with the same (salted) seed decodes.
//!
//! The "model" is [`toy_next_token`]: the next token is a hash of the visible tokens and
//! the branch's sampler seed. Visible tokens are read from a toy KV memory through the
//! branch's block table, so a wrong share, a missing tail copy or a write into a page
//! another branch holds changes a token and fails the test. Forked branches and their
//! independent twins decode interleaved in one pool, in an order that changes every step,
//! and some roll back into the shared prefix (truncate) to force copy-on-write.

#![cfg(not(loom))]

use moonagent_core::fork::{
    branch_seed, fork_request, toy_next_token, AdmissionInput, BlockPool, BranchState,
    GrammarState, MRope, MmAnchor, PoolConfig, SeqId, TailPolicy, ToyKv,
};
use moonagent_core::rng::Rng;
use proptest::prelude::*;

const VOCAB: u32 = 151_936;

struct Seq {
    id: SeqId,
    state: BranchState,
}

fn prefill(pool: &BlockPool, kv: &mut ToyKv, prompt: &[u32]) -> SeqId {
    let id = pool.allocate(prompt.len() as u64).expect("capacity");
    let table = pool.table(id).expect("live");
    for (pos, &t) in prompt.iter().enumerate() {
        assert!(kv.write(&table, pos as u64, t));
    }
    id
}

fn decode_step(pool: &BlockPool, kv: &mut ToyKv, s: &mut Seq) {
    let len = pool.seq_len(s.id).expect("live");
    let visible = kv
        .read(&pool.table(s.id).expect("live"), len)
        .expect("covered");
    assert_eq!(visible, s.state.tokens, "KV and branch state disagree");
    let next = toy_next_token(&visible, s.state.sampler.seed, VOCAB);
    let out = pool.append(s.id, 1).expect("capacity");
    if let Some(c) = out.cow {
        assert!(kv.apply(&c));
    }
    let table = pool.table(s.id).expect("live");
    assert_eq!(
        pool.refcount(table[table.len() - 1]).expect("lock"),
        Some(1)
    );
    assert!(kv.write(&table, len, next));
    s.state.tokens.push(next);
    s.state.logprobs.push(-((next % 97) as f32) / 10.0);
    s.state.finish.generated += 1;
    s.state.positions.next += 1;
}

fn rollback(pool: &BlockPool, s: &mut Seq, to: usize) {
    pool.truncate(s.id, to as u64).expect("shorter");
    s.state.tokens.truncate(to);
}

fn parent_state(prompt: Vec<u32>, seed: u64) -> BranchState {
    let mut s = BranchState::new(prompt, seed);
    s.grammar = GrammarState::Snapshot(vec![1, 2, 3]);
    s.positions.mrope = Some(MRope {
        delta: -5,
        last_thw: [3, 9, 9],
    });
    s.anchors.push(MmAnchor {
        offset: 0,
        len: 2,
        fingerprint: [7; 16],
    });
    s
}

/// Returns each forked branch's tokens and its independent twin's.
fn run(
    block: u32,
    tail: TailPolicy,
    prefix: usize,
    n: u32,
    steps: usize,
    seed: u64,
) -> Vec<(Vec<u32>, Vec<u32>)> {
    let cap = 4 * (n + 1) * ((prefix as u32 + steps as u32) / block + 2);
    let cfg = PoolConfig::new(cap, block, 1).with_tail(tail);
    let pool = BlockPool::new(cfg).expect("config");
    let mut kv = ToyKv::new(&cfg);
    let mut rng = Rng::stream(seed, "prompt");
    let prompt: Vec<u32> = (0..prefix)
        .map(|_| rng.below(u64::from(VOCAB)) as u32)
        .collect();

    let parent = prefill(&pool, &mut kv, &prompt);
    let state = parent_state(prompt.clone(), seed);
    let forked =
        fork_request(&pool, parent, &state, n, AdmissionInput::default()).expect("admitted");
    for c in &forked.copies {
        assert!(kv.apply(c));
    }
    let mut branches: Vec<Seq> = forked
        .branches
        .into_iter()
        .map(|b| Seq {
            id: b.seq,
            state: b.state,
        })
        .collect();
    // Independent prefill of each branch with the branch's salted seed.
    let mut twins: Vec<Seq> = (0..n)
        .map(|i| Seq {
            id: prefill(&pool, &mut kv, &prompt),
            state: parent_state(prompt.clone(), branch_seed(seed, i)),
        })
        .collect();

    let mut order = Rng::stream(seed, "order");
    for step in 0..steps {
        // Odd branches roll back into the shared prefix once, twins alike.
        if step == steps / 2 {
            let to = prefix.saturating_sub(block as usize / 2 + 1);
            for i in (1..n as usize).step_by(2) {
                rollback(&pool, &mut branches[i], to);
                rollback(&pool, &mut twins[i], to);
            }
        }
        let mut all: Vec<&mut Seq> = branches.iter_mut().chain(twins.iter_mut()).collect();
        // Fisher-Yates with the test's own stream: a new interleaving every step.
        for i in (1..all.len()).rev() {
            all.swap(i, order.below(i as u64 + 1) as usize);
        }
        for s in all {
            decode_step(&pool, &mut kv, s);
        }
    }
    let out = branches
        .iter()
        .zip(&twins)
        .map(|(b, t)| (b.state.tokens.clone(), t.state.tokens.clone()))
        .collect();
    for s in branches.iter().chain(&twins) {
        pool.release(s.id).expect("live");
    }
    let stats = pool.stats().expect("lock");
    assert_eq!(stats.free, stats.capacity, "leak");
    out
}

#[test]
fn forked_branches_decode_the_same_tokens_as_independent_prefill() {
    for tail in [TailPolicy::CopyAtFork, TailPolicy::CopyOnWrite] {
        for prefix in [0usize, 1, 15, 16, 17, 32, 45] {
            for n in [1u32, 2, 3, 8] {
                let pairs = run(16, tail, prefix, n, 24, 0xC0FFEE + prefix as u64);
                for (i, (forked, twin)) in pairs.iter().enumerate() {
                    assert_eq!(forked, twin, "{tail:?} prefix {prefix} n {n} branch {i}");
                }
                if n > 1 {
                    assert_ne!(pairs[0].0, pairs[1].0, "salted seeds must diverge");
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn token_identity_holds_for_random_shapes(
        block in 1u32..=8,
        tail in prop_oneof![Just(TailPolicy::CopyAtFork), Just(TailPolicy::CopyOnWrite)],
        prefix in 0usize..=40,
        n in 1u32..=6,
        steps in 1usize..=16,
        seed in any::<u64>(),
    ) {
        for (forked, twin) in run(block, tail, prefix, n, steps, seed) {
            prop_assert_eq!(forked, twin);
        }
    }
}

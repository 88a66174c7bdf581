//! Unit tests of the block pool: vLLM's block-table behaviours, copy-on-write, admission,
//! idempotent release, exhaustion and costs. Each test is named after what it holds.

use super::*;

const BS: u32 = 4;

fn pool(cap: u32, tail: TailPolicy) -> BlockPool {
    BlockPool::new(PoolConfig::new(cap, BS, 10).with_tail(tail)).expect("valid config")
}

fn free(p: &BlockPool) -> u32 {
    p.stats().expect("lock").free
}

fn check(p: &BlockPool) {
    p.snapshot()
        .expect("lock")
        .check(p.config())
        .expect("invariants");
}

// ---- vLLM's block-table behaviours -------------------------------------------------

#[test]
fn page_aligned_fork_leaves_free_blocks_unchanged() {
    for tail in [TailPolicy::CopyAtFork, TailPolicy::CopyOnWrite] {
        let p = pool(16, tail);
        let parent = p.allocate(2 * u64::from(BS)).unwrap();
        let before = free(&p);
        let out = p.fork(parent, 4).unwrap();
        assert_eq!(free(&p), before, "{tail:?}");
        assert!(out.copies.is_empty());
        let t0 = p.table(parent).unwrap();
        for b in &out.branches {
            assert_eq!(
                p.table(*b).unwrap(),
                t0,
                "branches share the parent's block ids"
            );
        }
        for b in t0 {
            assert_eq!(p.refcount(b).unwrap(), Some(4));
        }
        check(&p);
    }
}

#[test]
fn freeing_the_original_leaves_the_pool_not_full() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(2 * u64::from(BS)).unwrap();
    let out = p.fork(parent, 3).unwrap();
    assert_eq!(out.branches[0], parent);
    assert_eq!(
        p.release(parent).unwrap(),
        Release::Released {
            pages_dropped: 2,
            pages_freed: 0
        }
    );
    assert!(free(&p) < 16, "branches still hold the prefix");
    assert_eq!(free(&p), 14);
    check(&p);
}

#[test]
fn pool_is_full_again_only_after_every_branch_is_freed() {
    for tail in [TailPolicy::CopyAtFork, TailPolicy::CopyOnWrite] {
        for len in [8u64, 10] {
            let p = pool(16, tail);
            let parent = p.allocate(len).unwrap();
            let out = p.fork(parent, 4).unwrap();
            let (last, rest) = out.branches.split_last().unwrap();
            for b in rest {
                p.release(*b).unwrap();
                assert!(free(&p) < 16, "{tail:?} len {len}: full too early");
                check(&p);
            }
            p.release(*last).unwrap();
            assert_eq!(free(&p), 16, "{tail:?} len {len}");
            check(&p);
        }
    }
}

#[test]
fn cow_copies_only_when_not_page_aligned() {
    // Page-aligned: appending to a branch allocates a fresh page and copies nothing.
    let p = pool(16, TailPolicy::CopyOnWrite);
    let parent = p.allocate(8).unwrap();
    let out = p.fork(parent, 2).unwrap();
    let a = p.append(out.branches[1], 1).unwrap();
    assert_eq!(a.cow, None);
    assert_eq!(a.pages_allocated, 1);

    // Not aligned: the first write into the shared tail copies it.
    let p = pool(16, TailPolicy::CopyOnWrite);
    let parent = p.allocate(6).unwrap();
    let out = p.fork(parent, 2).unwrap();
    assert!(out.copies.is_empty(), "copy-on-write defers the tail copy");
    let tail = p.table(parent).unwrap()[1];
    let a = p.append(out.branches[1], 1).unwrap();
    let cow = a.cow.expect("shared tail is copied");
    assert_eq!((cow.src, cow.tokens, cow.bytes), (tail, 2, 20));
    assert_eq!(a.pages_allocated, 0);
    check(&p);
}

#[test]
fn cow_copies_only_on_the_writing_side() {
    let p = pool(16, TailPolicy::CopyOnWrite);
    let parent = p.allocate(6).unwrap();
    let out = p.fork(parent, 3).unwrap();
    let before = p.table(parent).unwrap();
    let tail = before[1];
    // Branch 2 writes: only branch 2's table changes.
    let w = p.append(out.branches[2], 1).unwrap().cow.expect("copy");
    assert_eq!(p.table(parent).unwrap(), before);
    assert_eq!(p.table(out.branches[1]).unwrap(), before);
    assert_eq!(p.table(out.branches[2]).unwrap(), vec![before[0], w.dst]);
    assert_eq!(p.refcount(tail).unwrap(), Some(2));
    // Branch 1 writes: copies again (tail still shared with branch 0).
    assert!(p.append(out.branches[1], 1).unwrap().cow.is_some());
    // Branch 0 is now the tail's only holder: it writes in place, no copy.
    assert_eq!(p.refcount(tail).unwrap(), Some(1));
    let a = p.append(parent, 1).unwrap();
    assert_eq!(a.cow, None);
    assert_eq!(p.table(parent).unwrap(), before);
    check(&p);
}

// ---- fork shapes and costs ----------------------------------------------------------

#[test]
fn unaligned_copy_at_fork_gives_every_branch_a_private_tail() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(10).unwrap(); // 2 whole pages + 2 tokens
    let before = free(&p);
    let out = p.fork(parent, 4).unwrap();
    assert_eq!(free(&p), before - 3, "n - 1 new tail pages");
    assert_eq!(out.copies.len(), 3);
    let parent_table = p.table(parent).unwrap();
    let mut tails = vec![parent_table[2]];
    for (c, b) in out.copies.iter().zip(&out.branches[1..]) {
        let t = p.table(*b).unwrap();
        assert_eq!(t[..2], parent_table[..2]);
        assert_eq!(c.src, parent_table[2]);
        assert_eq!(c.dst, t[2]);
        assert_eq!((c.tokens, c.bytes), (2, 20));
        tails.push(t[2]);
    }
    for t in &tails {
        assert_eq!(p.refcount(*t).unwrap(), Some(1), "tail {t} private");
    }
    // Appends after the fork never copy: every tail is private.
    for b in &out.branches {
        assert_eq!(p.append(*b, 5).unwrap().cow, None);
    }
    check(&p);
}

#[test]
fn fork_cost_reports_table_and_tail_apart() {
    let p = pool(32, TailPolicy::CopyAtFork);
    let parent = p.allocate(10).unwrap();
    let out = p.fork(parent, 4).unwrap();
    assert_eq!(
        out.cost,
        ForkCost {
            table_clones: 3,
            table_entries_cloned: 6,
            pages_shared: 2,
            state_clones: 0,
            state_bytes: 0,
            tail_copies: 3,
            tail_copy_bytes: 60,
        }
    );
    let q = p.allocate(8).unwrap();
    let state = BranchState::new(vec![1; 8], 5);
    let r = fork_request(&p, q, &state, 2, AdmissionInput::default()).unwrap();
    assert_eq!(r.cost.state_clones, 2);
    assert_eq!(r.cost.state_bytes, 2 * state.fork_bytes());
    assert_eq!((r.cost.tail_copies, r.cost.tail_copy_bytes), (0, 0));
    assert_eq!(r.cost.table_entries_cloned, 2);
}

#[test]
fn one_way_fork_changes_no_page() {
    let p = pool(8, TailPolicy::CopyAtFork);
    let parent = p.allocate(6).unwrap();
    let before = p.snapshot().unwrap();
    let out = p.fork(parent, 1).unwrap();
    assert_eq!(out.branches, vec![parent]);
    assert_eq!(out.cost, ForkCost::default());
    assert_eq!(p.snapshot().unwrap(), before);
    assert!(p.fork(parent, 2).is_err(), "a one-way fork still counts");
}

#[test]
fn truncate_into_a_shared_page_copies_on_the_next_write() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(8).unwrap();
    let out = p.fork(parent, 2).unwrap();
    let shared = p.table(parent).unwrap()[1];
    // Roll branch 1 back into the middle of a shared page, then write.
    let t = p.truncate(out.branches[1], 6).unwrap();
    assert_eq!(t, TruncateOutcome::default());
    let a = p.append(out.branches[1], 1).unwrap();
    let cow = a.cow.expect("shared page copied before the write");
    assert_eq!((cow.src, cow.tokens), (shared, 2));
    assert_eq!(p.refcount(shared).unwrap(), Some(1));
    assert_eq!(
        p.table(parent).unwrap()[1],
        shared,
        "the other side is untouched"
    );
    check(&p);
}

// ---- admission --------------------------------------------------------------------------

fn rejected(r: Result<ForkedRequest<BranchState>, ForkError>) -> Reason {
    match r {
        Err(ForkError::AdmissionRejected(reason)) => reason,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn admission_rejects_an_already_forked_request() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(5).unwrap();
    let s = BranchState::new(vec![0; 5], 1);
    let out = fork_request(&p, parent, &s, 2, AdmissionInput::default()).unwrap();
    let before = p.snapshot().unwrap();
    for b in &out.branches {
        let r = fork_request(&p, b.seq, &s, 2, AdmissionInput::default());
        assert_eq!(rejected(r), Reason::AlreadyForked);
    }
    assert_eq!(p.snapshot().unwrap(), before, "a reject changes nothing");
}

#[test]
fn admission_rejects_pages_shared_with_a_text_prefix_cache() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(9).unwrap();
    let cache = p.share_prefix(parent).unwrap();
    assert_eq!(p.table(cache).unwrap(), p.table(parent).unwrap()[..2]);
    let s = BranchState::new(vec![0; 9], 1);
    let before = p.snapshot().unwrap();
    let r = fork_request(&p, parent, &s, 3, AdmissionInput::default());
    assert_eq!(rejected(r), Reason::SharedPages { pages: 2 });
    assert_eq!(p.snapshot().unwrap(), before);
    // The caller's own knowledge of a radix-cache hit also rejects.
    let q = p.allocate(4).unwrap();
    let hit = AdmissionInput {
        text_prefix_cache_hit: true,
    };
    assert_eq!(
        rejected(fork_request(&p, q, &s, 2, hit)),
        Reason::TextPrefixCache
    );
    // Once the cache lets go, the fork is admitted.
    p.release(cache).unwrap();
    assert!(fork_request(&p, parent, &s, 3, AdmissionInput::default()).is_ok());
    check(&p);
}

#[test]
fn admission_rejects_state_that_cannot_be_cloned() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(5).unwrap();
    let mut s = BranchState::new(vec![0; 5], 1);
    s.grammar = GrammarState::Live {
        backend: "outlines".into(),
    };
    let before = p.snapshot().unwrap();
    let err = fork_request(&p, parent, &s, 2, AdmissionInput::default()).unwrap_err();
    assert!(err.falls_back_to_prefill());
    assert_eq!(
        err,
        ForkError::AdmissionRejected(Reason::StateNotCloneable { field: "grammar" })
    );
    assert_eq!(p.snapshot().unwrap(), before);
    assert!(!p.with_core(|c| c.is_forked(parent)).unwrap().unwrap());
}

#[test]
fn a_doomed_fork_is_rejected_on_its_pages_before_any_state_is_cloned() {
    // Pages shared with a prefix cache and a state that cannot clone: the cheap page check
    // runs first, so the reason is the pages, on the locked pool and on a bare core alike.
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(9).unwrap();
    let _cache = p.share_prefix(parent).unwrap();
    let mut s = BranchState::new(vec![0; 9], 1);
    s.grammar = GrammarState::Live {
        backend: "outlines".into(),
    };
    let shared = Reason::SharedPages { pages: 2 };
    let r = fork_request(&p, parent, &s, 2, AdmissionInput::default());
    assert_eq!(rejected(r), shared);
    let r = p
        .with_core(|c| fork_request(c, parent, &s, 2, AdmissionInput::default()))
        .unwrap();
    assert_eq!(rejected(r), shared);
}

#[test]
fn qwen25_vl_7b_kv_bytes_per_token_is_57_344() {
    // 28 layers x 2 (K, V) x 4 KV heads x 128 dims x 2 bytes (bf16): DESIGN.md's figure,
    // and moonagent-models' `kv_bytes_per_token` for the 7B spec.
    assert_eq!(QWEN25_VL_7B_BYTES_PER_TOKEN, 57_344);
}

#[test]
fn fork_request_salts_every_branch_seed() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(5).unwrap();
    let s = BranchState::new(vec![0; 5], 77);
    let r = fork_request(&p, parent, &s, 4, AdmissionInput::default()).unwrap();
    for (i, b) in r.branches.iter().enumerate() {
        assert_eq!(b.state.sampler.seed, branch_seed(77, i as u32));
    }
    assert_eq!(r.branches[0].seq, parent);
}

// ---- release, exhaustion, misuse ------------------------------------------------------

#[test]
fn release_twice_never_decrements_twice() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let parent = p.allocate(8).unwrap();
    let out = p.fork(parent, 2).unwrap();
    let b = out.branches[1];
    assert!(matches!(p.release(b).unwrap(), Release::Released { .. }));
    let after_first = p.snapshot().unwrap();
    assert_eq!(p.release(b).unwrap(), Release::AlreadyReleased);
    assert_eq!(p.snapshot().unwrap(), after_first);
    // The slot is reused; the stale handle still cannot reach the new occupant.
    let c = p.allocate(4).unwrap();
    assert_eq!(c.index(), b.index());
    assert_eq!(p.release(b).unwrap(), Release::AlreadyReleased);
    assert_eq!(p.seq_len(c).unwrap(), 4);
    check(&p);
}

#[test]
fn seq_ids_name_their_slot_and_generation() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let a = p.allocate(4).unwrap();
    let b = p.allocate(4).unwrap();
    assert_eq!((a.index(), a.generation()), (0, 0));
    assert_eq!((b.index(), b.generation()), (1, 0));
    assert_eq!(b.to_string(), "seq#1.0");
    p.release(a).unwrap();
    p.release(b).unwrap();
    // Slot 1 (released last) is reused under its next generation, then slot 0.
    let c = p.allocate(4).unwrap();
    let d = p.allocate(4).unwrap();
    assert_eq!((c.index(), c.generation()), (1, 1));
    assert_eq!((d.index(), d.generation()), (0, 1));
    assert_eq!(d.to_string(), "seq#0.1");
}

#[test]
fn page_bytes_is_block_size_times_bytes_per_token_saturating() {
    assert_eq!(PoolConfig::new(8, BS, 10).page_bytes(), 40);
    assert_eq!(
        PoolConfig::new(8, 16, QWEN25_VL_7B_BYTES_PER_TOKEN).page_bytes(),
        16 * 57_344
    );
    assert_eq!(PoolConfig::new(8, 2, u64::MAX).page_bytes(), u64::MAX);
}

#[test]
fn snapshot_check_rejects_every_kind_of_corruption() {
    let p = pool(8, TailPolicy::CopyAtFork);
    let a = p.allocate(9).unwrap(); // 3 pages
    let _ = p.fork(a, 2).unwrap();
    let cfg = p.config();
    let good = p.snapshot().unwrap();
    good.check(cfg).unwrap();
    let bad = |what: &str, f: &dyn Fn(&mut PoolSnapshot)| {
        let mut s = good.clone();
        f(&mut s);
        let err = s.check(cfg).expect_err(what);
        assert_eq!(err.invariant, "F1", "{what}");
    };
    bad("capacity", &|s| {
        s.refcounts.push(0);
    });
    bad("table length", &|s| s.tables[0].1 += u64::from(BS));
    bad("page out of range", &|s| s.tables[0].2[0] = 99);
    bad("refcount", &|s| s.refcounts[s.tables[0].2[0] as usize] += 1);
    bad("free twice", &|s| {
        let f = s.free[0];
        s.free.push(f)
    });
    bad("free out of range", &|s| s.free[0] = 99);
    bad("free and referenced", &|s| {
        let held = s.tables[0].2[0];
        s.free[0] = held;
    });
    bad("free + used", &|s| {
        s.free.pop();
    });
}

#[test]
fn a_stale_handle_never_reads_the_slots_next_occupant() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let a = p.allocate(4).unwrap();
    p.release(a).unwrap();
    let c = p.allocate(9).unwrap();
    assert_eq!(c.index(), a.index());
    assert_eq!(p.seq_len(a), Err(ForkError::UnknownSequence(a)));
    assert_eq!(p.table(a), Err(ForkError::UnknownSequence(a)));
    assert_eq!(p.seq_len(c).unwrap(), 9);
}

#[test]
fn a_handle_from_a_generation_not_yet_issued_is_unknown_not_released() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let a = p.allocate(4).unwrap();
    p.release(a).unwrap();
    // Slot 0 is empty at generation 1: a handle of generation 1 was never issued.
    let never = SeqId {
        index: a.index(),
        generation: a.generation() + 1,
    };
    assert_eq!(p.release(never), Err(ForkError::UnknownSequence(never)));
    assert_eq!(p.release(a), Ok(Release::AlreadyReleased));
}

#[test]
fn exhaustion_is_an_error_and_changes_nothing() {
    let p = pool(4, TailPolicy::CopyAtFork);
    assert_eq!(
        p.allocate(17),
        Err(ForkError::PoolExhausted { needed: 5, free: 4 })
    );
    let a = p.allocate(7).unwrap();
    let before = p.snapshot().unwrap();
    assert_eq!(
        p.fork(a, 4),
        Err(ForkError::PoolExhausted { needed: 3, free: 2 })
    );
    assert!(!p.with_core(|c| c.is_forked(a)).unwrap().unwrap());
    assert_eq!(
        p.append(a, 10),
        Err(ForkError::PoolExhausted { needed: 3, free: 2 })
    );
    assert_eq!(p.snapshot().unwrap(), before);
    check(&p);
}

#[test]
fn misuse_returns_errors_not_panics() {
    let p = pool(4, TailPolicy::CopyAtFork);
    let a = p.allocate(3).unwrap();
    assert_eq!(p.fork(a, 0), Err(ForkError::InvalidBranchCount(0)));
    assert_eq!(
        p.truncate(a, 4),
        Err(ForkError::InvalidLength {
            len: 3,
            requested: 4
        })
    );
    let bogus = SeqId {
        index: 99,
        generation: 0,
    };
    for r in [
        p.append(bogus, 1).map(|_| ()),
        p.fork(bogus, 2).map(|_| ()),
        p.truncate(bogus, 0).map(|_| ()),
        p.release(bogus).map(|_| ()),
        p.share_prefix(bogus).map(|_| ()),
        p.table(bogus).map(|_| ()),
    ] {
        assert_eq!(r, Err(ForkError::UnknownSequence(bogus)));
    }
    let future = SeqId {
        index: a.index,
        generation: 5,
    };
    assert_eq!(p.release(future), Err(ForkError::UnknownSequence(future)));
    assert_eq!(
        p.append(a, u64::MAX),
        Err(ForkError::Overflow("sequence length"))
    );
    assert_eq!(p.refcount(1000).unwrap(), None);
    assert!(BlockPool::new(PoolConfig::new(4, 0, 1)).is_err());
    check(&p);
}

#[test]
fn block_pool_is_send_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<BlockPool>();
    assert_send_sync::<PoolCore>();
}

#[test]
fn scheduler_forks_while_completion_threads_release() {
    use std::sync::{mpsc, Arc, Mutex};
    let p = Arc::new(pool(256, TailPolicy::CopyAtFork));
    let (tx, rx) = mpsc::channel::<SeqId>();
    let rx = Arc::new(Mutex::new(rx));
    let completions: Vec<_> = (0..2)
        .map(|_| {
            let (p, rx) = (Arc::clone(&p), Arc::clone(&rx));
            std::thread::spawn(move || loop {
                let next = rx.lock().unwrap().recv();
                let Ok(b) = next else { break };
                assert!(matches!(p.release(b).unwrap(), Release::Released { .. }));
                assert_eq!(p.release(b).unwrap(), Release::AlreadyReleased);
            })
        })
        .collect();
    // Exhaustion is back-pressure: the scheduler retries once completions free pages.
    fn retry<T>(mut f: impl FnMut() -> Result<T, ForkError>) -> T {
        loop {
            match f() {
                Ok(v) => return v,
                Err(ForkError::PoolExhausted { .. }) => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
    }
    for i in 0..200u64 {
        let parent = retry(|| p.allocate(5 + i % 11));
        for b in retry(|| p.fork(parent, 4)).branches {
            tx.send(b).unwrap();
        }
    }
    drop(tx);
    for c in completions {
        c.join().unwrap();
    }
    assert_eq!(free(&p), 256);
    check(&p);
}

// ---- outcomes, counters and predicates (mutation survivors) ------------------------------

#[test]
fn truncate_reports_pages_dropped_and_of_those_freed() {
    let p = pool(16, TailPolicy::CopyAtFork);
    // A private 3-page sequence cut to 5 tokens keeps pages_for(5) = 2 pages: the third
    // is dropped and, held by no other table, freed.
    let private = p.allocate(3 * u64::from(BS)).unwrap();
    assert_eq!(
        p.truncate(private, 5).unwrap(),
        TruncateOutcome {
            pages_dropped: 1,
            pages_freed: 1
        }
    );
    // A page-aligned 3-page parent forked 2 ways: every page is held by both tables.
    let parent = p.allocate(3 * u64::from(BS)).unwrap();
    let branch = p.fork(parent, 2).unwrap().branches[1];
    // Rolling the branch back to nothing drops its 3 pages; the parent still holds them.
    assert_eq!(
        p.truncate(branch, 0).unwrap(),
        TruncateOutcome {
            pages_dropped: 3,
            pages_freed: 0
        }
    );
    // Now the parent holds them alone: cutting it to one page frees the other two.
    assert_eq!(
        p.truncate(parent, u64::from(BS)).unwrap(),
        TruncateOutcome {
            pages_dropped: 2,
            pages_freed: 2
        }
    );
    check(&p);
}

#[test]
fn truncate_with_a_stale_handle_leaves_the_slots_next_occupant_alone() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let a = p.allocate(8).unwrap();
    p.release(a).unwrap();
    let c = p.allocate(9).unwrap();
    assert_eq!(c.index(), a.index(), "the slot is reused");
    assert_eq!(p.truncate(a, 0), Err(ForkError::UnknownSequence(a)));
    assert_eq!(p.seq_len(c).unwrap(), 9);
    assert_eq!(p.table(c).unwrap().len(), 3);
    check(&p);
}

#[test]
fn stats_count_used_pages_and_live_sequences() {
    let p = pool(16, TailPolicy::CopyAtFork);
    let a = p.allocate(5).unwrap(); // 2 pages
    let _b = p.allocate(4).unwrap(); // 1 page
    let s = p.stats().unwrap();
    assert_eq!(
        (s.capacity, s.free, s.used, s.live_sequences),
        (16, 13, 3, 2)
    );
    p.release(a).unwrap();
    let s = p.stats().unwrap();
    assert_eq!(
        (s.capacity, s.free, s.used, s.live_sequences),
        (16, 15, 1, 1)
    );
    // A second release decrements nothing, the live count included.
    assert_eq!(p.release(a), Ok(Release::AlreadyReleased));
    assert_eq!(p.stats().unwrap().live_sequences, 1);
}

#[test]
fn is_forked_and_is_live_follow_fork_and_release() {
    let mut core = PoolCore::new(PoolConfig::new(16, BS, 10)).unwrap();
    let a = core.allocate(8).unwrap();
    assert!(core.is_live(a));
    assert_eq!(core.is_forked(a), Ok(false));
    let out = core.fork(a, 3).unwrap();
    for &b in &out.branches {
        assert!(core.is_live(b));
        assert_eq!(core.is_forked(b), Ok(true), "{b:?}");
    }
    let gone = out.branches[1];
    core.release(gone).unwrap();
    assert!(!core.is_live(gone));
    assert_eq!(core.is_forked(gone), Err(ForkError::UnknownSequence(gone)));
    let never = SeqId {
        index: 99,
        generation: 0,
    };
    assert!(!core.is_live(never));
}

#[test]
fn only_admission_rejects_fall_back_to_prefill() {
    assert!(ForkError::AdmissionRejected(Reason::AlreadyForked).falls_back_to_prefill());
    let id = SeqId {
        index: 0,
        generation: 0,
    };
    for e in [
        ForkError::PoolExhausted { needed: 2, free: 1 },
        ForkError::UnknownSequence(id),
        ForkError::InvalidBranchCount(0),
        ForkError::InvalidLength {
            len: 1,
            requested: 2,
        },
        ForkError::Overflow("x"),
        ForkError::InvalidConfig("x"),
        ForkError::Poisoned,
    ] {
        assert!(!e.falls_back_to_prefill(), "{e:?}");
    }
}

/// `allocate_for` reserves memory only: the same pages, state and outcomes as `allocate`
/// through a decode's appends, with the block table reserved for the expected length.
#[test]
fn allocate_for_differs_from_allocate_in_memory_only() {
    let cfg = PoolConfig::new(64, BS, 10);
    let (mut a, mut b) = (PoolCore::new(cfg).unwrap(), PoolCore::new(cfg).unwrap());
    let sa = a.allocate(6).unwrap();
    let sb = b.allocate_for(6, 6 + 40).unwrap();
    assert_eq!(sa, sb);
    assert!(b.table_capacity(sb).unwrap() >= 12);
    assert!(a.table_capacity(sa).unwrap() < 12);
    for _ in 0..40 {
        assert_eq!(a.append(sa, 1).unwrap(), b.append(sb, 1).unwrap());
    }
    assert_eq!(a.table(sa).unwrap(), b.table(sb).unwrap());
    assert_eq!(a.stats(), b.stats());
    // An expectation below the length reserves what the length needs.
    let s = b.allocate_for(9, 1).unwrap();
    assert_eq!(b.table(s).unwrap().len(), 3);
}

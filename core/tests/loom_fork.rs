//! Loom model checks of the shared block pool: every interleaving of concurrent release,
//! fork and copy-on-write append ends with every page freed exactly once.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p moonagent-core --release --test loom_fork`.
//! Pools are tiny (a handful of pages, two or three threads) so loom can exhaust the
//! interleavings without a preemption bound (set here, not in the environment).

#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use moonagent_core::fork::{
    fork_request, AdmissionInput, BlockPool, BranchState, ForkError, PoolConfig, Reason, Release,
    SeqId, TailPolicy,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Runs `f` under loom, unbounded (the pool has one lock, so the interleavings are few
/// enough to exhaust), and asserts that at least `min` interleavings ran: the count loom
/// 0.7 explores for the model as written, so a misconfigured run (a preemption bound, a
/// `LOOM_MAX_PREEMPTIONS` or iteration cap in the environment, a model that no longer
/// spawns its threads) fails instead of passing having explored little or nothing.
fn model(min: usize, f: impl Fn() + Sync + Send + 'static) {
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    let mut b = loom::model::Builder::new();
    b.preemption_bound = None;
    b.check(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        f();
    });
    let n = runs.load(Ordering::Relaxed);
    eprintln!("loom explored {n} interleavings (at least {min} expected)");
    assert!(
        n >= min,
        "loom explored {n} interleavings, expected at least {min}"
    );
}

fn pool(cap: u32, tail: TailPolicy) -> Arc<BlockPool> {
    Arc::new(BlockPool::new(PoolConfig::new(cap, 2, 1).with_tail(tail)).expect("config"))
}

fn freed(r: Result<Release, ForkError>) -> u32 {
    match r.expect("release never errors on an issued handle") {
        Release::Released { pages_freed, .. } => pages_freed,
        Release::AlreadyReleased => 0,
    }
}

/// Releases whatever is still live, then asserts the pool is full, every page is on the
/// free list exactly once, and `freed` (pages freed by releases) equals the pages used.
fn assert_all_freed_once(p: &BlockPool, mut freed_so_far: u32, handles: &[SeqId], used: u32) {
    for &h in handles {
        freed_so_far += freed(p.release(h));
    }
    let cfg = p.config();
    let snap = p.snapshot().expect("lock");
    snap.check(cfg).expect("invariants");
    assert!(snap.tables.is_empty());
    let mut free = snap.free.clone();
    free.sort_unstable();
    assert_eq!(free, (0..cfg.capacity_pages).collect::<Vec<_>>());
    assert_eq!(freed_so_far, used, "each page freed exactly once");
}

#[test]
fn concurrent_release_of_branches_sharing_pages_frees_every_page_once() {
    model(253, || {
        let p = pool(4, TailPolicy::CopyAtFork);
        // 3 tokens = 1 whole page + a 1-token tail; 3 branches: 1 shared + 3 tails.
        let parent = p.allocate(3).expect("capacity");
        let out = p.fork(parent, 3).expect("admitted");
        assert_eq!(p.stats().expect("lock").free, 0);
        let spawned: Vec<_> = out.branches[1..]
            .iter()
            .map(|&b| {
                let p = Arc::clone(&p);
                thread::spawn(move || freed(p.release(b)))
            })
            .collect();
        let mut total = freed(p.release(out.branches[0]));
        for t in spawned {
            total += t.join().expect("thread");
        }
        assert_all_freed_once(&p, total, &out.branches, 4);
    });
}

#[test]
fn fork_racing_release_of_the_parent_frees_every_page_once() {
    model(4, || {
        let p = pool(4, TailPolicy::CopyAtFork);
        let parent = p.allocate(3).expect("capacity");
        let forker = {
            let p = Arc::clone(&p);
            thread::spawn(move || p.fork(parent, 2))
        };
        let released = freed(p.release(parent));
        let fork = forker.join().expect("thread");
        let (branches, used) = match fork {
            // The fork won: branch 0 is the parent (maybe released already), branch 1 is new
            // with its own tail copy.
            Ok(out) => {
                assert_eq!(out.branches[0], parent);
                assert_eq!(out.copies.len(), 1);
                (out.branches, 3)
            }
            // The release won: the fork saw a dead handle and changed nothing.
            Err(e) => {
                assert_eq!(e, ForkError::UnknownSequence(parent));
                (vec![parent], 2)
            }
        };
        assert_all_freed_once(&p, released, &branches, used);
    });
}

#[test]
fn double_release_racing_itself_decrements_once() {
    model(4, || {
        let p = pool(4, TailPolicy::CopyAtFork);
        let parent = p.allocate(4).expect("capacity");
        let out = p.fork(parent, 2).expect("admitted");
        let b = out.branches[1];
        let other = {
            let p = Arc::clone(&p);
            thread::spawn(move || p.release(b))
        };
        let mine = p.release(b);
        let theirs = other.join().expect("thread");
        let results = [mine, theirs];
        let released = results
            .iter()
            .filter(|r| matches!(r, Ok(Release::Released { .. })))
            .count();
        let again = results
            .iter()
            .filter(|r| matches!(r, Ok(Release::AlreadyReleased)))
            .count();
        assert_eq!((released, again), (1, 1));
        // Branch 1 shared both pages with branch 0: its release freed none of them.
        let total: u32 = results.into_iter().map(freed).sum();
        assert_eq!(total, 0);
        for blk in p.table(parent).expect("live") {
            assert_eq!(p.refcount(blk).expect("lock"), Some(1));
        }
        assert_all_freed_once(&p, total, &out.branches, 2);
    });
}

#[test]
fn copy_on_write_racing_release_of_the_sibling_frees_every_page_once() {
    model(4, || {
        let p = pool(4, TailPolicy::CopyOnWrite);
        let parent = p.allocate(3).expect("capacity");
        let out = p.fork(parent, 2).expect("admitted");
        let writer = {
            let p = Arc::clone(&p);
            let b = out.branches[1];
            thread::spawn(move || p.append(b, 1))
        };
        let released = freed(p.release(out.branches[0]));
        let appended = writer.join().expect("thread").expect("capacity");
        // Copy-on-write iff the sibling still held the tail when the write came.
        let used = 2 + u32::from(appended.cow.is_some());
        assert_eq!(released, u32::from(appended.cow.is_some()));
        assert_all_freed_once(&p, released, &out.branches, used);
    });
}

#[test]
fn racing_fork_requests_admit_exactly_one() {
    model(14, || {
        let p = pool(4, TailPolicy::CopyAtFork);
        let parent = p.allocate(3).expect("capacity");
        let state = BranchState::new(vec![1, 2, 3], 9);
        // Both schedulers may pass the unlocked pre-check; the fork re-checks under the lock.
        let other = {
            let (p, state) = (Arc::clone(&p), state.clone());
            thread::spawn(move || {
                fork_request(&*p, parent, &state, 2, AdmissionInput::default()).map(|r| r.branches)
            })
        };
        let mine =
            fork_request(&*p, parent, &state, 2, AdmissionInput::default()).map(|r| r.branches);
        let theirs = other.join().expect("thread");
        let (won, lost) = match (mine, theirs) {
            (Ok(w), Err(l)) | (Err(l), Ok(w)) => (w, l),
            (a, b) => panic!("exactly one fork must win: {a:?} / {b:?}"),
        };
        assert_eq!(lost, ForkError::AdmissionRejected(Reason::AlreadyForked));
        let handles: Vec<SeqId> = won.iter().map(|b| b.seq).collect();
        assert_all_freed_once(&p, 0, &handles, 3);
    });
}

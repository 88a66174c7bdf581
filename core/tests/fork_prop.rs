//! Property tests of the block pool against a trivially correct model (quick_cache's
//! fuzz style): random sequences of allocate, append (write), truncate, fork, share with
//! a text-prefix cache, release and release-again run on the real pool, a model that
//! recomputes everything by brute force, and a toy KV memory that holds real token ids.
//!
//! After every operation the test checks, independently of the pool's own checker:
//! refcount = number of live tables holding the page; free + used = capacity; no page is
//! both free and referenced; the pool's sharing structure is the model's (a consistent
//! bijection between model pages and real pages); every live sequence reads back its own
//! tokens through its block table; and every token write lands in a page no other table
//! holds. An operation that fails (exhaustion, admission) must fail exactly when the
//! model says so and must leave the pool unchanged. At the end everything is released and
//! the pool must be full with every refcount zero.

#![cfg(not(loom))]

use moonagent_core::fork::{
    BlockPool, ForkError, PoolConfig, PoolSnapshot, Reason, Release, SeqId, TailPolicy, ToyKv,
};
use proptest::prelude::*;
use proptest::sample::Index;
use std::collections::{BTreeMap, HashMap};

#[derive(Debug, Clone)]
enum Op {
    Allocate(u16),
    /// Append is the write: every appended token is written into the KV memory.
    Append(Index, u8),
    /// Roll back to `len * keep / 255` tokens.
    Truncate(Index, u8),
    Fork(Index, u8),
    /// A text-prefix cache takes a reference to the whole pages.
    Share(Index),
    /// Release any handle ever issued (live or not).
    Release(Index),
    /// Release a handle already released.
    ReleaseAgain(Index),
}

#[derive(Debug, Clone)]
struct Weights {
    alloc: u32,
    append: u32,
    truncate: u32,
    fork: u32,
    share: u32,
    release: u32,
    again: u32,
}

fn op_strategy(w: Weights, max_alloc: u16, max_append: u8) -> impl Strategy<Value = Op> {
    prop_oneof![
        w.alloc => (0..=max_alloc).prop_map(Op::Allocate),
        w.append => (any::<Index>(), 0..=max_append).prop_map(|(i, n)| Op::Append(i, n)),
        w.truncate => (any::<Index>(), any::<u8>()).prop_map(|(i, k)| Op::Truncate(i, k)),
        w.fork => (any::<Index>(), 0u8..=5).prop_map(|(i, n)| Op::Fork(i, n)),
        w.share => any::<Index>().prop_map(Op::Share),
        w.release => any::<Index>().prop_map(Op::Release),
        w.again => any::<Index>().prop_map(Op::ReleaseAgain),
    ]
}

fn config_strategy(caps: std::ops::RangeInclusive<u32>) -> impl Strategy<Value = PoolConfig> {
    (
        caps,
        1u32..=5,
        prop_oneof![Just(TailPolicy::CopyAtFork), Just(TailPolicy::CopyOnWrite)],
    )
        .prop_map(|(cap, bs, tail)| PoolConfig::new(cap, bs, 7).with_tail(tail))
}

/// One sequence in the model: abstract page ids (never reused) and its token contents.
#[derive(Debug, Clone)]
struct MSeq {
    pages: Vec<u64>,
    tokens: Vec<u32>,
    forked: bool,
}

/// The model: brute force over the live sequences, no refcounts stored anywhere.
struct Model {
    cfg: PoolConfig,
    next_page: u64,
    live: BTreeMap<SeqId, MSeq>,
}

impl Model {
    fn fresh(&mut self, n: u64) -> Vec<u64> {
        let v = (self.next_page..self.next_page + n).collect();
        self.next_page += n;
        v
    }
    fn holders(&self, page: u64) -> usize {
        self.live
            .values()
            .filter(|s| s.pages.contains(&page))
            .count()
    }
    fn used(&self) -> u64 {
        let mut all: Vec<u64> = self.live.values().flat_map(|s| s.pages.clone()).collect();
        all.sort_unstable();
        all.dedup();
        all.len() as u64
    }
    fn free(&self) -> u64 {
        u64::from(self.cfg.capacity_pages) - self.used()
    }
    fn exhausted(&self, needed: u64) -> Option<ForkError> {
        let free = self.free();
        (needed > free).then_some(ForkError::PoolExhausted { needed, free })
    }
}

struct Harness {
    pool: BlockPool,
    kv: ToyKv,
    model: Model,
    handles: Vec<SeqId>,
    dead: Vec<SeqId>,
    next_token: u32,
}

fn pick<T: Copy>(v: &[T], i: &Index) -> Option<T> {
    (!v.is_empty()).then(|| v[i.index(v.len())])
}

impl Harness {
    fn new(cfg: PoolConfig) -> Self {
        Self {
            pool: BlockPool::new(cfg).expect("valid config"),
            kv: ToyKv::new(&cfg),
            model: Model {
                cfg,
                next_page: 0,
                live: BTreeMap::new(),
            },
            handles: Vec::new(),
            dead: Vec::new(),
            next_token: 0,
        }
    }

    fn snap(&self) -> PoolSnapshot {
        self.pool.snapshot().expect("lock")
    }

    fn live_ids(&self) -> Vec<SeqId> {
        self.model.live.keys().copied().collect()
    }

    /// Appends `n` fresh tokens at `from..` of `id`, writing each into the KV memory
    /// after checking its page is private.
    fn write_tokens(&mut self, id: SeqId, from: u64, n: u64) -> Result<(), TestCaseError> {
        let table = self.pool.table(id).expect("live");
        let bs = u64::from(self.model.cfg.block_size_tokens);
        for pos in from..from + n {
            let page = table[(pos / bs) as usize];
            let rc = self.pool.refcount(page).expect("lock");
            prop_assert_eq!(
                rc,
                Some(1),
                "write into page {} held by another table",
                page
            );
            let t = self.next_token;
            self.next_token += 1;
            prop_assert!(self.kv.write(&table, pos, t));
            let seq = self.model.live.get_mut(&id).expect("live in model");
            seq.tokens.push(t);
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let cfg = self.model.cfg;
        let bs = u64::from(cfg.block_size_tokens);
        let before = self.snap();
        let live = self.live_ids();
        // `Err(e)` from the pool must be exactly the model's expectation and change nothing.
        let expect_err = |h: &Self, got: ForkError, want: ForkError| {
            prop_assert_eq!(got, want);
            prop_assert_eq!(h.snap(), before.clone(), "a failed op changed the pool");
            Ok(())
        };
        match op {
            Op::Allocate(t) => {
                let t = u64::from(*t);
                let needed = cfg.pages_for(t);
                match (self.pool.allocate(t), self.model.exhausted(needed)) {
                    (Err(got), Some(want)) => expect_err(self, got, want)?,
                    (Ok(id), None) => {
                        let pages = self.model.fresh(needed);
                        self.model.live.insert(
                            id,
                            MSeq {
                                pages,
                                tokens: Vec::new(),
                                forked: false,
                            },
                        );
                        self.handles.push(id);
                        self.write_tokens(id, 0, t)?;
                    }
                    (got, want) => prop_assert!(false, "allocate: {got:?} vs model {want:?}"),
                }
            }
            Op::Append(i, n) => {
                let Some(id) = pick(&live, i) else {
                    return Ok(());
                };
                let n = u64::from(*n);
                let m = &self.model.live[&id];
                let len = m.tokens.len() as u64;
                let cow = n > 0
                    && len % bs != 0
                    && m.pages.last().is_some_and(|&p| self.model.holders(p) > 1);
                let new = cfg.pages_for(len + n) - m.pages.len() as u64;
                // Headroom: tokens that need no page and no copy (the simulator batches
                // appends up to it); an append within it must allocate nothing.
                let tail_shared =
                    len % bs != 0 && m.pages.last().is_some_and(|&p| self.model.holders(p) > 1);
                let room = if tail_shared {
                    0
                } else {
                    m.pages.len() as u64 * bs - len
                };
                prop_assert_eq!(self.pool.append_headroom(id), Ok(room));
                if n > 0 && n <= room {
                    prop_assert!(!cow && new == 0, "append within headroom allocated");
                }
                if n > room {
                    prop_assert!(cow || new > 0, "append past headroom allocated nothing");
                }
                match (
                    self.pool.append(id, n),
                    self.model.exhausted(new + u64::from(cow)),
                ) {
                    (Err(got), Some(want)) => expect_err(self, got, want)?,
                    (Ok(out), None) => {
                        prop_assert_eq!(out.cow.is_some(), cow, "copy-on-write iff shared tail");
                        prop_assert_eq!(u64::from(out.pages_allocated), new);
                        prop_assert_eq!(Ok(out.headroom), self.pool.append_headroom(id));
                        if let Some(c) = out.cow {
                            prop_assert_eq!(u64::from(c.tokens), len % bs);
                            prop_assert_eq!(c.bytes, u64::from(c.tokens) * cfg.bytes_per_token);
                            prop_assert!(self.kv.apply(&c));
                        }
                        let fresh = self.model.fresh(new + u64::from(cow));
                        let seq = self.model.live.get_mut(&id).expect("live");
                        let mut fresh = fresh.into_iter();
                        if cow {
                            if let (Some(last), Some(p)) = (seq.pages.last_mut(), fresh.next()) {
                                *last = p;
                            }
                        }
                        seq.pages.extend(fresh);
                        self.write_tokens(id, len, n)?;
                    }
                    (got, want) => prop_assert!(false, "append: {got:?} vs model {want:?}"),
                }
            }
            Op::Truncate(i, keep) => {
                let Some(id) = pick(&live, i) else {
                    return Ok(());
                };
                let len = self.model.live[&id].tokens.len() as u64;
                let to = len * u64::from(*keep) / 255;
                let out = self.pool.truncate(id, to);
                prop_assert!(out.is_ok(), "truncate: {out:?}");
                let seq = self.model.live.get_mut(&id).expect("live");
                seq.pages.truncate(cfg.pages_for(to) as usize);
                seq.tokens.truncate(to as usize);
                prop_assert_eq!(self.pool.truncate(id, to + 1).is_err(), true);
            }
            Op::Fork(i, n) => {
                let Some(id) = pick(&live, i) else {
                    return Ok(());
                };
                let n = u32::from(*n);
                let m = self.model.live[&id].clone();
                let len = m.tokens.len() as u64;
                let shared = m
                    .pages
                    .iter()
                    .filter(|&&p| self.model.holders(p) > 1)
                    .count() as u64;
                let copy_tail = cfg.tail == TailPolicy::CopyAtFork && len % bs != 0;
                let want = if n == 0 {
                    Some(ForkError::InvalidBranchCount(0))
                } else if m.forked {
                    Some(ForkError::AdmissionRejected(Reason::AlreadyForked))
                } else if shared > 0 {
                    Some(ForkError::AdmissionRejected(Reason::SharedPages {
                        pages: shared,
                    }))
                } else if copy_tail {
                    self.model.exhausted(u64::from(n) - 1)
                } else {
                    None
                };
                match (self.pool.fork(id, n), want) {
                    (Err(got), Some(want)) => expect_err(self, got, want)?,
                    (Ok(out), None) => {
                        prop_assert_eq!(out.branches.len(), n as usize);
                        prop_assert_eq!(out.branches[0], id);
                        let copies = if copy_tail { n as usize - 1 } else { 0 };
                        prop_assert_eq!(out.copies.len(), copies);
                        prop_assert_eq!(out.cost.tail_copies as usize, copies);
                        for c in &out.copies {
                            prop_assert!(self.kv.apply(c));
                        }
                        let keep = if copy_tail {
                            m.pages.len() - 1
                        } else {
                            m.pages.len()
                        };
                        self.model.live.get_mut(&id).expect("live").forked = true;
                        for &b in &out.branches[1..] {
                            let mut pages = m.pages[..keep].to_vec();
                            if copy_tail {
                                pages.extend(self.model.fresh(1));
                            }
                            let seq = MSeq {
                                pages,
                                tokens: m.tokens.clone(),
                                forked: true,
                            };
                            prop_assert!(self.model.live.insert(b, seq).is_none());
                            self.handles.push(b);
                        }
                    }
                    (got, want) => prop_assert!(false, "fork: {got:?} vs model {want:?}"),
                }
            }
            Op::Share(i) => {
                let Some(id) = pick(&live, i) else {
                    return Ok(());
                };
                let m = &self.model.live[&id];
                let whole = m.tokens.len() / bs as usize;
                let seq = MSeq {
                    pages: m.pages[..whole].to_vec(),
                    tokens: m.tokens[..whole * bs as usize].to_vec(),
                    forked: false,
                };
                let got = self.pool.share_prefix(id);
                prop_assert!(got.is_ok(), "share: {got:?}");
                let got = got.expect("checked");
                self.model.live.insert(got, seq);
                self.handles.push(got);
            }
            Op::Release(i) => {
                let Some(id) = pick(&self.handles, i) else {
                    return Ok(());
                };
                self.release(id, &before)?;
            }
            Op::ReleaseAgain(i) => {
                let Some(id) = pick(&self.dead, i) else {
                    return Ok(());
                };
                self.release(id, &before)?;
            }
        }
        self.check_all()
    }

    fn release(&mut self, id: SeqId, before: &PoolSnapshot) -> Result<(), TestCaseError> {
        let got = self.pool.release(id);
        match self.model.live.get(&id) {
            Some(m) => {
                let dropped = m.pages.len() as u32;
                let freed = m
                    .pages
                    .iter()
                    .filter(|&&p| self.model.holders(p) == 1)
                    .count() as u32;
                prop_assert_eq!(
                    got,
                    Ok(Release::Released {
                        pages_dropped: dropped,
                        pages_freed: freed
                    })
                );
                self.model.live.remove(&id);
                self.dead.push(id);
            }
            None => {
                prop_assert_eq!(got, Ok(Release::AlreadyReleased));
                prop_assert_eq!(&self.snap(), before, "a second release changed the pool");
            }
        }
        Ok(())
    }

    fn check_all(&self) -> Result<(), TestCaseError> {
        let snap = self.snap();
        let cfg = self.model.cfg;
        refcount_equals_live_holders(&snap)?;
        free_plus_used_equals_capacity(&snap, cfg.capacity_pages)?;
        no_block_both_free_and_referenced(&snap)?;
        // The pool's own checker must agree.
        prop_assert_eq!(snap.check(&cfg), Ok(()));
        prop_assert_eq!(
            u64::from(self.pool.stats().expect("lock").free),
            self.model.free()
        );
        // Same live set, same lengths, same sharing structure, same contents.
        let ids: Vec<SeqId> = snap.tables.iter().map(|(id, _, _)| *id).collect();
        prop_assert_eq!(ids, self.live_ids());
        let mut m2r: HashMap<u64, u32> = HashMap::new();
        let mut r2m: HashMap<u32, u64> = HashMap::new();
        for (id, len, table) in &snap.tables {
            let m = &self.model.live[id];
            prop_assert_eq!(*len, m.tokens.len() as u64);
            prop_assert_eq!(table.len(), m.pages.len());
            for (&mp, &rp) in m.pages.iter().zip(table) {
                prop_assert_eq!(*m2r.entry(mp).or_insert(rp), rp, "sharing differs");
                prop_assert_eq!(*r2m.entry(rp).or_insert(mp), mp, "sharing differs");
            }
            let read = self.kv.read(table, *len);
            prop_assert_eq!(read.as_ref(), Some(&m.tokens), "{} reads wrong tokens", id);
        }
        Ok(())
    }

    fn release_everything(&mut self) -> Result<(), TestCaseError> {
        for id in self.live_ids() {
            let released = matches!(self.pool.release(id), Ok(Release::Released { .. }));
            prop_assert!(released, "live {} did not release", id);
            self.model.live.remove(&id);
        }
        for id in self.handles.clone() {
            prop_assert_eq!(self.pool.release(id), Ok(Release::AlreadyReleased));
        }
        nothing_leaks_once_everything_is_released(&self.snap(), self.model.cfg.capacity_pages)
    }
}

fn refcount_equals_live_holders(s: &PoolSnapshot) -> Result<(), TestCaseError> {
    let mut holders = vec![0u32; s.refcounts.len()];
    for (_, _, t) in &s.tables {
        for &b in t {
            holders[b as usize] += 1;
        }
    }
    prop_assert_eq!(&holders, &s.refcounts);
    Ok(())
}

fn free_plus_used_equals_capacity(s: &PoolSnapshot, cap: u32) -> Result<(), TestCaseError> {
    let used = s.refcounts.iter().filter(|&&r| r > 0).count();
    prop_assert_eq!(used + s.free.len(), cap as usize);
    Ok(())
}

fn no_block_both_free_and_referenced(s: &PoolSnapshot) -> Result<(), TestCaseError> {
    let mut seen = vec![false; s.refcounts.len()];
    for &b in &s.free {
        prop_assert!(!seen[b as usize], "page {} twice on the free list", b);
        seen[b as usize] = true;
        prop_assert_eq!(s.refcounts[b as usize], 0, "page {} free and referenced", b);
    }
    Ok(())
}

fn nothing_leaks_once_everything_is_released(
    s: &PoolSnapshot,
    cap: u32,
) -> Result<(), TestCaseError> {
    prop_assert!(s.tables.is_empty());
    prop_assert!(s.refcounts.iter().all(|&r| r == 0));
    let mut free = s.free.clone();
    free.sort_unstable();
    prop_assert_eq!(free, (0..cap).collect::<Vec<_>>());
    Ok(())
}

fn run(cfg: PoolConfig, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Harness::new(cfg);
    for op in ops {
        h.step(op)?;
    }
    h.release_everything()
}

const MIXED: Weights = Weights {
    alloc: 4,
    append: 6,
    truncate: 2,
    fork: 4,
    share: 1,
    release: 3,
    again: 1,
};

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The general mix: every invariant after every op, model equivalence, no leaks.
    #[test]
    fn refcount_equals_live_holders_and_pool_matches_model(
        cfg in config_strategy(8..=48),
        ops in prop::collection::vec(op_strategy(MIXED, 40, 12), 1..200),
    ) {
        run(cfg, &ops)?;
    }

    /// Tiny pools, allocation- and fork-heavy: exhaustion is an error that changes nothing.
    #[test]
    fn exhaustion_is_an_error_never_a_panic_or_corruption(
        cfg in config_strategy(1..=8),
        ops in prop::collection::vec(
            op_strategy(Weights { alloc: 6, append: 6, fork: 6, release: 2, ..MIXED }, 30, 12),
            1..200,
        ),
    ) {
        run(cfg, &ops)?;
    }

    /// Release-heavy: a second release of any handle decrements nothing.
    #[test]
    fn release_again_never_decrements_twice(
        cfg in config_strategy(8..=32),
        ops in prop::collection::vec(
            op_strategy(Weights { release: 6, again: 6, ..MIXED }, 20, 8),
            1..200,
        ),
    ) {
        run(cfg, &ops)?;
    }
}

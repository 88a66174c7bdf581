//! A decode worker's continuous batch, advanced in O(batch / page size) work per iteration
//! instead of O(batch).
//!
//! Each decode iteration adds one token to every running sequence. Calling the core's
//! `PoolCore::append(seq, 1)` for every sequence on every iteration makes an iteration
//! cost O(batch) (the simulator's hot loop). Most of those calls change nothing but a
//! length: a page is allocated only when a sequence crosses a page boundary, and a tail
//! page is copied only on the first write into a page another table still holds. The
//! pool reports that headroom (`PoolCore::append_headroom`), so this batch calls
//! `append` once per sequence per *page* (the "touch"), with all the tokens produced since
//! the last call, at exactly the iteration whose token needs the page. Pages, refcounts,
//! copy-on-write copies, exhaustion errors and the free list's order are therefore the
//! same as with one call per token, in the same iteration and in the same order (touches
//! in one iteration run in admission order, as the per-token loop ran over its batch);
//! `tests::lazy_batch_matches_per_token_appends` checks it against that loop.
//!
//! Touches wait on a timing wheel (a sequence's next touch is at most one page of
//! iterations ahead), finishes in a heap keyed by (finish iteration, admission order).
//! The batch's context sum, which the decode cost model needs every iteration, is kept
//! in closed form: a sequence's context at iteration `k` is `synced_ctx + k - synced_iter`,
//! so the sum is `sum(synced_ctx - synced_iter) + n * k` (in wrapping arithmetic, whose
//! result is exact because the true sum fits in `u64`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::ServeError;
use crate::fork::{PoolCore, SeqId};

/// A sequence leaving the batch (finished or preempted) with its context length then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leaving {
    /// The engine's job id.
    pub job: u32,
    /// Its KV sequence.
    pub seq: SeqId,
    /// Tokens in its context (prompt plus the output tokens whose KV was written).
    pub ctx: u64,
}

/// What one iteration did, in the order the per-token loop would have done it.
#[derive(Debug, Default)]
pub struct StepOutcome {
    /// `(job, tokens)`: output tokens a leaving sequence produced since its admission. A
    /// preempted sequence is reported with the token whose KV append failed too (it was
    /// sampled; its KV was not written, so it recomputes on re-admission).
    pub credits: Vec<(u32, u64)>,
    /// Sequences whose next page could not be allocated (KV pool full), in batch order.
    pub preempted: Vec<Leaving>,
    /// Sequences that produced their last token this iteration, in batch order.
    pub finished: Vec<Leaving>,
    /// Bytes copied by copy-on-write this iteration.
    pub cow_bytes: u64,
}

impl StepOutcome {
    /// Empty every list (keeping their buffers).
    pub fn clear(&mut self) {
        self.credits.clear();
        self.preempted.clear();
        self.finished.clear();
        self.cow_bytes = 0;
    }
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    job: u32,
    seq: SeqId,
    /// Admission order within this batch (the per-token loop's batch order).
    order: u64,
    /// Iteration of admission.
    admit_iter: u64,
    /// First iteration whose token is not yet appended to the pool.
    synced_iter: u64,
    /// Context length the pool holds for this sequence.
    synced_ctx: u64,
    /// Iteration after which the sequence leaves (its last token, or its only iteration
    /// when it has no token to decode).
    finish_iter: u64,
    /// False for a sequence admitted with nothing left to decode: it spends one
    /// iteration in the batch and appends nothing.
    appends: bool,
    live: bool,
}

/// One decode worker's running batch.
#[derive(Debug)]
pub struct DecodeBatch {
    slots: Vec<Slot>,
    free_slots: Vec<u32>,
    len: u32,
    /// Iterations completed (the index of the next one).
    iter: u64,
    next_order: u64,
    /// Wrapping sum of `synced_ctx - synced_iter` over appending sequences.
    base: u64,
    appending: u64,
    /// Context sum of sequences that do not append.
    still_ctx: u64,
    /// Touches by iteration modulo the wheel's size: `(order, slot)`.
    wheel: Vec<Vec<(u64, u32)>>,
    finish: BinaryHeap<Reverse<(u64, u64, u32)>>,
}

impl DecodeBatch {
    /// An empty batch for pages of `block_tokens` tokens.
    pub fn new(block_tokens: u32) -> Self {
        let size = (u64::from(block_tokens) + 2).next_power_of_two() as usize;
        Self {
            slots: Vec::new(),
            free_slots: Vec::new(),
            len: 0,
            iter: 0,
            next_order: 0,
            base: 0,
            appending: 0,
            still_ctx: 0,
            wheel: vec![Vec::new(); size],
            finish: BinaryHeap::new(),
        }
    }

    /// Sequences in the batch.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True when nothing runs.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sum of the running sequences' context lengths for the next iteration.
    pub fn ctx_sum(&self) -> u64 {
        self.base
            .wrapping_add(self.appending.wrapping_mul(self.iter))
            .wrapping_add(self.still_ctx)
    }

    /// The wheel slot of iteration `k` (the wheel's size is a power of two).
    #[inline]
    fn slot(&self, k: u64) -> usize {
        (k & (self.wheel.len() as u64 - 1)) as usize
    }

    fn schedule(&mut self, at: u64, from: u64, order: u64, idx: u32) {
        // At most one wheel turn ahead; an earlier touch than needed appends without
        // allocating, which changes nothing but the length the pool holds.
        let at = at.min(from + self.wheel.len() as u64 - 1);
        let slot = self.slot(at);
        self.wheel[slot].push((order, idx));
    }

    /// Admit `seq` (holding `ctx` tokens) with `decode_left` tokens to produce; it runs
    /// from the next iteration on.
    pub fn admit(
        &mut self,
        pool: &PoolCore,
        job: u32,
        seq: SeqId,
        ctx: u64,
        decode_left: u64,
    ) -> Result<(), ServeError> {
        let k = self.iter;
        let order = self.next_order;
        self.next_order += 1;
        let appends = decode_left > 0;
        let slot = Slot {
            job,
            seq,
            order,
            admit_iter: k,
            synced_iter: k,
            synced_ctx: ctx,
            finish_iter: k + decode_left.max(1) - 1,
            appends,
            live: true,
        };
        let idx = match self.free_slots.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                self.slots.push(slot);
                (self.slots.len() - 1) as u32
            }
        };
        self.len += 1;
        if appends {
            self.base = self.base.wrapping_add(ctx).wrapping_sub(k);
            self.appending += 1;
            let h = pool
                .append_headroom(seq)
                .map_err(|e| ServeError::Pool("decode admit", e))?;
            if k + h <= slot.finish_iter {
                self.schedule(k + h, k, order, idx);
            }
        } else {
            self.still_ctx += ctx;
        }
        self.finish.push(Reverse((slot.finish_iter, order, idx)));
        Ok(())
    }

    fn remove(&mut self, idx: u32) {
        let s = &mut self.slots[idx as usize];
        s.live = false;
        if s.appends {
            self.base = self
                .base
                .wrapping_sub(s.synced_ctx.wrapping_sub(s.synced_iter));
            self.appending -= 1;
        } else {
            self.still_ctx -= s.synced_ctx;
        }
        self.len -= 1;
        self.free_slots.push(idx);
    }

    fn current(&self, idx: u32, order: u64) -> Option<Slot> {
        let s = self.slots[idx as usize];
        (s.live && s.order == order).then_some(s)
    }

    /// The touches due at iteration `k` (its wheel slot, in admission order).
    fn touch_due(
        &mut self,
        k: u64,
        pool: &mut PoolCore,
        out: &mut StepOutcome,
    ) -> Result<(), ServeError> {
        let here = self.slot(k);
        let mut due = std::mem::take(&mut self.wheel[here]);
        due.sort_unstable();
        for &(order, idx) in &due {
            let Some(s) = self.current(idx, order) else {
                continue;
            };
            let count = k + 1 - s.synced_iter;
            match pool.append(s.seq, count) {
                Ok(a) => {
                    out.cow_bytes += a.cow.map_or(0, |c| c.bytes);
                    let s = &mut self.slots[idx as usize];
                    s.synced_iter = k + 1;
                    s.synced_ctx += count;
                    let next = k + 1 + a.headroom;
                    if next <= s.finish_iter {
                        self.schedule(next, k + 1, order, idx);
                    }
                }
                Err(_) => {
                    out.credits.push((s.job, k + 1 - s.admit_iter));
                    out.preempted.push(Leaving {
                        job: s.job,
                        seq: s.seq,
                        ctx: s.synced_ctx + (k - s.synced_iter),
                    });
                    self.remove(idx);
                }
            }
        }
        due.clear();
        let slot = self.slot(k);
        let slot = &mut self.wheel[slot];
        if slot.is_empty() {
            *slot = due;
        }
        Ok(())
    }

    /// Complete one iteration: every running sequence produced a token. What changed is
    /// written to `out` (cleared first, so its buffers are reused).
    pub fn step(&mut self, pool: &mut PoolCore, out: &mut StepOutcome) -> Result<(), ServeError> {
        let k = self.iter;
        out.clear();
        // Most iterations cross no page boundary: skip the wheel slot's take-sort-return.
        if !self.wheel[self.slot(k)].is_empty() {
            self.touch_due(k, pool, out)?;
        }
        while let Some(&Reverse((fi, order, idx))) = self.finish.peek() {
            if fi > k {
                break;
            }
            self.finish.pop();
            let Some(s) = self.current(idx, order) else {
                continue;
            };
            let mut ctx = s.synced_ctx;
            if s.appends {
                let count = k + 1 - s.synced_iter;
                if count > 0 {
                    let a = pool
                        .append(s.seq, count)
                        .map_err(|e| ServeError::Pool("decode finish", e))?;
                    if a.pages_allocated > 0 || a.cow.is_some() {
                        return Err(ServeError::HeadroomAllocated { tokens: count });
                    }
                    ctx += count;
                    let sl = &mut self.slots[idx as usize];
                    sl.synced_ctx = ctx;
                    sl.synced_iter = k + 1;
                }
                out.credits.push((s.job, k + 1 - s.admit_iter));
            }
            out.finished.push(Leaving {
                job: s.job,
                seq: s.seq,
                ctx,
            });
            self.remove(idx);
        }
        self.iter = k + 1;
        Ok(())
    }

    /// The running sequences in admission order, for the next iteration: `(job, seq,
    /// context length before the iteration's token, appends)`. O(batch); a real backend's
    /// view (the simulator never asks).
    pub fn live(&self) -> Vec<(u32, SeqId, u64, bool)> {
        let mut v: Vec<(u64, u32, SeqId, u64, bool)> = self
            .slots
            .iter()
            .filter(|s| s.live)
            .map(|s| {
                let ctx = if s.appends {
                    s.synced_ctx + (self.iter - s.synced_iter)
                } else {
                    s.synced_ctx
                };
                (s.order, s.job, s.seq, ctx, s.appends)
            })
            .collect();
        v.sort_unstable_by_key(|x| x.0);
        v.into_iter().map(|(_, j, s, c, a)| (j, s, c, a)).collect()
    }

    /// Output tokens of completed iterations not reported yet, per running sequence
    /// (for a run cut off by its horizon).
    pub fn unreported(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.slots
            .iter()
            .filter(|s| s.live && s.appends && self.iter > s.admit_iter)
            .map(|s| (s.job, self.iter - s.admit_iter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fork::{PoolConfig, TailPolicy};
    use proptest::prelude::*;

    /// The reference: the per-token loop the simulator ran before (one `append(seq, 1)`
    /// per running sequence per iteration, in batch order).
    struct Eager {
        pool: PoolCore,
        running: Vec<(u32, SeqId, u64, u64)>,
    }

    impl Eager {
        fn step(&mut self) -> StepOutcome {
            let mut o = StepOutcome::default();
            let mut keep = Vec::new();
            for (job, seq, ctx, left) in std::mem::take(&mut self.running) {
                if left == 0 {
                    o.finished.push(Leaving { job, seq, ctx });
                    continue;
                }
                o.credits.push((job, 1));
                match self.pool.append(seq, 1) {
                    Ok(a) => {
                        o.cow_bytes += a.cow.map_or(0, |c| c.bytes);
                        if left == 1 {
                            o.finished.push(Leaving {
                                job,
                                seq,
                                ctx: ctx + 1,
                            });
                        } else {
                            keep.push((job, seq, ctx + 1, left - 1));
                        }
                    }
                    Err(_) => o.preempted.push(Leaving { job, seq, ctx }),
                }
            }
            self.running = keep;
            o
        }
    }

    fn tally(c: &[(u32, u64)]) -> std::collections::BTreeMap<u32, u64> {
        let mut m = std::collections::BTreeMap::new();
        for &(j, n) in c {
            *m.entry(j).or_insert(0) += n;
        }
        m
    }

    /// Pages, refcounts and the free list, without lengths (the lazy pool's lag).
    type Pages = (Vec<u32>, Vec<u32>, Vec<(SeqId, Vec<u32>)>);

    fn pages(p: &PoolCore) -> Pages {
        let s = p.snapshot();
        let tables = s.tables.into_iter().map(|(id, _, t)| (id, t)).collect();
        (s.refcounts, s.free, tables)
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit {
            ctx: u16,
            left: u8,
        },
        Step,
        /// Fork a sequence that finished in the last step into `n` branches.
        Fork {
            n: u8,
            left: u8,
        },
    }

    fn pool(cap: u32, block: u32) -> PoolCore {
        PoolCore::new(PoolConfig::new(cap, block, 3)).unwrap()
    }

    /// A pool of 16 pages of `block` tokens and a batch running one sequence (job 0) of
    /// `ctx` tokens with `left` to produce.
    fn one_sequence(block: u32, ctx: u64, left: u64) -> (PoolCore, SeqId, DecodeBatch) {
        let mut p = pool(16, block);
        let seq = p.allocate(ctx).unwrap();
        let mut b = DecodeBatch::new(block);
        b.admit(&p, 0, seq, ctx, left).unwrap();
        (p, seq, b)
    }

    /// The batch's point: a sequence's tokens reach the pool only when its tail page is
    /// full (one `append` a page), never token by token. Lengths lag; pages do not.
    #[test]
    fn appends_wait_for_the_page_boundary() {
        let (mut p, seq, mut b) = one_sequence(16, 1, 40);
        let mut out = StepOutcome::default();
        // Headroom 15: iterations 0..=14 write into the first page without telling the pool.
        for k in 0..15 {
            b.step(&mut p, &mut out).unwrap();
            assert_eq!(
                p.seq_len(seq).unwrap(),
                1,
                "no append before the page fills (step {k})"
            );
            assert_eq!(p.table(seq).unwrap().len(), 1);
        }
        // Iteration 15 writes the 17th token: one append of the 16 since admission.
        b.step(&mut p, &mut out).unwrap();
        assert_eq!(p.seq_len(seq).unwrap(), 17);
        assert_eq!(p.table(seq).unwrap().len(), 2);
        assert_eq!(b.ctx_sum(), 17);
    }

    /// `unreported` names the sequences with tokens to report, none before their first
    /// completed iteration (a run cut off there has produced nothing for them).
    #[test]
    fn unreported_names_only_sequences_with_produced_tokens() {
        let mut p = pool(16, 16);
        let mut b = DecodeBatch::new(16);
        let mut out = StepOutcome::default();
        let first = p.allocate(3).unwrap();
        b.admit(&p, 7, first, 3, 10).unwrap();
        assert_eq!(b.unreported().count(), 0);
        b.step(&mut p, &mut out).unwrap();
        let second = p.allocate(2).unwrap();
        b.admit(&p, 8, second, 2, 10).unwrap();
        assert_eq!(b.unreported().collect::<Vec<_>>(), vec![(7, 1)]);
        b.step(&mut p, &mut out).unwrap();
        assert_eq!(b.unreported().collect::<Vec<_>>(), vec![(7, 2), (8, 1)]);
    }

    /// The batch owns its sequences' appends: when a sequence's length in the pool moved
    /// under it (an append from elsewhere filled its tail page), the finishing append
    /// allocates a page the batch never planned for, and the step reports it as an error
    /// instead of going on.
    #[test]
    fn a_finishing_append_that_would_allocate_is_an_error() {
        // Three tokens to produce, within the headroom of 3: no touch before the finish.
        let (mut p, seq, mut b) = one_sequence(4, 1, 3);
        let mut out = StepOutcome::default();
        p.append(seq, 3).unwrap();
        b.step(&mut p, &mut out).unwrap();
        b.step(&mut p, &mut out).unwrap();
        assert!(matches!(
            b.step(&mut p, &mut out),
            Err(ServeError::HeadroomAllocated { tokens: 3 })
        ));
        assert_eq!(p.table(seq).unwrap().len(), 2, "the page the error reports");
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (1u16..120, 0u8..60).prop_map(|(ctx, left)| Op::Admit { ctx, left }),
            6 => Just(Op::Step),
            1 => (1u8..5, 0u8..40).prop_map(|(n, left)| Op::Fork { n, left }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn lazy_batch_matches_per_token_appends(
            cap in 8u32..80,
            block in prop_oneof![Just(1u32), Just(4), Just(16), Just(7)],
            cow in any::<bool>(),
            ops in prop::collection::vec(op(), 1..200),
        ) {
            let mut cfg = PoolConfig::new(cap, block, 3);
            cfg.tail = if cow { TailPolicy::CopyOnWrite } else { TailPolicy::CopyAtFork };
            let mut eager = Eager { pool: PoolCore::new(cfg).unwrap(), running: Vec::new() };
            let mut lazy_pool = PoolCore::new(cfg).unwrap();
            let mut lazy = DecodeBatch::new(block);
            let mut lo = StepOutcome::default();
            let mut job = 0u32;
            let mut last_finished: Vec<Leaving> = Vec::new();
            let mut lazy_credits = std::collections::BTreeMap::new();
            let mut eager_credits = std::collections::BTreeMap::new();
            for op in ops {
                match op {
                    Op::Admit { ctx, left } => {
                        let (a, b) = (eager.pool.allocate(u64::from(ctx)), lazy_pool.allocate(u64::from(ctx)));
                        prop_assert_eq!(a.is_ok(), b.is_ok());
                        if let (Ok(a), Ok(b)) = (a, b) {
                            prop_assert_eq!(a, b);
                            eager.running.push((job, a, u64::from(ctx), u64::from(left)));
                            lazy.admit(&lazy_pool, job, b, u64::from(ctx), u64::from(left)).unwrap();
                            job += 1;
                        }
                    }
                    Op::Step => {
                        let StepOutcome { credits: ec, preempted: ep, finished: ef, cow_bytes: ecow } = eager.step();
                        lazy.step(&mut lazy_pool, &mut lo).unwrap();
                        prop_assert_eq!(&ep, &lo.preempted);
                        prop_assert_eq!(&ef, &lo.finished);
                        prop_assert_eq!(ecow, lo.cow_bytes);
                        for (j, n) in tally(&ec) { *eager_credits.entry(j).or_insert(0) += n; }
                        for (j, n) in tally(&lo.credits) { *lazy_credits.entry(j).or_insert(0) += n; }
                        // Preempted sequences give their pages back now; finished ones
                        // may still fork below (or keep their pages: a fuller pool).
                        for l in &ep {
                            prop_assert_eq!(eager.pool.release(l.seq).is_ok(), lazy_pool.release(l.seq).is_ok());
                        }
                        last_finished = ef;
                        prop_assert_eq!(pages(&eager.pool), pages(&lazy_pool));
                        prop_assert_eq!(eager.running.len() as u32, lazy.len());
                        let esum: u64 = eager.running.iter().map(|r| r.2).sum();
                        prop_assert_eq!(esum, lazy.ctx_sum());
                        // Unreported tokens plus reported ones equal the per-token count.
                        let mut all = lazy_credits.clone();
                        for (j, n) in lazy.unreported() { *all.entry(j).or_insert(0) += n; }
                        prop_assert_eq!(&all, &eager_credits);
                    }
                    Op::Fork { n, left } => {
                        let Some(l) = last_finished.pop() else { continue };
                        let (a, b) = (eager.pool.fork(l.seq, u32::from(n)), lazy_pool.fork(l.seq, u32::from(n)));
                        prop_assert_eq!(a.is_ok(), b.is_ok());
                        if let (Ok(a), Ok(b)) = (a, b) {
                            prop_assert_eq!(&a.branches, &b.branches);
                            prop_assert_eq!(a.cost.tail_copy_bytes, b.cost.tail_copy_bytes);
                            for (i, s) in a.branches.iter().enumerate() {
                                let left = u64::from(left) + i as u64;
                                eager.running.push((job, *s, l.ctx, left));
                                lazy.admit(&lazy_pool, job, *s, l.ctx, left).unwrap();
                                job += 1;
                            }
                        }
                    }
                }
            }
        }
    }
}

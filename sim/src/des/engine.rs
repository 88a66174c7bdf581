//! The event queue: events ordered by (integer ns time, kind priority, insertion sequence).
//!
//! Equal times are broken first by a kind priority the model chooses (e.g. completions
//! before arrivals, so a resource freed at `t` is visible to a request arriving at `t`),
//! then FIFO by insertion order, so the same inputs always pop in the same order (nexosim
//! and BLIS do the same). Trace arrivals do not enter the heap: they stay on a cursor and
//! are merged at pop time (simcore), which keeps the heap small.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Integer nanoseconds of virtual time.
pub type Time = u64;

/// An event and its key, `(time, prio, seq)` packed into one `u128` (time in the high 64
/// bits, then the priority's 8, then the sequence's 56), so an ordering is one integer
/// comparison; the order is exactly the tuple's (`seq` stays below 2^56).
struct Entry<E> {
    key: u128,
    ev: E,
}

const SEQ_BITS: u32 = 56;

fn pack(time: Time, prio: u8, seq: u64) -> u128 {
    debug_assert!(seq < 1 << SEQ_BITS, "event sequence overflow");
    (u128::from(time) << 64) | (u128::from(prio) << SEQ_BITS) | u128::from(seq)
}

impl<E> Entry<E> {
    fn time(&self) -> Time {
        (self.key >> 64) as Time
    }
    fn prio(&self) -> u8 {
        (self.key >> SEQ_BITS) as u8
    }
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, o: &Self) -> bool {
        self.key == o.key
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<E> Ord for Entry<E> {
    #[inline]
    fn cmp(&self, o: &Self) -> Ordering {
        // BinaryHeap is a max-heap: reverse so the smallest key pops first.
        o.key.cmp(&self.key)
    }
}

/// A deterministic priority queue of timed events.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
    now: Time,
    popped: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            seq: 0,
            now: 0,
            popped: 0,
        }
    }
}

impl<E> EventQueue<E> {
    /// An empty queue at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Current virtual time (the time of the last popped event).
    pub fn now(&self) -> Time {
        self.now
    }

    /// Events popped so far.
    pub fn popped(&self) -> u64 {
        self.popped
    }

    /// Events waiting.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Schedule `ev` at `time` (clamped to now: the clock never runs backwards).
    pub fn push(&mut self, time: Time, prio: u8, ev: E) {
        self.seq += 1;
        self.heap.push(Entry {
            key: pack(time.max(self.now), prio, self.seq),
            ev,
        });
    }

    /// Time and priority of the next event, if any.
    pub fn peek_key(&self) -> Option<(Time, u8)> {
        self.heap.peek().map(|e| (e.time(), e.prio()))
    }

    /// The next event, if any.
    pub fn peek(&self) -> Option<&E> {
        self.heap.peek().map(|e| &e.ev)
    }

    /// Pop the next event and advance the clock to it.
    pub fn pop(&mut self) -> Option<(Time, E)> {
        let e = self.heap.pop()?;
        let t = e.time();
        debug_assert!(t >= self.now, "clock monotonicity");
        self.now = t;
        self.popped += 1;
        Some((t, e.ev))
    }

    /// Advance the clock to `t` for an event taken from outside the heap (an arrival
    /// cursor); `t` earlier than now is clamped.
    pub fn advance_to(&mut self, t: Time) -> Time {
        self.now = self.now.max(t);
        self.popped += 1;
        self.now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_times_pop_by_priority_then_fifo() {
        let mut q = EventQueue::new();
        q.push(10, 1, "b1");
        q.push(10, 0, "a1");
        q.push(5, 9, "first");
        q.push(10, 1, "b2");
        q.push(10, 0, "a2");
        let order: Vec<_> = std::iter::from_fn(|| {
            let next = q.peek().copied();
            let e = q.pop().map(|(_, e)| e);
            assert_eq!(next, e, "peek shows what pop takes");
            e
        })
        .collect();
        assert_eq!(order, ["first", "a1", "a2", "b1", "b2"]);
    }

    #[test]
    fn clock_never_runs_backwards() {
        let mut q = EventQueue::new();
        q.push(100, 0, 1);
        assert_eq!(q.pop(), Some((100, 1)));
        q.push(50, 0, 2); // scheduled in the past: clamped to now
        assert_eq!(q.pop(), Some((100, 2)));
        assert_eq!(q.now(), 100);
    }
}

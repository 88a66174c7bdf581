//! Host cores time-sliced among more compute threads than there are cores.
//!
//! The CPU backend stands in for a cluster of devices with one thread per worker; on a
//! host with fewer cores than workers the threads must share the cores. Left to the
//! kernel, that sharing follows the kernel's scheduler, whose heuristics (EEVDF favours
//! short, often-waking threads) no simulator models; measured on the 2-core VM, decode
//! iterations stretched 1.0x while encoder and prefill steps stretched 1.3-1.4x under the
//! same load. [`CoreGate`] makes the sharing a stated discipline instead: at most `cores`
//! steps hold a core at once, a step waits for one in first-come order, and a step that
//! has held its core for a quantum gives it to the longest waiter at its next
//! checkpoint (round robin). With a quantum much shorter than the steps this is
//! processor sharing with equal weights, the simulator's `SharedCores` (INVARIANTS D9),
//! up to one quantum per step.
//!
//! [`CoreQueue`] is the rule, a plain state machine (`&mut self`, deterministic, no
//! clock: the caller says how long a core has been held). [`CoreGate`] wraps it in one
//! mutex and a condition variable for the backend's threads; it is the one place in this
//! crate that blocks a thread, and only the real backend calls it. Under `cfg(loom)` the
//! mutex, condition variable and atomic are loom's (`tests/loom_cores.rs`).

use std::collections::VecDeque;
use std::fmt;

mod sync {
    #[cfg(loom)]
    pub(super) use loom::sync::atomic::{AtomicUsize, Ordering};
    #[cfg(loom)]
    pub(super) use loom::sync::{Condvar, Mutex, MutexGuard};
    #[cfg(not(loom))]
    pub(super) use std::sync::atomic::{AtomicUsize, Ordering};
    #[cfg(not(loom))]
    pub(super) use std::sync::{Condvar, Mutex, MutexGuard};
}
use sync::{AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

/// A place in the queue for a core, handed out in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(u64);

/// An invalid gate configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoresError(String);

impl fmt::Display for CoresError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CoresError {}

/// The rule: `cores` cores, first come first served, one queue.
///
/// A thread asks with [`CoreQueue::request`] and takes a core with
/// [`CoreQueue::try_take`], which succeeds only for the ticket at the front of the queue
/// while a core is free, so cores are granted strictly in ticket order. A grant names the
/// core (`0..cores`): the one freed last, so a thread that yields hands its very core to
/// the next in line (a driver pins the thread to it, and the kernel cannot leave that core
/// idle while the two threads share another). A holder gives its core back with
/// [`CoreQueue::release`]; to yield it asks again (a new ticket, at the back) after
/// releasing.
#[derive(Debug, Clone)]
pub struct CoreQueue {
    cores: usize,
    /// Free cores; the last freed on top.
    free: Vec<usize>,
    /// `held[c]`: core `c` is held.
    held: Vec<bool>,
    /// Waiting tickets in order, each with its caller's tag (a thread id, say).
    queue: VecDeque<(Ticket, u64)>,
    next: u64,
}

impl CoreQueue {
    /// A queue for `cores` cores (at least one).
    pub fn new(cores: usize) -> Result<Self, CoresError> {
        if cores == 0 {
            return Err(CoresError(
                "cores: expected at least 1 core to share, got 0".into(),
            ));
        }
        Ok(Self {
            cores,
            free: (0..cores).rev().collect(),
            held: vec![false; cores],
            queue: VecDeque::new(),
            next: 0,
        })
    }

    /// The number of cores.
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// Cores held now.
    pub fn running(&self) -> usize {
        self.cores - self.free.len()
    }

    /// Tickets waiting for a core.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// Joins the queue with `tag` (whatever the caller needs to find the thread again);
    /// the ticket is behind every ticket handed out before it.
    pub fn request(&mut self, tag: u64) -> Ticket {
        let t = Ticket(self.next);
        self.next += 1;
        self.queue.push_back((t, tag));
        t
    }

    /// Who takes a core next and which: the front ticket's tag and the core freed last,
    /// when a core is free and someone waits.
    pub fn next_grant(&self) -> Option<(u64, usize)> {
        let &(_, tag) = self.queue.front()?;
        Some((tag, *self.free.last()?))
    }

    /// Takes a core for `t` if `t` is at the front of the queue and a core is free (the
    /// one freed last); otherwise changes nothing and returns `None`.
    pub fn try_take(&mut self, t: Ticket) -> Option<usize> {
        if self.queue.front().map(|&(f, _)| f) != Some(t) {
            return None;
        }
        let core = self.free.pop()?;
        self.queue.pop_front();
        self.held[core] = true;
        Some(core)
    }

    /// Whether the front ticket could take a core now (a free core and a waiter).
    pub fn grantable(&self) -> bool {
        !self.free.is_empty() && !self.queue.is_empty()
    }

    /// Gives core `core` back. Returns false (and changes nothing) when that core is not
    /// held, so a double release cannot make room that is not there.
    pub fn release(&mut self, core: usize) -> bool {
        match self.held.get_mut(core) {
            Some(h @ true) => {
                *h = false;
                self.free.push(core);
                true
            }
            _ => false,
        }
    }

    /// Whether a holder that has held its core for `held_ns` should yield it: a quantum
    /// has passed and someone is waiting.
    pub fn should_yield(&self, held_ns: u64, quantum_ns: u64) -> bool {
        held_ns >= quantum_ns && !self.queue.is_empty()
    }
}

/// What a gate does, under its lock, just before it wakes the thread that will take a
/// core: `(tag, core)` of [`CoreQueue::next_grant`]. The real backend pins that thread to
/// that core, so the thread wakes on the core its predecessor is leaving (which then
/// switches straight to it) instead of wherever the kernel would put it: on a VM, an
/// idle virtual CPU to be woken while the two threads share the other (measured on the
/// 2-core VM: three threads kept 73% of two cores' work without it, 95% with it).
pub type Handoff = Box<dyn Fn(u64, usize) + Send + Sync>;

/// [`CoreQueue`] shared by threads: blocking [`CoreGate::acquire`], [`CoreGate::release`],
/// and a lock-free [`CoreGate::should_yield`] for the checkpoints between operators.
pub struct CoreGate {
    queue: Mutex<CoreQueue>,
    wake: Condvar,
    /// `queue.waiting()`, written under the lock, read without it by `should_yield`.
    waiting: AtomicUsize,
    quantum_ns: u64,
    handoff: Option<Handoff>,
}

impl fmt::Debug for CoreGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CoreGate")
            .field("queue", &self.queue)
            .field("quantum_ns", &self.quantum_ns)
            .field("handoff", &self.handoff.is_some())
            .finish()
    }
}

impl CoreGate {
    /// A gate over `cores` cores that asks a holder to yield after `quantum_ns` when
    /// someone waits (`quantum_ns` at least 1).
    pub fn new(cores: usize, quantum_ns: u64) -> Result<Self, CoresError> {
        if quantum_ns == 0 {
            return Err(CoresError("quantum: expected at least 1 ns, got 0".into()));
        }
        Ok(Self {
            queue: Mutex::new(CoreQueue::new(cores)?),
            wake: Condvar::new(),
            waiting: AtomicUsize::new(0),
            quantum_ns,
            handoff: None,
        })
    }

    /// The gate with `handoff` called before each wake-up of a thread that will take a
    /// core ([`Handoff`]).
    pub fn with_handoff(mut self, handoff: Handoff) -> Self {
        self.handoff = Some(handoff);
        self
    }

    /// Wakes the waiters when a core can be taken, telling the hand-off first who takes
    /// which.
    fn wake_next(&self, q: &CoreQueue) {
        if let Some((tag, core)) = q.next_grant() {
            if let Some(h) = &self.handoff {
                h(tag, core);
            }
            self.wake.notify_all();
        }
    }

    /// The number of cores.
    pub fn cores(&self) -> usize {
        self.lock().cores()
    }

    /// The quantum, ns.
    pub fn quantum_ns(&self) -> u64 {
        self.quantum_ns
    }

    fn lock(&self) -> MutexGuard<'_, CoreQueue> {
        // The lock is only held inside this type's own code, which does not panic, so a
        // poisoned lock still holds a consistent queue.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Blocks until this thread holds a core, granted in the order of the calls; returns
    /// the core (`0..cores`). `tag` is what [`Handoff`] is told of this thread.
    pub fn acquire(&self, tag: u64) -> usize {
        let mut q = self.lock();
        let t = q.request(tag);
        self.waiting.store(q.waiting(), Ordering::Relaxed);
        let core = loop {
            if let Some(c) = q.try_take(t) {
                break c;
            }
            q = self
                .wake
                .wait(q)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        };
        self.waiting.store(q.waiting(), Ordering::Relaxed);
        // Two cores freed before the first waiter woke: the next one may go too.
        self.wake_next(&q);
        core
    }

    /// Gives core `core` back (a no-op when it is not held).
    pub fn release(&self, core: usize) {
        let mut q = self.lock();
        q.release(core);
        self.wake_next(&q);
    }

    /// Whether a holder that has held its core for `held_ns` should [`CoreGate::rotate`]:
    /// a quantum has passed and someone waits. Reads one atomic, takes no lock.
    pub fn should_yield(&self, held_ns: u64) -> bool {
        held_ns >= self.quantum_ns && self.waiting.load(Ordering::Relaxed) > 0
    }

    /// Gives core `core` to the longest waiter and waits for one again, at the back;
    /// returns the core it then holds.
    pub fn rotate(&self, core: usize, tag: u64) -> usize {
        self.release(core);
        self.acquire(tag)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_needs_a_core_and_a_gate_a_quantum() {
        assert!(CoreQueue::new(0).unwrap_err().to_string().contains("cores"));
        assert!(CoreGate::new(1, 0)
            .unwrap_err()
            .to_string()
            .contains("quantum"));
        assert!(CoreGate::new(0, 1)
            .unwrap_err()
            .to_string()
            .contains("cores"));
    }

    #[test]
    fn cores_go_in_ticket_order_and_never_beyond_the_count() {
        let mut q = CoreQueue::new(2).unwrap();
        let (a, b, c) = (q.request(10), q.request(11), q.request(12));
        assert_eq!(q.next_grant(), Some((10, 0)));
        assert_eq!(q.try_take(b), None, "b is behind a");
        assert_eq!((q.try_take(a), q.try_take(b)), (Some(0), Some(1)));
        assert_eq!(q.try_take(c), None, "both cores held");
        assert!(q.should_yield(5, 5) && !q.should_yield(4, 5));
        assert_eq!(q.next_grant(), None, "no core free");
        assert!(q.release(0));
        assert!(!q.release(0), "core 0 is free already");
        assert_eq!(q.next_grant(), Some((12, 0)));
        assert_eq!(q.try_take(c), Some(0), "c takes the core a freed");
        assert!(!q.should_yield(100, 5), "nobody waits");
        assert_eq!((q.running(), q.waiting()), (2, 0));
        assert!(q.release(1) && q.release(0) && !q.release(1) && !q.release(2));
    }

    #[test]
    fn a_lone_thread_never_waits_and_never_yields() {
        let g = CoreGate::new(1, 1).unwrap();
        for _ in 0..3 {
            let c = g.acquire(7);
            assert_eq!(c, 0);
            assert!(!g.should_yield(u64::MAX));
            g.release(c);
        }
        assert_eq!((g.cores(), g.quantum_ns()), (1, 1));
    }
}

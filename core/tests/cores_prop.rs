//! `CoreQueue` (the host-core time-slicing rule) against a trivially correct model, and
//! `CoreGate` under real threads (the loom model check is `tests/loom_cores.rs`).
//!
//! The model: a list of waiting threads in arrival order and a count of holders. A take
//! succeeds exactly for the first waiter while fewer than `cores` hold a core; a release
//! by a holder frees one. Each thread is a small state machine (idle, waiting with a
//! ticket, holding), so every operation the test sends is one a real thread could send.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use moonagent_core::cores::{CoreGate, CoreQueue, Ticket};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Thread `t` asks for a core (if idle).
    Request(u8),
    /// Thread `t` tries to take a core with its ticket (if waiting).
    Take(u8),
    /// Thread `t` gives its core back (if holding).
    Release(u8),
    /// Thread `t` yields: gives its core back and asks again (if holding).
    Rotate(u8),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Th {
    Idle,
    Waiting(Ticket),
    Holding,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..6).prop_map(Op::Request),
        (0u8..6).prop_map(Op::Take),
        (0u8..6).prop_map(Op::Release),
        (0u8..6).prop_map(Op::Rotate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn the_queue_grants_in_arrival_order_and_never_beyond_its_cores(
        cores in 1usize..4,
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut q = CoreQueue::new(cores).unwrap();
        let mut th = [Th::Idle; 6];
        // The model: waiting threads in arrival order, and the number holding a core.
        let mut waiting: VecDeque<usize> = VecDeque::new();
        let mut holders = 0usize;
        let mut last_grant: Option<Ticket> = None;
        for op in ops {
            match op {
                Op::Request(t) | Op::Rotate(t) => {
                    let t = t as usize;
                    if matches!(op, Op::Rotate(_)) {
                        if th[t] != Th::Holding {
                            continue;
                        }
                        prop_assert!(q.release());
                        holders -= 1;
                    } else if th[t] != Th::Idle {
                        continue;
                    }
                    th[t] = Th::Waiting(q.request());
                    waiting.push_back(t);
                }
                Op::Take(t) => {
                    let t = t as usize;
                    let Th::Waiting(ticket) = th[t] else { continue };
                    let expect = holders < cores && waiting.front() == Some(&t);
                    prop_assert_eq!(q.try_take(ticket), expect, "thread {} ticket {:?}", t, ticket);
                    if expect {
                        waiting.pop_front();
                        holders += 1;
                        th[t] = Th::Holding;
                        // Grants go in ticket order.
                        prop_assert!(last_grant.is_none_or(|g| g < ticket));
                        last_grant = Some(ticket);
                    }
                }
                Op::Release(t) => {
                    let t = t as usize;
                    if th[t] != Th::Holding {
                        // A release by a thread that holds nothing frees nothing real; the
                        // queue refuses it only when no core at all is held.
                        continue;
                    }
                    prop_assert!(q.release());
                    holders -= 1;
                    th[t] = Th::Idle;
                }
            }
            prop_assert_eq!(q.running(), holders);
            prop_assert_eq!(q.waiting(), waiting.len());
            prop_assert!(q.running() <= cores);
            prop_assert_eq!(q.grantable(), holders < cores && !waiting.is_empty());
            prop_assert_eq!(q.should_yield(10, 10), !waiting.is_empty());
            prop_assert!(!q.should_yield(9, 10));
        }
        // Draining: every waiter gets a core in turn once holders leave.
        for t in th.iter().filter(|&&t| t == Th::Holding) {
            prop_assert!(q.release(), "{:?}", t);
        }
        while let Some(t) = waiting.pop_front() {
            let Th::Waiting(ticket) = th[t] else { unreachable!() };
            prop_assert!(q.try_take(ticket));
            prop_assert!(q.release());
        }
        prop_assert!(!q.release(), "nothing held: a release frees nothing");
    }
}

/// Threads that hold a core for a while, rotate and release: never more holders than
/// cores at once, and every thread finishes (no lost wake-up).
#[test]
fn the_gate_holds_at_most_its_cores_under_real_threads() {
    for cores in [1usize, 2, 3] {
        let gate = Arc::new(CoreGate::new(cores, 1).unwrap());
        let holders = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let spawned: Vec<_> = (0..6)
            .map(|_| {
                let (gate, holders, most) =
                    (Arc::clone(&gate), Arc::clone(&holders), Arc::clone(&most));
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        gate.acquire();
                        let h = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(h, Ordering::SeqCst);
                        std::hint::black_box((0..50).sum::<u64>());
                        if gate.should_yield(i) {
                            holders.fetch_sub(1, Ordering::SeqCst);
                            gate.rotate();
                            let h = holders.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(h, Ordering::SeqCst);
                        }
                        holders.fetch_sub(1, Ordering::SeqCst);
                        gate.release();
                    }
                })
            })
            .collect();
        for s in spawned {
            s.join().unwrap();
        }
        let most = most.load(Ordering::SeqCst);
        assert!(most <= cores, "{most} holders on {cores} cores");
        assert_eq!(holders.load(Ordering::SeqCst), 0);
    }
}

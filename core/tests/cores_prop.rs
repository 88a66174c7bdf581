//! `CoreQueue` (the host-core time-slicing rule) against a trivially correct model, and
//! `CoreGate` under real threads (the loom model check is `tests/loom_cores.rs`).
//!
//! The model: a list of waiting threads in arrival order and a stack of free cores. A
//! take succeeds exactly for the first waiter while a core is free, and gets the core
//! freed last; a release by a holder frees its core; no core is held twice. Each thread is a small state machine (idle, waiting with a
//! ticket, holding), so every operation the test sends is one a real thread could send.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

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
    Holding(usize),
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
        let mut free: Vec<usize> = (0..cores).rev().collect();
        let mut last_grant: Option<Ticket> = None;
        for op in ops {
            match op {
                Op::Request(t) | Op::Rotate(t) => {
                    let t = t as usize;
                    if matches!(op, Op::Rotate(_)) {
                        let Th::Holding(core) = th[t] else { continue };
                        prop_assert!(q.release(core));
                        free.push(core);
                    } else if th[t] != Th::Idle {
                        continue;
                    }
                    th[t] = Th::Waiting(q.request(t as u64 + 100));
                    waiting.push_back(t);
                }
                Op::Take(t) => {
                    let t = t as usize;
                    let Th::Waiting(ticket) = th[t] else { continue };
                    let expect = if waiting.front() == Some(&t) { free.last().copied() } else { None };
                    prop_assert_eq!(q.try_take(ticket), expect, "thread {} ticket {:?}", t, ticket);
                    if let Some(core) = expect {
                        waiting.pop_front();
                        free.pop();
                        prop_assert!(th.iter().all(|h| *h != Th::Holding(core)), "core {} held twice", core);
                        th[t] = Th::Holding(core);
                        // Grants go in ticket order.
                        prop_assert!(last_grant.is_none_or(|g| g < ticket));
                        last_grant = Some(ticket);
                    }
                }
                Op::Release(t) => {
                    let t = t as usize;
                    let Th::Holding(core) = th[t] else {
                        // A thread that holds nothing: releasing any free core frees nothing.
                        for &c in &free {
                            prop_assert!(!q.release(c), "core {} was free", c);
                        }
                        continue;
                    };
                    prop_assert!(q.release(core));
                    free.push(core);
                    th[t] = Th::Idle;
                }
            }
            let holders = th.iter().filter(|h| matches!(h, Th::Holding(_))).count();
            prop_assert_eq!(q.running(), holders);
            prop_assert_eq!(holders + free.len(), cores);
            prop_assert_eq!(q.waiting(), waiting.len());
            prop_assert_eq!(q.grantable(), !free.is_empty() && !waiting.is_empty());
            let next = waiting.front().zip(free.last()).map(|(&t, &c)| (t as u64 + 100, c));
            prop_assert_eq!(q.next_grant(), next);
            prop_assert_eq!(q.should_yield(10, 10), !waiting.is_empty());
            prop_assert!(!q.should_yield(9, 10));
        }
        // Draining: every waiter gets a core in turn once holders leave.
        for h in th {
            if let Th::Holding(core) = h {
                prop_assert!(q.release(core));
            }
        }
        while let Some(t) = waiting.pop_front() {
            let Th::Waiting(ticket) = th[t] else { unreachable!() };
            let core = q.try_take(ticket);
            prop_assert!(core.is_some());
            prop_assert!(q.release(core.unwrap()));
        }
        prop_assert!((0..cores).all(|c| !q.release(c)), "nothing held: a release frees nothing");
    }
}

/// Threads that hold a core for a while, rotate and release: never more holders than
/// cores at once, every thread finishes (no lost wake-up), and a thread the hand-off was
/// told of takes the core it was told (the last telling before its take).
#[test]
fn the_gate_holds_at_most_its_cores_under_real_threads() {
    for cores in [1usize, 2, 3] {
        let told = Arc::new(Mutex::new(HashMap::<u64, usize>::new()));
        let t2 = Arc::clone(&told);
        let gate = CoreGate::new(cores, 1)
            .unwrap()
            .with_handoff(Box::new(move |tag, core| {
                t2.lock().unwrap().insert(tag, core);
            }));
        let gate = Arc::new(gate);
        let holders = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let spawned: Vec<_> = (0..6u64)
            .map(|tag| {
                let (gate, holders, most, told) = (
                    Arc::clone(&gate),
                    Arc::clone(&holders),
                    Arc::clone(&most),
                    Arc::clone(&told),
                );
                let check = move |core: usize| {
                    if let Some(c) = told.lock().unwrap().remove(&tag) {
                        assert_eq!(c, core, "thread {tag} was told core {c}, took {core}");
                    }
                };
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        let mut core = gate.acquire(tag);
                        check(core);
                        let h = holders.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(h, Ordering::SeqCst);
                        std::hint::black_box((0..50).sum::<u64>());
                        if gate.should_yield(i) {
                            holders.fetch_sub(1, Ordering::SeqCst);
                            core = gate.rotate(core, tag);
                            check(core);
                            let h = holders.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(h, Ordering::SeqCst);
                        }
                        assert!(core < cores);
                        holders.fetch_sub(1, Ordering::SeqCst);
                        gate.release(core);
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

//! Loom model checks of the host-core gate: under every interleaving of acquire, rotate
//! and release, never more threads hold a core than there are cores, and every thread
//! gets one and finishes (a lost wake-up would leave loom with a deadlock).
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test -p moonagent-core --release --test loom_cores`.

#![cfg(loom)]

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;
use moonagent_core::cores::CoreGate;

/// Runs `f` under loom with a preemption bound of 3 (the gate's condition-variable loop
/// makes the unbounded space too large to exhaust in CI) and asserts that at least `min`
/// interleavings ran (the count loom 0.7 explores for the model as written), so a
/// misconfigured run fails instead of passing having explored little or nothing.
fn model(min: usize, f: impl Fn() + Sync + Send + 'static) {
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = std::sync::Arc::clone(&runs);
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    let n = runs.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("loom explored {n} interleavings (at least {min} expected)");
    assert!(
        n >= min,
        "loom explored {n} interleavings, expected at least {min}"
    );
}

/// One holder's turn: take a core, count holders (never above `cores`), optionally rotate.
fn turn(gate: &CoreGate, holders: &AtomicUsize, cores: usize, rotate: bool) {
    let mut core = gate.acquire(0);
    let h = holders.fetch_add(1, Ordering::SeqCst) + 1;
    assert!(
        h <= cores && core < cores,
        "{h} holders on {cores} cores, core {core}"
    );
    if rotate {
        holders.fetch_sub(1, Ordering::SeqCst);
        core = gate.rotate(core, 0);
        let h = holders.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(
            h <= cores && core < cores,
            "{h} holders on {cores} cores after a rotate"
        );
    }
    holders.fetch_sub(1, Ordering::SeqCst);
    gate.release(core);
}

#[test]
fn two_threads_on_one_core_rotate_and_both_finish() {
    model(74, || {
        let gate = Arc::new(CoreGate::new(1, 1).unwrap());
        let holders = Arc::new(AtomicUsize::new(0));
        let other = {
            let (g, h) = (Arc::clone(&gate), Arc::clone(&holders));
            thread::spawn(move || turn(&g, &h, 1, true))
        };
        turn(&gate, &holders, 1, true);
        other.join().unwrap();
        assert_eq!(holders.load(Ordering::SeqCst), 0);
    });
}

#[test]
fn three_threads_on_two_cores_never_exceed_two_holders() {
    model(15_227, || {
        let gate = Arc::new(CoreGate::new(2, 1).unwrap());
        let holders = Arc::new(AtomicUsize::new(0));
        let spawned: Vec<_> = [true, false]
            .into_iter()
            .map(|rotate| {
                let (g, h) = (Arc::clone(&gate), Arc::clone(&holders));
                thread::spawn(move || turn(&g, &h, 2, rotate))
            })
            .collect();
        turn(&gate, &holders, 2, true);
        for s in spawned {
            s.join().unwrap();
        }
        assert_eq!(holders.load(Ordering::SeqCst), 0);
    });
}

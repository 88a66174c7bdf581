//! How the CPU backend's compute threads share the host's cores ([`HostSched`]).
//!
//! Each worker of a run is a compute thread standing in for a device; on a host with
//! fewer cores than workers they share the cores. [`HostSched::Os`] leaves that to the
//! kernel's scheduler. [`HostSched::RoundRobin`] (the default) runs every step under the
//! core's [`CoreGate`]: a step holds one of the host's cores for its length, waits for
//! one in first-come order, and gives its core to the longest waiter at the first
//! operator boundary ([`checkpoint`], called by every GEMM of the CPU operators) after it
//! has held it a quantum. With a quantum much shorter than the steps that is processor
//! sharing with equal weights, what the simulator's `SharedCores` models (INVARIANTS D9,
//! D10), instead of the kernel's heuristics, which no simulator models.
//!
//! Time spent waiting for a core is part of a step's measured time, as a step's stretch
//! is part of its simulated time.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use moonagent_core::cores::{CoreGate, CoresError};
use serde::{Deserialize, Serialize};

/// The quantum of [`HostSched::RoundRobin`] when none is given: 1 ms, chosen before any
/// run was compared (short next to the tiny model's steps, a 4-5 ms decode iteration and
/// 20-80 ms prefill and encoder steps, long next to a hand-over's ~10-50 us).
pub const DEFAULT_QUANTUM_US: u64 = 1_000;

/// Who decides which compute thread runs on the host's cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum HostSched {
    /// The kernel's scheduler: every compute thread runnable at once.
    Os,
    /// The backend's round robin over the host's cores ([`CoreGate`]), yielding at the
    /// first operator boundary after `quantum_us` when another step waits.
    RoundRobin {
        /// The quantum, microseconds (at least 1).
        quantum_us: u64,
    },
}

impl Default for HostSched {
    fn default() -> Self {
        HostSched::RoundRobin {
            quantum_us: DEFAULT_QUANTUM_US,
        }
    }
}

impl HostSched {
    /// The name the CLI and the run summary use (`os`, `round_robin`).
    pub const fn name(self) -> &'static str {
        match self {
            HostSched::Os => "os",
            HostSched::RoundRobin { .. } => "round_robin",
        }
    }

    /// The gate for `cores` host cores, or `None` (the kernel decides, or the compute is
    /// not the host's: `cores` is `None`).
    pub fn gate(self, cores: Option<f64>) -> Result<Option<HostCores>, CoresError> {
        match (self, cores) {
            (HostSched::RoundRobin { quantum_us }, Some(c)) => {
                let cores = (c.floor() as usize).max(1);
                let gate = CoreGate::new(cores, quantum_us.saturating_mul(1_000))?;
                Ok(Some(HostCores {
                    gate: Arc::new(gate),
                    rotations: Arc::new(AtomicU64::new(0)),
                }))
            }
            _ => Ok(None),
        }
    }
}

/// A run's gate over the host's cores and its count of hand-overs.
#[derive(Debug, Clone)]
pub struct HostCores {
    gate: Arc<CoreGate>,
    rotations: Arc<AtomicU64>,
}

impl HostCores {
    /// Times a step gave its core to a waiter at a checkpoint.
    pub fn rotations(&self) -> u64 {
        self.rotations.load(Ordering::Relaxed)
    }

    /// The cores shared.
    pub fn cores(&self) -> usize {
        self.gate.cores()
    }
}

struct Held {
    cores: HostCores,
    since: Instant,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Runs `f` holding one of `cores`' cores (waiting for it first), or at once without a
/// gate. Checkpoints inside `f` on this thread may hand the core over and wait again.
pub fn on_core<T>(cores: Option<&HostCores>, f: impl FnOnce() -> T) -> T {
    let Some(c) = cores else { return f() };
    c.gate.acquire();
    HELD.with_borrow_mut(|h| {
        *h = Some(Held {
            cores: c.clone(),
            since: Instant::now(),
        })
    });
    // Released even if `f` panics (the core is given back as the thread unwinds).
    struct Release<'a>(&'a CoreGate);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            HELD.with_borrow_mut(|h| *h = None);
            self.0.release();
        }
    }
    let _release = Release(&c.gate);
    f()
}

/// An operator boundary: if this thread holds a core under a gate, has held it for a
/// quantum and another step waits, hand the core over and wait for it again. Costs one
/// thread-local read and one atomic load when nobody waits.
#[inline]
pub fn checkpoint() {
    HELD.with_borrow_mut(|h| {
        let Some(h) = h.as_mut() else { return };
        let held = h.since.elapsed().as_nanos() as u64;
        if h.cores.gate.should_yield(held) {
            h.cores.gate.rotate();
            h.cores.rotations.fetch_add(1, Ordering::Relaxed);
            h.since = Instant::now();
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_and_gpu_runs_get_no_gate_and_round_robin_gets_the_host_cores() {
        assert!(HostSched::Os.gate(Some(2.0)).unwrap().is_none());
        assert!(HostSched::default().gate(None).unwrap().is_none());
        let g = HostSched::default().gate(Some(2.0)).unwrap().unwrap();
        assert_eq!(g.cores(), 2);
        let q0 = HostSched::RoundRobin { quantum_us: 0 }.gate(Some(2.0));
        assert!(q0.unwrap_err().to_string().contains("quantum"));
        assert_eq!(HostSched::Os.name(), "os");
        assert_eq!(HostSched::default().name(), "round_robin");
    }

    /// Three threads on one core with a 1 us quantum: each step holds the core alone
    /// (never two inside at once) and hands it over at checkpoints.
    #[test]
    fn steps_on_one_core_never_overlap_and_hand_over_at_checkpoints() {
        let c = HostSched::RoundRobin { quantum_us: 1 }
            .gate(Some(1.0))
            .unwrap()
            .unwrap();
        let inside = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let (c, inside) = (c.clone(), Arc::clone(&inside));
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        on_core(Some(&c), || {
                            for _ in 0..20 {
                                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                                std::thread::sleep(std::time::Duration::from_micros(20));
                                inside.fetch_sub(1, Ordering::SeqCst);
                                checkpoint();
                            }
                        });
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        assert!(c.rotations() > 0, "no hand-over at any checkpoint");
        // Outside a step a checkpoint does nothing.
        checkpoint();
    }
}

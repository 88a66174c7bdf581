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
//! Each grant names one of the host's cores, and on Linux the thread runs pinned to it;
//! a thread about to take a core is pinned to it before it is woken ([`Handoff`]), so it
//! wakes on the core its predecessor leaves rather than wherever the kernel would put it.
//!
//! Time spent waiting for a core is part of a step's measured time, as a step's stretch
//! is part of its simulated time.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use moonagent_core::cores::{CoreGate, CoresError, Handoff};
use serde::{Deserialize, Serialize};

/// The quantum of [`HostSched::RoundRobin`] when none is given: 1 ms, chosen before any
/// run was compared (short next to the tiny model's steps, a 4-5 ms decode iteration and
/// 20-80 ms prefill and encoder steps, long next to a hand-over's ~10-50 us).
pub const DEFAULT_QUANTUM_US: u64 = 1_000;

/// Who decides which compute thread runs on the host's cores.
///
/// The default is the round robin at [`DEFAULT_QUANTUM_US`]: the processor sharing the
/// simulator's `SharedCores` models (three CPU-bound threads on two cores each got a third
/// of the work within 3% under it, and 29-37% each under the kernel). The kernel's
/// scheduler (`Os`) favours short, often-waking threads by heuristics no simulator
/// models; in six same-sitting B0 runs at 70% load each (2026-12-07, the README's
/// "Who shares the cores"), B0's TTFT median |error| was 12.4-28.4% (median 19.7%) under
/// the round robin and 25.1-34.6% (29.6%) under the kernel, with B0 at 20% and B3 at
/// both loads unchanged. Every figure before that day was measured under `Os`.
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
        Self::round_robin()
    }
}

impl HostSched {
    /// The round robin at the default quantum.
    pub const fn round_robin() -> Self {
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
                HostCores::new((c.floor() as usize).max(1), quantum_us, true).map(Some)
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
    /// The CPUs this process may run on; core `i` of the gate is `cpus[i % len]`.
    cpus: Arc<Vec<usize>>,
}

impl HostCores {
    /// A round robin over `cores` cores at `quantum_us`; `pin`: threads run pinned to
    /// their core's CPU and a waiter is pinned to its core before it is woken (what
    /// [`HostSched::gate`] builds; without it the kernel places the threads, which the
    /// bench `examples/host_cores_bench.rs` compares).
    pub fn new(cores: usize, quantum_us: u64, pin: bool) -> Result<Self, CoresError> {
        let cpus: Arc<Vec<usize>> = Arc::new(if pin { affinity::cpus() } else { Vec::new() });
        let mut gate = CoreGate::new(cores, quantum_us.saturating_mul(1_000))?;
        if pin {
            let to = Arc::clone(&cpus);
            let handoff: Handoff = Box::new(move |tid, core| affinity::pin(tid, &to, core));
            gate = gate.with_handoff(handoff);
        }
        Ok(HostCores {
            gate: Arc::new(gate),
            rotations: Arc::new(AtomicU64::new(0)),
            cpus,
        })
    }

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
    core: usize,
    tid: u64,
    since: Instant,
    /// Time this step has waited for a core so far (its start and its hand-overs).
    waited_ns: u64,
}

thread_local! {
    static HELD: RefCell<Option<Held>> = const { RefCell::new(None) };
}

/// Runs `f` holding one of `cores`' cores (waiting for it first), or at once without a
/// gate. Checkpoints inside `f` on this thread may hand the core over and wait again.
pub fn on_core<T>(cores: Option<&HostCores>, f: impl FnOnce() -> T) -> T {
    on_core_waited(cores, f).0
}

/// [`on_core`], with the time the call spent waiting for a core: before it started and
/// at every hand-over of its checkpoints (0 without a gate). The rest of its time it held
/// a core.
pub fn on_core_waited<T>(cores: Option<&HostCores>, f: impl FnOnce() -> T) -> (T, u64) {
    let Some(c) = cores else { return (f(), 0) };
    let tid = affinity::tid();
    let asked = Instant::now();
    let core = c.gate.acquire(tid);
    affinity::pin(tid, &c.cpus, core);
    let since = Instant::now();
    HELD.with_borrow_mut(|h| {
        *h = Some(Held {
            cores: c.clone(),
            core,
            tid,
            since,
            waited_ns: since.duration_since(asked).as_nanos() as u64,
        })
    });
    // Released even if `f` panics (the core is given back as the thread unwinds).
    struct Release<'a>(&'a CoreGate);
    impl Drop for Release<'_> {
        fn drop(&mut self) {
            release_held(self.0);
        }
    }
    let _release = Release(&c.gate);
    let out = f();
    // Released here, so the guard finds nothing left to release.
    let waited_ns = release_held(&c.gate);
    (out, waited_ns)
}

/// Gives this thread's core back, if it holds one, and returns the time its step waited.
fn release_held(gate: &CoreGate) -> u64 {
    let Some(h) = HELD.with_borrow_mut(Option::take) else {
        return 0;
    };
    gate.release(h.core);
    // Off the core, the thread may wake anywhere: pinned to the CPU it left, its next
    // step's wake-up waited for whatever now runs there (1.5-6 ms in a quarter of B0
    // 70%'s steps) even with the other CPU free.
    affinity::unpin(h.tid, &h.cores.cpus);
    h.waited_ns
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
            let asked = Instant::now();
            h.core = h.cores.gate.rotate(h.core, h.tid);
            affinity::pin(h.tid, &h.cores.cpus, h.core);
            h.cores.rotations.fetch_add(1, Ordering::Relaxed);
            h.since = Instant::now();
            h.waited_ns += h.since.duration_since(asked).as_nanos() as u64;
        }
    });
}

/// What the host's cores delivered just then: a fixed integer loop's rate on one thread
/// and on every core at once. A shared host (a VM whose neighbours or quota take CPU
/// away) can deliver far less than its cores for minutes at a time; a run's summary
/// records a probe before and after it, so a run taken while the host's capacity moved is
/// visible as such instead of as a simulator error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HostProbe {
    /// Cores probed at once.
    pub cores: usize,
    /// Work units per millisecond on one thread.
    pub one_per_ms: f64,
    /// Work units per millisecond on all `cores` threads together.
    pub all_per_ms: f64,
}

impl HostProbe {
    /// The all-core rate as a share of `cores` times the one-thread rate (1.0: every core
    /// delivered what one thread alone did).
    pub fn parallel_share(&self) -> f64 {
        self.all_per_ms / (self.cores as f64 * self.one_per_ms).max(f64::MIN_POSITIVE)
    }
}

/// One work unit of [`probe`]: a fixed integer loop (~40 us on the 2-core VM).
pub fn probe_unit() {
    let mut x = 1u64;
    for i in 0..20_000u64 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i);
    }
    std::hint::black_box(x);
}

/// Probe the host for `window` on one thread, then `window` on every core.
pub fn probe(window: std::time::Duration) -> HostProbe {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let run = |threads: usize| -> f64 {
        let units: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|_| {
                    s.spawn(|| {
                        let t0 = Instant::now();
                        let mut n = 0u64;
                        while t0.elapsed() < window {
                            probe_unit();
                            n += 1;
                        }
                        n
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        units as f64 / (window.as_secs_f64() * 1e3).max(f64::MIN_POSITIVE)
    };
    HostProbe {
        cores,
        one_per_ms: run(1),
        all_per_ms: run(cores),
    }
}

/// Thread ids and CPU affinity: Linux's `gettid` and `sched_{get,set}affinity`; no-ops
/// elsewhere (the round robin then runs unpinned).
mod affinity {
    /// This thread's id.
    #[cfg(target_os = "linux")]
    pub(super) fn tid() -> u64 {
        // SAFETY: gettid has no preconditions.
        unsafe { libc::gettid() as u64 }
    }

    /// The CPUs this process may run on, ascending.
    #[cfg(target_os = "linux")]
    pub(super) fn cpus() -> Vec<usize> {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the size passed is its own.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Vec::new();
            }
            (0..libc::CPU_SETSIZE as usize)
                .filter(|&c| libc::CPU_ISSET(c, &set))
                .collect()
        }
    }

    /// Let thread `tid` run on exactly `allowed` (CPUs the process may run on; a failure
    /// leaves the thread where it was: the round robin still holds, only the placement is
    /// the kernel's).
    #[cfg(target_os = "linux")]
    fn set_affinity(tid: u64, allowed: &[usize]) {
        // SAFETY: as in `cpus`; CPU_SET is given CPUs below CPU_SETSIZE (ones the process
        // may run on).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in allowed {
                libc::CPU_SET(c, &mut set);
            }
            libc::sched_setaffinity(
                tid as libc::pid_t,
                std::mem::size_of::<libc::cpu_set_t>(),
                &set,
            );
        }
    }

    /// Pin thread `tid` to the CPU of gate core `core`.
    #[cfg(target_os = "linux")]
    pub(super) fn pin(tid: u64, cpus: &[usize], core: usize) {
        if !cpus.is_empty() {
            set_affinity(tid, &[cpus[core % cpus.len()]]);
        }
    }

    /// Let thread `tid` run on any of `cpus` again.
    #[cfg(target_os = "linux")]
    pub(super) fn unpin(tid: u64, cpus: &[usize]) {
        if !cpus.is_empty() {
            set_affinity(tid, cpus);
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn unpin(_tid: u64, _cpus: &[usize]) {}

    #[cfg(not(target_os = "linux"))]
    pub(super) fn tid() -> u64 {
        0
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn cpus() -> Vec<usize> {
        Vec::new()
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn pin(_tid: u64, _cpus: &[usize], _core: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_measures_every_core() {
        let p = probe(std::time::Duration::from_millis(20));
        assert!(
            p.cores >= 1 && p.one_per_ms > 0.0 && p.all_per_ms > 0.0,
            "{p:?}"
        );
        assert!(p.parallel_share() > 0.0);
    }

    #[test]
    fn os_and_gpu_runs_get_no_gate_and_round_robin_gets_the_host_cores() {
        assert_eq!(HostSched::default(), HostSched::round_robin());
        assert!(HostSched::Os.gate(Some(2.0)).unwrap().is_none());
        assert!(HostSched::round_robin().gate(None).unwrap().is_none());
        let g = HostSched::round_robin().gate(Some(2.0)).unwrap().unwrap();
        assert_eq!(g.cores(), 2);
        let q0 = HostSched::RoundRobin { quantum_us: 0 }.gate(Some(2.0));
        assert!(q0.unwrap_err().to_string().contains("quantum"));
        assert_eq!(HostSched::Os.name(), "os");
        assert_eq!(HostSched::round_robin().name(), "round_robin");
    }

    /// A step reports the time it waited for a core: none without a gate, next to none
    /// alone, and the holder's remaining time when another step holds the only core.
    #[test]
    fn a_step_reports_how_long_it_waited_for_a_core() {
        assert_eq!(on_core_waited(None, || 7), (7, 0));
        let c = HostSched::RoundRobin {
            quantum_us: 1_000_000,
        }
        .gate(Some(1.0))
        .unwrap()
        .unwrap();
        let (_, alone) = on_core_waited(Some(&c), || ());
        assert!(alone < 20_000_000, "alone it waited {alone} ns");
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = {
            let c = c.clone();
            std::thread::spawn(move || {
                on_core(Some(&c), || {
                    held_tx.send(()).unwrap();
                    std::thread::sleep(std::time::Duration::from_millis(60));
                })
            })
        };
        held_rx.recv().unwrap();
        let t = Instant::now();
        let (_, waited) = on_core_waited(Some(&c), || ());
        let total = t.elapsed().as_nanos() as u64;
        holder.join().unwrap();
        assert!(
            waited >= 40_000_000,
            "waited {waited} ns behind a 60 ms step"
        );
        assert!(waited <= total, "waited {waited} ns of {total}");
        // Hand-overs count too: with a 1 ms quantum and another step always waiting, a
        // 20 ms step gives its core away at about every millisecond and waits a quantum
        // each time, far more than its one wait to start.
        let c = HostSched::RoundRobin { quantum_us: 1_000 }
            .gate(Some(1.0))
            .unwrap()
            .unwrap();
        let stop = Arc::new(AtomicU64::new(0));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let other = {
            let (c, stop) = (c.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                on_core(Some(&c), || {
                    held_tx.send(()).unwrap();
                    while stop.load(Ordering::SeqCst) == 0 {
                        std::thread::sleep(std::time::Duration::from_micros(200));
                        checkpoint();
                    }
                })
            })
        };
        held_rx.recv().unwrap();
        let (_, waited) = on_core_waited(Some(&c), || {
            for _ in 0..20 {
                std::thread::sleep(std::time::Duration::from_millis(1));
                checkpoint();
            }
        });
        stop.store(1, Ordering::SeqCst);
        other.join().unwrap();
        assert!(c.rotations() >= 10, "{} hand-overs", c.rotations());
        assert!(
            waited >= 8_000_000,
            "waited {waited} ns over its hand-overs"
        );
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
        // A step runs pinned to the one CPU of its core (Linux).
        #[cfg(target_os = "linux")]
        on_core(Some(&c), || {
            let mine = affinity::cpus();
            assert_eq!(mine.len(), 1, "pinned to one CPU: {mine:?}");
            assert!(c.cpus.contains(&mine[0]));
        });
        // Off its core the thread may run on every CPU it started with again.
        #[cfg(target_os = "linux")]
        assert_eq!(affinity::cpus(), *c.cpus, "still pinned after the step");
        // Outside a step a checkpoint does nothing.
        checkpoint();
    }
}

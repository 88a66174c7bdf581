//! `WarmKeeper`: keeps the CPU backend's weights in the host's caches while its workers
//! idle (`--keep-warm`).
//!
//! Why: the CPU backend stands in for GPUs, whose weights stay in device memory between
//! steps. The scaled model's weights fit in this host's shared L3, where they sit while
//! steps run back to back, which is how `validate profile` times them; but a worker that
//! idles loses them to the host's other tenants, and its next step reads them from DRAM.
//! Measured on the 2-core VM (`validation/examples/cold_probe.rs`, median of 7 after each
//! gap, two runs): a step after its thread slept 20 / 100 / 300 ms took +0.2-2.8 /
//! +2.6-7.1 / +4.8-12.7 ms more than back to back, whatever its own length (a 4 ms decode
//! iteration and a 100 ms encoder batch alike), and idle-priority threads that kept the
//! cores busy without touching memory did not change that (so it is not the cores' idle
//! states). A light
//! run's steps mostly follow such gaps; a loaded run's mostly do not, which is part of
//! why one calibration factor cannot fit both (README, the calibration run).
//!
//! What it does: one thread at the kernel's idle priority (`SCHED_IDLE`: it runs only on a
//! core no other thread wants) that, every `interval`, reads every weight once (one load
//! per cache line, [`Compute::touch_weights`](crate::compute::Compute::touch_weights)) if
//! no compute step is running, and stops a pass part-way as soon as one starts (it checks
//! every 256 KiB): a running step's own reads keep what it uses warm, and a pass beside it
//! would take memory bandwidth from it (the first version read regardless and slowed the
//! runs' decode iterations by up to 1.36x). It reads, never writes, so no result changes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The keeper's default pause between passes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(5);

/// A running keeper; stops (and joins its thread) when dropped.
#[derive(Debug)]
pub struct WarmKeeper {
    stop: Arc<AtomicBool>,
    passes: Arc<AtomicU64>,
    bytes: u64,
    idle_priority: bool,
    thread: Option<JoinHandle<()>>,
}

impl WarmKeeper {
    /// Start a keeper that every `interval`, while `quiet()` holds, calls `touch(&quiet)`
    /// (a pass that stops once `quiet` turns false; it returns the bytes it read). `None`
    /// when a whole pass reads nothing (a backend whose weights are not in host memory).
    pub fn start(
        touch: impl Fn(&dyn Fn() -> bool) -> u64 + Send + 'static,
        quiet: impl Fn() -> bool + Send + 'static,
        interval: Duration,
    ) -> std::io::Result<Option<Self>> {
        let bytes = touch(&|| true);
        if bytes == 0 {
            return Ok(None);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(AtomicU64::new(1));
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = {
            let (stop, passes) = (stop.clone(), passes.clone());
            std::thread::Builder::new()
                .name("moonagent-warm".into())
                .spawn(move || {
                    let _ = tx.send(idle_priority());
                    while !stop.load(Ordering::Relaxed) {
                        if quiet() {
                            touch(&quiet);
                            passes.fetch_add(1, Ordering::Relaxed);
                        }
                        std::thread::park_timeout(interval);
                    }
                })?
        };
        let idle_priority = rx.recv().unwrap_or(false);
        Ok(Some(Self {
            stop,
            passes,
            bytes,
            idle_priority,
            thread: Some(thread),
        }))
    }

    /// Passes over the weights so far, whole or stopped part-way (the first one, whole, at
    /// start, included).
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Bytes one pass reads.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether the thread runs at the kernel's idle priority (else at normal priority: a
    /// kernel without `SCHED_IDLE`).
    pub fn idle_priority(&self) -> bool {
        self.idle_priority
    }
}

impl Drop for WarmKeeper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Put the calling thread at the kernel's idle priority (`SCHED_IDLE`: it runs only on a
/// core no other thread wants); whether that worked.
#[cfg(target_os = "linux")]
pub fn idle_priority() -> bool {
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` with pid 0 changes only the calling thread's policy and
    // reads `p` only during the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) == 0 }
}

/// Not Linux: no idle priority.
#[cfg(not(target_os = "linux"))]
pub fn idle_priority() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A keeper calls its touch repeatedly while quiet, never while not, at idle priority
    /// on Linux, and its thread is gone once it is dropped (no call after the drop).
    #[test]
    fn a_keeper_touches_while_quiet_until_dropped() {
        let calls = Arc::new(AtomicU64::new(0));
        let quiet = Arc::new(AtomicBool::new(false));
        let c = calls.clone();
        let q = quiet.clone();
        let k = WarmKeeper::start(
            move |go: &dyn Fn() -> bool| {
                c.fetch_add(1, Ordering::SeqCst);
                if go() {
                    64
                } else {
                    0
                }
            },
            move || q.load(Ordering::SeqCst),
            Duration::from_millis(1),
        )
        .unwrap()
        .expect("a keeper for 64 bytes");
        // Not quiet: only the first pass, made at start.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(calls.load(Ordering::SeqCst), 1, "touched while busy");
        assert_eq!(k.passes(), 1);
        quiet.store(true, Ordering::SeqCst);
        assert_eq!(k.bytes(), 64);
        let t0 = std::time::Instant::now();
        while k.passes() < 4 && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(k.passes() >= 4, "passes: {}", k.passes());
        assert_eq!(k.idle_priority(), cfg!(target_os = "linux"));
        drop(k);
        let after = calls.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(
            calls.load(Ordering::SeqCst),
            after,
            "touched after the drop"
        );
    }

    /// Nothing to keep warm: no thread.
    #[test]
    fn nothing_to_touch_starts_no_keeper() {
        let k = WarmKeeper::start(|_: &dyn Fn() -> bool| 0, || true, DEFAULT_INTERVAL).unwrap();
        assert!(k.is_none());
    }
}

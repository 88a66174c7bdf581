//! The sweep's progress: a bar over runs (points done in its message, rate, ETA) drawn by
//! [`crate::progress`] on a terminal only, then one final line on stderr wherever stderr
//! goes (logs of batch jobs keep it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use crate::progress::{bar, ProgressBar};

pub(crate) struct Progress {
    label: String,
    total_runs: usize,
    total_points: usize,
    /// Runs already done when this process started (resumed), not counted in the rate.
    before: usize,
    runs: AtomicUsize,
    points: AtomicUsize,
    start: Instant,
    bar: ProgressBar,
    enabled: bool,
}

impl Progress {
    pub(crate) fn new(
        label: String,
        total_runs: usize,
        total_points: usize,
        done_runs: usize,
        done_points: usize,
        enabled: bool,
    ) -> Self {
        let pb = bar(&label, total_runs as u64, "runs", enabled);
        pb.set_position(done_runs as u64);
        // The rate and ETA count this process's runs only, not those resumed from disk.
        pb.reset_eta();
        pb.set_message(format!("{done_points}/{total_points} points"));
        Self {
            label,
            total_runs,
            total_points,
            before: done_runs,
            runs: AtomicUsize::new(done_runs),
            points: AtomicUsize::new(done_points),
            start: Instant::now(),
            bar: pb,
            enabled,
        }
    }

    /// One run finished (`point_done`: it was its point's last seed).
    pub(crate) fn run_done(&self, point_done: bool) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        if point_done {
            let p = self.points.fetch_add(1, Ordering::Relaxed) + 1;
            self.bar
                .set_message(format!("{p}/{} points", self.total_points));
        }
        self.bar.inc(1);
    }

    fn line(&self) -> String {
        let runs = self.runs.load(Ordering::Relaxed);
        let points = self.points.load(Ordering::Relaxed);
        let el = self.start.elapsed().as_secs_f64();
        let executed = runs - self.before;
        let rate = if el > 0.0 { executed as f64 / el } else { 0.0 };
        format!(
            "{}: {runs}/{} runs, {points}/{} points done; {executed} executed in {:.1} s ({rate:.2} runs/s), {} already done",
            self.label, self.total_runs, self.total_points, el, self.before
        )
    }

    /// Clear the bar and print the final line.
    pub(crate) fn finish(&self) {
        self.bar.finish_and_clear();
        if self.enabled {
            eprintln!("{}", self.line());
        }
    }
}

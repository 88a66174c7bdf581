//! A progress bar on stderr: runs and points done, rate, ETA. Redrawn at most ten times a
//! second on a terminal; silent elsewhere (logs of batch jobs) except for the final line.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub(crate) struct Progress {
    label: String,
    total_runs: usize,
    total_points: usize,
    /// Runs already done when this process started (resumed), not counted in the rate.
    before: usize,
    runs: AtomicUsize,
    points: AtomicUsize,
    start: Instant,
    last: Mutex<Option<Instant>>,
    tty: bool,
    enabled: bool,
}

fn clock(s: f64) -> String {
    if !s.is_finite() {
        return "--:--".into();
    }
    let s = s.round() as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
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
        Self {
            label,
            total_runs,
            total_points,
            before: done_runs,
            runs: AtomicUsize::new(done_runs),
            points: AtomicUsize::new(done_points),
            start: Instant::now(),
            last: Mutex::new(None),
            tty: std::io::stderr().is_terminal(),
            enabled,
        }
    }

    /// One run finished (`point_done`: it was its point's last seed).
    pub(crate) fn run_done(&self, point_done: bool) {
        self.runs.fetch_add(1, Ordering::Relaxed);
        if point_done {
            self.points.fetch_add(1, Ordering::Relaxed);
        }
        if !(self.enabled && self.tty) {
            return;
        }
        let mut last = self.last.lock().expect("progress lock");
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < Duration::from_millis(100)) {
            return;
        }
        *last = Some(now);
        let line = self.line(false);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}\x1b[K");
        let _ = err.flush();
    }

    fn line(&self, last: bool) -> String {
        let runs = self.runs.load(Ordering::Relaxed);
        let points = self.points.load(Ordering::Relaxed);
        let el = self.start.elapsed().as_secs_f64();
        let executed = runs - self.before;
        let rate = if el > 0.0 { executed as f64 / el } else { 0.0 };
        if last {
            return format!(
                "{}: {runs}/{} runs, {points}/{} points done; {executed} executed in {:.1} s ({rate:.2} runs/s), {} already done",
                self.label, self.total_runs, self.total_points, el, self.before
            );
        }
        let left = self.total_runs.saturating_sub(runs);
        let eta = if rate > 0.0 {
            left as f64 / rate
        } else {
            f64::INFINITY
        };
        let width = 24;
        let filled = (runs * width).checked_div(self.total_runs).unwrap_or(width);
        format!(
            "{} [{}{}] {runs}/{} runs {points}/{} points  {rate:.2} runs/s  ETA {}",
            self.label,
            "=".repeat(filled),
            " ".repeat(width - filled),
            self.total_runs,
            self.total_points,
            clock(eta)
        )
    }

    /// Clear the bar and print the final line.
    pub(crate) fn finish(&self) {
        if !self.enabled {
            return;
        }
        let line = self.line(true);
        let mut err = std::io::stderr().lock();
        if self.tty {
            let _ = write!(err, "\r\x1b[K");
        }
        let _ = writeln!(err, "{line}");
    }
}

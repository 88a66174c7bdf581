//! Progress on stderr through `indicatif`, for every long command (sweep, simulate, trace
//! import/convert/generate). One home for the look and the rule: a bar or spinner is drawn
//! only when stderr is a terminal (`ProgressDrawTarget::stderr` hides itself otherwise,
//! so piped output and batch logs carry no escape codes), at most 10 redraws a second,
//! and never on stdout, where results go.

use std::time::Duration;

use indicatif::{HumanDuration, ProgressDrawTarget, ProgressFinish, ProgressState, ProgressStyle};

pub use indicatif::ProgressBar;

/// Units per second since the start. Not indicatif's `per_sec`, a recent-steps estimate
/// that decays towards zero while a slow step runs (a replay's bar counts whole runs of
/// minutes each: it showed `0.00/s  ETA 5d` two runs into twelve).
fn mean_rate(state: &ProgressState) -> f64 {
    let s = state.elapsed().as_secs_f64();
    if s > 0.0 {
        state.pos() as f64 / s
    } else {
        0.0
    }
}

/// `{rate}`: units per second since the start, two decimals below 100/s, none above.
fn rate(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    let r = mean_rate(state);
    let _ = if r < 100.0 {
        write!(w, "{r:.2}/s")
    } else {
        write!(w, "{r:.0}/s")
    };
}

/// Seconds left when `pos` of `len` units took `elapsed` seconds, at that mean rate;
/// `None` before the first unit.
fn eta_secs(elapsed: f64, pos: u64, len: u64) -> Option<f64> {
    if pos >= len {
        Some(0.0)
    } else if pos == 0 {
        None
    } else {
        Some(elapsed * (len - pos) as f64 / pos as f64)
    }
}

/// `{mean_eta}`: the time left at the mean rate so far (`?` before the first unit).
fn mean_eta(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    let e = eta_secs(
        state.elapsed().as_secs_f64(),
        state.pos(),
        state.len().unwrap_or(0),
    );
    let _ = match e {
        None => write!(w, "?"),
        Some(s) => write!(w, "{:#}", HumanDuration(Duration::from_secs_f64(s))),
    };
}

fn target(enabled: bool) -> ProgressDrawTarget {
    if enabled {
        ProgressDrawTarget::stderr_with_hz(10)
    } else {
        ProgressDrawTarget::hidden()
    }
}

/// A bar over `len` units (`unit`: "runs", "modes", ...), labelled `label`, with rate and
/// ETA. Hidden when `enabled` is false or stderr is not a terminal.
pub fn bar(label: &str, len: u64, unit: &str, enabled: bool) -> ProgressBar {
    let style = ProgressStyle::with_template(&format!(
        "{{prefix}} [{{bar:24}}] {{pos}}/{{len}} {unit} {{msg}}  {{rate}}  {{elapsed}} elapsed, ETA {{mean_eta}}"
    ))
    .expect("progress template")
    .with_key("rate", rate)
    .with_key("mean_eta", mean_eta)
    .progress_chars("=> ");
    let pb = ProgressBar::with_draw_target(Some(len), target(enabled))
        .with_style(style)
        .with_prefix(label.to_string())
        // An early return (an error) drops the bar: clear it so the error line stands alone.
        .with_finish(ProgressFinish::AndClear);
    pb.enable_steady_tick(Duration::from_millis(200));
    pb
}

/// A spinner counting `unit` ("requests") with the elapsed time, for work of unknown
/// length; with `unit` empty, only the message and the elapsed time. Hidden when
/// `enabled` is false or stderr is not a terminal.
pub fn spinner(label: &str, unit: &str, enabled: bool) -> ProgressBar {
    let template = if unit.is_empty() {
        "{spinner} {prefix}: {msg} ({elapsed})".to_string()
    } else {
        format!("{{spinner}} {{prefix}}: {{human_pos}} {unit} {{msg}} ({{rate}}, {{elapsed}})")
    };
    let style = ProgressStyle::with_template(&template)
        .expect("progress template")
        .with_key("rate", rate);
    let pb = ProgressBar::with_draw_target(None, target(enabled))
        .with_style(style)
        .with_prefix(label.to_string())
        .with_finish(ProgressFinish::AndClear);
    pb.enable_steady_tick(Duration::from_millis(100));
    pb
}

/// A long command's stage on `pb` (a spinner made enabled): its message on a terminal;
/// where stderr is not one (a batch job's log, `2> file`), one plain line per stage with
/// the seconds since the spinner started ([`stage_line`]), so the log says where a
/// command of many minutes is.
pub fn stage(pb: &ProgressBar, what: &str) {
    if pb.is_hidden() {
        eprintln!("{}", stage_line(&pb.prefix(), pb.elapsed(), what));
    } else {
        pb.set_message(what.to_string());
    }
}

/// The line [`stage`] writes: `validate [  42 s] round 1/3: calibration run ...`.
pub fn stage_line(label: &str, elapsed: Duration, what: &str) -> String {
    format!("{label} [{:4} s] {what}", elapsed.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_line_names_the_command_the_seconds_and_the_stage() {
        assert_eq!(
            stage_line("validate", Duration::from_millis(42_900), "round 1/3: B0"),
            "validate [  42 s] round 1/3: B0"
        );
    }

    #[test]
    fn hidden_when_disabled() {
        let b = bar("t", 3, "runs", false);
        assert!(b.is_hidden());
        b.inc(3);
        assert_eq!(b.position(), 3);
        b.finish_and_clear();
        assert!(spinner("t", "requests", false).is_hidden());
    }

    #[test]
    fn eta_is_the_time_left_at_the_mean_rate() {
        // Two runs of twelve in 120 s: ten more at 60 s each.
        assert_eq!(eta_secs(120.0, 2, 12), Some(600.0));
        assert_eq!(eta_secs(5.0, 0, 12), None);
        assert_eq!(eta_secs(5.0, 12, 12), Some(0.0));
        assert_eq!(eta_secs(5.0, 3, 0), Some(0.0));
    }
}

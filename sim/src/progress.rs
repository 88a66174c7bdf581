//! Progress on stderr through `indicatif`, for every long command (sweep, simulate, trace
//! import/convert/generate). One home for the look and the rule: a bar or spinner is drawn
//! only when stderr is a terminal (`ProgressDrawTarget::stderr` hides itself otherwise,
//! so piped output and batch logs carry no escape codes), at most 10 redraws a second,
//! and never on stdout, where results go.

use std::time::Duration;

use indicatif::{ProgressDrawTarget, ProgressFinish, ProgressState, ProgressStyle};

pub use indicatif::ProgressBar;

/// `{rate}`: units per second, two decimals below 100/s, none above.
fn rate(state: &ProgressState, w: &mut dyn std::fmt::Write) {
    let r = state.per_sec();
    let _ = if r < 100.0 {
        write!(w, "{r:.2}/s")
    } else {
        write!(w, "{r:.0}/s")
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
        "{{prefix}} [{{bar:24}}] {{pos}}/{{len}} {unit} {{msg}}  {{rate}}  ETA {{eta}}"
    ))
    .expect("progress template")
    .with_key("rate", rate)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_when_disabled() {
        let b = bar("t", 3, "runs", false);
        assert!(b.is_hidden());
        b.inc(3);
        assert_eq!(b.position(), 3);
        b.finish_and_clear();
        assert!(spinner("t", "requests", false).is_hidden());
    }
}

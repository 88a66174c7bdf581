//! Figures as SVG, drawn from results already computed (plotters' SVG backend only: no
//! system libraries, no fonts read; text is left to the SVG viewer).
//!
//! One function per figure, each returning the SVG text; the CLI only decides where it
//! goes. [`ladder`] (throughput and P95 TTFT per mode per workload), [`capacity`] (hit rate
//! vs capacity per policy with Belady's MIN bound), [`pareto`] (`sweep best`'s points, the
//! SLO-feasible ones, the front and the best point), [`sim_vs_measured`] (`moonagent
//! validate`'s per-request scatter and error CDF). The notebooks in `notebooks/` draw the
//! same results with more detail; these are the figures one gets without Python.

mod capacity;
mod ladder;
mod pareto;
mod validate;

pub use capacity::{capacity, Curve, Panel};
pub use ladder::ladder;
pub use pareto::pareto;
pub use validate::{sim_vs_measured, Pairs};

use plotters::style::RGBColor;

/// Why a figure could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// plotters refused to draw (its SVG backend's error, kept as the source).
    #[error("drawing a figure: {0}")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Result of drawing a figure.
pub type Result<T, E = PlotError> = std::result::Result<T, E>;

fn err<E: std::error::Error + Send + Sync + 'static>(e: E) -> PlotError {
    PlotError::Draw(Box::new(e))
}

/// A qualitative palette (matplotlib's tab10) so series read apart in print and on screen.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

const FONT: &str = "sans-serif";

/// A range around `[lo, hi]` with room for the legend above the data.
fn padded(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if log {
        let lo = if lo > 0.0 { lo } else { 1e-3 };
        let hi = if hi > lo { hi } else { lo * 10.0 };
        (lo / 1.5, hi * 3.0)
    } else {
        let hi = if hi > lo { hi } else { lo + 1.0 };
        (lo.min(0.0), hi + 0.25 * (hi - lo.min(0.0)))
    }
}

/// A number with about three significant digits, for tick labels.
fn num(x: f64) -> String {
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if (1e-2..1e5).contains(&a) {
        let d = (2 - a.log10().floor() as i32).clamp(0, 4) as usize;
        let s = format!("{x:.d$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    } else {
        format!("{x:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_numbers_are_short() {
        assert_eq!(num(0.0), "0");
        assert_eq!(num(12.5), "12.5");
        assert_eq!(num(100.0), "100");
        assert_eq!(num(0.25), "0.25");
        assert_eq!(num(1234.0), "1234");
        assert_eq!(num(2.5e6), "2.5e6");
    }
}

#[cfg(test)]
mod figure_tests {
    use super::*;
    use crate::des::ladder::{LadderConfig, Workload};
    use crate::des::run_ladder;

    fn has(svg: &str, texts: &[&str]) {
        assert!(svg.starts_with("<svg"), "not an SVG");
        for t in texts {
            assert!(svg.contains(t), "no {t:?} in the figure");
        }
    }

    #[test]
    fn ladder_has_both_panels_and_every_mode() {
        let cfg = LadderConfig {
            workloads: vec![Workload {
                name: "W3".into(),
                generator: "w3".into(),
                config: serde_json::Value::Null,
            }],
            requests: 20,
            ..LadderConfig::default()
        };
        let r = run_ladder(&cfg).unwrap();
        let svg = ladder(&r).unwrap();
        has(
            &svg,
            &[
                "saturated throughput (req/s)",
                "P95 TTFT at load (ms, log scale)",
                "W3",
                "B0",
                "Full",
                "H200",
            ],
        );
    }

    #[test]
    fn capacity_curves_carry_the_bound_and_the_labels() {
        let c = |label: &str, v: [f64; 3]| Curve {
            label: label.into(),
            points: vec![(1 << 30, v[0]), (4 << 30, v[1]), (16 << 30, v[2])],
            offline: label.starts_with("Belady"),
        };
        let panel = Panel {
            title: "kv_cache hit rate vs capacity".into(),
            y_desc: "kv_cache hit rate".into(),
            curves: vec![c("lru", [0.1, 0.2, 0.3]), c("s3-fifo", [0.12, 0.25, 0.31])],
            bound: Some(c("Belady MIN bound", [0.2, 0.3, 0.35])),
        };
        let svg = capacity("a trace", &[panel]).unwrap();
        has(
            &svg,
            &[
                "a trace",
                "lru",
                "s3-fifo",
                "Belady MIN bound",
                "store capacity (GiB, log scale)",
                "kv_cache hit rate (%)",
            ],
        );
        // Nothing to draw is not an error.
        capacity("empty", &[]).unwrap();
    }
}

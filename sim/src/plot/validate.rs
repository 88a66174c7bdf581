//! Simulated against measured, request by request: a scatter of simulated vs measured
//! time (log-log, the y = x line drawn) and the CDF of the signed relative error.

use plotters::prelude::*;

use super::{color, err, num, Result, FONT};

/// One series of per-request pairs, e.g. one mode at one load.
#[derive(Debug, Clone, PartialEq)]
pub struct Pairs {
    /// Legend label.
    pub label: String,
    /// `(measured, simulated)` in ms.
    pub points: Vec<(f64, f64)>,
}

/// Scatter and error CDF of `metric` (e.g. "TTFT") side by side, as SVG.
pub fn sim_vs_measured(title: &str, metric: &str, series: &[Pairs]) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1280, 520)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, (FONT, 20)).map_err(err)?;
        let panels = root.split_evenly((1, 2));
        let all: Vec<f64> = series
            .iter()
            .flat_map(|s| s.points.iter().flat_map(|p| [p.0, p.1]))
            .filter(|v| *v > 0.0)
            .collect();
        let lo = all.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = all.iter().copied().fold(0.0, f64::max);
        let (lo, hi) = if lo.is_finite() && hi > lo {
            (lo / 1.5, hi * 1.5)
        } else {
            (0.1, 10.0)
        };
        let mut chart = ChartBuilder::on(&panels[0])
            .caption(format!("{metric} per request"), (FONT, 16))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d((lo..hi).log_scale(), (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .x_desc(format!("measured {metric} (ms, log scale)"))
            .y_desc(format!("simulated {metric} (ms, log scale)"))
            .x_label_formatter(&|x: &f64| num(*x))
            .y_label_formatter(&|y: &f64| num(*y))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(err)?;
        let diag = BLACK.mix(0.5).stroke_width(1);
        chart
            .draw_series(DashedLineSeries::new([(lo, lo), (hi, hi)], 6, 4, diag))
            .map_err(err)?
            .label("simulated = measured")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], diag));
        for (i, s) in series.iter().enumerate() {
            let col = color(i);
            chart
                .draw_series(
                    s.points
                        .iter()
                        .filter(|p| p.0 > 0.0 && p.1 > 0.0)
                        .map(|&p| Circle::new(p, 3, col.mix(0.7).filled())),
                )
                .map_err(err)?
                .label(s.label.as_str())
                .legend(move |(x, y)| Circle::new((x + 9, y), 4, col.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 12))
            .draw()
            .map_err(err)?;

        // The CDF of (simulated - measured) / measured, percent.
        let errs: Vec<Vec<f64>> = series
            .iter()
            .map(|s| {
                let mut v: Vec<f64> = s
                    .points
                    .iter()
                    .filter(|p| p.0 > 0.0)
                    .map(|p| 100.0 * (p.1 - p.0) / p.0)
                    .collect();
                v.sort_by(f64::total_cmp);
                v
            })
            .collect();
        let emin = errs.iter().flatten().copied().fold(0.0, f64::min);
        let emax = errs.iter().flatten().copied().fold(0.0, f64::max);
        let pad = 0.05 * (emax - emin).max(1.0);
        let mut chart = ChartBuilder::on(&panels[1])
            .caption(format!("{metric} error CDF"), (FONT, 16))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(60)
            .build_cartesian_2d(emin - pad..emax + pad, 0.0..1.0)
            .map_err(err)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .x_desc("(simulated - measured) / measured (%)")
            .y_desc("fraction of requests")
            .x_label_formatter(&|x: &f64| num(*x))
            .y_label_formatter(&|y: &f64| num(*y))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(err)?;
        for (i, (s, v)) in series.iter().zip(&errs).enumerate() {
            let style = color(i).stroke_width(2);
            let n = v.len().max(1) as f64;
            let pts: Vec<(f64, f64)> = v
                .iter()
                .enumerate()
                .map(|(k, &e)| (e, (k + 1) as f64 / n))
                .collect();
            chart
                .draw_series(LineSeries::new(pts, style))
                .map_err(err)?
                .label(s.label.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 12))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

//! Hit rate vs capacity: one curve per policy, Belady's MIN bound dashed above them, one
//! panel per data type.

use plotters::prelude::*;

use super::{color, err, num, Result, FONT};

/// One policy's curve: (capacity in bytes, hit rate in [0, 1]) points.
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    /// Legend label.
    pub label: String,
    /// Points, in any order (drawn by increasing capacity).
    pub points: Vec<(u64, f64)>,
    /// An offline oracle (drawn dashed, apart from the online policies' solid lines).
    pub offline: bool,
}

/// One panel: a data type's curves and, where it exists, the MIN bound.
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// What the y axis is, e.g. "KV block hit rate".
    pub y_desc: String,
    /// One curve per policy.
    pub curves: Vec<Curve>,
    /// Belady's MIN on an ideal cache of the same capacity (an upper bound), if any.
    pub bound: Option<Curve>,
}

/// The panels side by side (each 640 x 480) as SVG. Capacity on a log axis in GiB.
pub fn capacity(title: &str, panels: &[Panel]) -> Result<String> {
    let n = panels.len().max(1) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (640 * n, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, (FONT, 20)).map_err(err)?;
        for (area, p) in root.split_evenly((1, n as usize)).iter().zip(panels) {
            let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
            let all = p.curves.iter().chain(&p.bound);
            let xs: Vec<f64> = all
                .clone()
                .flat_map(|c| c.points.iter().map(|q| gib(q.0)))
                .collect();
            let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = xs.iter().copied().fold(0.0, f64::max);
            let (lo, hi) = if lo.is_finite() && hi > 0.0 {
                (lo, hi)
            } else {
                (0.1, 1.0)
            };
            // Ticks at the capacities run: plotters' log-axis ticks crowd and overlap.
            let mut ticks = xs.clone();
            ticks.sort_by(f64::total_cmp);
            ticks.dedup_by(|a, b| (*a - *b).abs() <= 1e-9 * b.abs());
            let ymax = all
                .flat_map(|c| c.points.iter().map(|q| q.1))
                .fold(0.0, f64::max);
            // Room above the highest curve for the legend.
            let ytop = (100.0 * ymax * 1.45).clamp(5.0, 130.0);
            let mut chart = ChartBuilder::on(area)
                .caption(&p.title, (FONT, 16))
                .margin(12)
                .x_label_area_size(44)
                .y_label_area_size(60)
                .build_cartesian_2d(
                    (lo / 1.3..hi * 1.3).log_scale().with_key_points(ticks),
                    0.0..ytop,
                )
                .map_err(err)?;
            chart
                .configure_mesh()
                .max_light_lines(1)
                .x_desc("store capacity (GiB, log scale)")
                .y_desc(format!("{} (%)", p.y_desc))
                .x_label_formatter(&|x: &f64| num(*x))
                .y_label_formatter(&|y: &f64| num(*y))
                .label_style((FONT, 13))
                .axis_desc_style((FONT, 14))
                .draw()
                .map_err(err)?;
            let pts = |c: &Curve| {
                let mut v: Vec<(f64, f64)> =
                    c.points.iter().map(|q| (gib(q.0), 100.0 * q.1)).collect();
                v.sort_by(|a, b| a.0.total_cmp(&b.0));
                v
            };
            for (i, c) in p.curves.iter().enumerate() {
                let col = color(i);
                let v = pts(c);
                let style = col.stroke_width(2);
                let series = if c.offline {
                    chart.draw_series(DashedLineSeries::new(v.clone(), 4, 4, style))
                } else {
                    chart.draw_series(LineSeries::new(v.clone(), style))
                };
                let label = if c.offline {
                    format!("{} (offline)", c.label)
                } else {
                    c.label.clone()
                };
                series
                    .map_err(err)?
                    .label(label)
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
                chart
                    .draw_series(v.into_iter().map(|q| Circle::new(q, 3, col.filled())))
                    .map_err(err)?;
            }
            if let Some(b) = &p.bound {
                let style = BLACK.stroke_width(3);
                chart
                    .draw_series(DashedLineSeries::new(pts(b), 8, 5, style))
                    .map_err(err)?
                    .label(b.label.as_str())
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
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

//! The ladder: saturated throughput (top) and P95 TTFT at load (bottom, log scale) per mode,
//! grouped by workload.

use plotters::prelude::*;

use super::{color, err, num, padded, Result, FONT};
use crate::des::ladder::{Cell, LadderResult};

/// A cell's value drawn in a panel.
type Metric = fn(&Cell) -> f64;

/// The ladder's two panels as SVG (900 x 760).
pub fn ladder(r: &LadderResult) -> Result<String> {
    let mut workloads: Vec<&str> = Vec::new();
    for c in &r.cells {
        if !workloads.contains(&c.workload.as_str()) {
            workloads.push(&c.workload);
        }
    }
    let modes = &r.config.modes;
    let title = format!(
        "{} x{} GPUs, {}",
        r.config.base.hardware.to_uppercase(),
        r.config.base.gpus,
        r.config.base.model
    );
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 760)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root
            .titled(&title, (FONT, 22))
            .map_err(err)?
            .margin(0, 0, 10, 10);
        let (top, bottom) = root.split_vertically(370);
        let cell = |w: &str, m| r.cells.iter().find(|c| c.workload == w && c.mode == m);
        let panels: [(_, &str, bool, Metric); 2] = [
            (&top, "saturated throughput (req/s)", false, |c: &Cell| {
                c.saturated.throughput_rps
            }),
            (
                &bottom,
                "P95 TTFT at load (ms, log scale)",
                true,
                |c: &Cell| c.at_load.ttft_ms.p95,
            ),
        ];
        for (area, y_desc, log, metric) in panels {
            let vals: Vec<f64> = r.cells.iter().map(metric).filter(|v| *v > 0.0).collect();
            let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = vals.iter().copied().fold(0.0, f64::max);
            let (y0, y1) = padded(if log { lo } else { 0.0 }, hi, log);
            let n = workloads.len() as f64;
            let names = workloads.clone();
            let x_fmt = move |x: &f64| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
                    names[i as usize].to_string()
                } else {
                    String::new()
                }
            };
            let width = 0.8 / modes.len().max(1) as f64;
            let bar = |wi: usize, mi: usize| {
                let x0 = wi as f64 - 0.4 + mi as f64 * width;
                (x0, x0 + width * 0.92)
            };
            let mut b = ChartBuilder::on(area);
            b.margin(8).x_label_area_size(36).y_label_area_size(70);
            macro_rules! draw {
                ($chart:expr, $base:expr) => {{
                    let mut chart = $chart;
                    chart
                        .configure_mesh()
                        .disable_x_mesh()
                        .max_light_lines(1)
                        .x_labels(workloads.len())
                        .x_label_formatter(&x_fmt)
                        .y_label_formatter(&|y: &f64| num(*y))
                        .x_desc("workload")
                        .y_desc(y_desc)
                        .label_style((FONT, 14))
                        .axis_desc_style((FONT, 15))
                        .draw()
                        .map_err(err)?;
                    for (mi, m) in modes.iter().enumerate() {
                        let c = color(mi);
                        let bars: Vec<_> = workloads
                            .iter()
                            .enumerate()
                            .filter_map(|(wi, w)| {
                                let v = metric(cell(w, *m)?);
                                let (x0, x1) = bar(wi, mi);
                                Some(Rectangle::new(
                                    [(x0, $base), (x1, v.max($base))],
                                    c.filled(),
                                ))
                            })
                            .collect();
                        chart
                            .draw_series(bars)
                            .map_err(err)?
                            .label(m.name())
                            .legend(move |(x, y)| {
                                Rectangle::new([(x, y - 6), (x + 14, y + 6)], c.filled())
                            });
                    }
                    chart
                        .configure_series_labels()
                        .position(SeriesLabelPosition::UpperRight)
                        .background_style(WHITE.mix(0.9))
                        .border_style(BLACK.mix(0.4))
                        .label_font((FONT, 14))
                        .draw()
                        .map_err(err)?;
                }};
            }
            if log {
                draw!(
                    b.build_cartesian_2d(-0.5..n - 0.5, (y0..y1).log_scale())
                        .map_err(err)?,
                    y0
                );
            } else {
                draw!(
                    b.build_cartesian_2d(-0.5..n - 0.5, y0..y1).map_err(err)?,
                    0.0
                );
            }
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

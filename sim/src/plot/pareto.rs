//! `sweep best`: every point (mean over seeds), those meeting the SLOs, the Pareto front
//! as a staircase, and the best point.

use plotters::prelude::*;

use super::{color, err, num, padded, Result, FONT};
use crate::sweep::{BestReport, Constraint, Objective, PointMeans};

/// How a metric is drawn: its scale and axis label (rates in %, bytes in GiB).
fn unit(o: &Objective) -> (f64, String) {
    let dir = if o.maximize { "max" } else { "min" };
    let m = &o.metric;
    if m.ends_with("rate") {
        (100.0, format!("{m} (%, {dir})"))
    } else if m.ends_with("bytes") {
        (1.0 / f64::from(1u32 << 30), format!("{m} (GiB, {dir})"))
    } else if m.ends_with("_ms") || m.contains("_ms.") {
        (1.0, format!("{m} (ms, {dir})"))
    } else if m.ends_with("_s") {
        (1.0, format!("{m} (s, {dir})"))
    } else {
        (1.0, format!("{m} ({dir})"))
    }
}

/// The front over `x` and `y` under `slos` as SVG (820 x 560), from `sweep::best`'s report.
pub fn pareto(r: &BestReport, x: &Objective, y: &Objective, slos: &[Constraint]) -> Result<String> {
    let ((sx, lx), (sy, ly)) = (unit(x), unit(y));
    let at = |p: &PointMeans| {
        let g = |m: &str| p.means.get(m).copied().unwrap_or(f64::NAN);
        (sx * g(&x.metric), sy * g(&y.metric))
    };
    let ok = |p: &PointMeans| {
        slos.iter()
            .all(|c| c.holds(p.means.get(&c.metric).copied().unwrap_or(f64::NAN)))
    };
    let all: Vec<(f64, f64)> = r
        .points
        .iter()
        .map(at)
        .filter(|q| q.0.is_finite() && q.1.is_finite())
        .collect();
    let (xl, xh) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, q| {
        (a.0.min(q.0), a.1.max(q.0))
    });
    let (yl, yh) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |a, q| {
        (a.0.min(q.1), a.1.max(q.1))
    });
    let (xl, xh) = if xl.is_finite() { (xl, xh) } else { (0.0, 1.0) };
    let (yl, yh) = if yl.is_finite() { (yl, yh) } else { (0.0, 1.0) };
    let xpad = ((xh - xl) * 0.06).max(xh.abs() * 0.02).max(1e-9);
    let (y0, y1) = padded(yl, yh, false);
    let y0 = if yl > 0.0 {
        (yl - (yh - yl) * 0.1).max(0.0)
    } else {
        y0
    };
    let slo = if slos.is_empty() {
        "no SLO".to_string()
    } else {
        slos.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (820, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "sweep best: {} of {} points meet {slo}; {} on the front",
                    r.feasible,
                    r.total,
                    r.front.len()
                ),
                (FONT, 18),
            )
            .margin(14)
            .x_label_area_size(46)
            .y_label_area_size(70)
            .build_cartesian_2d(xl - xpad..xh + xpad, y0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .max_light_lines(1)
            .x_desc(lx)
            .y_desc(ly)
            .x_label_formatter(&|v: &f64| num(*v))
            .y_label_formatter(&|v: &f64| num(*v))
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 14))
            .draw()
            .map_err(err)?;
        let grey = RGBColor(190, 190, 190);
        let blue = color(0);
        let red = color(3);
        let (infeasible, feasible): (Vec<_>, Vec<_>) = r.points.iter().partition(|p| !ok(p));
        chart
            .draw_series(
                infeasible
                    .iter()
                    .map(|p| Circle::new(at(p), 4, grey.filled())),
            )
            .map_err(err)?
            .label("fails the SLO (mean over seeds)")
            .legend(move |(x, y)| Circle::new((x + 8, y), 4, grey.filled()));
        chart
            .draw_series(
                feasible
                    .iter()
                    .map(|p| Circle::new(at(p), 4, blue.filled())),
            )
            .map_err(err)?
            .label(format!("meets {slo}"))
            .legend(move |(x, y)| Circle::new((x + 8, y), 4, blue.filled()));
        // The front as a staircase through its points, in the report's (x-increasing) order.
        let f: Vec<(f64, f64)> = r.front.iter().map(at).collect();
        let mut steps = Vec::new();
        for (i, q) in f.iter().enumerate() {
            if i > 0 {
                steps.push((q.0, f[i - 1].1));
            }
            steps.push(*q);
        }
        chart
            .draw_series(LineSeries::new(steps, red.stroke_width(2)))
            .map_err(err)?;
        chart
            .draw_series(f.iter().map(|q| Circle::new(*q, 6, red.stroke_width(2))))
            .map_err(err)?
            .label("Pareto front")
            .legend(move |(x, y)| Circle::new((x + 8, y), 6, red.stroke_width(2)));
        if let Some(b) = &r.best {
            let q = at(b);
            let gold = RGBColor(230, 170, 0);
            chart
                .draw_series([TriangleMarker::new(q, 12, gold.filled())])
                .map_err(err)?
                .label(format!("best on {} (point {})", y.metric, b.point))
                .legend(move |(x, y)| TriangleMarker::new((x + 8, y), 7, gold.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .label_font((FONT, 13))
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

//! Choosing points: the Pareto front over two metrics and the best point under SLOs, on
//! per-point means over seeds.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use super::table::read_results;
use super::{PlanError, Result, SweepError};

/// A metric to minimise (default) or maximise: `ttft_ms.p95`, `throughput_rps:max`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Objective {
    /// Metric column.
    pub metric: String,
    /// Larger is better.
    pub maximize: bool,
}

impl FromStr for Objective {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        let (metric, maximize) = match s.rsplit_once(':') {
            Some((m, "max")) => (m, true),
            Some((m, "min")) => (m, false),
            Some((_, d)) => {
                return Err(PlanError::field(
                    format!("{s:?}"),
                    format!("direction {d:?}; expected :min or :max"),
                ))
            }
            None => (s, false),
        };
        if metric.trim().is_empty() {
            return Err(PlanError::field(format!("{s:?}"), "expected a metric name"));
        }
        Ok(Objective {
            metric: metric.trim().to_string(),
            maximize,
        })
    }
}

impl Objective {
    /// The value turned so that smaller is better.
    fn key(&self, v: f64) -> f64 {
        if self.maximize {
            -v
        } else {
            v
        }
    }
}

/// Comparison of a constraint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// `<=`
    Le,
    /// `<`
    Lt,
    /// `>=`
    Ge,
    /// `>`
    Gt,
}

/// An SLO on a metric's mean over seeds: `ttft_ms.p95<=2000`.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    /// Metric column.
    pub metric: String,
    /// Comparison.
    pub op: Op,
    /// Bound.
    pub value: f64,
}

impl FromStr for Constraint {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        for (tok, op) in [("<=", Op::Le), (">=", Op::Ge), ("<", Op::Lt), (">", Op::Gt)] {
            if let Some((m, v)) = s.split_once(tok) {
                let value: f64 = v.trim().parse().map_err(|_| {
                    PlanError::field(
                        format!("{s:?}"),
                        format!("expected a number after {tok}, found {:?}", v.trim()),
                    )
                })?;
                if m.trim().is_empty() {
                    return Err(PlanError::field(
                        format!("{s:?}"),
                        format!("expected a metric before {tok}"),
                    ));
                }
                return Ok(Constraint {
                    metric: m.trim().to_string(),
                    op,
                    value,
                });
            }
        }
        Err(PlanError::field(
            format!("{s:?}"),
            "expected metric<=value (or <, >=, >), e.g. ttft_ms.p95<=2000",
        ))
    }
}

impl Constraint {
    /// Whether `v` meets it (NaN never does).
    pub fn holds(&self, v: f64) -> bool {
        match self.op {
            Op::Le => v <= self.value,
            Op::Lt => v < self.value,
            Op::Ge => v >= self.value,
            Op::Gt => v > self.value,
        }
    }
}

impl std::fmt::Display for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let op = match self.op {
            Op::Le => "<=",
            Op::Lt => "<",
            Op::Ge => ">=",
            Op::Gt => ">",
        };
        write!(f, "{}{op}{}", self.metric, self.value)
    }
}

/// One point's means over seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct PointMeans {
    /// Point index.
    pub point: u32,
    /// Axis (name, value) pairs.
    pub axes: Vec<(String, String)>,
    /// Seeds averaged.
    pub seeds: usize,
    /// Mean of every metric.
    pub means: BTreeMap<String, f64>,
}

/// The front and the best point.
#[derive(Debug, Clone, PartialEq)]
pub struct BestReport {
    /// Points in the table.
    pub total: usize,
    /// Points meeting every constraint.
    pub feasible: usize,
    /// Pareto-optimal feasible points over (x, y), in increasing x (as optimised).
    pub front: Vec<PointMeans>,
    /// The feasible point best on y (ties: x, then point index).
    pub best: Option<PointMeans>,
    /// Every point, feasible or not, in point order (what a figure draws behind the front).
    pub points: Vec<PointMeans>,
}

/// Indices of the Pareto-optimal points among `pts`, minimising both coordinates, in
/// increasing x. Points with a NaN are never on it; equal points are all on it.
pub fn pareto_front(pts: &[(f64, f64)]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..pts.len())
        .filter(|&i| !(pts[i].0.is_nan() || pts[i].1.is_nan()))
        .collect();
    idx.sort_by(|&a, &b| {
        pts[a]
            .0
            .total_cmp(&pts[b].0)
            .then(pts[a].1.total_cmp(&pts[b].1))
            .then(a.cmp(&b))
    });
    let mut front = Vec::new();
    let mut last: Option<(f64, f64)> = None;
    for i in idx {
        let p = pts[i];
        match last {
            Some(l) if p == l => front.push(i),
            Some(l) if p.1 >= l.1 => {}
            _ => {
                front.push(i);
                last = Some(p);
            }
        }
    }
    front
}

/// The Pareto front over `x` and `y` and the best point on `y` under `constraints`, from a
/// results table (a `results.parquet` or a sweep folder), on per-point means over seeds.
pub fn best(
    results: &Path,
    x: &Objective,
    y: &Objective,
    constraints: &[Constraint],
) -> Result<BestReport> {
    let t = read_results(results)?;
    let col = |m: &str| -> Result<usize> {
        t.metrics.iter().position(|n| n == m).ok_or_else(|| {
            SweepError::Results(format!(
                "no metric `{m}` in {} (it has: {})",
                results.display(),
                t.metrics.join(", ")
            ))
        })
    };
    let (xi, yi) = (col(&x.metric)?, col(&y.metric)?);
    let ci: Vec<usize> = constraints
        .iter()
        .map(|c| col(&c.metric))
        .collect::<Result<_>>()?;
    let mut points: Vec<PointMeans> = Vec::new();
    let mut sums: Vec<Vec<f64>> = Vec::new();
    let mut at: BTreeMap<u32, usize> = BTreeMap::new();
    for r in 0..t.point.len() {
        let k = *at.entry(t.point[r]).or_insert_with(|| {
            points.push(PointMeans {
                point: t.point[r],
                axes: t
                    .axes
                    .iter()
                    .cloned()
                    .zip(t.axis_values[r].iter().cloned())
                    .collect(),
                seeds: 0,
                means: BTreeMap::new(),
            });
            sums.push(vec![0.0; t.metrics.len()]);
            points.len() - 1
        });
        points[k].seeds += 1;
        for (s, v) in sums[k].iter_mut().zip(&t.values[r]) {
            *s += v;
        }
    }
    let mut means: Vec<Vec<f64>> = Vec::new();
    for (p, s) in points.iter_mut().zip(&sums) {
        let m: Vec<f64> = s.iter().map(|v| v / p.seeds as f64).collect();
        p.means = t.metrics.iter().cloned().zip(m.iter().copied()).collect();
        means.push(m);
    }
    let feasible: Vec<usize> = (0..points.len())
        .filter(|&p| {
            constraints
                .iter()
                .zip(&ci)
                .all(|(c, &i)| c.holds(means[p][i]))
        })
        .collect();
    let pts: Vec<(f64, f64)> = feasible
        .iter()
        .map(|&p| (x.key(means[p][xi]), y.key(means[p][yi])))
        .collect();
    let front: Vec<PointMeans> = pareto_front(&pts)
        .into_iter()
        .map(|i| points[feasible[i]].clone())
        .collect();
    let best = feasible
        .iter()
        .copied()
        .filter(|&p| !(means[p][yi].is_nan() || means[p][xi].is_nan()))
        .min_by(|&a, &b| {
            y.key(means[a][yi])
                .total_cmp(&y.key(means[b][yi]))
                .then(x.key(means[a][xi]).total_cmp(&x.key(means[b][xi])))
                .then(points[a].point.cmp(&points[b].point))
        })
        .map(|p| points[p].clone());
    Ok(BestReport {
        total: points.len(),
        feasible: feasible.len(),
        front,
        best,
        points,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn dominated(p: (f64, f64), q: (f64, f64)) -> bool {
        q.0 <= p.0 && q.1 <= p.1 && (q.0 < p.0 || q.1 < p.1)
    }

    #[test]
    fn front_of_a_hand_made_set() {
        let pts = [
            (1.0, 5.0),
            (2.0, 3.0),
            (2.0, 4.0),
            (3.0, 3.0),
            (4.0, 1.0),
            (4.0, 1.0),
            (0.5, f64::NAN),
        ];
        assert_eq!(pareto_front(&pts), [0, 1, 4, 5]);
    }

    proptest! {
        #[test]
        fn front_is_exactly_the_non_dominated_points(
            pts in proptest::collection::vec((0u8..8, 0u8..8), 0..40)
        ) {
            let pts: Vec<(f64, f64)> = pts.into_iter().map(|(a, b)| (f64::from(a), f64::from(b))).collect();
            let mut got = pareto_front(&pts);
            got.sort_unstable();
            let want: Vec<usize> = (0..pts.len())
                .filter(|&i| !pts.iter().any(|&q| dominated(pts[i], q)))
                .collect();
            prop_assert_eq!(got, want);
        }
    }

    #[test]
    fn objectives_and_constraints_parse() {
        assert_eq!(
            "throughput_rps:max".parse::<Objective>().unwrap(),
            Objective {
                metric: "throughput_rps".into(),
                maximize: true
            }
        );
        assert!(!"ttft_ms.p95".parse::<Objective>().unwrap().maximize);
        assert!("x:up".parse::<Objective>().is_err());
        let c: Constraint = "ttft_ms.p95 <= 2000".parse().unwrap();
        assert_eq!(
            (c.metric.as_str(), c.op, c.value),
            ("ttft_ms.p95", Op::Le, 2000.0)
        );
        assert!(c.holds(2000.0) && !c.holds(2000.5) && !c.holds(f64::NAN));
        let c: Constraint = "hit_rate>0.5".parse().unwrap();
        assert_eq!(c.op, Op::Gt);
        assert!("hit_rate=0.5".parse::<Constraint>().is_err());
        assert!("<=3".parse::<Constraint>().is_err());
    }
}

//! `moonagent sweep`: parameter sweeps over the simulator or the store-level replay.
//!
//! `run` executes a plan (or one shard) into a folder, `check` validates a plan without
//! running it, `merge` joins shard folders into one table, `best` reads a table and prints
//! the Pareto front and the best point under SLOs. Everything is decided in
//! `moonagent_sim::sweep`; this module parses arguments and prints.

use std::path::PathBuf;

use anyhow::{anyhow, Context, Result};
use clap::{Args, Subcommand};
use moonagent_sim::sweep::{
    self, best, merge, Constraint, Kind, Objective, Plan, PointMeans, RunOptions, Shard, SummaryRow,
};

use super::util::print_table;

/// Arguments of `moonagent sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(subcommand)]
    command: SweepCommand,
}

#[derive(Subcommand, Debug)]
enum SweepCommand {
    /// Run a plan (or one shard of it) into a sweep folder; --resume continues one.
    Run(RunArgs),
    /// Validate a plan (every axis value and point) and count its runs, running nothing.
    Check(CheckArgs),
    /// Merge shard folders into one results table, checking every run is there once.
    Merge(MergeArgs),
    /// Pareto front over two metrics and the best point under SLOs.
    Best(BestArgs),
}

#[derive(Args, Debug)]
struct RunArgs {
    /// The plan file (TOML); see examples/sweeps/.
    plan: PathBuf,
    /// Sweep folder: plan.json, points/, results.parquet, summary.parquet, timings.json.
    #[arg(long)]
    out: PathBuf,
    /// Worker threads (0 = every core, or RAYON_NUM_THREADS).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Run only shard i of N (0-based): the points whose index is i mod N.
    #[arg(long)]
    shard: Option<Shard>,
    /// Continue the sweep in --out (same plan and shard), skipping finished runs; starts
    /// afresh if --out holds none, so a retried batch job can always pass it.
    #[arg(long)]
    resume: bool,
    /// Override a plan value: a dotted path from the plan's top level and a TOML value,
    /// e.g. --set base.workload.config.sessions=100 --set seeds=5. Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Metrics shown in the printed summary (default: a few key ones). Repeatable.
    #[arg(long = "show", value_name = "METRIC")]
    show: Vec<String>,
    /// No progress bar or final line on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// fsync every point file (durable at once across a power loss; costs a disk flush per
    /// run). Without it a point file torn by a power loss fails its checksum and reruns.
    #[arg(long)]
    fsync: bool,
}

#[derive(Args, Debug)]
struct CheckArgs {
    /// The plan file.
    plan: PathBuf,
    /// Override a plan value (as for `run`). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Print every point.
    #[arg(long)]
    list: bool,
}

#[derive(Args, Debug)]
struct MergeArgs {
    /// Sweep folders (shards of one plan).
    #[arg(required = true)]
    dirs: Vec<PathBuf>,
    /// The merged results table (Parquet).
    #[arg(long)]
    out: PathBuf,
    /// The merged summary table (default: summary.parquet beside a results.parquet, else
    /// <stem>_summary.parquet).
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Metrics shown in the printed summary. Repeatable.
    #[arg(long = "show", value_name = "METRIC")]
    show: Vec<String>,
}

#[derive(Args, Debug)]
struct BestArgs {
    /// A results table (results.parquet) or a sweep folder holding one.
    results: PathBuf,
    /// First metric of the front; minimised, or append :max (e.g. throughput_rps:max).
    #[arg(long)]
    x: Objective,
    /// Second metric; the best point is the feasible one best on it.
    #[arg(long)]
    y: Objective,
    /// Constraint on a metric's mean over seeds, e.g. 'ttft_ms.p95<=2000'. Repeatable.
    #[arg(long = "slo", value_name = "METRIC<=VALUE")]
    slos: Vec<Constraint>,
    /// Print the front and the best point as JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Draw every point, the SLO-feasible ones, the front and the best point as SVG here.
    #[arg(long)]
    plot: Option<PathBuf>,
}

fn parse_sets(sets: &[String]) -> Result<Vec<(String, String)>> {
    sets.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| anyhow!("--set {s:?}: expected KEY=VALUE"))
        })
        .collect()
}

/// A number with about four significant digits.
fn num(x: f64) -> String {
    if !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if a == 0.0 {
        "0".into()
    } else if x.fract() == 0.0 && a < 1e7 {
        format!("{x:.0}")
    } else if !(1e-3..1e7).contains(&a) {
        format!("{x:.3e}")
    } else {
        let decimals = (3 - a.log10().floor() as i32).clamp(0, 6) as usize;
        format!("{x:.decimals$}")
    }
}

fn shown_metrics(kind: Kind, plan_metrics: &[String], show: &[String]) -> Vec<usize> {
    let defaults: &[&str] = match kind {
        Kind::Simulate => &[
            "ttft_ms.p95",
            "encoder_gpu_s",
            "throughput_rps",
            "image_hit_rate",
        ],
        Kind::Replay => &[
            "encoder_output.hit_rate",
            "kv_cache.hit_rate",
            "total.saving_time_rate",
            "encoder_output.recompute_s",
        ],
    };
    let pos = |m: &str| plan_metrics.iter().position(|x| x == m);
    let picked: Vec<usize> = if show.is_empty() {
        defaults.iter().filter_map(|m| pos(m)).collect()
    } else {
        show.iter().filter_map(|m| pos(m)).collect()
    };
    if picked.is_empty() {
        (0..plan_metrics.len().min(4)).collect()
    } else {
        picked
    }
}

fn print_summary(plan: &Plan, summary: &[SummaryRow], show: &[String]) {
    const MAX_ROWS: usize = 40;
    let cols = shown_metrics(plan.kind, &plan.metrics, show);
    let mut head = vec!["point".to_string()];
    head.extend(plan.axes.iter().map(|a| a.name.clone()));
    head.push("seeds".into());
    head.extend(cols.iter().map(|&m| plan.metrics[m].clone()));
    let mut rows = vec![head];
    for s in summary.iter().take(MAX_ROWS) {
        let mut r = vec![s.point.to_string()];
        r.extend(s.axes.iter().cloned());
        r.push(s.metrics.first().map_or(0, |m| m.n).to_string());
        for &m in &cols {
            let c = &s.metrics[m];
            r.push(match c.half {
                Some(h) => format!("{} ± {}", num(c.mean), num(h)),
                None => num(c.mean),
            });
        }
        rows.push(r);
    }
    println!();
    print_table(&rows);
    if summary.len() > MAX_ROWS {
        println!(
            "... {} more points (see the summary table)",
            summary.len() - MAX_ROWS
        );
    }
    println!("(mean ± half-width of a two-sided 95% Student-t interval over seeds)");
}

/// Run `moonagent sweep`.
pub fn run(args: SweepArgs) -> Result<()> {
    match args.command {
        SweepCommand::Run(a) => run_plan(a),
        SweepCommand::Check(a) => check(a),
        SweepCommand::Merge(a) => merge_dirs(a),
        SweepCommand::Best(a) => best_point(a),
    }
}

fn load(plan: &std::path::Path, sets: &[String]) -> Result<(Plan, sweep::Prepared)> {
    let plan = Plan::from_file(plan, &parse_sets(sets)?)?;
    let prep = plan.prepare()?;
    Ok((plan, prep))
}

fn run_plan(a: RunArgs) -> Result<()> {
    let (plan, prep) = load(&a.plan, &a.sets)?;
    let opts = RunOptions {
        out: a.out.clone(),
        threads: a.threads,
        shard: a.shard,
        resume: a.resume,
        progress: !a.quiet,
        fsync: a.fsync,
    };
    let r = sweep::run(&prep, &opts).with_context(|| format!("sweep {}", a.plan.display()))?;
    print_summary(&plan, &r.summary, &a.show);
    println!(
        "\n{} runs ({} points x {} seeds{}), {} executed now on {} threads, {} already done",
        r.runs,
        r.points,
        plan.seeds.len(),
        a.shard.map(|s| format!(", shard {s}")).unwrap_or_default(),
        r.executed,
        r.threads,
        r.skipped
    );
    println!(
        "results: {}\nsummary: {}\nplan hash: {}",
        r.results.display(),
        r.summary_path.display(),
        prep.hash
    );
    Ok(())
}

fn check(a: CheckArgs) -> Result<()> {
    let (plan, prep) = load(&a.plan, &a.sets)?;
    println!(
        "{}: {} plan, {} points x {} seeds = {} runs, {} metrics; plan hash {}",
        a.plan.display(),
        plan.kind.name(),
        plan.points.len(),
        plan.seeds.len(),
        plan.runs(),
        plan.metrics.len(),
        prep.hash
    );
    for (i, ax) in plan.axes.iter().enumerate() {
        println!(
            "  axis {} `{}` ({}): {} values{}",
            i + 1,
            ax.name,
            ax.path,
            ax.values.len(),
            plan.axes
                .iter()
                .enumerate()
                .find(|(j, b)| *j != i && b.group == ax.group)
                .map(|(_, b)| format!(", zipped with `{}`", b.name))
                .unwrap_or_default()
        );
    }
    if a.list {
        let mut rows = vec![{
            let mut h = vec!["point".to_string(), "id".into()];
            h.extend(plan.axes.iter().map(|x| x.name.clone()));
            h
        }];
        for p in &plan.points {
            let mut r = vec![p.index.to_string(), p.id.clone()];
            r.extend((0..plan.axes.len()).map(|i| sweep::table::value_text(plan.value(p, i))));
            rows.push(r);
        }
        print_table(&rows);
    }
    Ok(())
}

fn merge_dirs(a: MergeArgs) -> Result<()> {
    let r = merge(&a.dirs, &a.out, a.summary.as_deref())?;
    print_summary(&r.plan, &r.summary, &a.show);
    println!(
        "\nmerged {} runs from {} folders\nresults: {}\nsummary: {}\nplan hash: {}",
        r.runs,
        a.dirs.len(),
        r.results.display(),
        r.summary_path.display(),
        r.plan_hash
    );
    Ok(())
}

fn point_json(p: &PointMeans) -> serde_json::Value {
    serde_json::json!({
        "point": p.point,
        "axes": p.axes.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        "seeds": p.seeds,
        "means": p.means,
    })
}

fn best_point(a: BestArgs) -> Result<()> {
    let r = best(&a.results, &a.x, &a.y, &a.slos)?;
    if let Some(p) = &a.plot {
        let svg =
            moonagent_sim::plot::pareto(&r, &a.x, &a.y, &a.slos).map_err(anyhow::Error::msg)?;
        super::plot::write(p, &svg)?;
    }
    if a.json {
        let v = serde_json::json!({
            "x": a.x.metric, "y": a.y.metric,
            "x_maximize": a.x.maximize, "y_maximize": a.y.maximize,
            "slo": a.slos.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "points": r.total, "feasible": r.feasible,
            "front": r.front.iter().map(point_json).collect::<Vec<_>>(),
            "best": r.best.as_ref().map(point_json),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let dir = |o: &Objective| if o.maximize { "max" } else { "min" };
    let table = |pts: &[&PointMeans]| {
        let Some(first) = pts.first() else { return };
        let mut head = vec!["point".to_string()];
        head.extend(first.axes.iter().map(|(n, _)| n.clone()));
        head.push(format!("{} ({})", a.x.metric, dir(&a.x)));
        head.push(format!("{} ({})", a.y.metric, dir(&a.y)));
        head.extend(
            a.slos
                .iter()
                .map(|c| c.metric.clone())
                .filter(|m| *m != a.x.metric && *m != a.y.metric),
        );
        let mut rows = vec![head];
        for p in pts {
            let mut row = vec![p.point.to_string()];
            row.extend(p.axes.iter().map(|(_, v)| v.clone()));
            row.push(num(p.means[&a.x.metric]));
            row.push(num(p.means[&a.y.metric]));
            row.extend(
                a.slos
                    .iter()
                    .filter(|c| c.metric != a.x.metric && c.metric != a.y.metric)
                    .map(|c| num(p.means[&c.metric])),
            );
            rows.push(row);
        }
        print_table(&rows);
    };
    let slo = if a.slos.is_empty() {
        String::new()
    } else {
        format!(
            " meeting {}",
            a.slos
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    println!(
        "Pareto front over {} and {} (means over seeds): {} of {} points{slo}, {} on the front\n",
        a.x.metric,
        a.y.metric,
        r.feasible,
        r.total,
        r.front.len()
    );
    table(&r.front.iter().collect::<Vec<_>>());
    match &r.best {
        Some(b) => {
            println!("\nbest on {} ({}){slo}:", a.y.metric, dir(&a.y));
            table(&[b]);
        }
        None => println!("\nno point{slo}"),
    }
    Ok(())
}

//! `moonagent repro ...`: the published experiments, rerun on moonagent's replay.
//!
//! - `eviction-ablation`: the type-aware eviction ablation of the Mooncake proposal
//!   (PRs 2743-2746) on its 600-session workload, printed beside the proposal's numbers,
//!   with the shape check;
//! - `mooncake-capacity`: hit rate vs capacity on Mooncake's FAST'25 conversation trace
//!   (KV blocks only) for every online policy, the store-level offline policies and
//!   Belady's MIN bound.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use moonagent_core::store::{DataType, MemStoreConfig};
use moonagent_sim::replay::ablation::{self, Row, Shape, SEED_002};
use moonagent_sim::replay::{replay_all, replay_grid, Compiled, PolicyResult};
use moonagent_sim::table::Column;
use serde::Serialize;

use super::replay::{capacities, min_bounds, results_table, write_out, CapacityRun};
use super::util::{human_bytes, parse_bytes, print_table};

/// Arguments of `moonagent repro`.
#[derive(Args, Debug)]
pub struct ReproArgs {
    #[command(subcommand)]
    what: Experiment,
}

#[derive(Subcommand, Debug)]
enum Experiment {
    /// The type-aware eviction ablation of the Mooncake proposal (default, grace only, reuse scale only,
    /// balanced; plus gdsf, hierarchical, lru and the offline oracles) on its session workload.
    EvictionAblation(AblationArgs),
    /// Hit rate vs capacity on Mooncake's conversation trace (KV blocks only), every policy
    /// and Belady's MIN bound.
    MooncakeCapacity(CapacityArgs),
}

/// Arguments of `moonagent repro eviction-ablation`.
#[derive(Args, Debug)]
pub struct AblationArgs {
    /// Sessions of the workload (the proposal's: 600).
    #[arg(long, default_value_t = 600)]
    pub sessions: u64,
    /// Workload seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Store capacity: bytes or a share of the workload's unique bytes. Default: 20%, the
    /// share at which `default`'s KV re-reference hit rate comes closest to the proposal's.
    #[arg(long)]
    pub capacity: Option<String>,
    /// Also print `default`'s KV re-reference hit rate at these shares (how the default
    /// capacity was chosen), e.g. `5%,10%,15%,20%,30%`.
    #[arg(long, value_delimiter = ',')]
    pub calibrate: Vec<String>,
    /// Write the results: `.json`, `.parquet` or `.csv`.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Arguments of `moonagent repro mooncake-capacity`.
#[derive(Args, Debug)]
pub struct CapacityArgs {
    /// The Mooncake FAST'25 JSONL trace (default: `$MOONAGENT_TRACES/mooncake/conversation_trace.jsonl`).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Capacities: bytes or shares of the trace's unique bytes.
    #[arg(long, value_delimiter = ',', default_value = "0.5%,1%,2%,5%,10%,20%")]
    pub capacity: Vec<String>,
    /// Write the results: `.json`, `.parquet` or `.csv`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Draw hit rate vs capacity (every policy and the MIN bound) as SVG here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// Run `moonagent repro`.
pub fn run(args: ReproArgs) -> Result<()> {
    match args.what {
        Experiment::EvictionAblation(a) => eviction_ablation(a),
        Experiment::MooncakeCapacity(a) => mooncake_capacity(a),
    }
}

/// What `eviction-ablation --out x.json` writes.
#[derive(Serialize)]
struct AblationReport {
    sessions: u64,
    seed: u64,
    capacity_bytes: u64,
    unique_bytes: u64,
    encoder_share_of_unique_bytes: f64,
    rows: Vec<Row>,
    shape_reuse: Option<Shape>,
    shape_all: Option<Shape>,
    results: Vec<PolicyResult>,
}

fn seed_of(label: &str) -> Option<(f64, f64, f64)> {
    SEED_002
        .iter()
        .find(|r| r.0 == label)
        .map(|r| (r.1, r.2, r.3))
}

fn f2(x: f64) -> String {
    format!("{x:.2}")
}

fn eviction_ablation(a: AblationArgs) -> Result<()> {
    if a.sessions == 0 {
        bail!("--sessions: expected at least 1 session");
    }
    let compiled =
        ablation::sessions_trace(a.sessions, a.seed).map_err(|e| anyhow::anyhow!("{e}"))?;
    let unique = compiled.unique_bytes();
    let total: u64 = unique.iter().sum();
    let enc_share = unique[DataType::EncoderOutput.index()] as f64 / total.max(1) as f64;
    let base = MemStoreConfig::default();
    if !a.calibrate.is_empty() {
        let shares: Vec<f64> = a
            .calibrate
            .iter()
            .map(|s| {
                let p = s
                    .trim()
                    .strip_suffix('%')
                    .and_then(|p| p.trim().parse::<f64>().ok())
                    .filter(|p| *p > 0.0 && p.is_finite());
                p.map(|p| p / 100.0).with_context(|| {
                    format!("--calibrate {s}: expected a positive percentage such as 20%")
                })
            })
            .collect::<Result<_>>()?;
        let cal =
            ablation::calibrate_capacity(&compiled, &shares, &base).map_err(anyhow::Error::msg)?;
        println!("default's KV re-reference hit rate by capacity (the proposal: 96.65%):");
        let mut rows = vec![vec!["capacity share".to_string(), "KV reuse hit %".into()]];
        for (s, h) in cal {
            rows.push(vec![format!("{:.1}%", 100.0 * s), f2(h)]);
        }
        print_table(&rows);
        println!();
    }
    let cap_s = a
        .capacity
        .clone()
        .unwrap_or_else(|| format!("{}%", 100.0 * ablation::DEFAULT_CAPACITY_SHARE));
    let capacity =
        parse_bytes(&cap_s, Some(total)).with_context(|| format!("--capacity {cap_s}"))?;
    let cfg = MemStoreConfig {
        capacity_bytes: capacity,
        ..base
    };
    let pols = ablation::all_policies();
    eprintln!(
        "the proposal's sessions workload: {} sessions (seed {}), {} requests, {} accesses, unique {} ({:.2}% encoder outputs); capacity {} ({:.1}% of unique); {} policies on {} threads",
        a.sessions,
        a.seed,
        compiled.requests,
        compiled.accesses.len(),
        human_bytes(total),
        100.0 * enc_share,
        human_bytes(capacity),
        100.0 * capacity as f64 / total.max(1) as f64,
        pols.len(),
        rayon::current_num_threads()
    );
    let results = replay_all(&compiled, &cfg, &pols).map_err(anyhow::Error::msg)?;
    let rows: Vec<Row> = results.iter().map(Row::of).collect();
    println!(
        "Type-aware eviction ablation (Mooncake proposal, PRs 2743-2746), {} sessions, capacity {} ({:.1}% of unique bytes)",
        a.sessions,
        human_bytes(capacity),
        100.0 * capacity as f64 / total.max(1) as f64
    );
    println!("reuse = re-references only (first references excluded, the proposal's terms); all = every lookup");
    let mut t = vec![vec![
        "policy".to_string(),
        "hidden reuse hit".into(),
        "KV reuse hit".into(),
        "saving-time (reuse)".into(),
        "proposal hidden".into(),
        "proposal KV".into(),
        "proposal saving".into(),
        "hidden hit (all)".into(),
        "KV hit (all)".into(),
        "saving-time (all)".into(),
        "evicted".into(),
        "no-space puts".into(),
    ]];
    for r in &rows {
        let s = seed_of(&r.label);
        let sc = |f: fn(&(f64, f64, f64)) -> f64| s.as_ref().map_or("-".to_string(), |x| f2(f(x)));
        t.push(vec![
            r.label.clone(),
            f2(r.hidden_reuse_hit),
            f2(r.kv_reuse_hit),
            f2(r.reuse_saving_time),
            sc(|x| x.0),
            sc(|x| x.1),
            sc(|x| x.2),
            f2(r.hidden_hit),
            f2(r.kv_hit),
            f2(r.saving_time),
            r.evicted.to_string(),
            r.puts_no_space.to_string(),
        ]);
    }
    print_table(&t);
    let shape_reuse = Shape::of(&rows, true);
    let shape_all = Shape::of(&rows, false);
    let (d, b) = (SEED_002[0], SEED_002[3]);
    let seed_shape = (b.1 - d.1, d.2 - b.2, b.3 - d.3);
    println!(
        "\nshape, balanced vs default (the proposal: hidden +{:.2} pts, KV -{:.2} pts, saving-time +{:.2} pts):",
        seed_shape.0, seed_shape.1, seed_shape.2
    );
    for s in [&shape_reuse, &shape_all].into_iter().flatten() {
        println!(
            "  {:<5} hidden {:+.2} pts (>= +30: {}), KV {:+.2} pts (drop <= 2: {}), saving-time {:+.2} pts (rises: {}) => {}",
            s.rates,
            s.hidden_gain,
            s.hidden_gain >= 30.0,
            -s.kv_drop,
            s.kv_drop <= 2.0,
            s.saving_gain,
            s.saving_gain > 0.0,
            if s.holds() { "shape holds" } else { "shape does not hold" }
        );
    }
    println!(
        "  (belady and belady-cost are offline oracles; with mixed object sizes and leases neither is a strict bound)"
    );
    if let Some(out) = &a.out {
        let report = AblationReport {
            sessions: a.sessions,
            seed: a.seed,
            capacity_bytes: capacity,
            unique_bytes: total,
            encoder_share_of_unique_bytes: enc_share,
            rows,
            shape_reuse,
            shape_all,
            results,
        };
        write_out(out, &report, || {
            let runs = [CapacityRun {
                capacity_bytes: capacity,
                results: report.results.clone(),
                min_bound: Default::default(),
            }];
            results_table(&runs)
        })?;
    }
    Ok(())
}

fn mooncake_capacity(a: CapacityArgs) -> Result<()> {
    let path = match a.trace {
        Some(p) => p,
        None => match moonagent_traces::shared_traces_dir("mooncake") {
            Some(d) => d.join("conversation_trace.jsonl"),
            None => bail!("no --trace given and MOONAGENT_TRACES/mooncake not found"),
        },
    };
    let compiled = Compiled::mooncake_kv(&path).map_err(anyhow::Error::msg)?;
    let total = compiled.unique_total();
    let caps = capacities(&a.capacity, total)?;
    let pols = ablation::capacity_policies();
    eprintln!(
        "{}: {} requests, {} KV block lookups, {} distinct blocks, unique {}; {} policies x {} capacities on {} threads",
        path.display(),
        compiled.requests,
        compiled.accesses.len(),
        compiled.distinct,
        human_bytes(total),
        pols.len(),
        caps.len(),
        rayon::current_num_threads()
    );
    let cfgs: Vec<MemStoreConfig> = caps
        .iter()
        .map(|&c| MemStoreConfig {
            capacity_bytes: c,
            ..MemStoreConfig::default()
        })
        .collect();
    let grid = replay_grid(&compiled, &cfgs, &pols).map_err(anyhow::Error::msg)?;
    let runs: Vec<CapacityRun> = caps
        .iter()
        .zip(grid)
        .map(|(&c, results)| CapacityRun {
            capacity_bytes: c,
            min_bound: min_bounds(&compiled, c),
            results,
        })
        .collect();
    println!(
        "Mooncake conversation trace, KV blocks only (512 tokens x 57,344 B = 28 MiB each): KV hit rate % by capacity"
    );
    let mut head = vec!["policy".to_string()];
    for r in &runs {
        head.push(format!(
            "{} ({:.1}%)",
            human_bytes(r.capacity_bytes),
            100.0 * r.capacity_bytes as f64 / total.max(1) as f64
        ));
    }
    let mut t = vec![head];
    for (i, p) in pols.iter().enumerate() {
        let mut row = vec![p.label.clone()];
        for r in &runs {
            row.push(f2(100.0 * r.results[i].of(DataType::KvCache).hit_rate()));
        }
        t.push(row);
    }
    let mut row = vec!["Belady MIN bound (ideal cache)".to_string()];
    for r in &runs {
        let (h, n) = r.min_bound.get("kv_cache").copied().unwrap_or((0, 0));
        row.push(f2(100.0 * h as f64 / n.max(1) as f64));
    }
    t.push(row);
    print_table(&t);
    println!("\nsaving-time rate %:");
    let mut t = vec![t[0].clone()];
    for (i, p) in pols.iter().enumerate() {
        let mut row = vec![p.label.clone()];
        for r in &runs {
            row.push(f2(100.0 * r.results[i].total.saving_time_rate()));
        }
        t.push(row);
    }
    print_table(&t);
    if let Some(p) = &a.plot {
        super::plot::capacity_curves("Mooncake conversation trace, KV blocks", &runs, p)?;
    }
    if let Some(out) = &a.out {
        let report = serde_json::json!({
            "trace": path.display().to_string(),
            "requests": compiled.requests,
            "accesses": compiled.accesses.len(),
            "unique_bytes": total,
            "runs": runs,
        });
        write_out(out, &report, || {
            let mut t = results_table(&runs);
            // The bound as its own rows would break the table's shape; add it as a column.
            let bound: Vec<f64> = runs
                .iter()
                .flat_map(|r| {
                    let (h, n) = r.min_bound.get("kv_cache").copied().unwrap_or((0, 0));
                    let b = h as f64 / n.max(1) as f64;
                    r.results
                        .iter()
                        .flat_map(move |p| std::iter::repeat_n(b, p.by_type.len() + 1))
                })
                .collect();
            t = t.with("min_bound_hit_rate", Column::F64(bound));
            t
        })?;
    }
    Ok(())
}

//! `moonagent replay`: store-level trace replay under one or more eviction policies.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use moonagent_core::store::{MemStoreConfig, PolicyConfig};
use moonagent_sim::replay::{
    replay_all, Compiled, Include, LabelledPolicy, LinearCost, ObjectSizes, PolicyResult,
};
use moonagent_traces::TraceReader;
use serde::Serialize;

use super::util::{human_bytes, parse_bytes, pct, print_table, read_config};

/// Arguments of `moonagent replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace file (.jsonl or .parquet) in moonagent's trace schema.
    #[arg(long)]
    pub trace: PathBuf,
    /// Store capacity: bytes (`64GiB`, `1e9`) or a share of the trace's unique bytes (`30%`).
    /// Repeat or comma-separate for a capacity sweep.
    #[arg(long, required = true, value_delimiter = ',')]
    pub capacity: Vec<String>,
    /// A policy by name with default settings (mooncake-default, lru, ...). Repeatable.
    #[arg(long = "policy")]
    pub policies: Vec<String>,
    /// A policy configuration file (TOML or JSON, `policy = "type-aware"` ...), labelled by
    /// its file name. Repeatable.
    #[arg(long = "policy-config")]
    pub policy_configs: Vec<PathBuf>,
    /// Store settings (TOML or JSON `MemStoreConfig`; capacity is taken from --capacity).
    #[arg(long)]
    pub store_config: Option<PathBuf>,
    /// Replay only prefix KV blocks (no encoder outputs).
    #[arg(long, conflicts_with = "images_only")]
    pub kv_only: bool,
    /// Replay only encoder outputs (no KV blocks).
    #[arg(long)]
    pub images_only: bool,
    /// Recompute-cost model (TOML or JSON `LinearCost`); defaults approximate Qwen2.5-VL-7B on an H200.
    #[arg(long)]
    pub cost: Option<PathBuf>,
    /// Write every result as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// Everything a replay run reports, as written by `--out`.
#[derive(Serialize)]
pub struct ReplayReport {
    /// Trace path.
    pub trace: String,
    /// Requests replayed.
    pub requests: u64,
    /// Store accesses replayed per policy.
    pub accesses: u64,
    /// Distinct bytes per data type in the trace.
    pub unique_bytes: std::collections::BTreeMap<String, u64>,
    /// One entry per capacity.
    pub runs: Vec<CapacityRun>,
}

/// All policies at one capacity.
#[derive(Serialize)]
pub struct CapacityRun {
    /// Capacity in bytes.
    pub capacity_bytes: u64,
    /// One result per policy, in the order given.
    pub results: Vec<PolicyResult>,
}

/// Parse the policy list: names, then config files.
pub fn policies(names: &[String], files: &[PathBuf]) -> Result<Vec<LabelledPolicy>> {
    let mut out = Vec::new();
    for n in names {
        let policy: PolicyConfig = serde_json::from_value(serde_json::json!({ "policy": n }))
            .with_context(|| format!("--policy {n}: unknown policy name, or one that needs settings (use --policy-config)"))?;
        policy
            .build()
            .map_err(|e| anyhow::anyhow!("--policy {n}: {e}"))?;
        out.push(LabelledPolicy {
            label: n.clone(),
            policy,
        });
    }
    for f in files {
        let policy: PolicyConfig = read_config(f)?;
        policy
            .build()
            .map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        let label = f.file_stem().map_or_else(
            || f.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        out.push(LabelledPolicy { label, policy });
    }
    if out.is_empty() {
        out.push(LabelledPolicy {
            label: "mooncake-default".into(),
            policy: PolicyConfig::default(),
        });
    }
    Ok(out)
}

/// Print one capacity's results as a table (one row per policy and data type).
pub fn print_results(capacity: u64, results: &[PolicyResult]) {
    println!("\ncapacity {} ({} B)", human_bytes(capacity), capacity);
    let mut rows = vec![vec![
        "policy".to_string(),
        "type".into(),
        "hit %".into(),
        "byte hit %".into(),
        "saving-time %".into(),
        "evicted".into(),
        "no-space puts".into(),
    ]];
    for r in results {
        for (t, x) in r
            .by_type
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .chain(std::iter::once(("all", &r.total)))
        {
            rows.push(vec![
                r.label.clone(),
                t.to_string(),
                pct(x.hit_rate()),
                pct(x.byte_hit_rate()),
                pct(x.saving_time_rate()),
                x.evicted.to_string(),
                x.puts_no_space.to_string(),
            ]);
        }
    }
    print_table(&rows);
}

/// Run `moonagent replay`.
pub fn run(args: ReplayArgs) -> Result<()> {
    let pols = policies(&args.policies, &args.policy_configs)?;
    let mut store_cfg: MemStoreConfig = match &args.store_config {
        Some(p) => read_config(p)?,
        None => MemStoreConfig::default(),
    };
    let cost: LinearCost = match &args.cost {
        Some(p) => read_config(p)?,
        None => LinearCost::default(),
    };
    let include = Include {
        images: !args.kv_only,
        kv: !args.images_only,
    };
    let reader = TraceReader::open(&args.trace)
        .with_context(|| format!("opening trace {}", args.trace.display()))?;
    let block = reader.header().block_size_tokens;
    let mut reqs = Vec::new();
    for r in reader {
        reqs.push(r?);
    }
    let mut compiled =
        Compiled::from_requests(reqs, block, &ObjectSizes::default(), &cost, include)
            .map_err(anyhow::Error::msg)?;
    compiled.fill_next();
    let unique = compiled.unique_bytes();
    let unique_total: u64 = unique.iter().sum();
    eprintln!(
        "{}: {} requests, {} accesses, unique {} ({} policies, {} threads)",
        args.trace.display(),
        compiled.requests,
        compiled.accesses.len(),
        human_bytes(unique_total),
        pols.len(),
        rayon::current_num_threads()
    );
    let mut report = ReplayReport {
        trace: args.trace.display().to_string(),
        requests: compiled.requests,
        accesses: compiled.accesses.len() as u64,
        unique_bytes: moonagent_core::store::DataType::ALL
            .iter()
            .map(|t| (t.name().to_string(), unique[t.index()]))
            .collect(),
        runs: Vec::new(),
    };
    for c in &args.capacity {
        let capacity = parse_bytes(c, Some(unique_total))?;
        if capacity == 0 {
            bail!("--capacity {c}: resolves to 0 bytes");
        }
        store_cfg.capacity_bytes = capacity;
        let results = replay_all(&compiled, &store_cfg, &pols).map_err(anyhow::Error::msg)?;
        print_results(capacity, &results);
        report.runs.push(CapacityRun {
            capacity_bytes: capacity,
            results,
        });
    }
    if let Some(out) = &args.out {
        let f =
            std::fs::File::create(out).with_context(|| format!("creating {}", out.display()))?;
        serde_json::to_writer_pretty(std::io::BufWriter::new(f), &report)?;
        eprintln!("wrote {}", out.display());
    }
    Ok(())
}

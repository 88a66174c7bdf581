//! `moonagent replay`: store-level trace replay under one or more eviction policies.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use moonagent_core::store::{DataType, MemStoreConfig, PolicyConfig};
use moonagent_sim::progress;
use moonagent_sim::replay::trace_cache::{key_of_bytes, key_of_file, KeyHasher};
pub use moonagent_sim::replay::{
    capacities, min_bounds, min_bounds_objects, results_table, CapacityRun,
};
use moonagent_sim::replay::{
    grid, replay_one, replay_plain, sizes_for_model, CapacityUnit, CompileOptions, Compiled,
    CsvParams, Include, LabelledPolicy, LinearCost, MissCost, ModelCost, ObjectSizes, PlainConfig,
    PolicyResult, TraceCache, TraceKey, TypeResult,
};
use moonagent_sim::table::Table;
use moonagent_traces::TraceReader;
use serde::Serialize;

use super::util::{human_bytes, parse_bytes, pct, print_table, read_config};

/// Which cache semantics the replay runs.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CacheModel {
    /// Mooncake master's store (`MemStore`): leases, watermark eviction on the 10 ms tick,
    /// batch eviction, failed puts, the KV prefix rule.
    Mooncake,
    /// libCacheSim's cache: evict before insert, every access a lookup, no leases
    /// (`moonagent_sim::replay::plain`).
    Plain,
}

/// The trace file's format.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceFormat {
    /// By name: `*.oracleGeneral` / `*.oracleGeneral.bin` are oracle-general, `*.csv` csv,
    /// else moonagent.
    Auto,
    /// moonagent's trace schema (.jsonl or .parquet).
    Moonagent,
    /// libCacheSim's binary `oracleGeneral` (24-byte records).
    OracleGeneral,
    /// libCacheSim's csv traces; the columns and options in --trace-type-params.
    Csv,
    /// Mooncake's FAST'25 JSONL, flattened to its KV blocks (512 tokens each, whole blocks
    /// of Qwen2.5-VL-7B KV bytes, H200 miss costs), as `repro mooncake-capacity` reads it.
    Mooncake,
}

/// Arguments of `moonagent replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// Trace file (.jsonl or .parquet) in moonagent's trace schema, or see --trace-format.
    #[arg(long)]
    pub trace: PathBuf,
    /// The trace's format.
    #[arg(long, value_enum, default_value = "auto")]
    pub trace_format: TraceFormat,
    /// libCacheSim's csv reader options, as its CLI takes them (columns from 1):
    /// "time-col=1,obj-id-col=2,obj-size-col=3,delimiter=,,has-header=true,obj-id-is-num=true".
    /// obj-id-col is required; the rest are optional (delimiter and header detected).
    #[arg(long, short = 't')]
    pub trace_type_params: Option<String>,
    /// Neither read nor write the compiled-trace cache ($MOONAGENT_CACHE, else
    /// ~/.cache/moonagent/compiled): read and compile the trace every time.
    #[arg(long)]
    pub no_trace_cache: bool,
    /// Cache semantics: `mooncake` (the store, default) or `plain` (libCacheSim-compatible:
    /// evict before insert, per-access counting, no leases or watermarks).
    #[arg(long, value_enum, default_value = "mooncake")]
    pub cache_model: CacheModel,
    /// What --capacity counts in the plain model: `bytes`, or `objects` (every object
    /// weighs 1; a percentage is of the trace's distinct objects).
    #[arg(long, value_enum, default_value = "bytes")]
    pub capacity_unit: CapacityUnitArg,
    /// Store capacity: bytes (`64GiB`, `1e9`) or a share of the trace's unique bytes (`30%`).
    /// Repeat or comma-separate for a capacity sweep.
    #[arg(long, required = true, value_delimiter = ',')]
    pub capacity: Vec<String>,
    /// A policy by name with default settings (mooncake-default, type-aware, lru, fifo,
    /// s3-fifo, sieve, w-tinylfu, gdsf, belady, belady-cost; the list is
    /// `PolicyConfig::NAMES`, and an unknown name prints it). Repeatable or comma-separated.
    #[arg(long = "policy", value_delimiter = ',')]
    pub policies: Vec<String>,
    /// A policy configuration file (TOML or JSON, `policy = "type-aware"` ...), labelled by
    /// its file name. Repeatable. `examples/policies/` has the type-aware eviction ablation's policies.
    #[arg(long = "policy-config")]
    pub policy_configs: Vec<PathBuf>,
    /// Store settings (TOML or JSON `MemStoreConfig`; capacity is taken from --capacity).
    /// Defaults are Mooncake master's: 10 s read leases, 10 ms eviction tick, watermark 0.90.
    #[arg(long)]
    pub store_config: Option<PathBuf>,
    /// Replay only prefix KV blocks (no encoder outputs).
    #[arg(long, conflicts_with = "images_only")]
    pub kv_only: bool,
    /// Replay only encoder outputs (no KV blocks).
    #[arg(long)]
    pub images_only: bool,
    /// Charge every KV block a whole block of bytes (the last, partial one too).
    #[arg(long)]
    pub kv_full_blocks: bool,
    /// Hardware profile of the miss penalties (h200, b200, h100, cpu).
    #[arg(long, default_value = "h200")]
    pub hardware: String,
    /// Model of the miss penalties and object sizes (qwen2.5-vl-7b, qwen2.5-vl-3b, qwen2.5-vl-72b).
    #[arg(long, default_value = "qwen2.5-vl-7b")]
    pub model: String,
    /// Fixed linear miss penalties instead (TOML or JSON `LinearCost`).
    #[arg(long)]
    pub cost: Option<PathBuf>,
    /// Skip Belady's MIN bound per capacity (it costs a pass over the trace per capacity).
    #[arg(long)]
    pub no_min_bound: bool,
    /// Write every result: `.json` (full report), `.parquet` or `.csv` (one row per
    /// capacity, policy and data type).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Draw hit rate vs capacity (every policy, the MIN bound where one exists) as SVG here.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// `--capacity-unit`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityUnitArg {
    /// Bytes.
    Bytes,
    /// Objects (plain model only).
    Objects,
}

/// Everything a replay run reports, as written by `--out x.json`.
#[derive(Serialize)]
pub struct ReplayReport {
    /// Trace path.
    pub trace: String,
    /// The cache model replayed.
    pub cache_model: CacheModel,
    /// What `capacity_bytes` counts: bytes, or objects (plain model, `--capacity-unit objects`).
    pub capacity_unit: CapacityUnit,
    /// Requests replayed.
    pub requests: u64,
    /// Store accesses replayed per policy.
    pub accesses: u64,
    /// Distinct bytes per data type in the trace.
    pub unique_bytes: BTreeMap<String, u64>,
    /// One entry per capacity.
    pub runs: Vec<CapacityRun>,
}

/// Parse the policy list: names, then config files. Errors name the flag or file and field.
pub fn policies(names: &[String], files: &[PathBuf]) -> Result<Vec<LabelledPolicy>> {
    let mut out = Vec::new();
    for n in names {
        out.push(LabelledPolicy::by_name(n.trim()).map_err(|e| anyhow::anyhow!("--policy: {e}"))?);
    }
    for f in files {
        out.push(policy_file(f)?);
    }
    if out.is_empty() {
        out.push(LabelledPolicy::named(PolicyConfig::default()));
    }
    Ok(out)
}

/// A policy configuration file (TOML or JSON), validated, labelled by its file stem.
pub fn policy_file(f: &Path) -> Result<LabelledPolicy> {
    let policy: PolicyConfig =
        read_config(f).with_context(|| format!("--policy-config {}", f.display()))?;
    policy
        .validate()
        .map_err(|e| anyhow::anyhow!("--policy-config {}: {e}", f.display()))?;
    let label = f.file_stem().map_or_else(
        || f.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    Ok(LabelledPolicy { label, policy })
}

/// The miss-cost model of `--hardware`/`--model`, or `--cost`'s fixed constants.
pub fn cost_model(hardware: &str, model: &str, cost: Option<&Path>) -> Result<Box<dyn MissCost>> {
    Ok(match cost {
        Some(p) => Box::new(read_config::<LinearCost>(p)?),
        None => Box::new(
            ModelCost::new(hardware, model, 1)
                .map_err(|e| anyhow::anyhow!("--hardware/--model: {e}"))?,
        ),
    })
}

fn rows_of(results: &[PolicyResult]) -> Vec<(&str, &str, &TypeResult)> {
    let mut v = Vec::new();
    for r in results {
        for (k, x) in &r.by_type {
            v.push((r.label.as_str(), k.as_str(), x));
        }
        if r.by_type.len() > 1 {
            v.push((r.label.as_str(), "all", &r.total));
        }
    }
    v
}

/// Print one capacity's results as a table (one row per policy and data type).
pub fn print_results(run: &CapacityRun, unit: CapacityUnit) {
    match unit {
        CapacityUnit::Bytes => println!(
            "\ncapacity {} ({} B)",
            human_bytes(run.capacity_bytes),
            run.capacity_bytes
        ),
        CapacityUnit::Objects => println!("\ncapacity {} objects", run.capacity_bytes),
    }
    let mut rows = vec![vec![
        "policy".to_string(),
        "type".into(),
        "hit %".into(),
        "reuse hit %".into(),
        "byte hit %".into(),
        "saving-time %".into(),
        "evicted".into(),
        "no-space puts".into(),
        "hits".into(),
        "lookups".into(),
    ]];
    for (label, t, x) in rows_of(&run.results) {
        rows.push(vec![
            label.to_string(),
            t.to_string(),
            pct(x.hit_rate()),
            pct(x.reuse_hit_rate()),
            pct(x.byte_hit_rate()),
            pct(x.saving_time_rate()),
            x.evicted.to_string(),
            x.puts_no_space.to_string(),
            x.hits.to_string(),
            x.lookups.to_string(),
        ]);
    }
    for (t, (h, n)) in &run.min_bound {
        rows.push(vec![
            "min-bound".into(),
            t.clone(),
            pct(h.to_owned() as f64 / (*n).max(1) as f64),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            h.to_string(),
            n.to_string(),
        ]);
    }
    print_table(&rows);
}

/// Write `report` as JSON, or its table as Parquet or CSV, by `out`'s extension.
pub fn write_out<R: Serialize>(
    out: &Path,
    report: &R,
    table: impl FnOnce() -> Table,
) -> Result<()> {
    match out.extension().and_then(|e| e.to_str()) {
        Some("parquet") => table().write_parquet(out).map_err(anyhow::Error::msg)?,
        Some("csv") => table().write_csv(out).map_err(anyhow::Error::msg)?,
        Some("json") => {
            let tmp = out.with_extension("json.tmp");
            let f = std::fs::File::create(&tmp)
                .with_context(|| format!("creating {}", tmp.display()))?;
            serde_json::to_writer_pretty(std::io::BufWriter::new(f), report)
                .with_context(|| format!("writing {}", tmp.display()))?;
            std::fs::rename(&tmp, out).with_context(|| format!("writing {}", out.display()))?;
        }
        _ => bail!(
            "--out {}: expected a .json, .parquet or .csv file",
            out.display()
        ),
    }
    eprintln!("wrote {}", out.display());
    Ok(())
}

/// Replay every (capacity, policy) pair of the grid under `model`.
fn run_grid(
    model: CacheModel,
    caps: &[u64],
    unit: CapacityUnit,
    base: &MemStoreConfig,
    pols: &[LabelledPolicy],
    compiled: &Compiled,
    done: &(dyn Fn() + Sync),
) -> Result<Vec<Vec<PolicyResult>>> {
    match model {
        CacheModel::Mooncake => {
            let cfgs: Vec<MemStoreConfig> = caps
                .iter()
                .map(|&c| MemStoreConfig {
                    capacity_bytes: c,
                    ..base.clone()
                })
                .collect();
            grid(&cfgs, pols, |c, p| replay_one(compiled, c, p), done)
        }
        CacheModel::Plain => {
            let cfgs: Vec<PlainConfig> = caps
                .iter()
                .map(|&capacity| PlainConfig { capacity, unit })
                .collect();
            grid(&cfgs, pols, |c, p| replay_plain(compiled, c, p), done)
        }
    }
    .map_err(anyhow::Error::msg)
}

/// Everything besides the trace's bytes that its compiled form depends on, as the
/// compiled-trace cache's key takes it: the format and its options, for moonagent traces
/// the object sizes, included types and the miss-cost model, and this binary (its version,
/// length and modification time, so that a rebuilt binary never reads what another build
/// compiled).
fn compile_description(
    format: TraceFormat,
    csv: Option<&CsvParams>,
    args: &ReplayArgs,
    sizes: &ObjectSizes,
    include: Include,
) -> Result<String> {
    let exe = std::env::current_exe()
        .and_then(std::fs::metadata)
        .map(|m| {
            let t = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            format!("{} {t}", m.len())
        })
        .unwrap_or_else(|_| "unknown".into());
    let mut d = format!(
        "moonagent {} ({exe}); format {format:?}",
        env!("CARGO_PKG_VERSION")
    );
    match format {
        TraceFormat::Csv => {
            d += &format!("; csv {:?}", csv.map(CsvParams::to_param_string));
        }
        TraceFormat::Moonagent | TraceFormat::Auto => {
            let cost = match &args.cost {
                Some(p) => {
                    let b = std::fs::read(p).with_context(|| format!("--cost {}", p.display()))?;
                    format!("linear {}", key_of_bytes(&b, b"").hex())
                }
                None => format!("roofline {} {}", args.hardware, args.model),
            };
            d += &format!(
                "; sizes {sizes:?}; include {include:?}; kv_full_blocks {}; cost {cost}",
                args.kv_full_blocks
            );
        }
        TraceFormat::OracleGeneral | TraceFormat::Mooncake => {}
    }
    Ok(d)
}

/// Read and compile the trace. For the formats read whole into memory (oracleGeneral,
/// csv), also the cache key of the bytes compiled, when `key_extra` is given.
#[allow(clippy::too_many_arguments)]
fn compile_trace(
    path: &Path,
    format: TraceFormat,
    csv: Option<&CsvParams>,
    args: &ReplayArgs,
    sizes: &ObjectSizes,
    include: Include,
    cost: &dyn MissCost,
    key_extra: Option<&[u8]>,
) -> Result<(Compiled, Option<TraceKey>)> {
    let read = || std::fs::read(path).with_context(|| format!("reading trace {}", path.display()));
    Ok(match format {
        TraceFormat::OracleGeneral => {
            // Streamed in pieces, each hashed as it is decoded: no copy of the whole file,
            // and the key is that of exactly the bytes compiled.
            let f = std::fs::File::open(path)
                .with_context(|| format!("reading trace {}", path.display()))?;
            let len = f.metadata().map_or(0, |m| m.len());
            let mut key = key_extra.map(KeyHasher::new);
            let c = Compiled::from_oracle_general_reader(f, path, len, key.as_mut())
                .map_err(|e| anyhow::anyhow!("--trace {}: {e}", path.display()))?;
            (c, key.map(|k| k.finish()))
        }
        TraceFormat::Csv => {
            let bytes = read()?;
            let p = csv.expect("csv options parsed before");
            let c = Compiled::from_csv_bytes(&bytes, p)
                .map_err(|e| anyhow::anyhow!("--trace {}: {e}", path.display()))?;
            (c, key_extra.map(|x| key_of_bytes(&bytes, x)))
        }
        TraceFormat::Mooncake => (
            Compiled::mooncake_kv(path).map_err(|e| anyhow::anyhow!("--trace: {e}"))?,
            None,
        ),
        TraceFormat::Moonagent | TraceFormat::Auto => {
            let reader = TraceReader::open(path)
                .with_context(|| format!("opening trace {}", path.display()))?;
            let opts = CompileOptions {
                block_size: reader.header().block_size_tokens,
                sizes: *sizes,
                include,
                kv_full_blocks: args.kv_full_blocks,
            };
            // A spinner counting requests while the trace is read and compiled.
            let rp = progress::spinner("reading", "requests", true);
            // Once the last line is read, the spinner says the compile (next accesses,
            // dense object numbers) is what runs.
            let reqs = reader.inspect(|_| rp.inc(1)).chain(std::iter::from_fn(|| {
                rp.set_prefix("compiling");
                rp.set_message("read; computing next accesses");
                None
            }));
            let c = Compiled::compile(reqs, &opts, cost)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            rp.finish_and_clear();
            (c, None)
        }
    })
}

/// Run `moonagent replay`.
pub fn run(args: ReplayArgs) -> Result<()> {
    let pols = policies(&args.policies, &args.policy_configs)?;
    let base: MemStoreConfig = match &args.store_config {
        Some(p) => read_config(p).with_context(|| format!("--store-config {}", p.display()))?,
        None => MemStoreConfig::default(),
    };
    let cost = cost_model(&args.hardware, &args.model, args.cost.as_deref())?;
    let sizes = sizes_for_model(&args.model).map_err(|e| anyhow::anyhow!("--model: {e}"))?;
    // Check the capacities' syntax before reading the trace.
    for c in &args.capacity {
        parse_bytes(c, Some(1)).with_context(|| format!("--capacity {c}"))?;
    }
    if let Some(out) = &args.out {
        if !matches!(
            out.extension().and_then(|e| e.to_str()),
            Some("json" | "parquet" | "csv")
        ) {
            bail!(
                "--out {}: expected a .json, .parquet or .csv file",
                out.display()
            );
        }
    }
    let objects = args.capacity_unit == CapacityUnitArg::Objects;
    if objects && args.cache_model != CacheModel::Plain {
        bail!("--capacity-unit objects: needs --cache-model plain");
    }
    let format = match args.trace_format {
        TraceFormat::Auto => {
            let name = args.trace.to_string_lossy();
            if name.ends_with(".oracleGeneral") || name.ends_with(".oracleGeneral.bin") {
                TraceFormat::OracleGeneral
            } else if name.ends_with(".csv") {
                TraceFormat::Csv
            } else {
                TraceFormat::Moonagent
            }
        }
        f => f,
    };
    let csv = match (format, &args.trace_type_params) {
        (TraceFormat::Csv, Some(p)) => Some(CsvParams::parse(p)?),
        (TraceFormat::Csv, None) => bail!(
            "--trace {}: a csv trace needs --trace-type-params \"obj-id-col=N,...\" \
             (libCacheSim's csv options)",
            args.trace.display()
        ),
        (_, Some(_)) => bail!("--trace-type-params: only with --trace-format csv"),
        (_, None) => None,
    };
    let include = Include {
        images: !args.kv_only,
        kv: !args.images_only,
    };
    // Wall-clock phase times go to stderr only (never into results).
    let t_load = std::time::Instant::now();
    let cache = if args.no_trace_cache {
        None
    } else {
        let c = TraceCache::default_dir().map(TraceCache::new);
        if c.is_none() {
            eprintln!("trace cache: off (no MOONAGENT_CACHE, XDG_CACHE_HOME or HOME)");
        }
        c
    };
    let extra = compile_description(format, csv.as_ref(), &args, &sizes, include)?;
    let key = match &cache {
        Some(_) => Some(
            key_of_file(&args.trace, extra.as_bytes())
                .with_context(|| format!("reading trace {}", args.trace.display()))?,
        ),
        None => None,
    };
    let hash_s = t_load.elapsed().as_secs_f64();
    let mut mapped = None;
    if let (Some(c), Some(k)) = (&cache, &key) {
        match c.load(k) {
            Ok(m) => {
                eprintln!("trace cache: mapped {}", c.path(k).display());
                mapped = Some(m);
            }
            Err(why) => eprintln!("trace cache: {} ({why}); compiling", c.path(k).display()),
        }
    }
    let from_cache = mapped.is_some();
    let (compiled, store_key) = match mapped {
        Some(m) => (m, None),
        None => {
            let (c, bytes_key) = compile_trace(
                &args.trace,
                format,
                csv.as_ref(),
                &args,
                &sizes,
                include,
                cost.as_ref(),
                key.is_some().then_some(extra.as_bytes()),
            )?;
            // Stored only under the key of the bytes compiled (when the reader held them
            // in memory): a trace that changed after it was hashed is not cached.
            let store = match (key, bytes_key) {
                (Some(k), Some(b)) if k != b => {
                    eprintln!("trace cache: the trace changed while it was read; not cached");
                    None
                }
                (k, _) => k,
            };
            (c, store)
        }
    };
    let unique = compiled.unique_bytes();
    let unique_total: u64 = unique.iter().sum();
    let unit = if objects {
        CapacityUnit::Objects
    } else {
        CapacityUnit::Bytes
    };
    let caps = capacities(
        &args.capacity,
        if objects {
            u64::from(compiled.distinct)
        } else {
            unique_total
        },
    )?;
    eprintln!(
        "{}: {} requests, {} accesses, unique {} ({} policies x {} capacities, {} threads)",
        args.trace.display(),
        compiled.requests,
        compiled.accesses.len(),
        human_bytes(unique_total),
        pols.len(),
        caps.len(),
        rayon::current_num_threads()
    );
    let load_s = t_load.elapsed().as_secs_f64();
    let t_replay = std::time::Instant::now();
    // A bar over the (capacity, policy) runs, ticked as each finishes.
    let pb = progress::bar("replay", (caps.len() * pols.len()) as u64, "runs", true);
    let done = || pb.inc(1);
    // A freshly compiled trace is written to the cache on a second thread while the
    // replay runs (the file is renamed into place only once whole).
    let (grid, stored) = std::thread::scope(|s| {
        let writer = match (&cache, &store_key) {
            (Some(c), Some(k)) => Some(s.spawn(|| (c.path(k), c.store(k, &compiled)))),
            _ => None,
        };
        let grid = run_grid(
            args.cache_model,
            &caps,
            unit,
            &base,
            &pols,
            &compiled,
            &done,
        );
        (grid, writer.map(|w| w.join()))
    });
    match stored {
        Some(Ok((_, Ok(p)))) => eprintln!("trace cache: wrote {}", p.display()),
        Some(Ok((p, Err(e)))) => eprintln!("trace cache: could not write {}: {e}", p.display()),
        Some(Err(_)) => eprintln!("trace cache: the writer thread panicked"),
        None => {}
    }
    let grid = grid?;
    pb.finish_and_clear();
    eprintln!(
        "timing: trace hashed in {hash_s:.3} s, {} in {load_s:.3} s, replayed in {:.3} s",
        if from_cache {
            "mapped from the cache"
        } else {
            "read and compiled"
        },
        t_replay.elapsed().as_secs_f64()
    );
    let mut report = ReplayReport {
        trace: args.trace.display().to_string(),
        cache_model: args.cache_model,
        capacity_unit: unit,
        requests: compiled.requests,
        accesses: compiled.accesses.len() as u64,
        unique_bytes: DataType::ALL
            .iter()
            .map(|t| (t.name().to_string(), unique[t.index()]))
            .collect(),
        runs: Vec::new(),
    };
    let mb = if args.no_min_bound {
        None
    } else {
        Some(progress::bar(
            "MIN bound",
            caps.len() as u64,
            "capacities",
            true,
        ))
    };
    for (capacity_bytes, results) in caps.into_iter().zip(grid) {
        report.runs.push(CapacityRun {
            capacity_bytes,
            min_bound: match unit {
                _ if args.no_min_bound => BTreeMap::new(),
                CapacityUnit::Bytes => min_bounds(&compiled, capacity_bytes),
                CapacityUnit::Objects => min_bounds_objects(&compiled, capacity_bytes),
            },
            results,
        });
        if let Some(b) = &mb {
            b.inc(1);
        }
    }
    if let Some(b) = mb {
        b.finish_and_clear();
    }
    for run in &report.runs {
        print_results(run, unit);
    }
    if let Some(out) = &args.out {
        write_out(out, &report, || results_table(&report.runs))?;
    }
    if let Some(p) = &args.plot {
        super::plot::capacity_curves(&report.trace, &report.runs, p)?;
    }
    Ok(())
}

//! Running a prepared plan (or one shard of it) into a sweep folder, resuming, and merging
//! shard folders.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use rayon::prelude::*;

use super::exec::{run_one, Inputs};
use super::files::{
    read_points, remove_temps, write_atomic, write_point, PlanRecord, PLAN_FILE, POINTS_DIR,
    TIMINGS_FILE,
};
use super::metrics::MetricValue;
use super::plan::{Plan, Prepared, FORMAT};
use super::progress::Progress;
use super::table::{
    results_batch, summarise, summary_batch, table_metadata, write_parquet, Row, SummaryRow,
    RESULTS_FILE, SUMMARY_FILE,
};
use super::{PlanError, Result, SweepError};

/// `i/N`: this process runs the points whose index is `i mod N` (0 <= i < N).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    /// This shard, 0-based (Slurm's `SLURM_ARRAY_TASK_ID` with `--array=0-(N-1)`,
    /// Kubernetes' `JOB_COMPLETION_INDEX`).
    pub index: u32,
    /// Number of shards.
    pub count: u32,
}

impl FromStr for Shard {
    type Err = PlanError;
    fn from_str(s: &str) -> Result<Self, PlanError> {
        let bad = || {
            PlanError::field(
                format!("shard {s:?}"),
                "expected i/N with 0 <= i < N, e.g. 0/4",
            )
        };
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u32 = i.trim().parse().map_err(|_| bad())?;
        let count: u32 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// How to run a sweep.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The sweep folder (created if missing).
    pub out: PathBuf,
    /// Worker threads; 0 = rayon's default (every core, or `RAYON_NUM_THREADS`).
    pub threads: usize,
    /// Run one shard only.
    pub shard: Option<Shard>,
    /// Continue a sweep already in `out` (same plan, same shard), skipping finished runs;
    /// starts afresh when `out` holds none.
    pub resume: bool,
    /// Progress bar (on a terminal) and a final line on stderr.
    pub progress: bool,
    /// fsync every point file before its rename (durable at once across a power loss;
    /// without it a point file a power loss tears fails its checksum and is run again).
    pub fsync: bool,
}

/// What a run did, with the time it spent where (wall-clock: never in the tables).
#[derive(Debug, Clone)]
pub struct RunReport {
    /// Runs in this shard (points x seeds).
    pub runs: usize,
    /// Points in this shard.
    pub points: usize,
    /// Runs found finished (resume).
    pub skipped: usize,
    /// Runs executed now.
    pub executed: usize,
    /// Worker threads used.
    pub threads: usize,
    /// Whole call, s.
    pub wall_s: f64,
    /// Folder setup and reading finished runs, s.
    pub setup_s: f64,
    /// Sum over executed runs of their own time (trace generation included), s.
    pub compute_s: f64,
    /// Sum over executed runs of writing their point file, s.
    pub write_s: f64,
    /// Building and writing the two tables, s.
    pub table_s: f64,
    /// The results table.
    pub results: PathBuf,
    /// The summary table.
    pub summary_path: PathBuf,
    /// The summary rows.
    pub summary: Vec<SummaryRow>,
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

/// The plan's selected metrics out of a run's full list, in the plan's order.
fn pick(plan: &Plan, all: Vec<(String, MetricValue)>) -> Result<Vec<MetricValue>, PlanError> {
    let by: HashMap<String, MetricValue> = all.into_iter().collect();
    plan.metrics
        .iter()
        .map(|m| {
            by.get(m)
                .copied()
                .ok_or_else(|| PlanError::Internal(format!("the run reported no metric `{m}`")))
        })
        .collect()
}

fn not_empty(dir: &Path) -> Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut rd) => Ok(rd.any(|e| {
            e.map(|e| !e.file_name().to_string_lossy().starts_with('.'))
                .unwrap_or(true)
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(SweepError::io(dir)(e)),
    }
}

/// The summary table's default path beside a results table.
pub fn summary_path_for(results: &Path) -> PathBuf {
    let name = results
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if name == RESULTS_FILE {
        results.with_file_name(SUMMARY_FILE)
    } else {
        let stem = results
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "results".into());
        results.with_file_name(format!("{stem}_summary.parquet"))
    }
}

fn write_tables(
    plan: &Plan,
    hash: &str,
    rows: &[Row],
    results: &Path,
    summary_path: &Path,
) -> Result<Vec<SummaryRow>> {
    let meta = table_metadata(plan, hash);
    write_parquet(results, &results_batch(plan, rows)?, meta.clone())?;
    let summary = summarise(plan, rows);
    write_parquet(summary_path, &summary_batch(plan, &summary)?, meta)?;
    Ok(summary)
}

/// Run `prep` (or one shard of it) into `opts.out`: every pending (point, seed) in
/// parallel, one atomic file per finished run, then `results.parquet`, `summary.parquet`
/// and `timings.json` rebuilt from every finished run of the shard.
pub fn run(prep: &Prepared, opts: &RunOptions) -> Result<RunReport> {
    let t0 = Instant::now();
    let plan = &prep.plan;
    let out = &opts.out;
    let points_dir = out.join(POINTS_DIR);
    let shard = opts.shard.unwrap_or(Shard { index: 0, count: 1 });
    let shard_text = opts.shard.map(|s| s.to_string());
    let shown = |s: &Option<String>| {
        s.clone()
            .map_or("the whole plan".into(), |s| format!("shard {s}"))
    };

    match PlanRecord::read(out)? {
        Some(rec) => {
            if !opts.resume {
                return Err(SweepError::Results(format!(
                    "{} already holds a sweep ({PLAN_FILE}); pass --resume to continue it, or choose another --out",
                    out.display()
                )));
            }
            if rec.plan_hash != prep.hash {
                return Err(SweepError::Results(format!(
                    "the plan changed since {} was started (plan hash {} there, {} now): resuming would mix two plans; run it into a new --out, or resume with the plan (and --set overrides, and trace files) it was started with",
                    out.display(),
                    rec.plan_hash,
                    prep.hash
                )));
            }
            if rec.shard != shard_text {
                return Err(SweepError::Results(format!(
                    "{} holds {}, not {}: resume it with the same --shard",
                    out.display(),
                    shown(&rec.shard),
                    shown(&shard_text)
                )));
            }
        }
        None => {
            if not_empty(&points_dir)? && !opts.resume {
                return Err(SweepError::Results(format!(
                    "{} holds point files but no {PLAN_FILE}; choose another --out",
                    out.display()
                )));
            }
            std::fs::create_dir_all(&points_dir).map_err(SweepError::io(&points_dir))?;
            PlanRecord {
                format: FORMAT,
                plan_hash: prep.hash.clone(),
                kind: plan.kind,
                points: plan.points.len(),
                seeds: plan.seeds.clone(),
                shard: shard_text.clone(),
                plan_toml: plan.source.clone(),
                moonagent_sim: env!("CARGO_PKG_VERSION").to_string(),
            }
            .write(out)?;
        }
    }
    std::fs::create_dir_all(&points_dir).map_err(SweepError::io(&points_dir))?;
    remove_temps(&points_dir)?;
    remove_temps(out)?;
    let (done, torn) = read_points(&points_dir, plan, &prep.hash)?;
    for t in &torn {
        // Left empty or torn by a power loss: not a result; the run is done again.
        if opts.progress {
            eprintln!("{}: checksum fails; running it again", t.display());
        }
        std::fs::remove_file(t).map_err(SweepError::io(t))?;
    }
    if let Some((_, (_, _, path))) = done
        .iter()
        .find(|((p, _), _)| p % shard.count != shard.index)
    {
        return Err(SweepError::Results(format!(
            "{}: not in {}",
            path.display(),
            shown(&shard_text)
        )));
    }

    let shard_points: Vec<u32> = plan
        .shard_points(shard.index, shard.count)
        .map(|p| p.index)
        .collect();
    let mut jobs = Vec::new();
    let mut pending: HashMap<u32, AtomicUsize> = HashMap::new();
    for &p in &shard_points {
        let mut left = 0;
        for &s in &plan.seeds {
            if !done.contains_key(&(p, s)) {
                jobs.push((p, s));
                left += 1;
            }
        }
        pending.insert(p, AtomicUsize::new(left));
    }
    let total_runs = shard_points.len() * plan.seeds.len();
    let done_points = pending
        .values()
        .filter(|n| n.load(Ordering::Relaxed) == 0)
        .count();
    let inputs = Inputs::new(&plan.base_dir);
    let keys: Vec<String> = jobs
        .iter()
        .map(|&(p, s)| Inputs::key(&prep.configs[p as usize], s))
        .collect();
    for k in &keys {
        inputs.register(k);
    }
    let setup_s = t0.elapsed().as_secs_f64();

    let label = match opts.shard {
        Some(s) => format!("sweep shard {s}"),
        None => "sweep".to_string(),
    };
    let progress = Progress::new(
        label,
        total_runs,
        shard_points.len(),
        done.len(),
        done_points,
        opts.progress,
    );
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(opts.threads)
        .thread_name(|i| format!("sweep-{i}"))
        .build()
        .map_err(|e| SweepError::Results(format!("starting {} threads: {e}", opts.threads)))?;
    let threads = pool.current_num_threads();
    let new_rows: Mutex<Vec<(Row, f64)>> = Mutex::new(Vec::with_capacity(jobs.len()));
    let errors: Mutex<Vec<SweepError>> = Mutex::new(Vec::new());
    let cancel = AtomicBool::new(false);
    let compute_ns = AtomicU64::new(0);
    let write_ns = AtomicU64::new(0);
    pool.install(|| {
        jobs.par_iter()
            .zip(keys.par_iter())
            .with_max_len(1)
            .for_each(|(&(index, seed), key)| {
                if cancel.load(Ordering::Relaxed) {
                    inputs.release(key);
                    return;
                }
                let cfg = &prep.configs[index as usize];
                let t = Instant::now();
                let res = catch_unwind(AssertUnwindSafe(|| run_one(cfg, seed, key, &inputs)))
                    .unwrap_or_else(|p| Err(PlanError::Panic(panic_text(p))))
                    .and_then(|all| pick(plan, all));
                inputs.release(key);
                let wall = t.elapsed();
                compute_ns.fetch_add(wall.as_nanos() as u64, Ordering::Relaxed);
                let metrics = match res {
                    Ok(m) => m,
                    Err(msg) => {
                        cancel.store(true, Ordering::Relaxed);
                        errors.lock().expect("errors lock").push(SweepError::Run {
                            index,
                            seed,
                            desc: plan.describe(&plan.points[index as usize]),
                            msg: Box::new(msg),
                            note: String::new(),
                        });
                        return;
                    }
                };
                let row = Row {
                    point: index,
                    seed,
                    metrics,
                };
                let tw = Instant::now();
                if let Err(e) = write_point(
                    &points_dir,
                    plan,
                    &prep.hash,
                    &row,
                    wall.as_secs_f64(),
                    opts.fsync,
                ) {
                    cancel.store(true, Ordering::Relaxed);
                    errors.lock().expect("errors lock").push(e);
                    return;
                }
                write_ns.fetch_add(tw.elapsed().as_nanos() as u64, Ordering::Relaxed);
                new_rows
                    .lock()
                    .expect("rows lock")
                    .push((row, wall.as_secs_f64()));
                let left = pending[&index].fetch_sub(1, Ordering::Relaxed) - 1;
                progress.run_done(left == 0);
            });
    });
    progress.finish();
    let mut errors = errors.into_inner().expect("errors lock");
    if !errors.is_empty() {
        let key = |e: &SweepError| match e {
            SweepError::Run { index, seed, .. } => (*index, *seed),
            _ => (0, 0),
        };
        errors.sort_by_key(key);
        let n = errors.len();
        let first = errors.swap_remove(0);
        let more = if n > 1 {
            format!(" ({} more runs failed)", n - 1)
        } else {
            String::new()
        };
        return Err(match first {
            SweepError::Run {
                index,
                seed,
                desc,
                msg,
                note,
            } => SweepError::Run {
                index,
                seed,
                desc,
                msg,
                note: format!(
                    "{note}{more}; the finished runs are kept in {}: --resume retries the rest (a changed plan needs a new --out)",
                    out.display()
                ),
            },
            other => other,
        });
    }

    let tt = Instant::now();
    let mut rows: Vec<(Row, f64)> = done.into_values().map(|(r, w, _)| (r, w)).collect();
    let executed = new_rows.lock().expect("rows lock").len();
    rows.extend(new_rows.into_inner().expect("rows lock"));
    rows.sort_by_key(|(r, _)| (r.point, r.seed));
    if rows.len() != total_runs {
        return Err(SweepError::Results(format!(
            "internal: {} runs finished, {total_runs} expected",
            rows.len()
        )));
    }
    let timings: Vec<serde_json::Value> = rows
        .iter()
        .map(|(r, w)| serde_json::json!({"point": r.point, "seed": r.seed, "wall_s": w}))
        .collect();
    let rows: Vec<Row> = rows.into_iter().map(|(r, _)| r).collect();
    let results = out.join(RESULTS_FILE);
    let summary_path = out.join(SUMMARY_FILE);
    let summary = write_tables(plan, &prep.hash, &rows, &results, &summary_path)?;
    let table_s = tt.elapsed().as_secs_f64();
    let report = RunReport {
        runs: total_runs,
        points: shard_points.len(),
        skipped: total_runs - executed,
        executed,
        threads,
        wall_s: t0.elapsed().as_secs_f64(),
        setup_s,
        compute_s: compute_ns.load(Ordering::Relaxed) as f64 / 1e9,
        write_s: write_ns.load(Ordering::Relaxed) as f64 / 1e9,
        table_s,
        results,
        summary_path,
        summary,
    };
    let timings = serde_json::json!({
        "note": "wall-clock figures of the last invocation; never part of the result tables",
        "threads": report.threads,
        "wall_s": report.wall_s,
        "executed": report.executed,
        "skipped": report.skipped,
        "setup_s": report.setup_s,
        "compute_s": report.compute_s,
        "write_s": report.write_s,
        "table_s": report.table_s,
        "runs": timings,
    });
    let tpath = out.join(TIMINGS_FILE);
    write_atomic(
        &tpath,
        serde_json::to_string_pretty(&timings)
            .unwrap_or_default()
            .as_bytes(),
        false,
    )
    .map_err(SweepError::io(&tpath))?;
    Ok(report)
}

/// What a merge found and wrote.
#[derive(Debug, Clone)]
pub struct MergeReport {
    /// The plan, re-expanded from the shards' record.
    pub plan: Plan,
    /// Its hash.
    pub plan_hash: String,
    /// Runs merged.
    pub runs: usize,
    /// The results table.
    pub results: PathBuf,
    /// The summary table.
    pub summary_path: PathBuf,
    /// The summary rows.
    pub summary: Vec<SummaryRow>,
}

/// Merge the point files of sweep folders (shards of one plan) into one results table at
/// `out` (and its summary at `summary_out`, default beside it). Fails unless every folder
/// ran the same plan and every (point, seed) of the plan is present exactly once.
pub fn merge(dirs: &[PathBuf], out: &Path, summary_out: Option<&Path>) -> Result<MergeReport> {
    if dirs.is_empty() {
        return Err(SweepError::Results("merge: no sweep folders given".into()));
    }
    let mut recs = Vec::new();
    for d in dirs {
        let rec = PlanRecord::read(d)?.ok_or_else(|| {
            SweepError::Results(format!(
                "{}: not a sweep folder (no {PLAN_FILE})",
                d.display()
            ))
        })?;
        recs.push(rec);
    }
    let hash = recs[0].plan_hash.clone();
    if let Some((d, r)) = dirs.iter().zip(&recs).find(|(_, r)| r.plan_hash != hash) {
        return Err(SweepError::Results(format!(
            "{} ran another plan than {} (plan hash {} vs {hash}): shards must come from one plan",
            d.display(),
            dirs[0].display(),
            r.plan_hash
        )));
    }
    let plan = Plan::parse(&recs[0].plan_toml, &dirs[0])?;
    let mut all: BTreeMap<(u32, u64), (Row, PathBuf)> = BTreeMap::new();
    for d in dirs {
        let (runs, torn) = read_points(&d.join(POINTS_DIR), &plan, &hash)?;
        if let Some(t) = torn.first() {
            return Err(SweepError::Results(format!(
                "{}: checksum fails (a torn write): resume that folder's sweep to run it again",
                t.display()
            )));
        }
        for (k, (row, _, path)) in runs {
            if let Some((_, prev)) = all.get(&k) {
                return Err(SweepError::Results(format!(
                    "point {} seed {} is present twice: {} and {}",
                    k.0,
                    k.1,
                    prev.display(),
                    path.display()
                )));
            }
            all.insert(k, (row, path));
        }
    }
    let mut missing = Vec::new();
    for p in &plan.points {
        for &s in &plan.seeds {
            if !all.contains_key(&(p.index, s)) {
                missing.push((p.index, s));
            }
        }
    }
    if !missing.is_empty() {
        let counts: BTreeSet<u32> = recs
            .iter()
            .filter_map(|r| r.shard.as_deref().and_then(|s| s.parse::<Shard>().ok()))
            .map(|s| s.count)
            .collect();
        let hint = match counts.iter().next() {
            Some(&n) if counts.len() == 1 => {
                let shards: BTreeSet<u32> = missing.iter().map(|(p, _)| p % n).collect();
                format!(
                    "; missing from shard(s) {} of {n}: run or resume them (--shard i/{n} --resume)",
                    shards
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
            _ => String::new(),
        };
        let first: Vec<String> = missing
            .iter()
            .take(5)
            .map(|(p, s)| {
                format!(
                    "point {p} seed {s} ({})",
                    plan.describe(&plan.points[*p as usize])
                )
            })
            .collect();
        return Err(SweepError::Results(format!(
            "{} of {} runs are missing, e.g. {}{hint}",
            missing.len(),
            plan.runs(),
            first.join("; ")
        )));
    }
    let rows: Vec<Row> = all.into_values().map(|(r, _)| r).collect();
    let summary_path = summary_out
        .map(Path::to_path_buf)
        .unwrap_or_else(|| summary_path_for(out));
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(SweepError::io(parent))?;
    }
    let summary = write_tables(&plan, &hash, &rows, out, &summary_path)?;
    Ok(MergeReport {
        runs: rows.len(),
        plan,
        plan_hash: hash,
        results: out.to_path_buf(),
        summary_path,
        summary,
    })
}

//! Parameter sweeps over the simulator and the store-level replay: plans, parallel runs,
//! crash-safe Parquet results, shards for a cluster, Pareto fronts.
//!
//! A **plan** (TOML, [`Plan`]) is a base configuration (anything `moonagent simulate` or
//! `moonagent replay` takes, plus the workload) and axes: a config path and a list or range
//! of values. Axes combine as a grid, or in lockstep when they share a `zip` group. Every
//! (point, seed) is an independent deterministic run. Before anything runs, every axis
//! value and every point is applied to the base (as a JSON path) and deserialized into the
//! typed configuration, so an unknown path or a bad value fails at once, naming the axis.
//!
//! **Running** ([`run`]) executes the pending (point, seed) runs on a rayon pool of the
//! chosen size. Each finished run is one small file `DIR/points/<index>-<id>-<seed>.json`,
//! written to a temporary name and renamed into place, ending with a checksum of its
//! record, so a reader never takes a partial file for a result and a SIGKILL loses at
//! most the runs in flight (a file a power loss tears fails its checksum and is run again;
//! `fsync` makes each one durable at once). `DIR/plan.json` holds the
//! plan and its hash (BLAKE2b over the canonical plan and the content of every trace file
//! it reads); every point file repeats the hash, and `--resume` refuses a changed plan.
//! At the end the results table is rebuilt from the point files, rows sorted by (point
//! index, seed), so neither the thread count nor sharding changes a byte of it.
//!
//! **Shards** (`--shard i/N`) take the points whose index is `i mod N`; [`merge`] rebuilds
//! the table from several shard directories and checks that every (point, seed) is present
//! exactly once.
//!
//! **Tables.** `results.parquet` has one row per (point, seed): `point`, `point_id`,
//! `seed`, one column per axis (typed: integer, float, bool or text), then every metric,
//! nested metrics flattened to dotted names (`ttft_ms.p95`, `link_bytes.encoder_store`,
//! `encoder_output.hit_rate`). `summary.parquet` has one row per point: the axes,
//! `n_seeds`, and per metric `<m>.mean`, `<m>.ci95_lo`, `<m>.ci95_hi`, a two-sided 95%
//! Student-t interval over seeds (null with a single seed). Wall-clock figures never enter
//! either table: they go to `timings.json`. The files are written with arrow-rs's Parquet
//! writer (not polars-rs, which would add ~11 minutes of release build); they load as they
//! are with `polars.read_parquet` and `pandas.read_parquet`, which CI checks.
//!
//! **Choosing** ([`best`]): the Pareto front over two metrics (point means over seeds) and
//! the best point under SLO constraints such as `ttft_ms.p95<=2000`.

mod config;
mod exec;
pub(crate) mod files;
pub mod metrics;
pub mod pareto;
pub mod plan;
mod progress;
mod runner;
pub mod stats;
pub mod table;

use std::path::PathBuf;

pub use config::{Capacity, ReplayRun, RunConfig, SimRun, Workload};
pub use metrics::{MetricType, MetricValue};
pub use pareto::{best, BestReport, Constraint, Objective, PointMeans};
pub use plan::{Axis, Combine, Kind, Plan, Point, Prepared};
pub use runner::{merge, run, MergeReport, RunOptions, RunReport, Shard};
pub use table::{SummaryRow, RESULTS_FILE, SUMMARY_FILE};

/// What can go wrong in a sweep. Every message names the file, axis, point or run at fault.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The plan file itself: syntax, missing or unknown keys, bad ranges, bad seeds.
    #[error("plan: {0}")]
    Plan(String),
    /// One axis value cannot be applied or does not make a valid configuration.
    #[error("axis {axis} `{name}` (path {path}){value}: {msg}")]
    Axis {
        /// 1-based position of the axis in the plan.
        axis: usize,
        /// Column name of the axis.
        name: String,
        /// Config path the axis sets.
        path: String,
        /// ` = <value>` when one value is at fault, empty otherwise.
        value: String,
        /// What is wrong.
        msg: String,
    },
    /// A combination of axis values does not make a valid configuration.
    #[error("point {index} ({desc}): {msg}")]
    Point {
        /// Point index.
        index: u32,
        /// Its axis values, `name=value, ...`.
        desc: String,
        /// What is wrong.
        msg: String,
    },
    /// A run failed while executing.
    #[error("run of point {index} seed {seed} ({desc}): {msg}")]
    Run {
        /// Point index.
        index: u32,
        /// Seed.
        seed: u64,
        /// Its axis values.
        desc: String,
        /// What failed.
        msg: String,
    },
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Existing results disagree with the plan or with each other (changed plan on
    /// resume, missing or duplicate points in a merge, a malformed point file).
    #[error("{0}")]
    Results(String),
}

impl SweepError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| SweepError::Io { path, source }
    }
}

/// Result alias for sweeps.
pub type Result<T, E = SweepError> = std::result::Result<T, E>;

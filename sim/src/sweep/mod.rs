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
    Plan(PlanError),
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
        msg: Box<PlanError>,
    },
    /// A combination of axis values does not make a valid configuration.
    #[error("point {index} ({desc}): {msg}")]
    Point {
        /// Point index.
        index: u32,
        /// Its axis values, `name=value, ...`.
        desc: String,
        /// What is wrong.
        msg: Box<PlanError>,
    },
    /// A run failed while executing.
    #[error("run of point {index} seed {seed} ({desc}): {msg}{note}")]
    Run {
        /// Point index.
        index: u32,
        /// Seed.
        seed: u64,
        /// Its axis values.
        desc: String,
        /// What failed.
        msg: Box<PlanError>,
        /// What became of the other runs (empty, or `; the finished runs are kept ...`).
        note: String,
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

/// What is wrong with a plan's value, one point's configuration or the inputs of one run;
/// [`SweepError`] says where (the plan, an axis, a point, a run). The causes (the trace
/// reader's, the simulator's, the replay's, a parser's) are kept as sources.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// A field is missing, of the wrong type or out of range.
    #[error("{field}: {what}")]
    Field {
        /// The field's path (`seeds`, `range.step`, `workload.config`, `--set axis.0`).
        field: String,
        /// What was expected, and what was found.
        what: String,
    },
    /// A rule of the plan format that no single field breaks (an axis's name or path
    /// clashing with another's, two equal points): what is wrong and what was expected.
    #[error("{0}")]
    Rule(String),
    /// A config path runs through a value that is not a table.
    #[error("`{path}` is {found}, not a table, so it has no field `{field}`")]
    NotATable {
        /// The path up to the value.
        path: String,
        /// The value's type (`a number`, ...).
        found: &'static str,
        /// The field the path asks of it.
        field: String,
    },
    /// A computed value JSON cannot hold.
    #[error("value {0} is not a finite number")]
    NotFinite(f64),
    /// The plan text is not valid TOML (the parser's message has the line and column).
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    /// The plan with its `--set` overrides applied cannot be written back as TOML.
    #[error(transparent)]
    TomlWrite(#[from] toml::ser::Error),
    /// A configuration value does not have the configuration's shape; `at` is the field's
    /// path (empty when the whole value is at fault).
    #[error("{}{source}", field_prefix(at))]
    Deserialize {
        /// The field's path.
        at: String,
        /// serde's message.
        source: serde_json::Error,
    },
    /// The workload's generator refused its settings.
    #[error("workload.{0}")]
    Generator(#[source] moonagent_traces::TraceError),
    /// The workload's trace file cannot be opened.
    #[error("workload.trace: {0}")]
    TraceFile(#[source] moonagent_traces::TraceError),
    /// Generating the workload's requests failed.
    #[error("workload: {0}")]
    Workload(#[source] moonagent_traces::TraceError),
    /// Reading the workload's trace failed.
    #[error(transparent)]
    Trace(#[from] moonagent_traces::TraceError),
    /// A capacity that is not a size or a share.
    #[error(transparent)]
    Capacity(#[from] crate::capacity::CapacityError),
    /// The store settings.
    #[error("store.{0}")]
    Store(#[source] moonagent_core::store::ConfigError),
    /// The policy settings.
    #[error("policy: {0}")]
    Policy(#[source] moonagent_core::store::ConfigError),
    /// The model name.
    #[error("model: {0}")]
    Model(#[source] moonagent_models::ModelError),
    /// The simulator refused the configuration, or failed.
    #[error(transparent)]
    Sim(#[from] crate::des::SimError),
    /// The replay failed.
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
    /// A run panicked.
    #[error("panicked: {0}")]
    Panic(String),
    /// A broken assumption of the sweep's own code.
    #[error("internal: {0}")]
    Internal(String),
    /// An error found once and shared by every point or run it concerns (a workload's
    /// check, a trace loaded for several runs).
    #[error(transparent)]
    Shared(std::sync::Arc<PlanError>),
    /// An error in a plan file.
    #[error("{}: {source}", path.display())]
    File {
        /// The plan file.
        path: PathBuf,
        /// What is wrong in it.
        source: Box<PlanError>,
    },
}

impl PlanError {
    /// A field error.
    pub fn field(field: impl Into<String>, what: impl Into<String>) -> Self {
        PlanError::Field {
            field: field.into(),
            what: what.into(),
        }
    }
}

fn field_prefix(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!("{at}: ")
    }
}

/// Result alias for sweeps.
pub type Result<T, E = SweepError> = std::result::Result<T, E>;

//! The EPD discrete-event simulator: engine, configuration, cluster model, metrics.

pub mod cluster;
pub mod config;
pub mod engine;
pub mod ladder;
pub mod metrics;

pub use cluster::{simulate, simulate_all, Run, Simulation, StepLog};

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A configuration field is out of range.
    #[error("{field}: {what}")]
    Config {
        /// The field (dotted path).
        field: &'static str,
        /// What was expected, and what was given.
        what: String,
    },
    /// The hardware profile, model spec or cost model refused the configuration.
    #[error("{0}: {1}")]
    Models(&'static str, #[source] moonagent_models::ModelError),
    /// The store configuration is invalid.
    #[error("store.{0}")]
    Store(#[source] moonagent_core::store::ConfigError),
    /// The store's eviction policy is invalid.
    #[error("policy: {0}")]
    Policy(#[source] moonagent_core::store::ConfigError),
    /// The serving engine stopped.
    #[error(transparent)]
    Serve(#[from] moonagent_core::serve::ServeError),
    /// A workload could not be generated.
    #[error("workload {workload}: {what}")]
    Workload {
        /// Its name.
        workload: String,
        /// What went wrong.
        what: String,
    },
}
pub use config::{Mode, SimConfig, Slo};
pub use ladder::{run_ladder, LadderConfig, LadderResult};
pub use metrics::{workers_table, Percentiles, RequestRecord, Summary, WorkerRecord};

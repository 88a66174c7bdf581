//! The EPD discrete-event simulator: engine, configuration, cluster model, metrics.

pub mod cluster;
pub mod config;
pub mod engine;
pub mod ladder;
pub mod metrics;

pub use cluster::{simulate, Simulation};
pub use config::{Mode, SimConfig, Slo};
pub use ladder::{run_ladder, LadderConfig, LadderResult};
pub use metrics::{Percentiles, RequestRecord, Summary};

//! moonagent-traces: one schema for multimodal agent workloads.
//!
//! The simulator, the store-level replay and the real backend all read the same traces.
//! A trace is a [`TraceHeader`] followed by [`Request`]s in arrival order, stored as JSONL
//! (human) or Parquet (fast). [`TraceReader`] streams either format in constant memory and
//! validates every record as it goes; [`TraceWriter`] streams either out. The [`gen`]
//! module holds seeded, deterministic generators (W1-W4, seed 002's continuous sessions,
//! ServeGen), [`import`] the importers of public traces (Mooncake FAST'25, Azure), and
//! [`stats`] the one-pass statistics behind `moonagent trace stats`. `traces/README.md`
//! documents the schema field by field.

#![warn(missing_docs)]

pub mod error;
pub mod gen;
pub mod import;
pub mod io;
pub mod jsonl;
pub mod parquet_io;
pub mod schema;
pub mod stats;

use std::path::PathBuf;

pub use error::{FieldError, Location, TraceError};
pub use io::{convert, write_trace, Format, TraceReader, TraceWriter};
pub use schema::{
    qwen25vl_grid, qwen25vl_visual_tokens, Fork, Image, Request, TraceHeader, Validator,
    SCHEMA_VERSION,
};
pub use stats::{ObjectSizes, StatsBuilder, StatsConfig, TraceStats};

/// The one setting that locates the shared public traces (CI sets it to `../shared/traces`).
pub const TRACES_ENV: &str = "MOONAGENT_TRACES";

/// Where the public originals of the shared traces live, by sub-folder.
fn origin_of(sub: &str) -> &'static str {
    if sub.starts_with("mooncake") {
        "Mooncake FAST'25 traces: github.com/kvcache-ai/Mooncake, folder FAST25-release/traces"
    } else if sub.starts_with("servegen") {
        "ServeGen: github.com/alibaba/ServeGen (data/multimodal)"
    } else {
        "Mooncake FAST'25 traces: github.com/kvcache-ai/Mooncake FAST25-release/traces; ServeGen: github.com/alibaba/ServeGen"
    }
}

/// Resolve the variable's value: absolute as is; relative from the working directory, then
/// from its parents (cargo runs a crate's tests inside the crate's folder, while CI sets
/// the variable relative to the repository root).
/// One step of a reader that ends at its first error: the step's request, error or end,
/// with `done` set unless a request came (readers check `done` before stepping).
pub(crate) fn end_on_error<T, E>(
    done: &mut bool,
    step: Result<Option<T>, E>,
) -> Option<Result<T, E>> {
    let out = step.transpose();
    *done = !matches!(out, Some(Ok(_)));
    out
}

pub(crate) fn resolve(base: &std::ffi::OsStr, sub: &str) -> PathBuf {
    let rel = PathBuf::from(base).join(sub);
    if rel.is_absolute() || rel.is_dir() {
        return rel;
    }
    if let Ok(cwd) = std::env::current_dir() {
        for dir in cwd.ancestors().skip(1).take(3) {
            let p = dir.join(&rel);
            if p.is_dir() {
                return p;
            }
        }
    }
    rel
}

/// The shared-trace folder `$MOONAGENT_TRACES/sub`, for tests and benchmarks.
///
/// Returns the folder if it exists (a relative value is tried from the working directory
/// and up to three of its parents). If not: under `CI=true` it panics naming the variable
/// and what is missing; otherwise it prints one line to stderr (what is missing, where the
/// public originals live) and returns `None`, so the caller can skip.
pub fn shared_traces_dir(sub: &str) -> Option<PathBuf> {
    let missing = match std::env::var_os(TRACES_ENV) {
        Some(base) => {
            let p = resolve(&base, sub);
            if p.is_dir() {
                return Some(p);
            }
            format!("{} (from {TRACES_ENV}) does not exist", p.display())
        }
        None => format!("{TRACES_ENV} is not set, so {sub}/ cannot be found"),
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("shared traces missing under CI: {missing}; set {TRACES_ENV} to the folder holding {sub}/");
    }
    eprintln!(
        "skipping: {missing}; set {TRACES_ENV} to a folder holding {sub}/ (public originals: {})",
        origin_of(sub)
    );
    None
}

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

pub use error::{FieldError, Location, TraceError, ValueError};
pub use io::{convert, convert_observed, write_trace, Format, TraceReader, TraceWriter};
pub use schema::{
    qwen25vl_grid, qwen25vl_visual_tokens, Fork, Image, ImageError, Request, TraceHeader,
    Validator, SCHEMA_VERSION,
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

/// The file (named by this variable) that skipped tests append their line to.
pub const SKIP_LOG_ENV: &str = "MOONAGENT_SKIP_LOG";

/// Whether this run must not skip anything (`CI=true`).
pub fn must_not_skip() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Report that the calling test cannot run here because `why`, for a caller that then
/// returns early. Under `CI=true` this panics instead (nothing skips in CI). Otherwise it
/// prints `SKIPPED <test>: <why>` to stderr and, when `$MOONAGENT_SKIP_LOG` names a
/// file, appends the line there: libtest captures a passing test's stderr, so
/// `scripts/test.sh` prints that file as its summary. The one place every skip goes.
pub fn skip_test(why: &str) {
    // libtest names each test's thread after the test; the binary names the test file.
    let bin = std::env::args()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => name.to_owned(),
            _ => s,
        })
        .unwrap_or_default();
    let test = std::thread::current()
        .name()
        .map(str::to_owned)
        .unwrap_or_default();
    let log = std::env::var_os(SKIP_LOG_ENV).map(PathBuf::from);
    report_skip(
        must_not_skip(),
        log.as_deref(),
        &format!("{bin}::{test}"),
        why,
    );
}

/// [`skip_test`] with its environment as arguments (tested without touching the
/// process environment, which other tests read concurrently).
fn report_skip(ci: bool, log: Option<&std::path::Path>, test: &str, why: &str) {
    if ci {
        panic!("test cannot skip under CI=true: {test}: {why}");
    }
    let line = format!("SKIPPED {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = log {
        use std::io::Write;
        // One `write_all` of a whole line on an append-mode file: tests running in
        // parallel (and processes) never interleave within a line.
        let r = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(format!("{line}\n").as_bytes()));
        if let Err(e) = r {
            eprintln!("could not append to {}: {e}", path.display());
        }
    }
}

/// The shared-trace folder `$MOONAGENT_TRACES/sub`, for tests and benchmarks.
///
/// Returns the folder if it exists (a relative value is tried from the working directory
/// and up to three of its parents). If not, it reports a skip through [`skip_test`]
/// (what is missing, where the public originals live; a panic under `CI=true`) and
/// returns `None`, so the caller can return.
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
    skip_test(&format!(
        "{missing}; set {TRACES_ENV} to a folder holding {sub}/ (public originals: {})",
        origin_of(sub)
    ));
    None
}

#[cfg(test)]
mod skip_tests {
    use super::report_skip;

    #[test]
    fn a_skip_appends_one_line_per_test_and_ci_refuses_it() {
        let dir = std::env::temp_dir().join(format!("moonagent-skip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let log = dir.join("skipped.txt");
        let _ = std::fs::remove_file(&log);
        report_skip(false, Some(&log), "it::a", "no traces");
        report_skip(false, Some(&log), "it::b", "no store");
        let text = std::fs::read_to_string(&log).expect("log written");
        assert_eq!(text, "SKIPPED it::a: no traces\nSKIPPED it::b: no store\n");
        let ci = std::panic::catch_unwind(|| report_skip(true, Some(&log), "it::c", "x"));
        assert!(ci.is_err(), "CI=true must fail, not skip");
        assert_eq!(std::fs::read_to_string(&log).expect("log"), text);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

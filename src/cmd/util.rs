//! Small parsing and printing helpers shared by the subcommands.

use anyhow::{Context, Result};
use std::path::Path;

/// A byte count or a percentage of `reference` (`moonagent_sim::capacity`, the one parser
/// of capacities).
pub fn parse_bytes(s: &str, reference: Option<u64>) -> Result<u64> {
    Ok(moonagent_sim::capacity::parse_bytes(s, reference)?)
}

/// Read a TOML or JSON file (by extension; JSON otherwise) into `T`, naming the file in errors.
pub fn read_config<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str(&text).with_context(|| format!("{}: invalid configuration", path.display()))
    } else {
        serde_json::from_str(&text)
            .with_context(|| format!("{}: invalid configuration", path.display()))
    }
}

/// Print rows as an aligned text table (first row = header).
pub fn print_table(rows: &[Vec<String>]) {
    let Some(first) = rows.first() else { return };
    let mut w = vec![0usize; first.len()];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    for (n, r) in rows.iter().enumerate() {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 0 {
                    format!("{c:<width$}", width = w[i])
                } else {
                    format!("{c:>width$}", width = w[i])
                }
            })
            .collect();
        println!("{}", line.join("  "));
        if n == 0 {
            println!(
                "{}",
                w.iter()
                    .map(|&x| "-".repeat(x))
                    .collect::<Vec<_>>()
                    .join("  ")
            );
        }
    }
}

/// A percentage with two decimals.
pub fn pct(x: f64) -> String {
    format!("{:.2}", 100.0 * x)
}

/// Bytes in binary units.
pub fn human_bytes(b: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", units[i])
}

/// Every request of the trace at `path` (moonagent schema, .jsonl or .parquet) and its
/// prefix block size, with a spinner while reading. JSONL lines are parsed on every core
/// (`TraceReader::collect_all`: the same requests and errors as reading line by line).
pub fn read_trace(path: &Path) -> Result<(Vec<moonagent_traces::schema::Request>, u32)> {
    let reader = moonagent_traces::TraceReader::open(path)
        .with_context(|| format!("opening trace {}", path.display()))?;
    let bs = reader.header().block_size_tokens;
    let rp = moonagent_sim::progress::spinner("reading", "requests", true);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let reqs = reader
        .collect_all(threads)
        .with_context(|| format!("reading {}", path.display()))?;
    rp.finish_and_clear();
    Ok((reqs, bs))
}

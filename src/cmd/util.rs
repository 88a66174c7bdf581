//! Small parsing and printing helpers shared by the subcommands.

use anyhow::{bail, Context, Result};
use std::path::Path;

/// A byte count: plain (`1073741824`), with a binary or decimal suffix (`64GiB`, `2.5GB`,
/// `512MiB`, `1e9`), or a percentage (`30%`) of `reference` when one is given.
pub fn parse_bytes(s: &str, reference: Option<u64>) -> Result<u64> {
    let t = s.trim();
    if let Some(p) = t.strip_suffix('%') {
        let pct: f64 = p
            .trim()
            .parse()
            .with_context(|| format!("capacity {s:?}: expected a number before %"))?;
        let Some(r) = reference else {
            bail!("capacity {s:?}: a percentage needs a reference size")
        };
        if !(pct > 0.0 && pct.is_finite()) {
            bail!("capacity {s:?}: expected a positive percentage");
        }
        return Ok((r as f64 * pct / 100.0).round() as u64);
    }
    let units: [(&str, f64); 9] = [
        ("KiB", 1024.0),
        ("MiB", 1024.0 * 1024.0),
        ("GiB", 1024.0 * 1024.0 * 1024.0),
        ("TiB", 1024.0_f64.powi(4)),
        ("KB", 1e3),
        ("MB", 1e6),
        ("GB", 1e9),
        ("TB", 1e12),
        ("B", 1.0),
    ];
    let (num, mult) = units
        .iter()
        .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.trim(), *m)))
        .unwrap_or((t, 1.0));
    let v: f64 = num.parse().with_context(|| format!("size {s:?}: expected a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB) or a percentage"))?;
    if !(v > 0.0 && v.is_finite()) {
        bail!("size {s:?}: expected a positive size");
    }
    Ok((v * mult).round() as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_bytes_accepts_units_and_percentages_and_rejects_junk() {
        assert_eq!(parse_bytes("1024", None).unwrap(), 1024);
        assert_eq!(parse_bytes("64GiB", None).unwrap(), 64 << 30);
        assert_eq!(parse_bytes("2.5 GB", None).unwrap(), 2_500_000_000);
        assert_eq!(parse_bytes("1e9", None).unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("30%", Some(1000)).unwrap(), 300);
        assert!(parse_bytes("30%", None).is_err());
        assert!(parse_bytes("lots", None).is_err());
        assert!(parse_bytes("-5GB", None).is_err());
        assert!(parse_bytes("0", None).is_err());
    }
}

//! Store capacities as researchers write them, parsed in one place: a byte count (`1e9`,
//! `1073741824`), a size with a binary or decimal unit (`64GiB`, `2.5 GB`), or a
//! percentage of a reference size (`30%`: of the workload's unique bytes). The CLI
//! (`--capacity`) and sweep plans (`capacity = "30%"`) both use [`CapacitySpec`].

/// A parsed capacity, not yet resolved against a reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CapacitySpec {
    /// Bytes.
    Bytes(u64),
    /// A share of the reference size (`0.3` for `30%`), > 0.
    Share(f64),
}

/// Why a capacity was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CapacityError {
    /// The text is not a number, a size with a unit, or a percentage.
    #[error("capacity {0:?}: expected a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB) or a percentage")]
    Syntax(String),
    /// Zero, negative or not finite.
    #[error("capacity {0:?}: expected a positive size")]
    NotPositive(String),
    /// A percentage where no reference size exists.
    #[error("capacity {0:?}: a percentage needs a reference size")]
    NoReference(String),
}

const UNITS: [(&str, f64); 9] = [
    ("KiB", 1024.0),
    ("MiB", 1_048_576.0),
    ("GiB", 1_073_741_824.0),
    ("TiB", 1_099_511_627_776.0),
    ("KB", 1e3),
    ("MB", 1e6),
    ("GB", 1e9),
    ("TB", 1e12),
    ("B", 1.0),
];

impl CapacitySpec {
    /// Parse `s` (see the module docs).
    pub fn parse(s: &str) -> Result<Self, CapacityError> {
        let t = s.trim();
        if let Some(p) = t.strip_suffix('%') {
            let pct: f64 = p
                .trim()
                .parse()
                .map_err(|_| CapacityError::Syntax(s.into()))?;
            if !(pct > 0.0 && pct.is_finite()) {
                return Err(CapacityError::NotPositive(s.into()));
            }
            return Ok(CapacitySpec::Share(pct / 100.0));
        }
        let (num, mult) = UNITS
            .iter()
            .find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.trim(), *m)))
            .unwrap_or((t, 1.0));
        let v: f64 = num.parse().map_err(|_| CapacityError::Syntax(s.into()))?;
        let bytes = (v * mult).round();
        if !(bytes >= 1.0 && bytes.is_finite()) {
            return Err(CapacityError::NotPositive(s.into()));
        }
        Ok(CapacitySpec::Bytes(bytes as u64))
    }

    /// Bytes, a share resolved against `reference` (rounded, at least 1 byte).
    pub fn resolve(self, reference: Option<u64>, text: &str) -> Result<u64, CapacityError> {
        match (self, reference) {
            (CapacitySpec::Bytes(b), _) => Ok(b),
            (CapacitySpec::Share(s), Some(r)) => Ok(((r as f64 * s).round() as u64).max(1)),
            (CapacitySpec::Share(_), None) => Err(CapacityError::NoReference(text.into())),
        }
    }
}

/// Parse and resolve in one step: `30%` of `reference`, or a size.
pub fn parse_bytes(s: &str, reference: Option<u64>) -> Result<u64, CapacityError> {
    CapacitySpec::parse(s)?.resolve(reference, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_percentages_and_junk() {
        assert_eq!(parse_bytes("1024", None).unwrap(), 1024);
        assert_eq!(parse_bytes("64GiB", None).unwrap(), 64 << 30);
        assert_eq!(parse_bytes("2.5 GB", None).unwrap(), 2_500_000_000);
        assert_eq!(parse_bytes("1e9", None).unwrap(), 1_000_000_000);
        assert_eq!(parse_bytes("30%", Some(1000)).unwrap(), 300);
        assert_eq!(parse_bytes("25%", Some(1000)).unwrap(), 250);
        // A tiny share of a tiny reference is still a capacity.
        assert_eq!(parse_bytes("0.01%", Some(10)).unwrap(), 1);
        assert_eq!(
            parse_bytes("30%", None),
            Err(CapacityError::NoReference("30%".into()))
        );
        assert!(matches!(
            parse_bytes("lots", None),
            Err(CapacityError::Syntax(_))
        ));
        assert!(matches!(
            parse_bytes("-5GB", None),
            Err(CapacityError::NotPositive(_))
        ));
        assert!(matches!(
            parse_bytes("0", None),
            Err(CapacityError::NotPositive(_))
        ));
        assert!(matches!(
            parse_bytes("0%", Some(9)),
            Err(CapacityError::NotPositive(_))
        ));
        assert_eq!(
            CapacitySpec::parse("30%").unwrap(),
            CapacitySpec::Share(0.3)
        );
    }
}

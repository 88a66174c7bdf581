//! libCacheSim's `oracleGeneral` binary traces (the format of the large public block, KV
//! and CDN trace collections): 24-byte little-endian records `u32 timestamp (s), u64
//! obj_id, u32 obj_size, i64 next_access_vtime`, no header.
//!
//! Each record becomes one access of data type `general` (size `obj_size`, no miss
//! penalty, tenant 0). Next accesses are recomputed by [`Compiled::fill_next`] (they
//! equal the file's `next_access_vtime` on a well-formed file; the file's are not trusted).
//! Timestamps become nanoseconds, clamped to be non-decreasing (a few public traces have
//! out-of-order seconds; only the Mooncake model reads time).
//!
//! A file whose length is not a multiple of 24 is refused naming the offset of the
//! truncated record; no input panics the reader.

use std::path::Path;

use moonagent_core::store::DataType;

use super::{Access, Compiled, NEVER};

/// Bytes per `oracleGeneral` record.
pub const RECORD: usize = 24;

/// Why an `oracleGeneral` trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OracleGeneralError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The last record is cut short.
    #[error("truncated record at byte offset {offset}: {len} of 24 bytes")]
    Truncated {
        /// Offset of the incomplete record.
        offset: usize,
        /// Its bytes present.
        len: usize,
    },
    /// A record the replay cannot hold (too many accesses).
    #[error("record {index} at byte offset {offset}: {reason}")]
    Record {
        /// Record number (from 0).
        index: usize,
        /// Its byte offset.
        offset: usize,
        /// What is wrong.
        #[source]
        reason: Box<super::ReplayError>,
    },
}

/// One decoded record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Timestamp, seconds.
    pub timestamp: u32,
    /// Object id.
    pub obj_id: u64,
    /// Object size, bytes.
    pub obj_size: u32,
    /// Index of the next request to the object (-1 or i64::MAX when none).
    pub next_access_vtime: i64,
}

/// Decode every record of `bytes`.
pub fn records(bytes: &[u8]) -> Result<Vec<Record>, OracleGeneralError> {
    let rem = bytes.len() % RECORD;
    if rem != 0 {
        return Err(OracleGeneralError::Truncated {
            offset: bytes.len() - rem,
            len: rem,
        });
    }
    Ok(bytes
        .chunks_exact(RECORD)
        .map(|r| Record {
            timestamp: u32::from_le_bytes(r[0..4].try_into().expect("4 bytes")),
            obj_id: u64::from_le_bytes(r[4..12].try_into().expect("8 bytes")),
            obj_size: u32::from_le_bytes(r[12..16].try_into().expect("4 bytes")),
            next_access_vtime: i64::from_le_bytes(r[16..24].try_into().expect("8 bytes")),
        })
        .collect())
}

impl Compiled {
    /// Compile an `oracleGeneral` trace held in memory (see the module docs).
    pub fn from_oracle_general_bytes(bytes: &[u8]) -> Result<Self, OracleGeneralError> {
        let rem = bytes.len() % RECORD;
        if rem != 0 {
            return Err(OracleGeneralError::Truncated {
                offset: bytes.len() - rem,
                len: rem,
            });
        }
        let n = bytes.len() / RECORD;
        if n >= NEVER as usize - 1 {
            return Err(OracleGeneralError::Record {
                index: NEVER as usize - 1,
                offset: (NEVER as usize - 1) * RECORD,
                reason: Box::new(super::ReplayError::TooLong { max: NEVER - 1 }),
            });
        }
        // Decoded straight into accesses: every check `push` makes holds by construction
        // (sizes are u32, times are clamped to be non-decreasing, the count is checked).
        let general = DataType::General.index() as u8;
        let mut c = Compiled::default();
        c.accesses.reserve_exact(n);
        let mut t = 0u64;
        for r in bytes.chunks_exact(RECORD) {
            let ts = u32::from_le_bytes(r[0..4].try_into().expect("4 bytes"));
            t = t.max(u64::from(ts) * 1_000_000_000);
            c.accesses.push(Access::new(
                t,
                u64::from_le_bytes(r[4..12].try_into().expect("8 bytes")),
                u32::from_le_bytes(r[12..16].try_into().expect("4 bytes")),
                0,
                general,
                0,
                0,
            ));
        }
        c.requests = n as u64;
        c.fill_next();
        Ok(c)
    }

    /// Read and compile an `oracleGeneral` trace file.
    pub fn from_oracle_general(path: &Path) -> Result<Self, OracleGeneralError> {
        let bytes = std::fs::read(path).map_err(|source| OracleGeneralError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_oracle_general_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rec(ts: u32, id: u64, size: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&ts.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&(-1i64).to_le_bytes());
        v
    }

    #[test]
    fn records_decode_and_next_accesses_are_recomputed() {
        let mut b = rec(5, 7, 100);
        b.extend(rec(6, 8, 50));
        b.extend(rec(4, 7, 100)); // out of order: clamped to 6 s
        let c = Compiled::from_oracle_general_bytes(&b).unwrap();
        assert_eq!(c.accesses.len(), 3);
        assert_eq!(c.accesses[0].next, 2);
        assert_eq!(c.accesses[2].time, 6_000_000_000);
        assert!(c.accesses[2].is_reuse());
        assert_eq!(c.distinct, 2);
    }

    #[test]
    fn a_truncated_file_names_the_offset() {
        let mut b = rec(1, 1, 1);
        b.extend(&rec(2, 2, 2)[..10]);
        let e = Compiled::from_oracle_general_bytes(&b).unwrap_err();
        assert!(matches!(
            e,
            OracleGeneralError::Truncated {
                offset: 24,
                len: 10
            }
        ));
        assert_eq!(
            e.to_string(),
            "truncated record at byte offset 24: 10 of 24 bytes"
        );
    }

    proptest! {
        /// Arbitrary bytes: a trace or an error, never a panic; whole records always decode.
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..400)) {
            match Compiled::from_oracle_general_bytes(&b) {
                Ok(c) => prop_assert_eq!(c.accesses.len() * RECORD, b.len()),
                Err(OracleGeneralError::Truncated { offset, len }) => {
                    prop_assert_eq!(offset + len, b.len());
                    prop_assert!(len > 0 && len < RECORD);
                }
                Err(e) => prop_assert!(false, "unexpected error {e}"),
            }
        }
    }
}

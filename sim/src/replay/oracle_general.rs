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
        let mut c = Compiled::default();
        c.accesses.reserve_exact(bytes.len() / RECORD);
        let mut t = 0u64;
        c.push_records(bytes, &mut t)?;
        c.fill_next();
        Ok(c)
    }

    /// Read and compile an `oracleGeneral` trace from `r` in 1.5 MiB pieces, each piece
    /// also fed to `key` (so the key is that of exactly the bytes compiled). `len_hint`
    /// (the file's length, if known) sizes the accesses once. Same result and errors as
    /// [`Compiled::from_oracle_general_bytes`] on the same bytes, plus `Io` for `path`.
    pub fn from_oracle_general_reader(
        mut r: impl std::io::Read,
        path: &Path,
        len_hint: u64,
        mut key: Option<&mut super::trace_cache::KeyHasher>,
    ) -> Result<Self, OracleGeneralError> {
        let io = |source| OracleGeneralError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut c = Compiled::default();
        // A hint only (the file may change while it is read); capped at what a replay holds.
        c.accesses
            .reserve_exact((len_hint / RECORD as u64).min(u64::from(NEVER - 1)) as usize);
        let mut t = 0u64;
        // Records are decoded once the buffer (a whole number of them) is full, so none
        // straddles two pieces.
        let mut buf = vec![0u8; RECORD << 16];
        let mut have = 0;
        let mut total = 0usize;
        loop {
            let n = match r.read(&mut buf[have..]) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e)),
            };
            if let Some(k) = key.as_deref_mut() {
                k.update(&buf[have..have + n]);
            }
            total += n;
            have += n;
            if n == 0 {
                break;
            }
            if have == buf.len() {
                // `buf` holds a whole number of records.
                c.push_records(&buf, &mut t)?;
                have = 0;
            }
        }
        let whole = have - have % RECORD;
        c.push_records(&buf[..whole], &mut t)?;
        if have % RECORD != 0 {
            return Err(OracleGeneralError::Truncated {
                offset: total - have % RECORD,
                len: have % RECORD,
            });
        }
        c.fill_next();
        Ok(c)
    }

    /// Append whole records (`bytes.len()` a multiple of [`RECORD`]); `t` carries the
    /// clamped time across calls.
    fn push_records(&mut self, bytes: &[u8], t: &mut u64) -> Result<(), OracleGeneralError> {
        debug_assert_eq!(bytes.len() % RECORD, 0);
        let n = self.accesses.len() + bytes.len() / RECORD;
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
        for r in bytes.chunks_exact(RECORD) {
            let ts = u32::from_le_bytes(r[0..4].try_into().expect("4 bytes"));
            *t = (*t).max(u64::from(ts) * 1_000_000_000);
            self.accesses.push(Access::new(
                *t,
                u64::from_le_bytes(r[4..12].try_into().expect("8 bytes")),
                u32::from_le_bytes(r[12..16].try_into().expect("4 bytes")),
                0,
                general,
                0,
                0,
            ));
        }
        self.requests += (bytes.len() / RECORD) as u64;
        Ok(())
    }

    /// Read and compile an `oracleGeneral` trace file.
    pub fn from_oracle_general(path: &Path) -> Result<Self, OracleGeneralError> {
        let f = std::fs::File::open(path).map_err(|source| OracleGeneralError::Io {
            path: path.display().to_string(),
            source,
        })?;
        let len = f.metadata().map_or(0, |m| m.len());
        Self::from_oracle_general_reader(f, path, len, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zerocopy::IntoBytes;

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
        // Only a later access of an object is a re-reference, never its first.
        assert!(c.accesses[2].is_reuse());
        assert!(!c.accesses[0].is_reuse() && !c.accesses[1].is_reuse());
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

    /// A reader handing out at most `step` bytes per call (short reads, as pipes do).
    struct Trickle<'a> {
        bytes: &'a [u8],
        step: usize,
    }

    impl std::io::Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.step).min(self.bytes.len());
            buf[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn the_streamed_reader_spans_its_buffer_and_hashes_every_byte() {
        // More than one 1.5 MiB buffer, read in pieces that split records.
        let b: Vec<u8> = (0..70_000u32)
            .flat_map(|i| rec(i / 7, u64::from(i % 5_000), 1 + i % 3))
            .collect();
        let want = Compiled::from_oracle_general_bytes(&b).unwrap();
        let mut key = crate::replay::trace_cache::KeyHasher::new(b"x");
        let got = Compiled::from_oracle_general_reader(
            Trickle {
                bytes: &b,
                step: 100_003,
            },
            Path::new("t"),
            0,
            Some(&mut key),
        )
        .unwrap();
        assert_eq!(got.accesses.as_bytes(), want.accesses.as_bytes());
        assert_eq!(got.objects.as_bytes(), want.objects.as_bytes());
        assert_eq!((got.requests, got.distinct), (70_000, 5_000));
        assert_eq!(
            key.finish(),
            crate::replay::trace_cache::key_of_bytes(&b, b"x")
        );
    }

    proptest! {
        /// The streamed reader gives what the in-memory decoder gives, errors included,
        /// whatever the sizes of the reads.
        #[test]
        fn streamed_and_in_memory_agree(
            b in proptest::collection::vec(any::<u8>(), 0..400),
            step in 1usize..64,
        ) {
            let mem = Compiled::from_oracle_general_bytes(&b);
            let streamed = Compiled::from_oracle_general_reader(
                Trickle { bytes: &b, step }, Path::new("t"), b.len() as u64, None);
            match (mem, streamed) {
                (Ok(m), Ok(s)) => {
                    prop_assert_eq!(m.accesses.as_bytes(), s.accesses.as_bytes());
                    prop_assert_eq!(m.objects.as_bytes(), s.objects.as_bytes());
                    prop_assert_eq!((m.requests, m.distinct), (s.requests, s.distinct));
                }
                (Err(m), Err(s)) => prop_assert_eq!(m.to_string(), s.to_string()),
                (m, s) => prop_assert!(false, "differ: {:?} vs {:?}", m.is_ok(), s.is_ok()),
            }
        }

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

//! Format-agnostic reading and writing.
//!
//! [`TraceReader::open`] picks JSONL or Parquet from the extension (`.jsonl`, `.json`,
//! `.parquet`, `.pq`), else from the magic bytes (`PAR1`). [`TraceWriter::create`]
//! picks by extension. [`convert`] streams one into the other.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read};
use std::path::{Path, PathBuf};

use crate::error::{Location, TraceError};
use crate::jsonl::{JsonlReader, JsonlWriter};
use crate::parquet_io::{ParquetReader, ParquetWriter};
use crate::schema::{Request, TraceHeader};

/// A trace file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// One JSON object per line, header first.
    Jsonl,
    /// Apache Parquet, header in key-value metadata.
    Parquet,
}

impl Format {
    /// The format named by a path's extension, if any.
    pub fn from_extension(path: &Path) -> Option<Format> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "jsonl" | "json" | "ndjson" => Some(Format::Jsonl),
            "parquet" | "pq" => Some(Format::Parquet),
            _ => None,
        }
    }

    /// The format of `path`: by extension, else by its first bytes.
    pub fn detect(path: &Path) -> Result<Format, TraceError> {
        if let Some(f) = Format::from_extension(path) {
            return Ok(f);
        }
        let mut magic = [0u8; 4];
        let mut f = File::open(path).map_err(|e| TraceError::io(path, e))?;
        let n = f.read(&mut magic).map_err(|e| TraceError::io(path, e))?;
        if n == 4 && &magic == b"PAR1" {
            Ok(Format::Parquet)
        } else {
            Ok(Format::Jsonl)
        }
    }
}

/// A streaming reader of either format: an iterator of validated requests.
// One reader per open file: variant size does not matter, an extra indirection per
// request would.
#[allow(clippy::large_enum_variant)]
pub enum TraceReader {
    /// A JSONL file.
    Jsonl(JsonlReader<BufReader<File>>),
    /// A Parquet file.
    Parquet(Box<ParquetReader>),
}

impl TraceReader {
    /// Open a trace, choosing the format by extension or magic bytes.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        match Format::detect(path)? {
            Format::Jsonl => Ok(TraceReader::Jsonl(JsonlReader::open(path)?)),
            Format::Parquet => Ok(TraceReader::Parquet(Box::new(ParquetReader::open(path)?))),
        }
    }

    /// The trace header.
    pub fn header(&self) -> &TraceHeader {
        match self {
            TraceReader::Jsonl(r) => r.header(),
            TraceReader::Parquet(r) => r.header(),
        }
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        match self {
            TraceReader::Jsonl(r) => r.path(),
            TraceReader::Parquet(r) => r.path(),
        }
    }
}

impl TraceReader {
    /// Every request, validated: a JSONL trace parsed on up to `threads` threads
    /// ([`JsonlReader::collect_parallel`]), a Parquet one read in order. The same requests
    /// and the same first error as collecting the iterator.
    pub fn collect_all(self, threads: usize) -> Result<Vec<Request>, TraceError> {
        match self {
            TraceReader::Jsonl(r) => r.collect_parallel(threads),
            TraceReader::Parquet(r) => r.collect(),
        }
    }
}

impl Iterator for TraceReader {
    type Item = Result<Request, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            TraceReader::Jsonl(r) => r.next(),
            TraceReader::Parquet(r) => r.next(),
        }
    }
}

/// A streaming writer of either format.
pub enum TraceWriter {
    /// A JSONL file.
    Jsonl(JsonlWriter<BufWriter<File>>),
    /// A Parquet file.
    Parquet(Box<ParquetWriter<File>>),
}

impl TraceWriter {
    /// Create a trace file; the format comes from the extension (`.jsonl` or `.parquet`).
    pub fn create(path: impl AsRef<Path>, header: &TraceHeader) -> Result<Self, TraceError> {
        let path = path.as_ref();
        match Format::from_extension(path) {
            Some(Format::Jsonl) => Ok(TraceWriter::Jsonl(JsonlWriter::create(path, header)?)),
            Some(Format::Parquet) => Ok(TraceWriter::Parquet(Box::new(ParquetWriter::create(
                path, header,
            )?))),
            None => Err(TraceError::invalid(
                path,
                Location::File,
                "(extension)",
                "unknown output format; expected a .jsonl or .parquet file name",
            )),
        }
    }

    /// Validate and append one request.
    pub fn write(&mut self, r: &Request) -> Result<(), TraceError> {
        match self {
            TraceWriter::Jsonl(w) => w.write(r),
            TraceWriter::Parquet(w) => w.write(r),
        }
    }

    /// Requests written so far.
    pub fn written(&self) -> u64 {
        match self {
            TraceWriter::Jsonl(w) => w.written(),
            TraceWriter::Parquet(w) => w.written(),
        }
    }

    /// Flush everything and close the file; returns the number of requests written.
    pub fn finish(self) -> Result<u64, TraceError> {
        let n = self.written();
        match self {
            TraceWriter::Jsonl(w) => {
                w.finish()?;
            }
            TraceWriter::Parquet(w) => {
                w.finish()?;
            }
        }
        Ok(n)
    }
}

/// Write a stream of requests to `path` under `header`; returns the count written.
/// `observe` sees every request (e.g. a stats builder) before it is written.
pub fn write_trace<I>(
    path: impl AsRef<Path>,
    header: &TraceHeader,
    requests: I,
    mut observe: impl FnMut(&Request),
) -> Result<u64, TraceError>
where
    I: IntoIterator<Item = Result<Request, TraceError>>,
{
    let mut w = TraceWriter::create(path, header)?;
    for r in requests {
        let r = r?;
        observe(&r);
        w.write(&r)?;
    }
    w.finish()
}

/// Convert a trace between formats (by the two extensions), streaming.
pub fn convert(input: impl AsRef<Path>, output: impl AsRef<Path>) -> Result<u64, TraceError> {
    convert_observed(input, output, |_| {})
}

/// [`convert`], with `observe` seeing every request before it is written (a progress
/// counter, a stats builder).
pub fn convert_observed(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    observe: impl FnMut(&Request),
) -> Result<u64, TraceError> {
    let (input, output): (PathBuf, PathBuf) = (input.as_ref().into(), output.as_ref().into());
    if input == output {
        return Err(TraceError::invalid(
            &output,
            Location::File,
            "(path)",
            "input and output are the same file; expected two different paths",
        ));
    }
    let reader = TraceReader::open(&input)?;
    let header = reader.header().clone();
    write_trace(&output, &header, reader, observe)
}

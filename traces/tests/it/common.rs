//! Helpers: in-memory writing and reading of both formats.

use moonagent_traces::jsonl::{JsonlReader, JsonlWriter};
use moonagent_traces::parquet_io::{ParquetReader, ParquetWriter};
use moonagent_traces::{Request, TraceError, TraceHeader};

pub fn to_jsonl(header: &TraceHeader, reqs: &[Request]) -> Vec<u8> {
    let mut w = JsonlWriter::new(Vec::new(), "mem.jsonl", header).expect("header");
    for r in reqs {
        w.write(r).expect("valid request");
    }
    w.finish().expect("flush")
}

pub fn to_parquet(header: &TraceHeader, reqs: &[Request]) -> Vec<u8> {
    let mut w = ParquetWriter::new(Vec::new(), "mem.parquet", header).expect("header");
    for r in reqs {
        w.write(r).expect("valid request");
    }
    w.finish().expect("footer")
}

pub fn read_jsonl(bytes: &[u8]) -> Result<(TraceHeader, Vec<Request>), TraceError> {
    let r = JsonlReader::from_reader(bytes, "mem.jsonl")?;
    let h = r.header().clone();
    Ok((h, r.collect::<Result<Vec<_>, _>>()?))
}

pub fn read_parquet(bytes: Vec<u8>) -> Result<(TraceHeader, Vec<Request>), TraceError> {
    let r = ParquetReader::from_bytes(bytes, "mem.parquet")?;
    let h = r.header().clone();
    Ok((h, r.collect::<Result<Vec<_>, _>>()?))
}

/// The first error of reading JSONL bytes, which must exist.
pub fn jsonl_error(bytes: &[u8]) -> TraceError {
    match read_jsonl(bytes) {
        Ok(_) => panic!("expected an error for {:?}", String::from_utf8_lossy(bytes)),
        Err(e) => e,
    }
}

pub fn header() -> TraceHeader {
    TraceHeader::new("test", 16)
}

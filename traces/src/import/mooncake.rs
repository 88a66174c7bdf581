//! Mooncake FAST'25 traces (`conversation_trace.jsonl`, `synthetic_trace.jsonl`, ...).
//!
//! One JSON object per line: `timestamp` (ms from the trace start, integer or decimal),
//! `input_length`, `output_length` (tokens) and `hash_ids`, the remapped prefix-block
//! hashes at 512 tokens a block. Each record becomes a request with `arrival_ns =
//! timestamp * 1,000,000` (exact for integers; decimals are rounded to the nearest ns),
//! `prompt_tokens = input_length`, `prompt_blocks = hash_ids`, `output_tokens =
//! output_length`. Every record is checked: `len(hash_ids) == ceil(input_length / 512)`,
//! non-negative integers, timestamps non-decreasing.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{check_imported, one_turn, AttachImages, Attacher};
use crate::error::{FieldError, Location, TraceError};
use crate::jsonl::{is_blank, parse_line, read_line};
use crate::schema::{blocks_for_tokens, Request, TraceHeader, Validator};

/// Tokens per `hash_ids` block in Mooncake's traces.
pub const MOONCAKE_BLOCK_TOKENS: u32 = 512;

#[derive(Deserialize)]
struct Record {
    timestamp: serde_json::Number,
    input_length: u32,
    output_length: u32,
    hash_ids: Vec<u64>,
}

fn ms_to_ns(n: &serde_json::Number) -> Result<u64, FieldError> {
    if let Some(ms) = n.as_u64() {
        return ms.checked_mul(1_000_000).ok_or_else(|| {
            FieldError::new("timestamp", format!("{ms} ms overflows u64 nanoseconds"))
        });
    }
    match n.as_f64() {
        Some(ms) if ms.is_finite() && ms >= 0.0 && ms * 1e6 < u64::MAX as f64 => {
            Ok((ms * 1e6).round() as u64)
        }
        _ => Err(FieldError::new(
            "timestamp",
            format!("{n}: expected non-negative milliseconds"),
        )),
    }
}

/// Streaming Mooncake importer: an iterator of checked requests.
pub struct MooncakeImport<R: BufRead> {
    input: R,
    file: PathBuf,
    header: TraceHeader,
    validator: Validator,
    attach: Option<Attacher>,
    line_no: u64,
    buf: Vec<u8>,
    next_id: u64,
    done: bool,
}

impl MooncakeImport<BufReader<File>> {
    /// Open a Mooncake JSONL trace; `attach` adds images from a seeded generator.
    pub fn open(path: impl AsRef<Path>, attach: Option<AttachImages>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let f = File::open(path).map_err(|e| TraceError::io(path, e))?;
        Self::from_reader(BufReader::with_capacity(1 << 16, f), path, attach)
    }
}

impl<R: BufRead> MooncakeImport<R> {
    /// Import from any reader; `file` names it in errors and in the header's source.
    pub fn from_reader(
        input: R,
        file: impl AsRef<Path>,
        attach: Option<AttachImages>,
    ) -> Result<Self, TraceError> {
        let file = file.as_ref().to_path_buf();
        let mut header = TraceHeader::new("import-mooncake", MOONCAKE_BLOCK_TOKENS);
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        header.source = Some(format!("mooncake FAST'25 trace {name}"));
        if let Some(a) = &attach {
            header.seed = Some(a.seed);
            header.notes = Some(a.describe());
            header.config = serde_json::to_value(a).ok();
        }
        Ok(Self {
            validator: Validator::new(&header),
            attach: attach.map(Attacher::new).transpose()?,
            input,
            file,
            header,
            line_no: 0,
            buf: Vec::new(),
            next_id: 0,
            done: false,
        })
    }

    /// The header of the imported trace.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    fn next_inner(&mut self) -> Result<Option<Request>, TraceError> {
        loop {
            self.line_no += 1;
            if !read_line(&mut self.input, &mut self.buf, &self.file, self.line_no)? {
                if self.next_id == 0 {
                    return Err(TraceError::invalid(
                        &self.file,
                        Location::Line(self.line_no.max(1)),
                        "(record)",
                        "the file has no records; expected one JSON object per line",
                    ));
                }
                return Ok(None);
            }
            if is_blank(&self.buf) {
                continue;
            }
            let at = Location::Line(self.line_no);
            let rec: Record = parse_line(&self.buf).map_err(|e| e.at(&self.file, at))?;
            let want = blocks_for_tokens(rec.input_length, MOONCAKE_BLOCK_TOKENS);
            if rec.hash_ids.len() as u64 != want {
                return Err(TraceError::invalid(
                    &self.file,
                    at,
                    "hash_ids",
                    format!(
                        "{} ids for input_length {}; expected ceil({}/512) = {want}",
                        rec.hash_ids.len(),
                        rec.input_length,
                        rec.input_length
                    ),
                ));
            }
            let arrival_ns = ms_to_ns(&rec.timestamp).map_err(|e| e.at(&self.file, at))?;
            let images = match self.attach.as_mut() {
                Some(a) => a.images(rec.input_length, None),
                None => Vec::new(),
            };
            let req = one_turn(
                self.next_id,
                arrival_ns,
                rec.input_length,
                rec.hash_ids,
                images,
                rec.output_length,
            );
            check_imported(&mut self.validator, &req, &self.file, at, "timestamp")?;
            self.next_id += 1;
            return Ok(Some(req));
        }
    }
}

impl<R: BufRead> Iterator for MooncakeImport<R> {
    type Item = Result<Request, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = self.next_inner();
        crate::end_on_error(&mut self.done, step)
    }
}

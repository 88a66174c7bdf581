//! JSONL: the human-readable format.
//!
//! Line 1 is `{"header": {...}}`; every further non-blank line is one request object.
//! The reader keeps one line buffer (constant memory in trace length), parses with
//! field-path tracking so that a type error names the field (`images[1].visual_tokens`),
//! and runs the [`Validator`] on each record.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{FieldError, Location, TraceError};
use crate::import::ImportKind;
use crate::schema::{Request, TraceHeader, Validator, SCHEMA_VERSION};

/// Longest line a reader accepts (a guard against reading a binary file as text).
pub const MAX_LINE_BYTES: usize = 256 << 20;

#[derive(Serialize)]
struct HeaderLineRef<'a> {
    header: &'a TraceHeader,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HeaderLine {
    header: TraceHeader,
}

/// The key being written where a truncated JSON line stops: the last complete `"key":`,
/// or the partial key after it. Only used to name the field of a truncated line.
fn key_at_end(bytes: &[u8]) -> Option<String> {
    let mut last_key: Option<(usize, usize)> = None;
    let mut i = 0;
    let mut open: Option<usize> = None;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if open.is_some() => i += 1,
            b'"' => match open.take() {
                None => open = Some(i + 1),
                Some(start) => {
                    let mut j = i + 1;
                    while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                        j += 1;
                    }
                    if j < bytes.len() && bytes[j] == b':' {
                        last_key = Some((start, i));
                    }
                }
            },
            _ => {}
        }
        i += 1;
    }
    if let Some(start) = open {
        // Cut inside a string: a key if what precedes its quote is `{` or `,`.
        let before = bytes[..start - 1]
            .iter()
            .rev()
            .find(|b| !b.is_ascii_whitespace());
        if matches!(before, Some(b'{') | Some(b',')) {
            return Some(String::from_utf8_lossy(&bytes[start..]).into_owned());
        }
    }
    last_key.map(|(a, b)| String::from_utf8_lossy(&bytes[a..b]).into_owned())
}

fn join(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_string()
    } else {
        format!("{path}.{name}")
    }
}

/// Turn a serde_json error found while parsing one line into (field, problem).
pub(crate) fn describe_json_error(path: &str, err: &serde_json::Error, line: &[u8]) -> FieldError {
    let full = err.to_string();
    // serde_json appends " at line L column C"; the line is ours to report, keep the column.
    let msg = match full.rfind(" at line ") {
        Some(i) => &full[..i],
        None => full.as_str(),
    };
    let path = if path == "." { "" } else { path };
    let quoted = |prefix: &str| -> Option<String> {
        let rest = &msg[msg.find(prefix)? + prefix.len()..];
        Some(rest[..rest.find('`')?].to_string())
    };
    let mut field = path.to_string();
    if let Some(name) = quoted("missing field `") {
        field = join(path, &name);
    } else if let Some(name) = quoted("unknown field `") {
        if !(path == name || path.ends_with(&format!(".{name}"))) {
            field = join(path, &name);
        }
    }
    if err.is_eof() && (field.is_empty() || field == "?" || field.ends_with(".?")) {
        if let Some(k) = key_at_end(line) {
            let base = field.trim_end_matches('?').trim_end_matches('.');
            field = join(base, &k);
        }
    }
    let problem = if err.is_eof() {
        format!(
            "{msg} (column {}): the line is truncated, expected a complete JSON object",
            err.column()
        )
    } else if err.is_syntax() {
        format!("{msg} (column {}): expected valid JSON", err.column())
    } else {
        format!("{msg} (column {})", err.column())
    };
    if field.is_empty() || field == "?" {
        field = "(record)".to_string();
    }
    FieldError::new(field, problem)
}

/// Parse one JSON line into `T`, naming the field of any error.
pub(crate) fn parse_line<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, FieldError> {
    // Fast path without path tracking; a bad line is parsed again to name the field.
    if let Ok(v) = serde_json::from_slice(bytes) {
        return Ok(v);
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T = match serde_path_to_error::deserialize(&mut de) {
        Ok(v) => v,
        Err(e) => {
            let path = e.path().to_string();
            return Err(describe_json_error(&path, e.inner(), bytes));
        }
    };
    if let Err(e) = de.end() {
        return Err(describe_json_error("", &e, bytes));
    }
    Ok(value)
}

/// Parse and check a header line (line 1 of a JSONL trace).
fn parse_header(line: &[u8]) -> Result<TraceHeader, FieldError> {
    // Look at the version first so that a newer file says "unknown schema version"
    // rather than complaining about a field it added.
    let value: serde_json::Value = parse_line(line).map_err(|e| FieldError {
        field: if e.field == "(record)" {
            "header".into()
        } else {
            e.field
        },
        problem: e.problem,
    })?;
    let Some(h) = value.get("header") else {
        return Err(FieldError::new(
            "header",
            "expected the first line to be {\"header\": {...}} (schema_version, block_size_tokens, generator, ...)",
        ));
    };
    match h.get("schema_version") {
        Some(v) => match v.as_u64() {
            Some(n) if n == u64::from(SCHEMA_VERSION) => {}
            Some(n) => {
                return Err(FieldError::new(
                    "header.schema_version",
                    format!("unknown schema version {n}, expected {SCHEMA_VERSION}"),
                ))
            }
            None => {
                return Err(FieldError::new(
                    "header.schema_version",
                    format!("expected an unsigned integer, found {v}"),
                ))
            }
        },
        None => {
            return Err(FieldError::new(
                "header.schema_version",
                "missing; expected an unsigned integer",
            ))
        }
    }
    let hl: HeaderLine = parse_line(line)?;
    hl.header.check()?;
    Ok(hl.header)
}

/// Streaming JSONL trace reader.
pub struct JsonlReader<R: BufRead> {
    input: R,
    file: PathBuf,
    header: TraceHeader,
    validator: Validator,
    line_no: u64,
    buf: Vec<u8>,
    done: bool,
}

impl JsonlReader<BufReader<File>> {
    /// Open a JSONL trace file and read its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let f = File::open(path).map_err(|e| TraceError::io(path, e))?;
        Self::from_reader(BufReader::with_capacity(1 << 16, f), path)
    }
}

/// Read one line into `buf` (without the newline); `Ok(false)` at end of input.
pub(crate) fn read_line<R: BufRead>(
    input: &mut R,
    buf: &mut Vec<u8>,
    file: &Path,
    line_no: u64,
) -> Result<bool, TraceError> {
    buf.clear();
    // read_until retries on interruption itself; the limit guards against binary input.
    let taken = <&mut R as std::io::Read>::take(&mut *input, MAX_LINE_BYTES as u64 + 1)
        .read_until(b'\n', buf);
    let n = taken.map_err(|e| TraceError::io(file, e))?;
    if n == 0 {
        return Ok(false);
    }
    if buf.len() > MAX_LINE_BYTES {
        return Err(TraceError::invalid(
            file,
            Location::Line(line_no),
            "(record)",
            format!("line longer than {MAX_LINE_BYTES} bytes; expected one JSON object per line"),
        ));
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    Ok(true)
}

pub(crate) fn is_blank(buf: &[u8]) -> bool {
    buf.iter().all(|b| b.is_ascii_whitespace())
}

/// The public trace whose first line `line` is, if it is one moonagent imports: a
/// Mooncake FAST'25 record (a JSON object with `hash_ids`, or with `timestamp` and
/// `input_length`, and no `header`) or an Azure CSV header row (`TIMESTAMP`,
/// `ContextTokens`, `GeneratedTokens`, and `NumImages` for the multimodal one).
pub(crate) fn raw_trace_kind(line: &[u8]) -> Option<ImportKind> {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if let Ok(serde_json::Value::Object(m)) = serde_json::from_slice::<serde_json::Value>(line) {
        let mooncake = !m.contains_key("header")
            && (m.contains_key("hash_ids")
                || (m.contains_key("timestamp") && m.contains_key("input_length")));
        return mooncake.then_some(ImportKind::Mooncake);
    }
    let text = std::str::from_utf8(line).ok()?;
    let cols: Vec<&str> = text.split(',').map(str::trim).collect();
    let has = |c: &str| cols.iter().any(|x| x.eq_ignore_ascii_case(c));
    if !(has("TIMESTAMP") && has("ContextTokens") && has("GeneratedTokens")) {
        return None;
    }
    Some(if has("NumImages") {
        ImportKind::AzureMm
    } else {
        ImportKind::AzureLlm
    })
}

impl<R: BufRead> JsonlReader<R> {
    /// Read a JSONL trace from any buffered reader; `file` names it in errors.
    pub fn from_reader(mut input: R, file: impl AsRef<Path>) -> Result<Self, TraceError> {
        let file = file.as_ref().to_path_buf();
        let mut buf = Vec::new();
        if !read_line(&mut input, &mut buf, &file, 1)? || is_blank(&buf) {
            return Err(TraceError::invalid(
                &file,
                Location::Line(1),
                "header",
                "the file is empty; expected a first line {\"header\": {...}}",
            ));
        }
        let header = parse_header(&buf).map_err(|e| match raw_trace_kind(&buf) {
            Some(kind) => TraceError::not_imported(&file, kind),
            None => e.at(&file, Location::Line(1)),
        })?;
        Ok(Self {
            validator: Validator::new(&header),
            input,
            file,
            header,
            line_no: 1,
            buf,
            done: false,
        })
    }

    /// The trace header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// The file name used in errors.
    pub fn path(&self) -> &Path {
        &self.file
    }

    fn next_inner(&mut self) -> Result<Option<Request>, TraceError> {
        loop {
            self.line_no += 1;
            if !read_line(&mut self.input, &mut self.buf, &self.file, self.line_no)? {
                return Ok(None);
            }
            if is_blank(&self.buf) {
                continue;
            }
            let at = Location::Line(self.line_no);
            let req: Request = parse_line(&self.buf).map_err(|e| e.at(&self.file, at))?;
            self.validator
                .check(&req)
                .map_err(|e| e.at(&self.file, at))?;
            return Ok(Some(req));
        }
    }
}

/// Input bytes a round of [`JsonlReader::collect_parallel`] parses (whole lines; a line
/// longer than this makes its round longer).
const WINDOW_BYTES: usize = 8 << 20;

/// What one thread made of its share of a round's lines.
struct ChunkOut {
    /// Requests with their line's index in the chunk.
    reqs: Vec<(usize, Request)>,
    /// The chunk's first bad line (its index) and what is wrong; the chunk stops there.
    err: Option<(usize, FieldError)>,
    /// Lines in the chunk.
    lines: usize,
}

/// Parse whole lines (each ended by `\n`, the last one also by the end of input when
/// `eof`), as [`JsonlReader`]'s iteration does line by line: `\r\n` endings, blank lines
/// skipped, the line length guard.
fn parse_chunk(chunk: &[u8], eof: bool) -> ChunkOut {
    let mut out = ChunkOut {
        reqs: Vec::new(),
        err: None,
        lines: 0,
    };
    let mut rest = chunk;
    while !rest.is_empty() {
        let (line, nl) = match rest.iter().position(|&b| b == b'\n') {
            Some(p) => (&rest[..p], 1),
            None => (rest, 0),
        };
        rest = &rest[line.len() + nl..];
        let i = out.lines;
        out.lines += 1;
        // `read_line` takes at most MAX_LINE_BYTES + 1 bytes, newline included.
        if line.len() + nl > MAX_LINE_BYTES {
            out.err = Some((
                i,
                FieldError::new(
                    "(record)",
                    format!(
                        "line longer than {MAX_LINE_BYTES} bytes; expected one JSON object per line"
                    ),
                ),
            ));
            return out;
        }
        debug_assert!(nl == 1 || eof, "a round ends with a whole line");
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if is_blank(line) {
            continue;
        }
        match parse_line::<Request>(line) {
            Ok(r) => out.reqs.push((i, r)),
            Err(e) => {
                out.err = Some((i, e));
                return out;
            }
        }
    }
    out
}

/// `block` cut into at most `n` pieces of whole lines.
fn split_lines(block: &[u8], n: usize) -> Vec<&[u8]> {
    let mut pieces = Vec::with_capacity(n);
    let mut rest = block;
    for k in (1..=n).rev() {
        if rest.is_empty() {
            break;
        }
        let want = (rest.len() / k).max(1);
        let cut = match rest[want - 1..].iter().position(|&b| b == b'\n') {
            Some(p) if k > 1 => want + p,
            _ => rest.len(),
        };
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    pieces
}

impl<R: BufRead> JsonlReader<R> {
    /// Every remaining request: the input is read a window at a time, each window's lines
    /// parsed on up to `threads` threads and validated in file order, so the result (the
    /// requests, or the first error with its line) is exactly what iterating the reader
    /// gives. Memory: a window of input besides the requests.
    pub fn collect_parallel(self, threads: usize) -> Result<Vec<Request>, TraceError> {
        self.collect_windows(threads, WINDOW_BYTES)
    }

    fn collect_windows(
        mut self,
        threads: usize,
        window: usize,
    ) -> Result<Vec<Request>, TraceError> {
        let mut out = Vec::new();
        if self.done {
            return Ok(out);
        }
        self.done = true;
        let threads = threads.max(1);
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        let mut eof = false;
        while !eof {
            // Read until the window holds a whole line past `window` bytes, or the end.
            let mut want = window.max(1);
            let end = loop {
                let need = want.saturating_sub(buf.len()).max(1) as u64;
                let n = (&mut self.input)
                    .take(need)
                    .read_to_end(&mut buf)
                    .map_err(|e| TraceError::io(&self.file, e))?;
                if n == 0 {
                    eof = true;
                    break buf.len();
                }
                if let Some(p) = buf.iter().rposition(|&b| b == b'\n') {
                    break p + 1;
                }
                if buf.len() > MAX_LINE_BYTES {
                    // A line without its end past the guard: the iteration's error.
                    break buf.len();
                }
                want = buf.len() + window.max(1);
            };
            let block = &buf[..end];
            let pieces = split_lines(block, threads);
            let outs: Vec<ChunkOut> = if pieces.len() <= 1 {
                pieces.iter().map(|p| parse_chunk(p, eof)).collect()
            } else {
                std::thread::scope(|sc| {
                    let handles: Vec<_> = pieces[1..]
                        .iter()
                        .map(|p| sc.spawn(move || parse_chunk(p, eof)))
                        .collect();
                    let mut v = vec![parse_chunk(pieces[0], eof)];
                    v.extend(
                        handles
                            .into_iter()
                            .map(|h| h.join().expect("a trace parsing thread panicked")),
                    );
                    v
                })
            };
            for c in outs {
                let base = self.line_no + 1;
                for (i, r) in c.reqs {
                    let at = Location::Line(base + i as u64);
                    self.validator.check(&r).map_err(|e| e.at(&self.file, at))?;
                    out.push(r);
                }
                if let Some((i, e)) = c.err {
                    return Err(e.at(&self.file, Location::Line(base + i as u64)));
                }
                self.line_no += c.lines as u64;
            }
            buf.drain(..end);
        }
        Ok(out)
    }
}

impl<R: BufRead> Iterator for JsonlReader<R> {
    type Item = Result<Request, TraceError>;

    /// The next request; after the first error the stream ends.
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = self.next_inner();
        crate::end_on_error(&mut self.done, step)
    }
}

/// Streaming JSONL trace writer; validates what it writes.
pub struct JsonlWriter<W: Write> {
    out: W,
    file: PathBuf,
    validator: Validator,
    written: u64,
}

impl JsonlWriter<BufWriter<File>> {
    /// Create `path` and write the header line.
    pub fn create(path: impl AsRef<Path>, header: &TraceHeader) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let f = File::create(path).map_err(|e| TraceError::io(path, e))?;
        Self::new(BufWriter::with_capacity(1 << 16, f), path, header)
    }
}

impl<W: Write> JsonlWriter<W> {
    /// Write a trace to any writer; `file` names it in errors.
    pub fn new(
        mut out: W,
        file: impl AsRef<Path>,
        header: &TraceHeader,
    ) -> Result<Self, TraceError> {
        let file = file.as_ref().to_path_buf();
        header.check().map_err(|e| e.at(&file, Location::File))?;
        serde_json::to_writer(&mut out, &HeaderLineRef { header })
            .map_err(|e| TraceError::io(&file, e.into()))?;
        out.write_all(b"\n").map_err(|e| TraceError::io(&file, e))?;
        Ok(Self {
            out,
            validator: Validator::new(header),
            file,
            written: 0,
        })
    }

    /// Validate and append one request.
    pub fn write(&mut self, r: &Request) -> Result<(), TraceError> {
        self.validator
            .check(r)
            .map_err(|e| e.at(&self.file, Location::Request(self.written + 1)))?;
        serde_json::to_writer(&mut self.out, r)
            .map_err(|e| TraceError::io(&self.file, e.into()))?;
        self.out
            .write_all(b"\n")
            .map_err(|e| TraceError::io(&self.file, e))?;
        self.written += 1;
        Ok(())
    }

    /// Requests written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Flush and return the inner writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.out
            .flush()
            .map_err(|e| TraceError::io(&self.file, e))?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{Generated, GeneratorKind};
    use proptest::prelude::*;

    /// A valid JSONL trace of `n` W4 requests (forks, images, prefix blocks).
    fn trace(n: usize) -> Vec<u8> {
        let g = Generated::new(
            GeneratorKind::W4,
            None,
            &[("requests".into(), n.to_string())],
            3,
        )
        .unwrap();
        let mut w = JsonlWriter::new(Vec::new(), "t.jsonl", &g.header).unwrap();
        for r in g.requests {
            w.write(&r.unwrap()).unwrap();
        }
        w.finish().unwrap()
    }

    /// What iterating gives: the requests, or the first error's text.
    fn iterated(bytes: &[u8]) -> Result<Vec<Request>, String> {
        let r = JsonlReader::from_reader(bytes, "t.jsonl").map_err(|e| e.to_string())?;
        r.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())
    }

    fn windowed(bytes: &[u8], threads: usize, window: usize) -> Result<Vec<Request>, String> {
        let r = JsonlReader::from_reader(bytes, "t.jsonl").map_err(|e| e.to_string())?;
        r.collect_windows(threads, window)
            .map_err(|e| e.to_string())
    }

    /// An edit of a trace's lines after the header: what real files and broken ones do.
    #[derive(Debug, Clone)]
    enum Edit {
        Blank(usize),
        Crlf(usize),
        Garble(usize, usize),
        Truncate(usize, usize),
        Swap(usize),
        NoFinalNewline,
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (0usize..64).prop_map(Edit::Blank),
            (0usize..64).prop_map(Edit::Crlf),
            (0usize..64, 0usize..400).prop_map(|(l, c)| Edit::Garble(l, c)),
            (0usize..64, 0usize..400).prop_map(|(l, c)| Edit::Truncate(l, c)),
            (0usize..64).prop_map(Edit::Swap),
            Just(Edit::NoFinalNewline),
        ]
    }

    fn apply(bytes: &[u8], edits: &[Edit]) -> Vec<u8> {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let mut lines: Vec<Vec<u8>> = text.lines().map(|l| l.as_bytes().to_vec()).collect();
        let mut final_newline = true;
        let n = lines.len();
        for e in edits {
            // Line 0 is the header: edits start at line 1.
            let at = |l: usize| 1 + l % (n - 1);
            match *e {
                Edit::Blank(l) => lines.insert(at(l), b"  ".to_vec()),
                Edit::Crlf(l) => lines[at(l)].push(b'\r'),
                Edit::Garble(l, c) => {
                    let line = &mut lines[at(l)];
                    if !line.is_empty() {
                        let c = c % line.len();
                        line[c] = b'#';
                    }
                }
                Edit::Truncate(l, c) => {
                    let line = &mut lines[at(l)];
                    let c = c % (line.len() + 1);
                    line.truncate(c);
                }
                Edit::Swap(l) => {
                    let a = at(l);
                    if a + 1 < lines.len() {
                        lines.swap(a, a + 1);
                    }
                }
                Edit::NoFinalNewline => final_newline = false,
            }
        }
        let mut out = lines.join(&b'\n');
        if final_newline {
            out.push(b'\n');
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Parsed in windows on threads, a trace gives exactly what iterating gives: the
        /// same requests, or the same first error (line and text), whatever the edits,
        /// window sizes (lines straddling windows) and thread counts.
        #[test]
        fn windows_on_threads_read_what_iterating_reads(
            edits in proptest::collection::vec(edit(), 0..4),
            threads in 1usize..5,
            window in prop_oneof![1usize..300, Just(WINDOW_BYTES)],
        ) {
            let bytes = apply(&trace(40), &edits);
            let want = iterated(&bytes);
            prop_assert_eq!(windowed(&bytes, threads, window), want);
        }
    }

    #[test]
    fn a_clean_trace_reads_whole_in_parallel() {
        let bytes = trace(300);
        let want = iterated(&bytes).unwrap();
        assert_eq!(want.len(), 300);
        for threads in 1..5 {
            let r = JsonlReader::from_reader(&bytes[..], "t.jsonl").unwrap();
            assert_eq!(r.collect_parallel(threads).unwrap(), want);
        }
    }
}

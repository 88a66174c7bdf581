//! Azure LLM inference traces (CSV).
//!
//! - LLM: header `TIMESTAMP,ContextTokens,GeneratedTokens`;
//! - multimodal: header `TIMESTAMP,NumImages,ContextTokens,GeneratedTokens`.
//!
//! `TIMESTAMP` is a date-time such as `2023-11-16 18:15:46.6805900` (up to 9 fractional
//! digits, optional `T`, optional `Z` or `+HH:MM` offset), or plain seconds; arrivals are
//! relative to the first record, in exact integer nanoseconds. Azure traces carry no
//! prefix information, so requests have no `prompt_blocks`. In the multimodal trace,
//! `ContextTokens` is taken to include the images' visual tokens: `NumImages` images are
//! drawn from the attach config (sizes, repeat rate, seed) and, if they would not fit in
//! the context, replaced by token-only images sharing it equally.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use super::{check_imported, one_turn, AttachImages, Attacher};
use crate::error::{Location, TraceError, ValueError};
use crate::jsonl::{is_blank, read_line};
use crate::schema::{Request, TraceHeader, Validator};

/// Which Azure CSV layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AzureKind {
    /// `TIMESTAMP,ContextTokens,GeneratedTokens`.
    Llm,
    /// `TIMESTAMP,NumImages,ContextTokens,GeneratedTokens`.
    Multimodal,
}

impl AzureKind {
    fn columns(self) -> &'static [&'static str] {
        match self {
            AzureKind::Llm => &["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
            AzureKind::Multimodal => {
                &["TIMESTAMP", "NumImages", "ContextTokens", "GeneratedTokens"]
            }
        }
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn num<T: std::str::FromStr>(s: &str, what: &'static str) -> Result<T, ValueError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ValueError::expected(
            format!("{what} digits"),
            format!("{s:?}"),
        ));
    }
    s.parse().map_err(|_| ValueError::OutOfRange {
        what,
        text: s.to_string(),
    })
}

/// Parse a timestamp into nanoseconds since the Unix epoch (or since 0 for plain seconds).
pub fn parse_timestamp_ns(s: &str) -> Result<i128, ValueError> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<f64>() {
        if secs.is_finite() && secs >= 0.0 {
            return Ok((secs * 1e9).round() as i128);
        }
        return Err(ValueError::expected(
            "a date-time or non-negative seconds",
            format!("{s:?}"),
        ));
    }
    let b = s.as_bytes();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b' ' || b[10] == b'T')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(ValueError::expected(
            "YYYY-MM-DD HH:MM:SS[.fraction]",
            format!("{s:?}"),
        ));
    }
    let y: i64 = num(&s[0..4], "year")?;
    let mo: u32 = num(&s[5..7], "month")?;
    let d: u32 = num(&s[8..10], "day")?;
    let h: i64 = num(&s[11..13], "hour")?;
    let mi: i64 = num(&s[14..16], "minute")?;
    let se: i64 = num(&s[17..19], "second")?;
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return Err(ValueError::DateTimeRange(s.to_string()));
    }
    let mut rest = &s[19..];
    let mut frac_ns: i128 = 0;
    if let Some(r) = rest.strip_prefix('.') {
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 9 {
            return Err(ValueError::ExpectedIn {
                expected: "1 to 9 fractional digits",
                value: s.to_string(),
            });
        }
        let digits: i128 = num(&r[..n], "fraction")?;
        frac_ns = digits * 10i128.pow(9 - n as u32);
        rest = &r[n..];
    }
    let offset_s: i64 = match rest {
        "" | "Z" | "z" => 0,
        r if r.starts_with('+') || r.starts_with('-') => {
            let sign = if r.starts_with('-') { -1 } else { 1 };
            let t = r[1..].replace(':', "");
            if t.len() != 4 {
                return Err(ValueError::ExpectedIn {
                    expected: "a +HH:MM offset",
                    value: s.to_string(),
                });
            }
            let oh: i64 = num(&t[0..2], "offset hour")?;
            let om: i64 = num(&t[2..4], "offset minute")?;
            sign * (oh * 3600 + om * 60)
        }
        other => {
            return Err(ValueError::Trailing {
                rest: other.to_string(),
                value: s.to_string(),
            })
        }
    };
    let secs = days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + se - offset_s;
    Ok(i128::from(secs) * 1_000_000_000 + frac_ns)
}

/// Streaming Azure CSV importer: an iterator of checked requests.
pub struct AzureImport<R: BufRead> {
    kind: AzureKind,
    input: R,
    file: PathBuf,
    header: TraceHeader,
    validator: Validator,
    attach: Option<Attacher>,
    first_ns: Option<i128>,
    line_no: u64,
    buf: Vec<u8>,
    next_id: u64,
    done: bool,
}

impl AzureImport<BufReader<File>> {
    /// Open an Azure CSV trace. For the multimodal kind `attach` sets how images are drawn
    /// (default config when `None`); for the LLM kind it attaches images as for Mooncake.
    pub fn open(
        path: impl AsRef<Path>,
        kind: AzureKind,
        attach: Option<AttachImages>,
    ) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let f = File::open(path).map_err(|e| TraceError::io(path, e))?;
        Self::from_reader(BufReader::with_capacity(1 << 16, f), path, kind, attach)
    }
}

fn split_csv(line: &str) -> Vec<&str> {
    line.split(',')
        .map(|c| c.trim().trim_matches('"').trim())
        .collect()
}

impl<R: BufRead> AzureImport<R> {
    /// Import from any reader; `file` names it in errors. Reads the CSV header now.
    pub fn from_reader(
        mut input: R,
        file: impl AsRef<Path>,
        kind: AzureKind,
        attach: Option<AttachImages>,
    ) -> Result<Self, TraceError> {
        let file = file.as_ref().to_path_buf();
        let want = kind.columns();
        let mut buf = Vec::new();
        let mut line_no = 0;
        loop {
            line_no += 1;
            if !read_line(&mut input, &mut buf, &file, line_no)? {
                return Err(TraceError::invalid(
                    &file,
                    Location::Line(line_no),
                    "(header)",
                    format!(
                        "the file is empty; expected a header row {}",
                        want.join(",")
                    ),
                ));
            }
            if !is_blank(&buf) {
                break;
            }
        }
        let text = String::from_utf8_lossy(&buf);
        let cols = split_csv(&text);
        let ok = cols.len() == want.len()
            && cols
                .iter()
                .zip(want)
                .all(|(a, b)| a.eq_ignore_ascii_case(b));
        if !ok {
            return Err(TraceError::invalid(
                &file,
                Location::Line(line_no),
                "(header)",
                format!(
                    "found {:?}; expected the header row {}",
                    short(&text),
                    want.join(",")
                ),
            ));
        }
        let (gen, src) = match kind {
            AzureKind::Llm => ("import-azure-llm", "Azure LLM inference trace"),
            AzureKind::Multimodal => ("import-azure-mm", "Azure multimodal inference trace"),
        };
        let mut header = TraceHeader::new(gen, 512);
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        header.source = Some(format!("{src} {name}"));
        let attach = match (kind, attach) {
            (AzureKind::Multimodal, a) => Some(a.unwrap_or_default()),
            (AzureKind::Llm, a) => a,
        };
        if let Some(a) = &attach {
            header.seed = Some(a.seed);
            header.notes = Some(a.describe());
            header.config = serde_json::to_value(a).ok();
        }
        Ok(Self {
            kind,
            validator: Validator::new(&header),
            attach: attach.map(Attacher::new).transpose()?,
            input,
            file,
            header,
            first_ns: None,
            line_no,
            buf,
            next_id: 0,
            done: false,
        })
    }

    /// The header of the imported trace.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    fn column_u32(&self, cols: &[&str], k: usize, at: Location) -> Result<u32, TraceError> {
        let name = self.kind.columns()[k];
        let s = cols[k];
        if let Some(rest) = s.strip_prefix('-') {
            if !rest.is_empty() {
                return Err(TraceError::invalid(
                    &self.file,
                    at,
                    name,
                    format!("negative length {s}; expected a non-negative integer"),
                ));
            }
        }
        s.parse::<u32>().map_err(|_| {
            TraceError::invalid(
                &self.file,
                at,
                name,
                format!(
                    "expected a non-negative integer (u32), found {:?}",
                    short(s)
                ),
            )
        })
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
            let text = String::from_utf8_lossy(&self.buf).into_owned();
            let cols = split_csv(&text);
            let want = self.kind.columns();
            if cols.len() != want.len() {
                return Err(TraceError::invalid(
                    &self.file,
                    at,
                    "(row)",
                    format!(
                        "{} columns; expected {}: {}",
                        cols.len(),
                        want.len(),
                        want.join(",")
                    ),
                ));
            }
            let ts = parse_timestamp_ns(cols[0])
                .map_err(|p| TraceError::invalid(&self.file, at, "TIMESTAMP", p.to_string()))?;
            let first = *self.first_ns.get_or_insert(ts);
            if ts < first {
                return Err(TraceError::invalid(
                    &self.file,
                    at,
                    "TIMESTAMP",
                    format!("timestamps out of order: {} is before the first record; expected non-decreasing times", cols[0]),
                ));
            }
            let arrival_ns = u64::try_from(ts - first).map_err(|_| {
                TraceError::invalid(
                    &self.file,
                    at,
                    "TIMESTAMP",
                    "more than 584 years after the first record",
                )
            })?;
            let (n_images, ctx, gen) = match self.kind {
                AzureKind::Llm => (
                    None,
                    self.column_u32(&cols, 1, at)?,
                    self.column_u32(&cols, 2, at)?,
                ),
                AzureKind::Multimodal => (
                    Some(self.column_u32(&cols, 1, at)?),
                    self.column_u32(&cols, 2, at)?,
                    self.column_u32(&cols, 3, at)?,
                ),
            };
            let images = match (self.attach.as_mut(), n_images) {
                (Some(a), Some(n)) => a.exact(ctx, n).ok_or_else(|| {
                    TraceError::invalid(
                        &self.file,
                        at,
                        "NumImages",
                        format!("{n} images in a context of {ctx} tokens; expected at least one token per image"),
                    )
                })?,
                (Some(a), None) => a.images(ctx, None),
                (None, _) => Vec::new(),
            };
            let req = one_turn(self.next_id, arrival_ns, ctx, Vec::new(), images, gen);
            check_imported(&mut self.validator, &req, &self.file, at, "TIMESTAMP")?;
            self.next_id += 1;
            return Ok(Some(req));
        }
    }
}

fn short(s: &str) -> String {
    s.chars().take(60).collect()
}

impl<R: BufRead> Iterator for AzureImport<R> {
    type Item = Result<Request, TraceError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let step = self.next_inner();
        crate::end_on_error(&mut self.done, step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_exactly() {
        let a = parse_timestamp_ns("2023-11-16 18:15:46.6805900").unwrap();
        let b = parse_timestamp_ns("2023-11-16 18:15:46.6805901").unwrap();
        assert_eq!(b - a, 100);
        assert_eq!(
            parse_timestamp_ns("1970-01-01T00:00:01Z").unwrap(),
            1_000_000_000
        );
        assert_eq!(parse_timestamp_ns("1970-01-01 01:00:00+01:00").unwrap(), 0);
        assert_eq!(
            parse_timestamp_ns("2000-03-01 00:00:00").unwrap(),
            951_868_800 * 1_000_000_000
        );
        assert!(parse_timestamp_ns("yesterday").is_err());
        assert!(parse_timestamp_ns("2023-13-01 00:00:00").is_err());
    }
}

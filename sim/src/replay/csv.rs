//! libCacheSim's csv traces (`--trace-format csv`), read with libCacheSim's own reader
//! options, given the way its CLI takes them (`--trace-type-params "time-col=1,obj-id-col=2,
//! obj-size-col=3,delimiter=,,has-header=true,obj-id-is-num=true"`; columns from 1).
//!
//! Semantics, libCacheSim's (`traceReader/reader.c`'s `parse_reader_params`,
//! `generalReader/csv.c`), with where this reader is stricter:
//! - parameters: `key=value` separated by commas (spaces after a comma skipped, `_` in a
//!   key read as `-`, keys case-insensitive); `delimiter=,,` and `delimiter=\,` mean a
//!   comma, `delimiter=\t` a tab; booleans `true/1/yes/y` or `false/0/no/n`. `obj-id-col`
//!   is required; `time-col` and `obj-size-col` are optional (time 0, size 1 without them).
//!   libCacheSim's other csv keys (`op-col`, `ttl-col`, `tenant-col`, ...) are refused by
//!   name rather than ignored, since they would change what libCacheSim replays.
//! - no `delimiter`: detected from the first line (the most frequent of tab, comma, `|`,
//!   `:`, weighted 4/3/2/1 as libCacheSim does; a comma when none occurs, a one-column
//!   file); no `has-header`: detected (the first line is data when it has more digits than
//!   letters, libCacheSim's rule).
//! - the object id: with `obj-id-is-num=true` an unsigned integer read as C's `strtoull`
//!   base 0 reads it (`0x` hexadecimal, a leading `0` octal, else decimal), the whole field
//!   (libCacheSim warns and reads a prefix; this reader refuses); otherwise the field's
//!   bytes hashed (xxh3-64: deterministic, the same on every platform; libCacheSim interns
//!   the strings instead, which numbers them differently but maps equal ids to equal
//!   objects, so hit counts agree). Without `obj-id-is-num` the first data line decides:
//!   numeric ids are read as numbers (libCacheSim stops and asks for the flag).
//! - time: a decimal number of seconds below 2^32 (libCacheSim's `atof`, truncated, and
//!   its `ts < UINT32_MAX` assertion), kept as whole seconds and, as for oracleGeneral,
//!   clamped to be non-decreasing; size: an unsigned 32-bit integer (`strtoul` base 0).
//! - fields: spaces and tabs around a field are trimmed (libcsv's default), a field may be
//!   double-quoted with `""` for a quote; a quoted field cannot span lines (refused). A line
//!   ending in `\r\n` is read without the `\r`; blank lines are skipped (libcsv emits no row
//!   for them). Columns past the last one used are not read.
//!
//! Each row becomes one access of data type `general` (no miss penalty, tenant 0), as an
//! oracleGeneral record does. Every bad line is refused with its line number (from 1),
//! column and what was expected; no input panics the reader (a property test).

use std::borrow::Cow;

use moonagent_core::store::DataType;

use super::{Access, Compiled, NEVER};

/// libCacheSim's csv reader options (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CsvParams {
    /// Column of the timestamp (seconds), from 1.
    pub time_col: Option<u32>,
    /// Column of the object id, from 1.
    pub obj_id_col: u32,
    /// Column of the object size (bytes), from 1.
    pub obj_size_col: Option<u32>,
    /// The field separator; detected when `None`.
    pub delimiter: Option<u8>,
    /// Whether the first line is a header; detected when `None`.
    pub has_header: Option<bool>,
    /// Whether ids are numbers (else hashed); detected from the first data line when `None`.
    pub obj_id_is_num: Option<bool>,
}

/// Why a csv trace or its options could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CsvError {
    /// `--trace-type-params` is malformed.
    #[error("--trace-type-params: {0}")]
    Params(String),
    /// A field of a line could not be read.
    #[error("line {line}, column {column} ({field}): expected {expected}, found {found:?}")]
    Field {
        /// Line number, from 1.
        line: usize,
        /// Column number, from 1.
        column: u32,
        /// Which option named the column (`obj-id-col`, ...).
        field: &'static str,
        /// What the field must hold.
        expected: String,
        /// The field as read (at most 40 characters).
        found: String,
    },
    /// A line could not be split into fields, or is short of a column.
    #[error("line {line}: {reason}")]
    Line {
        /// Line number, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

fn is_true(key: &str, v: &str) -> Result<bool, CsvError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "y" => Ok(true),
        "false" | "0" | "no" | "n" => Ok(false),
        _ => Err(CsvError::Params(format!(
            "{key}={v}: expected true/false (or 1/0, yes/no)"
        ))),
    }
}

fn column(key: &str, v: &str) -> Result<u32, CsvError> {
    match v.trim().parse::<u32>() {
        Ok(c) if c >= 1 => Ok(c),
        _ => Err(CsvError::Params(format!(
            "{key}={v}: expected a column number from 1"
        ))),
    }
}

impl CsvParams {
    /// Parse libCacheSim's `--trace-type-params` string (see the module docs).
    pub fn parse(s: &str) -> Result<Self, CsvError> {
        let mut p = CsvParams::default();
        let mut id_col = None;
        let mut rest = s.trim_start_matches([' ', ',']);
        while !rest.is_empty() {
            let Some((key, after)) = rest.split_once('=') else {
                return Err(CsvError::Params(format!(
                    "{rest:?}: expected key=value (keys: time-col, obj-id-col, obj-size-col, \
                     delimiter, has-header, obj-id-is-num)"
                )));
            };
            let (value, after) = after.split_once(',').unwrap_or((after, ""));
            rest = after.trim_start_matches([' ', ',']);
            let key = key.trim().replace('_', "-").to_ascii_lowercase();
            match key.as_str() {
                "time-col" => p.time_col = Some(column(&key, value)?),
                "obj-id-col" => id_col = Some(column(&key, value)?),
                "obj-size-col" | "size-col" => p.obj_size_col = Some(column(&key, value)?),
                "obj-id-is-num" => p.obj_id_is_num = Some(is_true(&key, value)?),
                "has-header" | "header" => p.has_header = Some(is_true(&key, value)?),
                "delimiter" => {
                    p.delimiter = Some(match value.as_bytes() {
                        // `delimiter=,,`: the comma ended the (empty) value.
                        [] | [b'\\'] | [b'\\', b','] => b',',
                        [b'\\', b't'] => b'\t',
                        [c] if *c != b'\n' && *c != b'"' => *c,
                        _ => {
                            return Err(CsvError::Params(format!(
                                "delimiter={value}: expected one character, \\t, or \
                                 nothing (delimiter=,, is a comma)"
                            )))
                        }
                    })
                }
                "op-col" | "ttl-col" | "cnt-col" | "tenant-col" | "feature-cols"
                | "next-access-col" | "block-size" | "format" => {
                    return Err(CsvError::Params(format!(
                        "{key}: a libCacheSim option moonagent's csv reader does not support \
                         (it reads time-col, obj-id-col, obj-size-col, delimiter, has-header, \
                         obj-id-is-num)"
                    )))
                }
                _ => {
                    return Err(CsvError::Params(format!(
                        "unknown key {key:?} (keys: time-col, obj-id-col, obj-size-col, \
                         delimiter, has-header, obj-id-is-num)"
                    )))
                }
            }
        }
        p.obj_id_col =
            id_col.ok_or_else(|| CsvError::Params("obj-id-col=N is required".to_string()))?;
        Ok(p)
    }

    /// The options as libCacheSim's CLI takes them (every one set explicitly).
    pub fn to_param_string(&self) -> String {
        let mut v = vec![format!("obj-id-col={}", self.obj_id_col)];
        if let Some(c) = self.time_col {
            v.push(format!("time-col={c}"));
        }
        if let Some(c) = self.obj_size_col {
            v.push(format!("obj-size-col={c}"));
        }
        if let Some(h) = self.has_header {
            v.push(format!("has-header={h}"));
        }
        if let Some(n) = self.obj_id_is_num {
            v.push(format!("obj-id-is-num={n}"));
        }
        match self.delimiter {
            Some(b',') => v.push("delimiter=,".to_string()),
            Some(b'\t') => v.push("delimiter=\\t".to_string()),
            Some(d) => v.push(format!("delimiter={}", d as char)),
            None => {}
        }
        v.join(",")
    }
}

/// The first line, at most 1024 bytes (libCacheSim's detectors read as much).
fn first_line(bytes: &[u8]) -> &[u8] {
    let end = bytes
        .iter()
        .position(|&b| b == b'\n')
        .unwrap_or(bytes.len());
    &bytes[..end.min(1024)]
}

/// libCacheSim's delimiter detector: the most frequent of tab, comma, `|`, `:` on the
/// first line, weighted 4, 3, 2, 1; a comma when none occurs.
pub fn detect_delimiter(bytes: &[u8]) -> u8 {
    let line = first_line(bytes);
    let mut best = (0usize, b',');
    for (w, d) in [(4, b'\t'), (3, b','), (2, b'|'), (1, b':')] {
        let n = line.iter().filter(|&&b| b == d).count() * w;
        if n > best.0 {
            best = (n, d);
        }
    }
    best.1
}

/// libCacheSim's header detector: the first line is data when it has more digits than
/// letters, a header when it has more letters (not counting a-f) than digits, else a header.
pub fn detect_header(bytes: &[u8]) -> bool {
    let line = first_line(bytes);
    let digits = line.iter().filter(|b| b.is_ascii_digit()).count();
    let letters = line.iter().filter(|b| b.is_ascii_alphabetic()).count();
    digits <= letters
}

/// C's `strtoull(s, &end, 0)` on the whole of `s`: `0x` hexadecimal, a leading `0` octal,
/// else decimal; `None` unless every byte is used and the value fits.
fn parse_base0(s: &[u8]) -> Option<u64> {
    let (digits, radix) = match s {
        [b'0', b'x' | b'X', rest @ ..] => (rest, 16),
        [b'0', rest @ ..] if !rest.is_empty() => (rest, 8),
        _ => (s, 10),
    };
    if digits.is_empty() {
        return None;
    }
    let mut v: u64 = 0;
    for &b in digits {
        let d = (b as char).to_digit(radix)?;
        v = v.checked_mul(u64::from(radix))?.checked_add(u64::from(d))?;
    }
    Some(v)
}

fn is_blank(b: u8, delim: u8) -> bool {
    (b == b' ' || b == b'\t') && b != delim
}

/// One line's fields, up to column `upto` (from 1): borrowed, or owned when a quoted field
/// held `""`. A line with fewer columns gives fewer fields.
fn split<'a>(
    line: &'a [u8],
    delim: u8,
    upto: usize,
    out: &mut Vec<Cow<'a, [u8]>>,
) -> Result<(), String> {
    out.clear();
    let mut i = 0;
    loop {
        while i < line.len() && is_blank(line[i], delim) {
            i += 1;
        }
        if i < line.len() && line[i] == b'"' {
            // Quoted: up to the closing quote; `""` is a quote.
            let col = out.len() + 1;
            let mut field: Option<Vec<u8>> = None;
            let start = i + 1;
            let mut j = start;
            loop {
                match line[j..].iter().position(|&b| b == b'"') {
                    None => {
                        return Err(format!(
                            "column {col}: unterminated quoted field (a quoted field cannot \
                             span lines)"
                        ))
                    }
                    Some(k) => {
                        let q = j + k;
                        if line.get(q + 1) == Some(&b'"') {
                            field
                                .get_or_insert_with(Vec::new)
                                .extend_from_slice(&line[j..=q]);
                            j = q + 2;
                        } else {
                            let f = match field {
                                Some(mut v) => {
                                    v.extend_from_slice(&line[j..q]);
                                    Cow::Owned(v)
                                }
                                None => Cow::Borrowed(&line[start..q]),
                            };
                            out.push(f);
                            i = q + 1;
                            break;
                        }
                    }
                }
            }
            while i < line.len() && is_blank(line[i], delim) {
                i += 1;
            }
            if i < line.len() && line[i] != delim {
                return Err(format!(
                    "column {col}: expected the delimiter {:?} after a closing quote, found {:?}",
                    delim as char, line[i] as char
                ));
            }
        } else {
            let end = line[i..]
                .iter()
                .position(|&b| b == delim)
                .map_or(line.len(), |k| i + k);
            let mut e = end;
            while e > i && is_blank(line[e - 1], delim) {
                e -= 1;
            }
            out.push(Cow::Borrowed(&line[i..e]));
            i = end;
        }
        if out.len() >= upto || i >= line.len() {
            return Ok(());
        }
        i += 1; // past the delimiter
        if i == line.len() {
            // A trailing delimiter: one more, empty field.
            out.push(Cow::Borrowed(&line[i..]));
            return Ok(());
        }
    }
}

fn shown(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.chars().count() > 40 {
        format!("{}...", s.chars().take(40).collect::<String>())
    } else {
        s.into_owned()
    }
}

impl Compiled {
    /// Compile a libCacheSim csv trace held in memory (see the module docs).
    pub fn from_csv_bytes(bytes: &[u8], p: &CsvParams) -> Result<Self, CsvError> {
        for (k, c) in [
            ("obj-id-col", Some(p.obj_id_col)),
            ("time-col", p.time_col),
            ("obj-size-col", p.obj_size_col),
        ] {
            if c == Some(0) {
                return Err(CsvError::Params(format!(
                    "{k}=0: expected a column number from 1"
                )));
            }
        }
        let delim = p.delimiter.unwrap_or_else(|| detect_delimiter(bytes));
        if delim == b'"' || delim == b'\n' || delim == b'\r' {
            return Err(CsvError::Params(format!(
                "delimiter {:?}: cannot be a quote or a line end",
                delim as char
            )));
        }
        let header = p.has_header.unwrap_or_else(|| detect_header(bytes));
        let upto = [Some(p.obj_id_col), p.time_col, p.obj_size_col]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(1) as usize;
        let general = DataType::General.index() as u8;
        let mut is_num = p.obj_id_is_num;
        let mut accesses: Vec<Access> = Vec::with_capacity(bytes.len() / 16);
        let mut t = 0u64;
        let mut fields: Vec<Cow<'_, [u8]>> = Vec::with_capacity(upto);
        for (idx, raw) in bytes.split(|&b| b == b'\n').enumerate() {
            let line_no = idx + 1;
            if idx == 0 && header {
                continue;
            }
            let line = raw.strip_suffix(b"\r").unwrap_or(raw);
            if line.iter().all(|&b| b == b' ' || b == b'\t') {
                continue;
            }
            split(line, delim, upto, &mut fields).map_err(|reason| CsvError::Line {
                line: line_no,
                reason,
            })?;
            let get = |col: u32, name: &'static str| {
                fields.get(col as usize - 1).ok_or_else(|| CsvError::Line {
                    line: line_no,
                    reason: format!(
                        "{name}={col}, but the line has {} column(s) (delimiter {:?})",
                        fields.len(),
                        delim as char
                    ),
                })
            };
            let bad =
                |col: u32, field: &'static str, expected: &str, found: &[u8]| CsvError::Field {
                    line: line_no,
                    column: col,
                    field,
                    expected: expected.to_string(),
                    found: shown(found),
                };
            let id_field = get(p.obj_id_col, "obj-id-col")?;
            if id_field.is_empty() {
                return Err(bad(p.obj_id_col, "obj-id-col", "an object id", id_field));
            }
            let num = *is_num.get_or_insert_with(|| parse_base0(id_field).is_some());
            let id = if num {
                parse_base0(id_field).ok_or_else(|| {
                    bad(
                        p.obj_id_col,
                        "obj-id-col",
                        if p.obj_id_is_num.is_some() {
                            "an unsigned 64-bit integer (obj-id-is-num=true; set it to \
                             false to hash the ids)"
                        } else {
                            "an unsigned 64-bit integer (the first data line's id was \
                             numeric; set obj-id-is-num=false to hash the ids)"
                        },
                        id_field,
                    )
                })?
            } else {
                xxhash_rust::xxh3::xxh3_64(id_field)
            };
            let size = match p.obj_size_col {
                None => 1,
                Some(c) => {
                    let f = get(c, "obj-size-col")?;
                    parse_base0(f)
                        .and_then(|v| u32::try_from(v).ok())
                        .ok_or_else(|| {
                            bad(c, "obj-size-col", "an unsigned 32-bit integer (bytes)", f)
                        })?
                }
            };
            if let Some(c) = p.time_col {
                let f = get(c, "time-col")?;
                let secs = std::str::from_utf8(f)
                    .ok()
                    .and_then(|s| s.parse::<f64>().ok())
                    .filter(|v| v.is_finite() && *v >= 0.0 && *v < 4_294_967_296.0)
                    .ok_or_else(|| {
                        bad(c, "time-col", "a number of seconds from 0 to below 2^32", f)
                    })?;
                t = t.max(secs.trunc() as u64 * 1_000_000_000);
            }
            if accesses.len() >= NEVER as usize - 1 {
                return Err(CsvError::Line {
                    line: line_no,
                    reason: format!("more than {} requests", NEVER - 1),
                });
            }
            accesses.push(Access::new(t, id, size, 0, general, 0, 0));
        }
        let mut c = Compiled {
            requests: accesses.len() as u64,
            accesses: accesses.into(),
            ..Compiled::default()
        };
        c.fill_next();
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn params(s: &str) -> CsvParams {
        CsvParams::parse(s).unwrap()
    }

    fn ids(c: &Compiled) -> Vec<u64> {
        c.accesses.iter().map(|a| a.id).collect()
    }

    #[test]
    fn params_parse_the_way_libcachesim_takes_them() {
        let p = params(
            "time-col=1,obj-id-col=2,obj-size-col=3,delimiter=,,has-header=true,obj-id-is-num=1",
        );
        assert_eq!(
            p,
            CsvParams {
                time_col: Some(1),
                obj_id_col: 2,
                obj_size_col: Some(3),
                delimiter: Some(b','),
                has_header: Some(true),
                obj_id_is_num: Some(true),
            }
        );
        // Spaces after commas, `_` for `-`, upper case, a trailing `delimiter=,`, `\t`.
        let p = params("time_col=2, OBJ-ID-COL=5, obj-size-col=4, obj-id-is-num=true, delimiter=,");
        assert_eq!(
            (p.time_col, p.obj_id_col, p.delimiter),
            (Some(2), 5, Some(b','))
        );
        assert_eq!(params("obj-id-col=1,delimiter=\\t").delimiter, Some(b'\t'));
        assert_eq!(params("obj-id-col=1,delimiter=|").delimiter, Some(b'|'));
        assert_eq!(params("obj-id-col=1,header=no").has_header, Some(false));
        // The string it writes parses back to the same options.
        let p = params("time-col=1,obj-id-col=2,delimiter=\\t,has-header=false");
        assert_eq!(params(&p.to_param_string()), p);
    }

    #[test]
    fn bad_params_are_refused_naming_the_key() {
        for (s, needle) in [
            ("time-col=1", "obj-id-col=N is required"),
            (
                "obj-id-col=0",
                "obj-id-col=0: expected a column number from 1",
            ),
            ("obj-id-col=x", "obj-id-col=x"),
            (
                "obj-id-col=1,has-header=maybe",
                "has-header=maybe: expected true/false",
            ),
            ("obj-id-col=1,op-col=3", "op-col: a libCacheSim option"),
            ("obj-id-col=1,colour=3", "unknown key \"colour\""),
            ("obj-id-col", "expected key=value"),
            (
                "obj-id-col=1,delimiter=ab",
                "delimiter=ab: expected one character",
            ),
        ] {
            let e = CsvParams::parse(s).unwrap_err().to_string();
            assert!(e.contains(needle), "{s}: {e}");
            assert!(e.starts_with("--trace-type-params: "), "{e}");
        }
    }

    #[test]
    fn rows_become_general_accesses_with_sizes_and_clamped_times() {
        let csv = b"time,id,size\n5,7,100\n6.9,8,50\r\n\n4,7,100\n";
        let c = Compiled::from_csv_bytes(
            csv,
            &params("time-col=1,obj-id-col=2,obj-size-col=3,has-header=true,obj-id-is-num=true"),
        )
        .unwrap();
        assert_eq!(c.requests, 3);
        assert_eq!(ids(&c), [7, 8, 7]);
        assert_eq!(
            c.accesses.iter().map(|a| a.size).collect::<Vec<_>>(),
            [100, 50, 100]
        );
        // 6.9 s truncates to 6 s; 4 s after it is clamped to 6 s.
        assert_eq!(c.accesses[1].time, 6_000_000_000);
        assert_eq!(c.accesses[2].time, 6_000_000_000);
        assert_eq!(c.accesses[0].next, 2);
        assert!(c.accesses[2].is_reuse());
        assert_eq!(c.distinct, 2);
        assert!(c
            .accesses
            .iter()
            .all(|a| a.dtype == DataType::General.index() as u8 && a.penalty_ns == 0));
    }

    #[test]
    fn the_delimiter_and_header_are_detected_as_libcachesim_does() {
        assert_eq!(detect_delimiter(b"1\t2,3\n"), b'\t');
        assert_eq!(detect_delimiter(b"1|2|3|4\n"), b'|');
        assert_eq!(detect_delimiter(b"17\n"), b',');
        assert!(detect_header(b"time,obj,size\n1,2,3\n"));
        assert!(!detect_header(b"1,2,3\n"));
        // Hex-looking ids: digits win.
        assert!(!detect_header(b"1700000000,abc1234,4096\n"));
        let c = Compiled::from_csv_bytes(b"ts|key|bytes\n1|a|3\n2|b|4\n", &params("obj-id-col=2"))
            .unwrap();
        assert_eq!(c.requests, 2);
        assert_eq!(c.accesses[0].size, 1); // no obj-size-col: size 1
    }

    #[test]
    fn numeric_ids_read_as_strtoull_base_0_and_strings_hash() {
        let p = params("obj-id-col=1,obj-id-is-num=true,has-header=false");
        let c = Compiled::from_csv_bytes(b"10\n0x10\n010\n", &p).unwrap();
        assert_eq!(ids(&c), [10, 16, 8]);
        // Hashed: equal strings are one object, the hash is xxh3-64 of the field.
        let p = params("obj-id-col=1,obj-id-is-num=false,has-header=false");
        let c = Compiled::from_csv_bytes(b"a\nb\n\"a\"\n10\n", &p).unwrap();
        assert_eq!(c.accesses[0].id, xxhash_rust::xxh3::xxh3_64(b"a"));
        assert_eq!(c.accesses[0].id, c.accesses[2].id);
        assert_eq!(c.accesses[3].id, xxhash_rust::xxh3::xxh3_64(b"10"));
        assert_eq!(c.distinct, 3);
        // Undecided: the first data line's id decides.
        let c =
            Compiled::from_csv_bytes(b"5\n6\n", &params("obj-id-col=1,has-header=false")).unwrap();
        assert_eq!(ids(&c), [5, 6]);
    }

    #[test]
    fn quoted_fields_and_blanks_follow_libcsv() {
        let p = params("obj-id-col=2,obj-size-col=3,obj-id-is-num=false,has-header=false");
        let c = Compiled::from_csv_bytes(b" 1 , \"x,\"\"y\" ,  7 \n2,plain,8,\n", &p).unwrap();
        assert_eq!(c.accesses[0].id, xxhash_rust::xxh3::xxh3_64(b"x,\"y"));
        assert_eq!(c.accesses[0].size, 7);
        assert_eq!(c.accesses[1].id, xxhash_rust::xxh3::xxh3_64(b"plain"));
    }

    #[test]
    fn every_bad_line_names_its_line_column_and_what_was_expected() {
        let p = params("time-col=1,obj-id-col=2,obj-size-col=3,has-header=true,obj-id-is-num=1");
        for (csv, msg) in [
            (
                &b"t,id,s\n1,2,3\n1,x,3\n"[..],
                "line 3, column 2 (obj-id-col): expected an unsigned 64-bit integer \
                 (obj-id-is-num=true; set it to false to hash the ids), found \"x\"",
            ),
            (
                b"t,id,s\n1,2,-3\n",
                "line 2, column 3 (obj-size-col): expected an unsigned 32-bit integer \
                 (bytes), found \"-3\"",
            ),
            (
                b"t,id,s\n1,2,4294967296\n",
                "line 2, column 3 (obj-size-col): expected an unsigned 32-bit integer",
            ),
            (
                b"t,id,s\nnan,2,3\n",
                "line 2, column 1 (time-col): expected a number of seconds from 0 to below \
                 2^32, found \"nan\"",
            ),
            (b"t,id,s\n1e10,2,3\n", "line 2, column 1 (time-col)"),
            (
                b"t,id,s\n1,2\n",
                "line 2: obj-size-col=3, but the line has 2 column(s) (delimiter ',')",
            ),
            (
                b"t,id,s\n1,\"2,3\n",
                "line 2: column 2: unterminated quoted field",
            ),
            (
                b"t,id,s\n1,\"2\"x,3\n",
                "line 2: column 2: expected the delimiter ','",
            ),
            (
                b"t,id,s\n1,,3\n",
                "line 2, column 2 (obj-id-col): expected an object id",
            ),
            (
                b"t,id,s\n1,99999999999999999999,3\n",
                "line 2, column 2 (obj-id-col)",
            ),
        ] {
            let e = Compiled::from_csv_bytes(csv, &p).unwrap_err().to_string();
            assert!(
                e.starts_with(msg),
                "{:?}: {e}",
                String::from_utf8_lossy(csv)
            );
        }
        // Detected numeric ids, then a string one.
        let e = Compiled::from_csv_bytes(b"1\nz\n", &params("obj-id-col=1,has-header=false"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2, column 1 (obj-id-col)"), "{e}");
        assert!(e.contains("the first data line's id was numeric"), "{e}");
    }

    /// The oracleGeneral record of the same request: the csv reader must give the same
    /// accesses as the binary reader.
    fn og(ts: u32, id: u64, size: u32) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&ts.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
        v.extend_from_slice(&size.to_le_bytes());
        v.extend_from_slice(&(-1i64).to_le_bytes());
        v
    }

    proptest! {
        /// Arbitrary bytes under arbitrary options: a trace or an error, never a panic.
        #[test]
        fn arbitrary_input_never_panics(
            b in proptest::collection::vec(
                prop_oneof![Just(b','), Just(b'\n'), Just(b'"'), Just(b' '), Just(b'\r'),
                            Just(b'\t'), Just(b'0'), Just(b'x'), b'0'..=b'9', any::<u8>()],
                0..300),
            id in 1u32..5, time in proptest::option::of(1u32..5),
            size in proptest::option::of(1u32..5),
            delim in proptest::option::of(prop_oneof![Just(b','), Just(b'\t'), Just(b'|')]),
            header in proptest::option::of(any::<bool>()),
            num in proptest::option::of(any::<bool>()),
        ) {
            let p = CsvParams { time_col: time, obj_id_col: id, obj_size_col: size,
                                delimiter: delim, has_header: header, obj_id_is_num: num };
            if let Ok(c) = Compiled::from_csv_bytes(&b, &p) {
                prop_assert_eq!(c.objects.len(), c.accesses.len());
            }
        }

        /// Records written as csv (any delimiter, header or not, quoted or not, CRLF or
        /// not) read back as the oracleGeneral reader reads the same records.
        #[test]
        fn csv_reads_as_the_same_records_in_oracle_general(
            recs in proptest::collection::vec((0u32..100, 0u64..50, 1u32..1000), 0..60),
            delim in prop_oneof![Just(b','), Just(b'\t'), Just(b'|'), Just(b';')],
            header in any::<bool>(), quote in any::<bool>(), crlf in any::<bool>(),
        ) {
            let mut csv = Vec::new();
            let nl: &[u8] = if crlf { b"\r\n" } else { b"\n" };
            let d = delim as char;
            if header {
                csv.extend(format!("size{d}time{d}id").as_bytes());
                csv.extend(nl);
            }
            let mut bin = Vec::new();
            for &(ts, id, size) in &recs {
                let idf = if quote { format!("\"{id}\"") } else { id.to_string() };
                csv.extend(format!("{size}{d} {ts}{d}{idf}").as_bytes());
                csv.extend(nl);
                bin.extend(og(ts, id, size));
            }
            let p = CsvParams { time_col: Some(2), obj_id_col: 3, obj_size_col: Some(1),
                                delimiter: Some(delim), has_header: Some(header),
                                obj_id_is_num: Some(true) };
            let c = Compiled::from_csv_bytes(&csv, &p).unwrap();
            let o = Compiled::from_oracle_general_bytes(&bin).unwrap();
            prop_assert_eq!(c.requests, o.requests);
            prop_assert_eq!(&c.accesses, &o.accesses);
            prop_assert_eq!(&c.objects, &o.objects);
        }
    }
}

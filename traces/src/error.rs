//! Errors of the trace crate.
//!
//! Every problem with an input names the file, where in it (a 1-based line for JSONL and
//! CSV, a 1-based row for Parquet, or the whole file), the field, and what was expected,
//! so that a researcher can fix a trace without reading our code. Readers never panic on
//! bad input: they return one of these and stop.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where in a file a problem was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// The file as a whole (its header, schema or footer).
    File,
    /// A 1-based line of a text file (JSONL, CSV); the JSONL header is line 1.
    Line(u64),
    /// A 1-based data row of a Parquet file.
    Row(u64),
    /// The n-th (1-based) request handed to a writer.
    Request(u64),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::File => f.write_str("file"),
            Location::Line(n) => write!(f, "line {n}"),
            Location::Row(n) => write!(f, "row {n}"),
            Location::Request(n) => write!(f, "request {n}"),
        }
    }
}

/// An error reading, writing, generating or importing a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The operating system refused a read or write.
    #[error("{}: {source}", file.display())]
    Io {
        /// The file involved.
        file: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The input is malformed or breaks a rule of the schema.
    #[error("{}: {at}: field `{field}`: {problem}", file.display())]
    Invalid {
        /// The file involved.
        file: PathBuf,
        /// Where in the file.
        at: Location,
        /// The field at fault (dotted path such as `images[1].visual_tokens`).
        field: String,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// A public trace in its own format where moonagent's schema was expected: the one
    /// line says which `moonagent trace import` command turns it into a trace.
    #[error(
        "{}: {}, not a moonagent trace; import it first: moonagent trace import {} {} --out {}",
        file.display(),
        kind.describe(),
        kind.name(),
        file.display(),
        out.display()
    )]
    NotImported {
        /// The file involved.
        file: PathBuf,
        /// The importer that reads it.
        kind: crate::import::ImportKind,
        /// A suggested output path (beside the input, `.moonagent.jsonl`).
        out: PathBuf,
    },
    /// A generator or importer configuration is not usable.
    #[error("config: field `{field}`: {problem}")]
    Config {
        /// The knob at fault.
        field: String,
        /// What is wrong and what was expected.
        problem: String,
    },
}

impl TraceError {
    /// An I/O error on `file`.
    pub fn io(file: &Path, source: std::io::Error) -> Self {
        TraceError::Io {
            file: file.to_path_buf(),
            source,
        }
    }

    /// An input error at `at` in `file`.
    pub fn invalid(
        file: &Path,
        at: Location,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        TraceError::Invalid {
            file: file.to_path_buf(),
            at,
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// `file` is a public trace of `kind` that must be imported before it is read.
    pub fn not_imported(file: &Path, kind: crate::import::ImportKind) -> Self {
        let stem = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "trace".into());
        TraceError::NotImported {
            file: file.to_path_buf(),
            kind,
            out: file.with_file_name(format!("{stem}.moonagent.jsonl")),
        }
    }

    /// A configuration error.
    pub fn config(field: impl Into<String>, problem: impl Into<String>) -> Self {
        TraceError::Config {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The field named by an input error, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            TraceError::Invalid { field, .. } | TraceError::Config { field, .. } => Some(field),
            TraceError::Io { .. } | TraceError::NotImported { .. } => None,
        }
    }

    /// The location of an input error, if any.
    pub fn location(&self) -> Option<Location> {
        match self {
            TraceError::Invalid { at, .. } => Some(*at),
            _ => None,
        }
    }
}

/// What is wrong with one value of a record (an Azure timestamp, a ServeGen dict cell),
/// before the reader adds the file, location and field ([`TraceError::Invalid`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Not of the expected form.
    #[error("expected {expected}, found {found}")]
    Expected {
        /// What was expected.
        expected: String,
        /// What was found (quoted when it is text).
        found: String,
    },
    /// A part of the value is not of the expected form.
    #[error("expected {expected} in {value:?}")]
    ExpectedIn {
        /// What was expected.
        expected: &'static str,
        /// The whole value.
        value: String,
    },
    /// Text left over after the value.
    #[error("unexpected {rest:?} after the time in {value:?}")]
    Trailing {
        /// The text left over.
        rest: String,
        /// The whole value.
        value: String,
    },
    /// A number of the expected form but too large.
    #[error("{what} {text:?} out of range")]
    OutOfRange {
        /// Which part (`year`, `fraction`, ...).
        what: &'static str,
        /// Its digits.
        text: String,
    },
    /// A date or time field (month, day, hour, minute, second) out of its range.
    #[error("date-time field out of range in {0:?}")]
    DateTimeRange(String),
}

impl ValueError {
    /// `expected {expected}, found {found}`.
    pub fn expected(expected: impl Into<String>, found: impl Into<String>) -> Self {
        ValueError::Expected {
            expected: expected.into(),
            found: found.into(),
        }
    }
}

/// A rule broken by one record, before the reader adds file and location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field at fault.
    pub field: String,
    /// What is wrong and what was expected.
    pub problem: String,
}

impl FieldError {
    /// A new field error.
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// Attach the file and location.
    pub fn at(self, file: &Path, at: Location) -> TraceError {
        TraceError::invalid(file, at, self.field, self.problem)
    }
}

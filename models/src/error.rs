//! Errors of the models crate.
//!
//! Every problem with a profile or a model spec names where it came from (a file path, or
//! `built-in <name>` for the embedded data), the field at fault as a dotted path that
//! matches the TOML (`efficiency.prefill_mfu`, `links.tcp.put_bytes_per_s`), and what was
//! expected. Loading never panics on bad input: it returns one of these.

use std::path::PathBuf;

/// An error loading, validating or using a hardware profile or a model spec.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The operating system refused to read a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is malformed, has an unknown or missing field, or a value of the wrong type.
    /// The message is the parser's: it quotes the line and names the field.
    #[error("{origin}: {message}")]
    Parse {
        /// Where the text came from.
        origin: String,
        /// The parser's message (line, column, the offending key and what was expected).
        message: String,
    },
    /// A value parsed but is impossible (zero layers, efficiency above 1, ...).
    #[error("{origin}: field `{field}`: {problem}")]
    Invalid {
        /// Where the value came from.
        origin: String,
        /// Dotted path of the field, as written in the TOML.
        field: String,
        /// What is wrong and what was expected.
        problem: String,
    },
    /// No built-in profile or model has this name.
    #[error("no built-in {kind} named `{name}`; built-in: {known}")]
    UnknownName {
        /// `hardware profile` or `model`.
        kind: &'static str,
        /// The name asked for.
        name: String,
        /// The built-in names, comma-separated.
        known: String,
    },
    /// A profile could not be written back as TOML.
    #[error("cannot write TOML: {0}")]
    Write(String),
}

impl ModelError {
    /// An impossible value of `field` in the data from `origin`.
    pub fn invalid(
        origin: impl Into<String>,
        field: impl Into<String>,
        problem: impl Into<String>,
    ) -> Self {
        ModelError::Invalid {
            origin: origin.into(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// The field named by a validation error, if this is one.
    pub fn field(&self) -> Option<&str> {
        match self {
            ModelError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }
}

/// A broken rule found by a validator, before the loader adds where the data came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldError {
    pub field: String,
    pub problem: String,
}

impl FieldError {
    pub(crate) fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            problem: problem.into(),
        }
    }

    pub(crate) fn at(self, origin: &str) -> ModelError {
        ModelError::invalid(origin, self.field, self.problem)
    }
}

/// `value` must be finite and strictly positive.
pub(crate) fn check_positive(field: &str, value: f64) -> Result<(), FieldError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("expected a finite number > 0, found {value}"),
        ))
    }
}

/// `value` must be a fraction in (0, 1].
pub(crate) fn check_fraction(field: &str, value: f64) -> Result<(), FieldError> {
    if value.is_finite() && value > 0.0 && value <= 1.0 {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            format!("expected an efficiency in (0, 1], found {value}"),
        ))
    }
}

/// An integer that must be at least 1.
pub(crate) fn check_nonzero(field: &str, value: u64) -> Result<(), FieldError> {
    if value > 0 {
        Ok(())
    } else {
        Err(FieldError::new(field, "expected a value >= 1, found 0"))
    }
}

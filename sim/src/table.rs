//! Result tables: named typed columns written as Parquet (arrow-rs) or CSV.
//!
//! Deterministic: the same rows give the same bytes (fixed writer properties, no
//! timestamps). Files are written atomically through the sweep's `write_atomic`. Parquet files load as they are in polars (`pl.read_parquet`) and pandas.

use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::sweep::files::write_atomic;

/// One column's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Column {
    /// Unsigned integers.
    U64(Vec<u64>),
    /// Floats.
    F64(Vec<f64>),
    /// Text.
    Str(Vec<String>),
}

impl Column {
    fn len(&self) -> usize {
        match self {
            Column::U64(v) => v.len(),
            Column::F64(v) => v.len(),
            Column::Str(v) => v.len(),
        }
    }
    fn cell(&self, i: usize) -> String {
        match self {
            Column::U64(v) => v[i].to_string(),
            Column::F64(v) => format!("{}", v[i]),
            Column::Str(v) => {
                let s = &v[i];
                if s.contains([',', '"', '\n']) {
                    format!("\"{}\"", s.replace('"', "\"\""))
                } else {
                    s.clone()
                }
            }
        }
    }
}

/// A table: equal-length named columns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Table {
    /// Columns in order.
    pub columns: Vec<(String, Column)>,
}

/// Why a table could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TableError {
    /// Columns of different lengths.
    #[error("column {column} has {rows} rows, expected {expected}")]
    Ragged {
        /// The column.
        column: String,
        /// Its rows.
        rows: usize,
        /// The first column's rows.
        expected: usize,
    },
    /// Arrow or Parquet refused the data.
    #[error("{}: {what}", path.display())]
    Encode {
        /// The file.
        path: std::path::PathBuf,
        /// What the encoder said.
        what: String,
    },
    /// The file could not be written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a column (builder style).
    pub fn with(mut self, name: &str, col: Column) -> Self {
        self.columns.push((name.to_string(), col));
        self
    }

    /// Rows (0 when there are no columns).
    pub fn rows(&self) -> usize {
        self.columns.first().map_or(0, |c| c.1.len())
    }

    fn check(&self) -> Result<(), TableError> {
        let n = self.rows();
        for (name, c) in &self.columns {
            if c.len() != n {
                return Err(TableError::Ragged {
                    column: name.clone(),
                    rows: c.len(),
                    expected: n,
                });
            }
        }
        Ok(())
    }

    /// Write as Parquet (snappy), atomically (temp file, then rename).
    pub fn write_parquet(&self, path: &Path) -> Result<(), TableError> {
        self.check()?;
        let mut fields = Vec::new();
        let mut arrays: Vec<ArrayRef> = Vec::new();
        for (name, c) in &self.columns {
            let (dt, a): (DataType, ArrayRef) = match c {
                Column::U64(v) => (DataType::UInt64, Arc::new(UInt64Array::from(v.clone()))),
                Column::F64(v) => (DataType::Float64, Arc::new(Float64Array::from(v.clone()))),
                Column::Str(v) => (DataType::Utf8, Arc::new(StringArray::from(v.clone()))),
            };
            fields.push(Field::new(name, dt, false));
            arrays.push(a);
        }
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(schema, arrays).map_err(|e| TableError::Encode {
            path: path.into(),
            what: e.to_string(),
        })?;
        write_batch(path, &batch, "moonagent", None)
    }

    /// Write as CSV (header row first), atomically.
    pub fn write_csv(&self, path: &Path) -> Result<(), TableError> {
        self.check()?;
        let mut out = String::new();
        let head: Vec<&str> = self.columns.iter().map(|c| c.0.as_str()).collect();
        out.push_str(&head.join(","));
        out.push('\n');
        for i in 0..self.rows() {
            let row: Vec<String> = self.columns.iter().map(|c| c.1.cell(i)).collect();
            out.push_str(&row.join(","));
            out.push('\n');
        }
        write_atomic(path, out.as_bytes(), true).map_err(|source| TableError::Io {
            path: path.into(),
            source,
        })
    }
}

/// Write `batch` as Parquet (snappy, fixed writer properties: the same batch gives the same
/// bytes) to `path`, atomically: every Parquet file the simulator writes goes through here.
pub fn write_batch(
    path: &Path,
    batch: &RecordBatch,
    created_by: &str,
    meta: Option<Vec<KeyValue>>,
) -> Result<(), TableError> {
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .set_created_by(created_by.into())
        .set_key_value_metadata(meta)
        .build();
    let err = |e: parquet::errors::ParquetError| TableError::Encode {
        path: path.into(),
        what: e.to_string(),
    };
    let mut buf = Vec::new();
    let mut w = ArrowWriter::try_new(&mut buf, batch.schema(), Some(props)).map_err(err)?;
    w.write(batch).map_err(err)?;
    w.close().map_err(err)?;
    write_atomic(path, &buf, true).map_err(|source| TableError::Io {
        path: path.into(),
        source,
    })
}

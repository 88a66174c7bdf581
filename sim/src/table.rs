//! Result tables: named typed columns written as Parquet (arrow-rs) or CSV.
//!
//! Deterministic: the same rows give the same bytes (fixed writer properties, no
//! timestamps). Parquet files load as they are in polars (`pl.read_parquet`) and pandas.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{ArrayRef, Float64Array, RecordBatch, StringArray, UInt64Array};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;

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

    fn check(&self) -> Result<(), String> {
        let n = self.rows();
        for (name, c) in &self.columns {
            if c.len() != n {
                return Err(format!("column {name} has {} rows, expected {n}", c.len()));
            }
        }
        Ok(())
    }

    /// Write as Parquet (snappy), atomically (temp file, then rename).
    pub fn write_parquet(&self, path: &Path) -> Result<(), String> {
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
        let batch = RecordBatch::try_new(schema.clone(), arrays)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let tmp = path.with_extension("parquet.tmp");
        let f = File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by("moonagent".into())
            .build();
        let mut w = ArrowWriter::try_new(f, schema, Some(props))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        w.write(&batch)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let f = w
            .into_inner()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.sync_all()
            .map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Write as CSV (header row first), atomically.
    pub fn write_csv(&self, path: &Path) -> Result<(), String> {
        self.check()?;
        let tmp = path.with_extension("csv.tmp");
        let mut f = std::io::BufWriter::new(
            File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?,
        );
        let head: Vec<&str> = self.columns.iter().map(|c| c.0.as_str()).collect();
        let io = |e: std::io::Error| format!("{}: {e}", tmp.display());
        writeln!(f, "{}", head.join(",")).map_err(io)?;
        for i in 0..self.rows() {
            let row: Vec<String> = self.columns.iter().map(|c| c.1.cell(i)).collect();
            writeln!(f, "{}", row.join(",")).map_err(io)?;
        }
        f.flush().map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
    }
}

//! The results and summary tables: built from finished runs, written as Parquet through
//! arrow-rs (fixed writer settings, no timestamps: equal rows give equal bytes), and read
//! back for `best`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use arrow_array::{
    Array, ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray, UInt32Array,
    UInt64Array,
};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::file::metadata::KeyValue;
use serde_json::Value;

use super::metrics::{schema, MetricType, MetricValue};
use super::plan::{canonical_json, Axis, Plan, FORMAT};
use super::stats::MeanCi;
use super::{Result, SweepError};

/// The results table's file name in a sweep folder.
pub const RESULTS_FILE: &str = "results.parquet";
/// The summary table's file name in a sweep folder.
pub const SUMMARY_FILE: &str = "summary.parquet";

/// Parquet key-value metadata keys.
pub(crate) const META_FORMAT: &str = "moonagent.sweep.format";
pub(crate) const META_HASH: &str = "moonagent.sweep.plan_hash";
pub(crate) const META_KIND: &str = "moonagent.sweep.kind";
pub(crate) const META_AXES: &str = "moonagent.sweep.axes";
pub(crate) const META_METRICS: &str = "moonagent.sweep.metrics";
pub(crate) const META_PLAN: &str = "moonagent.sweep.plan";

/// One finished run: the plan's selected metrics, in the plan's order.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Point index.
    pub point: u32,
    /// Seed.
    pub seed: u64,
    /// Metric values.
    pub metrics: Vec<MetricValue>,
}

/// One point of the summary: mean and 95% interval of each metric over seeds.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// Point index.
    pub point: u32,
    /// Point id.
    pub point_id: String,
    /// Axis values as text (strings bare, other values as JSON).
    pub axes: Vec<String>,
    /// Per selected metric.
    pub metrics: Vec<MeanCi>,
}

/// Types of the plan's selected metrics.
pub(crate) fn metric_types(plan: &Plan) -> Vec<MetricType> {
    let all: BTreeMap<String, MetricType> = schema(plan.kind).into_iter().collect();
    plan.metrics
        .iter()
        .map(|m| all.get(m).copied().unwrap_or(MetricType::F64))
        .collect()
}

/// An axis value as table text.
pub fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => canonical_json(other),
    }
}

fn axis_column(axis: &Axis, at: &[u32]) -> (DataType, ArrayRef) {
    let vals = &axis.values;
    let pick = |k: &u32| &vals[*k as usize];
    if vals.iter().all(Value::is_boolean) {
        let a: BooleanArray = at.iter().map(|k| pick(k).as_bool()).collect();
        (DataType::Boolean, Arc::new(a))
    } else if vals.iter().all(|v| v.as_i64().is_some()) {
        let a: Int64Array = at.iter().map(|k| pick(k).as_i64()).collect();
        (DataType::Int64, Arc::new(a))
    } else if vals.iter().all(|v| v.as_u64().is_some()) {
        let a: UInt64Array = at.iter().map(|k| pick(k).as_u64()).collect();
        (DataType::UInt64, Arc::new(a))
    } else if vals.iter().all(Value::is_number) {
        let a: Float64Array = at.iter().map(|k| pick(k).as_f64()).collect();
        (DataType::Float64, Arc::new(a))
    } else {
        let a: StringArray = at.iter().map(|k| Some(value_text(pick(k)))).collect();
        (DataType::Utf8, Arc::new(a))
    }
}

fn key_columns(plan: &Plan, points: &[u32], fields: &mut Vec<Field>, arrays: &mut Vec<ArrayRef>) {
    fields.push(Field::new("point", DataType::UInt32, false));
    arrays.push(Arc::new(UInt32Array::from(points.to_vec())));
    fields.push(Field::new("point_id", DataType::Utf8, false));
    arrays.push(Arc::new(StringArray::from_iter_values(
        points.iter().map(|&p| plan.points[p as usize].id.as_str()),
    )));
}

fn axis_columns(plan: &Plan, points: &[u32], fields: &mut Vec<Field>, arrays: &mut Vec<ArrayRef>) {
    for (a, axis) in plan.axes.iter().enumerate() {
        let at: Vec<u32> = points
            .iter()
            .map(|&p| plan.points[p as usize].at[a])
            .collect();
        let (dt, arr) = axis_column(axis, &at);
        fields.push(Field::new(&axis.name, dt, false));
        arrays.push(arr);
    }
}

/// The results table: one row per run, sorted by (point, seed) by the caller.
pub(crate) fn results_batch(plan: &Plan, rows: &[Row]) -> Result<RecordBatch> {
    let points: Vec<u32> = rows.iter().map(|r| r.point).collect();
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    key_columns(plan, &points, &mut fields, &mut arrays);
    fields.push(Field::new("seed", DataType::UInt64, false));
    arrays.push(Arc::new(UInt64Array::from_iter_values(
        rows.iter().map(|r| r.seed),
    )));
    axis_columns(plan, &points, &mut fields, &mut arrays);
    for (m, (name, ty)) in plan.metrics.iter().zip(metric_types(plan)).enumerate() {
        match ty {
            MetricType::U64 => {
                let a: UInt64Array = rows
                    .iter()
                    .map(|r| match r.metrics[m] {
                        MetricValue::U64(v) => Some(v),
                        MetricValue::F64(v) => Some(v as u64),
                    })
                    .collect();
                fields.push(Field::new(name, DataType::UInt64, false));
                arrays.push(Arc::new(a));
            }
            MetricType::F64 => {
                let a: Float64Array = rows.iter().map(|r| Some(r.metrics[m].as_f64())).collect();
                fields.push(Field::new(name, DataType::Float64, false));
                arrays.push(Arc::new(a));
            }
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| SweepError::Results(format!("building the results table: {e}")))
}

/// Per point: mean and interval over its seeds (rows sorted by point, then seed).
pub(crate) fn summarise(plan: &Plan, rows: &[Row]) -> Vec<SummaryRow> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < rows.len() {
        let p = rows[i].point;
        let j = i + rows[i..].iter().take_while(|r| r.point == p).count();
        let point = &plan.points[p as usize];
        let metrics = (0..plan.metrics.len())
            .map(|m| {
                let xs: Vec<f64> = rows[i..j].iter().map(|r| r.metrics[m].as_f64()).collect();
                MeanCi::of(&xs)
            })
            .collect();
        out.push(SummaryRow {
            point: p,
            point_id: point.id.clone(),
            axes: (0..plan.axes.len())
                .map(|a| value_text(plan.value(point, a)))
                .collect(),
            metrics,
        });
        i = j;
    }
    out
}

/// The summary table: one row per point.
pub(crate) fn summary_batch(plan: &Plan, summary: &[SummaryRow]) -> Result<RecordBatch> {
    let points: Vec<u32> = summary.iter().map(|s| s.point).collect();
    let mut fields = Vec::new();
    let mut arrays: Vec<ArrayRef> = Vec::new();
    key_columns(plan, &points, &mut fields, &mut arrays);
    axis_columns(plan, &points, &mut fields, &mut arrays);
    fields.push(Field::new("n_seeds", DataType::UInt32, false));
    arrays.push(Arc::new(UInt32Array::from_iter_values(
        summary
            .iter()
            .map(|s| s.metrics.first().map_or(0, |m| m.n as u32)),
    )));
    for (m, name) in plan.metrics.iter().enumerate() {
        let mean: Float64Array = summary.iter().map(|s| Some(s.metrics[m].mean)).collect();
        let lo: Float64Array = summary.iter().map(|s| s.metrics[m].lo()).collect();
        let hi: Float64Array = summary.iter().map(|s| s.metrics[m].hi()).collect();
        fields.push(Field::new(format!("{name}.mean"), DataType::Float64, false));
        arrays.push(Arc::new(mean));
        fields.push(Field::new(
            format!("{name}.ci95_lo"),
            DataType::Float64,
            true,
        ));
        arrays.push(Arc::new(lo));
        fields.push(Field::new(
            format!("{name}.ci95_hi"),
            DataType::Float64,
            true,
        ));
        arrays.push(Arc::new(hi));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| SweepError::Results(format!("building the summary table: {e}")))
}

/// Key-value metadata every table carries.
pub(crate) fn table_metadata(plan: &Plan, hash: &str) -> Vec<KeyValue> {
    let names = |v: Vec<&str>| serde_json::to_string(&v).unwrap_or_default();
    vec![
        KeyValue::new(META_FORMAT.into(), FORMAT.to_string()),
        KeyValue::new(META_HASH.into(), hash.to_string()),
        KeyValue::new(META_KIND.into(), plan.kind.name().to_string()),
        KeyValue::new(
            META_AXES.into(),
            names(plan.axes.iter().map(|a| a.name.as_str()).collect()),
        ),
        KeyValue::new(
            META_METRICS.into(),
            names(plan.metrics.iter().map(String::as_str).collect()),
        ),
        KeyValue::new(META_PLAN.into(), plan.canonical()),
    ]
}

/// Write `batch` as Parquet (snappy) to `path`, atomically.
pub(crate) fn write_parquet(path: &Path, batch: &RecordBatch, meta: Vec<KeyValue>) -> Result<()> {
    crate::table::write_batch(path, batch, "moonagent-sim sweep", Some(meta)).map_err(|e| match e {
        crate::table::TableError::Io { path, source } => SweepError::io(&path)(source),
        e => SweepError::Results(format!("writing Parquet: {e}")),
    })
}

/// A results table read back: per run, its point, seed, axis values (as text) and every
/// metric as a float.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResultsTable {
    /// Plan hash the table was built from.
    pub plan_hash: String,
    /// Axis column names.
    pub axes: Vec<String>,
    /// Metric column names.
    pub metrics: Vec<String>,
    /// Point index per row.
    pub point: Vec<u32>,
    /// Seed per row.
    pub seed: Vec<u64>,
    /// Axis values per row (outer: row).
    pub axis_values: Vec<Vec<String>>,
    /// Metric values per row (outer: row).
    pub values: Vec<Vec<f64>>,
}

fn cell_f64(a: &dyn Array, i: usize) -> f64 {
    use arrow_array::cast::AsArray;
    use arrow_array::types::{Float64Type, Int64Type, UInt32Type, UInt64Type};
    if a.is_null(i) {
        return f64::NAN;
    }
    match a.data_type() {
        DataType::Float64 => a.as_primitive::<Float64Type>().value(i),
        DataType::UInt64 => a.as_primitive::<UInt64Type>().value(i) as f64,
        DataType::Int64 => a.as_primitive::<Int64Type>().value(i) as f64,
        DataType::UInt32 => f64::from(a.as_primitive::<UInt32Type>().value(i)),
        DataType::Boolean => f64::from(u8::from(a.as_boolean().value(i))),
        _ => f64::NAN,
    }
}

fn cell_u64(a: &dyn Array, i: usize) -> u64 {
    use arrow_array::cast::AsArray;
    use arrow_array::types::UInt64Type;
    match a.data_type() {
        DataType::UInt64 if !a.is_null(i) => a.as_primitive::<UInt64Type>().value(i),
        _ => cell_f64(a, i) as u64,
    }
}

fn cell_text(a: &dyn Array, i: usize) -> String {
    use arrow_array::cast::AsArray;
    if a.is_null(i) {
        return String::new();
    }
    match a.data_type() {
        DataType::Utf8 => a.as_string::<i32>().value(i).to_string(),
        DataType::Boolean => a.as_boolean().value(i).to_string(),
        DataType::Float64 => format!("{}", cell_f64(a, i)),
        _ => format!("{}", cell_f64(a, i) as i128),
    }
}

/// Read a results table written by a sweep (`results.parquet`, or a folder holding one).
pub fn read_results(path: &Path) -> Result<ResultsTable> {
    let path = if path.is_dir() {
        path.join(RESULTS_FILE)
    } else {
        path.to_path_buf()
    };
    let bad = |m: String| SweepError::Results(format!("{}: {m}", path.display()));
    let f = std::fs::File::open(&path).map_err(SweepError::io(&path))?;
    let b = ParquetRecordBatchReaderBuilder::try_new(f).map_err(|e| bad(e.to_string()))?;
    let meta: BTreeMap<String, String> = b
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .filter_map(|k| k.value.clone().map(|v| (k.key.clone(), v)))
                .collect()
        })
        .unwrap_or_default();
    let list = |key: &str| -> Result<Vec<String>> {
        let text = meta
            .get(key)
            .ok_or_else(|| bad(format!("not a sweep results table (no `{key}` metadata)")))?;
        serde_json::from_str(text).map_err(|e| bad(format!("metadata `{key}`: {e}")))
    };
    let mut t = ResultsTable {
        plan_hash: meta.get(META_HASH).cloned().unwrap_or_default(),
        axes: list(META_AXES)?,
        metrics: list(META_METRICS)?,
        ..ResultsTable::default()
    };
    let reader = b.build().map_err(|e| bad(e.to_string()))?;
    for batch in reader {
        let batch = batch.map_err(|e| bad(e.to_string()))?;
        let col = |name: &str| -> Result<ArrayRef> {
            batch.column_by_name(name).cloned().ok_or_else(|| {
                bad(format!(
                    "no column `{name}`{}",
                    if name == "seed" {
                        " (a summary table? give the results table or the sweep folder)"
                    } else {
                        ""
                    }
                ))
            })
        };
        let point = col("point")?;
        let seed = col("seed")?;
        let axes: Vec<ArrayRef> = t.axes.iter().map(|a| col(a)).collect::<Result<_>>()?;
        let metrics: Vec<ArrayRef> = t.metrics.iter().map(|m| col(m)).collect::<Result<_>>()?;
        for i in 0..batch.num_rows() {
            t.point.push(cell_f64(point.as_ref(), i) as u32);
            t.seed.push(cell_u64(seed.as_ref(), i));
            t.axis_values
                .push(axes.iter().map(|a| cell_text(a.as_ref(), i)).collect());
            t.values
                .push(metrics.iter().map(|a| cell_f64(a.as_ref(), i)).collect());
        }
    }
    Ok(t)
}

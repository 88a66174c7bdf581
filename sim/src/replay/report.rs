//! What a replay over several capacities reports: the runs, Belady's MIN per data type
//! beside them, and one table (rows per capacity, policy and data type) for Parquet and
//! CSV. Used by `moonagent replay`, `moonagent repro` and the figures.

use std::collections::BTreeMap;

use moonagent_core::store::DataType;
use serde::Serialize;

use super::{min_bound, Compiled, PolicyResult, TypeResult};
use crate::capacity::{parse_bytes, CapacityError};
use crate::table::{Column, Table};

/// All policies at one capacity.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityRun {
    /// Capacity in bytes (in objects with `--capacity-unit objects`).
    pub capacity_bytes: u64,
    /// One result per policy, in the order given.
    pub results: Vec<PolicyResult>,
    /// Belady's MIN on an ideal cache of `capacity / size` objects, per data type whose
    /// objects all have one size: `(hits, lookups)`. An upper bound on every policy's hits.
    pub min_bound: BTreeMap<String, (u64, u64)>,
}

/// Per data type whose replayed objects all have one size, that size.
pub fn uniform_sizes(c: &Compiled) -> BTreeMap<DataType, u64> {
    let mut size: [Option<u64>; DataType::COUNT] = [None; DataType::COUNT];
    let mut mixed = [false; DataType::COUNT];
    for a in &c.accesses {
        let t = a.dtype as usize;
        match size[t] {
            None => size[t] = Some(u64::from(a.size)),
            Some(s) if s != u64::from(a.size) => mixed[t] = true,
            _ => {}
        }
    }
    DataType::ALL
        .iter()
        .filter_map(|t| {
            let s = size[t.index()]?;
            (!mixed[t.index()] && s > 0).then_some((*t, s))
        })
        .collect()
}

/// Belady's MIN per uniform-size data type at `capacity` (only when the replay holds that
/// type alone, so the store's capacity is all that type's).
pub fn min_bounds(c: &Compiled, capacity: u64) -> BTreeMap<String, (u64, u64)> {
    let u = uniform_sizes(c);
    let types_present = c.unique_objects().iter().filter(|&&n| n > 0).count();
    if types_present != 1 {
        return BTreeMap::new();
    }
    u.into_iter()
        .map(|(t, s)| (t.name().to_string(), min_bound(c, t, capacity / s)))
        .collect()
}

/// Belady's MIN on `k` unit objects, when the replay holds one data type.
pub fn min_bounds_objects(c: &Compiled, k: u64) -> BTreeMap<String, (u64, u64)> {
    let unique = c.unique_objects();
    let present: Vec<DataType> = DataType::ALL
        .into_iter()
        .filter(|t| unique[t.index()] > 0)
        .collect();
    match present[..] {
        [t] => BTreeMap::from([(t.name().to_string(), min_bound(c, t, k))]),
        _ => BTreeMap::new(),
    }
}

/// One row per capacity, policy and data type (and `all`), for Parquet and CSV.
pub fn results_table(runs: &[CapacityRun]) -> Table {
    let mut cap = Vec::new();
    let mut label = Vec::new();
    let mut policy = Vec::new();
    let mut dtype = Vec::new();
    // Column names from `TypeResult`'s column set (so an empty table has them too).
    let (rate_names, count_names) = {
        let z = TypeResult::default();
        (z.rates().map(|c| c.0), z.counts().map(|c| c.0))
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); rate_names.len()];
    let mut counts: Vec<Vec<u64>> = vec![Vec::new(); count_names.len()];
    for run in runs {
        for r in &run.results {
            let types = r
                .by_type
                .iter()
                .map(|(k, v)| (k.as_str(), v))
                .chain(std::iter::once(("all", &r.total)));
            for (t, x) in types {
                cap.push(run.capacity_bytes);
                label.push(r.label.clone());
                policy.push(r.policy.name().to_string());
                dtype.push(t.to_string());
                for (col, (_, v)) in rates.iter_mut().zip(x.rates()) {
                    col.push(v);
                }
                for (col, (_, v)) in counts.iter_mut().zip(x.counts()) {
                    col.push(v);
                }
            }
        }
    }
    let mut t = Table::new()
        .with("capacity_bytes", Column::U64(cap))
        .with("label", Column::Str(label))
        .with("policy", Column::Str(policy))
        .with("data_type", Column::Str(dtype));
    // Rates first, then counters, in `TypeResult`'s column order.
    for (name, col) in rate_names.into_iter().zip(rates) {
        t = t.with(name, Column::F64(col));
    }
    for (name, col) in count_names.into_iter().zip(counts) {
        t = t.with(name, Column::U64(col));
    }
    t
}

/// Resolve capacities (`64GiB`, `30%` of `unique_total`, ...) with the one capacity parser.
pub fn capacities(values: &[String], unique_total: u64) -> Result<Vec<u64>, CapacityError> {
    values
        .iter()
        .map(|c| parse_bytes(c, Some(unique_total)))
        .collect()
}

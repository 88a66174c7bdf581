//! Metric columns: names, types, and how a run's result becomes one value per column.
//!
//! - `simulate`: every numeric field of [`Summary`], nested fields flattened to dotted
//!   names (`ttft_ms.p95`), arrays to named entries (`link_bytes.encoder_store`,
//!   `link_bytes.store_prefill`, `link_bytes.prefill_decode`, `events_by_kind.arrival`,
//!   ...); sorted by name.
//! - `replay`: per data type (`encoder_output`, `kv_cache`) and for all types together
//!   (`total`): hit, byte-hit and saving-time rates, recompute seconds left after hits,
//!   and the raw counters; then the store's eviction counters and the trace's facts
//!   (requests, accesses, unique bytes per type, the capacity in bytes).

use std::collections::BTreeMap;

use serde_json::Value;

use super::plan::Kind;
use super::PlanError;
use crate::des::Summary;
use crate::replay::{PolicyResult, TypeResult};

/// Column type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    /// Unsigned integer (counts, bytes, ns).
    U64,
    /// Float (rates, ms, seconds).
    F64,
}

/// One metric value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MetricValue {
    /// Unsigned integer.
    U64(u64),
    /// Float.
    F64(f64),
}

impl MetricValue {
    /// The value as a float (means, Pareto fronts).
    pub fn as_f64(self) -> f64 {
        match self {
            MetricValue::U64(v) => v as f64,
            MetricValue::F64(v) => v,
        }
    }
    /// Its type.
    pub fn kind(self) -> MetricType {
        match self {
            MetricValue::U64(_) => MetricType::U64,
            MetricValue::F64(_) => MetricType::F64,
        }
    }
}

/// Names for the entries of `Summary`'s array fields (as documented there); an array of
/// another length keeps numeric suffixes.
const ARRAY_NAMES: [(&str, &[&str]); 2] = [
    (
        "link_bytes",
        &["encoder_store", "store_prefill", "prefill_decode"],
    ),
    (
        "events_by_kind",
        &[
            "arrival",
            "dispatch",
            "step_done",
            "image_stored",
            "images_loaded",
            "kv_arrived",
        ],
    ),
];

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, MetricValue>) {
    let join = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                flatten(&join(k), x, out);
            }
        }
        Value::Array(a) => {
            let names = ARRAY_NAMES
                .iter()
                .find(|(f, n)| *f == prefix && n.len() == a.len())
                .map(|(_, n)| *n);
            for (i, x) in a.iter().enumerate() {
                let name = names.map_or_else(|| i.to_string(), |n| n[i].to_string());
                flatten(&join(&name), x, out);
            }
        }
        Value::Number(n) => {
            let val = match n.as_u64() {
                Some(u) if !n.is_f64() => MetricValue::U64(u),
                _ => MetricValue::F64(n.as_f64().unwrap_or(f64::NAN)),
            };
            out.insert(prefix.to_string(), val);
        }
        Value::Bool(b) => {
            out.insert(prefix.to_string(), MetricValue::U64(u64::from(*b)));
        }
        // Strings (the mode name) are configuration, not metrics; NaN serializes as null.
        Value::Null => {
            out.insert(prefix.to_string(), MetricValue::F64(f64::NAN));
        }
        Value::String(_) => {}
    }
}

/// The simulator's metrics of one run, sorted by name.
pub fn sim_metrics(s: &Summary) -> Vec<(String, MetricValue)> {
    let mut out = BTreeMap::new();
    flatten(
        "",
        &serde_json::to_value(s).unwrap_or(Value::Null),
        &mut out,
    );
    out.into_iter().collect()
}

/// What the replay knows about the trace, reported beside the policy's result.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceFacts {
    /// Requests replayed.
    pub requests: u64,
    /// Store accesses replayed.
    pub accesses: u64,
    /// Distinct encoder-output bytes.
    pub unique_encoder_bytes: u64,
    /// Distinct prefix-KV bytes.
    pub unique_kv_bytes: u64,
    /// Store capacity, bytes.
    pub capacity_bytes: u64,
}

/// Data types the replay reports, in column order.
const REPLAY_TYPES: [&str; 2] = ["encoder_output", "kv_cache"];

fn type_metrics(prefix: &str, t: &TypeResult, out: &mut Vec<(String, MetricValue)>) {
    // The replay's one column set (`TypeResult::rates`, `counts`), under `prefix.`.
    let f = |n: &str| format!("{prefix}.{n}");
    out.extend(t.rates().map(|(n, v)| (f(n), MetricValue::F64(v))));
    out.extend(t.counts().map(|(n, v)| (f(n), MetricValue::U64(v))));
}

/// The replay's metrics of one run, in a fixed order.
pub fn replay_metrics(r: &PolicyResult, facts: &TraceFacts) -> Vec<(String, MetricValue)> {
    let mut out = Vec::new();
    for t in REPLAY_TYPES {
        let tr = r.by_type.get(t).copied().unwrap_or_default();
        type_metrics(t, &tr, &mut out);
    }
    type_metrics("total", &r.total, &mut out);
    out.extend([
        (
            "store.eviction_runs".to_string(),
            MetricValue::U64(r.store.eviction_runs),
        ),
        (
            "store.eviction_runs_empty".to_string(),
            MetricValue::U64(r.store.eviction_runs_empty),
        ),
        (
            "store.policy_refused".to_string(),
            MetricValue::U64(r.store.policy_refused),
        ),
        ("requests".to_string(), MetricValue::U64(facts.requests)),
        ("accesses".to_string(), MetricValue::U64(facts.accesses)),
        (
            "unique_bytes.encoder_output".to_string(),
            MetricValue::U64(facts.unique_encoder_bytes),
        ),
        (
            "unique_bytes.kv_cache".to_string(),
            MetricValue::U64(facts.unique_kv_bytes),
        ),
        (
            "capacity_bytes".to_string(),
            MetricValue::U64(facts.capacity_bytes),
        ),
    ]);
    out
}

/// Every metric of `kind`, with its type, in table order.
pub fn schema(kind: Kind) -> Vec<(String, MetricType)> {
    let v = match kind {
        Kind::Simulate => sim_metrics(&Summary::default()),
        Kind::Replay => {
            let r = PolicyResult {
                label: String::new(),
                policy: Default::default(),
                by_type: Default::default(),
                total: Default::default(),
                store: Default::default(),
            };
            replay_metrics(&r, &TraceFacts::default())
        }
    };
    v.into_iter().map(|(n, x)| (n, x.kind())).collect()
}

/// Resolve a plan's `metrics` list against `kind`'s schema: exact names, or patterns
/// ending in `*` (`encoder_output.*`, `ttft_ms.*`). Empty keeps every metric. The order is
/// the list's (a pattern's matches in schema order), without repeats.
pub fn select(kind: Kind, wanted: &[String]) -> Result<Vec<String>, PlanError> {
    let all = schema(kind);
    if wanted.is_empty() {
        return Ok(all.into_iter().map(|(n, _)| n).collect());
    }
    let mut out: Vec<String> = Vec::new();
    for w in wanted {
        let matches: Vec<&String> = match w.strip_suffix('*') {
            Some(prefix) => all
                .iter()
                .map(|(n, _)| n)
                .filter(|n| n.starts_with(prefix))
                .collect(),
            None => all.iter().map(|(n, _)| n).filter(|n| *n == w).collect(),
        };
        if matches.is_empty() {
            let stem = w.trim_end_matches('*').split('.').next().unwrap_or("");
            let near: Vec<&str> = all
                .iter()
                .map(|(n, _)| n.as_str())
                .filter(|n| !stem.is_empty() && n.starts_with(stem))
                .take(12)
                .collect();
            return Err(PlanError::field(
                "metrics",
                format!(
                    "no {} metric matches {w:?}{}",
                    kind.name(),
                    if near.is_empty() {
                        format!(
                            " (known: {}, ...)",
                            all.iter()
                                .take(12)
                                .map(|(n, _)| n.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    } else {
                        format!(" (did you mean one of {}?)", near.join(", "))
                    }
                ),
            ));
        }
        for m in matches {
            if !out.contains(m) {
                out.push(m.clone());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_schema_flattens_nested_fields_with_names() {
        let s = schema(Kind::Simulate);
        let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
        assert!(names.contains(&"ttft_ms.p95"));
        assert!(names.contains(&"link_bytes.encoder_store"));
        assert!(names.contains(&"events_by_kind.kv_arrived"));
        assert!(names.contains(&"encoder_gpu_s"));
        assert!(!names.contains(&"mode"));
        let t = |n: &str| s.iter().find(|(x, _)| x == n).unwrap().1;
        assert_eq!(t("ttft_ms.p95"), MetricType::F64);
        assert_eq!(t("completed"), MetricType::U64);
        assert_eq!(t("throughput_rps"), MetricType::F64);
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted);
    }

    #[test]
    fn select_keeps_order_expands_patterns_and_names_unknowns() {
        let m = select(
            Kind::Simulate,
            &[
                "ttft_ms.p95".into(),
                "encoder_gpu_s".into(),
                "ttft_ms.*".into(),
            ],
        )
        .unwrap();
        assert_eq!(m[0], "ttft_ms.p95");
        assert_eq!(m[1], "encoder_gpu_s");
        assert_eq!(m.len(), 2 + 3);
        let e = select(Kind::Simulate, &["ttft_ms.p96".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("ttft_ms.p95"), "{e}");
        let all = select(Kind::Replay, &[]).unwrap();
        assert!(all.contains(&"encoder_output.hit_rate".to_string()));
        assert!(all.contains(&"total.saving_time_rate".to_string()));
    }
}

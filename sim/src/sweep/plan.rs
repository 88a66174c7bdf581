//! Plan files: parsing, axis expansion into points, the canonical form the plan hash is
//! taken over, and `--set` overrides.
//!
//! ```toml
//! kind = "replay"                 # or "simulate"
//! mode = "grid"                   # or "zip": every axis in lockstep (default grid)
//! seeds = 3                       # seeds 1, 2, 3; or a list: seeds = [7, 11]
//! metrics = ["encoder_output.*", "total.saving_time_rate"]   # empty or absent = all
//!
//! [base]                          # the configuration every point starts from
//! capacity = "20%"
//! workload = { generator = "sessions", config = { sessions = 100 } }
//! policy = { policy = "type-aware" }
//!
//! [[axis]]
//! name = "reuse_scale"            # column name (default: the path)
//! path = "policy.types.encoder_output.reuse_scale"
//! values = [1.0, 4.0, 8.0]
//!
//! [[axis]]
//! path = "policy.types.encoder_output.eviction_grace_ms"
//! range = { start = 0, stop = 20000, step = 10000 }   # stop included when reached
//! zip = "g"                       # axes sharing a zip group vary together
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use blake2::digest::consts::{U16, U8};
use blake2::{Blake2b, Digest};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::metrics;
use super::{PlanError, Result, SweepError};

/// Format version of plan hashes, point files and tables.
pub const FORMAT: u32 = 1;

/// Most points one plan may expand to.
pub const MAX_POINTS: usize = 1_000_000;

/// Columns every results table has before the axes.
pub const RESERVED_COLUMNS: [&str; 4] = ["point", "point_id", "seed", "n_seeds"];

/// What every point runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The EPD discrete-event simulator (`moonagent_sim::des::simulate`).
    Simulate,
    /// The store-level replay under one policy (`moonagent_sim::replay::replay_one`).
    Replay,
}

impl Kind {
    /// `simulate` or `replay`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Simulate => "simulate",
            Kind::Replay => "replay",
        }
    }
}

/// How axes combine into points.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Combine {
    /// Cartesian product of the axes (zip groups count as one axis).
    #[default]
    Grid,
    /// Every axis in lockstep: value i of each axis makes point i.
    Zip,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    kind: Kind,
    #[serde(default)]
    mode: Combine,
    base: Value,
    #[serde(default)]
    axis: Vec<AxisFile>,
    #[serde(default)]
    seeds: Option<SeedsFile>,
    #[serde(default)]
    metrics: Vec<String>,
}

#[derive(Deserialize)]
#[serde(
    untagged,
    expecting = "a count (seeds = 3 means seeds 1, 2, 3) or a list of seeds (seeds = [7, 11])"
)]
enum SeedsFile {
    Count(u64),
    List(Vec<u64>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AxisFile {
    path: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    values: Option<Vec<Value>>,
    #[serde(default)]
    range: Option<RangeFile>,
    #[serde(default)]
    log_range: Option<LogRangeFile>,
    #[serde(default)]
    zip: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RangeFile {
    start: Value,
    stop: Value,
    step: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogRangeFile {
    start: Value,
    stop: Value,
    num: u32,
}

/// One axis: a config path and its values.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// Column name in the tables (the plan's `name`, else the path).
    pub name: String,
    /// Dotted path into `[base]`.
    pub path: String,
    /// The values, in plan order.
    pub values: Vec<Value>,
    /// Zip group index (axes with the same group vary together).
    pub group: usize,
    segments: Vec<String>,
}

/// One point of the expanded plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    /// Position in expansion order (the first axis group varies slowest).
    pub index: u32,
    /// Stable id: BLAKE2b-64 of the canonical (path, value) list, 16 hex digits.
    pub id: String,
    /// Per axis, the index of its value.
    pub at: Vec<u32>,
}

/// A parsed, expanded plan (not yet validated against the typed configurations: see
/// [`Plan::prepare`]).
#[derive(Debug, Clone)]
pub struct Plan {
    /// What every point runs.
    pub kind: Kind,
    /// Grid or zip.
    pub combine: Combine,
    /// The base configuration (a JSON object).
    pub base: Value,
    /// The axes, in plan order.
    pub axes: Vec<Axis>,
    /// Seeds, ascending.
    pub seeds: Vec<u64>,
    /// Metrics kept, in table order.
    pub metrics: Vec<String>,
    /// Every point, by index.
    pub points: Vec<Point>,
    /// The plan text as run (after `--set` overrides).
    pub source: String,
    /// Folder that relative trace paths are resolved against (the plan file's).
    pub base_dir: PathBuf,
}

/// A validated plan: every point's typed configuration and the plan hash.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The plan.
    pub plan: Plan,
    /// BLAKE2b-128 of the canonical plan and of every trace file it reads, 32 hex digits.
    pub hash: String,
    /// Typed configuration of every point, by index.
    pub configs: Vec<super::RunConfig>,
}

impl Plan {
    /// Read a plan file, apply `key=value` overrides (dotted TOML paths, e.g.
    /// `base.workload.config.sessions=50` or `axis.0.values=[1,2]`), parse and expand it.
    pub fn from_file(path: &Path, overrides: &[(String, String)]) -> Result<Plan> {
        let text = std::fs::read_to_string(path).map_err(SweepError::io(path))?;
        let in_file = |e: PlanError| {
            SweepError::Plan(PlanError::File {
                path: path.to_path_buf(),
                source: Box::new(e),
            })
        };
        let text = apply_overrides(&text, overrides).map_err(in_file)?;
        let dir = path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        Plan::parse(&text, &dir).map_err(|e| match e {
            SweepError::Plan(e) => in_file(e),
            other => other,
        })
    }

    /// Parse and expand plan text; relative trace paths resolve against `base_dir`.
    pub fn parse(text: &str, base_dir: &Path) -> Result<Plan> {
        let f: PlanFile = toml::from_str(text).map_err(|e| SweepError::Plan(PlanError::Toml(e)))?;
        if !f.base.is_object() {
            return Err(SweepError::Plan(PlanError::Rule(
                "[base] must be a table".into(),
            )));
        }
        let seeds_err = |what: String| SweepError::Plan(PlanError::field("seeds", what));
        let seeds = match f.seeds {
            None => vec![1],
            Some(SeedsFile::Count(0)) => return Err(seeds_err("expected at least 1".into())),
            Some(SeedsFile::Count(n)) => (1..=n).collect(),
            Some(SeedsFile::List(mut v)) => {
                if v.is_empty() {
                    return Err(seeds_err("expected at least one seed".into()));
                }
                v.sort_unstable();
                if let Some(w) = v.windows(2).find(|w| w[0] == w[1]) {
                    return Err(seeds_err(format!("{} is listed twice", w[0])));
                }
                v
            }
        };
        let metrics = metrics::select(f.kind, &f.metrics).map_err(SweepError::Plan)?;

        let mut axes = Vec::new();
        let mut groups: Vec<Option<String>> = Vec::new();
        for (i, a) in f.axis.into_iter().enumerate() {
            let axis_fault = |name: &str, path: &str, msg: PlanError| SweepError::Axis {
                axis: i + 1,
                name: name.to_string(),
                path: path.to_string(),
                value: String::new(),
                msg: Box::new(msg),
            };
            let axis_err =
                |name: &str, path: &str, msg: String| axis_fault(name, path, PlanError::Rule(msg));
            let path = a.path.trim().to_string();
            let name = a.name.clone().unwrap_or_else(|| path.clone());
            let segments: Vec<String> = path.split('.').map(str::to_string).collect();
            if let Some(bad) = segments.iter().find(|s| {
                s.is_empty()
                    || !s
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            }) {
                return Err(axis_err(
                    &name,
                    &path,
                    format!(
                        "path segment {bad:?}: expected letters, digits, `_` or `-` between dots"
                    ),
                ));
            }
            let values = match (a.values, a.range, a.log_range) {
                (Some(v), None, None) => v,
                (None, Some(r), None) => {
                    linear_range(&r).map_err(|m| axis_fault(&name, &path, m))?
                }
                (None, None, Some(r)) => log_range(&r).map_err(|m| axis_fault(&name, &path, m))?,
                _ => {
                    return Err(axis_err(
                        &name,
                        &path,
                        "expected exactly one of `values`, `range` or `log_range`".into(),
                    ))
                }
            };
            if values.is_empty() {
                return Err(axis_err(&name, &path, "no values".into()));
            }
            let key = match f.mode {
                Combine::Zip => Some(String::new()),
                Combine::Grid => a.zip.clone(),
            };
            let group = match key
                .as_ref()
                .and_then(|k| groups.iter().position(|g| g.as_ref() == Some(k)))
            {
                Some(g) => g,
                None => {
                    groups.push(key);
                    groups.len() - 1
                }
            };
            if let Some(first) = axes.iter().find(|x: &&Axis| x.group == group) {
                if first.values.len() != values.len() {
                    return Err(axis_err(
                        &name,
                        &path,
                        format!(
                            "zipped with axis `{}` ({} values) but has {} values",
                            first.name,
                            first.values.len(),
                            values.len()
                        ),
                    ));
                }
            }
            if RESERVED_COLUMNS.contains(&name.as_str()) {
                return Err(axis_err(
                    &name,
                    &path,
                    format!("`{name}` is a reserved column name; set `name`"),
                ));
            }
            if axes.iter().any(|x: &Axis| x.name == name) {
                return Err(axis_err(
                    &name,
                    &path,
                    "another axis has the same column name; set `name`".into(),
                ));
            }
            if axes.iter().any(|x: &Axis| x.path == path) {
                return Err(axis_err(
                    &name,
                    &path,
                    "another axis sets the same path".into(),
                ));
            }
            if let Some(m) = metrics.iter().find(|m| {
                name == **m
                    || ["mean", "ci95_lo", "ci95_hi"]
                        .iter()
                        .any(|s| name == format!("{m}.{s}"))
            }) {
                return Err(axis_err(
                    &name,
                    &path,
                    format!("the column name clashes with metric `{m}`; set `name`"),
                ));
            }
            axes.push(Axis {
                name,
                path,
                values,
                group,
                segments,
            });
        }

        // Each zip group is one dimension of the grid; its axes advance together.
        let sizes: Vec<usize> = (0..groups.len())
            .map(|g| {
                axes.iter()
                    .find(|a| a.group == g)
                    .map_or(1, |a| a.values.len())
            })
            .collect();
        for (g, _) in sizes.iter().enumerate() {
            let members: Vec<&Axis> = axes.iter().filter(|a| a.group == g).collect();
            let mut seen: BTreeMap<String, usize> = BTreeMap::new();
            for k in 0..members[0].values.len() {
                let tuple: Vec<&Value> = members.iter().map(|a| &a.values[k]).collect();
                let c = canonical_json(&Value::Array(tuple.into_iter().cloned().collect()));
                if let Some(prev) = seen.insert(c, k) {
                    let (pos, a) = axes
                        .iter()
                        .enumerate()
                        .find(|(_, a)| a.group == g)
                        .expect("group has an axis");
                    return Err(SweepError::Axis {
                        axis: pos + 1,
                        name: a.name.clone(),
                        path: a.path.clone(),
                        value: format!(" = {}", canonical_json(&a.values[k])),
                        msg: Box::new(PlanError::Rule(format!(
                            "values {} and {} give the same point{}",
                            prev + 1,
                            k + 1,
                            if members.len() > 1 {
                                " (with the axes zipped to it)"
                            } else {
                                ""
                            }
                        ))),
                    });
                }
            }
        }
        let total = sizes.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n));
        let total = match total {
            Some(t) if t <= MAX_POINTS => t,
            _ => {
                return Err(SweepError::Plan(PlanError::Rule(format!(
                    "the axes expand to more than {MAX_POINTS} points"
                ))))
            }
        };
        let mut points = Vec::with_capacity(total);
        let mut ids = BTreeMap::new();
        for n in 0..total {
            let mut rest = n;
            let mut gi = vec![0u32; sizes.len()];
            for g in (0..sizes.len()).rev() {
                gi[g] = (rest % sizes[g]) as u32;
                rest /= sizes[g];
            }
            let at: Vec<u32> = axes.iter().map(|a| gi[a.group]).collect();
            let pairs: Vec<Value> = axes
                .iter()
                .zip(&at)
                .map(|(a, &k)| {
                    Value::Array(vec![
                        Value::String(a.path.clone()),
                        a.values[k as usize].clone(),
                    ])
                })
                .collect();
            let id = hex(&Blake2b::<U8>::digest(
                canonical_json(&Value::Array(pairs)).as_bytes(),
            ));
            if let Some(prev) = ids.insert(id.clone(), n) {
                return Err(SweepError::Plan(PlanError::Rule(format!(
                    "points {prev} and {n} have the same id {id}: two points with equal axis values"
                ))));
            }
            points.push(Point {
                index: n as u32,
                id,
                at,
            });
        }
        Ok(Plan {
            kind: f.kind,
            combine: f.mode,
            base: f.base,
            axes,
            seeds,
            metrics,
            points,
            source: text.to_string(),
            base_dir: base_dir.to_path_buf(),
        })
    }

    /// Runs in the plan: points x seeds.
    pub fn runs(&self) -> usize {
        self.points.len() * self.seeds.len()
    }

    /// The value axis `a` takes at point `p`.
    pub fn value(&self, p: &Point, a: usize) -> &Value {
        &self.axes[a].values[p.at[a] as usize]
    }

    /// `name=value, ...` for messages (`base` with no axes).
    pub fn describe(&self, p: &Point) -> String {
        if self.axes.is_empty() {
            return "base".into();
        }
        self.axes
            .iter()
            .enumerate()
            .map(|(i, a)| format!("{}={}", a.name, canonical_json(self.value(p, i))))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The base with every axis value of `p` set.
    pub fn config_value(&self, p: &Point) -> Result<Value> {
        let mut v = self.base.clone();
        for (i, a) in self.axes.iter().enumerate() {
            set_path(&mut v, &a.segments, self.value(p, i).clone()).map_err(|msg| {
                SweepError::Axis {
                    axis: i + 1,
                    name: a.name.clone(),
                    path: a.path.clone(),
                    value: String::new(),
                    msg: Box::new(msg),
                }
            })?;
        }
        Ok(v)
    }

    /// The base with only axis `a`'s value `k` set.
    pub(crate) fn single_axis_value(&self, a: usize, k: usize) -> Result<Value, PlanError> {
        let mut v = self.base.clone();
        set_path(
            &mut v,
            &self.axes[a].segments,
            self.axes[a].values[k].clone(),
        )?;
        Ok(v)
    }

    /// Canonical JSON of everything that determines the results (sorted keys, no
    /// whitespace): what the plan hash is taken over, with the trace files' contents.
    pub fn canonical(&self) -> String {
        let axes: Vec<Value> = self
            .axes
            .iter()
            .map(|a| {
                serde_json::json!({
                    "name": a.name,
                    "path": a.path,
                    "values": a.values,
                    "group": a.group,
                })
            })
            .collect();
        canonical_json(&serde_json::json!({
            "format": FORMAT,
            "kind": self.kind,
            "mode": self.combine,
            "base": self.base,
            "axes": axes,
            "seeds": self.seeds,
            "metrics": self.metrics,
        }))
    }

    /// The indices of the points shard `index` of `count` runs (index mod count).
    pub fn shard_points(&self, index: u32, count: u32) -> impl Iterator<Item = &Point> + '_ {
        self.points
            .iter()
            .filter(move |p| p.index % count.max(1) == index)
    }
}

/// `bytes` as lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// BLAKE2b-128 of `parts` (each length-prefixed), as 32 hex digits.
pub(crate) fn hash128(parts: &[&[u8]]) -> String {
    let mut h = Blake2b::<U16>::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize())
}

/// BLAKE2b-128 of a file's bytes, streamed.
pub(crate) fn hash_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut h = Blake2b::<U16>::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// JSON with object keys sorted and no whitespace: equal values give equal text.
pub fn canonical_json(v: &Value) -> String {
    let mut s = String::new();
    write_canonical(v, &mut s);
    s
}

fn write_canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "a table",
    }
}

/// Set `segs` in `root`, creating tables on the way.
pub(crate) fn set_path(root: &mut Value, segs: &[String], v: Value) -> Result<(), PlanError> {
    let mut cur = root;
    for (i, s) in segs.iter().enumerate() {
        if cur.is_null() {
            *cur = Value::Object(Map::new());
        }
        let found = type_name(cur);
        let Value::Object(obj) = cur else {
            return Err(PlanError::NotATable {
                path: segs[..i].join("."),
                found,
                field: s.clone(),
            });
        };
        if i + 1 == segs.len() {
            obj.insert(s.clone(), v);
            return Ok(());
        }
        cur = obj
            .entry(s.clone())
            .or_insert_with(|| Value::Object(Map::new()));
    }
    Ok(())
}

fn as_num(field: &str, v: &Value) -> Result<(Option<i64>, f64), PlanError> {
    match v {
        Value::Number(n) => Ok((n.as_i64(), n.as_f64().unwrap_or(f64::NAN))),
        other => Err(PlanError::field(
            field,
            format!("expected a number, found {}", type_name(other)),
        )),
    }
}

/// Round to 12 significant digits, so `0.1 + 2 * 0.1` is written `0.3`.
fn tidy(x: f64) -> f64 {
    format!("{x:.11e}").parse().unwrap_or(x)
}

fn float_value(x: f64) -> Result<Value, PlanError> {
    serde_json::Number::from_f64(x)
        .map(Value::Number)
        .ok_or(PlanError::NotFinite(x))
}

/// `start, start + step, ...` up to `stop` (included when reached). Integers when all
/// three are integers.
fn linear_range(r: &RangeFile) -> Result<Vec<Value>, PlanError> {
    let (si, sf) = as_num("range.start", &r.start)?;
    let (ei, ef) = as_num("range.stop", &r.stop)?;
    let (ti, tf) = as_num("range.step", &r.step)?;
    if !(sf.is_finite() && ef.is_finite() && tf.is_finite()) {
        return Err(PlanError::field(
            "range",
            "start, stop and step must be finite",
        ));
    }
    if tf == 0.0 || (ef - sf) * tf < 0.0 {
        return Err(PlanError::field(
            "range",
            format!("step {tf} never goes from {sf} to {ef}"),
        ));
    }
    let n = ((ef - sf) / tf + 1e-9).floor() as u64 + 1;
    if n as usize > MAX_POINTS {
        return Err(PlanError::field(
            "range",
            format!("{n} values is more than {MAX_POINTS}"),
        ));
    }
    let mut out = Vec::with_capacity(n as usize);
    if let (Some(s), Some(_), Some(t)) = (si, ei, ti) {
        for k in 0..n as i64 {
            out.push(Value::from(s + k * t));
        }
    } else {
        for k in 0..n {
            out.push(float_value(tidy(sf + k as f64 * tf))?);
        }
    }
    Ok(out)
}

/// `num` values from `start` to `stop` (both included) evenly spaced in log scale.
/// Rounded to integers (duplicates dropped) when `start` and `stop` are integers.
fn log_range(r: &LogRangeFile) -> Result<Vec<Value>, PlanError> {
    let (si, sf) = as_num("log_range.start", &r.start)?;
    let (ei, ef) = as_num("log_range.stop", &r.stop)?;
    if !(sf > 0.0 && ef > 0.0 && sf.is_finite() && ef.is_finite()) {
        return Err(PlanError::field(
            "log_range",
            "start and stop must be positive and finite",
        ));
    }
    if r.num == 0 || r.num as usize > MAX_POINTS {
        return Err(PlanError::field(
            "log_range.num",
            format!("expected 1..={MAX_POINTS}"),
        ));
    }
    let at = |k: u32| -> f64 {
        if k == 0 {
            sf
        } else if k + 1 == r.num {
            ef
        } else {
            sf * (ef / sf).powf(f64::from(k) / f64::from(r.num - 1))
        }
    };
    let mut out = Vec::new();
    if let (Some(s), Some(e)) = (si, ei) {
        let mut last = None;
        for k in 0..r.num {
            let v = if k == 0 {
                s
            } else if k + 1 == r.num {
                e
            } else {
                at(k).round() as i64
            };
            if last != Some(v) {
                out.push(Value::from(v));
                last = Some(v);
            }
        }
    } else {
        for k in 0..r.num {
            out.push(float_value(tidy(at(k)))?);
        }
    }
    Ok(out)
}

/// Apply `key=value` overrides to plan text: each value is read as a TOML value (`8.0`,
/// `"30%"`, `[1, 2]`, `{ policy = "lru" }`) or, failing that, taken as a string. Dotted
/// keys reach nested tables (created as needed) and array elements by index. Returns the
/// text unchanged when there are no overrides.
pub fn apply_overrides(text: &str, overrides: &[(String, String)]) -> Result<String, PlanError> {
    if overrides.is_empty() {
        return Ok(text.to_string());
    }
    let mut doc: toml::Table = toml::from_str(text)?;
    for (key, raw) in overrides {
        let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .unwrap_or_else(|| toml::Value::String(raw.clone()));
        let segs: Vec<&str> = key.split('.').collect();
        if segs.iter().any(|s| s.is_empty()) {
            return Err(PlanError::field(
                format!("--set {key}"),
                "empty path segment",
            ));
        }
        let mut cur: &mut toml::Value = doc
            .entry(segs[0].to_string())
            .or_insert_with(|| toml::Value::Table(Default::default()));
        if segs.len() == 1 {
            *cur = value;
            continue;
        }
        for (i, s) in segs.iter().enumerate().skip(1) {
            let last = i + 1 == segs.len();
            let here = segs[..i].join(".");
            cur = match cur {
                toml::Value::Table(t) => {
                    if last {
                        t.insert((*s).to_string(), value.clone());
                        break;
                    }
                    t.entry((*s).to_string())
                        .or_insert_with(|| toml::Value::Table(Default::default()))
                }
                toml::Value::Array(a) => {
                    let k: usize = s.parse().map_err(|_| {
                        PlanError::field(
                            format!("--set {key}"),
                            format!("`{here}` is an array; expected an index, found {s:?}"),
                        )
                    })?;
                    let n = a.len();
                    let slot = a.get_mut(k).ok_or_else(|| {
                        PlanError::field(
                            format!("--set {key}"),
                            format!("`{here}` has {n} elements, no index {k}"),
                        )
                    })?;
                    if last {
                        *slot = value.clone();
                        break;
                    }
                    slot
                }
                _ => {
                    return Err(PlanError::field(
                        format!("--set {key}"),
                        format!("`{here}` is not a table or an array"),
                    ))
                }
            };
        }
    }
    Ok(toml::to_string(&doc)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replay plan with `top` before `[base]` and `axes` after it.
    fn plan(top: &str, axes: &str) -> Result<Plan> {
        let text = format!(
            "kind = \"replay\"\n{top}\n[base]\nworkload = {{ generator = \"w3\" }}\n{axes}"
        );
        Plan::parse(&text, Path::new("."))
    }

    fn values(p: &Plan, a: usize) -> String {
        canonical_json(&Value::Array(p.axes[a].values.clone()))
    }

    #[test]
    fn ranges_include_stop_and_keep_integers() {
        let p = plan(
            "",
            "[[axis]]\npath = \"a\"\nrange = { start = 0, stop = 20000, step = 5000 }\n[[axis]]\npath = \"b\"\nrange = { start = 0.1, stop = 0.3, step = 0.1 }\n[[axis]]\npath = \"c\"\nlog_range = { start = 1, stop = 100, num = 5 }\n[[axis]]\npath = \"d\"\nlog_range = { start = 0.5, stop = 8.0, num = 5 }\n",
        )
        .unwrap();
        assert_eq!(values(&p, 0), "[0,5000,10000,15000,20000]");
        assert_eq!(values(&p, 1), "[0.1,0.2,0.3]");
        assert_eq!(values(&p, 2), "[1,3,10,32,100]");
        assert_eq!(values(&p, 3), "[0.5,1.0,2.0,4.0,8.0]");
        assert_eq!(p.points.len(), 5 * 3 * 5 * 5);
    }

    #[test]
    fn grid_varies_the_last_axis_fastest_and_zip_groups_move_together() {
        let p = plan(
            "seeds = [3, 1]",
            "[[axis]]\npath = \"a\"\nvalues = [1, 2]\n[[axis]]\npath = \"b\"\nvalues = [\"x\", \"y\", \"z\"]\nzip = \"g\"\n[[axis]]\npath = \"c\"\nvalues = [10, 20, 30]\nzip = \"g\"\n",
        )
        .unwrap();
        assert_eq!(p.seeds, [1, 3]);
        assert_eq!(p.runs(), 12);
        let d: Vec<String> = p.points.iter().map(|x| p.describe(x)).collect();
        assert_eq!(d.len(), 6);
        assert_eq!(d[0], "a=1, b=\"x\", c=10");
        assert_eq!(d[1], "a=1, b=\"y\", c=20");
        assert_eq!(d[3], "a=2, b=\"x\", c=10");
        let z = plan(
            "mode = \"zip\"\nseeds = 2",
            "[[axis]]\npath = \"a\"\nvalues = [1, 2]\n[[axis]]\npath = \"b\"\nvalues = [3, 4]\n",
        )
        .unwrap();
        assert_eq!(z.points.len(), 2);
        assert_eq!(z.seeds, [1, 2]);
        assert_eq!(z.describe(&z.points[1]), "a=2, b=4");
        let shard: Vec<u32> = p.shard_points(1, 4).map(|x| x.index).collect();
        assert_eq!(shard, [1, 5]);
    }

    #[test]
    fn point_ids_depend_on_values_not_on_position() {
        let a = plan("", "[[axis]]\npath = \"a\"\nvalues = [1, 2]\n").unwrap();
        let b = plan("", "[[axis]]\npath = \"a\"\nvalues = [2, 1]\n").unwrap();
        assert_eq!(a.points[0].id, b.points[1].id);
        assert_ne!(a.points[0].id, a.points[1].id);
        assert_eq!(a.points[0].id.len(), 16);
    }

    #[test]
    fn bad_axes_and_plans_are_named() {
        let e = plan("", "[[axis]]\npath = \"a\"\nvalues = [1, 1]\n").unwrap_err();
        assert!(e.to_string().starts_with("axis 1 `a`"), "{e}");
        let e = plan(
            "",
            "[[axis]]\npath = \"a\"\nvalues = [1]\n[[axis]]\nname = \"x\"\npath = \"b\"\nvalues = [1, 2]\nzip = \"g\"\n[[axis]]\npath = \"c\"\nvalues = [1]\nzip = \"g\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("axis 3 `c`"), "{e}");
        let e = plan("", "[[axis]]\npath = \"a..b\"\nvalues = [1]\n").unwrap_err();
        assert!(e.to_string().starts_with("axis 1"), "{e}");
        let e = plan("", "[[axis]]\npath = \"seed\"\nvalues = [1]\n").unwrap_err();
        assert!(e.to_string().contains("reserved"), "{e}");
        let e = plan(
            "",
            "[[axis]]\npath = \"a\"\nrange = { start = 1, stop = 0, step = 1 }\n",
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("axis 1 `a`"), "{e}");
        let e = plan(
            "",
            "[[axis]]\npath = \"a\"\nvalues = [1]\nrange = { start = 1, stop = 2, step = 1 }\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("exactly one of"), "{e}");
        let e = plan(
            "",
            "[[axis]]\nname = \"completed\"\npath = \"a\"\nvalues = [1]\n",
        )
        .unwrap();
        assert_eq!(
            e.axes[0].name, "completed",
            "replay has no `completed` metric"
        );
        let e = plan(
            "",
            "[[axis]]\nname = \"total.hit_rate\"\npath = \"a\"\nvalues = [1]\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("clashes"), "{e}");
        assert!(plan("seeds = 0", "").is_err());
        assert!(plan("seeds = [1, 1]", "").is_err());
        assert!(plan("bogus = 1", "").is_err());
        let e = plan("metrics = [\"no_such_metric\"]", "").unwrap_err();
        assert!(e.to_string().contains("no_such_metric"), "{e}");
    }

    #[test]
    fn set_path_creates_tables_and_refuses_scalars() {
        let mut v = serde_json::json!({"a": {"b": 1}});
        set_path(
            &mut v,
            &["a".into(), "c".into(), "d".into()],
            Value::from(2),
        )
        .unwrap();
        assert_eq!(v, serde_json::json!({"a": {"b": 1, "c": {"d": 2}}}));
        let e = set_path(
            &mut v,
            &["a".into(), "b".into(), "x".into()],
            Value::from(3),
        )
        .unwrap_err();
        assert!(
            matches!(&e, PlanError::NotATable { path, found: "a number", field } if path == "a.b" && field == "x"),
            "{e}"
        );
        assert!(e.to_string().contains("`a.b` is a number"), "{e}");
    }

    #[test]
    fn overrides_reach_tables_and_arrays() {
        let text = "kind = \"replay\"\n[base]\nworkload = { generator = \"w3\" }\n[[axis]]\npath = \"a\"\nvalues = [1, 2]\n";
        let t = apply_overrides(
            text,
            &[
                ("base.workload.config.requests".into(), "50".into()),
                ("axis.0.values".into(), "[3, 4, 5]".into()),
                ("base.capacity".into(), "30%".into()),
                ("seeds".into(), "2".into()),
            ],
        )
        .unwrap();
        let p = Plan::parse(&t, Path::new(".")).unwrap();
        assert_eq!(p.points.len(), 3);
        assert_eq!(p.seeds, [1, 2]);
        assert_eq!(p.base["workload"]["config"]["requests"], 50);
        assert_eq!(p.base["capacity"], "30%");
        assert!(apply_overrides(text, &[("axis.5.values".into(), "1".into())]).is_err());
        assert_eq!(apply_overrides(text, &[]).unwrap(), text);
    }

    #[test]
    fn canonical_json_sorts_keys() {
        let v = serde_json::json!({"b": [1, 2.5, {"d": 1, "c": null}], "a": "x"});
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"x","b":[1,2.5,{"c":null,"d":1}]}"#
        );
    }
}

//! ServeGen-driven multimodal requests (Alibaba ServeGen, Qwen-VL production clients).
//!
//! Reads `chunk-N-trace.csv` (`window_start_s,rate,cv,dist,arg1,arg2`: a 600 s window's
//! request rate and fitted inter-arrival distribution) and `chunk-N-dataset.json`
//! (per dataset window, Python-style `{value: probability}` dicts of `text_tokens`,
//! `image_tokens`, `image_count`, `output_tokens`, ...). Each chunk is one client, its own
//! tenant. Within each trace window, arrivals follow the fitted distribution's *shape*
//! (`Gamma` shape = arg1, `Weibull` shape = arg1, `Exponential`), with its scale set so
//! the mean gap is `1 / (rate * rate_scale)`; the renewal process restarts at each window
//! start. A window with rate 0 or no distribution has no arrivals; an unknown
//! distribution name falls back to exponential at the window's rate when
//! `unknown_dist = "exponential"` (the default) or is an error with `"error"`.
//! Per request, from the dataset window in force (the latest start <= the arrival, as in
//! ServeGen; windows with an empty dict are skipped): an image count, then each image's
//! visual tokens (`image_tokens` is read as per image, as its 1,280-token cap suggests),
//! text tokens and output tokens. Prompt = text + visual tokens; prefix blocks are fresh
//! (ServeGen has no prefix information); images are fresh unless `repeat_rate` > 0.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::{Path, PathBuf};

use moonagent_core::rng::Rng;
use serde::{Deserialize, Serialize};

use super::dist::{parse_py_dict, secs_to_ns, Discrete, InterArrival};
use super::{check_at_least_one, check_positive, check_prob, BlockIds, ImageSource};
use crate::error::{Location, TraceError};
use crate::schema::{blocks_for_tokens, Request, TraceHeader};

/// What to do with a window whose distribution name is not Gamma, Weibull or Exponential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownDist {
    /// Use exponential gaps at the window's rate.
    Exponential,
    /// Fail, naming the file, line and distribution.
    Error,
}

/// Knobs of the ServeGen generator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServeGenConfig {
    /// Folder with `chunk-N-*.{csv,json}`; default `$MOONAGENT_TRACES/servegen-mm-image`.
    pub dir: Option<PathBuf>,
    /// Chunks (clients) to use; empty = every chunk in the folder.
    pub chunks: Vec<u32>,
    /// Start of the replayed span in trace time, seconds (default 0).
    pub start_s: f64,
    /// Length of the replayed span, seconds (default 3,600).
    pub duration_s: f64,
    /// Multiplier on every window's rate (default 1).
    pub rate_scale: f64,
    /// Stop after this many requests (default: no limit).
    pub max_requests: Option<u64>,
    /// Chance an image reference repeats a recent image (default 0: ServeGen has no ids).
    pub repeat_rate: f64,
    /// Distinct recent images repeats are drawn from (default 4,096).
    pub repeat_pool: u32,
    /// Unknown distribution names: `exponential` (default) or `error`.
    pub unknown_dist: UnknownDist,
    /// Tokens per prefix block (default 64).
    pub block_size_tokens: u32,
}

impl Default for ServeGenConfig {
    fn default() -> Self {
        Self {
            dir: None,
            chunks: Vec::new(),
            start_s: 0.0,
            duration_s: 3600.0,
            rate_scale: 1.0,
            max_requests: None,
            repeat_rate: 0.0,
            repeat_pool: 4096,
            unknown_dist: UnknownDist::Exponential,
            block_size_tokens: 64,
        }
    }
}

/// One 600 s window of a client's arrival process.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    /// Window start, seconds.
    pub start_s: f64,
    /// Window end, seconds.
    pub end_s: f64,
    /// Requests per second (0 = idle).
    pub rate: f64,
    /// Gap distribution shape.
    pub dist: Option<InterArrival>,
}

/// One dataset window of a client's request-size distributions.
#[derive(Debug, Clone)]
pub struct DatasetWindow {
    /// Window start, seconds.
    pub start_s: f64,
    /// Text tokens per request.
    pub text_tokens: Discrete,
    /// Visual tokens per image.
    pub image_tokens: Discrete,
    /// Images per request.
    pub image_count: Discrete,
    /// Output tokens per request.
    pub output_tokens: Discrete,
}

/// One client (chunk): arrival windows and dataset windows.
#[derive(Debug, Clone)]
pub struct Client {
    /// Chunk number.
    pub chunk: u32,
    /// Arrival windows in time order.
    pub windows: Vec<Window>,
    /// Dataset windows in time order.
    pub dataset: Vec<DatasetWindow>,
    /// Windows whose distribution name was unknown (replaced by exponential).
    pub unknown_dists: u64,
}

fn read_text(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|e| TraceError::io(path, e))
}

/// Parse a `chunk-N-trace.csv`.
pub fn parse_trace_csv(
    text: &str,
    file: &Path,
    unknown: UnknownDist,
) -> Result<(Vec<Window>, u64), TraceError> {
    let mut rows: Vec<(f64, f64, Option<InterArrival>)> = Vec::new();
    let mut unknown_count = 0;
    for (i, line) in text.lines().enumerate() {
        let at = Location::Line(i as u64 + 1);
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let cols: Vec<&str> = line.split(',').map(str::trim).collect();
        if cols.len() != 6 {
            return Err(TraceError::invalid(
                file,
                at,
                "(row)",
                format!(
                    "{} columns; expected 6: window_start_s,rate,cv,dist,arg1,arg2",
                    cols.len()
                ),
            ));
        }
        if i == 0 && cols[0].parse::<f64>().is_err() {
            continue; // a header row
        }
        let num = |k: usize, name: &str| -> Result<f64, TraceError> {
            let v: f64 = cols[k].parse().map_err(|_| {
                TraceError::invalid(
                    file,
                    at,
                    name,
                    format!("expected a number, found {:?}", cols[k]),
                )
            })?;
            if v.is_finite() && v >= 0.0 {
                Ok(v)
            } else {
                Err(TraceError::invalid(
                    file,
                    at,
                    name,
                    format!("expected a non-negative number, found {v}"),
                ))
            }
        };
        let start = num(0, "window_start_s")?;
        let rate = num(1, "rate")?;
        if let Some(&(prev, _, _)) = rows.last() {
            if start <= prev {
                return Err(TraceError::invalid(
                    file,
                    at,
                    "window_start_s",
                    format!("{start} is not after the previous window's {prev}; expected increasing starts"),
                ));
            }
        }
        let dist = match cols[3] {
            "" => None,
            "Exponential" | "Expon" | "Poisson" => Some(InterArrival::Exponential),
            "Gamma" | "Weibull" => {
                let shape = num(4, "arg1")?;
                if shape <= 0.0 {
                    return Err(TraceError::invalid(
                        file,
                        at,
                        "arg1",
                        "expected a positive shape, found 0",
                    ));
                }
                Some(if cols[3] == "Gamma" {
                    InterArrival::Gamma { shape }
                } else {
                    InterArrival::Weibull { shape }
                })
            }
            other => match unknown {
                UnknownDist::Exponential => {
                    unknown_count += 1;
                    Some(InterArrival::Exponential)
                }
                UnknownDist::Error => {
                    return Err(TraceError::invalid(
                        file,
                        at,
                        "dist",
                        format!(
                        "unknown distribution {other:?}; expected Gamma, Weibull or Exponential"
                    ),
                    ))
                }
            },
        };
        rows.push((start, rate, dist));
    }
    let mut windows = Vec::with_capacity(rows.len());
    let default_len = if rows.len() >= 2 {
        rows[1].0 - rows[0].0
    } else {
        600.0
    };
    for (i, &(start, rate, dist)) in rows.iter().enumerate() {
        let end = rows.get(i + 1).map(|r| r.0).unwrap_or(start + default_len);
        windows.push(Window {
            start_s: start,
            end_s: end,
            rate,
            dist: if rate > 0.0 { dist } else { None },
        });
    }
    Ok((windows, unknown_count))
}

/// Parse a `chunk-N-dataset.json`.
pub fn parse_dataset_json(text: &str, file: &Path) -> Result<Vec<DatasetWindow>, TraceError> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        TraceError::invalid(
            file,
            Location::Line(e.line() as u64),
            "(json)",
            format!("{e}; expected a JSON object"),
        )
    })?;
    let obj = v.as_object().ok_or_else(|| {
        TraceError::invalid(
            file,
            Location::File,
            "(json)",
            "expected an object {window_start_s: {...}}",
        )
    })?;
    let mut out = Vec::new();
    'windows: for (k, fields) in obj {
        let start: f64 = k.parse().map_err(|_| {
            TraceError::invalid(
                file,
                Location::File,
                k.as_str(),
                "expected a window start in seconds as the key",
            )
        })?;
        let get = |name: &str| -> Result<Option<Discrete>, TraceError> {
            let field = format!("{k}.{name}");
            let s = fields.get(name).and_then(|x| x.as_str()).ok_or_else(|| {
                TraceError::invalid(
                    file,
                    Location::File,
                    field.as_str(),
                    "missing; expected a string holding a {value: probability} dict",
                )
            })?;
            let pairs = parse_py_dict(s).map_err(|p| {
                TraceError::invalid(file, Location::File, field.as_str(), p.to_string())
            })?;
            Ok(Discrete::new(&pairs))
        };
        let (Some(text_tokens), Some(image_tokens), Some(image_count), Some(output_tokens)) = (
            get("text_tokens")?,
            get("image_tokens")?,
            get("image_count")?,
            get("output_tokens")?,
        ) else {
            continue 'windows; // ServeGen skips windows with an empty distribution
        };
        out.push(DatasetWindow {
            start_s: start,
            text_tokens,
            image_tokens,
            image_count,
            output_tokens,
        });
    }
    out.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    Ok(out)
}

/// Load chunk `chunk` of a ServeGen folder.
pub fn load_client(dir: &Path, chunk: u32, unknown: UnknownDist) -> Result<Client, TraceError> {
    let tp = dir.join(format!("chunk-{chunk}-trace.csv"));
    let dp = dir.join(format!("chunk-{chunk}-dataset.json"));
    let (windows, unknown_dists) = parse_trace_csv(&read_text(&tp)?, &tp, unknown)?;
    let dataset = parse_dataset_json(&read_text(&dp)?, &dp)?;
    if dataset.is_empty() {
        return Err(TraceError::invalid(
            &dp,
            Location::File,
            "(json)",
            "no usable dataset window; expected at least one",
        ));
    }
    Ok(Client {
        chunk,
        windows,
        dataset,
        unknown_dists,
    })
}

/// Chunk numbers present in a ServeGen folder, sorted.
pub fn list_chunks(dir: &Path) -> Result<Vec<u32>, TraceError> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| TraceError::io(dir, e))? {
        let e = e.map_err(|e| TraceError::io(dir, e))?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name
            .strip_prefix("chunk-")
            .and_then(|r| r.strip_suffix("-trace.csv"))
        {
            if let Ok(n) = n.parse() {
                out.push(n);
            }
        }
    }
    out.sort_unstable();
    Ok(out)
}

struct ClientState {
    client: Client,
    tenant: u32,
    rng: Rng,
    window: usize,
}

impl ClientState {
    /// Advance to the client's next arrival at or after `t_s` (seconds, trace time).
    fn advance(&mut self, mut t_s: f64, span_end_s: f64, scale: f64) -> Option<f64> {
        while self.window < self.client.windows.len() {
            let w = &self.client.windows[self.window];
            if w.start_s >= span_end_s {
                return None;
            }
            if let (Some(d), true) = (w.dist, w.rate > 0.0) {
                let t = t_s.max(w.start_s) + d.sample(&mut self.rng, 1.0 / (w.rate * scale));
                if t < w.end_s {
                    return (t < span_end_s).then_some(t);
                }
            }
            self.window += 1;
            if let Some(nw) = self.client.windows.get(self.window) {
                t_s = nw.start_s;
            }
        }
        None
    }
}

/// The ServeGen generator: an iterator of requests in arrival order.
pub struct ServeGenGen {
    cfg: ServeGenConfig,
    header: TraceHeader,
    clients: Vec<ClientState>,
    heap: BinaryHeap<Reverse<(u64, usize)>>,
    images: ImageSource,
    blocks: BlockIds,
    next_id: u64,
}

impl ServeGenGen {
    /// A generator from `cfg` and `seed`; reads the folder's files now.
    pub fn new(cfg: ServeGenConfig, seed: u64) -> Result<Self, TraceError> {
        check_positive("duration_s", cfg.duration_s)?;
        check_positive("rate_scale", cfg.rate_scale)?;
        check_prob("repeat_rate", cfg.repeat_rate)?;
        if !(cfg.start_s.is_finite() && cfg.start_s >= 0.0) {
            return Err(TraceError::config(
                "start_s",
                "expected a non-negative number",
            ));
        }
        check_at_least_one("block_size_tokens", cfg.block_size_tokens)?;
        let dir = match &cfg.dir {
            Some(d) => d.clone(),
            None => std::env::var_os(crate::TRACES_ENV)
                .map(|b| crate::resolve(&b, "servegen-mm-image"))
                .ok_or_else(|| {
                    TraceError::config(
                        "dir",
                        format!("not set and {} is unset; expected the servegen-mm-image folder (public original: github.com/alibaba/ServeGen)", crate::TRACES_ENV),
                    )
                })?,
        };
        let chunks = if cfg.chunks.is_empty() {
            list_chunks(&dir)?
        } else {
            cfg.chunks.clone()
        };
        if chunks.is_empty() {
            return Err(TraceError::config(
                "chunks",
                format!("no chunk-N-trace.csv in {}", dir.display()),
            ));
        }
        let mut clients = Vec::with_capacity(chunks.len());
        let mut unknown = 0;
        for &chunk in &chunks {
            let client = load_client(&dir, chunk, cfg.unknown_dist)?;
            unknown += client.unknown_dists;
            clients.push(ClientState {
                tenant: chunk,
                rng: Rng::stream(seed, "servegen.client").child(u64::from(chunk)),
                window: 0,
                client,
            });
        }
        let mut header = TraceHeader::new("servegen", cfg.block_size_tokens);
        header.seed = Some(seed);
        // The folder's name only: the header must not depend on where the data sits.
        let folder = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        header.source = Some(format!("ServeGen {folder}, chunks {chunks:?}"));
        header.config = serde_json::to_value(&cfg).ok();
        if unknown > 0 {
            header.notes = Some(format!(
                "{unknown} windows with an unknown distribution used exponential gaps"
            ));
        }
        let mut g = Self {
            images: ImageSource::new(
                &super::default_image_sizes(),
                cfg.repeat_rate,
                cfg.repeat_pool,
                1,
            )?,
            blocks: BlockIds::default(),
            heap: BinaryHeap::new(),
            next_id: 0,
            header,
            clients,
            cfg,
        };
        let end = g.cfg.start_s + g.cfg.duration_s;
        for i in 0..g.clients.len() {
            g.schedule(i, g.cfg.start_s, end);
        }
        Ok(g)
    }

    /// The header of the trace this generator produces.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    fn schedule(&mut self, i: usize, from_s: f64, end_s: f64) {
        let c = &mut self.clients[i];
        if let Some(t) = c.advance(from_s, end_s, self.cfg.rate_scale) {
            let ns = secs_to_ns(t - self.cfg.start_s);
            self.heap.push(Reverse((ns, i)));
        }
    }
}

impl Iterator for ServeGenGen {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        if self.cfg.max_requests.is_some_and(|m| self.next_id >= m) {
            return None;
        }
        let Reverse((ns, i)) = self.heap.pop()?;
        let t_s = self.cfg.start_s + ns as f64 / 1e9;
        let c = &mut self.clients[i];
        let ds = &c.client.dataset;
        let k = ds.partition_point(|d| d.start_s <= t_s).max(1) - 1;
        let d = &ds[k];
        let rng = &mut c.rng;
        let n_images = d.image_count.sample(rng);
        let mut images = Vec::with_capacity(n_images.min(64) as usize);
        for _ in 0..n_images {
            let tokens = d.image_tokens.sample(rng).clamp(1, u64::from(u32::MAX)) as u32;
            let img = self
                .images
                .next(rng, &images, |s, _| s.fresh_tokens(tokens));
            images.push(img);
        }
        let text = d.text_tokens.sample(rng);
        let output = d.output_tokens.sample(rng).min(u64::from(u32::MAX)) as u32;
        let visual: u64 = images.iter().map(|i| u64::from(i.visual_tokens)).sum();
        let prompt = (text + visual).min(u64::from(u32::MAX)) as u32;
        let mut prompt_blocks = Vec::new();
        self.blocks.extend(
            &mut prompt_blocks,
            blocks_for_tokens(prompt, self.cfg.block_size_tokens),
        );
        let tenant = c.tenant;
        let id = self.next_id;
        self.next_id += 1;
        let end = self.cfg.start_s + self.cfg.duration_s;
        self.schedule(i, t_s, end);
        Some(Request {
            id,
            arrival_ns: ns,
            session: id,
            turn: 0,
            tenant,
            prompt_tokens: prompt,
            prompt_blocks,
            images,
            output_tokens: output,
            fork: None,
        })
    }
}

//! `moonagent validate compare`: the simulator against a measured run, request by request.
//!
//! The measured side is the run's input log: the engine is a function of its inputs, so
//! replaying the log through a fresh engine gives back the measured per-request records
//! exactly (arrival, stage and finish times as the backend saw them). The simulated side
//! runs the same trace, with each request arriving when it arrived in the measured run,
//! under the same configuration with the hardware profile given (the fitted one). The two
//! are joined by request and compared per metric.

use std::path::Path;

use moonagent_core::serve::toy::{replay_inputs, Input};
use moonagent_core::serve::{RequestRecord, NONE};
use moonagent_sim::des::{simulate, SimConfig, SimError, Simulation, StepLog, Summary};
use moonagent_sim::plot::{sim_vs_measured, Pairs};
use moonagent_sim::table::{Column, Table};
use moonagent_traces::schema::Request;
use serde::Serialize;

use crate::backend::{Step, Timed, Work};
use crate::measure::{engine, mem_store, write_lines, MeasureError};

/// The file a comparison's simulated steps go to, beside a run's measured `timed.jsonl`.
pub const SIM_TIMED: &str = "simulated-timed.jsonl";

/// Error of one metric, simulated against measured, over the requests both finished.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct MetricError {
    /// Requests compared.
    pub n: usize,
    /// Median measured value, ms.
    pub measured_p50_ms: f64,
    /// Median simulated value, ms.
    pub simulated_p50_ms: f64,
    /// Median |sim - meas| / meas, percent.
    pub median_abs_pct: f64,
    /// 90th percentile of |sim - meas| / meas, percent.
    pub p90_abs_pct: f64,
    /// Mean (sim - meas) / meas, percent: positive when the simulator is too slow.
    pub bias_pct: f64,
    /// Pearson correlation of simulated and measured values.
    pub pearson_r: f64,
}

impl MetricError {
    /// Over pairs `(measured, simulated)`, ns.
    pub fn of(pairs: &[(u64, u64)]) -> Self {
        let pairs: Vec<(f64, f64)> = pairs
            .iter()
            .filter(|(m, _)| *m > 0)
            .map(|&(m, s)| (m as f64, s as f64))
            .collect();
        if pairs.is_empty() {
            return Self::default();
        }
        let n = pairs.len();
        let signed: Vec<f64> = pairs.iter().map(|(m, s)| 100.0 * (s - m) / m).collect();
        let mut abs: Vec<f64> = signed.iter().map(|e| e.abs()).collect();
        abs.sort_by(f64::total_cmp);
        let q = |v: &[f64], p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        let mut ms: Vec<f64> = pairs.iter().map(|p| p.0).collect();
        let mut ss: Vec<f64> = pairs.iter().map(|p| p.1).collect();
        let r = pearson(&ms, &ss);
        ms.sort_by(f64::total_cmp);
        ss.sort_by(f64::total_cmp);
        MetricError {
            n,
            measured_p50_ms: q(&ms, 0.5) / 1e6,
            simulated_p50_ms: q(&ss, 0.5) / 1e6,
            median_abs_pct: q(&abs, 0.5),
            p90_abs_pct: q(&abs, 0.9),
            bias_pct: signed.iter().sum::<f64>() / n as f64,
            pearson_r: r,
        }
    }
}

fn pearson(a: &[f64], b: &[f64]) -> f64 {
    let n = a.len() as f64;
    let (ma, mb) = (a.iter().sum::<f64>() / n, b.iter().sum::<f64>() / n);
    let (mut sab, mut saa, mut sbb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        sab += (x - ma) * (y - mb);
        saa += (x - ma) * (x - ma);
        sbb += (y - mb) * (y - mb);
    }
    if saa == 0.0 || sbb == 0.0 {
        return f64::NAN;
    }
    sab / (saa * sbb).sqrt()
}

/// The comparison of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Mode.
    pub mode: String,
    /// What this run was (mode, load, repeat), for legends.
    pub label: String,
    /// Requests in the trace.
    pub requests: usize,
    /// Time to first token.
    pub ttft: MetricError,
    /// End to end.
    pub e2e: MetricError,
    /// Time per output token.
    pub tpot: MetricError,
    /// Encode stage (first encode start to last encode end of the request's own path).
    pub encode_stage: MetricError,
    /// Prefill stage.
    pub prefill_stage: MetricError,
    /// Decode stage (first token to finish).
    pub decode_stage: MetricError,
    /// Measured and simulated throughput, completed requests per second of makespan.
    pub throughput_rps: (f64, f64),
    /// Measured and simulated image hit rate.
    pub image_hit_rate: (f64, f64),
    /// Measured and simulated prefix-KV block hit rate.
    pub kv_block_hit_rate: (f64, f64),
    /// Simulated summary.
    #[serde(skip)]
    pub simulated: Summary,
    /// Measured summary.
    #[serde(skip)]
    pub measured: Summary,
    /// Per-request pairs (measured, simulated) records.
    #[serde(skip)]
    pub pairs: Vec<(RequestRecord, RequestRecord)>,
    /// The simulated run's compute steps as the backend's `timed.jsonl` records them
    /// ([`sim_timed`]), in start order.
    #[serde(skip)]
    pub sim_steps: Vec<Timed>,
}

/// The simulator's compute steps as the backend records measured ones: the step's shape,
/// its worker, start and span (`measured_ns`: end - start in simulated time) and, as
/// `waited_ns`, what the span holds beyond the step's priced time alone (on shared cores,
/// what processor sharing stretched it by). So `timed.jsonl` tools read either run.
pub fn sim_timed(steps: &[StepLog]) -> Vec<Timed> {
    steps
        .iter()
        .filter_map(|s| {
            let (worker, step) = Step::of_action(&s.action)?;
            let span = s.end_ns.saturating_sub(s.start_ns);
            Some(Timed {
                worker,
                what: Work::Step(step),
                start_ns: s.start_ns,
                measured_ns: span,
                waited_ns: span.saturating_sub(s.priced_ns),
            })
        })
        .collect()
}

/// `trace` with each request arriving when the run logged in `inputs` saw it arrive; an
/// error unless every request of `trace` arrived in the log exactly once (the trace is
/// the run's).
fn arrivals_of(trace: &[Request], inputs: &[(u64, Input)]) -> Result<Vec<Request>, MeasureError> {
    let mut timed = trace.to_vec();
    let mut seen = vec![false; trace.len()];
    let (mut arrivals, mut max_seen, mut ok) = (0, 0, true);
    for &(t, input) in inputs {
        if let Input::Arrive(i) = input {
            arrivals += 1;
            max_seen = max_seen.max(i.saturating_add(1));
            match (timed.get_mut(i), seen.get_mut(i)) {
                (Some(r), Some(s)) if !*s => {
                    r.arrival_ns = t;
                    *s = true;
                }
                _ => ok = false,
            }
        }
    }
    if !ok || arrivals != trace.len() {
        return Err(MeasureError::NotTheRunsTrace {
            arrivals,
            max_seen,
            requests: trace.len(),
        });
    }
    Ok(timed)
}

/// The simulator against itself: the run's arrivals (`inputs`) simulated with profile `a`
/// (as "measured") and with profile `b`, per-request TTFT and E2E compared as
/// [`compare`] compares a run. How much per-request error a given difference between two
/// profiles causes on its own (e.g. `b` = `a` with every step a few percent slower).
pub fn sim_vs_sim(
    cfg: &SimConfig,
    trace: &[Request],
    block_size: u32,
    inputs: &[(u64, Input)],
    a: &str,
    b: &str,
) -> Result<(MetricError, MetricError), MeasureError> {
    let timed = arrivals_of(trace, inputs)?;
    let run = |hw: &str| {
        let c = SimConfig {
            hardware: hw.to_string(),
            ..cfg.clone()
        };
        simulate(&c, &timed, block_size).map(|(_, recs)| recs)
    };
    let (ra, rb) = (run(a)?, run(b)?);
    let pairs: Vec<(&RequestRecord, &RequestRecord)> = ra
        .iter()
        .zip(&rb)
        .filter(|(x, y)| x.finish_ns != NONE && y.finish_ns != NONE)
        .collect();
    Ok(ttft_e2e(&pairs))
}

/// TTFT and E2E errors over record pairs `(reference, other)`.
fn ttft_e2e(pairs: &[(&RequestRecord, &RequestRecord)]) -> (MetricError, MetricError) {
    let metric = |f: &dyn Fn(&RequestRecord) -> u64| {
        let v: Vec<(u64, u64)> = pairs.iter().map(|(x, y)| (f(x), f(y))).collect();
        MetricError::of(&v)
    };
    (metric(&|r| r.ttft_ns()), metric(&|r| r.e2e_ns()))
}

/// Two measured runs of the same trace against each other, request by request: TTFT and
/// E2E of `b`'s measured records against `a`'s (as "measured"), over the requests both
/// finished. The machine's own repeatability, the floor under any simulator's error.
pub fn repeat_difference(a: &Comparison, b: &Comparison) -> (MetricError, MetricError) {
    let by_id: std::collections::HashMap<u64, &RequestRecord> =
        b.pairs.iter().map(|(m, _)| (m.id, m)).collect();
    let pairs: Vec<(&RequestRecord, &RequestRecord)> = a
        .pairs
        .iter()
        .filter_map(|(m, _)| Some((m, *by_id.get(&m.id)?)))
        .collect();
    ttft_e2e(&pairs)
}

/// Compare the run logged in `inputs` (over `trace` under `cfg`) with the simulator under
/// `cfg` with `sim_hardware` as its profile.
pub fn compare(
    cfg: &SimConfig,
    trace: &[Request],
    block_size: u32,
    inputs: &[(u64, Input)],
    sim_hardware: &str,
) -> Result<Comparison, MeasureError> {
    let timed_trace = arrivals_of(trace, inputs)?;
    // The measured records, from the log.
    let mut e = engine(cfg, trace, block_size, mem_store(cfg)?)?;
    replay_inputs(&mut e, inputs).map_err(SimError::Serve)?;
    let measured_recs: Vec<RequestRecord> = e.served().iter().map(|s| s.rec).collect();
    let measured_done: Vec<bool> = e.served().iter().map(|s| s.done).collect();
    let c = *e.counters();
    let readbacks = e.cache().counters().readbacks;
    let measured = Summary::of_run(
        cfg.mode,
        &cfg.slo,
        &measured_recs,
        &measured_done,
        &c,
        readbacks,
    );
    drop(e);
    let sim_cfg = SimConfig {
        hardware: sim_hardware.to_string(),
        ..cfg.clone()
    };
    let run = Simulation::new(&sim_cfg, &timed_trace, block_size)?
        .log_steps()
        .run_all()?;
    let (simulated, sim_recs) = (run.summary, run.requests);
    let pairs: Vec<(RequestRecord, RequestRecord)> = measured_recs
        .into_iter()
        .zip(sim_recs)
        .filter(|(m, s)| m.finish_ns != NONE && s.finish_ns != NONE)
        .collect();
    let metric = |f: &dyn Fn(&RequestRecord) -> Option<u64>| {
        let v: Vec<(u64, u64)> = pairs
            .iter()
            .filter_map(|(m, s)| Some((f(m)?, f(s)?)))
            .collect();
        MetricError::of(&v)
    };
    let span = |a: u64, b: u64| (a != NONE && b != NONE && b >= a).then(|| b - a);
    Ok(Comparison {
        mode: cfg.mode.name().into(),
        label: cfg.mode.name().into(),
        requests: trace.len(),
        ttft: metric(&|r| Some(r.ttft_ns())),
        e2e: metric(&|r| Some(r.e2e_ns())),
        tpot: metric(&|r| (r.output_tokens > 1).then(|| r.tpot_ns())),
        encode_stage: metric(&|r| span(r.encode_start_ns, r.encode_end_ns)),
        prefill_stage: metric(&|r| span(r.prefill_start_ns, r.prefill_end_ns)),
        decode_stage: metric(&|r| span(r.first_token_ns, r.finish_ns)),
        throughput_rps: (measured.throughput_rps, simulated.throughput_rps),
        image_hit_rate: (measured.image_hit_rate, simulated.image_hit_rate),
        kv_block_hit_rate: (measured.kv_block_hit_rate, simulated.kv_block_hit_rate),
        simulated,
        measured,
        pairs,
        sim_steps: sim_timed(&run.steps),
    })
}

impl Comparison {
    /// A Markdown report.
    pub fn markdown(&self, title: &str) -> String {
        let mut s = format!(
            "## {title}: {} ({} requests, {} compared)\n\n",
            self.mode,
            self.requests,
            self.pairs.len()
        );
        s.push_str("| metric | n | measured p50 ms | simulated p50 ms | median abs err % | P90 abs err % | bias % | Pearson r |\n|---|---|---|---|---|---|---|---|\n");
        for (name, m) in [
            ("TTFT", &self.ttft),
            ("E2E", &self.e2e),
            ("TPOT", &self.tpot),
            ("encode stage", &self.encode_stage),
            ("prefill stage", &self.prefill_stage),
            ("decode stage", &self.decode_stage),
        ] {
            s.push_str(&format!(
                "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:+.1} | {:.3} |\n",
                m.n,
                m.measured_p50_ms,
                m.simulated_p50_ms,
                m.median_abs_pct,
                m.p90_abs_pct,
                m.bias_pct,
                m.pearson_r
            ));
        }
        let rel = |(m, s): (f64, f64)| if m > 0.0 { 100.0 * (s - m) / m } else { 0.0 };
        s.push_str(&format!(
            "\n| | measured | simulated | difference |\n|---|---|---|---|\n| throughput req/s | {:.3} | {:.3} | {:+.1}% |\n| image hit rate | {:.1}% | {:.1}% | {:+.1} pt |\n| KV block hit rate | {:.1}% | {:.1}% | {:+.1} pt |\n",
            self.throughput_rps.0,
            self.throughput_rps.1,
            rel(self.throughput_rps),
            100.0 * self.image_hit_rate.0,
            100.0 * self.image_hit_rate.1,
            100.0 * (self.image_hit_rate.1 - self.image_hit_rate.0),
            100.0 * self.kv_block_hit_rate.0,
            100.0 * self.kv_block_hit_rate.1,
            100.0 * (self.kv_block_hit_rate.1 - self.kv_block_hit_rate.0),
        ));
        s
    }
}

/// Write `compare.md` (each comparison's report, then `appendix` when it is not empty),
/// `compare.json` and `compare.parquet` (every comparison's pairs) into `dir`, and each
/// comparison's simulated steps as `simulated-timed.jsonl` (`simulated-timed-<i>.jsonl`
/// for the i-th of several).
pub fn write(
    dir: &Path,
    title: &str,
    cs: &[Comparison],
    appendix: &str,
) -> Result<(), MeasureError> {
    let file = |path: &Path, e: &dyn std::fmt::Display| MeasureError::writing(path, e);
    std::fs::create_dir_all(dir).map_err(|e| file(dir, &e))?;
    let mut md: String = cs.iter().map(|c| c.markdown(title) + "\n").collect();
    if !appendix.is_empty() {
        md.push('\n');
        md.push_str(appendix);
    }
    let p = dir.join("compare.md");
    std::fs::write(&p, md).map_err(|e| file(&p, &e))?;
    let p = dir.join("compare.json");
    let text = serde_json::to_string_pretty(cs).map_err(|e| file(&p, &e))?;
    std::fs::write(&p, text).map_err(|e| file(&p, &e))?;
    let p = dir.join("compare.parquet");
    table(cs).write_parquet(&p).map_err(|e| file(&p, &e))?;
    for (i, c) in cs.iter().enumerate() {
        let name = match cs.len() {
            1 => SIM_TIMED.to_string(),
            _ => format!("simulated-timed-{i}.jsonl"),
        };
        write_lines(&dir.join(name), &c.sim_steps)?;
    }
    for (name, f) in [
        (
            "TTFT",
            (|r: &RequestRecord| r.ttft_ns()) as fn(&RequestRecord) -> u64,
        ),
        ("E2E", |r: &RequestRecord| r.e2e_ns()),
    ] {
        let series: Vec<Pairs> = cs
            .iter()
            .map(|c| Pairs {
                label: c.label.clone(),
                points: c
                    .pairs
                    .iter()
                    .map(|(m, s)| (f(m) as f64 / 1e6, f(s) as f64 / 1e6))
                    .collect(),
            })
            .collect();
        let svg = sim_vs_measured(title, name, &series).map_err(|e| file(dir, &e))?;
        let p = dir.join(format!("compare-{}.svg", name.to_lowercase()));
        std::fs::write(&p, svg).map_err(|e| file(&p, &e))?;
    }
    Ok(())
}

/// Per-request table of every comparison: run (the comparison's label, e.g. "B3 70% #2"),
/// mode, id, arrival and, for each metric, the measured and simulated ns.
pub fn table(cs: &[Comparison]) -> Table {
    let rows: Vec<(&Comparison, &RequestRecord, &RequestRecord)> = cs
        .iter()
        .flat_map(|c| c.pairs.iter().map(move |(m, s)| (c, m, s)))
        .collect();
    let col = |f: &dyn Fn(&RequestRecord, &RequestRecord) -> u64| {
        Column::U64(rows.iter().map(|(_, m, s)| f(m, s)).collect())
    };
    Table::new()
        .with(
            "run",
            Column::Str(rows.iter().map(|r| r.0.label.clone()).collect()),
        )
        .with(
            "mode",
            Column::Str(rows.iter().map(|r| r.0.mode.clone()).collect()),
        )
        .with("id", col(&|m, _| m.id))
        .with("arrival_ns", col(&|m, _| m.arrival_ns))
        .with("ttft_measured_ns", col(&|m, _| m.ttft_ns()))
        .with("ttft_simulated_ns", col(&|_, s| s.ttft_ns()))
        .with("e2e_measured_ns", col(&|m, _| m.e2e_ns()))
        .with("e2e_simulated_ns", col(&|_, s| s.e2e_ns()))
        .with("tpot_measured_ns", col(&|m, _| m.tpot_ns()))
        .with("tpot_simulated_ns", col(&|_, s| s.tpot_ns()))
        .with("output_tokens", col(&|m, _| m.output_tokens))
}

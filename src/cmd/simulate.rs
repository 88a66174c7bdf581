//! `moonagent simulate`: the EPD discrete-event simulator. With no arguments, the
//! B0 -> Full ladder on W1-W4 on an H200 profile.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use moonagent_sim::des::ladder::{Gains, LadderConfig, LadderResult};
use moonagent_sim::des::metrics::{records_table, workers_table};
use moonagent_sim::des::{run_ladder, simulate_all, Mode, SimConfig, Summary};
use moonagent_sim::progress;

use super::util::{print_table, read_config, read_trace};

/// Arguments of `moonagent simulate`.
#[derive(Args, Debug, Default)]
pub struct SimulateArgs {
    /// Ladder settings (TOML or JSON `LadderConfig`: `base` = SimConfig, `modes`, `workloads`,
    /// `requests`, `seed`, `saturation_rate`, `load_factor`); any part may be given.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Replay this trace (moonagent schema, .jsonl or .parquet) instead of the ladder's
    /// generated workloads, under every mode of the ladder.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Hardware profile, overriding the config (h200, b200, h100, cpu).
    #[arg(long)]
    pub hardware: Option<String>,
    /// Modes to run, overriding the config (comma-separated: b0,b1,b2,b3,full).
    #[arg(long, value_delimiter = ',')]
    pub modes: Vec<String>,
    /// Requests per generated workload, overriding the config.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Write tables here: ladder.parquet/.csv, summary.json and the figure ladder.svg, or
    /// for `--trace` summary.json and per mode requests-MODE.parquet (one row per request)
    /// and workers-MODE.parquet (one row per worker: steps and priced time by kind, mean
    /// decode batch, recomputes, tail copies, NIC bytes and time).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn summary_row(label: &str, mode: Mode, sat: &Summary, at: &Summary) -> Vec<String> {
    vec![
        label.to_string(),
        mode.name().to_string(),
        format!("{:.2}", sat.throughput_rps),
        format!("{:.0}", at.ttft_ms.p50),
        format!("{:.0}", at.ttft_ms.p95),
        format!("{:.0}", at.e2e_ms.p95),
        format!("{:.1}", 100.0 * at.image_hit_rate),
        format!("{:.1}", 100.0 * at.kv_block_hit_rate),
        format!("{:.1}", at.encoder_gpu_s),
        at.forks.to_string(),
    ]
}

fn print_ladder(r: &LadderResult) {
    let mut rows = vec![[
        "workload",
        "mode",
        "thr req/s",
        "TTFT p50 ms",
        "TTFT p95 ms",
        "E2E p95 ms",
        "img hit %",
        "kv hit %",
        "enc GPU-s",
        "forks",
    ]
    .map(String::from)
    .to_vec()];
    for c in &r.cells {
        rows.push(summary_row(&c.workload, c.mode, &c.saturated, &c.at_load));
    }
    println!(
        "\n{} x{} GPUs, {}: throughput saturated; latency and hit rates at {:.0}% of the slowest mode's throughput",
        r.config.base.hardware,
        r.config.base.gpus,
        r.config.base.model,
        100.0 * r.config.load_factor
    );
    print_table(&rows);
    if !r.gains.is_empty() {
        println!("\ngain decomposition (throughput x; P95 TTFT change at load)");
        let mut g = vec![[
            "workload",
            "EPD B1/B0",
            "cache B2/B1",
            "fork B3/B2",
            "sched Full/B3",
            "EPD TTFT",
            "cache TTFT",
            "fork TTFT",
            "sched TTFT",
            "fork E2E p95",
        ]
        .map(String::from)
        .to_vec()];
        let x = |v: f64| format!("{v:.2}x");
        let p = |v: f64| format!("{v:+.1}%");
        for Gains {
            workload,
            epd_throughput_x,
            cache_throughput_x,
            fork_throughput_x,
            scheduling_throughput_x,
            epd_p95_ttft_pct,
            cache_p95_ttft_pct,
            fork_p95_ttft_pct,
            scheduling_p95_ttft_pct,
            fork_p95_e2e_pct,
        } in &r.gains
        {
            g.push(vec![
                workload.clone(),
                x(*epd_throughput_x),
                x(*cache_throughput_x),
                x(*fork_throughput_x),
                x(*scheduling_throughput_x),
                p(*epd_p95_ttft_pct),
                p(*cache_p95_ttft_pct),
                p(*fork_p95_ttft_pct),
                p(*scheduling_p95_ttft_pct),
                p(*fork_p95_e2e_pct),
            ]);
        }
        print_table(&g);
        for g in &r.gains {
            if g.scheduling_throughput_x < 1.0 || g.scheduling_p95_ttft_pct > 0.0 {
                println!(
                    "note: three-point scheduling lost to round robin on {}: throughput {:.3}x, P95 TTFT {:+.1}%",
                    g.workload, g.scheduling_throughput_x, g.scheduling_p95_ttft_pct
                );
            }
        }
    }
}

/// Run `moonagent simulate`.
pub fn run(args: SimulateArgs) -> Result<()> {
    let mut cfg: LadderConfig = match &args.config {
        Some(p) => read_config(p)?,
        None => LadderConfig::default(),
    };
    if let Some(h) = &args.hardware {
        cfg.base.hardware = h.clone();
    }
    if let Some(n) = args.requests {
        cfg.requests = n;
    }
    if !args.modes.is_empty() {
        cfg.modes = args
            .modes
            .iter()
            .map(|m| {
                serde_json::from_value(serde_json::Value::String(m.to_lowercase()))
                    .with_context(|| format!("--modes {m}: expected b0, b1, b2, b3 or full"))
            })
            .collect::<Result<_>>()?;
    }
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    }
    if let Some(path) = &args.trace {
        let t_read = std::time::Instant::now();
        let (reqs, bs) = read_trace(path)?;
        let read_s = t_read.elapsed().as_secs_f64();
        let mut rows = vec![[
            "mode",
            "completed",
            "thr req/s",
            "TTFT p50 ms",
            "TTFT p95 ms",
            "TPOT p50 ms",
            "E2E p95 ms",
            "img hit %",
            "forks",
        ]
        .map(String::from)
        .to_vec()];
        let mut summaries = Vec::new();
        let pb = progress::bar("simulate", cfg.modes.len() as u64, "modes", true);
        for &m in &cfg.modes {
            pb.set_message(m.name());
            let t_sim = std::time::Instant::now();
            let run = simulate_all(
                &SimConfig {
                    mode: m,
                    ..cfg.base.clone()
                },
                &reqs,
                bs,
            )?;
            let sim_s = t_sim.elapsed().as_secs_f64();
            let s = run.summary;
            // The simulation loop's rate (what the sim_speed bench measures); the trace
            // read is reported apart, once.
            eprintln!(
                "timing: {}: trace read in {read_s:.3} s, simulated {} events in {sim_s:.3} s ({:.2} M events/s)",
                m.name(),
                s.events,
                s.events as f64 / sim_s / 1e6
            );
            rows.push(vec![
                m.name().into(),
                s.completed.to_string(),
                format!("{:.2}", s.throughput_rps),
                format!("{:.0}", s.ttft_ms.p50),
                format!("{:.0}", s.ttft_ms.p95),
                format!("{:.1}", s.tpot_ms.p50),
                format!("{:.0}", s.e2e_ms.p95),
                format!("{:.1}", 100.0 * s.image_hit_rate),
                s.forks.to_string(),
            ]);
            if let Some(out) = &args.out {
                records_table(&run.requests)
                    .write_parquet(&out.join(format!("requests-{}.parquet", m.name())))?;
                workers_table(&run.workers)
                    .write_parquet(&out.join(format!("workers-{}.parquet", m.name())))?;
            }
            summaries.push(s);
            pb.inc(1);
        }
        pb.finish_and_clear();
        println!("{} ({} requests)", path.display(), reqs.len());
        print_table(&rows);
        let by = |m: &str| summaries.iter().find(|s: &&Summary| s.mode == m);
        if let (Some(b3), Some(full)) = (by("B3"), by("Full")) {
            if full.ttft_ms.p50 > b3.ttft_ms.p50
                || full.ttft_ms.p95 > b3.ttft_ms.p95
                || full.throughput_rps < b3.throughput_rps
            {
                println!(
                    "note: three-point scheduling lost to round robin here (Full vs B3: TTFT p50 {:.0} vs {:.0} ms, p95 {:.0} vs {:.0} ms, {:.3} vs {:.3} req/s)",
                    full.ttft_ms.p50, b3.ttft_ms.p50, full.ttft_ms.p95, b3.ttft_ms.p95,
                    full.throughput_rps, b3.throughput_rps
                );
            }
        }
        if let Some(out) = &args.out {
            std::fs::write(
                out.join("summary.json"),
                serde_json::to_string_pretty(&summaries)?,
            )?;
            eprintln!("wrote {}", out.display());
        }
        return Ok(());
    }
    // run_ladder reports no progress per cell yet: a spinner with the elapsed time.
    let pb = progress::spinner("simulate", "", true);
    pb.set_message(format!(
        "the ladder: {} workloads x {} modes",
        cfg.workloads.len(),
        cfg.modes.len()
    ));
    let r = run_ladder(&cfg);
    pb.finish_and_clear();
    let r = r?;
    print_ladder(&r);
    if let Some(out) = &args.out {
        let t = r.table();
        t.write_parquet(&out.join("ladder.parquet"))?;
        t.write_csv(&out.join("ladder.csv"))?;
        std::fs::write(out.join("summary.json"), serde_json::to_string_pretty(&r)?)?;
        let svg = moonagent_sim::plot::ladder(&r).map_err(anyhow::Error::msg)?;
        std::fs::write(out.join("ladder.svg"), svg)?;
        eprintln!(
            "wrote {}/ladder.parquet, ladder.csv, summary.json, ladder.svg",
            out.display()
        );
    }
    Ok(())
}

//! `moonagent trace ...`: convert, stats, generate, import. Parsing and wiring only; the
//! logic lives in `moonagent-traces`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use moonagent_sim::progress;
use moonagent_traces::gen::{Generated, GeneratorKind};
use moonagent_traces::import::{AttachImages, ImportKind, Imported};
use moonagent_traces::{
    stats, write_trace, ObjectSizes, StatsBuilder, StatsConfig, TraceHeader, TraceStats,
};

/// Trace tools.
#[derive(Args)]
pub struct TraceArgs {
    #[command(subcommand)]
    cmd: TraceCmd,
}

#[derive(Args)]
struct StatsOpts {
    /// Rate-over-time bucket width in seconds.
    #[arg(long, default_value_t = 60.0)]
    bucket_s: f64,
    /// KV bytes per token for unique-byte accounting (default Qwen2.5-VL-7B: 57344).
    #[arg(long)]
    kv_bytes_per_token: Option<u64>,
    /// Encoder-output bytes per visual token (default Qwen2.5-VL-7B: 7168).
    #[arg(long)]
    encoder_bytes_per_token: Option<u64>,
    /// Print statistics as JSON.
    #[arg(long)]
    json: bool,
}

impl StatsOpts {
    fn config(&self) -> StatsConfig {
        let d = ObjectSizes::default();
        StatsConfig {
            bucket_s: self.bucket_s,
            sizes: ObjectSizes {
                kv_bytes_per_token: self.kv_bytes_per_token.unwrap_or(d.kv_bytes_per_token),
                encoder_bytes_per_visual_token: self
                    .encoder_bytes_per_token
                    .unwrap_or(d.encoder_bytes_per_visual_token),
            },
        }
    }

    fn print(&self, s: &TraceStats) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(s)?);
        } else {
            print!("{s}");
        }
        Ok(())
    }
}

#[derive(Subcommand)]
enum TraceCmd {
    /// Convert a trace between JSONL and Parquet (formats from the extensions).
    Convert {
        /// Input trace (.jsonl or .parquet).
        input: PathBuf,
        /// Output trace (.jsonl or .parquet).
        output: PathBuf,
    },
    /// Requests, rate over time, tokens, images, repeat rates, forks, unique bytes.
    Stats {
        /// Trace file (.jsonl or .parquet).
        file: PathBuf,
        #[command(flatten)]
        opts: StatsOpts,
    },
    /// Generate a trace: w1, w2, w3, w4, sessions or servegen.
    Generate {
        /// Generator: w1 | w2 | w3 | w4 | sessions | servegen.
        kind: String,
        /// Output file (.jsonl or .parquet).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Seed.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// JSON file of knobs (merged over the generator's defaults).
        #[arg(long)]
        config: Option<PathBuf>,
        /// A knob, e.g. `--set repeat_rate=0.7` (repeatable; see --print-config).
        #[arg(long = "set", value_name = "KNOB=VALUE")]
        set: Vec<String>,
        /// Shorthand for `--set requests=N`.
        #[arg(long)]
        requests: Option<u64>,
        /// Shorthand for `--set rate=R` (requests per second).
        #[arg(long)]
        rate: Option<f64>,
        /// Shorthand for `--set sessions=N`.
        #[arg(long)]
        sessions: Option<u64>,
        /// Print the generator's knobs with their defaults and exit.
        #[arg(long)]
        print_config: bool,
        /// Skip the statistics pass (it keeps every distinct id in memory).
        #[arg(long)]
        no_stats: bool,
        #[command(flatten)]
        opts: StatsOpts,
    },
    /// Import a public trace: mooncake, azure-llm or azure-mm.
    Import {
        /// Importer: mooncake | azure-llm | azure-mm.
        kind: String,
        /// Input file.
        input: PathBuf,
        /// Output file (.jsonl or .parquet).
        #[arg(long)]
        out: PathBuf,
        /// Attach images from a seeded generator (always on for azure-mm).
        #[arg(long)]
        attach_images: bool,
        /// Seed of the attached images.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// An attach knob, e.g. `--set repeat_rate=0.3` (images_min, images_max,
        /// probability, repeat_rate, repeat_pool, image_sizes).
        #[arg(long = "set", value_name = "KNOB=VALUE")]
        set: Vec<String>,
        /// Skip the statistics pass.
        #[arg(long)]
        no_stats: bool,
        #[command(flatten)]
        opts: StatsOpts,
    },
}

fn parse_sets(sets: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    sets.iter()
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .with_context(|| format!("--set {s:?}: expected KNOB=VALUE"))
        })
        .collect()
}

fn write_with_stats(
    label: &str,
    out: &PathBuf,
    header: &TraceHeader,
    requests: Box<
        dyn Iterator<Item = Result<moonagent_traces::Request, moonagent_traces::TraceError>>,
    >,
    no_stats: bool,
    opts: &StatsOpts,
) -> anyhow::Result<()> {
    let mut sb = (!no_stats).then(|| StatsBuilder::new(header, opts.config()));
    let pb = progress::spinner(label, "requests", true);
    let n = write_trace(out, header, requests, |r| {
        pb.inc(1);
        if let Some(b) = sb.as_mut() {
            b.add(r);
        }
    });
    pb.finish_and_clear();
    let n = n?;
    eprintln!("wrote {n} requests to {}", out.display());
    if let Some(b) = sb {
        opts.print(&b.finish())?;
    }
    Ok(())
}

/// Run `moonagent trace ...`.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    match args.cmd {
        TraceCmd::Convert { input, output } => {
            let pb = progress::spinner("convert", "requests", true);
            let n = moonagent_traces::convert_observed(&input, &output, |_| pb.inc(1));
            pb.finish_and_clear();
            let n = n?;
            eprintln!(
                "converted {n} requests: {} -> {}",
                input.display(),
                output.display()
            );
        }
        TraceCmd::Stats { file, opts } => {
            let s = stats::stats_of_file(&file, opts.config())?;
            opts.print(&s)?;
        }
        TraceCmd::Generate {
            kind,
            out,
            seed,
            config,
            set,
            requests,
            rate,
            sessions,
            print_config,
            no_stats,
            opts,
        } => {
            let kind: GeneratorKind = kind.parse()?;
            if print_config {
                println!("{}", serde_json::to_string_pretty(&kind.default_config())?);
                return Ok(());
            }
            let Some(out) = out else {
                bail!("generate: --out FILE is required (.jsonl or .parquet)");
            };
            let cfg = match &config {
                Some(p) => {
                    let text = std::fs::read_to_string(p)
                        .with_context(|| format!("reading {}", p.display()))?;
                    Some(
                        serde_json::from_str::<serde_json::Value>(&text)
                            .with_context(|| format!("parsing {}", p.display()))?,
                    )
                }
                None => None,
            };
            let mut sets = parse_sets(&set)?;
            for (k, v) in [
                ("requests", requests.map(|x| x.to_string())),
                ("rate", rate.map(|x| x.to_string())),
                ("sessions", sessions.map(|x| x.to_string())),
            ] {
                if let Some(v) = v {
                    sets.push((k.to_string(), v));
                }
            }
            let g = Generated::new(kind, cfg.as_ref(), &sets, seed)?;
            write_with_stats("generate", &out, &g.header, g.requests, no_stats, &opts)?;
        }
        TraceCmd::Import {
            kind,
            input,
            out,
            attach_images,
            seed,
            set,
            no_stats,
            opts,
        } => {
            let kind: ImportKind = kind.parse()?;
            let sets = parse_sets(&set)?;
            let attach = if attach_images || kind == ImportKind::AzureMm {
                Some(AttachImages::with_overrides(seed, &sets)?)
            } else {
                if !sets.is_empty() {
                    bail!("import: --set applies to attached images; add --attach-images");
                }
                None
            };
            let imp = Imported::open(kind, &input, attach)?;
            write_with_stats("import", &out, &imp.header, imp.requests, no_stats, &opts)?;
        }
    }
    Ok(())
}

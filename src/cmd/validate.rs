//! `moonagent validate`: the real backend. Profile the operators and fit a hardware
//! profile, run a trace on the backend, compare the simulator with a measured run, or all
//! of it in one command.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use moonagent_core::serve::{Flow, Mode};
use moonagent_core::store::{Recorded, Store};
use moonagent_models::{HardwareProfile, ModelSpec, Roofline};
use moonagent_sim::des::SimConfig;
use moonagent_sim::progress;
use moonagent_validation::backend::{Executor, KvPath, RunOptions};
use moonagent_validation::compute::CpuCompute;
use moonagent_validation::cores::{HostSched, DEFAULT_QUANTUM_US};
use moonagent_validation::exec::ComputeExecutor;
use moonagent_validation::measure::{
    mem_store, read_inputs, read_lines, run_trace, write_run, MeasureError,
};
use moonagent_validation::mooncake::BridgeStore;
use moonagent_validation::profile::{self, ContentionPlan, Grid, Order};
use moonagent_validation::study::{self, cpu_config, CalibrationPlan, StoreFactory, StudyConfig};

use super::util::{read_config, read_trace};

/// Arguments of `moonagent validate`.
#[derive(Args, Debug)]
pub struct ValidateArgs {
    #[command(subcommand)]
    what: ValidateCmd,
}

#[derive(Subcommand, Debug)]
enum ValidateCmd {
    /// Measure every operator the cost model prices, fit a hardware profile, judge it on
    /// hold-out shapes.
    Profile(ProfileArgs),
    /// Run a trace on the real backend; write the measured per-request table and logs.
    Run(RunArgs),
    /// Simulate a measured run's trace with a profile and compare request by request.
    Compare(CompareArgs),
    /// profile -> runs at two loads (with repeats) -> compare, with a report.
    All(AllArgs),
}

#[derive(Args, Debug)]
struct ProfileArgs {
    /// Write profile.toml, profile.json, samples.jsonl and holdout.jsonl here.
    #[arg(long, default_value = "validate-profile")]
    out: PathBuf,
    /// Base profile whose parameters are fitted.
    #[arg(long, default_value = "cpu")]
    base: String,
    /// Model spec run on the backend.
    #[arg(long, default_value = "qwen2.5-vl-tiny")]
    model: String,
    /// Weight seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The cost model's form for compute steps: fit both and keep the better (auto), or
    /// one of them.
    #[arg(long, value_enum, default_value = "auto")]
    roofline: RooflineArg,
    /// Refit the samples of an earlier profile (its output folder, or `validate all`'s
    /// `profile/`) instead of measuring: its samples.jsonl and holdout.jsonl, and the host
    /// facts of its profile.toml (shared_cores, core_weights).
    #[arg(long, value_name = "DIR")]
    from: Option<PathBuf>,
    /// In what order the compute operators are timed.
    #[arg(long, value_enum, default_value = "grouped")]
    order: OrderArg,
    #[command(flatten)]
    sched: HostSchedArgs,
    #[command(flatten)]
    device: ComputeArgs,
}

/// `--order`: how the profile times the compute operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OrderArg {
    /// Each shape's runs back to back (one warm-up, three timed): the shape is timed with
    /// its weights and buffers hot in the caches.
    Grouped,
    /// A warm-up pass over every shape, then three rounds timing each shape once in a
    /// seeded shuffled order, so each run follows another operator's, as a serving run's
    /// steps follow other work (see the README's validation section for what it changes).
    Interleaved,
}

impl OrderArg {
    fn order(self) -> Order {
        match self {
            OrderArg::Grouped => Order::Grouped,
            OrderArg::Interleaved => Order::Interleaved,
        }
    }
}

/// `--roofline`: which forms of the compute cost the fit may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum RooflineArg {
    /// Fit `max` and `sum`, keep the one with the lower error on the fit samples.
    Auto,
    /// `max(compute, memory)`: they overlap (the roofline).
    Max,
    /// `compute + memory`: no overlap.
    Sum,
}

impl RooflineArg {
    fn forms(self) -> Vec<Roofline> {
        match self {
            RooflineArg::Auto => Roofline::ALL.to_vec(),
            RooflineArg::Max => vec![Roofline::Max],
            RooflineArg::Sum => vec![Roofline::Sum],
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum StoreKind {
    /// The embedded store.
    Mem,
    /// A real Mooncake Store through the bridge (`scripts/mooncake.sh up`;
    /// `MOONAGENT_MOONCAKE_BRIDGE`).
    Mooncake,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ComputeKind {
    /// The host's cores (matrixmultiply's sgemm).
    Cpu,
    /// An NVIDIA GPU: every dense layer's GEMM through cuBLAS on device memory (a build
    /// with `--features cuda`; the driver and cuBLAS are loaded at run time).
    Cuda,
}

/// Where the backend's operators run.
#[derive(Args, Debug, Clone, Copy)]
struct ComputeArgs {
    /// The operators' device.
    #[arg(long, value_enum, default_value = "cpu")]
    compute: ComputeKind,
    /// The GPU's ordinal (`--compute cuda`).
    #[arg(long, default_value_t = 0)]
    gpu: usize,
    /// Keep the CPU backend's weights in the host's caches while its workers idle (`true`,
    /// the default) or not (`false`): a thread at the kernel's idle priority reads them
    /// every 5 ms while no step runs, as a GPU's weights stay in its memory between steps.
    /// Without it a step after idle workers reads them from DRAM (+3-7 ms after 100 ms idle
    /// on a 2-core VM), which the profile, timing steps back to back, does not see; see the
    /// README. Reads only: no result changes. No effect with `--compute cuda`
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    keep_warm: bool,
}

impl ComputeArgs {
    /// How reports name the device (`cpu`, `cuda:0`).
    fn label(self) -> String {
        match self.compute {
            ComputeKind::Cpu if self.keep_warm => "cpu, weights kept warm".into(),
            ComputeKind::Cpu => "cpu, weights not kept warm".into(),
            ComputeKind::Cuda => format!("cuda:{}", self.gpu),
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum HostSchedArg {
    /// The kernel's scheduler: every compute thread runnable at once.
    Os,
    /// The backend's round robin over the host's cores: a step waits for a core in turn
    /// and hands it over after a quantum (processor sharing, as the simulator models it).
    RoundRobin,
}

/// How the compute threads share the host's cores when there are more workers than cores.
#[derive(Args, Debug, Clone, Copy)]
struct HostSchedArgs {
    /// Who schedules the workers' compute threads on the host's cores: the backend's round
    /// robin (the default since 2026-12-07: the processor sharing the simulator models) or
    /// the kernel (`os`, what figures before that date used). No effect with
    /// `--compute cuda`; no step waits where there are as many cores as workers
    #[arg(long, value_enum, default_value_t = HostSched::default().into())]
    host_sched: HostSchedArg,
    /// The round robin's quantum, microseconds.
    #[arg(long, default_value_t = DEFAULT_QUANTUM_US, value_parser = clap::value_parser!(u64).range(1..))]
    quantum_us: u64,
}

/// The library's default discipline as the flag's default (one place says which it is).
impl From<HostSched> for HostSchedArg {
    fn from(s: HostSched) -> Self {
        match s {
            HostSched::Os => HostSchedArg::Os,
            HostSched::RoundRobin { .. } => HostSchedArg::RoundRobin,
        }
    }
}

impl HostSchedArgs {
    fn sched(self) -> HostSched {
        match self.host_sched {
            HostSchedArg::Os => HostSched::Os,
            HostSchedArg::RoundRobin => HostSched::RoundRobin {
                quantum_us: self.quantum_us,
            },
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum KvPathArg {
    /// Loopback TCP, like every other transfer.
    Tcp,
    /// Mooncake's Transfer Engine between the workers (needs a build with
    /// `--features transfer-engine`; `scripts/transfer_engine.sh build`).
    TransferEngine,
}

impl KvPathArg {
    fn path(self) -> Result<KvPath> {
        match self {
            KvPathArg::Tcp => Ok(KvPath::Tcp),
            KvPathArg::TransferEngine if cfg!(feature = "transfer-engine") => {
                Ok(KvPath::TransferEngine)
            }
            KvPathArg::TransferEngine => bail!(
                "--kv-path transfer-engine: this moonagent was built without the `transfer-engine` feature; build it with `export $(bash scripts/transfer_engine.sh build) && cargo build --release --features transfer-engine` and run it with that LD_LIBRARY_PATH"
            ),
        }
    }
}

/// The trace of a run: a file, or the generated validation workload.
#[derive(Args, Debug)]
struct WorkloadArgs {
    /// Trace (moonagent schema, .jsonl or .parquet); default: the validation workload
    /// (`--requests`, `--rate`, `--seed`).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Requests of the generated validation workload.
    #[arg(long, default_value_t = 200)]
    requests: u64,
    /// Arrival rate of the generated validation workload, requests per second.
    #[arg(long, default_value_t = 1.0)]
    rate: f64,
    /// Seed of the generated validation workload.
    #[arg(long, default_value_t = 17)]
    seed: u64,
}

impl WorkloadArgs {
    fn load(&self) -> Result<(Vec<moonagent_traces::schema::Request>, u32)> {
        match &self.trace {
            Some(p) => read_trace(p),
            None => Ok(study::generate(self.requests, self.rate, self.seed)?),
        }
    }
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Simulator configuration (TOML or JSON SimConfig; default: the CPU validation cluster).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Mode (b0, b1, b2, b3, full), overriding the config.
    #[arg(long)]
    mode: Option<String>,
    /// Hardware profile for three-point scheduling's prices (a name or a fitted profile file).
    #[arg(long)]
    hardware: Option<String>,
    /// Where encoder outputs and prefix KV live.
    #[arg(long, value_enum, default_value = "mem")]
    store: StoreKind,
    /// Replay arrivals this many times faster than the trace's times.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// The link of prefill-to-decode KV handoffs (disaggregated modes); every other
    /// transfer goes over loopback TCP.
    #[arg(long, value_enum, default_value = "tcp")]
    kv_path: KvPathArg,
    #[command(flatten)]
    sched: HostSchedArgs,
    #[command(flatten)]
    device: ComputeArgs,
    /// Output folder.
    #[arg(long, default_value = "validate-run")]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct CompareArgs {
    /// A folder written by `moonagent validate run` (its inputs.jsonl).
    #[arg(long)]
    run: PathBuf,
    /// The trace that run replayed (`compare` needs the same trace arguments as `run`).
    #[command(flatten)]
    workload: WorkloadArgs,
    /// The run's configuration, if it was not the default.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Mode of the run; default: the one its summary.json records, else the config's.
    #[arg(long)]
    mode: Option<String>,
    /// Hardware profile the simulator uses (a fitted profile.toml).
    #[arg(long)]
    hardware: String,
    /// Output folder (compare.md, compare.json, compare.parquet).
    #[arg(long, default_value = "validate-compare")]
    out: PathBuf,
}

#[derive(Args, Debug)]
struct AllArgs {
    /// Output folder.
    #[arg(long, default_value = "validate")]
    out: PathBuf,
    /// Requests per run.
    #[arg(long, default_value_t = 200)]
    requests: u64,
    /// Runs per mode and load.
    #[arg(long, default_value_t = 3)]
    repeats: u32,
    /// Modes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "b0,b3")]
    modes: Vec<String>,
    /// Loads as fractions of each mode's capacity (comma-separated; see `--capacity`).
    #[arg(long, value_delimiter = ',', default_value = "0.2,0.7")]
    loads: Vec<f64>,
    /// Whose capacity the loads are fractions of: `measured`, a burst of up to 100
    /// requests arriving at once on the backend (a trace of its own) per mode, the
    /// simulator's throughput on it reported beside; or `simulated`, the simulator's
    /// saturated throughput on the study's workload (every study before 2026-12-07, night).
    #[arg(long, value_enum, default_value_t = study::CapacityBasis::default().into())]
    capacity: CapacityArg,
    /// A short run for tests: 30 requests, one repeat, a small profile grid.
    #[arg(long)]
    quick: bool,
    /// Base profile whose parameters the fit adjusts (`h200` with `--compute cuda` on one).
    #[arg(long, default_value = "cpu")]
    base: String,
    /// Model spec the backend runs and the simulator prices (a name or a spec file). The
    /// CPU backend builds at most 2^28 parameters; `qwen2.5-vl-7b` needs `--compute cuda`.
    #[arg(long, default_value = study::STUDY_MODEL)]
    model: String,
    /// Where each run keeps encoder outputs and prefix KV.
    #[arg(long, value_enum, default_value = "mem")]
    store: StoreKind,
    /// The cost model's form for compute steps (see `validate profile --help`).
    #[arg(long, value_enum, default_value = "auto")]
    roofline: RooflineArg,
    /// In what order the profile times the compute operators (see `validate profile --help`).
    #[arg(long, value_enum, default_value = "grouped")]
    order: OrderArg,
    /// Requests of the calibration run that opens each round of runs (B3 at 20% load on a
    /// trace of its own): its steps that ran alone give `profile-calibrated-<round>.toml`'s
    /// `step_scale`, each kind's time in a serving run over its profiled time, and every
    /// run of the round is compared with it (the headline errors) and with the operator
    /// profile alone. 0: no calibration runs (the operator profile is the headline).
    /// `--quick`: 20.
    #[arg(long)]
    calibration_requests: Option<u64>,
    #[command(flatten)]
    sched: HostSchedArgs,
    #[command(flatten)]
    device: ComputeArgs,
}

fn mode_of(s: &str) -> Result<Mode> {
    serde_json::from_value(serde_json::Value::String(s.to_lowercase()))
        .with_context(|| format!("mode {s}: expected b0, b1, b2, b3 or full"))
}

fn config(path: &Option<PathBuf>, mode: &Option<String>) -> Result<SimConfig> {
    let mut cfg = match path {
        Some(p) => read_config(p)?,
        None => cpu_config(Mode::B3),
    };
    if let Some(m) = mode {
        cfg.mode = mode_of(m)?;
    }
    Ok(cfg)
}

fn executor(cfg: &SimConfig, seed: u64, device: ComputeArgs) -> Result<Arc<dyn Executor>> {
    let spec = ModelSpec::resolve(&cfg.model).map_err(|e| anyhow::anyhow!("model: {e}"))?;
    let workers = if cfg.mode.disaggregated() {
        cfg.encoders + cfg.prefills + cfg.decodes
    } else {
        cfg.gpus / cfg.tp.max(1)
    };
    match device.compute {
        ComputeKind::Cpu => {
            let compute = CpuCompute::new(&spec, seed).map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut exec = ComputeExecutor::new(compute, workers);
            if device.keep_warm {
                exec = exec
                    .keep_warm(moonagent_validation::warm::DEFAULT_INTERVAL)
                    .map_err(|e| anyhow::anyhow!("--keep-warm: starting the keeper: {e}"))?;
            }
            Ok(Arc::new(exec))
        }
        ComputeKind::Cuda => cuda_executor(&spec, seed, device.gpu, workers),
    }
}

#[cfg(feature = "cuda")]
fn cuda_executor(
    spec: &ModelSpec,
    seed: u64,
    gpu: usize,
    workers: u32,
) -> Result<Arc<dyn Executor>> {
    let compute = moonagent_validation::compute::CudaCompute::new(spec, seed, gpu)
        .map_err(|e| anyhow::anyhow!("--compute cuda: {e}"))?;
    Ok(Arc::new(ComputeExecutor::new(compute, workers)))
}

#[cfg(not(feature = "cuda"))]
fn cuda_executor(
    _spec: &ModelSpec,
    _seed: u64,
    _gpu: usize,
    _workers: u32,
) -> Result<Arc<dyn Executor>> {
    bail!(
        "--compute cuda: this moonagent was built without the `cuda` feature; build it with `cargo build --release --features cuda` (it builds without CUDA installed: the driver and cuBLAS are loaded when it runs)"
    )
}

/// A real Mooncake Store through the bridge, under a fresh namespace: the store may hold
/// an earlier run's objects, and a run must start from an empty store to replay to the
/// same decisions.
fn mooncake_store(label: &str) -> Result<Recorded<BridgeStore>> {
    let store = match BridgeStore::from_env() {
        Some(s) => s.context("connecting to the Mooncake bridge")?,
        None => bail!(
            "--store mooncake needs MOONAGENT_MOONCAKE_BRIDGE (start a store with `bash scripts/mooncake.sh up` and export what it prints)"
        ),
    };
    let ns = format!(
        "validate-{}-{}-{label}/",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    Ok(Recorded::namespaced(store, &ns))
}

/// Run `moonagent validate`.
pub fn run(args: ValidateArgs) -> Result<()> {
    match args.what {
        ValidateCmd::Profile(a) => profile_cmd(a),
        ValidateCmd::Run(a) => run_cmd(a),
        ValidateCmd::Compare(a) => compare_cmd(a),
        ValidateCmd::All(a) => all_cmd(a),
    }
}

fn profile_cmd(a: ProfileArgs) -> Result<()> {
    let base = HardwareProfile::resolve(&a.base).map_err(|e| anyhow::anyhow!("--base: {e}"))?;
    let cfg = SimConfig {
        model: a.model.clone(),
        ..cpu_config(Mode::B0)
    };
    let spec = ModelSpec::resolve(&a.model).map_err(|e| anyhow::anyhow!("--model: {e}"))?;
    if let Some(from) = &a.from {
        let same = match (from.canonicalize(), a.out.canonicalize()) {
            (Ok(f), Ok(o)) => f == o,
            _ => false,
        };
        if same {
            bail!(
                "--out {}: the folder whose samples are refitted; choose another --out",
                a.out.display()
            );
        }
        let (p, samples, holdout) = study::refit(from, &base, &spec, &a.roofline.forms())?;
        let path = study::write_profile(&a.out, &p, &samples, &holdout)?;
        println!("{}", study::profile_markdown(&p));
        eprintln!(
            "refitted {} samples from {}; wrote {}",
            samples.len(),
            from.display(),
            path.display()
        );
        return Ok(());
    }
    let exec = executor(&cfg, a.seed, a.device)?;
    let grid = Grid {
        order: a.order.order(),
        ..Grid::cpu_default().covering(&spec)
    };
    let hold = grid.holdout(a.seed ^ 0x5eed, 8);
    let n = (grid.encode.len()
        + grid.prefill.len()
        + grid.decode.len()
        + grid.transfer.len()
        + grid.fingerprint.len()) as u64;
    let pb = progress::bar("profile", 2 * n, "shapes", true);
    let samples = profile::measure(&grid, exec.as_ref(), |op| {
        pb.set_message(op.to_string());
        pb.inc(1);
    })?;
    let holdout = profile::measure(&hold, exec.as_ref(), |op| {
        pb.set_message(format!("hold-out {op}"));
        pb.inc(1);
    })?;
    pb.finish_and_clear();
    let pb = progress::spinner("contention", "", true);
    let plan = ContentionPlan {
        host_sched: a.sched.sched(),
        ..ContentionPlan::cpu_default()
    };
    let contention =
        profile::contention_if_shared(Some(&plan), exec.as_ref(), |m| progress::stage(&pb, m))?;
    pb.finish_and_clear();
    let mut p = profile::fit(
        &base,
        &spec,
        &samples,
        &holdout,
        exec.shared_cores(),
        contention,
        &a.roofline.forms(),
    )?;
    p.order = Some(grid.order);
    let path = study::write_profile(&a.out, &p, &samples, &holdout)?;
    println!("{}", study::profile_markdown(&p));
    eprintln!("wrote {}", path.display());
    Ok(())
}

fn run_cmd(a: RunArgs) -> Result<()> {
    let mut cfg = config(&a.config, &a.mode)?;
    if let Some(h) = &a.hardware {
        cfg.hardware = h.clone();
    }
    if a.speedup.is_nan() || a.speedup <= 0.0 {
        bail!("--speedup: expected > 0, got {}", a.speedup);
    }
    let opts = RunOptions {
        kv_path: a.kv_path.path()?,
        host_sched: a.sched.sched(),
        probe_host: Some(study::HOST_PROBE),
        ..RunOptions::default()
    };
    let (trace, bs) = a.workload.load()?;
    let exec = executor(&cfg, 0, a.device)?;
    let pb = progress::spinner("validate run", "", true);
    progress::stage(
        &pb,
        &format!("{} requests, {}", trace.len(), cfg.mode.name()),
    );
    let r = match a.store {
        StoreKind::Mem => run_trace(&cfg, &trace, bs, mem_store(&cfg)?, exec, a.speedup, opts),
        StoreKind::Mooncake => run_trace(
            &cfg,
            &trace,
            bs,
            mooncake_store("run")?,
            exec,
            a.speedup,
            opts,
        ),
    };
    pb.finish_and_clear();
    let (m, s) = r?;
    write_run(&a.out, &m, &s)?;
    let sm = &s.summary;
    println!(
        "{}: {} of {} requests in {:.1} s (engine decisions, store calls included: {:.2} s); TTFT p50 {:.1} ms p95 {:.1} ms; {:.3} req/s; image hits {:.1}%, KV block hits {:.1}%; {} actions, same decisions on replay: {}",
        sm.mode,
        sm.completed,
        sm.injected,
        s.wall_s,
        s.engine_s,
        sm.ttft_ms.p50,
        sm.ttft_ms.p95,
        sm.throughput_rps,
        100.0 * sm.image_hit_rate,
        100.0 * sm.kv_block_hit_rate,
        s.actions,
        if s.same_decisions { "yes" } else { "NO" }
    );
    if let (Some(b), Some(a)) = (s.host_before, s.host_after) {
        println!(
            "host cores before / after the run: {:.0} / {:.0} work units per ms on {} cores ({:.2} / {:.2} of {} x one thread alone)",
            b.all_per_ms,
            a.all_per_ms,
            b.cores,
            b.parallel_share(),
            a.parallel_share(),
            b.cores
        );
    }
    match s.host_sched {
        HostSched::Os => println!("compute threads scheduled by the kernel"),
        HostSched::RoundRobin { quantum_us } => println!(
            "compute threads on the host's cores by round robin ({quantum_us} us quantum): {} hand-overs",
            s.core_rotations
        ),
    }
    for k in &s.kv_links {
        println!(
            "KV {} over {}: {} transfers, {} bytes; median {} bytes in {:.3} ms, {:.3} GB/s",
            if k.flow == Flow::KvGet { "get" } else { "put" },
            k.path.name(),
            k.transfers,
            k.bytes,
            k.bytes_p50,
            k.ns_p50 as f64 / 1e6,
            k.gb_s_p50
        );
    }
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

/// The mode a `validate run` folder recorded in its `summary.json`, if it did.
fn run_mode(run: &std::path::Path) -> Option<String> {
    let text = std::fs::read_to_string(run.join("summary.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("summary")?.get("mode")?.as_str().map(str::to_string)
}

fn compare_cmd(a: CompareArgs) -> Result<()> {
    // Without --mode, the run's own mode (a mode other than the run's cannot replay it).
    let mode = a.mode.clone().or_else(|| run_mode(&a.run));
    let cfg = config(&a.config, &mode)?;
    let (trace, bs) = a.workload.load()?;
    let inputs = read_inputs(&a.run.join("inputs.jsonl"))?;
    let c = moonagent_validation::compare::compare(&cfg, &trace, bs, &inputs, &a.hardware)
        .with_context(|| {
            format!(
                "replaying {} in mode {:?} on {} requests: the trace (--trace, or --requests, --rate and --seed), the mode and the config must be the run's",
                a.run.join("inputs.jsonl").display(),
                cfg.mode,
                trace.len()
            )
        })?;
    println!("{}", c.markdown("simulated vs measured"));
    // The steps side by side, when the run folder has its measured steps.
    let timed = a.run.join("timed.jsonl");
    let steps_md = if timed.exists() {
        let steps: Vec<moonagent_validation::backend::Timed> = read_lines(
            &timed,
            "a timed record {worker, what, start_ns, measured_ns}",
        )?;
        let md = study::StepTotals::markdown_pair(
            &study::step_totals(&steps),
            &study::step_totals(&c.sim_steps),
        );
        println!("{md}");
        md
    } else {
        String::new()
    };
    moonagent_validation::compare::write(
        &a.out,
        "simulated vs measured",
        std::slice::from_ref(&c),
        &steps_md,
    )?;
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

/// `validate all --capacity`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum CapacityArg {
    /// Measured on the backend (a burst per mode).
    Measured,
    /// The simulator's, with the operator profile.
    Simulated,
}

/// The library's default basis as the flag's default (one place says which it is).
impl From<study::CapacityBasis> for CapacityArg {
    fn from(b: study::CapacityBasis) -> Self {
        match b {
            study::CapacityBasis::Measured => CapacityArg::Measured,
            study::CapacityBasis::Simulated => CapacityArg::Simulated,
        }
    }
}

impl CapacityArg {
    fn basis(self) -> study::CapacityBasis {
        match self {
            CapacityArg::Measured => study::CapacityBasis::Measured,
            CapacityArg::Simulated => study::CapacityBasis::Simulated,
        }
    }
}

fn all_cmd(a: AllArgs) -> Result<()> {
    let mut cfg = StudyConfig {
        modes: a.modes.iter().map(|m| mode_of(m)).collect::<Result<_>>()?,
        requests: a.requests,
        repeats: a.repeats,
        loads: a.loads.clone(),
        capacity: a.capacity.basis(),
        host_sched: a.sched.sched(),
        base_hardware: a.base.clone(),
        compute: a.device.label(),
        rooflines: a.roofline.forms(),
        model: a.model.clone(),
        ..StudyConfig::default()
    };
    if let Some(l) = cfg
        .loads
        .iter()
        .find(|l| l.is_nan() || **l <= 0.0 || **l > 2.0)
    {
        bail!("--loads: expected fractions of capacity in (0, 2], got {l}");
    }
    if a.quick {
        cfg.requests = 30;
        cfg.repeats = 1;
        cfg.grid = Grid::quick();
        cfg.holdout = 3;
        cfg.contention = Some(ContentionPlan {
            host_sched: cfg.host_sched,
            ..ContentionPlan::quick()
        });
    }
    let calibration_requests = a.calibration_requests.unwrap_or(if a.quick {
        20
    } else {
        CalibrationPlan::default().requests
    });
    cfg.calibration = (calibration_requests > 0).then(|| CalibrationPlan {
        requests: calibration_requests,
        ..CalibrationPlan::default()
    });
    cfg.grid.order = a.order.order();
    let base = HardwareProfile::resolve(&a.base).map_err(|e| anyhow::anyhow!("--base: {e}"))?;
    let run_cfg = study::model_config(Mode::B3, &a.model, &base)
        .map_err(|e| anyhow::anyhow!("--model {}: {e}", a.model))?;
    let exec = executor(&run_cfg, 0, a.device)?;
    let mut mooncake = |_: &SimConfig, label: &str| -> Result<Box<dyn Store>, MeasureError> {
        mooncake_store(label)
            .map(|s| Box::new(s) as Box<dyn Store>)
            .map_err(|e| MeasureError::Store(format!("{e:#}")))
    };
    let stores: &mut StoreFactory<'_> = match a.store {
        StoreKind::Mem => &mut study::embedded_stores,
        StoreKind::Mooncake => {
            // Fail before profiling if the store is not there.
            mooncake_store("probe")?;
            &mut mooncake
        }
    };
    let pb = progress::spinner("validate", "", true);
    let st = study::run_study(&cfg, exec, stores, &a.out, |what| {
        progress::stage(&pb, what)
    });
    pb.finish_and_clear();
    let st = st?;
    println!("{}", study::report(&st));
    eprintln!("wrote {}", a.out.display());
    Ok(())
}

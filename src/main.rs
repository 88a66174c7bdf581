//! `moonagent`: the command-line tool. Argument parsing and wiring only; every decision
//! lives in the library crates.

mod cmd;

use clap::{Parser, Subcommand};

/// jemalloc instead of the system allocator: the simulator allocates and frees small
/// per-request and per-step buffers at every event; under jemalloc the W1 loop takes 2-8%
/// less time than under glibc's (`sim/README.md`, "Allocator and profile-guided build",
/// same-run comparisons on a noisy host). Outputs do not depend on
/// the allocator (the golden result files are byte-identical under both).
#[cfg(not(target_env = "msvc"))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "moonagent",
    version,
    about = "Multimodal EPD serving over Mooncake Store: cache, fork and eviction semantics, simulated and measured"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The EPD simulator; with no arguments, the B0 -> Full ladder on W1-W4 on an H200.
    Simulate(cmd::simulate::SimulateArgs),
    /// Small demonstrations of the core on the embedded store or a real Mooncake Store.
    Demo(cmd::demo::DemoArgs),
    /// Trace tools: convert, stats, generate, import.
    Trace(cmd::trace::TraceArgs),
    /// Store-level trace replay under one or more eviction policies.
    Replay(cmd::replay::ReplayArgs),
    /// Published experiments rerun: the type-aware eviction ablation, Mooncake capacity sweep.
    Repro(cmd::repro::ReproArgs),
    /// Parameter sweeps over the simulator or the replay: run, resume, merge shards, Pareto.
    Sweep(cmd::sweep::SweepArgs),
    /// The real backend: profile operators, run traces, compare with the simulator.
    Validate(cmd::validate::ValidateArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Simulate(args)) => cmd::simulate::run(args),
        Some(Command::Demo(args)) => cmd::demo::run(args),
        Some(Command::Trace(args)) => cmd::trace::run(args),
        Some(Command::Replay(args)) => cmd::replay::run(args),
        Some(Command::Repro(args)) => cmd::repro::run(args),
        Some(Command::Sweep(args)) => cmd::sweep::run(args),
        Some(Command::Validate(args)) => cmd::validate::run(args),
        // The main job: the simulator's embedded default.
        None => cmd::simulate::run(cmd::simulate::SimulateArgs::default()),
    }
}

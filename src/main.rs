//! `moonagent`: the command-line tool. Argument parsing and wiring only; every decision
//! lives in the library crates.

mod cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "moonagent", version, about = "Multimodal EPD serving over Mooncake Store: cache, fork and eviction semantics, simulated and measured")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Trace tools: convert, stats, generate, import.
    Trace(cmd::trace::TraceArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Trace(args)) => cmd::trace::run(args),
        None => {
            eprintln!("no subcommand yet");
            Ok(())
        }
    }
}

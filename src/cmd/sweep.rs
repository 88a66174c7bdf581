//! `moonagent sweep ...`. Being written: see issue 7.
use clap::Args;

/// Arguments of `moonagent sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {}

/// Run `moonagent sweep`.
pub fn run(_args: SweepArgs) -> anyhow::Result<()> {
    anyhow::bail!("sweeps are not implemented yet")
}

//! `moonagent trace ...`. Being written: see issue 4.
use clap::Args;

#[derive(Args)]
pub struct TraceArgs {}

pub fn run(_args: TraceArgs) -> anyhow::Result<()> {
    anyhow::bail!("trace tools are not implemented yet")
}

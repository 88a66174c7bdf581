//! `moonagent demo cache`: the seed's `multi_image_agent` session replayed twice through the
//! validated embedding cache, on the embedded store or on a real Mooncake Store.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use moonagent_core::mm_cache::demo::{multi_image_agent_session, replay_pass, PassReport};
use moonagent_core::mm_cache::MmCache;
use moonagent_core::store::{MemStore, MemStoreConfig, Store, SEC};
use moonagent_validation::mooncake::BridgeStore;

use super::util::print_table;

/// Arguments of `moonagent demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(subcommand)]
    what: DemoKind,
}

#[derive(Subcommand, Debug)]
enum DemoKind {
    /// Replay a multi-image agent session through the embedding cache twice.
    Cache {
        /// Use a real Mooncake Store through the bridge at this address (see scripts/mooncake.sh).
        #[arg(long)]
        bridge: Option<String>,
    },
}

fn passes<S: Store>(store: S) -> Result<(PassReport, PassReport)> {
    let session = multi_image_agent_session().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut cache = MmCache::new(store);
    let a = replay_pass(&mut cache, &session, SEC).map_err(|e| anyhow::anyhow!("pass 1: {e}"))?;
    let b =
        replay_pass(&mut cache, &session, 2 * SEC).map_err(|e| anyhow::anyhow!("pass 2: {e}"))?;
    Ok((a, b))
}

/// Run `moonagent demo`.
pub fn run(args: DemoArgs) -> Result<()> {
    let DemoKind::Cache { bridge } = args.what;
    let (a, b, store) = match &bridge {
        Some(addr) => {
            let s = BridgeStore::connect(addr)
                .with_context(|| format!("connecting to the bridge at {addr}"))?;
            let (a, b) = passes(s)?;
            (a, b, format!("real Mooncake Store via {addr}"))
        }
        None => {
            let s: MemStore<String> =
                MemStore::new(MemStoreConfig::default()).map_err(anyhow::Error::msg)?;
            let (a, b) = passes(s)?;
            (a, b, "embedded MemStore".to_string())
        }
    };
    println!("multi-image agent session, twice through the embedding cache ({store})");
    let row = |name: &str, p: &PassReport| {
        vec![
            name.to_string(),
            p.encoder_calls.to_string(),
            p.images_encoded.to_string(),
            p.hits.to_string(),
            p.readbacks.to_string(),
            p.dedup.to_string(),
            p.cache_objects.to_string(),
            p.corrupt_meta.to_string(),
            p.corrupt_blob.to_string(),
            format!(
                "{}/{}",
                p.verified_segments,
                p.verified_segments + p.wrong_segments
            ),
        ]
    };
    print_table(&[
        [
            "pass",
            "encoder calls",
            "images encoded",
            "hits",
            "readbacks",
            "dedup",
            "objects committed",
            "corrupt meta",
            "corrupt blob",
            "bytes verified",
        ]
        .map(String::from)
        .to_vec(),
        row("1 (cold)", &a),
        row("2 (warm)", &b),
    ]);
    anyhow::ensure!(
        a.wrong_segments + b.wrong_segments == 0,
        "an embedding differed from the encoder's bytes"
    );
    Ok(())
}

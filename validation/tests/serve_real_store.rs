//! The serving engine on a real Mooncake Store and on `MemStore`, side by side: the same
//! trace, the same toy driver, real bytes on both. Every store operation the engine issues
//! (prefix-KV `exists` and puts, the embedding cache's validated lookups, commits and
//! readbacks) must have the same outcome on both, and the final object sets must match.
//!
//! Needs `MOONAGENT_MOONCAKE_BRIDGE` (the README's test command starts the store).
//! Without it the test is skipped with a line saying so, except under `CI=true`.

use moonagent_core::serve::toy::{drive, toy_config, toy_trace, Seen, ToyPricing};
use moonagent_core::serve::{Engine, Mode, Payloads};
use moonagent_core::store::{MemStore, MemStoreConfig, Recorded, Store};
use moonagent_validation::mooncake::{BridgeStore, BRIDGE_ENV};

fn bridge() -> Option<BridgeStore> {
    match BridgeStore::from_env() {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => panic!("{BRIDGE_ENV} is set but the bridge is unreachable: {e}"),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{BRIDGE_ENV} is not set under CI=true: .ci/run must start the store with scripts/mooncake.sh up")
        }
        None => {
            eprintln!("skipped: {BRIDGE_ENV} not set (start a real store with `scripts/mooncake.sh up` and export what it prints)");
            None
        }
    }
}

/// Run `mode` over a 40-request toy trace on `store`; return the store's log.
fn run<S: Store>(mode: Mode, store: Recorded<S>) -> (Recorded<S>, Vec<(u64, String)>) {
    let trace = toy_trace(11, 40, 16);
    let mut e = Engine::new(
        toy_config(mode, Payloads::Bytes),
        store,
        &trace,
        Some(Box::new(ToyPricing)),
    )
    .unwrap();
    let arrivals: Vec<u64> = (0..trace.len() as u64).map(|i| i * 20_000).collect();
    // Fixed durations: both runs see the same completion order.
    let log = drive(
        &mut e,
        &arrivals,
        |_, _| 50_000,
        |_: Seen<'_, '_, _, _>| Ok(()),
    )
    .unwrap();
    assert!(e.served().iter().all(|s| s.done));
    let actions = log
        .actions
        .iter()
        .map(|(t, a)| (*t, format!("{a:?}")))
        .collect();
    let (_, _, cache) = e.into_served();
    (cache.into_store(), actions)
}

#[test]
fn engine_decides_the_same_on_a_real_mooncake_store_as_on_memstore() {
    let Some(real) = bridge() else { return };
    let mut real = Some(real);
    let pid = std::process::id();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    for mode in [Mode::B1, Mode::Full] {
        let mem = MemStore::<String>::new(MemStoreConfig::with_capacity(256 << 20)).unwrap();
        let (mem, mem_actions) = run(mode, Recorded::new(mem));
        // A fresh namespace per run: the real store may hold an earlier run's objects.
        let ns = format!("serve-{pid}-{nanos}-{}/", mode.name());
        let (mut rs, real_actions) = run(
            mode,
            Recorded::namespaced(real.take().expect("one bridge"), &ns),
        );
        let (m, r) = (mem.ops(), rs.ops());
        assert!(m.len() > 200, "{mode:?}: only {} store operations", m.len());
        for (i, (a, b)) in m.iter().zip(r).enumerate() {
            assert_eq!(a, b, "{mode:?}: store operation {i} differs");
        }
        assert_eq!(m.len(), r.len(), "{mode:?}: operation counts differ");
        assert_eq!(mem_actions, real_actions, "{mode:?}: actions differ");
        // Hits happened (the comparison covers both outcomes).
        let hits = m
            .iter()
            .filter(|o| o.ok && o.kind == moonagent_core::store::OpKind::Exists)
            .count();
        assert!(hits > 0, "{mode:?}: no prefix-KV hit to compare");
        println!(
            "{mode:?}: {} store operations, {hits} prefix-KV hits, identical on both stores",
            m.len()
        );
        // The same final object set: what the log says was written is there, on both.
        let written = mem.written_keys();
        assert_eq!(written, rs.written_keys());
        let mut mem_inner = mem;
        for k in &written {
            let now = u64::MAX / 2;
            assert_eq!(
                mem_inner.inner_mut().exists(now, k),
                Ok(true),
                "{k} in MemStore"
            );
            assert_eq!(
                rs.inner_mut().exists(now, &format!("{ns}{k}")),
                Ok(true),
                "{k} in the real store"
            );
        }
        assert_eq!(mem_inner.inner().len() as usize, written.len());
        // Hand the connection back for the next mode.
        real = Some(rs.into_inner());
    }
}

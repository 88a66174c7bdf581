//! The core's store semantics against a real Mooncake Store (master + moonagent's bridge),
//! side by side with the embedded `MemStore`.
//!
//! Needs `MOONAGENT_MOONCAKE_BRIDGE` (printed by `scripts/mooncake.sh up`; the README's
//! test command starts and stops the store). Without it the test is skipped with a line
//! saying so, except under `CI=true`, where a missing store is a failure.

use moonagent_core::mm_cache::demo::{multi_image_agent_session, replay_pass};
use moonagent_core::mm_cache::MmCache;
use moonagent_core::store::{
    MemStore, MemStoreConfig, Payload, ReplicateConfig, Store, StoreError, SEC,
};
use moonagent_validation::mooncake::{BridgeStore, BRIDGE_ENV};

fn bridge() -> Option<BridgeStore> {
    match BridgeStore::from_env() {
        Some(Ok(s)) => Some(s),
        Some(Err(e)) => panic!("{BRIDGE_ENV} is set but the bridge is unreachable: {e}"),
        None => {
            // Panics under CI=true, where .ci/run must start the store.
            moonagent_traces::skip_test(&format!(
                "{BRIDGE_ENV} not set (start a real store with `scripts/mooncake.sh up` and export what it prints)"
            ));
            None
        }
    }
}

/// A scripted operation sequence; returns every outcome as text so two stores compare.
fn script(s: &mut dyn Store, ns: &str) -> Vec<String> {
    let k = |n: &str| format!("{ns}:{n}");
    let cfg = ReplicateConfig::default();
    let t = 100 * SEC;
    let mut out = Vec::new();
    let mut log = |what: &str, r: String| out.push(format!("{what}: {r}"));
    log(
        "put a",
        format!(
            "{:?}",
            s.put(
                t,
                &k("a"),
                Payload::Bytes(b"hello moonagent".to_vec()),
                &cfg
            )
        ),
    );
    log(
        "put a again",
        format!(
            "{:?}",
            s.put(t, &k("a"), Payload::Bytes(b"other".to_vec()), &cfg)
        ),
    );
    let mut buf = [0u8; 64];
    let r = s.get_into(t, &k("a"), &mut buf);
    log(
        "get a",
        format!(
            "{r:?} {:?}",
            r.as_ref()
                .ok()
                .map(|&n| String::from_utf8_lossy(&buf[..n as usize]).into_owned())
        ),
    );
    let mut small = [0u8; 4];
    log(
        "get a small buffer",
        format!("{:?}", s.get_into(t, &k("a"), &mut small)),
    );
    log(
        "exists missing",
        format!("{:?}", s.exists(t, &k("missing"))),
    );
    log(
        "size missing",
        format!("{:?}", s.get_size(t, &k("missing"))),
    );
    log(
        "put_start b",
        format!("{:?}", s.put_start(t, &k("b"), 8, &cfg)),
    );
    log(
        "exists b in progress",
        format!("{:?}", s.exists(t, &k("b"))),
    );
    log(
        "size b in progress",
        format!("{:?}", s.get_size(t, &k("b"))),
    );
    log(
        "put_start b again",
        format!("{:?}", s.put_start(t, &k("b"), 8, &cfg)),
    );
    log(
        "put_end b",
        format!(
            "{:?}",
            s.put_end(t, &k("b"), Payload::Bytes(b"12345678".to_vec()))
        ),
    );
    log("size b", format!("{:?}", s.get_size(t, &k("b"))));
    log(
        "put_start c",
        format!("{:?}", s.put_start(t, &k("c"), 8, &cfg)),
    );
    log("revoke c", format!("{:?}", s.put_revoke(t, &k("c"))));
    log("exists c", format!("{:?}", s.exists(t, &k("c"))));
    log(
        "remove a leased",
        format!("{:?}", s.remove(t, &k("a"), false)),
    );
    log(
        "remove a force",
        format!("{:?}", s.remove(t, &k("a"), true)),
    );
    log("get a removed", format!("{:?}", s.get_size(t, &k("a"))));
    log(
        "remove b force",
        format!("{:?}", s.remove(t, &k("b"), true)),
    );
    out
}

#[test]
fn real_store_matches_memstore_and_fills_when_all_leased() {
    let Some(mut real) = bridge() else { return };
    let ns = format!("conf-{}", std::process::id());

    // 1. The same script on both stores gives the same outcome, error kinds included.
    let mut mem: MemStore<String> =
        MemStore::new(MemStoreConfig::with_capacity(256 << 20)).unwrap();
    let expect = script(&mut mem, &ns);
    let got = script(&mut real, &ns);
    assert_eq!(got, expect, "real store and MemStore disagree");
    assert!(
        expect.iter().any(|l| l.contains("HasLease")),
        "the script exercises leases"
    );

    // 2. Experiment 3 of shared/mooncake/README.md: every object read (leased) right after
    //    its put fills the segment to 100%, then every put fails with -200; MemStore agrees.
    let segment: u64 = std::env::var("MC_SEGMENT_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20);
    let obj = 1u64 << 20;
    let fits = (segment / obj) as usize;
    // Per put: whether it succeeded, and whether the read right after it found the
    // object (and so leased it).
    let run = |s: &mut dyn Store, tag: &str| -> Vec<(bool, bool)> {
        (0..fits + 16)
            .map(|i| {
                let key = format!("{ns}:{tag}:{i}");
                let ok = s
                    .put(
                        0,
                        &key,
                        Payload::Bytes(vec![i as u8; obj as usize]),
                        &ReplicateConfig::default(),
                    )
                    .is_ok();
                (ok, ok && s.get_size(0, &key).is_ok())
            })
            .collect()
    };
    let mut mem: MemStore<String> = MemStore::new(MemStoreConfig::with_capacity(segment)).unwrap();
    let m = run(&mut mem, "mem");
    let r = run(&mut real, "leased");
    let count =
        |v: &[(bool, bool)], f: fn(&(bool, bool)) -> bool| v.iter().filter(|x| f(x)).count();
    assert_eq!(count(&m, |x| x.0), fits);
    assert_eq!(
        count(&m, |x| x.1),
        fits,
        "MemStore reads every object it took"
    );
    assert!(m[fits..].iter().all(|x| !x.0));
    // The real segment also carries the conformance objects' allocator slack: allow one slot.
    let leased = count(&r, |x| x.1);
    assert!(
        leased + 1 >= fits && leased <= fits,
        "real store leased {leased} of {fits}"
    );
    // A put takes no lease: above the eviction watermark the master may evict a fresh
    // object before the read that would lease it. The experiment's run did not hit that
    // race; it is the likely cause of a CI run on a loaded host taking 257 of 256, once
    // (its master log was not kept). Each such eviction frees one slot, and only those let
    // a put past the full segment succeed: a leased object evicted, or a put beyond a full
    // segment accepted, still fails here.
    let evicted_unread = count(&r, |x| x.0 && !x.1);
    let past_full = count(&r[fits..], |x| x.0);
    assert!(
        past_full <= evicted_unread,
        "{past_full} puts succeeded after the segment was full, with {evicted_unread} \
         objects evicted before their read: every other put must fail"
    );
    let mut buf = vec![0u8; 16];
    assert!(matches!(
        real.get_into(0, &format!("{ns}:leased:0"), &mut buf),
        Err(StoreError::BufferTooSmall { .. })
    ));

    // Clean up: force-remove what the experiment left (leases would hold it for 10 s).
    for i in 0..fits + 16 {
        let _ = real.remove(0, &format!("{ns}:leased:{i}"), true);
    }

    // 3. The embedding cache (the same core code) over the real store: the multi-image agent
    //    session twice gives exactly the counters it gives on MemStore, and every byte read
    //    back equals the encoder's.
    let session = multi_image_agent_session().expect("demo session");
    let run_cache = |store: &mut dyn Store| {
        let mut cache = MmCache::new(store);
        let a = replay_pass(&mut cache, &session, SEC).expect("pass 1");
        let b = replay_pass(&mut cache, &session, 2 * SEC).expect("pass 2");
        // Leave nothing behind on the real store.
        for img in &session.images {
            let _ = cache.remove_pair(0, &img.input.fp);
        }
        (a, b)
    };
    let mut mem: MemStore<String> = MemStore::new(MemStoreConfig::default()).unwrap();
    let on_mem = run_cache(&mut mem);
    let on_real = run_cache(&mut real);
    assert_eq!(
        on_real, on_mem,
        "the embedding cache behaves differently on the real store"
    );
    assert_eq!(
        on_real.1.images_encoded, 0,
        "the second pass encodes nothing"
    );
    assert_eq!(on_real.0.wrong_segments + on_real.1.wrong_segments, 0);
}

//! The six eviction experiments measured on the real Mooncake master (0.3.13.post1,
//! `../shared/mooncake/README.md`), replayed against `MemStore` with the same sizes and
//! flags: 256 MiB segment, 1 MiB objects, default flags unless stated.
//!
//! The real runs did not record per-operation timing, and three outcomes depend on how
//! fast the client put relative to the master's 10 ms eviction tick. Each test therefore
//! fixes the client's cycle time (stated per test) and asserts:
//! - exactly, the outcomes that do not depend on timing (experiments 3 and 6, which pins
//!   and which reads survive, oldest-first order);
//! - within a stated band, the counts that do (experiments 1, 2, 4, 5).
//!
//! Every band is two-sided and centred on the real master's value: +-3% of it (the real
//! runs were single runs, so the master's own spread is unknown; 3% is the largest
//! distance between a `MemStore` count and the master's here, exp 2's 171 vs 167). The
//! no-space counts of experiments 1 and 2, which the one-shard model does not reproduce
//! (below), are asserted at the model's exact value with the master's beside it, so a
//! change in either the model or the explanation shows.
//!
//! Why the bands, not exact counts: the real master splits pass 1 of `BatchEvict` across
//! 1,024 hash shards, each evicting its share of the target in its own lease order, and a
//! shard whose objects are all leased gives up its share (pass 2 tops up only to the lower
//! bound, half the target). So per tick it evicts between the lower bound and the target,
//! while `MemStore` (one shard, global lease order) always evicts the full target. That is
//! why the real master lets a fast client hit the full segment a few times (1 x -200 in
//! experiment 1, 18 x -200 in experiment 2) where `MemStore` at the same pace does not.

use moonagent_core::store::{
    MemStore, MemStoreConfig, Payload, ReplicateConfig, Store, StoreError, MS, SEC,
};

const MIB: u64 = 1 << 20;
const SEGMENT: u64 = 256 * MIB;
const T0: u64 = SEC;

fn store(cfg: MemStoreConfig) -> MemStore<String> {
    MemStore::new(cfg).expect("valid config")
}

fn key(i: usize) -> String {
    format!("obj-{i}")
}

fn put(
    s: &mut MemStore<String>,
    now: u64,
    k: &str,
    cfg: &ReplicateConfig,
) -> Result<(), StoreError> {
    s.put(now, k, Payload::SizeOnly(MIB), cfg)
}

fn alive(s: &MemStore<String>, k: &str) -> bool {
    s.peek(k).is_some()
}

/// Within 3% of the real master's `real`, on both sides (module docs).
fn within_3pct(got: u64, real: u64) -> bool {
    got.abs_diff(real) * 100 <= 3 * real
}

fn evicted(s: &MemStore<String>) -> u64 {
    s.stats().by_type.iter().map(|t| t.evicted).sum()
}

/// Experiment 1: 2 soft + 2 hard pinned, then 600 puts, no reads.
/// Real: 599 ok, 1 x -200; 385 evicted, oldest first; all pinned survive.
/// Client pace: one 1 MiB put every 1 ms (the README's loopback Python API: ~900 MB/s).
#[test]
fn exp1_pinned_survive_and_unpinned_evicted_oldest_first() {
    let mut s = store(MemStoreConfig::with_capacity(SEGMENT));
    let soft = ReplicateConfig {
        soft_pin: true,
        ..Default::default()
    };
    let hard = ReplicateConfig {
        hard_pin: true,
        ..Default::default()
    };
    let mut t = T0;
    for i in 0..2 {
        put(&mut s, t, &format!("soft-{i}"), &soft).unwrap();
        put(&mut s, t, &format!("hard-{i}"), &hard).unwrap();
        t += MS;
    }
    let (mut ok, mut no_space) = (0, 0);
    for i in 0..600 {
        match put(&mut s, t, &key(i), &ReplicateConfig::default()) {
            Ok(()) => ok += 1,
            Err(StoreError::NoAvailableHandle) => no_space += 1,
            Err(e) => panic!("unexpected {e}"),
        }
        t += MS;
    }
    s.advance(t + SEC);
    for k in ["soft-0", "soft-1", "hard-0", "hard-1"] {
        assert!(alive(&s, k), "{k} must survive");
    }
    // The real master: 599 ok, 1 x -200 (the shard effect of the module docs); one shard
    // evicts the full target every tick, so the segment never fills at this pace.
    assert_eq!((ok, no_space), (600, 0), "real master 599 ok, 1 x -200");
    let ev = evicted(&s);
    assert!(within_3pct(ev, 385), "evicted {ev}, real master 385");
    // Oldest first: the survivors among the 600 are exactly the newest ones.
    let survivors: Vec<usize> = (0..600).filter(|&i| alive(&s, &key(i))).collect();
    let first = survivors[0];
    assert_eq!(
        survivors,
        (first..600).collect::<Vec<_>>(),
        "survivors must be the newest"
    );
}

/// Experiment 2: 200 puts, read 0..49, 400 more puts.
/// Real: 18 x -200; all 50 read objects survive; 0 of 50..199; 167 of the newest 400.
/// Client pace: 1 ms a put, 0.25 ms a read.
#[test]
fn exp2_read_objects_survive_by_lease() {
    let mut s = store(MemStoreConfig::with_capacity(SEGMENT));
    let mut t = T0;
    let mut no_space = 0;
    for i in 0..200 {
        if put(&mut s, t, &key(i), &ReplicateConfig::default()).is_err() {
            no_space += 1;
        }
        t += MS;
    }
    for i in 0..50 {
        assert_eq!(s.get_size(t, &key(i)), Ok(MIB));
        t += MS / 4;
    }
    for i in 200..600 {
        match put(&mut s, t, &key(i), &ReplicateConfig::default()) {
            Ok(()) => {}
            Err(StoreError::NoAvailableHandle) => no_space += 1,
            Err(e) => panic!("unexpected {e}"),
        }
        t += MS;
    }
    // The whole run takes under 10 s: every read lease still holds.
    assert!(t < T0 + 10 * SEC);
    s.advance(t + 50 * MS);
    assert_eq!(
        (0..50).filter(|&i| alive(&s, &key(i))).count(),
        50,
        "every read object survives"
    );
    assert_eq!(
        (50..200).filter(|&i| alive(&s, &key(i))).count(),
        0,
        "no unread old object survives"
    );
    let newest = (200..600).filter(|&i| alive(&s, &key(i))).count();
    assert!(
        within_3pct(newest as u64, 167),
        "{newest} of the newest 400 survive, real master 167"
    );
    // The shard effect (module docs) gives the real master 18 x -200; one shard gives none.
    assert_eq!(no_space, 0, "real master 18 x -200");
}

/// Experiment 3: put then get every object (all leased), 512 puts.
/// Real: first 256 ok, segment 100% full, all later puts -200. Timing-free: exact.
#[test]
fn exp3_all_leased_fills_to_full_then_every_put_fails() {
    let mut s = store(MemStoreConfig::with_capacity(SEGMENT));
    let mut t = T0;
    let mut results = Vec::new();
    for i in 0..512 {
        let r = put(&mut s, t, &key(i), &ReplicateConfig::default());
        if r.is_ok() {
            s.get_size(t, &key(i)).unwrap();
        }
        results.push(r);
        t += MS;
    }
    assert!(results[..256].iter().all(|r| r.is_ok()));
    assert!(results[256..]
        .iter()
        .all(|r| *r == Err(StoreError::NoAvailableHandle)));
    assert_eq!(s.used_bytes(), SEGMENT);
    assert_eq!(evicted(&s), 0);
}

/// Experiment 4: as 3 with lease 500 ms, high watermark 0.8, eviction ratio 0.1.
/// Real: 391 ok, 121 x -200. The outcome is a function of the client's put+get cycle time
/// against the 500 ms lease, which the real run did not record. What is checked without
/// fitting: the count grows with the cycle time, and over the README's loopback range
/// (a put + get of 1 MiB takes 1-2 ms) it spans the real 391 strictly. The 1.35 ms cycle
/// was fitted to give the real count, so the check there is a consistency check only.
/// The test also pins the two timing-free ends: a fast client (0.5 ms) fills the segment
/// and then fails like experiment 3; a slow one (3 ms) never fails.
#[test]
fn exp4_short_lease_frees_space_as_leases_expire() {
    let run = |cycle_us: u64| {
        let mut c = MemStoreConfig::with_capacity(SEGMENT);
        c.kv_lease_ttl_ns = 500 * MS;
        c.high_watermark = 0.8;
        c.eviction_ratio = 0.1;
        let mut s = store(c);
        let mut t = T0;
        let mut ok = 0;
        for i in 0..512 {
            if put(&mut s, t, &key(i), &ReplicateConfig::default()).is_ok() {
                ok += 1;
                // A fresh object takes no lease and may be evicted before its read.
                let _ = s.get_size(t + cycle_us * 500, &key(i));
            }
            t += cycle_us * 1000;
        }
        ok
    };
    assert_eq!(run(500), 256, "fast client: all leased, like experiment 3");
    assert_eq!(
        run(3000),
        512,
        "slow client: leases expire faster than the segment fills"
    );
    let grid: Vec<u64> = [1000, 1250, 1500, 1750, 2000].map(run).to_vec();
    assert!(grid.windows(2).all(|w| w[0] <= w[1]), "{grid:?}");
    assert!(
        grid[0] < 391 && 391 < grid[4],
        "{grid:?} over 1-2 ms/cycle must span the real master's 391"
    );
    let at_fit = run(1350);
    assert!(
        within_3pct(at_fit, 391),
        "consistency at the fitted 1.35 ms/cycle: {at_fit} ok, real master 391"
    );
}

/// Experiment 5: 100 unpinned then 400 soft-pinned. Real: all ok; every unpinned evicted
/// first, then oldest soft-pinned; 229 soft survive. Client pace: 1 ms a put.
#[test]
fn exp5_unpinned_go_before_any_soft_pinned() {
    let mut s = store(MemStoreConfig::with_capacity(SEGMENT));
    let soft = ReplicateConfig {
        soft_pin: true,
        ..Default::default()
    };
    let mut t = T0;
    for i in 0..500 {
        let cfg = if i < 100 {
            ReplicateConfig::default()
        } else {
            soft
        };
        put(&mut s, t, &key(i), &cfg).unwrap_or_else(|e| panic!("put {i}: {e}"));
        t += MS;
    }
    s.advance(t + SEC);
    assert_eq!(
        (0..100).filter(|&i| alive(&s, &key(i))).count(),
        0,
        "every unpinned evicted"
    );
    let soft_alive: Vec<usize> = (100..500).filter(|&i| alive(&s, &key(i))).collect();
    assert_eq!(
        soft_alive,
        (soft_alive[0]..500).collect::<Vec<_>>(),
        "oldest soft-pinned go first"
    );
    assert!(
        within_3pct(soft_alive.len() as u64, 229),
        "{} soft survive, real master 229",
        soft_alive.len()
    );
}

/// Experiment 6: as 5 with `allow_evict_soft_pinned_objects=false`.
/// Real: 356 ok, 144 x -200. Timing-free: exact.
#[test]
fn exp6_soft_pinned_never_evicted_when_disallowed() {
    let mut c = MemStoreConfig::with_capacity(SEGMENT);
    c.allow_evict_soft_pinned = false;
    let mut s = store(c);
    let soft = ReplicateConfig {
        soft_pin: true,
        ..Default::default()
    };
    let mut t = T0;
    let (mut ok, mut no_space) = (0, 0);
    for i in 0..500 {
        let cfg = if i < 100 {
            ReplicateConfig::default()
        } else {
            soft
        };
        match put(&mut s, t, &key(i), &cfg) {
            Ok(()) => ok += 1,
            Err(StoreError::NoAvailableHandle) => no_space += 1,
            Err(e) => panic!("unexpected {e}"),
        }
        t += MS;
    }
    assert_eq!((ok, no_space), (356, 144));
    assert_eq!((100..500).filter(|&i| alive(&s, &key(i))).count(), 256);
}

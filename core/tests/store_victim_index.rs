//! INVARIANTS S11: the victim index picks exactly the scan's victims.
//!
//! `mooncake-default` and `type-aware` pick their victims from the store's `VictimIndex`
//! (`select_victims_indexed`); their full scan (`select_victims`) is the reference. Each
//! random workload runs on two stores with the same policy: one that uses the index and one
//! whose policy is wrapped so that the store only ever scans. Both record every run's
//! victims in order; after every operation the two victim logs, the operation results, the
//! stats and every slot's meta must be equal, and the index must match the metas
//! (`VictimIndex::check`). Workloads mix types, sizes, soft and hard pins, puts in
//! progress, revokes, reads refreshing leases (also with a lagging clock), reads held open
//! across time, removes, waits and capacity pressure, under random store configs (lease
//! TTLs, soft-pin TTLs, watermarks, eviction ratios, tick or synchronous eviction) and random
//! `type-aware` knobs (grace, reuse scale, soft-pin weight, budgets).

use std::sync::{Arc, Mutex};

use moonagent_core::store::policies::{TypeAwareConfig, TypeKnobs, TypeKnobsByType};
use moonagent_core::store::{
    Candidate, DataType, EvictRequest, EvictionPolicy, MemStore, MemStoreConfig, ObjId, ObjectMeta,
    Payload, PolicyConfig, ReplicateConfig, StoreResult, VictimIndex, MS,
};
use proptest::prelude::*;

/// Forwards to a policy and logs the victims of every run. With `indexed` false the store
/// sees a policy without an index (it scans); with it true, only the indexed runs are
/// logged (a debug store also runs the scan to cross-check, which is not a run).
#[derive(Debug)]
struct Logged {
    inner: Box<dyn EvictionPolicy>,
    indexed: bool,
    log: Log,
}

/// Every run's victims, each with whether it was soft-pinned then.
type Log = Arc<Mutex<Vec<Vec<(ObjId, bool)>>>>;

fn entry(req: &EvictRequest, o: &[ObjectMeta], out: &[ObjId]) -> Vec<(ObjId, bool)> {
    out.iter()
        .map(|&id| {
            (
                id,
                o[id.index()].candidate(req.now) == Candidate::SoftPinned,
            )
        })
        .collect()
}

impl EvictionPolicy for Logged {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn on_insert(&mut self, id: ObjId, m: &ObjectMeta) {
        self.inner.on_insert(id, m)
    }
    fn on_access(&mut self, id: ObjId, m: &ObjectMeta) {
        self.inner.on_access(id, m)
    }
    fn on_remove(&mut self, id: ObjId, m: &ObjectMeta) {
        self.inner.on_remove(id, m)
    }
    fn select_victims(&mut self, req: &EvictRequest, o: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.inner.select_victims(req, o, out);
        if !self.indexed {
            self.log.lock().unwrap().push(entry(req, o, out));
        }
    }
    fn uses_victim_index(&self) -> bool {
        self.indexed
    }
    fn select_victims_indexed(
        &mut self,
        req: &EvictRequest,
        o: &[ObjectMeta],
        ix: &mut VictimIndex,
        out: &mut Vec<ObjId>,
    ) {
        assert!(self.indexed, "a scanning store called the indexed path");
        self.inner.select_victims_indexed(req, o, ix, out);
        self.log.lock().unwrap().push(entry(req, o, out));
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// `pin`: 0-3 none, 4 soft, 5 hard; `lag_ms` > 0 stamps it that far in the past (its
    /// eviction then runs at a time before the last one's).
    Put {
        key: u8,
        size: u8,
        pin: u8,
        dt: u8,
        lag_ms: u16,
    },
    PutStart {
        key: u8,
        size: u8,
        pin: u8,
        dt: u8,
    },
    PutEnd {
        key: u8,
    },
    Revoke {
        key: u8,
    },
    /// A lease-granting read; `lag_ms` > 0 stamps it that far in the past.
    Get {
        key: u8,
        lag_ms: u16,
    },
    BeginRead {
        key: u8,
    },
    EndRead {
        key: u8,
    },
    Remove {
        key: u8,
        force: bool,
    },
    Wait {
        ms: u16,
    },
}

const KEYS: u8 = 40;

/// Mostly on time, sometimes up to 4 s late.
fn lag() -> impl Strategy<Value = u16> {
    prop_oneof![3 => Just(0u16), 1 => 1u16..4000]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0..KEYS, 1u8..64, 0u8..6, 0u8..3, lag())
            .prop_map(|(key, size, pin, dt, lag_ms)| Op::Put { key, size, pin, dt, lag_ms }),
        2 => (0..KEYS, 1u8..64, 0u8..6, 0u8..3)
            .prop_map(|(key, size, pin, dt)| Op::PutStart { key, size, pin, dt }),
        2 => (0..KEYS).prop_map(|key| Op::PutEnd { key }),
        1 => (0..KEYS).prop_map(|key| Op::Revoke { key }),
        6 => (0..KEYS, lag()).prop_map(|(key, lag_ms)| Op::Get { key, lag_ms }),
        1 => (0..KEYS).prop_map(|key| Op::BeginRead { key }),
        1 => (0..KEYS).prop_map(|key| Op::EndRead { key }),
        1 => (0..KEYS, any::<bool>()).prop_map(|(key, force)| Op::Remove { key, force }),
        3 => prop_oneof![0u16..50, 0u16..20_000].prop_map(|ms| Op::Wait { ms }),
    ]
}

fn store_cfg() -> impl Strategy<Value = MemStoreConfig> {
    (
        100u64..800,
        prop_oneof![Just(0.9), 0.5f64..1.0],
        prop_oneof![Just(0.05), 0.0f64..0.5],
        prop_oneof![Just(0u64), Just(200u64), 1u64..20_000],
        prop_oneof![Just(1_000u64), 1u64..5_000, 1u64..60_000],
        any::<bool>(),
        prop_oneof![Just(0u64), Just(10u64), 1u64..500],
    )
        .prop_map(
            |(cap, hwm, ratio, ttl_ms, pin_ms, allow_soft, tick_ms)| MemStoreConfig {
                capacity_bytes: cap,
                high_watermark: hwm,
                eviction_ratio: ratio,
                kv_lease_ttl_ns: ttl_ms * MS,
                soft_pin_ttl_ns: pin_ms * MS,
                allow_evict_soft_pinned: allow_soft,
                eviction_interval_ns: tick_ms * MS,
                put_start_discard_timeout_ns: 3_000 * MS,
            },
        )
}

fn knobs() -> impl Strategy<Value = TypeKnobs> {
    (
        prop_oneof![Just(1.0), Just(0.5), Just(2.0), Just(8.0), 0.01f64..100.0],
        prop_oneof![Just(1.0), Just(0.25), Just(3.0)],
        prop_oneof![Just(0u64), Just(5), Just(100), Just(5_000)],
        prop_oneof![Just(None), Just(Some(0.0)), (0.0f64..=1.0).prop_map(Some)],
    )
        .prop_map(
            |(reuse_scale, soft_pin_weight, eviction_grace_ms, budget_ratio)| TypeKnobs {
                reuse_scale,
                soft_pin_weight,
                eviction_grace_ms,
                budget_ratio,
            },
        )
}

fn policy() -> impl Strategy<Value = PolicyConfig> {
    prop_oneof![
        2 => Just(PolicyConfig::MooncakeDefault {}),
        1 => Just(PolicyConfig::TypeAware(TypeAwareConfig::default())),
        3 => (knobs(), knobs(), knobs()).prop_map(|(general, kv_cache, encoder_output)| {
            PolicyConfig::TypeAware(TypeAwareConfig {
                types: TypeKnobsByType {
                    general,
                    kv_cache,
                    encoder_output,
                },
            })
        }),
    ]
}

fn store(cfg: &MemStoreConfig, p: &PolicyConfig, indexed: bool) -> (MemStore<String>, Log) {
    let log = Log::default();
    let inner = p.build().unwrap();
    assert!(
        inner.uses_victim_index(),
        "{} has no indexed path",
        inner.name()
    );
    let wrapped = Logged {
        inner,
        indexed,
        log: log.clone(),
    };
    let s = MemStore::with_policy_box(cfg.clone(), Box::new(wrapped)).unwrap();
    assert_eq!(s.victim_index().is_some(), indexed);
    (s, log)
}

fn rc(key: u8, pin: u8) -> ReplicateConfig {
    ReplicateConfig {
        data_type: DataType::ALL[key as usize % DataType::COUNT],
        hard_pin: pin == 5,
        soft_pin: pin == 4,
    }
}

/// Apply `op` at `now`; returns its result as a comparable string.
fn apply(s: &mut MemStore<String>, op: &Op, now: u64) -> String {
    let k = |key: u8| format!("k{key}");
    let r: StoreResult<String> = match *op {
        Op::Put {
            key,
            size,
            pin,
            lag_ms,
            ..
        } => s
            .put_with(
                now.saturating_sub(u64::from(lag_ms) * MS),
                k(key),
                Payload::SizeOnly(u64::from(size)),
                &rc(key, pin),
                Default::default(),
            )
            .map(|id| format!("{id:?}")),
        Op::PutStart { key, size, pin, .. } => s
            .put_start_with(
                now,
                k(key),
                u64::from(size),
                &rc(key, pin),
                Default::default(),
            )
            .map(|id| format!("{id:?}")),
        Op::PutEnd { key } => {
            let size = s.peek(&k(key)).map_or(1, |m| m.size);
            s.put_end_with(now, k(key).as_str(), Payload::SizeOnly(size))
                .map(|()| String::new())
        }
        Op::Revoke { key } => s
            .put_revoke_with(now, k(key).as_str())
            .map(|()| String::new()),
        Op::Get { key, lag_ms } => s
            .get_size_with(
                now.saturating_sub(u64::from(lag_ms) * MS),
                k(key).as_str(),
                None,
            )
            .map(|n| n.to_string()),
        Op::BeginRead { key } => s
            .begin_read_with(now, k(key).as_str(), None)
            .map(|n| n.to_string()),
        Op::EndRead { key } => s
            .end_read_with(now, k(key).as_str())
            .map(|()| String::new()),
        Op::Remove { key, force } => s
            .remove_with(now, k(key).as_str(), force)
            .map(|()| String::new()),
        Op::Wait { .. } => {
            s.advance(now);
            Ok(String::new())
        }
    };
    format!("{r:?}")
}

fn run(cfg: MemStoreConfig, p: PolicyConfig, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (mut a, la) = store(&cfg, &p, true);
    let (mut b, lb) = store(&cfg, &p, false);
    let mut now = 1_000 * MS;
    for (i, op) in ops.iter().enumerate() {
        now += match *op {
            Op::Wait { ms } => u64::from(ms) * MS,
            Op::Put { dt, .. } | Op::PutStart { dt, .. } => u64::from(dt) * MS,
            _ => 0,
        };
        let ra = apply(&mut a, op, now);
        let rb = apply(&mut b, op, now);
        prop_assert_eq!(&ra, &rb, "op {} {:?}: results differ", i, op);
        prop_assert_eq!(
            &*la.lock().unwrap(),
            &*lb.lock().unwrap(),
            "op {} {:?}: victim sequences differ",
            i,
            op
        );
        prop_assert_eq!(a.stats(), b.stats(), "op {} {:?}: stats differ", i, op);
        prop_assert_eq!(a.metas(), b.metas(), "op {} {:?}: metas differ", i, op);
        if let Err(e) = a.victim_index().unwrap().check(a.metas()) {
            return Err(TestCaseError::fail(format!("op {i} {op:?}: {e}")));
        }
    }
    prop_assert_eq!(a.stats().policy_refused, 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// S11: same victims in the same order and the same store, index vs scan.
    #[test]
    fn indexed_victims_equal_the_scan(
        cfg in store_cfg(),
        p in policy(),
        ops in prop::collection::vec(op(), 1..300),
    ) {
        run(cfg, p, ops)?;
    }
}

/// The workloads above do evict, and they evict soft-pinned and budgeted objects too (so
/// the property is not vacuous): a fixed long run under pressure.
#[test]
fn the_workload_reaches_every_branch() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let (mut runs, mut victims, mut soft, mut typed) = (0, 0, 0, 0);
    for _ in 0..64 {
        let cfg = store_cfg().new_tree(&mut runner).unwrap().current();
        let p = policy().new_tree(&mut runner).unwrap().current();
        let ops = prop::collection::vec(op(), 300)
            .new_tree(&mut runner)
            .unwrap()
            .current();
        let (mut a, la) = store(&cfg, &p, true);
        let mut now = 1_000 * MS;
        for op in &ops {
            now += match *op {
                Op::Wait { ms } => u64::from(ms) * MS,
                Op::Put { dt, .. } | Op::PutStart { dt, .. } => u64::from(dt) * MS,
                _ => 0,
            };
            apply(&mut a, op, now);
        }
        let log = la.lock().unwrap();
        let n: usize = log.iter().map(Vec::len).sum();
        runs += log.len();
        victims += n;
        soft += log.iter().flatten().filter(|v| v.1).count();
        if matches!(p, PolicyConfig::TypeAware(c) if c != TypeAwareConfig::default()) {
            typed += n;
        }
    }
    eprintln!("runs {runs} victims {victims} soft {soft} typed {typed}");
    assert!(runs > 1_000, "only {runs} eviction runs");
    assert!(victims > 2_000, "only {victims} victims");
    assert!(soft > 50, "only {soft} soft-pinned victims");
    assert!(typed > 500, "only {typed} victims of type-aware with knobs");
}

/// A soft pin ends exactly at its expiry (`soft_pin_until` is exclusive): a run at that
/// very time treats the object as unpinned in the index as in the scan. The random times
/// above rarely land on the boundary; here the run is at it. Object 0 (general, 40 bytes,
/// soft-pinned for 1 s) is put at 1 s; at 2 s two more general puts (40 and 20 bytes)
/// bring the store to 100 of 100 bytes, above the 90% watermark, and a synchronous run
/// evicts one object (5% of 3, rounded up) with soft-pinned objects protected: object 0,
/// unpinned from 2 s and the oldest lease (1 s against 2 s).
#[test]
fn a_soft_pin_ends_exactly_at_its_expiry_in_the_index_too() {
    let cfg = MemStoreConfig {
        capacity_bytes: 100,
        high_watermark: 0.9,
        eviction_ratio: 0.05,
        kv_lease_ttl_ns: 0,
        soft_pin_ttl_ns: 1_000 * MS,
        allow_evict_soft_pinned: false,
        eviction_interval_ns: 0,
        put_start_discard_timeout_ns: 3_000 * MS,
    };
    let put = |key, size, pin| Op::Put {
        key,
        size,
        pin,
        dt: 0,
        lag_ms: 0,
    };
    // Keys 0, 3 and 6 are all general (`rc`: key % 3).
    let ops = vec![
        put(0, 40, 4),
        Op::Wait { ms: 1_000 },
        put(3, 40, 0),
        put(6, 20, 0),
    ];
    for p in [
        PolicyConfig::MooncakeDefault {},
        PolicyConfig::TypeAware(TypeAwareConfig::default()),
    ] {
        run(cfg.clone(), p.clone(), ops.clone()).unwrap();
        let (mut s, log) = store(&cfg, &p, true);
        let mut now = 1_000 * MS;
        for op in &ops {
            if let Op::Wait { ms } = *op {
                now += u64::from(ms) * MS;
            }
            apply(&mut s, op, now);
        }
        let victim = s.peek("k0").is_none();
        assert!(victim, "{p:?}: object 0 not evicted");
        assert_eq!(s.peek("k3").map(|m| m.size), Some(40), "{p:?}");
        assert_eq!(s.peek("k6").map(|m| m.size), Some(20), "{p:?}");
        assert_eq!(log.lock().unwrap().len(), 1, "{p:?}: one run");
    }
}

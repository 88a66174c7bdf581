//! Property tests over every eviction policy (quick_cache's op-sequence style): random
//! operation sequences on a real `MemStore`, with each policy wrapped in a checker that
//! inspects every plan the store asks for.
//!
//! Invariants held (for INVARIANTS.md):
//! - capacity: `used_bytes <= capacity_bytes` after every operation, any policy;
//! - protection: a victim is always a candidate at the run's `now` (never leased,
//!   hard-pinned, in progress or being read); the store's own re-validation agrees
//!   (`policy_refused == 0`);
//! - pass structure: a run plans exactly `min(U, max(target, lower_bound))` unpinned
//!   victims and `min(S, lower_bound - that)` soft-pinned ones (0 when disallowed), all
//!   distinct, soft-pinned after unpinned: soft pins are touched only when no unpinned
//!   candidate is left, and no policy under-delivers;
//! - hook consistency: LRU's, FIFO's, S3-FIFO's and SIEVE's queues hold exactly the live objects
//!   (slot reuse included), and LRU / FIFO evict exactly what a full scan by
//!   `last_access_seq` / `insert_seq` would;
//! - compatibility: `type-aware` with default knobs and a single-leaf `hierarchical` tree
//!   make exactly `mooncake-default`'s choices.

use std::collections::BTreeSet;

use moonagent_core::invariant::InvariantViolation;
use moonagent_core::store::policies::{
    Belady, Fifo, Lru, S3Fifo, S3FifoConfig, Sieve, WTinyLfu, WTinyLfuConfig,
};
use moonagent_core::store::{
    AccessHints, Candidate, DataType, EvictRequest, EvictionPolicy, MemStore, MemStoreConfig,
    MooncakeDefault, ObjId, ObjectMeta, Payload, PolicyConfig, ReplicateConfig, MS,
};
use proptest::prelude::*;

// ---------------------------------------------------------------- the checker

/// A policy behind a box, so the checker can wrap configured policies.
#[derive(Debug)]
struct Dyn(Box<dyn EvictionPolicy>);

impl EvictionPolicy for Dyn {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn on_insert(&mut self, id: ObjId, m: &ObjectMeta) {
        self.0.on_insert(id, m)
    }
    fn on_access(&mut self, id: ObjId, m: &ObjectMeta) {
        self.0.on_access(id, m)
    }
    fn on_remove(&mut self, id: ObjId, m: &ObjectMeta) {
        self.0.on_remove(id, m)
    }
    fn select_victims(&mut self, req: &EvictRequest, o: &[ObjectMeta], out: &mut Vec<ObjId>) {
        self.0.select_victims(req, o, out)
    }
}

type StateCheck<P> = fn(&P, &[ObjectMeta]) -> Result<(), InvariantViolation>;

/// Checks every plan of the wrapped policy (and its internal state, if it can).
#[derive(Debug)]
struct Checked<P> {
    inner: P,
    state: Option<StateCheck<P>>,
}

fn check_plan(name: &str, req: &EvictRequest, objects: &[ObjectMeta], victims: &[ObjId]) {
    let mut unpinned = 0u64;
    let mut soft = 0u64;
    for m in objects {
        match m.candidate(req.now) {
            Candidate::Unpinned => unpinned += 1,
            Candidate::SoftPinned if req.allow_soft_pinned => soft += 1,
            _ => {}
        }
    }
    let q = req.target.max(req.lower_bound);
    let want_u = unpinned.min(q);
    let want_s = soft.min(req.lower_bound.saturating_sub(want_u));
    let mut seen = BTreeSet::new();
    let (mut got_u, mut got_s) = (0, 0);
    for &id in victims {
        assert!(seen.insert(id), "{name}: victim {id:?} planned twice");
        match objects.get(id.index()).map(|m| m.candidate(req.now)) {
            Some(Candidate::Unpinned) => {
                assert_eq!(got_s, 0, "{name}: unpinned victim after a soft-pinned one");
                got_u += 1;
            }
            Some(Candidate::SoftPinned) if req.allow_soft_pinned => got_s += 1,
            c => panic!(
                "{name}: victim {id:?} is not a candidate ({c:?}) at {}",
                req.now
            ),
        }
    }
    assert_eq!(
        (got_u, got_s),
        (want_u, want_s),
        "{name}: planned (unpinned, soft) vs expected, for {req:?}"
    );
}

impl<P: EvictionPolicy> EvictionPolicy for Checked<P> {
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
    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        if let Some(f) = self.state {
            if let Err(e) = f(&self.inner, objects) {
                panic!("{}: state before the run: {e}", self.inner.name());
            }
        }
        let start = out.len();
        self.inner.select_victims(req, objects, out);
        check_plan(self.inner.name(), req, objects, &out[start..]);
    }
}

fn checked<P: EvictionPolicy + 'static>(
    inner: P,
    state: Option<StateCheck<P>>,
) -> Box<dyn EvictionPolicy> {
    Box::new(Checked { inner, state })
}

fn all_policies() -> Vec<Box<dyn EvictionPolicy>> {
    let mut v: Vec<Box<dyn EvictionPolicy>> = Vec::new();
    for json in [
        r#"{"policy":"mooncake-default"}"#,
        r#"{"policy":"type-aware"}"#,
        r#"{"policy":"type-aware","types":{"encoder_output":{"reuse_scale":8.0,"eviction_grace_ms":500,"budget_ratio":0.12,"soft_pin_weight":2.0},"kv_cache":{"budget_ratio":0.8}}}"#,
        r#"{"policy":"type-aware","types":{"kv_cache":{"budget_ratio":0.0}}}"#,
        r#"{"policy":"gdsf"}"#,
        r#"{"policy":"belady"}"#,
        r#"{"policy":"belady-cost"}"#,
    ] {
        let p = PolicyConfig::from_json_str(json).unwrap().build().unwrap();
        v.push(checked(Dyn(p), None));
    }
    let tree = PolicyConfig::from_toml_str(include_str!("data/hierarchical.toml")).unwrap();
    v.push(checked(Dyn(tree.build().unwrap()), None));
    let gdsf_tree = r#"
policy = "hierarchical"
[tree]
assign = "objects"
budget_ratio = 0.5
[[tree.children]]
select = { data_types = ["kv_cache", "general"] }
budget_ratio = 0.3
assign = "bytes"
evict = { rule = "gdsf" }
[[tree.children.children]]
select = { priorities = [1, 2] }
evict = { rule = "fifo" }
[[tree.children]]
select = { tenant = 1 }
evict = { rule = "type-aware", types = { encoder_output = { reuse_scale = 4.0 } } }
"#;
    let p = PolicyConfig::from_toml_str(gdsf_tree)
        .unwrap()
        .build()
        .unwrap();
    v.push(checked(Dyn(p), None));
    v.push(checked(Lru::new(), Some(Lru::check)));
    v.push(checked(Fifo::new(), Some(Fifo::check)));
    v.push(checked(
        S3Fifo::new(&S3FifoConfig::default()).unwrap(),
        Some(S3Fifo::check),
    ));
    v.push(checked(Sieve::new(), Some(Sieve::check)));
    v.push(checked(
        WTinyLfu::new(&WTinyLfuConfig::default()).unwrap(),
        Some(WTinyLfu::check),
    ));
    v
}

// ---------------------------------------------------------------- operations

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: u8,
        size: u8,
        pin: u8,
        dt: u8,
        hint: u16,
    },
    PutStart {
        key: u8,
        size: u8,
    },
    PutEnd {
        key: u8,
    },
    Revoke {
        key: u8,
    },
    Get {
        key: u8,
        hint: u16,
    },
    Exists {
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

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..24, 1u8..48, 0u8..8, 0u8..3, any::<u16>())
            .prop_map(|(key, size, pin, dt, hint)| Op::Put { key, size, pin, dt, hint }),
        1 => (0u8..24, 1u8..48).prop_map(|(key, size)| Op::PutStart { key, size }),
        1 => (0u8..24).prop_map(|key| Op::PutEnd { key }),
        1 => (0u8..24).prop_map(|key| Op::Revoke { key }),
        5 => (0u8..24, any::<u16>()).prop_map(|(key, hint)| Op::Get { key, hint }),
        1 => (0u8..24).prop_map(|key| Op::Exists { key }),
        1 => (0u8..24, any::<bool>()).prop_map(|(key, force)| Op::Remove { key, force }),
        2 => (0u16..3000).prop_map(|ms| Op::Wait { ms }),
    ]
}

/// Driver hints from 16 random bits: tenant, priority, penalty, next access.
fn hints(h: u16, pos: u64) -> AccessHints {
    AccessHints {
        miss_penalty_ns: u64::from(h & 0xf) * 1000,
        next_access: if h & 0x30 == 0 {
            u64::MAX
        } else {
            pos + u64::from(h >> 8)
        },
        tenant: u32::from((h >> 6) & 3),
        priority: ((h >> 4) & 1) as u8 + ((h >> 8) & 1) as u8,
    }
}

fn store_cfg(interval: u64) -> MemStoreConfig {
    MemStoreConfig {
        capacity_bytes: 256,
        kv_lease_ttl_ns: 1000 * MS,
        soft_pin_ttl_ns: 5000 * MS,
        put_start_discard_timeout_ns: 2000 * MS,
        eviction_interval_ns: interval,
        ..MemStoreConfig::default()
    }
}

/// Apply one operation at `now` (results are not checked here: `store_model.rs` does).
fn apply(s: &mut MemStore<String>, op: &Op, now: u64, pos: u64) {
    match *op {
        Op::Put {
            key,
            size,
            pin,
            dt,
            hint,
        } => {
            let rc = ReplicateConfig {
                data_type: DataType::ALL[dt as usize],
                hard_pin: pin == 0,
                soft_pin: pin == 1 || pin == 2,
                // 3 of 8 puts pinned
            };
            let _ = s.put_with(
                now,
                format!("k{key}"),
                Payload::SizeOnly(u64::from(size)),
                &rc,
                hints(hint, pos),
            );
        }
        Op::PutStart { key, size } => {
            let _ = s.put_start_with(
                now,
                format!("k{key}"),
                u64::from(size),
                &ReplicateConfig::of(DataType::EncoderOutput),
                AccessHints::default(),
            );
        }
        Op::PutEnd { key } => {
            let k = format!("k{key}");
            if let Some(size) = s.peek(k.as_str()).map(|m| m.size) {
                let _ = s.put_end_with(now, k.as_str(), Payload::SizeOnly(size));
            }
        }
        Op::Revoke { key } => {
            let _ = s.put_revoke_with(now, format!("k{key}").as_str());
        }
        Op::Get { key, hint } => {
            let _ = s.get_size_with(now, format!("k{key}").as_str(), Some(hints(hint, pos)));
        }
        Op::Exists { key } => {
            let _ = s.exists_with(now, format!("k{key}").as_str());
        }
        Op::Remove { key, force } => {
            let _ = s.remove_with(now, format!("k{key}").as_str(), force);
        }
        Op::Wait { .. } => s.advance(now),
    }
}

fn time_step(op: &Op) -> u64 {
    match *op {
        Op::Wait { ms } => u64::from(ms) * MS,
        Op::Put { dt, .. } => u64::from(dt) * 7 * MS,
        _ => MS,
    }
}

fn run_all(ops: &[Op], interval: u64) {
    for p in all_policies() {
        let name = p.name().to_string();
        let mut s: MemStore<String> = MemStore::with_policy_box(store_cfg(interval), p).unwrap();
        let mut now = 1000 * MS;
        for (pos, op) in ops.iter().enumerate() {
            now += time_step(op);
            apply(&mut s, op, now, pos as u64);
            assert!(
                s.used_bytes() <= s.config().capacity_bytes,
                "{name}: capacity exceeded"
            );
            assert_eq!(
                s.stats().policy_refused,
                0,
                "{name}: store refused a victim"
            );
        }
    }
}

// ---------------------------------------------------------------- references

/// A full-scan reference: rank candidates by `key`, then Mooncake's two passes.
#[derive(Debug)]
struct ScanRef {
    key: fn(&ObjectMeta) -> (u64, u64),
}

impl EvictionPolicy for ScanRef {
    fn name(&self) -> &str {
        "scan-reference"
    }
    fn select_victims(&mut self, req: &EvictRequest, objects: &[ObjectMeta], out: &mut Vec<ObjId>) {
        let mut u: Vec<((u64, u64), u32)> = Vec::new();
        let mut sp: Vec<((u64, u64), u32)> = Vec::new();
        for (i, m) in objects.iter().enumerate() {
            match m.candidate(req.now) {
                Candidate::Unpinned => u.push(((self.key)(m), i as u32)),
                Candidate::SoftPinned if req.allow_soft_pinned => {
                    sp.push(((self.key)(m), i as u32))
                }
                _ => {}
            }
        }
        u.sort();
        sp.sort();
        let q = req.target.max(req.lower_bound) as usize;
        let nu = u.len().min(q);
        out.extend(u[..nu].iter().map(|e| ObjId(e.1)));
        let ns = sp.len().min((req.lower_bound as usize).saturating_sub(nu));
        out.extend(sp[..ns].iter().map(|e| ObjId(e.1)));
    }
}

/// Run `ops` on two stores and require the same keys and counters after every operation.
fn same_choices(ops: &[Op], interval: u64, a: Box<dyn EvictionPolicy>, b: Box<dyn EvictionPolicy>) {
    let (na, nb) = (a.name().to_string(), b.name().to_string());
    let mut sa: MemStore<String> = MemStore::with_policy_box(store_cfg(interval), a).unwrap();
    let mut sb: MemStore<String> = MemStore::with_policy_box(store_cfg(interval), b).unwrap();
    let mut now = 1000 * MS;
    for (pos, op) in ops.iter().enumerate() {
        now += time_step(op);
        apply(&mut sa, op, now, pos as u64);
        apply(&mut sb, op, now, pos as u64);
        let ka: BTreeSet<&String> = sa.keys().collect();
        let kb: BTreeSet<&String> = sb.keys().collect();
        assert_eq!(ka, kb, "{na} vs {nb}: resident keys differ after {op:?}");
        assert_eq!(sa.stats(), sb.stats(), "{na} vs {nb}: counters differ");
    }
}

fn hier_single_leaf() -> Box<dyn EvictionPolicy> {
    PolicyConfig::from_json_str(r#"{"policy":"hierarchical","tree":{}}"#)
        .unwrap()
        .build()
        .unwrap()
}

fn hier_catch_all_child() -> Box<dyn EvictionPolicy> {
    PolicyConfig::from_json_str(
        r#"{"policy":"hierarchical","tree":{"assign":"weights","children":[{"select":"any","evict":{"rule":"type-aware"}}]}}"#,
    )
    .unwrap()
    .build()
    .unwrap()
}

// ---------------------------------------------------------------- random tables

fn meta_strategy() -> impl Strategy<Value = ObjectMeta> {
    (
        (any::<bool>(), 1u64..100, 0u8..3, 0u8..10, 0u64..50, 0u8..8),
        (0u64..6, 0u64..40),
    )
        .prop_map(
            |((live, size, dt, flags, lease, soft), (readers, seq))| ObjectMeta {
                live: live || flags > 1,
                size,
                data_type: DataType::ALL[dt as usize],
                hard_pinned: flags == 0,
                soft_pin_until: (soft < 3).then_some(u64::from(soft) * 20 * MS),
                lease_timeout: lease * MS,
                complete: flags != 1,
                readers: u32::from(readers == 0),
                put_time: 0,
                insert_seq: seq,
                last_access: 0,
                last_access_seq: seq,
                access_count: 0,
                hints: AccessHints::default(),
                key_hash: seq,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Capacity, protection and pass structure, every policy, synchronous eviction.
    #[test]
    fn every_policy_keeps_capacity_protection_and_passes_sync(
        ops in proptest::collection::vec(op(), 1..200)
    ) {
        run_all(&ops, 0);
    }

    /// The same with the master's 10 ms eviction tick.
    #[test]
    fn every_policy_keeps_capacity_protection_and_passes_tick(
        ops in proptest::collection::vec(op(), 1..200)
    ) {
        run_all(&ops, 10 * MS);
    }

    /// LRU's and FIFO's O(1) queues evict exactly what a full scan would.
    #[test]
    fn lru_and_fifo_queues_match_a_full_scan(ops in proptest::collection::vec(op(), 1..200)) {
        same_choices(&ops, 0, Box::new(Lru::new()), Box::new(ScanRef { key: |m| (m.last_access_seq, 0) }));
        same_choices(&ops, 10 * MS, Box::new(Fifo::new()), Box::new(ScanRef { key: |m| (m.insert_seq, 0) }));
    }

    /// Belady's ordered index evicts exactly what a full scan by (furthest next access,
    /// oldest insertion) would.
    #[test]
    fn belady_index_matches_a_full_scan(ops in proptest::collection::vec(op(), 1..200)) {
        let key: fn(&ObjectMeta) -> (u64, u64) = |m| (u64::MAX - m.hints.next_access, m.insert_seq);
        same_choices(&ops, 0, Box::new(Belady::new()), Box::new(ScanRef { key }));
        same_choices(&ops, 10 * MS, Box::new(Belady::new()), Box::new(ScanRef { key }));
    }

    /// `type-aware` at default knobs and trivial `hierarchical` trees are `mooncake-default`.
    #[test]
    fn defaults_equal_mooncake_default_on_the_store(ops in proptest::collection::vec(op(), 1..200)) {
        let ta = || PolicyConfig::from_json_str(r#"{"policy":"type-aware"}"#).unwrap().build().unwrap();
        same_choices(&ops, 0, Box::new(MooncakeDefault::new()), ta());
        same_choices(&ops, 10 * MS, Box::new(MooncakeDefault::new()), ta());
        same_choices(&ops, 0, Box::new(MooncakeDefault::new()), hier_single_leaf());
        same_choices(&ops, 10 * MS, Box::new(MooncakeDefault::new()), hier_catch_all_child());
    }

    /// The same equivalence plan by plan, exact order included, on random object tables.
    #[test]
    fn type_aware_defaults_plan_exactly_like_mooncake_default(
        metas in proptest::collection::vec(meta_strategy(), 0..40),
        now in 0u64..60,
        target in 0u64..12,
        lower in 0u64..12,
        allow in any::<bool>(),
    ) {
        // The store's insertion sequence is unique; keep it so (random order).
        let mut metas = metas;
        for (i, m) in metas.iter_mut().enumerate() {
            m.insert_seq = m.insert_seq * 64 + i as u64;
        }
        let req = EvictRequest {
            now: now * MS,
            target: target.max(lower),
            lower_bound: lower,
            object_count: metas.len() as u64,
            used_bytes: 0,
            capacity_bytes: 1 << 20,
            allow_soft_pinned: allow,
        };
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        MooncakeDefault::new().select_victims(&req, &metas, &mut a);
        let mut ta = PolicyConfig::from_json_str(r#"{"policy":"type-aware"}"#).unwrap().build().unwrap();
        ta.select_victims(&req, &metas, &mut b);
        hier_single_leaf().select_victims(&req, &metas, &mut c);
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(&a, &c);
    }
}

//! The `Store` trait's provided methods and the small value types beside it, through
//! `MemStore` (which overrides none of the batch calls): each batch call answers one
//! result per item, in order, equal to the single call's; names and configs are what the
//! reports and configs spell. Written for survivors of `scripts/mutants.sh run store`
//! (issue 14): with these gone, `batch_*` returning `vec![]`, `DataType::name` returning
//! another string, `ReplicateConfig::of` ignoring its type and `Payload::is_empty` answering
//! a constant all passed.

use moonagent_core::store::{
    DataType, MemStore, MemStoreConfig, Payload, ReplicateConfig, Store, StoreError,
};

fn store() -> MemStore<String> {
    MemStore::new(MemStoreConfig::with_capacity(1 << 20)).unwrap()
}

#[test]
fn batch_calls_answer_each_item_in_order_like_the_single_calls() {
    let mut s = store();
    let cfg = ReplicateConfig::of(DataType::KvCache);
    let put = s.batch_put(
        1,
        vec![
            ("a".into(), Payload::Bytes(vec![1, 2, 3])),
            ("b".into(), Payload::Bytes(vec![4; 5])),
            ("a".into(), Payload::Bytes(vec![9])),
        ],
        &cfg,
    );
    assert_eq!(put, vec![Ok(()), Ok(()), Err(StoreError::AlreadyExists)]);
    assert_eq!(
        s.batch_exists(2, &["b", "zz", "a"]),
        vec![Ok(true), Ok(false), Ok(true)]
    );
    let (mut x, mut y, mut z) = ([0u8; 3], [0u8; 5], [0u8; 1]);
    let got = s.batch_get_into(3, &["a", "b", "zz"], &mut [&mut x, &mut y, &mut z]);
    assert_eq!(got, vec![Ok(3), Ok(5), Err(StoreError::NotFound)]);
    assert_eq!((x, y), ([1, 2, 3], [4; 5]));
    // Leased by the reads above: a remove without force keeps them.
    assert_eq!(
        s.batch_remove(4, &["a", "zz"], false),
        vec![Err(StoreError::HasLease), Err(StoreError::NotFound)]
    );
    assert_eq!(s.batch_remove(4, &["a", "b"], true), vec![Ok(()), Ok(())]);
    assert_eq!(s.batch_exists(5, &["a", "b"]), vec![Ok(false), Ok(false)]);
}

#[test]
fn a_payload_is_empty_exactly_when_it_has_no_bytes() {
    assert!(Payload::Bytes(Vec::new()).is_empty());
    assert!(Payload::SizeOnly(0).is_empty());
    assert!(!Payload::Bytes(vec![0]).is_empty());
    assert!(!Payload::SizeOnly(1).is_empty());
}

#[test]
fn data_types_are_named_as_configs_spell_them_and_configs_carry_their_type() {
    let names: Vec<&str> = DataType::ALL.iter().map(|t| t.name()).collect();
    assert_eq!(names, ["general", "kv_cache", "encoder_output"]);
    for t in DataType::ALL {
        let c = ReplicateConfig::of(t);
        assert_eq!(c.data_type, t);
        assert!(!c.hard_pin && !c.soft_pin);
        assert_eq!(
            serde_json::to_value(t).unwrap(),
            serde_json::Value::String(t.name().into())
        );
    }
}

#[test]
fn a_colon_is_no_digit_in_compact_keys() {
    use moonagent_core::store::StoreKey;
    // ':' is the byte after '9': an off-by-one in the digit tables would read it as 10.
    assert!(matches!(StoreKey::parse("kv:1:"), StoreKey::Other(_)));
    assert!(matches!(StoreKey::parse("kv::"), StoreKey::Other(_)));
    let hex = format!("mc:mmblob:{}:", "a".repeat(63));
    assert!(matches!(StoreKey::parse(&hex), StoreKey::Other(_)));
    assert_eq!(StoreKey::parse("kv:1:").to_string(), "kv:1:");
}

#[test]
fn store_configs_are_validated_field_by_field() {
    let ok = MemStoreConfig::with_capacity(1 << 20);
    assert!(ok.validate().is_ok());
    let zero = MemStoreConfig {
        capacity_bytes: 0,
        ..ok.clone()
    };
    assert!(zero.validate().is_err());
    for hw in [0.0, -0.5, 1.5, f64::NAN] {
        let bad = MemStoreConfig {
            high_watermark: hw,
            ..ok.clone()
        };
        assert!(bad.validate().is_err(), "high_watermark {hw} accepted");
    }
    assert!(MemStore::<String>::new(zero).is_err());
}

/// `MemStore`'s admin views report what it holds: the configuration it was built with, its
/// policy's name, emptiness, the key of a slot, every live key, and a debug line naming
/// both. Written for survivors of `scripts/mutants.sh run store` shard 2 of 4 (each
/// accessor replaced by a constant passed every other test).
#[test]
fn the_stores_admin_views_report_what_it_holds() {
    use moonagent_core::store::{ObjId, PolicyConfig};
    let cfg = MemStoreConfig {
        capacity_bytes: 12_345,
        ..MemStoreConfig::with_capacity(1 << 20)
    };
    let mut s: MemStore<String> =
        MemStore::with_policy(cfg.clone(), &PolicyConfig::Lru {}).unwrap();
    assert_eq!(s.config(), &cfg);
    assert_eq!(s.policy_name(), "lru");
    assert_eq!(store().policy_name(), "mooncake-default");
    assert!(s.is_empty());
    assert_eq!(s.keys().count(), 0);
    let rc = ReplicateConfig::of(DataType::KvCache);
    s.put(1, "a", Payload::Bytes(vec![1; 10]), &rc).unwrap();
    s.put(2, "b", Payload::Bytes(vec![2; 10]), &rc).unwrap();
    assert!(!s.is_empty());
    let mut keys: Vec<&String> = s.keys().collect();
    keys.sort();
    assert_eq!(keys, [&"a".to_string(), &"b".to_string()]);
    let live: Vec<&String> = (0..s.metas().len() as u32)
        .filter_map(|i| s.key_of(ObjId(i)))
        .collect();
    assert_eq!(live.len(), 2, "key_of names every live slot");
    let dbg = format!("{s:?}");
    assert!(dbg.contains("lru") && dbg.contains("12345"), "{dbg}");
}

/// Eviction ticks are aligned to multiples of the interval: a store first called at 250
/// with a 100 ns interval evicts at its tick of 300, not before. (It does not kill the
/// survivors of store shard 2 of 4 that mutate the first call's alignment, `(now / iv) *
/// iv`: they are equivalent, since before a store's second call it holds only puts in
/// progress, which no tick evicts, and a tick that finds nothing to evict realigns.)
#[test]
fn eviction_ticks_align_to_the_interval_from_the_first_call() {
    let cfg = MemStoreConfig {
        capacity_bytes: 1000,
        eviction_interval_ns: 100,
        ..MemStoreConfig::with_capacity(1000)
    };
    let mut s: MemStore<String> = MemStore::new(cfg).unwrap();
    let rc = ReplicateConfig::of(DataType::KvCache);
    // The first call fills the store above its high watermark at once.
    s.put(250, "big", Payload::Bytes(vec![0; 990]), &rc)
        .unwrap();
    s.advance(299);
    assert_eq!(s.len(), 1, "a tick ran before 300");
    s.advance(300);
    assert_eq!(
        s.len(),
        0,
        "no eviction at the tick of 300 above the high watermark"
    );
}

/// Every counter of `StoreStats` counts its events, checked exactly on a short scripted
/// run whose expected values are worked out by hand below (synchronous eviction: the
/// store evicts at the end of each call while it is above its high watermark or was
/// refused space). Written for the survivors of store shard 3 of 4 (`+=` mutated to `*=`
/// leaves a zero counter at zero) and of the counters in shard 3.
#[test]
fn every_store_counter_counts_its_events() {
    use moonagent_core::store::AccessHints;
    let cfg = MemStoreConfig {
        capacity_bytes: 1000,
        eviction_interval_ns: 0,
        kv_lease_ttl_ns: 1_000_000,
        ..MemStoreConfig::with_capacity(1000)
    };
    let mut s: MemStore<String> = MemStore::new(cfg).unwrap();
    let kv = ReplicateConfig::of(DataType::KvCache);
    let gen = ReplicateConfig::of(DataType::General);
    // a: 100 B of KV, put at 1; again at 2 (exists); read at 3 (a hit, leased to 1_000_003).
    s.put(1, "a", Payload::Bytes(vec![1; 100]), &kv).unwrap();
    assert_eq!(
        s.put(2, "a", Payload::Bytes(vec![1; 100]), &kv),
        Err(StoreError::AlreadyExists)
    );
    assert_eq!(s.exists(3, "a"), Ok(true));
    // Two misses: an unknown key, and a put still in progress.
    assert!(s.get_size(4, "zz").is_err());
    s.put_start(5, "p", 50, &kv).unwrap();
    assert!(s.get_size(6, "p").is_err());
    s.put_end(7, "p", Payload::Bytes(vec![2; 50])).unwrap();
    s.remove(8, "p", false).unwrap();
    // c: 850 B of General through put_with: 950 B in use, above the 900 B watermark, so
    // the end of the call evicts ceil(5% of 2 objects) = 1: the only candidate, c (a is
    // leased).
    s.put_with(
        9,
        "c".into(),
        Payload::Bytes(vec![3; 850]),
        &gen,
        AccessHints::default(),
    )
    .unwrap();
    assert!(s.peek("c").is_none(), "c evicted");
    // No room for 2000 B: refused, and the run it asks for finds nothing to evict.
    assert_eq!(
        s.put(10, "big", Payload::Bytes(vec![0; 2000]), &kv),
        Err(StoreError::NoAvailableHandle)
    );
    let st = s.stats();
    let (k, g) = (
        &st.by_type[DataType::KvCache.index()],
        &st.by_type[DataType::General.index()],
    );
    assert_eq!((k.puts, k.put_bytes, k.put_no_space), (2, 150, 1));
    assert_eq!(
        (k.evicted, k.evicted_bytes, k.resident, k.resident_bytes),
        (0, 0, 1, 100)
    );
    assert_eq!((g.puts, g.put_bytes, g.put_no_space), (1, 850, 0));
    assert_eq!(
        (g.evicted, g.evicted_bytes, g.resident, g.resident_bytes),
        (1, 850, 0, 0)
    );
    assert_eq!((st.put_exists, st.read_hits, st.read_misses), (1, 1, 2));
    assert_eq!(
        (st.eviction_runs, st.eviction_runs_empty, st.policy_refused),
        (2, 1, 0)
    );
    assert_eq!(st.removed, 1);
    assert_eq!(s.peek("a").map(|m| m.access_count), Some(1));
    assert_eq!(s.used_bytes(), 100);
    // The refused put still wants room: once a's lease has expired, the next call's run
    // evicts it (an empty run leaves the want standing while objects remain).
    assert!(s.get_size(1_000_010, "zz").is_err());
    assert!(s.peek("a").is_none(), "a kept after its lease expired");
}

/// The high watermark is a strict bound, and a store with eviction ratio 0 never runs an
/// eviction for a refused put. Written for survivors of store shard 3 of 4 in `trigger`
/// (`>` to `>=`, `eviction_ratio > 0.0` to `>=`).
#[test]
fn eviction_triggers_above_the_watermark_only_and_never_at_ratio_zero() {
    let kv = ReplicateConfig::of(DataType::KvCache);
    let cfg = MemStoreConfig {
        capacity_bytes: 1000,
        eviction_interval_ns: 0,
        ..MemStoreConfig::with_capacity(1000)
    };
    let mut s: MemStore<String> = MemStore::new(cfg.clone()).unwrap();
    // Exactly 900 B of 1000: at the watermark, not above it.
    s.put(1, "a", Payload::Bytes(vec![0; 900]), &kv).unwrap();
    s.advance(10);
    assert_eq!((s.len(), s.stats().eviction_runs), (1, 0));
    let mut z: MemStore<String> = MemStore::new(MemStoreConfig {
        eviction_ratio: 0.0,
        ..cfg
    })
    .unwrap();
    z.put(1, "a", Payload::Bytes(vec![0; 100]), &kv).unwrap();
    assert!(z.put(2, "big", Payload::Bytes(vec![0; 2000]), &kv).is_err());
    z.advance(10);
    assert_eq!(z.stats().eviction_runs, 0, "an eviction run at ratio 0");
}

/// A put left in progress blocks its key for exactly the discard timeout: a new put of the
/// key one nanosecond before is refused, at the timeout it replaces the abandoned one.
/// Written for a survivor of store shard 3 of 4 (`<` to `<=` in `put_start_inner`).
#[test]
fn an_abandoned_put_is_replaced_exactly_at_the_discard_timeout() {
    let kv = ReplicateConfig::of(DataType::KvCache);
    let cfg = MemStoreConfig {
        put_start_discard_timeout_ns: 1_000,
        ..MemStoreConfig::with_capacity(1 << 20)
    };
    let mut s: MemStore<String> = MemStore::new(cfg).unwrap();
    s.put_start(100, "q", 10, &kv).unwrap();
    assert_eq!(
        s.put_start(1_099, "q", 10, &kv),
        Err(StoreError::AlreadyExists)
    );
    assert_eq!(s.put_start(1_100, "q", 10, &kv), Ok(()));
    assert_eq!(s.len(), 1);
}

/// One `advance` runs every tick due, in order, each at its own time, and a tick that
/// finds nothing to evict runs once more at the last due tick, and only when that is a
/// later tick. Ten 99 B objects (990 B of 1000, watermark 40%: at least 6 must go), five
/// of them read at 50 (leased to `50 + ttl`); a run evicts what it can down to the
/// watermark. Written for the survivors of store shard 3 of 4 in `advance` (the next tick
/// `t + iv` to `t - iv`, `== 0` to `!= 0`, the catch-up condition `last_due > t &&
/// trigger()` mutated).
#[test]
fn every_due_tick_runs_once_in_order_and_an_empty_one_catches_up_once() {
    let kv = ReplicateConfig::of(DataType::KvCache);
    let store = |ttl: u64| {
        let cfg = MemStoreConfig {
            capacity_bytes: 1000,
            high_watermark: 0.4,
            eviction_interval_ns: 100,
            kv_lease_ttl_ns: ttl,
            ..MemStoreConfig::with_capacity(1000)
        };
        let mut s: MemStore<String> = MemStore::new(cfg).unwrap();
        for i in 0..10u64 {
            s.put(1 + i, &format!("k{i}"), Payload::Bytes(vec![0; 99]), &kv)
                .unwrap();
        }
        for i in 5..10 {
            assert_eq!(s.exists(50, &format!("k{i}")), Ok(true));
        }
        s
    };
    let runs = |s: &MemStore<String>| (s.stats().eviction_runs, s.stats().eviction_runs_empty);
    // Leased to 150: tick 100 evicts the five others, tick 200 one more.
    let mut s = store(100);
    s.advance(550);
    assert_eq!((s.len(), runs(&s)), (4, (2, 0)));
    // Leased to 250: tick 100 evicts five, tick 200 finds nothing, the catch-up at 500 one.
    let mut s = store(200);
    s.advance(550);
    assert_eq!((s.len(), runs(&s)), (4, (3, 1)));
    // Leased to 250, called at 250: tick 100 evicts five, tick 200 is the last due one and
    // finds nothing; no second run.
    let mut s = store(200);
    s.advance(250);
    assert_eq!((s.len(), runs(&s)), (5, (2, 1)));
}

//! `StoreKey` is an exact bijection with strings, and a `MemStore<StoreKey>` behaves exactly
//! as a `MemStore<String>`: the same random operation script on both gives the same results,
//! stats, metas and keys.

use moonagent_core::store::{
    AccessHints, DataType, MemStore, MemStoreConfig, ObjectMeta, Payload, PolicyConfig,
    ReplicateConfig, Store, StoreKey, MS,
};
use proptest::prelude::*;

fn hex(b: &[u8; 32]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Parsing round-trips and is injective (checked on the pair as well as through the
/// round trip, which already implies it).
fn check_bijection(a: &str, b: &str) {
    let (ka, kb) = (StoreKey::parse(a), StoreKey::parse(b));
    assert_eq!(ka.to_string(), a, "{a:?} round trip ({ka:?})");
    assert_eq!(kb.to_string(), b, "{b:?} round trip ({kb:?})");
    assert_eq!(ka == kb, a == b, "{a:?} vs {b:?}");
}

/// Strings near the compact forms: one of the prefixes (or a near-miss of one), then
/// digits, hex of either case, signs, spaces and other characters, of lengths around 64.
fn near_miss() -> impl Strategy<Value = String> {
    let prefix = prop::sample::select(vec![
        "kv:",
        "mc:mmmeta:",
        "mc:mmblob:",
        "KV:",
        "kv",
        "mc:mmmeta",
        "mc:mmblob;",
        "mc:mmmeta:mc:mmblob:",
        "",
    ]);
    let body = prop_oneof![
        "[0-9]{0,22}",
        "0[0-9]{0,21}",
        "[+-][0-9]{1,20}",
        "1844674407370955161[0-9]",
        "[0-9a-f]{62,66}",
        "[0-9a-fA-F]{64}",
        "[0-9a-f]{30}[g-zA-Z: ][0-9a-f]{33}",
        "[0-9a-f]{64}[ \n]",
        ".{0,70}",
    ];
    (prefix, body).prop_map(|(p, b)| format!("{p}{b}"))
}

/// A well-formed compact key's string.
fn well_formed() -> impl Strategy<Value = (String, StoreKey)> {
    prop_oneof![
        any::<u64>().prop_map(|v| (format!("kv:{v}"), StoreKey::Kv(v))),
        (0u64..1000).prop_map(|v| (format!("kv:{v}"), StoreKey::Kv(v))),
        any::<[u8; 32]>().prop_map(|b| (format!("mc:mmmeta:{}", hex(&b)), StoreKey::MmMeta(b))),
        any::<[u8; 32]>().prop_map(|b| (format!("mc:mmblob:{}", hex(&b)), StoreKey::MmBlob(b))),
    ]
}

fn any_key_string() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        near_miss(),
        well_formed().prop_map(|(s, _)| s),
    ]
}

#[test]
fn near_misses_stay_strings() {
    let long = "0123456789abcdef".repeat(4);
    let other = [
        "".to_string(),
        "kv:".into(),
        "kv:01".into(),
        "kv:00".into(),
        "kv:-1".into(),
        "kv:+1".into(),
        "kv: 1".into(),
        "kv:1 ".into(),
        "kv:1.0".into(),
        "KV:1".into(),
        "kv:18446744073709551616".into(),
        "kv:99999999999999999999".into(),
        "kv:018446744073709551615".into(),
        "mc:mmmeta:".into(),
        format!("mc:mmmeta:{}", long.to_uppercase()),
        format!("mc:mmmeta:{}", &long[..63]),
        format!("mc:mmmeta:{long}0"),
        format!("mc:mmblob:{}", &long[..63]),
        format!("mc:mmblob:{long}f"),
        format!("mc:mmblob:{}A", &long[..63]),
        format!("mc:mmmeta:{}g", &long[..63]),
        format!("mc:mmMeta:{long}"),
        format!("mc:mmblob:{long}\n"),
        format!("mc:mmblob:{long}\u{e9}"),
    ];
    for s in &other {
        let k = StoreKey::parse(s);
        assert!(matches!(k, StoreKey::Other(_)), "{s:?} parsed to {k:?}");
        assert_eq!(k.to_string(), *s);
    }
    assert_eq!(StoreKey::parse("kv:0"), StoreKey::Kv(0));
    assert_eq!(
        StoreKey::parse("kv:18446744073709551615"),
        StoreKey::Kv(u64::MAX)
    );
    let b: [u8; 32] = std::array::from_fn(|i| (i * 8) as u8 | 0x0f);
    assert_eq!(
        StoreKey::parse(&format!("mc:mmmeta:{}", hex(&b))),
        StoreKey::MmMeta(b)
    );
    assert_eq!(
        StoreKey::parse(&format!("mc:mmblob:{long}")).to_string(),
        format!("mc:mmblob:{long}")
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn parse_round_trips_and_is_injective(a in any_key_string(), b in any_key_string()) {
        check_bijection(&a, &b);
        // A one-character edit of a string is another key.
        let mut c = a.clone();
        c.push('0');
        check_bijection(&a, &c);
    }

    #[test]
    fn well_formed_keys_are_compact((s, k) in well_formed()) {
        prop_assert_eq!(StoreKey::parse(&s), k.clone());
        prop_assert_eq!(k.to_string(), s);
    }

    #[test]
    fn near_misses_are_other_or_their_exact_form(s in near_miss()) {
        let k = StoreKey::parse(&s);
        prop_assert_eq!(k.to_string(), s.clone());
        let compact = match &k {
            StoreKey::Kv(v) => s == format!("kv:{v}"),
            StoreKey::MmMeta(b) => s == format!("mc:mmmeta:{}", hex(b)),
            StoreKey::MmBlob(b) => s == format!("mc:mmblob:{}", hex(b)),
            StoreKey::Other(o) => o.as_str() == s,
        };
        prop_assert!(compact, "{:?} -> {:?}", s, k);
    }
}

// ---- A `MemStore<StoreKey>` runs exactly as a `MemStore<String>`. ----

#[derive(Debug, Clone)]
enum Op {
    Put { key: u8, size: u8, pin: u8 },
    PutStart { key: u8, size: u8 },
    PutEnd { key: u8, size: u8 },
    Revoke { key: u8 },
    Get { key: u8 },
    Size { key: u8 },
    Exists { key: u8 },
    Remove { key: u8, force: bool },
    Wait { ms: u16 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..32, 1u8..48, 0u8..6).prop_map(|(key, size, pin)| Op::Put { key, size, pin }),
        1 => (0u8..32, 1u8..48).prop_map(|(key, size)| Op::PutStart { key, size }),
        1 => (0u8..32, 1u8..48).prop_map(|(key, size)| Op::PutEnd { key, size }),
        1 => (0u8..32).prop_map(|key| Op::Revoke { key }),
        3 => (0u8..32).prop_map(|key| Op::Get { key }),
        1 => (0u8..32).prop_map(|key| Op::Size { key }),
        2 => (0u8..32).prop_map(|key| Op::Exists { key }),
        1 => (0u8..32, any::<bool>()).prop_map(|(key, force)| Op::Remove { key, force }),
        2 => (0u16..3000).prop_map(|ms| Op::Wait { ms }),
    ]
}

/// Key `i`'s string: compact forms and near misses of them.
fn name(i: u8) -> String {
    let v = u64::from(i / 8);
    match i % 8 {
        0 => format!("kv:{v}"),
        1 => format!("kv:0{v}"),
        2 => format!("mc:mmmeta:{v:064x}"),
        3 => format!("mc:mmblob:{v:064x}"),
        4 => format!("mc:mmblob:{v:064X}"),
        5 => format!("mc:mmmeta:{v:063x}"),
        6 => format!("kv:{}", u64::MAX - v),
        _ => format!("k{v}"),
    }
}

/// Everything observable of one operation (errors as their display, so variants with
/// messages compare too).
fn apply<S: Store>(s: &mut S, op: &Op, now: u64) -> String {
    let rc = |key: u8, pin: u8| ReplicateConfig {
        data_type: DataType::ALL[usize::from(key) % DataType::COUNT],
        hard_pin: pin == 0,
        soft_pin: pin == 1,
    };
    let bytes = |key: u8, size: u8| (0..size).map(|i| i ^ key).collect::<Vec<u8>>();
    match *op {
        Op::Put { key, size, pin } => format!(
            "{:?}",
            s.put(
                now,
                &name(key),
                Payload::Bytes(bytes(key, size)),
                &rc(key, pin)
            )
        ),
        Op::PutStart { key, size } => format!(
            "{:?}",
            s.put_start(now, &name(key), u64::from(size), &rc(key, 9))
        ),
        Op::PutEnd { key, size } => format!(
            "{:?}",
            s.put_end(now, &name(key), Payload::Bytes(bytes(key, size)))
        ),
        Op::Revoke { key } => format!("{:?}", s.put_revoke(now, &name(key))),
        Op::Get { key } => {
            let mut buf = vec![0u8; 64];
            let r = s.get_into(now, &name(key), &mut buf);
            format!("{r:?} {buf:?}")
        }
        Op::Size { key } => format!("{:?}", s.get_size(now, &name(key))),
        Op::Exists { key } => format!("{:?}", s.exists(now, &name(key))),
        Op::Remove { key, force } => format!("{:?}", s.remove(now, &name(key), force)),
        Op::Wait { .. } => String::new(),
    }
}

/// Metas without the key hash (a function of the key type's `Hash`, read by no report).
fn metas<K: std::hash::Hash + Eq + Clone>(s: &MemStore<K>) -> Vec<ObjectMeta> {
    s.metas()
        .iter()
        .map(|m| ObjectMeta { key_hash: 0, ..*m })
        .collect()
}

fn same_runs(ops: &[Op], policy: &PolicyConfig, interval: u64) {
    let cfg = MemStoreConfig {
        capacity_bytes: 300,
        kv_lease_ttl_ns: 1000 * MS,
        soft_pin_ttl_ns: 5000 * MS,
        put_start_discard_timeout_ns: 2000 * MS,
        eviction_interval_ns: interval,
        ..MemStoreConfig::default()
    };
    let mut a: MemStore<String> = MemStore::with_policy(cfg.clone(), policy).unwrap();
    let mut b: MemStore<StoreKey> = MemStore::with_policy(cfg, policy).unwrap();
    let mut now = 1_000 * MS;
    for (i, op) in ops.iter().enumerate() {
        now += match op {
            Op::Wait { ms } => u64::from(*ms) * MS,
            _ => MS,
        };
        if i % 5 == 0 {
            // The simulator's path: the generic methods, with hints, on the compact key.
            let key = (i % 32) as u8;
            let h = AccessHints {
                miss_penalty_ns: i as u64,
                next_access: (i as u64 * 7) % 50,
                ..AccessHints::default()
            };
            let ra = a.exists_hinted(now, name(key).as_str(), Some(h));
            let rb = b.exists_hinted(now, &StoreKey::parse(&name(key)), Some(h));
            assert_eq!(ra, rb, "op {i}: exists_hinted {}", name(key));
        }
        let ra = apply(&mut a, op, now);
        let rb = apply(&mut b, op, now);
        assert_eq!(ra, rb, "op {i}: {op:?}");
        if let Op::Wait { .. } = op {
            a.advance(now);
            b.advance(now);
        }
        assert_eq!(a.stats(), b.stats(), "op {i}: stats");
        assert_eq!(metas(&a), metas(&b), "op {i}: metas");
        let ka: Vec<String> = a.keys().cloned().collect();
        let kb: Vec<String> = b.keys().map(|k| k.to_string()).collect();
        assert_eq!(ka, kb, "op {i}: keys");
        for k in &ka {
            let ma = a.peek(k.as_str()).map(|m| ObjectMeta { key_hash: 0, ..*m });
            let mb = b
                .peek(&StoreKey::parse(k))
                .map(|m| ObjectMeta { key_hash: 0, ..*m });
            assert_eq!(ma, mb, "op {i}: peek {k}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn store_key_memstore_runs_as_string_memstore(
        ops in proptest::collection::vec(op(), 1..300),
        policy in prop::sample::select(vec![
            "policy = \"mooncake-default\"",
            "policy = \"lru\"",
            "policy = \"fifo\"",
            "policy = \"s3-fifo\"",
            "policy = \"gdsf\"",
            "policy = \"type-aware\"",
            "policy = \"belady\"",
        ]),
        sync in any::<bool>(),
    ) {
        let p = PolicyConfig::from_toml_str(policy).unwrap();
        same_runs(&ops, &p, if sync { 0 } else { 10 * MS });
    }
}

//! `MemStore` against a trivially correct model (quick_cache's fuzz style): random
//! operation sequences, every result and every eviction checked.
//!
//! The model knows everything but the policy's choice of victims. After each operation it
//! diffs the store's keys against its own: each object that vanished without a remove was
//! evicted, and that eviction must have been legal (complete, not hard-pinned, lease
//! expired, soft-pinned only when no unpinned candidate was left). Evictions happen before
//! the operation in tick mode (the ticks due by `now`) and after it in synchronous mode,
//! so the model applies them on the matching side before predicting the result.
//!
//! Every sequence runs on `MemStore<String>` and on `MemStore<StoreKey>`, with keys in the
//! compact forms (`kv:<n>`, `mc:mmmeta:<hex>`, `mc:mmblob:<hex>`) and plain strings.

use std::collections::BTreeMap;

use moonagent_core::store::{
    Candidate, DataType, MemStore, MemStoreConfig, Payload, ReplicateConfig, Store, StoreError,
    StoreKey, StrKey, MS,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: u8,
        size: u8,
        pin: u8,
        dt: u8,
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
    /// A read that spans time opens (`Store::begin_read`) ...
    BeginRead {
        key: u8,
    },
    /// ... and closes (`Store::end_read`); objects read in between are never evicted.
    EndRead {
        key: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..24, 1u8..48, 0u8..6, 0u8..4).prop_map(|(key, size, pin, dt)| Op::Put { key, size, pin, dt }),
        1 => (0u8..24, 1u8..48).prop_map(|(key, size)| Op::PutStart { key, size }),
        1 => (0u8..24).prop_map(|key| Op::PutEnd { key }),
        1 => (0u8..24).prop_map(|key| Op::Revoke { key }),
        4 => (0u8..24).prop_map(|key| Op::Get { key }),
        1 => (0u8..24).prop_map(|key| Op::Exists { key }),
        1 => (0u8..24, any::<bool>()).prop_map(|(key, force)| Op::Remove { key, force }),
        2 => (0u16..3000).prop_map(|ms| Op::Wait { ms }),
        1 => (0u8..24).prop_map(|key| Op::BeginRead { key }),
        1 => (0u8..24).prop_map(|key| Op::EndRead { key }),
    ]
}

#[derive(Debug, Clone)]
struct M {
    bytes: Vec<u8>,
    complete: bool,
    hard: bool,
    soft_until: Option<u64>,
    lease: u64,
    put_time: u64,
    /// Reads open on it (`begin_read` without its `end_read` yet).
    readers: u32,
}

struct Model {
    objs: BTreeMap<String, M>,
    cfg: MemStoreConfig,
    version: u64,
}

impl Model {
    fn used(&self) -> u64 {
        self.objs.values().map(|m| m.bytes.len() as u64).sum()
    }
    fn candidate(&self, m: &M, now: u64) -> Candidate {
        if !m.complete || m.hard || m.readers > 0 || now < m.lease {
            Candidate::No
        } else if m.soft_until.is_some_and(|t| now < t) {
            Candidate::SoftPinned
        } else {
            Candidate::Unpinned
        }
    }
    /// Drop what the store evicted, asserting each eviction was legal at `now`.
    fn sync_evictions<K: StrKey>(&mut self, s: &MemStore<K>, now: u64, strict_soft: bool) {
        let gone: Vec<String> = self
            .objs
            .keys()
            .filter(|k| K::with_lookup(k, |q| s.peek(q).is_none()))
            .cloned()
            .collect();
        let mut soft_evicted = false;
        for k in &gone {
            let m = &self.objs[k];
            let c = self.candidate(m, now);
            assert_ne!(c, Candidate::No, "illegal eviction of {k}: {m:?} at {now}");
            if c == Candidate::SoftPinned {
                assert!(
                    self.cfg.allow_evict_soft_pinned,
                    "soft-pinned {k} evicted though disallowed"
                );
                soft_evicted = true;
            }
        }
        for k in &gone {
            self.objs.remove(k);
        }
        if soft_evicted && strict_soft {
            let left = self
                .objs
                .values()
                .filter(|m| self.candidate(m, now) == Candidate::Unpinned)
                .count();
            assert_eq!(
                left, 0,
                "a soft-pinned object went while {left} unpinned candidates stayed"
            );
        }
    }
    fn payload(&mut self, key: u8, size: u8) -> Vec<u8> {
        self.version += 1;
        (0..size).map(|i| key ^ i ^ self.version as u8).collect()
    }
}

/// Key `key`'s string: the simulator's compact forms (`StoreKey::Kv`, `MmMeta`, `MmBlob`)
/// and plain strings, so both key types meet every form.
fn name(key: u8) -> String {
    let v = u64::from(key / 4);
    match key % 4 {
        0 => format!("kv:{v}"),
        1 => format!("mc:mmmeta:{v:064x}"),
        2 => format!("mc:mmblob:{v:064x}"),
        _ => format!("k{key}"),
    }
}

fn run<K: StrKey>(ops: Vec<Op>, interval: u64) {
    let cfg = MemStoreConfig {
        capacity_bytes: 256,
        kv_lease_ttl_ns: 1000 * MS,
        soft_pin_ttl_ns: 5000 * MS,
        put_start_discard_timeout_ns: 2000 * MS,
        eviction_interval_ns: interval,
        ..MemStoreConfig::default()
    };
    let mut s: MemStore<K> = MemStore::new(cfg.clone()).unwrap();
    let mut m = Model {
        objs: BTreeMap::new(),
        cfg: cfg.clone(),
        version: 0,
    };
    let sync = interval == 0;
    let mut now = 1_000 * MS;
    for op in ops {
        let dt = match op {
            Op::Wait { ms } => u64::from(ms) * MS,
            Op::Put { dt, .. } => u64::from(dt) * 7 * MS,
            _ => MS,
        };
        now += dt;
        if !sync {
            s.advance(now);
            m.sync_evictions(&s, now, false);
        }
        match op {
            Op::Put { key, size, pin, .. } => {
                let k = name(key);
                let bytes = m.payload(key, size);
                let rc = ReplicateConfig {
                    data_type: if key % 2 == 0 {
                        DataType::KvCache
                    } else {
                        DataType::EncoderOutput
                    },
                    hard_pin: pin == 0,
                    soft_pin: pin == 1,
                };
                let r = s.put(now, &k, Payload::Bytes(bytes.clone()), &rc);
                let expect = match m.objs.get(&k) {
                    Some(o)
                        if o.complete || now < o.put_time + cfg.put_start_discard_timeout_ns =>
                    {
                        Err(StoreError::AlreadyExists)
                    }
                    _ => {
                        let stale = m.objs.get(&k).map_or(0, |o| o.bytes.len() as u64);
                        if m.used() - stale + u64::from(size) > cfg.capacity_bytes {
                            Err(StoreError::NoAvailableHandle)
                        } else {
                            Ok(())
                        }
                    }
                };
                assert_eq!(r, expect, "put {k}");
                if r.is_ok() {
                    m.objs.insert(
                        k,
                        M {
                            bytes,
                            complete: true,
                            hard: rc.hard_pin,
                            soft_until: rc.soft_pin.then_some(now + cfg.soft_pin_ttl_ns),
                            lease: now,
                            put_time: now,
                            readers: 0,
                        },
                    );
                } else if let Some(o) = m.objs.get(&k) {
                    if !o.complete && now >= o.put_time + cfg.put_start_discard_timeout_ns {
                        m.objs.remove(&k); // the abandoned put was discarded
                    }
                }
            }
            Op::PutStart { key, size } => {
                let k = name(key);
                let r = s.put_start(now, &k, u64::from(size), &ReplicateConfig::default());
                match m.objs.get(&k) {
                    Some(o)
                        if o.complete || now < o.put_time + cfg.put_start_discard_timeout_ns =>
                    {
                        assert_eq!(r, Err(StoreError::AlreadyExists))
                    }
                    _ => {
                        m.objs.remove(&k);
                        if m.used() + u64::from(size) > cfg.capacity_bytes {
                            assert_eq!(r, Err(StoreError::NoAvailableHandle));
                        } else {
                            assert_eq!(r, Ok(()));
                            let bytes = m.payload(key, size);
                            m.objs.insert(
                                k,
                                M {
                                    bytes,
                                    complete: false,
                                    hard: false,
                                    soft_until: None,
                                    lease: now,
                                    put_time: now,
                                    readers: 0,
                                },
                            );
                        }
                    }
                }
            }
            Op::PutEnd { key } => {
                let k = name(key);
                match m.objs.get_mut(&k) {
                    None => assert_eq!(
                        s.put_end(now, &k, Payload::Bytes(vec![])),
                        Err(StoreError::NotFound)
                    ),
                    Some(o) if o.complete => assert_eq!(
                        s.put_end(now, &k, Payload::Bytes(o.bytes.clone())),
                        Err(StoreError::AlreadyExists)
                    ),
                    Some(o) => {
                        assert_eq!(s.put_end(now, &k, Payload::Bytes(o.bytes.clone())), Ok(()));
                        o.complete = true;
                        o.lease = now;
                    }
                }
            }
            Op::Revoke { key } => {
                let k = name(key);
                let r = s.put_revoke(now, &k);
                match m.objs.get(&k) {
                    None => assert_eq!(r, Err(StoreError::NotFound)),
                    Some(o) if o.complete => assert_eq!(r, Err(StoreError::AlreadyExists)),
                    Some(_) => {
                        assert_eq!(r, Ok(()));
                        m.objs.remove(&k);
                    }
                }
            }
            Op::Get { key } => {
                let k = name(key);
                let mut buf = vec![0u8; 64];
                let r = s.get_into(now, &k, &mut buf);
                match m.objs.get_mut(&k) {
                    None => assert_eq!(r, Err(StoreError::NotFound)),
                    Some(o) if !o.complete => assert_eq!(r, Err(StoreError::NotReady)),
                    Some(o) => {
                        assert_eq!(r, Ok(o.bytes.len() as u64));
                        assert_eq!(&buf[..o.bytes.len()], &o.bytes[..], "bytes of {k}");
                        o.lease = o.lease.max(now + cfg.kv_lease_ttl_ns);
                    }
                }
            }
            Op::Exists { key } => {
                let k = name(key);
                let r = s.exists(now, &k);
                match m.objs.get_mut(&k) {
                    Some(o) if o.complete => {
                        assert_eq!(r, Ok(true));
                        o.lease = o.lease.max(now + cfg.kv_lease_ttl_ns);
                    }
                    _ => assert_eq!(r, Ok(false)),
                }
            }
            Op::Remove { key, force } => {
                let k = name(key);
                let r = s.remove(now, &k, force);
                match m.objs.get(&k) {
                    None => assert_eq!(r, Err(StoreError::NotFound)),
                    Some(o) if !o.complete => assert_eq!(r, Err(StoreError::NotReady)),
                    Some(o) if !force && (now < o.lease || o.readers > 0) => {
                        assert_eq!(r, Err(StoreError::HasLease))
                    }
                    Some(_) => {
                        assert_eq!(r, Ok(()));
                        m.objs.remove(&k);
                    }
                }
            }
            Op::Wait { .. } => s.advance(now),
            Op::BeginRead { key } => {
                let k = name(key);
                let r = s.begin_read(now, &k);
                match m.objs.get_mut(&k) {
                    None => assert_eq!(r, Err(StoreError::NotFound)),
                    Some(o) if !o.complete => assert_eq!(r, Err(StoreError::NotReady)),
                    Some(o) => {
                        assert_eq!(r, Ok(o.bytes.len() as u64));
                        o.lease = o.lease.max(now + cfg.kv_lease_ttl_ns);
                        o.readers += 1;
                    }
                }
            }
            Op::EndRead { key } => {
                let k = name(key);
                let r = s.end_read(now, &k);
                match m.objs.get_mut(&k) {
                    None => assert_eq!(r, Err(StoreError::NotFound)),
                    Some(o) if o.readers == 0 => {
                        assert!(matches!(r, Err(StoreError::InvalidParams(_))), "{r:?}")
                    }
                    Some(o) => {
                        assert_eq!(r, Ok(()));
                        o.readers -= 1;
                    }
                }
            }
        }
        if sync {
            m.sync_evictions(&s, now, true);
        } else {
            m.sync_evictions(&s, now, false);
        }
        // Invariants after every operation.
        assert!(s.used_bytes() <= cfg.capacity_bytes, "capacity exceeded");
        assert_eq!(s.used_bytes(), m.used(), "used bytes = sum of live sizes");
        assert_eq!(s.len(), m.objs.len() as u64, "same objects");
        assert_eq!(
            s.stats().policy_refused,
            0,
            "policy proposed an illegal victim"
        );
        if let Err(e) = s.check_index() {
            panic!("{e}");
        }
        for (k, o) in &m.objs {
            let meta = K::with_lookup(k, |q| s.peek(q)).expect("model object present in store");
            assert_eq!(meta.complete, o.complete);
            assert_eq!(meta.lease_timeout, o.lease, "lease of {k}");
            assert_eq!(meta.readers, o.readers, "readers of {k}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Capacity never exceeded; leased, hard-pinned and in-progress never evicted; soft-pinned
    /// only after every evictable unpinned object (synchronous eviction, checked exactly).
    #[test]
    fn memstore_matches_model_sync_eviction(ops in proptest::collection::vec(op(), 1..300)) {
        run::<String>(ops.clone(), 0);
        run::<StoreKey>(ops, 0);
    }

    /// The same with the master's 10 ms eviction tick (evictions checked for legality).
    #[test]
    fn memstore_matches_model_tick_eviction(ops in proptest::collection::vec(op(), 1..300)) {
        run::<String>(ops.clone(), 10 * MS);
        run::<StoreKey>(ops, 10 * MS);
    }
}

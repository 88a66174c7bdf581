//! Typed keys are the string keys: `exists_key` / `put_key` of `StoreKey::Kv(b)` (the
//! engine's prefix-KV path) give the same results, stats and keys as `exists("kv:<b>")` /
//! `put("kv:<b>")`, for both key types, and so do the other typed-key operations the
//! embedding cache uses (INVARIANTS S10).

use moonagent_core::store::{
    DataType, MemStore, MemStoreConfig, Payload, ReplicateConfig, Store, StoreKey, StrKey,
};
use proptest::prelude::*;

fn ops() -> impl Strategy<Value = Vec<(bool, u64, u64)>> {
    prop::collection::vec((any::<bool>(), 0u64..40, 1u64..400), 1..300)
}

fn check<K: StrKey + std::fmt::Debug>(ops: &[(bool, u64, u64)]) -> Result<(), TestCaseError> {
    let cfg = MemStoreConfig::with_capacity(4_000);
    let (mut fast, mut slow) = (
        MemStore::<K>::new(cfg.clone()).unwrap(),
        MemStore::<K>::new(cfg).unwrap(),
    );
    let rc = ReplicateConfig::of(DataType::KvCache);
    for (i, &(put, b, size)) in ops.iter().enumerate() {
        let now = i as u64 * 3_000_000;
        let key = format!("kv:{b}");
        if put {
            let a = fast.put_key(now, &StoreKey::Kv(b), Payload::SizeOnly(size), &rc);
            let s = slow.put(now, &key, Payload::SizeOnly(size), &rc);
            prop_assert_eq!(a, s);
        } else {
            prop_assert_eq!(
                fast.exists_key(now, &StoreKey::Kv(b)),
                slow.exists(now, &key)
            );
        }
    }
    prop_assert_eq!(fast.stats(), slow.stats());
    prop_assert_eq!(
        fast.keys().collect::<Vec<_>>(),
        slow.keys().collect::<Vec<_>>()
    );
    Ok(())
}

proptest! {
    #[test]
    fn kv_fast_path_equals_the_string_path(ops in ops()) {
        check::<String>(&ops)?;
        check::<StoreKey>(&ops)?;
    }
}

#[test]
fn kv_key_is_the_parsed_string() {
    for b in [0u64, 7, 10, u64::MAX] {
        let k = StoreKey::Kv(b);
        assert_eq!(
            StoreKey::of_store_key(&k),
            StoreKey::parse(&format!("kv:{b}"))
        );
        assert_eq!(<String as StrKey>::of_store_key(&k), format!("kv:{b}"));
    }
}

/// Typed keys (`get_into_key`, `get_size_key`, `put_key`, `remove_key`) against the string
/// path, on both key types, with meta and blob keys of a few fingerprints and other keys.
fn check_typed<K: StrKey + std::fmt::Debug>(ops: &[(u8, u8, u64)]) -> Result<(), TestCaseError> {
    use moonagent_core::store::StoreKey;
    let cfg = MemStoreConfig::with_capacity(3_000);
    let (mut typed, mut text) = (
        MemStore::<K>::new(cfg.clone()).unwrap(),
        MemStore::<K>::new(cfg).unwrap(),
    );
    let rc = ReplicateConfig::of(DataType::EncoderOutput);
    for (i, &(op, k, size)) in ops.iter().enumerate() {
        let now = i as u64 * 3_000_000;
        let key = match k % 3 {
            0 => StoreKey::MmMeta([k; 32]),
            1 => StoreKey::MmBlob([k; 32]),
            _ => StoreKey::parse(&format!("other:{k}")),
        };
        let s = key.to_string();
        let mut b1 = vec![0u8; 64];
        let mut b2 = vec![0u8; 64];
        match op % 4 {
            0 => prop_assert_eq!(
                typed.put_key(now, &key, Payload::Bytes(vec![k; size as usize % 50]), &rc),
                text.put(now, &s, Payload::Bytes(vec![k; size as usize % 50]), &rc)
            ),
            1 => {
                prop_assert_eq!(typed.get_size_key(now, &key), text.get_size(now, &s));
                prop_assert_eq!(typed.exists_key(now, &key), text.exists(now, &s));
            }
            2 => {
                prop_assert_eq!(
                    typed.get_into_key(now, &key, &mut b1),
                    text.get_into(now, &s, &mut b2)
                );
                prop_assert_eq!(&b1, &b2);
            }
            _ => prop_assert_eq!(
                typed.remove_key(now, &key, size % 2 == 0),
                text.remove(now, &s, size % 2 == 0)
            ),
        }
    }
    prop_assert_eq!(typed.stats(), text.stats());
    prop_assert_eq!(
        typed.keys().collect::<Vec<_>>(),
        text.keys().collect::<Vec<_>>()
    );
    Ok(())
}

proptest! {
    #[test]
    fn typed_keys_equal_the_string_path(
        ops in prop::collection::vec((any::<u8>(), 0u8..9, 1u64..400), 1..300)
    ) {
        check_typed::<String>(&ops)?;
        check_typed::<StoreKey>(&ops)?;
    }
}

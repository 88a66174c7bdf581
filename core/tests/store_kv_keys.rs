//! The prefix-KV fast path is the string path: `exists_kv(b)` / `put_kv(b)` on a store give
//! the same results, stats and keys as `exists("kv:<b>")` / `put("kv:<b>")`, for both key
//! types (INVARIANTS S10).

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
            let a = fast.put_kv(now, b, Payload::SizeOnly(size), &rc);
            let s = slow.put(now, &key, Payload::SizeOnly(size), &rc);
            prop_assert_eq!(a, s);
        } else {
            prop_assert_eq!(fast.exists_kv(now, b), slow.exists(now, &key));
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
        assert_eq!(StoreKey::kv(b), StoreKey::parse(&format!("kv:{b}")));
        assert_eq!(<String as StrKey>::kv(b), format!("kv:{b}"));
    }
}

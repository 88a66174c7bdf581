//! The `Store` trait's provided methods and the small value types beside it, through
//! `MemStore` (which overrides none of the batch calls): each batch call answers one
//! result per item, in order, equal to the single call's; names and configs are what the
//! reports and configs spell. Written for survivors of `scripts/mutants.sh run store`
//! (issue 14): with these gone, `batch_*` returning `vec![]`, `DataType::name` returning
//! another string and `ReplicateConfig::of` ignoring its type all passed.

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

//! Policy configs: the serde schema (JSON and TOML), names, and validation errors.

use moonagent_core::store::PolicyConfig;

const EXAMPLES: &[&str] = &[
    r#"{"policy":"mooncake-default"}"#,
    r#"{"policy":"type-aware","types":{"encoder_output":{"reuse_scale":8.0,"eviction_grace_ms":10000,"budget_ratio":0.12},"kv_cache":{"budget_ratio":0.8}}}"#,
    r#"{"policy":"hierarchical","tree":{"assign":"weights","children":[{"select":{"tenant":1},"weight":3.0,"children":[{"select":{"data_type":"kv_cache"},"evict":{"rule":"lru"}}]},{"select":"any","evict":{"rule":"gdsf"}}]}}"#,
    r#"{"policy":"lru"}"#,
    r#"{"policy":"fifo"}"#,
    r#"{"policy":"s3-fifo","small_ratio":0.1,"ghost_ratio":0.9,"move_threshold":1}"#,
    r#"{"policy":"sieve"}"#,
    r#"{"policy":"w-tinylfu","window_ratio":0.01,"protected_ratio":0.8}"#,
    r#"{"policy":"gdsf"}"#,
    r#"{"policy":"belady"}"#,
    r#"{"policy":"belady-cost"}"#,
];

#[test]
fn every_example_parses_builds_and_round_trips_through_json() {
    for j in EXAMPLES {
        let p = PolicyConfig::from_json_str(j).unwrap_or_else(|e| panic!("{j}: {e}"));
        assert_eq!(p.build().unwrap().name(), p.name(), "{j}");
        let back = serde_json::to_string(&p).unwrap();
        assert_eq!(PolicyConfig::from_json_str(&back).unwrap(), p, "{back}");
    }
}

#[test]
fn default_is_mooncake_default() {
    assert_eq!(
        PolicyConfig::from_json_str(r#"{"policy":"mooncake-default"}"#).unwrap(),
        PolicyConfig::default()
    );
    assert_eq!(PolicyConfig::default().name(), "mooncake-default");
}

#[test]
fn toml_matches_json() {
    let t = PolicyConfig::from_toml_str(
        r#"
policy = "type-aware"
[types.encoder_output]
reuse_scale = 8
eviction_grace_ms = 10000
budget_ratio = 0.12
[types.kv_cache]
budget_ratio = 0.8
"#,
    )
    .unwrap();
    assert_eq!(t, PolicyConfig::from_json_str(EXAMPLES[1]).unwrap());
    let h = PolicyConfig::from_toml_str(include_str!("data/hierarchical.toml")).unwrap();
    assert_eq!(h.name(), "hierarchical");
    assert!(!h.is_offline());
    assert!(PolicyConfig::from_toml_str("policy = \"belady\"")
        .unwrap()
        .is_offline());
}

#[test]
fn unknown_policies_and_fields_are_rejected() {
    for bad in [
        r#"{"policy":"lfu"}"#,
        r#"{"policy":"lru","capacity":3}"#,
        r#"{"policy":"mooncake-default","ratio":0.1}"#,
        r#"{"policy":"belady","oracle":true}"#,
        r#"{"policy":"s3-fifo","small":0.1}"#,
        r#"{"policy":"type-aware","reuse_scale":8.0}"#,
        r#"{"policy":"hierarchical","tree":{"evict":{"rule":"lru","x":1}}}"#,
        r#"{"policy":"hierarchical","tree":{"select":{"tenant_id":1}}}"#,
        r#"{"policy":"hierarchical","tree":{"assign":"random"}}"#,
        r#"{"policy":"hierarchical"}"#,
    ] {
        assert!(PolicyConfig::from_json_str(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn s3fifo_ratios_are_validated_naming_the_field() {
    for (j, field) in [
        (r#"{"policy":"s3-fifo","small_ratio":0.0}"#, "small_ratio"),
        (r#"{"policy":"s3-fifo","small_ratio":1.0}"#, "small_ratio"),
        (r#"{"policy":"s3-fifo","ghost_ratio":1.5}"#, "ghost_ratio"),
    ] {
        let e = PolicyConfig::from_json_str(j).unwrap_err();
        assert!(e.to_string().contains(field), "{e}");
    }
}

/// The registry's position of a variant: an exhaustive match, so a new variant does not
/// compile until it is placed here, and the test below then wants it in `NAMES`.
fn registry_index(p: &PolicyConfig) -> usize {
    match p {
        PolicyConfig::MooncakeDefault {} => 0,
        PolicyConfig::TypeAware(_) => 1,
        PolicyConfig::Hierarchical(_) => 2,
        PolicyConfig::Lru {} => 3,
        PolicyConfig::Fifo {} => 4,
        PolicyConfig::S3Fifo(_) => 5,
        PolicyConfig::Sieve {} => 6,
        PolicyConfig::WTinyLfu(_) => 7,
        PolicyConfig::Gdsf {} => 8,
        PolicyConfig::Belady {} => 9,
        PolicyConfig::BeladyCost {} => 10,
    }
}

#[test]
fn names_are_the_one_registry_serde_name_and_build_agree() {
    use moonagent_core::store::PolicyNameError;
    for (i, &name) in PolicyConfig::NAMES.iter().enumerate() {
        match PolicyConfig::by_name(name) {
            Ok(p) => {
                assert_eq!(p.name(), name);
                assert_eq!(registry_index(&p), i, "{name} out of place in NAMES");
                assert_eq!(p.build().unwrap().name(), name);
            }
            // Only the tree policy has no defaults.
            Err(PolicyNameError::NeedsSettings { .. }) => assert_eq!(name, "hierarchical"),
            Err(e) => panic!("{name}: {e}"),
        }
    }
    let tree = PolicyConfig::from_json_str(EXAMPLES[2]).unwrap();
    assert_eq!(PolicyConfig::NAMES[registry_index(&tree)], "hierarchical");
    let e = PolicyConfig::by_name("lfu").unwrap_err();
    assert!(matches!(e, PolicyNameError::Unknown { .. }));
    assert!(e.to_string().contains("sieve"), "{e}");
}

//! Seed 002's type-aware eviction ablation on the seed-002 session workload (600
//! sessions, seed 0), replayed with Mooncake master's semantics (10 s read leases, 10 ms
//! eviction tick, watermark 0.90). Rates are over re-references (first references, which
//! miss under every policy, left out: the only reading under which the seed's
//! encoder-output hit rates are reachable on a sparse-reuse workload), as `Row` reports.
//!
//! What holds on our workload, and is asserted here:
//! - at the default capacity (20% of unique bytes, where `default`'s KV hit rate is
//!   closest to the seed's 96.65%), balanced raises the encoder-output hit rate by far more
//!   than 30 points, but the KV hit rate drops by more than 2 points and the saving-time
//!   rate falls: encoder-output re-references carry under 2% of the recompute time here
//!   (the seed's numbers imply about 14%), so the KV loss outweighs the encoder gain;
//! - at 30% of unique bytes (KV under almost no pressure, encoder outputs under pressure:
//!   default keeps about half of them) the seed's whole shape holds.

use moonagent_core::store::{DataType, MemStoreConfig, PolicyConfig};
use moonagent_sim::replay::ablation::{self, Row, Shape};
use moonagent_sim::replay::{replay_all, Compiled, LabelledPolicy};

fn workload() -> Compiled {
    ablation::sessions_trace(600, 0).expect("sessions workload")
}

fn rows_at(c: &Compiled, share: f64, pols: &[LabelledPolicy]) -> Vec<Row> {
    let cfg = MemStoreConfig {
        capacity_bytes: (c.unique_total() as f64 * share).round() as u64,
        ..MemStoreConfig::default()
    };
    replay_all(c, &cfg, pols)
        .expect("replay")
        .iter()
        .map(Row::of)
        .collect()
}

fn default_and_balanced() -> Vec<LabelledPolicy> {
    let s = ablation::seed_policies();
    vec![s[0].clone(), s[3].clone()]
}

#[test]
fn balanced_gains_30_points_of_encoder_hits_at_default_capacity_but_kv_and_saving_time_fall() {
    let c = workload();
    let u = c.unique_bytes();
    let enc_share = u[DataType::EncoderOutput.index()] as f64 / c.unique_total() as f64;
    assert!(
        (0.085..0.10).contains(&enc_share),
        "seed-002 workload: encoder outputs are about 9% of unique bytes, got {enc_share}"
    );
    let rows = rows_at(
        &c,
        ablation::DEFAULT_CAPACITY_SHARE,
        &default_and_balanced(),
    );
    let d = &rows[0];
    // The capacity is where default's KV hit rate is closest to the seed's 96.65%.
    assert!((d.kv_reuse_hit - 96.65).abs() < 1.0, "{d:?}");
    let s = Shape::of(&rows, true).expect("rows");
    assert!(s.hidden_gain >= 30.0, "{s:?}");
    assert!(s.kv_drop > 2.0 && s.kv_drop < 4.0, "{s:?}");
    assert!(s.saving_gain < 0.0, "{s:?}");
    assert!(!s.holds());
}

#[test]
fn encoder_reuse_carries_under_2_percent_of_recompute_time() {
    // Why the saving-time rate follows KV on this workload.
    let c = workload();
    let (mut enc, mut kv) = (0u64, 0u64);
    for a in c.accesses.iter().filter(|a| a.is_reuse()) {
        if a.dtype == DataType::EncoderOutput.index() as u8 {
            enc += u64::from(a.penalty_ns);
        } else {
            kv += u64::from(a.penalty_ns);
        }
    }
    let share = enc as f64 / (enc + kv) as f64;
    assert!(
        share > 0.0 && share < 0.02,
        "encoder share of reuse recompute time {share}"
    );
}

#[test]
fn seed_shape_holds_at_30_percent_capacity() {
    let c = workload();
    let rows = rows_at(&c, 0.30, &default_and_balanced());
    let s = Shape::of(&rows, true).expect("rows");
    assert!(s.holds(), "{s:?} {rows:?}");
    // The store is under pressure: default loses about half of the encoder outputs.
    assert!(rows[0].hidden_reuse_hit < 60.0, "{rows:?}");
}

#[test]
fn ablation_rows_order_and_grace_reuse_scale_effects() {
    // Each knob alone raises encoder-output hits over default at the default capacity,
    // reuse scale more than grace, and every online policy stays below 100%.
    let c = workload();
    let rows = rows_at(
        &c,
        ablation::DEFAULT_CAPACITY_SHARE,
        &ablation::seed_policies(),
    );
    let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(
        labels,
        ["default", "grace-only", "reuse-scale-only", "balanced"]
    );
    assert!(
        rows[1].hidden_reuse_hit >= rows[0].hidden_reuse_hit,
        "{rows:?}"
    );
    assert!(
        rows[2].hidden_reuse_hit > rows[1].hidden_reuse_hit,
        "{rows:?}"
    );
    assert!(rows[2].kv_reuse_hit < rows[3].kv_reuse_hit, "{rows:?}");
}

#[test]
fn example_policy_files_equal_the_ablation_configs() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies");
    for lp in ablation::seed_policies() {
        let p = dir.join(format!("{}.toml", lp.label));
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let cfg =
            PolicyConfig::from_toml_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(cfg, lp.policy, "{}", p.display());
    }
    let p = dir.join("hierarchical-type.toml");
    let text = std::fs::read_to_string(&p).expect("hierarchical-type.toml");
    assert_eq!(
        PolicyConfig::from_toml_str(&text).expect("valid"),
        ablation::hierarchical()
    );
}

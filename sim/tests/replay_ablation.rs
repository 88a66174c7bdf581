//! Seed 002's type-aware eviction ablation on the seed-002 session workload (600
//! sessions), replayed with Mooncake master's semantics (10 s read leases, 10 ms eviction
//! tick, watermark 0.90). Rates are over re-references (first references, which miss under
//! every policy, left out: the only reading under which the seed's encoder-output hit
//! rates are reachable on a sparse-reuse workload), as `Row` reports.
//!
//! Every quantity below is a property of one random workload, so it is checked on the
//! workloads of generator seeds 0-9 (`SEEDS`), not on seed 0 alone: a claim must hold on
//! every seed, and a band on a seed-dependent number is set from its spread over seeds.
//! Measured (ChaCha8 generator; the former SplitMix64 generator in brackets), at the
//! default capacity (20% of unique bytes):
//! - balanced - default, encoder-output hit rate: +38.3 to +51.6 points [+38.3 to +51.2];
//! - default - balanced, KV hit rate (`kv_drop`): mean 1.44, sd 0.41, range 0.89-2.08
//!   [mean 1.57, sd 0.44, range 1.04-2.57]. Until this test looked at more than one seed
//!   it required 2 < kv_drop < 4 on seed 0 (2.57 with SplitMix64, the one seed of ten
//!   above 2); with ChaCha8 seed 0 gives 1.64. The band was one seed's value, not a
//!   property of the workload; the two generators' distributions agree (difference of
//!   means 0.12, standard error 0.19);
//! - balanced - default, saving-time rate: -0.40 to -1.64 points [-0.50 to -2.08]: it
//!   falls on every seed, because encoder-output re-references carry under 2% of the
//!   recompute time here (the seed's numbers imply about 14%), so even a 1-2 point KV loss
//!   outweighs the encoder gain. So the seed's shape (which needs KV drop <= 2 and the
//!   saving-time rate to rise) fails at this capacity on every seed, by its saving-time
//!   condition.
//!
//! At 30% of unique bytes (KV under almost no pressure, encoder outputs under pressure:
//! default keeps about half of them) the KV drop is under 0.3 points and the saving-time
//! rate rises on every seed, but the encoder-output gain is 23.6-34.0 points (mean 29.2,
//! sd 3.3) [25.2-36.9, mean 30.7, sd 4.0]: the seed's 30-point bar holds on 3 of 10 seeds [5 of 10],
//! seed 0 among them with both generators.

use std::sync::OnceLock;

use moonagent_core::store::{DataType, MemStoreConfig, PolicyConfig};
use moonagent_sim::replay::ablation::{self, Row, Shape};
use moonagent_sim::replay::{replay_all, Compiled, LabelledPolicy};

/// The generator seeds whose workloads every claim is checked on.
const SEEDS: u64 = 10;

/// One seed's workload, measured.
struct Measured {
    seed: u64,
    /// Encoder outputs' share of unique bytes.
    enc_share: f64,
    /// Encoder outputs' share of the re-references' recompute time.
    enc_penalty_share: f64,
    /// The four seed policies at the default capacity.
    rows20: Vec<Row>,
    /// default and balanced at 30%.
    rows30: Vec<Row>,
    /// default's KV re-reference hit rate at 15% and 25% of unique bytes.
    kv_hit15: f64,
    kv_hit25: f64,
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

fn measure(seed: u64) -> Measured {
    let c = ablation::sessions_trace(600, seed).expect("sessions workload");
    let u = c.unique_bytes();
    let (mut enc, mut kv) = (0u64, 0u64);
    for a in c.accesses.iter().filter(|a| a.is_reuse()) {
        if a.dtype == DataType::EncoderOutput.index() as u8 {
            enc += u64::from(a.penalty_ns);
        } else {
            kv += u64::from(a.penalty_ns);
        }
    }
    let cal = ablation::calibrate_capacity(&c, &[0.15, 0.25], &MemStoreConfig::default())
        .expect("calibration");
    Measured {
        seed,
        enc_share: u[DataType::EncoderOutput.index()] as f64 / c.unique_total() as f64,
        enc_penalty_share: enc as f64 / (enc + kv) as f64,
        rows20: rows_at(
            &c,
            ablation::DEFAULT_CAPACITY_SHARE,
            &ablation::seed_policies(),
        ),
        rows30: rows_at(&c, 0.30, &default_and_balanced()),
        kv_hit15: cal[0].1,
        kv_hit25: cal[1].1,
    }
}

/// Every seed's measurements, computed once for all tests of this file.
fn measured() -> &'static [Measured] {
    static M: OnceLock<Vec<Measured>> = OnceLock::new();
    M.get_or_init(|| {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..SEEDS).map(|k| s.spawn(move || measure(k))).collect();
            hs.into_iter().map(|h| h.join().expect("seed")).collect()
        })
    })
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let m = xs.iter().sum::<f64>() / n;
    let v = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0);
    (m, v.sqrt())
}

#[test]
fn the_workload_is_about_9_percent_encoder_outputs_on_every_seed() {
    for m in measured() {
        assert!(
            (0.085..0.10).contains(&m.enc_share),
            "seed {}: encoder outputs are about 9% of unique bytes, got {}",
            m.seed,
            m.enc_share
        );
    }
}

#[test]
fn default_capacity_is_the_5_point_share_closest_to_the_seeds_kv_hit_rate() {
    // DEFAULT_CAPACITY_SHARE: among 15%, 20%, 25% of unique bytes, the share at which
    // default's KV re-reference hit rate, averaged over seeds, is closest to the seed's
    // 96.65%. (Measured means: 20% gives 98.2, per seed 97.6-99.0; on a 2-point grid 18%
    // would be closest, mean 96.7.)
    let ms = measured();
    let mean = |f: fn(&Measured) -> f64| ms.iter().map(f).sum::<f64>() / ms.len() as f64;
    let at = [
        mean(|m| m.kv_hit15),
        mean(|m| m.rows20[0].kv_reuse_hit),
        mean(|m| m.kv_hit25),
    ];
    let off = at.map(|h| (h - 96.65).abs());
    assert!(off[1] < off[0] && off[1] < off[2], "{at:?}");
}

#[test]
fn balanced_gains_30_points_of_encoder_hits_at_default_capacity_but_kv_and_saving_time_fall() {
    let ms = measured();
    let shapes: Vec<Shape> = ms
        .iter()
        .map(|m| Shape::of(&m.rows20, true).expect("rows"))
        .collect();
    for (m, s) in ms.iter().zip(&shapes) {
        assert!(s.hidden_gain >= 30.0, "seed {}: {s:?}", m.seed);
        assert!(s.kv_drop > 0.0, "seed {}: {s:?}", m.seed);
        assert!(s.saving_gain < 0.0, "seed {}: {s:?}", m.seed);
        assert!(!s.holds(), "seed {}: {s:?}", m.seed);
    }
    // The KV drop's size is seed-dependent (sd 0.41 points over seeds): its mean over the
    // seeds is checked against a band of 4 standard errors of that mean (0.41 / sqrt(10)
    // = 0.13, so +-0.52) around the measured 1.44 (1.57 with SplitMix64).
    let drops: Vec<f64> = shapes.iter().map(|s| s.kv_drop).collect();
    let (mean, sd) = mean_sd(&drops);
    assert!(
        (0.9..2.0).contains(&mean),
        "KV drop mean {mean} sd {sd}: {drops:?}"
    );
}

#[test]
fn encoder_reuse_carries_under_2_percent_of_recompute_time() {
    // Why the saving-time rate follows KV on this workload.
    for m in measured() {
        let share = m.enc_penalty_share;
        assert!(
            share > 0.0 && share < 0.02,
            "seed {}: encoder share of reuse recompute time {share}",
            m.seed
        );
    }
}

#[test]
fn at_30_percent_capacity_kv_barely_drops_and_saving_time_rises_on_every_seed() {
    let ms = measured();
    let mut gains = Vec::new();
    for m in ms {
        let s = Shape::of(&m.rows30, true).expect("rows");
        assert!(
            s.kv_drop <= 2.0 && s.saving_gain > 0.0,
            "seed {}: {s:?}",
            m.seed
        );
        // The store is under pressure: default loses about half of the encoder outputs.
        assert!(
            m.rows30[0].hidden_reuse_hit < 65.0,
            "seed {}: {:?}",
            m.seed,
            m.rows30
        );
        gains.push(s.hidden_gain);
    }
    // The encoder-output gain straddles the seed's 30-point bar (sd 3.3 points over
    // seeds): its mean is checked against 4 standard errors (3.3 / sqrt(10) = 1.03, so
    // +-4.1) around the measured 29.2 (30.7 with SplitMix64).
    let (mean, sd) = mean_sd(&gains);
    assert!(
        (25.0..33.5).contains(&mean),
        "encoder gain mean {mean} sd {sd}: {gains:?}"
    );
    // Seed 0, the workload `moonagent repro eviction-ablation` runs, shows the whole shape.
    assert!(
        Shape::of(&ms[0].rows30, true).expect("rows").holds(),
        "{:?}",
        ms[0].rows30
    );
}

#[test]
fn ablation_rows_order_and_grace_reuse_scale_effects() {
    // Each knob alone raises encoder-output hits over default at the default capacity,
    // reuse scale more than grace, and every online policy stays below 100%.
    for m in measured() {
        let rows = &m.rows20;
        let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(
            labels,
            ["default", "grace-only", "reuse-scale-only", "balanced"]
        );
        assert!(
            rows[1].hidden_reuse_hit >= rows[0].hidden_reuse_hit,
            "seed {}: {rows:?}",
            m.seed
        );
        assert!(
            rows[2].hidden_reuse_hit > rows[1].hidden_reuse_hit,
            "seed {}: {rows:?}",
            m.seed
        );
        assert!(
            rows[2].kv_reuse_hit < rows[3].kv_reuse_hit,
            "seed {}: {rows:?}",
            m.seed
        );
    }
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

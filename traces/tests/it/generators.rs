//! Generators: the figures the issue asks for, determinism, and config handling.

use moonagent_traces::gen::servegen::{load_client, ServeGenConfig, ServeGenGen, UnknownDist};
use moonagent_traces::gen::{Generated, GeneratorKind};
use moonagent_traces::stats::{compute, StatsConfig, TraceStats};
use moonagent_traces::{shared_traces_dir, Request, TraceError};

use crate::common::*;

fn stats(kind: GeneratorKind, sets: &[(&str, &str)], seed: u64) -> TraceStats {
    let sets: Vec<(String, String)> = sets
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let g = Generated::new(kind, None, &sets, seed).expect("generator");
    let h = g.header.clone();
    compute(&h, g.requests, StatsConfig::default()).expect("stats")
}

#[test]
fn sessions_defaults_give_91_9_unique_byte_shares() {
    for seed in 0..3 {
        let s = stats(GeneratorKind::Sessions, &[], seed);
        let u = &s.unique_bytes;
        eprintln!(
            "seed {seed}: {} requests, KV {:.2}% / encoder {:.2}%, image repeat {:.2}% every {:.0} s, block repeat {:.2}% every {:.0} s",
            s.requests,
            100.0 * u.kv_share,
            100.0 * u.encoder_share,
            100.0 * s.images.repeat_rate,
            s.images.mean_reuse_interval_s,
            100.0 * s.blocks.repeat_rate,
            s.blocks.mean_reuse_interval_s
        );
        assert_eq!(s.sessions, 600);
        assert!(
            (u.kv_share - 0.9088).abs() < 0.01,
            "KV share {}",
            u.kv_share
        );
        assert!(
            (u.encoder_share - 0.0912).abs() < 0.01,
            "encoder share {}",
            u.encoder_share
        );
        // KV reused often, encoder outputs sparsely and over longer intervals.
        assert!(s.blocks.repeat_rate > 0.5, "{}", s.blocks.repeat_rate);
        assert!(
            s.images.repeat_rate > 0.0 && s.images.repeat_rate < 0.15,
            "{}",
            s.images.repeat_rate
        );
        assert!(s.images.mean_reuse_interval_s > 3.0 * s.blocks.mean_reuse_interval_s);
    }
}

#[test]
fn sessions_shares_move_with_their_knobs() {
    let base = stats(GeneratorKind::Sessions, &[("sessions", "100")], 1).unwrap_share();
    let more_images = stats(
        GeneratorKind::Sessions,
        &[("sessions", "100"), ("image_turn_prob", "1.0")],
        1,
    )
    .unwrap_share();
    let more_text = stats(
        GeneratorKind::Sessions,
        &[
            ("sessions", "100"),
            ("text_tokens_min", "500"),
            ("text_tokens_max", "900"),
        ],
        1,
    )
    .unwrap_share();
    assert!(more_images > base, "{more_images} vs {base}");
    assert!(more_text < base, "{more_text} vs {base}");
}

trait Share {
    fn unwrap_share(&self) -> f64;
}
impl Share for TraceStats {
    fn unwrap_share(&self) -> f64 {
        self.unique_bytes.encoder_share
    }
}

#[test]
fn w3_repeat_rate_is_70_percent() {
    for seed in 0..3 {
        let s = stats(GeneratorKind::W3, &[], seed);
        assert_eq!(s.requests, 10_000);
        assert!(
            (s.images.repeat_rate - 0.70).abs() < 0.02,
            "seed {seed}: {}",
            s.images.repeat_rate
        );
        assert!(s.images_per_request.min >= 1 && s.images_per_request.max <= 4);
        assert!((s.images_per_request.mean - 2.5).abs() < 0.05);
    }
}

#[test]
fn w1_w2_w4_match_seed_000() {
    let w1 = stats(GeneratorKind::W1, &[("requests", "3000")], 1);
    assert_eq!(
        (w1.images_per_request.min, w1.images_per_request.max),
        (1, 1)
    );
    assert_eq!(w1.images.repeats, 0);
    assert_eq!(w1.forks.forked_requests, 0);
    let w2 = stats(GeneratorKind::W2, &[("requests", "3000")], 1);
    assert_eq!(
        (w2.images_per_request.min, w2.images_per_request.max),
        (4, 8)
    );
    assert_eq!(w2.images.repeats, 0);
    let w4 = stats(GeneratorKind::W4, &[("requests", "5000")], 1);
    assert_eq!(
        (w4.images_per_request.min, w4.images_per_request.max),
        (2, 2)
    );
    assert!(
        (w4.images.repeat_rate - 0.5).abs() < 0.03,
        "{}",
        w4.images.repeat_rate
    );
    assert_eq!(w4.forks.forked_requests, 5000);
    assert_eq!(
        w4.forks
            .branch_histogram
            .keys()
            .copied()
            .collect::<Vec<_>>(),
        vec![4, 5, 6, 7, 8]
    );
    // Poisson arrivals at the configured rate.
    let r = stats(
        GeneratorKind::W1,
        &[("requests", "20000"), ("rate", "50")],
        2,
    );
    assert!((r.mean_rate - 50.0).abs() < 2.0, "{}", r.mean_rate);
}

#[test]
fn generators_are_deterministic() {
    for kind in [
        GeneratorKind::W2,
        GeneratorKind::W4,
        GeneratorKind::Sessions,
    ] {
        let sets = vec![("requests".to_string(), "300".to_string())];
        let sets = if kind == GeneratorKind::Sessions {
            vec![("sessions".to_string(), "40".to_string())]
        } else {
            sets
        };
        let run = |seed| {
            let g = Generated::new(kind, None, &sets, seed).unwrap();
            let h = g.header.clone();
            let reqs: Vec<Request> = g.requests.collect::<Result<_, _>>().unwrap();
            to_jsonl(&h, &reqs)
        };
        assert_eq!(run(11), run(11), "{kind:?}");
        assert_ne!(run(11), run(12), "{kind:?}");
    }
}

#[test]
fn config_errors_name_the_knob() {
    let err = |sets: &[(&str, &str)]| -> TraceError {
        let sets: Vec<(String, String)> = sets
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        match Generated::new(GeneratorKind::W3, None, &sets, 0) {
            Err(e) => e,
            Ok(_) => panic!("expected an error"),
        }
    };
    assert_eq!(err(&[("repeat_rat", "0.5")]).field(), Some("repeat_rat"));
    assert_eq!(err(&[("repeat_rate", "1.5")]).field(), Some("repeat_rate"));
    assert_eq!(err(&[("rate", "\"fast\"")]).field(), Some("rate"));
    assert_eq!(err(&[("images_min", "5")]).field(), Some("images_min"));
    assert!("w9".parse::<GeneratorKind>().is_err());
}

#[test]
fn servegen_follows_window_rates_and_distributions() {
    let Some(dir) = shared_traces_dir("servegen-mm-image") else {
        return;
    };
    let cfg = ServeGenConfig {
        dir: Some(dir.clone()),
        chunks: vec![0, 10],
        duration_s: 7200.0,
        ..ServeGenConfig::default()
    };
    // Expected count: sum of rate x window length over the span.
    let mut expected = 0.0;
    for chunk in [0, 10] {
        let c = load_client(&dir, chunk, UnknownDist::Error).unwrap();
        for w in &c.windows {
            let overlap = (w.end_s.min(7200.0) - w.start_s.max(0.0)).max(0.0);
            expected += w.rate * overlap;
        }
    }
    let g = ServeGenGen::new(cfg.clone(), 4).unwrap();
    let h = g.header().clone();
    let s = compute(&h, g.map(Ok), StatsConfig::default()).unwrap();
    let got = s.requests as f64;
    assert!(
        (got - expected).abs() / expected < 0.05,
        "{got} requests, expected about {expected}"
    );
    assert_eq!(s.tenants, 2);
    assert!(s.images_per_request.min >= 1);
    assert!(s.visual_tokens_per_image > 4.0 && s.visual_tokens_per_image <= 1280.0);
    // Same seed, same trace.
    let a: Vec<Request> = ServeGenGen::new(cfg.clone(), 4)
        .unwrap()
        .take(500)
        .collect();
    let b: Vec<Request> = ServeGenGen::new(cfg, 4).unwrap().take(500).collect();
    assert_eq!(a, b);
}

//! Calibration recovers known parameters from noisy synthetic samples, reports its fit
//! error, and turns too few or degenerate samples into errors instead of panics.

use moonagent_models::{
    calibrate, calibrate_select, Calibration, CalibrationError, CostModel, Flow, Group,
    HardwareProfile, LinkKind, ModelSpec, Param, Roofline, Rooflines, Sample,
};

/// Deterministic noise in [-1, 1] (splitmix64).
struct Noise(u64);

impl Noise {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

/// The H200 profile with "true" parameters that differ from its defaults.
fn truth() -> HardwareProfile {
    let mut hw = HardwareProfile::by_name("h200").unwrap();
    hw.efficiency.encoder_mfu = 0.42;
    hw.efficiency.prefill_mfu = 0.57;
    hw.efficiency.decode_mfu = 0.61;
    hw.efficiency.hbm_efficiency = 0.83;
    hw.overheads.encoder_batch_ns = 1_300_000;
    hw.overheads.prefill_chunk_ns = 2_200_000;
    hw.overheads.decode_iter_ns = 350_000;
    let tcp = hw.links.tcp.as_mut().unwrap();
    tcp.latency_ns = 150_000;
    tcp.put_bytes_per_s = 8.0e8;
    tcp.get_bytes_per_s = 1.1e9;
    tcp.kv_put_bytes_per_s = Some(3.5e8);
    let rdma = hw.links.rdma.as_mut().unwrap();
    rdma.latency_ns = 12_000;
    rdma.get_bytes_per_s = 4.2e10;
    hw.host.fingerprint_bytes_per_s = 7.0e8;
    hw.host.fingerprint_overhead_ns = 3_000;
    hw.validate().unwrap();
    hw
}

/// Samples covering both roofline sides of every group, timed with `hw`, with
/// multiplicative noise of at most `noise` (0.002 = 0.2%).
fn samples(hw: &HardwareProfile, model: &ModelSpec, noise: f64) -> Vec<Sample> {
    let cost = CostModel::new(hw, model, 1).unwrap();
    let mut rng = Noise(42);
    let mut jitter = |t: u64| ((t as f64) * (1.0 + noise * rng.next())).round() as u64;
    let mut out = Vec::new();
    for batch in [1u32, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024] {
        for ctx in [16u64, 64, 256, 1024, 4096] {
            let context_tokens = u64::from(batch) * ctx;
            let measured_ns = jitter(cost.decode_iter_time_ns(batch, context_tokens));
            out.push(Sample::Decode {
                batch,
                context_tokens,
                measured_ns,
            });
        }
    }
    for new_tokens in [8u32, 32, 128, 256, 512, 1024, 2048, 4096, 8192] {
        for cached_tokens in [0u32, 2048, 16_384] {
            let measured_ns = jitter(cost.prefill_time_ns(new_tokens, cached_tokens));
            out.push(Sample::Prefill {
                new_tokens,
                cached_tokens,
                measured_ns,
            });
        }
    }
    for tokens in [4u32, 16, 64, 256, 1024, 2048, 4096] {
        for images in [1usize, 2, 4] {
            let visual_tokens = vec![tokens; images];
            let measured_ns = jitter(cost.encoder_time_ns(&visual_tokens));
            out.push(Sample::Encoder {
                visual_tokens,
                measured_ns,
            });
        }
    }
    for (link, flows) in [
        (LinkKind::Tcp, &[Flow::Put, Flow::Get, Flow::KvPut][..]),
        (LinkKind::Rdma, &[Flow::Get][..]),
    ] {
        let l = *hw.link(link).unwrap();
        for &flow in flows {
            for bytes in [4_096u64, 65_536, 1 << 20, 7 << 20, 32 << 20, 200 << 20] {
                let measured_ns = jitter(l.transfer_time_ns(flow, bytes));
                out.push(Sample::Transfer {
                    link,
                    flow,
                    bytes,
                    measured_ns,
                });
            }
        }
    }
    for bytes in [1_000u64, 100_000, 1 << 20, 19 << 20, 64 << 20] {
        let measured_ns = jitter(hw.host.fingerprint_time_ns(bytes));
        out.push(Sample::Fingerprint { bytes, measured_ns });
    }
    out
}

fn model() -> ModelSpec {
    ModelSpec::by_name("qwen2.5-vl-7b").unwrap()
}

/// Calibrate the shipped H200 defaults (off by 5-40%) against samples from [`truth`] with
/// `noise` multiplicative jitter; every parameter must come back within `tolerance`.
fn recover(noise: f64, tolerance: f64) {
    let truth = truth();
    let model = model();
    let data = samples(&truth, &model, noise);
    let prior = HardwareProfile::by_name("h200").unwrap();
    let report = calibrate(&prior, &model, 1, &data).unwrap();
    let want = Calibration::of(&truth);
    for p in &report.params {
        let expected = want.get(p.param).unwrap();
        let rel = (p.value - expected) / expected;
        eprintln!(
            "noise {noise}: {:<30} true {expected:>12.5e} fitted {:>12.5e} ({:+.3}%)",
            p.param.to_string(),
            p.value,
            rel * 100.0
        );
        assert!(p.fitted, "{} not fitted", p.param);
        assert!(
            rel.abs() < tolerance,
            "{}: {:.3}% off",
            p.param,
            rel * 100.0
        );
    }
    // 7 GPU parameters + TCP (3 bandwidths, latency) + RDMA (1, latency) + fingerprint (2).
    assert_eq!(report.params.len(), 15);
    for g in &report.groups {
        eprintln!("noise {noise}: {g:?}");
        assert!(g.r2 > 0.999, "{g:?}");
        // The fit explains the samples to within the noise.
        assert!(g.mean_abs_pct_error < noise * 100.0, "{g:?}");
    }
    assert_eq!(report.residuals.len(), data.len());
    assert!(report.mean_abs_pct_error < noise * 100.0);
    let fitted = report.calibration.apply(&prior);
    fitted.validate().unwrap();
    assert_eq!(fitted.peak_bf16_flops_per_s, prior.peak_bf16_flops_per_s);
}

#[test]
fn samples_with_0_2_percent_noise_recover_every_parameter_within_half_a_percent() {
    recover(0.002, 0.005);
}

#[test]
fn samples_with_1_percent_noise_recover_every_parameter_within_two_percent() {
    recover(0.01, 0.02);
}

#[test]
fn noiseless_samples_recover_parameters_almost_exactly() {
    let truth = truth();
    let model = model();
    let data = samples(&truth, &model, 0.0);
    let report = calibrate(&HardwareProfile::by_name("h200").unwrap(), &model, 1, &data).unwrap();
    let want = Calibration::of(&truth);
    for p in &report.params {
        let expected = want.get(p.param).unwrap();
        // Rounding of the samples to whole ns leaves a sub-0.1% error, mostly in overheads.
        assert!(
            (p.value - expected).abs() / expected < 1e-3,
            "{}: {} vs {expected}",
            p.param,
            p.value
        );
    }
    assert!(report.rmse_ns < 1_000.0, "{}", report.rmse_ns);
}

#[test]
fn calibration_is_deterministic() {
    let model = model();
    let data = samples(&truth(), &model, 0.002);
    let prior = HardwareProfile::by_name("h200").unwrap();
    let a = calibrate(&prior, &model, 1, &data).unwrap();
    let b = calibrate(&prior, &model, 1, &data).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.to_json(), b.to_json());
}

#[test]
fn groups_without_samples_keep_their_priors() {
    let model = model();
    let mut prior = HardwareProfile::by_name("h200").unwrap();
    // The encoder's memory side (tiny images) uses the profile's bandwidth factor as given.
    prior.efficiency.hbm_efficiency = truth().efficiency.hbm_efficiency;
    let data: Vec<Sample> = samples(&truth(), &model, 0.0)
        .into_iter()
        .filter(|s| s.group() == Group::Encoder)
        .collect();
    let report = calibrate(&prior, &model, 1, &data).unwrap();
    assert_eq!(report.params.len(), 2);
    assert!((report.param(Param::EncoderMfu).unwrap().value - 0.42).abs() < 1e-3);
    let fitted = report.calibration.apply(&prior);
    assert_eq!(fitted.efficiency.prefill_mfu, prior.efficiency.prefill_mfu);
    assert_eq!(fitted.links, prior.links);
    assert_eq!(fitted.host, prior.host);
    assert_eq!(report.groups.len(), 1);
}

#[test]
fn memory_bound_decode_samples_leave_decode_mfu_unfitted() {
    let model = model();
    let truth = truth();
    let cost = CostModel::new(&truth, &model, 1).unwrap();
    let data: Vec<Sample> = [
        (1u32, 100u64),
        (1, 4096),
        (2, 30_000),
        (4, 9_000),
        (8, 70_000),
    ]
    .into_iter()
    .map(|(batch, context_tokens)| Sample::Decode {
        batch,
        context_tokens,
        measured_ns: cost.decode_iter_time_ns(batch, context_tokens),
    })
    .collect();
    let prior = HardwareProfile::by_name("h200").unwrap();
    let report = calibrate(&prior, &model, 1, &data).unwrap();
    let mfu = report.param(Param::DecodeMfu).unwrap();
    assert!(!mfu.fitted);
    assert_eq!(mfu.value, prior.efficiency.decode_mfu);
    let eff = report.param(Param::HbmEfficiency).unwrap();
    assert!(eff.fitted && (eff.value - 0.83).abs() < 1e-3, "{eff:?}");
}

#[test]
fn no_samples_is_an_error() {
    let err = calibrate(&HardwareProfile::by_name("h200").unwrap(), &model(), 1, &[]).unwrap_err();
    assert!(matches!(err, CalibrationError::NoSamples));
}

#[test]
fn fewer_samples_than_parameters_is_an_error() {
    let hw = HardwareProfile::by_name("h200").unwrap();
    let one_encoder = [Sample::Encoder {
        visual_tokens: vec![1024],
        measured_ns: 20_000_000,
    }];
    let err = calibrate(&hw, &model(), 1, &one_encoder).unwrap_err();
    assert!(
        matches!(
            err,
            CalibrationError::TooFewSamples {
                group: Group::Encoder,
                samples: 1,
                params: 2,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("efficiency.encoder_mfu"), "{err}");
    let two_decode: Vec<Sample> = [1u32, 64]
        .into_iter()
        .map(|batch| Sample::Decode {
            batch,
            context_tokens: 1000,
            measured_ns: 5_000_000,
        })
        .collect();
    let err = calibrate(&hw, &model(), 1, &two_decode).unwrap_err();
    assert!(matches!(
        err,
        CalibrationError::TooFewSamples {
            group: Group::Decode,
            params: 3,
            ..
        }
    ));
    // Seed 002's three TCP measurements: three bandwidths and a latency are four unknowns.
    let seed = [
        (Flow::Put, 32_062_464u64, 44_033_000u64),
        (Flow::Get, 32_062_464, 33_520_000),
        (Flow::KvPut, 206_438_400, 623_245_000),
    ]
    .map(|(flow, bytes, measured_ns)| Sample::Transfer {
        link: LinkKind::Tcp,
        flow,
        bytes,
        measured_ns,
    });
    let err = calibrate(&hw, &model(), 1, &seed).unwrap_err();
    assert!(
        matches!(
            err,
            CalibrationError::TooFewSamples {
                group: Group::Transfer(LinkKind::Tcp),
                samples: 3,
                params: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn samples_all_of_one_size_are_degenerate() {
    let hw = HardwareProfile::by_name("h200").unwrap();
    let same: Vec<Sample> = (0..6)
        .map(|i| Sample::Encoder {
            visual_tokens: vec![1024],
            measured_ns: 17_000_000 + i * 10_000,
        })
        .collect();
    let err = calibrate(&hw, &model(), 1, &same).unwrap_err();
    assert!(
        matches!(
            err,
            CalibrationError::Degenerate {
                group: Group::Encoder,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("overheads.encoder_batch_ns"),
        "{err}"
    );
    let same: Vec<Sample> = (0..4)
        .map(|i| Sample::Fingerprint {
            bytes: 1 << 20,
            measured_ns: 1_000_000 + i,
        })
        .collect();
    let err = calibrate(&hw, &model(), 1, &same).unwrap_err();
    assert!(
        matches!(
            err,
            CalibrationError::Degenerate {
                group: Group::Fingerprint,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn impossible_fits_are_errors_naming_the_parameter() {
    let hw = HardwareProfile::by_name("h200").unwrap();
    let model = model();
    let cost = CostModel::new(&hw, &model, 1).unwrap();
    // Ten times faster than the roofline at the profile's MFU: 3.5x the peak FLOP/s.
    let fast: Vec<Sample> = [64u32, 256, 1024, 4096]
        .into_iter()
        .map(|t| Sample::Encoder {
            visual_tokens: vec![t],
            measured_ns: (cost.encoder_time_ns(&[t]) - hw.overheads.encoder_batch_ns) / 10,
        })
        .collect();
    let err = calibrate(&hw, &model, 1, &fast).unwrap_err();
    assert!(
        matches!(
            err,
            CalibrationError::NonPhysical {
                param: Param::EncoderMfu,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("efficiency.encoder_mfu"), "{err}");
    // Times that shrink as transfers grow.
    let shrinking: Vec<Sample> = [
        (1u64 << 20, 9_000_000u64),
        (1 << 24, 5_000_000),
        (1 << 26, 1_000_000),
    ]
    .into_iter()
    .map(|(bytes, measured_ns)| Sample::Transfer {
        link: LinkKind::Rdma,
        flow: Flow::Put,
        bytes,
        measured_ns,
    })
    .collect();
    let err = calibrate(&hw, &model, 1, &shrinking).unwrap_err();
    assert!(
        matches!(
            err,
            CalibrationError::NonPhysical {
                param: Param::LinkBytesPerS(LinkKind::Rdma, Flow::Put),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn unusable_samples_are_errors() {
    let hw = HardwareProfile::by_name("cpu").unwrap();
    let model = model();
    let zero = [Sample::Fingerprint {
        bytes: 10,
        measured_ns: 0,
    }];
    let err = calibrate(&hw, &model, 1, &zero).unwrap_err();
    assert!(
        matches!(err, CalibrationError::BadSample { index: 0, .. }),
        "{err}"
    );
    let empty = [
        Sample::Prefill {
            new_tokens: 5,
            cached_tokens: 0,
            measured_ns: 5,
        },
        Sample::Encoder {
            visual_tokens: vec![],
            measured_ns: 5,
        },
    ];
    let err = calibrate(&hw, &model, 1, &empty).unwrap_err();
    assert!(
        matches!(err, CalibrationError::BadSample { index: 1, .. }),
        "{err}"
    );
    // The CPU host has no NVLink.
    let nvlink = [Sample::Transfer {
        link: LinkKind::Nvlink,
        flow: Flow::Put,
        bytes: 1,
        measured_ns: 1,
    }];
    let err = calibrate(&hw, &model, 1, &nvlink).unwrap_err();
    assert!(err.to_string().contains("links.nvlink"), "{err}");
    // A bad tensor-parallel degree is a model error, named.
    let err = calibrate(&hw, &model, 3, &zero).unwrap_err();
    assert!(err.to_string().contains("tp"), "{err}");
}

#[test]
fn samples_and_reports_serialise() {
    let model = model();
    let data = samples(&truth(), &model, 0.002);
    let json = serde_json::to_string(&data).unwrap();
    let back: Vec<Sample> = serde_json::from_str(&json).unwrap();
    assert_eq!(back, data);
    let one: Sample = serde_json::from_str(
        r#"{"kind":"transfer","link":"tcp","flow":"kv_put","bytes":206438400,"measured_ns":623245000}"#,
    )
    .unwrap();
    assert_eq!(one.group(), Group::Transfer(LinkKind::Tcp));
    let bad = serde_json::from_str::<Sample>(
        r#"{"kind":"decode","batch":1,"context":5,"measured_ns":9}"#,
    );
    assert!(bad.unwrap_err().to_string().contains("context"));
    let report = calibrate(&HardwareProfile::by_name("h200").unwrap(), &model, 1, &data).unwrap();
    let text = report.to_json();
    for needle in [
        "\"efficiency.prefill_mfu\"",
        "\"links.tcp.kv_put_bytes_per_s\"",
        "\"transfer tcp\"",
        "\"r2\"",
        "\"rmse_ns\"",
        "\"mean_abs_pct_error\"",
    ] {
        assert!(text.contains(needle), "{needle} missing");
    }
}

/// [`truth`] with the given forms: samples from it, fitted from the all-`max` H200 prior
/// with both forms on offer, must come back with the same forms and parameters.
fn recover_forms(forms: Rooflines) {
    let mut truth = truth();
    truth.roofline = forms;
    let model = model();
    let data = samples(&truth, &model, 0.002);
    let prior = HardwareProfile::by_name("h200").unwrap();
    let report = calibrate_select(&prior, &model, 1, &data, &Roofline::ALL).unwrap();
    assert_eq!(report.calibration.roofline, forms);
    let want = Calibration::of(&truth);
    for p in &report.params {
        let expected = want.get(p.param).unwrap();
        let rel = (p.value - expected) / expected;
        assert!(p.fitted, "{forms:?}: {} not fitted", p.param);
        assert!(
            rel.abs() < 0.005,
            "{forms:?}: {} {:.3}% off",
            p.param,
            rel * 100.0
        );
    }
    // Every compute group was fitted in both forms, decode first; the kept form has the
    // lower error, and the true form explains the samples to within the noise.
    let groups: Vec<(Group, Roofline)> =
        report.forms.iter().map(|f| (f.group, f.roofline)).collect();
    let mut expected = Vec::new();
    for g in [Group::Decode, Group::Prefill, Group::Encoder] {
        for r in Roofline::ALL {
            expected.push((g, r));
        }
    }
    assert_eq!(groups, expected);
    for pair in report.forms.chunks(2) {
        let kept = match pair[0].group {
            Group::Decode => forms.decode,
            Group::Prefill => forms.prefill,
            _ => forms.encoder,
        };
        let (k, other) = if pair[0].roofline == kept {
            (&pair[0], &pair[1])
        } else {
            (&pair[1], &pair[0])
        };
        assert!(k.kept && !other.kept, "{forms:?}: {pair:?}");
        let ke = k.mean_abs_pct_error.unwrap();
        assert!(ke < 0.2, "{forms:?}: {k:?}");
        if let Some(oe) = other.mean_abs_pct_error {
            assert!(oe > ke, "{forms:?}: {other:?} beat {k:?}");
        }
    }
    for g in &report.groups {
        assert!(g.mean_abs_pct_error < 0.2, "{forms:?}: {g:?}");
    }
}

#[test]
fn the_form_each_kind_was_timed_in_is_the_form_the_fit_keeps() {
    let sum = Roofline::Sum;
    let max = Roofline::Max;
    for (encoder, prefill, decode) in [
        (max, max, max),
        (max, max, sum),
        (max, sum, max),
        (sum, max, max),
        (sum, sum, sum),
    ] {
        recover_forms(Rooflines {
            encoder,
            prefill,
            decode,
        });
    }
}

#[test]
fn calibrate_fits_each_kind_in_the_priors_form() {
    let model = model();
    let mut truth = truth();
    truth.roofline.decode = Roofline::Sum;
    let data = samples(&truth, &model, 0.002);
    let mut prior = HardwareProfile::by_name("h200").unwrap();
    // In the prior's (all max) form the sum-timed decode samples fit worse.
    let all_max = calibrate(&prior, &model, 1, &data).unwrap();
    assert_eq!(all_max.calibration.roofline, Rooflines::default());
    assert_eq!(all_max.forms.len(), 3);
    assert!(all_max
        .forms
        .iter()
        .all(|f| f.kept && f.roofline == Roofline::Max));
    assert!(all_max.group(Group::Decode).unwrap().mean_abs_pct_error > 1.0);
    prior.roofline.decode = Roofline::Sum;
    let own = calibrate(&prior, &model, 1, &data).unwrap();
    assert_eq!(own.calibration.roofline, truth.roofline);
    assert!(own.group(Group::Decode).unwrap().mean_abs_pct_error < 0.2);
    // calibrate is calibrate_select with no forms on offer.
    assert_eq!(
        own,
        calibrate_select(&prior, &model, 1, &data, &[]).unwrap()
    );
    let text = own.to_json();
    assert!(text.contains("\"decode\": \"sum\""), "{text}");
    assert!(text.contains("\"roofline\": \"sum\""), "{text}");
}

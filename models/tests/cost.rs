//! Cost functions: monotone, deterministic, zero for no work, never panicking on extreme
//! inputs, and of the right order of magnitude against public figures.

use moonagent_models::{
    decode_iter_time_ns, encoder_time_ns, fingerprint_time_ns, prefill_time_ns, transfer_time_ns,
    CostModel, Flow, HardwareProfile, LinkKind, ModelSpec, Roofline, Rooflines, Work,
};

fn setup(hw: &str, model: &str, tp: u32) -> (HardwareProfile, ModelSpec, CostModel) {
    let hw = HardwareProfile::by_name(hw).unwrap();
    let model = ModelSpec::by_name(model).unwrap();
    let cost = CostModel::new(&hw, &model, tp).unwrap();
    (hw, model, cost)
}

const MS: f64 = 1e6;

#[test]
fn more_visual_tokens_never_cost_less() {
    for hw in HardwareProfile::builtin_names() {
        let (_, _, c) = setup(hw, "qwen2.5-vl-7b", 1);
        let mut last = 0;
        for tokens in (0..=20_000u32).step_by(7) {
            let t = c.encoder_time_ns(&[tokens]);
            assert!(t >= last, "{hw}: {tokens} tokens: {t} < {last}");
            last = t;
        }
        // Adding an image to a batch never makes it cheaper, and batching beats running
        // the images one by one (the overhead and the weight reads are paid once).
        let mut batch = Vec::new();
        let mut last = 0;
        for tokens in [1u32, 64, 256, 1024, 4096, 16] {
            batch.push(tokens);
            let t = c.encoder_time_ns(&batch);
            assert!(t >= last, "{hw}: batch {batch:?}");
            last = t;
        }
        let alone: u64 = batch.iter().map(|&t| c.encoder_time_ns(&[t])).sum();
        assert!(c.encoder_time_ns(&batch) < alone);
    }
}

#[test]
fn more_prefill_tokens_never_cost_less() {
    for model in ModelSpec::builtin_names() {
        let (_, _, c) = setup("h200", model, 4);
        for cached in [0u32, 100, 4096, 100_000] {
            let mut last = 0;
            for new in (0..=32_768u32).step_by(61) {
                let t = c.prefill_time_ns(new, cached);
                assert!(t >= last, "{model}: new {new} cached {cached}");
                last = t;
            }
        }
        for new in [1u32, 512, 8192] {
            let mut last = 0;
            for cached in (0..=65_536u32).step_by(127) {
                let t = c.prefill_time_ns(new, cached);
                assert!(t >= last, "{model}: new {new} cached {cached}");
                last = t;
            }
        }
    }
}

#[test]
fn a_cached_prefix_makes_prefill_cheaper() {
    for hw in HardwareProfile::builtin_names() {
        let (_, _, c) = setup(hw, "qwen2.5-vl-7b", 1);
        for prompt in [64u32, 1000, 4096, 32_000] {
            let full = c.prefill_time_ns(prompt, 0);
            let mut last = full;
            for cached in [prompt / 4, prompt / 2, prompt - prompt / 8] {
                let t = c.prefill_time_ns(prompt - cached, cached);
                assert!(
                    t <= last,
                    "{hw}: prompt {prompt} cached {cached}: {t} > {last}"
                );
                last = t;
            }
            // From a few hundred tokens on, skipping half of them is a clear saving.
            if prompt >= 1000 {
                let half = c.prefill_time_ns(prompt / 2, prompt / 2);
                assert!((half as f64) < 0.75 * full as f64, "{hw}: {prompt}");
            }
        }
    }
}

#[test]
fn bigger_decode_batches_and_contexts_never_cost_less() {
    for model in ModelSpec::builtin_names() {
        let (_, _, c) = setup("b200", model, 4);
        for ctx_per_seq in [0u64, 128, 4096] {
            let mut last = 0;
            for batch in 0..=1024u32 {
                let t = c.decode_iter_time_ns(batch, u64::from(batch) * ctx_per_seq);
                assert!(t >= last, "{model}: batch {batch}");
                last = t;
            }
        }
        let mut last = 0;
        for ctx in (0..=2_000_000u64).step_by(997) {
            let t = c.decode_iter_time_ns(64, ctx);
            assert!(t >= last, "{model}: context {ctx}");
            last = t;
        }
    }
}

#[test]
fn transfers_and_fingerprints_grow_with_bytes() {
    for hw in HardwareProfile::builtins().unwrap() {
        for kind in LinkKind::ALL {
            let Some(link) = hw.links.get(kind) else {
                continue;
            };
            for flow in Flow::ALL {
                let mut last = 0;
                for bytes in (0..=1u64 << 30).step_by(1 << 20) {
                    let t = transfer_time_ns(link, flow, bytes);
                    assert!(t >= last && t >= link.latency_ns);
                    last = t;
                }
            }
        }
        let mut last = 0;
        for bytes in (0..=1u64 << 28).step_by(4099) {
            let t = fingerprint_time_ns(&hw.host, bytes);
            assert!(t >= last);
            last = t;
        }
    }
}

#[test]
fn no_work_costs_nothing() {
    let (hw, _, c) = setup("h200", "qwen2.5-vl-7b", 2);
    assert_eq!(c.encoder_time_ns(&[]), 0);
    assert_eq!(c.encoder_time_ns(&[0, 0]), 0);
    assert_eq!(c.prefill_time_ns(0, 5000), 0);
    assert_eq!(c.prefill_batch_time_ns(&[]), 0);
    assert_eq!(c.decode_iter_time_ns(0, 0), 0);
    // A transfer of nothing still pays the link's latency (an RPC still happens).
    let tcp = hw.link(LinkKind::Tcp).unwrap();
    assert_eq!(transfer_time_ns(tcp, Flow::Put, 0), tcp.latency_ns);
}

#[test]
fn free_functions_equal_a_tp1_cost_model_and_are_deterministic() {
    for hw_name in HardwareProfile::builtin_names() {
        for m in ModelSpec::builtin_names() {
            let (hw, model, c) = setup(hw_name, m, 1);
            for tokens in [1u32, 333, 4096] {
                let a = encoder_time_ns(&hw, &model, &[tokens, tokens / 3]);
                assert_eq!(a, c.encoder_time_ns(&[tokens, tokens / 3]));
                assert_eq!(a, encoder_time_ns(&hw, &model, &[tokens, tokens / 3]));
                assert_eq!(
                    prefill_time_ns(&hw, &model, tokens, 77),
                    c.prefill_time_ns(tokens, 77)
                );
                assert_eq!(
                    decode_iter_time_ns(&hw, &model, tokens, 1000 * u64::from(tokens)),
                    c.decode_iter_time_ns(tokens, 1000 * u64::from(tokens))
                );
            }
        }
    }
}

#[test]
fn golden_values_do_not_drift() {
    // Pinned so that an accidental change to a formula or a default shows up here; update
    // deliberately, with the reason, when the model changes. scripts/check_cost_golden.py
    // (run by scripts/test.sh) derives each value independently from the TOML data and the
    // formulas in README.md, in exact fractions, and reads the values from this test: a
    // changed value must agree with it to the ns.
    let (_, _, c) = setup("h200", "qwen2.5-vl-7b", 1);
    assert_eq!(c.decode_iter_time_ns(1, 4096), 4_393_383);
    assert_eq!(c.prefill_time_ns(4096, 0), 116_418_161);
    assert_eq!(c.encoder_time_ns(&[1024]), 17_321_282);
}

#[test]
fn prefill_batch_of_one_equals_prefill() {
    let (_, _, c) = setup("h100", "qwen2.5-vl-3b", 2);
    for (n, k) in [(1u32, 0u32), (100, 5000), (8192, 8192)] {
        assert_eq!(c.prefill_batch_time_ns(&[(n, k)]), c.prefill_time_ns(n, k));
    }
    // Two chunks in one pass cost less than two passes, more than either alone.
    let both = c.prefill_batch_time_ns(&[(512, 0), (256, 4096)]);
    let a = c.prefill_time_ns(512, 0);
    let b = c.prefill_time_ns(256, 4096);
    assert!(both < a + b && both > a.max(b));
}

#[test]
fn extreme_inputs_saturate_instead_of_panicking() {
    let (hw, _, c) = setup("cpu", "qwen2.5-vl-72b", 1);
    let _ = c.encoder_time_ns(&[u32::MAX, u32::MAX]);
    let _ = c.prefill_time_ns(u32::MAX, u32::MAX);
    let _ = c.prefill_batch_time_ns(&[(u32::MAX, u32::MAX); 3]);
    assert!(c.decode_iter_time_ns(u32::MAX, u64::MAX) > 0);
    let tcp = hw.link(LinkKind::Tcp).unwrap();
    assert_eq!(transfer_time_ns(tcp, Flow::KvGet, u64::MAX), u64::MAX);
    assert_eq!(fingerprint_time_ns(&hw.host, u64::MAX), u64::MAX);
}

/// A consistency check, not a validation: the TCP bandwidths in the H200 profile were
/// computed from these very measurements, so this only shows the profile and
/// `transfer_time_ns` still agree with the numbers they were built from (and that the
/// latency guess stays negligible).
#[test]
fn seed_002_tcp_profile_is_consistent_with_the_measurements_it_was_built_from() {
    // Seed 002, one node, TCP: (flow, bytes, measured ms).
    let hw = HardwareProfile::by_name("h200").unwrap();
    let tcp = hw.link(LinkKind::Tcp).unwrap();
    for (flow, bytes, ms) in [
        (Flow::Put, 32_062_464u64, 44.033),
        (Flow::Get, 32_062_464, 33.520),
        (Flow::KvPut, 206_438_400, 623.245),
    ] {
        let t = transfer_time_ns(tcp, flow, bytes) as f64 / MS;
        // The bandwidths are the measured ones; the 0.1 ms latency guess adds <= 0.3%.
        assert!((t - ms).abs() / ms < 0.004, "{flow:?}: {t} ms vs {ms} ms");
    }
}

#[test]
fn tensor_parallelism_speeds_up_and_makes_room() {
    let (_, model, _) = setup("h200", "qwen2.5-vl-72b", 1);
    let hw = HardwareProfile::by_name("h200").unwrap();
    let tp1 = CostModel::new(&hw, &model, 1).unwrap();
    let tp2 = CostModel::new(&hw, &model, 2).unwrap();
    let tp4 = CostModel::new(&hw, &model, 4).unwrap();
    // 145 GB of weights do not fit one 141 GB H200.
    assert_eq!(tp1.kv_capacity_tokens(0.9), 0);
    assert!(tp2.kv_capacity_tokens(0.9) > 100_000);
    assert!(tp4.kv_capacity_tokens(0.9) > 2 * tp2.kv_capacity_tokens(0.9));
    for (b, ctx) in [(1u32, 4096u64), (64, 64 * 2048)] {
        let (t1, t2, t4) = (
            tp1.decode_iter_time_ns(b, ctx),
            tp2.decode_iter_time_ns(b, ctx),
            tp4.decode_iter_time_ns(b, ctx),
        );
        assert!(t4 < t2 && t2 < t1, "{t1} {t2} {t4}");
        // ...but not perfectly: all-reduces and overheads do not shrink.
        assert!(t4 * 4 > t1);
    }
    let (p1, p4) = (tp1.prefill_time_ns(4096, 0), tp4.prefill_time_ns(4096, 0));
    assert!(p4 < p1 && p4 * 4 > p1);
}

#[test]
fn roofline_sides_are_where_expected() {
    let (hw, _, c) = setup("h200", "qwen2.5-vl-7b", 1);
    let compute = |w: moonagent_models::Work, mfu: f64| w.flops / (hw.peak_bf16_flops_per_s * mfu);
    let memory = |w: moonagent_models::Work| {
        w.hbm_bytes / (hw.hbm_bytes_per_s * hw.efficiency.hbm_efficiency)
    };
    let e = hw.efficiency;
    // Decode at batch 1 streams weights: memory-bound. At batch 512 of short contexts the
    // GEMMs are compute-bound.
    let w = c.decode_work(1, 4096);
    assert!(memory(w) > 10.0 * compute(w, e.decode_mfu));
    let w = c.decode_work(512, 512 * 64);
    assert!(compute(w, e.decode_mfu) > memory(w));
    // Prefill of a long prompt and encoding a large image are compute-bound.
    let w = c.prefill_work(4096, 0);
    assert!(compute(w, e.prefill_mfu) > 10.0 * memory(w));
    let w = c.encoder_work(&[1024]);
    assert!(compute(w, e.encoder_mfu) > 10.0 * memory(w));
    // Prefill of a handful of tokens reads all the weights for little compute.
    let w = c.prefill_work(8, 0);
    assert!(memory(w) > compute(w, e.prefill_mfu));
}

/// Representative shapes; printed with `--nocapture` for the README's sanity table.
#[test]
fn sanity_orders_of_magnitude() {
    let mut rows = Vec::new();
    for hw in ["b200", "h200", "h100"] {
        let (_, _, c) = setup(hw, "qwen2.5-vl-7b", 1);
        let decode1 = c.decode_iter_time_ns(1, 4096) as f64 / MS;
        let decode64 = c.decode_iter_time_ns(64, 64 * 2048) as f64 / MS;
        let prefill = c.prefill_time_ns(4096, 0) as f64 / MS;
        let prefill_cached = c.prefill_time_ns(512, 3584) as f64 / MS;
        let enc = c.encoder_time_ns(&[1024]) as f64 / MS;
        let enc8 = c.encoder_time_ns(&[256; 8]) as f64 / MS;
        eprintln!(
            "{hw} 7B: decode b1@4k {decode1:.2} ms, b64@2k {decode64:.2} ms; prefill 4k {prefill:.1} ms, \
             512 new after 3584 cached {prefill_cached:.1} ms; encode 1x1024 tok {enc:.2} ms, 8x256 tok {enc8:.2} ms"
        );
        rows.push((hw, decode1, prefill, enc));
    }
    for (hw, decode1, prefill, enc) in &rows {
        // Public single-stream decode for 7-8B bf16 models on Hopper is 120-250 tok/s,
        // i.e. 4-8 ms per token; B200 is faster.
        assert!((2.0..10.0).contains(decode1), "{hw} decode {decode1} ms");
        // 4k-token prefill of a 7B model: 5.7e13 FLOPs, 100-300 ms on Hopper at 30-60% MFU.
        if *hw != "b200" {
            assert!((60.0..300.0).contains(prefill), "{hw} prefill {prefill} ms");
        }
        // A 1024-token image through a 0.68B ViT: 5.6e12 FLOPs, tens of ms.
        assert!((3.0..60.0).contains(enc), "{hw} encode {enc} ms");
    }
    // B200 < H200 <= H100 on every shape.
    assert!(rows[0].1 < rows[1].1 && rows[1].1 < rows[2].1);
    assert!(rows[0].2 < rows[1].2 && rows[1].2 <= rows[2].2);
    assert!(rows[0].3 < rows[1].3 && rows[1].3 <= rows[2].3);

    for (hw, tp) in [("h200", 4u32), ("b200", 2)] {
        let (_, _, c) = setup(hw, "qwen2.5-vl-72b", tp);
        eprintln!(
            "{hw} 72B tp{tp}: decode b1@4k {:.2} ms, b64@2k {:.2} ms; prefill 4k {:.1} ms",
            c.decode_iter_time_ns(1, 4096) as f64 / MS,
            c.decode_iter_time_ns(64, 64 * 2048) as f64 / MS,
            c.prefill_time_ns(4096, 0) as f64 / MS,
        );
    }
    let (hw, model, c) = setup("cpu", "qwen2.5-vl-3b", 1);
    let px = model.pixel_bytes_per_visual_token() * 1024;
    eprintln!(
        "cpu 3B: decode b1@1k {:.1} ms; prefill 1k {:.0} ms; encode 1x1024 tok {:.0} ms; fingerprint 1024-token image ({px} B) {:.1} ms",
        c.decode_iter_time_ns(1, 1024) as f64 / MS,
        c.prefill_time_ns(1024, 0) as f64 / MS,
        c.encoder_time_ns(&[1024]) as f64 / MS,
        fingerprint_time_ns(&hw.host, px) as f64 / MS,
    );
}

/// `with_steps_scaled(s)` makes every compute step `s` times as long (to rounding) and
/// leaves links and fingerprinting alone, on a GPU profile and the CPU one.
#[test]
fn scaled_steps_take_s_times_as_long_and_nothing_else_moves() {
    for (hw_name, form) in [
        ("h200", Roofline::Max),
        ("cpu", Roofline::Max),
        ("cpu", Roofline::Sum),
    ] {
        let (mut hw, spec, _) = setup(hw_name, "qwen2.5-vl-tiny", 1);
        hw.roofline = Rooflines {
            encoder: form,
            prefill: form,
            decode: form,
        };
        let base = CostModel::new(&hw, &spec, 1).unwrap();
        for s in [0.9, 1.05, 2.0] {
            let slow = hw.with_steps_scaled(s);
            let cost = CostModel::new(&slow, &spec, 1).unwrap();
            let close = |a: u64, b: u64, what: &str| {
                let want = a as f64 * s;
                assert!(
                    (b as f64 - want).abs() <= 2.0 + 1e-9 * want,
                    "{hw_name} x{s} {what}: {a} ns became {b}, expected {want:.0}"
                );
            };
            for tokens in [64u32, 256, 1024] {
                close(
                    base.encoder_time_ns(&[tokens]),
                    cost.encoder_time_ns(&[tokens]),
                    "encode",
                );
            }
            for chunk in [(512u32, 0u32), (64, 4096), (2048, 512)] {
                close(
                    base.prefill_batch_time_ns(&[chunk]),
                    cost.prefill_batch_time_ns(&[chunk]),
                    "prefill",
                );
            }
            for (b, ctx) in [(1u32, 128u64), (8, 4096), (64, 65536)] {
                close(
                    base.decode_iter_time_ns(b, ctx),
                    cost.decode_iter_time_ns(b, ctx),
                    "decode",
                );
            }
            assert_eq!(slow.links, hw.links, "{hw_name}: links moved");
            assert_eq!(slow.host, hw.host, "{hw_name}: the host moved");
            assert_eq!(slow.shared_cores, hw.shared_cores);
        }
    }
}

/// `step_scale` multiplies each kind's step time by that kind's factor alone (to
/// rounding: within 1 + factor ns), the other kinds and links unmoved; factors of exactly 1 give the unscaled
/// times bit for bit (profiles without the table price as before).
#[test]
fn a_step_scale_multiplies_its_kind_only() {
    use moonagent_models::StepScale;
    for hw_name in ["h200", "cpu"] {
        let (hw, spec, base) = setup(hw_name, "qwen2.5-vl-tiny", 1);
        let times = |c: &CostModel| {
            [
                [64u32, 256, 1024].map(|t| c.encoder_time_ns(&[t])),
                [(512u32, 0u32), (64, 4096), (2048, 512)].map(|ch| c.prefill_batch_time_ns(&[ch])),
                [(1u32, 128u64), (8, 4096), (64, 65536)].map(|(b, x)| c.decode_iter_time_ns(b, x)),
            ]
        };
        let t0 = times(&base);
        let mut one = hw.clone();
        one.step_scale = Some(StepScale {
            encode: 1.0,
            prefill: 1.0,
            decode: 1.0,
        });
        assert_eq!(
            times(&CostModel::new(&one, &spec, 1).unwrap()),
            t0,
            "{hw_name}: x1"
        );
        for (k, f) in [(0usize, 1.37), (1, 0.8), (2, 2.5)] {
            let mut f3 = [1.0; 3];
            f3[k] = f;
            let mut hw2 = hw.clone();
            hw2.step_scale = Some(StepScale {
                encode: f3[0],
                prefill: f3[1],
                decode: f3[2],
            });
            let t = times(&CostModel::new(&hw2, &spec, 1).unwrap());
            for kind in 0..3 {
                for i in 0..3 {
                    let want = t0[kind][i] as f64 * f3[kind];
                    // The unscaled time rounds up once, the scaled one after scaling.
                    assert!(
                        (t[kind][i] as f64 - want).abs() <= 1.0 + f3[kind],
                        "{hw_name}: kind {kind} shape {i} with factors {f3:?}: {} ns, expected {want:.0}",
                        t[kind][i]
                    );
                }
            }
        }
    }
}

/// The time a kind's cost should take in `form`: compute and memory at the profile's
/// efficiencies, combined, rounded up, plus the overhead.
fn expected_ns(hw: &HardwareProfile, w: Work, mfu: f64, overhead: u64, form: Roofline) -> u64 {
    let compute = w.flops / (hw.peak_bf16_flops_per_s * mfu) * 1e9;
    let memory = w.hbm_bytes / (hw.hbm_bytes_per_s * hw.efficiency.hbm_efficiency) * 1e9;
    let t = match form {
        Roofline::Max => compute.max(memory),
        Roofline::Sum => compute + memory,
    };
    t.ceil() as u64 + overhead
}

#[test]
fn a_sum_roofline_adds_compute_and_memory_for_its_kind_only() {
    for hw_name in ["h200", "cpu"] {
        let (hw, spec, max) = setup(hw_name, "qwen2.5-vl-tiny", 1);
        let (e, o) = (hw.efficiency, hw.overheads);
        for kind in 0..3 {
            let mut sum_hw = hw.clone();
            let mut forms = Rooflines::default();
            *[&mut forms.encoder, &mut forms.prefill, &mut forms.decode][kind] = Roofline::Sum;
            sum_hw.roofline = forms;
            let cost = CostModel::new(&sum_hw, &spec, 1).unwrap();
            let close = |got: u64, want: u64, what: &str| {
                assert!(
                    got.abs_diff(want) <= 1,
                    "{hw_name}, {what} with forms {forms:?}: {got} ns, expected {want}"
                );
            };
            for tokens in [64u32, 1024] {
                let w = cost.encoder_work(&[tokens]);
                close(
                    cost.encoder_time_ns(&[tokens]),
                    expected_ns(&hw, w, e.encoder_mfu, o.encoder_batch_ns, forms.encoder),
                    "encode",
                );
            }
            for (new, cached) in [(8u32, 0u32), (2048, 512)] {
                let w = cost.prefill_work(new, cached);
                close(
                    cost.prefill_time_ns(new, cached),
                    expected_ns(&hw, w, e.prefill_mfu, o.prefill_chunk_ns, forms.prefill),
                    "prefill",
                );
            }
            for (b, ctx) in [(1u32, 128u64), (64, 65536)] {
                let w = cost.decode_work(b, ctx);
                let t = cost.decode_iter_time_ns(b, ctx);
                close(
                    t,
                    expected_ns(&hw, w, e.decode_mfu, o.decode_iter_ns, forms.decode),
                    "decode",
                );
                // Without overlap a step never takes less than with it.
                assert!(t >= max.decode_iter_time_ns(b, ctx));
            }
        }
    }
}

#[test]
fn roofline_forms_round_trip_through_a_profile_file() {
    let hw = HardwareProfile::by_name("cpu").unwrap();
    let text = hw.to_toml_string().unwrap();
    assert!(
        !text.contains("roofline"),
        "the default form is left out:\n{text}"
    );
    let mut sum = hw.clone();
    sum.roofline.decode = Roofline::Sum;
    let text = sum.to_toml_string().unwrap();
    assert!(
        text.contains("[roofline]") && text.contains("decode = \"sum\""),
        "{text}"
    );
    assert!(!text.contains("prefill = "), "{text}");
    let back = HardwareProfile::from_toml_str(&text, "test").unwrap();
    assert_eq!(back, sum);
    for (bad, needle) in [
        ("[roofline]\ndecode = \"min\"\n", "min"),
        ("[roofline]\nlm_head = \"sum\"\n", "lm_head"),
    ] {
        let err =
            HardwareProfile::from_toml_str(&format!("{}{bad}", hw.to_toml_string().unwrap()), "t")
                .unwrap_err()
                .to_string();
        assert!(err.contains(needle), "{err}");
    }
}

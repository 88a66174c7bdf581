//! Bad config gives a clear error naming the field, never a panic: unknown fields,
//! missing fields, wrong types, and impossible values each get their own test.

use moonagent_models::{CostModel, HardwareProfile, ModelError, ModelSpec};

const H200: &str = include_str!("../data/hardware/h200.toml");
const CPU: &str = include_str!("../data/hardware/cpu.toml");
const QWEN7B: &str = include_str!("../data/models/qwen2.5-vl-7b.toml");

/// `text` with the one line starting with `key =` (inside `table`, "" for the top level)
/// replaced by `key = value`.
fn set(text: &str, table: &str, key: &str, value: &str) -> String {
    let mut current = String::new();
    let mut done = false;
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            current = t.trim_matches(|c| c == '[' || c == ']').to_string();
        }
        if !done && current == table && t.split('=').next().map(str::trim) == Some(key) {
            out.push_str(&format!("{key} = {value}\n"));
            done = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(done, "no `{key}` in [{table}]");
    out
}

fn hw_err(text: &str) -> ModelError {
    HardwareProfile::from_toml_str(text, "test.toml").unwrap_err()
}

fn model_err(text: &str) -> ModelError {
    ModelSpec::from_toml_str(text, "test.toml").unwrap_err()
}

/// An `Invalid` error for exactly `field`, whose message names the field and the origin.
fn assert_invalid(err: &ModelError, field: &str) {
    assert_eq!(err.field(), Some(field), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(field) && msg.contains("test.toml"), "{msg}");
}

/// A parse error whose message mentions every one of `words`.
fn assert_parse(err: &ModelError, words: &[&str]) {
    assert!(matches!(err, ModelError::Parse { .. }), "{err:?}");
    let msg = err.to_string();
    for w in words {
        assert!(msg.contains(w), "`{w}` not in: {msg}");
    }
}

#[test]
fn unknown_top_level_field_is_named() {
    let text = format!("peak_fp8_flops_per_s = 1.0\n{H200}");
    assert_parse(
        &hw_err(&text),
        &["unknown field", "peak_fp8_flops_per_s", "test.toml"],
    );
}

#[test]
fn unknown_nested_field_is_named() {
    let text = H200.replace("[efficiency]\n", "[efficiency]\nprefil_mfu = 0.5\n");
    assert_parse(&hw_err(&text), &["unknown field", "prefil_mfu"]);
    let text = H200.replace("[links.tcp]\n", "[links.tcp]\nbandwidth = 1.0\n");
    assert_parse(&hw_err(&text), &["unknown field", "bandwidth"]);
    let text = H200.replace(
        "[links.pcie]\n",
        "[links.infiniband]\nlatency_ns = 1\n[links.pcie]\n",
    );
    assert_parse(&hw_err(&text), &["unknown field", "infiniband"]);
}

#[test]
fn missing_field_is_named() {
    let text = H200.replace("hbm_bytes_per_s = 4.8e12\n", "");
    assert_parse(&hw_err(&text), &["missing field", "hbm_bytes_per_s"]);
}

#[test]
fn wrong_type_is_named() {
    let text = set(H200, "", "hbm_capacity_bytes", "\"141 GB\"");
    assert_parse(&hw_err(&text), &["hbm_capacity_bytes"]);
}

#[test]
fn negative_overhead_is_named() {
    let text = set(H200, "overheads", "decode_iter_ns", "-5");
    assert_parse(&hw_err(&text), &["decode_iter_ns"]);
}

#[test]
fn negative_bandwidth_is_named() {
    let text = set(H200, "", "hbm_bytes_per_s", "-4.8e12");
    assert_invalid(&hw_err(&text), "hbm_bytes_per_s");
}

#[test]
fn zero_bandwidth_is_named() {
    let text = set(H200, "links.tcp", "put_bytes_per_s", "0.0");
    assert_invalid(&hw_err(&text), "links.tcp.put_bytes_per_s");
    let text = set(H200, "links.tcp", "kv_get_bytes_per_s", "0");
    assert_invalid(&hw_err(&text), "links.tcp.kv_get_bytes_per_s");
    let text = set(H200, "host", "fingerprint_bytes_per_s", "0.0");
    assert_invalid(&hw_err(&text), "host.fingerprint_bytes_per_s");
}

#[test]
fn non_finite_values_are_named() {
    let text = set(H200, "", "peak_bf16_flops_per_s", "nan");
    assert_invalid(&hw_err(&text), "peak_bf16_flops_per_s");
    let text = set(H200, "links.nvlink", "get_bytes_per_s", "inf");
    assert_invalid(&hw_err(&text), "links.nvlink.get_bytes_per_s");
}

#[test]
fn zero_capacity_is_named() {
    let text = set(H200, "", "hbm_capacity_bytes", "0");
    assert_invalid(&hw_err(&text), "hbm_capacity_bytes");
}

#[test]
fn efficiency_above_one_is_named() {
    let text = set(H200, "efficiency", "prefill_mfu", "1.5");
    let err = hw_err(&text);
    assert_invalid(&err, "efficiency.prefill_mfu");
    assert!(err.to_string().contains("(0, 1]"), "{err}");
    let text = set(H200, "efficiency", "hbm_efficiency", "1.01");
    assert_invalid(&hw_err(&text), "efficiency.hbm_efficiency");
}

#[test]
fn zero_or_negative_efficiency_is_named() {
    let text = set(H200, "efficiency", "encoder_mfu", "0.0");
    assert_invalid(&hw_err(&text), "efficiency.encoder_mfu");
    let text = set(H200, "efficiency", "decode_mfu", "-0.4");
    assert_invalid(&hw_err(&text), "efficiency.decode_mfu");
}

#[test]
fn empty_name_is_named() {
    let text = set(CPU, "", "name", "\" \"");
    assert_invalid(&hw_err(&text), "name");
}

#[test]
fn malformed_toml_says_where() {
    let err = hw_err("name = \"x\"\npeak_bf16_flops_per_s = = 3\n");
    assert_parse(&err, &["line 2"]);
}

#[test]
fn zero_layers_is_named() {
    let text = set(QWEN7B, "llm", "num_hidden_layers", "0");
    assert_invalid(&model_err(&text), "llm.num_hidden_layers");
}

#[test]
fn every_zero_count_is_named() {
    for (table, key) in [
        ("llm", "hidden_size"),
        ("llm", "num_attention_heads"),
        ("llm", "num_key_value_heads"),
        ("llm", "head_dim"),
        ("llm", "intermediate_size"),
        ("llm", "vocab_size"),
        ("vision", "depth"),
        ("vision", "hidden_size"),
        ("vision", "num_heads"),
        ("vision", "intermediate_size"),
        ("vision", "patch_size"),
        ("vision", "temporal_patch_size"),
        ("vision", "in_channels"),
        ("vision", "spatial_merge_size"),
        ("vision", "window_size"),
    ] {
        let text = set(QWEN7B, table, key, "0");
        assert_invalid(&model_err(&text), &format!("{table}.{key}"));
    }
}

#[test]
fn kv_heads_must_divide_query_heads() {
    let text = set(QWEN7B, "llm", "num_key_value_heads", "3");
    assert_invalid(&model_err(&text), "llm.num_key_value_heads");
}

#[test]
fn missing_head_dim_needs_divisible_hidden() {
    let text = QWEN7B.replace("head_dim = 128\n", "");
    assert_eq!(
        ModelSpec::from_toml_str(&text, "t").unwrap().head_dim(),
        128
    );
    let text = set(&text, "llm", "hidden_size", "3585");
    // out_hidden_size no longer matches either, but head_dim is checked first.
    assert_invalid(&model_err(&text), "llm.head_dim");
}

#[test]
fn encoder_output_width_must_match_the_llm() {
    let text = set(QWEN7B, "vision", "out_hidden_size", "2048");
    assert_invalid(&model_err(&text), "vision.out_hidden_size");
}

#[test]
fn full_attention_blocks_must_exist() {
    let text = set(QWEN7B, "vision", "fullatt_block_indexes", "[7, 15, 23, 32]");
    assert_invalid(&model_err(&text), "vision.fullatt_block_indexes[3]");
    let text = set(QWEN7B, "vision", "fullatt_block_indexes", "[7, 7]");
    assert_invalid(&model_err(&text), "vision.fullatt_block_indexes[1]");
}

#[test]
fn window_must_tile_merged_patches() {
    let text = set(QWEN7B, "vision", "window_size", "100");
    assert_invalid(&model_err(&text), "vision.window_size");
}

#[test]
fn unknown_dtype_and_model_field_are_named() {
    let text = set(QWEN7B, "", "dtype", "\"int3\"");
    assert_parse(&model_err(&text), &["int3", "dtype"]);
    let text = QWEN7B.replace("[vision]\n", "[vision]\nmrope_section = [16, 24, 24]\n");
    assert_parse(&model_err(&text), &["unknown field", "mrope_section"]);
}

#[test]
fn values_changed_in_code_are_checked_before_use() {
    let model = ModelSpec::by_name("qwen2.5-vl-7b").unwrap();
    let mut hw = HardwareProfile::by_name("h200").unwrap();
    hw.efficiency.prefill_mfu = 2.0;
    let err = hw.validate().unwrap_err();
    assert_eq!(err.field(), Some("efficiency.prefill_mfu"));
    assert!(err.to_string().contains("h200"), "{err}");
    assert_eq!(
        CostModel::new(&hw, &model, 1).unwrap_err().field(),
        Some("efficiency.prefill_mfu")
    );
    let mut bad = model.clone();
    bad.llm.num_hidden_layers = 0;
    let hw = HardwareProfile::by_name("h200").unwrap();
    assert_eq!(
        CostModel::new(&hw, &bad, 1).unwrap_err().field(),
        Some("llm.num_hidden_layers")
    );
}

#[test]
fn tensor_parallel_degree_is_checked() {
    let model = ModelSpec::by_name("qwen2.5-vl-7b").unwrap();
    let h200 = HardwareProfile::by_name("h200").unwrap();
    assert_eq!(
        CostModel::new(&h200, &model, 0).unwrap_err().field(),
        Some("tp")
    );
    // 28 heads: 3 does not divide them.
    let err = CostModel::new(&h200, &model, 3).unwrap_err();
    assert_eq!(err.field(), Some("tp"));
    assert!(err.to_string().contains("28"), "{err}");
    // 28 LLM heads but 16 ViT heads: 7 divides one and not the other.
    assert_eq!(
        CostModel::new(&h200, &model, 7).unwrap_err().field(),
        Some("tp")
    );
    for tp in [1, 2, 4] {
        CostModel::new(&h200, &model, tp).unwrap();
    }
    let cpu = HardwareProfile::by_name("cpu").unwrap();
    assert_eq!(
        CostModel::new(&cpu, &model, 2).unwrap_err().field(),
        Some("links.nvlink")
    );
    assert_eq!(
        cpu.link(moonagent_models::LinkKind::Rdma)
            .unwrap_err()
            .field(),
        Some("links.rdma")
    );
}

#[test]
fn core_weights_need_shared_cores_and_positive_values() {
    // Top-level keys first, the table last (TOML puts later keys into the table).
    let with = |shared: &str, table: &str| format!("{shared}{CPU}\n[core_weights]\n{table}");
    let (yes, no) = ("shared_cores = 2.0\n", "");
    assert_invalid(
        &hw_err(&with(no, "encode = 1.0\nprefill = 1.0\ndecode = 2.0")),
        "core_weights",
    );
    assert_invalid(
        &hw_err(&with(yes, "encode = 1.0\nprefill = 0.0\ndecode = 2.0")),
        "core_weights.prefill",
    );
    assert_parse(
        &hw_err(&with(yes, "encode = 1.0\ndecode = 2.0")),
        &["prefill"],
    );
    let ok = HardwareProfile::from_toml_str(
        &with(yes, "encode = 1.0\nprefill = 0.5\ndecode = 2.0"),
        "test.toml",
    )
    .expect("valid");
    assert_eq!(ok.core_weights.map(|w| w.as_array()), Some([1.0, 0.5, 2.0]));
}

/// `oversubscribed` slows steps sharing cores, so it needs `shared_cores`, and three
/// positive factors.
#[test]
fn oversubscribed_needs_shared_cores_and_positive_factors() {
    let with = |shared: &str, table: &str| format!("{shared}{CPU}\n[oversubscribed]\n{table}");
    let (yes, no) = ("shared_cores = 2.0\n", "");
    assert_invalid(
        &hw_err(&with(no, "encode = 1.0\nprefill = 1.0\ndecode = 1.5")),
        "oversubscribed",
    );
    assert_invalid(
        &hw_err(&with(yes, "encode = 1.0\nprefill = -1.0\ndecode = 1.5")),
        "oversubscribed.prefill",
    );
    assert_parse(
        &hw_err(&with(yes, "encode = 1.0\ndecode = 1.5")),
        &["prefill"],
    );
    let ok = HardwareProfile::from_toml_str(
        &with(yes, "encode = 1.1\nprefill = 1.0\ndecode = 1.5"),
        "test.toml",
    )
    .expect("valid");
    assert_eq!(
        ok.oversubscribed.map(|k| k.as_array()),
        Some([1.1, 1.0, 1.5])
    );
    // It round-trips through a profile file, and a profile without it writes none.
    let back = HardwareProfile::from_toml_str(&ok.to_toml_string().unwrap(), "back.toml")
        .expect("round trip");
    assert_eq!(back.oversubscribed, ok.oversubscribed);
    let none = HardwareProfile::from_toml_str(&format!("{yes}{CPU}"), "t.toml").unwrap();
    assert!(!none.to_toml_string().unwrap().contains("oversubscribed"));
}

/// `decode_contention` slows decode iterations sharing cores, so it needs
/// `shared_cores`, and two finite coefficients >= 0 (0 is no loss); the cost model's KV
/// share it scales runs from 0 (no context) toward 1.
#[test]
fn decode_contention_needs_shared_cores_and_coefficients_of_zero_or_more() {
    let with = |shared: &str, table: &str| format!("{shared}{CPU}\n[decode_contention]\n{table}");
    let (yes, no) = ("shared_cores = 2.0\n", "");
    assert_invalid(
        &hw_err(&with(no, "kv = 0.5\nencoder = 0.2")),
        "decode_contention",
    );
    assert_invalid(
        &hw_err(&with(yes, "kv = 0.5\nencoder = -0.2")),
        "decode_contention.encoder",
    );
    assert_invalid(
        &hw_err(&with(yes, "kv = nan\nencoder = 0.2")),
        "decode_contention.kv",
    );
    assert_parse(&hw_err(&with(yes, "kv = 0.5")), &["encoder"]);
    let ok = HardwareProfile::from_toml_str(&with(yes, "kv = 0.0\nencoder = 0.25"), "test.toml")
        .expect("valid");
    let c = ok.decode_contention.expect("set");
    assert_eq!(c.slow(0.5, 2), 1.5);
    let back = HardwareProfile::from_toml_str(&ok.to_toml_string().unwrap(), "back.toml")
        .expect("round trip");
    assert_eq!(back.decode_contention, ok.decode_contention);
    let none = HardwareProfile::from_toml_str(&format!("{yes}{CPU}"), "t.toml").unwrap();
    assert!(!none.to_toml_string().unwrap().contains("decode_contention"));
    let spec = moonagent_models::ModelSpec::resolve("qwen2.5-vl-tiny").unwrap();
    let cost = moonagent_models::CostModel::new(&ok, &spec, 1).unwrap();
    assert_eq!(cost.decode_kv_share(0, 100), 0.0);
    let (short, long) = (
        cost.decode_kv_share(1, 100),
        cost.decode_kv_share(8, 100_000),
    );
    assert!(0.0 < short && short < long && long < 1.0, "{short} {long}");
}

#[test]
fn a_step_scale_needs_three_positive_factors() {
    let with = |table: &str| format!("{CPU}\n[step_scale]\n{table}");
    assert_invalid(
        &hw_err(&with("encode = 1.0\nprefill = 1.0\ndecode = 0.0")),
        "step_scale.decode",
    );
    assert_invalid(
        &hw_err(&with("encode = -1.0\nprefill = 1.0\ndecode = 1.0")),
        "step_scale.encode",
    );
    assert_parse(&hw_err(&with("encode = 1.0\ndecode = 2.0")), &["prefill"]);
    let ok = HardwareProfile::from_toml_str(
        &with("encode = 1.2\nprefill = 0.9\ndecode = 1.5"),
        "test.toml",
    )
    .expect("valid");
    assert_eq!(ok.step_scale.map(|k| k.as_array()), Some([1.2, 0.9, 1.5]));
    // Written back and read again: the same profile.
    let back = HardwareProfile::from_toml_str(&ok.to_toml_string().unwrap(), "back.toml").unwrap();
    assert_eq!(back, ok);
}

/// Water-filling: the rates never exceed 1, sum to `min(cores, steps)`, keep the weights'
/// proportions among steps below full speed, and are plain processor sharing for equal
/// weights.
#[test]
fn shared_core_rates_fill_the_cores_by_weight() {
    use moonagent_models::shared_core_rates;
    let mut r = Vec::new();
    shared_core_rates(2.0, &[1.0, 1.0, 3.0], &mut r);
    assert_eq!(r, vec![0.5, 0.5, 1.0]);
    shared_core_rates(1.0, &[1.0, 3.0], &mut r);
    assert_eq!(r, vec![0.25, 0.75]);
    shared_core_rates(2.0, &[5.0, 5.0, 5.0], &mut r);
    assert_eq!(r, vec![2.0 / 3.0; 3]);
    shared_core_rates(4.0, &[1.0, 9.0], &mut r);
    assert_eq!(r, vec![1.0, 1.0]);
    shared_core_rates(2.0, &[], &mut r);
    assert!(r.is_empty());
    // Two saturate in turn: 3 cores, weights 10, 4, 1, 1 -> 10 full (10/16*3 > 1), then 4
    // full (4/6*2 > 1), then 1 core for the last two.
    shared_core_rates(3.0, &[10.0, 4.0, 1.0, 1.0], &mut r);
    assert_eq!(r, vec![1.0, 1.0, 0.5, 0.5]);
}

//! Every embedded profile and model loads, round-trips through TOML, and gives the exact
//! derived numbers of DESIGN.md's "Facts for the cost models".

use moonagent_models::{HardwareProfile, ModelError, ModelSpec};

#[test]
fn every_builtin_hardware_profile_loads_and_round_trips() {
    let names: Vec<_> = HardwareProfile::builtin_names().collect();
    assert_eq!(names, ["b200", "h200", "h100", "cpu"]);
    for hw in HardwareProfile::builtins().unwrap() {
        hw.validate().unwrap();
        let text = hw.to_toml_string().unwrap();
        let back = HardwareProfile::from_toml_str(&text, "round trip").unwrap();
        assert_eq!(back, hw, "{} changes through TOML", hw.name);
    }
}

#[test]
fn every_builtin_model_loads_and_round_trips() {
    let names: Vec<_> = ModelSpec::builtin_names().collect();
    assert_eq!(
        names,
        [
            "qwen2.5-vl-7b",
            "qwen2.5-vl-3b",
            "qwen2.5-vl-72b",
            "qwen2.5-vl-tiny"
        ]
    );
    for m in ModelSpec::builtins().unwrap() {
        m.validate().unwrap();
        let text = m.to_toml_string().unwrap();
        let back = ModelSpec::from_toml_str(&text, "round trip").unwrap();
        assert_eq!(back, m, "{} changes through TOML", m.name);
    }
}

#[test]
fn builtin_names_match_the_name_field_and_ignore_case() {
    for name in HardwareProfile::builtin_names() {
        assert_eq!(HardwareProfile::by_name(name).unwrap().name, name);
        let upper = name.to_ascii_uppercase();
        assert_eq!(HardwareProfile::by_name(&upper).unwrap().name, name);
    }
    for name in ModelSpec::builtin_names() {
        assert_eq!(ModelSpec::by_name(name).unwrap().name, name);
    }
}

#[test]
fn unknown_builtin_names_list_the_known_ones() {
    let err = HardwareProfile::by_name("a100").unwrap_err();
    assert!(matches!(err, ModelError::UnknownName { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("a100") && msg.contains("h200") && msg.contains("cpu"),
        "{msg}"
    );
    let msg = ModelSpec::by_name("llava").unwrap_err().to_string();
    assert!(
        msg.contains("llava") && msg.contains("qwen2.5-vl-7b"),
        "{msg}"
    );
}

#[test]
fn profiles_and_models_load_from_a_user_path() {
    let dir = std::env::temp_dir().join(format!("moonagent-models-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let hw = HardwareProfile::by_name("h100").unwrap();
    let hw_path = dir.join("my-h100.toml");
    std::fs::write(&hw_path, hw.to_toml_string().unwrap()).unwrap();
    assert_eq!(HardwareProfile::from_path(&hw_path).unwrap(), hw);
    let m = ModelSpec::by_name("qwen2.5-vl-72b").unwrap();
    let m_path = dir.join("my-72b.toml");
    std::fs::write(&m_path, m.to_toml_string().unwrap()).unwrap();
    assert_eq!(ModelSpec::from_path(&m_path).unwrap(), m);
    // The shipped data files themselves load from disk too.
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/data/hardware/h200.toml");
    assert_eq!(
        HardwareProfile::from_path(shipped).unwrap(),
        HardwareProfile::by_name("h200").unwrap()
    );
    let missing = dir.join("nope.toml");
    let err = HardwareProfile::from_path(&missing).unwrap_err();
    assert!(matches!(err, ModelError::Io { .. }));
    assert!(err.to_string().contains("nope.toml"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn qwen25_vl_7b_derived_facts_are_exact() {
    let m = ModelSpec::by_name("qwen2.5-vl-7b").unwrap();
    // 2 (K and V) * 28 layers * 4 KV heads * 128 head dim * 2 bytes.
    assert_eq!(m.kv_bytes_per_token(), 57_344);
    // 3584 hidden * 2 bytes.
    assert_eq!(m.encoder_output_bytes_per_token(), 7_168);
    assert_eq!(m.head_dim(), 128);
    assert_eq!(m.patches_per_visual_token(), 4);
    // (H/14)(W/14)/4.
    assert_eq!(m.visual_tokens(448, 448), 256);
    assert_eq!(m.visual_tokens(1120, 1120), 1_600);
    assert_eq!(m.visual_tokens(812, 1232), (58 * 88) / 4);
    assert_eq!(m.visual_tokens(28, 28), 1);
    // 4 patches * 3 channels * 2 frames * 14 * 14 pixels * 4 bytes (fp32).
    assert_eq!(m.pixel_bytes_per_visual_token(), 18_816);
    // The model card's 7.6B LLM (Qwen2.5-7B) and ~0.67B ViT; 8.29B in all.
    assert_eq!(m.llm_params(), 7_615_616_512);
    assert_eq!(m.vision_params(), 676_550_144);
    assert_eq!(m.vision_window_patches(), 64);
    // Seed 002's transfers are whole numbers of these units: 4,473 visual tokens of
    // encoder output and 3,600 tokens of KV.
    assert_eq!(32_062_464 % m.encoder_output_bytes_per_token(), 0);
    assert_eq!(32_062_464 / m.encoder_output_bytes_per_token(), 4_473);
    assert_eq!(206_438_400 % m.kv_bytes_per_token(), 0);
    assert_eq!(206_438_400 / m.kv_bytes_per_token(), 3_600);
}

#[test]
fn qwen25_vl_3b_and_72b_derived_facts_are_exact() {
    let m3 = ModelSpec::by_name("qwen2.5-vl-3b").unwrap();
    assert_eq!(m3.kv_bytes_per_token(), 2 * 36 * 2 * 128 * 2);
    assert_eq!(m3.encoder_output_bytes_per_token(), 4_096);
    assert_eq!(m3.llm_params(), 3_085_938_688); // Qwen2.5-3B: 3.09B, tied embeddings
    assert_eq!(m3.vision_params(), 668_684_288); // 3.75B in all
    let m72 = ModelSpec::by_name("qwen2.5-vl-72b").unwrap();
    assert_eq!(m72.kv_bytes_per_token(), 2 * 80 * 8 * 128 * 2);
    assert_eq!(m72.encoder_output_bytes_per_token(), 16_384);
    assert_eq!(m72.llm_params(), 72_706_203_648); // Qwen2.5-72B: 72.7B
    assert_eq!(m72.vision_params(), 700_147_712); // 73.4B in all
    assert_eq!(m72.llm_resident_bytes(), 145_412_407_296);
}

#[test]
fn qwen25_vl_tiny_validates_and_has_its_header_sizes() {
    let m = ModelSpec::by_name("qwen2.5-vl-tiny").unwrap();
    m.validate().unwrap();
    // 2 (K and V) * 6 layers * 2 KV heads * 32 head dim * 2 bytes (bf16).
    assert_eq!(m.kv_bytes_per_token(), 1_536);
    // 256 out_hidden * 2 bytes.
    assert_eq!(m.encoder_output_bytes_per_token(), 512);
    assert_eq!(m.patches_per_visual_token(), 4);
    // 4 patches * 3 channels * 2 frames * 14 * 14 pixels * 4 bytes (fp32).
    assert_eq!(m.pixel_bytes_per_visual_token(), 18_816);
    // Layer: q 256*256 + k,v 2*256*64 + o 256*256 + bias (256 + 2*64) + MLP 3*256*704
    // + norms 2*256 = 705,408. LLM: embedding 4096*256 + 6 layers + final norm 256
    // + untied head 4096*256 = 1,048,576 + 4,232,448 + 256 + 1,048,576.
    assert_eq!(m.llm_layer_params(), 705_408);
    assert_eq!(m.llm_params(), 6_329_856);
    // Patch embed 3*2*14*14*192 = 225,792; block: qkv 192*576 + 576, proj 192*192 + 192,
    // MLP 2*(192*512 + 512) + 512*192 + 192, norms 2*192 = 444,736; merger: norm 192,
    // 768*768 + 768, 768*256 + 256 = 787,648. 225,792 + 6*444,736 + 787,648.
    assert_eq!(m.vision_block_params(), 444_736);
    assert_eq!(m.vision_merger_params(), 787_648);
    assert_eq!(m.vision_params(), 3_681_856);
    // Windows of (112/14)^2 = 64 patches.
    assert_eq!(m.vision_window_patches(), 64);
}

#[test]
fn spec_sheet_numbers_are_the_stated_ones() {
    let h200 = HardwareProfile::by_name("h200").unwrap();
    assert_eq!(h200.peak_bf16_flops_per_s, 989e12);
    assert_eq!(h200.hbm_bytes_per_s, 4.8e12);
    assert_eq!(h200.hbm_capacity_bytes, 141_000_000_000);
    let h100 = HardwareProfile::by_name("h100").unwrap();
    assert_eq!(h100.peak_bf16_flops_per_s, 989e12);
    assert_eq!(h100.hbm_bytes_per_s, 3.35e12);
    assert_eq!(h100.hbm_capacity_bytes, 80_000_000_000);
    let b200 = HardwareProfile::by_name("b200").unwrap();
    assert_eq!(b200.peak_bf16_flops_per_s, 2.25e15);
    assert_eq!(b200.hbm_bytes_per_s, 8e12);
    assert_eq!(b200.links.nvlink.unwrap().put_bytes_per_s, 900e9);
    assert_eq!(h200.links.nvlink.unwrap().put_bytes_per_s, 450e9);
    assert_eq!(h200.links.rdma.unwrap().put_bytes_per_s, 50e9);
    // Seed 002's TCP measurements, in MiB/s.
    const MIB: f64 = 1_048_576.0;
    for hw in HardwareProfile::builtins().unwrap() {
        let tcp = hw.links.tcp.unwrap();
        assert!(
            (tcp.put_bytes_per_s / MIB - 694.414).abs() < 1e-3,
            "{}",
            hw.name
        );
        assert!(
            (tcp.get_bytes_per_s / MIB - 912.206).abs() < 1e-3,
            "{}",
            hw.name
        );
        assert!((tcp.kv_put_bytes_per_s.unwrap() / MIB - 315.887).abs() < 1e-3);
    }
    let cpu = HardwareProfile::by_name("cpu").unwrap();
    assert!(cpu.links.nvlink.is_none() && cpu.links.rdma.is_none());
}

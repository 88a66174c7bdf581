//! The simulator against closed forms: exact stage sums on an idle cluster, and the
//! M/D/1 mean queueing wait of the encoder.

use moonagent_models::{CostModel, Flow, HardwareProfile, ModelSpec};
use moonagent_sim::des::{simulate, Mode, SimConfig};
use moonagent_traces::schema::{Image, Request};

fn one_image_request(id: u64, arrival_ns: u64, visual_tokens: u32, text: u32) -> Request {
    Request {
        id,
        arrival_ns,
        session: id,
        turn: 0,
        tenant: 0,
        prompt_tokens: visual_tokens + text,
        prompt_blocks: Vec::new(),
        images: vec![Image::tokens_only(1_000_000 + id, visual_tokens)],
        output_tokens: 8,
        fork: None,
    }
}

/// One request on an idle EPD cluster: TTFT is exactly fingerprint + encode + put to the
/// store + load to prefill + prefill, each from the cost model.
#[test]
fn idle_cluster_ttft_equals_the_sum_of_modelled_stages() {
    let cfg = SimConfig {
        mode: Mode::B2,
        ..SimConfig::default()
    };
    let hw = HardwareProfile::by_name(&cfg.hardware).unwrap();
    let spec = ModelSpec::by_name(&cfg.model).unwrap();
    let cost = CostModel::new(&hw, &spec, 1).unwrap();
    let link = *hw.link(moonagent_models::LinkKind::Rdma).unwrap();
    let (tokens, text) = (1196u32, 200u32);
    let trace = vec![one_image_request(0, 5_000_000, tokens, text)];
    let (s, recs) = simulate(&cfg, &trace, 64).unwrap();
    assert_eq!(s.completed, 1);
    let bytes = u64::from(tokens) * spec.encoder_output_bytes_per_token();
    let pixels = u64::from(tokens) * spec.pixel_bytes_per_visual_token();
    let expect = moonagent_models::fingerprint_time_ns(&hw.host, pixels)
        + cost.encoder_time_ns(&[tokens])
        + moonagent_models::transfer_time_ns(&link, Flow::Put, bytes)
        + moonagent_models::transfer_time_ns(&link, Flow::Get, bytes)
        + cost.prefill_batch_time_ns(&[(tokens + text, 0)]);
    assert_eq!(
        recs[0].ttft_ns(),
        expect,
        "TTFT must be the exact sum of the stages"
    );
}

/// M/D/1: Poisson arrivals of one-image requests at one encoder with batch size 1 and a
/// deterministic service time D; the mean wait in queue is rho * D / (2 (1 - rho)).
#[test]
fn encoder_queue_matches_md1_mean_wait() {
    let tokens = 1024u32;
    let cfg = SimConfig {
        mode: Mode::B1,
        encoders: 1,
        prefills: 3,
        decodes: 4,
        encoder_max_batch_tokens: tokens,
        ..SimConfig::default()
    };
    let hw = HardwareProfile::by_name(&cfg.hardware).unwrap();
    let spec = ModelSpec::by_name(&cfg.model).unwrap();
    let d = CostModel::new(&hw, &spec, 1)
        .unwrap()
        .encoder_time_ns(&[tokens]) as f64;
    let rho = 0.7;
    let mean_gap = d / rho;
    let mut rng = moonagent_core::rng::Rng::stream(11, "md1");
    let mut t = 0.0;
    let n = 40_000;
    let trace: Vec<Request> = (0..n)
        .map(|i| {
            t += rng.exp(mean_gap);
            one_image_request(i, t as u64, tokens, 16)
        })
        .collect();
    let (s, recs) = simulate(&cfg, &trace, 64).unwrap();
    assert_eq!(s.completed, n);
    let fp = moonagent_models::fingerprint_time_ns(
        &hw.host,
        u64::from(tokens) * spec.pixel_bytes_per_visual_token(),
    ) as f64;
    // Skip the first 5% (warm-up from an empty queue).
    let waits: Vec<f64> = recs[(n as usize / 20)..]
        .iter()
        .map(|r| (r.encode_start_ns - r.arrival_ns) as f64 - fp)
        .collect();
    let measured = waits.iter().sum::<f64>() / waits.len() as f64;
    let textbook = rho * d / (2.0 * (1.0 - rho));
    let err = (measured - textbook).abs() / textbook;
    assert!(
        err < 0.05,
        "M/D/1 mean wait: measured {measured:.0} ns, textbook {textbook:.0} ns, error {:.1}%",
        100.0 * err
    );
}

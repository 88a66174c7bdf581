//! Round trip JSONL -> Parquet -> JSONL is lossless, byte for byte.

use moonagent_traces::gen::{Generated, GeneratorKind};
use moonagent_traces::{qwen25vl_grid, Fork, Image, Request, TraceHeader};
use proptest::prelude::*;

use crate::common::*;

fn image() -> impl Strategy<Value = Image> {
    prop_oneof![
        // Tokens only.
        (any::<u64>(), 1u32..3000).prop_map(|(id, v)| Image::tokens_only(id, v)),
        // Pixel size with Qwen grid.
        (any::<u64>(), 28u32..2000, 28u32..2000)
            .prop_filter_map("processable", |(id, w, h)| Image::qwen25vl(id, w, h)),
        // Grid without pixel size.
        (any::<u64>(), 1u32..3, 1u32..40, 1u32..40).prop_map(|(id, t, h, w)| Image {
            content_id: id,
            width: None,
            height: None,
            visual_tokens: t * h * w,
            grid_thw: Some([t, 2 * h, 2 * w]),
        }),
        // Pixel size without grid.
        (any::<u64>(), 1u32..5000, 1u32..5000, 1u32..3000).prop_map(|(id, w, h, v)| Image {
            content_id: id,
            width: Some(w),
            height: Some(h),
            visual_tokens: v,
            grid_thw: None,
        }),
    ]
}

fn request(block: u32) -> impl Strategy<Value = (u64, Request)> {
    (
        0u64..5_000_000_000,
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        0u32..20_000,
        any::<bool>(),
        proptest::collection::vec(image(), 0..4),
        any::<u32>(),
        proptest::option::of(proptest::collection::vec(any::<u32>(), 1..6)),
        any::<u64>(),
    )
        .prop_map(
            move |(gap, id, session, turn, tenant, text, with_blocks, images, out, fork, salt)| {
                let visual: u32 = images.iter().map(|i| i.visual_tokens).sum();
                let prompt = text + visual;
                let n = u64::from(prompt).div_ceil(u64::from(block));
                let prompt_blocks = if with_blocks {
                    (0..n).map(|i| salt.wrapping_add(i % 3)).collect()
                } else {
                    Vec::new()
                };
                let fork = fork.map(|o| Fork {
                    branches: o.len() as u32,
                    output_tokens: o,
                });
                (
                    gap,
                    Request {
                        id,
                        arrival_ns: 0,
                        session,
                        turn,
                        tenant,
                        prompt_tokens: prompt,
                        prompt_blocks,
                        images,
                        output_tokens: out,
                        fork,
                    },
                )
            },
        )
}

fn trace() -> impl Strategy<Value = (TraceHeader, Vec<Request>)> {
    prop_oneof![Just(1u32), Just(16), Just(64), Just(512)].prop_flat_map(|block| {
        (
            proptest::option::of(any::<u64>()),
            proptest::option::of("[a-z ]{0,12}"),
            proptest::collection::vec(request(block), 0..40),
        )
            .prop_map(move |(seed, source, reqs)| {
                let mut h = TraceHeader::new("prop", block);
                h.seed = seed;
                h.source = source;
                let mut t = 0u64;
                let reqs = reqs
                    .into_iter()
                    .map(|(gap, mut r)| {
                        t += gap;
                        r.arrival_ns = t;
                        r
                    })
                    .collect();
                (h, reqs)
            })
    })
}

fn assert_round_trip(header: &TraceHeader, reqs: &[Request]) {
    let a = to_jsonl(header, reqs);
    let (h1, r1) = read_jsonl(&a).expect("read jsonl");
    assert_eq!(&h1, header);
    assert_eq!(r1, reqs);
    let p = to_parquet(&h1, &r1);
    let (h2, r2) = read_parquet(p).expect("read parquet");
    assert_eq!(h2, h1);
    assert_eq!(r2, r1);
    let b = to_jsonl(&h2, &r2);
    assert_eq!(a, b, "JSONL -> Parquet -> JSONL changed bytes");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_traces_round_trip_losslessly((header, reqs) in trace()) {
        assert_round_trip(&header, &reqs);
    }

    #[test]
    fn generated_traces_round_trip_losslessly(kind in 0usize..5, seed in any::<u64>(), n in 1u64..300) {
        let kinds = [GeneratorKind::W1, GeneratorKind::W2, GeneratorKind::W3, GeneratorKind::W4, GeneratorKind::Sessions];
        let kind = kinds[kind];
        let sets = if kind == GeneratorKind::Sessions {
            vec![("sessions".to_string(), (n / 10 + 1).to_string())]
        } else {
            vec![("requests".to_string(), n.to_string())]
        };
        let g = Generated::new(kind, None, &sets, seed).expect("generator");
        let header = g.header.clone();
        let reqs: Vec<Request> = g.requests.collect::<Result<_, _>>().expect("requests");
        assert_round_trip(&header, &reqs);
    }
}

#[test]
fn round_trip_spans_several_batches_and_row_groups() {
    // 70k requests: more than one 64k row group and many 8k batches.
    let g = Generated::new(
        GeneratorKind::W1,
        None,
        &[("requests".into(), "70000".into())],
        5,
    )
    .expect("generator");
    let header = g.header.clone();
    let reqs: Vec<Request> = g.requests.collect::<Result<_, _>>().expect("requests");
    assert_round_trip(&header, &reqs);
}

#[test]
fn jsonl_visual_tokens_may_be_derived_from_grid_or_pixels() {
    let text = concat!(
        r#"{"header":{"schema_version":1,"block_size_tokens":16,"generator":"hand"}}"#,
        "\n",
        r#"{"id":0,"arrival_ns":0,"prompt_tokens":300,"output_tokens":1,"images":[{"content_id":1,"width":448,"height":448}]}"#,
        "\n",
        r#"{"id":1,"arrival_ns":5,"prompt_tokens":300,"output_tokens":1,"images":[{"content_id":1,"grid_thw":[1,32,32]}]}"#,
        "\n",
    );
    let (_, reqs) = read_jsonl(text.as_bytes()).expect("valid");
    assert_eq!(reqs[0].images[0].visual_tokens, 256);
    assert_eq!(reqs[1].images[0].visual_tokens, 256);
    assert_eq!(qwen25vl_grid(448, 448), Some([1, 32, 32]));
}

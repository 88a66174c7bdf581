//! The two Mooncake FAST'25 traces import with exact counts, a block-count check on every
//! record, and the averages of the shared folder's README. Needs `MOONAGENT_TRACES`.

use moonagent_traces::import::mooncake::MooncakeImport;
use moonagent_traces::import::AttachImages;
use moonagent_traces::schema::blocks_for_tokens;
use moonagent_traces::stats::{compute, StatsConfig};
use moonagent_traces::{shared_traces_dir, Request};

struct Expect {
    file: &'static str,
    requests: u64,
    avg_input: u64,
    avg_output: u64,
    unique_hashes: u64,
}

const TRACES: [Expect; 2] = [
    Expect {
        file: "conversation_trace.jsonl",
        requests: 12_031,
        avg_input: 12_035,
        avg_output: 343,
        unique_hashes: 182_790,
    },
    Expect {
        file: "synthetic_trace.jsonl",
        requests: 3_993,
        avg_input: 15_325,
        avg_output: 149,
        unique_hashes: 43_924,
    },
];

#[test]
fn mooncake_traces_import_exactly_and_stats_match_readme() {
    let Some(dir) = shared_traces_dir("mooncake") else {
        return;
    };
    for t in TRACES {
        let imp = MooncakeImport::open(dir.join(t.file), None).expect("open");
        let header = imp.header().clone();
        assert_eq!(header.block_size_tokens, 512);
        let mut n = 0u64;
        let checked = imp.inspect(|r| {
            if let Ok(r) = r {
                n += 1;
                // The importer checks this itself; check it again on every record here.
                assert_eq!(
                    r.prompt_blocks.len() as u64,
                    blocks_for_tokens(r.prompt_tokens, 512),
                    "{} id {}",
                    t.file,
                    r.id
                );
            }
        });
        let s = compute(&header, checked, StatsConfig::default()).expect("import");
        assert_eq!(n, t.requests, "{}", t.file);
        assert_eq!(s.requests, t.requests, "{}", t.file);
        assert_eq!(
            s.prompt_tokens.mean.round() as u64,
            t.avg_input,
            "{}",
            t.file
        );
        assert_eq!(
            s.output_tokens.mean.round() as u64,
            t.avg_output,
            "{}",
            t.file
        );
        assert_eq!(s.blocks.unique, t.unique_hashes, "{}", t.file);
        // Timestamps are ms: the last arrival is an exact multiple of 1 ms.
        assert_eq!((s.last_arrival_s * 1e9).round() as u64 % 1_000_000, 0);
    }
}

#[test]
fn mooncake_with_attached_images_keeps_prompts_exact() {
    let Some(dir) = shared_traces_dir("mooncake") else {
        return;
    };
    let attach = AttachImages {
        seed: 3,
        ..AttachImages::default()
    };
    let plain: Vec<Request> = MooncakeImport::open(dir.join("synthetic_trace.jsonl"), None)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let imp = MooncakeImport::open(dir.join("synthetic_trace.jsonl"), Some(attach)).unwrap();
    assert!(imp
        .header()
        .notes
        .as_deref()
        .unwrap_or("")
        .contains("seed 3"));
    let with: Vec<Request> = imp.collect::<Result<_, _>>().unwrap();
    assert_eq!(plain.len(), with.len());
    let mut images = 0;
    for (a, b) in plain.iter().zip(&with) {
        assert_eq!(
            (
                a.arrival_ns,
                a.prompt_tokens,
                &a.prompt_blocks,
                a.output_tokens
            ),
            (
                b.arrival_ns,
                b.prompt_tokens,
                &b.prompt_blocks,
                b.output_tokens
            )
        );
        assert!(b.visual_tokens() <= u64::from(b.prompt_tokens));
        images += b.images.len();
    }
    assert!(
        images > with.len(),
        "expected about 2.5 images per request, got {images}"
    );
}

//! Arbitrary bytes to every reader and importer: errors are fine, panics are not.

use std::path::Path;

use moonagent_traces::gen::dist::parse_py_dict;
use moonagent_traces::gen::servegen::{parse_dataset_json, parse_trace_csv, UnknownDist};
use moonagent_traces::gen::{Generated, GeneratorKind};
use moonagent_traces::import::azure::{AzureImport, AzureKind};
use moonagent_traces::import::mooncake::MooncakeImport;
use moonagent_traces::jsonl::JsonlReader;
use moonagent_traces::parquet_io::ParquetReader;
use moonagent_traces::Request;
use proptest::prelude::*;

use crate::common::*;

fn drain<I: Iterator<Item = Result<Request, moonagent_traces::TraceError>>>(it: I) {
    // Bounded: a reader must end (after its first error at the latest).
    for (i, r) in it.enumerate() {
        if r.is_err() || i > 100_000 {
            break;
        }
    }
}

fn sample_parquet() -> Vec<u8> {
    let g = Generated::new(
        GeneratorKind::W4,
        None,
        &[("requests".into(), "50".into())],
        9,
    )
    .unwrap();
    let h = g.header.clone();
    let reqs: Vec<Request> = g.requests.collect::<Result<_, _>>().unwrap();
    to_parquet(&h, &reqs)
}

fn sample_jsonl() -> Vec<u8> {
    let g = Generated::new(
        GeneratorKind::W3,
        None,
        &[("requests".into(), "20".into())],
        9,
    )
    .unwrap();
    let h = g.header.clone();
    let reqs: Vec<Request> = g.requests.collect::<Result<_, _>>().unwrap();
    to_jsonl(&h, &reqs)
}

/// Bytes that look like a trace line more often than uniform noise does.
fn jsonish() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        "[{}\\[\\]\":,0-9a-z_ \n-]{0,300}".prop_map(String::into_bytes),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn jsonl_reader_never_panics(body in jsonish(), with_header in any::<bool>()) {
        let mut bytes = Vec::new();
        if with_header {
            bytes.extend_from_slice(br#"{"header":{"schema_version":1,"block_size_tokens":16,"generator":"f"}}"#);
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(&body);
        if let Ok(r) = JsonlReader::from_reader(&bytes[..], "f.jsonl") {
            drain(r);
        }
    }

    #[test]
    fn jsonl_reader_never_panics_on_mutated_traces(pos in any::<prop::sample::Index>(), byte in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let mut bytes = sample_jsonl();
        let i = pos.index(bytes.len());
        bytes[i] = byte;
        bytes.truncate(cut.index(bytes.len()) + 1);
        if let Ok(r) = JsonlReader::from_reader(&bytes[..], "f.jsonl") {
            drain(r);
        }
    }

    #[test]
    fn mooncake_importer_never_panics(body in jsonish()) {
        if let Ok(r) = MooncakeImport::from_reader(&body[..], "f.jsonl", None) {
            drain(r);
        }
    }

    #[test]
    fn azure_importers_never_panic(body in "[0-9:. ,TZa-zA-Z+-]{0,200}\n?[0-9:. ,-]{0,200}", mm in any::<bool>()) {
        let header = if mm { "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n" } else { "TIMESTAMP,ContextTokens,GeneratedTokens\n" };
        let kind = if mm { AzureKind::Multimodal } else { AzureKind::Llm };
        for text in [body.clone(), format!("{header}{body}")] {
            if let Ok(r) = AzureImport::from_reader(text.as_bytes(), "f.csv", kind, None) {
                drain(r);
            }
        }
    }

    #[test]
    fn azure_importers_never_panic_on_bytes(body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut text = b"TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n".to_vec();
        text.extend_from_slice(&body);
        if let Ok(r) = AzureImport::from_reader(&text[..], "f.csv", AzureKind::Multimodal, None) {
            drain(r);
        }
    }

    #[test]
    fn servegen_parsers_never_panic(csv in "[0-9.,a-zA-Z\n]{0,200}", json in jsonish(), dict in "[{}0-9.:, e-]{0,80}") {
        let _ = parse_trace_csv(&csv, Path::new("t.csv"), UnknownDist::Error);
        let _ = parse_dataset_json(&String::from_utf8_lossy(&json), Path::new("d.json"));
        let _ = parse_py_dict(&dict);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn parquet_reader_never_panics_on_bytes(body in proptest::collection::vec(any::<u8>(), 0..2048), magic in any::<bool>()) {
        let mut bytes = body;
        if magic {
            bytes.splice(0..0, *b"PAR1");
            bytes.extend_from_slice(b"PAR1");
        }
        if let Ok(r) = ParquetReader::from_bytes(bytes, "f.parquet") {
            drain(r);
        }
    }

    #[test]
    fn parquet_reader_never_panics_on_mutated_files(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8), cut in proptest::option::of(any::<prop::sample::Index>())) {
        let mut bytes = sample_parquet();
        for (pos, byte) in edits {
            let i = pos.index(bytes.len());
            bytes[i] = byte;
        }
        if let Some(c) = cut {
            bytes.truncate(c.index(bytes.len()));
        }
        if let Ok(r) = ParquetReader::from_bytes(bytes, "f.parquet") {
            drain(r);
        }
    }
}

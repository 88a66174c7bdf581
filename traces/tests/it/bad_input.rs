//! Bad input gives an error naming the file, the line (or row) and the field, and what
//! was expected; never a panic.

use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use moonagent_traces::import::azure::{AzureImport, AzureKind};
use moonagent_traces::import::mooncake::MooncakeImport;
use moonagent_traces::parquet_io::{ParquetReader, HEADER_KEY};
use moonagent_traces::{Location, Request, TraceError, TraceHeader};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;

use crate::common::*;

const HEADER: &str = r#"{"header":{"schema_version":1,"block_size_tokens":16,"generator":"hand"}}"#;
const GOOD: &str = r#"{"id":0,"arrival_ns":10,"prompt_tokens":20,"output_tokens":3}"#;

fn lines(ls: &[&str]) -> Vec<u8> {
    let mut s = ls.join("\n");
    s.push('\n');
    s.into_bytes()
}

/// Assert the error names the file, the location, the field, and says `expect`.
fn check(e: &TraceError, file: &str, at: Location, field: &str, expect: &str) {
    let msg = e.to_string();
    assert!(msg.contains(file), "{msg:?} should name {file}");
    assert_eq!(e.location(), Some(at), "{msg}");
    assert_eq!(e.field(), Some(field), "{msg}");
    assert!(msg.contains(expect), "{msg:?} should say {expect:?}");
}

#[test]
fn jsonl_truncated_line() {
    let e = jsonl_error(&lines(&[
        HEADER,
        GOOD,
        r#"{"id":1,"arrival_ns":12,"prompt_tok"#,
    ]));
    let msg = e.to_string();
    assert!(msg.contains("mem.jsonl: line 3"), "{msg}");
    assert!(msg.contains("truncated"), "{msg}");
    // A truncated last line without a newline is the same error.
    let mut bytes = lines(&[HEADER, GOOD]);
    bytes.extend_from_slice(br#"{"id":1,"arrival_ns":12,"prompt_tokens":2"#);
    let e = jsonl_error(&bytes);
    check(
        &e,
        "mem.jsonl",
        Location::Line(3),
        "prompt_tokens",
        "truncated",
    );
}

#[test]
fn jsonl_wrong_type() {
    let e = jsonl_error(&lines(&[
        HEADER,
        r#"{"id":0,"arrival_ns":10,"prompt_tokens":"many","output_tokens":3}"#,
    ]));
    check(
        &e,
        "mem.jsonl",
        Location::Line(2),
        "prompt_tokens",
        "expected u32",
    );
    let e = jsonl_error(&lines(&[
        HEADER,
        r#"{"id":0,"arrival_ns":10,"prompt_tokens":300,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":"x"}]}"#,
    ]));
    check(
        &e,
        "mem.jsonl",
        Location::Line(2),
        "images[0].visual_tokens",
        "expected u32",
    );
}

#[test]
fn jsonl_negative_length() {
    let e = jsonl_error(&lines(&[
        HEADER,
        GOOD,
        r#"{"id":1,"arrival_ns":11,"prompt_tokens":20,"output_tokens":-5}"#,
    ]));
    check(
        &e,
        "mem.jsonl",
        Location::Line(3),
        "output_tokens",
        "expected u32",
    );
    assert!(e.to_string().contains("-5"));
}

#[test]
fn jsonl_timestamps_out_of_order() {
    let e = jsonl_error(&lines(&[
        HEADER,
        GOOD,
        r#"{"id":1,"arrival_ns":5,"prompt_tokens":20,"output_tokens":3}"#,
    ]));
    check(
        &e,
        "mem.jsonl",
        Location::Line(3),
        "arrival_ns",
        "expected non-decreasing",
    );
}

#[test]
fn jsonl_unknown_schema_version() {
    let e = jsonl_error(&lines(&[
        r#"{"header":{"schema_version":2,"block_size_tokens":16,"generator":"x","new_field":1}}"#,
        GOOD,
    ]));
    check(
        &e,
        "mem.jsonl",
        Location::Line(1),
        "header.schema_version",
        "expected 1",
    );
}

#[test]
fn jsonl_empty_file() {
    let e = jsonl_error(b"");
    check(&e, "mem.jsonl", Location::Line(1), "header", "empty");
    let e = jsonl_error(b"\n\n");
    check(&e, "mem.jsonl", Location::Line(1), "header", "empty");
}

#[test]
fn jsonl_schema_rules() {
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":20,"prompt_blocks":[1],"output_tokens":3}"#,
            "prompt_blocks",
            "expected ceil(20/16) = 2",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":300,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":10,"grid_thw":[1,4,4]}]}"#,
            "images[0].visual_tokens",
            "expected them to agree",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":300,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":4,"grid_thw":[1,3,4]}]}"#,
            "images[0].grid_thw",
            "divisible by 2",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":10}]}"#,
            "images",
            "expected prompt_tokens >=",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"fork":{"branches":3,"output_tokens":[1,2]}}"#,
            "fork.output_tokens",
            "expected one per branch",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"fork":{"branches":0,"output_tokens":[]}}"#,
            "fork.branches",
            "expected at least 1",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"colour":1}"#,
            "colour",
            "unknown field",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"output_tokens":3}"#,
            "prompt_tokens",
            "missing field",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":0}]}"#,
            "images[0].visual_tokens",
            "expected at least 1 visual token, found 0",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":1},{"content_id":2,"visual_tokens":0}]}"#,
            "images[1].visual_tokens",
            "expected at least 1 visual token, found 0",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":1,"width":0,"height":28}]}"#,
            "images[0].width",
            "expected a positive pixel size, found 0",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":1,"width":28,"height":0}]}"#,
            "images[0].width",
            "expected a positive pixel size, found 0",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":1,"width":28}]}"#,
            "images[0].height",
            "width and height must be given together",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":300,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":4,"grid_thw":[0,4,4]}]}"#,
            "images[0].grid_thw",
            "expected positive t, h, w",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":17,"prompt_blocks":[1],"output_tokens":3}"#,
            "prompt_blocks",
            "expected ceil(17/16) = 2",
        ),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":4,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":5}]}"#,
            "images",
            "expected prompt_tokens >= the sum of visual_tokens",
        ),
        (r#"[1,2,3]"#, "(record)", "expected struct Request"),
        (
            r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3} x"#,
            "(record)",
            "expected valid JSON",
        ),
    ];
    for (line, field, expect) in cases {
        let e = jsonl_error(&lines(&[HEADER, line]));
        check(&e, "mem.jsonl", Location::Line(2), field, expect);
    }
}

/// Each zero and bound of the schema alone on an otherwise valid request is rejected, and
/// the bound itself is accepted (so the check is `>= 1` / `<=`, not something stricter).
#[test]
fn jsonl_schema_bounds_accept_the_edge_and_reject_one_past_it() {
    let ok: &[&str] = &[
        r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":1}]}"#,
        r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"images":[{"content_id":1,"visual_tokens":5}]}"#,
        r#"{"id":0,"arrival_ns":1,"prompt_tokens":16,"prompt_blocks":[1],"output_tokens":3}"#,
        r#"{"id":0,"arrival_ns":1,"prompt_tokens":5,"output_tokens":3,"fork":{"branches":1,"output_tokens":[2]}}"#,
    ];
    for line in ok {
        let (_, reqs) =
            read_jsonl(&lines(&[HEADER, line])).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(reqs.len(), 1);
    }
    // Equal arrivals are in order; one ns earlier is not.
    let same = r#"{"id":1,"arrival_ns":10,"prompt_tokens":20,"output_tokens":3}"#;
    assert!(read_jsonl(&lines(&[HEADER, GOOD, same])).is_ok());
    let early = r#"{"id":1,"arrival_ns":9,"prompt_tokens":20,"output_tokens":3}"#;
    let e = jsonl_error(&lines(&[HEADER, GOOD, early]));
    check(
        &e,
        "mem.jsonl",
        Location::Line(3),
        "arrival_ns",
        "expected non-decreasing",
    );
}

#[test]
fn jsonl_header_zero_sizes_are_rejected_naming_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            r#"{"header":{"schema_version":1,"block_size_tokens":0,"generator":"hand"}}"#,
            "header.block_size_tokens",
            "expected a block size of at least 1 token, found 0",
        ),
        (
            r#"{"header":{"schema_version":1,"block_size_tokens":16,"patch_size":0,"generator":"hand"}}"#,
            "header.patch_size",
            "expected at least 1 pixel, found 0",
        ),
        (
            r#"{"header":{"schema_version":1,"block_size_tokens":16,"spatial_merge":0,"generator":"hand"}}"#,
            "header.spatial_merge",
            "expected at least 1, found 0",
        ),
    ];
    for (header, field, expect) in cases {
        let e = jsonl_error(&lines(&[header, GOOD]));
        check(&e, "mem.jsonl", Location::Line(1), field, expect);
    }
    // One is the smallest valid size of each.
    let one = r#"{"header":{"schema_version":1,"block_size_tokens":1,"patch_size":1,"spatial_merge":1,"generator":"hand"}}"#;
    assert!(read_jsonl(&lines(&[one, GOOD])).is_ok());
}

#[test]
fn reader_stops_after_first_error() {
    let bytes = lines(&[HEADER, GOOD, "{", GOOD]);
    let r = moonagent_traces::jsonl::JsonlReader::from_reader(&bytes[..], "mem.jsonl").unwrap();
    let items: Vec<_> = r.collect();
    assert_eq!(items.len(), 2);
    assert!(items[0].is_ok() && items[1].is_err());
}

fn good_requests() -> (TraceHeader, Vec<Request>) {
    let h = header();
    let reqs = (0..5)
        .map(|i| Request {
            id: i,
            arrival_ns: 100 * i,
            session: 0,
            turn: i as u32,
            tenant: 0,
            prompt_tokens: 20,
            prompt_blocks: vec![1, 2],
            images: vec![],
            output_tokens: 3,
            fork: None,
        })
        .collect();
    (h, reqs)
}

/// Rewrite a valid Parquet trace through arrow with `edit` applied to each batch and the
/// header metadata replaced by `header_json`.
fn rewrite(
    bytes: Vec<u8>,
    header_json: &str,
    edit: impl Fn(RecordBatch) -> RecordBatch,
) -> Vec<u8> {
    let b = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes)).unwrap();
    let reader = b.build().unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| edit(b.unwrap())).collect();
    let props = WriterProperties::builder()
        .set_key_value_metadata(Some(vec![KeyValue::new(
            HEADER_KEY.to_string(),
            header_json.to_string(),
        )]))
        .build();
    let mut w = ArrowWriter::try_new(Vec::new(), batches[0].schema(), Some(props)).unwrap();
    for b in &batches {
        w.write(b).unwrap();
    }
    w.into_inner().unwrap()
}

fn replace_column(b: RecordBatch, name: &str, col: ArrayRef) -> RecordBatch {
    let schema = b.schema();
    let idx = schema.index_of(name).unwrap();
    let mut fields: Vec<_> = schema.fields().iter().cloned().collect();
    fields[idx] = Arc::new(arrow_schema::Field::new(
        name,
        col.data_type().clone(),
        false,
    ));
    let mut cols = b.columns().to_vec();
    cols[idx] = col;
    RecordBatch::try_new(Arc::new(arrow_schema::Schema::new(fields)), cols).unwrap()
}

fn parquet_error(bytes: Vec<u8>) -> TraceError {
    match read_parquet(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn parquet_empty_and_truncated_files() {
    let e = parquet_error(Vec::new());
    check(
        &e,
        "mem.parquet",
        Location::File,
        "(parquet)",
        "expected a Parquet trace file",
    );
    let (h, reqs) = good_requests();
    let full = to_parquet(&h, &reqs);
    for cut in [4, full.len() / 2, full.len() - 1] {
        let e = parquet_error(full[..cut].to_vec());
        assert!(e.to_string().contains("mem.parquet"), "{e}");
    }
}

#[test]
fn parquet_unknown_schema_version_and_missing_header() {
    let (h, reqs) = good_requests();
    let full = to_parquet(&h, &reqs);
    let bad = rewrite(
        full.clone(),
        r#"{"schema_version":7,"block_size_tokens":16,"generator":"x"}"#,
        |b| b,
    );
    let e = parquet_error(bad);
    check(
        &e,
        "mem.parquet",
        Location::File,
        "header.schema_version",
        "expected 1",
    );
    let bad = rewrite(
        full,
        r#"{"schema_version":1,"block_size_tokens":"big","generator":"x"}"#,
        |b| b,
    );
    let e = parquet_error(bad);
    check(
        &e,
        "mem.parquet",
        Location::File,
        "header.block_size_tokens",
        "expected u32",
    );
}

#[test]
fn parquet_timestamps_out_of_order() {
    let (h, reqs) = good_requests();
    let hj = serde_json::to_string(&h).unwrap();
    let bad = rewrite(to_parquet(&h, &reqs), &hj, |b| {
        let col: ArrayRef = Arc::new(UInt64Array::from(vec![0u64, 100, 50, 300, 400]));
        replace_column(b, "arrival_ns", col)
    });
    let e = parquet_error(bad);
    check(
        &e,
        "mem.parquet",
        Location::Row(3),
        "arrival_ns",
        "expected non-decreasing",
    );
}

#[test]
fn parquet_wrong_type_and_negative_length() {
    let (h, reqs) = good_requests();
    let hj = serde_json::to_string(&h).unwrap();
    let bad = rewrite(to_parquet(&h, &reqs), &hj, |b| {
        let col: ArrayRef = Arc::new(StringArray::from(vec!["a"; 5]));
        replace_column(b, "prompt_tokens", col)
    });
    let e = parquet_error(bad);
    check(
        &e,
        "mem.parquet",
        Location::File,
        "prompt_tokens",
        "expected UInt32",
    );
    let bad = rewrite(to_parquet(&h, &reqs), &hj, |b| {
        let col: ArrayRef = Arc::new(arrow_array::Int32Array::from(vec![-5; 5]));
        replace_column(b, "output_tokens", col)
    });
    let e = parquet_error(bad);
    check(
        &e,
        "mem.parquet",
        Location::File,
        "output_tokens",
        "expected UInt32",
    );
}

#[test]
fn parquet_rows_are_validated() {
    let (h, reqs) = good_requests();
    let hj = serde_json::to_string(&h).unwrap();
    let bad = rewrite(to_parquet(&h, &reqs), &hj, |b| {
        let col: ArrayRef = Arc::new(arrow_array::UInt32Array::from(vec![20, 20, 20, 20, 99]));
        replace_column(b, "prompt_tokens", col)
    });
    let e = parquet_error(bad);
    check(
        &e,
        "mem.parquet",
        Location::Row(5),
        "prompt_blocks",
        "expected ceil(99/16) = 7",
    );
}

#[test]
fn open_names_missing_files_and_unknown_extensions() {
    let e = match moonagent_traces::TraceReader::open("/nonexistent/x.jsonl") {
        Err(e) => e,
        Ok(_) => panic!("expected an error"),
    };
    assert!(e.to_string().contains("/nonexistent/x.jsonl"));
    let e = match moonagent_traces::TraceWriter::create("/tmp/x.csv", &header()) {
        Err(e) => e,
        Ok(_) => panic!("expected an error"),
    };
    assert!(e.to_string().contains(".jsonl or .parquet"));
}

fn mooncake_error(text: &str) -> TraceError {
    let imp = MooncakeImport::from_reader(text.as_bytes(), "mc.jsonl", None).unwrap();
    match imp.collect::<Result<Vec<_>, _>>() {
        Ok(_) => panic!("expected an error for {text:?}"),
        Err(e) => e,
    }
}

#[test]
fn mooncake_bad_records() {
    let ok = r#"{"timestamp": 5, "input_length": 513, "output_length": 3, "hash_ids": [1, 2]}"#;
    let cases: &[(&str, Location, &str, &str)] = &[
        (
            r#"{"timestamp": 5, "input_length": 513, "output_length": 3, "hash_ids": [1]}"#,
            Location::Line(2),
            "hash_ids",
            "expected ceil(513/512) = 2",
        ),
        (
            r#"{"timestamp": 5, "input_length": -1, "output_length": 3, "hash_ids": []}"#,
            Location::Line(2),
            "input_length",
            "expected u32",
        ),
        (
            r#"{"timestamp": 1, "input_length": 1, "output_length": 3, "hash_ids": [1]}"#,
            Location::Line(2),
            "timestamp",
            "expected non-decreasing",
        ),
        (
            r#"{"timestamp": -3, "input_length": 1, "output_length": 3, "hash_ids": [1]}"#,
            Location::Line(2),
            "timestamp",
            "expected non-negative",
        ),
        (
            r#"{"timestamp": 5, "input_length": 1, "output_length": "x", "hash_ids": [1]}"#,
            Location::Line(2),
            "output_length",
            "expected u32",
        ),
        (
            r#"{"timestamp": 5, "input_length": 1, "output_length": 3, "hash_ids": [1"#,
            Location::Line(2),
            "hash_ids",
            "truncated",
        ),
        (
            r#"{"timestamp": 5, "input_length": 1, "output_length": 3}"#,
            Location::Line(2),
            "hash_ids",
            "missing field",
        ),
    ];
    for (line, at, field, expect) in cases {
        let e = mooncake_error(&format!("{ok}\n{line}\n"));
        check(&e, "mc.jsonl", *at, field, expect);
    }
    let e = mooncake_error("");
    check(&e, "mc.jsonl", Location::Line(1), "(record)", "no records");
}

fn azure_error(kind: AzureKind, text: &str) -> TraceError {
    let imp = match AzureImport::from_reader(text.as_bytes(), "az.csv", kind, None) {
        Ok(i) => i,
        Err(e) => return e,
    };
    match imp.collect::<Result<Vec<_>, _>>() {
        Ok(_) => panic!("expected an error for {text:?}"),
        Err(e) => e,
    }
}

#[test]
fn azure_bad_rows() {
    let h = "TIMESTAMP,ContextTokens,GeneratedTokens";
    let ok = "2023-11-16 18:15:46.6805900,374,44";
    let cases: &[(&str, Location, &str, &str)] = &[
        (
            "2023-11-16 18:15:47.0000000,-5,44",
            Location::Line(3),
            "ContextTokens",
            "negative length -5",
        ),
        (
            "2023-11-16 18:15:47.0000000,abc,44",
            Location::Line(3),
            "ContextTokens",
            "expected a non-negative integer",
        ),
        (
            "2023-11-16 18:15:45.0000000,5,44",
            Location::Line(3),
            "TIMESTAMP",
            "expected non-decreasing",
        ),
        (
            "yesterday,5,44",
            Location::Line(3),
            "TIMESTAMP",
            "expected YYYY-MM-DD",
        ),
        (
            "2023-11-16 18:15:47.0000000,5",
            Location::Line(3),
            "(row)",
            "expected 3",
        ),
    ];
    for (line, at, field, expect) in cases {
        let e = azure_error(AzureKind::Llm, &format!("{h}\n{ok}\n{line}\n"));
        check(&e, "az.csv", *at, field, expect);
    }
    let e = azure_error(AzureKind::Llm, "");
    check(
        &e,
        "az.csv",
        Location::Line(1),
        "(header)",
        "expected a header row",
    );
    let e = azure_error(AzureKind::Multimodal, &format!("{h}\n{ok}\n"));
    check(
        &e,
        "az.csv",
        Location::Line(1),
        "(header)",
        "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens",
    );
    let e = azure_error(
        AzureKind::Multimodal,
        "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.000,3,2,10\n",
    );
    check(
        &e,
        "az.csv",
        Location::Line(2),
        "NumImages",
        "at least one token per image",
    );
}

#[test]
fn azure_imports_good_rows() {
    let text = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens\n\
                2024-05-10 00:00:00.000,1,3000,10\n\
                2024-05-10 00:00:00.250,2,300,20\n\
                2024-05-10 00:00:01.000,0,50,20\n";
    let imp =
        AzureImport::from_reader(text.as_bytes(), "az.csv", AzureKind::Multimodal, None).unwrap();
    let reqs: Vec<Request> = imp.collect::<Result<_, _>>().unwrap();
    assert_eq!(reqs.len(), 3);
    assert_eq!(reqs[1].arrival_ns, 250_000_000);
    assert_eq!(reqs[2].arrival_ns, 1_000_000_000);
    assert_eq!(reqs[0].images.len(), 1);
    assert_eq!(reqs[1].images.len(), 2);
    assert!(reqs[1].visual_tokens() <= 300);
    assert!(reqs[2].images.is_empty());
    let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9667101,396,109\n";
    let imp = AzureImport::from_reader(text.as_bytes(), "az.csv", AzureKind::Llm, None).unwrap();
    let reqs: Vec<Request> = imp.collect::<Result<_, _>>().unwrap();
    assert_eq!(reqs[1].arrival_ns, 4_286_120_100);
    assert_eq!((reqs[1].prompt_tokens, reqs[1].output_tokens), (396, 109));
}

#[test]
fn parquet_reader_open_error_is_named() {
    let e = match ParquetReader::from_bytes(b"PAR1 not really".to_vec(), "x.parquet") {
        Err(e) => e,
        Ok(_) => panic!("expected an error"),
    };
    assert!(
        e.to_string()
            .starts_with("x.parquet: file: field `(parquet)`"),
        "{e}"
    );
}

/// Env var the parent sets for `corrupt_parquet_child` (run by hand, the child says so).
const CORRUPT_CHILD_ENV: &str = "MOONAGENT_CORRUPT_PARQUET_CHILD";

/// Every second truncation and a flip of every byte of a valid Parquet trace (some make
/// the decoder panic inside arrow-rs/parquet): each read ends
/// in `Ok` or in an error naming the file. Runs its body only as the child of
/// `corrupt_parquet_files_are_errors_with_nothing_on_stderr` (which checks its stderr).
#[test]
#[ignore = "run as a child process by corrupt_parquet_files_are_errors_with_nothing_on_stderr"]
fn corrupt_parquet_child() {
    assert!(
        std::env::var_os(CORRUPT_CHILD_ENV).is_some(),
        "run through corrupt_parquet_files_are_errors_with_nothing_on_stderr"
    );
    let (h, reqs) = good_requests();
    let full = to_parquet(&h, &reqs);
    let mut inputs: Vec<Vec<u8>> = (0..full.len())
        .step_by(2)
        .map(|n| full[..n].to_vec())
        .collect();
    for i in 0..full.len() {
        let mut b = full.clone();
        b[i] ^= 0xff;
        inputs.push(b);
    }
    let (mut errors, mut panics) = (0u64, 0u64);
    for bytes in inputs {
        let r = ParquetReader::from_bytes(bytes, "bad.parquet")
            .and_then(|r| r.collect::<Result<Vec<_>, _>>().map(|_| ()));
        if let Err(e) = r {
            let msg = e.to_string();
            assert!(msg.starts_with("bad.parquet: "), "{msg}");
            errors += 1;
            panics += u64::from(msg.contains("corrupt file (") || msg.contains("corrupt data ("));
        }
    }
    // Stdout, not stderr: the parent requires an empty stderr.
    println!("CORRUPT_PARQUET errors={errors} decoder_panics={panics}");
}

#[test]
fn corrupt_parquet_files_are_errors_with_nothing_on_stderr() {
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "bad_input::corrupt_parquet_child",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CORRUPT_CHILD_ENV, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stdout}\n{stderr}");
    assert!(stderr.is_empty(), "stderr must stay empty, got:\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.contains("CORRUPT_PARQUET"))
        .unwrap_or_else(|| panic!("child did not run: {stdout}"));
    let count = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    // Every truncation is an error, so there are many; and some inputs did panic the
    // decoder, so the silence above is the reader's doing, not luck.
    assert!(count("errors=") > 100, "{line}");
    assert!(count("decoder_panics=") > 0, "{line}");
    eprintln!("{line}");
}

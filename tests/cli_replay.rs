//! `moonagent replay` and `moonagent repro` at the command line: bad input is refused with
//! the flag, file and field named; good input writes every output format.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moonagent"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moonagent-cli-replay-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d.join(name)
}

fn run(cmd: &mut Command) -> (Output, String, String) {
    let out = cmd.output().expect("run moonagent");
    let so = String::from_utf8_lossy(&out.stdout).into_owned();
    let se = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, so, se)
}

/// A small sessions trace, written once per test process.
fn trace() -> PathBuf {
    static T: OnceLock<PathBuf> = OnceLock::new();
    T.get_or_init(|| {
        let p = tmp("sessions.jsonl");
        let (o, _, e) = run(bin()
            .args([
                "trace",
                "generate",
                "sessions",
                "--sessions",
                "8",
                "--no-stats",
                "--out",
            ])
            .arg(&p));
        assert!(o.status.success(), "{e}");
        p
    })
    .clone()
}

fn replay(extra: &[&str]) -> (Output, String, String) {
    run(bin().arg("replay").arg("--trace").arg(trace()).args(extra))
}

fn write(name: &str, text: &str) -> PathBuf {
    let p = tmp(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn fails_with(r: (Output, String, String), needles: &[&str]) {
    let (o, _, e) = r;
    assert!(!o.status.success(), "expected failure");
    for n in needles {
        assert!(e.contains(n), "stderr lacks {n:?}:\n{e}");
    }
}

#[test]
fn unknown_policy_name_is_refused_listing_the_known_ones() {
    fails_with(
        replay(&["--capacity", "10%", "--policy", "lfu"]),
        &[
            "--policy",
            "unknown policy \"lfu\"",
            "s3-fifo",
            "belady-cost",
        ],
    );
}

#[test]
fn bad_capacity_is_refused_naming_the_value() {
    fails_with(
        replay(&["--capacity", "lots"]),
        &["--capacity lots", "expected a number"],
    );
    fails_with(
        replay(&["--capacity=-5GB"]),
        &["--capacity -5GB", "positive"],
    );
}

#[test]
fn bad_policy_config_is_refused_naming_the_file_and_field() {
    let f = write(
        "typo.toml",
        "policy = \"type-aware\"\n[types.encoder_output]\nreuse_scal = 8.0\n",
    );
    fails_with(
        replay(&["--capacity", "10%", "--policy-config", f.to_str().unwrap()]),
        &["typo.toml", "reuse_scal"],
    );
    let f = write(
        "neg.toml",
        "policy = \"type-aware\"\n[types.encoder_output]\nreuse_scale = -1.0\n",
    );
    fails_with(
        replay(&["--capacity", "10%", "--policy-config", f.to_str().unwrap()]),
        &["neg.toml", "types.encoder_output.reuse_scale", "> 0"],
    );
    let f = write("name.json", "{\"policy\": \"lfu\"}");
    fails_with(
        replay(&["--capacity", "10%", "--policy-config", f.to_str().unwrap()]),
        &["name.json", "lfu"],
    );
    fails_with(
        replay(&[
            "--capacity",
            "10%",
            "--policy-config",
            "/nonexistent/p.toml",
        ]),
        &["/nonexistent/p.toml"],
    );
}

#[test]
fn bad_out_extension_is_refused_before_replaying() {
    fails_with(
        replay(&["--capacity", "10%", "--out", "results.txt"]),
        &["--out results.txt", ".parquet"],
    );
}

#[test]
fn replay_prints_a_table_and_writes_json_parquet_and_csv() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/policies");
    let balanced = examples.join("balanced.toml");
    for ext in ["json", "parquet", "csv"] {
        let out = tmp(&format!("r.{ext}"));
        let (o, so, e) = replay(&[
            "--capacity",
            "5%,50%",
            "--policy",
            "lru,mooncake-default",
            "--policy-config",
            balanced.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{e}");
        assert!(
            so.contains("balanced") && so.contains("encoder_output") && so.contains("reuse hit %"),
            "{so}"
        );
        let bytes = std::fs::read(&out).expect("output written");
        match ext {
            "parquet" => assert_eq!(&bytes[..4], b"PAR1"),
            "csv" => {
                let text = String::from_utf8(bytes).expect("utf8");
                assert!(text.starts_with("capacity_bytes,label,policy,data_type,hit_rate"));
                // 2 capacities x 3 policies x (2 types + all) + header.
                assert_eq!(text.lines().count(), 1 + 2 * 3 * 3);
            }
            _ => {
                let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
                assert_eq!(v["runs"].as_array().map(Vec::len), Some(2));
            }
        }
    }
}

#[test]
fn repro_eviction_ablation_prints_the_seed_beside_ours() {
    let (o, so, e) = run(bin().args(["repro", "eviction-ablation", "--sessions", "40"]));
    assert!(o.status.success(), "{e}");
    for n in [
        "default",
        "grace-only",
        "reuse-scale-only",
        "balanced",
        "gdsf",
        "hierarchical",
        "belady",
        "33.94",
        "96.65",
        "shape",
    ] {
        assert!(so.contains(n), "stdout lacks {n:?}:\n{so}");
    }
}

#[test]
fn plain_model_flags_are_checked_and_a_truncated_oracle_general_trace_names_the_offset() {
    fails_with(
        replay(&["--capacity", "10", "--capacity-unit", "objects"]),
        &["--capacity-unit objects: needs --cache-model plain"],
    );
    // Two whole 24-byte records and 5 bytes of a third.
    let p = tmp("cut.oracleGeneral");
    std::fs::write(&p, [0u8; 53]).expect("write");
    fails_with(
        run(bin()
            .args([
                "replay",
                "--cache-model",
                "plain",
                "--capacity",
                "1",
                "--trace",
            ])
            .arg(&p)),
        &[
            "cut.oracleGeneral",
            "truncated record at byte offset 48: 5 of 24 bytes",
        ],
    );
    // A whole file replays in the plain model with an object-count capacity.
    std::fs::write(&p, [0u8; 48]).expect("write");
    let (o, so, e) = run(bin()
        .args([
            "replay",
            "--cache-model",
            "plain",
            "--capacity-unit",
            "objects",
            "--capacity",
            "1",
            "--policy",
            "sieve",
            "--trace",
        ])
        .arg(&p));
    assert!(o.status.success(), "{e}");
    assert!(so.contains("capacity 1 objects"), "{so}");
}

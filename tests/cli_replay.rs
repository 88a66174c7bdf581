//! `moonagent replay` and `moonagent repro` at the command line: bad input is refused with
//! the flag, file and field named; good input writes every output format.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The binary, its compiled-trace cache in this test process's temporary directory (never
/// the user's).
fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moonagent"));
    c.env("MOONAGENT_CACHE", tmp("compiled"));
    c
}

fn tmp(name: &str) -> PathBuf {
    let d = scratch_dir("cli-replay");
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

/// A Zipf-like trace of `n` requests, as oracleGeneral bytes and as libCacheSim csv
/// (header, string ids `obj<N>`, time in column 3, id in 1, size in 2).
fn zipf_pair(n: u64) -> (Vec<u8>, String) {
    let mut og = Vec::new();
    let mut csv = String::from("obj,size,time\n");
    let mut x: u64 = 15;
    for i in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        // Skewed ids: the smaller of two uniform draws, squared down.
        let id = ((x >> 33) % 400).min((x >> 13) % 400) + 1;
        let ts = (i / 100) as u32;
        og.extend(ts.to_le_bytes());
        og.extend(id.to_le_bytes());
        og.extend(1u32.to_le_bytes());
        og.extend((-1i64).to_le_bytes());
        csv += &format!("obj{id},1,{ts}\n");
    }
    (og, csv)
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).expect("read json")).expect("json")
}

#[test]
fn a_csv_trace_replays_as_its_oracle_general_twin() {
    let (og, csv) = zipf_pair(5_000);
    let og_path = tmp("twin.oracleGeneral");
    std::fs::write(&og_path, og).expect("write");
    let csv_path = write("twin.csv", &csv);
    let plain = |trace: &Path, out: &Path, extra: &[&str]| {
        let (o, _, e) = run(bin()
            .args([
                "replay",
                "--cache-model",
                "plain",
                "--capacity-unit",
                "objects",
            ])
            .args([
                "--capacity",
                "10,50",
                "--policy",
                "lru,fifo,s3-fifo,sieve,belady",
            ])
            .arg("--trace")
            .arg(trace)
            .arg("--out")
            .arg(out)
            .args(extra));
        assert!(o.status.success(), "{e}");
    };
    let (a, b) = (tmp("twin-og.json"), tmp("twin-csv.json"));
    plain(&og_path, &a, &[]);
    // Detected by the name `.csv`; ids hashed (obj-id-is-num=false), header given.
    plain(
        &csv_path,
        &b,
        &[
            "--trace-type-params",
            "obj-id-col=1, obj-size-col=2, time-col=3, has-header=true, obj-id-is-num=false, delimiter=,",
        ],
    );
    let (a, b) = (json(&a), json(&b));
    assert_eq!(a["runs"], b["runs"]);
    assert_eq!(a["requests"], b["requests"]);
    assert!(
        a["runs"][0]["results"][0]["total"]["hits"]
            .as_u64()
            .unwrap()
            > 0
    );
}

#[test]
fn bad_csv_input_names_the_file_line_column_and_what_was_expected() {
    let p = write("bad.csv", "time,obj,size\n1,7,10\n2,8,ten\n");
    let csv = |params: &[&str]| {
        run(bin()
            .args(["replay", "--cache-model", "plain", "--capacity", "1"])
            .arg("--trace")
            .arg(&p)
            .args(params))
    };
    fails_with(
        csv(&["-t", "time-col=1,obj-id-col=2,obj-size-col=3"]),
        &[
            "bad.csv",
            "line 3, column 3 (obj-size-col): expected an unsigned 32-bit integer (bytes), \
             found \"ten\"",
        ],
    );
    fails_with(
        csv(&[]),
        &["bad.csv", "needs --trace-type-params \"obj-id-col=N,...\""],
    );
    fails_with(
        csv(&["-t", "obj-id-col=2,ttl-col=4"]),
        &["--trace-type-params: ttl-col: a libCacheSim option"],
    );
    fails_with(
        replay(&["--capacity", "10%", "-t", "obj-id-col=1"]),
        &["--trace-type-params: only with --trace-format csv"],
    );
}

/// The cache's one file (there is one compiled trace in `dir`).
fn cache_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("cache dir")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].extension().and_then(|e| e.to_str()), Some("mtc"));
    files[0].clone()
}

#[test]
fn the_trace_cache_gives_byte_identical_output_and_rebuilds_damaged_files() {
    let dir = tmp("own-cache");
    let _ = std::fs::remove_dir_all(&dir);
    // The Mooncake model on a moonagent trace (images and KV, miss costs), and the plain
    // model on an oracleGeneral one.
    let (og, _) = zipf_pair(3_000);
    let og_path = tmp("cached.oracleGeneral");
    std::fs::write(&og_path, og).expect("write");
    let cases: [(PathBuf, &[&str]); 2] = [
        (
            trace(),
            &["--capacity", "5%,30%", "--policy", "lru,belady-cost"],
        ),
        (
            og_path,
            &[
                "--cache-model",
                "plain",
                "--capacity-unit",
                "objects",
                "--capacity",
                "40",
                "--policy",
                "s3-fifo",
            ],
        ),
    ];
    for (k, (trace, args)) in cases.iter().enumerate() {
        let _ = std::fs::remove_dir_all(&dir);
        let go = |name: &str, extra: &[&str]| {
            let out = tmp(&format!("cache-{k}-{name}.json"));
            let (o, _, e) = run(bin()
                .env("MOONAGENT_CACHE", &dir)
                .arg("replay")
                .arg("--trace")
                .arg(trace)
                .args(*args)
                .arg("--out")
                .arg(&out)
                .args(extra));
            assert!(o.status.success(), "{e}");
            (std::fs::read(&out).expect("out"), e)
        };
        let (off, e) = go("off", &["--no-trace-cache"]);
        assert!(!e.contains("trace cache"), "{e}");
        assert!(!dir.exists());
        let (cold, e) = go("cold", &[]);
        assert!(
            e.contains("no compiled trace yet") && e.contains("trace cache: wrote"),
            "{e}"
        );
        let (warm, e) = go("warm", &[]);
        assert!(e.contains("trace cache: mapped"), "{e}");
        assert_eq!(off, cold);
        assert_eq!(off, warm);
        // Damaged files are refused, rebuilt, and the output does not change.
        let file = cache_file(&dir);
        let good = std::fs::read(&file).expect("cache file");
        let mut bad = good.clone();
        *bad.last_mut().expect("bytes") ^= 0x40;
        for (damage, bytes, says) in [
            ("flip", bad, "checksum mismatch"),
            ("cut", good[..good.len() - 3].to_vec(), "wrong length"),
            (
                "magic",
                [&b"NOTMOON!"[..], &good[8..]].concat(),
                "wrong magic",
            ),
            (
                "version",
                [&good[..8], &[9u8, 0, 0, 0][..], &good[12..]].concat(),
                "format version 9",
            ),
        ] {
            std::fs::write(&file, bytes).expect("damage");
            let (again, e) = go(damage, &[]);
            assert!(
                e.contains(says) && e.contains("trace cache: wrote"),
                "{damage}: {e}"
            );
            assert_eq!(off, again, "{damage}");
            assert_eq!(std::fs::read(&file).expect("rebuilt"), good, "{damage}");
        }
        // Other compile options are another file; the first is kept.
        if k == 0 {
            let (_, e) = go("kv-only", &["--kv-only"]);
            assert!(e.contains("no compiled trace yet"), "{e}");
            assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 2);
        }
    }
}

/// This test binary's scratch folder under cargo's `target/tmp`, emptied once per run: the
/// last run's files stay there to look at, and no run leaves one in the system temp dir.
fn scratch_dir(name: &str) -> PathBuf {
    static EMPTIED: std::sync::Once = std::sync::Once::new();
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    EMPTIED.call_once(|| {
        let _ = std::fs::remove_dir_all(&d);
    });
    d
}

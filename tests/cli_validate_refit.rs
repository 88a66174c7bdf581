//! `moonagent validate profile --from DIR` refits stored samples without measuring: the
//! cost form each operator is timed in comes back, `--roofline max` forces the roofline,
//! the old profile's host facts carry over, and bad input is a clear error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use moonagent_models::calibrate::Sample;
use moonagent_models::{CostModel, HardwareProfile, ModelSpec, Roofline};

fn scratch_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cli-validate-refit")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// The CPU profile as the "truth" a profile run measured: decode timed without overlap,
/// shared cores recorded.
fn truth() -> HardwareProfile {
    let mut hw = HardwareProfile::by_name("cpu").unwrap();
    hw.efficiency.decode_mfu = 0.05;
    hw.efficiency.hbm_efficiency = 0.01;
    hw.overheads.decode_iter_ns = 400_000;
    hw.roofline.decode = Roofline::Sum;
    hw.shared_cores = Some(2.0);
    hw
}

/// Samples of every compute operator, timed by `hw`, with +-0.5% deterministic jitter.
fn samples(hw: &HardwareProfile, salt: u64) -> Vec<Sample> {
    let spec = ModelSpec::resolve("qwen2.5-vl-tiny").unwrap();
    let c = CostModel::new(hw, &spec, 1).unwrap();
    let mut k = salt;
    let mut jitter = |t: u64| {
        k = k
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let e = ((k >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.01;
        (t as f64 * (1.0 + e)).round() as u64
    };
    let mut out = Vec::new();
    for (batch, ctx) in [
        (1u32, 128u64),
        (1, 1024),
        (4, 512),
        (4, 4096),
        (8, 1024),
        (8, 8192),
    ]
    .into_iter()
    .chain([(16, 2048), (16, 16384), (2, 700), (11, 5600)])
    {
        let context_tokens = u64::from(batch) * ctx;
        out.push(Sample::Decode {
            batch,
            context_tokens,
            measured_ns: jitter(c.decode_iter_time_ns(batch, context_tokens)),
        });
    }
    for (new_tokens, cached_tokens) in [(64u32, 0u32), (256, 0), (1024, 0), (256, 512), (512, 2048)]
    {
        out.push(Sample::Prefill {
            new_tokens,
            cached_tokens,
            measured_ns: jitter(c.prefill_time_ns(new_tokens, cached_tokens)),
        });
    }
    for t in [64u32, 256, 1024] {
        for n in [1usize, 2] {
            let visual_tokens = vec![t; n];
            out.push(Sample::Encoder {
                measured_ns: jitter(c.encoder_time_ns(&visual_tokens)),
                visual_tokens,
            });
        }
    }
    out
}

fn write_lines(path: &Path, rows: &[Sample]) {
    let text: String = rows
        .iter()
        .map(|s| serde_json::to_string(s).unwrap() + "\n")
        .collect();
    std::fs::write(path, text).unwrap();
}

/// A folder as `validate profile` leaves it: samples, hold-out, profile.toml.
fn profile_dir(name: &str) -> PathBuf {
    let d = scratch_dir(name);
    let hw = truth();
    write_lines(&d.join("samples.jsonl"), &samples(&hw, 1));
    write_lines(&d.join("holdout.jsonl"), &samples(&hw, 2));
    std::fs::write(d.join("profile.toml"), hw.to_toml_string().unwrap()).unwrap();
    d
}

fn refit(from: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moonagent"))
        .args(["validate", "profile", "--from"])
        .arg(from)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run moonagent")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_refit_finds_the_form_each_operator_was_timed_in_and_keeps_the_host_facts() {
    let from = profile_dir("auto");
    let out = from.with_file_name("auto-out");
    let o = refit(&from, &out, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("decode **sum**"), "{stdout}");
    let hw = HardwareProfile::from_path(out.join("profile.toml")).unwrap();
    assert_eq!(hw.roofline.decode, Roofline::Sum);
    assert_eq!(hw.roofline.prefill, Roofline::Max);
    assert_eq!(hw.shared_cores, Some(2.0));
    let want = truth();
    // Loose: 10 samples with 0.5% jitter (models/tests/calibration.rs checks recovery).
    let rel = |a: f64, b: f64| (a - b).abs() / b;
    assert!(
        rel(hw.efficiency.decode_mfu, want.efficiency.decode_mfu) < 0.1,
        "{hw:?}"
    );
    assert!(
        rel(hw.efficiency.hbm_efficiency, want.efficiency.hbm_efficiency) < 0.1,
        "{hw:?}"
    );
    // The refit wrote the samples it used, unchanged.
    for f in ["samples.jsonl", "holdout.jsonl"] {
        assert_eq!(
            std::fs::read(from.join(f)).unwrap(),
            std::fs::read(out.join(f)).unwrap(),
            "{f}"
        );
    }
    // Refitting its own output again gives the same profile (deterministic).
    let again = from.with_file_name("auto-again");
    let o = refit(&out, &again, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let strip = |p: PathBuf| {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(
        strip(out.join("profile.toml")),
        strip(again.join("profile.toml"))
    );

    let forced = from.with_file_name("max-out");
    let o = refit(&from, &forced, &["--roofline", "max"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let hw = HardwareProfile::from_path(forced.join("profile.toml")).unwrap();
    assert_eq!(hw.roofline.decode, Roofline::Max);
    let json = std::fs::read_to_string(forced.join("profile.json")).unwrap();
    assert!(!json.contains("\"sum\""), "only max was on offer: {json}");
}

#[test]
fn bad_refit_input_is_a_clear_error() {
    let from = profile_dir("bad");
    // Writing over the samples being refitted.
    let o = refit(&from, &from, &[]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("choose another --out"),
        "{}",
        stderr(&o)
    );
    // A damaged line names the file and the line.
    let text = std::fs::read_to_string(from.join("samples.jsonl")).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines[2] = r#"{"kind":"decode","batch":1,"measured_ns":5}"#;
    std::fs::write(from.join("samples.jsonl"), lines.join("\n")).unwrap();
    let o = refit(&from, &from.with_file_name("bad-out"), &[]);
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("samples.jsonl:3") && err.contains("context_tokens"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // No samples folder at all.
    let o = refit(
        &from.with_file_name("missing"),
        &from.with_file_name("x"),
        &[],
    );
    let err = stderr(&o);
    assert!(!o.status.success());
    assert!(
        err.contains("missing") && err.contains("samples.jsonl"),
        "{err}"
    );
}

//! `moonagent validate run` then `validate compare` on its folder: the comparison, the
//! simulated steps written beside it in the run's `timed.jsonl` shape, and the measured and
//! simulated steps side by side in `compare.md`; a trace that is not the run's and a
//! corrupt `timed.jsonl` are clear errors naming what to fix (and leave no partial
//! `compare.md`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn scratch_dir(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("cli-validate-compare")
        .join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

fn moonagent(args: &[&str], dirs: &[(&str, &Path)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_moonagent"));
    c.args(args);
    for (flag, d) in dirs {
        c.arg(flag).arg(d);
    }
    c.output().expect("run moonagent")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn compare_writes_the_simulated_steps_beside_the_measured_ones() {
    let dir = scratch_dir("run");
    let run = dir.join("run");
    let workload = ["--mode", "b3", "--requests", "8", "--rate", "8"];
    let o = moonagent(
        &[&["validate", "run"], &workload[..]].concat(),
        &[("--out", &run)],
    );
    let (_, err) = text(&o);
    assert!(o.status.success(), "validate run failed: {err}");

    let cmp = dir.join("compare");
    let o = moonagent(
        &[
            &["validate", "compare", "--hardware", "cpu"],
            &workload[2..],
        ]
        .concat(),
        &[("--run", &run), ("--out", &cmp)],
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "validate compare failed: {err}");
    assert!(out.contains("## Compute steps"), "{out}");
    assert!(
        out.contains("| measured |") && out.contains("| simulated |"),
        "{out}"
    );
    let md = std::fs::read_to_string(cmp.join("compare.md")).unwrap();
    assert!(md.contains("## Compute steps"), "{md}");
    let sim = std::fs::read_to_string(cmp.join("simulated-timed.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = sim
        .lines()
        .map(|l| serde_json::from_str(l).expect("a simulated step"))
        .collect();
    assert!(!lines.is_empty(), "no simulated step");
    for l in &lines {
        assert!(l["what"]["Step"].is_object(), "{l}");
        assert!(l["start_ns"].is_u64() && l["measured_ns"].is_u64(), "{l}");
    }

    // Another trace than the run's: it cannot replay, and the error says what must match.
    let o = moonagent(
        &[
            "validate",
            "compare",
            "--hardware",
            "cpu",
            "--mode",
            "b3",
            "--requests",
            "9",
            "--rate",
            "8",
        ],
        &[("--run", &run), ("--out", &dir.join("bad"))],
    );
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("must be the run's"), "{err}");

    // A corrupt timed.jsonl: the file and line named.
    let timed = run.join("timed.jsonl");
    let mut t = std::fs::read_to_string(&timed).unwrap();
    t.push_str("{\"worker\": 0, \"what\": 7}\n");
    std::fs::write(&timed, t).unwrap();
    let o = moonagent(
        &[
            &["validate", "compare", "--hardware", "cpu"],
            &workload[2..],
        ]
        .concat(),
        &[("--run", &run), ("--out", &dir.join("corrupt"))],
    );
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(!err.contains("panicked"), "{err}");
    let n = std::fs::read_to_string(&timed).unwrap().lines().count();
    assert!(err.contains(&format!("timed.jsonl:{n}")), "{err}");
    // Read before anything is written: no comparison without its steps table.
    assert!(!dir.join("corrupt").join("compare.md").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

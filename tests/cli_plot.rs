//! The figures the commands draw (`sim/src/plot`): `simulate --out DIR` writes ladder.svg,
//! `replay --plot`, `sweep best --plot` write theirs, each with its axes and legend.

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moonagent"))
}

fn tmp(name: &str) -> PathBuf {
    let d = scratch_dir("cli-plot");
    std::fs::create_dir_all(&d).expect("temp dir");
    d.join(name)
}

fn ok(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run moonagent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn svg_with(path: &Path, texts: &[&str]) {
    let svg = std::fs::read_to_string(path).expect("figure written");
    assert!(svg.starts_with("<svg"), "{} is not an SVG", path.display());
    for t in texts {
        assert!(svg.contains(t), "no {t:?} in {}", path.display());
    }
}

#[test]
fn simulate_out_dir_holds_the_ladder_figure() {
    let out = tmp("ladder");
    ok(bin()
        .args([
            "simulate",
            "--requests",
            "20",
            "--modes",
            "b0,b2,full",
            "--out",
        ])
        .arg(&out));
    svg_with(
        &out.join("ladder.svg"),
        &[
            "saturated throughput (req/s)",
            "P95 TTFT at load (ms, log scale)",
            "W1",
            "W4",
            "B0",
            "B2",
            "Full",
        ],
    );
}

#[test]
fn replay_plot_draws_every_policy_and_the_min_bound() {
    let trace = tmp("sessions.jsonl");
    ok(bin()
        .args([
            "trace",
            "generate",
            "sessions",
            "--sessions",
            "8",
            "--no-stats",
            "--out",
        ])
        .arg(&trace));
    let fig = tmp("replay.svg");
    ok(bin()
        .arg("replay")
        .arg("--trace")
        .arg(&trace)
        .args(["--kv-only", "--kv-full-blocks", "--capacity", "5%,20%,50%"])
        .args(["--policy", "lru,s3-fifo,belady", "--plot"])
        .arg(&fig));
    svg_with(
        &fig,
        &[
            "kv_cache hit rate vs capacity",
            "store capacity (GiB, log scale)",
            "lru",
            "s3-fifo",
            "belady (offline)",
            "Belady MIN bound",
        ],
    );
}

#[test]
fn sweep_best_plot_draws_the_front_and_the_best_point() {
    let plan =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sweeps/seed002_type_aware.toml");
    let dir = tmp("sweep");
    ok(bin()
        .arg("sweep")
        .arg("run")
        .arg(&plan)
        .arg("--out")
        .arg(&dir)
        .args(["--quiet", "--set", "base.workload.config.sessions=4"])
        .args(["--set", "seeds=1", "--set", "axis.0.values=[1.0, 8.0]"])
        .args(["--set", "axis.1.values=[0]"])
        .args(["--set", "axis.2.values=[\"10%\", \"40%\"]"]));
    let fig = tmp("best.svg");
    ok(bin()
        .arg("sweep")
        .arg("best")
        .arg(&dir)
        .args([
            "--x",
            "capacity_bytes",
            "--y",
            "encoder_output.hit_rate:max",
        ])
        .args(["--slo", "kv_cache.hit_rate>=0", "--plot"])
        .arg(&fig));
    svg_with(
        &fig,
        &[
            "4 of 4 points meet kv_cache.hit_rate&gt;=0",
            "capacity_bytes (GiB, min)",
            "encoder_output.hit_rate (%, max)",
            "Pareto front",
            "best on encoder_output.hit_rate",
        ],
    );
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

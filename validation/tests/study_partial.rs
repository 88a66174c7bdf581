//! A study that stops part-way (here: the second run's store cannot be opened) still
//! leaves a report of the runs it measured, marked partial, its profile (which says in
//! what order its compute operators were timed) and its calibration run.

use std::sync::Arc;

use moonagent_core::serve::Mode;
use moonagent_core::store::Store;
use moonagent_models::ModelSpec;
use moonagent_sim::des::SimConfig;
use moonagent_validation::backend::Executor;
use moonagent_validation::compute::CpuCompute;
use moonagent_validation::exec::ComputeExecutor;
use moonagent_validation::measure::MeasureError;
use moonagent_validation::profile::{Grid, Order};
use moonagent_validation::study::{self, CalibrationPlan, StudyConfig};

#[test]
fn a_study_stopped_part_way_leaves_a_partial_report() {
    let spec = ModelSpec::resolve(study::STUDY_MODEL).unwrap();
    let exec: Arc<dyn Executor> =
        Arc::new(ComputeExecutor::new(CpuCompute::new(&spec, 0).unwrap(), 3));
    let cfg = StudyConfig {
        modes: vec![Mode::B3],
        requests: 6,
        repeats: 2,
        loads: vec![0.5],
        grid: Grid {
            order: Order::Interleaved,
            ..Grid::quick()
        },
        holdout: 3,
        contention: None,
        calibration: Some(CalibrationPlan {
            requests: 6,
            ..CalibrationPlan::default()
        }),
        ..StudyConfig::default()
    };
    let out = std::env::temp_dir().join(format!("moonagent-partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut opened = Vec::new();
    let mut stores = |c: &SimConfig, label: &str| -> Result<Box<dyn Store>, MeasureError> {
        opened.push(label.to_string());
        // The calibration run's store, then the first run's.
        if opened.len() > 2 {
            return Err(MeasureError::Store(format!("{label}: the store went away")));
        }
        study::embedded_stores(c, label)
    };
    let err = study::run_study(&cfg, exec, &mut stores, &out, |_| {}).unwrap_err();
    assert!(err.to_string().contains("the store went away"), "{err}");
    assert_eq!(opened, ["calibration", "B3-50-0", "B3-50-1"]);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("**Partial: 1 of 2 runs**"), "{report}");
    assert!(report.contains("| B3 | 50% |"), "{report}");
    assert!(
        report.contains("Compute operators timed interleaved"),
        "{report}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("study.json")).unwrap()).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 1);
    assert_eq!(json["runs_planned"], 2);
    assert_eq!(json["profile"]["order"], "interleaved");
    assert!(out.join("profile").join("profile.toml").exists());
    // The calibration run: on a trace of its own, written beside the runs, its factors in
    // the calibrated profile each run is also compared with.
    assert!(report.contains("## Calibration run"), "{report}");
    assert!(report.contains("with calibration"), "{report}");
    assert_eq!(json["calibration"]["requests"], 6);
    assert_eq!(json["calibration"]["seed"], 18);
    assert!(json["runs"][0]["calibrated"]["ttft"].is_object());
    assert!(out.join("calibration").join("timed.jsonl").exists());
    let cal = moonagent_models::HardwareProfile::from_path(
        out.join("profile").join("profile-calibrated.toml"),
    )
    .unwrap();
    let k = cal
        .step_scale
        .expect("a calibrated profile has a step_scale");
    // To the last bits only: serde_json's default float parser (no `float_roundtrip`) can
    // read a printed f64 one ulp off.
    for (name, v) in ["encode", "prefill", "decode"]
        .into_iter()
        .zip(k.as_array())
    {
        let j = json["calibration"]["step_scale"][name].as_f64().unwrap();
        assert!(
            (j - v).abs() <= 1e-12 * v.abs(),
            "{name}: {j} in study.json, {v} in the profile"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

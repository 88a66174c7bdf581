//! A study that stops part-way (here: the second run's store cannot be opened) still
//! leaves a report of the runs it measured, marked partial, and its profile (which says
//! in what order its compute operators were timed).

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
use moonagent_validation::study::{self, StudyConfig};

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
        ..StudyConfig::default()
    };
    let out = std::env::temp_dir().join(format!("moonagent-partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let mut opened = 0;
    let mut stores = |c: &SimConfig, label: &str| -> Result<Box<dyn Store>, MeasureError> {
        opened += 1;
        if opened > 1 {
            return Err(MeasureError::Store(format!("{label}: the store went away")));
        }
        study::embedded_stores(c, label)
    };
    let err = study::run_study(&cfg, exec, &mut stores, &out, |_| {}).unwrap_err();
    assert!(err.to_string().contains("the store went away"), "{err}");
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
    let _ = std::fs::remove_dir_all(&out);
}

//! A study that stops part-way (here: the second run's store cannot be opened) still
//! leaves a report of the runs it measured, marked partial, its profile (which says in
//! what order its compute operators were timed) and its calibration runs, one opening
//! each round.

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
        loads: vec![0.3, 0.6],
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
        // Round 0 (its calibration run and two runs), round 1's calibration run and first
        // run.
        if opened.len() > 6 {
            return Err(MeasureError::Store(format!("{label}: the store went away")));
        }
        study::embedded_stores(c, label)
    };
    let err = study::run_study(&cfg, exec, &mut stores, &out, |_| {}).unwrap_err();
    assert!(err.to_string().contains("the store went away"), "{err}");
    assert_eq!(
        opened,
        [
            "capacity-B3",
            "calibration-0",
            "B3-30-0",
            "B3-60-0",
            "calibration-1",
            "B3-30-1",
            "B3-60-1"
        ]
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("**Partial: 3 of 4 runs**"), "{report}");
    // The summary and the steps table have one row per mode and load, over its runs of
    // every round (and the per-run table one row per run).
    assert!(report.contains("| B3 | 30% | 2 |"), "{report}");
    assert!(report.contains("| B3 | 60% | 1 |"), "{report}");
    assert_eq!(report.matches("| B3 | 30% |").count(), 4, "{report}");
    assert!(
        report.contains("Compute operators timed interleaved"),
        "{report}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("study.json")).unwrap()).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 3);
    assert_eq!(json["runs_planned"], 4);
    assert_eq!(json["profile"]["order"], "interleaved");
    assert!(out.join("profile").join("profile.toml").exists());
    // The calibration runs: on a trace of their own, written beside the runs, each
    // round's factors in the calibrated profile its runs are compared with.
    assert!(report.contains("## Calibration runs"), "{report}");
    // The loads are fractions of the capacity measured on the backend, a burst of the
    // study's requests on a trace of its own, with the simulator's beside it.
    assert!(report.contains("## Capacity"), "{report}");
    assert_eq!(json["capacity_basis"], "measured");
    let cap = &json["capacity_runs"][0];
    assert_eq!(cap["mode"], "B3");
    assert_eq!(cap["requests"], 6);
    assert_eq!(cap["seed"], 19);
    let measured = cap["measured_rps"].as_f64().unwrap();
    assert!(measured > 0.0 && cap["simulated_rps"].as_f64().unwrap() > 0.0);
    assert!(out.join("capacity-B3").join("timed.jsonl").exists());
    // The burst priced again with each round's calibrated profile, as each round's
    // calibration ran (two rounds' calibrations in this study).
    for field in ["calibrated_rps", "alone_calibrated_rps"] {
        let v = cap[field].as_array().unwrap();
        assert_eq!(v.len(), 2, "{field}: {cap}");
        assert!(v.iter().all(|r| r.as_f64().unwrap() > 0.0), "{cap}");
    }
    assert!(report.contains("calibrated by round"), "{report}");
    // Each compared run's simulated steps beside its measured ones.
    let first = out.join("runs").join("B3-30-0");
    assert!(
        first.join("simulated-timed.jsonl").exists(),
        "{}",
        first.display()
    );
    assert!(
        report.contains("## Steps, measured vs simulated"),
        "{report}"
    );
    let busy = json["runs"][0]["steps_measured"]["busy"]
        .as_array()
        .unwrap();
    let total: f64 = busy.iter().map(|v| v.as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-9, "busy shares sum to {total}");
    assert!(
        json["runs"][0]["steps_simulated"]["steps"][2]
            .as_u64()
            .unwrap()
            > 0
    );
    let rate = json["runs"][0]["rate"].as_f64().unwrap();
    assert!(
        (rate - 0.3 * measured).abs() <= 1e-9 * rate,
        "the 30% run's rate {rate} is 30% of the measured {measured}"
    );
    assert!(report.contains("operator profile alone"), "{report}");
    let cals = json["calibrations"].as_array().unwrap();
    assert_eq!(cals.len(), 2, "round 1's calibration ran before its runs");
    // The headline is the calibrated profile's; the operator profile alone beside it.
    assert!(json["runs"][0]["comparison"]["ttft"].is_object());
    assert!(json["runs"][0]["operator"]["ttft"].is_object());
    let workers = json["workers"].as_f64().unwrap();
    for (k, c) in cals.iter().enumerate() {
        assert_eq!(c["round"], k);
        assert_eq!(c["requests"], 6);
        assert_eq!(c["seed"], 18);
        assert!(out
            .join(format!("calibration-{k}"))
            .join("timed.jsonl")
            .exists());
        let cal = moonagent_models::HardwareProfile::from_path(
            out.join("profile")
                .join(study::calibrated_profile_name(k as u32)),
        )
        .unwrap();
        // The oversubscribed factors come from the capacity burst's all-busy steps when
        // the workers outnumber the cores the profile says they share, and go into the
        // round's calibrated profile.
        assert_eq!(
            cal.oversubscribed.is_some(),
            cal.shared_cores.is_some_and(|c| workers > c),
            "round {k}: {:?} shared cores, {workers} workers",
            cal.shared_cores
        );
        assert_eq!(
            cal.oversubscribed.is_some(),
            !c["oversubscribed"].is_null(),
            "round {k}: the profile's oversubscribed factors are study.json's"
        );
        // So is the decode contention (absent where too few decode iterations ran with
        // every worker busy), and it needs oversubscription.
        assert_eq!(
            cal.decode_contention.is_some(),
            !c["decode_contention"].is_null(),
            "round {k}: the profile's decode contention is study.json's"
        );
        if let Some(d) = cal.decode_contention {
            assert!(cal.oversubscribed.is_some());
            for (v, name) in [(d.kv, "kv"), (d.encoder, "encoder")] {
                let j = c["decode_contention"][name].as_f64().unwrap();
                assert!(
                    (v - j).abs() <= 1e-12 * v.abs().max(1.0),
                    "{name}: {v} vs {j}"
                );
            }
        }
        let f = cal
            .step_scale
            .expect("a calibrated profile has a step_scale");
        // To the last bits only: serde_json's default float parser (no
        // `float_roundtrip`) can read a printed f64 one ulp off.
        for (name, v) in ["encode", "prefill", "decode"]
            .into_iter()
            .zip(f.as_array())
        {
            let j = c["step_scale"][name].as_f64().unwrap();
            assert!(
                (j - v).abs() <= 1e-12 * v.abs(),
                "round {k}, {name}: {j} in study.json, {v} in the profile"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out);
}

//! The contention run of `validate profile` (issue 12 item 7): steps of each kind looping
//! on their own threads, alone and all at once, fit the simulator's per-kind core weights.

use std::time::Duration;

use moonagent_core::serve::WorkerId;
use moonagent_models::{HardwareProfile, ModelSpec, Roofline};
use moonagent_validation::backend::{ExecError, Executor, Step};
use moonagent_validation::cores::HostSched;
use moonagent_validation::profile::{self, ContentionPlan, Grid};

/// Steps that wait instead of computing: nothing competes for cores, so running them
/// together changes nothing and the fitted weights are equal.
struct Sleeper;

impl Executor for Sleeper {
    fn run(&self, _worker: WorkerId, step: &Step) -> Result<Vec<Vec<u8>>, ExecError> {
        let ms = match step {
            Step::Encode { .. } => 6,
            Step::Prefill(_) => 4,
            Step::Decode { .. } => 2,
        };
        std::thread::sleep(Duration::from_millis(ms));
        Ok(Vec::new())
    }
    fn fingerprint(&self, _bytes: u64) -> Result<(), ExecError> {
        Ok(())
    }
}

/// A short plan under the kernel's scheduler: there sleeping steps hold no core. (Under
/// the backend's round robin, the default, a step holds its core for its whole length,
/// sleeping or not, so sleepers would compete.)
fn plan() -> ContentionPlan {
    ContentionPlan {
        window: Duration::from_millis(300),
        host_sched: HostSched::Os,
        ..ContentionPlan::cpu_default()
    }
}

#[test]
fn steps_that_do_not_compete_fit_equal_weights_and_stretch_one() {
    let r = profile::contention(&plan(), &Sleeper, 2.0, |_| {}).expect("contention run");
    let w = r.weights;
    assert_eq!(w.decode, 1.0, "normalised to decode");
    for (k, x) in [("encode", w.encode), ("prefill", w.prefill)] {
        assert!(
            (0.7..1.4).contains(&x),
            "{k} weight {x} for steps that never compete"
        );
    }
    assert_eq!(r.fit.len(), 3);
    assert_eq!(r.holdout.len(), 3);
    for c in r.fit.iter().chain(&r.holdout) {
        assert!(c.together_runs >= 10, "{c:?}");
        let sleep_ns = match c.kind {
            "encode" => 6e6,
            "prefill" => 4e6,
            _ => 2e6,
        };
        assert!(c.alone_ns as f64 >= sleep_ns, "{c:?}");
        assert!((0.7..1.5).contains(&c.measured_stretch), "{c:?}");
        // Three steps on two cores: equal sharing predicts 1.5 whatever they do.
        assert!((c.equal_stretch - 1.5).abs() < 1e-9, "{c:?}");
    }
}

#[test]
fn a_fit_mix_without_each_kind_once_is_refused_before_anything_runs() {
    let mut p = plan();
    p.fit[2] = p.fit[0].clone();
    let e = profile::contention(&p, &Sleeper, 2.0, |_| panic!("ran"))
        .expect_err("two encodes, no decode");
    assert!(
        e.to_string()
            .contains("one encode, one prefill and one decode"),
        "{e}"
    );
}

/// On the CPU executor the weights go into the fitted profile, which the simulator reads
/// (and writes back) as `core_weights`.
#[test]
fn fitted_weights_enter_the_profile_with_the_shared_cores() {
    use moonagent_validation::compute::CpuCompute;
    use moonagent_validation::exec::ComputeExecutor;
    let spec = ModelSpec::resolve("qwen2.5-vl-tiny").unwrap();
    let exec = ComputeExecutor::new(CpuCompute::new(&spec, 0).unwrap(), 3);
    let cores = exec
        .shared_cores()
        .expect("a CPU executor shares the host's cores");
    let c = profile::contention(&plan(), &exec, cores, |_| {}).expect("contention run");
    for x in c.weights.as_array() {
        assert!(x.is_finite() && x > 0.0, "{:?}", c.weights);
    }
    let grid = Grid::quick();
    let samples = profile::measure(&grid, &exec, |_| {}).unwrap();
    let base = HardwareProfile::resolve("cpu").unwrap();
    let (w_err, e_err) = profile::stretch_errors(&c.holdout);
    assert_eq!(
        (c.weighted_holdout_err_pct, c.equal_holdout_err_pct),
        (w_err, e_err)
    );
    assert_eq!(c.adopted, w_err < e_err, "{c:?}");
    // Weights that lost on the hold-out mix stay out of the profile ...
    let rejected = profile::ContentionReport {
        adopted: false,
        ..c.clone()
    };
    let fit_with = |c: profile::ContentionReport| {
        profile::fit(
            &base,
            &spec,
            &samples,
            &samples,
            Some(cores),
            Some(c),
            &Roofline::ALL,
        )
        .unwrap()
    };
    let p = fit_with(rejected);
    assert_eq!(p.hardware.core_weights, None);
    assert!(moonagent_validation::study::profile_markdown(&p).contains("stay out of the profile"));
    // ... and adopted ones go in.
    let c = profile::ContentionReport { adopted: true, ..c };
    let p = fit_with(c.clone());
    assert_eq!(p.hardware.core_weights, Some(c.weights));
    let dir = std::env::temp_dir().join(format!("moonagent-contention-{}", std::process::id()));
    let path = moonagent_validation::study::write_profile(&dir, &p, &samples, &samples).unwrap();
    let back = HardwareProfile::resolve(&path.display().to_string()).unwrap();
    assert_eq!(back.core_weights, Some(c.weights));
    std::fs::remove_dir_all(&dir).ok();
    assert!(moonagent_validation::study::profile_markdown(&p).contains("Shared cores"));
    // Without shared cores there is nothing to weigh.
    let p = profile::fit(
        &base,
        &spec,
        &samples,
        &samples,
        None,
        Some(c),
        &Roofline::ALL,
    )
    .unwrap();
    assert_eq!(p.hardware.core_weights, None);
}

/// The gate's arithmetic on a hand-made hold-out mix: measured stretches 1.2 and 2.0,
/// weighted predictions 1.2 and 1.5 (errors 0% and 25%), equal 1.5 and 1.5 (25% and 25%).
#[test]
fn stretch_errors_are_the_mean_relative_error_of_each_prediction() {
    let c = |measured: f64, weighted: f64| profile::Contended {
        kind: "decode",
        alone_ns: 1,
        together_ns: 1,
        together_runs: 1,
        measured_stretch: measured,
        weighted_stretch: weighted,
        equal_stretch: 1.5,
    };
    let (w, e) = profile::stretch_errors(&[c(1.2, 1.2), c(2.0, 1.5)]);
    assert!((w - 12.5).abs() < 1e-9, "{w}");
    assert!((e - 25.0).abs() < 1e-9, "{e}");
}

//! A measured run under the backend's round robin over the host's cores (INVARIANTS H3,
//! H4): with the cores cut to one for three workers, steps hand the core over at
//! operator boundaries, and the run still finishes every request, replays to its
//! decisions and says how its threads were scheduled.

use std::sync::Arc;

use moonagent_core::serve::{EngineConfig, JobId, Mode, WorkerId};
use moonagent_models::ModelSpec;
use moonagent_validation::backend::{ExecError, Executor, RunOptions, Step, StepKv};
use moonagent_validation::compute::CpuCompute;
use moonagent_validation::cores::HostSched;
use moonagent_validation::exec::ComputeExecutor;
use moonagent_validation::measure::{mem_store, run_trace};
use moonagent_validation::study::{cpu_config, generate};

/// The CPU executor with its host cores given as `cores`.
struct Cores(ComputeExecutor<CpuCompute>, f64);

impl Executor for Cores {
    fn prepare(&self, cfg: &EngineConfig) -> Result<(), ExecError> {
        self.0.prepare(cfg)
    }
    fn run_kv(&self, w: WorkerId, step: &Step, kv: &StepKv) -> Result<Vec<Vec<u8>>, ExecError> {
        self.0.run_kv(w, step, kv)
    }
    fn kv_take(&self, w: WorkerId, job: JobId) -> Result<Option<Vec<u8>>, ExecError> {
        self.0.kv_take(w, job)
    }
    fn kv_give(&self, w: WorkerId, job: JobId, bytes: Vec<u8>) -> Result<(), ExecError> {
        self.0.kv_give(w, job, bytes)
    }
    fn run(&self, w: WorkerId, step: &Step) -> Result<Vec<Vec<u8>>, ExecError> {
        self.0.run(w, step)
    }
    fn encoder_outputs(&self) -> bool {
        self.0.encoder_outputs()
    }
    fn fingerprint(&self, bytes: u64) -> Result<(), ExecError> {
        self.0.fingerprint(bytes)
    }
    fn shared_cores(&self) -> Option<f64> {
        Some(self.1)
    }
}

#[test]
fn a_round_robin_run_on_one_core_hands_it_over_and_keeps_its_decisions() {
    let spec = ModelSpec::resolve("qwen2.5-vl-tiny").unwrap();
    let cfg = cpu_config(Mode::B3);
    let (trace, bs) = generate(8, 20.0, 3).unwrap();
    let exec = Arc::new(Cores(
        ComputeExecutor::new(CpuCompute::new(&spec, 0).unwrap(), 3),
        1.0,
    ));
    let sched = HostSched::RoundRobin { quantum_us: 200 };
    let opts = RunOptions {
        host_sched: sched,
        ..RunOptions::default()
    };
    let (m, s) = run_trace(&cfg, &trace, bs, mem_store(&cfg).unwrap(), exec, 1.0, opts).unwrap();
    assert!(s.same_decisions);
    assert!(m.done.iter().all(|&d| d), "not every request finished");
    assert_eq!(s.host_sched, sched);
    // 8 requests at 20 req/s keep the encoder, prefill and decode workers busy at once.
    assert!(
        m.core_rotations > 0,
        "no hand-over on one core shared by three workers"
    );
    assert_eq!(s.core_rotations, m.core_rotations);
    println!("{} hand-overs", m.core_rotations);
}

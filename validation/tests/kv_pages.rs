//! A measured run whose decode pools are tight enough to preempt, in the mode that forks:
//! every sequence's KV lives in the pages the engine's block pool gave it (handed off from
//! its prefill as real bytes, shared by fork branches, recomputed after preemption), and
//! the run still finishes every request and replays to its decisions (INVARIANTS E15).
//! The byte-level check of paging, fork sharing and copy-on-write against an unpaged
//! computation is `exec::tests::forked_branches_read_exactly_the_kv_of_their_own_tokens`.

use std::sync::Arc;

use moonagent_core::serve::Mode;
use moonagent_models::{HardwareProfile, ModelSpec};
use moonagent_sim::des::SimConfig;
use moonagent_validation::backend::RunOptions;
use moonagent_validation::compute::CpuCompute;
use moonagent_validation::exec::ComputeExecutor;
use moonagent_validation::measure::{mem_store, run_trace};
use moonagent_validation::study::{cpu_config, generate};

#[test]
fn a_run_that_forks_and_preempts_keeps_its_kv_in_the_pools_pages() {
    let spec = ModelSpec::resolve("qwen2.5-vl-tiny").unwrap();
    let hw = HardwareProfile::resolve("cpu").unwrap();
    // Room for about 1,600 tokens of KV per decode worker: a few sequences at a time.
    let tokens = 1_600.0;
    let fraction = (spec.llm_resident_bytes() as f64 + tokens * spec.kv_bytes_per_token() as f64)
        / hw.hbm_capacity_bytes as f64;
    let cfg = SimConfig {
        kv_mem_fraction: fraction,
        ..cpu_config(Mode::Full)
    };
    // 24 requests within about a second, faster than two cores serve them, so that the
    // decode pools fill whatever the host's speed: at 8 req/s a quiet host preempted
    // nothing in 1 run of 4 (2026-12-07); at 24 req/s 8-13 preemptions a run, 2-5 with
    // both cores loaded by other work.
    let (trace, bs) = generate(24, 24.0, 5).unwrap();
    let exec = Arc::new(ComputeExecutor::new(CpuCompute::new(&spec, 0).unwrap(), 3));
    let (m, s) = run_trace(
        &cfg,
        &trace,
        bs,
        mem_store(&cfg).unwrap(),
        exec,
        1.0,
        RunOptions::default(),
    )
    .unwrap();
    assert!(s.same_decisions);
    assert!(m.done.iter().all(|&d| d), "not every request finished");
    let c = m.counters;
    println!(
        "forks {}, preemptions {}, fork copy bytes {}",
        c.forks, c.preemptions, c.fork_copy_bytes
    );
    assert!(c.forks > 0, "no fork: {c:?}");
    assert!(c.preemptions > 0, "no preemption: {c:?}");
}

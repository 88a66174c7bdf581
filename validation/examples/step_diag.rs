//! Per-step diagnosis of a measured run: every compute step's measured time beside the
//! fitted profile's prediction for it alone (as `study::step_stretch` judges it), and the mean number of compute steps running
//! at once over its span (itself included), from the run's `timed.jsonl`. CSV on stdout:
//! `worker,kind,start_ns,measured_ns,predicted_ns,busy,batch,ctx_sum,waited_ns,with_encode,with_prefill,with_decode`
//! (`waited_ns`: of `measured_ns`, the time the step waited for a host core under the round
//! robin; `with_<kind>`: the time other workers ran a step of that kind during this step's
//! span, as a fraction of the span, so a step beside an encoder batch is told from one
//! beside other LLM steps). Works on a simulated run's `simulated-timed.jsonl` too.
//!
//! `cargo run --release -p moonagent-validation --example step_diag -- PROFILE.toml RUN/timed.jsonl`
use moonagent_core::serve::Mode;
use moonagent_models::{CoreWeights, CostModel, HardwareProfile, ModelSpec};
use moonagent_validation::backend::{Step, Timed, Work};
use moonagent_validation::study::{alone_ns, corunners, cpu_config, step_concurrency};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(profile), Some(timed)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: step_diag PROFILE.toml RUN/timed.jsonl");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(profile).expect("read profile");
    let hw = HardwareProfile::from_toml_str(&text, profile).expect("parse profile");
    // The model every `validate` run uses.
    let spec = ModelSpec::resolve(&cpu_config(Mode::B0).model).expect("the runs' model");
    let cost = CostModel::new(&hw, &spec, 1).expect("cost model");
    let steps: Vec<Timed> = std::fs::read_to_string(timed)
        .expect("read timed")
        .lines()
        .map(|l| serde_json::from_str(l).expect("parse timed line"))
        .filter(|t: &Timed| matches!(t.what, Work::Step(_)))
        .collect();
    let busy = step_concurrency(&steps);
    let beside = corunners(&steps);
    println!("worker,kind,start_ns,measured_ns,predicted_ns,busy,batch,ctx_sum,waited_ns,with_encode,with_prefill,with_decode");
    for &(i, busy) in &busy {
        let t = &steps[i];
        let Work::Step(s) = &t.what else { continue };
        let Some((k, p)) = alone_ns(&cost, s) else {
            continue;
        };
        let (b, c) = match s {
            Step::Prefill(chunks) => (
                chunks.len() as u32,
                chunks.iter().map(|c| u64::from(c.0 + c.1)).sum(),
            ),
            Step::Decode { batch, ctx_sum, .. } => (*batch, *ctx_sum),
            _ => (0, 0),
        };
        let w = beside[i];
        println!(
            "{},{},{},{},{p},{:.3},{b},{c},{},{:.3},{:.3},{:.3}",
            t.worker,
            CoreWeights::KINDS[k],
            t.start_ns,
            t.measured_ns,
            busy,
            t.waited_ns,
            w[0],
            w[1],
            w[2]
        );
    }
}

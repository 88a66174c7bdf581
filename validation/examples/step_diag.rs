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
use moonagent_validation::study::{alone_ns, cpu_config, step_concurrency};

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

/// The kind index of a step: 0 encode, 1 prefill, 2 decode.
fn kind_of(s: &Step) -> usize {
    match s {
        Step::Encode { .. } => 0,
        Step::Prefill(_) => 1,
        Step::Decode { .. } => 2,
    }
}

/// Per step, the time steps of each kind ran on other workers during its span, as a
/// fraction of the span. A worker's steps do not overlap, so per worker they are in start
/// order and the ones overlapping a span are found by a binary search and a short walk.
fn corunners(steps: &[Timed]) -> Vec<[f64; 3]> {
    let span = |t: &Timed| (t.start_ns, t.start_ns + t.measured_ns);
    let mut by_worker: std::collections::BTreeMap<u32, Vec<usize>> = Default::default();
    for (i, t) in steps.iter().enumerate() {
        by_worker.entry(t.worker).or_default().push(i);
    }
    for v in by_worker.values_mut() {
        v.sort_by_key(|&i| steps[i].start_ns);
    }
    steps
        .iter()
        .map(|t| {
            let (a0, a1) = span(t);
            let mut with = [0.0; 3];
            if a1 == a0 {
                return with;
            }
            for (&w, v) in &by_worker {
                if w == t.worker {
                    continue;
                }
                let first = v.partition_point(|&j| span(&steps[j]).1 <= a0);
                for &j in &v[first..] {
                    let (b0, b1) = span(&steps[j]);
                    if b0 >= a1 {
                        break;
                    }
                    if let Work::Step(s) = &steps[j].what {
                        with[kind_of(s)] += (b1.min(a1) - b0.max(a0)) as f64;
                    }
                }
            }
            with.map(|x| x / (a1 - a0) as f64)
        })
        .collect()
}

//! The order in which `validate profile` times the compute operators (`--order`): grouped
//! runs each shape back to back; interleaved runs a warm-up pass, then shuffled rounds in
//! which every shape runs once. Checked on an executor that records what it ran.

use std::sync::Mutex;
use std::time::Duration;

use moonagent_core::serve::WorkerId;
use moonagent_models::calibrate::Sample;
use moonagent_validation::backend::{ExecError, Executor, Step};
use moonagent_validation::profile::{self, Grid, Order};

/// How long each recorded step waits: every timed run takes at least this long.
const WAIT: Duration = Duration::from_micros(100);

/// Waits [`WAIT`] per step; remembers every step in call order.
#[derive(Default)]
struct Recorder(Mutex<Vec<Step>>);

impl Executor for Recorder {
    fn run(&self, _worker: WorkerId, step: &Step) -> Result<Vec<Vec<u8>>, ExecError> {
        self.0.lock().unwrap().push(step.clone());
        std::thread::sleep(WAIT);
        Ok(Vec::new())
    }
    fn fingerprint(&self, _bytes: u64) -> Result<(), ExecError> {
        Ok(())
    }
}

/// The quick grid's compute points only (no transfers or fingerprints), in `order`.
fn grid(order: Order) -> Grid {
    Grid {
        transfer: Vec::new(),
        fingerprint: Vec::new(),
        order,
        ..Grid::quick()
    }
}

/// The grid's compute steps in grid order, as `measure` builds them.
fn points(g: &Grid) -> Vec<Step> {
    let mut v: Vec<Step> = g
        .encode
        .iter()
        .map(|t| Step::Encode {
            tokens: t.clone(),
            contents: (0..t.len() as u64).collect(),
        })
        .collect();
    v.extend(g.prefill.iter().map(|&p| Step::Prefill(vec![p])));
    v.extend(g.decode.iter().map(|&(batch, ctx)| Step::Decode {
        batch,
        ctx_sum: u64::from(batch) * u64::from(ctx),
        extra: Vec::new(),
    }));
    v
}

/// What ran, the samples, and the progress names in call order.
fn record(g: &Grid) -> (Vec<Step>, Vec<Sample>, Vec<String>) {
    let r = Recorder::default();
    let mut told = Vec::new();
    let samples = profile::measure(g, &r, |op| told.push(op.to_string())).expect("measure");
    (r.0.into_inner().unwrap(), samples, told)
}

/// The operator progress names for `steps`.
fn names(steps: &[Step]) -> Vec<String> {
    steps
        .iter()
        .map(|p| match p {
            Step::Encode { .. } => "encode",
            Step::Prefill(_) => "prefill",
            Step::Decode { .. } => "decode",
        })
        .map(String::from)
        .collect()
}

/// The samples name the grid's points, in grid order, whatever the order of timing, and
/// each is a timed run's (at least [`WAIT`]).
fn check_samples(g: &Grid, samples: &[Sample]) {
    let want = points(g);
    assert_eq!(samples.len(), want.len());
    for (s, p) in samples.iter().zip(&want) {
        let ns = match s {
            Sample::Encoder { measured_ns, .. }
            | Sample::Prefill { measured_ns, .. }
            | Sample::Decode { measured_ns, .. } => *measured_ns,
            other => panic!("not a compute sample: {other:?}"),
        };
        assert!(ns >= WAIT.as_nanos() as u64, "{s:?} is shorter than a run");
        let same = match (s, p) {
            (Sample::Encoder { visual_tokens, .. }, Step::Encode { tokens, .. }) => {
                visual_tokens == tokens
            }
            (
                Sample::Prefill {
                    new_tokens,
                    cached_tokens,
                    ..
                },
                Step::Prefill(c),
            ) => c == &vec![(*new_tokens, *cached_tokens)],
            (
                Sample::Decode {
                    batch,
                    context_tokens,
                    ..
                },
                Step::Decode {
                    batch: b, ctx_sum, ..
                },
            ) => batch == b && context_tokens == ctx_sum,
            _ => false,
        };
        assert!(same, "sample {s:?} for point {p:?}");
    }
}

#[test]
fn grouped_times_each_shape_back_to_back() {
    let g = grid(Order::Grouped);
    let (ran, samples, told) = record(&g);
    assert_eq!(
        told,
        names(&points(&g)),
        "progress after each shape, in grid order"
    );
    let want: Vec<Step> = points(&g)
        .into_iter()
        .flat_map(|p| std::iter::repeat_n(p, 1 + g.repeats))
        .collect();
    assert_eq!(
        ran, want,
        "one warm-up and {} timed runs per shape, in grid order",
        g.repeats
    );
    check_samples(&g, &samples);
}

#[test]
fn interleaved_warms_every_shape_then_times_each_once_per_shuffled_round() {
    let g = grid(Order::Interleaved);
    let want = points(&g);
    let n = want.len();
    let (ran, samples, told) = record(&g);
    assert_eq!(
        ran.len(),
        n * (1 + g.repeats),
        "a warm-up pass and {} rounds",
        g.repeats
    );
    assert_eq!(ran[..n], want[..], "the warm-up pass runs in grid order");
    let mut shuffled = 0;
    for (k, round) in ran[n..].chunks(n).enumerate() {
        let mut idx: Vec<usize> = round
            .iter()
            .map(|s| want.iter().position(|p| p == s).expect("a grid point"))
            .collect();
        if idx.windows(2).any(|w| w[0] > w[1]) {
            shuffled += 1;
        }
        idx.sort_unstable();
        assert_eq!(
            idx,
            (0..n).collect::<Vec<_>>(),
            "round {k} runs every shape once"
        );
    }
    assert_eq!(shuffled, g.repeats, "every round is shuffled ({n} shapes)");
    // Runs of one shape are spread out: no shape runs twice in a row after the warm-up.
    assert!(
        ran[n..].windows(2).filter(|w| w[0] == w[1]).count() <= g.repeats,
        "consecutive runs of one shape happen only across a round boundary"
    );
    assert_eq!(
        told,
        names(&ran[n * g.repeats..]),
        "progress once per shape, as the last round times it"
    );
    check_samples(&g, &samples);
    // The shuffle is seeded: the same grid runs in the same order again.
    assert_eq!(record(&g).0, ran);
}

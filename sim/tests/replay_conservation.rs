//! Counter conservation and determinism of the store-level replay, on a small seed-002
//! session workload at capacities from heavy pressure (most of the store leased, puts
//! failing for space) to none, under every policy.

use moonagent_core::store::{DataType, MemStoreConfig, PolicyConfig};
use moonagent_sim::replay::ablation;
use moonagent_sim::replay::{
    policy_by_name, replay_all, replay_grid, Compiled, LabelledPolicy, PolicyResult, ReplayError,
    NEVER, POLICY_NAMES,
};

fn every_policy() -> Vec<LabelledPolicy> {
    let mut v: Vec<LabelledPolicy> = POLICY_NAMES
        .iter()
        .filter(|n| **n != "hierarchical")
        .map(|n| LabelledPolicy::by_name(n).expect("default policy"))
        .collect();
    v.extend(ablation::seed_policies().into_iter().skip(1));
    v.push(LabelledPolicy {
        label: "hierarchical".into(),
        policy: ablation::hierarchical(),
    });
    v
}

fn small() -> Compiled {
    ablation::sessions_trace(60, 3).expect("workload")
}

fn check(r: &PolicyResult, c: &Compiled, capacity: u64) {
    let s = &r.store;
    let mut sum = moonagent_sim::replay::TypeResult::default();
    for t in DataType::ALL {
        let x = r.of(t);
        let ctx = format!("{} {}", r.label, t.name());
        let misses = x.lookups - x.hits;
        assert!(x.hits <= x.lookups, "{ctx}");
        assert!(x.reuse_lookups <= x.lookups, "{ctx}");
        // A first reference can never hit: every hit is a re-reference hit.
        assert_eq!(x.hits, x.reuse_hits, "{ctx}");
        assert!(x.hit_bytes <= x.lookup_bytes, "{ctx}");
        assert!(x.saved_ns <= x.reuse_penalty_ns, "{ctx}");
        assert!(x.reuse_penalty_ns <= x.penalty_ns, "{ctx}");
        assert!(x.puts + x.puts_no_space + x.puts_exists <= misses, "{ctx}");
        if t == DataType::EncoderOutput {
            // Every encoder-output miss is recomputed and put once.
            assert_eq!(x.puts + x.puts_no_space + x.puts_exists, misses, "{ctx}");
        }
        // The replay's counts agree with the store's own.
        let st = &s.by_type[t.index()];
        assert_eq!(x.puts, st.puts, "{ctx}");
        assert_eq!(x.puts_no_space, st.put_no_space, "{ctx}");
        assert_eq!(x.evicted, st.evicted, "{ctx}");
        assert!(x.evicted <= x.puts, "{ctx}");
        // Nothing is removed: resident = put - evicted.
        assert_eq!(st.resident, st.puts - st.evicted, "{ctx}");
        sum.lookups += x.lookups;
        sum.hits += x.hits;
        sum.saved_ns += x.saved_ns;
        sum.penalty_ns += x.penalty_ns;
        sum.puts_exists += x.puts_exists;
        sum.evicted_bytes += x.evicted_bytes;
    }
    assert_eq!(sum.lookups, r.total.lookups);
    assert_eq!(sum.hits, r.total.hits);
    assert_eq!(sum.saved_ns, r.total.saved_ns);
    assert_eq!(sum.penalty_ns, r.total.penalty_ns);
    assert_eq!(sum.puts_exists, s.put_exists);
    assert_eq!(r.total.lookups, c.accesses.len() as u64);
    let resident: u64 = s.by_type.iter().map(|t| t.resident_bytes).sum();
    assert!(resident <= capacity, "{}", r.label);
    assert_eq!(s.policy_refused, 0, "{}", r.label);
    assert_eq!(s.removed, 0);
}

#[test]
fn counters_are_conserved_under_every_policy_and_pressure() {
    let c = small();
    let total = c.unique_total();
    let caps: Vec<u64> = [0.005, 0.05, 0.2, 2.0]
        .iter()
        .map(|s| (total as f64 * s) as u64)
        .collect();
    let cfgs: Vec<MemStoreConfig> = caps
        .iter()
        .map(|&b| MemStoreConfig::with_capacity(b))
        .collect();
    let pols = every_policy();
    let grid = replay_grid(&c, &cfgs, &pols).expect("replay");
    for (cap, results) in caps.iter().zip(&grid) {
        for r in results {
            check(r, &c, *cap);
        }
    }
    // Heavy pressure really refuses puts for space; no pressure evicts nothing.
    assert!(grid[0].iter().all(|r| r.total.puts_no_space > 0));
    assert!(grid[3]
        .iter()
        .all(|r| r.total.evicted == 0 && r.total.puts_no_space == 0));
    // With room for everything, every re-reference hits under every policy.
    for r in &grid[3] {
        assert_eq!(r.total.hits, r.total.reuse_lookups, "{}", r.label);
    }
}

#[test]
fn compiled_trace_next_access_and_reuse_marks_are_consistent() {
    let c = small();
    assert_eq!(c.objects.len(), c.accesses.len());
    let mut seen = std::collections::HashSet::new();
    for (i, a) in c.accesses.iter().enumerate() {
        assert_eq!(a.is_reuse(), !seen.insert((a.dtype, a.id)), "access {i}");
        if a.next != NEVER {
            let n = &c.accesses[a.next as usize];
            assert!(a.next as usize > i);
            assert_eq!((n.dtype, n.id), (a.dtype, a.id));
            assert_eq!(c.objects[a.next as usize], c.objects[i]);
        }
    }
    assert_eq!(seen.len() as u32, c.distinct);
    let mut again = c.clone();
    again.fill_next();
    assert_eq!(again.accesses, c.accesses);
    assert_eq!(again.objects, c.objects);
}

#[test]
fn replay_is_deterministic_across_runs_and_thread_counts() {
    let c = small();
    let cfg = MemStoreConfig::with_capacity(c.unique_total() / 10);
    let pols = every_policy();
    let with = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool")
            .install(|| replay_all(&c, &cfg, &pols).expect("replay"))
    };
    let one = with(1);
    let two = with(2);
    assert_eq!(one, two);
    assert_eq!(one, with(2));
    // Byte-identical as reported.
    assert_eq!(
        serde_json::to_string(&one).expect("json"),
        serde_json::to_string(&two).expect("json")
    );
    // The same workload generated and compiled again gives the same results.
    let c2 = small();
    assert_eq!(c2.accesses, c.accesses);
    let again = replay_all(&c2, &cfg, &pols).expect("replay");
    assert_eq!(again, one);
    assert_eq!(
        one.iter()
            .map(|r| r.label.as_str())
            .collect::<Vec<_>>()
            .len(),
        pols.len()
    );
}

#[test]
fn bad_inputs_are_refused_with_the_reason() {
    let e = policy_by_name("lfu").unwrap_err().to_string();
    assert!(
        e.contains("unknown policy \"lfu\"") && e.contains("mooncake-default"),
        "{e}"
    );
    let e = policy_by_name("hierarchical").unwrap_err().to_string();
    assert!(e.contains("needs settings"), "{e}");
    assert!(matches!(
        policy_by_name("s3-fifo"),
        Ok(PolicyConfig::S3Fifo(_))
    ));
    // Out-of-order accesses.
    let mut c = Compiled::default();
    c.push(10, 1, 1, 1, DataType::KvCache, 0, 1).expect("push");
    let e = c.push(5, 2, 1, 1, DataType::KvCache, 0, 1).unwrap_err();
    assert!(
        matches!(e, ReplayError::OutOfOrder { time: 5, last: 10 }),
        "{e}"
    );
    assert!(e.to_string().contains("arrival order"), "{e}");
    // A replay of an unfinished compiled trace.
    let lp = LabelledPolicy::by_name("lru").expect("lru");
    let e = moonagent_sim::replay::replay_one(&c, &MemStoreConfig::default(), &lp).unwrap_err();
    assert!(matches!(e, ReplayError::NotFilled), "{e}");
    assert!(e.to_string().contains("fill_next"), "{e}");
    c.fill_next();
    assert!(moonagent_sim::replay::replay_one(&c, &MemStoreConfig::default(), &lp).is_ok());
    // A store config with no capacity.
    let e =
        moonagent_sim::replay::replay_one(&c, &MemStoreConfig::with_capacity(0), &lp).unwrap_err();
    assert!(matches!(e, ReplayError::StoreConfig(_)), "{e}");
    assert!(e.to_string().contains("capacity_bytes"), "{e}");
    // Objects over 4 GiB.
    let e = c
        .push(20, 3, 5 << 30, 1, DataType::KvCache, 0, 1)
        .unwrap_err();
    assert!(
        matches!(e, ReplayError::ObjectTooLarge { bytes } if bytes == 5 << 30),
        "{e}"
    );
    assert!(e.to_string().contains("4 GiB"), "{e}");
}

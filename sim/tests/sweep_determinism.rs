//! Determinism of sweeps: the same plan run on 1 thread, on 2 threads, and as 3 shards
//! merged gives byte-identical results and summary tables, for both kinds of run.

mod sweep_common;

use moonagent_sim::sweep::{self, Shard, RESULTS_FILE, SUMMARY_FILE};
use sweep_common::*;

fn identical_tables_on_1_2_threads_and_3_merged_shards(name: &str, plan: &str, runs: usize) {
    let dir = scratch(name);
    let prep = prepare(&dir, plan);
    assert_eq!(prep.plan.runs(), runs);
    let one = run(&prep, &dir.join("t1"), 1, None);
    assert_eq!((one.executed, one.threads), (runs, 1));
    let two = run(&prep, &dir.join("t2"), 2, None);
    assert_eq!(two.threads, 2);
    let mut shards = Vec::new();
    for i in 0..3 {
        let out = dir.join(format!("shard{i}"));
        let r = run(&prep, &out, 1, Some(Shard { index: i, count: 3 }));
        assert!(r.executed < runs, "a shard runs a subset");
        shards.push(out);
    }
    let merged = dir.join("merged").join(RESULTS_FILE);
    let m = sweep::merge(&shards, &merged, None).unwrap();
    assert_eq!(m.runs, runs);
    for file in [RESULTS_FILE, SUMMARY_FILE] {
        let a = bytes(&dir.join("t1").join(file));
        assert_eq!(
            a,
            bytes(&dir.join("t2").join(file)),
            "{file}: 1 vs 2 threads"
        );
        assert_eq!(
            a,
            bytes(&dir.join("merged").join(file)),
            "{file}: 1 thread vs 3 merged shards"
        );
    }
    let t = sweep::table::read_results(&dir.join("t1")).unwrap();
    assert_eq!(t.point.len(), runs);
    let mut keys: Vec<(u32, u64)> = t
        .point
        .iter()
        .copied()
        .zip(t.seed.iter().copied())
        .collect();
    let sorted = {
        let mut k = keys.clone();
        k.sort_unstable();
        k
    };
    assert_eq!(keys, sorted, "rows sorted by (point, seed)");
    keys.dedup();
    assert_eq!(keys.len(), runs, "every run exactly once");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn replay_sweep_is_byte_identical_on_1_thread_2_threads_and_3_merged_shards() {
    identical_tables_on_1_2_threads_and_3_merged_shards("det-replay", REPLAY_PLAN, 8);
}

#[test]
fn simulate_sweep_is_byte_identical_on_1_thread_2_threads_and_3_merged_shards() {
    identical_tables_on_1_2_threads_and_3_merged_shards("det-sim", SIM_PLAN, 8);
}

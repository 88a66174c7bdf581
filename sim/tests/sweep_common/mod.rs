//! Helpers shared by the sweep integration tests (included with `mod sweep_common;`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use moonagent_sim::sweep::{self, Plan, Prepared, RunOptions, Shard};

/// A fresh, empty scratch folder for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moonagent-sweep-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Write `text` as `dir/plan.toml` and prepare it.
pub fn prepare(dir: &Path, text: &str) -> Prepared {
    let path = dir.join("plan.toml");
    std::fs::write(&path, text).unwrap();
    Plan::from_file(&path, &[]).unwrap().prepare().unwrap()
}

/// Run `prep` into `out` with `threads` workers (optionally one shard), quietly.
pub fn run(prep: &Prepared, out: &Path, threads: usize, shard: Option<Shard>) -> sweep::RunReport {
    sweep::run(
        prep,
        &RunOptions {
            out: out.to_path_buf(),
            threads,
            shard,
            resume: false,
            progress: false,
            fsync: false,
        },
    )
    .unwrap()
}

pub fn bytes(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Point files (not temporaries) in a sweep folder.
pub fn point_files(out: &Path) -> usize {
    std::fs::read_dir(out.join("points"))
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.ends_with(".json") && !n.starts_with('.')
                })
                .count()
        })
        .unwrap_or(0)
}

/// A small replay plan over W3 (repeated images): 2 capacities x 2 reuse scales, 2 seeds.
pub const REPLAY_PLAN: &str = r#"
kind = "replay"
seeds = 2

[base]
capacity = "10%"
workload = { generator = "w3", config = { requests = 300 } }
policy = { policy = "type-aware", types = { encoder_output = { eviction_grace_ms = 1000 } } }

[[axis]]
name = "capacity"
path = "capacity"
values = ["5%", "20%"]

[[axis]]
name = "reuse_scale"
path = "policy.types.encoder_output.reuse_scale"
values = [1.0, 8.0]
"#;

/// A small simulator plan over W3: encoder count zipped with prefill count, x repeat rate.
pub const SIM_PLAN: &str = r#"
kind = "simulate"
seeds = [5, 9]
metrics = ["ttft_ms.*", "encoder_gpu_s", "image_hit_rate", "completed", "link_bytes.*"]

[base]
gpus = 8
decodes = 3
workload = { generator = "w3", config = { requests = 40, rate = 20.0 } }

[[axis]]
path = "encoders"
values = [1, 2]
zip = "roles"

[[axis]]
path = "prefills"
values = [4, 3]
zip = "roles"

[[axis]]
name = "repeat_rate"
path = "workload.config.repeat_rate"
values = [0.0, 0.7]
"#;

//! `moonagent validate ... --compute cuda` on a machine without a GPU: a clear error on
//! stderr and a failing exit status, never a panic. Without the `cuda` feature the error
//! says how to build with it; with the feature (and no NVIDIA driver or GPU here) it is the
//! backend's "no GPU available" error. On a machine with a GPU and the feature the run (4
//! requests) goes through and the test only checks that nothing panicked.

use std::process::Command;

fn validate_run_cuda() -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("moonagent-cli-cuda-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_moonagent"))
        .args(["validate", "run", "--compute", "cuda", "--gpu", "0"])
        .args(["--requests", "4", "--rate", "100", "--out"])
        .arg(&dir)
        .output()
        .expect("run moonagent");
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn compute_cuda_without_a_gpu_is_a_clear_error() {
    let (ok, err) = validate_run_cuda();
    assert!(!err.contains("panicked"), "{err}");
    if cfg!(feature = "cuda") {
        if ok {
            return; // a GPU is here: the device path ran
        }
        assert!(err.contains("--compute cuda: no GPU available: "), "{err}");
    } else {
        assert!(!ok, "{err}");
        assert!(
            err.contains("built without the `cuda` feature")
                && err.contains("cargo build --release --features cuda"),
            "{err}"
        );
    }
}

#[test]
fn compute_takes_cpu_or_cuda_only() {
    let out = Command::new(env!("CARGO_BIN_EXE_moonagent"))
        .args(["validate", "run", "--compute", "tpu"])
        .output()
        .expect("run moonagent");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid value 'tpu'") && err.contains("cpu") && err.contains("cuda"),
        "{err}"
    );
}

//! The `transfer-engine` feature links Mooncake's Transfer Engine (through mooncake-rs),
//! which `scripts/transfer_engine.sh build` builds from the vendored source. Stop with a
//! line naming that script when its library folder is not given, instead of a linker
//! error; and give this package's tests an rpath to it so they run without
//! `LD_LIBRARY_PATH`.

fn main() {
    println!("cargo:rerun-if-env-changed=TRANSFER_ENGINE_LIB_DIR");
    if std::env::var_os("CARGO_FEATURE_TRANSFER_ENGINE").is_none() {
        return;
    }
    let how = "run `export $(bash scripts/transfer_engine.sh build)` (it builds the engine once per machine, ~12 min on 2 cores) and build again";
    let Some(dir) = std::env::var_os("TRANSFER_ENGINE_LIB_DIR") else {
        eprintln!("error: the transfer-engine feature needs TRANSFER_ENGINE_LIB_DIR: {how}");
        std::process::exit(1);
    };
    let dir = std::path::PathBuf::from(dir);
    let lib = dir.join("libtransfer_engine.so");
    if !lib.is_file() {
        eprintln!(
            "error: the transfer-engine feature: {} not found (TRANSFER_ENGINE_LIB_DIR={}): {how}",
            lib.display(),
            dir.display()
        );
        std::process::exit(1);
    }
    if dir.join("libtransfer_engine.a").exists() {
        eprintln!(
            "error: {} holds libtransfer_engine.a: mooncake-rs then links statically and fails on libstdc++ symbols; keep only the .so files there ({how})",
            dir.display()
        );
        std::process::exit(1);
    }
    println!("cargo:rerun-if-changed={}", lib.display());
    // An RPATH (not RUNPATH): it also serves the libraries' own dependencies (libasio).
    println!(
        "cargo:rustc-link-arg=-Wl,--disable-new-dtags,-rpath,{}",
        dir.display()
    );
}

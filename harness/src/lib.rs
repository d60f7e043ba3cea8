//! What the measurement harnesses share. Each harness is a program of `src/bin/`, measuring real
//! processes for minutes and printing a table for `docs/performance.md`: programs, not
//! benchmarks, so they live where programs live and run by name.

use std::path::PathBuf;

/// The `planned-stop` binary of the same build profile as the running harness
/// (`target/<profile>/planned-stop`, beside the harness itself): the harnesses start it
/// as real processes. Build it first (`cargo build --release`). `PLANNED_STOP_BINARY` names another
/// build instead (a baseline to measure side by side).
pub fn planned_stop_binary() -> PathBuf {
    // Another build to compare with (a baseline measured in the same run).
    if let Some(binary) = std::env::var_os("PLANNED_STOP_BINARY") {
        return PathBuf::from(binary);
    }
    let exe = std::env::current_exe().expect("the harness's own path");
    let dir = exe.parent().expect("target/<profile>/");
    let binary = dir.join(format!("planned-stop{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} not found: run `cargo build --release` first",
        binary.display()
    );
    binary
}

/// The harness's arguments, its own path first, as `std::env::args` gives them.
pub fn args() -> impl Iterator<Item = String> {
    std::env::args()
}

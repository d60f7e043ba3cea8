//! What the measurement harnesses share.

// Each harness uses its part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The `planned-stop` binary of the same build profile as the running harness
/// (`target/<profile>/planned-stop`, next to `target/<profile>/deps/`): the harnesses start it
/// as real processes. Build it first (`cargo build --release`). `PLANNED_STOP_BINARY` names another
/// build instead (a baseline to measure side by side).
pub fn planned_stop_binary() -> PathBuf {
    // Another build to compare with (a baseline measured in the same run).
    if let Some(binary) = std::env::var_os("PLANNED_STOP_BINARY") {
        return PathBuf::from(binary);
    }
    let exe = std::env::current_exe().expect("the harness's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/");
    let binary = dir.join(format!("planned-stop{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} not found: run `cargo build --release` first",
        binary.display()
    );
    binary
}

/// The harness's arguments, its own path first, as `std::env::args` gives them — without the
/// `--bench` that `cargo bench` adds.
pub fn args() -> impl Iterator<Item = String> {
    std::env::args().filter(|a| a != "--bench")
}

//! What the example harnesses share.

use std::path::{Path, PathBuf};

/// The `planned-stop` binary of the same build profile as the running example
/// (`target/<profile>/planned-stop`, next to `target/<profile>/examples/`): the harnesses start it
/// as real processes. Build it first (`cargo build --release`). `PLANNED_STOP_BINARY` names another
/// build instead (a baseline to measure side by side).
pub fn planned_stop_binary() -> PathBuf {
    // Another build to compare with (a baseline measured in the same run).
    if let Some(binary) = std::env::var_os("PLANNED_STOP_BINARY") {
        return PathBuf::from(binary);
    }
    let exe = std::env::current_exe().expect("the example's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/examples/");
    let binary = dir.join(format!("planned-stop{}", std::env::consts::EXE_SUFFIX));
    assert!(
        binary.exists(),
        "{} not found: run `cargo build --release` first",
        binary.display()
    );
    binary
}

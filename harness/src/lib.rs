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

/// A stop record of `n` unfinished items, ids `TAG-0000000` on: each its own participant
/// (`job-I`) with a short string for its item, as a service of `n` one-job participants hands
/// back.
pub fn record(n: usize, tag: &str) -> planned_stop::record::StopRecord {
    let at = chrono::Utc::now();
    let items: Vec<_> = (0..n)
        .map(|i| serde_json::json!({"id": format!("{tag}-{i:07}"), "participant": format!("job-{i}"), "item": format!("job-{i}")}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "pid": 1, "cause": {"kind": "marker"}, "verdict": "planned", "request_id": null,
        "reason": null, "stopper_pid": null, "accepted_at": at, "drain_deadline": at,
        "finished_at": at, "drained_in_time": true, "forced": false, "unfinished": items,
        "unanswered": [], "exit_code": 0,
    }))
    .expect("a stop record")
}

/// A current-thread tokio runtime with timers and I/O, to run a store's futures on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

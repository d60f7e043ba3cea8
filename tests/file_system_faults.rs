//! A marker directory that turns read-only or fills up under a running service: the stopper fails
//! with a clear error, no partial marker is left, and the service keeps running.
//!
//! The directory is a tmpfs mounted by the test (root only): the tests are `#[ignore]`d with that
//! reason, and `.ci/run` (root) runs them with `--ignored`.

#![cfg(unix)]

use crate::common;

use common::process::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted for the test (root only; skipped where mounting is not allowed).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let ok = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
                s(path),
            ])
            .status()
            .is_ok_and(|st| st.success());
        assert!(
            ok,
            "cannot mount a tmpfs here (needs root and mount rights)"
        );
        Tmpfs(path.to_path_buf())
    }

    fn remount(&self, mode: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,{mode}"), s(&self.0)])
            .status()
            .unwrap();
        assert!(st.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").args(["-l", s(&self.0)]).status();
    }
}

#[test]
#[ignore = "needs root and mount rights (a tmpfs): .ci/run runs it with --ignored"]
fn a_read_only_marker_directory_fails_the_stopper_and_the_service_keeps_running() {
    let base = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&base.path().join("m"), "1m");
    let run_dir = fs.0.join("run");
    let mut service = Serve::start(&["--dir", s(&run_dir), "--poll-ms", "10"]);
    fs.remount("ro");
    let out = run(&["stop", "--pid", &service.pid_arg(), "--dir", s(&run_dir)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Read-only file system"),
        "the error says why: {err}"
    );
    service.wait_probes("absent", 5);
    assert!(service.running(), "the service keeps running");
    fs.remount("rw");
    assert_eq!(
        stop_json(&run_dir, &service.pid_arg(), &["--wait", "20"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(service.exit_code(), Some(0));
}

#[test]
#[ignore = "needs root and mount rights (a tmpfs): .ci/run runs it with --ignored"]
fn a_full_marker_directory_fails_the_stopper_leaves_no_partial_marker_and_the_service_keeps_running()
 {
    let base = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&base.path().join("m"), "64k");
    let run_dir = fs.0.join("run");
    let mut service = Serve::start(&["--dir", s(&run_dir), "--poll-ms", "10"]);
    // Fill the file system.
    let filler = fs.0.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 1 << 20]);
    let out = run(&["stop", "--pid", &service.pid_arg(), "--dir", s(&run_dir)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No space left"), "the error says why: {err}");
    let leftovers: Vec<_> = std::fs::read_dir(&run_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    // Only the service's own announcement that it watches the directory.
    let presence = format!("planned-stop-{}.watching.json", service.pid_arg());
    assert_eq!(
        leftovers,
        [std::ffi::OsString::from(presence)],
        "no partial marker or temp file left"
    );
    service.wait_probes("absent", 5);
    assert!(service.running());
    std::fs::remove_file(&filler).unwrap();
    assert_eq!(
        stop_json(&run_dir, &service.pid_arg(), &["--wait", "20"])
            .status
            .code(),
        Some(0)
    );
    assert_eq!(service.exit_code(), Some(0));
}

#[test]
#[ignore = "needs root and mount rights (a tmpfs): .ci/run runs it with --ignored"]
fn a_full_state_directory_at_the_stop_is_record_lost_never_planned_and_the_items_are_in_the_log() {
    let base = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&base.path().join("state"), "64k");
    let run_dir = base.path().join("run");
    let state = fs.0.join("state");
    let mut service = Serve::start(&[
        "--dir",
        s(&run_dir),
        "--state",
        s(&state),
        "--jobs",
        "3",
        "--job-ms",
        "600000",
        "--drain-ms",
        "50",
    ]);
    let filler = fs.0.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 1 << 20]);
    let pid = service.pid_arg();
    let out = stop_json(&run_dir, &pid, &["--wait", "20"]);
    let report = json_of(&out);
    assert_eq!(report["outcome"], "record_lost", "{report}");
    assert_eq!(out.status.code(), Some(10));
    assert_eq!(
        service.exit_code(),
        Some(74),
        "a lost record is never exit 0"
    );
    let stderr = service.stderr_after_exit();
    assert!(
        stderr.contains("No space left"),
        "the error says why: {stderr}"
    );
    for i in 0..3 {
        assert!(
            stderr.contains(&format!("job-{pid}-{i}")),
            "every item is in the log: {stderr}"
        );
    }
}

/// The marker directory fills during a drain. The service stopped as
/// planned with both items stored, but its final outcome could not be written, so the stopper
/// answered `killed_while_draining` (9), "no stop record was written". The accepted stop now
/// keeps room for its final outcome: the stopper answers `stopped_planned`, 0.
#[test]
#[ignore = "needs root and mount rights (a tmpfs): .ci/run runs it with --ignored"]
fn a_marker_directory_that_fills_during_the_drain_still_gets_the_final_outcome() {
    let base = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&base.path().join("m"), "64k");
    let run_dir = fs.0.join("run");
    let (state, go) = (base.path().join("state"), base.path().join("go"));
    let mut cmd = Command::new(common::helper_program("slow_drain_service"));
    cmd.env("FS_RUN", &run_dir)
        .env("FS_STATE", &state)
        .env("FS_GO", &go)
        .stdout(std::process::Stdio::null());
    let mut service = common::Helper::new(cmd.spawn().unwrap());
    let pid = service.id();
    let presence = run_dir.join(format!("planned-stop-{pid}.watching.json"));
    common::wait_until("the service announces itself", || presence.exists());
    let stopper = planned_stop()
        .args(["stop", "--pid", &pid.to_string(), "--dir", s(&run_dir)])
        .args(["--wait", "20", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let outcome = run_dir.join(format!("planned-stop-{pid}.outcome.json"));
    let draining = || std::fs::read_to_string(&outcome).is_ok_and(|t| t.contains("draining"));
    common::wait_until("the stop is accepted", draining);
    // Fill the file system to the last byte, then let the drain end.
    let mut n = 0;
    while std::fs::write(fs.0.join(format!("filler-{n}")), vec![0u8; 4096]).is_ok() {
        n += 1;
    }
    std::fs::write(&go, b"").unwrap();
    let out = stopper.wait_with_output().unwrap();
    let report = json_of(&out);
    assert_eq!(report["outcome"], "stopped_planned", "{report}");
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["drain"]["handed_back"], 2, "{report}");
    assert_eq!(service.wait().unwrap().code(), Some(0));
}

/// On a read-only state directory holding a pending item, `serve` became
/// ready, reported `resumed … jobs: 0`, and its planned stop then ended `record_lost` (74): it
/// could neither resume nor record. It now refuses to start (exit 2), saying why.
#[test]
#[ignore = "needs root and mount rights (a tmpfs): .ci/run runs it with --ignored"]
fn a_read_only_state_directory_is_refused_at_start() {
    let base = tempfile::tempdir().unwrap();
    let fs = Tmpfs::mount(&base.path().join("state"), "1m");
    let run_dir = base.path().join("run");
    let state = fs.0.join("state");
    let args = [
        "--dir",
        s(&run_dir),
        "--state",
        s(&state),
        "--drain-ms",
        "50",
    ];
    let mut first = Serve::start(&[&args[..], &["--jobs", "1", "--job-ms", "600000"]].concat());
    let out = stop_json(&run_dir, &first.pid_arg(), &["--wait", "20"]);
    assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
    assert_eq!(first.exit_code(), Some(0));
    fs.remount("ro");
    let mut serve = common::Helper::new(
        planned_stop()
            .arg("serve")
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let ended = common::wait_for("serve ends at once", || serve.try_wait().unwrap());
    let read = |pipe: Option<&mut dyn std::io::Read>| {
        let mut text = String::new();
        pipe.unwrap().read_to_string(&mut text).unwrap();
        text
    };
    let err = read(serve.0.stderr.as_mut().map(|p| p as &mut dyn std::io::Read));
    let out = read(serve.0.stdout.as_mut().map(|p| p as &mut dyn std::io::Read));
    assert_eq!(ended.code(), Some(2), "{err}");
    assert!(err.contains("Read-only file system"), "says why: {err}");
    assert!(out.is_empty(), "never ready: {out}");
    fs.remount("rw");
}

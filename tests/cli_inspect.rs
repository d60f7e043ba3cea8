//! `planned-stop inspect` prints the verdict the owner would reach and changes nothing.

mod common;

use chrono::Utc;
use planned_stop::{Marker, ProcessIdentity};
use std::process::Command;

fn planned_stop() -> Command {
    Command::new(env!("CARGO_BIN_EXE_planned-stop"))
}

#[test]
fn inspect_reports_the_owners_verdict_and_leaves_the_slot() {
    let dir = tempfile::tempdir().unwrap();
    let me = ProcessIdentity::current().unwrap();
    let slot = dir.path().join(format!("planned-stop-{}.json", me.pid));

    let cases = [
        (
            Marker::new(me.pid, Some(me.start), Utc::now())
                .to_json()
                .unwrap(),
            "for_self",
        ),
        (
            Marker::new(me.pid, Some(me.start + 1), Utc::now())
                .to_json()
                .unwrap(),
            "stale",
        ),
        (b"{not json".to_vec(), "malformed"),
    ];
    for (bytes, expected) in cases {
        std::fs::write(&slot, &bytes).unwrap();
        let by_file = planned_stop()
            .arg("inspect")
            .arg(&slot)
            .arg("--json")
            .output()
            .unwrap();
        let by_pid = planned_stop()
            .args(["inspect", "--json", "--pid", &me.pid.to_string(), "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        for out in [by_file, by_pid] {
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(v["verdict"], expected, "{v}");
        }
        assert_eq!(
            std::fs::read(&slot).unwrap(),
            bytes,
            "inspect changed the slot"
        );
    }
}

#[test]
fn inspect_of_a_missing_directory_creates_nothing() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("absent");
    let out = planned_stop()
        .args(["inspect", "--pid", "1", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("absent"));
    assert!(!dir.exists());
}

#[test]
fn inspect_without_a_target_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = planned_stop()
        .args(["inspect", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pid"));
}

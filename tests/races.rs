//! Races with real processes: stoppers, the service's watcher and SIGTERM on one target at once,
//! round after round; every round ends with exactly one accepted stop whose exit code is its
//! verdict's (planned and 0 once a marker was there; unexpected and 1 for a SIGTERM that came first).

#![cfg(unix)]

use crate::common;

use common::process::*;

/// Two stoppers, the service's watcher and a SIGTERM race on one target, round after round:
/// every round ends with exactly one accepted stop, and its exit code and record say its verdict —
/// planned and 0 when a marker was there before the SIGTERM was handled, unexpected and 1 when the
/// SIGTERM came first (the test below writes the markers first and asserts 0 every round).
#[test]
fn racing_stoppers_a_watcher_and_sigterm_give_one_planned_stop_every_round() {
    let base = tempfile::tempdir().unwrap();
    let run_dir = base.path().join("run");
    let state = base.path().join("state");
    for round in 0..15 {
        let mut service = Serve::start(&[
            "--dir",
            s(&run_dir),
            "--state",
            s(&state),
            "--poll-ms",
            "2",
            "--drain-ms",
            "100",
        ]);
        let pid = service.pid_arg();
        let stoppers: Vec<_> = (0..2)
            .map(|_| {
                planned_stop()
                    .args(["stop", "--pid", &pid, "--dir", s(&run_dir), "--json"])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        // The SIGTERM lands somewhere among the two writes and the watcher's probes.
        if round % 3 != 0 {
            std::thread::yield_now();
        }
        service.signal(libc::SIGTERM);
        for stopper in stoppers {
            let out = stopper.wait_with_output().unwrap();
            // A stopper that came after the exit finds the process gone: also fine.
            assert!(
                matches!(out.status.code(), Some(0) | Some(5)),
                "round {round}: {out:?}"
            );
        }
        // Either the SIGTERM found a marker (planned) or it came first and the marker came too
        // late (unexpected): but one or the other, once, and the exit code says which.
        let code = service.exit_code();
        // The last line; once it is read, every earlier event has been read too.
        service.expect("exit");
        let accepted: Vec<_> = {
            service
                .history
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e["event"] == "stop_accepted")
                .cloned()
                .collect()
        };
        assert_eq!(accepted.len(), 1, "round {round}: {accepted:?}");
        let planned = accepted[0]["verdict"] == "planned";
        assert_eq!(code, Some(if planned { 0 } else { 1 }), "round {round}");
        let record = planned_stop::record::FileRecordStore::read_last_stop(&state)
            .unwrap()
            .unwrap();
        std::fs::remove_file(state.join("planned-stop-record.json")).unwrap();
        assert_eq!(record.exit_code, code.unwrap());
    }
}

/// The stoppers write their markers first; only then does the SIGTERM race the watcher. Every
/// round must be planned (hazard 1 in docs/protocol.md: a SIGTERM after the watcher consumed the marker exited 1).
#[test]
fn stoppers_then_sigterm_racing_the_watcher_are_planned_every_round() {
    let base = tempfile::tempdir().unwrap();
    let run_dir = base.path().join("run");
    for round in 0..20 {
        let mut service =
            Serve::start(&["--dir", s(&run_dir), "--poll-ms", "1", "--drain-ms", "50"]);
        let pid = service.pid_arg();
        let outs: Vec<_> = (0..3)
            .map(|_| {
                planned_stop()
                    .args(["stop", "--pid", &pid, "--dir", s(&run_dir), "--json"])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let codes: Vec<_> = outs
            .into_iter()
            .map(|o| o.wait_with_output().unwrap())
            .collect();
        // The first marker may stop the service before a later stopper looks: "already gone".
        assert!(
            codes.iter().any(|o| o.status.code() == Some(0)),
            "round {round}: {codes:?}"
        );
        assert!(
            codes
                .iter()
                .all(|o| matches!(o.status.code(), Some(0) | Some(5))),
            "round {round}: {codes:?}"
        );
        if service.running() {
            service.signal(libc::SIGTERM);
        }
        assert_eq!(service.exit_code(), Some(0), "round {round}");
    }
}

/// Two stoppers ask one target at once, and both wait: both see it stop as planned, exactly one
/// learns that its own request was the one accepted, the other is told whose was — and once the
/// target has exited no marker is left behind for its pid.
#[test]
fn racing_waiting_stoppers_are_told_whose_request_was_accepted_and_nothing_is_left_behind() {
    let base = tempfile::tempdir().unwrap();
    let run_dir = base.path().join("run");
    for round in 0..20 {
        // One job that never finishes holds the drain to its 1 s deadline, so both stoppers
        // arrive while the target still runs.
        let mut service = Serve::start(&[
            "--dir",
            s(&run_dir),
            "--poll-ms",
            "2",
            "--jobs",
            "1",
            "--job-ms",
            "60000",
            "--drain-ms",
            "1000",
        ]);
        let pid = service.pid_arg();
        let stoppers: Vec<_> = ["first", "second"]
            .into_iter()
            .map(|id| {
                planned_stop()
                    .args(["stop", "--pid", &pid, "--dir", s(&run_dir), "--wait", "20"])
                    .args(["--request-id", id, "--json"])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let reports: Vec<serde_json::Value> = stoppers
            .into_iter()
            .map(|stopper| {
                let out = stopper.wait_with_output().unwrap();
                serde_json::from_slice(&out.stdout).unwrap()
            })
            .collect();
        assert_eq!(service.exit_code(), Some(0), "round {round}");
        let accepted = service.expect("stop_accepted")["request_id"].clone();
        for report in &reports {
            assert_eq!(
                report["outcome"], "stopped_planned",
                "round {round}: {report}"
            );
            assert_eq!(
                report["accepted_request_id"], accepted,
                "round {round}: {report}"
            );
            assert_eq!(
                report["own_request"],
                report["request_id"] == accepted,
                "round {round}: {report}"
            );
        }
        let own: Vec<_> = reports
            .iter()
            .filter(|r| r["own_request"] == true)
            .collect();
        assert_eq!(own.len(), 1, "round {round}: {reports:?}");
        let slot = run_dir.join(format!("planned-stop-{pid}.json"));
        assert!(!slot.exists(), "round {round}: a marker was left behind");
    }
}

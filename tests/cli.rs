//! The command line, with real processes: `planned-stop serve` stopped by markers, signals and
//! `planned-stop stop`; `status`, `clear` and `inspect` on real marker directories.
//!
//! The tests that send Unix signals are `#[cfg(unix)]`; `inspect` runs everywhere (and under Wine).

use crate::common;
use chrono::Utc;
use common::process::*;
use planned_stop::ProcessIdentity;
use planned_stop::marker::Marker;
#[cfg(unix)]
use {
    common::other_live_process,
    planned_stop::{Layout, StopVerdict, marker::MarkerStore, record::FileRecordStore},
    std::path::Path,
    std::time::Duration,
};

#[cfg(unix)]
fn stop(d: &Dirs, pid: &str, extra: &[&str]) -> std::process::Output {
    stop_json(&d.run, pid, extra)
}

#[cfg(unix)]
#[test]
fn a_marker_stop_exits_0_records_planned_and_the_next_start_resumes_exactly_the_jobs_left() {
    let d = dirs();
    let mut first = serve(
        &d,
        &["--jobs", "3", "--job-ms", "60000", "--drain-ms", "200"],
    );
    let out = stop(&d, &first.pid_arg(), &["--wait", "20", "--reason", "test"]);
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["outcome"], "stopped_planned");
    assert_eq!(report["exit_code"], 0);
    let accepted = first.expect("stop_accepted");
    assert_eq!(accepted["verdict"], "planned");
    assert_eq!(accepted["request_id"], report["request_id"]);
    assert_eq!(
        first.expect("exit"),
        serde_json::json!({"event": "exit", "code": 0, "verdict": "planned"})
    );
    assert_eq!(first.exit_code(), Some(0));

    let record = FileRecordStore::read_last_stop(&d.state)
        .unwrap()
        .expect("a stop record");
    assert_eq!(record.verdict, StopVerdict::Planned);
    assert_eq!(record.pid, first.pid());
    let left: Vec<String> = record
        .unfinished
        .iter()
        .map(|u| u.item_as::<String>().unwrap())
        .collect();
    assert_eq!(left.len(), 3);

    let second = serve(&d, &["--jobs", "0"]);
    let history = second.history.lock().unwrap().clone();
    assert_eq!(
        history[0]["event"], "resumed",
        "the resumed event comes before ready: {history:?}"
    );
    let resumed = &history[0];
    assert_eq!(resumed["jobs"], 3);
    assert_eq!(resumed["items"], serde_json::json!(left));
    assert_eq!(second.ready["jobs"], 3);
}

#[cfg(unix)]
#[test]
fn jobs_that_finish_within_the_drain_leave_nothing_to_resume() {
    let d = dirs();
    let mut service = serve(&d, &["--jobs", "2", "--job-ms", "50", "--drain-ms", "5000"]);
    let out = stop(&d, &service.pid_arg(), &["--wait", "20"]);
    assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
    assert_eq!(service.exit_code(), Some(0));
    let record = FileRecordStore::read_last_stop(&d.state).unwrap().unwrap();
    assert!(
        record.drained_in_time && record.unfinished.is_empty(),
        "{record:?}"
    );
}

#[cfg(unix)]
#[test]
fn stop_wait_reports_the_same_told_of_the_exit_or_polling() {
    let d = dirs();
    for extra in [&[][..], &["--no-events"][..]] {
        let mut service = serve(&d, &["--jobs", "1", "--job-ms", "10", "--drain-ms", "5000"]);
        let mut args = vec!["--wait", "20"];
        args.extend_from_slice(extra);
        let out = stop(&d, &service.pid_arg(), &args);
        let report = json_of(&out);
        assert_eq!(out.status.code(), Some(0), "{extra:?}: {report}");
        assert_eq!(report["outcome"], "stopped_planned", "{extra:?}: {report}");
        assert_eq!(report["own_request"], true, "{extra:?}: {report}");
        assert_eq!(service.exit_code(), Some(0), "{extra:?}");
    }
}

#[cfg(unix)]
#[test]
fn a_bare_sigterm_exits_1_and_sigint_exits_0() {
    let d = dirs();
    let mut service = serve(&d, &[]);
    service.signal(libc::SIGTERM);
    assert_eq!(service.expect("exit")["verdict"], "unexpected");
    assert_eq!(service.exit_code(), Some(1));

    let mut service = serve(&d, &[]);
    service.signal(libc::SIGINT);
    assert_eq!(service.expect("exit")["verdict"], "planned");
    assert_eq!(service.exit_code(), Some(0));
}

#[cfg(unix)]
#[test]
fn a_marker_then_sigterm_0_to_50_ms_later_exits_0_in_20_of_20_runs() {
    let d = dirs();
    for run in 0..20u64 {
        let mut service = serve(&d, &["--drain-ms", "100"]);
        let out = stop(&d, &service.pid_arg(), &[]);
        assert_eq!(out.status.code(), Some(0));
        // Deliberately spread the SIGTERM over 0–50 ms after the marker: sometimes before the
        // watcher's probe, sometimes after it delivered.
        std::thread::sleep(Duration::from_micros(run * 2_500));
        if service.running() {
            service.signal(libc::SIGTERM);
        }
        assert_eq!(service.exit_code(), Some(0), "run {run}");
    }
}

#[cfg(unix)]
#[test]
fn an_unmarked_sigterm_then_a_marker_still_exits_1() {
    let d = dirs();
    let mut service = serve(
        &d,
        &["--jobs", "1", "--job-ms", "60000", "--drain-ms", "500"],
    );
    service.signal(libc::SIGTERM);
    assert_eq!(service.expect("stop_accepted")["verdict"], "unexpected");
    // The service is draining; a stopper now writes a marker for it.
    let out = stop(&d, &service.pid_arg(), &["--wait", "20"]);
    let report = json_of(&out);
    assert_eq!(report["outcome"], "stopped_unexpectedly", "{report}");
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(service.exit_code(), Some(1));
}

/// A forced drain used to read `stopped_planned`, exit 0, like a clean one. The
/// stopper now carries the drain's summary (`clean`, `drain`), and with `--require-clean` a lossy
/// drain exits 13; a clean one still exits 0.
#[cfg(unix)]
#[test]
fn stop_wait_tells_a_clean_drain_from_a_forced_one() {
    let d = dirs();
    let mut service = serve(
        &d,
        &["--jobs", "1", "--job-ms", "60000", "--drain-ms", "20000"],
    );
    let stopper = planned_stop()
        .args(["stop", "--pid", &service.pid_arg(), "--dir"])
        .arg(&d.run)
        .args(["--wait", "30", "--json", "--require-clean"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    service.expect("draining");
    // The first Ctrl-C of a drain begun by a marker does not force it (it says so);
    // the second does.
    service.signal(libc::SIGINT);
    common::wait_until("the first Ctrl-C is answered", || {
        service
            .stderr
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("a second Ctrl-C forces"))
    });
    service.signal(libc::SIGINT);
    let out = stopper.wait_with_output().unwrap();
    let report = json_of(&out);
    assert_eq!(report["outcome"], "stopped_planned", "{report}");
    assert_eq!(out.status.code(), Some(13), "{report}");
    assert_eq!(report["clean"], false, "{report}");
    assert_eq!(report["drain"]["forced"], true, "{report}");
    assert_eq!(report["drain"]["in_time"], false, "{report}");
    assert!(
        report["message"].as_str().unwrap().contains("forced"),
        "{report}"
    );
    assert_eq!(service.exit_code(), Some(0), "still a planned stop");
    // Asked again (it once answered `already_stopped`, 0): still not clean, 13 with the
    // flag, 0 without it.
    let again = stop(&d, &service.pid_arg(), &["--require-clean"]);
    let report = json_of(&again);
    assert_eq!(report["outcome"], "already_stopped", "{report}");
    assert_eq!(
        (again.status.code(), &report["clean"]),
        (Some(13), &serde_json::json!(false)),
        "{report}"
    );
    assert_eq!(stop(&d, &service.pid_arg(), &[]).status.code(), Some(0));

    // A drain in which every job hands its work back in time is clean: 0 with the flag.
    let mut service = serve(
        &d,
        &["--jobs", "2", "--job-ms", "60000", "--drain-ms", "200"],
    );
    let out = stop(&d, &service.pid_arg(), &["--wait", "20", "--require-clean"]);
    let report = json_of(&out);
    assert_eq!(
        (report["outcome"].as_str(), out.status.code()),
        (Some("stopped_planned"), Some(0)),
        "{report}"
    );
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(report["drain"]["handed_back"], 2, "{report}");
    assert_eq!(service.exit_code(), Some(0));
}

#[cfg(unix)]
#[test]
fn stop_wait_json_reports_still_draining_already_gone_refused_and_not_accepted() {
    let d = dirs();
    // Still draining at the deadline.
    let mut service = serve(
        &d,
        &["--jobs", "1", "--job-ms", "60000", "--drain-ms", "10000"],
    );
    let out = stop(&d, &service.pid_arg(), &["--wait", "0.5"]);
    let report = json_of(&out);
    assert_eq!(
        (report["outcome"].as_str(), out.status.code()),
        (Some("still_draining"), Some(3)),
        "{report}"
    );
    assert!(report["drain_deadline"].is_string());
    assert!(service.running());
    service.signal(libc::SIGINT); // a second Ctrl-C equivalent: force
    assert_eq!(service.exit_code(), Some(0));

    // Stopped already (as planned, forced): a repeated stop says so, 0.
    let out = stop(&d, &service.pid_arg(), &["--wait", "1"]);
    assert_eq!(
        (json_of(&out)["outcome"].as_str(), out.status.code()),
        (Some("already_stopped"), Some(0))
    );
    // Already gone, with no outcome here: 5.
    let mut gone = other_live_process();
    let gone_pid = gone.id().to_string();
    gone.kill().unwrap();
    gone.wait().unwrap();
    let out = stop(&d, &gone_pid, &["--wait", "1"]);
    assert_eq!(
        (json_of(&out)["outcome"].as_str(), out.status.code()),
        (Some("already_gone"), Some(5))
    );

    // Refused: the process at that pid is not the one expected.
    let mut service = serve(&d, &[]);
    let wrong = (service.identity.start + 1).to_string();
    let out = stop(&d, &service.pid_arg(), &["--wait", "1", "--start", &wrong]);
    assert_eq!(
        (json_of(&out)["outcome"].as_str(), out.status.code()),
        (Some("refused"), Some(6))
    );
    assert!(service.running(), "a refused stop writes nothing");
    assert!(
        !MarkerStore::open(Layout::Slots(d.run.clone()))
            .unwrap()
            .slot_path(service.pid())
            .exists()
    );

    // Not accepted: a process that is not a planned-stop service.
    let mut sleeper = other_live_process();
    let out = stop(&d, &sleeper.id().to_string(), &["--wait", "0.3"]);
    assert_eq!(
        (json_of(&out)["outcome"].as_str(), out.status.code()),
        (Some("not_accepted"), Some(4))
    );

    // Stopped unexpectedly: it exits, but leaves no planned outcome. (The not-accepted request
    // above left its marker; clear it so the next stopper's marker is the signal it is waiting.)
    let pid = sleeper.id().to_string();
    assert_eq!(
        run(&["clear", "--dir", s(&d.run), "--pid", &pid])
            .status
            .code(),
        Some(0)
    );
    let waiting = std::thread::spawn({
        let run_dir = d.run.clone();
        move || stop_json(&run_dir, &pid, &["--wait", "20"])
    });
    // Kill it once the stopper has written its marker, i.e. is waiting (an explicit event).
    let slot = MarkerStore::open(Layout::Slots(d.run.clone()))
        .unwrap()
        .slot_path(sleeper.id());
    let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
    while !slot.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the stopper never wrote its marker"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let out = waiting.join().unwrap();
    // Not a planned-stop service watching this directory: gone, and nothing says how.
    assert_eq!(
        (json_of(&out)["outcome"].as_str(), out.status.code()),
        (Some("gone_outcome_unknown"), Some(8))
    );
    drop(service);
}

#[cfg(unix)]
#[test]
fn a_marker_with_a_dead_processs_fingerprint_never_stops_the_pids_new_owner() {
    let d = dirs();
    let mut service = serve(&d, &[]);
    let store = MarkerStore::open(Layout::Slots(d.run.clone())).unwrap();
    // What a stopper of the pid's previous owner would have written: same pid, other start.
    let predecessor = Marker::new(service.pid(), Some(service.identity.start - 1), Utc::now());
    store.write(&predecessor).unwrap();
    service.wait_probes_total("stale", 1);
    service.wait_probes("absent", 3);
    assert!(
        !store.slot_path(service.pid()).exists(),
        "the stale marker was removed"
    );
    assert!(service.running());
    assert!(service.drain_events().is_empty(), "no stop was accepted");
    // `stop` itself writes the live fingerprint, so it works.
    assert_eq!(
        stop(&d, &service.pid_arg(), &["--wait", "20"])
            .status
            .code(),
        Some(0)
    );
}

#[cfg(unix)]
#[test]
fn twenty_services_sharing_a_directory_stopped_by_twenty_concurrent_stops_all_exit_0() {
    let d = dirs();
    let mut services: Vec<Serve> = (0..20).map(|_| serve(&d, &["--drain-ms", "200"])).collect();
    let stoppers: Vec<_> = services
        .iter()
        .map(|svc| {
            planned_stop()
                .args([
                    "stop",
                    "--pid",
                    &svc.pid_arg(),
                    "--dir",
                    s(&d.run),
                    "--json",
                    "--wait",
                    "30",
                ])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for stopper in stoppers {
        let out = stopper.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
        assert_eq!(json_of(&out)["outcome"], "stopped_planned");
    }
    for svc in &mut services {
        assert_eq!(svc.exit_code(), Some(0));
    }
}

#[cfg(unix)]
#[test]
fn the_single_file_layout_leaves_another_processs_marker_and_keeps_running() {
    let base = tempfile::tempdir().unwrap();
    let file = base.path().join("planned-stop.json");
    let mut service = Serve::start(&["--marker", s(&file), "--poll-ms", "20"]);
    let mut other = other_live_process();
    let store = MarkerStore::open(Layout::SingleFile(file.clone())).unwrap();
    let foreign = planned_stop::ProcessIdentity::of(other.id()).unwrap();
    store
        .write(&Marker::new(foreign.pid, Some(foreign.start), Utc::now()))
        .unwrap();
    service.wait_probes_total("foreign", 5);
    assert!(
        file.exists(),
        "a marker naming another live process is left in place"
    );
    assert!(service.running());
    // While it is pending for the other process, a stop of ours is refused, not overwriting it.
    let out = run(&[
        "stop",
        "--pid",
        &service.pid_arg(),
        "--marker",
        s(&file),
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Once that process is gone, the file is ours to use.
    other.kill().unwrap();
    other.wait().unwrap();
    let out = run(&[
        "stop",
        "--pid",
        &service.pid_arg(),
        "--marker",
        s(&file),
        "--json",
        "--wait",
        "20",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
    assert_eq!(service.exit_code(), Some(0));
}

#[cfg(unix)]
#[test]
fn status_and_clear_report_and_remove_slots() {
    let d = dirs();
    let mut service = serve(
        &d,
        &["--jobs", "1", "--job-ms", "60000", "--drain-ms", "10000"],
    );
    let out = stop(&d, &service.pid_arg(), &["--no-trigger"]);
    assert_eq!(out.status.code(), Some(0));
    let status = json_of(&run(&["status", "--dir", s(&d.run), "--json"]));
    let slots = status["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 1, "{status}");
    assert_eq!(slots[0]["verdict"], "for_self");
    let cleared = run(&["clear", "--dir", s(&d.run), "--pid", &service.pid_arg()]);
    assert_eq!(cleared.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&cleared.stdout).contains("removed"));
    let status = json_of(&run(&["status", "--dir", s(&d.run), "--json"]));
    assert_eq!(status["slots"].as_array().unwrap().len(), 0);
    // With the marker cleared, SIGTERM is unexpected.
    service.signal(libc::SIGTERM);
    assert_eq!(service.expect("stop_accepted")["verdict"], "unexpected");
    // A Ctrl-C while draining forces the stop; the verdict stays.
    service.signal(libc::SIGINT);
    assert_eq!(service.exit_code(), Some(1));
    let status = json_of(&run(&[
        "status",
        "--dir",
        s(&d.run),
        "--state",
        s(&d.state),
        "--json",
    ]));
    assert_eq!(status["outcomes"][0]["verdict"], "unexpected", "{status}");
    assert_eq!(status["stop_record"]["verdict"], "unexpected");
}

/// systemd's `ExecStop=planned-stop stop --pid $MAINPID --no-trigger`: the marker alone does not
/// stop the service; the SIGTERM systemd sends next is then classified planned.
#[cfg(unix)]
#[test]
fn a_no_trigger_marker_waits_for_the_sigterm_and_makes_it_planned() {
    let d = dirs();
    let mut service = serve(&d, &[]);
    let out = stop(&d, &service.pid_arg(), &["--no-trigger"]);
    assert_eq!(out.status.code(), Some(0));
    service.wait_probes_total("for_self", 5);
    assert!(
        service.running(),
        "the watcher left the marker to the signal path"
    );
    assert!(service.drain_events().is_empty());
    service.signal(libc::SIGTERM);
    assert_eq!(service.expect("stop_accepted")["verdict"], "planned");
    assert_eq!(service.exit_code(), Some(0));
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

/// One answer for a missing directory. `inspect` said "absent" (0) and `clear`
/// "nothing to remove" (0) where `stop` and `status` said 2: every verb now says the directory
/// does not exist (2), and none creates it.
#[test]
fn every_verb_answers_2_for_a_missing_directory_and_creates_nothing() {
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join("absent");
    let d = dir.to_str().unwrap();
    for args in [
        vec!["inspect", "--pid", "1", "--dir", d],
        vec!["clear", "--pid", "1", "--dir", d],
        vec!["status", "--dir", d],
        vec!["stop", "--pid", "1", "--dir", d],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("does not exist"),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!dir.exists(), "{args:?} created it");
    }
}

/// `inspect` said "will stop as planned" for a `--no-trigger` marker, which stops
/// nothing by itself: it classifies the next SIGTERM.
#[test]
fn inspect_says_what_a_no_trigger_marker_does() {
    let dir = tempfile::tempdir().unwrap();
    let me = std::process::id().to_string();
    let d = dir.path().to_str().unwrap();
    assert_eq!(
        run(&["stop", "--pid", &me, "--dir", d, "--no-trigger"])
            .status
            .code(),
        Some(0)
    );
    let out = run(&["inspect", "--pid", &me, "--dir", d]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("the next SIGTERM"), "{said}");
    assert!(!said.contains("will stop as planned"), "{said}");
    run(&["clear", "--pid", &me, "--dir", d]);
    assert_eq!(
        run(&["stop", "--pid", &me, "--dir", d]).status.code(),
        Some(0)
    );
    let said =
        String::from_utf8_lossy(&run(&["inspect", "--pid", &me, "--dir", d]).stdout).into_owned();
    assert!(said.contains("if it watches this directory"), "{said}");
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

/// A marker directory whose path is not valid UTF-8: every verb works, and `--json` carries the
/// path lossily (U+FFFD for the bytes that are not UTF-8) instead of panicking with exit 101.
#[cfg(unix)]
#[test]
fn every_verb_works_with_a_directory_whose_path_is_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let base = tempfile::tempdir().unwrap();
    let dir = base.path().join(std::ffi::OsStr::from_bytes(b"run-\xff"));
    let lossy = dir.to_string_lossy().into_owned();
    assert!(lossy.contains('\u{FFFD}'));
    let mut target = other_live_process();
    let pid = target.id().to_string();
    let verb = |args: &[&str]| {
        let out = planned_stop()
            .args(args)
            .arg("--dir")
            .arg(&dir)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        out
    };

    let stopped = json_of(&verb(&["stop", "--pid", &pid, "--create-dir", "--json"]));
    assert_eq!(stopped["outcome"], "marker_written");
    assert!(stopped["slot"].as_str().unwrap().starts_with(&lossy));
    let inspected = json_of(&verb(&["inspect", "--pid", &pid, "--json"]));
    assert!(inspected["path"].as_str().unwrap().starts_with(&lossy));
    let status = json_of(&verb(&["status", "--json"]));
    assert_eq!(status["dir"], lossy.as_str());
    assert_eq!(status["slots"].as_array().unwrap().len(), 1);
    verb(&["clear", "--pid", &pid]);
    // With --signal the marker is written first, then the signal is sent.
    let signalled = json_of(&verb(&[
        "stop",
        "--pid",
        &pid,
        "--signal",
        "--signal-anyway",
        "--json",
    ]));
    assert_eq!(signalled["signalled"], true);
    assert!(
        target.wait().unwrap().code().is_some(),
        "the target got SIGTERM"
    );
}

/// `--wait 0` does not wait: the same answer as no `--wait` (not "not accepted", which the target
/// would then contradict by stopping as planned).
#[cfg(unix)]
#[test]
fn stop_wait_0_reports_the_marker_written_not_a_refusal() {
    let d = dirs();
    let mut service = serve(&d, &[]);
    let out = stop(&d, &service.pid_arg(), &["--wait", "0"]);
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["outcome"], "marker_written");
    assert_eq!(
        service.exit_code(),
        Some(0),
        "and the target stops as planned"
    );
}

/// A drain deadline of 285,000 years (`--drain-ms 9000000000000000`) used to panic the runner on a
/// date overflow at stop, leaving a process that ignored every later stop. It is clamped now.
#[cfg(unix)]
#[test]
fn a_huge_drain_deadline_still_stops_as_planned() {
    let d = dirs();
    let mut service = serve(&d, &["--drain-ms", "9000000000000000"]);
    let out = stop(&d, &service.pid_arg(), &["--wait", "20"]);
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["outcome"], "stopped_planned");
    assert_eq!(service.exit_code(), Some(0));
}

/// A target killed while it drains: the stopper says so (not "stopped unexpectedly", which would
/// suggest an outcome), and `status` shows the dead owner as gone, not as draining.
#[cfg(unix)]
#[test]
fn a_target_killed_while_draining_is_reported_so_and_status_shows_it_gone() {
    let d = dirs();
    let mut service = serve(
        &d,
        &["--jobs", "1", "--job-ms", "60000", "--drain-ms", "30000"],
    );
    let pid = service.pid_arg();
    let waiting = {
        let run = d.run.clone();
        let pid = pid.clone();
        std::thread::spawn(move || run_in(&run, &["stop", "--pid", &pid, "--wait", "20", "--json"]))
    };
    service.expect("stop_accepted");
    service.signal(libc::SIGKILL);
    assert_eq!(service.exit_code(), None, "killed");
    let out = waiting.join().unwrap();
    let report = json_of(&out);
    assert_eq!(report["outcome"], "killed_while_draining", "{report}");
    assert_eq!(out.status.code(), Some(9));
    let status = json_of(&run_in(&d.run, &["status", "--json"]));
    let outcome = &status["outcomes"][0];
    assert_eq!(outcome["phase"], "draining");
    assert_eq!(outcome["owner_alive"], false, "{status}");
    let text = run_in(&d.run, &["status"]);
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("gone: killed before it finished"),
        "{text:?}"
    );
}

/// `status` calls a gone process "killed before it finished" whenever its last outcome says a
/// stop was under way — held, handing over or draining — by the rule `stop --wait` answers
/// `killed_while_draining` with; a finished one is only gone.
#[cfg(unix)]
#[test]
fn status_shows_a_process_gone_in_any_unfinished_stop_as_killed_before_it_finished() {
    use planned_stop::stopper::{Outcome, WaitOutcome};
    use planned_stop::{Layout, ProcessState, StopCause, StopVerdict, marker::MarkerStore};
    let d = dirs();
    let store = MarkerStore::builder(Layout::Slots(d.run.clone()))
        .create_dir(true)
        .open()
        .unwrap();
    let now = Utc::now();
    let states = [
        ProcessState::Held,
        ProcessState::HandingOver,
        ProcessState::Draining,
        ProcessState::Stopped,
    ];
    // Pids past any pid_max, with a start no process has: gone.
    let gone = |i: usize| ProcessIdentity::new(4_000_000 + i as u32, 1, now);
    for (i, state) in states.into_iter().enumerate() {
        let mut outcome =
            Outcome::accepted(&gone(i), StopCause::Marker, StopVerdict::Planned, now, now);
        outcome.state = state;
        store.write_outcome(&outcome).unwrap();
    }
    let text = run_in(&d.run, &["status"]);
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    for (i, state) in states.into_iter().enumerate() {
        let line = text
            .lines()
            .find(|l| l.contains(&format!("outcome of pid {}:", gone(i).pid)))
            .unwrap_or_else(|| panic!("no line for {state:?}: {text}"));
        let killed = matches!(
            WaitOutcome::after_exit(store.read_outcome(gone(i).pid)),
            WaitOutcome::KilledWhileDraining { .. }
        );
        assert_eq!(killed, state != ProcessState::Stopped, "{state:?}");
        assert_eq!(
            line.contains("(gone: killed before it finished)"),
            killed,
            "{state:?}: {line}"
        );
    }
}

/// `planned-stop ARGS --dir DIR`.
#[cfg(unix)]
fn run_in(dir: &Path, args: &[&str]) -> std::process::Output {
    planned_stop()
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

/// A typo in `--dir` used to create the directory silently and stop nobody (and `--wait` then
/// timed out asking "is it a planned-stop service?"). A missing directory is refused, named by
/// its absolute path; `--create-dir` creates it on purpose.
#[cfg(unix)]
#[test]
fn stop_refuses_a_marker_directory_that_does_not_exist_unless_asked_to_create_it() {
    let base = tempfile::tempdir().unwrap();
    let mut target = other_live_process();
    let pid = target.id().to_string();
    let out = planned_stop()
        .current_dir(base.path())
        .args(["stop", "--pid", &pid, "--dir", "typo"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let message = String::from_utf8_lossy(&out.stderr);
    let absolute = base.path().join("typo");
    assert!(
        message.contains(&format!("{} does not exist", absolute.display())),
        "{message}"
    );
    assert!(!absolute.exists(), "nothing was created");
    let out = planned_stop()
        .current_dir(base.path())
        .args([
            "stop",
            "--pid",
            &pid,
            "--dir",
            "typo",
            "--create-dir",
            "--json",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(absolute.is_dir());
    let _ = target.kill();
}

/// A planned restart: the target drains and records exactly as for a stop, then exits 75
/// (`EX_TEMPFAIL`) so a supervisor starts it again; the next start resumes what it left. Through
/// the watcher and through the signal path alike.
#[cfg(unix)]
#[test]
fn a_planned_restart_drains_records_and_exits_75() {
    for signal in [false, true] {
        let d = dirs();
        let mut service = serve(
            &d,
            &["--jobs", "2", "--job-ms", "60000", "--drain-ms", "200"],
        );
        let mut args = vec!["--restart", "--wait", "20"];
        if signal {
            args.push("--signal");
        }
        let out = stop(&d, &service.pid_arg(), &args);
        let report = json_of(&out);
        assert_eq!(
            out.status.code(),
            Some(0),
            "the stopper got what it asked: {report}"
        );
        assert_eq!(report["outcome"], "stopped_planned");
        assert_eq!(report["exit_code"], 75);
        assert_eq!(service.exit_code(), Some(75), "signal: {signal}");
        let record = FileRecordStore::read_last_stop(&d.state).unwrap().unwrap();
        assert_eq!(record.verdict, StopVerdict::Planned);
        assert_eq!(record.action, planned_stop::marker::StopAction::Restart);
        assert_eq!(record.unfinished.len(), 2, "kept for the restarted process");
    }
}

/// A stopper running as root stops a service running as `nobody`: the marker is given to the
/// directory's owner (still 0600), so the target can read and claim it, and root reads the
/// outcome.
#[cfg(unix)]
#[test]
#[ignore = "needs root (a service run as nobody): .ci/run runs it with --ignored"]
fn a_root_stopper_stops_a_service_running_as_another_user() {
    use std::io::BufRead;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("needs root to run a service as nobody");
    }
    let (_base, run_dir) = nobodys_run_dir();
    let mut child = planned_stop()
        .args(["serve", "--dir", s(&run_dir), "--poll-ms", "20"])
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("\"ready\"") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "serve exited before ready"
        );
    }
    let pid = child.id().to_string();
    let out_stop = stop_json(&run_dir, &pid, &["--wait", "20"]);
    let report = json_of(&out_stop);
    assert_eq!(out_stop.status.code(), Some(0), "{report}");
    assert_eq!(report["outcome"], "stopped_planned");
    assert_eq!(child.wait().unwrap().code(), Some(0));
    // Nothing root-owned is left in the service's directory.
    for entry in std::fs::read_dir(&run_dir).unwrap() {
        let meta = entry.unwrap().metadata().unwrap();
        assert_eq!(meta.uid(), NOBODY);
        assert_eq!(meta.mode() & 0o077, 0, "private");
    }
}

/// A target of another user that answers and exits before its root stopper looks again: the
/// outcome its user wrote still counts, since the store that wrote the request saw the target
/// run. (A fast stop read past the exit as "gone, outcome unknown", 8: the wait learned whose
/// files count only once it began, from a process already gone.)
#[cfg(unix)]
#[test]
#[ignore = "needs root (a target run as nobody): .ci/run runs it with --ignored"]
fn a_root_stopper_believes_the_outcome_of_a_target_of_another_user_that_exited_before_the_wait() {
    use planned_stop::stopper::{StopOptions, WaitOutcome, request, wait};
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("needs root to run a target as nobody");
    }
    let (_base, run_dir) = nobodys_run_dir();
    let mut target = std::process::Command::new("sleep")
        .arg("600")
        .uid(NOBODY)
        .gid(NOBODY)
        .spawn()
        .unwrap();
    let store = MarkerStore::open(Layout::Slots(run_dir.clone())).unwrap();
    let requested = request(&store, target.id(), &StopOptions::new()).unwrap();
    // The target's answer, written as its own user, then its exit: all before the wait.
    let outcome = serde_json::json!({
        "pid": requested.target.pid, "start": requested.target.start, "phase": "stopped",
        "cause": {"kind": "marker"}, "verdict": "planned",
        "request_id": requested.marker.request_id, "accepted_at": Utc::now(),
        "drain_deadline": Utc::now(), "finished_at": Utc::now(), "exit_code": 0,
    });
    let path = store.outcome_path(requested.target.pid);
    std::fs::write(&path, outcome.to_string()).unwrap();
    std::os::unix::fs::chown(&path, Some(NOBODY), Some(NOBODY)).unwrap();
    target.kill().unwrap();
    target.wait().unwrap();
    let waited = wait(&store, &requested.target, Duration::ZERO, |_, _| {});
    assert!(
        matches!(waited, WaitOutcome::StoppedPlanned { exit_code: 0, .. }),
        "{waited:?}"
    );
    // A stopper that never saw it run believes only its own user's files and root's.
    let fresh = MarkerStore::open(Layout::Slots(run_dir)).unwrap();
    let waited = wait(&fresh, &requested.target, Duration::ZERO, |_, _| {});
    assert_eq!(waited, WaitOutcome::GoneWithoutOutcome);
}

#[cfg(unix)]
#[test]
fn a_service_announces_that_it_watches_its_directory_and_a_stopper_warns_at_once_when_its_target_has_not()
 {
    let d = dirs();
    let mut service = serve(&d, &[]);
    let store = MarkerStore::open(Layout::Slots(d.run.clone())).unwrap();
    // Announced by the time it is ready, under its own identity; `status` lists it.
    let presence = store
        .read_presence(service.pid())
        .expect("a presence file once the service is ready");
    assert!(presence.is_from(&service.identity));
    let status = json_of(&run(&["status", "--json", "--dir", s(&d.run)]));
    assert_eq!(status["watching"][0]["pid"], service.pid());
    assert_eq!(status["watching"][0]["owner_alive"], true);

    // A planned-stop service watching another directory (the usual wrong `--dir`): the marker is
    // written, and the stopper says at once that nothing here announced watching for it.
    let elsewhere = other_live_process();
    let pid = elsewhere.id().to_string();
    let out = run(&["stop", "--pid", &pid, "--dir", s(&d.run)]);
    assert_eq!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "warning: process {pid} has not announced that it watches"
        )) && err.contains(&*d.run.to_string_lossy()),
        "{err}"
    );
    let report = json_of(&stop(&d, &pid, &[]));
    assert_eq!(
        (report["outcome"].as_str(), report["watching"].as_bool()),
        (Some("marker_written"), Some(false))
    );
    let out = stop(&d, &pid, &["--wait", "0.3"]);
    let report = json_of(&out);
    assert_eq!(
        (report["outcome"].as_str(), out.status.code()),
        (Some("not_accepted"), Some(4))
    );
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("never announced that it watches"),
        "{report}"
    );

    // Its own target: no warning, and the announcement is withdrawn once it has stopped (the
    // outcome file says the rest).
    let out = run(&[
        "stop",
        "--pid",
        &service.pid_arg(),
        "--dir",
        s(&d.run),
        "--wait",
        "20",
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("warning"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(service.exit_code(), Some(0));
    assert!(!store.presence_path(service.pid()).exists());
    assert!(store.outcome_path(service.pid()).exists());

    // A service killed outright cannot withdraw it: `status` shows the announcement as gone.
    let mut killed = serve(&d, &[]);
    killed.signal(libc::SIGKILL);
    assert_eq!(killed.exit_code(), None);
    let status = json_of(&run(&["status", "--json", "--dir", s(&d.run)]));
    let entry = status["watching"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["pid"] == killed.pid())
        .cloned()
        .expect("the killed service's announcement is listed");
    assert_eq!(entry["owner_alive"], false);
    let text = String::from_utf8_lossy(&run(&["status", "--dir", s(&d.run)]).stdout).into_owned();
    assert!(
        text.contains(&format!("watching: pid {} since", killed.pid()))
            && text.contains("(gone: killed or crashed)"),
        "{text}"
    );
}

/// Kubernetes creates an `emptyDir` with mode 0777 (1777 when backed by memory), and a
/// service pointed at it refused to start (exit 2): every Pod crash-looped. The recipe points the
/// service and the stopper at subdirectories of the volume; `serve` creates them 0700 inside a
/// 0777 and a 1777 parent, and a planned stop through them works.
#[cfg(unix)]
#[test]
fn a_service_starts_and_stops_in_private_subdirectories_of_a_shared_volume() {
    use std::os::unix::fs::PermissionsExt;
    for mode in [0o777, 0o1777] {
        let volume = tempfile::tempdir().unwrap();
        std::fs::set_permissions(volume.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let markers = volume.path().join("markers");
        let state = volume.path().join("state");
        let mut service = Serve::start(&[
            "--dir",
            s(&markers),
            "--state",
            s(&state),
            "--poll-ms",
            "20",
        ]);
        for dir in [&markers, &state] {
            let made = std::fs::metadata(dir).unwrap().permissions().mode() & 0o7777;
            assert_eq!(made, 0o700, "{mode:o}: {} is private", dir.display());
        }
        let out = stop_json(&markers, &service.pid_arg(), &["--wait", "20"]);
        let report = json_of(&out);
        assert_eq!(report["outcome"], "stopped_planned", "{mode:o}: {report}");
        assert_eq!(service.exit_code(), Some(0), "{mode:o}");
        // The volume itself is still refused, naming what to do.
        let out = run(&["serve", "--dir", s(volume.path()), "--jobs", "0"]);
        assert_eq!(out.status.code(), Some(2), "{mode:o}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("subdirectory"), "{mode:o}: {said}");
        // The flag that opts in is named once, and no type of the library is.
        assert_eq!(
            said.matches("--allow-shared-dir").count(),
            1,
            "{mode:o}: {said}"
        );
        assert!(
            !said.contains("::") && !said.contains("  "),
            "{mode:o}: {said}"
        );
        // As a state directory it is refused in a state directory's words.
        let out = run(&[
            "serve",
            "--dir",
            s(&markers),
            "--state",
            s(volume.path()),
            "--jobs",
            "0",
        ]);
        assert_eq!(out.status.code(), Some(2), "{mode:o}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("state directory") && said.contains("--allow-shared-state"),
            "{mode:o}: {said}"
        );
        assert!(!said.contains("marker directory"), "{mode:o}: {said}");
    }
}

/// A regular file given where a directory belongs was refused as "File exists (os error 17)":
/// every verb says it exists but is not a directory, naming the path, and exits 2.
#[cfg(unix)]
#[test]
fn a_file_where_a_directory_belongs_is_named_so() {
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("file");
    std::fs::write(&file, b"").unwrap();
    let markers = temp.path().join("markers");
    let tries: [&[&str]; 5] = [
        &[
            "serve",
            "--dir",
            s(&markers),
            "--state",
            s(&file),
            "--jobs",
            "0",
        ],
        &["serve", "--dir", s(&file), "--jobs", "0"],
        &["records", "list", "--state", s(&file)],
        &["stop", "--dir", s(&file), "--pid", "1"],
        &["status", "--dir", s(&file)],
    ];
    for args in tries {
        let out = run(args);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
        assert!(
            said.contains(&file.display().to_string())
                && said.contains("exists but is not a directory"),
            "{args:?}: {said}"
        );
        assert!(!said.contains("os error"), "{args:?}: {said}");
    }
}

/// `stop --signal` toward a process that never announced watching the directory (a
/// mistyped pid) sent SIGTERM and killed a bystander. It is refused now, before anything is
/// written; `--signal-anyway` insists.
#[cfg(unix)]
#[test]
fn stop_signal_refuses_a_process_that_does_not_watch() {
    let d = dirs();
    std::fs::create_dir_all(&d.run).unwrap();
    let mut bystander = other_live_process();
    let pid = bystander.id().to_string();
    let out = stop(&d, &pid, &["--signal"]);
    let report = json_of(&out);
    assert_eq!(report["outcome"], "refused_not_watching", "{report}");
    assert_eq!(out.status.code(), Some(6), "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("--signal-anyway")
    );
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the bystander lives"
    );
    let store = MarkerStore::open(Layout::Slots(d.run.clone())).unwrap();
    assert!(!store.slot_path(bystander.id()).exists(), "nothing written");
    // A service that watches is signalled as before.
    let mut service = serve(&d, &[]);
    let out = stop(&d, &service.pid_arg(), &["--signal", "--wait", "20"]);
    assert_eq!(json_of(&out)["outcome"], "stopped_planned");
    assert_eq!(service.exit_code(), Some(0));
    // And --signal-anyway insists.
    let out = stop(&d, &pid, &["--signal", "--signal-anyway"]);
    assert_eq!(json_of(&out)["signalled"], true);
    // It is a service watching another directory: the SIGTERM ends it, unexpectedly.
    assert_eq!(bystander.wait().unwrap().code(), Some(1), "got the SIGTERM");
}

/// Stopping a process that already stopped as planned answers that, 0 (as
/// `systemctl stop` does for a stopped unit), instead of 5 "already gone?"; `--pid 0` is a usage
/// error.
#[cfg(unix)]
#[test]
fn a_repeated_stop_of_a_process_that_stopped_as_planned_is_answered_0() {
    let d = dirs();
    let mut service = serve(&d, &[]);
    let pid = service.pid_arg();
    let first = stop(&d, &pid, &["--wait", "20"]);
    assert_eq!(json_of(&first)["outcome"], "stopped_planned");
    assert_eq!(service.exit_code(), Some(0));
    let again = stop(&d, &pid, &["--wait", "20"]);
    let report = json_of(&again);
    assert_eq!(report["outcome"], "already_stopped", "{report}");
    assert_eq!(again.status.code(), Some(0), "{report}");
    assert_eq!(report["exit_code"], 0);
    // Without --pid (the docs' Kubernetes hooks, `kubectl exec`): the same answer, for the
    // process whose outcome is the latest here (before: 2, "give --pid").
    let no_pid = run(&["stop", "--dir", s(&d.run), "--json", "--wait", "30"]);
    let report = json_of(&no_pid);
    assert_eq!(no_pid.status.code(), Some(0), "{report}");
    assert_eq!(report["outcome"], "already_stopped", "{report}");
    // Another fingerprint than the stopped process's: not that process, so just gone.
    let other = (service.identity.start + 1).to_string();
    let out = stop(&d, &pid, &["--start", &other]);
    assert_eq!(json_of(&out)["outcome"], "already_gone");
    assert_eq!(out.status.code(), Some(5));
    // `--pid 0` is what systemd prints as the MainPID of a stopped unit: no process
    // runs, so the answer is "already gone" (5), not a usage error (2).
    let zero = stop(&d, "0", &["--wait", "5"]);
    let report = json_of(&zero);
    assert_eq!(zero.status.code(), Some(5), "{report}");
    assert_eq!(report["outcome"], "already_gone", "{report}");
    assert!(
        report["message"].as_str().unwrap().contains("pid 0"),
        "{report}"
    );
    // An empty --pid is systemd's unset $MAINPID (a Type=exec unit's ExecStop after the service
    // ended by itself): answered as --pid 0, not a usage error.
    let empty = stop(&d, "", &[]);
    let report = json_of(&empty);
    assert_eq!(empty.status.code(), Some(5), "{report}");
    assert_eq!(report["outcome"], "already_gone", "{report}");
    // With --json even a malformed command line is one JSON object.
    let bad = stop(&d, "-3", &[]);
    assert_eq!(bad.status.code(), Some(2));
    assert_eq!(json_of(&bad)["outcome"], "error");
}

/// `stop --dir D` without `--pid` stops the one process that announced watching D
/// (as `pg_ctl` finds its server from the data directory); with none or several it is an error,
/// a JSON object with `--json`, naming the pids.
#[cfg(unix)]
#[test]
fn stop_without_pid_finds_the_one_watcher_of_the_directory() {
    let d = dirs();
    std::fs::create_dir_all(&d.run).unwrap();
    let none = run(&["stop", "--dir", s(&d.run), "--json", "--request-id", "r-1"]);
    let report = json_of(&none);
    assert_eq!(
        (report["outcome"].as_str(), none.status.code()),
        (Some("error"), Some(2)),
        "{report}"
    );
    assert_eq!(report["request_id"], "r-1", "{report}");
    assert!(report["message"].as_str().unwrap().contains("give --pid"));

    let mut service = serve(&d, &[]);
    let out = run(&["stop", "--dir", s(&d.run), "--wait", "20", "--json"]);
    let report = json_of(&out);
    assert_eq!(report["outcome"], "stopped_planned", "{report}");
    assert_eq!(report["pid"], service.pid());
    assert_eq!(service.exit_code(), Some(0));

    let mut first = serve(&d, &[]);
    let mut second = serve(&d, &[]);
    let out = run(&["stop", "--dir", s(&d.run), "--json"]);
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(2), "{report}");
    let message = report["message"].as_str().unwrap();
    assert!(
        message.contains(&first.pid_arg()) && message.contains(&second.pid_arg()),
        "{message}"
    );
    assert!(first.running() && second.running(), "nothing was stopped");
}

/// After `stop --wait` ran out, `--wait-only` follows the stop already requested
/// (writing nothing, so the report is not "on another stop request"), and `--kill` ends a target
/// still running at the deadline: first by forcing its drain, which a planned-stop
/// service obeys — it records and exits 0, reported as `forced_at_deadline` (18).
#[cfg(unix)]
#[test]
fn wait_only_follows_a_stop_under_way_and_kill_ends_one_that_overruns() {
    let d = dirs();
    let mut service = serve(
        &d,
        &["--jobs", "1", "--job-ms", "60000", "--drain-ms", "30000"],
    );
    let pid = service.pid_arg();
    let first = json_of(&stop(&d, &pid, &["--wait", "0.3"]));
    assert_eq!(first["outcome"], "still_draining", "{first}");
    let asked = first["request_id"].clone();
    let store = MarkerStore::open(Layout::Slots(d.run.clone())).unwrap();
    let followed = stop(&d, &pid, &["--wait-only", "--wait", "0.3"]);
    let report = json_of(&followed);
    assert_eq!(
        (report["outcome"].as_str(), followed.status.code()),
        (Some("still_draining"), Some(3)),
        "{report}"
    );
    assert_eq!(
        report["request_id"],
        serde_json::Value::Null,
        "nothing written: {report}"
    );
    assert!(!store.slot_path(service.pid()).exists(), "no new marker");
    assert_eq!(
        store
            .read_outcome(service.pid())
            .unwrap()
            .request_id
            .as_deref(),
        asked.as_str()
    );
    let killed = stop(&d, &pid, &["--wait-only", "--wait", "0.3", "--kill"]);
    let report = json_of(&killed);
    assert_eq!(
        (report["outcome"].as_str(), killed.status.code()),
        (Some("forced_at_deadline"), Some(18)),
        "{report}"
    );
    assert_eq!(report["was"], "still_draining");
    assert_eq!(report["exit_code"], 0, "a forced planned stop: {report}");
    assert_eq!(report["drain"]["forced"], true, "{report}");
    assert_eq!(service.exit_code(), Some(0), "ended by itself, not killed");

    // A stop that finishes within --wait-only's deadline is reported as the stop it follows.
    let mut service = serve(
        &d,
        &["--jobs", "1", "--job-ms", "60000", "--drain-ms", "300"],
    );
    let pid = service.pid_arg();
    assert_eq!(json_of(&stop(&d, &pid, &[]))["outcome"], "marker_written");
    let out = stop(&d, &pid, &["--wait-only", "--wait", "20"]);
    let report = json_of(&out);
    assert_eq!(
        (report["outcome"].as_str(), out.status.code()),
        (Some("stopped_planned"), Some(0)),
        "{report}"
    );
    assert_eq!(report["own_request"], true, "{report}");
    assert_eq!(service.exit_code(), Some(0));
}

/// `--kill` lost what a fast stop keeps: it forced the drain at the wait's deadline, so two long
/// jobs that `--drain-ms 0` hands back (and the target records) were cut off, and the service
/// exited 0 having handed back nothing. Its first step is now a drain that ends before the wait
/// does: the jobs are handed back and recorded, the stop is planned and clean (0), nothing is
/// forced, and the next start resumes both.
#[cfg(unix)]
#[test]
fn kill_first_asks_for_a_drain_that_ends_before_its_deadline() {
    let d = dirs();
    let mut service = serve(
        &d,
        &["--jobs", "2", "--job-ms", "60000", "--drain-ms", "30000"],
    );
    let pid = service.pid_arg();
    let out = stop(&d, &pid, &["--wait", "2", "--kill", "--require-clean"]);
    let report = json_of(&out);
    assert_eq!(
        (report["outcome"].as_str(), out.status.code()),
        (Some("stopped_planned"), Some(0)),
        "{report}"
    );
    assert_eq!(report["drain"]["handed_back"], 2, "{report}");
    assert_eq!(report["drain"]["forced"], false, "{report}");
    assert_eq!(service.exit_code(), Some(0));
    let listed = json_of(&run(&["records", "list", "--json", "--state", s(&d.state)]));
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(2),
        "{listed}"
    );
}

/// `status --pid N` answers like `pg_ctl status` / `systemctl is-active` — 0 while it
/// runs, 3 once it is not — with whether it watches and its last outcome; `--version` names the
/// features the binary was built with.
#[cfg(unix)]
#[test]
fn status_pid_answers_running_or_not_with_the_last_outcome() {
    let d = dirs();
    let mut service = serve(&d, &[]);
    let pid = service.pid_arg();
    let running = run(&["status", "--dir", s(&d.run), "--pid", &pid, "--json"]);
    let report = json_of(&running);
    assert_eq!(running.status.code(), Some(0), "{report}");
    assert_eq!(
        (report["running"].as_bool(), report["watching"].as_bool()),
        (Some(true), Some(true)),
        "{report}"
    );
    // A process that runs but does not watch this directory is not the service asked about: a
    // health check keyed on the exit code must not pass for it (before: 0).
    let other = std::process::id().to_string();
    let stranger = run(&["status", "--dir", s(&d.run), "--pid", &other, "--json"]);
    let report = json_of(&stranger);
    assert_eq!(stranger.status.code(), Some(20), "{report}");
    assert_eq!(
        (report["running"].as_bool(), report["watching"].as_bool()),
        (Some(true), Some(false)),
        "{report}"
    );
    assert_eq!(
        json_of(&stop(&d, &pid, &["--wait", "20"]))["outcome"],
        "stopped_planned"
    );
    assert_eq!(service.exit_code(), Some(0));
    let gone = run(&["status", "--dir", s(&d.run), "--pid", &pid, "--json"]);
    let report = json_of(&gone);
    assert_eq!(gone.status.code(), Some(3), "{report}");
    assert_eq!(report["running"], false);
    assert_eq!(report["outcome"]["phase"], "stopped", "{report}");
    let text = run(&["status", "--dir", s(&d.run), "--pid", &pid]);
    let said = String::from_utf8_lossy(&text.stdout);
    assert!(
        said.contains("not running") && said.contains("stopped, planned, exit code 0"),
        "{said}"
    );

    let version = run(&["--version"]);
    let said = String::from_utf8_lossy(&version.stdout);
    assert!(
        said.contains(env!("CARGO_PKG_VERSION")) && said.contains("features:"),
        "{said}"
    );
}

/// Text output speaks the JSON vocabulary (`stopped, planned`, not `Stopped,
/// Planned`), times to the millisecond, `inspect FILE` with an absolute path, and `status --json`
/// says `items: null` when no state directory was given.
#[cfg(unix)]
#[test]
fn text_output_speaks_the_json_vocabulary() {
    let d = dirs();
    let mut service = serve(&d, &[]);
    let pid = service.pid_arg();
    assert_eq!(
        json_of(&stop(&d, &pid, &["--wait", "20"]))["outcome"],
        "stopped_planned"
    );
    assert_eq!(service.exit_code(), Some(0));
    let text = String::from_utf8_lossy(
        &run(&["status", "--dir", s(&d.run), "--state", s(&d.state)]).stdout,
    )
    .into_owned();
    assert!(text.contains("stopped, planned, exit code 0"), "{text}");
    assert!(text.contains("stopped, planned (marker)"), "{text}");
    for internal in ["Stopped", "Planned", "Marker"] {
        assert!(!text.contains(internal), "{internal} in {text}");
    }
    let status = json_of(&run(&["status", "--dir", s(&d.run), "--json"]));
    assert_eq!(status["items"], serde_json::Value::Null, "{status}");
    // inspect FILE, given relative to the working directory, answers with the absolute path.
    let store = MarkerStore::open(Layout::Slots(d.run.clone())).unwrap();
    let me = std::process::id();
    assert_eq!(
        run(&["stop", "--pid", &me.to_string(), "--dir", s(&d.run)])
            .status
            .code(),
        Some(0)
    );
    let slot = store.slot_path(me);
    let out = planned_stop()
        .current_dir(&d.run)
        .args(["inspect"])
        .arg(slot.file_name().unwrap())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.starts_with(s(&slot)), "{said}");
    assert!(
        said.contains("will stop as planned if it watches"),
        "{said}"
    );
    let listed = String::from_utf8_lossy(&run(&["records", "list", "--state", s(&d.state)]).stdout)
        .into_owned();
    let stamp = regex_free_nanos(&listed);
    assert!(!stamp, "nine digits of nanoseconds in {listed}");
    // records list --json carries the store as fields, not only as prose.
    let listing = json_of(&run(&["records", "list", "--state", s(&d.state), "--json"]));
    assert_eq!(listing["store_kind"], "state_directory", "{listing}");
    assert_eq!(listing["state_dir"], s(&d.state), "{listing}");
    assert_eq!(listing["service"], serde_json::Value::Null, "{listing}");
}

/// Whether `text` holds a time with nine fractional digits (`12:00:00.123456789`).
#[cfg(unix)]
fn regex_free_nanos(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_digit() && c != '.')
        .filter_map(|word| word.split_once('.'))
        .any(|(_, fraction)| fraction.len() == 9)
}

/// `inspect` as a user who cannot read the directory said "undecided … will retry"
/// (7) though nothing would retry and no slot may exist; it now says it cannot read the
/// directory and whom to run as (2).
#[cfg(unix)]
#[test]
#[ignore = "needs root (runs inspect as nobody): .ci/run runs it with --ignored"]
fn inspect_of_a_directory_this_user_cannot_read_says_whom_to_run_as() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("needs root to run inspect as nobody");
    }
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dir = base.path().join("run");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    for verb in [
        &["inspect", "--pid", "1"][..],
        &["status"][..],
        &["clear", "--pid", "1"][..],
    ] {
        let out = planned_stop()
            .args(verb)
            .arg("--dir")
            .arg(&dir)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{verb:?}: {said}");
        assert!(
            said.contains("cannot read") && said.contains("uid 0"),
            "{verb:?}: {said}"
        );
        assert!(!said.contains("will retry"), "{verb:?}: {said}");
    }
}

/// The uid of `nobody`, the other user of the cross-user tests.
#[cfg(unix)]
const NOBODY: u32 = 65534;

/// A marker directory of `nobody`'s own (0700, in a base anyone may enter): the directory of a
/// service run as `nobody`, or of a root service that another user may write.
#[cfg(unix)]
fn nobodys_run_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let run_dir = base.path().join("run");
    std::fs::create_dir(&run_dir).unwrap();
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&run_dir, Some(NOBODY), Some(NOBODY)).unwrap();
    (base, run_dir)
}

/// Plants in `run_dir` a presence file naming process `pid` (its true start fingerprint), owned
/// by `owner`; returns its path.
#[cfg(unix)]
fn plant_presence(run_dir: &Path, pid: u32, owner: u32) -> std::path::PathBuf {
    let identity = ProcessIdentity::of(pid).unwrap();
    let presence = run_dir.join(format!("planned-stop-{}.watching.json", identity.pid));
    let body =
        serde_json::json!({"pid": identity.pid, "start": identity.start, "since": Utc::now()});
    std::fs::write(&presence, body.to_string()).unwrap();
    std::os::unix::fs::chown(&presence, Some(owner), Some(owner)).unwrap();
    presence
}

/// A presence file another user wrote never chooses whom root signals or kills. User
/// `nobody` owns the marker directory and plants a presence file naming a root process (its true
/// pid and start fingerprint). Root's `stop --dir D --signal` (no `--pid`) finds no watcher,
/// `--pid P --signal --wait 1 --kill` is refused as not watching, `status` lists no watcher, and
/// the bystander lives. The same file owned by root (the process's own user) is believed: the
/// SIGTERM then goes out, so the refusal above is the owner check and nothing else.
#[cfg(unix)]
#[test]
#[ignore = "needs root (files of nobody in root's view): .ci/run runs it with --ignored"]
fn a_presence_file_another_user_planted_never_chooses_whom_root_signals() {
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("needs root to see another user's files");
    }
    let (_base, run_dir) = nobodys_run_dir();
    let mut bystander = common::Helper::new(
        std::process::Command::new("sleep")
            .arg("600")
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let presence = plant_presence(&run_dir, bystander.id(), NOBODY);
    let pid = bystander.id().to_string();

    let out = run(&["stop", "--dir", s(&run_dir), "--signal", "--json"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another user wrote it"), "says why: {err}");
    let out = run(&[
        "stop",
        "--dir",
        s(&run_dir),
        "--pid",
        &pid,
        "--signal",
        "--wait",
        "1",
        "--kill",
        "--json",
    ]);
    assert_eq!(
        out.status.code(),
        Some(6),
        "refused as not watching: {out:?}"
    );
    let status = json_of(&run(&["status", "--json", "--dir", s(&run_dir)]));
    assert_eq!(status["watching"], serde_json::json!([]), "{status}");
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "the bystander lives"
    );

    // Its own user's file is believed: the signal goes out (the check above is the owner's).
    std::os::unix::fs::chown(&presence, Some(0), Some(0)).unwrap();
    let out = run(&["stop", "--dir", s(&run_dir), "--signal", "--json"]);
    assert_eq!(json_of(&out)["signalled"], true, "{out:?}");
    assert_eq!(bystander.wait().unwrap().signal(), Some(libc::SIGTERM));
}

/// A presence file counts only when its owner could signal the named process itself (kill(2)'s
/// rule: the process's real or saved uid), not merely when the process runs with its owner's
/// *effective* uid. A root process that dropped to effective uid `nobody` but keeps real and saved
/// uid root (it can take root back) is named by a presence file `nobody` planted: root's `stop
/// --pid P --signal --kill` is refused as not watching and the process lives; `status --pid` says
/// it has not announced (20). The same file about a process that dropped to `nobody` for good is
/// believed: the signal goes out, so the refusal is the uid rule and nothing else.
#[cfg(target_os = "linux")]
#[test]
#[ignore = "needs root (processes and files of nobody): .ci/run runs it with --ignored"]
fn a_presence_file_counts_only_for_a_user_who_may_signal_its_process() {
    use std::io::BufRead;
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("needs root to run processes as another user");
    }
    // (real, effective, saved) uids the bystander sets in itself, without exec (an exec copies
    // the effective uid to the saved one), and whether `nobody`'s file may speak for it.
    for (uids, believed) in [((0, NOBODY, 0), false), ((NOBODY, NOBODY, NOBODY), true)] {
        let (_base, run_dir) = nobodys_run_dir();
        let script = format!(
            "import os, time; os.setresuid({}, {}, {}); print('ready', flush=True); time.sleep(600)",
            uids.0, uids.1, uids.2
        );
        let mut child = std::process::Command::new("python3")
            .args(["-c", &script])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready", "{uids:?}");
        let mut bystander = common::Helper::new(child);
        let status = std::fs::read_to_string(format!("/proc/{}/status", bystander.id())).unwrap();
        let expected = format!("{}\t{}\t{}", uids.0, uids.1, uids.2);
        assert!(status.contains(&expected), "{uids:?}: {status}");
        plant_presence(&run_dir, bystander.id(), NOBODY);
        let pid = bystander.id().to_string();

        let status = run(&["status", "--dir", s(&run_dir), "--pid", &pid]);
        assert_eq!(
            status.status.code(),
            Some(if believed { 0 } else { 20 }),
            "{uids:?}"
        );
        let out = run(&[
            "stop",
            "--dir",
            s(&run_dir),
            "--pid",
            &pid,
            "--signal",
            "--wait",
            "1",
            "--kill",
            "--json",
        ]);
        if believed {
            assert_eq!(json_of(&out)["watching"], true, "{uids:?}: {out:?}");
            assert_eq!(bystander.wait().unwrap().signal(), Some(libc::SIGTERM));
        } else {
            assert_eq!(out.status.code(), Some(6), "{uids:?}: refused: {out:?}");
            assert!(
                bystander.try_wait().unwrap().is_none(),
                "the bystander lives"
            );
        }
    }
}

/// A hard link of a service's genuine presence file, placed in a directory it never announced
/// (anyone who can write a directory on the same file system may link a file they cannot read
/// where `fs.protected_hardlinks=0`, and root always may), made `stop --dir OTHER --signal`
/// SIGTERM it: it exited 1. A presence file with another name proves nothing about the directory
/// it is in: through the other directory the stop is refused as not watching (6), `status` lists
/// no watcher and the service keeps running; once the link is gone, its own directory's stop is
/// planned as ever.
#[cfg(unix)]
#[test]
fn a_hard_link_of_a_presence_file_speaks_for_no_other_directory() {
    let d = dirs();
    let other = d.run.with_file_name("other");
    std::fs::create_dir(&other).unwrap();
    let mut service = Serve::start(&["--dir", s(&d.run), "--poll-ms", "20"]);
    let pid = service.pid_arg();
    let name = format!("planned-stop-{pid}.watching.json");
    std::fs::hard_link(d.run.join(&name), other.join(&name)).unwrap();

    let out = stop_json(&other, &pid, &["--signal", "--wait", "1"]);
    assert_eq!(
        out.status.code(),
        Some(6),
        "refused as not watching: {out:?}"
    );
    let status = json_of(&run(&["status", "--json", "--dir", s(&other)]));
    assert_eq!(status["watching"], serde_json::json!([]), "{status}");
    assert!(
        service.child.try_wait().unwrap().is_none(),
        "the service keeps running"
    );

    std::fs::remove_file(other.join(&name)).unwrap();
    let report = json_of(&stop_json(&d.run, &pid, &["--signal", "--wait", "20"]));
    assert_eq!(report["outcome"], "stopped_planned", "{report}");
    assert_eq!(service.exit_code(), Some(0));
}

/// A presence file whose name and content name different processes is no one's
/// announcement: `status` lists no watcher for it, and a stop without `--pid` finds none.
#[cfg(unix)]
#[test]
fn a_presence_file_whose_name_and_content_disagree_is_not_listed() {
    let d = dirs();
    std::fs::create_dir_all(&d.run).unwrap();
    let me = ProcessIdentity::current().unwrap();
    let other = other_live_process();
    let body = serde_json::json!({"pid": me.pid, "start": me.start, "since": Utc::now()});
    let misnamed = d
        .run
        .join(format!("planned-stop-{}.watching.json", other.id()));
    std::fs::write(&misnamed, body.to_string()).unwrap();
    let status = json_of(&run(&["status", "--json", "--dir", s(&d.run)]));
    assert_eq!(status["watching"], serde_json::json!([]), "{status}");
    let out = run(&["stop", "--dir", s(&d.run), "--json"]);
    assert_ne!(out.status.code(), Some(0), "{out:?}");
    assert!(misnamed.exists());
}

/// `stop --restart` toward a service that had stopped for good answered
/// `already_stopped`, 0 — a deploy would believe it restarted. It now answers
/// `already_stopped_for_good`, 5; toward one that did restart, `already_stopped`, 0. And
/// `--wait-only`, which sends nothing, no longer ignores `--signal` and `--restart` in silence:
/// with either it is a usage error (2) naming the flag.
#[cfg(unix)]
#[test]
fn a_repeated_restart_tells_a_restart_from_a_stop_for_good() {
    let d = dirs();
    let mut service = serve(&d, &["--drain-ms", "50"]);
    let pid = service.pid_arg();
    assert_eq!(stop(&d, &pid, &["--wait", "20"]).status.code(), Some(0));
    assert_eq!(service.exit_code(), Some(0));
    let out = stop(&d, &pid, &["--restart"]);
    let report = json_of(&out);
    assert_eq!(report["outcome"], "already_stopped_for_good", "{report}");
    assert_eq!(out.status.code(), Some(5), "{report}");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("nothing restarted it"),
        "{report}"
    );

    let mut service = serve(&d, &["--drain-ms", "50"]);
    let pid = service.pid_arg();
    let out = stop(&d, &pid, &["--restart", "--wait", "20"]);
    assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
    assert_eq!(service.exit_code(), Some(75));
    let out = stop(&d, &pid, &["--restart"]);
    let report = json_of(&out);
    assert_eq!(report["outcome"], "already_stopped", "{report}");
    assert_eq!(
        (out.status.code(), &report["action"]),
        (Some(0), &serde_json::json!("restart")),
        "{report}"
    );

    for flag in ["--signal", "--restart"] {
        let out = run(&[
            "stop",
            "--pid",
            &pid,
            "--dir",
            s(&d.run),
            "--wait",
            "1",
            "--wait-only",
            flag,
        ]);
        assert_eq!(out.status.code(), Some(2), "{flag}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(flag),
            "{flag}: {out:?}"
        );
    }
}

/// The reserve an accepted stop keeps for its final outcome is written through a new file
/// renamed into place: a symlink planted under its name is replaced, never followed, so the
/// file it points to is untouched.
#[cfg(unix)]
#[test]
fn a_symlink_planted_as_the_outcome_reserve_is_never_followed() {
    let d = dirs();
    let mut service = serve(&d, &["--drain-ms", "50"]);
    let victim = d.state.with_file_name("victim");
    std::fs::write(&victim, b"keep me").unwrap();
    let reserve = d.run.join(format!(
        ".planned-stop-{}.outcome.json.tmp-reserve",
        service.pid()
    ));
    std::os::unix::fs::symlink(&victim, &reserve).unwrap();
    let out = stop(&d, &service.pid_arg(), &["--wait", "20"]);
    assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
    assert_eq!(service.exit_code(), Some(0));
    let kept = std::fs::read(&victim).unwrap() == b"keep me";
    assert!(
        kept,
        "the file the symlink points to was written through it"
    );
    assert!(
        !reserve.exists() && std::fs::symlink_metadata(&reserve).is_err(),
        "removed"
    );
}

/// `stop --restart --wait` sent while a stop is draining answered `stopped_planned`,
/// 0 — the deploy saw success and, under `Restart=on-failure`, the service stayed down. The
/// target ends as the stop under way says (for good, exit 0): the restart answer is
/// `not_restarted`, 16, saying so. 20 rounds.
#[cfg(unix)]
#[test]
fn a_restart_asked_while_a_stop_drains_is_never_reported_as_done() {
    for _ in 0..20 {
        let d = dirs();
        let mut service = serve(
            &d,
            &["--jobs", "1", "--job-ms", "600", "--drain-ms", "5000"],
        );
        let pid = service.pid_arg();
        assert_eq!(stop(&d, &pid, &[]).status.code(), Some(0));
        service.expect("stop_accepted");
        let out = stop(&d, &pid, &["--restart", "--wait", "20"]);
        let report = json_of(&out);
        assert_eq!(report["outcome"], "not_restarted", "{report}");
        assert_eq!(out.status.code(), Some(16), "{report}");
        assert_eq!(report["exit_code"], 0, "{report}");
        assert!(
            report["message"]
                .as_str()
                .unwrap()
                .contains("did not restart"),
            "{report}"
        );
        assert_eq!(service.exit_code(), Some(0));
    }
}

/// `serve` serves no sockets: handed some (as a `.socket` unit hands them), it refuses to start,
/// saying so, rather than saying ready while connections to them wait unanswered.
#[cfg(unix)]
#[test]
fn serve_handed_listening_sockets_refuses_to_start() {
    use std::process::Stdio;
    let d = dirs();
    let mut child = std::process::Command::new("/bin/sh")
        .args(["-c", "export LISTEN_PID=$$; exec \"$0\" serve --dir \"$1\""])
        .arg(common::command_line_binary())
        .arg(&d.run)
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "http")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ended = common::wait_for("serve to refuse to start", || child.try_wait().unwrap());
    let out = child.wait_with_output().unwrap();
    assert_eq!(ended.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("serve serves no sockets"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("\"ready\""));
}

/// `serve --restart-in-place-ms`: a planned restart starts the successor (the same
/// command), waits for its `ready`, and only then drains and exits 0 — not 75; the stopper names
/// the successor, which resumes the job the old process handed back. 20 rounds, each restarting
/// the previous round's successor.
#[cfg(unix)]
#[test]
fn serve_restarts_in_place_and_the_successor_resumes_what_it_left() {
    let d = dirs();
    let args = [
        "--restart-in-place-ms",
        "10000",
        "--jobs",
        "1",
        "--job-ms",
        "600000",
        "--drain-ms",
        "200",
        "--resume-every-ms",
        "50",
    ];
    let mut service = serve(&d, &args);
    let mut target = service.pid();
    let mut successors = Vec::new();
    for round in 0..20 {
        let out = stop(&d, &target.to_string(), &["--restart", "--wait", "20"]);
        let report = json_of(&out);
        assert_eq!(
            report["outcome"], "stopped_planned",
            "round {round}: {report}"
        );
        assert_eq!(
            (out.status.code(), &report["exit_code"]),
            (Some(0), &serde_json::json!(0)),
            "{report}"
        );
        let successor = report["successor"].as_u64().expect("the successor") as u32;
        successors.push(successor);
        // The successor writes to the same stdout: its ready, then what it resumed.
        let ready = service.expect("ready");
        assert_eq!(ready["pid"], successor, "round {round}");
        let resumed = loop {
            let event = service.expect("resumed");
            if event["jobs"].as_u64().unwrap_or(0) > 0 {
                break event;
            }
        };
        assert_eq!(resumed["items"].as_array().unwrap().len(), 1, "{resumed}");
        assert!(
            ProcessIdentity::of(target).is_none(),
            "round {round}: the predecessor is gone"
        );
        target = successor;
    }
    assert_eq!(service.exit_code(), Some(0), "the first process exited 0");
    let out = stop(&d, &target.to_string(), &["--wait", "20"]);
    assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
    for pid in successors {
        assert!(ProcessIdentity::of(pid).is_none(), "pid {pid} is gone");
    }
}

/// Every `--json` answer is one JSON object — an unusable directory for `status` and
/// `records list` too — and every answer of `stop` names the request (the one given when none
/// was sent: a command line that does not parse, `already_stopped`); a stop without `--pid`
/// through `--marker` asks whether `--marker` is right, not `--dir`.
#[cfg(unix)]
#[test]
fn every_json_answer_is_json_and_names_its_request() {
    let d = dirs();
    let missing = d.run.join("missing");
    for args in [
        vec!["status", "--dir", s(&missing), "--json"],
        vec!["records", "list", "--state", s(&missing), "--json"],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert_eq!(json_of(&out)["outcome"], "error", "{args:?}");
    }
    let out = run(&[
        "stop",
        "--dir",
        s(&d.run),
        "--pid",
        "9",
        "--json",
        "--bogus",
        "--request-id",
        "r-7",
    ]);
    assert_eq!(json_of(&out)["request_id"], "r-7");
    let mut service = serve(&d, &[]);
    let pid = service.pid_arg();
    assert_eq!(stop(&d, &pid, &["--wait", "20"]).status.code(), Some(0));
    assert_eq!(service.exit_code(), Some(0));
    let again = json_of(&stop(&d, &pid, &["--request-id", "r-8"]));
    assert_eq!(
        (&again["outcome"], &again["request_id"]),
        (
            &serde_json::json!("already_stopped"),
            &serde_json::json!("r-8")
        ),
        "{again}"
    );
    let marker = d.run.join("one.marker");
    let out = run(&["stop", "--marker", s(&marker), "--json"]);
    let message = json_of(&out)["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("--marker") && !message.contains("--dir"),
        "{message}"
    );
}

/// A stopper that gives up while its marker is still live says so — the process may
/// still stop on it — and how to withdraw it; `--wait-only` toward a process nothing was asked of
/// says that, not "is its event loop blocked?".
#[cfg(unix)]
#[test]
fn a_stopper_that_gives_up_says_its_marker_is_still_live() {
    let d = dirs();
    std::fs::create_dir_all(&d.run).unwrap();
    let mut bystander = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = bystander.id().to_string();
    let out = stop(&d, &pid, &["--wait", "1"]);
    let report = json_of(&out);
    assert_eq!(
        (out.status.code(), &report["outcome"]),
        (Some(4), &serde_json::json!("not_accepted")),
        "{report}"
    );
    let message = report["message"].as_str().unwrap();
    assert!(
        message.contains("stays live until") && message.contains("planned-stop clear"),
        "{message}"
    );
    assert!(report["marker_live_until"].is_string(), "{report}");
    let _ = bystander.kill();
    let _ = bystander.wait();

    let mut service = serve(&d, &[]);
    let out = stop(&d, &service.pid_arg(), &["--wait", "1", "--wait-only"]);
    let report = json_of(&out);
    let message = report["message"].as_str().unwrap();
    assert!(message.contains("no stop is under way"), "{message}");
    assert!(!message.contains("event loop"), "{message}");
    assert!(
        report.get("marker_live_until").is_none(),
        "nothing was written: {report}"
    );
    service.signal(libc::SIGINT);
    assert_eq!(service.exit_code(), Some(0));
}

/// One Ctrl-C during a drain begun by a marker forced it (`forced: true`, a job cut)
/// where the docs promise that a *second* one forces. Now the first is answered with a WARN and the
/// drain goes on: the job finishes, the stop is clean.
#[cfg(unix)]
#[test]
fn one_ctrl_c_during_a_marker_drain_does_not_force_it() {
    let d = dirs();
    let mut service = serve(
        &d,
        &["--jobs", "1", "--job-ms", "1500", "--drain-ms", "20000"],
    );
    let stopper = planned_stop()
        .args(["stop", "--pid", &service.pid_arg(), "--dir"])
        .arg(&d.run)
        .args(["--wait", "30", "--json", "--require-clean"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    service.expect("draining");
    service.signal(libc::SIGINT);
    let out = stopper.wait_with_output().unwrap();
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "clean: {report}");
    assert_eq!(report["drain"]["forced"], false, "{report}");
    assert_eq!(service.exit_code(), Some(0));
    let stderr = service.stderr_after_exit();
    assert!(stderr.contains("a second Ctrl-C forces"), "{stderr}");
}

/// `nobody` owns the marker directory of a root service, so it may ask for a stop
/// there. It used to be told `gone_outcome_unknown` (8) and "not watching", though the service
/// stopped as planned: root's presence and outcome files were 0600. They are readable in another
/// user's directory now (still root's, so they still count), and the answer is true. Toward root's
/// own 0700 directory, `nobody`'s `--signal` is refused as unreadable — permission denied, not
/// "has not announced".
#[cfg(unix)]
#[test]
#[ignore = "needs root (a stopper run as nobody): .ci/run runs it with --ignored"]
fn another_user_who_owns_the_directory_stops_a_root_service_and_hears_the_truth() {
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("needs root to run a stopper as nobody");
    }
    let as_nobody = |args: &[&str]| {
        common::process::planned_stop()
            .args(args)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let (base, run_dir) = nobodys_run_dir();
    let mut service = common::process::Serve::start(&["--dir", s(&run_dir), "--poll-ms", "20"]);
    let pid = service.pid_arg();
    let out = as_nobody(&[
        "stop",
        "--pid",
        &pid,
        "--dir",
        s(&run_dir),
        "--wait",
        "20",
        "--json",
    ]);
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["outcome"], "stopped_planned", "{report}");
    assert_eq!(report["watching"], true, "{report}");
    assert_eq!(service.child.wait().unwrap().code(), Some(0));

    // Root's own directory: nobody cannot enter it, and is told so.
    let root_dir = base.path().join("root-run");
    let service = common::process::Serve::start(&["--dir", s(&root_dir), "--poll-ms", "20"]);
    let pid = service.pid_arg();
    let out = as_nobody(&[
        "stop",
        "--pid",
        &pid,
        "--dir",
        s(&root_dir),
        "--signal",
        "--json",
    ]);
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(6), "{report}");
    assert_eq!(report["outcome"], "refused_unreadable", "{report}");
    assert!(
        report["message"]
            .as_str()
            .is_some_and(|m| m.contains("permission denied")),
        "{report}"
    );
    assert!(
        ProcessIdentity::of(service.pid()).is_some(),
        "not signalled"
    );
}

/// pg_ctl's modes: `--drain-ms` asks one stop for a shorter drain than the
/// service's own ("fast" beside the default "smart"): the job is handed back at once and
/// recorded, and the record's deadline is the one asked for. A longer one never lengthens the
/// service's own.
#[cfg(unix)]
#[test]
fn a_stopper_asks_for_a_shorter_drain_and_never_a_longer_one() {
    for (own_ms, asked, expected_ms) in [("20000", "300", 300), ("300", "60000", 300)] {
        let d = dirs();
        let mut service = serve(
            &d,
            &["--jobs", "1", "--job-ms", "60000", "--drain-ms", own_ms],
        );
        let pid = service.pid_arg();
        let out = stop(&d, &pid, &["--wait", "30", "--drain-ms", asked]);
        let report = json_of(&out);
        assert_eq!(out.status.code(), Some(0), "{report}");
        assert_eq!(report["outcome"], "stopped_planned", "{report}");
        assert_eq!(service.exit_code(), Some(0));
        let record = FileRecordStore::read_last_stop(&d.state).unwrap().unwrap();
        let deadline = (record.drain_deadline - record.accepted_at).num_milliseconds();
        assert_eq!(deadline, expected_ms, "asked {asked} of {own_ms}");
        assert_eq!(
            record.unfinished.len(),
            1,
            "the job, handed back and recorded"
        );
    }
}

/// `--kill` forces first, then kills. A target that ignores Ctrl-C (here a shell
/// that traps it, not a planned-stop service) is still running after the forced drain's grace,
/// and is killed: `killed_at_deadline` (14) with `forced: true`; one that ends on it is answered
/// `forced_at_deadline` (18), without claiming a record.
#[cfg(unix)]
#[test]
fn kill_kills_a_target_that_a_forced_drain_does_not_end() {
    let d = dirs();
    std::fs::create_dir_all(&d.run).unwrap();
    let mut deaf = common::Helper::new(
        std::process::Command::new("sh")
            .args(["-c", "trap '' INT; while :; do sleep 1; done"])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = deaf.id().to_string();
    let out = stop(&d, &pid, &["--wait", "0.3", "--kill"]);
    let report = json_of(&out);
    assert_eq!(
        (report["outcome"].as_str(), out.status.code()),
        (Some("killed_at_deadline"), Some(14)),
        "{report}"
    );
    assert_eq!(report["forced"], true, "{report}");
    assert_eq!(report["was"], "not_accepted", "{report}");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(deaf.wait().unwrap().signal(), Some(libc::SIGKILL));

    // A program that is no planned-stop service ends on the Ctrl-C itself: forced, not killed,
    // and the answer does not pretend anything was recorded.
    let mut sleep = std::process::Command::new("sleep");
    sleep.arg("600").stdin(std::process::Stdio::null());
    // A test run started in the background by a script (no job control) inherits SIGINT ignored,
    // and exec keeps it ignored: give `sleep` the default action this case is about.
    // SAFETY: signal(2) is async-signal-safe and changes only the child.
    unsafe {
        use std::os::unix::process::CommandExt;
        sleep.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut plain = common::Helper::new(sleep.spawn().unwrap());
    let out = stop(&d, &plain.id().to_string(), &["--wait", "0.3", "--kill"]);
    let report = json_of(&out);
    assert_eq!(
        (report["outcome"].as_str(), out.status.code()),
        (Some("forced_at_deadline"), Some(18)),
        "{report}"
    );
    assert!(
        report["message"]
            .as_str()
            .is_some_and(|m| m.contains("without a final outcome")),
        "{report}"
    );
    assert_eq!(plain.wait().unwrap().signal(), Some(libc::SIGINT));
}

/// A FIFO at the outcome path (planted by the target's own user) never hangs `stop`, with or
/// without `--wait`, whether the target watches the directory or not: reads are bounded and never
/// block (protocol.md). Before, `stop` opened the FIFO to see whether it could read it, and waited
/// for a writer for ever.
#[cfg(unix)]
#[test]
fn a_fifo_at_the_outcome_path_never_hangs_stop() {
    let d = dirs();
    let mut sleeper = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .unwrap();
    let mut service = serve(&d, &["--jobs", "0"]);
    for (pid, waits) in [
        (sleeper.id(), &[][..]),
        (sleeper.id(), &["--wait", "1"][..]),
        (service.pid(), &["--wait", "20"][..]),
    ] {
        let fifo = d.run.join(format!("planned-stop-{pid}.outcome.json"));
        let _ = std::fs::remove_file(&fifo);
        let c = std::ffi::CString::new(s(&fifo)).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut stop = planned_stop()
            .args(["stop", "--pid", &pid.to_string(), "--dir"])
            .arg(&d.run)
            .args(waits)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // A hang is what is tested: a minute is far beyond any answer (they take milliseconds).
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(status) = stop.try_wait().unwrap() {
                break Some(status);
            }
            if std::time::Instant::now() > deadline {
                let _ = stop.kill();
                let _ = stop.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.is_some(),
            "stop --pid {pid} {waits:?} hung on the FIFO"
        );
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(
        service.exit_code(),
        Some(0),
        "the watching target stopped as planned"
    );
}

/// A zero-deadline drain whose jobs hand their items back at once is clean: both items recorded,
/// nothing forced, nobody unanswered (issue 48, 6: it said `clean:false`, 13, "a participant
/// answered after its deadline", the answers having arrived a moment after a deadline of 0).
/// 20 rounds: it used to depend on when the runner took the answers in.
#[cfg(unix)]
#[test]
fn a_zero_deadline_drain_that_hands_everything_back_is_clean_20_of_20() {
    for round in 0..20 {
        let d = dirs();
        let mut service = serve(&d, &["--jobs", "2", "--job-ms", "600000"]);
        let out = stop(
            &d,
            &service.pid_arg(),
            &["--wait", "30", "--drain-ms", "0", "--require-clean"],
        );
        let report = json_of(&out);
        assert_eq!(out.status.code(), Some(0), "round {round}: {report}");
        assert_eq!(report["clean"], true, "round {round}: {report}");
        assert_eq!(report["drain"]["handed_back"], 2, "round {round}: {report}");
        assert_eq!(service.exit_code(), Some(0));
    }
}

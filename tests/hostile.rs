//! Hostile environments: racing stoppers and signals, clock steps, a marker directory that turns
//! read-only or fills up.

mod common;

use chrono::{DateTime, TimeDelta, Utc};
use common::actors::*;
use planned_stop::Clock;
use planned_stop::RunnerStatus;
use planned_stop::internals::OwnSlot;
use planned_stop::{Layout, Marker, MarkerStore, ProcessIdentity, RunnerState, Verdict};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A wall clock the test sets by hand: it can jump back and forward like an NTP step.
struct SteppedClock(Mutex<DateTime<Utc>>);

impl Clock for SteppedClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

#[derive(Debug, Clone, Copy)]
enum Hostile {
    /// For another pid.
    Foreign,
    /// Our pid, another start fingerprint.
    ReusedPid,
    /// Our pid, no fingerprint, written before we started.
    BeforeOurStart,
    /// Garbage.
    Malformed,
}

fn hostile_bytes(kind: Hostile, me: &ProcessIdentity, at: DateTime<Utc>) -> Vec<u8> {
    match kind {
        Hostile::Foreign => Marker::new(me.pid.wrapping_add(1).max(1), Some(me.start), at),
        Hostile::ReusedPid => Marker::new(me.pid, Some(me.start.wrapping_add(1)), at),
        Hostile::BeforeOurStart => {
            Marker::new(me.pid, None, me.started_at - TimeDelta::seconds(30))
        }
        Hostile::Malformed => return b"{\"target_pid\": 1.5".to_vec(),
    }
    .to_json()
    .unwrap()
}

fn any_hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        Just(Hostile::Foreign),
        Just(Hostile::ReusedPid),
        Just(Hostile::BeforeOurStart),
        Just(Hostile::Malformed),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// The wall clock steps back and forward (by up to days) between ticks while markers that are
    /// not for this process come and go: the watcher never delivers a stop.
    #[test]
    fn clock_steps_never_cause_a_wrong_stop(
        steps in proptest::collection::vec((-200_000i64..200_000, proptest::option::of(any_hostile())), 1..40),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = MarkerStore::open(Layout::Slots(dir.path().to_path_buf())).unwrap();
        let me = ProcessIdentity::current().unwrap();
        let clock = Arc::new(SteppedClock(Mutex::new(Utc::now())));
        let delivered = paused_system().block_on(async {
            let poll = Duration::from_millis(100);
            let probe = OwnSlot { store: store.clone(), own: me };
            let w = Watched::start(probe, RunnerState::Running, poll, clock.clone(), None);
            for (jump_s, marker) in &steps {
                let now = *clock.0.lock().unwrap() + TimeDelta::seconds(*jump_s);
                *clock.0.lock().unwrap() = now;
                if let Some(kind) = marker {
                    std::fs::write(store.slot_path(me.pid), hostile_bytes(*kind, &me, now)).unwrap();
                }
                advance(poll).await;
            }
            w.deliveries()
        });
        prop_assert!(delivered.is_empty(), "a hostile marker stopped the process");
    }

    /// The same at the store: whatever the clock says, a claim never takes a marker that is not ours.
    #[test]
    fn clock_steps_never_let_a_claim_take_a_marker_that_is_not_ours(
        kind in any_hostile(),
        written_offset_s in -1_000_000i64..1_000_000,
        now_offsets in proptest::collection::vec(-1_000_000i64..1_000_000, 1..10),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = MarkerStore::open(Layout::Slots(dir.path().to_path_buf())).unwrap();
        let me = ProcessIdentity::current().unwrap();
        let base = Utc::now();
        let bytes = hostile_bytes(kind, &me, base + TimeDelta::seconds(written_offset_s));
        for offset in now_offsets {
            std::fs::write(store.slot_path(me.pid), &bytes).unwrap();
            let now = base + TimeDelta::seconds(offset);
            prop_assert!(!matches!(store.probe(&me, now).unwrap(), Verdict::ForSelf(_)));
            prop_assert_eq!(store.claim(&me, now).unwrap(), None);
        }
    }
}

/// A fresh marker for us whose clock then steps far forward is stale, not a stop: the TTL is judged
/// on the wall clock, and a big step must not turn an old request into a late surprise.
#[test]
fn a_clock_step_past_the_ttl_turns_our_pending_marker_stale_not_into_a_stop() {
    let dir = tempfile::tempdir().unwrap();
    let store = MarkerStore::open(Layout::Slots(dir.path().to_path_buf())).unwrap();
    let me = ProcessIdentity::current().unwrap();
    let clock = Arc::new(SteppedClock(Mutex::new(Utc::now())));
    let delivered = paused_system().block_on(async {
        let probe = OwnSlot {
            store: store.clone(),
            own: me,
        };
        let poll = Duration::from_millis(100);
        let w = Watched::start(probe, RunnerState::Starting, poll, clock.clone(), None);
        // Written now, for us, with trigger_watcher false: it waits for a signal that never comes.
        let marker = Marker::new(me.pid, Some(me.start), clock.now()).with_trigger_watcher(false);
        store.write(&marker).unwrap();
        advance(poll).await;
        assert!(store.slot_path(me.pid).exists());
        *clock.0.lock().unwrap() += TimeDelta::hours(3);
        advance(poll).await;
        assert!(
            !store.slot_path(me.pid).exists(),
            "expired by the step and removed"
        );
        w.runner
            .send_modify(|s: &mut RunnerStatus| s.state = RunnerState::Running);
        advance(poll * 3).await;
        assert!(w.watcher.connected());
        w.deliveries()
    });
    assert!(delivered.is_empty());
}

#[cfg(unix)]
mod processes {
    use super::common::process::*;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

    /// Two stoppers, the service's watcher and a SIGTERM race on one target, round after round:
    /// every round ends with exactly one accepted stop, planned, and exit 0.
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
            let record = planned_stop::StopRecord::take(&state).unwrap().unwrap();
            assert_eq!(record.exit_code, code.unwrap());
        }
    }

    /// The stoppers write their markers first; only then does the SIGTERM race the watcher. Every
    /// round must be planned (hazard 1).
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

    /// A tmpfs mounted for the test (root only; skipped where mounting is not allowed).
    struct Tmpfs(PathBuf);

    impl Tmpfs {
        fn mount(path: &Path, size: &str) -> Option<Tmpfs> {
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
            if !ok {
                eprintln!("SKIPPED: cannot mount a tmpfs here (needs root and mount rights)");
                return None;
            }
            Some(Tmpfs(path.to_path_buf()))
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
    fn a_read_only_marker_directory_fails_the_stopper_and_the_service_keeps_running() {
        let base = tempfile::tempdir().unwrap();
        let Some(fs) = Tmpfs::mount(&base.path().join("m"), "1m") else {
            return;
        };
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
            run(&[
                "stop",
                "--pid",
                &service.pid_arg(),
                "--dir",
                s(&run_dir),
                "--wait",
                "20"
            ])
            .status
            .code(),
            Some(0)
        );
        assert_eq!(service.exit_code(), Some(0));
    }

    #[test]
    fn a_full_marker_directory_fails_the_stopper_leaves_no_partial_marker_and_the_service_keeps_running()
     {
        let base = tempfile::tempdir().unwrap();
        let Some(fs) = Tmpfs::mount(&base.path().join("m"), "64k") else {
            return;
        };
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
        assert!(
            leftovers.is_empty(),
            "no partial marker or temp file left: {leftovers:?}"
        );
        service.wait_probes("absent", 5);
        assert!(service.running());
        std::fs::remove_file(&filler).unwrap();
        assert_eq!(
            run(&[
                "stop",
                "--pid",
                &service.pid_arg(),
                "--dir",
                s(&run_dir),
                "--wait",
                "20"
            ])
            .status
            .code(),
            Some(0)
        );
        assert_eq!(service.exit_code(), Some(0));
    }
}

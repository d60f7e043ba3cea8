//! The watcher alone. The `test_watcher_*` tests are the watcher's first contract, one test a
//! rule, on one shared marker file (the probe's two are in `store.rs`).
//!
//! They state the watcher against an event loop that only records. Here the watcher is the real
//! `MarkerWatcherActor`; the runner's state is set by the test through the status channel, the fake
//! loop is a `Recorder` actor that records every `PlannedStop`, and its `stop_event` is the
//! runner reaching `Stopped`. Time is tokio's paused clock, so "let it poll a few times" is an exact
//! number of ticks, not a sleep.
//!
//! Every test runs twice: polling only, and event-driven (real filesystem notifications on the
//! marker's directory, with the poll as the safety net).

use crate::common;

use chrono::Utc;
use common::actors::*;
use common::*;
use planned_stop::Layout;
use planned_stop::internals::{MarkerProbe, OwnSlot, SlotEvents};
use planned_stop::marker::{Judgement, Marker, MarkerStore, StoreError};
use planned_stop::{ProcessIdentity, ProcessState};
use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(50);
/// The poll interval of the tests that count ticks in real-world units (10 a second).
const TICK: Duration = Duration::from_millis(100);

/// How the watcher learns of markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Poll,
    Events,
}

const MODES: [Mode; 2] = [Mode::Poll, Mode::Events];

/// The watcher and a recording loop, on one shared marker file, in `mode`.
fn on_file(path: &Path, state: ProcessState, poll: Duration, mode: Mode) -> Watched {
    let store = MarkerStore::open(Layout::SingleFile(path.to_path_buf())).unwrap();
    let own = ProcessIdentity::current().unwrap();
    let wakeups = match mode {
        Mode::Poll => None,
        Mode::Events => {
            let (events, wakeups) = SlotEvents::watch(path).expect("notifications on a temp dir");
            Some((wakeups, Some(events)))
        }
    };
    Watched::start(
        OwnSlot { store, own },
        state,
        poll,
        TokioClock::new(),
        wakeups,
    )
}

#[test]
fn test_watcher_fires_shutdown_when_marker_appears() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let marker = shared_marker(dir.path());
        let written = write_self_marker(&marker, false);
        paused_system().block_on(async {
            let w = on_file(&marker, ProcessState::Running, POLL, mode);
            advance(POLL * 3).await;
            assert!(!w.watcher.connected(), "watcher should exit after firing");
            let seen = w.deliveries();
            assert_eq!(
                seen.len(),
                1,
                "expected exactly one PlannedStop, got {seen:?}"
            );
            // The one delivery: the planned-stop message, carrying the marker's data.
            assert_eq!(
                seen[0].0,
                planned_stop::internals::PlannedStop::from(&written)
            );
            assert_eq!(seen[0].1, ProcessState::Running);
        });
    }
}

#[test]
fn test_watcher_does_not_fire_when_marker_absent() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let marker = shared_marker(dir.path());
        paused_system().block_on(async {
            let w = on_file(&marker, ProcessState::Running, POLL, mode);
            advance(Duration::from_millis(300)).await; // six polls
            assert!(
                w.watcher.connected(),
                "the watcher keeps polling while no marker is there"
            );
            w.stop_event();
            w.watcher_gone().await;
            assert!(!w.watcher.connected());
            assert_eq!(
                w.deliveries(),
                vec![],
                "no marker present, but the watcher fired"
            );
        });
    }
}

#[test]
fn test_watcher_skips_when_runner_already_draining() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let marker = shared_marker(dir.path());
        write_self_marker(&marker, false);
        paused_system().block_on(async {
            let w = on_file(&marker, ProcessState::Draining, POLL, mode);
            advance(Duration::from_millis(200)).await;
            w.stop_event();
            w.watcher_gone().await;
            assert_eq!(
                w.deliveries(),
                vec![],
                "watcher fired while runner was already draining"
            );
            assert!(!w.watcher.connected());
            assert!(
                marker.exists(),
                "the draining runner's marker is not touched by the watcher"
            );
        });
    }
}

#[test]
fn test_watcher_skips_when_runner_not_started() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let marker = shared_marker(dir.path());
        // A marker from a previous instance...
        std::fs::write(&marker, r#"{"target_pid": 9999}"#).unwrap();
        paused_system().block_on(async {
            let w = on_file(&marker, ProcessState::Starting, POLL, mode);
            advance(Duration::from_millis(200)).await;
            assert_eq!(
                w.deliveries(),
                vec![],
                "watcher fired before runner was running"
            );
            // ...and one that *is* for us: still nothing while starting (it is held, not dropped).
            write_self_marker(&marker, false);
            advance(Duration::from_millis(200)).await;
            assert_eq!(
                w.deliveries(),
                vec![],
                "watcher fired before runner was running"
            );
            w.stop_event();
            w.watcher_gone().await;
            assert_eq!(w.deliveries(), vec![]);
            assert!(!w.watcher.connected());
        });
    }
}

#[test]
fn test_watcher_responds_to_stop_event_promptly() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let marker = shared_marker(dir.path());
        paused_system().block_on(async {
            let w = on_file(
                &marker,
                ProcessState::Running,
                Duration::from_millis(100),
                mode,
            );
            advance(Duration::from_millis(50)).await;
            let before = tokio::time::Instant::now();
            w.stop_event();
            w.watcher_gone().await;
            // Not "within a poll interval": at once, without the clock moving at all.
            assert_eq!(tokio::time::Instant::now(), before);
            assert!(
                !w.watcher.connected(),
                "watcher must honour the stop without waiting for a tick"
            );
        });
    }
}

#[test]
fn test_watcher_fires_only_once_when_marker_persists() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let marker = shared_marker(dir.path());
        write_self_marker(&marker, false);
        paused_system().block_on(async {
            let w = on_file(&marker, ProcessState::Running, POLL, mode);
            // The recorder does not consume the marker: it stays for many polls.
            for _ in 0..20 {
                advance(POLL).await;
            }
            assert!(marker.exists());
            assert_eq!(
                w.deliveries().len(),
                1,
                "fired {:?}; should fire once and exit",
                w.deliveries()
            );
            assert!(!w.watcher.connected());
        });
    }
}

/// An exploding path resolver: the first probe works, every later one fails.
struct Exploding {
    calls: Rc<Cell<u32>>,
}

impl MarkerProbe for Exploding {
    fn probe(&self, _: chrono::DateTime<Utc>) -> Result<Judgement, StoreError> {
        self.calls.set(self.calls.get() + 1);
        if self.calls.get() == 1 {
            return Ok(Judgement::Absent);
        }
        Err(StoreError::Io {
            op: "stat",
            path: "/nonexistent".into(),
            source: std::io::Error::other("filesystem failed"),
        })
    }
}

#[test]
fn test_watcher_tolerates_marker_path_resolution_errors() {
    for mode in MODES {
        let logs = LogCapture::default();
        let _guard = logs.install();
        paused_system().block_on(async {
            let calls = Rc::new(Cell::new(0));
            // In event mode the "notifications" are sent by hand: there is no real path to watch.
            let (notify, wakeups) = tokio::sync::mpsc::unbounded_channel();
            let wakeups = (mode == Mode::Events).then_some((wakeups, None));
            let w = Watched::start(
                Exploding {
                    calls: calls.clone(),
                },
                ProcessState::Running,
                POLL,
                TokioClock::new(),
                wakeups,
            );
            advance(Duration::from_millis(200)).await;
            for _ in 0..20 {
                let _ = notify.send(());
                advance(POLL).await;
            }
            assert!(
                calls.get() >= 20,
                "the watcher keeps probing after errors ({} probes, {mode:?})",
                calls.get()
            );
            assert!(w.watcher.connected());
            w.stop_event();
            w.watcher_gone().await;
            assert!(
                !w.watcher.connected(),
                "watcher should still honour the stop after errors"
            );
            // No shutdown fired because the marker never reported existence.
            assert_eq!(w.deliveries(), vec![]);
        });
        // Logged, but not once per tick.
        assert_eq!(
            logs.count(tracing::Level::WARN, "cannot probe the planned-stop marker"),
            1,
            "{mode:?}"
        );
    }
}

#[test]
fn test_watcher_does_not_fire_for_foreign_pid_marker() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let marker = shared_marker(dir.path());
        let me = ProcessIdentity::current().unwrap();
        // A different, live process, with a start time that cannot match it, freshly written so the
        // TTL does not remove it.
        let other = other_live_process();
        let record = Marker::new(other.id(), Some(me.start ^ 0xFFFF), Utc::now())
            .with_stopper_pid(other.id());
        std::fs::write(&marker, record.to_json().unwrap()).unwrap();
        paused_system().block_on(async {
            let w = on_file(&marker, ProcessState::Running, POLL, mode);
            advance(Duration::from_millis(300)).await;
            w.stop_event();
            w.watcher_gone().await;
            assert!(!w.watcher.connected());
            assert_eq!(
                w.deliveries(),
                vec![],
                "watcher fired on a foreign-pid marker"
            );
        });
        // Foreign (but live) marker is left in place: it may still belong to the process it names.
        assert!(marker.exists());
        drop(other);
    }
}

#[test]
fn test_watcher_cleans_up_stale_marker_and_keeps_running() {
    for mode in MODES {
        let dir = tempfile::tempdir().unwrap();
        let marker = shared_marker(dir.path());
        write_self_marker(&marker, true);
        paused_system().block_on(async {
            let w = on_file(&marker, ProcessState::Running, POLL, mode);
            advance(Duration::from_millis(300)).await;
            assert!(
                w.watcher.connected(),
                "the watcher keeps running after cleaning up"
            );
            assert!(!marker.exists(), "stale marker should have been cleaned up");
            w.stop_event();
            w.watcher_gone().await;
            assert!(!w.watcher.connected());
            assert_eq!(
                w.deliveries(),
                vec![],
                "stale marker must not fire shutdown"
            );
        });
    }
}

/// Counts probes, to see how many ticks a stall produces.
struct Counting {
    inner: OwnSlot,
    probes: Rc<Cell<u32>>,
}

impl MarkerProbe for Counting {
    fn probe(&self, now: chrono::DateTime<Utc>) -> Result<Judgement, StoreError> {
        self.probes.set(self.probes.get() + 1);
        self.inner.probe(now)
    }
}

#[test]
fn a_burst_of_ticks_after_a_stall_sends_nothing_twice() {
    let dir = tempfile::tempdir().unwrap();
    let store = MarkerStore::open(Layout::Slots(dir.path().join("run"))).unwrap();
    let me = ProcessIdentity::current().unwrap();
    paused_system().block_on(async {
        let probes = Rc::new(Cell::new(0));
        let probe = Counting {
            inner: OwnSlot {
                store: store.clone(),
                own: me,
            },
            probes: probes.clone(),
        };
        let w = Watched::start(probe, ProcessState::Running, TICK, TokioClock::new(), None);
        advance(TICK * 3).await;
        let before = probes.get();
        // A stall of 50 intervals: fixed delay means one tick afterwards, not fifty.
        advance(TICK * 50).await;
        assert_eq!(probes.get(), before + 1, "one tick after the stall");
        store
            .write(&Marker::new(me.pid, Some(me.start), Utc::now()))
            .unwrap();
        advance(TICK * 50).await;
        advance(TICK * 50).await;
        assert_eq!(w.deliveries().len(), 1);
        assert!(!w.watcher.connected());
    });
}

/// Fails while `failing` is set, then finds nothing.
struct Flaky {
    failing: Rc<Cell<bool>>,
}

impl MarkerProbe for Flaky {
    fn probe(&self, _: chrono::DateTime<Utc>) -> Result<Judgement, StoreError> {
        if self.failing.get() {
            return Err(StoreError::Unreadable {
                path: "slot".into(),
                kind: std::io::ErrorKind::PermissionDenied,
            });
        }
        Ok(Judgement::Absent)
    }
}

/// A persisting probe error is logged once a minute, not once a tick, and its end is logged once.
#[test]
fn a_persisting_probe_error_is_logged_once_a_minute_and_its_recovery_once() {
    let logs = LogCapture::default();
    let _guard = logs.install();
    paused_system().block_on(async {
        let failing = Rc::new(Cell::new(true));
        let probe = Flaky {
            failing: failing.clone(),
        };
        let _w = Watched::start(probe, ProcessState::Running, TICK, TokioClock::new(), None);
        // 125 s of failures at 10 probes a second: 1 250 failed probes.
        for _ in 0..1_250 {
            advance(TICK).await;
        }
        failing.set(false);
        for _ in 0..10 {
            advance(TICK).await;
        }
    });
    let warned = logs.count(tracing::Level::WARN, "cannot probe the planned-stop marker");
    assert_eq!(warned, 3, "at 0 s, 60 s and 120 s");
    assert_eq!(
        logs.count(tracing::Level::INFO, "marker probe works again"),
        1
    );
}

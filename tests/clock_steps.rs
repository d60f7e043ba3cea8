//! Clock steps: the wall clock jumps back and forward (an NTP step, a suspended VM) while markers
//! wait; no step makes a marker stop the wrong process or turns an old request into a stop.

use crate::common;

use chrono::{DateTime, TimeDelta, Utc};
use common::actors::*;
use planned_stop::Layout;
use planned_stop::internals::{Clock, OwnSlot};
use planned_stop::marker::{Judgement, Marker, MarkerStore};
use planned_stop::{ProcessIdentity, ProcessState};
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
            let w = Watched::start(probe, ProcessState::Running, poll, clock.clone(), None);
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
            prop_assert!(!matches!(store.probe(&me, now).unwrap(), Judgement::ForSelf(_)));
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
        let w = Watched::start(probe, ProcessState::Starting, poll, clock.clone(), None);
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
        w.set_state(ProcessState::Running);
        advance(poll * 3).await;
        assert!(w.watcher.connected());
        w.deliveries()
    });
    assert!(delivered.is_empty());
}

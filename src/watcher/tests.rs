use super::*;
use crate::marker::Marker;
use crate::verdict::{Malformed, Stale};
use RunnerState::*;

fn for_self(trigger: bool) -> Verdict {
    let m = Marker::new(1, Some(2), DateTime::UNIX_EPOCH)
        .with_request_id("r")
        .with_trigger_watcher(trigger);
    Verdict::ForSelf(m)
}

#[test]
fn a_marker_for_us_is_delivered_when_running_and_held_when_starting() {
    let Verdict::ForSelf(m) = for_self(true) else {
        unreachable!()
    };
    assert_eq!(
        next_step(&for_self(true), Running),
        WatchStep::Deliver(PlannedStop::from(&m))
    );
    assert_eq!(
        next_step(&for_self(true), Starting),
        WatchStep::Hold(PlannedStop::from(&m))
    );
}

#[test]
fn nothing_is_delivered_once_the_runner_stops() {
    for state in [Draining, Stopped] {
        assert_eq!(next_step(&for_self(true), state), WatchStep::Exit);
        assert_eq!(next_step(&Verdict::Absent, state), WatchStep::Exit);
    }
}

#[test]
fn other_verdicts_and_no_trigger_markers_keep_watching() {
    let marker = Marker::new(9, None, DateTime::UNIX_EPOCH);
    for v in [
        Verdict::Absent,
        Verdict::Foreign(marker),
        Verdict::Stale(Stale::OwnerGone { pid: 9 }),
        Verdict::Malformed(Malformed::Content(crate::MarkerError::Empty)),
        for_self(false),
    ] {
        assert_eq!(next_step(&v, Running), WatchStep::Continue, "{v:?}");
        assert_eq!(next_step(&v, Starting), WatchStep::Continue, "{v:?}");
    }
}

use super::*;
use crate::judgement::{Malformed, Stale};
use crate::schema::Marker;
use ProcessState::*;

fn for_self(trigger: bool) -> Judgement {
    let m = Marker::new(1, Some(2), DateTime::UNIX_EPOCH)
        .with_request_id("r")
        .with_trigger_watcher(trigger);
    Judgement::ForSelf(m)
}

#[test]
fn a_marker_for_us_is_delivered_when_running_and_held_when_starting() {
    let Judgement::ForSelf(m) = for_self(true) else {
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
        assert_eq!(next_step(&Judgement::Absent, state), WatchStep::Exit);
    }
}

#[test]
fn other_verdicts_and_no_trigger_markers_keep_watching() {
    let marker = Marker::new(9, None, DateTime::UNIX_EPOCH);
    for v in [
        Judgement::Absent,
        Judgement::Foreign(marker),
        Judgement::Stale(Stale::OwnerGone { pid: 9 }),
        Judgement::Malformed(Malformed::Content(crate::schema::MarkerError::Empty)),
        for_self(false),
    ] {
        assert_eq!(next_step(&v, Running), WatchStep::Continue, "{v:?}");
        assert_eq!(next_step(&v, Starting), WatchStep::Continue, "{v:?}");
    }
}

fn a_stop() -> PlannedStop {
    let Judgement::ForSelf(m) = for_self(true) else {
        unreachable!()
    };
    PlannedStop::from(&m)
}

#[test]
fn the_watch_delivers_once_and_then_sends_nothing_whatever_it_is_told() {
    let mut watch = Watch::Looking;
    assert_eq!(watch.on_step(WatchStep::Continue), WatchSend::Nothing);
    assert!(watch.is_looking());
    assert_eq!(
        watch.on_step(WatchStep::Deliver(a_stop())),
        WatchSend::Stop(a_stop())
    );
    assert_eq!(watch, Watch::Done);
    assert_eq!(
        watch.on_step(WatchStep::Deliver(a_stop())),
        WatchSend::Nothing
    );
    assert_eq!(watch.on_step(WatchStep::Hold(a_stop())), WatchSend::Nothing);
    assert_eq!(watch.on_runner(Running), WatchSend::Nothing);
    assert_eq!(watch, Watch::Done);
}

#[test]
fn a_held_stop_is_noticed_once_and_delivered_once_the_runner_runs() {
    let mut watch = Watch::Looking;
    assert_eq!(
        watch.on_step(WatchStep::Hold(a_stop())),
        WatchSend::HeldNotice(a_stop())
    );
    assert_eq!(watch, Watch::Holding(a_stop()));
    assert_eq!(
        watch.on_step(WatchStep::Hold(a_stop())),
        WatchSend::Nothing,
        "not probing"
    );
    assert_eq!(watch.on_runner(Starting), WatchSend::Nothing);
    assert_eq!(watch.on_runner(Running), WatchSend::Stop(a_stop()));
    assert_eq!(watch.on_runner(Running), WatchSend::Nothing, "once");
}

#[test]
fn a_stopping_runner_ends_the_watch_and_drops_a_held_stop() {
    for state in [Draining, Stopped] {
        let mut looking = Watch::Looking;
        assert_eq!(looking.on_runner(state), WatchSend::Nothing);
        assert_eq!(looking, Watch::Done);
        let mut holding = Watch::Holding(a_stop());
        assert_eq!(holding.on_runner(state), WatchSend::Nothing);
        assert_eq!(holding, Watch::Done);
        assert_eq!(holding.on_runner(Running), WatchSend::Nothing);
    }
    let mut looking = Watch::Looking;
    assert_eq!(looking.on_step(WatchStep::Exit), WatchSend::Nothing);
    assert_eq!(looking, Watch::Done);
}

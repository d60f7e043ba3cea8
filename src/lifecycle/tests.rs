use super::*;
use ProcessState::*;
use SignalKind::*;
use StopVerdict::*;

fn running() -> Lifecycle {
    let mut l = Lifecycle::new();
    assert_eq!(l.ready(), Step::Ignore("running"));
    l
}

#[test]
fn a_planned_stop_while_running_drains_as_planned() {
    let mut l = running();
    assert_eq!(l.planned_stop(), Step::Drain(StopCause::Marker, Planned));
    assert_eq!((l.state(), l.verdict()), (Draining, Some(Planned)));
    assert_eq!(l.stopped(), Some(Planned));
    assert_eq!(l.state(), Stopped);
}

#[test]
fn the_latch_keeps_a_planned_stop_planned_when_sigterm_follows() {
    let mut l = running();
    l.planned_stop();
    // The marker is gone (claimed); the SIGTERM finds nothing to claim.
    assert!(!l.awaits_classification());
    assert_eq!(l.signal(Terminate, false), Step::Ignore("already stopping"));
    assert_eq!(l.stopped(), Some(Planned));
}

#[test]
fn the_latch_keeps_an_unmarked_sigterm_unexpected_when_a_marker_follows() {
    let mut l = running();
    assert_eq!(
        l.signal(Terminate, false),
        Step::Drain(StopCause::Signal(Terminate), Unexpected)
    );
    assert_eq!(l.planned_stop(), Step::Ignore("already stopping"));
    assert_eq!(l.stopped(), Some(Unexpected));
}

#[test]
fn sigterm_is_planned_only_with_a_claimed_marker_and_sigint_always() {
    assert_eq!(
        running().signal(Terminate, true),
        Step::Drain(StopCause::Signal(Terminate), Planned)
    );
    assert_eq!(
        running().signal(Hangup, false),
        Step::Drain(StopCause::Signal(Hangup), Unexpected)
    );
    assert_eq!(
        running().signal(Interrupt, false),
        Step::Drain(StopCause::Signal(Interrupt), Planned)
    );
}

#[test]
fn a_planned_stop_while_starting_is_held_until_ready() {
    let mut l = Lifecycle::new();
    assert_eq!(l.planned_stop(), Step::Hold);
    assert_eq!(l.state(), Held, "not acted on early");
    assert_eq!(l.planned_stop(), Step::Ignore("a stop is already decided"));
    assert_eq!(
        l.ready(),
        Step::Drain(StopCause::Marker, Planned),
        "not dropped"
    );
    assert_eq!(l.ready(), Step::Ignore("already past starting"));
}

#[test]
fn a_signal_while_starting_stops_at_once_keeping_a_held_planned_verdict() {
    let mut l = Lifecycle::new();
    assert_eq!(
        l.signal(Terminate, false),
        Step::Drain(StopCause::Signal(Terminate), Unexpected)
    );
    let mut held = Lifecycle::new();
    held.planned_stop();
    assert_eq!(
        held.signal(Terminate, false),
        Step::Drain(StopCause::Signal(Terminate), Planned)
    );
    assert_eq!(held.ready(), Step::Ignore("already past starting"));
}

#[test]
fn while_draining_only_an_escalation_does_anything() {
    let mut l = running();
    l.signal(Terminate, false);
    assert_eq!(l.signal(Terminate, true), Step::Ignore("already stopping"));
    assert_eq!(
        l.request(StopRequest::Planned),
        Step::Ignore("already stopping")
    );
    // The first Ctrl-C of a drain begun otherwise does not force it; the second does.
    assert_eq!(
        l.signal(Interrupt, false),
        Step::Ignore("a first Ctrl-C while draining: a second one forces the stop")
    );
    assert_eq!(l.signal(Interrupt, false), Step::Force);
    assert_eq!(l.request(StopRequest::Force), Step::Force);
    assert_eq!(
        l.verdict(),
        Some(Unexpected),
        "escalation does not reclassify"
    );
    l.stopped();
    assert_eq!(l.signal(Interrupt, false), Step::Ignore("already stopping"));
    assert_eq!(
        l.request(StopRequest::Force),
        Step::Ignore("already stopping")
    );
    assert_eq!(l.stopped(), None, "stopped once");
}

#[test]
fn programmatic_requests_carry_their_own_classification() {
    assert_eq!(
        running().request(StopRequest::Planned),
        Step::Drain(StopCause::Request, Planned)
    );
    assert_eq!(
        running().request(StopRequest::Unexpected),
        Step::Drain(StopCause::Request, Unexpected)
    );
}

#[test]
fn a_force_before_any_drain_is_ignored_and_decides_nothing() {
    let mut l = running();
    assert_eq!(
        l.request(StopRequest::Force),
        Step::Ignore("nothing to force: no drain in progress")
    );
    assert_eq!((l.state(), l.verdict()), (Running, None));
    assert_eq!(
        l.request(StopRequest::Planned),
        Step::Drain(StopCause::Request, Planned)
    );
}

#[test]
fn stages_are_ordered_forward() {
    use super::Stage::*;
    assert!(Starting < Running && Running < Draining && Draining < Stopped);
}

#[test]
fn the_second_ctrl_c_forces_a_drain_however_it_began() {
    let mut by_ctrl_c = running();
    assert!(matches!(
        by_ctrl_c.signal(Interrupt, false),
        Step::Drain(..)
    ));
    assert_eq!(
        by_ctrl_c.signal(Interrupt, false),
        Step::Force,
        "the second Ctrl-C"
    );
    let mut by_marker = running();
    assert!(matches!(by_marker.planned_stop(), Step::Drain(..)));
    assert!(
        matches!(by_marker.signal(Interrupt, false), Step::Ignore(_)),
        "the first Ctrl-C"
    );
    assert_eq!(
        by_marker.signal(Interrupt, false),
        Step::Force,
        "the second"
    );
}

use super::*;
use crate::lifecycle::{StopCause, StopVerdict};
use DrainPhase::*;

fn run(now: Instant, overall_secs: u64) -> DrainRun {
    DrainRun::new(
        StopCause::Marker,
        StopVerdict::Planned,
        Requester::default(),
        DateTime::UNIX_EPOCH,
        now,
        Duration::from_secs(overall_secs),
    )
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn wall(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(s, 0).unwrap()
}

#[test]
fn phases_run_in_order_and_empty_ones_are_skipped() {
    let t0 = Instant::now();
    let config = RunnerConfig::default();
    let phases = [Final, Ingress, Final];
    let mut r = run(t0, 10);
    let Next::Ask {
        phase,
        participants,
        ..
    } = r.advance(&phases, &config, t0, wall(0), false)
    else {
        panic!("ingress first")
    };
    assert_eq!((phase, participants), (Ingress, vec![1]));
    assert!(r.answer(1, "http", Ingress, Some(DrainReport::done())));
    // No work participants: straight to the final phase, both of its members at once.
    let Next::Ask {
        phase,
        participants,
        ..
    } = r.advance(&phases, &config, t0 + secs(1), wall(1), false)
    else {
        panic!("final next")
    };
    assert_eq!((phase, participants), (Final, vec![0, 2]));
    assert!(!r.answer(0, "a", Final, Some(DrainReport::done())));
    assert!(r.answer(2, "b", Final, Some(DrainReport::done())));
    assert_eq!(
        r.advance(&phases, &config, t0 + secs(2), wall(2), false),
        Next::Finish
    );
    let order: Vec<_> = r
        .phases
        .iter()
        .map(|p| (p.phase, p.started_at, p.finished_at))
        .collect();
    assert_eq!(
        order,
        [(Ingress, wall(0), wall(1)), (Final, wall(1), wall(2))]
    );
    assert!(r.drained_in_time(&["a", "http", "b"]));
}

#[test]
fn a_phase_gets_its_own_deadline_but_never_more_than_what_is_left() {
    let t0 = Instant::now();
    let config = RunnerConfig {
        phase_deadlines: vec![(Ingress, secs(3)), (Work, secs(30))],
        ..RunnerConfig::default()
    };
    let phases = [Ingress, Work];
    let mut r = run(t0, 10);
    let Next::Ask { within, .. } = r.advance(&phases, &config, t0, wall(0), false) else {
        panic!()
    };
    assert_eq!(within, secs(3), "the ingress phase's own deadline");
    // The ingress timed out at its deadline (3 s): the work phase gets the 7 s that are left,
    // not its own 30 s, and the ingress never takes more than its 3 s.
    let Next::Ask { within, .. } = r.advance(&phases, &config, t0 + secs(3), wall(3), true) else {
        panic!()
    };
    assert_eq!(within, secs(7));
    assert!(r.phases[0].timed_out);
    assert!(
        !r.drained_in_time(&["http", "jobs"]),
        "the ingress never answered"
    );
    assert_eq!(r.unanswered(&["http", "jobs"]), ["http", "jobs"]);
}

#[test]
fn a_closed_mailbox_does_not_delay_the_drain_but_its_work_is_unknown() {
    let t0 = Instant::now();
    let mut r = run(t0, 10);
    r.advance(&[Work, Work], &RunnerConfig::default(), t0, wall(0), false);
    assert!(!r.answer(0, "gone", Work, None));
    assert!(
        r.answer(1, "jobs", Work, Some(DrainReport::unfinished(["j-1"]))),
        "the phase is complete without waiting for the gone participant"
    );
    assert_eq!(r.unanswered(&["gone", "jobs"]), ["gone"]);
    assert!(!r.drained_in_time(&["gone", "jobs"]), "its work is unknown");
    assert_eq!(r.notes.len(), 1);
    assert_eq!(r.notes[0].participant, "gone");
    assert_eq!(r.unfinished[0].item, "j-1");
}

#[test]
fn handing_work_back_in_time_is_in_time() {
    let t0 = Instant::now();
    let mut r = run(t0, 10);
    r.advance(&[Work], &RunnerConfig::default(), t0, wall(0), false);
    assert!(r.answer(0, "jobs", Work, Some(DrainReport::unfinished(["j-1"]))));
    assert!(r.drained_in_time(&["jobs"]));
}

#[test]
fn late_cut_or_forced_drains_are_not_in_time() {
    let t0 = Instant::now();
    let config = RunnerConfig::default();
    // Late: the answer came after its phase had ended (at its deadline and grace), and stays
    // late; the phase timed out, so its participant is not waited for again.
    let mut late = run(t0, 1);
    late.advance(&[Work], &config, t0, wall(0), false);
    assert_eq!(
        late.advance(&[Work], &config, t0 + secs(2), wall(2), true),
        Next::Finish
    );
    late.answer(0, "jobs", Work, Some(DrainReport::done()));
    assert!(!late.drained_in_time(&["jobs"]));
    assert!(late.phases[0].timed_out);
    // Cut: in time, but work was cut that could not be handed back.
    let mut cut = run(t0, 10);
    cut.advance(&[Ingress], &config, t0, wall(0), false);
    let report = DrainReport::done().with_cut_short("2 in-flight requests cut");
    cut.answer(0, "http", Ingress, Some(report));
    assert!(!cut.drained_in_time(&["http"]));
    assert_eq!(cut.notes[0].note, "2 in-flight requests cut");
    // Forced: later phases never start.
    let mut forced = run(t0, 10);
    forced.advance(&[Ingress, Work], &config, t0, wall(0), false);
    forced.force(wall(1));
    assert_eq!(
        forced.advance(&[Ingress, Work], &config, t0, wall(1), false),
        Next::Finish
    );
    assert!(!forced.drained_in_time(&["http", "jobs"]));
}

#[test]
fn an_answer_counts_once_and_a_stale_timer_is_recognised() {
    let t0 = Instant::now();
    let config = RunnerConfig::default();
    let mut r = run(t0, 10);
    let Next::Ask { generation, .. } = r.advance(&[Work, Final], &config, t0, wall(0), false)
    else {
        panic!()
    };
    assert!(r.is_current(generation));
    assert!(r.answer(0, "jobs", Work, Some(DrainReport::unfinished(["a"]))));
    assert!(!r.answer(0, "jobs", Work, Some(DrainReport::unfinished(["a"]))));
    assert_eq!(r.unfinished.len(), 1);
    r.advance(&[Work, Final], &config, t0, wall(0), false);
    assert!(
        !r.is_current(generation),
        "the work phase's timer is stale now"
    );
}

#[test]
fn a_huge_deadline_is_clamped_instead_of_overflowing() {
    let t0 = Instant::now();
    let mut r = run(t0, u64::MAX);
    let Next::Ask { within, .. } = r.advance(&[Work], &RunnerConfig::default(), t0, wall(0), false)
    else {
        panic!()
    };
    assert_eq!(within, LONGEST_DEADLINE);
}

#[test]
fn an_answer_taken_while_its_phase_runs_is_in_time_however_late_the_runner_takes_it() {
    let t0 = Instant::now();
    let mut r = run(t0, 10);
    let Next::Ask { .. } = r.advance(&[Work], &RunnerConfig::default(), t0, wall(0), false) else {
        panic!()
    };
    assert!(r.answer(0, "jobs", Work, Some(DrainReport::done())));
    assert!(r.drained_in_time(&["jobs"]));
}

#[test]
fn the_longest_deadline_is_the_year_the_docs_state() {
    assert_eq!(LONGEST_DEADLINE, Duration::from_secs(365 * 24 * 60 * 60));
    assert_eq!(LONGEST_DEADLINE.as_secs(), 31_536_000);
}

#[test]
fn notes_are_kept_apart_from_the_items_to_resume() {
    let t0 = Instant::now();
    let mut r = run(t0, 10);
    r.advance(&[Work], &RunnerConfig::default(), t0, wall(0), false);
    let report = DrainReport::unfinished(["j-1"]).with_note("flushed 3 of 4 batches");
    assert!(r.answer(0, "jobs", Work, Some(report)));
    assert_eq!(r.unfinished.len(), 1);
    assert_eq!(r.notes.len(), 1);
    assert_eq!(r.notes[0].note, "flushed 3 of 4 batches");
    assert!(r.drained_in_time(&["jobs"]), "a note is not a cut");
}

#[test]
fn a_requested_drain_deadline_only_ever_shortens_the_services_own() {
    assert_eq!(drain_within(secs(20), None), secs(20));
    assert_eq!(drain_within(secs(20), Some(secs(3))), secs(3));
    assert_eq!(drain_within(secs(20), Some(Duration::ZERO)), Duration::ZERO);
    assert_eq!(
        drain_within(secs(3), Some(secs(60))),
        secs(3),
        "never longer"
    );
    assert_eq!(
        drain_within(Duration::MAX, Some(Duration::MAX)),
        LONGEST_DEADLINE,
        "clamped"
    );
}

use super::*;
use chrono::TimeZone;

fn me() -> ProcessIdentity {
    ProcessIdentity {
        pid: 4242,
        start: 777,
        started_at: Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap(),
    }
}

fn secs(s: i64) -> TimeDelta {
    TimeDelta::seconds(s)
}

/// The judgement for `marker` seen at `now`.
fn judgement_of(marker: &Marker, now: DateTime<Utc>) -> Judgement {
    let bytes = marker.to_json().unwrap();
    decide(SlotContent::Bytes(&bytes), &me(), now, &Policy::default()).unwrap()
}

#[test]
fn a_fresh_marker_with_our_pid_and_fingerprint_is_for_self() {
    let written = me().started_at + secs(30);
    let m = Marker::new(4242, Some(777), written);
    assert_eq!(
        judgement_of(&m, written + secs(1)),
        Judgement::ForSelf(m.clone())
    );
    // Still ours at the last second of the TTL.
    assert_eq!(judgement_of(&m, written + secs(60)), Judgement::ForSelf(m));
}

#[test]
fn the_ttl_expires_markers_whoever_they_name() {
    let written = me().started_at + secs(30);
    for pid in [4242, 4243] {
        let m = Marker::new(pid, Some(777), written);
        assert!(
            matches!(
                judgement_of(&m, written + secs(61)),
                Judgement::Stale(Stale::Expired { age_secs: 61, .. })
            ),
            "pid {pid}"
        );
    }
}

#[test]
fn future_markers_are_stale_beyond_the_skew() {
    let now = me().started_at + secs(100);
    let within = Marker::new(4242, Some(777), now + secs(5));
    assert!(matches!(judgement_of(&within, now), Judgement::ForSelf(_)));
    let beyond = Marker::new(4242, Some(777), now + secs(6));
    assert!(matches!(
        judgement_of(&beyond, now),
        Judgement::Stale(Stale::FromTheFuture { ahead_secs: 6, .. })
    ));
    let far = Marker::new(
        4243,
        None,
        Utc.with_ymd_and_hms(9999, 1, 1, 0, 0, 0).unwrap(),
    );
    assert!(matches!(
        judgement_of(&far, now),
        Judgement::Stale(Stale::FromTheFuture { .. })
    ));
}

#[test]
fn another_pid_is_foreign() {
    let now = me().started_at + secs(10);
    let m = Marker::new(4243, Some(777), now);
    assert_eq!(judgement_of(&m, now), Judgement::Foreign(m));
}

#[test]
fn another_fingerprint_is_an_earlier_incarnation() {
    let now = me().started_at + secs(10);
    let m = Marker::new(4242, Some(776), now);
    assert_eq!(
        judgement_of(&m, now),
        Judgement::Stale(Stale::OtherIncarnation {
            pid: 4242,
            theirs: 776,
            ours: 777
        })
    );
}

#[test]
fn without_a_fingerprint_only_markers_written_after_our_start_less_the_slack_fire() {
    let start = me().started_at;
    let after = Marker::new(4242, None, start + secs(1));
    assert!(matches!(
        judgement_of(&after, start + secs(2)),
        Judgement::ForSelf(_)
    ));
    let within_slack = Marker::new(4242, None, start - secs(2));
    assert!(matches!(
        judgement_of(&within_slack, start + secs(2)),
        Judgement::ForSelf(_)
    ));
    let before = Marker::new(4242, None, start - secs(3));
    assert!(matches!(
        judgement_of(&before, start + secs(2)),
        Judgement::Stale(Stale::BeforeOurStart { .. })
    ));
}

#[test]
fn a_matching_fingerprint_written_before_our_start_is_still_stale() {
    let start = me().started_at;
    let m = Marker::new(4242, Some(777), start - secs(10));
    assert!(matches!(
        judgement_of(&m, start + secs(1)),
        Judgement::Stale(Stale::BeforeOurStart { .. })
    ));
}

#[test]
fn read_errors_are_no_decision() {
    let now = me().started_at;
    for kind in [
        std::io::ErrorKind::PermissionDenied,
        std::io::ErrorKind::Other,
    ] {
        assert_eq!(
            decide(
                SlotContent::Unreadable(kind),
                &me(),
                now,
                &Policy::default()
            ),
            Err(Undecided(kind))
        );
    }
}

#[test]
fn non_files_and_bad_bytes_are_malformed_and_absence_is_absent() {
    let now = me().started_at;
    let p = Policy::default();
    assert_eq!(
        decide(SlotContent::Absent, &me(), now, &p),
        Ok(Judgement::Absent)
    );
    assert_eq!(
        decide(SlotContent::NotAFile(FileKind::Symlink), &me(), now, &p),
        Ok(Judgement::Malformed(Malformed::NotAFile(FileKind::Symlink)))
    );
    assert!(matches!(
        decide(SlotContent::Bytes(b"{}"), &me(), now, &p),
        Ok(Judgement::Malformed(_))
    ));
}

#[test]
fn as_owner_judges_with_the_owners_identity_and_a_gone_owner_is_stale() {
    let now = me().started_at + secs(10);
    let p = Policy::default();
    let bytes = Marker::new(4242, Some(777), now).to_json().unwrap();
    let found = SlotContent::Bytes(&bytes);
    // Single-file layout: the owner is the pid the marker names.
    let v = decide_as_owner(found, None, |pid| (pid == 4242).then(me), now, &p).unwrap();
    assert!(matches!(v, Judgement::ForSelf(_)));
    let v = decide_as_owner(found, None, |_| None, now, &p).unwrap();
    assert_eq!(v, Judgement::Stale(Stale::OwnerGone { pid: 4242 }));
    // Slot layout: the slot names its owner; a marker for someone else in it is foreign to it.
    let other = ProcessIdentity { pid: 5, ..me() };
    let v = decide_as_owner(found, Some(5), |_| Some(other), now, &p).unwrap();
    assert!(matches!(v, Judgement::Foreign(_)));
}

#[test]
fn policy_thresholds_are_honoured() {
    // Built through the public setters, so each must set its own threshold.
    let p = Policy::default()
        .with_ttl(Duration::from_secs(5))
        .with_future_skew(Duration::ZERO)
        .with_start_slack(Duration::ZERO);
    let start = me().started_at;
    let bytes = Marker::new(4242, None, start + secs(1)).to_json().unwrap();
    let at = |t| decide(SlotContent::Bytes(&bytes), &me(), t, &p).unwrap();
    assert!(matches!(
        at(start),
        Judgement::Stale(Stale::FromTheFuture { .. })
    ));
    assert!(matches!(at(start + secs(6)), Judgement::ForSelf(_)));
    assert!(matches!(
        at(start + secs(7)),
        Judgement::Stale(Stale::Expired { .. })
    ));
    let early = Marker::new(4242, None, start - TimeDelta::milliseconds(1))
        .to_json()
        .unwrap();
    assert!(matches!(
        decide(SlotContent::Bytes(&early), &me(), start, &p),
        Ok(Judgement::Stale(Stale::BeforeOurStart { .. }))
    ));
}

#[test]
fn a_null_fingerprint_is_ours_from_exactly_the_start_slack_before_our_start() {
    // The boundary docs/protocol.md states: `started_at - start_slack` is ours, one nanosecond
    // earlier is a predecessor's.
    let policy = Policy::default();
    let me = me();
    let boundary = me.started_at - TimeDelta::from_std(policy.start_slack).unwrap();
    let now = me.started_at + secs(1);
    let judge = |at: DateTime<Utc>| {
        let bytes = Marker::new(me.pid, None, at).to_json().unwrap();
        decide(SlotContent::Bytes(&bytes), &me, now, &policy).unwrap()
    };
    assert!(matches!(judge(boundary), Judgement::ForSelf(_)));
    assert!(matches!(
        judge(boundary - TimeDelta::nanoseconds(1)),
        Judgement::Stale(Stale::BeforeOurStart { .. })
    ));
}

#[test]
fn the_centisecond_fingerprint_of_the_earlier_system_is_accepted_where_the_os_rule_allows() {
    // Our start: 2026-11-30T12:00:00.123456Z, i.e. 1_796_040_000_123 ms since the epoch.
    let mut own = me();
    own.started_at = DateTime::from_timestamp(1_796_040_000, 123_456_000).unwrap();
    let centis = 179_604_000_012; // round(1_796_040_000.123456 × 100)
    let exact = CentisecondForm::Within { tolerance: 1 };
    assert!(exact.matches(centis, &own));
    assert!(exact.matches(centis + 1, &own) && exact.matches(centis - 1, &own));
    assert!(
        !exact.matches(centis + 2, &own) && !exact.matches(centis - 2, &own),
        "another process, 20 ms apart either way"
    );
    let second = CentisecondForm::SameSecond;
    assert!(second.matches(179_604_000_000, &own) && second.matches(179_604_000_099, &own));
    assert!(!second.matches(179_604_000_100, &own), "the next second");
    assert!(!CentisecondForm::Refused.matches(centis, &own));
    // Linux refuses it: both sides read /proc ticks there.
    if cfg!(target_os = "linux") {
        assert_eq!(CENTISECOND_FORM, CentisecondForm::Refused);
    }
}

#[test]
fn a_marker_in_the_centisecond_form_is_ours_only_where_the_os_rule_allows() {
    let mut own = me();
    own.started_at = DateTime::from_timestamp(1_796_040_000, 120_000_000).unwrap();
    let now = own.started_at + secs(5);
    let bytes = Marker::new(own.pid, Some(179_604_000_012), now)
        .to_json()
        .unwrap();
    let judgement = decide(SlotContent::Bytes(&bytes), &own, now, &Policy::default()).unwrap();
    match CENTISECOND_FORM {
        CentisecondForm::Refused => assert!(matches!(judgement, Judgement::Stale(_))),
        _ => assert!(matches!(judgement, Judgement::ForSelf(_)), "{judgement:?}"),
    }
}

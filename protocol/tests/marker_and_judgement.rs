//! Property tests of the marker codec: every marker round-trips, no input panics the parser.

use chrono::{DateTime, Utc};
use planned_stop_protocol::ProcessIdentity;
use planned_stop_protocol::judgement::{SlotContent, decide};
use planned_stop_protocol::marker::{MAX_REASON_CHARS, MAX_REQUEST_ID_CHARS, Marker, Policy};
use proptest::prelude::*;

fn any_time() -> impl Strategy<Value = DateTime<Utc>> {
    // Year 1 to 9999: the range RFC 3339 can write.
    (-62_135_596_800i64..253_402_300_799, 0u32..1_000_000_000)
        .prop_map(|(s, ns)| DateTime::from_timestamp(s, ns).unwrap())
}

fn any_marker() -> impl Strategy<Value = Marker> {
    (
        1..=u32::MAX,
        proptest::option::of(any::<u64>()),
        proptest::option::of(1..=u32::MAX),
        any_time(),
        proptest::option::of(
            proptest::string::string_regex(&format!("[ -~]{{0,{MAX_REQUEST_ID_CHARS}}}")).unwrap(),
        ),
        proptest::option::of(
            proptest::string::string_regex(&format!("\\PC{{0,{MAX_REASON_CHARS}}}")).unwrap(),
        ),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(pid, start, stopper, at, id, reason, trigger, restart)| {
            let action = if restart {
                planned_stop_protocol::marker::StopAction::Restart
            } else {
                planned_stop_protocol::marker::StopAction::Stop
            };
            let mut m = Marker::new(pid, start, at)
                .with_trigger_watcher(trigger)
                .with_action(action);
            m.stopper_pid = stopper;
            m.request_id = id;
            m.reason = reason;
            m
        })
}

/// JSON-ish text built from the tokens a marker is made of, to reach deeper than random bytes.
fn jsonish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just(",".to_owned()),
        Just(":".to_owned()),
        Just("\"target_pid\"".to_owned()),
        Just("\"written_at\"".to_owned()),
        Just("\"target_start_time\"".to_owned()),
        Just("\"version\"".to_owned()),
        Just("\"2026-11-30T12:00:00Z\"".to_owned()),
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("1e999".to_owned()),
        Just("-0".to_owned()),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|n| n.to_string()),
        "\\PC{0,8}".prop_map(|s| format!("{s:?}")),
    ];
    proptest::collection::vec(token, 0..40).prop_map(|t| t.concat())
}

proptest! {
    #[test]
    fn any_marker_round_trips_through_its_json(marker in any_marker()) {
        let bytes = marker.to_json().unwrap();
        prop_assert_eq!(Marker::parse(&bytes).unwrap(), marker);
    }

    #[test]
    fn parsing_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let _ = Marker::parse(&bytes);
    }

    #[test]
    fn parsing_jsonish_text_never_panics_and_accepted_markers_round_trip(text in jsonish()) {
        if let Ok(marker) = Marker::parse(text.as_bytes()) {
            prop_assert_eq!(Marker::parse(&marker.to_json().unwrap()).unwrap(), marker);
        }
    }

    #[test]
    fn only_our_pid_and_a_fresh_time_can_be_for_self(
        marker in any_marker(),
        start in any::<u64>(),
        pid in 1..=u32::MAX,
        started in any_time(),
        now in any_time(),
    ) {
        let me = ProcessIdentity::new(pid, start, started);
        let bytes = marker.to_json().unwrap();
        let policy = Policy::default();
        let judgement = decide(SlotContent::Bytes(&bytes), &me, now, &policy).unwrap();
        if let planned_stop_protocol::marker::Judgement::ForSelf(m) = judgement {
            prop_assert_eq!(m.target_pid, pid);
            prop_assert!(m.target_start_time.is_none_or(|s| s == start));
            let age = now.signed_duration_since(m.written_at);
            prop_assert!(age.num_seconds() <= 60 && age.num_seconds() >= -5);
        }
    }
}

use super::*;
use chrono::TimeZone;
use std::time::Duration;

fn at(secs: i64) -> DateTime<Utc> {
    Utc.timestamp_opt(secs, 0).unwrap()
}

fn parse_str(s: &str) -> Result<Marker, MarkerError> {
    Marker::parse(s.as_bytes())
}

#[test]
fn the_seeds_four_field_record_is_a_valid_v1_marker() {
    let m = parse_str(
        r#"{"target_pid": 4242, "target_start_time": 99, "stopper_pid": 7,
            "written_at": "2026-11-30T12:00:00+00:00"}"#,
    )
    .unwrap();
    assert_eq!(m.target_pid, 4242);
    assert_eq!(m.target_start_time, Some(99));
    assert_eq!(m.stopper_pid, Some(7));
    assert_eq!(
        m.written_at,
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
    );
    assert!(m.trigger_watcher, "trigger_watcher defaults to true");
    assert_eq!(m.request_id, None);
}

#[test]
fn offsets_are_normalised_to_utc() {
    let m = parse_str(
        r#"{"target_pid":1,"target_start_time":null,"written_at":"2026-11-30T13:30:00+01:30"}"#,
    )
    .unwrap();
    assert_eq!(
        m.written_at,
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).unwrap()
    );
    assert_eq!(m.target_start_time, None);
}

#[test]
fn serialisation_writes_version_and_round_trips() {
    let m = Marker::new(12, None, at(1_800_000_000))
        .with_stopper_pid(3)
        .with_request_id("req-1")
        .with_reason("deploy")
        .with_trigger_watcher(false);
    let bytes = m.to_json().unwrap();
    let text = std::str::from_utf8(&bytes).unwrap();
    assert!(
        text.starts_with(r#"{"version":1,"target_pid":12,"target_start_time":null"#),
        "{text}"
    );
    assert_eq!(Marker::parse(&bytes).unwrap(), m);
}

#[test]
fn a_byte_order_mark_is_accepted() {
    let bytes = [
        BOM,
        br#"{"target_pid":5,"written_at":"2026-01-01T00:00:00Z"}"#,
    ]
    .concat();
    assert_eq!(Marker::parse(&bytes).unwrap().target_pid, 5);
}

#[test]
fn each_rule_has_its_own_error() {
    let t = r#""written_at":"2026-01-01T00:00:00Z""#;
    let cases: Vec<(String, MarkerError)> = vec![
        (String::new(), MarkerError::Empty),
        ("[1]".into(), MarkerError::NotAnObject),
        ("{".into(), MarkerError::Syntax(String::new())),
        (
            format!(r#"{{"target_pid":1,"target_pid":1,{t}}}"#),
            MarkerError::DuplicateKey("target_pid".into()),
        ),
        (
            format!(r#"{{"x":1,"x":2,"target_pid":1,{t}}}"#),
            MarkerError::DuplicateKey("x".into()),
        ),
        (
            format!(r#"{{"version":2,"target_pid":1,{t}}}"#),
            MarkerError::UnsupportedVersion("2".into()),
        ),
        (
            format!(r#"{{"version":"1","target_pid":1,{t}}}"#),
            MarkerError::UnsupportedVersion("\"1\"".into()),
        ),
        (
            format!(r#"{{{t}}}"#),
            MarkerError::MissingField("target_pid"),
        ),
        (
            r#"{"target_pid":1}"#.into(),
            MarkerError::MissingField("written_at"),
        ),
        ("[[[[[[[[[[]]]]]]]]]]".into(), MarkerError::TooDeep),
    ];
    for (input, expected) in cases {
        let got = parse_str(&input).unwrap_err();
        assert_eq!(
            std::mem::discriminant(&got),
            std::mem::discriminant(&expected),
            "{input:?} gave {got:?}, expected {expected:?}"
        );
        if !matches!(expected, MarkerError::Syntax(_)) {
            assert_eq!(got, expected, "{input:?}");
        }
    }
}

#[test]
fn pids_must_be_json_integers_in_range() {
    for bad in [
        "true",
        "12.0",
        "1e3",
        "-1",
        "0",
        "4294967296",
        "\"12\"",
        "null",
        "[1]",
        "1e999",
    ] {
        let input = format!(r#"{{"target_pid":{bad},"written_at":"2026-01-01T00:00:00Z"}}"#);
        assert!(
            parse_str(&input).is_err(),
            "target_pid {bad} must be refused"
        );
    }
    let max = format!(
        r#"{{"target_pid":{},"written_at":"2026-01-01T00:00:00Z"}}"#,
        u32::MAX
    );
    assert_eq!(parse_str(&max).unwrap().target_pid, u32::MAX);
}

#[test]
fn timestamps_need_an_offset() {
    for bad in [
        "2026-01-01T00:00:00",
        "2026-01-01",
        "yesterday",
        "2026-13-01T00:00:00Z",
        "",
    ] {
        let input = format!(r#"{{"target_pid":1,"written_at":"{bad}"}}"#);
        assert!(
            matches!(
                parse_str(&input),
                Err(MarkerError::InvalidField {
                    field: "written_at",
                    ..
                })
            ),
            "{bad:?} must be refused"
        );
    }
}

#[test]
fn text_fields_are_bounded_and_free_of_control_characters() {
    let long_id = "x".repeat(MAX_REQUEST_ID_CHARS + 1);
    assert!(
        Marker::new(1, None, at(0))
            .with_request_id(long_id)
            .to_json()
            .is_err()
    );
    let ok_reason = "é".repeat(MAX_REASON_CHARS);
    assert!(
        Marker::new(1, None, at(0))
            .with_reason(ok_reason)
            .to_json()
            .is_ok()
    );
    assert!(
        Marker::new(1, None, at(0))
            .with_reason("a\nb")
            .to_json()
            .is_err()
    );
    assert!(
        Marker::new(0, None, at(0)).to_json().is_err(),
        "pid 0 is never written"
    );
}

#[test]
fn unknown_keys_are_ignored_but_still_bounded() {
    let ok = r#"{"target_pid":1,"written_at":"2026-01-01T00:00:00Z","future":{"a":[1,2]}}"#;
    assert_eq!(parse_str(ok).unwrap().target_pid, 1);
    let deep = format!(
        r#"{{"target_pid":1,"written_at":"2026-01-01T00:00:00Z","future":{}{}}}"#,
        "[".repeat(MAX_NESTING),
        "]".repeat(MAX_NESTING)
    );
    assert_eq!(parse_str(&deep), Err(MarkerError::TooDeep));
}

#[test]
fn brackets_inside_strings_do_not_count_as_nesting() {
    let reason = "[[[[[[[[[[{{{{{{{{\\\"";
    let input =
        format!(r#"{{"target_pid":1,"written_at":"2026-01-01T00:00:00Z","reason":"{reason}"}}"#);
    assert!(parse_str(&input).is_ok());
}

#[test]
fn oversize_input_is_refused_before_parsing() {
    let big = vec![b' '; MAX_MARKER_BYTES + 1];
    assert_eq!(
        Marker::parse(&big),
        Err(MarkerError::TooLarge {
            len: MAX_MARKER_BYTES + 1
        })
    );
}

#[test]
fn invalid_utf8_is_refused() {
    assert_eq!(
        Marker::parse(b"{\"target_pid\":1,\xff}"),
        Err(MarkerError::NotUtf8 { offset: 16 })
    );
}

#[test]
fn the_limits_the_public_docs_state_are_the_limits_enforced() {
    // `Marker::with_reason`, `with_request_id` and `MarkerError` name these numbers in words.
    assert_eq!(
        (
            MAX_REQUEST_ID_CHARS,
            MAX_REASON_CHARS,
            MAX_MARKER_BYTES,
            MAX_NESTING
        ),
        (64, 256, 4096, 8)
    );
}

/// A minimal valid marker with `extra` fields appended inside the object.
fn minimal_with(extra: &str) -> String {
    format!(r#"{{"target_pid":1,"written_at":"2026-01-01T00:00:00Z"{extra}}}"#)
}

#[test]
fn exactly_the_size_limit_is_accepted() {
    let mut bytes = minimal_with("").into_bytes();
    bytes.resize(MAX_MARKER_BYTES, b' ');
    assert!(Marker::parse(&bytes).is_ok());
}

#[test]
fn nesting_is_counted_exactly_up_to_the_limit() {
    // The object is level 1, so MAX_NESTING - 1 arrays inside it reach the limit and no further.
    let n = MAX_NESTING - 1;
    let at_limit = minimal_with(&format!(r#","future":{}{}"#, "[".repeat(n), "]".repeat(n)));
    assert!(parse_str(&at_limit).is_ok());
}

#[test]
fn a_closed_bracket_ends_its_level_so_siblings_do_not_add_up() {
    let siblings: String = (0..2 * MAX_NESTING)
        .map(|i| format!(r#","k{i}":[[1]]"#))
        .collect();
    assert!(parse_str(&minimal_with(&siblings)).is_ok());
}

#[test]
fn an_escape_covers_one_character_and_the_string_still_ends() {
    // An escaped quote does not end the string: brackets after it are text.
    let quoted = minimal_with(r#","reason":"\"[[[[[[[[[[""#);
    assert!(parse_str(&quoted).is_ok());
    // After an escape the closing quote still ends the string, so nesting after it counts.
    let n = MAX_NESTING;
    let deep = minimal_with(&format!(
        r#","reason":"a\nb","future":{}{}"#,
        "[".repeat(n),
        "]".repeat(n)
    ));
    assert_eq!(parse_str(&deep), Err(MarkerError::TooDeep));
}

#[test]
fn a_bad_pid_error_says_what_was_wrong() {
    let reason = |pid: &str| {
        let input = format!(r#"{{"target_pid":{pid},"written_at":"2026-01-01T00:00:00Z"}}"#);
        match parse_str(&input) {
            Err(MarkerError::InvalidField {
                field: "target_pid",
                reason,
            }) => reason,
            other => panic!("{pid}: {other:?}"),
        }
    };
    assert_eq!(reason("-1"), "must be in 1..=4294967295, found -1");
    assert_eq!(reason("0"), "must be in 1..=4294967295, found 0");
    assert_eq!(
        reason("4294967296"),
        "must be in 1..=4294967295, found 4294967296"
    );
    assert_eq!(reason("12.0"), "must be an integer, found 12.0");
    assert_eq!(reason("true"), "must be an integer, found true");
    assert_eq!(reason(r#""12""#), "must be an integer, found a string");
    assert_eq!(reason("[12]"), "must be an integer, found an array");
}

#[test]
fn the_action_is_stop_unless_the_marker_asks_for_a_restart() {
    let with = |action: &str| parse_str(&minimal_with(&format!(r#","action":{action}"#)));
    assert_eq!(
        parse_str(&minimal_with("")).unwrap().action,
        StopAction::Stop
    );
    assert_eq!(with("null").unwrap().action, StopAction::Stop);
    assert_eq!(with(r#""stop""#).unwrap().action, StopAction::Stop);
    assert_eq!(with(r#""restart""#).unwrap().action, StopAction::Restart);
    for unknown in [r#""reboot""#, r#""Restart""#, "true", "1"] {
        assert!(
            matches!(
                with(unknown),
                Err(MarkerError::InvalidField {
                    field: "action",
                    ..
                })
            ),
            "{unknown} is malformed"
        );
    }
    // A stop's marker is written exactly as before (no `action` key); a restart's names it.
    let stop = Marker::new(1, None, at(0)).to_json().unwrap();
    assert!(!String::from_utf8(stop).unwrap().contains("action"));
    let restart = Marker::new(1, None, at(0))
        .with_action(StopAction::Restart)
        .to_json()
        .unwrap();
    assert_eq!(Marker::parse(&restart).unwrap().action, StopAction::Restart);
}

#[test]
fn a_drain_deadline_is_asked_for_in_milliseconds_or_not_at_all() {
    let with = |value: &str| parse_str(&minimal_with(&format!(r#","drain_deadline_ms":{value}"#)));
    assert_eq!(parse_str(&minimal_with("")).unwrap().drain_deadline, None);
    assert_eq!(with("null").unwrap().drain_deadline, None);
    assert_eq!(with("0").unwrap().drain_deadline, Some(Duration::ZERO));
    assert_eq!(
        with("1500").unwrap().drain_deadline,
        Some(Duration::from_millis(1500))
    );
    for bad in ["-1", "1.5", r#""1500""#, "true"] {
        assert!(
            matches!(
                with(bad),
                Err(MarkerError::InvalidField {
                    field: "drain_deadline_ms",
                    ..
                })
            ),
            "{bad} is malformed"
        );
    }
    // Written only when asked for: other markers are what earlier writers wrote.
    let plain = Marker::new(1, None, at(0)).to_json().unwrap();
    assert!(!String::from_utf8(plain).unwrap().contains("drain_deadline"));
}

use super::*;
use crate::lifecycle::SignalKind;

fn record() -> StopRecord {
    let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
    StopRecord {
        pid: 42,
        cause: StopCause::Signal(SignalKind::Terminate),
        verdict: StopVerdict::Planned,
        request_id: Some("r1".into()),
        reason: None,
        stopper_pid: Some(7),
        accepted_at: at,
        drain_deadline: at,
        finished_at: at,
        drained_in_time: false,
        forced: false,
        unfinished: vec![Unfinished {
            participant: "jobs".into(),
            item: "job-3".into(),
        }],
        unanswered: vec![],
        notes: vec![],
        phases: vec![],
        action: crate::marker::StopAction::Stop,
        exit_code: 0,
    }
}

#[test]
fn a_record_is_written_read_and_taken_once() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    assert_eq!(StopRecord::read(&state).unwrap(), None);
    assert_eq!(StopRecord::take(&state).unwrap(), None);
    record().write(&state).unwrap();
    assert_eq!(StopRecord::read(&state).unwrap(), Some(record()));
    assert_eq!(StopRecord::take(&state).unwrap(), Some(record()));
    assert_eq!(
        StopRecord::take(&state).unwrap(),
        None,
        "taken exactly once"
    );
    assert_eq!(
        fs::read_dir(&state).unwrap().count(),
        0,
        "nothing left behind"
    );
}

#[test]
fn a_corrupt_record_is_reported_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(StopRecord::path(dir.path()), b"{\"pid\": 4").unwrap();
    let err = StopRecord::take(dir.path()).unwrap_err();
    assert!(matches!(err, RecordError::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("move it aside"));
    assert!(
        StopRecord::path(dir.path()).exists(),
        "resume work is never silently dropped"
    );
}

#[test]
fn the_cause_serialises_readably() {
    let json = serde_json::to_value(record()).unwrap();
    assert_eq!(
        json["cause"],
        serde_json::json!({"kind": "signal", "signal": "terminate"})
    );
    assert_eq!(json["verdict"], "planned");
}

#[test]
fn a_state_directory_that_cannot_be_read_is_an_error_not_an_absent_record() {
    // A regular file where the state directory should be: every access fails with "not a
    // directory", which must never read as "nothing to resume".
    let dir = tempfile::tempdir().unwrap();
    let not_a_dir = dir.path().join("state");
    fs::write(&not_a_dir, b"").unwrap();
    assert!(matches!(
        StopRecord::read(&not_a_dir),
        Err(RecordError::Io { op: "open", .. })
    ));
    assert!(matches!(
        StopRecord::take(&not_a_dir),
        Err(RecordError::Io { op: "take", .. })
    ));
}

#[test]
fn a_record_is_read_up_to_its_size_limit_and_refused_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let limit = usize::try_from(MAX_RECORD_BYTES).unwrap();
    // A valid record padded with white space to exactly the limit is read.
    record().write(dir.path()).unwrap();
    let path = StopRecord::path(dir.path());
    let mut bytes = fs::read(&path).unwrap();
    bytes.resize(limit, b' ');
    fs::write(&path, &bytes).unwrap();
    assert_eq!(StopRecord::read(dir.path()).unwrap(), Some(record()));
    // One byte more is refused as too large (and left in place).
    bytes.push(b' ');
    fs::write(&path, &bytes).unwrap();
    match StopRecord::read(dir.path()) {
        Err(RecordError::Invalid { reason, .. }) => {
            assert_eq!(reason, format!("larger than {MAX_RECORD_BYTES} bytes"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_record_written_before_notes_and_phases_existed_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut json = serde_json::to_value(record()).unwrap();
    let fields = json.as_object_mut().unwrap();
    fields.remove("notes");
    fields.remove("phases");
    fs::write(StopRecord::path(dir.path()), json.to_string()).unwrap();
    assert_eq!(StopRecord::read(dir.path()).unwrap(), Some(record()));
}

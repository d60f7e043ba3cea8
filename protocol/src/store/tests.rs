use super::*;
use crate::schema::MAX_MARKER_BYTES;

#[test]
fn slot_names_round_trip_and_reject_look_alikes() {
    assert_eq!(slot_file_name(42), "planned-stop-42.json");
    assert_eq!(parse_slot_file_name("planned-stop-42.json"), Some(42));
    for name in [
        "planned-stop-.json",
        "planned-stop-0.json",
        "planned-stop--1.json",
        "planned-stop-+1.json",
        "planned-stop-1.json.tmp-3-0",
        "planned-stop-99999999999.json",
        "planned-stop-42.outcome.json",
        ".planned-stop-42.json",
    ] {
        assert_eq!(parse_slot_file_name(name), None, "{name}");
    }
}

#[test]
fn presence_names_round_trip_and_are_neither_slots_nor_outcomes() {
    use super::naming::{parse_outcome_file_name, parse_presence_file_name, presence_file_name};
    assert_eq!(presence_file_name(42), "planned-stop-42.watching.json");
    assert_eq!(
        parse_presence_file_name("planned-stop-42.watching.json"),
        Some(42)
    );
    assert_eq!(parse_slot_file_name("planned-stop-42.watching.json"), None);
    assert_eq!(
        parse_outcome_file_name("planned-stop-42.watching.json"),
        None
    );
    assert_eq!(
        parse_presence_file_name("planned-stop-42.outcome.json"),
        None
    );
    assert_eq!(
        parse_presence_file_name("planned-stop-0.watching.json"),
        None
    );
    // A presence file being written is a leftover the sweep may remove once old.
    let dir = tempfile::tempdir().unwrap();
    let store = MarkerStore::open(Layout::Slots(dir.path().to_path_buf())).unwrap();
    let temp = store.private_name(&store.presence_path(42), TEMP_TAG);
    let name = temp.file_name().unwrap().to_str().unwrap();
    assert!(super::naming::is_leftover_name(name, None), "{name}");
}

#[test]
fn reads_are_bounded_to_one_byte_past_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big");
    fs::write(&path, vec![b'x'; 1 << 20]).unwrap();
    match read_slot(&path) {
        Found::Bytes(b) => assert_eq!(b.len(), MAX_MARKER_BYTES + 1),
        other => panic!("{other:?}"),
    }
}

/// Root reads any file regardless of its mode, so a real read *error* comes from `/proc/self/mem`: a
/// regular file whose offset 0 is unmapped memory (EIO).
#[cfg(target_os = "linux")]
#[test]
fn a_failing_read_is_unreadable_not_absent() {
    match read_slot(Path::new("/proc/self/mem")) {
        Found::Unreadable(_) => {}
        other => panic!("expected Unreadable, got {other:?}"),
    }
}

#[test]
fn private_names_are_hidden_unique_and_recognised_as_leftovers() {
    let dir = tempfile::tempdir().unwrap();
    let store = MarkerStore::open(Layout::Slots(dir.path().to_path_buf())).unwrap();
    let slot = store.slot_path(7);
    let a = store.private_name(&slot, TEMP_TAG);
    let b = store.private_name(&slot, TEMP_TAG);
    let c = store.private_name(&slot, TAKEN_TAG);
    assert_ne!(a, b);
    for p in [&a, &b, &c] {
        fs::write(p, b"x").unwrap();
        assert!(
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(".planned-stop-7.json.")
        );
    }
    fs::write(dir.path().join(".unrelated.tmp-1-1"), b"x").unwrap();
    let mut found = store.leftover_files().unwrap();
    found.sort();
    let mut expected = vec![a, b, c];
    expected.sort();
    assert_eq!(found, expected);
    assert!(store.slot_files().unwrap().is_empty());
}

/// On Windows a file held open without `FILE_SHARE_DELETE` cannot be renamed or deleted. A claim
/// must ride out a short hold, and report an error (never "no marker") for a long one.
#[cfg(windows)]
#[test]
fn a_claim_through_a_sharing_violation_is_retried_and_never_taken_as_absent() {
    use std::os::windows::fs::OpenOptionsExt;
    const FILE_SHARE_READ: u32 = 1;
    let dir = tempfile::tempdir().unwrap();
    let store = MarkerStore::open(Layout::Slots(dir.path().to_path_buf())).unwrap();
    let me = ProcessIdentity::current().unwrap();
    let now = Utc::now();
    let hold = |ms: u64| {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .share_mode(FILE_SHARE_READ)
            .open(store.slot_path(me.pid))
            .unwrap();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            drop(file);
        })
    };

    // Held far longer than the retries: an error, and the marker is still there afterwards.
    store
        .write(&Marker::new(me.pid, Some(me.start), now))
        .unwrap();
    let holder = hold(2_000);
    let claimed = store.claim(&me, now);
    assert!(matches!(claimed, Err(StoreError::Io { .. })), "{claimed:?}");
    holder.join().unwrap();
    assert!(matches!(store.claim(&me, now), Ok(Some(_))), "not lost");

    // Held briefly: the retries ride it out.
    store
        .write(&Marker::new(me.pid, Some(me.start), now))
        .unwrap();
    let holder = hold(30);
    let claimed = store.claim(&me, now);
    holder.join().unwrap();
    assert!(matches!(claimed, Ok(Some(_))), "{claimed:?}");
}

/// Records whether each write was synced and whether a directory was.
#[derive(Default)]
struct Syncs(std::sync::Mutex<Vec<(bool, bool)>>);

impl files::Observer for Syncs {
    fn took(&self, step: files::Step<'_>) {
        let mut seen = self.0.lock().unwrap();
        match step {
            files::Step::Write { synced, .. } => seen.push((synced, false)),
            files::Step::SyncDir { .. } => {
                if let Some(last) = seen.last_mut() {
                    last.1 = true;
                }
            }
            _ => {}
        }
    }
}

/// A restart in place took up to 1.2 s instead of 95 ms when the marker directory sat on a busy
/// disk: the stopper wrote its marker with two fsyncs, and the runner its `draining` outcome with
/// two more on the thread that runs the drain. A marker and an outcome that says how far a stop
/// has got are written atomically and not synced; the final outcome, which outlives the process,
/// is synced with its directory.
#[test]
fn only_a_final_outcome_is_synced_and_no_marker_is() {
    let dir = tempfile::tempdir().unwrap();
    let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    let own = ProcessIdentity::current().unwrap();
    let now = Utc::now();
    let draining = crate::outcome::Outcome::accepted(
        &own,
        crate::StopCause::Marker,
        crate::StopVerdict::Planned,
        now,
        now,
    );
    let stopped = draining
        .clone()
        .concluded(crate::ProcessState::Stopped, now, 0);
    for (outcome, synced) in [(draining, false), (stopped, true)] {
        let syncs = Syncs::default();
        store.write_outcome_observed(&outcome, &syncs).unwrap();
        assert_eq!(
            *syncs.0.lock().unwrap(),
            [(synced, synced)],
            "{:?}",
            outcome.state
        );
        assert_eq!(
            store.read_outcome(own.pid),
            Some(outcome),
            "written either way"
        );
    }
    // The stopper's side alike: the marker is for a running process only.
    let syncs = Syncs::default();
    let marker = Marker::new(own.pid, Some(own.start), now);
    store.write_observed(&marker, &syncs).unwrap();
    assert_eq!(*syncs.0.lock().unwrap(), [(false, false)]);
    assert!(matches!(store.probe(&own, now), Ok(Judgement::ForSelf(_))));
}

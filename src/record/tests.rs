use super::host::{HOST_ENV, liveness_here, local_host};
use super::lease::Liveness;
use super::*;
use crate::lifecycle::SignalKind;
use std::fs;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
            id: Some("item-1".into()),
            participant: "jobs".into(),
            item: "job-3".into(),
            resumed: false,
            failure: None,
        }],
        unfinished_omitted: 0,
        unanswered: vec![],
        notes: vec![],
        phases: vec![],
        action: crate::schema::StopAction::Stop,
        exit_code: 0,
    }
}

/// `record` with every item handed back by its holder rather than new.
fn handed_back(mut record: StopRecord) -> StopRecord {
    for item in &mut record.unfinished {
        item.resumed = true;
    }
    record
}

fn block_on<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

/// A store whose owners' liveness the test sets: every owner alive unless marked dead.
fn store(dir: &std::path::Path) -> (FileRecordStore, Arc<Mutex<Vec<u32>>>) {
    let dead = Arc::new(Mutex::new(Vec::new()));
    let probe = dead.clone();
    let store = FileRecordStore::open(dir.join("state"), crate::record::Sharing::Refused)
        .unwrap()
        .liveness(move |o: &Owner| {
            if probe.lock().unwrap().contains(&o.pid) {
                Liveness::Dead
            } else {
                Liveness::Alive
            }
        });
    (store, dead)
}

/// The one batch file of `store` (the one stop it recorded).
fn the_batch(store: &FileRecordStore) -> std::path::PathBuf {
    let dir = store.dir().join(file::BATCHES_DIR_NAME);
    let mut batches: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".batch.json"))
        .collect();
    assert_eq!(batches.len(), 1, "{batches:?}");
    batches.remove(0)
}

fn owner(pid: u32) -> Owner {
    Owner::new("here", pid, 1)
}

#[test]
fn persisted_items_are_leased_once_and_gone_once_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let (store, dead) = store(dir.path());
    block_on(store.persist(&owner(42), record().into())).unwrap();
    assert_eq!(
        FileRecordStore::read_last_stop(store.dir()).unwrap(),
        Some(record())
    );
    let leased = block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].item.id, "item-1");
    assert_eq!(leased[0].item.item_as::<String>().unwrap(), "job-3");
    assert!(
        block_on(store.lease(&owner(2), 10, Duration::from_secs(60)))
            .unwrap()
            .is_empty(),
        "held by a live owner"
    );
    let err = block_on(store.acknowledge(&owner(2), "item-1")).unwrap_err();
    assert!(matches!(err, RecordError::NotHolder { .. }), "{err}");
    // The holder dies before acknowledging: the item is offered again.
    dead.lock().unwrap().push(1);
    let again = block_on(store.lease(&owner(2), 10, Duration::from_secs(60))).unwrap();
    assert_eq!(again.len(), 1);
    block_on(store.acknowledge(&owner(2), "item-1")).unwrap();
    assert!(block_on(store.list()).unwrap().is_empty());
    let err = block_on(store.acknowledge(&owner(2), "item-1")).unwrap_err();
    assert!(
        matches!(err, RecordError::UnknownItem { .. }),
        "acknowledged once: {err}"
    );
}

/// A stop of many items keeps a summary of a few: the first `SUMMARY_ITEMS` named, the rest
/// counted, and every item in the store.
#[test]
fn the_summary_of_a_stop_of_many_items_names_a_few_and_counts_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _dead) = store(dir.path());
    let n = SUMMARY_ITEMS + 50;
    let mut many = record();
    let one = many.unfinished.pop().unwrap();
    many.unfinished = (0..n)
        .map(|i| Unfinished {
            id: Some(format!("item-{i:04}")),
            ..one.clone()
        })
        .collect();
    block_on(store.persist(&owner(42), many.clone().into())).unwrap();
    let summary = FileRecordStore::read_last_stop(store.dir())
        .unwrap()
        .unwrap();
    assert_eq!(
        (summary.unfinished.len(), summary.unfinished_omitted),
        (SUMMARY_ITEMS, 50)
    );
    assert_eq!(summary.unfinished_count(), n);
    assert_eq!(summary.unfinished[..], many.unfinished[..SUMMARY_ITEMS]);
    let leased = block_on(store.lease(&owner(1), usize::MAX, Duration::from_secs(60))).unwrap();
    assert_eq!(leased.len(), n, "every item is in the store");
}

#[test]
fn an_item_handed_back_by_its_holder_is_pending_again_with_its_attempts_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    block_on(store.persist(&owner(42), record().into())).unwrap();
    block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    // Someone else handing it back changes nothing: it is not theirs.
    block_on(store.persist(&owner(9), handed_back(record()).into())).unwrap();
    let listed = block_on(store.list()).unwrap();
    assert_eq!(listed[0].lease.as_ref().unwrap().owner, owner(1));
    assert_eq!(listed[0].item.attempts, 1);
    block_on(store.persist(&owner(1), handed_back(record()).into())).unwrap();
    let listed = block_on(store.list()).unwrap();
    assert_eq!(listed[0].lease, None);
    assert_eq!(listed[0].item.attempts, 2);
    assert_eq!(listed[0].item.stopped_by, owner(1));
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
    assert!(FileRecordStore::read_last_stop(&not_a_dir).is_err());
    assert!(FileRecordStore::open(&not_a_dir, crate::record::Sharing::Refused).is_err());
}

#[test]
fn a_record_is_read_up_to_its_size_limit_and_refused_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let limit = usize::try_from(MAX_RECORD_BYTES).unwrap();
    // A valid record padded with white space to exactly the limit is read.
    let path = file::record_path(dir.path());
    let mut bytes = serde_json::to_vec(&record()).unwrap();
    bytes.resize(limit, b' ');
    fs::write(&path, &bytes).unwrap();
    assert_eq!(
        FileRecordStore::read_last_stop(dir.path()).unwrap(),
        Some(record())
    );
    // One byte more is refused as too large (and left in place).
    bytes.push(b' ');
    fs::write(&path, &bytes).unwrap();
    match FileRecordStore::read_last_stop(dir.path()) {
        Err(RecordError::Invalid { reason, .. }) => {
            assert_eq!(reason, format!("larger than {MAX_RECORD_BYTES} bytes"))
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_record_written_by_an_earlier_version_still_reads_and_its_items_are_imported() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    let mut json = serde_json::to_value(record()).unwrap();
    let fields = json.as_object_mut().unwrap();
    fields.remove("notes");
    fields.remove("phases");
    fields["unfinished"][0]
        .as_object_mut()
        .unwrap()
        .remove("id");
    fs::write(file::record_path(store.dir()), json.to_string()).unwrap();
    let read = FileRecordStore::read_last_stop(store.dir())
        .unwrap()
        .unwrap();
    assert_eq!(read.unfinished[0].id, None);
    let leased = block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    assert_eq!(leased.len(), 1, "the earlier version's item is resumed");
    assert_eq!(leased[0].item.item, "job-3");
    // Imported once: the summary now names the item by its id.
    let read = FileRecordStore::read_last_stop(store.dir())
        .unwrap()
        .unwrap();
    assert_eq!(
        read.unfinished[0].id.as_deref(),
        Some(leased[0].item.id.as_str())
    );
    assert!(
        block_on(store.lease(&owner(2), 10, Duration::from_secs(60)))
            .unwrap()
            .is_empty()
    );
}

#[cfg(unix)]
#[test]
fn a_fifo_at_the_record_or_an_item_path_never_blocks_and_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    let mut two = record();
    two.unfinished.push(Unfinished {
        id: Some("item-2".into()),
        participant: "jobs".into(),
        item: "job-4".into(),
        resumed: false,
        failure: None,
    });
    block_on(store.persist(&owner(42), two.clone().into())).unwrap();
    let fifo = |path: &std::path::Path| {
        fs::remove_file(path).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
    };
    // Items 1 and 2 in a batch of their own, which is then a FIFO.
    let batch = the_batch(&store);
    let mut one = record();
    one.unfinished[0].id = Some("item-3".into());
    block_on(store.persist(&owner(42), one.clone().into())).unwrap();
    fifo(&file::record_path(store.dir()));
    fifo(&batch);
    assert!(matches!(
        FileRecordStore::read_last_stop(store.dir()),
        Err(RecordError::Invalid { .. })
    ));
    let leased = block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    let ids: Vec<_> = leased.iter().map(|l| l.item.id.as_str()).collect();
    assert_eq!(ids, ["item-3"], "the FIFO is skipped, the rest resumed");
}

#[test]
fn a_leftover_temporary_file_never_stops_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    // What an earlier process with this pid left behind, under every name this one might pick
    // first (the older naming, and the new one's prefix).
    let items = store.dir().join("planned-stop-items");
    let pid = std::process::id();
    fs::write(items.join(format!(".item-1.item.json.tmp-{pid}")), b"x").unwrap();
    fs::write(
        store
            .dir()
            .join(format!(".planned-stop-record.json.tmp-{pid}")),
        b"x",
    )
    .unwrap();
    block_on(store.persist(&owner(42), record().into())).unwrap();
    assert_eq!(block_on(store.list()).unwrap().len(), 1);
}

#[cfg(unix)]
#[test]
fn the_state_directory_is_created_private_and_a_shared_one_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    for path in [
        store.dir().to_path_buf(),
        store.dir().join("planned-stop-items"),
    ] {
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", path.display());
    }
    let shared = dir.path().join("shared");
    fs::create_dir(&shared).unwrap();
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o1777)).unwrap();
    let err = FileRecordStore::open(&shared, crate::record::Sharing::Refused).unwrap_err();
    assert!(err.to_string().contains("writable"), "{err}");
    FileRecordStore::open(&shared, crate::record::Sharing::Allowed).unwrap();
}

#[test]
fn operators_release_and_drop_items() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    block_on(store.persist(&owner(42), record().into())).unwrap();
    block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    assert!(block_on(store.release(None, "item-1")).unwrap());
    assert!(
        !block_on(store.release(None, "item-1")).unwrap(),
        "pending now"
    );
    let leased = block_on(store.lease(&owner(2), 10, Duration::from_secs(60))).unwrap();
    assert_eq!(leased.len(), 1, "offered again after the release");
    assert!(block_on(store.remove("item-1")).unwrap());
    assert!(!block_on(store.remove("item-1")).unwrap());
    assert!(
        !block_on(store.remove("../../etc/passwd")).unwrap(),
        "not an id"
    );
    assert!(block_on(store.list()).unwrap().is_empty());
}

#[cfg(unix)]
#[test]
fn a_lock_held_too_long_is_an_error_never_a_wedge() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    // Another open file description holding the lock, as another process would.
    block_on(store.list()).unwrap(); // creates the lock file
    let other = fs::File::open(store.dir().join(file::LOCK_FILE_NAME)).unwrap();
    other.lock().unwrap();
    let started = std::time::Instant::now();
    let err = block_on(store.list()).unwrap_err();
    assert!(matches!(err, RecordError::Locked { .. }), "{err}");
    assert!(started.elapsed() >= file::LOCK_WAIT);
    other.unlock().unwrap();
    assert!(block_on(store.list()).unwrap().is_empty());
}

#[test]
fn a_refusal_names_the_holder() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    block_on(store.persist(&owner(42), record().into())).unwrap();
    block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    let err = block_on(store.acknowledge(&owner(2), "item-1")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "resume item item-1 is not leased by this process (holder: pid 1 (start 1) on here)"
    );
}

/// An operator's drop or release wins over the holder's later hand-back.
#[test]
fn a_hand_back_never_undoes_an_acknowledgement_or_an_operators_drop_or_release() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    let mut three = record();
    for n in 2..=3 {
        three.unfinished.push(Unfinished {
            id: Some(format!("item-{n}")),
            participant: "jobs".into(),
            item: format!("job-{n}").into(),
            resumed: false,
            failure: None,
        });
    }
    block_on(store.persist(&owner(42), three.clone().into())).unwrap();
    let holder = owner(1);
    assert_eq!(
        block_on(store.lease(&holder, 10, Duration::from_secs(60)))
            .unwrap()
            .len(),
        3
    );
    block_on(store.acknowledge(&holder, "item-1")).unwrap();
    assert!(block_on(store.remove("item-2")).unwrap(), "dropped");
    assert!(block_on(store.release(None, "item-3")).unwrap(), "released");
    let other = owner(2);
    let taken = block_on(store.lease(&other, 10, Duration::from_secs(60))).unwrap();
    assert_eq!(taken.len(), 1, "item-3 is someone else's now");
    // The holder's planned stop hands back all three.
    block_on(store.persist(&holder, handed_back(three).into())).unwrap();
    let listed = block_on(store.list()).unwrap();
    let ids: Vec<&str> = listed.iter().map(|s| s.item.id.as_str()).collect();
    assert_eq!(
        ids,
        ["item-3"],
        "neither the acknowledged nor the dropped item comes back"
    );
    assert_eq!(listed[0].lease.as_ref().unwrap().owner, other);
    assert_eq!(listed[0].item.attempts, 1);
}

/// The summary is for people; the items are durable without it.
#[test]
fn a_summary_that_cannot_be_written_does_not_fail_the_persist() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    fs::create_dir(store.dir().join(RECORD_FILE_NAME)).unwrap();
    assert_eq!(
        block_on(store.persist(&owner(42), record().into())).unwrap(),
        Persisted::Durable
    );
    let listed = block_on(store.list()).unwrap();
    assert_eq!(listed.len(), 1, "the item is durable");
}

/// The state directory is crash-consistent. The store's file-system steps are
/// told to an observer the test hands the store (`FileRecordStore::observed`); for every prefix of an operation the test builds the tree
/// a power loss at that point would leave — only what a directory sync made durable, and a file
/// written without a sync as empty — and opens a store on it.
mod crash;

mod acknowledge;
mod lease;
mod limits;
mod look;

/// What a process that died while writing left (a temporary file) and acknowledgements are kept
/// for a day, then removed: the listing sweeps the one, a persist the other; younger ones stay.
#[test]
fn leftovers_and_acknowledgements_older_than_a_day_are_swept_and_younger_ones_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    let aged = |path: std::path::PathBuf, age: Duration| {
        fs::File::create(&path)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - age)
            .unwrap();
        path
    };
    let (day, hour) = (Duration::from_secs(24 * 3600), Duration::from_secs(3600));
    let items = store.dir().join(file::ITEMS_DIR_NAME);
    let acked = store.dir().join(file::ACKED_DIR_NAME);
    let old_temp = aged(items.join(".item-1.item.json.tmp-7-1-0"), 2 * day);
    let young_temp = aged(items.join(".item-2.item.json.tmp-7-1-0"), 2 * hour);
    let old_ack = aged(acked.join("item-3.item.json"), 2 * day);
    let young_ack = aged(acked.join("item-4.item.json"), 2 * hour);

    block_on(store.list()).unwrap();
    assert!(!old_temp.exists(), "a leftover older than a day is removed");
    assert!(young_temp.exists(), "two hours is younger than a day");
    block_on(store.persist(&owner(42), record().into())).unwrap();
    assert!(
        !old_ack.exists(),
        "an acknowledgement older than a day is removed"
    );
    assert!(
        young_ack.exists(),
        "a younger one is kept (records list shows it)"
    );
}

/// What a file that does not parse is reported as: the kind of error and where, never a word of
/// the file (serde_json's own message quotes the input).
#[test]
fn a_json_problem_says_where_and_not_what() {
    let e = serde_json::from_str::<StopRecord>("{\n  \"pid\": \"secret-token\"\n}").unwrap_err();
    let problem = json_problem(&e);
    assert!(
        problem.starts_with("not valid JSON of this kind (Data error at line 2, column"),
        "{problem}"
    );
    assert!(!problem.contains("secret"), "{problem}");
    assert!(
        e.to_string().contains("secret"),
        "serde_json's own message would have said it"
    );
}

//! An acknowledgement that cannot be carried out says why: "unknown item" only when the item is
//! really gone, never when the store's own directory is in the way (its holder would take the
//! item for done elsewhere, and it would be offered again once the lease ran out).

use super::*;

/// Leases the one item of `record()` to owner 1; returns the batch that holds it and the
/// acknowledged items' directory.
fn leased(store: &FileRecordStore) -> (std::path::PathBuf, std::path::PathBuf) {
    block_on(store.persist(&owner(42), record().into())).unwrap();
    let leased = block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    assert_eq!(leased.len(), 1);
    (the_batch(store), store.dir().join(file::ACKED_DIR_NAME))
}

#[test]
fn an_item_removed_by_hand_under_its_lease_is_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    let (item, _) = leased(&store);
    fs::remove_file(&item).unwrap();
    let err = block_on(store.acknowledge(&owner(1), "item-1")).unwrap_err();
    assert!(matches!(err, RecordError::UnknownItem { .. }), "{err}");
}

#[test]
fn a_missing_or_blocked_acknowledged_directory_is_an_error_and_the_item_stays() {
    for blocked in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = store(dir.path());
        let (item, acked) = leased(&store);
        fs::remove_dir_all(&acked).unwrap();
        if blocked {
            fs::write(&acked, b"").unwrap();
        }
        let err = block_on(store.acknowledge(&owner(1), "item-1")).unwrap_err();
        assert!(
            !matches!(
                err,
                RecordError::UnknownItem { .. } | RecordError::NotHolder { .. }
            ) && err.to_string().contains(file::ACKED_DIR_NAME),
            "blocked {blocked}: an error of the acknowledged directory, not an unknown item: {err}"
        );
        assert!(item.exists(), "blocked {blocked}: the item is still there");
        let listed = block_on(store.list()).unwrap();
        assert_eq!(listed.len(), 1, "blocked {blocked}");
        assert!(
            listed[0].lease.is_some(),
            "blocked {blocked}: and still held"
        );
    }
}

/// Many acknowledgements in one call: each answered as alone (done, not the holder's, unknown),
/// and only those done are gone.
#[test]
fn many_acknowledgements_are_each_answered_and_only_the_holders_are_made() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    let mut two = record();
    two.unfinished.push(Unfinished::new("jobs", "job-2".into()));
    two.unfinished.last_mut().unwrap().id = Some("item-2".into());
    block_on(store.persist(&owner(42), two.clone().into())).unwrap();
    block_on(store.lease(&owner(1), 1, Duration::from_secs(60))).unwrap();
    block_on(store.lease(&owner(2), 1, Duration::from_secs(60))).unwrap();
    let ids = ["item-1", "item-2", "item-9", "../x"].map(String::from);
    let answers = block_on(store.acknowledge_many(&owner(1), &ids)).unwrap();
    let kinds: Vec<&str> = answers
        .iter()
        .map(|a| match a {
            Ok(()) => "done",
            Err(RecordError::NotHolder { .. }) => "not holder",
            Err(RecordError::UnknownItem { .. }) => "unknown",
            Err(_) => "other",
        })
        .collect();
    assert_eq!(kinds, ["done", "not holder", "unknown", "unknown"]);
    let left: Vec<String> = block_on(store.list())
        .unwrap()
        .into_iter()
        .map(|s| s.item.id)
        .collect();
    assert_eq!(left, ["item-2"]);
}

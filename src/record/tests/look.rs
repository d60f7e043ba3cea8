//! A store opened to look (`FileRecordStore::open_existing`, what `records list` and `status`
//! use): it creates, removes and changes nothing, and says so when asked to.

use super::*;

/// A store opened to look creates nothing and removes nothing.
#[test]
fn a_store_opened_to_look_creates_and_removes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    assert!(
        FileRecordStore::open_existing(&state, crate::record::Sharing::Refused).is_err(),
        "no directory, no store"
    );
    fs::create_dir(&state).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).unwrap();
    }
    let look = FileRecordStore::open_existing(&state, crate::record::Sharing::Refused).unwrap();
    assert!(block_on(look.list()).unwrap().is_empty());
    assert_eq!(block_on(look.last_stop()).unwrap(), None);
    assert_eq!(
        fs::read_dir(&state).unwrap().count(),
        0,
        "no lock file, no item directories"
    );
    assert!(
        block_on(look.remove("item-1")).is_err(),
        "it does not write"
    );
    // With a service's items there: listed, and an orphaned lease left where it is.
    let (store, _) = self::store(dir.path());
    block_on(store.persist(&owner(42), record().into())).unwrap();
    let orphan = state.join("planned-stop-items/gone.lease.json");
    fs::write(&orphan, b"{}").unwrap();
    assert_eq!(block_on(look.list()).unwrap().len(), 1);
    assert!(orphan.exists());
    // Its writing operations are refused as such, and change nothing.
    let id = block_on(look.list()).unwrap()[0].item.id.clone();
    for refused in [
        block_on(look.remove(&id)).map(drop),
        block_on(look.release(None, &id)).map(drop),
        block_on(look.lease(&owner(43), 10, Duration::from_secs(60))).map(drop),
        block_on(look.renew(
            &owner(43),
            std::slice::from_ref(&id),
            Duration::from_secs(60),
        ))
        .map(drop),
        block_on(look.acknowledge(&owner(43), &id)).map(drop),
        block_on(look.persist(&owner(43), record().into())).map(drop),
    ] {
        let e = refused.expect_err("a store opened to look does not write");
        assert!(e.to_string().contains("opened to look only"), "{e}");
    }
    let items = block_on(look.list()).unwrap();
    assert_eq!(items.len(), 1, "still there");
    assert!(items[0].lease.is_none(), "and not leased");
    // A lock file it cannot take (a directory in its way) is an error: no look without the lock.
    let lock = state.join(file::LOCK_FILE_NAME);
    fs::remove_file(&lock).unwrap();
    fs::create_dir(&lock).unwrap();
    let e = block_on(look.list()).expect_err("not listed unlocked");
    assert!(e.to_string().contains("lock file"), "{e}");
    fs::remove_dir(&lock).unwrap();
    // A look at a store whose item directory is not a directory is an error, not an empty list.
    fs::remove_dir_all(state.join("planned-stop-items")).unwrap();
    fs::write(state.join("planned-stop-items"), b"").unwrap();
    assert!(block_on(look.list()).is_err(), "not an empty list");
}

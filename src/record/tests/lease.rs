//! The lease rules and this host's part in them: ids, durations, liveness, the host name.

use super::*;

#[test]
fn any_lease_duration_saturates_instead_of_overflowing() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    block_on(store.persist(&owner(42), record().into())).unwrap();
    let leased = block_on(store.lease(&owner(1), 1, Duration::MAX)).unwrap();
    assert_eq!(leased[0].lease.expires_at, DateTime::<Utc>::MAX_UTC);
    assert!(
        block_on(store.lease(&owner(2), 1, Duration::ZERO))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_lease_holder_is_alive_only_as_the_same_process_life_on_this_host() {
    let me = crate::identity::ProcessIdentity::current().unwrap();
    let here = local_host();
    assert_eq!(
        liveness_here(&Owner::new(here.clone(), me.pid, me.start)),
        Liveness::Alive
    );
    assert_eq!(
        liveness_here(&Owner::new(here, me.pid, me.start.wrapping_add(1))),
        Liveness::Dead,
        "an earlier life of this pid"
    );
    assert_eq!(
        liveness_here(&Owner::new("another-host", me.pid, me.start)),
        Liveness::Unknown
    );
}

#[test]
fn item_ids_are_short_safe_names() {
    assert!(is_valid_item_id("a"));
    assert!(is_valid_item_id("A-z_0-9"));
    assert!(is_valid_item_id(&"x".repeat(128)));
    for bad in ["", "a.b", "a/b", "..", "a b", "é", "a\0b"] {
        assert!(!is_valid_item_id(bad), "{bad:?}");
    }
    assert!(!is_valid_item_id(&"x".repeat(129)));
    // What the runner generates is valid, and differs per index and per host.
    let at = DateTime::from_timestamp(1_800_000_000, 5).unwrap();
    let a = item_id(&Owner::new("h1", 7, 9), at, 0);
    assert!(is_valid_item_id(&a), "{a}");
    assert_ne!(a, item_id(&Owner::new("h1", 7, 9), at, 1));
    assert_ne!(a, item_id(&Owner::new("h2", 7, 9), at, 0));
    assert!(
        a < item_id(&Owner::new("h1", 7, 9), at, 1),
        "in order within a stop"
    );
}

#[test]
fn this_hosts_name_is_the_systems_unless_overridden() {
    let host = local_host();
    assert!(!host.is_empty());
    match std::env::var(HOST_ENV) {
        Ok(name) if !name.is_empty() => assert_eq!(host, name),
        _ => assert_eq!(
            host,
            sysinfo::System::host_name().unwrap_or_else(|_| "localhost".into())
        ),
    }
}

#[test]
fn an_id_that_is_not_an_item_id_never_reaches_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    // A file an escaping id would name.
    let planted = store.dir().join("planted.item.json");
    fs::write(&planted, b"{}").unwrap();
    assert!(!block_on(store.remove("../planted")).unwrap());
    assert!(matches!(
        block_on(store.release(None, "../planted")),
        Err(RecordError::UnknownItem { .. })
    ));
    assert!(matches!(
        block_on(store.acknowledge(&owner(1), "../planted")),
        Err(RecordError::UnknownItem { .. })
    ));
    assert!(planted.exists(), "untouched");
}

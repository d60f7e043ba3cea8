//! The size limits of an item: what the store writes it reads back, and nothing larger.

use super::*;

#[test]
fn an_item_file_past_the_size_limit_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    block_on(store.persist(&owner(42), record().into())).unwrap();
    // Item 1's own file (held aside), then grown past the limit by hand.
    block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    block_on(store.hold_aside(&owner(1), "item-1", "too many failures")).unwrap();
    let mut two = record();
    two.unfinished[0].id = Some("item-2".into());
    block_on(store.persist(&owner(42), two.clone().into())).unwrap();
    let path = store.dir().join("planned-stop-items/item-1.item.json");
    let mut bytes = fs::read(&path).unwrap();
    bytes.resize(file::MAX_FILE_BYTES + 1, b' ');
    fs::write(&path, &bytes).unwrap();
    let ids: Vec<_> = block_on(store.list())
        .unwrap()
        .into_iter()
        .map(|s| s.item.id)
        .collect();
    assert_eq!(ids, ["item-2"], "skipped with a warning, never read");
}

/// One limit, the same where items are accepted and where they are read back.
#[test]
fn an_item_at_the_size_limit_is_read_back_and_one_over_it_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    let mut at_limit = record();
    // A JSON string of exactly MAX_ITEM_BYTES: the quotes and the text.
    at_limit.unfinished[0].item = serde_json::Value::String("x".repeat(MAX_ITEM_BYTES - 2));
    // A long participant name too: the envelope has room for it (64 KiB past the item).
    at_limit.unfinished[0].participant = "p".repeat(10_000);
    assert_eq!(oversized(&at_limit.unfinished[0].item), None);
    block_on(store.persist(&owner(42), at_limit.clone().into())).unwrap();
    let leased = block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    assert_eq!(leased.len(), 1, "written, so read back");
    assert_eq!(leased[0].item.item, at_limit.unfinished[0].item);

    let mut over = record();
    over.unfinished[0].id = Some("item-big".into());
    over.unfinished[0].item = serde_json::Value::String("x".repeat(MAX_ITEM_BYTES - 1));
    assert_eq!(
        oversized(&over.unfinished[0].item),
        Some(MAX_ITEM_BYTES + 1)
    );
    let err = block_on(store.persist(&owner(42), over.clone().into())).unwrap_err();
    assert!(
        matches!(&err, RecordError::Invalid { reason, .. } if reason.contains("over the limit")),
        "{err}"
    );
    assert!(
        !store
            .dir()
            .join("planned-stop-items/item-big.item.json")
            .exists()
    );
}

/// The item file's own limit agrees with the reader's: a file of exactly `MAX_FILE_BYTES` is
/// written and read back, and one byte more is refused before anything is written (a writer that
/// allowed more would leave an item no start can read back; one that allowed less, a refusal of an
/// item the reader takes).
#[test]
fn an_item_file_of_exactly_the_file_limit_is_written_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store(dir.path());
    let with_name = |id: &str, len: usize| {
        let mut r = record();
        r.unfinished[0].id = Some(id.into());
        r.unfinished[0].item = serde_json::Value::String("x".repeat(MAX_ITEM_BYTES - 2));
        r.unfinished[0].participant = "p".repeat(len);
        r
    };
    // The size of the item as a file: its stop's batch, less the batch's own 12 bytes
    // (`{"items":[` and `]}`); the item's own file, when one is written, holds the same bytes.
    let batches = store.dir().join(file::BATCHES_DIR_NAME);
    let seen = std::cell::RefCell::new(std::collections::HashSet::new());
    let size = |_: &str| {
        let newest = fs::read_dir(&batches)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| seen.borrow_mut().insert(p.clone()))
            .unwrap();
        fs::metadata(newest).unwrap().len() - 12
    };
    // Measure the envelope with a one-character name, then size the name to fill the file.
    block_on(store.persist(&owner(42), with_name("item-a", 1).into())).unwrap();
    let len = 1 + file::MAX_FILE_BYTES - size("item-a") as usize;
    block_on(store.persist(&owner(42), with_name("item-b", len).into())).unwrap();
    assert_eq!(size("item-b") as usize, file::MAX_FILE_BYTES);
    let err = block_on(store.persist(&owner(42), with_name("item-c", len + 1).into())).unwrap_err();
    assert!(
        matches!(&err, RecordError::Invalid { reason, .. } if reason.contains("reads back")),
        "{err}"
    );
    assert_eq!(
        fs::read_dir(&batches).unwrap().count(),
        2,
        "nothing written"
    );
    let leased = block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
    let ids: Vec<&str> = leased.iter().map(|l| l.item.id.as_str()).collect();
    assert_eq!(ids, ["item-a", "item-b"], "both read back");
}

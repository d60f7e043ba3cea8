//! The batches' indexes change by one batch at a time: after any sequence of batches held and
//! forgotten, they are what indexing the batches held from scratch gives.

use super::{Batches, LeaseBatch};
use crate::record::file::aside::ItemFile;
use crate::record::lease::{Lease, Owner};
use crate::record::store::ResumeItem;
use std::collections::{BTreeMap, BTreeSet};

fn items(ids: &[&str]) -> Vec<ItemFile> {
    let by = Owner::new("h", 1, 1);
    (ids.iter())
        .map(|id| ItemFile {
            item: ResumeItem::new(
                *id,
                "p",
                serde_json::json!(1),
                by.clone(),
                chrono::Utc::now(),
                1,
            ),
            held_aside: None,
        })
        .collect()
}

fn leases(ids: &[&str]) -> LeaseBatch {
    let now = chrono::Utc::now();
    LeaseBatch {
        lease: Lease::new(Owner::new("h", 2, 1), now, now),
        ids: ids.iter().map(|id| (*id).to_owned()).collect(),
        released: false,
    }
}

/// Every id's places, and every id's lease batches, as the indexes hold them.
type Indexed = (
    BTreeMap<String, BTreeSet<(String, usize)>>,
    BTreeMap<String, BTreeSet<String>>,
);

fn indexed(b: &Batches) -> Indexed {
    let places = (b.index.iter())
        .map(|(id, p)| {
            (
                id.clone(),
                p.iter().map(|(n, a)| (n.to_string(), *a)).collect(),
            )
        })
        .collect();
    let leased = (b.lease_index.iter())
        .map(|(id, names)| (id.clone(), names.iter().map(|n| n.to_string()).collect()))
        .collect();
    (places, leased)
}

/// The indexes of the batches `b` holds, built from nothing.
fn from_scratch(b: &Batches) -> Indexed {
    let mut fresh = Batches::default();
    for (name, files) in &b.files {
        fresh.insert_items(name.clone(), files.to_vec());
    }
    for (name, batch) in &b.leases {
        let ids: Vec<&str> = batch.ids.iter().map(String::as_str).collect();
        fresh.insert_leases(name.clone(), leases(&ids));
    }
    indexed(&fresh)
}

#[test]
fn held_and_forgotten_batches_leave_the_indexes_as_built_from_nothing() {
    let mut b = Batches::default();
    b.insert_items("1.batch".into(), items(&["a", "b", "c"]));
    b.insert_items("2.batch".into(), items(&["b", "d", "b"]));
    b.insert_leases("3.leases".into(), leases(&["a", "b"]));
    b.insert_leases("4.leases".into(), leases(&["b", "e"]));
    assert_eq!(indexed(&b), from_scratch(&b));
    assert_eq!(
        b.index["b"].iter().count(),
        3,
        "b is in two batches, twice in one"
    );
    b.forget("1.batch");
    b.forget("3.leases");
    assert_eq!(indexed(&b), from_scratch(&b));
    assert!(!b.holds("a") && !b.holds("c") && b.holds("b") && b.holds("d"));
    assert!(b.best_lease("a").is_none() && b.best_lease("b").is_some());
    // Read again under the same name (replaced by hand): its old places go.
    b.insert_items("2.batch".into(), items(&["f"]));
    assert_eq!(indexed(&b), from_scratch(&b));
    assert!(!b.holds("b") && !b.holds("d") && b.holds("f"));
    b.forget("2.batch");
    b.forget("4.leases");
    assert!(b.index.is_empty() && b.lease_index.is_empty());
}

use super::*;
use crate::store::files::{Observer, Step as Taken};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One file-system step, owned: what the journal keeps of a [`Taken`] step.
#[derive(Debug, Clone)]
enum Step {
    Write {
        path: PathBuf,
        bytes: Vec<u8>,
        synced: bool,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    Remove {
        path: PathBuf,
    },
    SyncDir {
        dir: PathBuf,
    },
}

/// The steps a store opened to be watched took, in order.
#[derive(Default)]
struct Journal(Mutex<Vec<Step>>);

impl Observer for Journal {
    fn took(&self, step: Taken<'_>) {
        let step = match step {
            Taken::Write {
                path,
                bytes,
                synced,
            } => Step::Write {
                path: path.to_path_buf(),
                bytes: bytes.to_vec(),
                synced,
            },
            Taken::Rename { from, to } => Step::Rename {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
            },
            Taken::Remove { path } => Step::Remove {
                path: path.to_path_buf(),
            },
            Taken::SyncDir { dir } => Step::SyncDir {
                dir: dir.to_path_buf(),
            },
        };
        self.0.lock().unwrap().push(step);
    }
}

impl Journal {
    /// The steps taken since the last call.
    fn take(&self) -> Vec<Step> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Path -> contents (`None`: a directory).
type Tree = BTreeMap<PathBuf, Option<Vec<u8>>>;

fn snapshot(root: &Path) -> Tree {
    let mut tree = Tree::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                tree.insert(path.clone(), None);
                dirs.push(path);
            } else {
                tree.insert(path.clone(), Some(fs::read(&path).unwrap()));
            }
        }
    }
    tree
}

/// What a power loss after `steps` leaves of `base`.
fn after_power_loss(base: &Tree, steps: &[Step]) -> Tree {
    let (mut current, mut durable) = (base.clone(), base.clone());
    for step in steps {
        match step {
            Step::Write {
                path,
                bytes,
                synced,
            } => {
                let kept = if *synced { bytes.clone() } else { Vec::new() };
                current.insert(path.clone(), Some(kept));
            }
            Step::Rename { from, to } => {
                let moved = current.remove(from).flatten();
                current.insert(to.clone(), moved);
            }
            Step::Remove { path } => {
                current.remove(path);
            }
            Step::SyncDir { dir } => {
                durable.retain(|p, _| p.parent() != Some(dir.as_path()));
                for (p, v) in current
                    .iter()
                    .filter(|(p, _)| p.parent() == Some(dir.as_path()))
                {
                    durable.insert(p.clone(), v.clone());
                }
            }
        }
    }
    durable
}

/// `tree` (taken under `from`) written out under `to`.
fn materialise(tree: &Tree, from: &Path, to: &Path) {
    for (path, contents) in tree {
        let target = to.join(path.strip_prefix(from).unwrap());
        match contents {
            None => fs::create_dir_all(&target).unwrap(),
            Some(bytes) => {
                fs::create_dir_all(target.parent().unwrap()).unwrap();
                fs::write(&target, bytes).unwrap();
            }
        }
    }
}

/// The item ids (with their lease holder's pid) a store finds in `tree`, and the ids in its
/// acknowledged directory.
fn found(tree: &Tree, root: &Path) -> (Vec<(String, Option<u32>)>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    materialise(tree, root, dir.path());
    let store =
        FileRecordStore::open(dir.path().join("state"), crate::record::Sharing::Refused).unwrap();
    let listed = block_on(store.list()).unwrap();
    let acked = fs::read_dir(dir.path().join("state").join(file::ACKED_DIR_NAME))
        .map(|d| {
            d.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".item.json").map(str::to_owned)
            })
            .collect()
        })
        .unwrap_or_default();
    let listed = listed
        .into_iter()
        .map(|s| (s.item.id, s.lease.map(|l| l.owner.pid)))
        .collect();
    (listed, acked)
}

/// Runs `op` on a store prepared by `setup` and checks `holds(k, n, listed, acked)` on the
/// tree a power loss after each of its `n` steps would leave (`k` = steps kept).
fn every_power_loss(
    setup: impl Fn(&FileRecordStore),
    op: impl Fn(&FileRecordStore),
    holds: impl Fn(usize, usize, &[(String, Option<u32>)], &[String]) -> Result<(), String>,
) {
    let dir = tempfile::tempdir().unwrap();
    let journal = Arc::new(Journal::default());
    let (store, _) = store(dir.path());
    let store = store.observed(journal.clone());
    setup(&store);
    let root = dir.path();
    journal.take();
    let base = snapshot(root);
    op(&store);
    let steps = journal.take();
    assert!(!steps.is_empty(), "the operation took no recorded step");
    for k in 0..=steps.len() {
        let (listed, acked) = found(&after_power_loss(&base, &steps[..k]), root);
        if let Err(why) = holds(k, steps.len(), &listed, &acked) {
            panic!(
                "power loss after {k} of {} steps: {why}\nsteps: {steps:#?}",
                steps.len()
            );
        }
    }
}

fn three_items() -> StopRecord {
    let mut three = record();
    for n in 2..=3 {
        three
            .unfinished
            .push(Unfinished::new("jobs", format!("job-{n}").into()));
        three.unfinished.last_mut().unwrap().id = Some(format!("item-{n}"));
    }
    three
}

fn leased_to_1(store: &FileRecordStore) {
    block_on(store.persist(&owner(42), three_items().into())).unwrap();
    block_on(store.lease(&owner(1), 10, Duration::from_secs(60))).unwrap();
}

fn ids(listed: &[(String, Option<u32>)]) -> Vec<&str> {
    listed.iter().map(|(id, _)| id.as_str()).collect()
}

#[test]
fn a_dropped_item_never_comes_back_once_the_drop_returned() {
    every_power_loss(
        leased_to_1,
        |s| assert!(block_on(s.remove("item-1")).unwrap()),
        |k, n, listed, _| {
            let listed = ids(listed);
            if !listed.contains(&"item-2") || !listed.contains(&"item-3") {
                return Err(format!("another item was lost: {listed:?}"));
            }
            if k == n && listed.contains(&"item-1") {
                return Err("the dropped item is back".into());
            }
            Ok(())
        },
    );
}

#[test]
fn an_acknowledged_item_never_comes_back_and_none_is_lost_meanwhile() {
    every_power_loss(
        leased_to_1,
        |s| block_on(s.acknowledge(&owner(1), "item-1")).unwrap(),
        |k, n, listed, acked| {
            let listed = ids(listed);
            let here = listed.contains(&"item-1");
            let done = acked.iter().any(|a| a == "item-1");
            match (here, done) {
                (false, false) => Err("item-1 is neither pending nor acknowledged".into()),
                (true, _) if k == n => Err("the acknowledged item is back".into()),
                _ => Ok(()),
            }
        },
    );
}

#[test]
fn acknowledgements_made_together_never_come_back_and_none_is_lost_meanwhile() {
    every_power_loss(
        leased_to_1,
        |s| {
            let ids = ["item-1", "item-2"].map(String::from);
            let answers = block_on(s.acknowledge_many(&owner(1), &ids)).unwrap();
            assert!(answers.iter().all(Result::is_ok), "{answers:?}");
        },
        |k, n, listed, acked| {
            let listed = ids(listed);
            if !listed.contains(&"item-3") {
                return Err("item-3 was lost".into());
            }
            for id in ["item-1", "item-2"] {
                let here = listed.contains(&id);
                let done = acked.iter().any(|a| a == id);
                match (here, done) {
                    (false, false) => {
                        return Err(format!("{id} is neither pending nor acknowledged"));
                    }
                    (true, _) if k == n => return Err(format!("acknowledged {id} is back")),
                    _ => {}
                }
            }
            Ok(())
        },
    );
}

#[test]
fn a_release_is_not_undone_once_it_returned() {
    every_power_loss(
        leased_to_1,
        |s| assert!(block_on(s.release(None, "item-1")).unwrap()),
        |k, n, listed, _| {
            let item = listed.iter().find(|(id, _)| id == "item-1");
            match item {
                None => Err("item-1 was lost".into()),
                Some((_, Some(_))) if k == n => Err("the released lease is back".into()),
                _ => Ok(()),
            }
        },
    );
}

#[test]
fn a_persist_loses_no_item_at_any_step_and_all_are_durable_once_it_returned() {
    // New work, and three items handed back by their holder.
    every_power_loss(
        leased_to_1,
        |s| {
            let mut both = handed_back(three_items());
            both.unfinished
                .push(Unfinished::new("jobs", "job-9".into()));
            both.unfinished.last_mut().unwrap().id = Some("item-9".into());
            block_on(s.persist(&owner(1), both.clone().into())).unwrap();
        },
        |k, n, listed, _| {
            let ids = ids(listed);
            for id in ["item-1", "item-2", "item-3"] {
                if !ids.contains(&id) {
                    return Err(format!("{id} was lost: {listed:?}"));
                }
            }
            if k == n && (!ids.contains(&"item-9") || listed.iter().any(|(_, l)| l.is_some())) {
                return Err(format!("not all durable and pending: {listed:?}"));
            }
            Ok(())
        },
    );
}

//! Batches: the items one stop records, in one file, written and synced once.
//!
//! Why: a stop may hand back a hundred thousand items, and a file per item costs a create, a
//! write, two syncs and a rename each — seconds where the same bytes in one file take
//! milliseconds. So a stop writes its items into `planned-stop-batches/<name>.batch.json` (in
//! files of at most [`BATCH_BYTES`], each written atomically and durably), and nothing rewrites a
//! batch: what happens to one of its items later is written beside it.
//!
//! Which version of an item counts, when there are several:
//!
//! - an item acknowledged (`planned-stop-acked/<id>.item.json`) or dropped by an operator
//!   (`planned-stop-acked/<id>.dropped`) is gone for good, whatever else holds it;
//! - otherwise the version with the most attempts (each hand-back counts one more), and at equal
//!   attempts the item's own file (`planned-stop-items/<id>.item.json`: a failure counted, held
//!   aside or released, which never changes the attempts) over any batch, and a later batch over
//!   an earlier one.
//!
//! A batch none of whose items counts any more is removed at the next stop (durably, before any
//! acknowledgement it outlived is swept: an acknowledgement is swept only when no batch holds its
//! item, so nothing comes back). Batches are immutable, so a store keeps each one it has read in
//! memory, keyed by its name.

use super::aside::{ItemFile, Line};
use super::leases::{LEASES, LeaseBatch};
use super::{FileRecordStore, ITEM, LEASE};
use crate::record::RecordError;
use crate::record::lease::Owner;
use crate::store::files::{self as fsx, Found};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// The directory of the batches inside the state directory.
pub(crate) const BATCHES_DIR_NAME: &str = "planned-stop-batches";
/// The suffix of a batch file.
const BATCH: &str = ".batch.json";
/// The suffix of an operator's drop in the acknowledged directory.
pub(super) const DROPPED: &str = ".dropped";
/// The largest batch file written (and read back): a stop with more items writes several.
pub(crate) const BATCH_BYTES: usize = 64 * 1024 * 1024;

/// A batch file's contents.
#[derive(Serialize, Deserialize)]
struct BatchFile {
    items: Vec<ItemFile>,
}

/// The batches read so far, by file name, and where each item id appears in them.
#[derive(Default)]
pub(super) struct Batches {
    files: HashMap<String, Arc<Vec<ItemFile>>>,
    /// The batches of leases ([`super::leases`]), by file name.
    leases: HashMap<String, Arc<LeaseBatch>>,
    /// What each file was when it was read: one replaced under the same name (by hand) is read
    /// again.
    stamps: HashMap<String, Stamp>,
    /// Item id → (batch name, position), every appearance. The name is shared, not copied per
    /// item: a batch of 100,000 items is indexed without 100,000 allocations of its name.
    index: HashMap<String, Places>,
    /// Item id → the lease batches naming it.
    lease_index: HashMap<String, Vec<Arc<str>>>,
    /// Batches of items this store wrote and has not read back: a stop's items are written
    /// from the record it was lent, not copied into the cache, and are read only when a later
    /// call needs them (most processes exit after their stop).
    unread: HashSet<String>,
    /// The highest sequence number among the names listed: the next file is numbered after it.
    top: u64,
}

impl Batches {
    /// The version of `id` the batches hold that counts among them (most attempts, then the
    /// later batch), with the batch's name.
    pub(super) fn best(&self, id: &str) -> Option<(&str, &ItemFile)> {
        self.index
            .get(id)?
            .iter()
            .filter_map(|(name, at)| Some((&**name, self.files.get(&**name)?.get(*at)?)))
            .max_by(|(a, x), (b, y)| (x.item.attempts, a).cmp(&(y.item.attempts, b)))
    }

    /// The latest lease (or release) of `id` among the lease batches, with the batch's number.
    pub(super) fn best_lease(&self, id: &str) -> Option<(u64, &LeaseBatch)> {
        self.lease_index
            .get(id)?
            .iter()
            .filter_map(|name| Some((sequence(name)?, &**self.leases.get(&**name)?)))
            .max_by_key(|(seq, _)| *seq)
    }

    /// The highest batch number listed.
    pub(super) fn top(&self) -> u64 {
        self.top
    }

    /// Every item id a lease batch names.
    pub(super) fn leased_ids(&self) -> impl Iterator<Item = &str> {
        self.lease_index.keys().map(String::as_str)
    }

    /// The lease batches, by name.
    pub(super) fn lease_files(&self) -> impl Iterator<Item = (&String, &Arc<LeaseBatch>)> {
        self.leases.iter()
    }

    /// How many batch files (of items and of leases) there are.
    pub(super) fn len(&self) -> usize {
        self.files.len() + self.leases.len() + self.unread.len()
    }

    /// Every item id the batches hold.
    pub(super) fn ids(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// Whether a batch holds `id`.
    pub(super) fn holds(&self, id: &str) -> bool {
        self.index.contains_key(id)
    }

    /// The batches, by name, with their items.
    pub(super) fn files(&self) -> impl Iterator<Item = (&String, &Arc<Vec<ItemFile>>)> {
        self.files.iter()
    }

    /// Holds the batch of items `name`, indexed; the indexes change by this batch only, so a
    /// stop that writes one batch beside 100,000 items does not index them all again.
    fn insert_items(&mut self, name: String, items: Vec<ItemFile>) {
        self.forget(&name);
        index_batch(&mut self.index, &Arc::from(name.as_str()), &items);
        self.files.insert(name, Arc::new(items));
    }

    /// Holds the batch of leases `name`, indexed.
    fn insert_leases(&mut self, name: String, batch: LeaseBatch) {
        self.forget(&name);
        let shared: Arc<str> = Arc::from(name.as_str());
        for id in &batch.ids {
            (self.lease_index.entry(id.clone()).or_default()).push(shared.clone());
        }
        self.leases.insert(name, Arc::new(batch));
    }

    /// Forgets the batch `name` (of items or of leases) and its places in the indexes.
    fn forget(&mut self, name: &str) {
        if let Some(items) = self.files.remove(name) {
            for (at, file) in items.iter().enumerate() {
                unindex(&mut self.index, &file.item.id, name, at);
            }
        }
        if let Some(batch) = self.leases.remove(name) {
            for id in &batch.ids {
                if let Some(names) = self.lease_index.get_mut(id) {
                    names.retain(|n| &**n != name);
                    if names.is_empty() {
                        self.lease_index.remove(id);
                    }
                }
            }
        }
    }
}

/// Removes the place (`name`, `at`) of `id` from `index`.
fn unindex(index: &mut HashMap<String, Places>, id: &str, name: &str, at: usize) {
    let Some(places) = index.get_mut(id) else {
        return;
    };
    if &*places.first.0 == name && places.first.1 == at {
        match places.more.pop() {
            Some(next) => places.first = next,
            None => {
                index.remove(id);
            }
        }
    } else {
        places.more.retain(|(n, a)| !(&**n == name && *a == at));
    }
}

/// A stopper and a stop's time as JSON, formatted once for every item that shares them.
struct Shared {
    by: Owner,
    at: DateTime<Utc>,
    by_json: Box<RawValue>,
    at_json: Box<RawValue>,
}

impl Shared {
    fn of(by: &Owner, at: DateTime<Utc>) -> Result<Shared, serde_json::Error> {
        Ok(Shared {
            by: by.clone(),
            at,
            by_json: serde_json::value::to_raw_value(by)?,
            at_json: serde_json::value::to_raw_value(&at)?,
        })
    }
}

/// Where one item id appears among the batches: nearly always in one, so the first place is
/// kept inline (100,000 items indexed without 100,000 vectors).
pub(super) struct Places {
    first: (Arc<str>, usize),
    more: Vec<(Arc<str>, usize)>,
}

impl Places {
    fn iter(&self) -> impl Iterator<Item = &(Arc<str>, usize)> {
        std::iter::once(&self.first).chain(&self.more)
    }
}

/// Adds every item of the batch `name` to `index`.
fn index_batch(index: &mut HashMap<String, Places>, name: &Arc<str>, items: &[ItemFile]) {
    index.reserve(items.len());
    for (at, file) in items.iter().enumerate() {
        let place = (name.clone(), at);
        match index.get_mut(&file.item.id) {
            Some(places) => places.more.push(place),
            None => {
                let places = Places {
                    first: place,
                    more: Vec::new(),
                };
                index.insert(file.item.id.clone(), places);
            }
        }
    }
}

/// The sequence number a batch file's name starts with.
pub(super) fn sequence(name: &str) -> Option<u64> {
    name.split('.').next()?.parse().ok()
}

/// A file's identity and version, as far as its metadata tells.
type Stamp = (u64, Option<std::time::SystemTime>, bool, u64);

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = fs::symlink_metadata(path).ok()?;
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
    #[cfg(not(unix))]
    let inode = 0;
    Some((meta.len(), meta.modified().ok(), meta.is_file(), inode))
}

/// Which of two versions of an item counts: `true` when the item's own file (`own`) does over
/// the best batch version (`batched`).
pub(super) fn own_file_counts(own: &ItemFile, batched: &ItemFile) -> bool {
    own.item.attempts >= batched.item.attempts
}

impl FileRecordStore {
    /// The batches as they are on disk now: new ones read (each once in this store's life), gone
    /// ones forgotten. A batch that cannot be read is skipped with a warning, as an item file is.
    pub(super) fn batches(&self) -> Result<std::sync::MutexGuard<'_, Batches>, RecordError> {
        self.refresh(true)
    }

    /// [`Self::batches`] for what only needs their names and number ([`Batches::len`],
    /// [`Batches::top`]): a batch this store wrote is not read back for it.
    pub(super) fn batch_names(&self) -> Result<std::sync::MutexGuard<'_, Batches>, RecordError> {
        self.refresh(false)
    }

    fn refresh(&self, read: bool) -> Result<std::sync::MutexGuard<'_, Batches>, RecordError> {
        let mut cache = self
            .batches
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let names = match fs::read_dir(&self.batches_dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            entries => entries
                .map_err(|source| RecordError::Io {
                    op: "list",
                    path: self.batches_dir.clone(),
                    source,
                })?
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_owned))
                .filter(|name| name.ends_with(BATCH) || name.ends_with(LEASES))
                .collect(),
        };
        let listed: HashSet<&String> = names.iter().collect();
        let gone: Vec<String> = (cache.files.keys().chain(cache.leases.keys()))
            .filter(|name| !listed.contains(name))
            .cloned()
            .collect();
        for name in &gone {
            cache.forget(name);
        }
        cache.unread.retain(|name| listed.contains(name));
        cache.top = names.iter().filter_map(|n| sequence(n)).max().unwrap_or(0);
        for name in names {
            let path = self.batches_dir.join(&name);
            let now = stamp(&path);
            let unread = cache.unread.contains(&name);
            let known = cache.files.contains_key(&name) || cache.leases.contains_key(&name);
            if (known || unread && !read) && cache.stamps.get(&name) == now.as_ref() {
                continue;
            }
            cache.unread.remove(&name);
            cache.forget(&name);
            if name.ends_with(LEASES) {
                if let Some(batch) = self.read_leases(&path) {
                    cache.insert_leases(name.clone(), batch);
                }
            } else if let Some(items) = self.read_batch(&path) {
                cache.insert_items(name.clone(), items);
            }
            match now {
                Some(now) => cache.stamps.insert(name, now),
                None => cache.stamps.remove(&name),
            };
        }
        let kept: HashSet<String> = (cache.files.keys().chain(cache.leases.keys()))
            .chain(&cache.unread)
            .cloned()
            .collect();
        cache.stamps.retain(|name, _| kept.contains(name));
        Ok(cache)
    }

    /// The name of the next batch file of `kind` (its suffix): numbered after every one listed,
    /// so a later file sorts after an earlier one (names are compared when versions tie).
    pub(super) fn next_name(&self, kind: &str) -> Result<String, RecordError> {
        let mut batches = self.batch_names()?;
        batches.top += 1;
        Ok(format!("{:020}{kind}", batches.top))
    }

    fn read_batch(&self, path: &Path) -> Option<Vec<ItemFile>> {
        let problem = match fsx::read_private(path, BATCH_BYTES) {
            Found::Bytes(bytes) => match serde_json::from_slice::<BatchFile>(&bytes) {
                Ok(batch) => {
                    let (valid, invalid): (Vec<ItemFile>, Vec<ItemFile>) = batch
                        .items
                        .into_iter()
                        .partition(|f| crate::record::lease::is_valid_item_id(&f.item.id));
                    if !invalid.is_empty() {
                        tracing::warn!(path = %path.display(), skipped = invalid.len(),
                            "items of a batch whose id is not an item id; skipped");
                    }
                    return Some(valid);
                }
                Err(e) => crate::record::json_problem(&e).to_string(),
            },
            // Removed by another process since the listing.
            Found::Absent => return None,
            found => found.describe(BATCH_BYTES),
        };
        tracing::warn!(path = %path.display(), problem,
            "a batch of items that cannot be read, skipped: its items are not resumed; move it \
             aside or repair it by hand");
        None
    }

    /// Writes `items` as one batch (or several, [`BATCH_BYTES`] each at most), each durable
    /// before this returns, or nothing when an item is too large to be read back. Each item is
    /// serialised once from what it borrows, and read back only when a later call needs it.
    pub(super) fn write_batches<'i>(
        &self,
        items: impl IntoIterator<Item = Line<&'i Owner, DateTime<Utc>, &'i str, &'i serde_json::Value>>,
    ) -> Result<(), RecordError> {
        // Each chunk's bytes and how many items it holds.
        let mut chunks: Vec<(Vec<u8>, usize)> = Vec::new();
        let invalid = |reason: String| RecordError::Invalid {
            path: self.batches_dir.clone(),
            reason,
        };
        // What a stop's items share (their stopper and the stop's time), formatted once.
        let mut shared: Option<Shared> = None;
        let mut bytes = Vec::new();
        for line in items {
            let (by, at) = (line.stopped_by, line.stopped_at);
            if !shared.as_ref().is_some_and(|s| s.by == *by && s.at == at) {
                shared = Some(Shared::of(by, at).map_err(|e| invalid(e.to_string()))?);
            }
            let s = shared.as_ref().expect("set just above");
            bytes.clear();
            let id = line.id;
            serde_json::to_writer(&mut bytes, &line.sharing(&s.by_json, &s.at_json))
                .map_err(|e| invalid(e.to_string()))?;
            // What is written can be read back, in a batch or (later) in a file of its own.
            if bytes.len() > super::MAX_FILE_BYTES {
                return Err(invalid(format!(
                    "item {} would take {} bytes, over the {} this store reads back",
                    id,
                    bytes.len(),
                    super::MAX_FILE_BYTES
                )));
            }
            let fits = chunks
                .last()
                .is_some_and(|(b, _)| b.len() + bytes.len() + 3 <= BATCH_BYTES);
            if !fits {
                chunks.push((b"{\"items\":[".to_vec(), 0));
            }
            let (chunk, count) = chunks.last_mut().expect("a chunk was just pushed");
            if *count > 0 {
                chunk.push(b',');
            }
            chunk.extend_from_slice(&bytes);
            *count += 1;
        }
        for (mut bytes, _) in chunks {
            bytes.extend_from_slice(b"]}");
            let name = self.next_name(BATCH)?;
            let path = self.batches_dir.join(&name);
            super::disk::write_unique(&path, &bytes, true, &*self.observer)?;
            let mut cache = self
                .batches
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(now) = stamp(&path) {
                cache.stamps.insert(name.clone(), now);
                cache.unread.insert(name);
            }
        }
        Ok(())
    }

    /// Removes the batches whose items all are done or written again since, then the
    /// acknowledgements older than [`ACK_KEEP`] no batch holds any more.
    pub(super) fn collect_garbage(&self) -> Result<(), RecordError> {
        // One batch and no leases (a first stop): nothing can be spent.
        if self.batch_names()?.len() <= 1 {
            return self.sweep_acked();
        }
        let (own, _) = self.scan()?;
        let retired = self.retired_ids();
        let own_counts: HashMap<String, u32> = own
            .iter()
            .filter_map(|id| Some((id.clone(), self.own_file(id)?.item.attempts)))
            .collect();
        let winners: HashMap<String, String> = {
            let batches = self.batches()?;
            batches
                .ids()
                .filter(|id| !retired.contains(*id))
                .filter_map(|id| {
                    let (name, best) = batches.best(id)?;
                    let own_wins = own_counts.get(id).is_some_and(|&a| a >= best.item.attempts);
                    (!own_wins).then(|| (id.to_owned(), name.to_owned()))
                })
                .collect()
        };
        self.remove_spent_batches(|id, name| winners.get(id).is_some_and(|w| w == name))?;
        // The ids stored (own files and batches, less what is retired), without every item's
        // state: building 100,000 states cost more than the rest of the sweep.
        let (own, own_leases) = self.scan()?;
        let retired = self.retired_ids();
        let known: HashSet<String> = {
            let batches = self.batches()?;
            (own.into_iter())
                .chain(batches.ids().map(str::to_owned))
                .filter(|id| !retired.contains(id))
                .collect()
        };
        if self.writable {
            for orphan in own_leases.iter().filter(|id| !known.contains(*id)) {
                self.remove_file(&self.path(orphan, LEASE))?;
            }
        }
        self.tidy_leases(&known, &own_leases)?;
        self.sweep_acked()
    }

    /// Removes every item of `ids` for good, whatever its lease, with a fixed number of syncs
    /// however many there are: a batch all of whose items go is removed whole; an item of a
    /// batch that keeps others gets a drop of its own. What a store that spills into this one
    /// (the PostgreSQL store) does with the items it pushed on.
    ///
    /// # Errors
    ///
    /// [`RecordError`] when the state directory cannot be changed (read-only, locked out).
    pub async fn remove_all(&self, ids: Vec<String>) -> Result<(), RecordError> {
        self.off_thread(move |s| s.remove_all_now(&ids)).await
    }

    fn remove_all_now(&self, ids: &[String]) -> Result<(), RecordError> {
        self.refuse_read_only()?;
        let gone: HashSet<&str> = ids.iter().map(String::as_str).collect();
        let (spent, kept_ids): (Vec<String>, HashSet<String>) = {
            let batches = self.batches()?;
            let mut spent = Vec::new();
            let mut kept = HashSet::new();
            for (name, items) in batches.files() {
                if items.iter().all(|f| gone.contains(f.item.id.as_str())) {
                    spent.push(name.clone());
                } else {
                    kept.extend(items.iter().map(|f| f.item.id.clone()));
                }
            }
            (spent, kept)
        };
        for id in ids.iter().filter(|id| self.valid(id).is_some()) {
            if kept_ids.contains(id) {
                self.tombstone(id)?;
            }
            self.remove_file(&self.path(id, ITEM))?;
            self.remove_file(&self.path(id, super::LEASE))?;
        }
        for name in &spent {
            self.remove_file(&self.batches_dir.join(name))?;
        }
        for dir in [&self.items, &self.batches_dir] {
            fsx::sync_dir_of(&dir.join("x"), &*self.observer)?;
        }
        Ok(())
    }

    /// Whether `id` was acknowledged or dropped: gone for good.
    pub(super) fn retired(&self, id: &str) -> bool {
        [ITEM, DROPPED]
            .iter()
            .any(|kind| fs::symlink_metadata(self.acked.join(format!("{id}{kind}"))).is_ok())
    }

    /// Records that an operator dropped `id`, durably: its batch version never counts again.
    pub(super) fn tombstone(&self, id: &str) -> Result<(), RecordError> {
        let path = self.acked.join(format!("{id}{DROPPED}"));
        super::disk::write_unique(&path, b"", true, &*self.observer)
    }

    /// Removes the batches none of whose items counts any more (`counts(id, batch)`: whether the
    /// version of `id` in that batch is the one that counts), then syncs their directory, so an
    /// acknowledgement swept after this can never let one come back.
    pub(super) fn remove_spent_batches(
        &self,
        counts: impl Fn(&str, &str) -> bool,
    ) -> Result<(), RecordError> {
        let spent: Vec<String> = {
            let batches = self.batches()?;
            batches
                .files()
                .filter(|(name, items)| !items.iter().any(|f| counts(&f.item.id, name)))
                .map(|(name, _)| name.clone())
                .collect()
        };
        // Never the file with the highest number: numbers only grow (see `leases`).
        let top = self.batches()?.top();
        let spent: Vec<String> = spent
            .into_iter()
            .filter(|n| sequence(n) != Some(top))
            .collect();
        if spent.is_empty() {
            return Ok(());
        }
        for name in &spent {
            self.remove_file(&self.batches_dir.join(name))?;
        }
        fsx::sync_dir_of(&self.batches_dir.join(&spent[0]), &*self.observer)?;
        tracing::debug!(
            batches = spent.len(),
            "removed batches of items that are all done"
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests;

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

use super::aside::ItemFile;
use super::{FileRecordStore, ITEM};
use crate::record::RecordError;
use crate::store::files::{self as fsx, Found};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// What each batch file was when it was read: one replaced under the same name (by hand)
    /// is read again.
    stamps: HashMap<String, Stamp>,
    /// Item id → (batch name, position), every appearance.
    index: HashMap<String, Vec<(String, usize)>>,
}

impl Batches {
    /// The version of `id` the batches hold that counts among them (most attempts, then the
    /// later batch), with the batch's name.
    pub(super) fn best(&self, id: &str) -> Option<(&str, &ItemFile)> {
        self.index
            .get(id)?
            .iter()
            .filter_map(|(name, at)| Some((name.as_str(), self.files.get(name)?.get(*at)?)))
            .max_by(|(a, x), (b, y)| (x.item.attempts, a).cmp(&(y.item.attempts, b)))
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

    fn reindex(&mut self) {
        self.index.clear();
        for (name, items) in &self.files {
            for (at, file) in items.iter().enumerate() {
                let places = self.index.entry(file.item.id.clone()).or_default();
                places.push((name.clone(), at));
            }
        }
    }
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
                .filter(|name| name.ends_with(BATCH))
                .collect(),
        };
        let listed: HashSet<&String> = names.iter().collect();
        let before = cache.files.len();
        cache.files.retain(|name, _| listed.contains(name));
        let mut changed = cache.files.len() != before;
        for name in names {
            let path = self.batches_dir.join(&name);
            let now = stamp(&path);
            if cache.files.contains_key(&name) && cache.stamps.get(&name) == now.as_ref() {
                continue;
            }
            changed |= cache.files.remove(&name).is_some();
            if let Some(items) = self.read_batch(&path) {
                cache.files.insert(name.clone(), Arc::new(items));
                changed = true;
            }
            match now {
                Some(now) => cache.stamps.insert(name, now),
                None => cache.stamps.remove(&name),
            };
        }
        let files = &cache.files;
        let kept: HashSet<String> = files.keys().cloned().collect();
        cache.stamps.retain(|name, _| kept.contains(name));
        if changed {
            cache.reindex();
        }
        Ok(cache)
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
    /// before this returns.
    pub(super) fn write_batches(&self, items: Vec<ItemFile>) -> Result<(), RecordError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut chunk: Vec<ItemFile> = Vec::new();
        let mut bytes = 0;
        let mut chunks = Vec::new();
        for file in items {
            let size = serde_json::to_vec(&file).map_or(0, |b| b.len()) + 1;
            if !chunk.is_empty() && bytes + size > BATCH_BYTES - 64 {
                chunks.push(std::mem::take(&mut chunk));
                bytes = 0;
            }
            bytes += size;
            chunk.push(file);
        }
        if !chunk.is_empty() {
            chunks.push(chunk);
        }
        let stamp = self.clock.now().timestamp_millis().max(0);
        for items in chunks {
            let name = format!(
                "b-{stamp:013}-{}-{}{BATCH}",
                std::process::id(),
                COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let path = self.batches_dir.join(name);
            let bytes =
                serde_json::to_vec(&BatchFile { items }).map_err(|e| RecordError::Invalid {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            super::disk::write_unique(&path, &bytes, true, &*self.observer)?;
        }
        Ok(())
    }

    /// Removes the batches whose items all are done or written again since, then the
    /// acknowledgements older than [`ACK_KEEP`] no batch holds any more.
    pub(super) fn collect_garbage(&self) -> Result<(), RecordError> {
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
        self.sweep_acked()
    }

    /// Removes every item of `ids` for good, whatever its lease, with a fixed number of syncs
    /// however many there are: a batch all of whose items go is removed whole; an item of a
    /// batch that keeps others gets a drop of its own. What a PostgreSQL store does with the
    /// items it pushed from its spill.
    #[cfg(feature = "postgres")]
    pub(crate) async fn remove_all(&self, ids: Vec<String>) -> Result<(), RecordError> {
        self.off_thread(move |s| s.remove_all_now(&ids)).await
    }

    #[cfg(feature = "postgres")]
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

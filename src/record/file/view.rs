//! Reading the state directory: which version of each item counts (see [`super::batch`]), with
//! its lease. Every operation starts here; the writes are in the parent module.

use super::aside::{self, ItemFile};
use super::leases::{self, LeaseFile};
use super::{ACK_KEEP, FileRecordStore, ITEM, LEASE, batch, misnamed, older_than};
use crate::record::RecordError;
use crate::record::lease;
use crate::record::store::{ItemState, oldest_first};
use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;

/// Every item that counts, by id; the ids with an item file of their own; the ids with a lease
/// file of their own.
pub(super) type Listing = (HashMap<String, ItemState>, HashSet<String>, HashSet<String>);

impl FileRecordStore {
    /// The ids of every item's own file and of every lease file; removes temporary files older
    /// than [`ACK_KEEP`] (left by a process that died while writing).
    pub(super) fn scan(&self) -> Result<(HashSet<String>, HashSet<String>), RecordError> {
        let entries = match fs::read_dir(&self.items) {
            // A store opened to look at a directory no service has written yet.
            Err(e) if !self.writable && e.kind() == io::ErrorKind::NotFound => {
                return Ok(Default::default());
            }
            entries => entries.map_err(|source| RecordError::Io {
                op: "list",
                path: self.items.clone(),
                source,
            })?,
        };
        let (mut ids, mut leases) = (HashSet::new(), HashSet::new());
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                misnamed(&entry.path(), "its name is not UTF-8");
                continue;
            };
            if let Some(id) = name.strip_suffix(ITEM) {
                if lease::is_valid_item_id(id) {
                    ids.insert(id.to_owned());
                } else {
                    misnamed(
                        &entry.path(),
                        "its name is not an item id (1 to 128 of A-Z a-z 0-9 - _)",
                    );
                }
            } else if let Some(id) = name.strip_suffix(LEASE) {
                leases.insert(id.to_owned());
            } else if self.writable && name.starts_with('.') && older_than(&entry, ACK_KEEP) {
                self.remove_file(&entry.path())?;
            }
        }
        Ok((ids, leases))
    }

    /// The ids acknowledged or dropped (the names in the acknowledged directory).
    pub(super) fn retired_ids(&self) -> HashSet<String> {
        let Ok(entries) = fs::read_dir(&self.acked) else {
            return HashSet::new();
        };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let id = name
                    .strip_suffix(ITEM)
                    .or_else(|| name.strip_suffix(batch::DROPPED))?;
                Some(id.to_owned())
            })
            .collect()
    }

    /// The item's own file, when it is one of this store's for `id`.
    pub(super) fn own_file(&self, id: &str) -> Option<ItemFile> {
        let file: aside::ItemFile = self.read_json(&self.path(id, ITEM))?;
        if file.item.id != id {
            tracing::warn!(id, found = %file.item.id, "an item file names another id; skipped");
            return None;
        }
        Some(file)
    }

    /// The version of `id` that counts (see [`batch`]), and whether it is the item's own file;
    /// `None` when the item is unknown, acknowledged or dropped.
    pub(super) fn version(&self, id: &str) -> Result<Option<(ItemFile, bool)>, RecordError> {
        if self.retired(id) {
            return Ok(None);
        }
        let own = self.own_file(id);
        let batches = self.batches()?;
        Ok(pick(own, batches.best(id).map(|(_, f)| f)))
    }

    pub(super) fn state_of(&self, id: &str) -> Option<ItemState> {
        let (file, _) = self
            .version(id)
            .inspect_err(|e| {
                tracing::warn!(id, error = %crate::error_chain::ErrorChain(e),
                    "cannot read the batches of items; the item is taken as unknown");
            })
            .ok()
            .flatten()?;
        let lease = self
            .lease_of(id)
            .inspect_err(|e| {
                tracing::warn!(id, error = %crate::error_chain::ErrorChain(e),
                    "cannot read the batches of leases; the item is taken as not leased");
            })
            .ok()
            .flatten();
        Some(ItemState {
            item: file.item,
            lease,
            quarantined: file.held_aside,
        })
    }

    /// Every item that counts, by id, with its lease; removes a lease whose item is gone
    /// (acknowledged or dropped by a process that died before removing the lease).
    pub(super) fn states(&self) -> Result<HashMap<String, ItemState>, RecordError> {
        Ok(self.states_and_files()?.0)
    }

    /// [`Self::states`], and the ids with an item file of their own and with a lease file of
    /// their own.
    pub(super) fn states_and_files(&self) -> Result<Listing, RecordError> {
        let (own, leases) = self.scan()?;
        let retired = self.retired_ids();
        let batches = self.batches()?;
        let mut states = HashMap::new();
        let ids = own.iter().map(String::as_str).chain(batches.ids());
        for id in ids {
            if retired.contains(id) || states.contains_key(id) {
                continue;
            }
            let own = if own.contains(id) {
                self.own_file(id)
            } else {
                None
            };
            let Some((file, _)) = pick(own, batches.best(id).map(|(_, f)| f)) else {
                continue;
            };
            let own_lease = if leases.contains(id) {
                self.read_json::<LeaseFile>(&self.path(id, LEASE))
            } else {
                None
            };
            let lease = leases::resolve(own_lease, batches.best_lease(id));
            let state = ItemState {
                item: file.item,
                lease,
                quarantined: file.held_aside,
            };
            states.insert(id.to_owned(), state);
        }
        drop(batches);
        if self.writable {
            for orphan in leases.iter().filter(|id| !states.contains_key(id.as_str())) {
                self.remove_file(&self.path(orphan, LEASE))?;
            }
        }
        Ok((states, own, leases))
    }

    pub(super) fn all(&self) -> Result<Vec<ItemState>, RecordError> {
        let mut items: Vec<ItemState> = self.states()?.into_values().collect();
        oldest_first(&mut items);
        Ok(items)
    }
}

/// The version of an item that counts, from its own file and the best of its batch versions
/// (see [`batch`]), and whether it is the own file.
fn pick(own: Option<ItemFile>, batched: Option<&ItemFile>) -> Option<(ItemFile, bool)> {
    match (own, batched) {
        (Some(own), Some(b)) if !batch::own_file_counts(&own, b) => Some((b.clone(), false)),
        (Some(own), _) => Some((own, true)),
        (None, Some(b)) => Some((b.clone(), false)),
        (None, None) => None,
    }
}

//! Acknowledgements in the state directory: one at a time, or many with one sync of each
//! directory. The item leaves the item directory for good: its own file is renamed into the
//! acknowledged directory, or (held only by a batch, which is never rewritten) a new file there
//! says it is done.

use super::{FileRecordStore, ITEM, LEASE, aside};
use crate::record::RecordError;
use crate::record::lease::{self, Owner};
use crate::store::files as fsx;
use std::fs;
use std::io;

impl FileRecordStore {
    pub(super) fn acknowledge_now(&self, owner: &Owner, id: &str) -> Result<(), RecordError> {
        self.refuse_read_only()?;
        let unknown = || RecordError::UnknownItem { id: id.to_owned() };
        if self.valid(id).is_none() {
            return Err(unknown());
        }
        let Some((file, own)) = self.version(id)? else {
            return Err(unknown());
        };
        let lease = self.lease_of(id)?;
        if !lease::holds(lease.as_ref(), owner) {
            return Err(RecordError::NotHolder {
                id: id.to_owned(),
                holder: lease.map(|l| l.owner.to_string()),
            });
        }
        self.retire(id, &file, own, true)
    }

    /// Acknowledges `ids` for `owner` (see [`RecordStore::acknowledge_many`]): each checked and
    /// moved as [`Self::acknowledge_now`] does, and all made durable by one sync of each
    /// directory at the end.
    pub(super) fn acknowledge_many_now(
        &self,
        owner: &Owner,
        ids: &[String],
    ) -> Result<Vec<Result<(), RecordError>>, RecordError> {
        self.refuse_read_only()?;
        let (states, own, _) = self.states_and_files()?;
        let mut answers = Vec::with_capacity(ids.len());
        for id in ids {
            let unknown = || RecordError::UnknownItem { id: id.clone() };
            let Some(state) = states.get(id).filter(|_| self.valid(id).is_some()) else {
                answers.push(Err(unknown()));
                continue;
            };
            if !lease::holds(state.lease.as_ref(), owner) {
                answers.push(Err(RecordError::NotHolder {
                    id: id.clone(),
                    holder: state.lease.as_ref().map(|l| l.owner.to_string()),
                }));
                continue;
            }
            let is_own = own.contains(id) && self.version(id)?.is_some_and(|(_, own)| own);
            let file = aside::ItemFile {
                item: state.item.clone(),
                held_aside: state.quarantined.clone(),
            };
            answers.push(self.retire(id, &file, is_own, false));
        }
        if answers.iter().any(Result::is_ok) {
            // The new place first: a power loss between the two leaves an item in both (done),
            // never in neither.
            fsx::sync_dir_of(&self.acked.join("x"), &*self.observer)?;
            fsx::sync_dir_of(&self.items.join("x"), &*self.observer)?;
        }
        Ok(answers)
    }

    /// Moves `id` (whose version that counts is `file`, its own file when `own`) to the
    /// acknowledged items, durably when `durable` (else the caller syncs both directories).
    fn retire(
        &self,
        id: &str,
        file: &aside::ItemFile,
        own: bool,
        durable: bool,
    ) -> Result<(), RecordError> {
        let item = self.path(id, ITEM);
        let done = self.acked.join(format!("{id}{ITEM}"));
        if own {
            // The acknowledgement is one rename: the item leaves the item directory for good.
            match fsx::rename_file(&item, &done, &*self.observer) {
                Ok(()) => {}
                // Unknown only if the item itself is gone: a missing acknowledged directory is
                // an error of the store, and the item stays held (its holder must not take it
                // for done).
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound
                        && fs::symlink_metadata(&item).is_err() =>
                {
                    return Err(RecordError::UnknownItem { id: id.to_owned() });
                }
                Err(source) => {
                    return Err(RecordError::Io {
                        op: "acknowledge (move to the acknowledged items)",
                        path: item,
                        source,
                    });
                }
            }
            // Its age in the acknowledged directory counts from now, not from the stop.
            if let Ok(file) = fs::OpenOptions::new().write(true).open(&done) {
                let _ = file.set_modified(std::time::SystemTime::now());
            }
            if durable {
                // The new place first: a power loss between the two syncs leaves the item in
                // both (done: the acknowledgement counts over any other version), never in
                // neither.
                fsx::sync_dir_of(&done, &*self.observer)?;
                fsx::sync_dir_of(&item, &*self.observer)?;
            }
        } else {
            // Only a batch holds it (batches are never rewritten): the acknowledgement is a new
            // file, and counts over every other version from then on.
            self.write_json_as(&done, file, durable)?;
            self.remove_file(&item)?;
        }
        self.remove_file(&self.path(id, LEASE))
    }
}

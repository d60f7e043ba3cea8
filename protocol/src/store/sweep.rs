//! Looking over the whole directory: listing every slot with its judgement, and sweeping what
//! earlier processes left behind (stale slots, outcome and presence files of gone processes,
//! temporary files of killed writers).

use super::files::{Found, read_slot};
use super::naming::{is_leftover_name, parse_slot_file_name};
use super::{Layout, MarkerStore, StoreError};
use crate::judgement::{Judgement, Undecided};
use chrono::{DateTime, Utc};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What [`MarkerStore::sweep`] removed.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
/// let report = store.sweep(chrono::Utc::now()).unwrap();
/// assert_eq!(report, planned_stop_protocol::marker::SweepReport::default());
/// ```
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Slots removed as malformed or stale (their owner gone included).
    pub removed_slots: Vec<PathBuf>,
    /// Leftover temporary and taken files removed.
    pub removed_leftovers: Vec<PathBuf>,
}

/// One slot as [`MarkerStore::entries`] lists it.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
/// std::fs::write(store.slot_path(3), b"junk").unwrap();
/// let entries = store.entries(chrono::Utc::now()).unwrap();
/// assert_eq!(entries[0].judgement.as_ref().map(|v| v.kind()), Ok("malformed"));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SlotEntry {
    /// The slot's path.
    pub path: PathBuf,
    /// The judgement its owner would reach now, or `Err` when it could not be read.
    pub judgement: Result<Judgement, Undecided>,
}

impl MarkerStore {
    /// Every slot in the directory with the judgement its owner would reach, changing nothing.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// store.write(&planned_stop_protocol::marker::Marker::new(9, None, chrono::Utc::now())).unwrap();
    /// let entries = store.entries(chrono::Utc::now()).unwrap();
    /// assert_eq!(entries.len(), 1);
    /// ```
    pub fn entries(&self, now: DateTime<Utc>) -> Result<Vec<SlotEntry>, StoreError> {
        let mut entries = Vec::new();
        for path in self.slot_files()? {
            let judgement = self.judge_as_owner(&read_slot(&path), self.owner_of(&path), now);
            entries.push(SlotEntry { path, judgement });
        }
        Ok(entries)
    }

    /// Removes the slot at `path` if its owner (the pid in its name, or the one its marker names)
    /// would judge it removable: stale, malformed, or for a process that is gone. Returns whether
    /// it was removed. The same judgement for the whole directory is [`MarkerStore::sweep`].
    pub(crate) fn sweep_slot(&self, path: &Path, now: DateTime<Utc>) -> Result<bool, StoreError> {
        let owner = self.owner_of(path);
        let judge = |found: &Found| self.judge_as_owner(found, owner, now);
        let found = read_slot(path);
        match judge(&found) {
            Ok(v) if v.is_removable() => self.discard(path, &found, judge),
            _ => Ok(false),
        }
    }

    /// Removes every slot its owner would find malformed or stale (a slot whose owner has exited
    /// included), and temporary or taken files older than the TTL (left by a writer or claimer that
    /// died mid-way). Fresh temporary files are left: their writer may still be at work.
    ///
    /// ```
    /// # use planned_stop_protocol::Layout;
    /// # use planned_stop_protocol::marker::MarkerStore;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// std::fs::write(store.slot_path(7), b"garbage").unwrap();
    /// let report = store.sweep(chrono::Utc::now()).unwrap();
    /// assert_eq!(report.removed_slots, vec![store.slot_path(7)]);
    /// ```
    pub fn sweep(&self, now: DateTime<Utc>) -> Result<SweepReport, StoreError> {
        let mut report = SweepReport::default();
        for path in self.slot_files()? {
            if self.sweep_slot(&path, now)? {
                report.removed_slots.push(path);
            }
        }
        let cutoff = SystemTime::from(now)
            .checked_sub(self.policy.ttl)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        // Outcome and presence files of processes that are gone: kept for the TTL, so a stopper
        // that is still waiting can read its target's outcome.
        let outcomes = self.outcome_files()?.into_iter().map(|(pid, path)| {
            let alive = self.read_outcome(pid).is_some_and(|o| {
                o.pid == pid && crate::identity::ProcessIdentity::is_running(o.pid, o.start)
            });
            (alive, path)
        });
        let presences = self.presence_files()?.into_iter().map(|(pid, path)| {
            let alive = self.read_presence(pid).is_some_and(|p| {
                p.pid == pid && crate::identity::ProcessIdentity::is_running(p.pid, p.start)
            });
            (alive, path)
        });
        for (owner_alive, path) in outcomes.chain(presences) {
            let old = fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t < cutoff);
            if old && !owner_alive && fs::remove_file(&path).is_ok() {
                report.removed_leftovers.push(path);
            }
        }
        for path in self.leftover_files()? {
            let old = fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t < cutoff);
            if old && fs::remove_file(&path).is_ok() {
                report.removed_leftovers.push(path);
            }
        }
        Ok(report)
    }

    /// The slot files present now.
    pub(super) fn slot_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        match &self.layout {
            Layout::SingleFile(file) => Ok(match fs::symlink_metadata(file) {
                Ok(_) => vec![file.clone()],
                Err(_) => Vec::new(),
            }),
            Layout::Slots(_) => Ok(self
                .dir_names()?
                .filter(|name| parse_slot_file_name(name).is_some())
                .map(|name| self.dir.join(name))
                .collect()),
        }
    }

    /// Temporary and taken files of this layout's slots.
    pub(super) fn leftover_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        let base = match &self.layout {
            Layout::SingleFile(file) => file.file_name().map(|n| n.to_string_lossy().into_owned()),
            Layout::Slots(_) => None,
        };
        Ok(self
            .dir_names()?
            .filter(|name| is_leftover_name(name, base.as_deref()))
            .map(|name| self.dir.join(name))
            .collect())
    }

    pub(super) fn dir_names(&self) -> Result<impl Iterator<Item = String>, StoreError> {
        let read = fs::read_dir(&self.dir).map_err(|source| StoreError::Directory {
            path: self.dir.clone(),
            source,
        })?;
        Ok(read.filter_map(|e| e.ok()?.file_name().into_string().ok()))
    }
}

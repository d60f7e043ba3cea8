//! The outcome files, `DIR/planned-stop-<PID>.outcome.json`: how a stopper that knows only the
//! directory and the pid follows its target (see `crate::outcome`).

use super::files::{Found, read_bounded, write_atomically};
use super::naming::{TEMP_TAG, outcome_file_name, parse_outcome_file_name};
use super::{MarkerStore, StoreError};
use crate::outcome::{MAX_OUTCOME_BYTES, Outcome};
use std::io;
use std::path::PathBuf;

impl MarkerStore {
    /// Where the runner of `pid` writes its [`Outcome`]: `DIR/planned-stop-<PID>.outcome.json`, in
    /// both layouts.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.outcome_path(42), dir.path().join("planned-stop-42.outcome.json"));
    /// ```
    pub fn outcome_path(&self, pid: u32) -> PathBuf {
        self.dir.join(outcome_file_name(pid))
    }

    /// Writes the runner's outcome file, atomically.
    pub(crate) fn write_outcome(&self, outcome: &Outcome) -> Result<PathBuf, StoreError> {
        let path = self.outcome_path(outcome.pid);
        let bytes = serde_json::to_vec(outcome).map_err(|e| StoreError::Io {
            op: "serialise",
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        write_atomically(&path, &self.private_name(&path, TEMP_TAG), &bytes)?;
        Ok(path)
    }

    /// Reads the outcome file of `pid`; `None` when there is none or it is not an outcome. Check
    /// [`Outcome::is_from`] before trusting it: the pid may have had an earlier owner.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.read_outcome(42), None);
    /// ```
    pub fn read_outcome(&self, pid: u32) -> Option<Outcome> {
        match read_bounded(&self.outcome_path(pid), MAX_OUTCOME_BYTES) {
            Found::Bytes(bytes) => Outcome::parse(&bytes),
            _ => None,
        }
    }

    /// Every readable outcome file in the directory, by pid.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// assert!(store.outcomes().is_empty());
    /// ```
    pub fn outcomes(&self) -> Vec<Outcome> {
        let mut outcomes: Vec<Outcome> = self
            .outcome_files()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(pid, _)| self.read_outcome(pid))
            .collect();
        outcomes.sort_by_key(|o| o.pid);
        outcomes
    }

    /// Outcome files in the directory, with their pids.
    pub(super) fn outcome_files(&self) -> Result<Vec<(u32, PathBuf)>, StoreError> {
        Ok(self
            .dir_names()?
            .filter_map(|name| {
                let pid = parse_outcome_file_name(&name)?;
                Some((pid, self.dir.join(name)))
            })
            .collect())
    }
}

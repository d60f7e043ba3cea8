//! One JSON file of the state directory: read bounded and only when private to this user, written
//! atomically through a temporary file no leftover can take, removed durably.

use super::{FileRecordStore, MAX_FILE_BYTES};
use crate::record::RecordError;
use crate::store::files::{self as fsx, Found};
use std::fs;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

impl FileRecordStore {
    /// Reads an item or lease file; `None` (with a warning naming the path, the size and why,
    /// never the contents) when it is absent or cannot be trusted.
    pub(super) fn read_json<T: serde::de::DeserializeOwned>(&self, path: &Path) -> Option<T> {
        match fsx::read_private(path, MAX_FILE_BYTES) {
            Found::Absent => None,
            Found::Bytes(bytes) if bytes.len() <= MAX_FILE_BYTES => {
                match serde_json::from_slice(&bytes) {
                    Ok(value) => Some(value),
                    Err(e) => {
                        tracing::warn!(path = %path.display(), bytes = bytes.len(),
                            problem = %crate::record::json_problem(&e),
                            "not a record file; skipped: move it aside or repair it by hand");
                        None
                    }
                }
            }
            found => {
                tracing::warn!(path = %path.display(), found = %found.describe(MAX_FILE_BYTES),
                    "not a private regular file of this user within the size limit; skipped: \
                     move it aside or repair it by hand");
                None
            }
        }
    }

    pub(super) fn write_json<T: serde::Serialize>(
        &self,
        path: &Path,
        value: &T,
    ) -> Result<(), RecordError> {
        self.write_json_as(path, value, true)
    }

    /// `durable: false` skips the fsyncs, for leases: a lease a power failure takes back only
    /// makes its item offered again, which at-least-once allows.
    pub(super) fn write_json_as<T: serde::Serialize>(
        &self,
        path: &Path,
        value: &T,
        durable: bool,
    ) -> Result<(), RecordError> {
        let bytes = serde_json::to_vec(value).map_err(|e| RecordError::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        write_unique(path, &bytes, durable, &*self.observer)
    }

    pub(super) fn remove_file(&self, path: &Path) -> Result<(), RecordError> {
        fsx::remove_observed(path, &*self.observer).map_err(RecordError::from)
    }

    /// Removes `path` for good: the directory is synced, so a power failure cannot bring the
    /// file back (an operator's drop that returns would run the work again).
    pub(super) fn remove_durably(&self, path: &Path) -> Result<(), RecordError> {
        self.remove_file(path)?;
        fsx::sync_dir_of(path, &*self.observer).map_err(RecordError::from)
    }
}

/// Whether the file `entry` names was last modified more than `age` ago.
pub(super) fn older_than(entry: &fs::DirEntry, age: Duration) -> bool {
    entry
        .metadata()
        .ok()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|elapsed| elapsed > age)
}

/// Writes `bytes` to `path` atomically through a temporary file whose name no leftover can
/// take: created exclusively, with a new name on a collision.
pub(super) fn write_unique(
    path: &Path,
    bytes: &[u8],
    durable: bool,
    observer: &dyn fsx::Observer,
) -> Result<(), RecordError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let mut tries = 0;
    loop {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let temp = dir.join(format!(
            ".{name}.tmp-{}-{}-{nanos:x}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        match fsx::write_replacing_observed(path, &temp, bytes, durable, observer) {
            Err(crate::store::StoreError::Io { source, .. })
                if source.kind() == io::ErrorKind::AlreadyExists && tries < 8 =>
            {
                tries += 1;
            }
            result => return result.map_err(RecordError::from),
        }
    }
}

/// A directory error of the shared helpers (worded for the marker directory), in the state
/// directory's own words: an operator must not look for a marker directory that is not there.
pub(super) fn in_state_dir_words(e: crate::store::StoreError) -> RecordError {
    use crate::store::StoreError;
    match e {
        StoreError::Directory { path, source } => RecordError::Io {
            op: "use the state directory",
            path,
            source,
        },
        StoreError::NotADirectory(path) => RecordError::Io {
            op: "use the state directory",
            source: io::Error::new(
                io::ErrorKind::NotADirectory,
                "it exists but is not a directory",
            ),
            path,
        },
        other => other.into(),
    }
}

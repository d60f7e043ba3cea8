//! The stop record a file store keeps as a summary for people (`planned-stop-record.json`): its
//! path and its bounded, ownership-checked read.

use crate::record::{MAX_RECORD_BYTES, RECORD_FILE_NAME, RecordError, StopRecord, json_problem};
use crate::store::files::Found;
use std::io;
use std::path::{Path, PathBuf};

/// The record's path in `state_dir`.
pub(crate) fn record_path(state_dir: &Path) -> PathBuf {
    state_dir.join(RECORD_FILE_NAME)
}

pub(super) fn read_record_file(path: &Path) -> Result<Option<StopRecord>, RecordError> {
    use crate::store::files::read_private;
    let invalid = |reason: String| RecordError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    match read_private(path, MAX_RECORD_BYTES as usize) {
        Found::Absent => absent_unless_not_a_directory(path),
        Found::Bytes(bytes) if bytes.len() as u64 > MAX_RECORD_BYTES => {
            Err(invalid(format!("larger than {MAX_RECORD_BYTES} bytes")))
        }
        Found::Bytes(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| invalid(json_problem(&e))),
        Found::NotAFile(kind) => Err(invalid(format!("a {kind:?}, not a regular file"))),
        Found::Foreign(uid) => Err(invalid(format!(
            "owned by uid {uid}, not by this user: it is never trusted"
        ))),
        Found::Unreadable(kind) => Err(RecordError::Io {
            op: "read",
            path: path.to_path_buf(),
            source: io::Error::from(kind),
        }),
    }
}

/// "No record" for a record path that does not exist — unless the state directory itself exists
/// as something else than a directory. Unix says so when opening (`ENOTDIR`); Windows answers
/// "path not found", which must not read as "nothing to resume".
fn absent_unless_not_a_directory(path: &Path) -> Result<Option<StopRecord>, RecordError> {
    match path.parent().map(std::fs::metadata) {
        Some(Ok(meta)) if !meta.is_dir() => Err(RecordError::Io {
            op: "read",
            path: path.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::NotADirectory,
                "the state directory is not a directory",
            ),
        }),
        _ => Ok(None),
    }
}

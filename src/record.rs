//! The stop record: what a stop left behind, for the next start.
//!
//! When the runner has drained it writes one [`StopRecord`] into the application's state directory,
//! atomically: why it stopped, whether that was planned, the request it answered, whether the drain
//! finished in time, and every item the drain participants left unfinished (the *resume pending*
//! list). At its next start the application takes the record ([`StopRecord::take`]) and resumes what
//! is listed. Taking is atomic, so a record is resumed once even if two instances start together.

use crate::lifecycle::{StopCause, StopVerdict};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The file name of the record inside the state directory.
pub const RECORD_FILE_NAME: &str = "planned-stop-record.json";

/// Largest record read back, in bytes; a larger file is refused rather than loaded.
pub const MAX_RECORD_BYTES: u64 = 16 << 20;

/// Work a drain participant left unfinished: data the next start can act on.
///
/// ```
/// # use planned_stop::{DrainReport, Unfinished};
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Job { id: u32, attempt: u8 }
/// // A participant hands back typed items; the next start reads them back as the same type.
/// let report = DrainReport::unfinished([Job { id: 7, attempt: 2 }]);
/// let item: &serde_json::Value = &report.unfinished[0];
/// let job: Job = serde_json::from_value(item.clone())?;
/// assert_eq!(job, Job { id: 7, attempt: 2 });
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Unfinished {
    /// The participant's name, as registered.
    pub participant: String,
    /// The item as the participant handed it back: any JSON value (a job id string, an object).
    pub item: serde_json::Value,
}

impl Unfinished {
    /// The item read back as `T`, the type the participant handed back.
    pub fn item_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.item)
    }
}

/// A participant's remark for people (what was cut, why), kept apart from the items to resume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Note {
    /// The participant's name, as registered.
    pub participant: String,
    /// The remark.
    pub note: String,
}

/// When one drain phase ran, from the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PhaseRecord {
    /// Which phase.
    pub phase: crate::runner::DrainPhase,
    /// How many participants it asked.
    pub participants: usize,
    /// When it began (the previous phase had answered or timed out).
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: DateTime<Utc>,
    /// `true` when it ended at its deadline with answers still missing.
    pub timed_out: bool,
}

/// What a stop left behind. Written once per process life by the runner.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// use planned_stop::StopRecord;
/// assert_eq!(StopRecord::read(dir.path()).unwrap(), None, "no stop recorded yet");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct StopRecord {
    /// The process that stopped.
    pub pid: u32,
    /// What started the stop.
    pub cause: StopCause,
    /// Planned or unexpected (latched at the first classification).
    pub verdict: StopVerdict,
    /// The stopper's request id, when a marker was involved.
    pub request_id: Option<String>,
    /// The stopper's reason, when given.
    pub reason: Option<String>,
    /// The stopper's pid, when known.
    pub stopper_pid: Option<u32>,
    /// When the runner accepted the stop and began draining.
    pub accepted_at: DateTime<Utc>,
    /// When the drain was due to end.
    pub drain_deadline: DateTime<Utc>,
    /// When the drain ended.
    pub finished_at: DateTime<Utc>,
    /// `true` when every participant answered before its phase's deadline and none reported work
    /// cut short, even if some handed work back (that work is in `unfinished`).
    pub drained_in_time: bool,
    /// `true` when the drain was cut short ("force now").
    pub forced: bool,
    /// Work to resume at the next start.
    pub unfinished: Vec<Unfinished>,
    /// Participants that did not answer at all (their unfinished work is unknown).
    pub unanswered: Vec<String>,
    /// Remarks for people, such as in-flight requests cut at the deadline (not work to resume).
    #[serde(default)]
    pub notes: Vec<Note>,
    /// The drain phases that ran, in order.
    #[serde(default)]
    pub phases: Vec<PhaseRecord>,
    /// Stop or restart, as the stopper asked (a stop when it did not say).
    #[serde(default)]
    pub action: crate::marker::StopAction,
    /// The exit code the process ended with.
    pub exit_code: i32,
}

/// Why a record could not be read or written.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// std::fs::write(planned_stop::StopRecord::path(dir.path()), b"{").unwrap();
/// let err = planned_stop::StopRecord::read(dir.path()).unwrap_err();
/// assert!(matches!(err, planned_stop::RecordError::Invalid { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A file operation failed.
    #[error("cannot {op} stop record {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The record's path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The file is not a record (hand-edited, truncated by a full disk, another program's file).
    #[error("stop record {path} is unreadable ({reason}); move it aside and start again")]
    Invalid {
        /// The record's path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Writing failed in the store's atomic write.
    #[error(transparent)]
    Write(#[from] crate::store::StoreError),
}

impl StopRecord {
    /// The record's path in `state_dir`.
    ///
    /// ```
    /// let path = planned_stop::StopRecord::path(std::path::Path::new("/var/lib/app"));
    /// assert!(path.ends_with("planned-stop-record.json"));
    /// ```
    pub fn path(state_dir: &Path) -> PathBuf {
        state_dir.join(RECORD_FILE_NAME)
    }

    /// Writes the record atomically into `state_dir` (created if missing), replacing any earlier one.
    pub(crate) fn write(&self, state_dir: &Path) -> Result<PathBuf, RecordError> {
        let path = StopRecord::path(state_dir);
        fs::create_dir_all(state_dir).map_err(|source| RecordError::Io {
            op: "create the directory of",
            path: path.clone(),
            source,
        })?;
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| RecordError::Invalid {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let temp = state_dir.join(format!(".{RECORD_FILE_NAME}.tmp-{}", std::process::id()));
        crate::store::write_atomically(&path, &temp, &bytes)?;
        Ok(path)
    }

    /// Reads the record in `state_dir` without removing it; `None` when there is none.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// assert!(planned_stop::StopRecord::read(dir.path()).unwrap().is_none());
    /// ```
    pub fn read(state_dir: &Path) -> Result<Option<StopRecord>, RecordError> {
        read_file(&StopRecord::path(state_dir))
    }

    /// Takes the record in `state_dir`: reads and removes it, atomically, so that exactly one caller
    /// gets it. `None` when there is none. An unreadable record is left in place (and reported), so
    /// resume work is never silently lost.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use planned_stop::StopRecord;
    /// // At start-up: resume what the previous life left, exactly once.
    /// if let Some(previous) = StopRecord::take(dir.path()).unwrap() {
    ///     for item in previous.unfinished { /* resume item.item */ }
    /// }
    /// ```
    pub fn take(state_dir: &Path) -> Result<Option<StopRecord>, RecordError> {
        let path = StopRecord::path(state_dir);
        let taken = state_dir.join(format!(".{RECORD_FILE_NAME}.taken-{}", std::process::id()));
        match fs::rename(&path, &taken) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return absent_unless_not_a_directory(&path, "take");
            }
            Err(source) => {
                return Err(RecordError::Io {
                    op: "take",
                    path,
                    source,
                });
            }
        }
        match read_file(&taken) {
            Ok(record) => {
                let _ = fs::remove_file(&taken);
                Ok(record)
            }
            Err(e) => {
                let _ = fs::rename(&taken, &path);
                Err(e)
            }
        }
    }
}

/// "No record" for a record path that does not exist — unless the state directory itself exists
/// as something else than a directory. Unix says so when opening (`ENOTDIR`); Windows answers
/// "path not found", which must not read as "nothing to resume" and drop the work silently.
fn absent_unless_not_a_directory(
    path: &Path,
    op: &'static str,
) -> Result<Option<StopRecord>, RecordError> {
    match path.parent().map(fs::metadata) {
        Some(Ok(meta)) if !meta.is_dir() => Err(RecordError::Io {
            op,
            path: path.to_path_buf(),
            source: io::Error::new(
                io::ErrorKind::NotADirectory,
                "the state directory is not a directory",
            ),
        }),
        _ => Ok(None),
    }
}

fn read_file(path: &Path) -> Result<Option<StopRecord>, RecordError> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return absent_unless_not_a_directory(path, "open");
        }
        Err(source) => {
            return Err(RecordError::Io {
                op: "open",
                path: path.to_path_buf(),
                source,
            });
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| RecordError::Io {
            op: "read",
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(RecordError::Invalid {
            path: path.to_path_buf(),
            reason: format!("larger than {MAX_RECORD_BYTES} bytes"),
        });
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| RecordError::Invalid {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

#[cfg(test)]
mod tests;

//! The stop record and the resume items: what a stop left behind, for the next start.
//!
//! When the runner has drained it persists one [`StopRecord`] through the service's
//! [`RecordStore`]: why it stopped, whether that was planned, the request it answered, whether the
//! drain finished in time, and every item the drain participants left unfinished. Each item gets a
//! stable id and becomes a [`ResumeItem`] of its own, so that several processes sharing one store
//! never overwrite each other's work. The items are durable *before* the stop is reported as
//! planned; when they cannot be made durable the stop ends as `record_lost` instead (its own exit
//! code and outcome phase, and the items on stderr as JSON), never as a planned success.
//!
//! At its next start an application leases the items ([`crate::ServiceHandle::resume`]) and
//! acknowledges each once it has taken it over for good. Until then a crash loses nothing: the
//! lease rules (one pure function every store calls) offer the item again once its holder is gone. So every item is
//! resumed at least once and acknowledged exactly once, and never held by two live owners at once.

pub(crate) mod file;
pub(crate) mod host;
pub(crate) mod lease;
mod store;

pub use file::{FileRecordStore, Sharing};
pub(crate) use lease::is_valid_item_id;
pub(crate) use lease::item_id;
pub use lease::{Lease, Owner};
pub use store::{ItemState, Leased, Persisted, RecordFuture, RecordStore, ResumeItem};

/// The rules every record store follows, for a store written outside this crate (as the
/// PostgreSQL store, `planned-stop-postgres`, is): who may take an item and what a takeover
/// counts as, when a lease ends, which ids and items may be stored, and whether an owner on this
/// host still runs. `testing::check_conformance` holds a store to the same rules.
pub mod rules {
    pub use super::host::liveness_here;
    pub use super::lease::{Liveness, failure_at_takeover, is_offered, is_valid_item_id};
    pub use super::store::{checked_item, lease_end};
}

use crate::lifecycle::{StopCause, StopVerdict};
use crate::outcome::DrainSummary;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::PathBuf;

/// The file name of the record inside the state directory.
pub(crate) const RECORD_FILE_NAME: &str = "planned-stop-record.json";

/// Largest record read back, in bytes; a larger file is refused rather than loaded.
pub(crate) const MAX_RECORD_BYTES: u64 = 16 << 20;

/// The largest item a drain participant may hand back, in bytes of its compact JSON encoding
/// (1 MiB). Checked where the runner accepts a drain's report, the same for every store, and
/// every store reads back whatever fits: an item over it is never written and never silently
/// dropped — the stop ends `record_lost`, with the item in its ERROR log line.
pub const MAX_ITEM_BYTES: usize = 1 << 20;

/// The size of `item`'s compact JSON encoding when it is over [`MAX_ITEM_BYTES`], `None` when it
/// fits: the size half of [`unstorable`], which everything outside calls.
pub(crate) fn oversized(item: &serde_json::Value) -> Option<usize> {
    /// Counts bytes without keeping them.
    struct Count(usize);
    impl io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, item);
    (count.0 > MAX_ITEM_BYTES).then_some(count.0)
}

/// Why no record store may hold `item`, or `None` when every one can: its compact JSON is over
/// [`MAX_ITEM_BYTES`], or one of its strings (or keys) holds a NUL character, which PostgreSQL's
/// `jsonb` cannot store. The one rule of what an item may be: the runner applies it where it
/// accepts a drain's report (such an item ends the stop `record_lost`, with the item in its ERROR
/// log line) and every store before it writes, so no store holds what another would refuse.
///
/// ```
/// use planned_stop::record::unstorable;
/// assert_eq!(unstorable(&serde_json::json!({"job": 7})), None);
/// assert!(unstorable(&serde_json::json!({"name": "a\u{0}b"})).unwrap().contains("NUL"));
/// assert!(unstorable(&serde_json::json!({"a\u{0}": 1})).is_some(), "keys too");
/// ```
pub fn unstorable(item: &serde_json::Value) -> Option<String> {
    if let Some(size) = oversized(item) {
        return Some(format!(
            "{size} bytes of JSON, over the limit of {MAX_ITEM_BYTES} (MAX_ITEM_BYTES)"
        ));
    }
    // Depth-first without recursion: a value built in code may nest deeper than any stack. The
    // item itself is looked at before the stack is used: a scalar allocates nothing (a stop
    // may check a hundred thousand of them).
    let mut stack = Vec::new();
    let mut first = Some(item);
    while let Some(value) = first.take().or_else(|| stack.pop()) {
        match value {
            serde_json::Value::String(s) if s.contains('\0') => {
                return Some(
                    "a string holding a NUL character (\\u0000), which PostgreSQL's \
                    jsonb cannot store"
                        .to_owned(),
                );
            }
            serde_json::Value::Array(items) => stack.extend(items),
            serde_json::Value::Object(map) => {
                if map.keys().any(|k| k.contains('\0')) {
                    return Some(
                        "a key holding a NUL character (\\u0000), which PostgreSQL's \
                        jsonb cannot store"
                            .to_owned(),
                    );
                }
                stack.extend(map.values());
            }
            _ => {}
        }
    }
    None
}

/// Work a drain participant left unfinished: data the next start can act on.
///
/// ```
/// # use planned_stop::DrainReport;
/// # use planned_stop::record::Unfinished;
/// #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
/// struct Job { id: u32, attempt: u8 }
/// // A participant hands back typed items; the next start reads them back as the same type.
/// let report = DrainReport::unfinished([Job { id: 7, attempt: 2 }]);
/// let item: &serde_json::Value = &report.unfinished_items()[0];
/// let job: Job = serde_json::from_value(item.clone())?;
/// assert_eq!(job, Job { id: 7, attempt: 2 });
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Unfinished {
    /// The item's id in the record store: given by the runner when the stop is recorded, or the
    /// id it had when it was resumed and handed back again ([`crate::DrainReport::with_handed_back`]).
    /// `None` only in records of an earlier version.
    #[serde(default)]
    pub id: Option<String>,
    /// The participant's name, as registered.
    pub participant: String,
    /// The item as the participant handed it back: any JSON value (a job id string, an object).
    pub item: serde_json::Value,
    /// `true` when the item was resumed from the record store and is handed back under the id
    /// the store gave it ([`crate::DrainReport::with_handed_back`]); `false` for new work. A store
    /// writes a handed-back item again only while the stopper still holds its lease: one that
    /// was acknowledged, dropped by an operator or taken by someone else meanwhile stays as it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resumed: bool,
    /// Why the item's attempt failed in this life, when it did (its task panicked): the store
    /// counts the failure ([`crate::record::ResumeItem::failures`]), and an item that failed too
    /// often is held aside for a person instead of being offered again. `None` for an item
    /// handed back by a planned stop: a deploy is not a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

impl Unfinished {
    /// New work left by `participant` (the runner gives it its id at the stop).
    pub fn new(participant: impl Into<String>, item: serde_json::Value) -> Unfinished {
        Unfinished {
            id: None,
            participant: participant.into(),
            item,
            resumed: false,
            failure: None,
        }
    }

    /// A resumed item handed back under the id its store gave it.
    pub fn with_handed_back(item: &ResumeItem) -> Unfinished {
        Unfinished {
            id: Some(item.id.clone()),
            participant: item.participant.clone(),
            item: item.item.clone(),
            resumed: true,
            failure: None,
        }
    }

    /// The same item, its attempt in this life failed for `why` (its task panicked).
    #[must_use]
    pub fn failed(mut self, why: impl Into<String>) -> Unfinished {
        self.failure = Some(why.into());
        self
    }

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
    pub phase: crate::lifecycle::DrainPhase,
    /// How many participants it asked.
    pub participants: usize,
    /// When it began (the previous phase had answered or timed out).
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: DateTime<Utc>,
    /// `true` when it ended at its deadline with answers still missing.
    pub timed_out: bool,
}

/// What a stop left behind. Persisted once per process life by the runner; a file store keeps the
/// most recent one as a summary for people (the items themselves are kept one by one).
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// use planned_stop::record::FileRecordStore;
/// assert_eq!(FileRecordStore::read_last_stop(dir.path()).unwrap(), None, "no stop recorded yet");
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
    /// Work to resume at the next start. A store's summary for people
    /// ([`crate::record::RecordStore::last_stop`]) names the first [`SUMMARY_ITEMS`] and counts
    /// the rest in `unfinished_omitted`; the store holds every one.
    pub unfinished: Vec<Unfinished>,
    /// How many more unfinished items the stop left than `unfinished` names (0 in the runner's
    /// own record; a summary with many items leaves them out).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unfinished_omitted: usize,
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
    pub action: crate::schema::StopAction,
    /// The exit code the process ended with.
    pub exit_code: i32,
}

/// How many unfinished items a store's summary of a stop names; the rest are counted
/// (`StopRecord::unfinished_omitted`). The items themselves are in the store, every one: the
/// summary is for people, and a hundred thousand items would only make it slow to write.
pub const SUMMARY_ITEMS: usize = 100;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl StopRecord {
    /// How many items the stop left unfinished, those a summary leaves out included.
    pub fn unfinished_count(&self) -> usize {
        self.unfinished
            .len()
            .saturating_add(self.unfinished_omitted)
    }

    /// The record as every store keeps it for people (what [`RecordStore::last_stop`] answers):
    /// the first [`SUMMARY_ITEMS`] unfinished items named, the others counted.
    #[must_use]
    pub fn summary(&self) -> StopRecord {
        let shown = self.unfinished.len().min(SUMMARY_ITEMS);
        StopRecord {
            pid: self.pid,
            cause: self.cause,
            verdict: self.verdict,
            request_id: self.request_id.clone(),
            reason: self.reason.clone(),
            stopper_pid: self.stopper_pid,
            accepted_at: self.accepted_at,
            drain_deadline: self.drain_deadline,
            finished_at: self.finished_at,
            drained_in_time: self.drained_in_time,
            forced: self.forced,
            unfinished: self.unfinished[..shown].to_vec(),
            unfinished_omitted: self.unfinished_count() - shown,
            unanswered: self.unanswered.clone(),
            notes: self.notes.clone(),
            phases: self.phases.clone(),
            action: self.action,
            exit_code: self.exit_code,
        }
    }
}

/// Why a record could not be read or written.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// std::fs::write(dir.path().join("planned-stop-record.json"), b"{").unwrap();
/// let err = planned_stop::record::FileRecordStore::read_last_stop(dir.path()).unwrap_err();
/// assert!(matches!(err, planned_stop::record::RecordError::Invalid { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    /// A file operation failed.
    #[error("cannot {op} {path}")]
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
    /// The state directory cannot be used, or writing failed in the atomic write.
    #[error(transparent)]
    Write(#[from] crate::store::StoreError),
    /// Another process held the state directory's lock for too long.
    #[error(
        "the state directory's lock {path} was held by another process for {waited:?}; \
         find it with `fuser {path}` (or stop it) and try again",
        path = path.display()
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// How long this process waited.
        waited: std::time::Duration,
    },
    /// No such item (acknowledged already, removed by an operator, or never stored).
    #[error("no resume item {id}")]
    UnknownItem {
        /// The item id.
        id: String,
    },
    /// The caller does not hold the item's lease.
    #[error("resume item {id} is not leased by this process (holder: {})", holder.as_deref().unwrap_or("nobody: it is pending"))]
    NotHolder {
        /// The item id.
        id: String,
        /// Who holds it, if anyone.
        holder: Option<String>,
    },
    /// The database (or another remote store) could not be reached or refused the operation.
    /// Build it with [`RecordError::backend`] or [`RecordError::backend_caused_by`].
    #[error("the record store failed: {message}")]
    Backend {
        /// What went wrong, with what to do (the cause, if any, is the source).
        message: String,
        /// The error the backend reported (the driver's, the I/O error), kept whole so a caller
        /// can look into it; `None` when the store itself decided (a timeout, a schema it cannot
        /// read).
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
}

// How a stop record is summarized in its outcome file: the bounds are the outcome's rule
// (`DrainSummary::new`), what is summarized the record's.
impl From<&StopRecord> for DrainSummary {
    fn from(record: &StopRecord) -> DrainSummary {
        DrainSummary::new(
            record.drained_in_time,
            record.forced,
            record.unanswered.iter().map(String::as_str),
            record
                .notes
                .iter()
                .map(|n| format!("{}: {}", n.participant, n.note)),
            record.unfinished.len(),
        )
    }
}

impl RecordError {
    /// A backend failure the store decided itself: `message` says what went wrong and what to do.
    pub fn backend(message: impl Into<String>) -> RecordError {
        RecordError::Backend {
            message: message.into(),
            source: None,
        }
    }

    /// A backend failure with the error the backend reported as its source; `message` says what
    /// was being done (the source's text is not repeated in it).
    pub fn backend_caused_by(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> RecordError {
        RecordError::Backend {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}

/// What is wrong with a file that does not parse, without a word of its contents: serde_json's
/// own message can quote the input ("invalid type: string \"…\"").
pub(crate) fn json_problem(e: &serde_json::Error) -> String {
    format!(
        "not valid JSON of this kind ({:?} error at line {}, column {})",
        e.classify(),
        e.line(),
        e.column()
    )
}

#[cfg(test)]
mod tests;

//! The outcome file: the runner's answer to a stopper, next to the marker slot.
//!
//! A stopper that knows only the marker directory and the target's pid must be able to tell "not
//! seen yet" from "accepted, draining" from "stopped as planned". So the runner writes
//! `DIR/planned-stop-<PID>.outcome.json` twice, atomically: when it accepts a stop (state
//! `draining`: request id, acceptance time, drain deadline) and when it has stopped (state `stopped`:
//! verdict and exit code). The file carries the process's start fingerprint, so a stopper never
//! mistakes the outcome of an earlier process with the same pid for its target's.
//!
//! Outcome files of processes that are gone are removed by the sweep once older than the TTL.
//!
//! Before any stop, the runner announces that it watches the directory:
//! `DIR/planned-stop-<PID>.watching.json`, a [`Presence`], written when it starts and removed when
//! it has stopped. A stopper that finds neither a presence nor an outcome file of its target's
//! identity can say at once that the target has not announced watching this directory, the usual
//! sign of a wrong directory or a process that is not a planned-stop service; a stop that would
//! also signal is refused then. Because a stopper acts on these files, one counts only when the
//! named process's own user (or root) wrote it ([`may_speak_for`]): a directory another user can
//! write must not let that user choose whom a stopper signals or kills.

use crate::identity::ProcessIdentity;
use crate::schema::StopAction;
use crate::stop::{ProcessState, StopCause, StopVerdict};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Whether a file in the marker directory, owned by the uid `owner`, may speak for the process it
/// names, whose `process_users` may signal it (its real and saved uids, as kill(2) decides;
/// `None`: gone, or its uids cannot be read): a presence
/// or outcome file says who watches and how a stop went, and a stopper acts on that (whom it
/// signals or kills, whether a stop counts as done). A directory another user can write must
/// not let that user choose whom the stopper signals or kills, so only a file the process's own
/// user wrote counts, or root's. For a process that is gone only `reader`'s own files (and
/// root's) count. Where files have no owner uid (Windows: the directory's ACL decides), every
/// file counts.
///
/// ```
/// use planned_stop_protocol::outcome::may_speak_for;
/// assert!(may_speak_for(Some(1000), Some(&[1000]), 0), "the process's own user");
/// assert!(may_speak_for(Some(0), Some(&[1000]), 1000), "root's");
/// assert!(!may_speak_for(Some(65534), Some(&[0]), 0), "another user's file about a root process");
/// assert!(!may_speak_for(Some(65534), None, 0), "about a process that is gone");
/// assert!(may_speak_for(Some(1000), None, 1000), "the reader's own");
/// assert!(may_speak_for(None, None, 0), "no owner uids on this OS");
/// ```
pub fn may_speak_for(owner: Option<u32>, process_users: Option<&[u32]>, reader: u32) -> bool {
    match (owner, process_users) {
        (None, _) | (Some(0), _) => true,
        (Some(owner), Some(users)) => users.contains(&owner),
        (Some(owner), None) => owner == reader,
    }
}

/// Largest outcome file read, in bytes.
pub(crate) const MAX_OUTCOME_BYTES: usize = 16 * 1024;

/// A runner's announcement that it watches the directory for its markers.
///
/// ```
/// let bytes = br#"{"pid":4,"start":9,"since":"2026-11-30T12:00:00Z"}"#;
/// let presence = planned_stop_protocol::stopper::Presence::parse(bytes).unwrap();
/// assert_eq!((presence.pid, presence.start), (4, 9));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Presence {
    /// The process.
    pub pid: u32,
    /// Its start fingerprint ([`ProcessIdentity::start`]).
    pub start: u64,
    /// When it started watching.
    pub since: DateTime<Utc>,
}

impl Presence {
    /// The announcement of the process `identity`, watching since `since`.
    #[doc(hidden)] // the service's side, for planned-stop's own crates: what only a running service may say
    pub fn new(identity: &ProcessIdentity, since: DateTime<Utc>) -> Presence {
        Presence {
            pid: identity.pid,
            start: identity.start,
            since,
        }
    }

    /// Whether this announcement was written by the process `identity` (not an earlier one with
    /// its pid).
    pub fn is_from(&self, identity: &ProcessIdentity) -> bool {
        self.pid == identity.pid && self.start == identity.start
    }

    /// Parses a presence file's bytes; `None` for anything that is not one.
    ///
    /// ```
    /// assert_eq!(planned_stop_protocol::stopper::Presence::parse(b"[]"), None);
    /// ```
    pub fn parse(bytes: &[u8]) -> Option<Presence> {
        parse_bounded(bytes)
    }
}

/// The runner's acknowledgement and final outcome.
///
/// ```
/// let bytes = br#"{"pid":4,"start":9,"phase":"stopped","cause":{"kind":"marker"},"verdict":"planned","request_id":null,"accepted_at":"2026-11-30T12:00:00Z","drain_deadline":"2026-11-30T12:00:10Z","finished_at":"2026-11-30T12:00:01Z","exit_code":0}"#;
/// let outcome = planned_stop_protocol::stopper::Outcome::parse(bytes).unwrap();
/// assert_eq!(outcome.exit_code, Some(0));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Outcome {
    /// The process.
    pub pid: u32,
    /// Its start fingerprint ([`ProcessIdentity::start`]).
    pub start: u64,
    /// How far the stop has got. Its key in the file is `phase`, as it always was.
    #[serde(rename = "phase")]
    pub state: ProcessState,
    /// What started the stop.
    pub cause: StopCause,
    /// Planned or unexpected.
    pub verdict: StopVerdict,
    /// The request id of the marker that was acted on, if any.
    pub request_id: Option<String>,
    /// When the stop was accepted.
    pub accepted_at: DateTime<Utc>,
    /// When the drain is due to end.
    pub drain_deadline: DateTime<Utc>,
    /// When the process stopped (state `stopped`).
    pub finished_at: Option<DateTime<Utc>>,
    /// The exit code (state `stopped`).
    pub exit_code: Option<i32>,
    /// `true` when the record store's own place could not be reached and the unfinished items
    /// were kept on the process's host instead, to be pushed at the next start there (a
    /// database store's spill directory). Absent (false) otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spilled: bool,
    /// How the drain went, in a final outcome (`stopped`, `record_lost`): whether a stopper may
    /// call it clean. Absent in the other states and from earlier versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSummary>,
    /// What the accepted request asked for: `restart` when the stop is a planned restart; absent
    /// (a stop) otherwise, and from earlier versions. A stopper repeating a restart request
    /// toward a target that is gone tells from it whether the target restarted or stopped for
    /// good.
    #[serde(default, skip_serializing_if = "is_stop")]
    pub action: StopAction,
    /// The successor's pid, once a restart in place has handed over to it: it serves now, and
    /// the process stops as planned. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub successor: Option<u32>,
    /// Why a restart in place did not happen (state `restart_failed`). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

fn is_stop(action: &StopAction) -> bool {
    *action == StopAction::Stop
}

/// How a drain went, as the final outcome tells a stopper: enough to tell a clean drain from one
/// that lost in-memory work (a participant that never answered or panicked, requests cut at a
/// deadline, a forced stop). Bounded, so the outcome file stays within its 16 KiB bound.
///
/// ```
/// let summary: planned_stop_protocol::stopper::DrainSummary = serde_json::from_str(
///     r#"{"in_time":false,"forced":false,"unanswered":["jobs"],"notes":[],"note_count":0,"handed_back":0}"#,
/// ).unwrap();
/// assert!(!summary.is_clean());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DrainSummary {
    /// Every participant answered before its phase's deadline, none cut work, nobody forced.
    pub in_time: bool,
    /// Cut short by a force (a second Ctrl-C, `StopRequest::Force`).
    pub forced: bool,
    /// Participants that never answered, or whose mailbox closed before they could (a panic
    /// in their `Drain` handler): the work they held in memory is unknown. At most
    /// [`DrainSummary::MAX_LISTED`] names of at most [`DrainSummary::MAX_TEXT`] characters.
    pub unanswered: Vec<String>,
    /// The drain's notes (requests cut at a deadline, items not recorded), as
    /// `participant: note`: the first [`DrainSummary::MAX_LISTED`], each cut to
    /// [`DrainSummary::MAX_TEXT`] characters.
    pub notes: Vec<String>,
    /// How many notes there were in all.
    pub note_count: usize,
    /// How many unfinished items were handed back to be resumed.
    pub handed_back: usize,
}

impl DrainSummary {
    /// The most names or notes listed.
    pub const MAX_LISTED: usize = 16;
    /// The most characters of one name or note.
    pub const MAX_TEXT: usize = 200;

    /// A summary, bounded: at most [`Self::MAX_LISTED`] names and notes of at most
    /// [`Self::MAX_TEXT`] characters each (one rule for every writer).
    pub fn new<'a>(
        in_time: bool,
        forced: bool,
        unanswered: impl IntoIterator<Item = &'a str>,
        notes: impl ExactSizeIterator<Item = String>,
        handed_back: usize,
    ) -> DrainSummary {
        let cut = |text: &str| text.chars().take(Self::MAX_TEXT).collect::<String>();
        let note_count = notes.len();
        DrainSummary {
            in_time,
            forced,
            unanswered: unanswered
                .into_iter()
                .take(Self::MAX_LISTED)
                .map(cut)
                .collect(),
            notes: notes.take(Self::MAX_LISTED).map(|n| cut(&n)).collect(),
            note_count,
            handed_back,
        }
    }

    /// Whether the drain lost nothing it was told of: every participant answered in time, no
    /// work was cut, the stop was not forced. Items handed back are not a loss: they resume.
    pub fn is_clean(&self) -> bool {
        self.in_time && !self.forced && self.unanswered.is_empty()
    }
}

impl Outcome {
    /// The outcome of a stop `own` accepted at `accepted_at`, draining until `drain_deadline`:
    /// the one literal every outcome a process writes starts from (its writer sets the request,
    /// the action, and later the state it reached).
    #[doc(hidden)] // the service's side, for planned-stop's own crates: what only a running service may say
    pub fn accepted(
        own: &ProcessIdentity,
        cause: StopCause,
        verdict: StopVerdict,
        accepted_at: DateTime<Utc>,
        drain_deadline: DateTime<Utc>,
    ) -> Outcome {
        Outcome {
            pid: own.pid,
            start: own.start,
            state: ProcessState::Draining,
            cause,
            verdict,
            request_id: None,
            accepted_at,
            drain_deadline,
            finished_at: None,
            exit_code: None,
            spilled: false,
            drain: None,
            action: StopAction::default(),
            successor: None,
            note: None,
        }
    }

    /// This outcome, ended in `state` at `finished_at` with the process's exit `code`.
    #[doc(hidden)] // the service's side, for planned-stop's own crates: what only a running service may say
    pub fn concluded(self, state: ProcessState, finished_at: DateTime<Utc>, code: i32) -> Outcome {
        Outcome {
            state,
            finished_at: Some(finished_at),
            exit_code: Some(code),
            ..self
        }
    }

    /// Whether this outcome was written by the process `identity` (not an earlier one with its pid).
    pub fn is_from(&self, identity: &ProcessIdentity) -> bool {
        self.pid == identity.pid && self.start == identity.start
    }

    /// Parses an outcome file's bytes; `None` for anything that is not one.
    ///
    /// ```
    /// assert_eq!(planned_stop_protocol::stopper::Outcome::parse(b"{}"), None);
    /// ```
    pub fn parse(bytes: &[u8]) -> Option<Outcome> {
        parse_bounded(bytes)
    }
}

/// The JSON value in `bytes`, if it is one and within [`MAX_OUTCOME_BYTES`].
fn parse_bounded<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    if bytes.len() > MAX_OUTCOME_BYTES {
        return None;
    }
    serde_json::from_slice(bytes).ok()
}

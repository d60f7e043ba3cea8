//! The one decision: what a process does with what it found at its marker slot.
//!
//! The watcher's probe, the runner's claim, the sweep and `planned-stop inspect` all ask the same
//! question, so all of them call [`decide`], and none of them re-implements a rule. The function is
//! pure: what was read, who we are, the time and the policy go in; a [`Judgement`] comes out. Tests move
//! `now` instead of sleeping, and the fuzzer can call it a million times a second.
//!
//! The rules, in the order they are applied:
//!
//! | found | judgement | the store then |
//! |---|---|---|
//! | no file | [`Judgement::Absent`] | — |
//! | a read error (permission, sharing violation) | no decision ([`Undecided`]) | retries next tick |
//! | not a regular file, or bytes [`Marker::parse`] refuses | [`Judgement::Malformed`] | removes it |
//! | written more than the TTL ago, or more than the skew in the future | [`Judgement::Stale`] | removes it |
//! | names another pid | [`Judgement::Foreign`] | leaves it |
//! | names our pid with another fingerprint, or written before we started (less the slack) | [`Judgement::Stale`] | removes it |
//! | names our pid and fingerprint (or none), written no earlier than our start less the slack | [`Judgement::ForSelf`] | fires |
//!
//! The start-slack rule applies to every marker: none fires when it was written earlier than
//! [`Policy::start_slack`] before this process started (the wall-clock start time is known to
//! about a second). For a marker without a fingerprint it is the whole defence — there is no
//! pid-only match — so a dead predecessor's marker never stops its pid's next owner.

use crate::identity::ProcessIdentity;
use crate::schema::{Marker, MarkerError};
use chrono::{DateTime, TimeDelta, Utc};
use std::time::Duration;

/// The thresholds of the decision. The defaults are safe for a local stopper; raise the TTL for a
/// slow one, and the skew where the stopper's clock may be ahead of ours (another host on a shared
/// volume).
///
/// ```
/// let policy = planned_stop_protocol::marker::Policy::default();
/// assert_eq!((policy.ttl.as_secs(), policy.future_skew.as_secs(), policy.start_slack.as_secs()), (60, 5, 2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a builder or value that is dropped configures nothing"]
pub struct Policy {
    /// A marker older than this is stale. Default 60 s.
    pub ttl: Duration,
    /// A marker dated further in the future than this is stale. Default 5 s.
    pub future_skew: Duration,
    /// A marker without a fingerprint must be written no earlier than this before our start.
    /// Default 2 s (the wall-clock start time is known to about a second).
    pub start_slack: Duration,
}

impl Policy {
    /// A marker older than `ttl` is stale.
    pub fn with_ttl(mut self, ttl: Duration) -> Policy {
        self.ttl = ttl;
        self
    }

    /// A marker dated more than `skew` in the future is stale.
    pub fn with_future_skew(mut self, skew: Duration) -> Policy {
        self.future_skew = skew;
        self
    }

    /// How long before our start a marker without a fingerprint may have been written.
    pub fn with_start_slack(mut self, slack: Duration) -> Policy {
        self.start_slack = slack;
        self
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            ttl: Duration::from_secs(60),
            future_skew: Duration::from_secs(5),
            start_slack: Duration::from_secs(2),
        }
    }
}

/// What was found at a slot, as the store read it (at most one byte more than
/// [`crate::schema::MAX_MARKER_BYTES`]).
#[derive(Debug, Clone, Copy)]
pub enum SlotContent<'a> {
    /// Nothing at the slot path.
    Absent,
    /// A regular file with these contents (possibly truncated to the limit plus one byte).
    Bytes(&'a [u8]),
    /// Something that is not a regular file; it is never opened, let alone followed.
    NotAFile(FileKind),
    /// The slot exists but could not be read this time.
    Unreadable(std::io::ErrorKind),
}

/// The kind of a non-regular file found at a slot.
///
/// ```
/// use planned_stop_protocol::Layout;
/// use planned_stop_protocol::marker::{FileKind, Malformed, MarkerStore, Judgement};
/// # let dir = tempfile::tempdir()?;
/// let store = MarkerStore::open(Layout::Slots(dir.path().join("run")))?;
/// // Something that is not a marker file sits at process 42's slot: never a stop, never opened.
/// std::fs::create_dir(store.slot_path(42))?;
/// let v = store.inspect(42, chrono::Utc::now());
/// assert!(matches!(v, Ok(Judgement::Malformed(Malformed::NotAFile(FileKind::Directory)))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A symbolic link (never followed).
    Symlink,
    /// A directory.
    Directory,
    /// A FIFO, socket or device (never opened for reading: a FIFO would block).
    Special,
}

/// The decision for one slot.
///
/// ```
/// use planned_stop_protocol::ProcessIdentity;
/// use planned_stop_protocol::marker::{Marker, Policy, Judgement};
/// let me = ProcessIdentity::current().unwrap();
/// let now = chrono::Utc::now();
/// // In the single-file layout a marker for another process is left for it.
/// let bytes = Marker::new(me.pid.wrapping_add(1).max(1), None, now).to_json().unwrap();
/// assert!(matches!(Judgement::judge(&bytes, &me, now, &Policy::default()), Judgement::Foreign(_)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Judgement {
    /// No marker: keep running.
    Absent,
    /// Not a marker at all; remove it.
    Malformed(Malformed),
    /// A marker that can no longer mean what it says; remove it.
    Stale(Stale),
    /// A valid marker for another process; leave it alone.
    Foreign(Marker),
    /// A valid, fresh marker for this very process: stop as planned.
    ForSelf(Marker),
}

impl Judgement {
    /// What a process `own` concludes at `now` about `bytes` found at its marker slot: the same
    /// decision the service's watcher and runner make, without touching any file. For tools and
    /// tests that want to know how a marker will be judged before they put it in place.
    ///
    /// ```
    /// use chrono::{TimeDelta, Utc};
    /// use planned_stop_protocol::ProcessIdentity;
    /// use planned_stop_protocol::marker::{Marker, Policy, Judgement};
    ///
    /// let me = ProcessIdentity::current()?;
    /// let now = Utc::now();
    /// let fresh = Marker::new(me.pid, Some(me.start), now).to_json()?;
    /// assert!(matches!(Judgement::judge(&fresh, &me, now, &Policy::default()), Judgement::ForSelf(_)));
    /// // The same request two minutes later is stale, and a recycled pid is never ours.
    /// let later = now + TimeDelta::minutes(2);
    /// assert!(matches!(Judgement::judge(&fresh, &me, later, &Policy::default()), Judgement::Stale(_)));
    /// let reused = Marker::new(me.pid, Some(me.start + 1), now).to_json()?;
    /// assert!(matches!(Judgement::judge(&reused, &me, now, &Policy::default()), Judgement::Stale(_)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn judge(
        bytes: &[u8],
        own: &ProcessIdentity,
        now: DateTime<Utc>,
        policy: &Policy,
    ) -> Judgement {
        match Marker::parse(bytes) {
            Ok(marker) => judge(marker, own, now, policy),
            Err(e) => Judgement::Malformed(e.into()),
        }
    }

    /// `true` for the judgements after which the slot file should be removed.
    ///
    /// ```
    /// use planned_stop_protocol::marker::Judgement;
    /// assert!(!Judgement::Absent.is_removable());
    /// ```
    pub fn is_removable(&self) -> bool {
        matches!(self, Judgement::Malformed(_) | Judgement::Stale(_))
    }

    /// A short lower-case name, as `inspect --json` prints it.
    ///
    /// ```
    /// assert_eq!(planned_stop_protocol::marker::Judgement::Absent.kind(), "absent");
    /// ```
    pub fn kind(&self) -> &'static str {
        match self {
            Judgement::Absent => "absent",
            Judgement::Malformed(_) => "malformed",
            Judgement::Stale(_) => "stale",
            Judgement::Foreign(_) => "foreign",
            Judgement::ForSelf(_) => "for_self",
        }
    }
}

/// Why a slot holds no marker.
///
/// ```
/// use planned_stop_protocol::ProcessIdentity;
/// use planned_stop_protocol::marker::{Malformed, Policy, Judgement};
/// let me = ProcessIdentity::current().unwrap();
/// let v = Judgement::judge(b"{}", &me, chrono::Utc::now(), &Policy::default());
/// assert!(matches!(v, Judgement::Malformed(Malformed::Content(_))));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Malformed {
    /// The slot is not a regular file.
    #[error("the slot is a {0:?}, not a regular file")]
    NotAFile(FileKind),
    /// The contents break the schema.
    #[error(transparent)]
    Content(#[from] MarkerError),
}

/// Why a well-formed marker no longer applies.
///
/// ```
/// use planned_stop_protocol::ProcessIdentity;
/// use planned_stop_protocol::marker::{Marker, Policy, Stale, Judgement};
/// let me = ProcessIdentity::current().unwrap();
/// let old = chrono::Utc::now() - chrono::TimeDelta::minutes(5);
/// let bytes = Marker::new(me.pid, Some(me.start), old).to_json().unwrap();
/// let v = Judgement::judge(&bytes, &me, chrono::Utc::now(), &Policy::default());
/// assert!(matches!(v, Judgement::Stale(Stale::Expired { .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Stale {
    /// Written more than the TTL ago.
    #[error("written {age_secs} s ago, past the {ttl_secs} s time-to-live")]
    Expired {
        /// Age in whole seconds.
        age_secs: i64,
        /// The policy's TTL in seconds.
        ttl_secs: u64,
    },
    /// Dated too far in the future (a wrong clock, or a forgery that would never expire).
    #[error("dated {ahead_secs} s in the future, past the {skew_secs} s allowed skew")]
    FromTheFuture {
        /// How far ahead, in whole seconds.
        ahead_secs: i64,
        /// The policy's skew in seconds.
        skew_secs: u64,
    },
    /// Names our pid but another start fingerprint: meant for an earlier process with this pid.
    #[error("meant for an earlier process with pid {pid} (start {theirs}, ours {ours})")]
    OtherIncarnation {
        /// The pid, ours.
        pid: u32,
        /// The fingerprint in the marker.
        theirs: u64,
        /// Our fingerprint.
        ours: u64,
    },
    /// The process that owns the slot is no longer running (only an inspection by someone other than the owner says this: [`crate::store::MarkerStore::inspect`], `entries` and `sweep`).
    #[error("process {pid}, which the marker is for, is no longer running")]
    OwnerGone {
        /// The owner's pid.
        pid: u32,
    },
    /// Names our pid but was written before this process started.
    #[error("written at {written_at}, before this process started at {started_at}")]
    BeforeOurStart {
        /// The marker's time.
        written_at: DateTime<Utc>,
        /// Our start time.
        started_at: DateTime<Utc>,
    },
}

/// No decision this time: the slot exists but could not be read (retry on the next tick; never take
/// it as absent, never as a stop).
///
/// ```
/// let e = planned_stop_protocol::marker::Undecided(std::io::ErrorKind::PermissionDenied);
/// assert!(e.to_string().contains("will retry"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the marker slot could not be read ({0}); will retry")]
pub struct Undecided(pub std::io::ErrorKind);

/// Decides what `own` does with `found` at time `now` under `policy`. See the module docs for the
/// rules; this is the only place they live.
pub fn decide(
    found: SlotContent<'_>,
    own: &ProcessIdentity,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<Judgement, Undecided> {
    match read_marker(found)? {
        Ok(marker) => Ok(judge(marker, own, now, policy)),
        Err(judgement) => Ok(judgement),
    }
}

/// The judgement the *owner* of a slot would reach, for a process that is not the owner: the sweep,
/// `planned-stop inspect` and `status`. The owner is `slot_owner` when the layout names it (one slot
/// per pid), else the pid the marker names (the single shared file). `lookup` reads the owner's
/// identity ([`ProcessIdentity::of`] in production); an owner that is gone makes the marker
/// [`Stale::OwnerGone`], since nobody is left to act on it.
pub fn decide_as_owner(
    found: SlotContent<'_>,
    slot_owner: Option<u32>,
    lookup: impl FnOnce(u32) -> Option<ProcessIdentity>,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<Judgement, Undecided> {
    let marker = match read_marker(found)? {
        Ok(marker) => marker,
        Err(judgement) => return Ok(judgement),
    };
    let pid = slot_owner.unwrap_or(marker.target_pid);
    match lookup(pid) {
        Some(owner) => Ok(judge(marker, &owner, now, policy)),
        None => Ok(Judgement::Stale(Stale::OwnerGone { pid })),
    }
}

/// The part of the decision that needs no identity: a parsed marker, or the judgement that ends it.
fn read_marker(found: SlotContent<'_>) -> Result<Result<Marker, Judgement>, Undecided> {
    let bytes = match found {
        SlotContent::Absent => return Ok(Err(Judgement::Absent)),
        SlotContent::Unreadable(kind) => return Err(Undecided(kind)),
        SlotContent::NotAFile(kind) => {
            return Ok(Err(Judgement::Malformed(Malformed::NotAFile(kind))));
        }
        SlotContent::Bytes(bytes) => bytes,
    };
    Ok(Marker::parse(bytes).map_err(|e| Judgement::Malformed(e.into())))
}

/// How a fingerprint written in centiseconds since the Unix epoch (`round(create_time × 100)`,
/// what the earlier planned-stop system's stoppers write on macOS and Windows) is matched against
/// this process's start time, so those stoppers can stop a planned-stop target. Not on Linux, where
/// both sides read the same `/proc` ticks and nothing but the exact value is accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CentisecondForm {
    /// Only the exact fingerprint.
    Refused,
    /// Also centiseconds within `tolerance` of our start time (which is exact here).
    Within { tolerance: u64 },
    /// Also centiseconds in the same second as our start time (known to the second here).
    SameSecond,
}

/// The rule on this OS: Windows knows the start to 100 ns (±1 centisecond for the other side's
/// rounding); macOS and the BSDs to the second (sysinfo); Linux needs no alternative.
pub(crate) const CENTISECOND_FORM: CentisecondForm = if cfg!(windows) {
    CentisecondForm::Within { tolerance: 1 }
} else if cfg!(target_os = "linux") {
    CentisecondForm::Refused
} else {
    CentisecondForm::SameSecond
};

impl CentisecondForm {
    /// Whether `theirs` is `own`'s start time written in centiseconds since the Unix epoch.
    pub(crate) fn matches(self, theirs: u64, own: &ProcessIdentity) -> bool {
        let ours_ms = own.started_at.timestamp_millis();
        let Ok(ours_ms) = u64::try_from(ours_ms) else {
            return false;
        };
        match self {
            CentisecondForm::Refused => false,
            // Our start rounded to the centisecond, as the other side rounds.
            CentisecondForm::Within { tolerance } => {
                (ours_ms + 5) / 10 <= theirs.saturating_add(tolerance)
                    && theirs <= (ours_ms + 5) / 10 + tolerance
            }
            CentisecondForm::SameSecond => theirs / 100 == ours_ms / 1000,
        }
    }
}

/// The rules for a well-formed marker.
fn judge(marker: Marker, own: &ProcessIdentity, now: DateTime<Utc>, policy: &Policy) -> Judgement {
    let age = now.signed_duration_since(marker.written_at);
    if age > delta(policy.ttl) {
        return Judgement::Stale(Stale::Expired {
            age_secs: age.num_seconds(),
            ttl_secs: policy.ttl.as_secs(),
        });
    }
    if -age > delta(policy.future_skew) {
        return Judgement::Stale(Stale::FromTheFuture {
            ahead_secs: (-age).num_seconds(),
            skew_secs: policy.future_skew.as_secs(),
        });
    }
    if marker.target_pid != own.pid {
        return Judgement::Foreign(marker);
    }
    if let Some(theirs) = marker.target_start_time
        && theirs != own.start
        && !CENTISECOND_FORM.matches(theirs, own)
    {
        return Judgement::Stale(Stale::OtherIncarnation {
            pid: own.pid,
            theirs,
            ours: own.start,
        });
    }
    let earliest = own
        .started_at
        .checked_sub_signed(delta(policy.start_slack))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    if marker.written_at < earliest {
        return Judgement::Stale(Stale::BeforeOurStart {
            written_at: marker.written_at,
            started_at: own.started_at,
        });
    }
    Judgement::ForSelf(marker)
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

#[cfg(test)]
mod tests;

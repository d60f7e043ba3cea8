//! The lease rules: who may take a resume item, and when, decided in one place for every backend.
//!
//! An item left by a stop is *pending* until a later start leases it; the lease names its owner
//! (host, pid, start fingerprint) and an expiry. The owner acknowledges the item once it has taken
//! the work over for good, and only then is the item gone. Until then a crash loses nothing: an item
//! whose owner is known dead is offered again at once, and one whose owner cannot be checked (it
//! runs on another host) once its lease has expired. An owner known alive keeps its items for as
//! long as it lives, so an item is never handed to two live owners at the same time.
//!
//! Every backend ([`crate::record::FileRecordStore`], and any other [`crate::record::RecordStore`])
//! calls [`is_offered`] and [`holds`]; nothing else decides. The rules are pure: whether an owner
//! still runs is asked of this host's process table by `host.rs`, and handed in as [`Liveness`].

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Who holds a lease: one process life on one host.
///
/// ```
/// let owner = planned_stop::record::Owner::new("web-1", 4242, 123_456);
/// assert_eq!(owner.to_string(), "pid 4242 (start 123456) on web-1");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Owner {
    /// The host name, as the owner read it at start-up.
    pub host: String,
    /// The process id.
    pub pid: u32,
    /// The process's start fingerprint ([`crate::ProcessIdentity::start`]).
    pub start: u64,
}

/// Whether a lease's owner still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Liveness {
    /// It runs: its items stay its own.
    Alive,
    /// It is gone (or its pid belongs to another process now): its items are offered again.
    Dead,
    /// It cannot be checked from here (another host): its lease's expiry decides.
    Unknown,
}

impl Owner {
    /// An owner from its parts.
    pub fn new(host: impl Into<String>, pid: u32, start: u64) -> Owner {
        Owner {
            host: host.into(),
            pid,
            start,
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pid {} (start {}) on {}",
            self.pid, self.start, self.host
        )
    }
}

/// A lease on one item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Lease {
    /// Who holds it.
    pub owner: Owner,
    /// When it was taken.
    pub leased_at: DateTime<Utc>,
    /// When it lapses, for an owner whose liveness cannot be checked.
    pub expires_at: DateTime<Utc>,
}

impl Lease {
    /// A lease for `owner` from `now` until `expires_at`.
    pub fn new(owner: Owner, now: DateTime<Utc>, expires_at: DateTime<Utc>) -> Lease {
        Lease {
            owner,
            leased_at: now,
            expires_at,
        }
    }
}

/// Whether an item under `lease` may be leased now: a pending item may; a leased one when its
/// owner is dead, or cannot be checked and its lease has expired. An owner known alive keeps it.
///
/// ```
/// use planned_stop::internals::{Liveness, is_offered};
/// use planned_stop::record::{Lease, Owner};
/// let now = chrono::Utc::now();
/// let lease = Lease::new(Owner::new("h", 7, 1), now, now + chrono::TimeDelta::seconds(30));
/// assert!(is_offered(None, now, Liveness::Alive), "pending");
/// assert!(!is_offered(Some(&lease), now, Liveness::Alive));
/// assert!(is_offered(Some(&lease), now, Liveness::Dead));
/// assert!(!is_offered(Some(&lease), now, Liveness::Unknown), "not expired yet");
/// assert!(is_offered(Some(&lease), lease.expires_at, Liveness::Unknown));
/// ```
pub fn is_offered(lease: Option<&Lease>, now: DateTime<Utc>, owner: Liveness) -> bool {
    match (lease, owner) {
        (None, _) => true,
        (Some(_), Liveness::Alive) => false,
        (Some(_), Liveness::Dead) => true,
        (Some(lease), Liveness::Unknown) => now >= lease.expires_at,
    }
}

/// The failed attempt an item offered again under a lease counts, told for the operator: the
/// life `previous` names ended without handing the item back or completing it (`Dead`: killed
/// or crashed), or stopped renewing its lease (`Unknown`: gone, or cut off). `None` for an item
/// that was pending (a planned stop handed it back: no failure).
///
/// ```
/// use planned_stop::internals::{Liveness, failure_at_takeover};
/// use planned_stop::record::{Lease, Owner};
/// let now = chrono::Utc::now();
/// let lease = Lease::new(Owner::new("h", 7, 1), now, now);
/// assert!(failure_at_takeover(None, Liveness::Dead).is_none(), "pending: no failure");
/// let why = failure_at_takeover(Some(&lease), Liveness::Dead).unwrap();
/// assert!(why.contains("pid 7"), "{why}");
/// ```
pub fn failure_at_takeover(previous: Option<&Lease>, owner: Liveness) -> Option<String> {
    let lease = previous?;
    Some(match owner {
        Liveness::Dead => format!(
            "{} ended while holding it, without handing it back (killed or crashed)",
            lease.owner
        ),
        Liveness::Alive | Liveness::Unknown => format!(
            "{} stopped renewing its lease (it ended or was cut off from the store)",
            lease.owner
        ),
    })
}

/// Whether an item that failed `failures` times is held aside rather than resumed again, for a
/// service that allows at most `max_failed` failed attempts: it is, once it has used them all.
///
/// ```
/// use planned_stop::internals::is_held_aside;
/// assert!(!is_held_aside(0, 5));
/// assert!(!is_held_aside(4, 5));
/// assert!(is_held_aside(5, 5));
/// ```
pub fn is_held_aside(failures: u32, max_failed: u32) -> bool {
    failures >= max_failed
}

/// Whether `owner` holds `lease`, and so may acknowledge the item or hand it back. An owner whose
/// lease lapsed still holds it until someone else leases the item.
///
/// ```
/// use planned_stop::internals::holds;
/// use planned_stop::record::{Lease, Owner};
/// let now = chrono::Utc::now();
/// let me = Owner::new("h", 7, 1);
/// let lease = Lease::new(me.clone(), now, now);
/// assert!(holds(Some(&lease), &me));
/// assert!(!holds(Some(&lease), &Owner::new("h", 7, 2)), "another life of the pid");
/// assert!(!holds(None, &me), "a pending item is nobody's");
/// ```
pub fn holds(lease: Option<&Lease>, owner: &Owner) -> bool {
    lease.is_some_and(|l| l.owner == *owner)
}

/// Whether `id` may name an item: 1 to 128 characters of ASCII letters, digits, `-` and `_`
/// (item ids become file names and database keys).
///
/// ```
/// assert!(planned_stop::internals::is_valid_item_id("a1b2-0042-000003"));
/// assert!(!planned_stop::internals::is_valid_item_id("../x"));
/// assert!(!planned_stop::internals::is_valid_item_id(""));
/// ```
pub fn is_valid_item_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The id of the `index`-th item a stop left: unique per host, process life and stop, and in
/// order within one stop.
pub(crate) fn item_id(stopper: &Owner, stopped_at: DateTime<Utc>, index: usize) -> String {
    // FNV-1a: a short, stable tag for the host, so two hosts' pid-1 processes never share ids.
    let host = stopper
        .host
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let nanos = stopped_at.timestamp_nanos_opt().unwrap_or_default();
    format!(
        "{:08x}-{}-{}-{:x}-{index:06}",
        host as u32, stopper.pid, stopper.start, nanos
    )
}

//! The [`RecordStore`] contract: where a stop's unfinished work waits for the start that resumes it.
//!
//! A backend keeps three things: the items a stop left (each with a stable id), a lease per item
//! (who is resuming it), and the most recent stop's summary for people. It answers five
//! operations, each atomic with respect to every other caller, in this process or another:
//! persist, lease, acknowledge, release, remove. The file store in a state directory is the
//! default; any other backend (a database every replica reaches) implements the same trait and
//! passes the same conformance suite (`tests/records.rs`).
//!
//! The methods return boxed futures so a network backend can be asynchronous and the trait stays
//! usable as `Arc<dyn RecordStore>`; the file store does its (short, local) work when polled.

use super::lease::{Lease, Owner, holds, is_valid_item_id};
use super::{RecordError, StopRecord, Unfinished};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// What a [`RecordStore`] method returns.
pub type RecordFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, RecordError>> + Send + 'a>>;

/// One unit of work a stop left unfinished, as the next start sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ResumeItem {
    /// Stable across every hand-over: leases and acknowledgements name it.
    pub id: String,
    /// The drain participant that handed it back.
    pub participant: String,
    /// The item as the participant handed it back.
    pub item: serde_json::Value,
    /// The process whose stop left it (the last one, when it was handed back again).
    pub stopped_by: Owner,
    /// When that stop finished.
    pub stopped_at: DateTime<Utc>,
    /// How many stops handed it back (1 the first time).
    pub attempts: u32,
    /// How many of its attempts failed: a life that held it ended without handing it back or
    /// completing it (killed, crashed), or handed it back because its task panicked. A planned
    /// stop that hands it back is not a failure. Past the service's maximum
    /// ([`crate::ServiceBuilder::max_failed_attempts`]) the item is held aside for a person.
    #[serde(default)]
    pub failures: u32,
    /// What the last failed attempt was, for the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
}

impl ResumeItem {
    /// An item as a store reads it back (for other [`RecordStore`] backends and their tests).
    pub fn new(
        id: impl Into<String>,
        participant: impl Into<String>,
        item: serde_json::Value,
        stopped_by: Owner,
        stopped_at: DateTime<Utc>,
        attempts: u32,
    ) -> ResumeItem {
        ResumeItem {
            id: id.into(),
            participant: participant.into(),
            item,
            stopped_by,
            stopped_at,
            attempts,
            failures: 0,
            last_failure: None,
        }
    }

    /// The same item with `failures` failed attempts, the last one `last` (for other
    /// [`RecordStore`] backends).
    #[must_use]
    pub fn with_failures(mut self, failures: u32, last: Option<String>) -> ResumeItem {
        self.failures = failures;
        self.last_failure = last;
        self
    }

    /// The item read back as `T`, the type the participant handed back.
    pub fn item_as<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        T::deserialize(&self.item)
    }
}

/// An item and its lease, if any: what [`RecordStore::list`] shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ItemState {
    /// The item.
    pub item: ResumeItem,
    /// Who is resuming it; `None` while pending.
    pub lease: Option<Lease>,
    /// Why the item is kept aside, when it is: it failed too often
    /// ([`RecordStore::hold_aside`]), or the store does not accept it (a hand-edited database
    /// row: a NULL, an id that is not an item id). It is kept for the operator and never offered
    /// until released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
}

impl ItemState {
    /// An item and its lease (for other [`RecordStore`] backends).
    pub fn new(item: ResumeItem, lease: Option<Lease>) -> ItemState {
        ItemState {
            item,
            lease,
            quarantined: None,
        }
    }

    /// The same, quarantined for `reason`: listed, never offered.
    #[must_use]
    pub fn with_quarantine(mut self, reason: impl Into<String>) -> ItemState {
        self.quarantined = Some(reason.into());
        self
    }
}

/// An item leased to the caller: resume it, then acknowledge it (or hand it back).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leased {
    /// The item.
    pub item: ResumeItem,
    /// The caller's lease.
    pub lease: Lease,
}

impl Leased {
    /// An item leased under `lease` (for other [`RecordStore`] backends, and for a participant's
    /// unit tests that hand one back).
    pub fn new(item: ResumeItem, lease: Lease) -> Leased {
        Leased { item, lease }
    }
}

/// How [`RecordStore::persist`] kept the items.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Persisted {
    /// Durable where the store keeps them.
    Durable,
    /// The store's own place could not be reached, and the items are durable in a fallback on
    /// this host (a database store's spill directory) until they can be pushed.
    Spilled {
        /// Why the store's own place could not be used.
        reason: String,
    },
}

/// Where stop records and their unfinished items are kept. See the module docs.
///
/// Every method is atomic with respect to every other caller of the same store, in any process.
pub trait RecordStore: Send + Sync + std::fmt::Debug + 'static {
    /// Makes `record`'s unfinished items durable, then its summary (a summary that cannot be
    /// written is only a warning). Every item has an id and fits [`crate::record::MAX_ITEM_BYTES`]; a
    /// store refuses one that does not. New work (`resumed: false`) is written once, its attempt
    /// count 1. A handed-back item (`resumed: true`) becomes pending again with its attempts
    /// counted up (saturating) only while `stopper` holds its lease; one that was acknowledged, dropped or
    /// released by an operator, or taken by someone else, is left as it is. Returns only once
    /// everything is durable; an error means the items may not be.
    ///
    /// The record is shared, not lent: the runner keeps it for the stop's outcome, and a store
    /// that does its work on another thread takes it there without copying every item.
    fn persist<'a>(
        &'a self,
        stopper: &'a Owner,
        record: Arc<StopRecord>,
    ) -> RecordFuture<'a, Persisted>;

    /// Leases to `owner` up to `max` of the items on offer, oldest first, until `lease_for` from
    /// now. On offer: a pending item; a leased one whose owner is known dead, or whose owner
    /// cannot be checked from here (another host) once its lease has expired. An owner known
    /// alive keeps its items. (The conformance suite, `planned_stop::testing`, holds a store to this.)
    fn lease<'a>(
        &'a self,
        owner: &'a Owner,
        max: usize,
        lease_for: Duration,
    ) -> RecordFuture<'a, Vec<Leased>>;

    /// Extends `owner`'s leases on `ids` to `lease_for` from now; returns the ids it still held
    /// (and so renewed), in the order given. A live holder renews well before expiry, so an item
    /// whose holder cannot be looked up (another host) is only offered again when that holder has
    /// stopped renewing.
    fn renew<'a>(
        &'a self,
        owner: &'a Owner,
        ids: &'a [String],
        lease_for: Duration,
    ) -> RecordFuture<'a, Vec<String>>;

    /// `owner` has taken item `id` over for good: it is removed, never offered again. Refused
    /// ([`RecordError::NotHolder`]) unless `owner` holds its lease: the lease names it (a lapsed
    /// lease still does, until someone else leases the item).
    fn acknowledge<'a>(&'a self, owner: &'a Owner, id: &'a str) -> RecordFuture<'a, ()>;

    /// [`RecordStore::acknowledge`] of each of `ids`, the answers in the same order. The stores
    /// of this crate do it in one operation (a fixed number of syncs, one statement), so work
    /// finishing together is acknowledged together; the default asks one by one.
    fn acknowledge_many<'a>(
        &'a self,
        owner: &'a Owner,
        ids: &'a [String],
    ) -> RecordFuture<'a, Vec<Result<(), RecordError>>> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(ids.len());
            for id in ids {
                answers.push(self.acknowledge(owner, id).await);
            }
            Ok(answers)
        })
    }

    /// Makes item `id` pending again. With `Some(owner)`, only if `owner` holds its lease; with
    /// `None` (an operator), whoever holds it, and an item held aside
    /// ([`RecordStore::hold_aside`], or a row the store could not accept) is offered again with
    /// its failures counted from zero. Returns whether it was leased or held aside.
    fn release<'a>(&'a self, owner: Option<&'a Owner>, id: &'a str) -> RecordFuture<'a, bool>;

    /// `owner`, holding item `id`, keeps it aside for a person rather than resuming it (it
    /// failed too often): its lease ends, it stays listed with `reason`
    /// ([`ItemState::quarantined`]), and no lease offers it again until an operator releases it
    /// ([`RecordStore::release`] with `None`). Refused like [`RecordStore::acknowledge`] unless
    /// `owner` holds its lease.
    fn hold_aside<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        reason: &'a str,
    ) -> RecordFuture<'a, ()>;

    /// Removes item `id` whatever its lease (an operator giving the work up). Returns whether it
    /// existed.
    fn remove<'a>(&'a self, id: &'a str) -> RecordFuture<'a, bool>;

    /// Every item with its lease, oldest first.
    fn list(&self) -> RecordFuture<'_, Vec<ItemState>>;

    /// The summary of the most recent stop persisted here, if any.
    fn last_stop(&self) -> RecordFuture<'_, Option<StopRecord>>;
}

/// The id of an item about to be persisted, when it may be: a valid id
/// ([`crate::record::lease::is_valid_item_id`]) and an item every store can hold
/// ([`crate::record::unstorable`]). Every store calls
/// it before writing anything, so no store holds what another would refuse or could not read back.
pub fn checked_item(unfinished: &Unfinished) -> Result<&str, String> {
    let id = unfinished
        .id
        .as_deref()
        .filter(|id| is_valid_item_id(id))
        .ok_or_else(|| format!("an item without a valid id: {:?}", unfinished.id))?;
    match crate::record::unstorable(&unfinished.item) {
        Some(why) => Err(format!("item {id} is {why}")),
        None => Ok(id),
    }
}

/// What a stop writes for an item: its counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Stops that handed it back, this one included.
    pub(crate) attempts: u32,
    /// Failed attempts, this one included when it failed.
    pub(crate) failures: u32,
    /// The last failure's description.
    pub(crate) last_failure: Option<String>,
}

/// What a stop writes for `unfinished`, given what the store holds under its id (`existing`):
/// the item's counts, or `None` to leave the stored item as it is. The one rule every store
/// follows:
///
/// - new work (`resumed: false`) is written once, with attempt 1; an id already taken is left;
/// - a handed-back item is written again (pending, attempts + 1) only while `stopper` holds its
///   lease. One that is gone (acknowledged, or dropped by an operator) is not brought back, and one
///   someone else holds now (released by an operator, or taken over after its lease lapsed) is
///   theirs: the operator's decision wins over the holder's hand-back;
/// - either way, an attempt that failed ([`Unfinished::failure`]) counts one failure more.
pub(crate) fn counts_after_persist(
    stopper: &Owner,
    unfinished: &Unfinished,
    existing: Option<&ItemState>,
) -> Option<Counts> {
    let id = unfinished.id.as_deref().unwrap_or_default();
    let failed = u32::from(unfinished.failure.is_some());
    match (unfinished.resumed, existing) {
        (false, None) => Some(Counts {
            attempts: 1,
            failures: failed,
            last_failure: unfinished.failure.clone(),
        }),
        (false, Some(_)) => {
            tracing::warn!(
                id,
                "a new item's id is taken already; the stored item is kept"
            );
            None
        }
        (true, Some(existing)) if holds(existing.lease.as_ref(), stopper) => Some(Counts {
            attempts: existing.item.attempts.saturating_add(1),
            failures: existing.item.failures.saturating_add(failed),
            last_failure: unfinished
                .failure
                .clone()
                .or_else(|| existing.item.last_failure.clone()),
        }),
        (true, Some(existing)) => {
            tracing::warn!(id, holder = ?existing.lease.as_ref().map(|l| l.owner.to_string()),
                "an item handed back is not this process's any more (released by an operator, or \
                 taken over); left as it is");
            None
        }
        (true, None) => {
            tracing::warn!(
                id,
                "an item handed back is no longer in the record store \
                (acknowledged, or dropped by an operator); not written again"
            );
            None
        }
    }
}

/// The end of a lease taken or renewed at `now` for `lease_for`: saturates at the end of time.
pub fn lease_end(now: DateTime<Utc>, lease_for: Duration) -> DateTime<Utc> {
    chrono::TimeDelta::from_std(lease_for)
        .ok()
        .and_then(|d| now.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Sorts items oldest first: by the time their stop finished, then by id (in order within one
/// stop). Every backend lists and leases in this order.
pub(crate) fn oldest_first(items: &mut [ItemState]) {
    items.sort_by(|a, b| (a.item.stopped_at, &a.item.id).cmp(&(b.item.stopped_at, &b.item.id)));
}

//! [`WorkSet`]: the jobs a drain participant holds, each with where it came from.
//!
//! Why this exists: an item resumed from an earlier stop must be acknowledged when its *work
//! completes* — acknowledged when it is merely queued in memory, a crash before the job finishes
//! loses it — and at a drain it must be handed back under its own id
//! ([`DrainReport::with_handed_back`]) while new work is handed back as a new item
//! ([`DrainReport::unfinished`]). Doing that by hand means tracking each job's origin and reaching
//! the [`ServiceHandle`] from inside the participant. A `WorkSet` does both, so there is one way
//! to write a participant that loses nothing:
//!
//! - [`WorkSet::add`] new work (its payload serialised then: work that could not be recorded is
//!   refused at once), [`WorkSet::add_resumed`] each item [`ServiceHandle::resume`] leased;
//! - [`WorkSet::complete`] a job when its work is done (a resumed one is acknowledged then, and
//!   only then);
//! - answer a [`crate::Drain`] with [`WorkSet::drain`]: every job still held is handed back the
//!   way its origin needs.
//!
//! A process killed mid-job neither acknowledged nor handed back its resumed items: their lease
//! ends with it, and they are offered again. New work it had not handed back is lost with it —
//! only a stop can record it.
//!
//! The set needs the service's handle, which exists only once the service started: create the
//! participant after `start()` and register it with [`ServiceHandle::add_participant`] before
//! [`ServiceHandle::ready`] (a planned stop is held until then, so it cannot miss the drain).

use crate::record::{Leased, RecordError};
use crate::runner::DrainReport;
use crate::service::ServiceHandle;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::future::Future;

/// One job of a [`WorkSet`] or a [`crate::TaskGroup`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JobId(u64);

impl JobId {
    pub(crate) fn new(n: u64) -> JobId {
        JobId(n)
    }

    /// The job's number within its set or group (0, 1, …), for logs.
    pub fn number(self) -> u64 {
        self.0
    }
}

/// Why a [`WorkSet`] or a [`crate::TaskGroup`] refused a job; the job comes back with it ([`Refused::job`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The payload cannot become a resume item (JSON): it would be lost at a stop.
    #[error(
        "the job's payload cannot be recorded as a resume item: {0}; make it serialise to JSON (maps with string keys)"
    )]
    NotSerializable(#[source] serde_json::Error),
    /// A resumed item does not read back as the set's or the group's job type. The item, given
    /// back in [`Refused::job`], is still leased to this process: release it
    /// ([`ServiceHandle::release`]) for another version of the application, or acknowledge it to
    /// drop it for good; left alone it is offered again once this process is gone.
    #[error(
        "the resumed item does not read back as this participant's jobs: {0}; release it for another version of the application"
    )]
    Unreadable(#[source] serde_json::Error),
    /// The group's drain has begun (the service is stopping): the job would not be handed back.
    /// Give the work to the next life (answer 503, leave it in its queue).
    #[error("the service is stopping: the task group takes no new jobs")]
    Stopping,
}

/// A job the group did not take, and why.
pub struct Refused<J> {
    /// The job, given back: nothing is lost by a refusal.
    pub job: J,
    /// Why.
    pub reason: Refusal,
}

impl<J> std::fmt::Debug for Refused<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Refused")
            .field("reason", &self.reason)
            .finish_non_exhaustive()
    }
}

impl<J> std::fmt::Display for Refused<J> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.reason.fmt(f)
    }
}

impl<J> std::error::Error for Refused<J> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.reason)
    }
}

/// The jobs of a drain participant, each with where it came from, so none is lost: [`WorkSet::add`]
/// new work (serialised then: what cannot be recorded is refused at once), [`WorkSet::add_resumed`]
/// what [`ServiceHandle::resume`] leased, [`WorkSet::complete`] a job when its work is done (a
/// resumed item is acknowledged then, never when merely queued), and answer a [`crate::Drain`]
/// with [`WorkSet::drain`]: new work is handed back as new items, resumed work under its own ids.
/// Create it after the service started, and register its participant before
/// [`ServiceHandle::ready`].
///
/// ```
/// # use planned_stop::{Layout, ServiceBuilder, StopRequest, WorkSet};
/// # let dir = tempfile::tempdir().unwrap();
/// actix::System::new().block_on(async {
///     let service = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
///         .state_dir(dir.path().join("state"))
///         .owns_process_exit(false)
///         .handle_signals(false)
///         .start()
///         .unwrap();
///     let mut work: WorkSet<String> = WorkSet::new(&service);
///     for leased in service.resume().await.unwrap() {
///         work.add_resumed(leased).unwrap();
///     }
///     let done = work.add("job-1".to_owned()).unwrap();
///     let _left = work.add("job-2".to_owned()).unwrap();
///     work.complete(done).await.unwrap(); // new work: nothing to acknowledge
///     let report = work.drain(); // what a Drain handler answers
///     assert_eq!(report.unfinished_items(), ["job-2"]);
/// });
/// ```
#[derive(Debug)]
pub struct WorkSet<T> {
    service: ServiceHandle,
    next: u64,
    jobs: BTreeMap<JobId, Job<T>>,
}

#[derive(Debug)]
struct Job<T> {
    work: T,
    /// The work as it is recorded if handed back, serialised when it was added.
    item: serde_json::Value,
    /// `Some` for a resumed item: acknowledged on completion, handed back under its id.
    leased: Option<Leased>,
}

impl<T: Serialize + DeserializeOwned> WorkSet<T> {
    /// An empty set for a participant of `service`.
    pub fn new(service: &ServiceHandle) -> Self {
        WorkSet {
            service: service.clone(),
            next: 0,
            jobs: BTreeMap::new(),
        }
    }

    fn insert(&mut self, work: T, item: serde_json::Value, leased: Option<Leased>) -> JobId {
        let id = JobId(self.next);
        self.next += 1;
        self.jobs.insert(id, Job { work, item, leased });
        id
    }

    /// New work, taken on in this life: handed back as a new item at a drain. Its payload is
    /// serialised now, so work that could not be recorded at a stop is refused here, to the
    /// caller, with the work given back ([`Refusal::NotSerializable`]) — never lost at the stop.
    pub fn add(&mut self, work: T) -> Result<JobId, Refused<T>> {
        match serde_json::to_value(&work) {
            Ok(item) => Ok(self.insert(work, item, None)),
            Err(e) => Err(Refused {
                job: work,
                reason: Refusal::NotSerializable(e),
            }),
        }
    }

    /// An item [`ServiceHandle::resume`] leased to this process, read back as `T`: acknowledged
    /// when [`Self::complete`]d, handed back under its own id at a drain. One that does not read
    /// back as `T` is refused ([`Refusal::Unreadable`]) and given back, still leased.
    #[allow(
        clippy::result_large_err,
        reason = "the lease comes back by value, so the caller can release it; a rare path"
    )]
    pub fn add_resumed(&mut self, leased: Leased) -> Result<JobId, Refused<Leased>> {
        match leased.item.item_as::<T>() {
            Ok(work) => {
                let item = leased.item.item.clone();
                Ok(self.insert(work, item, Some(leased)))
            }
            Err(e) => Err(Refused {
                job: leased,
                reason: Refusal::Unreadable(e),
            }),
        }
    }

    /// The work of job `id`, while the set holds it.
    pub fn get(&self, id: JobId) -> Option<&T> {
        self.jobs.get(&id).map(|job| &job.work)
    }

    /// Whether job `id` was resumed from an earlier stop.
    pub fn is_resumed(&self, id: JobId) -> bool {
        self.jobs.get(&id).is_some_and(|job| job.leased.is_some())
    }

    /// How many jobs the set holds.
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether the set holds no job.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Job `id`'s work is done: it leaves the set, and a resumed item is acknowledged (never
    /// offered again). An error means the acknowledgement did not happen (the record store was
    /// unreachable, or an operator released or dropped the item meanwhile): the item may be
    /// offered again, so work must be safe to repeat. A job no longer in the set is `Ok`.
    pub fn complete(
        &mut self,
        id: JobId,
    ) -> impl Future<Output = Result<(), RecordError>> + 'static + use<T> {
        let leased = self.jobs.remove(&id).and_then(|job| job.leased);
        let acknowledged = leased.map(|leased| self.service.acknowledge(&leased));
        async move {
            match acknowledged {
                Some(acknowledging) => acknowledging.await,
                None => Ok(()),
            }
        }
    }

    /// The answer to a [`crate::Drain`]: every job still held, new ones as unfinished items and
    /// resumed ones handed back under their ids. The set is empty afterwards.
    pub fn drain(&mut self) -> DrainReport {
        let mut new = Vec::new();
        let mut resumed = Vec::new();
        for job in std::mem::take(&mut self.jobs).into_values() {
            match job.leased {
                Some(leased) => resumed.push(leased),
                None => new.push(job.item),
            }
        }
        let mut report = DrainReport::done().with_handed_back(resumed);
        report.unfinished = new;
        report
    }
}

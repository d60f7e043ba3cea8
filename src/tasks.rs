//! [`TaskGroup`]: work that runs as spawned futures, drained like any participant.
//!
//! Why this exists: most actix-web applications run background work as spawned tasks, not as
//! actors, and a spawned task is invisible to a drain: nothing tells it to stop, nothing waits for
//! it, and whatever it held is gone when the process ends. A task spawned from a request handler
//! is worse off still: it runs on the HTTP worker's runtime, which stops with the listener, at the
//! end of the ingress phase, long before the work phase. A `TaskGroup` makes such work a drain
//! participant:
//!
//! - the group owns its work function, given once to [`TaskGroup::new`]: a job spawned from a
//!   request handler and a job resumed by the [`crate::ResumeLoop`] run the same code, and a
//!   handler needs only the group;
//! - each job's payload is serialised when it is spawned ([`TaskGroup::spawn`]): a payload that
//!   cannot become a resume item is refused to the caller at once, never lost at the stop;
//! - the task runs on the service's `System` (the thread that started the service), wherever it
//!   was spawned from, so it lives through the ingress phase;
//! - it receives a [`CancellationToken`] that fires when the group's drain begins, and tells how
//!   it ended ([`JobEnd`]); a resumed item is acknowledged only when its task says
//!   [`JobEnd::Done`];
//! - the drain cancels the token, closes the [`TaskTracker`] and waits for the tracked tasks up
//!   to its phase's deadline, then hands back every job still held: new ones as new items,
//!   resumed ones under their ids;
//! - a task that panics keeps its job (handed back at the drain, its failed attempt counted, so a
//!   job that keeps panicking is held aside for a person) and makes the drain not clean
//!   (its report says work was cut short, naming the job).
//!
//! Built on tokio-util's [`CancellationToken`] and [`TaskTracker`]: the group adds only what a
//! planned stop needs on top (the jobs and their origin), no channel bookkeeping of its own.

use crate::record::Leased;
use crate::runner::{Drain, DrainPhase, DrainReport};
use crate::service::ServiceHandle;
use crate::work::{JobId, Refusal, Refused};
use actix::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
pub use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How a task's work ended, as the task tells its group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobEnd {
    /// The work is done: the job leaves the group, and a resumed item is acknowledged.
    Done,
    /// The work is not done (the task saw its cancellation and stopped early): the job stays in
    /// the group and is handed back at the drain, for the next life.
    Unfinished,
}

/// Jobs that run as spawned futures, drained as one participant. Every job runs the group's one
/// work function, whether it was spawned or resumed. Its payload is recorded when it is spawned
/// (refused at once when it cannot be), and its task runs on the service's `System` wherever it was
/// spawned from. The drain cancels every task's [`CancellationToken`], waits up to its phase's
/// deadline and hands back every job still held. A resumed job is acknowledged only when its task
/// says [`JobEnd::Done`]; a task that panics hands its job back as a failed attempt.
///
/// ```
/// # use planned_stop::{Layout, ServiceBuilder, JobEnd, TaskGroup};
/// # let dir = tempfile::tempdir().unwrap();
/// actix::System::new().block_on(async {
///     let service = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
///         .state_dir(dir.path().join("state"))
///         .owns_process_exit(false)
///         .handle_signals(false)
///         .start()
///         .unwrap();
///     let emails = TaskGroup::new(&service, "emails", |job: String, stop| async move {
///         tokio::select! {
///             _ = stop.cancelled() => JobEnd::Unfinished, // handed back at the drain
///             _ = send(&job) => JobEnd::Done,
///         }
///     });
///     emails.spawn("welcome to ada".to_owned()).unwrap();
///     service.ready();
/// #   async fn send(_: &str) {}
/// });
/// ```
pub struct TaskGroup<T> {
    shared: Arc<Shared>,
    work: Arc<Work<T>>,
}

/// The group's work function, its future boxed so every job of the group has one type.
type Work<T> = dyn Fn(T, CancellationToken) -> Pin<Box<dyn Future<Output = JobEnd>>> + Send + Sync;

impl<T> Clone for TaskGroup<T> {
    fn clone(&self) -> Self {
        TaskGroup {
            shared: self.shared.clone(),
            work: self.work.clone(),
        }
    }
}

impl<T> std::fmt::Debug for TaskGroup<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskGroup")
            .field("name", &self.shared.name)
            .field("jobs", &self.shared.held())
            .finish_non_exhaustive()
    }
}

/// What every clone of a group shares.
struct Shared {
    name: String,
    service: ServiceHandle,
    /// The service's `System`: where every task runs, wherever it was spawned from.
    system: actix::ArbiterHandle,
    token: CancellationToken,
    tracker: TaskTracker,
    jobs: Mutex<Jobs>,
}

#[derive(Default)]
struct Jobs {
    next: u64,
    held: BTreeMap<JobId, Held>,
    /// Jobs whose task panicked, with the panic's message.
    panicked: Vec<(JobId, String)>,
    /// The drain's report was taken: no job may join any more.
    drained: bool,
}

/// A job the group holds: its payload as recorded, and its lease when it was resumed.
struct Held {
    item: serde_json::Value,
    leased: Option<Leased>,
}

impl<T: Serialize + DeserializeOwned + Send + 'static> TaskGroup<T> {
    /// A group drained in the work phase, registered with `service` as participant `name`, whose
    /// every job runs `work(job, cancelled)`. Create it on the service's `System` (where the
    /// service was started), before [`ServiceHandle::ready`], so no stop can miss it.
    pub fn new<F, Fut>(service: &ServiceHandle, name: impl Into<String>, work: F) -> TaskGroup<T>
    where
        F: Fn(T, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = JobEnd> + 'static,
    {
        TaskGroup::in_phase(service, DrainPhase::Work, name, work)
    }

    /// [`TaskGroup::new`], drained in `phase`.
    pub fn in_phase<F, Fut>(
        service: &ServiceHandle,
        phase: DrainPhase,
        name: impl Into<String>,
        work: F,
    ) -> TaskGroup<T>
    where
        F: Fn(T, CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = JobEnd> + 'static,
    {
        let name = name.into();
        let shared = Arc::new(Shared {
            name: name.clone(),
            service: service.clone(),
            system: actix::System::current().arbiter().clone(),
            token: CancellationToken::new(),
            tracker: TaskTracker::new(),
            jobs: Mutex::default(),
        });
        let participant = GroupParticipant(shared.clone()).start();
        service.add_participant(phase, name, participant.recipient());
        let work: Arc<Work<T>> = Arc::new(move |job, cancelled| Box::pin(work(job, cancelled)));
        TaskGroup { shared, work }
    }

    /// Runs the group's work on `job` as a task on the service's `System`, holding `job` until the
    /// task says it is [`JobEnd::Done`]: new work, handed back as a new item at a drain. Refused,
    /// with the job given back, when its payload cannot be recorded or the drain has begun.
    pub fn spawn(&self, job: T) -> Result<JobId, Refused<T>> {
        let item = match serde_json::to_value(&job) {
            Ok(item) => item,
            Err(e) => return Err(refused(job, Refusal::NotSerializable(e))),
        };
        match self.shared.hold(Held { item, leased: None }) {
            Some(id) => self
                .shared
                .run(id, job, self.work.clone())
                .map_err(|job| refused(job, Refusal::Stopping)),
            None => Err(refused(job, Refusal::Stopping)),
        }
    }

    /// [`TaskGroup::spawn`] for an item [`ServiceHandle::resume`] leased to this process, read
    /// back as `T`: acknowledged when its task says [`JobEnd::Done`], handed back under its own
    /// id at a drain.
    #[allow(
        clippy::result_large_err,
        reason = "the lease comes back by value, so the caller can release it; a rare path"
    )]
    pub fn spawn_resumed(&self, leased: Leased) -> Result<JobId, Refused<Leased>> {
        let job = match leased.item.item_as::<T>() {
            Ok(job) => job,
            Err(e) => return Err(refused(leased, Refusal::Unreadable(e))),
        };
        let item = leased.item.item.clone();
        let held = Held {
            item,
            leased: Some(leased.clone()),
        };
        match self.shared.hold(held) {
            Some(id) => match self.shared.run(id, job, self.work.clone()) {
                Ok(id) => Ok(id),
                Err(_) => Err(refused(leased, Refusal::Stopping)),
            },
            None => Err(refused(leased, Refusal::Stopping)),
        }
    }

    /// How many jobs the group holds (running, or ended unfinished or by a panic).
    pub fn len(&self) -> usize {
        self.shared.held()
    }

    /// Whether the group holds no job.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The participant name the group drains under (and its items are recorded under).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The token every task's own token descends from: cancelled when the group's drain begins.
    pub fn cancellation(&self) -> CancellationToken {
        self.shared.token.clone()
    }
}

fn refused<J>(job: J, reason: Refusal) -> Refused<J> {
    Refused { job, reason }
}

impl Shared {
    fn held(&self) -> usize {
        self.jobs.lock().map_or(0, |jobs| jobs.held.len())
    }

    /// Takes `held` in, unless the drain's report was taken already.
    fn hold(&self, held: Held) -> Option<JobId> {
        let mut jobs = self.jobs.lock().ok()?;
        if jobs.drained {
            return None;
        }
        let id = JobId::new(jobs.next);
        jobs.next += 1;
        jobs.held.insert(id, held);
        Some(id)
    }

    fn release(&self, id: JobId) -> Option<Held> {
        self.jobs.lock().ok()?.held.remove(&id)
    }

    /// Starts job `id`'s task on the service's `System`, tracked; gives the job back when the
    /// `System` is gone.
    fn run<T: Send + 'static>(
        self: &Arc<Self>,
        id: JobId,
        job: T,
        work: Arc<Work<T>>,
    ) -> Result<JobId, T> {
        let shared = self.clone();
        let token = self.token.child_token();
        // The job travels in a slot the closure empties: if the System is gone, the closure is
        // dropped unrun and the job is still here to give back.
        let slot = Arc::new(Mutex::new(Some(job)));
        let taken = slot.clone();
        let started = self.system.spawn_fn(move || {
            let Some(job) = taken.lock().ok().and_then(|mut s| s.take()) else {
                return;
            };
            let task = tokio::task::spawn_local(work(job, token));
            let tracker = shared.tracker.clone();
            let tracked = tracker.track_future(async move {
                let end = task.await;
                shared.finish(id, end).await;
            });
            actix::spawn(tracked);
        });
        if started {
            return Ok(id);
        }
        match slot.lock().ok().and_then(|mut s| s.take()) {
            Some(job) => {
                self.release(id);
                Err(job)
            }
            None => Ok(id),
        }
    }

    /// Job `id`'s task ended: done (it leaves, a resumed item is acknowledged), unfinished (it
    /// stays, for the drain), or panicked (it stays, and the drain is not clean).
    async fn finish(&self, id: JobId, end: Result<JobEnd, tokio::task::JoinError>) {
        match end {
            Ok(JobEnd::Done) => {
                let leased = self
                    .jobs
                    .lock()
                    .ok()
                    .and_then(|jobs| jobs.held.get(&id).and_then(|held| held.leased.clone()));
                if let Some(leased) = leased
                    && let Err(e) = self.service.acknowledge(&leased).await
                {
                    tracing::warn!(group = %self.name, id = %leased.item.id,
                        error = %crate::error_chain::ErrorChain(&e),
                        "a resumed job is done but its acknowledgement failed: it may be offered again");
                }
                self.release(id);
            }
            Ok(JobEnd::Unfinished) => {}
            Err(e) => {
                let message = panic_message(e);
                tracing::error!(group = %self.name, job = ?id, panic = %message,
                    "a task panicked: its job is handed back at the drain, which is not clean");
                crate::telemetry::task_panicked(&self.name);
                if let Ok(mut jobs) = self.jobs.lock() {
                    jobs.panicked.push((id, message));
                }
            }
        }
    }

    /// The drain's answer: every job still held handed back the way its origin needs, and each
    /// panic as work cut short. No job joins afterwards.
    fn report(&self, still_running: usize) -> DrainReport {
        let Ok(mut jobs) = self.jobs.lock() else {
            return DrainReport::done().with_cut_short("the task group's state was poisoned");
        };
        jobs.drained = true;
        let mut report = DrainReport::done();
        let panicked = std::mem::take(&mut jobs.panicked);
        for (id, held) in std::mem::take(&mut jobs.held) {
            // A panic is a failed attempt: counted, so a job that keeps panicking is held aside.
            let failure = panicked
                .iter()
                .find(|(p, _)| *p == id)
                .map(|(_, message)| format!("its task panicked: {message}"));
            report = match (held.leased, failure) {
                (Some(leased), Some(why)) => report.with_failed_handed_back(leased, why),
                (Some(leased), None) => report.with_handed_back([leased]),
                (None, Some(why)) => report.with_failed(held.item, why),
                (None, None) => {
                    report.unfinished.push(held.item);
                    report
                }
            };
        }
        for (id, message) in panicked {
            report = report.with_cut_short(format!(
                "the task of job {} panicked ({message}); its job is handed back",
                id.number()
            ));
        }
        if still_running > 0 {
            report = report.with_note(format!(
                "{still_running} task(s) still running at the deadline; their jobs are handed back"
            ));
        }
        report
    }
}

fn panic_message(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(payload) => payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_owned()),
        Err(e) => e.to_string(),
    }
}

/// The group as a drain participant.
struct GroupParticipant(Arc<Shared>);

impl Actor for GroupParticipant {
    type Context = Context<Self>;
}

impl Handler<Drain> for GroupParticipant {
    type Result = ResponseFuture<DrainReport>;

    fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> Self::Result {
        let shared = self.0.clone();
        Box::pin(async move {
            shared.token.cancel();
            shared.tracker.close();
            // Answer a little before the phase's deadline, so the answer counts as in time.
            let wait = drain.within.saturating_sub(drain.within / 20);
            let _ = actix::clock::timeout(wait, shared.tracker.wait()).await;
            shared.report(shared.tracker.len())
        })
    }
}

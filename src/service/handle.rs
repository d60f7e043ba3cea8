//! [`ServiceHandle`]: what the application holds once the service runs — ready, stop, resume,
//! the status and the exit code `main` returns.

use crate::identity::ProcessIdentity;
use crate::lifecycle::{SignalKind, StopRequest};
use crate::record::{Leased, Owner, RecordError, RecordStore};
use crate::runner::{
    AddParticipant, Drain, DrainPhase, OsSignal, Ready, RequestStop, RunnerActor, RunnerStatus,
};
use actix::prelude::*;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The running service: tell it when the application is ready, ask it to stop, watch its status.
///
/// It does not hand out the runner's address: a `PlannedStop` says "this process's marker was
/// claimed", which only the watcher may say. An application asks with
/// [`ServiceHandle::request_stop`] (or feeds a signal with [`ServiceHandle::signal`]).
///
/// ```compile_fail,E0599
/// fn send(handle: &planned_stop::ServiceHandle) {
///     let _ = handle.runner();
/// }
/// ```
#[derive(Debug, Clone)]
pub struct ServiceHandle {
    pub(crate) runner: Addr<RunnerActor>,
    pub(super) status: watch::Receiver<RunnerStatus>,
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(super) own: ProcessIdentity,
    pub(super) owner: Owner,
    pub(super) records: Option<Arc<dyn RecordStore>>,
    pub(super) lease_for: Duration,
    pub(super) max_failed_attempts: u32,
    /// Whether the actix-web integration is used whole (see `integration`).
    pub(crate) integration: Arc<super::integration::Integration>,
    /// The listening sockets a restart in place hands to the successor.
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(crate) handover: Arc<crate::handover::Handover>,
    /// The items this process leased and has not acknowledged or released: renewed while it runs.
    pub(super) held: Held,
    /// The items `resume` delivered to the application and it has not acknowledged or released:
    /// never delivered again while it works on them (see `resume`).
    pub(super) delivered: Held,
    /// The acknowledgements waiting to go to the record store together.
    pub(super) acks: Arc<super::acks::Acks>,
    pub(super) unexpected_code: i32,
}

pub(super) type Held = Arc<std::sync::Mutex<BTreeSet<String>>>;

/// `code` as a process exit code; one that does not fit in a byte is a failure, never 0.
fn exit_code_of(code: i32) -> std::process::ExitCode {
    std::process::ExitCode::from(crate::runner::process_end::status_of(code))
}

impl ServiceHandle {
    /// Resolves to the process's exit code once the runner has stopped: what `main` returns in
    /// async layouts (`#[actix::main]`, `#[actix_web::main]`), where returning early would end
    /// the process before the drain. If the runner is gone without stopping, it resolves to the
    /// unexpected code.
    ///
    /// ```no_run
    /// use planned_stop::{Layout, ServiceBuilder};
    ///
    /// #[actix::main]
    /// async fn main() -> std::process::ExitCode {
    ///     let service = match ServiceBuilder::new(Layout::Slots("/run/app".into())).start() {
    ///         Ok(service) => service,
    ///         Err(e) => {
    ///             eprintln!("{e}");
    ///             return std::process::ExitCode::from(2);
    ///         }
    ///     };
    ///     // ... start the application's actors, then:
    ///     service.ready();
    ///     service.stopped().await // 0 after a planned stop, 1 after an unexpected one
    /// }
    /// ```
    pub fn stopped(
        &self,
    ) -> impl std::future::Future<Output = std::process::ExitCode> + 'static + use<> {
        let mut status = self.status.clone();
        let unexpected = self.unexpected_code;
        async move {
            loop {
                let stopped = {
                    let now = status.borrow_and_update();
                    // The exit code comes with the final outcome, once the record is persisted.
                    now.exit_code().filter(|_| now.state.is_final())
                };
                if let Some(code) = stopped {
                    return exit_code_of(code);
                }
                if status.changed().await.is_err() {
                    return exit_code_of(unexpected);
                }
            }
        }
    }

    /// The application is ready: `Starting → Running`. A stop requested during start-up is acted
    /// on now.
    pub fn ready(&self) {
        self.integration.readied();
        let untaken = crate::handover::untaken_sockets();
        if untaken > 0 {
            tracing::error!(
                untaken,
                "this process was handed {untaken} listening socket(s) (LISTEN_FDS) that it does \
                 not serve: connections to them wait unanswered; serve them through \
                 planned_stop::web::listeners_or_bind (or web::Admin for one named admin), or do \
                 not hand them to it. A predecessor restarting in place is not told it is ready, \
                 and keeps serving"
            );
        } else if crate::handover::signal_ready() {
            // A successor of a restart in place: its predecessor stops accepting from now on.
            #[cfg(all(unix, feature = "systemd"))]
            crate::systemd::main_process_now();
        }
        self.runner.do_send(Ready);
    }

    /// Asks the runner to stop: [`StopRequest::Planned`] (exit 0 by default),
    /// [`StopRequest::Unexpected`], or [`StopRequest::Force`] to cut a drain in progress short.
    pub fn request_stop(&self, request: StopRequest) {
        self.runner.do_send(RequestStop(request));
    }

    /// Feeds an OS signal to the runner, as the signal listener does for real signals (an
    /// application that listens for signals itself, with `handle_signals(false)`).
    pub fn signal(&self, signal: SignalKind) {
        self.runner.do_send(OsSignal(signal));
    }

    /// The ids of the items this process leased and has neither acknowledged nor released (nor
    /// lost to an operator or a lapse): those its lease keeper renews, in id order.
    pub fn items_held(&self) -> Vec<String> {
        self.held
            .lock()
            .map(|held| held.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The runner's current status.
    pub fn status(&self) -> RunnerStatus {
        self.status.borrow().clone()
    }

    /// A receiver that sees every status change.
    pub fn subscribe(&self) -> watch::Receiver<RunnerStatus> {
        self.status.clone()
    }

    /// Registers a drain participant in `phase` after the service started (an actor created
    /// later, a server started later). Refused, with a warning in the log, once a stop has been
    /// accepted: the participant would miss its phase.
    pub fn add_participant(
        &self,
        phase: DrainPhase,
        name: impl Into<String>,
        recipient: Recipient<Drain>,
    ) {
        self.runner.do_send(AddParticipant {
            phase,
            name: name.into(),
            recipient,
        });
    }

    /// This process's identity, as read at start-up.
    #[cfg(feature = "actix-web")]
    pub(crate) fn identity(&self) -> ProcessIdentity {
        self.own
    }

    /// Leases every item earlier stops left unfinished in the record store, oldest first, to
    /// this process: resume each, then [`ServiceHandle::acknowledge`] it once the work is taken
    /// over for good (or hand it back at the next stop with [`DrainReport::with_handed_back`]). An
    /// item this process neither acknowledges nor hands back is offered again once it is gone,
    /// so a crash loses nothing. Empty without a record store.
    ///
    /// An item is delivered to this process once while it works on it: leased again after an
    /// operator released it (`planned-stop records release` of a live holder's item), it is not
    /// delivered a second time but stays with the job that already has it, whose acknowledgement
    /// then holds — one process never does the same work twice.
    ///
    /// [`DrainReport::with_handed_back`]: crate::DrainReport::with_handed_back
    ///
    /// ```
    /// # use planned_stop::{DrainReport, Layout, ServiceBuilder, StopRequest};
    /// # use actix::prelude::*;
    /// # struct Jobs;
    /// # impl Actor for Jobs { type Context = Context<Self>; }
    /// # impl Handler<planned_stop::Drain> for Jobs {
    /// #     type Result = DrainReport;
    /// #     fn handle(&mut self, _: planned_stop::Drain, _: &mut Context<Self>) -> DrainReport {
    /// #         DrainReport::unfinished(["job-7"])
    /// #     }
    /// # }
    /// # let dir = tempfile::tempdir().unwrap();
    /// let life = |dir: &std::path::Path| {
    ///     actix::System::new().block_on(async {
    ///         let service = ServiceBuilder::new(Layout::Slots(dir.join("run")))
    ///             .state_dir(dir.join("state"))
    ///             // Two lives in one process: the first must not end it.
    ///             .owns_process_exit(false)
    ///             .handle_signals(false)
    ///             .participant("jobs", Jobs.start().recipient())
    ///             .start()
    ///             .unwrap();
    ///         let resumed = service.resume().await.unwrap();
    ///         for item in &resumed {
    ///             // ... take the work over, then:
    ///             service.acknowledge(item).await.unwrap();
    ///         }
    ///         service.ready();
    ///         service.request_stop(StopRequest::Planned);
    ///         service.stopped().await;
    ///         resumed.iter().map(|l| l.item.item_as::<String>().unwrap()).collect::<Vec<_>>()
    ///     })
    /// };
    /// assert!(life(dir.path()).is_empty(), "the first life has nothing to resume");
    /// assert_eq!(life(dir.path()), ["job-7"], "the second resumes what the first left");
    /// ```
    pub fn resume(
        &self,
    ) -> impl std::future::Future<Output = Result<Vec<Leased>, RecordError>> + 'static + use<> {
        self.resume_at_most(usize::MAX)
    }

    /// [`ServiceHandle::resume`], leasing at most `max` items (oldest first), so that replicas
    /// sharing a store share its work: what this call leaves stays on offer to the others.
    pub fn resume_at_most(
        &self,
        max: usize,
    ) -> impl std::future::Future<Output = Result<Vec<Leased>, RecordError>> + 'static + use<> {
        let store = self.records.clone();
        let owner = self.owner.clone();
        let lease_for = self.lease_for;
        let max_failed = self.max_failed_attempts;
        let (held, delivered) = (self.held.clone(), self.delivered.clone());
        async move {
            let leased = match store {
                Some(store) => {
                    let leased = store.lease(&owner, max, lease_for).await?;
                    hold_aside_exhausted(store.as_ref(), &owner, leased, max_failed).await
                }
                None => Vec::new(),
            };
            if let Ok(mut h) = held.lock() {
                h.extend(leased.iter().map(|l| l.item.id.clone()));
            }
            let fresh = first_deliveries(&delivered, leased);
            crate::telemetry::leased(fresh.len());
            Ok(fresh)
        }
    }

    /// This process has taken `item` over for good: it is never offered again.
    pub fn acknowledge(
        &self,
        item: &Leased,
    ) -> impl std::future::Future<Output = Result<(), RecordError>> + 'static + use<> {
        let store = self.records.clone();
        let owner = self.owner.clone();
        let id = item.item.id.clone();
        let (held, delivered) = (self.held.clone(), self.delivered.clone());
        let acks = self.acks.clone();
        async move {
            let result = match store {
                Some(store) => acks.acknowledge(store, owner, id.clone()).await,
                None => Err(RecordError::UnknownItem { id: id.clone() }),
            };
            if result.is_ok() {
                crate::telemetry::acknowledged();
            }
            // Done, or not ours (any more): either way nothing to renew or to keep from a
            // second delivery.
            if !matches!(result, Err(RecordError::Backend { .. })) {
                forget(&[&held, &delivered], &id);
            }
            result
        }
    }

    /// Gives `item` up without resuming it: it is offered again at once, to whoever leases next.
    pub fn release(
        &self,
        item: &Leased,
    ) -> impl std::future::Future<Output = Result<bool, RecordError>> + 'static + use<> {
        let store = self.records.clone();
        let owner = self.owner.clone();
        let id = item.item.id.clone();
        let (held, delivered) = (self.held.clone(), self.delivered.clone());
        async move {
            let result = match store {
                Some(store) => store.release(Some(&owner), &id).await,
                None => Err(RecordError::UnknownItem { id: id.clone() }),
            };
            if !matches!(result, Err(RecordError::Backend { .. })) {
                forget(&[&held, &delivered], &id);
            }
            result
        }
    }
}

/// Removes `id` from each of `sets`.
fn forget(sets: &[&Held], id: &str) {
    for set in sets {
        if let Ok(mut s) = set.lock() {
            s.remove(id);
        }
    }
}

/// The items of `leased` not delivered to the application before (and not answered since),
/// now counted as delivered. One leased again while its first job still runs (an operator
/// released it, and this process leased it before anyone else) stays with that job: delivering it
/// again would have this process do the same work twice.
fn first_deliveries(delivered: &Held, leased: Vec<Leased>) -> Vec<Leased> {
    let Ok(mut delivered) = delivered.lock() else {
        return leased;
    };
    leased
        .into_iter()
        .filter(|l| {
            let first = delivered.insert(l.item.id.clone());
            if !first {
                tracing::info!(
                    id = %l.item.id,
                    "leased again an item this process is still working on (an operator \
                     released it?): it stays with the job that has it"
                );
            }
            first
        })
        .collect()
}

/// The items of `leased` that may be resumed: each one that has used up its failed attempts
/// ([`crate::record::lease::is_held_aside`]) is held aside for a person instead, with a WARN and a
/// metric. One that cannot be held aside (the store failed) is not resumed either: it stays
/// leased to this process, and is offered (and held aside) again once this process is gone.
async fn hold_aside_exhausted(
    store: &dyn RecordStore,
    owner: &Owner,
    leased: Vec<Leased>,
    max_failed: u32,
) -> Vec<Leased> {
    let mut resumable = Vec::with_capacity(leased.len());
    for item in leased {
        if !crate::record::lease::is_held_aside(item.item.failures, max_failed) {
            resumable.push(item);
            continue;
        }
        let reason = format!(
            "held aside after {} failed attempts (at most {max_failed} allowed); the last: {}",
            item.item.failures,
            item.item.last_failure.as_deref().unwrap_or("unknown")
        );
        match store.hold_aside(owner, &item.item.id, &reason).await {
            Ok(()) => {
                tracing::warn!(id = %item.item.id, participant = %item.item.participant,
                    failures = item.item.failures, last = ?item.item.last_failure,
                    "an item failed too often and is held aside for a person, not resumed: \
                     release it to offer it again, or drop it");
                crate::telemetry::held_aside(&item.item.participant);
            }
            Err(e) => tracing::warn!(id = %item.item.id,
                error = %crate::error_chain::ErrorChain(&e),
                "an item that failed too often could not be held aside; it is not resumed"),
        }
    }
    resumable
}

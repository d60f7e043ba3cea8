//! [`ServiceBuilder`]: the runner and the watcher wired together in a few lines.
//!
//! ```no_run
//! use actix::prelude::*;
//! use planned_stop::{Layout, ServiceBuilder};
//! use std::time::Duration;
//!
//! #[actix::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let service = ServiceBuilder::new(Layout::Slots("/run/my-app".into()))
//!         .state_dir("/var/lib/my-app")
//!         .drain_deadline(Duration::from_secs(20))
//!         .start()?;
//!     for leased in service.resume().await? {
//!         // ... resume leased.item, then:
//!         service.acknowledge(&leased).await?;
//!     }
//!     // ... start the application's actors, then:
//!     service.ready();
//!     Ok(())
//! }
//! ```
//!
//! [`ServiceBuilder::new`] opens the marker store (creating the directory 0700), reads this
//! process's identity once, sweeps leftovers of dead processes, and starts a [`RunnerActor`](crate::runner::RunnerActor) and a
//! [`MarkerWatcherActor`](crate::watcher::MarkerWatcherActor) on the current actix system. `main` returns the code
//! [`ServiceHandle::stopped`] resolves to; with [`ServiceBuilder::owns_process_exit`] (the
//! default) the process ends with the verdict's code whatever `main` returns.

mod acks;
mod builder;
mod handle;
pub(crate) mod integration;

pub use builder::ServiceBuilder;
pub use handle::ServiceHandle;

use builder::Records;
use handle::Held;

use crate::clock::SystemClock;
use crate::error_chain::ErrorChain;
use crate::identity::IdentityError;
use crate::judgement::Policy;
use crate::record::{Owner, RecordError, RecordStore};
use crate::runner::{RunnerConfig, RunnerStatus};
use crate::store::{Layout, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Why the service could not start.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// let err = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots(dir.path().into())).start().unwrap_err();
/// assert!(matches!(err, planned_stop::StartError::NoSystem));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// This process's identity could not be read.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The marker store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The state directory (the record store) cannot be used.
    #[error(transparent)]
    Records(#[from] RecordError),
    /// The signal handlers could not be installed.
    #[error("cannot install signal handlers")]
    Signals(#[source] std::io::Error),
    /// `start` was called outside a running actix system.
    #[error("the service must be started inside a running actix System")]
    NoSystem,
    /// The lease is shorter than its renewal can keep ([`MIN_LEASE`]).
    #[error(
        "a lease of {lease:?} is shorter than {min:?}: leases are renewed every third of their \
         length and a renewal may wait up to 3 s for the record store, so a shorter lease could \
         lapse while its holder runs and hand its items to a second process; give \
         the lease at least {min:?}"
    )]
    LeaseTooShort {
        /// The lease asked for.
        lease: Duration,
        /// The shortest accepted.
        min: Duration,
    },
    /// No failed attempt is allowed at all: every resumed item would be held aside at once.
    #[error("at most 0 failed attempts leaves no attempt to an item: allow at least 1")]
    NoAttemptAllowed,
}

/// How many failed attempts an item may have before it is held aside, unless the application
/// says otherwise ([`ServiceBuilder::max_failed_attempts`]).
pub const DEFAULT_MAX_FAILED_ATTEMPTS: u32 = 5;

impl ServiceBuilder {
    /// The entry point: a builder with safe defaults for the markers of `layout` — filesystem
    /// notifications plus 250 ms polling, 10 s drain, [`Policy::default`], exit codes 0 / 1, a
    /// private marker directory. [`ServiceBuilder::start`] starts the service.
    ///
    /// ```
    /// let builder = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into()));
    /// let _builder = builder.poll_interval(std::time::Duration::from_millis(500));
    /// ```
    pub fn new(layout: Layout) -> ServiceBuilder {
        ServiceBuilder {
            layout,
            policy: Policy::default(),
            allow_shared_dir: false,
            poll_interval: Duration::from_millis(250),
            runner: RunnerConfig::default(),
            participants: Vec::new(),
            clock: Arc::new(SystemClock),
            identity: None,
            signals: Some(crate::signals::listen),
            events: true,
            records: Records::None,
            allow_shared_state: false,
            lease_for: DEFAULT_LEASE,
            max_failed_attempts: DEFAULT_MAX_FAILED_ATTEMPTS,
            restart_in_place: None,
            forced_exit: None,
        }
    }
}

/// How long a lease lasts by default (see [`ServiceBuilder::lease_for`]).
const DEFAULT_LEASE: Duration = Duration::from_secs(300);

/// The shortest lease a service accepts. Leases are renewed every third of their length
/// (a third of the lease), and one renewal may wait up to 3 s for its store (the PostgreSQL
/// store's operation timeout; the state directory's lock wait is 2 s): a lease must outlast one
/// interval plus that wait, or it could lapse while its holder runs and another host's process
/// would take the same items.
pub const MIN_LEASE: Duration = Duration::from_secs(5);

/// How often a service renews its leases: a third of `lease_for`. The one rule the service and
/// [`MIN_LEASE`] share.
pub(crate) fn renewal_interval(lease_for: Duration) -> Duration {
    (lease_for / 3).min(Duration::from_secs(3600))
}

/// Renews this process's leases every third of the lease (a failed renewal is retried within
/// 500 ms) until the stop has concluded, so an item is only offered to another host's process
/// once this one stops renewing (it died, or its event loop is wedged).
fn keep_leases(
    store: &Option<Arc<dyn RecordStore>>,
    owner: &Owner,
    held: &Held,
    lease_for: Duration,
    status: &watch::Receiver<RunnerStatus>,
) {
    let Some(store) = store.clone() else {
        return;
    };
    let (owner, held, status) = (owner.clone(), held.clone(), status.clone());
    let every = renewal_interval(lease_for);
    // After a failed renewal, try again soon rather than a whole interval later: a store that
    // was briefly unreachable must not cost a live holder its leases.
    let retry = (every / 8).clamp(Duration::from_millis(50), Duration::from_millis(500));
    actix::spawn(async move {
        let mut wait = every;
        loop {
            actix::clock::sleep(wait).await;
            wait = every;
            // Until the stop has concluded (its record persisted): the items it hands back are
            // still this process's while the persist runs.
            if status.borrow().exit_code().is_some() {
                return;
            }
            let ids: Vec<String> = held
                .lock()
                .map(|h| h.iter().cloned().collect())
                .unwrap_or_default();
            if ids.is_empty() {
                continue;
            }
            match store.renew(&owner, &ids, lease_for).await {
                Ok(kept) if kept.len() < ids.len() => {
                    let lost: Vec<&String> = ids.iter().filter(|id| !kept.contains(id)).collect();
                    crate::telemetry::renewed(ids.len() - lost.len(), lost.len());
                    tracing::warn!(
                        ?lost,
                        "leases lost (released by an operator, or taken over after they lapsed); those items are someone else's now"
                    );
                    if let Ok(mut h) = held.lock() {
                        h.retain(|id| kept.contains(id));
                    }
                }
                Ok(_) => crate::telemetry::renewed(ids.len(), 0),
                Err(e) => {
                    crate::telemetry::renewal_failed();
                    wait = retry;
                    tracing::warn!(error = %ErrorChain(&e), retry_ms = retry.as_millis() as u64,
                        "cannot renew the leases; retrying soon")
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::StopRequest;
    use actix::System;

    /// Installing the signal handlers is the last fallible step of `start`: when it fails, no
    /// runner is left behind (one used to be running already, and its drop guard ended the
    /// process about 30 s later when the application went on without it). A runner left behind
    /// would hold its participants: the participant here ends once nothing holds it.
    #[test]
    fn a_start_that_fails_on_signals_leaves_no_runner() {
        use std::sync::atomic::{AtomicBool, Ordering};
        struct Participant(Arc<AtomicBool>);
        impl actix::Actor for Participant {
            type Context = actix::Context<Self>;
            fn stopped(&mut self, _: &mut Self::Context) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        impl actix::Handler<crate::Drain> for Participant {
            type Result = crate::DrainReport;
            fn handle(&mut self, _: crate::Drain, _: &mut Self::Context) -> crate::DrainReport {
                crate::DrainReport::done()
            }
        }
        let dir = tempfile::tempdir().unwrap();
        System::new().block_on(async {
            use actix::Actor;
            let ended = Arc::new(AtomicBool::new(false));
            let participant = Participant(ended.clone()).start();
            let mut builder = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
                // Off, so a runner left behind shows instead of ending the tests.
                .owns_process_exit(false)
                .participant("jobs", participant.recipient());
            builder.signals = Some(|_| Err(std::io::Error::other("no signal handlers here")));
            let result = builder.start();
            assert!(matches!(result, Err(StartError::Signals(_))), "{result:?}");
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
            assert!(
                ended.load(Ordering::SeqCst),
                "a runner was left behind, holding its participant"
            );
            // The application retries without signal handlers, and that service works.
            let ended = Arc::new(AtomicBool::new(false));
            let participant = Participant(ended.clone()).start();
            let handle = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
                .owns_process_exit(false)
                .handle_signals(false)
                .participant("jobs", participant.recipient())
                .start()
                .unwrap();
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
            assert!(
                !ended.load(Ordering::SeqCst),
                "the runner holds its participant"
            );
            handle.ready();
            handle.request_stop(StopRequest::Planned);
            assert_eq!(handle.stopped().await, std::process::ExitCode::SUCCESS);
        });
    }
}

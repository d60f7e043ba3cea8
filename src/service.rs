//! [`PlannedStopService`]: the runner and the watcher wired together in a few lines.
//!
//! ```no_run
//! use actix::prelude::*;
//! use planned_stop::PlannedStopService;
//! use planned_stop::Layout;
//! use std::time::Duration;
//!
//! #[actix::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let service = PlannedStopService::builder(Layout::Slots("/run/my-app".into()))
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
//! [`PlannedStopService::builder`] opens the marker store (creating the directory 0700), reads this
//! process's identity once, sweeps leftovers of dead processes, and starts a [`RunnerActor`] and a
//! [`MarkerWatcherActor`] on the current actix system. The runner owns the end of the process
//! ([`ServiceBuilder::owns_process_exit`]): once the stop concluded, the process ends with the
//! verdict's exit code whatever `main` does.

use crate::clock::{Clock, SystemClock};
use crate::error_chain::ErrorChain;
use crate::events::SlotEvents;
use crate::identity::{IdentityError, ProcessIdentity};
use crate::lifecycle::{RunnerState, SignalKind, StopCause, StopRequest, StopVerdict};
use crate::record::{FileRecordStore, Leased, Owner, RecordError, RecordStore, Sharing};
use crate::runner::{
    AddParticipant, Drain, DrainPhase, ExitCodes, OsSignal, Ready, RequestStop, RunnerActor,
    RunnerConfig, RunnerStatus,
};
use crate::store::{Layout, MarkerStore, StoreError};
use crate::verdict::Policy;
use crate::watcher::{MarkerWatcherActor, OwnSlot};
use actix::prelude::*;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Why the service could not start.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// let err = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots(dir.path().into())).start().unwrap_err();
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
    #[error("PlannedStopService::start must be called inside a running actix System")]
    NoSystem,
    /// The lease is shorter than its renewal can keep ([`MIN_LEASE`]).
    #[error(
        "a lease of {lease:?} is shorter than {min:?}: leases are renewed every third of their \
         length and a renewal may wait up to 3 s for the record store, so a shorter lease could \
         lapse while its holder runs and hand its items to a second process; give \
         ServiceBuilder::lease_for (serve --lease-ms) at least {min:?}"
    )]
    LeaseTooShort {
        /// The lease asked for.
        lease: Duration,
        /// The shortest accepted.
        min: Duration,
    },
}

/// Entry point; see the module docs.
#[derive(Debug, Clone, Copy)]
pub struct PlannedStopService;

impl PlannedStopService {
    /// A builder with safe defaults: filesystem notifications plus 250 ms polling, 10 s drain, [`Policy::default`], exit codes
    /// 0 / 1, a private marker directory.
    ///
    /// ```
    /// let builder = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots("/run/app".into()));
    /// let _builder = builder.poll_interval(std::time::Duration::from_millis(500));
    /// ```
    pub fn builder(layout: Layout) -> ServiceBuilder {
        ServiceBuilder {
            layout,
            policy: Policy::default(),
            allow_shared_dir: false,
            poll_interval: Duration::from_millis(250),
            runner: RunnerConfig::default(),
            participants: Vec::new(),
            clock: Arc::new(SystemClock),
            identity: None,
            handle_signals: true,
            events: true,
            records: Records::None,
            allow_shared_state: false,
            lease_for: DEFAULT_LEASE,
            forced_exit: None,
        }
    }
}

/// Configures and starts the runner and the watcher.
///
/// ```
/// use planned_stop::{PlannedStopService, StopCause, StopVerdict};
/// use planned_stop::Layout;
/// let _builder = PlannedStopService::builder(Layout::Slots("/run/app".into()))
///     .state_dir("/var/lib/app")
///     .drain_deadline(std::time::Duration::from_secs(20))
///     .exit_code(StopCause::Request, StopVerdict::Unexpected, 3);
/// ```
#[must_use = "a builder or value that is dropped configures nothing"]
pub struct ServiceBuilder {
    layout: Layout,
    policy: Policy,
    allow_shared_dir: bool,
    poll_interval: Duration,
    runner: RunnerConfig,
    participants: Vec<(DrainPhase, String, Recipient<Drain>)>,
    clock: Arc<dyn Clock>,
    identity: Option<ProcessIdentity>,
    handle_signals: bool,
    events: bool,
    records: Records,
    allow_shared_state: bool,
    lease_for: Duration,
    forced_exit: Option<crate::runner::process_end::ForcedExitHook>,
}

impl std::fmt::Debug for ServiceBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceBuilder")
            .field("layout", &self.layout)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// Where the builder keeps records: opened at start, so a state directory that cannot be used
/// fails the start rather than the stop.
enum Records {
    None,
    Dir(PathBuf),
    Store(Arc<dyn RecordStore>),
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

impl ServiceBuilder {
    /// Whether to install handlers for SIGTERM, SIGINT and SIGHUP (console events on Windows) that
    /// feed the runner (default `true`). Turn it off when something else owns the signals and
    /// forwards them with [`ServiceHandle::signal`]. Once installed, a handler stays for the life of
    /// the process.
    ///
    /// ```
    /// let _b = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots("/run/app".into())).handle_signals(false);
    /// ```
    pub fn handle_signals(mut self, handle: bool) -> Self {
        self.handle_signals = handle;
        self
    }

    /// Keeps the stop record and the unfinished items in a state directory on this host
    /// ([`FileRecordStore`], created 0700 at start; one that group or others can write is refused
    /// unless [`ServiceBuilder::allow_shared_state`]). Several services may share it.
    ///
    /// ```
    /// let _b = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots("/run/app".into())).state_dir("/var/lib/app");
    /// ```
    pub fn state_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.records = Records::Dir(dir.into());
        self
    }

    /// Keeps the stop record and the unfinished items in `store` (another backend than the
    /// state directory, such as a database every replica reaches).
    pub fn record_store(mut self, store: Arc<dyn RecordStore>) -> Self {
        self.records = Records::Store(store);
        self
    }

    /// Accepts a state directory that group or others can write (default `false`: whoever can
    /// write there can plant work for this service to resume).
    pub fn allow_shared_state(mut self, allow: bool) -> Self {
        self.allow_shared_state = allow;
        self
    }

    /// How long a lease taken by [`ServiceHandle::resume`] lasts where the holder's liveness
    /// cannot be checked (a holder on another host). Default 5 minutes, at least [`MIN_LEASE`]
    /// (a shorter one fails the start). The service renews its leases every third of this while
    /// it runs, so a live holder keeps its items; on this host a holder is looked up, so a dead
    /// one's items are offered again at once.
    pub fn lease_for(mut self, lease_for: Duration) -> Self {
        self.lease_for = lease_for;
        self
    }

    /// Whether the watcher also reacts to filesystem notifications on the marker's directory
    /// (default `true`; falls back to polling alone, with a warning, where notifications are not
    /// available). The poll keeps running as a safety net either way.
    ///
    /// ```
    /// let _poll_only = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots("/run/app".into())).events(false);
    /// ```
    pub fn events(mut self, events: bool) -> Self {
        self.events = events;
        self
    }

    /// How often the watcher probes. Default 250 ms; anything under 1 ms is taken as 1 ms (a
    /// zero interval would probe in a busy loop).
    ///
    /// ```
    /// let _b = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots("/run/app".into())).poll_interval(std::time::Duration::from_secs(1));
    /// ```
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(MIN_POLL_INTERVAL);
        self
    }

    /// How long the drain participants have. Default 10 s.
    ///
    /// ```
    /// let _b = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots("/run/app".into())).drain_deadline(std::time::Duration::from_secs(30));
    /// ```
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.runner.drain_deadline = deadline;
        self
    }

    /// The marker policy (TTL, skew, start slack).
    ///
    /// ```
    /// use planned_stop::PlannedStopService;
    /// use planned_stop::Layout;
    /// use planned_stop::marker::Policy;
    /// let policy = Policy::default().with_ttl(std::time::Duration::from_secs(300));
    /// let _b = PlannedStopService::builder(Layout::Slots("/run/app".into())).policy(policy);
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Accepts a marker directory writable by group or others (see
    /// [`crate::store::MarkerStoreBuilder::allow_shared_dir`]).
    ///
    /// ```
    /// let _b = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots("/srv/shared".into())).allow_shared_dir(true);
    /// ```
    pub fn allow_shared_dir(mut self, allow: bool) -> Self {
        self.allow_shared_dir = allow;
        self
    }

    /// Exit codes by verdict and cause.
    ///
    /// ```
    /// use planned_stop::{ExitCodes, PlannedStopService};
    /// use planned_stop::Layout;
    /// let mut codes = ExitCodes::default();
    /// codes.unexpected = 75;
    /// let _b = PlannedStopService::builder(Layout::Slots("/run/app".into())).exit_codes(codes);
    /// ```
    pub fn exit_codes(mut self, codes: ExitCodes) -> Self {
        self.runner.exit_codes = codes;
        self
    }

    /// Overrides one exit code: `code` when a stop with `cause` reaches `verdict`.
    ///
    /// ```
    /// use planned_stop::{PlannedStopService, SignalKind, StopCause, StopVerdict};
    /// use planned_stop::Layout;
    /// // A SIGHUP is a clean stop for this application.
    /// let _b = PlannedStopService::builder(Layout::Slots("/run/app".into()))
    ///     .exit_code(StopCause::Signal(SignalKind::Hangup), StopVerdict::Unexpected, 0);
    /// ```
    pub fn exit_code(mut self, cause: StopCause, verdict: StopVerdict, code: i32) -> Self {
        self.runner.exit_codes = self.runner.exit_codes.with(cause, verdict, code);
        self
    }

    /// Registers a drain participant.
    ///
    /// ```
    /// use actix::prelude::*;
    /// use planned_stop::{Drain, DrainReport, PlannedStopService};
    /// use planned_stop::Layout;
    /// struct Jobs;
    /// impl Actor for Jobs { type Context = Context<Self>; }
    /// impl Handler<Drain> for Jobs {
    ///     type Result = DrainReport;
    ///     fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> DrainReport { DrainReport::default() }
    /// }
    /// actix::System::new().block_on(async {
    ///     let _b = PlannedStopService::builder(Layout::Slots("/run/app".into())).participant("jobs", Jobs.start().recipient());
    /// });
    /// ```
    pub fn participant(self, name: impl Into<String>, recipient: Recipient<Drain>) -> Self {
        self.participant_in(DrainPhase::Work, name, recipient)
    }

    /// Registers a drain participant in `phase`: ingress participants (servers, consumers) are
    /// asked first and must stop taking work; the work phase starts when they have answered or
    /// timed out; the final phase last. [`Self::participant`] registers in the work phase.
    pub fn participant_in(
        mut self,
        phase: DrainPhase,
        name: impl Into<String>,
        recipient: Recipient<Drain>,
    ) -> Self {
        self.participants.push((phase, name.into(), recipient));
        self
    }

    /// `phase`'s own deadline within the overall one ([`Self::drain_deadline`]): the phase moves
    /// on when it passes, and never has more than what is left of the overall deadline. Without
    /// one a phase may use all that is left.
    ///
    /// ```
    /// use planned_stop::{DrainPhase, PlannedStopService};
    /// use planned_stop::Layout;
    /// use std::time::Duration;
    /// // 25 s in all; the HTTP server gets at most 10 of them, the workers what remains.
    /// let _b = PlannedStopService::builder(Layout::Slots("/run/app".into()))
    ///     .drain_deadline(Duration::from_secs(25))
    ///     .phase_deadline(DrainPhase::Ingress, Duration::from_secs(10));
    /// ```
    pub fn phase_deadline(mut self, phase: DrainPhase, deadline: Duration) -> Self {
        self.runner.phase_deadlines.push((phase, deadline));
        self
    }

    /// How long a drain may overrun its deadline (plus the answer graces) before a watchdog
    /// thread ends the process with the unexpected code, logging who was still draining. It
    /// catches what the deadline timers cannot: something blocking the event loop. Default 5 s.
    pub fn overrun_grace(mut self, grace: Duration) -> Self {
        self.runner.overrun_grace = grace;
        self
    }

    /// How long persisting the stop record may take once the drain is over (default 10 s): a
    /// record store that has not finished by then ends the stop as `record_lost`, the items in
    /// the ERROR log line, rather than hanging it. It counts apart from the drain deadline, and
    /// the overrun watchdog allows for it.
    pub fn persist_deadline(mut self, deadline: Duration) -> Self {
        self.runner.persist_deadline = deadline;
        self
    }

    /// Warn (once) when the application has not called [`ServiceHandle::ready`] this long after
    /// start: a planned stop is held until then. Default 30 s; `None` never warns.
    pub fn ready_warning(mut self, after: Option<Duration>) -> Self {
        self.runner.ready_warning = after;
        self
    }

    /// Whether the runner owns the end of the process (default `true`, for services).
    ///
    /// On: once the stop concluded (its record persisted), the process ends with the verdict's
    /// exit code whatever `main` does — returns `Ok(())` or `ExitCode::SUCCESS`, never returns
    /// because it runs a server with `block_on`, or panics: the runner stops the actix `System`
    /// with the code, corrects any other code on the way out (an `atexit` handler), and ends the
    /// process itself if `main` has not returned within [`Self::exit_grace`]. A runner dropped
    /// before it stopped, a `System` stopped by someone else and a drain that overruns all end it
    /// with the unexpected code; panics are logged through `tracing`. docs/design.md has the table
    /// of `main` layouts and the codes they end with.
    ///
    /// Off (embedding the runner in a larger program, tests): nothing in the library ends the
    /// process or installs a panic hook; await [`ServiceHandle::stopped`] and end the process
    /// with its code yourself.
    ///
    /// ```
    /// // Run the runner inside a larger program that ends by other means.
    /// let _b = planned_stop::PlannedStopService::builder(planned_stop::Layout::Slots("/run/app".into())).owns_process_exit(false);
    /// ```
    pub fn owns_process_exit(mut self, owns: bool) -> Self {
        self.runner.owns_process_exit = owns;
        self
    }

    /// How long `main` has, once the stop concluded, to return by itself (and run what follows
    /// `stopped().await`, such as flushing telemetry) before the runner ends the process with
    /// the verdict's code. Default 2 s. Only with [`Self::owns_process_exit`].
    pub fn exit_grace(mut self, grace: Duration) -> Self {
        self.runner.exit_grace = grace;
        self
    }

    /// A last word before the library ends the process itself (the overrun watchdog, the guard
    /// against a `System` that ended before the runner finished, the exit grace passing): `hook`
    /// gets the exit code and, when the stop concluded, its verdict. It runs on the thread that
    /// ends the process, possibly while the event loop is blocked: keep it short (the command
    /// line prints its `exit` event). Only with [`Self::owns_process_exit`]; one per process.
    pub fn on_forced_exit(
        mut self,
        hook: impl Fn(i32, Option<StopVerdict>) + Send + Sync + 'static,
    ) -> Self {
        self.forced_exit = Some(Box::new(hook));
        self
    }

    /// The wall clock for verdicts and leases instead of the system's (tests pass one driven by
    /// tokio's paused clock). A test seam, with the `testing` feature.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The identity to act as, instead of this process's. A test seam, with the `testing` feature.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    pub fn identity(mut self, identity: ProcessIdentity) -> Self {
        self.identity = Some(identity);
        self
    }

    /// Opens the store, sweeps it, and starts both actors on the current system.
    ///
    /// Every fallible step comes first: an error leaves nothing running. From then on the
    /// runner owns the process's end (see [`Self::owns_process_exit`] to hand that back to the
    /// application).
    ///
    /// ```
    /// # use planned_stop::{PlannedStopService, RunnerState, StopRequest};
    /// # use planned_stop::Layout;
    /// # let dir = tempfile::tempdir().unwrap();
    /// let code = actix::System::new().block_on(async {
    ///     let service = PlannedStopService::builder(Layout::Slots(dir.path().join("run")))
    ///         .handle_signals(false)
    ///         .start()
    ///         .unwrap();
    ///     assert_eq!(service.status().state, RunnerState::Starting);
    ///     service.ready();
    ///     // The application decides to stop on purpose: drain, record, exit 0.
    ///     service.request_stop(StopRequest::Planned);
    ///     service.stopped().await
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    pub fn start(self) -> Result<ServiceHandle, StartError> {
        if System::try_current().is_none() {
            return Err(StartError::NoSystem);
        }
        if self.lease_for < MIN_LEASE {
            return Err(StartError::LeaseTooShort {
                lease: self.lease_for,
                min: MIN_LEASE,
            });
        }
        let own = match self.identity {
            Some(id) => id,
            None => ProcessIdentity::current()?,
        };
        let store = MarkerStore::builder(self.layout)
            .policy(self.policy)
            .allow_shared_dir(self.allow_shared_dir)
            .open()?;
        match store.sweep(self.clock.now()) {
            Ok(report) if report != Default::default() => {
                tracing::info!(?report, "swept markers of earlier processes")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %ErrorChain(&e), "cannot sweep the marker directory"),
        }
        let state_dir = match &self.records {
            Records::Dir(dir) => Some(std::path::absolute(dir).unwrap_or_else(|_| dir.clone())),
            _ => None,
        };
        let records: Option<Arc<dyn RecordStore>> = match self.records {
            Records::None => None,
            Records::Dir(dir) => Some(Arc::new(
                FileRecordStore::open(
                    dir,
                    if self.allow_shared_state {
                        Sharing::Allowed
                    } else {
                        Sharing::Refused
                    },
                )?
                .with_clock(self.clock.clone()),
            )),
            Records::Store(store) => Some(store),
        };
        // The runner's mailbox exists before the runner does: the signal handlers, the last
        // fallible step, are installed against it, and only then is the runner made and run. A
        // failure leaves no runner behind (its drop guard would end the process later).
        let context: Context<RunnerActor> = Context::new();
        let runner = context.address();
        if self.handle_signals {
            crate::signals::listen(runner.clone().recipient()).map_err(StartError::Signals)?;
        }
        let mut config = self.runner;
        config.records = records.clone();
        let unexpected_code = config.exit_codes.unexpected;
        let owns_exit = config.owns_process_exit;
        let mut actor = RunnerActor::new(store.clone(), own, config, self.clock.clone());
        for (phase, name, recipient) in self.participants {
            actor.add_participant(phase, name, recipient);
        }
        let status = actor.subscribe();
        if owns_exit {
            log_panics();
            if let Some(hook) = self.forced_exit {
                crate::runner::process_end::on_forced_exit(hook);
            }
            crate::runner::process_end::arm(unexpected_code);
        }
        context.run(actor);
        #[cfg(all(unix, feature = "systemd"))]
        {
            crate::systemd::follow(status.clone());
            crate::systemd::heartbeat();
        }
        let since = self.clock.now();
        let mut watcher = MarkerWatcherActor::new(
            OwnSlot {
                store: store.clone(),
                own,
            },
            runner.clone().recipient(),
            status.clone(),
            self.poll_interval,
            self.clock,
        )
        .with_held_notice(runner.clone().recipient())
        .ends_process_on_panic(owns_exit);
        if self.events {
            match SlotEvents::watch(&store.slot_path(own.pid)) {
                Ok((events, wakeups)) => watcher = watcher.with_wakeups(wakeups, Some(events)),
                Err(e) => tracing::warn!(error = %ErrorChain(&e),
                    "no filesystem notifications for the marker directory; polling only"),
            }
        }
        watcher.start();
        // Announced before `start` returns, so before the application can say it is ready: a
        // stopper that finds no announcement can warn that nothing here reads its marker.
        if let Err(e) = store.write_presence(&crate::stopper::Presence::new(&own, since)) {
            tracing::warn!(error = %ErrorChain(&e), "cannot write the presence file; stoppers \
                will warn that this process has not announced watching the directory");
        }
        let marker_dir = std::path::absolute(store.dir()).unwrap_or_else(|_| store.dir().into());
        tracing::info!(
            pid = own.pid,
            start = own.start,
            marker_dir = %marker_dir.display(),
            // Display, not Debug: a Windows path must read as itself, not with doubled
            // backslashes.
            state_dir = %state_dir
                .as_ref()
                .map_or_else(|| "none".to_owned(), |d| d.display().to_string()),
            records = records.is_some(),
            owns_process_exit = owns_exit,
            "planned-stop service started; a planned stop is `planned-stop stop --pid PID --dir \
             MARKER_DIR`"
        );
        let owner = crate::record::host::this_process(&own);
        let held = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        if let Some(records) = &records {
            keep_leases(
                records.clone(),
                owner.clone(),
                held.clone(),
                self.lease_for,
                status.clone(),
            );
        }
        Ok(ServiceHandle {
            runner,
            status,
            store,
            own,
            owner,
            records,
            lease_for: self.lease_for,
            held,
            unexpected_code,
        })
    }
}

/// The running service: tell it when the application is ready, ask it to stop, watch its status.
#[derive(Debug, Clone)]
pub struct ServiceHandle {
    pub(crate) runner: Addr<RunnerActor>,
    status: watch::Receiver<RunnerStatus>,
    store: MarkerStore,
    own: ProcessIdentity,
    owner: Owner,
    records: Option<Arc<dyn RecordStore>>,
    lease_for: Duration,
    /// The items this process leased and has not acknowledged or released: renewed while it runs.
    held: Held,
    unexpected_code: i32,
}

type Held = Arc<std::sync::Mutex<BTreeSet<String>>>;

/// Renews this process's leases every third of the lease (a failed renewal is retried within
/// 500 ms) until the stop has concluded, so an item is only offered to another host's process
/// once this one stops renewing (it died, or its event loop is wedged).
fn keep_leases(
    store: Arc<dyn RecordStore>,
    owner: Owner,
    held: Held,
    lease_for: Duration,
    status: watch::Receiver<RunnerStatus>,
) {
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
            if status.borrow().exit_code.is_some() {
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
                    tracing::warn!(
                        ?lost,
                        "leases lost (released by an operator, or taken over after they lapsed); those items are someone else's now"
                    );
                    if let Ok(mut h) = held.lock() {
                        h.retain(|id| kept.contains(id));
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    wait = retry;
                    tracing::warn!(error = %ErrorChain(&e), retry_ms = retry.as_millis() as u64,
                        "cannot renew the leases; retrying soon")
                }
            }
        }
    });
}

/// Logs every panic through `tracing` as well (once per process, chained to the hook that was
/// installed before), so a panic that ends the process — the runner's and the watcher's guards
/// exit non-zero — is in the service's logs, not only on stderr.
fn log_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            tracing::error!(panic = %info, "panic");
            previous(info);
        }));
    });
}

/// The shortest poll interval taken (see [`ServiceBuilder::poll_interval`]).
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);

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
    /// use planned_stop::PlannedStopService;
    /// use planned_stop::Layout;
    ///
    /// #[actix::main]
    /// async fn main() -> std::process::ExitCode {
    ///     let service = match PlannedStopService::builder(Layout::Slots("/run/app".into())).start() {
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
                    (now.state == RunnerState::Stopped && now.exit_code.is_some())
                        .then_some(now.exit_code)
                };
                if let Some(code) = stopped {
                    return exit_code_of(code.unwrap_or(unexpected));
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

    /// The marker store.
    pub fn store(&self) -> &MarkerStore {
        &self.store
    }

    /// This process's identity, as read at start-up.
    pub fn identity(&self) -> ProcessIdentity {
        self.own
    }

    /// Leases every item earlier stops left unfinished in the record store, oldest first, to
    /// this process: resume each, then [`ServiceHandle::acknowledge`] it once the work is taken
    /// over for good (or hand it back at the next stop with [`DrainReport::handed_back`]). An
    /// item this process neither acknowledges nor hands back is offered again once it is gone,
    /// so a crash loses nothing. Empty without a record store.
    ///
    /// [`DrainReport::handed_back`]: crate::DrainReport::handed_back
    ///
    /// ```
    /// # use planned_stop::{DrainReport, PlannedStopService, StopRequest};
    /// # use planned_stop::Layout;
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
    ///         let service = PlannedStopService::builder(Layout::Slots(dir.join("run")))
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
        let store = self.records.clone();
        let owner = self.owner.clone();
        let lease_for = self.lease_for;
        let held = self.held.clone();
        async move {
            let leased = match store {
                Some(store) => store.lease(&owner, usize::MAX, lease_for).await?,
                None => Vec::new(),
            };
            if let Ok(mut h) = held.lock() {
                h.extend(leased.iter().map(|l| l.item.id.clone()));
            }
            Ok(leased)
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
        let held = self.held.clone();
        async move {
            let result = match store {
                Some(store) => store.acknowledge(&owner, &id).await,
                None => Err(RecordError::UnknownItem { id: id.clone() }),
            };
            // Done, or not ours (any more): either way nothing to renew.
            if !matches!(result, Err(RecordError::Backend { .. }))
                && let Ok(mut h) = held.lock()
            {
                h.remove(&id);
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
        let held = self.held.clone();
        async move {
            let result = match store {
                Some(store) => store.release(Some(&owner), &id).await,
                None => Err(RecordError::UnknownItem { id: id.clone() }),
            };
            if !matches!(result, Err(RecordError::Backend { .. }))
                && let Ok(mut h) = held.lock()
            {
                h.remove(&id);
            }
            result
        }
    }

    /// The record store, if one is configured.
    pub fn record_store(&self) -> Option<&Arc<dyn RecordStore>> {
        self.records.as_ref()
    }

    /// This process as the owner of its leases.
    pub fn owner(&self) -> &Owner {
        &self.owner
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Installing the signal handlers is the last fallible step of `start`: when it fails, no
    /// runner is left behind (one used to be running already, and its drop guard ended the
    /// process about 30 s later when the application went on without it).
    #[test]
    fn a_start_that_fails_on_signals_leaves_no_runner() {
        let dir = tempfile::tempdir().unwrap();
        System::new().block_on(async {
            crate::signals::FAIL_NEXT.set(true);
            let before = crate::runner::LIVE.get();
            let result = PlannedStopService::builder(Layout::Slots(dir.path().join("run")))
                // Off, so a runner left behind shows in the count instead of ending the tests.
                .owns_process_exit(false)
                .start();
            assert!(matches!(result, Err(StartError::Signals(_))), "{result:?}");
            for _ in 0..16 {
                tokio::task::yield_now().await;
            }
            assert_eq!(
                crate::runner::LIVE.get(),
                before,
                "a runner was left behind"
            );
            // The application retries without signal handlers, and that service works.
            let handle = PlannedStopService::builder(Layout::Slots(dir.path().join("run")))
                .owns_process_exit(false)
                .handle_signals(false)
                .start()
                .unwrap();
            assert_eq!(crate::runner::LIVE.get(), before + 1);
            handle.ready();
            handle.request_stop(StopRequest::Planned);
            assert_eq!(handle.stopped().await, std::process::ExitCode::SUCCESS);
        });
    }
}

//! [`ServiceBuilder`]: what a service is configured with, and `start`, which wires the runner,
//! the watcher, the record store and the lease keeper together.

use super::{MIN_LEASE, ServiceHandle, StartError, keep_leases};
use crate::clock::Clock;
use crate::error_chain::ErrorChain;
use crate::events::SlotEvents;
use crate::identity::ProcessIdentity;
use crate::judgement::Policy;
use crate::lifecycle::StopVerdict;
use crate::record::{FileRecordStore, RecordStore, Sharing};
use crate::runner::{Drain, DrainPhase, ExitCodes, RunnerActor, RunnerConfig};
use crate::store::{Layout, MarkerStore};
use crate::watcher::{MarkerWatcherActor, OwnSlot};
use actix::prelude::*;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Configures and starts the runner and the watcher.
///
/// ```
/// use planned_stop::{ExitCodes, Layout, ServiceBuilder, StopCause, StopVerdict};
/// let _builder = ServiceBuilder::new(Layout::Slots("/run/app".into()))
///     .state_dir("/var/lib/app")
///     .drain_deadline(std::time::Duration::from_secs(20))
///     .exit_codes(ExitCodes::default().with(StopCause::Request, StopVerdict::Unexpected, 3));
/// ```
#[must_use = "a builder or value that is dropped configures nothing"]
pub struct ServiceBuilder {
    pub(super) layout: Layout,
    pub(super) policy: Policy,
    pub(super) allow_shared_dir: bool,
    pub(super) poll_interval: Duration,
    pub(super) runner: RunnerConfig,
    pub(super) participants: Vec<(DrainPhase, String, Recipient<Drain>)>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) identity: Option<ProcessIdentity>,
    /// Installs the signal handlers that forward to the runner; `None` installs none
    /// ([`ServiceBuilder::handle_signals`]). A function so a test can hand in one that fails.
    pub(super) signals: Option<SignalListener>,
    pub(super) events: bool,
    pub(super) records: Records,
    pub(super) allow_shared_state: bool,
    pub(super) lease_for: Duration,
    pub(super) max_failed_attempts: u32,
    pub(super) restart_in_place: Option<Duration>,
    pub(super) forced_exit: Option<crate::runner::process_end::ForcedExitHook>,
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
pub(super) enum Records {
    None,
    Dir(PathBuf),
    Store(Arc<dyn RecordStore>),
}

/// The shortest poll interval taken (see [`ServiceBuilder::poll_interval`]).
const MIN_POLL_INTERVAL: Duration = Duration::from_millis(1);

impl ServiceBuilder {
    /// Whether to install handlers for SIGTERM, SIGINT and SIGHUP (console events on Windows) that
    /// feed the runner (default `true`). Turn it off when something else owns the signals and
    /// forwards them with [`ServiceHandle::signal`]. Once installed, a handler stays for the life of
    /// the process.
    ///
    /// ```
    /// let _b = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into())).handle_signals(false);
    /// ```
    pub fn handle_signals(mut self, handle: bool) -> Self {
        self.signals = handle.then_some(crate::signals::listen as SignalListener);
        self
    }

    /// Keeps the stop record and the unfinished items in a state directory on this host
    /// ([`FileRecordStore`], created 0700 at start; one that group or others can write is refused
    /// unless [`ServiceBuilder::allow_shared_state`]). Several services may share it.
    ///
    /// ```
    /// let _b = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into())).state_dir("/var/lib/app");
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

    /// How many failed attempts an item may have before it is held aside for a person rather
    /// than resumed again (default [`crate::DEFAULT_MAX_FAILED_ATTEMPTS`], at least 1: 0
    /// fails the start). An attempt fails when the life holding the item ends without handing it
    /// back or completing it (killed, crashed), or hands it back because its task panicked
    /// ([`crate::TaskGroup`], [`crate::DrainReport::with_failed`]); a planned stop that hands it
    /// back is no failure, or every deploy would count. An item held aside stays in the record
    /// store, listed with its failures and the last one, until an operator releases it
    /// ([`crate::record::RecordStore::release`]) or drops it; holding it aside is a WARN and a
    /// metric (`planned_stop_items_held_aside_total`).
    ///
    /// ```
    /// let _b = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into()))
    ///     .max_failed_attempts(3);
    /// ```
    pub fn max_failed_attempts(mut self, max: u32) -> Self {
        self.max_failed_attempts = max;
        self
    }

    /// Restarts in place (off by default): a planned restart starts the successor — the
    /// executable on disk now, with this process's arguments and environment — hands it the
    /// listening sockets taken through `web::listeners_or_bind` (the `actix-web` feature), and
    /// waits up to `ready_within` for its [`ServiceHandle::ready`]. Only then does this process
    /// stop accepting, drain as in a planned stop, record what is left (for the successor's
    /// resume) and exit with the planned code (0), so no connection is refused across the swap.
    /// The successor runs detached, in a process group of its own (the service manager adopts
    /// it). A successor that ends, closes its readiness pipe, or is not ready in time leaves this
    /// process serving: its whole process group is killed, and the restart is reported as
    /// failed. Unix only; for PID 1 (a container) and elsewhere a restart exits with the restart
    /// code for the supervisor, with a WARN at the start.
    ///
    /// ```
    /// let _b = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into()))
    ///     .restart_in_place(std::time::Duration::from_secs(30));
    /// ```
    pub fn restart_in_place(mut self, ready_within: Duration) -> Self {
        self.restart_in_place = Some(ready_within);
        self
    }

    /// Whether the watcher also reacts to filesystem notifications on the marker's directory
    /// (default `true`; falls back to polling alone, with a warning, where notifications are not
    /// available). The poll keeps running as a safety net either way.
    ///
    /// ```
    /// let _poll_only = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into())).events(false);
    /// ```
    pub fn events(mut self, events: bool) -> Self {
        self.events = events;
        self
    }

    /// How often the watcher probes. Default 250 ms; anything under 1 ms is taken as 1 ms (a
    /// zero interval would probe in a busy loop).
    ///
    /// ```
    /// let _b = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into())).poll_interval(std::time::Duration::from_secs(1));
    /// ```
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval.max(MIN_POLL_INTERVAL);
        self
    }

    /// How long the drain participants have. Default 10 s.
    ///
    /// ```
    /// let _b = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into())).drain_deadline(std::time::Duration::from_secs(30));
    /// ```
    pub fn drain_deadline(mut self, deadline: Duration) -> Self {
        self.runner.drain_deadline = deadline;
        self
    }

    /// The marker policy (TTL, skew, start slack).
    ///
    /// ```
    /// use planned_stop::{Layout, ServiceBuilder};
    /// use planned_stop::marker::Policy;
    /// let policy = Policy::default().with_ttl(std::time::Duration::from_secs(300));
    /// let _b = ServiceBuilder::new(Layout::Slots("/run/app".into())).policy(policy);
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Accepts a marker directory writable by group or others (see
    /// [`crate::store::MarkerStoreBuilder::allow_shared_dir`]).
    ///
    /// ```
    /// let _b = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/srv/shared".into())).allow_shared_dir(true);
    /// ```
    pub fn allow_shared_dir(mut self, allow: bool) -> Self {
        self.allow_shared_dir = allow;
        self
    }

    /// Exit codes by verdict and cause.
    ///
    /// ```
    /// use planned_stop::{ExitCodes, Layout, ServiceBuilder, SignalKind, StopCause, StopVerdict};
    /// // Exit 75 for any unexpected stop; a SIGHUP is a clean stop for this application.
    /// let codes = ExitCodes::default()
    ///     .with_unexpected(75)
    ///     .with(StopCause::Signal(SignalKind::Hangup), StopVerdict::Unexpected, 0);
    /// let _b = ServiceBuilder::new(Layout::Slots("/run/app".into())).exit_codes(codes);
    /// ```
    pub fn exit_codes(mut self, codes: ExitCodes) -> Self {
        self.runner.exit_codes = codes;
        self
    }

    /// Registers a drain participant.
    ///
    /// ```
    /// use actix::prelude::*;
    /// use planned_stop::{Drain, DrainReport, Layout, ServiceBuilder};
    /// struct Jobs;
    /// impl Actor for Jobs { type Context = Context<Self>; }
    /// impl Handler<Drain> for Jobs {
    ///     type Result = DrainReport;
    ///     fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> DrainReport { DrainReport::default() }
    /// }
    /// actix::System::new().block_on(async {
    ///     let _b = ServiceBuilder::new(Layout::Slots("/run/app".into())).participant("jobs", Jobs.start().recipient());
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
    /// use planned_stop::{DrainPhase, Layout, ServiceBuilder};
    /// use std::time::Duration;
    /// // 25 s in all; the HTTP server gets at most 10 of them, the workers what remains.
    /// let _b = ServiceBuilder::new(Layout::Slots("/run/app".into()))
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

    /// Whether the runner keeps the verdict's exit code whatever `main` returns (default `true`).
    ///
    /// `main` returns what [`ServiceHandle::stopped`] resolves to; this covers the `main`s that
    /// do not: one that returns `Ok(())`, panics or returns an error after an unexpected stop
    /// ends with the unexpected code once std has printed what it prints (an `atexit`
    /// correction), and one that never returns (a server run with `block_on`) is ended with the
    /// verdict's code [`Self::exit_grace`] after the stop concluded. The library ends the process
    /// before `main` returns only then and when a drain overruns all its deadlines.
    /// docs/design.md has the table of `main` layouts and the codes they end with.
    ///
    /// Off (embedding the runner in a larger program, tests): nothing in the library ends the
    /// process or changes its code.
    ///
    /// ```
    /// // Run the runner inside a larger program that ends by other means.
    /// let _b = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots("/run/app".into())).owns_process_exit(false);
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

    /// A last word before the library ends the process itself (the overrun watchdog, the exit
    /// grace passing): `hook`
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
    /// Every fallible step comes first: an error leaves nothing running.
    ///
    /// ```
    /// # use planned_stop::{Layout, ServiceBuilder, ProcessState, StopRequest};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let code = actix::System::new().block_on(async {
    ///     let service = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
    ///         .handle_signals(false)
    ///         .start()
    ///         .unwrap();
    ///     assert_eq!(service.status().state, ProcessState::Starting);
    ///     service.ready();
    ///     // The application decides to stop on purpose: drain, record, exit 0.
    ///     service.request_stop(StopRequest::Planned);
    ///     service.stopped().await
    /// });
    /// assert_eq!(code, std::process::ExitCode::SUCCESS);
    /// ```
    pub fn start(self) -> Result<ServiceHandle, StartError> {
        self.check()?;
        let own = self.identity.map_or_else(ProcessIdentity::current, Ok)?;
        let store = open_marker_store(
            self.layout,
            self.policy,
            self.allow_shared_dir,
            self.clock.now(),
        )?;
        let (state_dir, records) =
            open_records(self.records, self.allow_shared_state, &self.clock)?;
        let (context, runner) = mailbox(self.signals)?;
        let mut config = self.runner;
        config.records = records.clone();
        let unexpected_code = i32::from(config.exit_codes.unexpected);
        let owns_exit = config.owns_process_exit;
        #[cfg(all(unix, feature = "systemd"))]
        let after_drain = config.stop_bound(Duration::ZERO);
        let mut actor = RunnerActor::new(store.clone(), own, config, self.clock.clone());
        let held = Arc::new(std::sync::Mutex::new(BTreeSet::new()));
        actor.holding(held.clone());
        let handover = Arc::new(crate::handover::Handover::default());
        let in_place = in_place(self.restart_in_place, own.pid, &handover);
        let restarts_in_place = in_place.is_some();
        actor.restart_in_place(in_place);
        for (phase, name, recipient) in self.participants {
            actor.add_participant(phase, name, recipient);
        }
        let status = actor.subscribe();
        crate::telemetry::describe();
        if owns_exit {
            arm_process_end(self.forced_exit, unexpected_code);
        }
        context.run(actor);
        #[cfg(all(unix, feature = "systemd"))]
        {
            crate::systemd::follow(status.clone(), after_drain);
            crate::systemd::heartbeat(status.clone());
        }
        let since = self.clock.now();
        let watcher = MarkerWatcherActor::new(
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
        .stops_runner_on_panic(runner.clone().recipient())
        .keeps_watching_after_restarts(restarts_in_place);
        start_watcher(watcher, &store, own.pid, self.events);
        announce(
            &store,
            &own,
            since,
            state_dir.as_deref(),
            records.is_some(),
            owns_exit,
        );
        let owner = crate::record::host::this_process(&own);
        keep_leases(&records, &owner, &held, self.lease_for, &status);
        Ok(ServiceHandle {
            runner,
            status,
            own,
            owner,
            records,
            lease_for: self.lease_for,
            max_failed_attempts: self.max_failed_attempts,
            integration: Arc::default(),
            handover,
            held,
            delivered: Arc::default(),
            acks: Arc::default(),
            unexpected_code,
        })
    }

    /// What `start` refuses before it touches anything: no actix `System`, a lease too short
    /// to renew, no attempt allowed.
    fn check(&self) -> Result<(), StartError> {
        if System::try_current().is_none() {
            return Err(StartError::NoSystem);
        }
        if self.lease_for < MIN_LEASE {
            return Err(StartError::LeaseTooShort {
                lease: self.lease_for,
                min: MIN_LEASE,
            });
        }
        if self.max_failed_attempts == 0 {
            return Err(StartError::NoAttemptAllowed);
        }
        Ok(())
    }
}

/// The runner's mailbox, which exists before the runner does: the signal handlers, the last
/// fallible step, are installed against it, and only then is the runner made and run. A
/// failure leaves no runner behind (its drop guard would end the process later).
fn mailbox(
    signals: Option<SignalListener>,
) -> Result<(Context<RunnerActor>, Addr<RunnerActor>), StartError> {
    let context: Context<RunnerActor> = Context::new();
    let runner = context.address();
    if let Some(listen) = signals {
        listen(runner.clone().recipient()).map_err(StartError::Signals)?;
    }
    Ok((context, runner))
}

/// Starts forwarding the OS's stop signals to the runner ([`crate::signals::listen`]).
pub(super) type SignalListener =
    fn(actix::Recipient<crate::runner::OsSignal>) -> std::io::Result<()>;

/// The runner keeps the process's exit code: the process ends with the unexpected code when it
/// would otherwise end before the runner concluded.
fn arm_process_end(
    forced_exit: Option<crate::runner::process_end::ForcedExitHook>,
    unexpected_code: i32,
) {
    if let Some(hook) = forced_exit {
        crate::runner::process_end::on_forced_exit(hook);
    }
    crate::runner::process_end::arm(unexpected_code);
}

/// The marker directory, opened by its policy, with what earlier processes left swept.
fn open_marker_store(
    layout: Layout,
    policy: Policy,
    allow_shared_dir: bool,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<MarkerStore, StartError> {
    let store = MarkerStore::builder(layout)
        .policy(policy)
        .allow_shared_dir(allow_shared_dir)
        .open()?;
    match store.sweep(now) {
        Ok(report) if report != Default::default() => {
            tracing::info!(?report, "swept markers of earlier processes")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %ErrorChain(&e), "cannot sweep the marker directory"),
    }
    Ok(store)
}

/// The state directory's absolute path when the records are a directory (for the start's log
/// line), and the record store.
type Opened = (Option<PathBuf>, Option<Arc<dyn RecordStore>>);

/// The record store the builder names, opened (see [`Opened`]).
fn open_records(
    records: Records,
    allow_shared_state: bool,
    clock: &Arc<dyn Clock>,
) -> Result<Opened, StartError> {
    Ok(match records {
        Records::None => (None, None),
        Records::Dir(dir) => {
            let absolute = std::path::absolute(&dir).unwrap_or_else(|_| dir.clone());
            let sharing = if allow_shared_state {
                Sharing::Allowed
            } else {
                Sharing::Refused
            };
            let store = FileRecordStore::open(dir, sharing)?.with_clock(clock.clone());
            (Some(absolute), Some(Arc::new(store)))
        }
        Records::Store(store) => (None, Some(store)),
    })
}

/// Starts the watcher, woken by filesystem notifications of its slot when `events` (polling
/// only when they cannot be had, with a WARN).
fn start_watcher(mut watcher: MarkerWatcherActor, store: &MarkerStore, pid: u32, events: bool) {
    if events {
        match SlotEvents::watch(&store.slot_path(pid)) {
            Ok((events, wakeups)) => watcher = watcher.with_wakeups(wakeups, Some(events)),
            Err(e) => tracing::warn!(error = %ErrorChain(&e),
                "no filesystem notifications for the marker directory; polling only"),
        }
    }
    watcher.start();
}

/// Announces that this process watches its directory — before `start` returns, so before the
/// application can say it is ready: a stopper that finds no announcement can warn that nothing
/// here reads its marker — and logs the start.
fn announce(
    store: &MarkerStore,
    own: &ProcessIdentity,
    since: chrono::DateTime<chrono::Utc>,
    state_dir: Option<&std::path::Path>,
    records: bool,
    owns_exit: bool,
) {
    if let Err(e) = store.write_presence(&crate::stopper::Presence::new(own, since)) {
        tracing::warn!(error = %ErrorChain(&e), "cannot write the presence file; stoppers \
            will warn that this process has not announced watching the directory");
    }
    let marker_dir = std::path::absolute(store.dir()).unwrap_or_else(|_| store.dir().into());
    tracing::info!(
        pid = own.pid,
        start = own.start,
        marker_dir = %marker_dir.display(),
        // Display, not Debug: a Windows path must read as itself, not with doubled backslashes.
        state_dir = %state_dir.map_or_else(|| "none".to_owned(), |d| d.display().to_string()),
        records,
        owns_process_exit = owns_exit,
        "planned-stop service started; a planned stop is a marker for this process in its \
         marker directory (docs/protocol.md)"
    );
}

/// The runner's restart in place, when it was asked for and can work here (a WARN when not).
fn in_place(
    asked: Option<Duration>,
    pid: u32,
    handover: &Arc<crate::handover::Handover>,
) -> Option<(Arc<crate::handover::Handover>, Duration)> {
    use crate::handover::{RestartMode, restart_mode};
    let within = asked?;
    match restart_mode(true, pid, cfg!(unix)) {
        RestartMode::InPlace => Some((handover.clone(), within)),
        RestartMode::BySupervisor(why) => {
            tracing::warn!(
                why = why.unwrap_or_default(),
                "restart in place is off: a planned restart exits with the restart code, for \
                 the supervisor to start the process again"
            );
            None
        }
    }
}

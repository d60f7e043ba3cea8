//! The stopper's side: ask one specific process to stop, and find out how it went.
//!
//! [`request`] reads the target's identity (refusing a pid that is not running, or that belongs to
//! another process than the caller expects), writes the marker for exactly that identity, and
//! optionally sends SIGTERM after it — never before, so the signal is always classified planned
//! (hazard 8: a stopper that wrote the marker and killed at once left no time to drain).
//!
//! [`wait`] then follows the target *by identity*, not by pid: if the pid is reused while waiting,
//! the target is gone. It reads the runner's [`Outcome`] file to tell "accepted, draining" from "not
//! seen yet", and the final verdict and exit code once the target has exited. It looks every 20 ms,
//! and on Linux it also holds a pidfd of the target, which the kernel makes readable the moment the
//! target exits: the report follows the exit at once, not up to a poll interval later
//! ([`ExitWatch`]).

use crate::ProcessState;
use crate::identity::ProcessIdentity;
pub use crate::outcome::{DrainSummary, Outcome, Presence};
use crate::schema::Marker;
use crate::store::{MarkerStore, StoreError};
use chrono::Utc;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How often [`wait`] looks at the target.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// How [`wait_for_request`] learns that the target has exited.
///
/// ```
/// assert_eq!(planned_stop_protocol::stopper::ExitWatch::default(), planned_stop_protocol::stopper::ExitWatch::Events);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ExitWatch {
    /// From the OS where it can tell (Linux 5.3 and later: a pidfd, readable once the target
    /// exits), besides looking every 20 ms; elsewhere, or when the pidfd cannot be had, by looking.
    #[default]
    Events,
    /// Only by looking every 20 ms (`stop --no-events`; the baseline of the latency harness).
    Poll,
}

/// What to ask for: [`StopOptions::new`] (or `default()`, the same) and the `with_` setters.
///
/// ```
/// use planned_stop_protocol::stopper::StopOptions;
/// let options = StopOptions::new().with_reason("deploy").with_signal(true);
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "a builder or value that is dropped configures nothing"]
pub struct StopOptions {
    /// Free text for the target's logs and stop record.
    pub(crate) reason: Option<String>,
    /// The request id; one is generated when `None`.
    pub(crate) request_id: Option<String>,
    /// `false` writes a marker that only classifies a signal that follows as planned; the target's
    /// watcher leaves it alone (systemd `ExecStop`). Default through [`StopOptions::new`]: `true`.
    pub(crate) trigger_watcher: bool,
    /// The start fingerprint the caller expects the target to have; a different one is refused.
    pub(crate) expect_start: Option<u64>,
    /// Send SIGTERM after writing the marker (Unix only).
    pub(crate) signal: bool,
    /// Send that SIGTERM even to a process that has not announced watching the directory (one
    /// that reads markers without announcing, such as a port of the protocol). Without it such a
    /// request is refused before anything is written: a mistyped pid must not kill a bystander.
    pub(crate) signal_unwatched: bool,
    /// Stop and stay down, or restart (see [`crate::schema::StopAction`]).
    pub(crate) action: crate::schema::StopAction,
    /// A drain deadline for this request, when it must be shorter than the target's own
    /// ([`crate::schema::Marker::drain_deadline`]).
    pub(crate) drain_deadline: Option<Duration>,
}

impl StopOptions {
    /// Options that trigger the watcher and send no signal.
    pub fn new() -> StopOptions {
        StopOptions {
            reason: None,
            request_id: None,
            trigger_watcher: true,
            expect_start: None,
            signal: false,
            signal_unwatched: false,
            action: crate::schema::StopAction::Stop,
            drain_deadline: None,
        }
    }

    /// Ask the target to drain within `deadline` (or its own deadline, if shorter): a faster
    /// stop than the service would give itself, still drained and recorded.
    pub fn with_drain_deadline(mut self, deadline: Duration) -> StopOptions {
        self.drain_deadline = Some(deadline);
        self
    }

    /// Ask for a planned restart instead of a stop: the target drains and records alike, and
    /// exits with its restart code (75 by default) so its supervisor starts it again.
    pub fn with_action(mut self, action: crate::schema::StopAction) -> StopOptions {
        self.action = action;
        self
    }

    /// Free text for the target's logs and stop record.
    pub fn with_reason(mut self, reason: impl Into<String>) -> StopOptions {
        self.reason = Some(reason.into());
        self
    }

    /// The request id to write instead of a generated one.
    pub fn with_request_id(mut self, request_id: impl Into<String>) -> StopOptions {
        self.request_id = Some(request_id.into());
        self
    }

    /// `false` leaves the marker to classify a signal that follows (systemd `ExecStop`).
    pub fn with_trigger_watcher(mut self, trigger: bool) -> StopOptions {
        self.trigger_watcher = trigger;
        self
    }

    /// Refuse unless the target's start fingerprint is `start`.
    pub fn with_expected_start(mut self, start: u64) -> StopOptions {
        self.expect_start = Some(start);
        self
    }

    /// Send SIGTERM after writing the marker (Unix only).
    pub fn with_signal(mut self, signal: bool) -> StopOptions {
        self.signal = signal;
        self
    }

    /// Send the SIGTERM of [`Self::with_signal`] even to a process that has not announced
    /// watching the directory (one that reads markers without announcing, such as a port of the
    /// protocol). Without it such a request is refused before anything is written: a mistyped pid
    /// must not kill a bystander.
    pub fn with_signal_unwatched(mut self, insist: bool) -> StopOptions {
        self.signal_unwatched = insist;
        self
    }
}

/// The same as [`StopOptions::new`]: a stop that triggers the target's watcher.
impl Default for StopOptions {
    fn default() -> Self {
        StopOptions::new()
    }
}

/// A stop request that was written.
///
/// ```
/// # use planned_stop_protocol::{Layout, ProcessIdentity};
/// # use planned_stop_protocol::marker::MarkerStore;
/// # let dir = tempfile::tempdir().unwrap();
/// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
/// // Ask this very process (nobody is watching here, so nothing stops).
/// let r = planned_stop_protocol::stopper::request(&store, std::process::id(), &planned_stop_protocol::stopper::StopOptions::new()).unwrap();
/// assert_eq!(r.target, ProcessIdentity::current().unwrap());
/// assert!(r.slot.exists() && !r.signalled && !r.watching);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Requested {
    /// The target, as identified when the marker was written.
    pub target: ProcessIdentity,
    /// The marker written.
    pub marker: Marker,
    /// Where it was written.
    pub slot: PathBuf,
    /// Whether SIGTERM was sent.
    pub signalled: bool,
    /// Whether the target had announced that it watches this directory when the marker was
    /// written ([`MarkerStore::is_watched_by`]). `false` is a warning, not a refusal: the target
    /// may still be starting, or be a port of the protocol that reads markers without
    /// announcing; but it is also what a wrong directory, or a
    /// process that is not a planned-stop service, looks like.
    pub watching: bool,
}

/// Why a stop request could not be made.
///
/// ```
/// use planned_stop_protocol::stopper::{request, StopOptions, StopperError};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
/// let wrong = StopOptions::new().with_expected_start(0);
/// let err = request(&store, std::process::id(), &wrong).unwrap_err();
/// assert!(matches!(err, StopperError::WrongIdentity { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StopperError {
    /// No process with that pid is running.
    #[error("no process with pid {pid} is running (already gone?)")]
    NotRunning {
        /// The pid asked for.
        pid: u32,
    },
    /// The process at that pid is not the one the caller expected.
    #[error(
        "process {pid} has start fingerprint {actual}, not {expected}: it is another process that \
         reused the pid; refusing to stop it"
    )]
    WrongIdentity {
        /// The pid asked for.
        pid: u32,
        /// The fingerprint the caller expected.
        expected: u64,
        /// The fingerprint found.
        actual: u64,
    },
    /// The marker could not be written.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A SIGTERM was asked for, toward a process that has not announced watching the directory:
    /// refused before anything was written (a mistyped pid would kill a bystander).
    #[error(
        "process {pid} has not announced that it watches {dir}: refusing to send it SIGTERM (a \
         mistyped pid would kill an unrelated process)"
    )]
    NotWatching {
        /// The pid asked for.
        pid: u32,
        /// The marker directory.
        dir: std::path::PathBuf,
    },
    /// A SIGTERM was asked for, and whether the process watches the directory cannot be told:
    /// its announcement is there but this user may not read it. Refused before anything was
    /// written; the cause is a permission, not a wrong pid.
    #[error(
        "cannot tell whether process {pid} watches {dir}: {path} cannot be read by this user \
         (permission denied); ask as the service's user or as root, who can read it"
    )]
    AnnouncementUnreadable {
        /// The pid asked for.
        pid: u32,
        /// The marker directory.
        dir: std::path::PathBuf,
        /// The presence or outcome file that could not be read.
        path: std::path::PathBuf,
    },
    /// SIGTERM could not be sent (the marker was written).
    #[error("the signal to process {pid} failed (a marker, if asked for, was written)")]
    Signal {
        /// The target.
        pid: u32,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Writes a stop request for the running process `pid` into `store` (see the module docs).
///
/// ```
/// # use planned_stop_protocol::Layout;
/// # use planned_stop_protocol::marker::MarkerStore;
/// use planned_stop_protocol::stopper::{request, StopOptions, StopperError};
/// # let dir = tempfile::tempdir().unwrap();
/// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
/// // A pid nobody has: refused before anything is written.
/// let err = request(&store, u32::MAX - 1, &StopOptions::new()).unwrap_err();
/// assert!(matches!(err, StopperError::NotRunning { .. }));
/// ```
pub fn request(
    store: &MarkerStore,
    pid: u32,
    options: &StopOptions,
) -> Result<Requested, StopperError> {
    let target = ProcessIdentity::of(pid).ok_or(StopperError::NotRunning { pid })?;
    // Remembered before the marker is written: the target may answer and exit before the
    // stopper's next look, and the files it wrote as its own user must still count then.
    let _ = store.users_of(pid, target.start);
    if let Some(expected) = options.expect_start
        && expected != target.start
    {
        return Err(StopperError::WrongIdentity {
            pid,
            expected,
            actual: target.start,
        });
    }
    if options.signal && !options.signal_unwatched && !store.is_watched_by(&target) {
        let dir = store.dir().to_path_buf();
        return Err(match store.unreadable_announcement(pid) {
            Some(path) => StopperError::AnnouncementUnreadable { pid, dir, path },
            None => StopperError::NotWatching { pid, dir },
        });
    }
    let now = Utc::now();
    let request_id = options.request_id.clone().unwrap_or_else(|| {
        format!(
            "{}-{}",
            std::process::id(),
            now.timestamp_nanos_opt().unwrap_or_default()
        )
    });
    let mut marker = Marker::new(pid, Some(target.start), now)
        .with_stopper_pid(std::process::id())
        .with_request_id(request_id)
        .with_trigger_watcher(options.trigger_watcher)
        .with_action(options.action);
    if let Some(reason) = &options.reason {
        marker = marker.with_reason(reason.clone());
    }
    if let Some(deadline) = options.drain_deadline {
        marker = marker.with_drain_deadline(deadline);
    }
    let slot = store.write(&marker)?;
    let watching = store.is_watched_by(&target);
    tracing::info!(pid, slot = %slot.display(), request_id = marker.request_id.as_deref(), watching, "marker written");
    let signalled = options.signal && os::send_terminate(&target)?;
    Ok(Requested {
        target,
        marker,
        slot,
        signalled,
        watching,
    })
}

/// Ends `target` with SIGKILL (Unix), if the process at its pid is still that process: the
/// escalation a supervisor applies when a stop overruns (systemd at `TimeoutStopSec`). Returns
/// whether it was sent. No drain, no record: for a target that did not stop in time.
pub fn kill(target: &ProcessIdentity) -> Result<bool, StopperError> {
    os::send(target, os::KILL)
}

/// How often [`force`] repeats its Ctrl-C while the target still runs.
const FORCE_EVERY: Duration = Duration::from_millis(100);

/// Forces `target`'s drain (Unix), the step before [`kill`]: SIGINT, repeated every 100 ms
/// until the target is gone or `within` runs out. A Ctrl-C during a drain is what forces it (the
/// second one; two sent at once may arrive as one, hence the repetition); where no drain runs
/// yet, the first begins a planned one that the next forces. A forced drain still records what
/// its participants handed back, and ends the process with its planned code. Returns how the
/// wait ended ([`WaitOutcome::is_running`] if the target still runs).
pub fn force(
    store: &MarkerStore,
    target: &ProcessIdentity,
    within: Duration,
) -> Result<WaitOutcome, StopperError> {
    let deadline = Instant::now() + within;
    loop {
        let sent = os::send(target, os::INTERRUPT)?;
        let left = deadline.saturating_duration_since(Instant::now());
        let wait_for = if sent {
            left.min(FORCE_EVERY)
        } else {
            Duration::ZERO
        };
        let outcome = wait(store, target, wait_for, |_, _| {});
        if !sent || !outcome.is_running() || left.is_zero() {
            return Ok(outcome);
        }
    }
}

#[cfg(unix)]
mod os {
    use super::StopperError;
    use crate::identity::ProcessIdentity;

    use rustix::process::{Pid, Signal};

    pub(super) const KILL: Signal = Signal::KILL;
    pub(super) const INTERRUPT: Signal = Signal::INT;

    /// Sends SIGTERM (`kill(2)`) to `target` if the process at its pid is still that process.
    /// Returns whether it was sent. (The check and the kill are two steps; the window between
    /// them is microseconds.)
    pub(super) fn send_terminate(target: &ProcessIdentity) -> Result<bool, StopperError> {
        send(target, Signal::TERM)
    }

    /// Sends `signal` to `target` if the process at its pid is still that process.
    pub(super) fn send(target: &ProcessIdentity, signal: Signal) -> Result<bool, StopperError> {
        if ProcessIdentity::of(target.pid) != Some(*target) {
            return Ok(false);
        }
        // A pid that is no positive i32 names no process (and 0 or -1 would name groups).
        let pid = i32::try_from(target.pid)
            .ok()
            .and_then(Pid::from_raw)
            .ok_or(StopperError::NotRunning { pid: target.pid })?;
        rustix::process::kill_process(pid, signal)
            .map(|()| true)
            .map_err(|e| StopperError::Signal {
                pid: target.pid,
                source: e.into(),
            })
    }
}

#[cfg(not(unix))]
mod os {
    use super::StopperError;
    use crate::identity::ProcessIdentity;

    /// The signal `--kill` would send (none exists here).
    pub(super) const KILL: () = ();
    /// The signal that forces a drain (none exists here).
    pub(super) const INTERRUPT: () = ();

    /// No signals here: `--kill` is refused rather than pretended.
    pub(super) fn send(target: &ProcessIdentity, _: ()) -> Result<bool, StopperError> {
        Err(StopperError::Signal {
            pid: target.pid,
            source: std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "killing the target is supported on Unix only",
            ),
        })
    }

    /// Windows has no SIGTERM; the marker is the only channel.
    pub(super) fn send_terminate(target: &ProcessIdentity) -> Result<bool, StopperError> {
        tracing::warn!(
            pid = target.pid,
            "signals are not supported on this OS; the marker alone \
             will stop the target"
        );
        Ok(false)
    }
}

/// How a wait ended.
///
/// ```
/// use planned_stop_protocol::stopper::{wait, WaitOutcome};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
/// // This process has not accepted anything: not accepted at the deadline.
/// let me = planned_stop_protocol::ProcessIdentity::current().unwrap();
/// let outcome = wait(&store, &me, std::time::Duration::from_millis(50), |_, _| {});
/// assert_eq!(outcome, WaitOutcome::NotAccepted);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum WaitOutcome {
    /// The target exited after a planned stop.
    StoppedPlanned {
        /// Its exit code.
        exit_code: i32,
        /// Its outcome file.
        outcome: Outcome,
    },
    /// The target exited, but not as planned: its outcome says an unexpected verdict, or that it
    /// was aborted (its actix `System` ended before the runner finished).
    StoppedUnexpectedly {
        /// Its exit code, when it wrote one.
        exit_code: Option<i32>,
        /// Its outcome file, if any.
        outcome: Option<Outcome>,
    },
    /// The target took the request and still ran at the deadline, its stop under way:
    /// `outcome.state` says how far it got — `held` (not ready yet: it drains once it is),
    /// `handing_over` (a restart in place whose successor is not ready yet; the target serves on)
    /// or `draining`.
    InProgress {
        /// Its outcome file.
        outcome: Outcome,
    },
    /// The target was still running at the deadline and had not accepted the stop.
    NotAccepted,
    /// The target finished its stop (its outcome is final: stopped, record lost, aborted) but
    /// was still alive at the deadline: its runner does not own the process's end
    /// (`ServiceBuilder::owns_process_exit(false)`) and its `main` has not ended it, or it is
    /// stuck on the way out. Not a refusal: the stop happened, the process did not end.
    StoppedStillAlive {
        /// Its final outcome file.
        outcome: Outcome,
    },
    /// The target exited without writing any outcome: not a planned-stop service, or killed
    /// (SIGKILL, a crash) before it accepted the stop. What happened is unknown.
    GoneWithoutOutcome,
    /// The target accepted the stop and was killed (or crashed) before it finished: its last
    /// outcome still says it was draining (or holding the stop), and no stop record was written.
    KilledWhileDraining {
        /// Its last outcome file.
        outcome: Outcome,
    },
    /// The target stopped, but could not make its unfinished work durable (its record store
    /// failed): the items are only in its log (stderr, as JSON at ERROR). Never a planned success.
    RecordLost {
        /// Its exit code (the record-lost code).
        exit_code: Option<i32>,
        /// Its outcome file, state `record_lost`.
        outcome: Outcome,
    },
    /// A planned restart in place of this request did not happen: the successor ended or was
    /// not ready in time (`outcome.note` says why). The target did not stop and keeps serving.
    /// Only [`wait_for_request`] reports it (the outcome must answer this very request).
    RestartFailed {
        /// Its outcome file, state `restart_failed`.
        outcome: Outcome,
    },
}

/// Waits up to `timeout` for `target` to exit, calling `progress` on every poll with where the
/// stop stands: the state of the target's outcome, `None` while it has not accepted. Pass the
/// store the request went through: it remembers which users' files speak for a target that
/// exits before this looks. See the module docs.
///
/// ```no_run
/// # use planned_stop_protocol::Layout;
/// # use planned_stop_protocol::marker::MarkerStore;
/// use planned_stop_protocol::stopper::{request, wait, StopOptions, WaitOutcome};
/// let store = MarkerStore::open(Layout::Slots("/run/my-app".into())).unwrap();
/// let requested = request(&store, 4242, &StopOptions::new()).unwrap();
/// let outcome = wait(&store, &requested.target, std::time::Duration::from_secs(30), |_, _| {});
/// assert!(matches!(outcome, WaitOutcome::StoppedPlanned { .. }));
/// ```
pub fn wait(
    store: &MarkerStore,
    target: &ProcessIdentity,
    timeout: Duration,
    progress: impl FnMut(Option<ProcessState>, Duration),
) -> WaitOutcome {
    wait_for_request(store, target, None, timeout, ExitWatch::Events, progress)
}

/// [`wait`] for the request `request_id` (the one [`request`] wrote), learning of the target's
/// exit as `watch` says: it also ends when the target's outcome says this request's restart in
/// place failed ([`WaitOutcome::RestartFailed`]) — the target keeps running then, so only the
/// request's own outcome can end the wait. With `None`, any stop's outcome answers, as [`wait`].
///
/// ```
/// use planned_stop_protocol::stopper::{wait_for_request, ExitWatch, WaitOutcome};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
/// let me = planned_stop_protocol::ProcessIdentity::current().unwrap();
/// let mut seen = Vec::new();
/// let timeout = std::time::Duration::from_millis(50);
/// let outcome = wait_for_request(&store, &me, None, timeout, ExitWatch::Poll, |p, _| seen.push(p));
/// assert_eq!(outcome, WaitOutcome::NotAccepted);
/// // It never accepted: every poll saw no state.
/// assert!(!seen.is_empty() && seen.iter().all(Option::is_none));
/// ```
pub fn wait_for_request(
    store: &MarkerStore,
    target: &ProcessIdentity,
    request_id: Option<&str>,
    timeout: Duration,
    watch: ExitWatch,
    mut progress: impl FnMut(Option<ProcessState>, Duration),
) -> WaitOutcome {
    let started = Instant::now();
    let exit = match watch {
        ExitWatch::Events => exit_event::ExitEvent::open(target),
        ExitWatch::Poll => None,
    };
    let mut exited = false;
    // Whose outcome files count (its own user's) is known from a look while it ran: this one, or
    // the store's when it wrote the request.
    let read = || store.read_outcome(target.pid).filter(|o| o.is_from(target));
    loop {
        // Read the outcome before checking liveness: a target that exits right after writing its
        // final outcome must not be seen as gone with a stale acknowledgement.
        let outcome = read();
        let alive = !exited && ProcessIdentity::of(target.pid) == Some(*target);
        if !alive {
            let outcome = read().or(outcome);
            // A marker that arrived after the target's last look (a racing stopper's, or ours)
            // must not stay behind for a pid that is gone.
            let slot = store.slot_path(target.pid);
            if let Err(e) = store.sweep_slot(&slot, Utc::now()) {
                tracing::debug!(error = %crate::error_chain::ErrorChain(&e), "cannot sweep the target's slot");
            }
            return WaitOutcome::after_exit(outcome);
        }
        if let Some(failed) = outcome
            .as_ref()
            .filter(|o| o.state == ProcessState::RestartFailed && is_own_request(o, request_id))
        {
            return WaitOutcome::RestartFailed {
                outcome: failed.clone(),
            };
        }
        let elapsed = started.elapsed();
        if elapsed >= timeout {
            return match outcome {
                Some(outcome) if is_under_way(outcome.state) => WaitOutcome::InProgress { outcome },
                Some(outcome) if outcome.state.is_final() => {
                    WaitOutcome::StoppedStillAlive { outcome }
                }
                _ => WaitOutcome::NotAccepted,
            };
        }
        progress(outcome.as_ref().map(|o| o.state), elapsed);
        let pause = WAIT_POLL.min(timeout - elapsed);
        match &exit {
            Some(exit) => exited = exit.wait(pause),
            None => std::thread::sleep(pause),
        }
    }
}

#[cfg(target_os = "linux")]
mod exit_event {
    use crate::identity::ProcessIdentity;
    use rustix::event::{PollFd, PollFlags, Timespec};
    use rustix::process::{Pid, PidfdFlags};
    use std::os::fd::OwnedFd;
    use std::time::Duration;

    /// A pidfd of the target: readable once it has exited.
    pub(super) struct ExitEvent(OwnedFd);

    impl ExitEvent {
        /// A pidfd for `target`, or `None` (no pidfd on this kernel, not permitted, or the pid
        /// already belongs to someone else: then waiting by looking is what is left).
        pub(super) fn open(target: &ProcessIdentity) -> Option<ExitEvent> {
            let pid = i32::try_from(target.pid).ok().and_then(Pid::from_raw)?;
            let fd = rustix::process::pidfd_open(pid, PidfdFlags::empty()).ok()?;
            // The pid may have been reused between the caller's look and the open: only a pidfd
            // of the target itself will do.
            (ProcessIdentity::of(target.pid) == Some(*target)).then_some(ExitEvent(fd))
        }

        /// Waits up to `pause`; returns whether the target has exited.
        pub(super) fn wait(&self, pause: Duration) -> bool {
            let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
            // A pause too long for a timespec waits without a bound; a signal (EINTR) just ends
            // the wait early, and the caller looks again.
            let timeout = Timespec::try_from(pause).ok();
            let ready = rustix::event::poll(&mut fds, timeout.as_ref()).unwrap_or(0);
            ready > 0 && fds[0].revents().contains(PollFlags::IN)
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::exit_event::ExitEvent;
    use crate::identity::ProcessIdentity;
    use std::time::Duration;

    #[test]
    fn the_exit_event_fires_when_the_target_exits_and_not_before() {
        let mut child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .expect("sleep runs");
        let target = ProcessIdentity::of(child.id()).expect("the child runs");
        let exit = ExitEvent::open(&target).expect("pidfd_open works on this kernel");
        assert!(!exit.wait(Duration::ZERO), "alive: no event yet");
        child.kill().expect("kill");
        // Blocks until the exit (the pause is only an upper bound): a broken event would return
        // false after it, failing the test.
        assert!(exit.wait(Duration::from_secs(600)), "the exit is an event");
        child.wait().expect("reaped");
        let mut other = target;
        other.start += 1;
        assert!(
            ExitEvent::open(&other).is_none(),
            "no pidfd for another identity at the pid"
        );
    }
}

#[cfg(not(target_os = "linux"))]
mod exit_event {
    use crate::identity::ProcessIdentity;
    use std::time::Duration;

    /// No exit event here: [`super::wait_for_request`] looks every 20 ms.
    pub(super) enum ExitEvent {}

    impl ExitEvent {
        pub(super) fn open(_: &ProcessIdentity) -> Option<ExitEvent> {
            None
        }

        pub(super) fn wait(&self, _: Duration) -> bool {
            match *self {}
        }
    }
}

/// Whether the stop a target accepted (its `outcome`) was the one this stopper asked for with
/// `request_id`: racing stoppers each see the target stop, and only one of them asked for the stop
/// it took. A stop the target took without any request (a Ctrl-C, or the application's own
/// request, after this stopper's marker expired unread) is nobody's.
///
/// ```
/// # let bytes = br#"{"pid":4,"start":9,"phase":"stopped","cause":{"kind":"marker"},"verdict":"planned","request_id":"a","accepted_at":"2026-11-30T12:00:00Z","drain_deadline":"2026-11-30T12:00:10Z","finished_at":"2026-11-30T12:00:01Z","exit_code":0}"#;
/// let outcome = planned_stop_protocol::stopper::Outcome::parse(bytes).unwrap();
/// assert!(planned_stop_protocol::stopper::is_own_request(&outcome, Some("a")));
/// assert!(!planned_stop_protocol::stopper::is_own_request(&outcome, Some("b")));
/// let by_signal = planned_stop_protocol::stopper::Outcome::parse(&String::from_utf8_lossy(bytes)
///     .replace(r#""request_id":"a""#, r#""request_id":null"#).into_bytes()).unwrap();
/// assert!(!planned_stop_protocol::stopper::is_own_request(&by_signal, Some("a")));
/// ```
pub fn is_own_request(outcome: &Outcome, request_id: Option<&str>) -> bool {
    request_id.is_some() && outcome.request_id.as_deref() == request_id
}

/// Whether an outcome in `state` says a stop is under way: seen and not finished.
fn is_under_way(state: ProcessState) -> bool {
    matches!(
        state,
        ProcessState::Held | ProcessState::HandingOver | ProcessState::Draining
    )
}

impl WaitOutcome {
    /// Whether the target was still running when the wait ended: its stop in progress (held,
    /// handing over, draining), or not accepted. The one rule for "still running" every caller
    /// shares (an escalation acts on it).
    ///
    /// ```
    /// use planned_stop_protocol::stopper::WaitOutcome;
    /// assert!(WaitOutcome::NotAccepted.is_running());
    /// assert!(!WaitOutcome::GoneWithoutOutcome.is_running());
    /// ```
    pub fn is_running(&self) -> bool {
        matches!(
            self,
            WaitOutcome::InProgress { .. } | WaitOutcome::NotAccepted
        )
    }

    /// What a stopper reports about a target that is gone, from the last outcome file that
    /// target wrote (`None` when it wrote none, or only an earlier process with its pid did): the
    /// one rule [`wait`] applies, public so another stopper reports the same.
    ///
    /// ```
    /// use planned_stop_protocol::stopper::WaitOutcome;
    /// assert_eq!(WaitOutcome::after_exit(None), WaitOutcome::GoneWithoutOutcome);
    /// ```
    pub fn after_exit(outcome: Option<Outcome>) -> WaitOutcome {
        match outcome {
            Some(o)
                if o.state == ProcessState::Stopped && o.verdict == crate::StopVerdict::Planned =>
            {
                WaitOutcome::StoppedPlanned {
                    exit_code: o.exit_code.unwrap_or(0),
                    outcome: o,
                }
            }
            Some(o) if is_under_way(o.state) => WaitOutcome::KilledWhileDraining { outcome: o },
            Some(o) if o.state == ProcessState::RecordLost => WaitOutcome::RecordLost {
                exit_code: o.exit_code,
                outcome: o,
            },
            Some(o) => WaitOutcome::StoppedUnexpectedly {
                exit_code: o.exit_code,
                outcome: Some(o),
            },
            None => WaitOutcome::GoneWithoutOutcome,
        }
    }
}

//! A process's life and why it stopped, as its status, outcome file and stop record say them: the
//! state, the cause and the verdict.

use serde::{Deserialize, Serialize};

/// Whether a stop was meant.
///
/// ```
/// use planned_stop_protocol::StopVerdict;
/// assert_eq!(serde_json::to_string(&StopVerdict::Planned).unwrap(), "\"planned\"");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopVerdict {
    /// Someone asked this very process to stop: exit 0 by default.
    Planned,
    /// Nobody asked (a bare SIGTERM, a crash): exit 1 by default, so supervisors revive it.
    Unexpected,
}

/// An OS signal or console event, as the runner sees it.
///
/// ```
/// use planned_stop_protocol::SignalKind;
/// assert!(SignalKind::Interrupt.is_planned_by_itself());
/// assert!(!SignalKind::Hangup.is_planned_by_itself());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SignalKind {
    /// SIGTERM; on Windows the console's close and shutdown events. Planned only with a marker.
    Terminate,
    /// SIGINT or Ctrl-C (Ctrl-Break on Windows): always planned; a second one forces the stop.
    Interrupt,
    /// SIGHUP: the terminal went away. Treated like [`SignalKind::Terminate`] (planned only with a
    /// marker), since nobody asked for a stop by closing a terminal.
    Hangup,
}

impl StopVerdict {
    /// The verdict as one word, as the outcome file writes it: `planned` or `unexpected`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopVerdict::Planned => "planned",
            StopVerdict::Unexpected => "unexpected",
        }
    }
}

impl SignalKind {
    /// Whether this signal alone says the stop was meant.
    ///
    /// ```
    /// assert!(!planned_stop_protocol::SignalKind::Terminate.is_planned_by_itself());
    /// ```
    pub fn is_planned_by_itself(self) -> bool {
        matches!(self, SignalKind::Interrupt)
    }
}

/// What started a stop.
///
/// ```
/// use planned_stop_protocol::{SignalKind, StopCause};
/// let cause = StopCause::Signal(SignalKind::Terminate);
/// assert_eq!(serde_json::to_value(cause).unwrap(), serde_json::json!({"kind": "signal", "signal": "terminate"}));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "signal")]
#[non_exhaustive]
pub enum StopCause {
    /// The marker watcher delivered a planned stop (it found this process's marker).
    Marker,
    /// An OS signal or console event.
    Signal(SignalKind),
    /// The application asked (`ServiceHandle::request_stop` in planned-stop).
    Request,
}

impl StopCause {
    /// The cause as one word: `marker`, `signal_terminate`, `signal_interrupt`,
    /// `signal_hangup` or `request` (a metrics label, a log field).
    pub fn as_str(self) -> &'static str {
        match self {
            StopCause::Marker => "marker",
            StopCause::Signal(SignalKind::Terminate) => "signal_terminate",
            StopCause::Signal(SignalKind::Interrupt) => "signal_interrupt",
            StopCause::Signal(SignalKind::Hangup) => "signal_hangup",
            StopCause::Request => "request",
        }
    }
}

/// Where a process is in its life: what the runner's status says, and what a stop's outcome file
/// says (under the key `phase`). A state of one view may not show in the other: an outcome is
/// written from `held` on, and the status says `running` again after a `restart_failed`.
///
/// ```
/// use planned_stop_protocol::ProcessState;
/// assert_eq!(serde_json::to_string(&ProcessState::Draining).unwrap(), "\"draining\"");
/// assert!(ProcessState::Stopped.is_final() && ProcessState::Draining.is_stopping());
/// assert!(ProcessState::Held.is_starting() && ProcessState::HandingOver.is_serving());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProcessState {
    /// Started, not yet ready.
    Starting,
    /// A planned stop arrived before the application declared itself ready: the drain begins once
    /// it does. `accepted_at` is when the stop was seen.
    Held,
    /// Ready and serving.
    Running,
    /// A planned restart in place: the successor is starting, and the drain begins once it says it
    /// is ready. The process keeps serving meanwhile.
    HandingOver,
    /// A planned restart in place did not happen (`note` says why): the successor ended or was not
    /// ready in time. The process did not stop and keeps serving; nothing follows for this request.
    RestartFailed,
    /// Accepted; the participants are draining.
    Draining,
    /// Stopped; `exit_code` is the process's exit code.
    Stopped,
    /// The stop finished, but the unfinished items could not be made durable (the record store
    /// failed): the items were written to stderr as JSON at ERROR, and `exit_code` is the
    /// record-lost code. Never a planned success, whatever the verdict.
    RecordLost,
    /// The process ended before the runner finished (the actix `System` was stopped by someone
    /// else, or `main` returned): nothing was recorded and the process exits with `exit_code`,
    /// the unexpected code.
    Aborted,
    /// The drain (or the persist after it) overran its deadlines and grace, and the overrun
    /// watchdog ended the process with `exit_code`, the unexpected code: the items not yet
    /// durable are in its ERROR log line, the participants that had not answered in another.
    Overrun,
}

impl ProcessState {
    /// Whether the process has finished in this state (nothing follows it).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            ProcessState::Stopped
                | ProcessState::RecordLost
                | ProcessState::Aborted
                | ProcessState::Overrun
        )
    }

    /// Whether the process is stopping or has stopped: it takes no new work.
    pub fn is_stopping(self) -> bool {
        self == ProcessState::Draining || self.is_final()
    }

    /// Whether the process has not declared itself ready yet (a stop may be held meanwhile).
    pub fn is_starting(self) -> bool {
        matches!(self, ProcessState::Starting | ProcessState::Held)
    }

    /// Whether the process is ready and not stopping: it serves and takes work, a successor
    /// starting meanwhile or not.
    pub fn is_serving(self) -> bool {
        !self.is_starting() && !self.is_stopping()
    }
}

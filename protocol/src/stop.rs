//! Why a process stopped, as its outcome file and stop record say it: the cause and the verdict.

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

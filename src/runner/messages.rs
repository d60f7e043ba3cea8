//! What the runner receives and publishes: each message a small struct with its result type.
//!
//! The watcher, the signal listener and the application talk to the runner only through these;
//! participants answer [`Drain`] with a [`DrainReport`]; everyone else reads [`RunnerStatus`] from
//! its watch channel.

use crate::lifecycle::{RunnerState, SignalKind, StopRequest, StopVerdict};
use crate::marker::Marker;
use crate::outcome::Outcome;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;

/// "This process was asked to stop, on purpose": the watcher found a marker for us.
///
/// ```
/// let marker = planned_stop::Marker::new(4, None, chrono::Utc::now()).with_request_id("r-1");
/// let stop = planned_stop::PlannedStop::from(&marker);
/// assert_eq!(stop.request_id.as_deref(), Some("r-1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
#[non_exhaustive]
pub struct PlannedStop {
    /// The stopper's request id.
    pub request_id: Option<String>,
    /// The stopper's reason.
    pub reason: Option<String>,
    /// The stopper's pid.
    pub stopper_pid: Option<u32>,
    /// When the marker was written.
    pub written_at: DateTime<Utc>,
}

impl From<&Marker> for PlannedStop {
    fn from(m: &Marker) -> Self {
        PlannedStop {
            request_id: m.request_id.clone(),
            reason: m.reason.clone(),
            stopper_pid: m.stopper_pid,
            written_at: m.written_at,
        }
    }
}

/// The application is ready to serve (`Starting → Running`). A planned stop held during start-up is
/// acted on now.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Ready;

/// An OS signal or console event arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct OsSignal(pub SignalKind);

/// The application asks to stop ([`crate::ServiceHandle::request_stop`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct RequestStop(pub StopRequest);

/// Registers a drain participant (also possible through the builder).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct AddParticipant {
    /// A name for the stop record and the logs.
    pub name: String,
    /// Where to send [`Drain`].
    pub recipient: Recipient<Drain>,
}

/// Sent to each drain participant when the stop begins: stop taking work, finish what you can
/// within `within`, and answer with what is left.
///
/// ```
/// use actix::prelude::*;
/// use planned_stop::{Drain, DrainReport};
/// /// Hands back whatever is still queued.
/// struct Queue(Vec<String>);
/// impl Actor for Queue { type Context = Context<Self>; }
/// impl Handler<Drain> for Queue {
///     type Result = DrainReport;
///     fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> DrainReport {
///         let _budget = drain.within; // finish what fits, then:
///         DrainReport::unfinished(std::mem::take(&mut self.0))
///     }
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "DrainReport")]
#[non_exhaustive]
pub struct Drain {
    /// How long the participant has before the runner records it as unfinished.
    pub within: Duration,
    /// Planned or unexpected, in case the participant treats them differently.
    pub verdict: StopVerdict,
}

/// A participant's answer to [`Drain`]: [`DrainReport::done`] or [`DrainReport::unfinished`].
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
#[non_exhaustive]
pub struct DrainReport {
    /// Work left unfinished, to resume at the next start.
    pub unfinished: Vec<String>,
}

impl DrainReport {
    /// Everything finished; nothing to resume.
    #[must_use]
    pub fn done() -> DrainReport {
        DrainReport::default()
    }

    /// These items were left unfinished, to resume at the next start.
    ///
    /// ```
    /// let report = planned_stop::DrainReport::unfinished(["job-7", "job-9"]);
    /// assert_eq!(report.unfinished, ["job-7", "job-9"]);
    /// ```
    #[must_use]
    pub fn unfinished(items: impl IntoIterator<Item = impl Into<String>>) -> DrainReport {
        DrainReport {
            unfinished: items.into_iter().map(Into::into).collect(),
        }
    }
}

/// What the runner publishes on its status channel.
///
/// ```
/// let status = planned_stop::RunnerStatus::starting();
/// assert_eq!(status.state, planned_stop::RunnerState::Starting);
/// assert_eq!(status.exit_code, None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunnerStatus {
    /// The lifecycle state.
    pub state: RunnerState,
    /// The latched verdict, once there is one.
    pub verdict: Option<StopVerdict>,
    /// The exit code, once stopped.
    pub exit_code: Option<i32>,
    /// The acknowledgement (once a stop is accepted) and then the final outcome, as written to the
    /// outcome file next to the marker slot.
    pub outcome: Option<Arc<Outcome>>,
}

impl RunnerStatus {
    /// The status of a runner that has not started yet.
    ///
    /// ```
    /// assert!(planned_stop::RunnerStatus::starting().outcome.is_none());
    /// ```
    pub fn starting() -> RunnerStatus {
        RunnerStatus {
            state: RunnerState::Starting,
            verdict: None,
            exit_code: None,
            outcome: None,
        }
    }
}

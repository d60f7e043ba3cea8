//! What the runner receives and publishes: each message a small struct with its result type.
//!
//! The watcher, the signal listener and the application talk to the runner only through these;
//! participants answer [`Drain`] with a [`DrainReport`]; everyone else reads [`RunnerStatus`] from
//! its watch channel.

use crate::lifecycle::{DrainPhase, ProcessState, SignalKind, StopRequest, StopVerdict};
use crate::outcome::Outcome;
use crate::schema::{Marker, StopAction};
use actix::prelude::*;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// "This process was asked to stop, on purpose": the watcher found a marker for us.
///
/// ```
/// let marker = planned_stop::marker::Marker::new(4, None, chrono::Utc::now()).with_request_id("r-1");
/// let stop = planned_stop::internals::PlannedStop::from(&marker);
/// assert_eq!(stop.request_id.as_deref(), Some("r-1"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Message)]
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
    /// Stop, or restart (the exit code tells the supervisor which).
    pub action: StopAction,
    /// The drain deadline the stopper asked for, if any (the shorter of it and the service's
    /// own is used).
    pub drain_deadline: Option<std::time::Duration>,
}

impl From<&Marker> for PlannedStop {
    fn from(m: &Marker) -> Self {
        PlannedStop {
            request_id: m.request_id.clone(),
            reason: m.reason.clone(),
            stopper_pid: m.stopper_pid,
            written_at: m.written_at,
            action: m.action,
            drain_deadline: m.drain_deadline,
        }
    }
}

/// Answered once the runner has handled every message sent to it before this one (a mailbox is
/// first in, first out): the crate's tests wait on it instead of guessing how many scheduler
/// turns the runner needs. Changes nothing.
#[cfg(feature = "internals")]
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct CaughtUp;

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

/// The watcher holds a planned stop because the runner is still starting (internal: lets the
/// runner tell stoppers, through the outcome file, why nothing happens yet).
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct HeldStop(pub PlannedStop);

/// Registers a drain participant (also possible through the builder).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct AddParticipant {
    /// The phase it drains in.
    pub phase: DrainPhase,
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
    /// How long the participant has (its phase's budget) before the runner records it as late.
    pub within: Duration,
    /// Planned or unexpected, in case the participant treats them differently.
    pub verdict: StopVerdict,
    /// The phase this participant drains in.
    pub phase: DrainPhase,
}

impl Drain {
    /// A drain request as the runner sends it: for a participant's own unit tests.
    ///
    /// ```
    /// use planned_stop::{Drain, DrainPhase, StopVerdict};
    /// let drain = Drain::new(std::time::Duration::from_secs(5), StopVerdict::Planned, DrainPhase::Work);
    /// assert_eq!(drain.phase, DrainPhase::Work);
    /// ```
    pub fn new(within: Duration, verdict: StopVerdict, phase: DrainPhase) -> Drain {
        Drain {
            within,
            verdict,
            phase,
        }
    }
}

/// A participant's answer to [`Drain`]: [`DrainReport::done`], or [`DrainReport::unfinished`]
/// with the items to resume, plus notes for people ([`DrainReport::with_note`]) and, when it had
/// to cut work it could neither finish nor hand back, [`DrainReport::with_cut_short`].
#[derive(Debug, Clone, Default, PartialEq, MessageResponse)]
#[non_exhaustive]
pub struct DrainReport {
    /// Work left unfinished, to resume at the next start: data the next start can act on.
    pub(crate) unfinished: Vec<serde_json::Value>,
    /// Remarks for people (not work to resume), kept in the record's `notes`.
    pub(crate) notes: Vec<String>,
    /// Work was cut at the deadline that could not be handed back (such as in-flight requests):
    /// the drain did not complete in time.
    pub(crate) cut: bool,
    /// Items this process leased from an earlier stop and hands back unfinished, under their ids
    /// (see [`DrainReport::with_handed_back`]).
    pub(crate) handed_back: Vec<crate::record::ResumeItem>,
    /// Unfinished items that could not be serialised as JSON, each as why: lost, so the stop
    /// ends `record_lost` (exit 74) with them in its ERROR log line, as an item too large does.
    pub(crate) unrecordable: Vec<String>,
    /// Which items' attempts failed in this life, and why ([`DrainReport::with_failed`]).
    pub(crate) failed: Vec<(FailedItem, String)>,
}

/// An item of a [`DrainReport`] whose attempt failed: new work by its place in `unfinished`, or
/// a handed-back item by its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FailedItem {
    New(usize),
    Resumed(String),
}

impl DrainReport {
    /// The new work left unfinished, as the JSON it is recorded as.
    pub fn unfinished_items(&self) -> &[serde_json::Value] {
        &self.unfinished
    }

    /// The items leased from an earlier stop that are handed back.
    pub fn handed_back(&self) -> &[crate::record::ResumeItem] {
        &self.handed_back
    }

    /// The notes for people.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Whether work was cut that could neither finish nor be handed back.
    pub fn is_cut_short(&self) -> bool {
        self.cut
    }

    /// Why each item that could not be serialised is lost.
    pub fn unrecordable(&self) -> &[String] {
        &self.unrecordable
    }

    /// Everything finished; nothing to resume.
    #[must_use]
    pub fn done() -> DrainReport {
        DrainReport::default()
    }

    /// These items were left unfinished, to resume at the next start. Each is kept as JSON; an
    /// item that cannot be serialised is lost, and the stop says so: it ends `record_lost`
    /// (exit 74) with the serialiser's reason in its ERROR log line, never a planned success.
    /// Serialise where work enters instead ([`crate::WorkSet::add`], [`crate::TaskGroup::spawn`]
    /// refuse such work at once).
    ///
    /// ```
    /// let report = planned_stop::DrainReport::unfinished(["job-7", "job-9"]);
    /// assert_eq!(report.unfinished_items(), ["job-7", "job-9"]);
    /// ```
    #[must_use]
    pub fn unfinished<T: Serialize>(items: impl IntoIterator<Item = T>) -> DrainReport {
        let mut report = DrainReport::default();
        for item in items {
            match serde_json::to_value(&item) {
                Ok(value) => report.unfinished.push(value),
                Err(e) => report
                    .unrecordable
                    .push(format!("an item that cannot be serialised as JSON ({e})")),
            }
        }
        report
    }

    /// Hands back items this process leased at start-up ([`crate::ServiceHandle::resume`]) and
    /// could not finish: they are recorded again under their own ids (their attempts counted up),
    /// so the item is still acknowledged exactly once, by whoever finishes it.
    ///
    /// ```
    /// # fn leased() -> Vec<planned_stop::record::Leased> { Vec::new() }
    /// let report = planned_stop::DrainReport::done().with_handed_back(leased());
    /// assert!(report.handed_back().is_empty());
    /// ```
    #[must_use]
    pub fn with_handed_back(
        mut self,
        items: impl IntoIterator<Item = crate::record::Leased>,
    ) -> DrainReport {
        self.handed_back.extend(items.into_iter().map(|l| l.item));
        self
    }

    /// Hands back new work whose attempt failed in this life (its task panicked, say): recorded
    /// as [`DrainReport::unfinished`] does, with one failed attempt counted, so an item that
    /// keeps failing is held aside for a person ([`crate::ServiceBuilder::max_failed_attempts`]).
    ///
    /// ```
    /// let report = planned_stop::DrainReport::done().with_failed("job-7", "it panicked");
    /// assert_eq!(report.unfinished_items(), ["job-7"]);
    /// ```
    #[must_use]
    pub fn with_failed<T: Serialize>(mut self, item: T, why: impl Into<String>) -> DrainReport {
        match serde_json::to_value(&item) {
            Ok(value) => {
                self.failed
                    .push((FailedItem::New(self.unfinished.len()), why.into()));
                self.unfinished.push(value);
            }
            Err(e) => self
                .unrecordable
                .push(format!("an item that cannot be serialised as JSON ({e})")),
        }
        self
    }

    /// [`DrainReport::with_handed_back`] for one resumed item whose attempt failed in this life:
    /// handed back with one failed attempt counted.
    #[must_use]
    pub fn with_failed_handed_back(
        mut self,
        item: crate::record::Leased,
        why: impl Into<String>,
    ) -> DrainReport {
        self.failed
            .push((FailedItem::Resumed(item.item.id.clone()), why.into()));
        self.handed_back.push(item.item);
        self
    }

    /// Why the attempt of the `index`-th new item failed, if it did.
    pub(crate) fn failure_of_new(&self, index: usize) -> Option<String> {
        self.failed
            .iter()
            .find(|(f, _)| *f == FailedItem::New(index))
            .map(|(_, why)| why.clone())
    }

    /// Why the attempt of handed-back item `id` failed, if it did.
    pub(crate) fn failure_of_resumed(&self, id: &str) -> Option<String> {
        self.failed
            .iter()
            .find(|(f, _)| matches!(f, FailedItem::Resumed(r) if r == id))
            .map(|(_, why)| why.clone())
    }

    /// Adds a remark for people, kept apart from the items to resume.
    #[must_use]
    pub fn with_note(mut self, note: impl Into<String>) -> DrainReport {
        self.notes.push(note.into());
        self
    }

    /// Says that work was cut at the deadline that could not be handed back, and what.
    #[must_use]
    pub fn with_cut_short(mut self, what: impl Into<String>) -> DrainReport {
        self.cut = true;
        self.notes.push(what.into());
        self
    }
}

/// What the runner publishes on its status channel.
///
/// ```
/// let status = planned_stop::RunnerStatus::starting();
/// assert_eq!(status.state, planned_stop::ProcessState::Starting);
/// assert_eq!(status.exit_code(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RunnerStatus {
    /// Where the process is in its life: `starting`, `held`, `running`, `handing_over`,
    /// `draining`, then the final state of its outcome (`stopped`, `record_lost`, `aborted`).
    pub state: ProcessState,
    /// The latched verdict, once there is one.
    pub verdict: Option<StopVerdict>,
    /// The acknowledgement (once a stop is accepted) and then the final outcome, as written to the
    /// outcome file next to the marker slot.
    pub outcome: Option<Arc<Outcome>>,
    /// The drain phase running now: `None` before the drain and once it has ended.
    pub drain_phase: Option<DrainPhase>,
}

impl RunnerStatus {
    /// The exit code, once the stop has concluded: its final outcome's.
    pub fn exit_code(&self) -> Option<i32> {
        self.outcome.as_ref().and_then(|outcome| outcome.exit_code)
    }

    /// The status of a runner that has not started yet.
    ///
    /// ```
    /// assert!(planned_stop::RunnerStatus::starting().outcome.is_none());
    /// ```
    pub fn starting() -> RunnerStatus {
        RunnerStatus {
            state: ProcessState::Starting,
            verdict: None,
            outcome: None,
            drain_phase: None,
        }
    }
}

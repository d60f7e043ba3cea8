//! The runner's rules, without actix: states, stop causes, the verdict latch.
//!
//! [`crate::runner::RunnerActor`] holds a [`Lifecycle`] and does what it says; every rule lives here
//! so it can be tested without a running system. The rules, and the hazard of docs/protocol.md each
//! one answers:
//!
//! - States only move forward: `Starting → Running → Draining → Stopped` (a signal may skip
//!   `Running`). There is no way back, so a process never "un-stops".
//! - **The verdict latch.** The first classification — planned or unexpected — is final for the life
//!   of the process. A SIGTERM that follows the watcher's planned stop stays planned (hazard 1: the
//!   watcher consumed the marker and a SIGTERM 20 ms later found nothing and exited 1); a marker that
//!   follows an unmarked SIGTERM does not make it planned.
//! - A planned stop that arrives while `Starting` is held and acted on once `Running`: not dropped
//!   (hazard 7: a marker written during start-up was ignored and the stopper force-killed the
//!   process), not acted on before the application is ready to drain.
//! - SIGTERM (and the signals that behave like it) is planned only when this process's own marker is
//!   there to claim; SIGINT (Ctrl-C) is planned by itself: someone at a terminal meant it.
//! - Once draining, further stop requests are ignored, except an escalation to "force now" (another
//!   Ctrl-C, or a forced programmatic request), which cuts the drain short. The verdict stays.

use serde::{Deserialize, Serialize};

/// The ordered phases of a drain, in the spirit of Akka's coordinated shutdown. A phase starts
/// when the previous one has answered or timed out, so the ingress stops taking requests before
/// the workers that those requests feed are told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum DrainPhase {
    /// Stop accepting work from outside and finish what was accepted (HTTP servers, consumers).
    Ingress,
    /// Workers finish or hand back what they cannot finish (the default phase).
    Work,
    /// Flush and close: caches, connections, logs.
    Final,
}

impl DrainPhase {
    /// The phases in the order they run.
    pub const ALL: [DrainPhase; 3] = [DrainPhase::Ingress, DrainPhase::Work, DrainPhase::Final];
}

/// How far the rules have got: the four states of [`ProcessState`] they decide between. Ordered: a
/// later stage compares greater.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Stage {
    #[default]
    Starting,
    Running,
    Draining,
    Stopped,
}

pub use planned_stop_protocol::{ProcessState, SignalKind, StopCause, StopVerdict};

/// What the application asks for with [`crate::ServiceHandle::request_stop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StopRequest {
    /// Stop on purpose: drain, record, exit with the planned code.
    Planned,
    /// Stop because something is wrong: drain, record, exit with the unexpected code.
    Unexpected,
    /// Cut a drain in progress short; the verdict stays. Before a drain has begun it is ignored
    /// (ask for [`StopRequest::Planned`] or [`StopRequest::Unexpected`] first).
    Force,
}

/// What the runner must do after an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Nothing; the reason is for the log.
    Ignore(&'static str),
    /// A planned stop arrived while starting; it is kept until the runner is ready.
    Hold,
    /// Begin draining, with this cause and verdict (now latched).
    Drain(StopCause, StopVerdict),
    /// Cut the running drain short.
    Force,
}

///
/// The runner's state and latch. Pure: events in, [`Step`]s out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Lifecycle {
    stage: Stage,
    verdict: Option<StopVerdict>,
    held: bool,
    /// A Ctrl-C (SIGINT) has been received: the next one while draining forces the stop.
    interrupted: bool,
}

impl Lifecycle {
    /// A lifecycle in `Starting`.
    pub fn new() -> Self {
        Lifecycle::default()
    }

    /// The current state: `Starting` (`Held` while a planned stop waits for the ready), `Running`,
    /// `Draining` or `Stopped`.
    pub fn state(&self) -> ProcessState {
        match self.stage {
            Stage::Starting if self.held => ProcessState::Held,
            Stage::Starting => ProcessState::Starting,
            Stage::Running => ProcessState::Running,
            Stage::Draining => ProcessState::Draining,
            Stage::Stopped => ProcessState::Stopped,
        }
    }

    /// The latched verdict, once there is one.
    pub fn verdict(&self) -> Option<StopVerdict> {
        self.verdict
    }

    /// Whether a signal now would be classified (and so whether the marker should be claimed).
    pub fn awaits_classification(&self) -> bool {
        self.verdict.is_none() && self.stage <= Stage::Running
    }

    /// The application is ready. Returns the held planned stop, if one was waiting.
    pub fn ready(&mut self) -> Step {
        if self.stage != Stage::Starting {
            return Step::Ignore("already past starting");
        }
        self.stage = Stage::Running;
        if self.held {
            self.held = false;
            return self.drain(StopCause::Marker, StopVerdict::Planned);
        }
        Step::Ignore("running")
    }

    /// The watcher found a marker for us.
    pub fn planned_stop(&mut self) -> Step {
        match self.stage {
            Stage::Starting if self.verdict.is_none() => {
                self.held = true;
                self.verdict = Some(StopVerdict::Planned);
                Step::Hold
            }
            Stage::Starting => Step::Ignore("a stop is already decided"),
            Stage::Running => self.drain(StopCause::Marker, StopVerdict::Planned),
            Stage::Draining | Stage::Stopped => Step::Ignore("already stopping"),
        }
    }

    /// A signal arrived; `marker_claimed` says whether our own marker was there to claim (only
    /// consulted when [`Lifecycle::awaits_classification`]).
    pub fn signal(&mut self, kind: SignalKind, marker_claimed: bool) -> Step {
        let second_interrupt = kind == SignalKind::Interrupt && self.interrupted;
        if kind == SignalKind::Interrupt {
            self.interrupted = true;
        }
        match self.stage {
            Stage::Starting | Stage::Running => {
                let verdict = if kind.is_planned_by_itself() || marker_claimed {
                    StopVerdict::Planned
                } else {
                    StopVerdict::Unexpected
                };
                self.drain(StopCause::Signal(kind), verdict)
            }
            // A *second* Ctrl-C forces, as promised: a drain begun by a marker or a SIGTERM is
            // not cut short by the first one.
            Stage::Draining if second_interrupt => Step::Force,
            Stage::Draining if kind == SignalKind::Interrupt => {
                Step::Ignore("a first Ctrl-C while draining: a second one forces the stop")
            }
            Stage::Draining | Stage::Stopped => Step::Ignore("already stopping"),
        }
    }

    /// The application asked to stop ([`StopRequest`]).
    pub fn request(&mut self, request: StopRequest) -> Step {
        let verdict = match (self.stage, request) {
            (Stage::Starting | Stage::Running, StopRequest::Planned) => StopVerdict::Planned,
            (Stage::Starting | Stage::Running, StopRequest::Unexpected) => StopVerdict::Unexpected,
            (Stage::Starting | Stage::Running, StopRequest::Force) => {
                return Step::Ignore("nothing to force: no drain in progress");
            }
            (Stage::Draining, StopRequest::Force) => return Step::Force,
            (Stage::Draining | Stage::Stopped, _) => {
                return Step::Ignore("already stopping");
            }
        };
        self.drain(StopCause::Request, verdict)
    }

    /// The drain is over (finished, timed out or forced). Returns the verdict to exit with.
    pub fn stopped(&mut self) -> Option<StopVerdict> {
        if self.stage != Stage::Draining {
            return None;
        }
        self.stage = Stage::Stopped;
        self.verdict
    }

    /// Enters `Draining`; the first verdict latched wins over `verdict`.
    fn drain(&mut self, cause: StopCause, verdict: StopVerdict) -> Step {
        let verdict = *self.verdict.get_or_insert(verdict);
        self.held = false;
        self.stage = Stage::Draining;
        Step::Drain(cause, verdict)
    }
}

#[cfg(test)]
mod tests;

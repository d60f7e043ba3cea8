//! [`RunnerActor`]: the process's lifecycle as an actix actor.
//!
//! The runner receives every stop cause — [`PlannedStop`] from the watcher, [`OsSignal`] from the
//! signal listener, [`RequestStop`] from the application — and lets its [`Lifecycle`] decide what each
//! means. It owns the I/O those decisions need: claiming the marker on a signal, asking the drain
//! participants to finish, writing the [`StopRecord`] and stopping the actix `System` with the exit
//! code of the verdict.
//!
//! When it accepts a stop, and again when it has stopped, it writes the [`Outcome`] file next to the
//! marker slot, so a stopper that knows only the directory and the pid can report progress.
//!
//! It publishes a [`RunnerStatus`] on a `tokio::sync::watch` channel, which is how the watcher knows
//! not to deliver while the runner is starting, draining or stopped, without a message round trip.
//!
//! ## Draining
//!
//! Each participant gets one [`Drain`] message saying how long it has, and answers with a
//! [`DrainReport`] of the work it leaves unfinished. The runner waits until every participant has
//! answered, or until the deadline plus a short grace for answers sent at the deadline, or until a
//! "force now" escalation; then it records what it has. A participant that never answered is listed
//! as such; its work is unknown.

mod config;
mod messages;

pub use config::{ExitCodes, RunnerConfig};
pub use messages::{
    AddParticipant, Drain, DrainReport, OsSignal, PlannedStop, Ready, RequestStop, RunnerStatus,
};

use crate::clock::Clock;
use crate::error_chain::ErrorChain;
use crate::identity::ProcessIdentity;
use crate::lifecycle::{Lifecycle, RunnerState, Step, StopCause, StopVerdict};
use crate::marker::Marker;
use crate::outcome::{Outcome, Phase};
use crate::record::{StopRecord, Unfinished};
use crate::store::MarkerStore;
use actix::clock::Instant;
use actix::prelude::*;
use chrono::{DateTime, TimeDelta, Utc};
use std::sync::Arc;
use tokio::sync::watch;

/// Who asked, for the stop record.
#[derive(Debug, Clone, Default)]
struct Requester {
    request_id: Option<String>,
    reason: Option<String>,
    stopper_pid: Option<u32>,
}

impl From<PlannedStop> for Requester {
    fn from(s: PlannedStop) -> Self {
        Requester {
            request_id: s.request_id,
            reason: s.reason,
            stopper_pid: s.stopper_pid,
        }
    }
}

/// A drain in progress.
struct DrainRun {
    cause: StopCause,
    verdict: StopVerdict,
    requester: Requester,
    accepted_at: DateTime<Utc>,
    deadline: Instant,
    answered: Vec<String>,
    unfinished: Vec<Unfinished>,
    late: bool,
    forced: bool,
}

/// The lifecycle actor. [`crate::PlannedStopService`] starts it with the watcher; its address,
/// [`crate::ServiceHandle::runner`], takes [`OsSignal`] and [`PlannedStop`] messages.
pub struct RunnerActor {
    lifecycle: Lifecycle,
    store: MarkerStore,
    own: ProcessIdentity,
    clock: Arc<dyn Clock>,
    config: RunnerConfig,
    participants: Vec<(String, Recipient<Drain>)>,
    status: watch::Sender<RunnerStatus>,
    held: Option<PlannedStop>,
    drain: Option<DrainRun>,
}

impl RunnerActor {
    /// A runner in `Starting` for the process `own`, claiming its markers from `store`.
    pub(crate) fn new(
        store: MarkerStore,
        own: ProcessIdentity,
        config: RunnerConfig,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let (status, _) = watch::channel(RunnerStatus::starting());
        RunnerActor {
            lifecycle: Lifecycle::new(),
            store,
            own,
            clock,
            config,
            participants: Vec::new(),
            status,
            held: None,
            drain: None,
        }
    }

    /// A receiver of the runner's status (subscribe before starting the actor, or later through
    /// the service handle).
    pub(crate) fn subscribe(&self) -> watch::Receiver<RunnerStatus> {
        self.status.subscribe()
    }

    /// Registers a drain participant before the actor starts.
    pub(crate) fn add_participant(&mut self, name: impl Into<String>, recipient: Recipient<Drain>) {
        self.participants.push((name.into(), recipient));
    }

    fn publish(&self) {
        self.status.send_if_modified(|status| {
            let before = status.clone();
            status.state = self.lifecycle.state();
            status.verdict = self.lifecycle.verdict();
            *status != before
        });
    }

    /// Writes the outcome file and publishes it with the status.
    fn publish_outcome(&self, outcome: Outcome) {
        if let Err(e) = self.store.write_outcome(&outcome) {
            tracing::warn!(error = %ErrorChain(&e), "cannot write the outcome file; stoppers cannot see the progress");
        }
        let outcome = Arc::new(outcome);
        self.status.send_modify(|status| {
            status.exit_code = outcome.exit_code;
            status.outcome = Some(outcome);
        });
        self.publish();
    }

    /// Consumes our marker, if one is there. A store error is logged and counts as "no marker":
    /// a planned stop must be proven.
    fn claim(&self) -> Option<Marker> {
        match self.store.claim(&self.own, self.clock.now()) {
            Ok(marker) => marker,
            Err(e) => {
                tracing::warn!(error = %ErrorChain(&e), "cannot claim the planned-stop marker");
                None
            }
        }
    }

    fn act(&mut self, step: Step, requester: Requester, ctx: &mut Context<Self>) {
        match step {
            Step::Ignore(why) => tracing::debug!(why, "stop request ignored"),
            Step::Hold => tracing::info!("planned stop received while starting; held until ready"),
            Step::Drain(cause, verdict) => self.begin_drain(cause, verdict, requester, ctx),
            Step::Force => {
                tracing::warn!("stop forced: cutting the drain short");
                if let Some(run) = self.drain.as_mut() {
                    run.forced = true;
                }
                self.finish(ctx);
            }
        }
        self.publish();
    }

    fn begin_drain(
        &mut self,
        cause: StopCause,
        verdict: StopVerdict,
        requester: Requester,
        ctx: &mut Context<Self>,
    ) {
        let within = self.config.drain_deadline;
        tracing::info!(
            ?cause,
            ?verdict,
            request_id = requester.request_id.as_deref(),
            participants = self.participants.len(),
            within_ms = within.as_millis() as u64,
            "stop accepted; draining"
        );
        let accepted_at = self.clock.now();
        self.publish_outcome(Outcome {
            pid: self.own.pid,
            start: self.own.start,
            phase: Phase::Draining,
            cause,
            verdict,
            request_id: requester.request_id.clone(),
            accepted_at,
            drain_deadline: accepted_at + TimeDelta::from_std(within).unwrap_or(TimeDelta::MAX),
            finished_at: None,
            exit_code: None,
        });
        self.drain = Some(DrainRun {
            cause,
            verdict,
            requester,
            accepted_at,
            deadline: Instant::now() + within,
            answered: Vec::new(),
            unfinished: Vec::new(),
            late: false,
            forced: false,
        });
        if self.participants.is_empty() {
            self.finish(ctx);
            return;
        }
        for (name, recipient) in &self.participants {
            let name = name.clone();
            let answer = recipient.send(Drain { within, verdict });
            ctx.spawn(
                answer
                    .into_actor(self)
                    .map(move |answer, act, ctx| act.on_answer(name, answer, ctx)),
            );
        }
        ctx.run_later(within + self.config.answer_grace, |act, ctx| {
            if act.lifecycle.state() == RunnerState::Draining {
                tracing::warn!("drain deadline passed; recording what is unfinished");
                act.finish(ctx);
            }
        });
    }

    fn on_answer(
        &mut self,
        name: String,
        answer: Result<DrainReport, MailboxError>,
        ctx: &mut Context<Self>,
    ) {
        if self.lifecycle.state() != RunnerState::Draining {
            return;
        }
        let Some(run) = self.drain.as_mut() else {
            return;
        };
        match answer {
            Ok(report) => {
                run.late |= Instant::now() > run.deadline;
                run.unfinished
                    .extend(report.unfinished.into_iter().map(|item| Unfinished {
                        participant: name.clone(),
                        item,
                    }));
                run.answered.push(name);
            }
            Err(e) => {
                tracing::warn!(participant = %name, error = %ErrorChain(&e), "drain participant is gone")
            }
        }
        let answered = run.answered.len();
        if answered == self.participants.len() {
            self.finish(ctx);
        }
    }

    /// Ends the drain: writes the stop record, publishes `Stopped`, stops the system.
    fn finish(&mut self, ctx: &mut Context<Self>) {
        let Some(verdict) = self.lifecycle.stopped() else {
            return;
        };
        let Some(run) = self.drain.take() else {
            return;
        };
        let code = self.config.exit_codes.code(run.cause, verdict);
        let unanswered: Vec<String> = self
            .participants
            .iter()
            .map(|(name, _)| name.clone())
            .filter(|name| !run.answered.contains(name))
            .collect();
        let record = StopRecord {
            pid: self.own.pid,
            cause: run.cause,
            verdict,
            request_id: run.requester.request_id,
            reason: run.requester.reason,
            stopper_pid: run.requester.stopper_pid,
            accepted_at: run.accepted_at,
            drain_deadline: run.accepted_at
                + TimeDelta::from_std(self.config.drain_deadline).unwrap_or(TimeDelta::MAX),
            finished_at: self.clock.now(),
            drained_in_time: !run.late
                && !run.forced
                && unanswered.is_empty()
                && run.unfinished.is_empty(),
            forced: run.forced,
            unfinished: run.unfinished,
            unanswered,
            exit_code: code,
        };
        debug_assert_eq!(record.verdict, run.verdict);
        if let Some(dir) = &self.config.state_dir {
            match record.write(dir) {
                Ok(path) => {
                    tracing::info!(path = %path.display(), unfinished = record.unfinished.len(), "stop record written")
                }
                Err(e) => {
                    tracing::error!(error = %ErrorChain(&e), "cannot write the stop record; unfinished work will not be resumed")
                }
            }
        }
        tracing::info!(
            ?verdict,
            code,
            drained_in_time = record.drained_in_time,
            "stopped"
        );
        self.publish_outcome(Outcome {
            pid: self.own.pid,
            start: self.own.start,
            phase: Phase::Stopped,
            cause: record.cause,
            verdict,
            request_id: record.request_id.clone(),
            accepted_at: record.accepted_at,
            drain_deadline: record.drain_deadline,
            finished_at: Some(record.finished_at),
            exit_code: Some(code),
        });
        if self.config.stop_system
            && let Some(system) = System::try_current()
        {
            system.stop_with_code(code);
        }
        ctx.stop();
    }
}

impl Actor for RunnerActor {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        self.publish();
    }
}

impl Handler<Ready> for RunnerActor {
    type Result = ();

    fn handle(&mut self, _: Ready, ctx: &mut Context<Self>) {
        let step = self.lifecycle.ready();
        let requester = self.held.take().map(Requester::from).unwrap_or_default();
        if matches!(step, Step::Drain(..)) {
            self.claim();
        }
        self.act(step, requester, ctx);
    }
}

impl Handler<PlannedStop> for RunnerActor {
    type Result = ();

    fn handle(&mut self, stop: PlannedStop, ctx: &mut Context<Self>) {
        let step = self.lifecycle.planned_stop();
        match step {
            Step::Hold => self.held = Some(stop),
            Step::Drain(..) => {
                // The watcher's probe already judged the marker ours; consume it so it cannot be
                // seen again, and prefer what the claimed file says.
                let requester = self.claim().map(|m| PlannedStop::from(&m)).unwrap_or(stop);
                return self.act(step, requester.into(), ctx);
            }
            _ => {}
        }
        self.act(step, Requester::default(), ctx);
    }
}

impl Handler<OsSignal> for RunnerActor {
    type Result = ();

    fn handle(&mut self, OsSignal(kind): OsSignal, ctx: &mut Context<Self>) {
        tracing::info!(signal = ?kind, "signal received");
        let claimed = if self.lifecycle.awaits_classification() {
            self.claim()
        } else {
            None
        };
        let step = self.lifecycle.signal(kind, claimed.is_some());
        let requester = match (claimed, self.held.take()) {
            (Some(m), _) => PlannedStop::from(&m).into(),
            (None, Some(held)) => held.into(),
            (None, None) => Requester::default(),
        };
        self.act(step, requester, ctx);
    }
}

impl Handler<RequestStop> for RunnerActor {
    type Result = ();

    fn handle(&mut self, request: RequestStop, ctx: &mut Context<Self>) {
        let step = self.lifecycle.request(request.0);
        self.act(step, Requester::default(), ctx);
    }
}

impl Handler<AddParticipant> for RunnerActor {
    type Result = ();

    fn handle(&mut self, add: AddParticipant, _: &mut Context<Self>) {
        if self.lifecycle.state() >= RunnerState::Draining {
            tracing::warn!(participant = %add.name, "too late to join the drain: already stopping");
            return;
        }
        self.participants.push((add.name, add.recipient));
    }
}

//! [`RunnerActor`]: the process's lifecycle as an actix actor.
//!
//! The runner receives every stop cause — [`PlannedStop`] from the watcher, [`OsSignal`] from the
//! signal listener, [`RequestStop`] from the application — and lets its [`Lifecycle`] decide what each
//! means. It owns the I/O those decisions need: claiming the marker on a signal, asking the drain
//! participants to finish, writing the [`StopRecord`](crate::record::StopRecord) and stopping the actix `System` with the exit
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

mod answers;
mod conclude;
mod config;
mod drain;
mod guard;
mod handlers;
mod messages;
pub(crate) mod process_end;
mod restart;

pub(crate) use crate::lifecycle::DrainPhase;
pub use config::{ExitCodes, RunnerConfig};
#[cfg(feature = "internals")]
pub(crate) use messages::CaughtUp;
pub(crate) use messages::{AddParticipant, HeldStop};
pub use messages::{Drain, DrainReport, OsSignal, PlannedStop, Ready, RequestStop, RunnerStatus};

use drain::{DrainRun, Next, Participant, Requester};

use crate::clock::Clock;
use crate::error_chain::ErrorChain;
use crate::identity::ProcessIdentity;
use crate::lifecycle::{Lifecycle, ProcessState, Step, StopCause, StopVerdict};
use crate::outcome::Outcome;
use crate::record::Unfinished;
use crate::schema::Marker;
use crate::store::MarkerStore;
use actix::clock::Instant;
use actix::prelude::*;
use chrono::{DateTime, TimeDelta, Utc};
use std::sync::Arc;
use tokio::sync::watch;

/// The lifecycle actor. [`crate::ServiceBuilder`] starts it with the watcher; the watcher
/// sends it [`PlannedStop`], the signal listener [`OsSignal`], and the service's handle the
/// application's requests. Its address stays inside the crate: a [`PlannedStop`] says a marker was
/// claimed, which only the watcher may say.
pub struct RunnerActor {
    lifecycle: Lifecycle,
    store: MarkerStore,
    own: ProcessIdentity,
    clock: Arc<dyn Clock>,
    config: RunnerConfig,
    participants: Vec<Participant>,
    status: watch::Sender<RunnerStatus>,
    held: Option<PlannedStop>,
    /// The ids of the items this process leased and still holds (the handle's set): a forced
    /// planned stop gives back those no participant handed back, as no failed attempt.
    leased: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    drain: Option<DrainRun>,
    /// The items of a stop that are not durable yet, as JSON, from the end of the drain until
    /// the record is persisted: whatever ends the process meanwhile (the overrun watchdog, the
    /// drop guard) logs them first, so no item is lost without a trace.
    pending: Pending,
    /// Items over [`MAX_ITEM_BYTES`](crate::record::MAX_ITEM_BYTES): never written, so the stop
    /// ends `record_lost` with them in its ERROR log line.
    unrecorded: Vec<Unfinished>,
    /// The participants of a drain that have not answered yet (by index), for the overrun
    /// watchdog's log.
    awaiting: Arc<std::sync::Mutex<std::collections::BTreeMap<usize, String>>>,
    /// The answers of the running phase on their way, by participant index.
    answers: std::collections::HashMap<usize, answers::Slot>,
    /// The span of the stop under way, from its acceptance to its conclusion: every log line of
    /// one stop carries its request id, cause and verdict, so they can be found together.
    stop_span: Option<tracing::Span>,
    /// Restart in place, when the service asked for it and it can work here.
    in_place: restart::InPlace,
    /// Where a restart in place stands (see `restart::Stage`).
    stage: restart::Stage,
}

impl std::fmt::Debug for RunnerActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerActor")
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

/// See [`RunnerActor::pending`].
pub(crate) type Pending = Arc<std::sync::Mutex<Option<String>>>;

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
            leased: Arc::default(),
            drain: None,
            pending: Arc::default(),
            unrecorded: Vec::new(),
            awaiting: Arc::default(),
            answers: Default::default(),
            stop_span: None,
            in_place: None,
            stage: restart::Stage::Idle,
        }
    }

    /// A receiver of the runner's status (subscribe before starting the actor, or later through
    /// the service handle).
    /// Shares the set of items this process holds with the handle that leases them.
    pub(crate) fn holding(
        &mut self,
        leased: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    ) {
        self.leased = leased;
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<RunnerStatus> {
        self.status.subscribe()
    }

    /// Registers a drain participant in `phase` before the actor starts.
    pub(crate) fn add_participant(
        &mut self,
        phase: DrainPhase,
        name: impl Into<String>,
        recipient: Recipient<Drain>,
    ) {
        self.participants.push(Participant {
            phase,
            name: name.into(),
            recipient,
        });
    }

    /// Where the process is, as its status says it: the final outcome's state once there is one;
    /// `draining` until then (the persist is part of the stop, as the outcome file says);
    /// `handing_over` while a successor starts.
    fn state(&self) -> ProcessState {
        let status = self.status.borrow();
        match (self.lifecycle.state(), status.outcome.as_deref()) {
            (_, Some(outcome)) if outcome.state.is_final() => outcome.state,
            (ProcessState::Stopped, _) => ProcessState::Draining,
            (ProcessState::Running, _) if matches!(self.stage, restart::Stage::Starting { .. }) => {
                ProcessState::HandingOver
            }
            (state, _) => state,
        }
    }

    fn publish(&self) {
        let state = self.state();
        let mut moved = false;
        self.status.send_if_modified(|status| {
            let before = status.clone();
            moved = status.state != state;
            status.state = state;
            status.verdict = self.lifecycle.verdict();
            *status != before
        });
        if moved {
            crate::telemetry::state(state);
        }
    }

    /// Writes the outcome file and publishes it with the status.
    fn publish_outcome(&self, outcome: Outcome) {
        if let Err(e) = self.store.write_outcome(&outcome) {
            tracing::warn!(error = %ErrorChain(&e), "cannot write the outcome file; stoppers cannot see the progress");
        }
        if outcome.state.is_final() {
            self.withdraw_presence();
        }
        let outcome = Arc::new(outcome);
        self.status.send_modify(|status| {
            status.outcome = Some(outcome);
        });
        self.publish();
    }

    /// Removes the announcement once the process has finished: the final outcome file says the rest.
    pub(super) fn withdraw_presence(&self) {
        if let Err(e) = self.store.remove_presence(&self.own) {
            tracing::warn!(error = %ErrorChain(&e), "cannot remove the presence file; the next \
                start's sweep removes it");
        }
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
        // A request that comes during a stop (ignored, or forcing it) is part of that stop.
        let _in_stop = self.in_stop();
        match step {
            Step::Ignore(why) => tracing::debug!(why, "stop request ignored"),
            Step::Hold => tracing::warn!(
                "a planned stop is held until the application is ready (its handle's ready())"
            ),
            Step::Drain(cause, verdict) => self.begin_drain(cause, verdict, requester, ctx),
            Step::Force => {
                tracing::warn!("stop forced: cutting the drain short");
                let now = self.clock.now();
                if let Some(run) = self.drain.as_mut() {
                    run.force(now);
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
        let within = drain::drain_within(self.config.drain_deadline, requester.drain_deadline);
        if requester.successor.is_none() {
            self.stop_starting_successor();
        }
        let span = tracing::info_span!(
            "planned_stop",
            request_id = requester.request_id.as_deref(),
            cause = ?cause,
            verdict = ?verdict,
        );
        self.stop_span = Some(span.clone());
        let _in_stop = span.entered();
        tracing::info!(
            ?cause,
            ?verdict,
            request_id = requester.request_id.as_deref(),
            participants = self.participants.len(),
            within_ms = within.as_millis() as u64,
            "stop accepted; draining"
        );
        let accepted_at = self.clock.now();
        crate::telemetry::stop_accepted(cause, verdict, requester.written_at, accepted_at);
        let deadline = wall_deadline(accepted_at, within);
        let mut draining = Outcome::accepted(&self.own, cause, verdict, accepted_at, deadline);
        draining.request_id = requester.request_id.clone();
        draining.action = requester.action;
        draining.successor = requester.successor;
        self.publish_outcome(draining);
        self.drain = Some(DrainRun::new(
            cause,
            verdict,
            requester,
            accepted_at,
            Instant::now(),
            within,
        ));
        if let Ok(mut awaiting) = self.awaiting.lock() {
            *awaiting = (self.participants.iter().map(|p| p.name.clone()))
                .enumerate()
                .collect();
        }
        self.arm_overrun_watchdog(within);
        self.next_phase(false, ctx);
    }

    /// Ends the running phase (`timed_out` says how) and asks the next one's participants, or
    /// finishes when no phase is left.
    fn next_phase(&mut self, timed_out: bool, ctx: &mut Context<Self>) {
        let _in_stop = self.in_stop();
        let phases: Vec<DrainPhase> = self.participants.iter().map(|p| p.phase).collect();
        let wall = self.clock.now();
        let Some(run) = self.drain.as_mut() else {
            return;
        };
        let (phase, within, members, generation) =
            match run.advance(&phases, &self.config, Instant::now(), wall, timed_out) {
                Next::Finish => return self.finish(ctx),
                Next::Ask {
                    phase,
                    within,
                    participants,
                    generation,
                } => (phase, within, participants, generation),
            };
        tracing::info!(
            ?phase,
            participants = members.len(),
            within_ms = within.as_millis() as u64,
            "drain phase begins"
        );
        self.status
            .send_if_modified(|status| status.drain_phase.replace(phase) != Some(phase));
        let verdict = self.lifecycle.verdict().unwrap_or(StopVerdict::Unexpected);
        self.answers.clear();
        for index in members {
            let participant = &self.participants[index];
            let name = participant.name.clone();
            let slot = answers::Slot::new(participant.recipient.send(Drain {
                within,
                verdict,
                phase,
            }));
            self.answers.insert(index, slot.clone());
            ctx.spawn(
                slot.arrival()
                    .into_actor(self)
                    .map(move |answer, act, ctx| {
                        if let Some(answer) = answer {
                            act.on_answer(index, &name, phase, answer, ctx);
                        }
                    }),
            );
        }
        let ends = within.saturating_add(drain::clamp(self.config.answer_grace));
        ctx.run_later(ends, move |act, ctx| {
            act.phase_timer(phase, generation, None, ctx)
        });
    }

    /// The running phase's deadline and answer grace have passed. Takes in every answer that has
    /// reached the runner; while answers keep coming (this look found some waiting, or more came
    /// since the previous look — `last`: how many had been taken then, and when looking ends),
    /// looks again a moment later, for at most one more answer grace; then names who has not
    /// answered and moves on.
    fn phase_timer(
        &mut self,
        phase: DrainPhase,
        generation: u64,
        last: Option<(usize, Instant)>,
        ctx: &mut Context<Self>,
    ) {
        let _in_stop = self.in_stop();
        let current = |act: &Self| {
            act.lifecycle.state() == ProcessState::Draining
                && act.drain.as_ref().is_some_and(|r| r.is_current(generation))
        };
        if !current(self) {
            return;
        }
        let before = self.drain.as_ref().map_or(0, DrainRun::answers_taken);
        let waiting = self.drain.as_ref().map_or(Vec::new(), DrainRun::waiting);
        for index in waiting {
            let Some(answer) = self.answers.get(&index).and_then(answers::Slot::delivered) else {
                continue;
            };
            let name = self.participants[index].name.clone();
            self.on_answer(index, &name, phase, answer, ctx);
            if !current(self) {
                return; // that was the last answer: the next phase has begun
            }
        }
        let taken = self.drain.as_ref().map_or(0, DrainRun::answers_taken);
        let settle_ends = last.map_or(Instant::now() + self.config.answer_grace, |(_, at)| at);
        // Progress: answers since the last look (at the first, those this look found waiting).
        let progress = taken > last.map_or(before, |(at_last, _)| at_last);
        if progress && Instant::now() < settle_ends {
            // Answers are still arriving: a moment for the event loop to deliver the rest.
            ctx.run_later(SETTLE_LOOK, move |act, ctx| {
                act.phase_timer(phase, generation, Some((taken, settle_ends)), ctx);
            });
            return;
        }
        let unanswered: Vec<&str> = self.drain.as_ref().map_or(Vec::new(), |run| {
            run.waiting()
                .iter()
                .filter_map(|&i| self.participants.get(i).map(|p| p.name.as_str()))
                .collect()
        });
        tracing::warn!(
            ?phase,
            ?unanswered,
            "drain phase deadline passed without an answer from these participants \
             (the work they hold in memory is unknown); moving on"
        );
        self.next_phase(true, ctx);
    }

    /// Enters the span of the stop under way, if there is one (see `stop_span`).
    pub(super) fn in_stop(&self) -> Option<tracing::span::EnteredSpan> {
        self.stop_span.clone().map(tracing::Span::entered)
    }

    fn on_answer(
        &mut self,
        index: usize,
        name: &str,
        phase: DrainPhase,
        answer: Result<DrainReport, MailboxError>,
        ctx: &mut Context<Self>,
    ) {
        let _in_stop = self.in_stop();
        if self.lifecycle.state() != ProcessState::Draining {
            return;
        }
        let Some(run) = self.drain.as_mut() else {
            return;
        };
        if let Ok(mut awaiting) = self.awaiting.lock() {
            awaiting.remove(&index);
        }
        let report = match answer {
            Ok(report) => {
                crate::telemetry::participant_answered(name, phase, report.cut);
                Some(report)
            }
            Err(e) => {
                tracing::warn!(participant = %name, error = %e, "drain participant is gone; counted as answered");
                None
            }
        };
        if run.answer(index, name, phase, report) {
            self.next_phase(false, ctx);
        }
    }
}

impl Actor for RunnerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        crate::telemetry::state(self.lifecycle.state());
        self.publish();
        // actix polls a context once while dropping it (a System torn down before the actor
        // ever ran): there is no timer then, and the drop guard below takes over.
        let timers = tokio::runtime::Handle::try_current().is_ok();
        if timers {
            self.check_system(ctx);
        }
        if let Some(after) = self.config.ready_warning.filter(|_| timers) {
            ctx.run_later(drain::clamp(after), move |act, _| {
                if act.lifecycle.state().is_starting() {
                    tracing::warn!(
                        after_ms = after.as_millis() as u64,
                        "the application has not said it is ready (its handle's ready()); a \
                         planned stop is held until it does"
                    );
                }
            });
        }
    }
}

/// How long the runner waits between two looks at answers still arriving after a phase's
/// deadline and grace ([`RunnerActor::phase_timer`]): a moment for the event loop to run the
/// participants that are answering.
const SETTLE_LOOK: std::time::Duration = std::time::Duration::from_millis(1);

/// `at + within` on the wall clock, saturating at the latest time chrono can represent.
pub(super) fn wall_deadline(at: DateTime<Utc>, within: std::time::Duration) -> DateTime<Utc> {
    TimeDelta::from_std(within)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

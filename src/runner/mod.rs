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
mod drain;
mod guard;
mod messages;
pub(crate) mod process_end;

pub(crate) use crate::lifecycle::DrainPhase;
pub use config::{ExitCodes, RunnerConfig};
pub(crate) use messages::{AddParticipant, HeldStop};
pub use messages::{Drain, DrainReport, OsSignal, PlannedStop, Ready, RequestStop, RunnerStatus};

use drain::{DrainRun, Next, Participant, Requester};

use crate::clock::Clock;
use crate::error_chain::ErrorChain;
use crate::identity::ProcessIdentity;
use crate::lifecycle::{Lifecycle, RunnerState, Step, StopCause, StopVerdict};
use crate::marker::Marker;
use crate::outcome::{Outcome, Phase};
use crate::record::{
    MAX_ITEM_BYTES, Note, Persisted, RecordError, StopRecord, Unfinished, is_valid_item_id,
    item_id, oversized,
};
use crate::store::MarkerStore;
use actix::clock::Instant;
use actix::prelude::*;
use chrono::{DateTime, TimeDelta, Utc};
use std::sync::Arc;
use tokio::sync::watch;

/// The lifecycle actor. [`crate::PlannedStopService`] starts it with the watcher; the watcher
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
    drain: Option<DrainRun>,
    /// The items of a stop that are not durable yet, as JSON, from the end of the drain until
    /// the record is persisted: whatever ends the process meanwhile (the overrun watchdog, the
    /// drop guard) logs them first, so no item is lost without a trace.
    pending: Pending,
    /// Items over [`MAX_ITEM_BYTES`]: never written, so the stop ends `record_lost` with them in
    /// its ERROR log line.
    unrecorded: Vec<Unfinished>,
    /// The participants of a drain that have not answered yet, for the overrun watchdog's log.
    awaiting: Arc<std::sync::Mutex<Vec<String>>>,
}

impl std::fmt::Debug for RunnerActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerActor")
            .field("own", &self.own)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
thread_local! {
    /// How many runners exist on this thread (tests: a failed start must leave none).
    pub(crate) static LIVE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
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
        #[cfg(test)]
        LIVE.with(|live| live.set(live.get() + 1));
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
            pending: Arc::default(),
            unrecorded: Vec::new(),
            awaiting: Arc::default(),
        }
    }

    /// A receiver of the runner's status (subscribe before starting the actor, or later through
    /// the service handle).
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
        if outcome.phase.is_final() {
            self.withdraw_presence();
        }
        let outcome = Arc::new(outcome);
        self.status.send_modify(|status| {
            status.exit_code = outcome.exit_code;
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
        match step {
            Step::Ignore(why) => tracing::debug!(why, "stop request ignored"),
            Step::Hold => tracing::info!("planned stop received while starting; held until ready"),
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
        let within = drain::clamp(self.config.drain_deadline);
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
            drain_deadline: wall_deadline(accepted_at, within),
            finished_at: None,
            exit_code: None,
            spilled: false,
            drain: None,
        });
        self.drain = Some(DrainRun::new(
            cause,
            verdict,
            requester,
            accepted_at,
            Instant::now(),
            within,
        ));
        if let Ok(mut awaiting) = self.awaiting.lock() {
            *awaiting = self.participants.iter().map(|p| p.name.clone()).collect();
        }
        self.arm_overrun_watchdog(within);
        self.next_phase(false, ctx);
    }

    /// Ends the running phase (`timed_out` says how) and asks the next one's participants, or
    /// finishes when no phase is left.
    fn next_phase(&mut self, timed_out: bool, ctx: &mut Context<Self>) {
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
        let verdict = self.lifecycle.verdict().unwrap_or(StopVerdict::Unexpected);
        for index in members {
            let participant = &self.participants[index];
            let name = participant.name.clone();
            let answer = participant.recipient.send(Drain {
                within,
                verdict,
                phase,
            });
            ctx.spawn(
                answer
                    .into_actor(self)
                    .map(move |answer, act, ctx| act.on_answer(index, &name, phase, answer, ctx)),
            );
        }
        ctx.run_later(
            within.saturating_add(self.config.answer_grace),
            move |act, ctx| {
                if act.lifecycle.state() == RunnerState::Draining
                    && act.drain.as_ref().is_some_and(|r| r.is_current(generation))
                {
                    let unanswered: Vec<&str> = act.drain.as_ref().map_or(Vec::new(), |run| {
                        run.waiting()
                            .iter()
                            .filter_map(|&i| act.participants.get(i).map(|p| p.name.as_str()))
                            .collect()
                    });
                    tracing::warn!(
                        ?phase,
                        ?unanswered,
                        "drain phase deadline passed without an answer from these participants \
                         (the work they hold in memory is unknown); moving on"
                    );
                    act.next_phase(true, ctx);
                }
            },
        );
    }

    fn on_answer(
        &mut self,
        index: usize,
        name: &str,
        phase: DrainPhase,
        answer: Result<DrainReport, MailboxError>,
        ctx: &mut Context<Self>,
    ) {
        if self.lifecycle.state() != RunnerState::Draining {
            return;
        }
        let Some(run) = self.drain.as_mut() else {
            return;
        };
        if let Ok(mut awaiting) = self.awaiting.lock()
            && let Some(at) = awaiting.iter().position(|n| n == name)
        {
            awaiting.remove(at);
        }
        let report = match answer {
            Ok(report) => Some(report),
            Err(e) => {
                tracing::warn!(participant = %name, error = %e, "drain participant is gone; counted as answered");
                None
            }
        };
        if run.answer(index, name, phase, report, Instant::now()) {
            self.next_phase(false, ctx);
        }
    }

    fn finish(&mut self, ctx: &mut Context<Self>) {
        let Some(verdict) = self.lifecycle.stopped() else {
            return;
        };
        let Some(run) = self.drain.take() else {
            return;
        };
        // A marker a racing stopper wrote after the one accepted would otherwise stay behind for
        // this pid once the process is gone: consume it now.
        if let Some(late) = self.claim() {
            tracing::info!(
                request_id = late.request_id.as_deref(),
                "a later stop request for this process is consumed: a stop was already under way"
            );
        }
        let finished_at = self.clock.now();
        let action = run.requester.action;
        let code = match (verdict, action) {
            (StopVerdict::Planned, crate::marker::StopAction::Restart) => {
                self.config.exit_codes.restart
            }
            _ => self.config.exit_codes.code(run.cause, verdict),
        };
        let names: Vec<&str> = self.participants.iter().map(|p| p.name.as_str()).collect();
        let drained_in_time = run.drained_in_time(&names);
        let unanswered = run.unanswered(&names);
        let stopper = crate::record::host::this_process(&self.own);
        let mut unfinished = run.unfinished;
        // New work gets its id here; a handed-back item keeps the one its store gave it (never a
        // new one, which would multiply it).
        for (index, item) in unfinished.iter_mut().enumerate() {
            if !item.resumed && item.id.as_deref().is_none_or(|id| !is_valid_item_id(id)) {
                item.id = Some(item_id(&stopper, finished_at, index));
            }
        }
        // The one size limit, checked where items are accepted: an item no store may hold (too
        // large, or handed back under an id that is not an item id) is kept out of the record
        // and ends the stop as `record_lost`, never dropped silently.
        let (unfinished, unrecorded): (Vec<_>, Vec<_>) = unfinished.into_iter().partition(|u| {
            oversized(&u.item).is_none() && u.id.as_deref().is_some_and(is_valid_item_id)
        });
        let mut notes = run.notes;
        for item in &unrecorded {
            let id = item.id.as_deref().unwrap_or_default();
            let why = match oversized(&item.item) {
                Some(size) => {
                    format!("item {id} is {size} bytes of JSON, over the limit of {MAX_ITEM_BYTES}")
                }
                None => format!("item {id:?} was handed back under an id that is not an item id"),
            };
            notes.push(Note {
                participant: item.participant.clone(),
                note: format!("{why}: not recorded (it is in the ERROR log line)"),
            });
        }
        // The summary says the code the process will end with.
        let code = if unrecorded.is_empty() || self.config.records.is_none() {
            code
        } else {
            self.config.exit_codes.record_lost_code(run.cause)
        };
        self.unrecorded = unrecorded;
        let record = StopRecord {
            pid: self.own.pid,
            cause: run.cause,
            verdict,
            request_id: run.requester.request_id,
            reason: run.requester.reason,
            stopper_pid: run.requester.stopper_pid,
            accepted_at: run.accepted_at,
            drain_deadline: wall_deadline(
                run.accepted_at,
                drain::clamp(self.config.drain_deadline),
            ),
            finished_at,
            drained_in_time,
            forced: run.forced,
            unfinished,
            unanswered,
            notes,
            phases: run.phases,
            action,
            exit_code: code,
        };
        debug_assert_eq!(record.verdict, run.verdict);
        if let Ok(mut pending) = self.pending.lock() {
            *pending = Some(items_json(&record.unfinished, &self.unrecorded));
        }
        match self.config.records.clone() {
            // Persisted before anything reports the stop: the outcome, the status and the exit
            // code all wait for the items to be durable, within the persist's own budget.
            Some(store) => {
                let budget = self.config.persist_deadline;
                let persisting = async move {
                    let result =
                        match actix::clock::timeout(budget, store.persist(&stopper, &record)).await
                        {
                            Ok(result) => result,
                            Err(_) => Err(RecordError::backend(format!(
                                "the record store did not finish persisting within {budget:?} \
                                 (the persist deadline); is it reachable?"
                            ))),
                        };
                    (record, result)
                };
                ctx.wait(
                    persisting
                        .into_actor(self)
                        .map(|(record, result), act, ctx| act.conclude(record, result, ctx)),
                );
            }
            None => {
                if !record.unfinished.is_empty() || !self.unrecorded.is_empty() {
                    tracing::error!(
                        items = %items_json(&record.unfinished, &self.unrecorded),
                        "no record store is configured (ServiceBuilder::state_dir or \
                         record_store); the unfinished items are only in this log line"
                    );
                }
                self.unrecorded.clear();
                self.conclude(record, Ok(Persisted::Durable), ctx);
            }
        }
    }

    /// Ends the stop once the record is persisted (or could not be): the final outcome, the
    /// status, the exit code.
    fn conclude(
        &mut self,
        mut record: StopRecord,
        persisted: Result<Persisted, RecordError>,
        ctx: &mut Context<Self>,
    ) {
        let mut spilled = false;
        let unrecorded = std::mem::take(&mut self.unrecorded);
        let phase = match persisted {
            Ok(_) if !unrecorded.is_empty() => {
                record.exit_code = self.config.exit_codes.record_lost_code(record.cause);
                tracing::error!(
                    code = record.exit_code,
                    items = %items_json(&[], &unrecorded),
                    "items no record store may hold were handed back (over the size limit \
                     MAX_ITEM_BYTES, or under an id that is not an item id): they are not recorded \
                     anywhere but in this log line; resubmit them, and hand back smaller items (an \
                     id of the work, not the work itself). The other items are durable"
                );
                Phase::RecordLost
            }
            Ok(how) => {
                if let Persisted::Spilled { reason } = &how {
                    spilled = true;
                    tracing::warn!(
                        reason,
                        unfinished = record.unfinished.len(),
                        "the record store was unreachable; the unfinished items are kept on this \
                         host until the next start here pushes them"
                    );
                } else if self.config.records.is_some() {
                    tracing::info!(
                        unfinished = record.unfinished.len(),
                        "stop record and unfinished items persisted"
                    );
                }
                Phase::Stopped
            }
            Err(e) => {
                record.exit_code = self.config.exit_codes.record_lost_code(record.cause);
                tracing::error!(
                    error = %ErrorChain(&e),
                    code = record.exit_code,
                    items = %items_json(&record.unfinished, &unrecorded),
                    "cannot persist the stop record: the unfinished items are not recorded \
                     anywhere but in this log line; resubmit them, then fix the record store"
                );
                Phase::RecordLost
            }
        };
        if let Ok(mut pending) = self.pending.lock() {
            *pending = None;
        }
        let code = record.exit_code;
        tracing::info!(
            verdict = ?record.verdict,
            code,
            drained_in_time = record.drained_in_time,
            "stopped"
        );
        self.publish_outcome(Outcome {
            pid: self.own.pid,
            start: self.own.start,
            phase,
            cause: record.cause,
            verdict: record.verdict,
            request_id: record.request_id.clone(),
            accepted_at: record.accepted_at,
            drain_deadline: record.drain_deadline,
            finished_at: Some(record.finished_at),
            exit_code: Some(code),
            spilled,
            drain: Some(crate::outcome::DrainSummary::of(&record)),
        });
        if self.config.owns_process_exit {
            if let Some(system) = System::try_current() {
                system.stop_with_code(i32::from(process_end::status_of(code)));
            }
            // Whatever main does next (returns another code, or never returns because it runs
            // a server with block_on), the process ends with this code.
            process_end::concluded(code, Some(record.verdict), self.config.exit_grace);
        }
        ctx.stop();
    }
}

impl Actor for RunnerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.publish();
        // actix polls a context once while dropping it (a System torn down before the actor
        // ever ran): there is no timer then, and the drop guard below takes over.
        let timers = tokio::runtime::Handle::try_current().is_ok();
        if timers {
            self.check_system(ctx);
        }
        if let Some(after) = self.config.ready_warning.filter(|_| timers) {
            ctx.run_later(drain::clamp(after), move |act, _| {
                if act.lifecycle.state() == RunnerState::Starting {
                    tracing::warn!(
                        after_ms = after.as_millis() as u64,
                        "the application has not called ServiceHandle::ready(); a planned stop \
                         is held until it does"
                    );
                }
            });
        }
    }
}

impl Handler<HeldStop> for RunnerActor {
    type Result = ();

    fn handle(&mut self, HeldStop(stop): HeldStop, _: &mut Context<Self>) {
        if self.lifecycle.state() != RunnerState::Starting {
            return;
        }
        tracing::info!(
            request_id = stop.request_id.as_deref(),
            "a planned stop is held until the application is ready"
        );
        let now = self.clock.now();
        self.publish_outcome(Outcome {
            pid: self.own.pid,
            start: self.own.start,
            phase: Phase::Held,
            cause: StopCause::Marker,
            verdict: StopVerdict::Planned,
            request_id: stop.request_id,
            accepted_at: now,
            drain_deadline: now,
            finished_at: None,
            exit_code: None,
            spilled: false,
            drain: None,
        });
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
        self.participants.push(Participant {
            phase: add.phase,
            name: add.name,
            recipient: add.recipient,
        });
    }
}

/// The items of a stop as one JSON array, for the log line that is their last trace.
fn items_json(recorded: &[Unfinished], unrecorded: &[Unfinished]) -> String {
    let all: Vec<&Unfinished> = recorded.iter().chain(unrecorded).collect();
    serde_json::to_string(&all).unwrap_or_default()
}

/// `at + within` on the wall clock, saturating at the latest time chrono can represent.
fn wall_deadline(at: DateTime<Utc>, within: std::time::Duration) -> DateTime<Utc> {
    TimeDelta::from_std(within)
        .ok()
        .and_then(|d| at.checked_add_signed(d))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

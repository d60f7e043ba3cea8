//! [`MarkerWatcherActor`]: turns a marker on disk into one [`PlannedStop`] message.
//!
//! On Windows no SIGTERM handler ever runs, so a stopper cannot reach the runner through a signal;
//! the watcher closes that gap by probing the process's marker slot on a fixed delay and telling the
//! runner when a marker for this process is there. What it guarantees:
//!
//! - **At most one [`PlannedStop`] per process life**; after sending it the watcher stops — but
//!   for a restart when the service restarts in place, which may leave the runner running (its
//!   successor failed): then it watches on until the runner drains.
//! - It ticks with a fixed *delay* (`run_later` re-armed after each tick), not a fixed rate, so after
//!   a stall (a suspended laptop, a paused VM, a busy executor) there is one tick, not a burst.
//! - It never sends while the runner is draining or stopped, and stops as soon as the runner's
//!   status says so (it follows the runner's status channel, so it does not wait for a tick).
//! - A marker for us seen while the runner is still starting is held and sent the moment the runner
//!   is running.
//! - A marker with `trigger_watcher: false` is left for the signal path (the systemd `ExecStop` case).
//! - A probe error is logged once, then again at most once a minute while it persists, and the
//!   watcher keeps going: an unreadable slot is "no decision", never a stop.
//!
//! - Optionally event-driven ([`MarkerWatcherActor::with_wakeups`], fed by
//!   [`crate::events::SlotEvents`]): a wake-up probes at once, and the fixed-delay poll stays as the
//!   safety net for missed events.
//!
//! The probe is non-destructive for our own marker; the runner claims it when it acts.

use crate::clock::Clock;
use crate::error_chain::ErrorChain;
use crate::events::{SlotEvents, Wakeups};
use crate::identity::ProcessIdentity;
use crate::judgement::Judgement;
use crate::lifecycle::{ProcessState, StopRequest};
use crate::runner::{HeldStop, PlannedStop, RequestStop, RunnerStatus};
use crate::store::{MarkerStore, StoreError};
use actix::clock::Instant;
use actix::prelude::*;
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a persisting probe error is logged again.
pub(crate) const PROBE_ERROR_LOG_EVERY: Duration = Duration::from_secs(60);

/// What the watcher probes: normally [`OwnSlot`], this process's slot in a [`MarkerStore`].
pub trait MarkerProbe: 'static {
    /// Judges the slot at `now` (see [`MarkerStore::probe`]).
    fn probe(&self, now: DateTime<Utc>) -> Result<Judgement, StoreError>;
}

/// This process's slot in a store.
#[derive(Debug, Clone)]
pub struct OwnSlot {
    /// The store.
    pub store: MarkerStore,
    /// This process, read once at start-up.
    pub own: ProcessIdentity,
}

impl MarkerProbe for OwnSlot {
    fn probe(&self, now: DateTime<Utc>) -> Result<Judgement, StoreError> {
        self.store.probe(&self.own, now)
    }
}

/// What the watcher does with one probe's judgement while the runner is in `state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchStep {
    /// Send this planned stop now and stop watching.
    Deliver(PlannedStop),
    /// Keep this planned stop until the runner is running.
    Hold(PlannedStop),
    /// Probe again after the interval.
    Continue,
    /// The runner is stopping: stop watching.
    Exit,
}

/// The watcher's rule, pure: a marker for us that asks the watcher to act is delivered when the
/// runner runs, held while it starts, and dropped once it is stopping.
pub fn next_step(judgement: &Judgement, state: ProcessState) -> WatchStep {
    match (state, judgement) {
        (state, _) if state.is_stopping() => WatchStep::Exit,
        (_, Judgement::ForSelf(m)) if !m.trigger_watcher => WatchStep::Continue,
        (state, Judgement::ForSelf(m)) if state.is_starting() => WatchStep::Hold(m.into()),
        (_, Judgement::ForSelf(m)) => WatchStep::Deliver(m.into()),
        _ => WatchStep::Continue,
    }
}

/// Where the watcher stands between probes: the once-only guard of delivery, kept apart from the
/// actor so the rule can be checked on its own (the model checker in `tests/model.rs` drives it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub enum Watch {
    /// Probing the slot.
    #[default]
    Looking,
    /// A planned stop was found while the runner was starting; it is delivered once the runner
    /// runs.
    Holding(PlannedStop),
    /// A stop was delivered, or the runner is stopping: nothing more to watch for this life.
    Done,
}

/// What the watcher sends after a step of [`Watch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchSend {
    /// Nothing.
    Nothing,
    /// This planned stop, to the runner.
    Stop(PlannedStop),
    /// The notice that this planned stop is held, to the runner (for the stopper's outcome file).
    HeldNotice(PlannedStop),
}

impl Watch {
    /// Whether the watcher still probes.
    pub fn is_looking(&self) -> bool {
        matches!(self, Watch::Looking)
    }

    /// Acts on one probe's [`WatchStep`] ([`next_step`]'s answer). Only a watcher still looking
    /// acts: after a delivery nothing is ever sent again, which makes delivery once per life.
    pub fn on_step(&mut self, step: WatchStep) -> WatchSend {
        if !self.is_looking() {
            return WatchSend::Nothing;
        }
        match step {
            WatchStep::Deliver(stop) => {
                *self = Watch::Done;
                WatchSend::Stop(stop)
            }
            WatchStep::Hold(stop) => {
                *self = Watch::Holding(stop.clone());
                WatchSend::HeldNotice(stop)
            }
            WatchStep::Continue => WatchSend::Nothing,
            WatchStep::Exit => {
                *self = Watch::Done;
                WatchSend::Nothing
            }
        }
    }

    /// The runner's state changed: a held stop goes out once it runs; a stopping runner ends
    /// the watch.
    pub fn on_runner(&mut self, state: ProcessState) -> WatchSend {
        match state {
            state if state.is_stopping() => {
                *self = Watch::Done;
                WatchSend::Nothing
            }
            state if state.is_starting() => WatchSend::Nothing,
            _ => match std::mem::take(self) {
                Watch::Holding(stop) => {
                    *self = Watch::Done;
                    WatchSend::Stop(stop)
                }
                other => {
                    *self = other;
                    WatchSend::Nothing
                }
            },
        }
    }
}

/// Logs probe errors without flooding: the first, then at most one per [`PROBE_ERROR_LOG_EVERY`].
#[derive(Debug, Default)]
struct ProbeErrors {
    consecutive: u64,
    last_logged: Option<Instant>,
}

impl ProbeErrors {
    fn failed(&mut self, error: &StoreError) {
        self.consecutive += 1;
        let now = Instant::now();
        if self
            .last_logged
            .is_none_or(|t| now.duration_since(t) >= PROBE_ERROR_LOG_EVERY)
        {
            tracing::warn!(error = %ErrorChain(error), consecutive = self.consecutive,
                "cannot probe the planned-stop marker; will keep trying");
            self.last_logged = Some(now);
        } else {
            tracing::debug!(error = %ErrorChain(error), consecutive = self.consecutive, "marker probe failed again");
        }
    }

    fn succeeded(&mut self) {
        if self.consecutive > 0 {
            tracing::info!(failures = self.consecutive, "marker probe works again");
        }
        *self = ProbeErrors::default();
    }
}

/// The watcher actor. See the module docs.
pub struct MarkerWatcherActor {
    probe: Box<dyn MarkerProbe>,
    target: Recipient<PlannedStop>,
    held_notice: Option<Recipient<HeldStop>>,
    runner: watch::Receiver<RunnerStatus>,
    clock: Arc<dyn Clock>,
    interval: Duration,
    watch: Watch,
    errors: ProbeErrors,
    wakeups: Option<Wakeups>,
    events: Option<SlotEvents>,
    /// Told to stop unexpectedly when the watcher panics.
    on_panic: Option<Recipient<RequestStop>>,
    /// Whether a delivered restart leaves the watch on (the service restarts in place).
    keeps_after_restart: bool,
}

impl std::fmt::Debug for MarkerWatcherActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MarkerWatcherActor").finish_non_exhaustive()
    }
}

impl MarkerWatcherActor {
    /// A watcher probing `probe` every `interval`, delivering to `target`, following the runner's
    /// status on `runner`.
    pub fn new(
        probe: impl MarkerProbe,
        target: Recipient<PlannedStop>,
        runner: watch::Receiver<RunnerStatus>,
        interval: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        MarkerWatcherActor {
            probe: Box::new(probe),
            target,
            held_notice: None,
            runner,
            clock,
            interval,
            watch: Watch::Looking,
            errors: ProbeErrors::default(),
            wakeups: None,
            events: None,
            on_panic: None,
            keeps_after_restart: false,
        }
    }

    /// Keeps watching after delivering a restart (default `false`): with restart in place the
    /// runner stays running until the successor is ready, and when the successor fails it runs
    /// on, so a later marker must reach it. A stop, and the runner's drain, still end the watch.
    pub fn keeps_watching_after_restarts(mut self, keep: bool) -> Self {
        self.keeps_after_restart = keep;
        self
    }

    /// Asks `runner` for an unexpected stop if the watcher panics (marker stops would be
    /// ignored from then on); without it the panic is only logged.
    pub fn stops_runner_on_panic(mut self, runner: Recipient<RequestStop>) -> Self {
        self.on_panic = Some(runner);
        self
    }

    /// Tells `notice` when a planned stop is held because the runner is still starting, so
    /// the runner can say so to stoppers.
    pub fn with_held_notice(mut self, notice: Recipient<HeldStop>) -> Self {
        self.held_notice = Some(notice);
        self
    }

    /// Probes at once whenever `wakeups` yields (a filesystem event), besides polling. `events`, if
    /// given, is kept alive as long as the watcher runs.
    pub fn with_wakeups(mut self, wakeups: Wakeups, events: Option<SlotEvents>) -> Self {
        self.wakeups = Some(wakeups);
        self.events = events;
        self
    }

    fn runner_state(&self) -> ProcessState {
        self.runner.borrow().state
    }

    /// One poll: probe, then re-arm the fixed delay unless the watcher is done.
    fn poll(&mut self, ctx: &mut Context<Self>) {
        if self.check(ctx) {
            ctx.run_later(self.interval, |act, ctx| act.poll(ctx));
        }
    }

    /// Probes and acts on the judgement. Returns whether watching goes on.
    fn check(&mut self, ctx: &mut Context<Self>) -> bool {
        if !self.watch.is_looking() {
            return false;
        }
        let state = self.runner_state();
        let step = match self.probe.probe(self.clock.now()) {
            Ok(judgement) => {
                tracing::trace!(verdict = judgement.kind(), "marker probed");
                self.errors.succeeded();
                next_step(&judgement, state)
            }
            Err(e) if state.is_stopping() => {
                tracing::debug!(error = %ErrorChain(&e), "probe failed while the runner stops");
                WatchStep::Exit
            }
            Err(e) => {
                self.errors.failed(&e);
                WatchStep::Continue
            }
        };
        let send = self.watch.on_step(step);
        self.keep_looking_after(&send);
        self.send(send, ctx);
        self.watch.is_looking()
    }

    /// A delivered restart leaves the watch on when the service restarts in place: the hand-over
    /// may fail, and the process then serves on and must see the next request. Shared by both
    /// ways a stop goes out (found now, or held while starting and sent once running).
    fn keep_looking_after(&mut self, send: &WatchSend) {
        let restart =
            matches!(send, WatchSend::Stop(s) if s.action == crate::schema::StopAction::Restart);
        if restart && self.keeps_after_restart {
            self.watch = Watch::Looking;
        }
    }

    /// Waits for the next wake-up (coalescing a burst into one probe), probes, and waits again.
    fn follow_wakeups(&mut self, ctx: &mut Context<Self>) {
        let Some(mut wakeups) = self.wakeups.take() else {
            return;
        };
        let next = async move {
            let open = wakeups.recv().await.is_some();
            while wakeups.try_recv().is_ok() {}
            (wakeups, open)
        };
        ctx.spawn(next.into_actor(self).map(|(wakeups, open), act, ctx| {
            if !open {
                tracing::debug!("filesystem notifications ended; polling only");
                return;
            }
            act.wakeups = Some(wakeups);
            if !act.runner_state().is_stopping() {
                act.check(ctx);
            }
            act.follow_wakeups(ctx);
        }));
    }

    /// Sends what a step of the watch says, and stops the actor once the watch is done.
    fn send(&mut self, send: WatchSend, ctx: &mut Context<Self>) {
        if self.watch == Watch::Done {
            // Nothing left to watch for: the notifications end before the stop goes out, so the
            // kernel reaps the watch while the runner claims and drains, not during the exit.
            self.events = None;
        }
        match send {
            WatchSend::Stop(stop) => {
                tracing::info!(
                    request_id = stop.request_id.as_deref(),
                    "planned stop delivered"
                );
                self.target.do_send(stop);
            }
            WatchSend::HeldNotice(stop) => {
                tracing::debug!("planned stop found while starting; held until running");
                if let Some(notice) = &self.held_notice {
                    notice.do_send(HeldStop(stop));
                }
            }
            WatchSend::Nothing => {}
        }
        if self.watch == Watch::Done {
            ctx.stop();
        }
    }

    /// The runner's status changed.
    fn on_runner(&mut self, ctx: &mut Context<Self>) {
        let send = self.watch.on_runner(self.runner_state());
        self.keep_looking_after(&send);
        let resumed = self.watch.is_looking() && matches!(send, WatchSend::Stop(_));
        self.send(send, ctx);
        if resumed {
            // Polling ended while the stop was held: it starts again.
            ctx.run_later(self.interval, |act, ctx| act.poll(ctx));
        }
    }

    /// Waits for the next change of the runner's status, then handles it and waits again. The
    /// receiver travels through the future and back, so each change is seen once.
    fn follow_runner(&mut self, ctx: &mut Context<Self>) {
        let mut runner = self.runner.clone();
        let changed = async move {
            let alive = runner.changed().await.is_ok();
            (runner, alive)
        };
        ctx.spawn(changed.into_actor(self).map(|(runner, alive), act, ctx| {
            act.runner = runner;
            if !alive {
                // The runner is gone: nobody left to deliver to.
                ctx.stop();
                return;
            }
            act.on_runner(ctx);
            if act.watch != Watch::Done {
                act.follow_runner(ctx);
            }
        }));
    }
}

impl Actor for MarkerWatcherActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // actix polls a context once while dropping it (a System torn down before the watcher
        // ever ran, `main` returning at once): no timer can be set then, and nothing is left to
        // watch for.
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        self.runner.mark_unchanged();
        self.follow_runner(ctx);
        self.follow_wakeups(ctx);
        self.on_runner(ctx);
        if !self.runner_state().is_stopping() {
            self.poll(ctx);
        }
    }
}

/// A watcher that panicked has stopped watching: marker stops (the only ones on Windows) would be
/// ignored for the rest of the process's life. So it asks the runner for an unexpected stop,
/// which `main` sees as the unexpected code; a supervisor restarts the process.
impl Drop for MarkerWatcherActor {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        match &self.on_panic {
            Some(runner) => {
                tracing::error!(
                    "the planned-stop marker watcher panicked; stopping as unexpected so that \
                     stops are not ignored"
                );
                runner.do_send(RequestStop(StopRequest::Unexpected));
            }
            None => tracing::error!(
                "the planned-stop marker watcher panicked; marker stops are ignored from now on"
            ),
        }
    }
}

#[cfg(test)]
mod tests;

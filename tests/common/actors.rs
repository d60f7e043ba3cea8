//! Harness for actor tests: an actix system on tokio's paused clock, a wall clock that follows it,
//! a recorder standing in for the runner, controllable drain participants and a log capture.

use actix::prelude::*;
use chrono::{DateTime, Utc};
use planned_stop::internals::{Clock, PlannedStop};
use planned_stop::{Drain, DrainReport, ProcessState, RunnerStatus, StopVerdict};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch};

/// An actix system whose tokio runtime starts with its clock paused: timers fire only when the test
/// advances time, so nothing depends on the machine's speed.
pub fn paused_system() -> actix::SystemRunner {
    System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    })
}

/// Resolves once the runner behind `h` has handled every message sent to it so far: what a test
/// waits on before asserting that a request, a signal or readiness changed (or did not change)
/// the runner's status.
pub async fn caught_up(h: &planned_stop::ServiceHandle) {
    planned_stop::internals::runner_caught_up(h).await;
}

/// Lets every ready task run (messages, watch notifications, fired timers) without moving time.
/// Used only where no single event marks the end of a step: after moving the paused clock
/// ([`advance`]), and between the state-machine test's steps, whose consequences fan out to the
/// runner, the watcher and a participant in an order the model leaves open. Everywhere else a
/// test waits for its own event: [`caught_up`], [`until`], [`ParticipantControl::wait_asked`],
/// [`Watched::watcher_gone`].
pub async fn settle() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// Waits until the runner's status satisfies `wanted` (work on the runtime's blocking threads,
/// such as the file store's, takes its own time: yields alone cannot wait for it). On the paused
/// clock a status that never comes fails the test once an hour of virtual time has passed,
/// instead of hanging it.
pub async fn until(
    status: &watch::Receiver<RunnerStatus>,
    wanted: impl Fn(&RunnerStatus) -> bool,
) -> RunnerStatus {
    let mut status = status.clone();
    let waited = tokio::time::timeout(Duration::from_secs(3600), async {
        loop {
            let now = status.borrow_and_update().clone();
            if wanted(&now) {
                return now;
            }
            if status.changed().await.is_err() {
                return status.borrow().clone();
            }
        }
    });
    waited
        .await
        .expect("the runner never reached the wanted status")
}

/// Waits until the runner has concluded its stop (its exit code is known: the record is
/// persisted, or could not be).
pub async fn concluded(status: &watch::Receiver<RunnerStatus>) -> RunnerStatus {
    until(status, |s| s.exit_code().is_some()).await
}

/// Moves the paused clock forward by `d` in one jump, then settles.
pub async fn advance(d: Duration) {
    tokio::time::advance(d).await;
    settle().await;
}

/// A wall clock that starts at the real time and then moves only with tokio's (paused) clock.
pub struct TokioClock {
    base_wall: DateTime<Utc>,
    base: tokio::time::Instant,
}

impl TokioClock {
    /// Call inside the runtime.
    pub fn new() -> Arc<TokioClock> {
        Arc::new(TokioClock {
            base_wall: Utc::now(),
            base: tokio::time::Instant::now(),
        })
    }
}

impl TokioClock {
    /// The wall time the clock started at.
    pub fn base_wall(&self) -> DateTime<Utc> {
        self.base_wall
    }
}

impl Clock for TokioClock {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = tokio::time::Instant::now() - self.base;
        self.base_wall + chrono::TimeDelta::from_std(elapsed).unwrap()
    }
}

/// A runner status for tests that set the runner's state by hand.
pub fn status(state: ProcessState) -> RunnerStatus {
    let mut status = RunnerStatus::starting();
    status.state = state;
    status
}

/// One delivery seen by a [`Recorder`]: the message and the runner's state at that moment.
pub type Delivery = (PlannedStop, ProcessState);

/// Stands in for the runner (an event loop that only records): records every `PlannedStop` and the runner state
/// it arrived in, then optionally forwards it.
pub struct Recorder {
    pub seen: Arc<Mutex<Vec<Delivery>>>,
    pub state: watch::Receiver<RunnerStatus>,
    pub forward: Option<Recipient<PlannedStop>>,
}

impl Actor for Recorder {
    type Context = Context<Self>;
}

impl Handler<PlannedStop> for Recorder {
    type Result = ();
    fn handle(&mut self, stop: PlannedStop, _: &mut Context<Self>) {
        let state = self.state.borrow().state;
        self.seen.lock().unwrap().push((stop.clone(), state));
        if let Some(next) = &self.forward {
            next.do_send(stop);
        }
    }
}

/// A drain participant that answers only when the test says so, with the given unfinished items.
pub struct Participant {
    pub pending: Arc<Mutex<Option<oneshot::Sender<DrainReport>>>>,
    pub asked: Arc<Mutex<Vec<(Duration, StopVerdict)>>>,
    /// How many drain requests have arrived: what [`ParticipantControl::wait_asked`] waits on.
    pub asks: Arc<watch::Sender<usize>>,
}

impl Default for Participant {
    fn default() -> Self {
        Participant {
            pending: Arc::default(),
            asked: Arc::default(),
            asks: Arc::new(watch::channel(0).0),
        }
    }
}

impl Actor for Participant {
    type Context = Context<Self>;
}

impl Handler<Drain> for Participant {
    type Result = ResponseFuture<DrainReport>;
    fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> Self::Result {
        self.asked
            .lock()
            .unwrap()
            .push((drain.within, drain.verdict));
        let (tx, rx) = oneshot::channel();
        *self.pending.lock().unwrap() = Some(tx);
        self.asks.send_modify(|n| *n += 1);
        Box::pin(async move { rx.await.unwrap_or_default() })
    }
}

/// The test's side of a [`Participant`].
#[derive(Clone)]
pub struct ParticipantControl {
    pub pending: Arc<Mutex<Option<oneshot::Sender<DrainReport>>>>,
    pub asked: Arc<Mutex<Vec<(Duration, StopVerdict)>>>,
    pub asks: watch::Receiver<usize>,
}

impl ParticipantControl {
    /// Starts a participant; returns its recipient and its control.
    pub fn start() -> (Recipient<Drain>, ParticipantControl) {
        let p = Participant::default();
        let control = ParticipantControl {
            pending: p.pending.clone(),
            asked: p.asked.clone(),
            asks: p.asks.subscribe(),
        };
        (p.start().recipient(), control)
    }

    /// The drain requests received so far (deadline, verdict).
    pub fn asked(&self) -> Vec<(Duration, StopVerdict)> {
        self.asked.lock().unwrap().clone()
    }

    /// Waits until the participant has been asked to drain (its answer is pending). On the paused
    /// clock a request that never comes fails the test once an hour of virtual time has passed.
    pub async fn wait_asked(&self) {
        let mut asks = self.asks.clone();
        tokio::time::timeout(Duration::from_secs(3600), asks.wait_for(|n| *n > 0))
            .await
            .expect("the participant was never asked to drain")
            .expect("the participant is gone");
    }

    /// Answers the drain request, if one is waiting. Returns whether one was.
    pub fn finish(&self, unfinished: &[&str]) -> bool {
        match self.pending.lock().unwrap().take() {
            Some(tx) => {
                let _ = tx.send(DrainReport::unfinished(unfinished.iter().copied()));
                true
            }
            None => false,
        }
    }
}

/// Captures tracing events (level, and the message followed by every other field as
/// ` name=value`) for assertions on logs.
#[derive(Clone, Default)]
pub struct LogCapture(pub Arc<Mutex<Vec<(tracing::Level, String)>>>);

impl LogCapture {
    /// Installs the capture for the current thread; keep the guard alive.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = tracing_subscriber::registry().with(self.clone());
        tracing::subscriber::set_default(subscriber)
    }

    /// The longest event captured, in bytes (message and fields).
    pub fn longest(&self) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, m)| m.len())
            .max()
            .unwrap_or(0)
    }

    /// How many events at `level` contain `text`.
    pub fn count(&self, level: tracing::Level, text: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(l, m)| *l == level && m.contains(text))
            .count()
    }
}

/// An event's or a span's fields: the message, and every other field as ` name=value`.
#[derive(Default)]
struct Fields(String, String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        } else {
            self.1 += &format!(" {}={value:?}", field.name());
        }
    }
}

/// A span's name and fields, kept with the span: `planned_stop{ request_id=Some("r") ...}`.
struct SpanText(String);

impl<S> tracing_subscriber::Layer<S> for LogCapture
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            let text = format!("{}{{{}}}", span.name(), fields.1);
            span.extensions_mut().insert(SpanText(text));
        }
    }

    /// Records the event as its message, its fields, and ` in SPAN{fields}` for each span it
    /// is inside, outermost first.
    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        let mut m = Fields::default();
        event.record(&mut m);
        let mut line = m.0 + &m.1;
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(text) = span.extensions().get::<SpanText>() {
                    line += &format!(" in {}", text.0);
                }
            }
        }
        self.0
            .lock()
            .unwrap()
            .push((*event.metadata().level(), line));
    }
}

/// A real watcher whose runner is a [`Recorder`] and whose runner state the test sets by hand.
pub struct Watched {
    pub watcher: Addr<planned_stop::internals::MarkerWatcherActor>,
    pub seen: Arc<Mutex<Vec<Delivery>>>,
    /// The runner status the watcher follows; only the watcher holds its receiver, so the
    /// channel closes when the watcher has stopped ([`Watched::watcher_gone`]).
    pub runner: watch::Sender<RunnerStatus>,
    /// The same status, for the recorder (which must not keep the watcher's channel open).
    recorder_status: watch::Sender<RunnerStatus>,
}

impl Watched {
    /// Starts a watcher on `probe` with the runner in `state`; `wakeups` makes it event-driven.
    pub fn start(
        probe: impl planned_stop::internals::MarkerProbe,
        state: ProcessState,
        poll: Duration,
        clock: Arc<dyn Clock>,
        wakeups: Option<(
            planned_stop::internals::Wakeups,
            Option<planned_stop::internals::SlotEvents>,
        )>,
    ) -> Watched {
        let (runner, rx) = watch::channel(status(state));
        let (recorder_status, recorder_rx) = watch::channel(status(state));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = Recorder {
            seen: seen.clone(),
            state: recorder_rx,
            forward: None,
        }
        .start();
        let mut watcher = planned_stop::internals::MarkerWatcherActor::new(
            probe,
            recorder.recipient(),
            rx,
            poll,
            clock,
        );
        if let Some((wakeups, events)) = wakeups {
            watcher = watcher.with_wakeups(wakeups, events);
        }
        Watched {
            watcher: watcher.start(),
            seen,
            runner,
            recorder_status,
        }
    }

    /// The runner has stopped.
    pub fn stop_event(&self) {
        self.set_state(ProcessState::Stopped);
    }

    /// Sets the runner state the watcher (and the recorder) see.
    pub fn set_state(&self, state: ProcessState) {
        self.runner.send_modify(|s| s.state = state);
        self.recorder_status.send_modify(|s| s.state = state);
    }

    /// Resolves once the watcher has stopped (it dropped its end of the status channel). On the
    /// paused clock a watcher that never stops fails the test once an hour of virtual time has
    /// passed.
    pub async fn watcher_gone(&self) {
        tokio::time::timeout(Duration::from_secs(3600), self.runner.closed())
            .await
            .expect("the watcher never stopped");
    }

    /// Every `PlannedStop` delivered so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.seen.lock().unwrap().clone()
    }
}

#[allow(unused_imports)] // not every test file uses it
pub use super::program::code_of;

/// A participant that answers its first drain with the report it was given (and any later one
/// with [`DrainReport::done`]).
pub struct Answering(pub Option<DrainReport>);

impl Answering {
    /// One that hands back `items`.
    pub fn holding(items: &[&str]) -> Recipient<Drain> {
        Answering(Some(DrainReport::unfinished(items.to_vec())))
            .start()
            .recipient()
    }
}

impl Actor for Answering {
    type Context = Context<Self>;
}

impl Handler<Drain> for Answering {
    type Result = DrainReport;
    fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> DrainReport {
        self.0.take().unwrap_or_else(DrainReport::done)
    }
}

/// A participant that holds items and hands them back at its deadline, as a job that cannot
/// finish in time does, `.2` later: the many-participants scale tests. The deadline is the one
/// the first participant sharing `.1` saw when it took its `Drain`, so the answers arrive when
/// the test says (ten thousand `Drain`s take a while to be handled on one thread, and a
/// participant counting its `within` from its own turn would answer late by that much, which is
/// not the runner's doing).
pub struct AtDeadline(
    pub Vec<String>,
    pub std::sync::Arc<std::sync::OnceLock<actix::clock::Instant>>,
    pub Duration,
);

impl Actor for AtDeadline {
    type Context = Context<Self>;
}

impl Handler<Drain> for AtDeadline {
    type Result = ResponseFuture<DrainReport>;
    fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> Self::Result {
        let items = std::mem::take(&mut self.0);
        let due = *self
            .1
            .get_or_init(|| actix::clock::Instant::now() + drain.within)
            + self.2;
        Box::pin(async move {
            actix::clock::sleep_until(due).await;
            DrainReport::unfinished(items)
        })
    }
}

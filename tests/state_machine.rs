//! proptest-state-machine: the runner and the watcher against reference models.
//!
//! Two machines, each model written from `docs/design.md`, not from the code:
//!
//! 1. **Runner and watcher together** (`runner_and_watcher_follow_the_model`): the runner's state,
//!    verdict and exit code, the marker slot and the watcher after any sequence of clock moves,
//!    markers, signals, drain events, and planned stops sent straight to the runner's address
//!    (the only way the runner itself is asked while starting, which is where the verdict latch
//!    decides). Invariants after every step:
//!    - at most one `PlannedStop` from the watcher, only ever while the runner is `Running`;
//!    - the verdict never changes once set; the state only moves forward;
//!    - a foreign marker is never deleted, and the probe never deletes our own marker;
//!    - the exit code matches the verdict.
//! 2. **The watcher against a stepped runner**
//!    (`the_watcher_follows_the_model_against_a_stepped_runner`): the real watcher, whose runner
//!    status moves only when the model says so and which nobody claims the marker for. The real
//!    runner reacts to a delivery at once, hiding a watcher that would deliver twice or deliver
//!    to a runner that is stopping; here either shows as a second delivery or a delivery seen in
//!    a state other than `Running`.
//!
//! Half the cases run the watcher event-driven (a notification on every change of the slot, sent
//! by the test as the OS would), half polling only.
//!
//! What these machines alone catch is recorded in `docs/reliability.md` (mutation testing): a
//! watcher that keeps delivering, one whose runner-state guards are all removed, and a lifecycle
//! without the verdict latch.
//!
//! CI runs 1,000 cases of each; `PROPTEST_CASES=10000 cargo test --test tests state_machine::` (or
//! `just proptest-long`) runs more.

use crate::common;

use actix::prelude::*;
use chrono::TimeDelta;
use common::actors::*;
use common::life_rank;
use planned_stop::internals::{
    Clock, MarkerWatcherActor, OsSignal, OwnSlot, PlannedStop, Ready, RunnerActor, RunnerConfig,
};
use planned_stop::marker::{Marker, MarkerStore};
use planned_stop::{Layout, RunnerStatus};
use planned_stop::{ProcessIdentity, ProcessState, SignalKind, StopVerdict};
use proptest::prelude::*;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const POLL_MS: u64 = 100;
const DRAIN_MS: u64 = 1_000;
const GRACE_MS: u64 = 100;
const TTL_MS: u64 = 60_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MarkerKind {
    /// For us, fresh, `trigger_watcher: true`.
    Own,
    /// For us, `trigger_watcher: false` (the signal path's marker).
    OwnNoTrigger,
    /// For another pid.
    Foreign,
    /// Our pid, another start fingerprint (a recycled pid).
    ReusedPid,
    /// Written two minutes ago.
    Stale,
    /// Dated an hour ahead.
    Future,
    /// Not JSON.
    Malformed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transition {
    /// Advance by one poll interval.
    Tick,
    /// Advance by less than a poll interval.
    AdvanceClock(u64),
    /// Advance by many poll intervals in one jump.
    Stall(u64),
    WriteMarker(MarkerKind),
    RemoveMarker,
    MarkReady,
    Signal(SignalKind),
    ParticipantFinishes,
    /// Advance to the drain deadline (plus the answer grace).
    DrainDeadline,
    /// A `PlannedStop` sent straight to the runner's address (the application, or a second
    /// source), not through the watcher: the only way the runner is asked while still starting.
    PlannedStopToRunner,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ModelMarker {
    kind: MarkerKind,
    written_ms: u64,
}

/// How the one decision function should judge a marker (the model's own, simpler statement).
#[derive(Debug, PartialEq, Eq)]
enum Judged {
    ForSelf { trigger: bool },
    Foreign,
    Removable,
}

impl ModelMarker {
    fn judge(&self, now_ms: u64) -> Judged {
        let expired = now_ms.saturating_sub(self.written_ms) > TTL_MS;
        match self.kind {
            MarkerKind::Own | MarkerKind::OwnNoTrigger if expired => Judged::Removable,
            MarkerKind::Own => Judged::ForSelf { trigger: true },
            MarkerKind::OwnNoTrigger => Judged::ForSelf { trigger: false },
            MarkerKind::Foreign if expired => Judged::Removable,
            MarkerKind::Foreign => Judged::Foreign,
            MarkerKind::ReusedPid
            | MarkerKind::Stale
            | MarkerKind::Future
            | MarkerKind::Malformed => Judged::Removable,
        }
    }
}

#[derive(Debug, Clone)]
struct Model {
    /// Event-driven (a notification wakes the watcher on every change of the slot) or polling only.
    events: bool,
    now_ms: u64,
    /// Time since the watcher's last tick; `None` once it stopped ticking (holding, or stopped).
    since_tick_ms: Option<u64>,
    watcher_alive: bool,
    watcher_holds: bool,
    /// The runner itself holds a planned stop that arrived while it was starting.
    runner_holds: bool,
    state: ProcessState,
    verdict: Option<StopVerdict>,
    marker: Option<ModelMarker>,
    deliveries: u32,
    drain_ends_ms: Option<u64>,
    participant_waiting: bool,
    exit_code: Option<i32>,
    /// A Ctrl-C was received: a second one while draining forces the stop.
    interrupted: bool,
}

impl Model {
    fn new(events: bool) -> Model {
        // The watcher probes once at start (t = 0) and finds nothing.
        Model {
            events,
            now_ms: 0,
            since_tick_ms: Some(0),
            watcher_alive: true,
            watcher_holds: false,
            runner_holds: false,
            state: ProcessState::Starting,
            verdict: None,
            marker: None,
            deliveries: 0,
            drain_ends_ms: None,
            participant_waiting: false,
            exit_code: None,
            interrupted: false,
        }
    }

    /// The runner's claim: consumes our marker, removes a removable one, leaves a foreign one.
    /// Returns whether our marker was consumed.
    fn claim(&mut self) -> bool {
        match self.marker.map(|m| m.judge(self.now_ms)) {
            Some(Judged::ForSelf { .. }) => {
                self.marker = None;
                true
            }
            Some(Judged::Removable) => {
                self.marker = None;
                false
            }
            Some(Judged::Foreign) | None => false,
        }
    }

    fn begin_drain(&mut self, verdict: StopVerdict) {
        // The latch: the first classification is final.
        self.verdict.get_or_insert(verdict);
        self.runner_holds = false;
        self.state = ProcessState::Draining;
        // The watcher follows the runner's status and stops at once.
        self.watcher_alive = false;
        self.watcher_holds = false;
        self.since_tick_ms = None;
        self.drain_ends_ms = Some(self.now_ms + DRAIN_MS + GRACE_MS);
        self.participant_waiting = true;
    }

    /// What the runner's status says in the model's state: `held` while the runner holds a stop.
    fn status_state(&self) -> ProcessState {
        match self.state {
            ProcessState::Starting if self.runner_holds => ProcessState::Held,
            state => state,
        }
    }

    fn stop(&mut self) {
        // As it finishes the runner claims once more: a marker for us that arrived during the
        // drain is consumed (so none is left for the pid once the process is gone), and a
        // removable one is removed; a foreign one stays.
        self.claim();
        self.state = ProcessState::Stopped;
        self.participant_waiting = false;
        self.exit_code = Some(match self.verdict {
            Some(StopVerdict::Planned) => 0,
            _ => 1,
        });
    }

    /// The watcher delivers a planned stop; the runner (running) drains and claims.
    fn deliver(&mut self) {
        self.deliveries += 1;
        self.watcher_alive = false;
        self.watcher_holds = false;
        self.since_tick_ms = None;
        self.claim();
        self.begin_drain(StopVerdict::Planned);
    }

    fn tick(&mut self) {
        match self.marker.map(|m| m.judge(self.now_ms)) {
            Some(Judged::ForSelf { trigger: true }) if self.state == ProcessState::Running => {
                self.deliver()
            }
            Some(Judged::ForSelf { trigger: true }) => {
                self.watcher_holds = true;
                self.since_tick_ms = None;
            }
            Some(Judged::Removable) => self.marker = None,
            _ => {}
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        // Fixed delay: however far the clock jumps, at most one tick, at the new time.
        if let Some(since) = self.since_tick_ms {
            if since + ms >= POLL_MS {
                self.since_tick_ms = Some(0);
                self.tick();
            } else {
                self.since_tick_ms = Some(since + ms);
            }
        }
        if self.state == ProcessState::Draining
            && self.drain_ends_ms.is_some_and(|t| self.now_ms >= t)
        {
            self.stop();
        }
    }

    /// The slot changed: in event mode a notification makes the watcher probe now (the poll
    /// timer is not reset).
    fn slot_changed(&mut self) {
        if self.events && self.watcher_alive && self.since_tick_ms.is_some() {
            self.tick();
        }
    }

    fn signal(&mut self, kind: SignalKind) {
        let second_interrupt = kind == SignalKind::Interrupt && self.interrupted;
        self.interrupted |= kind == SignalKind::Interrupt;
        match self.state {
            ProcessState::Starting | ProcessState::Running => {
                let claimed = self.verdict.is_none() && self.claim();
                let planned = kind == SignalKind::Interrupt || claimed;
                self.begin_drain(if planned {
                    StopVerdict::Planned
                } else {
                    StopVerdict::Unexpected
                });
            }
            // The *second* Ctrl-C forces, however the drain began.
            ProcessState::Draining if second_interrupt => self.stop(),
            _ => {}
        }
    }
}

struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Model> {
        any::<bool>().prop_map(Model::new).boxed()
    }

    fn transitions(_: &Model) -> BoxedStrategy<Transition> {
        let kind = prop_oneof![
            3 => Just(MarkerKind::Own),
            1 => Just(MarkerKind::OwnNoTrigger),
            1 => Just(MarkerKind::Foreign),
            1 => Just(MarkerKind::ReusedPid),
            1 => Just(MarkerKind::Stale),
            1 => Just(MarkerKind::Future),
            1 => Just(MarkerKind::Malformed),
        ];
        prop_oneof![
            4 => Just(Transition::Tick),
            2 => (1..POLL_MS).prop_map(Transition::AdvanceClock),
            1 => (5 * POLL_MS..=200 * POLL_MS).prop_map(Transition::Stall),
            4 => kind.prop_map(Transition::WriteMarker),
            1 => Just(Transition::RemoveMarker),
            2 => Just(Transition::MarkReady),
            1 => Just(Transition::Signal(SignalKind::Terminate)),
            1 => Just(Transition::Signal(SignalKind::Interrupt)),
            1 => Just(Transition::ParticipantFinishes),
            1 => Just(Transition::DrainDeadline),
            1 => Just(Transition::PlannedStopToRunner),
        ]
        .boxed()
    }

    fn apply(mut m: Model, t: &Transition) -> Model {
        match *t {
            Transition::Tick => m.advance(POLL_MS),
            Transition::AdvanceClock(ms) | Transition::Stall(ms) => m.advance(ms),
            Transition::DrainDeadline => {
                let ms = m
                    .drain_ends_ms
                    .map_or(0, |end| end.saturating_sub(m.now_ms));
                m.advance(ms);
            }
            Transition::WriteMarker(kind) => {
                m.marker = Some(ModelMarker {
                    kind,
                    written_ms: m.now_ms,
                });
                m.slot_changed();
            }
            Transition::RemoveMarker => {
                m.marker = None;
                m.slot_changed();
            }
            Transition::MarkReady => {
                if m.state == ProcessState::Starting {
                    m.state = ProcessState::Running;
                    if m.runner_holds {
                        // The runner acts on its own held stop; the watcher sees it draining.
                        m.claim();
                        m.begin_drain(StopVerdict::Planned);
                    } else if m.watcher_holds {
                        m.deliver();
                    }
                }
            }
            Transition::PlannedStopToRunner => match m.state {
                ProcessState::Starting if m.verdict.is_none() => {
                    m.verdict = Some(StopVerdict::Planned);
                    m.runner_holds = true;
                }
                ProcessState::Running => {
                    m.claim();
                    m.begin_drain(StopVerdict::Planned);
                }
                _ => {}
            },
            Transition::Signal(kind) => m.signal(kind),
            Transition::ParticipantFinishes => {
                if m.state == ProcessState::Draining && m.participant_waiting {
                    m.stop();
                }
            }
        }
        m
    }
}

/// The real actors.
struct Sut {
    system: actix::SystemRunner,
    dir: tempfile::TempDir,
    store: MarkerStore,
    me: ProcessIdentity,
    clock: Arc<TokioClock>,
    runner: Addr<RunnerActor>,
    watcher: Addr<MarkerWatcherActor>,
    status: tokio::sync::watch::Receiver<RunnerStatus>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    participant: ParticipantControl,
    /// In event mode: the watcher's notifications, sent by the test on every change of the slot.
    notify: Option<tokio::sync::mpsc::UnboundedSender<()>>,
    /// The most advanced state and the verdict seen so far, for the monotonicity invariants.
    last_state: ProcessState,
    last_verdict: Option<StopVerdict>,
}

impl Sut {
    /// In event mode, the notification the OS would send for a change of the slot.
    fn slot_changed(&self) {
        if let Some(notify) = &self.notify {
            // A stopped watcher no longer listens.
            let _ = notify.send(());
            self.run(settle());
        }
    }

    fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.system.block_on(f)
    }

    fn write(&self, kind: MarkerKind) {
        // Inside the runtime: outside it tokio's clock is the real one, not the paused one.
        let now = self.run(async { self.clock.now() });
        write_marker(&self.store, self.dir.path(), self.me, now, kind);
    }
}

/// Puts a marker of `kind` at our slot as a stopper would (write aside, rename), with bytes of our
/// choosing (the malformed one included).
fn write_marker(
    store: &MarkerStore,
    dir: &std::path::Path,
    me: ProcessIdentity,
    now: chrono::DateTime<chrono::Utc>,
    kind: MarkerKind,
) {
    let marker = |pid, start, at| Marker::new(pid, start, at);
    let bytes = match kind {
        MarkerKind::Own => marker(me.pid, Some(me.start), now).to_json().unwrap(),
        MarkerKind::OwnNoTrigger => marker(me.pid, Some(me.start), now)
            .with_trigger_watcher(false)
            .to_json()
            .unwrap(),
        MarkerKind::Foreign => marker(me.pid.wrapping_add(1).max(1), Some(me.start), now)
            .to_json()
            .unwrap(),
        MarkerKind::ReusedPid => marker(me.pid, Some(me.start.wrapping_add(1)), now)
            .to_json()
            .unwrap(),
        MarkerKind::Stale => marker(me.pid, Some(me.start), now - TimeDelta::minutes(2))
            .to_json()
            .unwrap(),
        MarkerKind::Future => marker(me.pid, Some(me.start), now + TimeDelta::hours(1))
            .to_json()
            .unwrap(),
        MarkerKind::Malformed => b"{\"target_pid\": true".to_vec(),
    };
    // Written as a stopper would, but the bytes are ours to choose (the malformed one included).
    let slot = store.slot_path(me.pid);
    let temp = dir.join("staging.json");
    std::fs::write(&temp, bytes).unwrap();
    std::fs::rename(&temp, &slot).unwrap();
}

struct RunnerAndWatcher;

impl StateMachineTest for RunnerAndWatcher {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(model: &Model) -> Sut {
        let system = paused_system();
        let dir = tempfile::tempdir().unwrap();
        let store = MarkerStore::open(Layout::Slots(dir.path().join("run"))).unwrap();
        let me = ProcessIdentity::current().unwrap();
        let (notify, wakeups) = tokio::sync::mpsc::unbounded_channel();
        let (clock, runner, watcher, status, deliveries, participant) = system.block_on(async {
            let clock = TokioClock::new();
            let config = RunnerConfig {
                drain_deadline: Duration::from_millis(DRAIN_MS),
                answer_grace: Duration::from_millis(GRACE_MS),
                owns_process_exit: false,
                ..RunnerConfig::default()
            };
            let (participant, control) = ParticipantControl::start();
            let (runner, status) = planned_stop::internals::runner(
                store.clone(),
                me,
                config,
                clock.clone(),
                vec![(
                    planned_stop::DrainPhase::Work,
                    "jobs".to_owned(),
                    participant,
                )],
            );
            let runner = runner.start();
            let deliveries = Arc::new(Mutex::new(Vec::new()));
            let recorder = Recorder {
                seen: deliveries.clone(),
                state: status.clone(),
                forward: Some(runner.clone().recipient::<PlannedStop>()),
            }
            .start();
            let probe = OwnSlot {
                store: store.clone(),
                own: me,
            };
            let poll = Duration::from_millis(POLL_MS);
            let mut watcher = MarkerWatcherActor::new(
                probe,
                recorder.recipient(),
                status.clone(),
                poll,
                clock.clone(),
            );
            if model.events {
                // Notifications by hand, sent on every change of the slot, as the OS would.
                watcher = watcher.with_wakeups(wakeups, None);
            }
            let watcher = watcher.start();
            settle().await;
            (clock, runner, watcher, status, deliveries, control)
        });
        Sut {
            system,
            dir,
            store,
            me,
            clock,
            runner,
            watcher,
            status,
            deliveries,
            participant,
            notify: model.events.then_some(notify),
            last_state: ProcessState::Starting,
            last_verdict: None,
        }
    }

    fn apply(mut sut: Sut, before_and_after: &Model, t: Transition) -> Sut {
        {
            let before = sut.status.borrow().clone();
            sut.last_state = before.state;
            sut.last_verdict = before.verdict;
        }
        let advance_ms = |ms: u64| async move { advance(Duration::from_millis(ms)).await };
        match t {
            Transition::Tick => sut.run(advance_ms(POLL_MS)),
            Transition::AdvanceClock(ms) | Transition::Stall(ms) => sut.run(advance_ms(ms)),
            Transition::DrainDeadline => {
                // The model has already moved its clock; advance the real one to the same instant.
                let elapsed = tokio_elapsed_ms(&sut);
                sut.run(advance_ms(before_and_after.now_ms - elapsed));
            }
            Transition::WriteMarker(kind) => {
                sut.write(kind);
                sut.slot_changed();
            }
            Transition::RemoveMarker => {
                let _ = std::fs::remove_file(sut.store.slot_path(sut.me.pid));
                sut.slot_changed();
            }
            Transition::MarkReady => {
                sut.runner.do_send(Ready);
                sut.run(settle());
            }
            Transition::Signal(kind) => {
                sut.runner.do_send(OsSignal(kind));
                sut.run(settle());
            }
            Transition::ParticipantFinishes => {
                sut.participant.finish(&[]);
                sut.run(settle());
            }
            Transition::PlannedStopToRunner => {
                let now = sut.run(async { sut.clock.now() });
                let marker = Marker::new(sut.me.pid, Some(sut.me.start), now);
                sut.runner.do_send(PlannedStop::from(&marker));
                sut.run(settle());
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        let status = sut.status.borrow().clone();
        let deliveries = sut.deliveries.lock().unwrap().clone();
        assert_eq!(tokio_elapsed_ms(sut), model.now_ms, "clocks agree");
        // At most one PlannedStop, and only ever to a running runner.
        assert!(
            deliveries.len() <= 1,
            "more than one PlannedStop: {deliveries:?}"
        );
        assert!(
            deliveries.iter().all(|(_, s)| *s == ProcessState::Running),
            "{deliveries:?}"
        );
        assert_eq!(deliveries.len() as u32, model.deliveries, "deliveries");
        // State and verdict as the model says; forward only; the verdict latched.
        assert_eq!(status.state, model.status_state(), "runner state");
        assert!(
            life_rank(status.state) >= life_rank(sut.last_state),
            "state went back"
        );
        assert_eq!(status.verdict, model.verdict, "verdict");
        if let Some(v) = sut.last_verdict {
            assert_eq!(status.verdict, Some(v), "verdict changed");
        }
        // The exit code follows the verdict.
        assert_eq!(status.exit_code(), model.exit_code, "exit code");
        if let Some(code) = status.exit_code() {
            assert_eq!(code == 0, status.verdict == Some(StopVerdict::Planned));
        }
        // The slot holds exactly what the model holds: foreign markers and our own are never
        // deleted by a probe; removable ones are.
        let present = sut.store.slot_path(sut.me.pid).exists();
        assert_eq!(
            present,
            model.marker.is_some(),
            "slot presence (model: {:?})",
            model.marker
        );
        assert_eq!(
            sut.watcher.connected(),
            model.watcher_alive,
            "watcher alive"
        );
    }

    fn teardown(sut: Sut, _: Model) {
        drop(sut);
    }
}

/// Milliseconds the paused clock has moved since the system under test was built (inside the
/// runtime: outside it tokio's clock is not the paused one).
fn tokio_elapsed_ms(sut: &Sut) -> u64 {
    let now = sut.run(async { sut.clock.now() });
    (now - sut.clock.base_wall()).num_milliseconds() as u64
}

use common::cases;

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2048,
        .. ProptestConfig::default()
    })]

    #[test]
    fn runner_and_watcher_follow_the_model(sequential 1..=50 => RunnerAndWatcher);
}

// ---------------------------------------------------------------------------------------------
// The watcher alone, against a runner whose every state change is a step of the model.
//
// The real runner reacts to a delivery at once (it claims the marker and starts draining), which
// hides a watcher that would deliver again, or deliver to a runner that is already stopping. Here
// nobody claims the marker and the runner moves only when the model says so, so each of those
// mistakes shows as a second delivery, or a delivery seen in a state other than `Running`.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatcherStep {
    Tick,
    AdvanceClock(u64),
    Stall(u64),
    WriteMarker(MarkerKind),
    RemoveMarker,
    /// The runner moves forward to this state (ignored when it is not forward).
    Runner(ProcessState),
}

#[derive(Debug, Clone)]
struct WatcherModel {
    events: bool,
    now_ms: u64,
    /// Time since the watcher's last probe; `None` once it stopped polling (holding, or stopped).
    since_tick_ms: Option<u64>,
    alive: bool,
    holds: bool,
    runner: ProcessState,
    marker: Option<ModelMarker>,
    deliveries: u32,
}

impl WatcherModel {
    fn stop_watching(&mut self) {
        self.alive = false;
        self.holds = false;
        self.since_tick_ms = None;
    }

    fn deliver(&mut self) {
        self.deliveries += 1;
        self.stop_watching();
    }

    /// One probe: our marker is delivered to a running runner or held while it starts; a
    /// removable one is removed; nothing else happens. Nobody claims our marker here.
    fn probe(&mut self) {
        match self.marker.map(|m| m.judge(self.now_ms)) {
            Some(Judged::ForSelf { trigger: true }) if self.runner == ProcessState::Running => {
                self.deliver()
            }
            Some(Judged::ForSelf { trigger: true }) => {
                self.holds = true;
                self.since_tick_ms = None;
            }
            Some(Judged::Removable) => self.marker = None,
            _ => {}
        }
    }

    fn advance(&mut self, ms: u64) {
        self.now_ms += ms;
        if let Some(since) = self.since_tick_ms {
            if since + ms >= POLL_MS {
                self.since_tick_ms = Some(0);
                self.probe();
            } else {
                self.since_tick_ms = Some(since + ms);
            }
        }
    }

    fn slot_changed(&mut self) {
        if self.events && self.alive && self.since_tick_ms.is_some() {
            self.probe();
        }
    }
}

struct SteppedRunner;

impl ReferenceStateMachine for SteppedRunner {
    type State = WatcherModel;
    type Transition = WatcherStep;

    fn init_state() -> BoxedStrategy<WatcherModel> {
        any::<bool>()
            .prop_map(|events| WatcherModel {
                events,
                now_ms: 0,
                since_tick_ms: Some(0),
                alive: true,
                holds: false,
                runner: ProcessState::Starting,
                marker: None,
                deliveries: 0,
            })
            .boxed()
    }

    fn transitions(_: &WatcherModel) -> BoxedStrategy<WatcherStep> {
        let kind = prop_oneof![
            4 => Just(MarkerKind::Own),
            1 => Just(MarkerKind::OwnNoTrigger),
            1 => Just(MarkerKind::Foreign),
            1 => Just(MarkerKind::Stale),
            1 => Just(MarkerKind::Malformed),
        ];
        prop_oneof![
            5 => Just(WatcherStep::Tick),
            2 => (1..POLL_MS).prop_map(WatcherStep::AdvanceClock),
            1 => (5 * POLL_MS..=200 * POLL_MS).prop_map(WatcherStep::Stall),
            3 => kind.prop_map(WatcherStep::WriteMarker),
            1 => Just(WatcherStep::RemoveMarker),
            3 => Just(WatcherStep::Runner(ProcessState::Running)),
            1 => Just(WatcherStep::Runner(ProcessState::Draining)),
            1 => Just(WatcherStep::Runner(ProcessState::Stopped)),
        ]
        .boxed()
    }

    fn apply(mut m: WatcherModel, t: &WatcherStep) -> WatcherModel {
        match *t {
            WatcherStep::Tick => m.advance(POLL_MS),
            WatcherStep::AdvanceClock(ms) | WatcherStep::Stall(ms) => m.advance(ms),
            WatcherStep::WriteMarker(kind) => {
                m.marker = Some(ModelMarker {
                    kind,
                    written_ms: m.now_ms,
                });
                m.slot_changed();
            }
            WatcherStep::RemoveMarker => {
                m.marker = None;
                m.slot_changed();
            }
            WatcherStep::Runner(next) if life_rank(next) > life_rank(m.runner) => {
                m.runner = next;
                match next {
                    ProcessState::Running if m.holds => m.deliver(),
                    ProcessState::Draining | ProcessState::Stopped => m.stop_watching(),
                    _ => {}
                }
            }
            WatcherStep::Runner(_) => {}
        }
        m
    }
}

/// The real watcher, a real marker directory, and a runner status the test sets by hand.
struct WatcherSut {
    system: actix::SystemRunner,
    dir: tempfile::TempDir,
    store: MarkerStore,
    me: ProcessIdentity,
    clock: Arc<TokioClock>,
    watcher: Addr<MarkerWatcherActor>,
    runner: tokio::sync::watch::Sender<RunnerStatus>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    notify: Option<tokio::sync::mpsc::UnboundedSender<()>>,
}

impl WatcherSut {
    fn run<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.system.block_on(f)
    }

    fn slot_changed(&self) {
        if let Some(notify) = &self.notify {
            let _ = notify.send(());
            self.run(settle());
        }
    }
}

struct WatcherAgainstSteppedRunner;

impl StateMachineTest for WatcherAgainstSteppedRunner {
    type SystemUnderTest = WatcherSut;
    type Reference = SteppedRunner;

    fn init_test(model: &WatcherModel) -> WatcherSut {
        let system = paused_system();
        let dir = tempfile::tempdir().unwrap();
        let store = MarkerStore::open(Layout::Slots(dir.path().join("run"))).unwrap();
        let me = ProcessIdentity::current().unwrap();
        let (notify, wakeups) = tokio::sync::mpsc::unbounded_channel();
        let (runner, status) = tokio::sync::watch::channel(RunnerStatus::starting());
        let (clock, watcher, deliveries) = system.block_on(async {
            let clock = TokioClock::new();
            let deliveries = Arc::new(Mutex::new(Vec::new()));
            // Records each delivery with the runner's state at that moment; forwards nothing.
            let recorder = Recorder {
                seen: deliveries.clone(),
                state: status.clone(),
                forward: None,
            }
            .start();
            let probe = OwnSlot {
                store: store.clone(),
                own: me,
            };
            let mut watcher = MarkerWatcherActor::new(
                probe,
                recorder.recipient(),
                status,
                Duration::from_millis(POLL_MS),
                clock.clone(),
            );
            if model.events {
                watcher = watcher.with_wakeups(wakeups, None);
            }
            let watcher = watcher.start();
            settle().await;
            (clock, watcher, deliveries)
        });
        WatcherSut {
            system,
            dir,
            store,
            me,
            clock,
            watcher,
            runner,
            deliveries,
            notify: model.events.then_some(notify),
        }
    }

    fn apply(sut: WatcherSut, _: &WatcherModel, t: WatcherStep) -> WatcherSut {
        let advance_ms = |ms: u64| async move { advance(Duration::from_millis(ms)).await };
        match t {
            WatcherStep::Tick => sut.run(advance_ms(POLL_MS)),
            WatcherStep::AdvanceClock(ms) | WatcherStep::Stall(ms) => sut.run(advance_ms(ms)),
            WatcherStep::WriteMarker(kind) => {
                let now = sut.run(async { sut.clock.now() });
                write_marker(&sut.store, sut.dir.path(), sut.me, now, kind);
                sut.slot_changed();
            }
            WatcherStep::RemoveMarker => {
                let _ = std::fs::remove_file(sut.store.slot_path(sut.me.pid));
                sut.slot_changed();
            }
            WatcherStep::Runner(next) => {
                sut.runner.send_if_modified(|status| {
                    let forward = life_rank(next) > life_rank(status.state);
                    if forward {
                        status.state = next;
                    }
                    forward
                });
                sut.run(settle());
            }
        }
        sut
    }

    fn check_invariants(sut: &WatcherSut, model: &WatcherModel) {
        let deliveries = sut.deliveries.lock().unwrap().clone();
        // Once per life, and only to a running runner, even though nobody ever claims the marker.
        assert!(
            deliveries.len() <= 1,
            "delivered more than once: {deliveries:?}"
        );
        assert!(
            deliveries.iter().all(|(_, s)| *s == ProcessState::Running),
            "delivered to a runner that was not running: {deliveries:?}"
        );
        assert_eq!(deliveries.len() as u32, model.deliveries, "deliveries");
        assert_eq!(sut.watcher.connected(), model.alive, "watcher alive");
        let present = sut.store.slot_path(sut.me.pid).exists();
        assert_eq!(present, model.marker.is_some(), "slot presence");
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2048,
        .. ProptestConfig::default()
    })]

    #[test]
    fn the_watcher_follows_the_model_against_a_stepped_runner(
        sequential 1..=40 => WatcherAgainstSteppedRunner
    );
}

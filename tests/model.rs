//! Exhaustive model checking (stateright) of the stop protocol and of the record handover, on the
//! crate's own decision code.
//!
//! The proptest machines (`tests/state_machine.rs`, `tests/records.rs`) sample random sequences;
//! the claims of docs/protocol.md are about *every* interleaving of independent actors. Here a
//! checker visits every state reachable within the bounds below. The model supplies only the
//! interleaving, the marker slot and the outcome file as shared state, the clock as whole-second
//! ticks, and the failures; every decision is the crate's:
//!
//! | who | decides with |
//! |---|---|
//! | the watcher's probe, the runner's claim | [`decide`] (the verdict function, on the marker's real JSON) |
//! | the watcher | [`next_step`], then [`Watch::on_step`] / [`Watch::on_runner`] (the once-only guard) |
//! | the runner | [`Lifecycle`] (states and the verdict latch) |
//! | a stopper's report | [`WaitOutcome::after_exit`] and [`is_own_request`], on a parsed [`Outcome`] |
//! | a stopper's sweep of a dead target's slot | [`decide_as_owner`] |
//! | leasing and acknowledging resume items | [`is_offered`] and [`holds`] |
//!
//! Each injected defect (the `defect_*` tests) replaces one of those functions, or the atomicity
//! of one step, and the checker must find a counterexample; the trace is printed.
//!
//! `cargo test --test tests model::` runs the CI bounds (`-- --nocapture` prints states and time);
//! `just model` runs the deeper ones (`PLANNED_STOP_MODEL=deep`). docs/design.md describes the
//! model and docs/reliability.md records the state counts.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use planned_stop::internals::{
    Lifecycle, SlotContent, Step, Watch, WatchSend, WatchStep, decide, decide_as_owner, next_step,
};
use planned_stop::internals::{Liveness, holds, is_offered};
use planned_stop::marker::{Judgement, Marker, Policy, Undecided};
use planned_stop::record::{Lease, Owner};
use planned_stop::stopper::{Outcome, WaitOutcome, is_own_request};
use planned_stop::{ProcessIdentity, ProcessState, SignalKind, StopCause, StopVerdict};
use stateright::{Checker, HasDiscoveries, Model, Property};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// The decisions, replaceable by a defect.

/// The crate's decision functions the model calls; a defect swaps one.
#[derive(Clone, Copy)]
struct Rules {
    decide: fn(
        SlotContent<'_>,
        &ProcessIdentity,
        DateTime<Utc>,
        &Policy,
    ) -> Result<Judgement, Undecided>,
    next_step: fn(&Judgement, ProcessState) -> WatchStep,
    on_step: fn(&mut Watch, WatchStep) -> WatchSend,
    signal: fn(&mut Lifecycle, SignalKind, bool) -> Step,
    after_exit: fn(Option<Outcome>) -> WaitOutcome,
    own_request: fn(&Outcome, Option<&str>) -> bool,
    is_offered: fn(Option<&Lease>, DateTime<Utc>, Liveness) -> bool,
}

impl Rules {
    const REAL: Rules = Rules {
        decide,
        next_step,
        on_step: Watch::on_step,
        signal: Lifecycle::signal,
        after_exit: WaitOutcome::after_exit,
        own_request: is_own_request,
        is_offered,
    };
}

/// Explores `model` (every reachable state, unless `until` names a property whose discovery ends
/// the run), printing how many states it visited and how long it took.
fn check<M>(name: &str, model: M, until: Option<&'static str>) -> impl Checker<M>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + std::hash::Hash + Send + Sync + std::fmt::Debug + PartialEq,
    M::Action: Clone + std::fmt::Debug + PartialEq,
{
    // A defect run stops at its first counterexample, on one thread, breadth first, so that its
    // trace is short.
    let threads = match until {
        Some(_) => 1,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let started = Instant::now();
    let mut builder = model.checker().threads(threads);
    if let Some(property) = until {
        builder = builder.finish_when(HasDiscoveries::AnyOf([property].into()));
    }
    if let Some(cap) = std::env::var("PLANNED_STOP_MODEL_STATES")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        builder = builder.target_state_count(cap);
    }
    let checker = builder.spawn_bfs().join();
    println!(
        "model {name}: {} unique states ({} generated), depth {}, in {:.1} s on {threads} threads",
        checker.unique_state_count(),
        checker.state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker
}

fn deep() -> bool {
    std::env::var("PLANNED_STOP_MODEL").is_ok_and(|v| v == "deep")
}

/// Checks `model` and fails, with each counterexample's steps, if a property does not hold (or a
/// reachability property was never reached).
fn assert_holds<M>(name: &str, model: M)
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + std::hash::Hash + Send + Sync + std::fmt::Debug + PartialEq,
    M::Action: Clone + std::fmt::Debug + PartialEq,
{
    let properties = model.properties();
    let checker = check(name, model, None);
    let mut failures = Vec::new();
    for property in properties {
        let found = checker.discovery(property.name);
        let failed = match property.expectation {
            stateright::Expectation::Sometimes => {
                found.is_none().then(|| "never reached".to_owned())
            }
            _ => found.map(trace),
        };
        if let Some(why) = failed {
            failures.push(format!(
                "{:?} \"{}\": {why}",
                property.expectation, property.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "model {name}:\n{}",
        failures.join("\n")
    );
}

/// The counterexample to `property` in `model`, as its steps (`None` when it holds).
fn counterexample<M>(name: &str, model: M, property: &'static str) -> Option<String>
where
    M: Model + Send + Sync + 'static,
    M::State: Clone + std::hash::Hash + Send + Sync + std::fmt::Debug + PartialEq,
    M::Action: Clone + std::fmt::Debug + PartialEq,
{
    let found = check(name, model, Some(property))
        .discovery(property)
        .map(trace);
    if let Some(steps) = &found {
        println!("counterexample to \"{property}\": {steps}");
    }
    found
}

fn trace<S: std::fmt::Debug, A: std::fmt::Debug>(path: stateright::Path<S, A>) -> String {
    let last = format!("{:?}", path.last_state());
    let steps: Vec<String> = path
        .into_actions()
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    format!("{}\n  final state: {last}", steps.join(" → "))
}

// ---------------------------------------------------------------------------------------------
// The stop protocol.

/// The pid every process in the model has (the successor reuses it).
const PID: u32 = 4242;
/// Start fingerprints: the target, its successor at the same pid, and one nobody has.
const TARGET: u8 = 10;
const SUCCESSOR: u8 = 11;
const NOBODY: u8 = 99;

fn at(tick: u8) -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0).unwrap() + TimeDelta::seconds(i64::from(tick))
}

/// TTL 1 s and skew 1 s: a marker written at tick `w` is stale from tick `w + 2`.
fn policy() -> Policy {
    Policy::default()
        .with_ttl(Duration::from_secs(1))
        .with_future_skew(Duration::from_secs(1))
}

/// What sits at the target pid's slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Slot {
    Empty,
    /// A marker naming `PID` with fingerprint `fp`, written at tick `written`, by requester
    /// `request` (a stopper's index; `None` for a forgery).
    Marker {
        fp: u8,
        written: u8,
        request: Option<u8>,
    },
    /// A valid marker naming another pid.
    ForeignPid,
    /// Bytes that are not a marker.
    Garbage,
}

impl Slot {
    fn bytes(&self) -> Option<Vec<u8>> {
        let marker = match self {
            Slot::Empty => return None,
            Slot::Garbage => return Some(b"{\"target_pid\": 4242, not json".to_vec()),
            Slot::ForeignPid => Marker::new(PID + 1, Some(u64::from(TARGET)), at(0)),
            Slot::Marker {
                fp,
                written,
                request,
            } => {
                let m = Marker::new(PID, Some(u64::from(*fp)), at(*written));
                match request {
                    Some(r) => m.with_request_id(format!("r{r}")),
                    None => m,
                }
            }
        };
        Some(marker.to_json().expect("a marker serialises"))
    }
}

fn request_of(id: Option<&str>) -> Option<u8> {
    id.and_then(|id| id.strip_prefix('r'))
        .and_then(|r| r.parse().ok())
}

/// A message in the runner's mailbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Msg {
    /// The watcher's planned stop, with the request it carries.
    Stop(Option<u8>),
    /// The watcher holds a stop while the runner starts.
    HeldNotice(Option<u8>),
    /// The application is ready.
    Ready,
    /// An OS signal.
    Signal(SignalKind),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Life {
    Alive,
    /// Exited through the runner, after writing its final outcome.
    Exited,
    /// Killed or crashed at some step.
    Crashed,
}

/// One process at `PID`: the target, or its successor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Proc {
    fp: u8,
    started: u8,
    life: Life,
    lifecycle: Lifecycle,
    watch: Watch,
    /// The runner state the watcher last saw.
    seen: ProcessState,
    ready_sent: bool,
    mailbox: Vec<Msg>,
    /// The runner's own held stop (a planned stop that reached it while starting).
    held: Option<Option<u8>>,
    // What it did, for the invariants.
    deliveries: u8,
    drains: u8,
    first_verdict: Option<StopVerdict>,
    verdict_changed: bool,
    accepted: Option<(StopCause, StopVerdict, Option<u8>)>,
    claimed_other: bool,
    finished: Option<StopVerdict>,
    /// The watcher held a stop while the runner started.
    was_held: bool,
}

impl Proc {
    fn new(fp: u8, started: u8) -> Proc {
        Proc {
            fp,
            started,
            life: Life::Alive,
            lifecycle: Lifecycle::new(),
            watch: Watch::Looking,
            seen: ProcessState::Starting,
            ready_sent: false,
            mailbox: Vec::new(),
            held: None,
            deliveries: 0,
            drains: 0,
            first_verdict: None,
            verdict_changed: false,
            accepted: None,
            claimed_other: false,
            finished: None,
            was_held: false,
        }
    }

    fn identity(&self) -> ProcessIdentity {
        ProcessIdentity::new(PID, u64::from(self.fp), at(self.started))
    }

    fn alive(&self) -> bool {
        self.life == Life::Alive
    }

    fn latch(&mut self, verdict: StopVerdict) {
        match self.first_verdict {
            None => self.first_verdict = Some(verdict),
            Some(first) if first != verdict => self.verdict_changed = true,
            Some(_) => {}
        }
    }
}

/// The outcome file at `PID` (one per pid: a successor overwrites it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct OutcomeFile {
    fp: u8,
    phase: &'static str,
    cause: StopCause,
    verdict: StopVerdict,
    request: Option<u8>,
}

impl OutcomeFile {
    /// The file as the runner writes it, parsed as a stopper reads it.
    fn parsed(&self) -> Outcome {
        let json = serde_json::json!({
            "pid": PID,
            "start": self.fp,
            "phase": self.phase,
            "cause": self.cause,
            "verdict": self.verdict,
            "request_id": self.request.map(|r| format!("r{r}")),
            "accepted_at": at(0),
            "drain_deadline": at(0),
            "finished_at": (self.phase == "stopped").then(|| at(0)),
            "exit_code": (self.phase == "stopped").then_some(
                if self.verdict == StopVerdict::Planned { 0 } else { 1 }),
        });
        Outcome::parse(json.to_string().as_bytes()).expect("the runner's outcome parses")
    }
}

/// What a stopper reported about the identity it asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Report {
    NotRunning,
    StoppedPlanned { own: bool },
    StoppedUnexpectedly,
    KilledWhileDraining,
    GoneWithoutOutcome,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Stopper {
    Idle,
    /// Read the identity at `PID`.
    Looked {
        fp: u8,
    },
    /// Wrote its marker naming `fp`; `signalled` once it sent SIGTERM.
    Asked {
        fp: u8,
        signalled: bool,
    },
    Reported {
        fp: u8,
        report: Report,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    tick: u8,
    slot: Slot,
    outcome: Option<OutcomeFile>,
    procs: Vec<Proc>,
    stoppers: [Stopper; 2],
    /// Identities a stopper wrote a marker for.
    asked: Vec<u8>,
    signals_left: u8,
    crashes_left: u8,
    forgeries_left: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Forgery {
    Garbage,
    ForeignPid,
    WrongFingerprint,
    FromTheFuture,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Act {
    Tick,
    Look(usize),
    Write(usize),
    SendTerm(usize),
    Report(usize),
    Forge(Forgery),
    Signal(SignalKind),
    Crash(usize),
    SuccessorStarts,
    AppReady(usize),
    Probe(usize),
    WatcherSeesRunner(usize),
    RunnerHandles(usize),
    RunnerFinishes(usize),
    Exit(usize),
}

/// The bounds of one run of the stop-protocol model.
#[derive(Clone, Copy)]
struct StopBounds {
    name: &'static str,
    /// How many stoppers take part (1 or 2).
    stoppers: usize,
    ticks: u8,
    signals: u8,
    crashes: u8,
    forgeries: u8,
    /// Whether stopper 1 also sends SIGTERM (`stop --signal`).
    stopper_signals: bool,
}

struct StopModel {
    rules: Rules,
    bounds: StopBounds,
}

impl StopModel {
    fn new(bounds: StopBounds) -> Self {
        StopModel {
            rules: Rules::REAL,
            bounds,
        }
    }

    /// The configurations CI checks: each explores one facet fully, small enough for minutes.
    fn ci() -> Vec<StopBounds> {
        vec![
            StopBounds {
                name: "racing stoppers, one signalling, a crash and pid reuse",
                stoppers: 2,
                ticks: 1,
                signals: 0,
                crashes: 1,
                forgeries: 0,
                stopper_signals: true,
            },
            StopBounds {
                name: "one stopper, SIGTERM or SIGINT, a forgery, a crash, expiry",
                stoppers: 1,
                ticks: 2,
                signals: 1,
                crashes: 1,
                forgeries: 1,
                stopper_signals: false,
            },
        ]
    }

    /// `just model`: each CI configuration with one more dimension.
    fn deeper() -> Vec<StopBounds> {
        vec![
            StopBounds {
                name: "racing stoppers, one signalling, SIGTERM or SIGINT, a crash, pid reuse, expiry",
                stoppers: 2,
                ticks: 2,
                signals: 1,
                crashes: 1,
                forgeries: 0,
                stopper_signals: true,
            },
            StopBounds {
                name: "one stopper, two signals, two forgeries, a crash, expiry",
                stoppers: 1,
                ticks: 3,
                signals: 2,
                crashes: 1,
                forgeries: 2,
                stopper_signals: false,
            },
        ]
    }

    fn live(world: &World) -> Option<usize> {
        world.procs.iter().position(Proc::alive)
    }

    /// The runner's claim ([`planned_stop::marker::MarkerStore::claim`]): judged, and taken if ours (one
    /// atomic step in the model: the store's rename lets exactly one claimer have it).
    fn claim(&self, world: &mut World, p: usize) -> Option<Option<u8>> {
        let own = world.procs[p].identity();
        let bytes = world.slot.bytes()?;
        let verdict =
            (self.rules.decide)(SlotContent::Bytes(&bytes), &own, at(world.tick), &policy())
                .expect("bytes are always decided");
        match verdict {
            Judgement::ForSelf(marker) => {
                if marker.target_start_time != Some(own.start) || marker.target_pid != own.pid {
                    world.procs[p].claimed_other = true;
                }
                world.slot = Slot::Empty;
                Some(request_of(marker.request_id.as_deref()))
            }
            v if v.is_removable() => {
                world.slot = Slot::Empty;
                None
            }
            _ => None,
        }
    }

    /// The watcher's probe ([`planned_stop::marker::MarkerStore::probe`]).
    fn probe(&self, world: &mut World, p: usize) -> Judgement {
        let own = world.procs[p].identity();
        let Some(bytes) = world.slot.bytes() else {
            return Judgement::Absent;
        };
        let verdict =
            (self.rules.decide)(SlotContent::Bytes(&bytes), &own, at(world.tick), &policy())
                .expect("bytes are always decided");
        if verdict.is_removable() {
            world.slot = Slot::Empty;
        }
        verdict
    }

    /// What the runner does with a [`Step`] (`RunnerActor::act`).
    fn act(&self, world: &mut World, p: usize, step: Step, request: Option<u8>) {
        match step {
            Step::Ignore(_) => {}
            Step::Hold => world.procs[p].latch(StopVerdict::Planned),
            Step::Drain(cause, verdict) => {
                let proc = &mut world.procs[p];
                proc.drains += 1;
                proc.latch(verdict);
                proc.accepted = Some((cause, verdict, request));
                world.outcome = Some(OutcomeFile {
                    fp: proc.fp,
                    phase: "draining",
                    cause,
                    verdict,
                    request,
                });
            }
            Step::Force => self.finish(world, p),
        }
    }

    /// `RunnerActor::finish`: the latched verdict, a late marker consumed, the final outcome.
    fn finish(&self, world: &mut World, p: usize) {
        let Some(verdict) = world.procs[p].lifecycle.stopped() else {
            return;
        };
        world.procs[p].latch(verdict);
        self.claim(world, p);
        let proc = &mut world.procs[p];
        let (cause, _, request) = proc.accepted.unwrap_or((StopCause::Request, verdict, None));
        proc.finished = Some(verdict);
        world.outcome = Some(OutcomeFile {
            fp: proc.fp,
            phase: "stopped",
            cause,
            verdict,
            request,
        });
    }

    fn handle(&self, world: &mut World, p: usize, msg: Msg) {
        match msg {
            Msg::Stop(request) => {
                let step = world.procs[p].lifecycle.planned_stop();
                match step {
                    Step::Hold => world.procs[p].held = Some(request),
                    Step::Drain(..) => {
                        let requester = self.claim(world, p).unwrap_or(request);
                        return self.act(world, p, step, requester);
                    }
                    _ => {}
                }
                self.act(world, p, step, None);
            }
            Msg::HeldNotice(request) => {
                let proc = &world.procs[p];
                if proc.lifecycle.state() == ProcessState::Starting {
                    world.outcome = Some(OutcomeFile {
                        fp: proc.fp,
                        phase: "held",
                        cause: StopCause::Marker,
                        verdict: StopVerdict::Planned,
                        request,
                    });
                }
            }
            Msg::Ready => {
                let step = world.procs[p].lifecycle.ready();
                let requester = world.procs[p].held.take().flatten();
                if matches!(step, Step::Drain(..)) {
                    self.claim(world, p);
                }
                self.act(world, p, step, requester);
            }
            Msg::Signal(kind) => {
                let claimed = if world.procs[p].lifecycle.awaits_classification() {
                    self.claim(world, p)
                } else {
                    None
                };
                let step =
                    (self.rules.signal)(&mut world.procs[p].lifecycle, kind, claimed.is_some());
                let requester = match (claimed, world.procs[p].held.take()) {
                    (Some(r), _) => r,
                    (None, Some(held)) => held,
                    (None, None) => None,
                };
                self.act(world, p, step, requester);
            }
        }
    }

    fn watcher_sends(world: &mut World, p: usize, send: WatchSend) {
        let proc = &mut world.procs[p];
        match send {
            WatchSend::Stop(stop) => {
                proc.deliveries += 1;
                proc.mailbox
                    .push(Msg::Stop(request_of(stop.request_id.as_deref())));
            }
            WatchSend::HeldNotice(stop) => {
                proc.was_held = true;
                proc.mailbox
                    .push(Msg::HeldNotice(request_of(stop.request_id.as_deref())));
            }
            WatchSend::Nothing => {}
        }
    }

    /// What stopper `i` does next: look for the target, write its marker, send SIGTERM after
    /// it, report. `None` when the act does not fit the stopper's state.
    fn stopper_acts(&self, w: &mut World, act: Act) -> Option<()> {
        match act {
            Act::Look(i) => {
                w.stoppers[i] = match Self::live(w) {
                    Some(p) => Stopper::Looked { fp: w.procs[p].fp },
                    None => Stopper::Reported {
                        fp: NOBODY,
                        report: Report::NotRunning,
                    },
                }
            }
            Act::Write(i) => {
                let Stopper::Looked { fp } = w.stoppers[i] else {
                    return None;
                };
                w.slot = Slot::Marker {
                    fp,
                    written: w.tick,
                    request: Some(i as u8),
                };
                if !w.asked.contains(&fp) {
                    w.asked.push(fp);
                    w.asked.sort_unstable();
                }
                w.stoppers[i] = Stopper::Asked {
                    fp,
                    signalled: false,
                };
            }
            Act::SendTerm(i) => {
                let Stopper::Asked { fp, .. } = w.stoppers[i] else {
                    return None;
                };
                // The identity is checked right before kill(2).
                if let Some(p) = Self::live(w).filter(|&p| w.procs[p].fp == fp) {
                    w.procs[p].mailbox.push(Msg::Signal(SignalKind::Terminate));
                }
                w.stoppers[i] = Stopper::Asked {
                    fp,
                    signalled: true,
                };
            }
            Act::Report(i) => {
                let Stopper::Asked { fp, .. } = w.stoppers[i] else {
                    return None;
                };
                let report = self.report(w, fp, i);
                w.stoppers[i] = Stopper::Reported { fp, report };
            }
            _ => {}
        }
        Some(())
    }

    /// A forged marker `f` takes the slot.
    fn forge(w: &mut World, f: Forgery) {
        w.forgeries_left -= 1;
        w.slot = match f {
            Forgery::Garbage => Slot::Garbage,
            Forgery::ForeignPid => Slot::ForeignPid,
            Forgery::WrongFingerprint => Slot::Marker {
                fp: NOBODY,
                written: w.tick,
                request: None,
            },
            Forgery::FromTheFuture => Slot::Marker {
                fp: Self::live(w).map_or(TARGET, |p| w.procs[p].fp),
                written: w.tick + 5,
                request: None,
            },
        };
    }

    /// What stopper `i` reports once the identity it asked is gone (`planned_stop::stopper::wait`).
    fn report(&self, world: &mut World, fp: u8, i: usize) -> Report {
        let outcome = world
            .outcome
            .as_ref()
            .filter(|o| o.fp == fp)
            .map(OutcomeFile::parsed);
        // The dead target's slot is swept as its pid's current owner would judge it.
        if let Some(bytes) = world.slot.bytes() {
            let owner = Self::live(world).map(|p| world.procs[p].identity());
            let verdict = decide_as_owner(
                SlotContent::Bytes(&bytes),
                Some(PID),
                |_| owner,
                at(world.tick),
                &policy(),
            )
            .expect("bytes are always decided");
            if verdict.is_removable() {
                world.slot = Slot::Empty;
            }
        }
        let request = format!("r{i}");
        match (self.rules.after_exit)(outcome) {
            WaitOutcome::StoppedPlanned { outcome, .. } => Report::StoppedPlanned {
                own: (self.rules.own_request)(&outcome, Some(&request)),
            },
            WaitOutcome::StoppedUnexpectedly { .. } => Report::StoppedUnexpectedly,
            WaitOutcome::KilledWhileDraining { .. } => Report::KilledWhileDraining,
            WaitOutcome::GoneWithoutOutcome => Report::GoneWithoutOutcome,
            _ => Report::Other,
        }
    }
}

impl Model for StopModel {
    type State = World;
    type Action = Act;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            tick: 0,
            slot: Slot::Empty,
            outcome: None,
            procs: vec![Proc::new(TARGET, 0)],
            stoppers: [Stopper::Idle; 2],
            asked: Vec::new(),
            signals_left: self.bounds.signals,
            crashes_left: self.bounds.crashes,
            forgeries_left: self.bounds.forgeries,
        }]
    }

    fn actions(&self, w: &World, acts: &mut Vec<Act>) {
        if w.tick < self.bounds.ticks {
            acts.push(Act::Tick);
        }
        let live = Self::live(w);
        for (i, s) in w.stoppers.iter().enumerate().take(self.bounds.stoppers) {
            match s {
                Stopper::Idle => acts.push(Act::Look(i)),
                Stopper::Looked { .. } => acts.push(Act::Write(i)),
                Stopper::Asked { fp, signalled } => {
                    if i == 1 && self.bounds.stopper_signals && !signalled {
                        acts.push(Act::SendTerm(i));
                    }
                    if live.is_none_or(|p| w.procs[p].fp != *fp) {
                        acts.push(Act::Report(i));
                    }
                }
                Stopper::Reported { .. } => {}
            }
        }
        if w.forgeries_left > 0 {
            for f in [
                Forgery::Garbage,
                Forgery::ForeignPid,
                Forgery::WrongFingerprint,
                Forgery::FromTheFuture,
            ] {
                acts.push(Act::Forge(f));
            }
        }
        match live {
            Some(p) => {
                if w.signals_left > 0 {
                    acts.push(Act::Signal(SignalKind::Terminate));
                    acts.push(Act::Signal(SignalKind::Interrupt));
                }
                if w.crashes_left > 0 {
                    acts.push(Act::Crash(p));
                }
                let proc = &w.procs[p];
                if !proc.ready_sent {
                    acts.push(Act::AppReady(p));
                }
                if proc.watch.is_looking() {
                    acts.push(Act::Probe(p));
                }
                if proc.watch != Watch::Done && proc.seen != proc.lifecycle.state() {
                    acts.push(Act::WatcherSeesRunner(p));
                }
                if !proc.mailbox.is_empty() {
                    acts.push(Act::RunnerHandles(p));
                }
                if proc.lifecycle.state() == ProcessState::Draining {
                    acts.push(Act::RunnerFinishes(p));
                }
                if proc.finished.is_some() {
                    acts.push(Act::Exit(p));
                }
            }
            None if w.procs.len() == 1 => acts.push(Act::SuccessorStarts),
            None => {}
        }
    }

    fn next_state(&self, w: &World, act: Act) -> Option<World> {
        let mut w = w.clone();
        match act {
            Act::Tick => w.tick += 1,
            Act::Look(_) | Act::Write(_) | Act::SendTerm(_) | Act::Report(_) => {
                self.stopper_acts(&mut w, act)?;
            }
            Act::Forge(f) => Self::forge(&mut w, f),
            Act::Signal(kind) => {
                w.signals_left -= 1;
                let p = Self::live(&w)?;
                w.procs[p].mailbox.push(Msg::Signal(kind));
            }
            Act::Crash(p) => {
                w.crashes_left -= 1;
                w.procs[p].life = Life::Crashed;
            }
            Act::SuccessorStarts => w.procs.push(Proc::new(SUCCESSOR, w.tick)),
            Act::AppReady(p) => {
                w.procs[p].ready_sent = true;
                w.procs[p].mailbox.push(Msg::Ready);
            }
            Act::Probe(p) => {
                let verdict = self.probe(&mut w, p);
                let step = (self.rules.next_step)(&verdict, w.procs[p].lifecycle.state());
                let send = (self.rules.on_step)(&mut w.procs[p].watch, step);
                Self::watcher_sends(&mut w, p, send);
            }
            Act::WatcherSeesRunner(p) => {
                let state = w.procs[p].lifecycle.state();
                w.procs[p].seen = state;
                let send = w.procs[p].watch.on_runner(state);
                Self::watcher_sends(&mut w, p, send);
            }
            Act::RunnerHandles(p) => {
                let msg = w.procs[p].mailbox.remove(0);
                self.handle(&mut w, p, msg);
            }
            Act::RunnerFinishes(p) => self.finish(&mut w, p),
            Act::Exit(p) => w.procs[p].life = Life::Exited,
        }
        Some(w)
    }

    /// Only a defect sends more: the real rules never reach this bound (the first property fails
    /// before it does).
    fn within_boundary(&self, w: &World) -> bool {
        w.procs.iter().all(|p| p.deliveries <= 2 && p.drains <= 2)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("one stop per life, delivered once", |_, w: &World| {
                w.procs.iter().all(|p| p.drains <= 1 && p.deliveries <= 1)
            }),
            Property::always("the first verdict never changes", |_, w: &World| {
                w.procs.iter().all(|p| !p.verdict_changed)
            }),
            Property::always(
                "a marker stops only the identity it names",
                |_, w: &World| w.procs.iter().all(|p| !p.claimed_other),
            ),
            Property::always("no phantom planned stop", |_, w: &World| {
                w.procs.iter().all(|p| match p.accepted {
                    Some((cause, StopVerdict::Planned, _)) => {
                        cause == StopCause::Signal(SignalKind::Interrupt) || w.asked.contains(&p.fp)
                    }
                    _ => true,
                })
            }),
            Property::always(
                "every report agrees with what the target did",
                |_, w: &World| {
                    w.stoppers.iter().enumerate().all(|(i, s)| {
                        let Stopper::Reported { fp, report } = *s else {
                            return true;
                        };
                        let Some(p) = w.procs.iter().find(|p| p.fp == fp) else {
                            return report == Report::NotRunning;
                        };
                        match report {
                            Report::StoppedPlanned { own } => {
                                p.finished == Some(StopVerdict::Planned)
                                    && (!own || p.accepted.is_some_and(|a| a.2 == Some(i as u8)))
                            }
                            Report::StoppedUnexpectedly => {
                                p.finished == Some(StopVerdict::Unexpected)
                            }
                            Report::KilledWhileDraining => {
                                p.life == Life::Crashed && p.finished.is_none()
                            }
                            // The outcome file is per pid: a successor that reused the pid before
                            // the stopper looked has replaced it, and "unknown" is the truth.
                            Report::GoneWithoutOutcome => {
                                p.life == Life::Crashed || w.procs.len() == 2
                            }
                            Report::NotRunning | Report::Other => false,
                        }
                    })
                },
            ),
            // Reachability: the invariants above are not vacuous.
            Property::sometimes("a stopper sees its own planned stop", |_, w: &World| {
                w.stoppers.iter().any(|s| {
                    matches!(
                        s,
                        Stopper::Reported {
                            report: Report::StoppedPlanned { own: true },
                            ..
                        }
                    )
                })
            }),
            Property::sometimes("a stopper's marker names a dead target", |_, w: &World| {
                w.procs.len() == 2
                    && w.stoppers
                        .iter()
                        .any(|s| matches!(s, Stopper::Asked { fp: TARGET, .. }))
                    && matches!(w.slot, Slot::Marker { fp: TARGET, .. })
            }),
            Property::sometimes("a stop held while starting ends planned", |_, w: &World| {
                w.procs
                    .iter()
                    .any(|p| p.was_held && p.finished == Some(StopVerdict::Planned))
            }),
            Property::sometimes("a successor stops unexpectedly", |_, w: &World| {
                w.procs
                    .get(1)
                    .is_some_and(|p| p.finished == Some(StopVerdict::Unexpected))
            }),
        ]
    }
}

#[test]
fn the_stop_protocol_holds_over_every_bounded_interleaving() {
    let configs = if deep() {
        StopModel::deeper()
    } else {
        StopModel::ci()
    };
    for bounds in configs {
        assert_holds(bounds.name, StopModel::new(bounds));
    }
}

// ---------------------------------------------------------------------------------------------
// The record handover: successors lease and acknowledge the items a stopped process left.

#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
struct Item {
    /// The holder (a successor's index) and whether its lease has lapsed.
    lease: Option<(usize, bool)>,
    attempts: u8,
    acks: u8,
    /// A successor leased it while its holder was alive.
    leased_from_the_living: bool,
    /// It was leased again after its holder died.
    taken_over: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Successor {
    alive: bool,
    /// Items it saw on offer and has not taken yet (only when the claim is not atomic).
    saw: Vec<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Handover {
    items: Vec<Item>,
    successors: Vec<Successor>,
    crashes_left: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum HandoverAct {
    /// Successor `.0` leases item `.1` (atomically; or only looks, when the claim is split).
    Lease(usize, usize),
    /// The second half of a split claim: the lease is written without looking again.
    Take(usize, usize),
    Acknowledge(usize, usize),
    Crash(usize),
    /// Item `.0`'s lease lapses.
    Lapse(usize),
}

struct HandoverModel {
    rules: Rules,
    /// Both successors on one host (liveness is looked up) or on two (the lease expiry decides,
    /// and a live holder renews in time).
    same_host: bool,
    atomic_claim: bool,
    items: usize,
    successors: usize,
    /// At most this many successors crash (fewer than there are: one lives long enough).
    crashes: u8,
}

impl HandoverModel {
    fn new(same_host: bool) -> Self {
        HandoverModel {
            rules: Rules::REAL,
            same_host,
            atomic_claim: true,
            items: 2,
            successors: 2,
            crashes: 1,
        }
    }

    fn owner(&self, s: usize) -> Owner {
        let host = if self.same_host {
            "h".to_owned()
        } else {
            format!("h{s}")
        };
        Owner::new(host, 100 + s as u32, 1)
    }

    /// The lease on `item` as a store holds it, at the model's "now" (`at(5)`): a lapsed lease
    /// expired at `at(0)`, a current one expires at `at(10)`.
    fn lease(&self, item: &Item) -> Option<Lease> {
        item.lease.map(|(holder, lapsed)| {
            Lease::new(
                self.owner(holder),
                at(0),
                if lapsed { at(0) } else { at(10) },
            )
        })
    }

    /// Whether `item` is on offer to successor `viewer` ([`is_offered`], with the holder's
    /// liveness as the viewer can tell it).
    fn offered(&self, h: &Handover, viewer: usize, i: usize) -> bool {
        let item = &h.items[i];
        // The real rules lease an item at most once per crash, plus once; a defect could lease it
        // forever, and the bound keeps its state space finite.
        if item.acks > 0 || item.attempts > self.crashes + 1 {
            return false;
        }
        let liveness = match item.lease {
            None => Liveness::Alive,
            Some((holder, _)) if self.owner(holder).host != self.owner(viewer).host => {
                Liveness::Unknown
            }
            Some((holder, _)) if h.successors[holder].alive => Liveness::Alive,
            Some(_) => Liveness::Dead,
        };
        (self.rules.is_offered)(self.lease(item).as_ref(), at(5), liveness)
    }

    fn take(&self, h: &mut Handover, s: usize, i: usize) {
        let item = &mut h.items[i];
        if let Some((holder, _)) = item.lease {
            if holder != s && h.successors[holder].alive {
                item.leased_from_the_living = true;
            } else if holder != s {
                item.taken_over = true;
            }
        }
        item.lease = Some((s, false));
        item.attempts += 1;
    }
}

impl Model for HandoverModel {
    type State = Handover;
    type Action = HandoverAct;

    fn init_states(&self) -> Vec<Handover> {
        let successor = Successor {
            alive: true,
            saw: Vec::new(),
        };
        vec![Handover {
            items: vec![Item::default(); self.items],
            successors: vec![successor; self.successors],
            crashes_left: self.crashes,
        }]
    }

    fn actions(&self, h: &Handover, acts: &mut Vec<HandoverAct>) {
        for s in 0..self.successors {
            if !h.successors[s].alive {
                continue;
            }
            if h.crashes_left > 0 {
                acts.push(HandoverAct::Crash(s));
            }
            for i in 0..self.items {
                if !h.successors[s].saw.contains(&i) && self.offered(h, s, i) {
                    acts.push(HandoverAct::Lease(s, i));
                }
                if h.successors[s].saw.contains(&i) {
                    acts.push(HandoverAct::Take(s, i));
                }
                let lease = self.lease(&h.items[i]);
                if h.items[i].acks == 0 && holds(lease.as_ref(), &self.owner(s)) {
                    acts.push(HandoverAct::Acknowledge(s, i));
                }
            }
        }
        for (i, item) in h.items.iter().enumerate() {
            // A dead holder's lease runs out; a live one's only where its liveness is looked up
            // (elsewhere the holder renews every third of the lease).
            if let Some((holder, false)) = item.lease
                && (!h.successors[holder].alive || self.same_host)
            {
                acts.push(HandoverAct::Lapse(i));
            }
        }
    }

    fn next_state(&self, h: &Handover, act: HandoverAct) -> Option<Handover> {
        let mut h = h.clone();
        match act {
            HandoverAct::Lease(s, i) if self.atomic_claim => self.take(&mut h, s, i),
            HandoverAct::Lease(s, i) => h.successors[s].saw.push(i),
            HandoverAct::Take(s, i) => {
                h.successors[s].saw.retain(|&x| x != i);
                self.take(&mut h, s, i);
            }
            HandoverAct::Acknowledge(_, i) => h.items[i].acks += 1,
            HandoverAct::Crash(s) => {
                h.crashes_left -= 1;
                h.successors[s].alive = false;
                h.successors[s].saw.clear();
            }
            HandoverAct::Lapse(i) => {
                if let Some((_, lapsed)) = h.items[i].lease.as_mut() {
                    *lapsed = true;
                }
            }
        }
        Some(h)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no item leased by two live owners", |_, h: &Handover| {
                h.items.iter().all(|i| !i.leased_from_the_living)
            }),
            Property::always("no item acknowledged twice", |_, h: &Handover| {
                h.items.iter().all(|i| i.acks <= 1)
            }),
            Property::eventually(
                "every item is acknowledged exactly once",
                |_, h: &Handover| h.items.iter().all(|i| i.acks == 1),
            ),
            Property::sometimes(
                "a crashed holder's item is taken over",
                |_, h: &Handover| h.items.iter().any(|i| i.taken_over && i.acks == 1),
            ),
        ]
    }
}

#[test]
fn the_record_handover_holds_over_every_bounded_interleaving() {
    for same_host in [true, false] {
        let mut model = HandoverModel::new(same_host);
        (model.items, model.successors, model.crashes) = if deep() { (4, 4, 3) } else { (3, 3, 2) };
        let name = format!(
            "handover, {} items, {} successors on {}, up to {} crashes",
            model.items,
            model.successors,
            if same_host {
                "one host"
            } else {
                "separate hosts"
            },
            model.crashes
        );
        assert_holds(&name, model);
    }
}

// ---------------------------------------------------------------------------------------------
// Injected defects: each must give a counterexample (docs/reliability.md lists them).

fn racing_stoppers() -> StopModel {
    StopModel::new(StopModel::ci()[0])
}

fn signals_and_forgeries() -> StopModel {
    StopModel::new(StopModel::ci()[1])
}

/// The verdict latch removed: every signal classifies the stop afresh, even one that follows a
/// stop already under way (hazard 1 of docs/protocol.md: the watcher's planned stop consumed the
/// marker, and a SIGTERM moments later found none).
fn signal_without_latch(lifecycle: &mut Lifecycle, kind: SignalKind, claimed: bool) -> Step {
    let real = lifecycle.signal(kind, claimed);
    let verdict = if kind.is_planned_by_itself() || claimed {
        StopVerdict::Planned
    } else {
        StopVerdict::Unexpected
    };
    match real {
        Step::Drain(cause, _) => Step::Drain(cause, verdict),
        Step::Force | Step::Ignore(_) if lifecycle.state() == ProcessState::Draining => {
            Step::Drain(StopCause::Signal(kind), verdict)
        }
        other => other,
    }
}

#[test]
fn defect_latch_removed_is_caught() {
    let mut model = racing_stoppers();
    model.rules.signal = signal_without_latch;
    assert!(
        counterexample(
            "defect: latch removed",
            model,
            "the first verdict never changes"
        )
        .is_some()
    );
}

/// The watcher goes on looking after it delivered.
fn on_step_keeps_looking(watch: &mut Watch, step: WatchStep) -> WatchSend {
    let send = watch.on_step(step);
    if matches!(send, WatchSend::Stop(_)) {
        *watch = Watch::Looking;
    }
    send
}

#[test]
fn defect_watcher_delivering_twice_is_caught() {
    let mut model = racing_stoppers();
    model.rules.on_step = on_step_keeps_looking;
    assert!(
        counterexample(
            "defect: watcher delivers twice",
            model,
            "one stop per life, delivered once"
        )
        .is_some()
    );
}

/// A marker naming our pid with another start fingerprint taken as ours (a pid-only match).
fn decide_ignoring_fingerprint(
    found: SlotContent<'_>,
    own: &ProcessIdentity,
    now: DateTime<Utc>,
    policy: &Policy,
) -> Result<Judgement, Undecided> {
    match decide(found, own, now, policy)? {
        Judgement::Stale(planned_stop::marker::Stale::OtherIncarnation { .. }) => {
            let SlotContent::Bytes(bytes) = found else {
                unreachable!("only bytes are judged stale")
            };
            Ok(Judgement::ForSelf(
                Marker::parse(bytes).expect("judged above"),
            ))
        }
        verdict => Ok(verdict),
    }
}

#[test]
fn defect_stale_identity_accepted_is_caught() {
    let mut model = racing_stoppers();
    model.rules.decide = decide_ignoring_fingerprint;
    assert!(
        counterexample(
            "defect: stale identity accepted",
            model,
            "a marker stops only the identity it names"
        )
        .is_some()
    );
}

/// The stopper's rule before the model found it wrong: a stop taken without any request was
/// counted as every stopper's own.
fn own_request_when_nobody_asked(outcome: &Outcome, request_id: Option<&str>) -> bool {
    outcome.request_id.is_none() || outcome.request_id.as_deref() == request_id
}

#[test]
fn defect_stop_without_request_counted_as_own_is_caught() {
    let mut model = signals_and_forgeries();
    model.rules.own_request = own_request_when_nobody_asked;
    assert!(
        counterexample(
            "defect: a Ctrl-C's stop reported as the stopper's",
            model,
            "every report agrees with what the target did"
        )
        .is_some()
    );
}

#[test]
fn defect_claim_not_atomic_is_caught() {
    let mut model = HandoverModel::new(true);
    model.atomic_claim = false;
    assert!(
        counterexample(
            "defect: claim not atomic",
            model,
            "no item leased by two live owners"
        )
        .is_some()
    );
}

/// Liveness not looked up: a live holder's item is offered once its lease runs out.
fn offered_by_expiry_alone(lease: Option<&Lease>, now: DateTime<Utc>, _: Liveness) -> bool {
    is_offered(lease, now, Liveness::Unknown)
}

#[test]
fn defect_lease_not_checked_for_liveness_is_caught() {
    let mut model = HandoverModel::new(true);
    model.rules.is_offered = offered_by_expiry_alone;
    assert!(
        counterexample(
            "defect: liveness not checked",
            model,
            "no item leased by two live owners"
        )
        .is_some()
    );
}

/// A crashed holder's item never offered again.
fn offered_only_when_pending(lease: Option<&Lease>, _: DateTime<Utc>, _: Liveness) -> bool {
    lease.is_none()
}

#[test]
fn defect_dead_holders_items_never_offered_is_caught() {
    for same_host in [true, false] {
        let mut model = HandoverModel::new(same_host);
        model.rules.is_offered = offered_only_when_pending;
        assert!(
            counterexample(
                "defect: a dead holder's items kept",
                model,
                "every item is acknowledged exactly once"
            )
            .is_some()
        );
    }
}

//! The record-store conformance suite: any [`RecordStore`] against one model, as a proptest state
//! machine (the `testing` feature).
//!
//! Why it is public: [`RecordStore`] invites other backends, and a backend is only as good as its
//! agreement with the lease rules every store shares. A backend's test implements [`Backend`] and
//! calls [`check_conformance`], exactly as this crate's own stores do (`tests/records.rs` for the
//! state directory, `tests/postgres.rs` for PostgreSQL); the suite's model and its property-test
//! machinery are this module's own business, not the backend's:
//!
//! ```no_run
//! use planned_stop::record::RecordStore;
//! use planned_stop::testing::{Backend, Clock, Probe, check_conformance};
//! use std::sync::Arc;
//! struct Mine;
//! impl Backend for Mine {
//!     fn open(clock: Arc<dyn Clock>, probe: Probe) -> (Arc<dyn RecordStore>, Box<dyn std::any::Any>) {
//!         todo!("a fresh, empty store reading `clock`, deciding liveness with `probe`")
//!     }
//! }
//! // In a #[test]: 256 random sequences of up to 30 steps, each failure shrunk to its shortest.
//! check_conformance::<Mine>(256, None);
//! ```
//!
//! The model: four owners (two on this host, whose liveness the store can check, two on another
//! host, where only lease expiry counts), each living, crashing and starting again with a new
//! start fingerprint (pid reuse); stops that leave new items and hand back every item their
//! process leased — also those it no longer holds (acknowledged, dropped or released by an
//! operator, taken over), which must stay as they are; stops whose attempts failed, and items
//! taken over from a holder that was gone, each counting a failed attempt; items held aside and
//! an operator's release that offers them again; leases, acknowledgements, releases and drops; a
//! wall clock that only the test moves. After every step
//! the store must list exactly what the model holds, and every answer must be the model's.

pub use crate::clock::Clock;
use crate::record::lease::Liveness;
use crate::record::{Owner, RecordError, RecordStore, StopRecord};
use chrono::{DateTime, TimeDelta, Utc};
use proptest_state_machine::StateMachineTest;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How an owner's liveness is decided: the suite's probe, which a backend must use.
pub type Probe = Arc<dyn Fn(&Owner) -> Liveness + Send + Sync>;

/// A backend under test: a fresh, empty store reading `clock` and deciding liveness with `probe`.
pub trait Backend: 'static {
    /// The store, and what keeps it alive (a temporary directory, a schema to drop).
    fn open(clock: Arc<dyn Clock>, probe: Probe) -> (Arc<dyn RecordStore>, Box<dyn std::any::Any>);
}

mod model;

use model::{Expect, Model, Reference, Step};
use model::{HERE, OWNERS, STOPPER, owner};

/// The test clock: the model's seconds after a fixed instant.
#[derive(Debug)]
struct TestClock(Mutex<i64>);

fn base() -> DateTime<Utc> {
    DateTime::from_timestamp(1_900_000_000, 0).unwrap()
}

impl Clock for TestClock {
    fn now(&self) -> DateTime<Utc> {
        base() + TimeDelta::seconds(*self.0.lock().unwrap())
    }
}

/// An item as compared: id, attempts, failures, held aside, lease holder (pid, start), value.
type Listed = (String, u32, u32, bool, Option<(u32, u64)>, String);

/// The store under test and the world it sees.
struct Sut {
    store: Arc<dyn RecordStore>,
    _keep: Box<dyn std::any::Any>,
    clock: Arc<TestClock>,
    lives: Arc<Mutex<[(u64, bool); OWNERS]>>,
    /// What each owner leased, by its start fingerprint: its stop hands it all back.
    taken: Mutex<[Vec<(u64, String, String)>; OWNERS]>,
    runtime: tokio::runtime::Runtime,
}

impl Sut {
    /// A stop with `new` items of its own, by owner `by` (which hands back everything it leased)
    /// or by a stopper that holds nothing; each item marked failed when `failed`.
    fn stop(
        &self,
        m: &Model,
        new: usize,
        by: Option<usize>,
        failed: bool,
        lives: &[(u64, bool); OWNERS],
        now: chrono::DateTime<chrono::Utc>,
    ) {
        let mut items: Vec<serde_json::Value> = Vec::new();
        // The model's new items are the last `new` with this stop's prefix.
        for i in 0..new {
            let id = format!("s{:04}-{i:02}", m.stops);
            let value = format!("work {} of stop {}", i, m.stops);
            items.push(serde_json::json!({"id": id, "participant": "jobs", "item": value}));
        }
        let stopper = match by {
            Some(k) => {
                // Everything this life leased, held or not: the store writes back only what it
                // still holds.
                let start = lives[k].0;
                let taken = self.taken.lock().unwrap();
                for (_, id, value) in taken[k].iter().filter(|(s, _, _)| *s == start) {
                    items.push(serde_json::json!({"id": id, "participant": "jobs", "item": value, "resumed": true}));
                }
                owner(k, start)
            }
            None => Owner::new(HERE, STOPPER, u64::from(m.stops)),
        };
        if failed {
            for item in &mut items {
                item["failure"] = serde_json::json!("its task panicked");
            }
        }
        let record = stop_record(stopper.pid, now, items);
        self.runtime
            .block_on(self.store.persist(&stopper, record.clone().into()))
            .unwrap();
    }

    /// A lease of up to `max` items for `secs` by owner `k` in its life `start`: exactly the
    /// items the model offers, oldest first, each to that owner.
    fn lease(&self, m: &Model, k: usize, max: usize, secs: u64, start: u64) {
        let me = owner(k, start);
        let leased = self
            .runtime
            .block_on(self.store.lease(&me, max, Duration::from_secs(secs)))
            .unwrap();
        let ids: Vec<String> = leased.iter().map(|l| l.item.id.clone()).collect();
        assert_eq!(Expect::Leased(ids), m.expect, "lease by owner {k}");
        let mut taken = self.taken.lock().unwrap();
        for l in &leased {
            let value = l.item.item.as_str().unwrap_or_default().to_owned();
            taken[k].push((start, l.item.id.clone(), value));
        }
        for l in &leased {
            assert_eq!(l.lease.owner, me);
        }
    }
}

impl std::fmt::Debug for Sut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sut").finish_non_exhaustive()
    }
}

/// The suite, for backend `B`: the store against the model, step by step.
struct Conformance<B>(PhantomData<B>);

impl<B> std::fmt::Debug for Conformance<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Conformance")
    }
}

/// Runs the conformance suite against backend `B`: `cases` random sequences of up to 30 steps,
/// each on a fresh store from [`Backend::open`]; after every step the store must list exactly
/// what the model holds, and every answer must be the model's. A failure is shrunk to its
/// shortest sequence and panics with it (so call this in a `#[test]`); with `regressions`, a
/// file (a path from the crate's root, as `concat!(env!("CARGO_MANIFEST_DIR"), "/tests/x.txt")`
/// gives it) keeps the seeds of past failures, which run first every time.
pub fn check_conformance<B: Backend>(cases: u32, regressions: Option<&'static str>) {
    use proptest::test_runner::{Config, FileFailurePersistence, TestRunner};
    use proptest_state_machine::ReferenceStateMachine;
    let persistence =
        regressions.map_or(FileFailurePersistence::Off, FileFailurePersistence::Direct);
    let config = Config {
        cases,
        max_shrink_iters: 4096,
        failure_persistence: Some(Box::new(persistence)),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config.clone());
    let result = runner.run(
        &Reference::sequential_strategy(1..=30),
        |(model, steps, seen)| {
            Conformance::<B>::test_sequential(config.clone(), model, steps, seen);
            Ok(())
        },
    );
    if let Err(failure) = result {
        panic!("the store does not conform to the model: {failure}");
    }
}

fn error_kind(e: &RecordError) -> &'static str {
    match e {
        RecordError::UnknownItem { .. } => "unknown",
        RecordError::NotHolder { .. } => "not holder",
        other => panic!("the store failed: {other}"),
    }
}

/// A planned stop's record by `pid` at `at` leaving `items` (each `{"id", "participant", "item"}`),
/// as the runner would persist it (built from JSON: the record's fields are the crate's).
pub fn stop_record(pid: u32, at: DateTime<Utc>, items: Vec<serde_json::Value>) -> StopRecord {
    serde_json::from_value(serde_json::json!({
        "pid": pid, "cause": {"kind": "marker"}, "verdict": "planned", "request_id": null,
        "reason": null, "stopper_pid": null, "accepted_at": at, "drain_deadline": at,
        "finished_at": at, "drained_in_time": true, "forced": false, "unfinished": items,
        "unanswered": [], "exit_code": 0,
    }))
    .unwrap()
}

impl<B: Backend> StateMachineTest for Conformance<B> {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(m: &Model) -> Sut {
        let clock = Arc::new(TestClock(Mutex::new(m.now)));
        let lives = Arc::new(Mutex::new(m.lives));
        let seen = lives.clone();
        let probe: Probe = Arc::new(move |o: &Owner| {
            if o.host != HERE {
                return Liveness::Unknown;
            }
            let k = (o.pid - 100) as usize;
            if seen.lock().unwrap()[k] == (o.start, true) {
                Liveness::Alive
            } else {
                Liveness::Dead
            }
        });
        let (store, keep) = B::open(clock.clone(), probe);
        Sut {
            store,
            _keep: keep,
            clock,
            lives,
            taken: Mutex::default(),
            runtime: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    fn apply(sut: Sut, m: &Model, step: Step) -> Sut {
        let store = sut.store.clone();
        let now = sut.clock.now();
        let before_lives = *sut.lives.lock().unwrap();
        match step {
            Step::Stop { new, by, failed } => sut.stop(m, new, by, failed, &before_lives, now),
            Step::Lease { k, max, secs } => sut.lease(m, k, max, secs, before_lives[k].0),
            Step::Renew { k, secs } => {
                let me = owner(k, before_lives[k].0);
                // Every item, in the listing's order: the store renews only this owner's.
                let all: Vec<String> = sut
                    .runtime
                    .block_on(store.list())
                    .unwrap()
                    .into_iter()
                    .map(|s| s.item.id)
                    .collect();
                let got = sut
                    .runtime
                    .block_on(store.renew(&me, &all, Duration::from_secs(secs)))
                    .unwrap();
                assert_eq!(Expect::Renewed(got), m.expect, "renew by owner {k}");
            }
            Step::Ack { k, pick } => {
                let me = owner(k, before_lives[k].0);
                let id = ack_target(m, pick);
                let got = sut.runtime.block_on(store.acknowledge(&me, &id));
                assert_eq!(
                    Expect::Acked(got.map_err(|e| error_kind(&e))),
                    m.expect,
                    "ack {id} by {k}"
                );
            }
            Step::Release { k, pick } => {
                let me = k.map(|k| owner(k, before_lives[k].0));
                let id = ack_target(m, pick);
                let got = sut.runtime.block_on(store.release(me.as_ref(), &id));
                assert_eq!(
                    Expect::Released(got.map_err(|e| error_kind(&e))),
                    m.expect,
                    "release {id}"
                );
            }
            Step::Drop { pick } => {
                let id = ack_target(m, pick);
                let got = sut.runtime.block_on(store.remove(&id)).unwrap();
                assert_eq!(Expect::Dropped(got), m.expect, "drop {id}");
            }
            Step::HoldAside { k, pick } => {
                let me = owner(k, before_lives[k].0);
                let id = ack_target(m, pick);
                let got = sut
                    .runtime
                    .block_on(store.hold_aside(&me, &id, "failed too often"));
                assert_eq!(
                    Expect::HeldAside(got.map_err(|e| error_kind(&e))),
                    m.expect,
                    "hold {id} aside by {k}"
                );
            }
            Step::Crash { .. } | Step::Start { .. } | Step::Advance { .. } => {}
        }
        *sut.lives.lock().unwrap() = m.lives;
        *sut.clock.0.lock().unwrap() = m.now;
        sut
    }

    fn check_invariants(sut: &Sut, m: &Model) {
        let listed = sut.runtime.block_on(sut.store.list()).unwrap();
        let got: Vec<Listed> = listed
            .iter()
            .map(|s| {
                (
                    s.item.id.clone(),
                    s.item.attempts,
                    s.item.failures,
                    s.quarantined.is_some(),
                    s.lease.as_ref().map(|l| (l.owner.pid, l.owner.start)),
                    s.item.item.as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        let want: Vec<Listed> = m
            .items
            .iter()
            .map(|i| {
                (
                    i.id.clone(),
                    i.attempts,
                    i.failures,
                    i.aside,
                    i.lease.map(|(k, s, _)| (100 + k as u32, s)),
                    i.value.clone(),
                )
            })
            .collect();
        assert_eq!(
            got, want,
            "the store lists exactly the model's items, oldest first"
        );
    }
}

/// The id the step named, as the model picked it before applying the step.
fn ack_target(m: &Model, _pick: usize) -> String {
    m.last_pick.clone().expect("the model picked an id")
}

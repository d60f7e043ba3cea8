//! The conformance suite's model: four owners, their lives, the items and what every step must
//! answer. Why apart from the system under test: the model is the specification, read on its own.

use crate::record::Owner;
use crate::record::lease::Liveness;
use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;

pub(super) const OWNERS: usize = 4;
pub(super) const HERE: &str = "this-host";
const THERE: &str = "another-host";

fn host(k: usize) -> &'static str {
    if k < 2 { HERE } else { THERE }
}

pub(super) fn owner(k: usize, start: u64) -> Owner {
    Owner::new(host(k), 100 + k as u32, start)
}

/// The pid of the process whose stops leave new items (it never leases).
pub(super) const STOPPER: u32 = 900;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Item {
    pub(super) id: String,
    pub(super) stopped_at: i64,
    pub(super) attempts: u32,
    /// Failed attempts: taken over from a holder that was gone, or handed back failed.
    pub(super) failures: u32,
    /// Held aside for a person: never offered until an operator releases it.
    pub(super) aside: bool,
    /// (owner index, its start fingerprint, lease expiry).
    pub(super) lease: Option<(usize, u64, i64)>,
    pub(super) value: String,
}

/// What the last step must have answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Expect {
    Nothing,
    Leased(Vec<String>),
    Acked(Result<(), &'static str>),
    Released(Result<bool, &'static str>),
    Dropped(bool),
    Renewed(Vec<String>),
    HeldAside(Result<(), &'static str>),
}

/// The model's state.
#[derive(Debug, Clone)]
pub(super) struct Model {
    pub(super) now: i64,
    /// Each owner's current start fingerprint and whether it runs.
    pub(super) lives: [(u64, bool); OWNERS],
    pub(super) items: Vec<Item>,
    pub(super) gone: Vec<String>,
    pub(super) stops: u32,
    pub(super) expect: Expect,
    /// The item id the last acknowledgement, release or drop named (picked before it applied).
    pub(super) last_pick: Option<String>,
}

/// One step.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// A stop: `new` fresh items, plus, from `by`, the items it holds handed back (it then exits);
    /// with `failed`, every item's attempt failed (its task panicked).
    Stop {
        new: usize,
        by: Option<usize>,
        failed: bool,
    },
    Lease {
        k: usize,
        max: usize,
        secs: u64,
    },
    /// Owner `k` renews every item (those it holds are renewed, the others refused).
    Renew {
        k: usize,
        secs: u64,
    },
    Ack {
        k: usize,
        pick: usize,
    },
    Release {
        k: Option<usize>,
        pick: usize,
    },
    Drop {
        pick: usize,
    },
    /// Owner `k` holds the picked item aside (it failed too often).
    HoldAside {
        k: usize,
        pick: usize,
    },
    Crash {
        k: usize,
    },
    Start {
        k: usize,
    },
    Advance {
        secs: i64,
    },
}

impl Model {
    fn liveness(&self, k: usize, start: u64) -> Liveness {
        if host(k) == THERE {
            Liveness::Unknown
        } else if self.lives[k] == (start, true) {
            Liveness::Alive
        } else {
            Liveness::Dead
        }
    }

    fn sort(&mut self) {
        self.items
            .sort_by(|a, b| (a.stopped_at, &a.id).cmp(&(b.stopped_at, &b.id)));
    }

    fn pick(&self, pick: usize) -> String {
        let known = self.items.len() + self.gone.len();
        if known == 0 {
            return "no-such-item".into();
        }
        let i = pick % known;
        match self.items.get(i) {
            Some(item) => item.id.clone(),
            None => self.gone[i - self.items.len()].clone(),
        }
    }
}

/// The reference state machine.
#[derive(Debug)]
pub(super) struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model {
            now: 0,
            lives: [(1, true); OWNERS],
            items: Vec::new(),
            gone: Vec::new(),
            stops: 0,
            expect: Expect::Nothing,
            last_pick: None,
        })
        .boxed()
    }

    fn transitions(_: &Model) -> BoxedStrategy<Step> {
        let k = 0..OWNERS;
        prop_oneof![
            3 => (0..4usize, proptest::option::of(0..OWNERS), proptest::bool::weighted(0.3))
                .prop_map(|(new, by, failed)| Step::Stop { new, by, failed }),
            4 => (k.clone(), 0..4usize, 1..6u64).prop_map(|(k, max, secs)| Step::Lease { k, max, secs }),
            2 => (k.clone(), 1..6u64).prop_map(|(k, secs)| Step::Renew { k, secs }),
            3 => (k.clone(), any::<usize>()).prop_map(|(k, pick)| Step::Ack { k, pick }),
            1 => (proptest::option::of(k.clone()), any::<usize>()).prop_map(|(k, pick)| Step::Release { k, pick }),
            1 => any::<usize>().prop_map(|pick| Step::Drop { pick }),
            1 => (k.clone(), any::<usize>()).prop_map(|(k, pick)| Step::HoldAside { k, pick }),
            1 => k.clone().prop_map(|k| Step::Crash { k }),
            2 => k.prop_map(|k| Step::Start { k }),
            2 => (0..8i64).prop_map(|secs| Step::Advance { secs }),
        ]
        .boxed()
    }

    fn preconditions(m: &Model, step: &Step) -> bool {
        match *step {
            Step::Stop { by: Some(k), .. }
            | Step::Lease { k, .. }
            | Step::Renew { k, .. }
            | Step::Ack { k, .. }
            | Step::HoldAside { k, .. } => m.lives[k].1,
            Step::Release { k: Some(k), .. } | Step::Crash { k } => m.lives[k].1,
            Step::Start { k } => !m.lives[k].1,
            _ => true,
        }
    }

    fn apply(mut m: Model, step: &Step) -> Model {
        m.expect = Expect::Nothing;
        m.last_pick = match *step {
            Step::Ack { pick, .. }
            | Step::Release { pick, .. }
            | Step::Drop { pick }
            | Step::HoldAside { pick, .. } => Some(m.pick(pick)),
            _ => None,
        };
        match *step {
            Step::Stop { new, by, failed } => m.stop(new, by, failed),
            Step::Lease { k, max, secs } => m.lease(k, max, secs),
            Step::Renew { k, secs } => {
                let start = m.lives[k].0;
                let now = m.now;
                let mut renewed = Vec::new();
                for item in &mut m.items {
                    if let Some((o, s, expires)) = item.lease.as_mut()
                        && (*o, *s) == (k, start)
                    {
                        *expires = now + secs as i64;
                        renewed.push(item.id.clone());
                    }
                }
                m.expect = Expect::Renewed(renewed);
            }
            Step::Ack { k, pick } => {
                let id = m.pick(pick);
                let start = m.lives[k].0;
                m.expect = Expect::Acked(match m.items.iter().position(|i| i.id == id) {
                    None => Err("unknown"),
                    Some(i)
                        if m.items[i]
                            .lease
                            .is_some_and(|(o, s, _)| (o, s) == (k, start)) =>
                    {
                        m.items.remove(i);
                        m.gone.push(id);
                        Ok(())
                    }
                    Some(_) => Err("not holder"),
                });
            }
            Step::Release { k, pick } => m.release(k, pick),
            Step::Drop { pick } => {
                let id = m.pick(pick);
                let existed = m.items.iter().any(|i| i.id == id);
                m.items.retain(|i| i.id != id);
                if existed {
                    m.gone.push(id);
                }
                m.expect = Expect::Dropped(existed);
            }
            Step::HoldAside { k, pick } => {
                let id = m.pick(pick);
                let start = m.lives[k].0;
                m.expect = Expect::HeldAside(match m.items.iter_mut().find(|i| i.id == id) {
                    None => Err("unknown"),
                    Some(item) if item.lease.is_some_and(|(o, s, _)| (o, s) == (k, start)) => {
                        item.lease = None;
                        item.aside = true;
                        Ok(())
                    }
                    Some(_) => Err("not holder"),
                });
            }
            Step::Crash { k } => m.lives[k].1 = false,
            Step::Start { k } => m.lives[k] = (m.lives[k].0 + 1, true),
            Step::Advance { secs } => m.now += secs,
        }
        m
    }
}

impl Model {
    /// A stop: `new` items of its own, and everything owner `by` holds handed back (the stop
    /// ends that life); with `failed`, each counts a failed attempt.
    fn stop(&mut self, new: usize, by: Option<usize>, failed: bool) {
        self.stops += 1;
        let failed = u32::from(failed);
        for i in 0..new {
            self.items.push(Item {
                id: format!("s{:04}-{i:02}", self.stops),
                stopped_at: self.now,
                attempts: 1,
                failures: failed,
                aside: false,
                lease: None,
                value: format!("work {} of stop {}", i, self.stops),
            });
        }
        if let Some(k) = by {
            let start = self.lives[k].0;
            let now = self.now;
            for item in &mut self.items {
                if item.lease.is_some_and(|(o, s, _)| (o, s) == (k, start)) {
                    item.lease = None;
                    item.attempts += 1;
                    item.failures += failed;
                    item.stopped_at = now;
                }
            }
            self.lives[k].1 = false; // a stop ends the process
        }
        self.sort();
    }

    /// Owner `k` leases up to `max` items for `secs`: the oldest on offer (nobody holds them, or
    /// their holder is gone, or its lease ran out where its liveness cannot be told).
    fn lease(&mut self, k: usize, max: usize, secs: u64) {
        let start = self.lives[k].0;
        let now = self.now;
        let mut leased = Vec::new();
        for i in 0..self.items.len() {
            if leased.len() >= max {
                break;
            }
            let offered = !self.items[i].aside
                && match self.items[i].lease {
                    None => true,
                    Some((o, s, expires)) => match self.liveness(o, s) {
                        Liveness::Alive => false,
                        Liveness::Dead => true,
                        Liveness::Unknown => now >= expires,
                    },
                };
            if offered {
                if self.items[i].lease.is_some() {
                    self.items[i].failures += 1; // its holder is gone: a failed attempt
                }
                self.items[i].lease = Some((k, start, now + secs as i64));
                leased.push(self.items[i].id.clone());
            }
        }
        self.expect = Expect::Leased(leased);
    }

    /// Owner `k` (or, with `None`, the operator) releases the picked item; the operator's
    /// release also takes an item back from aside.
    fn release(&mut self, k: Option<usize>, pick: usize) {
        let id = self.pick(pick);
        let holder = k.map(|k| (k, self.lives[k].0));
        self.expect = Expect::Released(match self.items.iter_mut().find(|i| i.id == id) {
            None => Err("unknown"),
            Some(item) if k.is_none() && item.aside => {
                item.aside = false;
                item.failures = 0;
                Ok(true)
            }
            Some(item) => match (item.lease, holder) {
                (None, _) => Ok(false),
                (Some((o, s, _)), Some(h)) if (o, s) != h => Err("not holder"),
                (Some(_), _) => {
                    item.lease = None;
                    Ok(true)
                }
            },
        });
    }
}

//! A drain in progress: its phases in order, the participants' answers, and what they add up to.
//!
//! The actor ([`super::RunnerActor`]) sends the messages and arms the timers; everything it must
//! remember between them, and every rule about what counts as answered, late or cut, is here, so
//! the rules can be read (and tested) without a running system.
//!
//! Phases run in the order of [`DrainPhase::ALL`]. A phase with no participants is skipped; the
//! next one starts when every participant of the current one has answered or its deadline (plus
//! the answer grace) has passed. A phase's deadline is its own (if configured) but never more than
//! what is left of the overall deadline, so a slow ingress cannot take the work phase's budget
//! beyond its own. A participant whose mailbox is closed counts as answered at once.

use super::{Drain, DrainPhase, DrainReport, RunnerConfig};
use crate::lifecycle::{StopCause, StopVerdict};
use crate::record::{Note, PhaseRecord, Unfinished};
use actix::Recipient;
use actix::clock::Instant;
use chrono::{DateTime, Utc};
use std::collections::BTreeSet;
use std::time::Duration;

/// The longest any deadline is taken to be: a larger one (a typo, `Duration::MAX`) is clamped so
/// no instant or wall-clock time computed from it can overflow.
pub(crate) const LONGEST_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// A registered drain participant.
pub(crate) struct Participant {
    pub(crate) phase: DrainPhase,
    pub(crate) name: String,
    pub(crate) recipient: Recipient<Drain>,
}

/// Who asked for the stop, for the stop record.
#[derive(Debug, Clone, Default)]
pub(crate) struct Requester {
    pub(crate) request_id: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) stopper_pid: Option<u32>,
    pub(crate) action: crate::schema::StopAction,
    /// When the marker that asked was written, when one did.
    pub(crate) written_at: Option<DateTime<Utc>>,
    /// The successor a restart in place handed over to, once it is ready.
    pub(crate) successor: Option<u32>,
    /// The drain deadline the stopper asked for, if any.
    pub(crate) drain_deadline: Option<Duration>,
}

impl From<super::PlannedStop> for Requester {
    fn from(s: super::PlannedStop) -> Self {
        Requester {
            request_id: s.request_id,
            reason: s.reason,
            stopper_pid: s.stopper_pid,
            action: s.action,
            written_at: Some(s.written_at),
            successor: None,
            drain_deadline: s.drain_deadline,
        }
    }
}

/// How long a drain may take: the service's own deadline, or the one its stopper asked for
/// when that is shorter (a request never lengthens a drain the service bounds), clamped to
/// [`LONGEST_DEADLINE`]. The one rule the drain, its outcome and its record share.
pub(crate) fn drain_within(own: Duration, asked: Option<Duration>) -> Duration {
    clamp(asked.map_or(own, |asked| asked.min(own)))
}

/// What the actor does next.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Send `Drain` to these participants (indexes into the participant list) with this budget,
    /// and arm the phase's timer under `generation`.
    Ask {
        phase: DrainPhase,
        within: Duration,
        participants: Vec<usize>,
        generation: u64,
    },
    /// Every phase is over.
    Finish,
}

/// The phase running now.
struct Current {
    phase: DrainPhase,
    started_at: DateTime<Utc>,
    /// Who has not answered yet (ordered, so the warning names them in order).
    waiting: BTreeSet<usize>,
    asked: usize,
}

/// A drain from acceptance to the record.
pub(crate) struct DrainRun {
    pub(crate) cause: StopCause,
    pub(crate) verdict: StopVerdict,
    pub(crate) requester: Requester,
    pub(crate) accepted_at: DateTime<Utc>,
    overall_deadline: Instant,
    current: Option<Current>,
    next_phase: usize,
    generation: u64,
    /// Who has answered, by participant index (one flag each: taking in an answer costs the
    /// same with ten participants as with a hundred thousand).
    answered: Vec<bool>,
    /// How many flags of `answered` are set.
    taken: usize,
    /// Participants whose mailbox was closed: counted as answered (they do not delay the drain)
    /// but their work is unknown, so the record lists them as unanswered.
    gone: Vec<bool>,
    pub(crate) unfinished: Vec<Unfinished>,
    /// Items that could not be serialised, each with its participant: lost, and said so.
    pub(crate) unrecordable: Vec<Note>,
    pub(crate) notes: Vec<Note>,
    pub(crate) phases: Vec<PhaseRecord>,
    late: bool,
    cut: bool,
    pub(crate) forced: bool,
    /// How long the drain may take ([`drain_within`]).
    pub(crate) within: Duration,
}

/// Whether flag `index` is set.
fn flag(flags: &[bool], index: usize) -> bool {
    flags.get(index).copied().unwrap_or(false)
}

/// Sets flag `index`, growing `flags` as needed.
fn set_flag(flags: &mut Vec<bool>, index: usize) {
    if flags.len() <= index {
        flags.resize(index + 1, false);
    }
    flags[index] = true;
}

/// `deadline` clamped to [`LONGEST_DEADLINE`].
pub(crate) fn clamp(deadline: Duration) -> Duration {
    deadline.min(LONGEST_DEADLINE)
}

impl DrainRun {
    /// A drain accepted at `accepted_at` (wall clock) and `now` (monotonic), due to end within
    /// `overall`.
    pub(crate) fn new(
        cause: StopCause,
        verdict: StopVerdict,
        requester: Requester,
        accepted_at: DateTime<Utc>,
        now: Instant,
        overall: Duration,
    ) -> DrainRun {
        DrainRun {
            cause,
            verdict,
            requester,
            accepted_at,
            overall_deadline: now + clamp(overall),
            current: None,
            next_phase: 0,
            generation: 0,
            answered: Vec::new(),
            taken: 0,
            gone: Vec::new(),
            unfinished: Vec::new(),
            unrecordable: Vec::new(),
            notes: Vec::new(),
            phases: Vec::new(),
            late: false,
            cut: false,
            forced: false,
            within: clamp(overall),
        }
    }

    /// Ends the current phase (`timed_out` says how) and starts the next one that has
    /// participants, or says that the drain is over.
    pub(crate) fn advance(
        &mut self,
        phases: &[DrainPhase],
        config: &RunnerConfig,
        now: Instant,
        wall: DateTime<Utc>,
        timed_out: bool,
    ) -> Next {
        self.close_phase(wall, timed_out);
        while let Some(&phase) = DrainPhase::ALL.get(self.next_phase) {
            self.next_phase += 1;
            let members: Vec<usize> = (0..phases.len()).filter(|&i| phases[i] == phase).collect();
            if members.is_empty() {
                continue;
            }
            let left = self.overall_deadline.saturating_duration_since(now);
            let within = config.phase_budget(phase, left);
            self.generation += 1;
            self.current = Some(Current {
                phase,
                started_at: wall,
                waiting: members.iter().copied().collect(),
                asked: members.len(),
            });
            return Next::Ask {
                phase,
                within,
                participants: members,
                generation: self.generation,
            };
        }
        Next::Finish
    }

    /// Records participant `index`'s answer in `phase` (`None`: its mailbox is closed, which
    /// counts as answered with nothing handed back). Returns whether the current phase is now
    /// complete. An answer taken while its phase runs is in time — the runner ends a phase at its
    /// deadline and answer grace, later while answers are still arriving
    /// ([`RunnerConfig::phase_end`]) — and one that comes after is late.
    pub(crate) fn answer(
        &mut self,
        index: usize,
        name: &str,
        phase: DrainPhase,
        report: Option<DrainReport>,
    ) -> bool {
        if flag(&self.answered, index) {
            return false;
        }
        set_flag(&mut self.answered, index);
        self.taken += 1;
        match report {
            Some(report) => {
                self.late |= self.current.as_ref().is_none_or(|c| c.phase != phase);
                self.cut |= report.cut;
                let new = report
                    .unfinished
                    .iter()
                    .enumerate()
                    .map(|(i, item)| Unfinished {
                        id: None,
                        participant: name.to_owned(),
                        item: item.clone(),
                        resumed: false,
                        failure: report.failure_of_new(i),
                    });
                let back = report.handed_back.iter().map(|resumed| Unfinished {
                    id: Some(resumed.id.clone()),
                    participant: name.to_owned(),
                    item: resumed.item.clone(),
                    resumed: true,
                    failure: report.failure_of_resumed(&resumed.id),
                });
                self.unfinished.extend(new.chain(back));
                let note = |note| Note {
                    participant: name.to_owned(),
                    note,
                };
                self.unrecordable
                    .extend(report.unrecordable.into_iter().map(note));
                self.notes.extend(report.notes.into_iter().map(note));
            }
            None => {
                set_flag(&mut self.gone, index);
                self.notes.push(Note {
                    participant: name.to_owned(),
                    note: "gone before it could answer (mailbox closed); its work is unknown"
                        .into(),
                });
            }
        }
        match self.current.as_mut() {
            Some(c) if c.phase == phase => {
                c.waiting.remove(&index);
                c.waiting.is_empty()
            }
            _ => false,
        }
    }

    /// The participants (by index, in order) of the running phase that have not answered yet.
    pub(crate) fn waiting(&self) -> Vec<usize> {
        self.current
            .as_ref()
            .map_or(Vec::new(), |c| c.waiting.iter().copied().collect())
    }

    /// How many answers have been taken in so far (the runner's measure of progress while a
    /// phase's answers are still arriving).
    pub(crate) fn answers_taken(&self) -> usize {
        self.taken
    }

    /// Whether the phase timer armed under `generation` still belongs to the running phase.
    pub(crate) fn is_current(&self, generation: u64) -> bool {
        self.current.is_some() && self.generation == generation
    }

    /// Cut short by a force: the running phase ends now, later ones never start.
    pub(crate) fn force(&mut self, wall: DateTime<Utc>) {
        self.forced = true;
        self.close_phase(wall, true);
        self.next_phase = DrainPhase::ALL.len();
    }

    /// The participants (of `names`, by index) that never answered, those of phases that never
    /// started and those whose mailbox was closed included: their work is unknown.
    pub(crate) fn unanswered(&self, names: &[&str]) -> Vec<String> {
        (0..names.len())
            .filter(|&i| !flag(&self.answered, i) || flag(&self.gone, i))
            .map(|i| names[i].to_owned())
            .collect()
    }

    /// Every participant answered before its phase's deadline, none cut work, nobody forced.
    /// Work handed back does not count against it: it is recorded to resume.
    pub(crate) fn drained_in_time(&self, names: &[&str]) -> bool {
        !self.late && !self.cut && !self.forced && self.unanswered(names).is_empty()
    }

    /// Records the running phase as ended at `wall`. `timed_out`: it ended at its deadline (or
    /// by a force) with answers still missing; a phase whose participants all answered ends
    /// through [`Self::advance`] at once. Who never answered is kept in `answered`, so
    /// [`Self::drained_in_time`] needs nothing more from here.
    fn close_phase(&mut self, wall: DateTime<Utc>, timed_out: bool) {
        if let Some(c) = self.current.take() {
            self.phases.push(PhaseRecord {
                phase: c.phase,
                participants: c.asked,
                started_at: c.started_at,
                finished_at: wall,
                timed_out,
            });
        }
    }
}

#[cfg(test)]
mod tests;

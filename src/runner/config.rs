//! How the runner is set up: deadlines, exit codes per cause and verdict, where to record.

use super::DrainPhase;
use crate::lifecycle::{StopCause, StopVerdict};
use crate::record::RecordStore;
use std::sync::Arc;
use std::time::Duration;

/// ```
/// use planned_stop::{ExitCodes, SignalKind, StopCause, StopVerdict};
/// let codes = ExitCodes::default().with(StopCause::Signal(SignalKind::Hangup), StopVerdict::Unexpected, 75);
/// assert_eq!(codes.code(StopCause::Marker, StopVerdict::Planned), 0);
/// assert_eq!(codes.code(StopCause::Signal(SignalKind::Terminate), StopVerdict::Unexpected), 1);
/// assert_eq!(codes.code(StopCause::Signal(SignalKind::Hangup), StopVerdict::Unexpected), 75);
/// ```
///
/// Exit codes by verdict, with overrides per cause. Defaults: planned 0, unexpected 1.
///
/// A code is a `u8`, what a process can end with on every OS: a code no process can have does
/// not compile, rather than becoming another at the end.
///
/// ```compile_fail
/// use planned_stop::{ExitCodes, StopCause, StopVerdict};
/// let codes = ExitCodes::default().with(StopCause::Marker, StopVerdict::Unexpected, -1);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a builder or value that is dropped configures nothing"]
pub struct ExitCodes {
    /// The code of a planned stop.
    pub(crate) planned: u8,
    /// The code of an unexpected stop.
    pub(crate) unexpected: u8,
    /// A planned stop whose marker asked for a restart. Default 75 (`EX_TEMPFAIL`): a failure
    /// to a supervisor, which starts the service again, while a planned stop (0) stays down.
    pub(crate) restart: u8,
    /// A stop whose unfinished items could not be made durable (the record store failed): never
    /// a success, whatever the verdict. Default 74 (`EX_IOERR`); see [`ExitCodes::record_lost_code`].
    pub(crate) record_lost: u8,
    overrides: Vec<(StopCause, StopVerdict, u8)>,
    record_lost_overrides: Vec<(StopCause, u8)>,
}

impl Default for ExitCodes {
    fn default() -> Self {
        ExitCodes {
            planned: 0,
            unexpected: 1,
            restart: 75,
            record_lost: 74,
            overrides: Vec::new(),
            record_lost_overrides: Vec::new(),
        }
    }
}

impl ExitCodes {
    /// Uses `code` when a stop with `cause` reaches `verdict` (the last override given wins).
    ///
    /// ```
    /// use planned_stop::{ExitCodes, StopCause, StopVerdict};
    /// let codes = ExitCodes::default().with(StopCause::Request, StopVerdict::Unexpected, 3);
    /// assert_eq!(codes.code(StopCause::Request, StopVerdict::Unexpected), 3);
    /// ```
    pub fn with(mut self, cause: StopCause, verdict: StopVerdict, code: u8) -> Self {
        self.overrides.push((cause, verdict, code));
        self
    }

    /// Uses `code` when a stop with `cause` could not record its unfinished items (the last
    /// override given wins).
    ///
    /// ```
    /// use planned_stop::{ExitCodes, SignalKind, StopCause};
    /// let codes = ExitCodes::default().with_record_lost(StopCause::Marker, 70);
    /// assert_eq!(codes.record_lost_code(StopCause::Marker), 70);
    /// assert_eq!(codes.record_lost_code(StopCause::Signal(SignalKind::Terminate)), 74);
    /// ```
    pub fn with_record_lost(mut self, cause: StopCause, code: u8) -> Self {
        self.record_lost_overrides.push((cause, code));
        self
    }

    /// The code for a stop with `cause` whose unfinished items could not be recorded.
    pub fn record_lost_code(&self, cause: StopCause) -> u8 {
        let mut overridden = self.record_lost_overrides.iter().rev();
        overridden
            .find(|(c, _)| *c == cause)
            .map_or(self.record_lost, |&(_, code)| code)
    }

    /// Uses `code` for every planned stop with no override of its own (default 0).
    pub fn with_planned(mut self, code: u8) -> Self {
        self.planned = code;
        self
    }

    /// Uses `code` for every unexpected stop with no override of its own (default 1).
    pub fn with_unexpected(mut self, code: u8) -> Self {
        self.unexpected = code;
        self
    }

    /// Uses `code` for a planned stop whose marker asked for a restart (default 75).
    ///
    /// ```
    /// assert_eq!(planned_stop::ExitCodes::default().with_restart(3).restart_code(), 3);
    /// ```
    pub fn with_restart(mut self, code: u8) -> Self {
        self.restart = code;
        self
    }

    /// The code of a planned stop whose marker asked for a restart.
    pub fn restart_code(&self) -> u8 {
        self.restart
    }

    /// The code for a stop with `cause` and `verdict`.
    ///
    /// ```
    /// use planned_stop::{ExitCodes, StopCause, StopVerdict};
    /// assert_eq!(ExitCodes::default().code(StopCause::Marker, StopVerdict::Unexpected), 1);
    /// ```
    pub fn code(&self, cause: StopCause, verdict: StopVerdict) -> u8 {
        let mut overridden = self.overrides.iter().rev();
        match overridden.find(|(c, v, _)| *c == cause && *v == verdict) {
            Some(&(_, _, code)) => code,
            None if verdict == StopVerdict::Planned => self.planned,
            None => self.unexpected,
        }
    }
}

/// How the runner stops.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// How long the participants have to drain. Default 10 s.
    pub drain_deadline: Duration,
    /// How long after a phase's deadline its answers are still waited for (answers sent exactly
    /// at the deadline). While answers keep arriving then (thousands of participants answering
    /// at once take the event loop a while to deliver), the phase waits on for at most one more
    /// grace, and ends as soon as a moment passes without a new answer. Default 100 ms.
    pub answer_grace: Duration,
    /// Exit codes.
    pub exit_codes: ExitCodes,
    /// Where to persist the stop record and its unfinished items; `None` keeps none (and the
    /// items are logged at ERROR, as for a store that fails).
    pub records: Option<Arc<dyn RecordStore>>,
    /// The runner owns the process's end (default `true`): it stops the actix `System` with
    /// the verdict's code, ends the process with that code whatever `main` returns (within
    /// [`Self::exit_grace`] of the stop's conclusion), and arms the guards (a runner dropped
    /// before it stopped, a `System` stopped by someone else, a drain that overruns: the
    /// unexpected code). With `false` nothing in the library ends the process or installs a
    /// panic hook; the application awaits `ServiceHandle::stopped`.
    pub owns_process_exit: bool,
    /// How long `main` has, once the stop concluded, to return by itself before the runner ends
    /// the process with the verdict's code. Default 2 s.
    pub exit_grace: Duration,
    /// A phase's own deadline, within the overall one; a phase without one may use all that is
    /// left of the overall deadline.
    pub phase_deadlines: Vec<(DrainPhase, Duration)>,
    /// Warn when the application has not said it is ready after this long. Default 30 s.
    pub ready_warning: Option<Duration>,
    /// How long past the drain deadline (plus one answer grace per phase) a drain may run before
    /// a watchdog thread ends the process with the unexpected code: the actor's own timers cannot
    /// fire if something blocks the event loop, and no stop may hang forever. Default 5 s.
    pub overrun_grace: Duration,
    /// How long persisting the stop record may take (the record store's own budget, apart from
    /// the drain's): a persist still running then ends the stop as `record_lost`, with the items
    /// in the ERROR log line, instead of hanging the stop. Default 10 s.
    pub persist_deadline: Duration,
}

impl RunnerConfig {
    /// When the overrun watchdog ends a stop that has not concluded, counted from its
    /// acceptance, for a drain due within `within`: the drain, one answer grace per phase, the
    /// persist deadline and the overrun grace.
    pub(crate) fn overrun_limit(&self, within: Duration) -> Duration {
        let phases = DrainPhase::ALL.len() as u32;
        within
            .saturating_add(self.phase_end(Duration::ZERO).saturating_mul(phases))
            .saturating_add(super::drain::clamp(self.persist_deadline))
            .saturating_add(super::drain::clamp(self.overrun_grace))
    }

    /// The longest a stop accepted for a drain due within `within` may take until the process
    /// has ended: the overrun limit, or (when the exit grace is the longer of the two) a stop
    /// concluded at its last moment plus the exit grace `main` has to return. What a
    /// supervisor's stop timeout must cover (systemd's `TimeoutStopSec`, Kubernetes'
    /// `terminationGracePeriodSeconds`), and what the systemd notifications extend it to.
    #[cfg_attr(not(all(unix, feature = "systemd")), allow(dead_code))]
    pub(crate) fn stop_bound(&self, within: Duration) -> Duration {
        let tail = super::drain::clamp(self.overrun_grace).max(self.exit_grace);
        self.overrun_limit(within)
            .saturating_sub(super::drain::clamp(self.overrun_grace))
            .saturating_add(tail)
    }

    /// The latest a phase due within `within` ends: its deadline, the answer grace, and at most
    /// one more grace while answers are still arriving (see [`Self::answer_grace`]). An answer
    /// taken in by then is in time.
    pub(crate) fn phase_end(&self, within: Duration) -> Duration {
        within.saturating_add(super::drain::clamp(self.answer_grace).saturating_mul(2))
    }

    /// How long `phase` may take when `left` remains of the overall deadline.
    pub fn phase_budget(&self, phase: DrainPhase, left: Duration) -> Duration {
        let own = self
            .phase_deadlines
            .iter()
            .rev()
            .find(|(p, _)| *p == phase)
            .map(|&(_, d)| d);
        own.map_or(left, |own| own.min(left))
    }
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            drain_deadline: Duration::from_secs(10),
            answer_grace: Duration::from_millis(100),
            exit_codes: ExitCodes::default(),
            records: None,
            owns_process_exit: true,
            exit_grace: Duration::from_secs(2),
            phase_deadlines: Vec::new(),
            ready_warning: Some(Duration::from_secs(30)),
            overrun_grace: Duration::from_secs(5),
            persist_deadline: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::SignalKind;

    /// The docs' arithmetic (operations.md, ci/stop_bound.py): drain 20 s + 0.6 (two answer graces a phase) + 10 + 5.
    #[test]
    fn the_stop_bound_adds_the_graces_the_persist_and_the_longer_of_overrun_and_exit_grace() {
        let config = RunnerConfig::default();
        let drain = Duration::from_secs(20);
        assert_eq!(config.overrun_limit(drain), Duration::from_millis(35_600));
        assert_eq!(config.stop_bound(drain), Duration::from_millis(35_600));
        let slow_main = RunnerConfig {
            exit_grace: Duration::from_secs(8),
            ..RunnerConfig::default()
        };
        assert_eq!(
            slow_main.overrun_limit(drain),
            Duration::from_millis(35_600)
        );
        assert_eq!(slow_main.stop_bound(drain), Duration::from_millis(38_600));
    }

    #[test]
    fn an_override_applies_to_its_cause_and_verdict_together_only() {
        let hup = StopCause::Signal(SignalKind::Hangup);
        let codes = ExitCodes::default().with(hup, StopVerdict::Unexpected, 75);
        assert_eq!(codes.code(hup, StopVerdict::Unexpected), 75);
        assert_eq!(
            codes.code(hup, StopVerdict::Planned),
            0,
            "same cause, other verdict"
        );
        assert_eq!(
            codes.code(StopCause::Request, StopVerdict::Unexpected),
            1,
            "same verdict, other cause"
        );
        // The latest override for the same pair wins.
        let codes = codes.with(hup, StopVerdict::Unexpected, 76);
        assert_eq!(codes.code(hup, StopVerdict::Unexpected), 76);
    }

    #[test]
    fn a_record_lost_override_applies_to_its_cause_only_and_the_latest_wins() {
        let term = StopCause::Signal(SignalKind::Terminate);
        let codes = ExitCodes::default()
            .with_record_lost(StopCause::Marker, 70)
            .with_record_lost(term, 71);
        assert_eq!(codes.record_lost_code(StopCause::Marker), 70);
        assert_eq!(codes.record_lost_code(term), 71);
        assert_eq!(
            codes.record_lost_code(StopCause::Request),
            74,
            "a cause with no override keeps the default"
        );
        let codes = codes.with_record_lost(StopCause::Marker, 72);
        assert_eq!(codes.record_lost_code(StopCause::Marker), 72);
        // The verdict codes are not touched by a record-lost override.
        assert_eq!(codes.code(StopCause::Marker, StopVerdict::Planned), 0);
    }
}

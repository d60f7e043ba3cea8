//! What ends the process when the runner cannot: the guards behind "a planned stop exits 0 and
//! nothing else does, and no stop hangs".
//!
//! The runner decides the exit code, but the process ends wherever `main` ends, and a blocked
//! event loop starves the runner's own timers. Both guards are armed only when the runner owns
//! the process's exit (`RunnerConfig::stop_system`, the default):
//!
//! - the **drop guard**: a runner dropped before it stopped (the `System` stopped by someone else,
//!   `main` returned early, a panic) writes an `aborted` outcome and exits with the unexpected
//!   code instead of letting the process exit 0;
//! - the **overrun watchdog**: a plain OS thread that ends the process with the unexpected code
//!   when a drain overruns its deadline, answer graces and overrun grace.

use super::{DrainPhase, RunnerActor, drain};
use crate::error_chain::ErrorChain;
use crate::lifecycle::{RunnerState, StopCause, StopVerdict};
use crate::outcome::{Outcome, Phase};
use chrono::Utc;

impl RunnerActor {
    /// A plain OS thread (not an actix timer, which a blocked event loop would never fire) that
    /// ends the process with the unexpected code if the runner has not concluded by the drain
    /// deadline, one answer grace per phase, the persist deadline and the overrun grace. It
    /// watches for the final outcome, not for the `Stopped` state, which comes before the persist:
    /// a persist that hangs is covered too. Before it exits it logs every item not yet durable.
    pub(super) fn arm_overrun_watchdog(&self, within: std::time::Duration) {
        // Only when the runner owns the process's exit, as for the drop guard.
        if !self.config.stop_system {
            return;
        }
        let phases = DrainPhase::ALL.len() as u32;
        let limit = within
            .saturating_add(self.config.answer_grace.saturating_mul(phases))
            .saturating_add(drain::clamp(self.config.persist_deadline))
            .saturating_add(drain::clamp(self.config.overrun_grace));
        let status = self.status.subscribe();
        let participants: Vec<String> = self.participants.iter().map(|p| p.name.clone()).collect();
        let code = self.config.exit_codes.unexpected;
        let pending = self.pending.clone();
        let spawned = std::thread::Builder::new()
            .name("planned-stop-overrun".into())
            .spawn(move || {
                std::thread::sleep(limit);
                let concluded = status.borrow().exit_code.is_some();
                if !concluded {
                    let state = status.borrow().state;
                    tracing::error!(
                        limit_ms = limit.as_millis() as u64,
                        ?state,
                        ?participants,
                        code,
                        "the stop overran its drain deadline, persist deadline and grace (is \
                         something blocking the event loop?); exiting so the stop cannot hang"
                    );
                    log_pending(&pending);
                    std::process::exit(code);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the drain overrun watchdog");
        }
    }
}

/// The guard against a silent exit 0: a runner dropped before it stopped means the actix
/// `System` was stopped by someone else (an `HttpServer` with its own signal handling, a
/// `System::stop` elsewhere) or `main` returned, before the stop was decided and recorded. The
/// process would otherwise exit with whatever code that path chose, usually 0, which a
/// supervisor reads as a clean stop. So the runner writes an `aborted` outcome, logs what to
/// change, and ends the process with the unexpected exit code. Armed only when the runner owns
/// the `System`'s exit (`stop_system`, the default).
impl Drop for RunnerActor {
    fn drop(&mut self) {
        // Also while unwinding: a runner that panicked has stopped deciding anything, and a
        // process whose runner is gone must not go on ignoring stops or exit 0.
        if self.lifecycle.state() == RunnerState::Stopped {
            return;
        }
        if !self.config.stop_system {
            // Nothing acts on a marker any more: stop announcing that something does.
            self.withdraw_presence();
            return;
        }
        let code = self.config.exit_codes.unexpected;
        let state = self.lifecycle.state();
        tracing::error!(
            ?state,
            code,
            "the actix System stopped (or main returned) before the planned-stop runner \
             finished; exiting with the unexpected code. Let the runner stop the System, or await \
             ServiceHandle::stopped() in main, and disable other signal handlers \
             (HttpServer::disable_signals, or planned_stop::web::serve)"
        );
        // Not the injected clock: it may be what panicked, and a second panic here would abort.
        let now = Utc::now();
        let (cause, verdict, request_id, accepted_at) = match &self.drain {
            Some(run) => (
                run.cause,
                run.verdict,
                run.requester.request_id.clone(),
                run.accepted_at,
            ),
            None => (StopCause::Request, StopVerdict::Unexpected, None, now),
        };
        let outcome = Outcome {
            pid: self.own.pid,
            start: self.own.start,
            phase: Phase::Aborted,
            cause,
            verdict,
            request_id,
            accepted_at,
            drain_deadline: accepted_at,
            finished_at: Some(now),
            exit_code: Some(code),
            spilled: false,
        };
        if let Err(e) = self.store.write_outcome(&outcome) {
            tracing::warn!(error = %ErrorChain(&e), "cannot write the aborted outcome");
        }
        log_pending(&self.pending);
        self.withdraw_presence();
        std::process::exit(code);
    }
}

/// Logs the items of a stop that are not durable yet (ERROR, as JSON): the last trace of work
/// the process is about to end without recording.
fn log_pending(pending: &super::Pending) {
    // A poisoned lock still holds the items.
    let items = match pending.lock() {
        Ok(p) => p.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    };
    if let Some(items) = items {
        tracing::error!(
            %items,
            "the process ends before these unfinished items were made durable: they are not \
             recorded anywhere but in this log line; resubmit them"
        );
    }
}

//! What ends the process when the runner cannot: the guards behind "a planned stop exits 0 and
//! nothing else does, and no stop hangs".
//!
//! The runner decides the exit code, but the process ends wherever `main` ends, and a blocked
//! event loop starves the runner's own timers. The guards are armed only when the runner owns
//! the process's exit (`RunnerConfig::owns_process_exit`, the default), and end the process
//! through [`super::process_end::end_forced`]:
//!
//! - the **drop guard**: a runner dropped before it stopped (`System::run` ended by someone
//!   else, `main` returned early, a panic) writes an `aborted` outcome and exits with the
//!   unexpected code instead of letting the process exit 0;
//! - the **System check**: a `System` stopped by someone else while `main` runs it with
//!   `block_on` (which goes on running): the same, found within [`SYSTEM_CHECK`];
//! - the **overrun watchdog**: a plain OS thread that ends the process with the unexpected code
//!   when a drain overruns its deadline, answer graces and overrun grace. It writes an
//!   `overrun` outcome, withdraws the presence file and logs who had not answered.

use super::{RunnerActor, process_end};
use crate::error_chain::ErrorChain;
use crate::lifecycle::{RunnerState, StopCause, StopVerdict};
use crate::outcome::{Outcome, Phase};
use actix::prelude::*;
use chrono::Utc;
use std::time::Duration;

/// How often the runner checks that its `System` has not been stopped by someone else.
pub(super) const SYSTEM_CHECK: Duration = Duration::from_millis(200);

impl RunnerActor {
    /// A plain OS thread (not an actix timer, which a blocked event loop would never fire) that
    /// ends the process with the unexpected code if the runner has not concluded by the drain
    /// deadline, one answer grace per phase, the persist deadline and the overrun grace. It
    /// watches for the final outcome, not for the `Stopped` state, which comes before the persist:
    /// a persist that hangs is covered too. Before it exits it logs every item not yet durable.
    pub(super) fn arm_overrun_watchdog(&self, within: std::time::Duration) {
        // Only when the runner owns the process's exit, as for the drop guard.
        if !self.config.owns_process_exit {
            return;
        }
        let limit = self.config.overrun_limit(within);
        let status = self.status.subscribe();
        let awaiting = self.awaiting.clone();
        let code = i32::from(self.config.exit_codes.unexpected);
        let pending = self.pending.clone();
        let store = self.store.clone();
        let own = self.own;
        let spawned = std::thread::Builder::new()
            .name("planned-stop-overrun".into())
            .spawn(move || {
                std::thread::sleep(limit);
                let (concluded, state, outcome) = {
                    let now = status.borrow();
                    (now.exit_code.is_some(), now.state, now.outcome.clone())
                };
                if concluded {
                    return;
                }
                let unanswered: Vec<String> = match awaiting.lock() {
                    Ok(a) => a.values().cloned().collect(),
                    Err(poisoned) => poisoned.into_inner().values().cloned().collect(),
                };
                tracing::error!(
                    limit_ms = limit.as_millis() as u64,
                    ?state,
                    ?unanswered,
                    code,
                    "the stop overran its drain deadline, persist deadline and grace (is \
                     something blocking the event loop?); exiting so the stop cannot hang"
                );
                log_pending(&pending);
                // The watchdog's end is an outcome of its own: the stopper reports that the
                // process ended itself (unexpectedly), not that it was killed while draining.
                if let Some(accepted) = outcome {
                    let now = Utc::now();
                    let outcome = Outcome {
                        phase: Phase::Overrun,
                        finished_at: Some(now),
                        exit_code: Some(code),
                        ..(*accepted).clone()
                    };
                    if let Err(e) = store.write_outcome(&outcome) {
                        tracing::warn!(error = %ErrorChain(&e), "cannot write the overrun outcome");
                    }
                }
                if let Err(e) = store.remove_presence(&own) {
                    tracing::warn!(error = %ErrorChain(&e), "cannot remove the presence file");
                }
                process_end::end_forced(code, None);
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
/// the `System`'s exit (`owns_process_exit`, the default).
impl Drop for RunnerActor {
    fn drop(&mut self) {
        // Also while unwinding: a runner that panicked has stopped deciding anything, and a
        // process whose runner is gone must not go on ignoring stops or exit 0.
        if self.lifecycle.state() == RunnerState::Stopped {
            return;
        }
        if !self.config.owns_process_exit {
            // Nothing acts on a marker any more: stop announcing that something does.
            self.withdraw_presence();
            return;
        }
        self.abort(
            "the actix System stopped (or main returned) before the planned-stop runner \
             finished; exiting with the unexpected code. Let the runner stop the System, or await \
             ServiceHandle::stopped() in main, and disable other signal handlers \
             (HttpServer::disable_signals, or planned_stop::web::serve)",
        );
    }
}

impl RunnerActor {
    /// Checks every [`SYSTEM_CHECK`] that the `System` is still running: `System::stop` (from a
    /// handler, from actix-server's own signal handling with `system_exit`) does not end a `main`
    /// that runs it with `block_on`, which would go on with its arbiters stopped — serving
    /// nothing, watching no marker's outcome through — until killed.
    pub(super) fn check_system(&self, ctx: &mut Context<Self>) {
        if !self.config.owns_process_exit {
            return;
        }
        ctx.run_interval(SYSTEM_CHECK, |act, _| {
            if act.lifecycle.state() == RunnerState::Stopped {
                return;
            }
            // The System's own arbiter takes no more work once the System was told to stop.
            let running = System::try_current().is_some_and(|s| s.arbiter().spawn(async {}));
            if !running {
                act.abort(
                    "the actix System was stopped (System::stop, or a server's own signal \
                     handling) before the planned-stop runner finished; exiting with the \
                     unexpected code. Stop through the runner (ServiceHandle::request_stop) and \
                     leave signals to it",
                );
            }
        });
    }

    /// Ends the process with the unexpected code before the runner finished: an `aborted`
    /// outcome, the pending items in the log, the presence withdrawn.
    fn abort(&mut self, why: &str) -> ! {
        let code = i32::from(self.config.exit_codes.unexpected);
        let state = self.lifecycle.state();
        tracing::error!(?state, code, "{why}");
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
            drain: None,
            action: self
                .drain
                .as_ref()
                .map(|run| run.requester.action)
                .unwrap_or_default(),
            successor: None,
            note: None,
        };
        if let Err(e) = self.store.write_outcome(&outcome) {
            tracing::warn!(error = %ErrorChain(&e), "cannot write the aborted outcome");
        }
        log_pending(&self.pending);
        self.withdraw_presence();
        process_end::end_forced(code, None)
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

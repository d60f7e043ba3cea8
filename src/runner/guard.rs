//! The guards behind "a planned stop exits 0 and nothing else does, and no stop hangs", armed
//! when the runner owns the process's exit (`owns_process_exit`, the default). Only the
//! overrun watchdog ends the process before `main` returns; the others record and resolve:
//!
//! - the **drop guard**: a runner dropped before its stop concluded writes `aborted`; the exit
//!   handler keeps the unexpected code once `main` has returned (never 0);
//! - the **System check**: a `System` stopped by someone else while `main` runs it with
//!   `block_on` concludes the stop as `aborted` (the exit grace ends a `main` that never returns);
//! - the **overrun watchdog**: a plain OS thread that ends a drain past all its deadlines with
//!   the unexpected code, after writing an `overrun` outcome and naming who had not answered.

use super::{RunnerActor, process_end};
use crate::error_chain::ErrorChain;
use crate::lifecycle::{ProcessState, StopCause, StopVerdict};
use crate::outcome::Outcome;
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
                    (now.exit_code().is_some(), now.state, now.outcome.clone())
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
                    let outcome = (*accepted)
                        .clone()
                        .concluded(ProcessState::Overrun, now, code);
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

/// A runner dropped before its stop concluded: its `System` ended (`main` returned or panicked,
/// the `System` was stopped elsewhere) or the runner itself panicked. Nothing decides stops any
/// more, so it records an `aborted` outcome, logs what it knows and withdraws its presence. It
/// never ends the process: `main`'s own error or panic is printed as std prints it, and once
/// `main` has returned the exit handler keeps the unexpected code (armed only when the runner
/// owns the process's exit, `owns_process_exit`, the default).
impl Drop for RunnerActor {
    fn drop(&mut self) {
        if self.lifecycle.state() == ProcessState::Stopped
            || self.status.borrow().exit_code().is_some()
        {
            return;
        }
        if !self.config.owns_process_exit {
            // Nothing acts on a marker any more: stop announcing that something does.
            self.withdraw_presence();
            return;
        }
        let why = if std::thread::panicking() {
            "the planned-stop runner is dropped by a panic before its stop concluded"
        } else {
            "the planned-stop runner is dropped before its stop concluded (its actix System \
             ended)"
        };
        let code = self.abort(why);
        process_end::aborted(code);
    }
}

impl RunnerActor {
    /// Checks every [`SYSTEM_CHECK`] that the `System` is still running: `System::stop` (from a
    /// handler, from actix-server's own signal handling with `system_exit`) does not end a `main`
    /// that runs it with `block_on`, which would go on with its arbiters stopped — serving
    /// nothing, watching no marker — until killed. The runner concludes the stop as `aborted`:
    /// [`crate::ServiceHandle::stopped`] resolves to the unexpected code, and a `main` that does
    /// not return within the exit grace is ended with it.
    pub(super) fn check_system(&self, ctx: &mut Context<Self>) {
        if !self.config.owns_process_exit {
            return;
        }
        ctx.run_interval(SYSTEM_CHECK, |act, ctx| {
            if act.lifecycle.state() == ProcessState::Stopped {
                return;
            }
            // The System's own arbiter takes no more work once the System was told to stop.
            let running = System::try_current().is_some_and(|s| s.arbiter().spawn(async {}));
            if !running {
                let code = act.abort(
                    "the actix System was stopped (by the application, or a server's own signal \
                     handling) before the planned-stop runner finished",
                );
                process_end::concluded(code, None, act.config.exit_grace);
                ctx.stop();
            }
        });
    }

    /// Concludes the stop as `aborted` before the runner finished: the outcome written and
    /// published, the pending items in the log, the presence withdrawn. Returns the unexpected
    /// code the process is to end with.
    fn abort(&mut self, why: &str) -> i32 {
        let code = i32::from(self.config.exit_codes.unexpected);
        let state = self.lifecycle.state();
        tracing::error!(
            ?state,
            code,
            "{why}; the process ends with the unexpected code"
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
        let mut outcome = Outcome::accepted(&self.own, cause, verdict, accepted_at, accepted_at)
            .concluded(ProcessState::Aborted, now, code);
        outcome.request_id = request_id;
        if let Some(run) = &self.drain {
            outcome.action = run.requester.action;
        }
        log_pending(&self.pending);
        // Final: written, published (so `stopped()` resolves) and the presence withdrawn.
        self.publish_outcome(outcome);
        code
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

//! systemd's notification protocol (`sd_notify(3)`), behind the `systemd` cargo feature.
//!
//! Follows the runner's status and tells systemd `READY=1` when running; `STOPPING=1` and a
//! `STATUS=` naming the verdict when the drain starts; `EXTEND_TIMEOUT_USEC=` once a second until
//! the final outcome, each covering the rest of the stop's bound, so a drain longer than
//! `TimeoutStopSec` is honoured while the event loop runs (a wedged one stops renewing, and the
//! overrun watchdog ends it first); a final `STATUS=` with the exit code; and `WATCHDOG=1` every
//! half of `WatchdogSec=`, from the `System`'s own event loop, so a blocked loop stops the
//! heartbeat.
//!
//! Once a restart in place has handed over (the successor sent `MAINPID=`) this process says
//! nothing more: with `NotifyAccess=all` systemd reads any message of the unit as the unit's, and a
//! `STOPPING=1` from the predecessor would stop the successor too. Without `$NOTIFY_SOCKET` every
//! call is a no-op.

use crate::lifecycle::StopVerdict;
use crate::runner::RunnerStatus;
use sd_notify::NotifyState;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How often the drain's timeout extension is renewed.
pub(crate) const EXTEND_EVERY: Duration = Duration::from_secs(1);

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// A successor of a restart in place tells systemd it is the main process now (`MAINPID=`, with
/// `NotifyAccess=all` in the unit), before its predecessor exits: systemd then follows it rather
/// than taking the predecessor's exit for the service's.
pub(crate) fn main_process_now() {
    send(&[NotifyState::MainPid(std::process::id())]);
}

/// The extension to ask for while stopping: what is left of the stop's bound (`bound`, less
/// `elapsed` since the drain began), plus [`EXTEND_EVERY`] for the next renewal's lateness.
fn extension(bound: Duration, elapsed: Duration) -> u32 {
    let left = bound.saturating_sub(elapsed);
    u32::try_from(left.saturating_add(EXTEND_EVERY).as_micros()).unwrap_or(u32::MAX)
}

/// The heartbeat interval for a watchdog of `timeout`: half of it (`sd_watchdog_enabled(3)`
/// recommends sending well within the timeout), never under a millisecond.
pub(crate) fn heartbeat_every(timeout: Duration) -> Duration {
    (timeout / 2).max(Duration::from_millis(1))
}

/// Sends `WATCHDOG=1` from the current actix system's event loop at [`heartbeat_every`] while
/// the process runs, when systemd asked for a watchdog (see the module docs).
pub(crate) fn heartbeat(status: watch::Receiver<RunnerStatus>) {
    let Some(timeout) = sd_notify::watchdog_enabled() else {
        return;
    };
    let every = heartbeat_every(timeout);
    tracing::debug!(
        every_ms = every.as_millis() as u64,
        "feeding systemd's watchdog"
    );
    actix::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        // A late tick (the loop was blocked) is sent once, not in a burst that hides the stall.
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if !speaks_for_unit(&status.borrow()) {
                return;
            }
            send(&[NotifyState::Watchdog]);
        }
    });
}

/// Whether this process still speaks for the unit: not once its stop hands over to a successor
/// of a restart in place, which is the unit's main process from then on.
fn speaks_for_unit(status: &RunnerStatus) -> bool {
    status
        .outcome
        .as_ref()
        .is_none_or(|o| o.successor.is_none())
}

/// Follows `status` on the current actix system and notifies systemd (see the module docs);
/// `after_drain` is how long a stop may take past its drain deadline until the process ends
/// (`RunnerConfig::stop_bound` of no drain).
pub(crate) fn follow(mut status: watch::Receiver<RunnerStatus>, after_drain: Duration) {
    actix::spawn(async move {
        let (mut ready_sent, mut stopping_sent) = (false, false);
        let mut drain = (Duration::ZERO, Instant::now());
        loop {
            let now = status.borrow_and_update().clone();
            if !speaks_for_unit(&now) {
                tracing::debug!("handed over: the successor speaks to systemd from now on");
                return;
            }
            if !now.state.is_starting() && !ready_sent {
                send(&[NotifyState::Ready, NotifyState::Status("running")]);
                ready_sent = true;
            }
            if now.state.is_stopping() && !stopping_sent {
                let verdict = match now.verdict {
                    Some(StopVerdict::Planned) => "planned",
                    _ => "unexpected",
                };
                let line = format!("draining ({verdict} stop)");
                send(&[NotifyState::Stopping, NotifyState::Status(&line)]);
                stopping_sent = true;
                let length = now
                    .outcome
                    .as_ref()
                    .and_then(|o| (o.drain_deadline - o.accepted_at).to_std().ok());
                let length = length.unwrap_or_default();
                drain = (length.saturating_add(after_drain), Instant::now());
            }
            let stopping = now.state.is_stopping() && now.exit_code().is_none();
            if stopping {
                let (bound, began) = drain;
                send(&[NotifyState::ExtendTimeoutUsec(extension(
                    bound,
                    began.elapsed(),
                ))]);
            }
            // The exit code comes with the final outcome, once the record is persisted.
            if now.state.is_final()
                && let Some(code) = now.exit_code()
            {
                let line = format!("stopped, exit code {code}");
                send(&[NotifyState::Status(&line)]);
                return;
            }
            // Until the final outcome (the drain, then the record's write), renew the extension
            // every second even without a status change.
            if stopping {
                // A timeout only means "renew the extension"; a closed channel ends the follower.
                if let Ok(Err(_)) = tokio::time::timeout(EXTEND_EVERY, status.changed()).await {
                    return;
                }
            } else if status.changed().await.is_err() {
                return;
            }
        }
    });
}

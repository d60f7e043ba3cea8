//! Restart in place, in the runner (`handover` does the process work): a planned restart request
//! starts the successor first, and the drain begins only once the successor says it is ready.
//!
//! Why before the drain, not inside it: until the successor is ready nothing is decided — the
//! process keeps serving and the lifecycle stays `Running`, so a successor that fails leaves it
//! exactly as it was (the stop's latched verdict is never undone). While a hand-over runs, another
//! request waits its turn: it is looked at again if the hand-over fails, and answered by the
//! restart's own outcome if it succeeds (the process is gone; its successor serves).

use super::drain::Requester;
use super::{PlannedStop, RunnerActor};
use crate::handover::{Handover, HandoverError};
use crate::lifecycle::{ProcessState, StopCause, StopVerdict};
use crate::outcome::Outcome;
use crate::schema::StopAction;
use actix::prelude::*;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// How this runner restarts in place: the sockets to hand over and how long a successor has.
pub(crate) type InPlace = Option<(Arc<Handover>, Duration)>;

/// Where a restart in place stands, in one value: what a hand-over under way, a successor that
/// took over and one that ended since each need, and nothing of the others.
#[derive(Debug, Default)]
pub(crate) enum Stage {
    /// No restart under way, none handed over.
    #[default]
    Idle,
    /// The successor is starting: its process group (0 until it is spawned; `None` once a stop
    /// that began meanwhile cancelled it), and whether another request came meanwhile (looked
    /// at again if this hand-over fails).
    Starting {
        group: Option<Arc<AtomicU32>>,
        deferred: bool,
    },
    /// This stop handed over to the successor, as it was when it said it was ready: the final
    /// outcome names it only if it still runs then.
    HandedTo(crate::ProcessIdentity),
    /// The successor ended after its ready: why, for the final outcome's note.
    SuccessorLost(String),
}

impl RunnerActor {
    /// Makes planned restarts start a successor first (`None`: they exit with the restart code).
    pub(crate) fn restart_in_place(&mut self, in_place: InPlace) {
        self.in_place = in_place;
    }

    /// At `ready()`: a restart in place that cannot work as configured — the process listens on
    /// sockets it did not give the crate, which a successor could not bind — is a WARN now, not
    /// a successor that dies at the first deploy. Looked at on a blocking thread.
    pub(super) fn check_restart_in_place(&mut self, ctx: &mut Context<Self>) {
        #[cfg(unix)]
        if let Some((handover, _)) = self.in_place.clone() {
            let count = async move {
                tokio::task::spawn_blocking(move || handover.unoffered_listeners())
                    .await
                    .unwrap_or(0)
            };
            ctx.spawn(count.into_actor(self).map(|n, _, _| {
                if n > 0 {
                    tracing::warn!(listeners = n, "{}", HandoverError::Unoffered(n));
                }
            }));
        }
        #[cfg(not(unix))]
        let _ = ctx;
    }

    /// Takes `stop` for a restart in place (begun now, or kept while one runs): `None` when it
    /// was taken, the request back otherwise.
    pub(super) fn take_for_restart(
        &mut self,
        stop: PlannedStop,
        ctx: &mut Context<Self>,
    ) -> Option<PlannedStop> {
        if let Stage::Starting { deferred, .. } = &mut self.stage {
            *deferred = true;
            return None;
        }
        let restart_here = self.in_place.is_some()
            && stop.action == StopAction::Restart
            && self.lifecycle.state() == ProcessState::Running;
        if !restart_here {
            return Some(stop);
        }
        // Consumed now, as an accepted request is: it cannot be seen again.
        let stop = self.claim().map(|m| PlannedStop::from(&m)).unwrap_or(stop);
        self.begin_handover(stop, ctx);
        None
    }

    fn begin_handover(&mut self, stop: PlannedStop, ctx: &mut Context<Self>) {
        let Some((handover, within)) = self.in_place.clone() else {
            return;
        };
        let starting = Arc::new(AtomicU32::new(0));
        self.stage = Stage::Starting {
            group: Some(starting.clone()),
            deferred: false,
        };
        tracing::info!(
            request_id = stop.request_id.as_deref(),
            within_ms = within.as_millis() as u64,
            "planned restart in place: starting the successor; serving meanwhile"
        );
        self.publish_outcome(self.restart_outcome(&stop, ProcessState::HandingOver, None));
        let started = async move {
            #[cfg(unix)]
            {
                let run = move || {
                    match handover.unoffered_listeners() {
                        0 => {}
                        n => return Err(HandoverError::Unoffered(n)),
                    }
                    let successor = handover.start_successor()?;
                    successor.unless_cancelled(&starting)?.wait_ready(within)
                };
                tokio::task::spawn_blocking(run).await.unwrap_or_else(|e| {
                    Err(HandoverError::EndedBeforeReady {
                        pid: 0,
                        status: format!("the hand-over thread failed: {e}"),
                    })
                })
            }
            #[cfg(not(unix))]
            {
                let _ = (handover, within, starting);
                Err(HandoverError::EndedBeforeReady {
                    pid: 0,
                    status: "restart in place needs Unix".into(),
                })
            }
        };
        ctx.spawn(
            started
                .into_actor(self)
                .map(move |result, actor, ctx| actor.handed_over(stop, result, ctx)),
        );
    }

    /// The successor answered (ready: its pid), or the hand-over failed.
    fn handed_over(
        &mut self,
        stop: PlannedStop,
        result: Result<u32, HandoverError>,
        ctx: &mut Context<Self>,
    ) {
        let deferred = matches!(self.stage, Stage::Starting { deferred: true, .. });
        self.stage = Stage::Idle;
        // A successor that ended right after its ready serves nothing: this process still
        // holds the sockets and has not stopped accepting, so it serves on.
        let result = result.and_then(|pid| {
            crate::ProcessIdentity::of(pid).ok_or(HandoverError::EndedBeforeReady {
                pid,
                status: "it ended right after it said it was ready".into(),
            })
        });
        match result {
            Ok(successor) if self.lifecycle.state() == ProcessState::Running => {
                let pid = successor.pid;
                self.stage = Stage::HandedTo(successor);
                tracing::info!(
                    successor = pid,
                    "the successor is ready: this process stops accepting and drains"
                );
                let step = self.lifecycle.planned_stop();
                let mut requester = Requester::from(stop);
                requester.successor = Some(pid);
                self.act(step, requester, ctx);
            }
            Ok(successor) => {
                // A signal or the application's own request began a stop meanwhile: the stop
                // the operator asked for wins over the restart under way, and its outcome names
                // no successor.
                let pid = successor.pid;
                tracing::warn!(
                    successor = pid,
                    "a stop began while the successor started: the successor is stopped"
                );
                #[cfg(unix)]
                if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
                }
            }
            // A stop began meanwhile: its own outcome stands, not overwritten by this one.
            Err(e) if self.lifecycle.state() != ProcessState::Running => {
                tracing::warn!(error = %e, "the restart in place did not happen; a stop is under way");
            }
            Err(e) => {
                tracing::warn!(error = %e, "the restart in place did not happen; still serving");
                let outcome =
                    self.restart_outcome(&stop, ProcessState::RestartFailed, Some(e.to_string()));
                self.publish_outcome(outcome);
                if deferred {
                    self.retry_deferred(ctx);
                }
            }
        }
    }

    /// A stop begins while a successor is starting: the successor is stopped (SIGTERM), so it
    /// does not outlive the process that was to hand over to it.
    pub(super) fn stop_starting_successor(&mut self) {
        let Stage::Starting { group, .. } = &mut self.stage else {
            return;
        };
        let Some(starting) = group.take() else {
            return;
        };
        // Not spawned yet (0): the hand-over stops it as soon as it is (`unless_cancelled`).
        let group = starting.swap(
            crate::handover::CANCELLED,
            std::sync::atomic::Ordering::SeqCst,
        );
        tracing::warn!(
            successor_group = group,
            "a stop began while the successor started: it is stopped"
        );
        #[cfg(unix)]
        if group != 0 {
            crate::handover::end_group(group, rustix::process::Signal::TERM);
        }
    }

    /// After a failed hand-over: a request that came meanwhile is acted on now, if it is still in
    /// the slot (the one this hand-over claimed is gone, and is not acted on twice).
    fn retry_deferred(&mut self, ctx: &mut Context<Self>) {
        let Some(marker) = self.claim() else {
            return;
        };
        let stop = PlannedStop::from(&marker);
        if stop.action == StopAction::Restart {
            return self.begin_handover(stop, ctx);
        }
        let step = self.lifecycle.planned_stop();
        self.act(step, Requester::from(stop), ctx);
    }

    fn restart_outcome(
        &self,
        stop: &PlannedStop,
        state: ProcessState,
        note: Option<String>,
    ) -> Outcome {
        let mut outcome = self.planned_outcome(stop, state);
        outcome.finished_at = (state == ProcessState::RestartFailed).then_some(outcome.accepted_at);
        outcome.action = StopAction::Restart;
        outcome.note = note;
        outcome
    }

    /// The outcome of the planned stop `stop` a marker asked for, in `state` from now: held
    /// until ready, or handing over to a successor.
    pub(super) fn planned_outcome(&self, stop: &PlannedStop, state: ProcessState) -> Outcome {
        let now = self.clock.now();
        let mut outcome =
            Outcome::accepted(&self.own, StopCause::Marker, StopVerdict::Planned, now, now);
        outcome.state = state;
        outcome.request_id = stop.request_id.clone();
        outcome.action = stop.action;
        outcome
    }
}

//! The answer to each way a wait can end: kind, exit code, words for a person and fields for a
//! script — one function per answer that needs more than a line, so `run` stays a sequence of
//! steps.

use super::report::{self, describe};
use super::{StopArgs, Target};
use crate::{
    EXIT_GONE_UNKNOWN, EXIT_KILLED_WHILE_DRAINING, EXIT_NOT_ACCEPTED, EXIT_NOT_CLEAN, EXIT_OK,
    EXIT_RECORD_LOST, EXIT_STILL_DRAINING, EXIT_STOPPED_STILL_ALIVE, EXIT_UNEXPECTED,
};
use planned_stop::ProcessState;
use planned_stop::marker::{MarkerStore, StopAction};
use planned_stop::stopper::{DrainSummary, Outcome, WaitOutcome};
use serde_json::json;

/// What the stopper says: the outcome's kind, its exit code, a sentence, and the JSON fields.
pub(super) struct Answer {
    pub(super) kind: &'static str,
    pub(super) code: u8,
    pub(super) text: String,
    pub(super) extra: serde_json::Value,
}

impl From<(&'static str, u8, String, serde_json::Value)> for Answer {
    fn from((kind, code, text, extra): (&'static str, u8, String, serde_json::Value)) -> Answer {
        Answer {
            kind,
            code,
            text,
            extra,
        }
    }
}

/// The answer to `outcome`, the way this wait ended.
pub(super) fn answer(
    args: &StopArgs,
    store: &MarkerStore,
    requested: &Target,
    outcome: &WaitOutcome,
) -> Answer {
    let answer: (&'static str, u8, String, serde_json::Value) = match outcome {
        WaitOutcome::StoppedPlanned { exit_code, outcome }
            if args.restart && outcome.action != StopAction::Restart =>
        {
            report::not_restarted(args, *exit_code, outcome)
        }
        WaitOutcome::StoppedPlanned { exit_code, outcome }
            if !args.restart && outcome.action == StopAction::Restart =>
        {
            report::restarted_instead(args, *exit_code, outcome)
        }
        WaitOutcome::StoppedPlanned { exit_code, outcome } => {
            stopped_planned(args, *exit_code, outcome, requested.request_id.as_deref())
        }
        WaitOutcome::InProgress { outcome } if outcome.state == ProcessState::Held => (
            "held",
            EXIT_NOT_ACCEPTED,
            format!(
                "process {} saw the stop at {} but holds it: it has not declared itself ready \
                 (it drains once ready)",
                args.pid(),
                outcome.accepted_at
            ),
            json!({ "held_since": outcome.accepted_at }),
        ),
        WaitOutcome::InProgress { outcome } if outcome.state == ProcessState::HandingOver => {
            report::still_handing_over(args, outcome)
        }
        WaitOutcome::InProgress { outcome } => (
            "still_draining",
            EXIT_STILL_DRAINING,
            format!(
                "process {} accepted the stop at {} and was still draining (deadline {})",
                args.pid(),
                outcome.accepted_at,
                outcome.drain_deadline
            ),
            json!({ "accepted_at": outcome.accepted_at, "drain_deadline": outcome.drain_deadline }),
        ),
        WaitOutcome::NotAccepted => not_accepted(args, store, requested),
        WaitOutcome::RestartFailed { outcome } => report::restart_failed(args, outcome),
        ended => ended_otherwise(args, store, ended),
    };
    answer.into()
}

/// The target ended, but not as planned and recorded: unexpectedly, without an outcome, killed
/// while draining, its record lost; or it finished its stop and lives on.
fn ended_otherwise(
    args: &StopArgs,
    store: &MarkerStore,
    outcome: &WaitOutcome,
) -> (&'static str, u8, String, serde_json::Value) {
    match outcome {
        WaitOutcome::StoppedUnexpectedly { exit_code, outcome } => (
            "stopped_unexpectedly",
            EXIT_UNEXPECTED,
            format!(
                "process {} stopped, but not as planned ({})",
                args.pid(),
                match exit_code {
                    Some(c) => format!("exit code {c}"),
                    None => "it left no outcome: killed or crashed?".to_owned(),
                }
            ),
            json!({
                "exit_code": exit_code,
                "verdict": outcome.as_ref().map(|o| o.verdict),
                "drain": outcome.as_ref().and_then(|o| o.drain.clone()),
            }),
        ),
        WaitOutcome::StoppedStillAlive { outcome } => (
            "stopped_still_alive",
            EXIT_STOPPED_STILL_ALIVE,
            format!(
                "process {} finished its stop ({}, exit code {}) but is still alive: its runner \
                 does not own the process's end (owns_process_exit(false)) and its main has not \
                 returned, or it is stuck on the way out",
                args.pid(),
                crate::word(&outcome.state),
                outcome.exit_code.map_or("?".to_owned(), |c| c.to_string())
            ),
            json!({ "phase": outcome.state, "exit_code": outcome.exit_code, "verdict": outcome.verdict }),
        ),
        WaitOutcome::GoneWithoutOutcome => (
            "gone_outcome_unknown",
            EXIT_GONE_UNKNOWN,
            format!(
                "process {} is gone and left no outcome: it is not a planned-stop service watching \
                 {}, or it was killed before it accepted the stop",
                args.pid(),
                store.dir().display()
            ),
            json!({}),
        ),
        WaitOutcome::KilledWhileDraining { outcome } => (
            "killed_while_draining",
            EXIT_KILLED_WHILE_DRAINING,
            format!(
                "process {} accepted the stop at {} and ended without its final outcome: killed \
                 or crashed before it finished (or it could not write the outcome); whether its \
                 unfinished work was recorded is unknown here (`planned-stop records list` shows \
                 what is waiting)",
                args.pid(),
                outcome.accepted_at
            ),
            json!({ "accepted_at": outcome.accepted_at, "verdict": outcome.verdict }),
        ),
        WaitOutcome::RecordLost { exit_code, outcome } => (
            "record_lost",
            EXIT_RECORD_LOST,
            format!(
                "process {} stopped (exit code {}), but could not record its unfinished work: \
                 the items are in its log (stderr, an ERROR line with `items`); resubmit them",
                args.pid(),
                exit_code.map_or("?".to_owned(), |c| c.to_string())
            ),
            json!({
                "exit_code": exit_code,
                "verdict": outcome.verdict,
                "cause": outcome.cause,
                "drain": outcome.drain,
            }),
        ),
        // A kind of answer this build's library knows and this table does not: never success.
        other => (
            "unknown",
            EXIT_UNEXPECTED,
            format!("process {}: {other:?}", args.pid()),
            json!({}),
        ),
    }
}

/// The target stopped as planned: on this request or another one, spilled, restarted in
/// place, clean or not (13 with `--require-clean`).
fn stopped_planned(
    args: &StopArgs,
    exit_code: i32,
    outcome: &Outcome,
    request_id: Option<&str>,
) -> (&'static str, u8, String, serde_json::Value) {
    // Racing stoppers: the target accepted one request; say whose.
    // Following a stop under way (--wait-only), whichever request it was is ours.
    let own = args.wait_only || planned_stop::stopper::is_own_request(outcome, request_id);
    // An outcome without a summary (an earlier version) is not known to be lossy.
    let clean = outcome.drain.as_ref().is_none_or(DrainSummary::is_clean);
    let mut lossy = match outcome.drain.as_ref().filter(|_| !clean) {
        Some(drain) => format!("; the drain was not clean: {}", describe(drain)),
        None => String::new(),
    };
    // Why a restart in place ended with the restart code after all (its successor ended).
    if let Some(note) = outcome.note.as_deref().filter(|_| own) {
        lossy = format!("; {note}{lossy}");
    }
    (
        "stopped_planned",
        if clean || !args.require_clean {
            EXIT_OK
        } else {
            EXIT_NOT_CLEAN
        },
        if own && outcome.spilled {
            format!(
                "process {} stopped as planned (exit code {exit_code}); its record store \
                 was unreachable, so its unfinished work is kept on its host until its \
                 next start there pushes it",
                args.pid()
            )
        } else if let (true, Some(successor)) = (own, outcome.successor) {
            format!(
                "process {} restarted in place: its successor, pid {successor}, serves \
                 from the same sockets, and it stopped as planned (exit code {exit_code})",
                args.pid()
            )
        } else if own {
            format!(
                "process {} stopped as planned (exit code {exit_code})",
                args.pid()
            )
        } else if let Some(other) = outcome.request_id.as_deref() {
            format!(
                "process {} stopped as planned (exit code {exit_code}) on another stop \
                 request, {other}, not this one",
                args.pid(),
            )
        } else {
            format!(
                "process {} stopped as planned (exit code {exit_code}) on a signal or \
                 its application's own request, not on this stop request",
                args.pid(),
            )
        } + &lossy,
        json!({
            "exit_code": exit_code,
            "verdict": outcome.verdict,
            "cause": outcome.cause,
            "accepted_request_id": outcome.request_id,
            "own_request": own,
            "spilled": outcome.spilled,
            "clean": clean,
            "drain": outcome.drain,
            "successor": outcome.successor,
            "note": outcome.note,
        }),
    )
}

/// The target still runs and has not accepted: never announced watching, nothing asked of it
/// (`--wait-only`), a `--no-trigger` marker waiting for its signal, or a loop that does not act.
fn not_accepted(
    args: &StopArgs,
    store: &MarkerStore,
    requested: &Target,
) -> (&'static str, u8, String, serde_json::Value) {
    let (pid, dir) = (args.pid(), store.dir().display());
    let text = if !requested.watching && !store.is_watched_by(&requested.target) {
        format!(
            "process {pid} is still running and has not accepted the stop; it never announced \
             that it watches {dir}: is it a planned-stop service watching this directory?"
        )
    } else if args.wait_only {
        format!(
            "process {pid} is running and no stop is under way: nothing was requested of it \
             (--wait-only follows a stop another stopper asked for)"
        )
    } else if args.no_trigger && !requested.signalled {
        format!(
            "process {pid} is still running: it watches {dir}, and a --no-trigger marker waits \
             for a signal that follows it"
        )
    } else {
        format!(
            "process {pid} is still running and has not accepted the stop, though it watches \
             {dir}: is its event loop blocked? (`planned-stop inspect` shows what it decides \
             about the marker)"
        )
    };
    ("not_accepted", EXIT_NOT_ACCEPTED, text, json!({}))
}

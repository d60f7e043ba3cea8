//! What `planned-stop stop` tells its caller: each ending as a line for a person or an event for
//! a script, and the kill at the deadline.

use super::StopArgs;
use crate::{
    EXIT_FORCED_AT_DEADLINE, EXIT_GONE, EXIT_KILLED_AT_DEADLINE, EXIT_NOT_CLEAN, EXIT_OK,
    EXIT_REFUSED, EXIT_USAGE, chain, emit,
};
use planned_stop::ProcessState;
use planned_stop::marker::{MarkerStore, StopAction};
use planned_stop::stopper::{self, DrainSummary, StopperError, WaitOutcome};
use serde_json::json;
use std::time::Duration;

/// `--kill`: the target is still running at the deadline; force its drain (it records what is
/// handed back and ends), and end it with SIGKILL, as systemd does when TimeoutStopSec runs out,
/// only if it still runs after that; say which.
pub(super) fn kill_at_deadline(
    args: &StopArgs,
    store: &MarkerStore,
    target: &planned_stop::ProcessIdentity,
    was: &str,
    mut extra: serde_json::Value,
) -> u8 {
    // First the drain is forced, so what the participants hand back is still recorded; only a
    // target that still runs after that is killed.
    match stopper::force(store, target, FORCE_GRACE) {
        Ok(ended) if !ended.is_running() => return forced_at_deadline(args, was, &ended, extra),
        Ok(_) => {}
        Err(e) => return report_error(args, e),
    }
    extra["forced"] = json!(true);
    match stopper::kill(target) {
        Ok(true) => {}
        Ok(false) => {
            // Gone between the deadline and the kill: what it left says the rest.
            let after = stopper::wait(store, target, Duration::ZERO, |_, _| {});
            extra["after"] = json!(format!("{after:?}"));
        }
        Err(e) => return report_error(args, e),
    }
    let gone = stopper::wait(store, target, Duration::from_secs(5), |_, _| {});
    let outcome = store.read_outcome(target.pid).filter(|o| o.is_from(target));
    extra["was"] = json!(was);
    extra["phase"] = json!(outcome.as_ref().map(|o| o.state));
    let alive = gone.is_running() || matches!(gone, WaitOutcome::StoppedStillAlive { .. });
    extra["gone"] = json!(!alive);
    report(
        args,
        "killed_at_deadline",
        EXIT_KILLED_AT_DEADLINE,
        format!(
            "process {} was still running at the deadline ({was}), and {}s after its drain was \
             forced; ended with SIGKILL (--kill): work it had not recorded is lost",
            args.pid(),
            FORCE_GRACE.as_secs()
        ),
        extra,
    );
    EXIT_KILLED_AT_DEADLINE
}

/// How long a target whose drain `--kill` forced has to end before it is killed: the forced
/// drain still persists its record (milliseconds, unless the store hangs).
const FORCE_GRACE: Duration = Duration::from_secs(5);

/// `--kill`'s first step worked: the target, still running at the deadline, ended once its
/// drain was forced. What it recorded and how it ended come from its outcome.
fn forced_at_deadline(
    args: &StopArgs,
    was: &str,
    ended: &WaitOutcome,
    mut extra: serde_json::Value,
) -> u8 {
    let outcome = match ended {
        WaitOutcome::StoppedPlanned { outcome, .. }
        | WaitOutcome::StoppedStillAlive { outcome }
        | WaitOutcome::KilledWhileDraining { outcome }
        | WaitOutcome::RecordLost { outcome, .. } => Some(outcome),
        WaitOutcome::StoppedUnexpectedly { outcome, .. } => outcome.as_ref(),
        _ => None,
    };
    extra["was"] = json!(was);
    extra["forced"] = json!(true);
    extra["phase"] = json!(outcome.map(|o| o.state));
    extra["exit_code"] = json!(outcome.and_then(|o| o.exit_code));
    extra["drain"] = json!(outcome.and_then(|o| o.drain.as_ref()));
    let ended = match outcome.and_then(|o| o.exit_code) {
        Some(code) => format!(
            "it ended with exit code {code}: what it handed back is recorded, work its \
             participants had not handed back is lost"
        ),
        // A program that is not a planned-stop service ends on a Ctrl-C without an outcome.
        None => "it ended without a final outcome (not a planned-stop service, or it could not \
                 write one): nothing of its work is known to be recorded"
            .to_owned(),
    };
    report(
        args,
        "forced_at_deadline",
        EXIT_FORCED_AT_DEADLINE,
        format!(
            "process {} was still running at the deadline ({was}); its drain was forced (--kill's \
             first step) and {ended}",
            args.pid()
        ),
        extra,
    );
    EXIT_FORCED_AT_DEADLINE
}

/// What made a drain not clean, in words.
pub(super) fn describe(drain: &DrainSummary) -> String {
    let mut parts = Vec::new();
    if !drain.unanswered.is_empty() {
        parts.push(format!(
            "no answer from {} (their in-memory work is unknown)",
            drain.unanswered.join(", ")
        ));
    }
    if drain.forced {
        parts.push("forced".to_owned());
    }
    if !drain.notes.is_empty() {
        parts.push(drain.notes.join("; "));
    }
    if parts.is_empty() {
        parts.push(
            "a participant answered after its phase had ended (its deadline and answer grace)"
                .to_owned(),
        );
    }
    parts.join("; ")
}

/// The warning for a target that has not announced watching the directory.
pub(super) fn not_watching(args: &StopArgs, store: &MarkerStore) -> String {
    if let Some(path) = store.unreadable_announcement(args.pid()) {
        return format!(
            "cannot tell whether process {pid} watches {dir}: {path} cannot be read by this user \
             (permission denied), so neither can this stopper read the outcome; run it as the \
             service's user or as root",
            pid = args.pid(),
            dir = store.dir().display(),
            path = path.display(),
        );
    }
    format!(
        "process {pid} has not announced that it watches {dir} (there is no {presence} of it): \
         if --dir is wrong or it is not a planned-stop service, nothing reads this marker, which \
         expires unread. A service still starting, or a program that reads the markers \
         without announcing (a port of the protocol), reads it anyway",
        pid = args.pid(),
        dir = store.dir().display(),
        presence = store.presence_path(args.pid()).display(),
    )
}

/// A target that is gone but left a final outcome here (and, with `--start`, has that
/// fingerprint): a repeated stop answers what happened, as `systemctl stop` does for a stopped
/// unit — 0 when it stopped as planned, and as the request asks: a `--restart` toward a target
/// that stopped for good did not restart anything (5), and `--require-clean` after a drain that
/// was not clean still says so (13).
pub(super) fn already_stopped(
    args: &StopArgs,
    store: &MarkerStore,
) -> Option<(&'static str, u8, String, serde_json::Value)> {
    let outcome = store.read_outcome(args.pid()).filter(|o| {
        o.pid == args.pid()
            && o.state.is_final()
            && !planned_stop::ProcessIdentity::is_running(o.pid, o.start)
            && args.start.is_none_or(|start| start == o.start)
    })?;
    let clean = outcome.drain.as_ref().is_none_or(DrainSummary::is_clean);
    let extra = json!({
        "exit_code": outcome.exit_code,
        "verdict": outcome.verdict,
        "phase": outcome.state,
        "finished_at": outcome.finished_at,
        "accepted_request_id": outcome.request_id,
        "action": outcome.action,
        "clean": clean,
    });
    let pid = args.pid();
    let code = outcome.exit_code.unwrap_or_default();
    let planned = outcome.state == ProcessState::Stopped
        && outcome.verdict == planned_stop::StopVerdict::Planned;
    let (kind, exit, text) = if !planned {
        let code = outcome.exit_code.map_or("?".to_owned(), |c| c.to_string());
        let phase = crate::word(&outcome.state);
        let text = format!(
            "process {pid} is gone; its last outcome here says it ended {phase} with exit code {code}"
        );
        ("already_gone", EXIT_GONE, text)
    } else if args.restart && outcome.action != StopAction::Restart {
        let text = format!(
            "process {pid} had already stopped as planned, for good (exit code {code}), not for a \
             restart: nothing restarted it; start the service again"
        );
        ("already_stopped_for_good", EXIT_GONE, text)
    } else if !args.restart && outcome.action == StopAction::Restart {
        let (_, exit, text, _) = restarted_instead(args, code, &outcome);
        (
            "restarted_instead",
            exit,
            format!("{text} (before this request)"),
        )
    } else if args.require_clean && !clean {
        let drain = outcome.drain.as_ref().map(describe).unwrap_or_default();
        let text = format!(
            "process {pid} had already stopped as planned (exit code {code}), but its drain was \
             not clean: {drain}"
        );
        ("already_stopped", EXIT_NOT_CLEAN, text)
    } else {
        let text = format!(
            "process {pid} had already stopped as planned (exit code {code}); nothing to do"
        );
        ("already_stopped", EXIT_OK, text)
    };
    Some((kind, exit, text, extra))
}

/// A `--restart` whose target stopped as planned for good: a stop under way (or a request that
/// raced this one) was accepted, so nothing restarts it. Never a success: the deploy must start
/// the service again.
pub(super) fn not_restarted(
    args: &StopArgs,
    exit_code: i32,
    outcome: &planned_stop::stopper::Outcome,
) -> (&'static str, u8, String, serde_json::Value) {
    let accepted = outcome.request_id.as_deref().map_or_else(
        || "a signal or its own request".to_owned(),
        |id| format!("request {id}"),
    );
    let text = format!(
        "process {} stopped as planned for good (exit code {exit_code}) on {accepted}, which it had accepted before this restart request: it did not restart; start the service again",
        args.pid()
    );
    let extra = json!({
        "exit_code": exit_code,
        "verdict": outcome.verdict,
        "cause": outcome.cause,
        "accepted_request_id": outcome.request_id,
        "action": outcome.action,
        "clean": outcome.drain.as_ref().is_none_or(DrainSummary::is_clean),
        "drain": outcome.drain,
    });
    ("not_restarted", crate::EXIT_NOT_RESTARTED, text, extra)
}

/// A plain stop whose target restarted instead, on a restart request it had accepted first: the
/// process is gone, but the service is not stopped. Never a success for a stop.
pub(super) fn restarted_instead(
    args: &StopArgs,
    exit_code: i32,
    outcome: &planned_stop::stopper::Outcome,
) -> (&'static str, u8, String, serde_json::Value) {
    let accepted = outcome.request_id.as_deref().unwrap_or("a restart request");
    let how = match outcome.successor {
        Some(successor) => format!("its successor, pid {successor}, serves from the same sockets"),
        None => format!("it exited {exit_code} for its supervisor to start it again"),
    };
    let text = format!(
        "process {} restarted instead of stopping, on {accepted}, which it had accepted first: \
         {how}; stop that one if the service must stop",
        args.pid()
    );
    let extra = json!({
        "exit_code": exit_code,
        "verdict": outcome.verdict,
        "accepted_request_id": outcome.request_id,
        "action": outcome.action,
        "successor": outcome.successor,
    });
    (
        "restarted_instead",
        crate::EXIT_RESTARTED_INSTEAD,
        text,
        extra,
    )
}

/// A restart in place of this request that did not happen: the target keeps serving.
pub(super) fn restart_failed(
    args: &StopArgs,
    outcome: &planned_stop::stopper::Outcome,
) -> (&'static str, u8, String, serde_json::Value) {
    let why = outcome.note.as_deref().unwrap_or("no reason given");
    let text = format!(
        "process {} did not restart: {why}; it did not stop and keeps serving",
        args.pid()
    );
    let extra = json!({ "note": outcome.note, "action": outcome.action });
    ("restart_failed", crate::EXIT_RESTART_FAILED, text, extra)
}

/// A restart in place still handing over at the deadline.
pub(super) fn still_handing_over(
    args: &StopArgs,
    outcome: &planned_stop::stopper::Outcome,
) -> (&'static str, u8, String, serde_json::Value) {
    let text = format!(
        "process {} began a restart in place at {} and its successor was not ready yet; it \
         keeps serving until the successor is, or gives the restart up",
        args.pid(),
        outcome.accepted_at
    );
    let extra = json!({ "since": outcome.accepted_at });
    (
        "still_handing_over",
        crate::EXIT_STILL_DRAINING,
        text,
        extra,
    )
}

/// When a stopper gives up while its marker is still live (not accepted, or held), says so: the
/// target stops as planned if it reads the marker before it expires, unless it is withdrawn.
pub(super) fn marker_left_live(
    args: &StopArgs,
    outcome: &WaitOutcome,
    live_until: Option<chrono::DateTime<chrono::Utc>>,
    text: String,
) -> (String, Option<chrono::DateTime<chrono::Utc>>) {
    let gave_up = match outcome {
        WaitOutcome::NotAccepted => true,
        WaitOutcome::InProgress { outcome } => outcome.state == ProcessState::Held,
        _ => false,
    };
    match live_until.filter(|until| gave_up && *until > chrono::Utc::now()) {
        Some(until) => {
            let place = match (&args.layout.dir, &args.layout.marker) {
                (Some(dir), _) => format!("--dir {} --pid {}", dir.display(), args.pid()),
                (None, Some(file)) => format!("--marker {}", file.display()),
                _ => String::new(),
            };
            let text = format!(
                "{text}; its marker stays live until {until}: the process still stops as planned \
                 if it reads it by then (`planned-stop clear {place}` withdraws it)"
            );
            (text, Some(until))
        }
        None => (text, None),
    }
}

pub(super) fn report_error(args: &StopArgs, error: StopperError) -> u8 {
    let (kind, code) = match &error {
        StopperError::NotRunning { .. } => ("already_gone", EXIT_GONE),
        StopperError::WrongIdentity { .. } => ("refused", EXIT_REFUSED),
        StopperError::NotWatching { .. } => ("refused_not_watching", EXIT_REFUSED),
        StopperError::AnnouncementUnreadable { .. } => ("refused_unreadable", EXIT_REFUSED),
        StopperError::Signal { .. } => ("signal_failed", EXIT_USAGE),
        _ => ("error", EXIT_USAGE),
    };
    if args.json {
        report(
            args,
            kind,
            code,
            chain(&error),
            json!({ "request_id": args.request_id }),
        );
    } else {
        eprintln!("planned-stop: {}", chain(&error));
    }
    code
}

pub(super) fn report(
    args: &StopArgs,
    kind: &str,
    code: u8,
    text: String,
    extra: serde_json::Value,
) {
    if args.json {
        // Every answer names the request (cli.md): the one sent, or the one asked for (an
        // answer given without sending one, such as `already_stopped`).
        let mut out = json!({ "outcome": kind, "pid": args.pid, "code": code, "message": text,
            "request_id": args.request_id });
        if let (Some(out), serde_json::Value::Object(extra)) = (out.as_object_mut(), extra) {
            out.extend(extra);
        }
        emit(out);
    } else {
        emit(text);
    }
}

//! `planned-stop stop`: write the marker for one process, optionally signal it, wait and report.

mod answer;
mod report;
mod target;

use super::{EXIT_GONE, EXIT_OK, EXIT_USAGE, LayoutArgs, chain, fail, path_json};
use answer::Answer;
use clap::Args;
use planned_stop::ProcessState;
use planned_stop::marker::{MarkerStore, StopAction};
use planned_stop::stopper::{self, StopOptions, StopperError, WaitOutcome};
use report::{already_stopped, kill_at_deadline, not_watching, report, report_error};
use serde_json::json;
use std::io::IsTerminal;
use std::time::Duration;
use target::the_target;

/// Arguments of `stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// The process to stop. Without it, the one process that has announced watching the
    /// directory (its start fingerprint is checked as with --start); several is an error, and
    /// with none running the one whose final outcome is the latest here is answered for (a
    /// repeated stop: `already_stopped`). 0, or empty (what systemd prints as the MainPID of a
    /// stopped unit, and expands an unset $MAINPID to), names no process: already gone.
    #[arg(long, value_parser = pid_or_empty)]
    pub pid: Option<u32>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub layout: LayoutArgs,
    /// Why, for the target's logs and stop record.
    #[arg(long)]
    pub reason: Option<String>,
    /// A request id to find this stop by (default: generated).
    #[arg(long)]
    pub request_id: Option<String>,
    /// Wait up to SECS for the target to exit, and report how it went (0: do not wait).
    #[arg(long, value_name = "SECS")]
    pub wait: Option<f64>,
    /// Send SIGTERM after writing the marker (Unix). Refused toward a process that has not
    /// announced watching the directory, unless --signal-anyway.
    #[arg(long)]
    pub signal: bool,
    /// With --signal: send it even to a process that has not announced watching the directory
    /// (one that reads markers without announcing).
    #[arg(long, requires = "signal")]
    pub signal_anyway: bool,
    /// Write a marker the target's watcher leaves alone: it only makes the SIGTERM that follows
    /// planned (systemd ExecStop).
    #[arg(long)]
    pub no_trigger: bool,
    /// Refuse unless the target's start fingerprint is this (guards against a reused pid).
    #[arg(long, value_name = "FINGERPRINT")]
    pub start: Option<u64>,
    /// Accept a marker directory writable by group or others.
    #[arg(long)]
    pub allow_shared_dir: bool,
    /// Create the marker directory (mode 0700) if it does not exist. Without it a missing
    /// directory is an error: a typo in --dir would otherwise stop nobody.
    #[arg(long)]
    pub create_dir: bool,
    /// Ask for a planned restart: the target drains and records as for a stop, then exits with
    /// its restart code (75 by default) so its supervisor starts it again.
    #[arg(long)]
    pub restart: bool,
    /// With --wait: look at the target every 20 ms only, instead of also being told of its exit
    /// by the OS (a pidfd on Linux), which reports the moment it exits.
    #[arg(long)]
    pub no_events: bool,
    /// With --wait: a planned stop whose drain was not clean (a participant never answered or
    /// panicked, requests were cut at a deadline, the stop was forced) exits 13 instead of 0, so
    /// a deploy script can stop on a lossy drain.
    #[arg(long)]
    pub require_clean: bool,
    /// With --wait: write nothing, only follow a stop already requested (after an earlier
    /// `stop --wait` ran out), and report as --wait does.
    /// It sends nothing, so it cannot go with what would be sent (--signal, --restart,
    /// --no-trigger, --reason, --create-dir).
    #[arg(long, requires = "wait", conflicts_with_all = ["signal", "restart", "no_trigger", "reason", "create_dir"])]
    pub wait_only: bool,
    /// With --wait (Unix): the marker asks for a drain that ends before the wait does (so what
    /// the participants hand back is recorded); a target still running at the deadline is forced (Ctrl-C,
    /// repeated: it records what was handed back and ends, `forced_at_deadline`, exit 18), and
    /// ended with SIGKILL, the signal systemd sends when TimeoutStopSec runs out, only if it still
    /// runs 5 s later (`killed_at_deadline`, exit 14: what it had not recorded is lost).
    #[arg(long, requires = "wait")]
    pub kill: bool,
    /// Ask the target to drain within N milliseconds, when that is shorter than its own drain
    /// deadline (pg_ctl's "fast" beside the default "smart"): still drained and recorded, just
    /// sooner; 0 hands back at once what the participants hold. A target of an earlier version
    /// ignores it.
    #[arg(long, value_name = "N", conflicts_with = "wait_only")]
    pub drain_ms: Option<u64>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// A pid, or 0 for an empty value (systemd's unset `$MAINPID`).
fn pid_or_empty(value: &str) -> Result<u32, String> {
    if value.trim().is_empty() {
        return Ok(0);
    }
    value
        .trim()
        .parse()
        .map_err(|_| format!("{value:?} is not a process id"))
}

impl StopArgs {
    /// The target's pid (resolved from the directory's watcher when --pid was not given).
    fn pid(&self) -> u32 {
        self.pid.unwrap_or_default()
    }
}

/// Whom a stop follows: the target, and the request written for it (none with --wait-only).
struct Target {
    target: planned_stop::ProcessIdentity,
    request_id: Option<String>,
    slot: Option<std::path::PathBuf>,
    /// Until when the marker written (if one was) is acted on.
    live_until: Option<chrono::DateTime<chrono::Utc>>,
    signalled: bool,
    watching: bool,
}

/// A usage or set-up error: one JSON object with --json (`"outcome": "error"`), else stderr.
fn fail_stop(args: &StopArgs, message: String) -> u8 {
    if args.json {
        report(
            args,
            "error",
            EXIT_USAGE,
            message,
            json!({ "request_id": args.request_id }),
        );
        EXIT_USAGE
    } else {
        fail(message)
    }
}

/// Said to a stopper that waits for PID 1: in a container the stopper cannot outlive it.
const PID_ONE_WAIT: &str = "the target is process 1 of this PID namespace (a container's main \
     process): its exit ends every process in it, this stopper included, so the answer may never \
     come; the container's exit code is the answer (0 planned, 75 restart, 74 record lost, 1 \
     unexpected)";

/// Runs `stop`; returns the exit code.
pub fn run(args: StopArgs) -> u8 {
    let mut args = args;
    if args.pid == Some(0) {
        // Never passed on: to kill(2), pid 0 is the caller's whole process group.
        let text = "no process has pid 0 (what `systemctl show -p MainPID --value` prints for a \
                    stopped unit): nothing is running to stop";
        report(&args, "already_gone", EXIT_GONE, text.to_owned(), json!({}));
        return EXIT_GONE;
    }
    let store = match open_store(&args) {
        Ok(store) => store,
        Err(e) => return fail_stop(&args, e),
    };
    if args.pid.is_none() {
        match the_target(&store, args.layout.flag()) {
            Ok((pid, start)) => {
                args.pid = Some(pid);
                args.start = args.start.or(Some(start));
            }
            Err(e) => return fail_stop(&args, e),
        }
    }
    // `--wait 0` waits for nothing: the same answer as without `--wait` (it used to report
    // "not accepted" at once, for a target that then stopped as planned).
    let wait = match args.wait.map(Duration::try_from_secs_f64).transpose() {
        Ok(w) => w.filter(|w| !w.is_zero()),
        Err(_) => return fail_stop(&args, "--wait takes a number of seconds".into()),
    };
    let requested = match request_or_follow(&args, &store, wait) {
        Ok(r) => r,
        Err(e @ StopperError::NotRunning { .. }) => {
            return match already_stopped(&args, &store) {
                Some((kind, code, text, extra)) => {
                    report(&args, kind, code, text, extra);
                    code
                }
                None => report_error(&args, e),
            };
        }
        Err(e) => return report_error(&args, e),
    };
    if !requested.watching && !args.json {
        eprintln!("planned-stop: warning: {}", not_watching(&args, &store));
    }
    if wait.is_some() && requested.target.pid == 1 {
        eprintln!("planned-stop: warning: {PID_ONE_WAIT}");
    }
    match wait {
        None => marker_written(&args, &requested),
        Some(timeout) => wait_and_answer(&args, &store, &requested, timeout),
    }
}

/// The marker directory `--dir` or `--marker` names; one that does not exist is refused unless
/// `--create-dir`: no target can be watching it.
fn open_store(args: &StopArgs) -> Result<MarkerStore, String> {
    let layout = args.layout.layout()?;
    let store = MarkerStore::builder(layout)
        .allow_shared_dir(args.allow_shared_dir)
        .create_dir(args.create_dir)
        .open()
        .map_err(|e| chain(&e))?;
    if !store.dir().is_dir() {
        return Err(format!(
            "marker directory {} does not exist: is --dir (or --marker) right? No target can be \
             watching it; --create-dir creates it",
            store.dir().display()
        ));
    }
    Ok(store)
}

/// `--kill`'s first step, for a wait of `wait`: how long the drain the marker asks for may last,
/// so that it ends before the wait does. The participants then hand back at that deadline what
/// a fast stop (`--drain-ms`) would have them hand back, and the target records it, instead of
/// having it cut off by the force at the wait's deadline. The rest of the wait is the target's to
/// record what was handed back, write its outcome and exit: a fifth of it, at least 100 ms and
/// at most 5 s.
///
/// ```text
/// 1 s -> 800 ms, 30 s -> 25 s, 50 ms -> 0
/// ```
pub(crate) fn drain_before_kill(wait: Duration) -> Duration {
    let reserve = (wait / 5).clamp(Duration::from_millis(100), Duration::from_secs(5));
    wait.saturating_sub(reserve)
}

/// What the command line asks the library to write (`wait`: `--wait`'s, when it waits).
fn options(args: &StopArgs, wait: Option<Duration>) -> StopOptions {
    let action = if args.restart {
        StopAction::Restart
    } else {
        StopAction::Stop
    };
    let mut options = StopOptions::new()
        .with_trigger_watcher(!args.no_trigger)
        .with_signal(args.signal)
        .with_signal_unwatched(args.signal_anyway)
        .with_action(action);
    if let Some(reason) = &args.reason {
        options = options.with_reason(reason);
    }
    // The shorter of --drain-ms and, with --kill, the drain that ends before the kill's deadline.
    let before_kill = wait.filter(|_| args.kill).map(drain_before_kill);
    let deadline = match (args.drain_ms.map(Duration::from_millis), before_kill) {
        (Some(asked), Some(kill)) => Some(asked.min(kill)),
        (asked, kill) => asked.or(kill),
    };
    if let Some(deadline) = deadline {
        options = options.with_drain_deadline(deadline);
    }
    if let Some(request_id) = &args.request_id {
        options = options.with_request_id(request_id);
    }
    if let Some(start) = args.start {
        options = options.with_expected_start(start);
    }
    options
}

/// Writes the request (or, with `--wait-only`, takes the target as it is now, writing nothing).
fn request_or_follow(
    args: &StopArgs,
    store: &MarkerStore,
    wait: Option<Duration>,
) -> Result<Target, StopperError> {
    if !args.wait_only {
        return stopper::request(store, args.pid(), &options(args, wait)).map(|r| Target {
            target: r.target,
            request_id: r.marker.request_id,
            slot: Some(r.slot),
            signalled: r.signalled,
            live_until: chrono::TimeDelta::from_std(store.policy().ttl)
                .ok()
                .and_then(|ttl| r.marker.written_at.checked_add_signed(ttl)),
            watching: r.watching,
        });
    }
    match planned_stop::ProcessIdentity::of(args.pid()) {
        Some(target) if args.start.is_none_or(|start| start == target.start) => Ok(Target {
            watching: store.is_watched_by(&target),
            target,
            request_id: None,
            slot: None,
            live_until: None,
            signalled: false,
        }),
        Some(target) => Err(StopperError::WrongIdentity {
            pid: args.pid(),
            expected: args.start.unwrap_or_default(),
            actual: target.start,
        }),
        None => Err(StopperError::NotRunning { pid: args.pid() }),
    }
}

/// Without `--wait`: the marker is written, and that is the answer.
fn marker_written(args: &StopArgs, requested: &Target) -> u8 {
    let slot = requested.slot.as_deref();
    let signalled = if requested.signalled {
        "; SIGTERM sent"
    } else {
        ""
    };
    report(
        args,
        "marker_written",
        EXIT_OK,
        format!(
            "stop requested for process {} ({}){signalled}",
            args.pid(),
            slot.map(|s| s.display().to_string()).unwrap_or_default(),
        ),
        json!({
            "request_id": requested.request_id,
            "slot": slot.map(path_json),
            "signalled": requested.signalled,
            "watching": requested.watching,
        }),
    );
    EXIT_OK
}

/// `--wait`: follows the target to its outcome (a progress line on a terminal), answers it, and
/// with `--kill` ends a target still running at the deadline.
fn wait_and_answer(
    args: &StopArgs,
    store: &MarkerStore,
    requested: &Target,
    timeout: Duration,
) -> u8 {
    let outcome = follow(args, store, requested, timeout);
    let request_id = requested.request_id.as_deref();
    let Answer {
        kind,
        code,
        text,
        mut extra,
    } = answer::answer(args, store, requested, &outcome);
    extra["request_id"] = json!(request_id);
    extra["watching"] = json!(requested.watching);
    // A stopper that gives up leaves its marker live: the target may still stop on it.
    let (text, marker_live) = report::marker_left_live(args, &outcome, requested.live_until, text);
    if let Some(until) = marker_live {
        extra["marker_live_until"] = json!(until);
    }
    // A restart in place still handing over serves on, as asked: --kill ends stops, not that.
    let handing_over = matches!(&outcome, WaitOutcome::InProgress { outcome }
        if outcome.state == ProcessState::HandingOver);
    let still_running = outcome.is_running() && !handing_over;
    if args.kill && still_running {
        return kill_at_deadline(args, store, &requested.target, kind, extra);
    }
    report(args, kind, code, text, extra);
    code
}

/// Waits for the target's answer to this request, with a progress line on a terminal.
fn follow(
    args: &StopArgs,
    store: &MarkerStore,
    requested: &Target,
    timeout: Duration,
) -> WaitOutcome {
    let bar = (!args.json && std::io::stdout().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    });
    let watch = if args.no_events {
        stopper::ExitWatch::Poll
    } else {
        stopper::ExitWatch::Events
    };
    let pid = args.pid();
    let outcome = stopper::wait_for_request(
        store,
        &requested.target,
        requested.request_id.as_deref(),
        timeout,
        watch,
        |progress, elapsed| {
            let Some(bar) = &bar else {
                return;
            };
            let secs = elapsed.as_secs_f64();
            bar.set_message(match progress {
                None => format!("waiting for process {pid} to accept ({secs:.1} s)"),
                Some(ProcessState::Draining) => format!("process {pid} is draining ({secs:.1} s)"),
                Some(ProcessState::Held) => {
                    format!("process {pid} holds the stop until it is ready ({secs:.1} s)")
                }
                Some(ProcessState::HandingOver) => {
                    format!("process {pid} is handing over to its successor ({secs:.1} s)")
                }
                Some(other) => format!("process {pid}: {other:?}"),
            });
        },
    );
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::drain_before_kill;
    use std::time::Duration;

    #[test]
    fn the_drain_before_a_kill_leaves_a_fifth_of_the_wait_within_bounds() {
        let ms = Duration::from_millis;
        assert_eq!(drain_before_kill(ms(1000)), ms(800));
        assert_eq!(
            drain_before_kill(Duration::from_secs(30)),
            Duration::from_secs(25)
        );
        assert_eq!(
            drain_before_kill(Duration::from_secs(3600)),
            Duration::from_secs(3595)
        );
        assert_eq!(drain_before_kill(ms(300)), ms(200), "at least 100 ms left");
        assert_eq!(drain_before_kill(ms(50)), Duration::ZERO);
    }
}

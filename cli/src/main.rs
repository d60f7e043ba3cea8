//! The `planned-stop` command line: argument parsing, output and exit codes, over the
//! `planned-stop` library (see `docs/cli.md`).
//!
//! It is a crate of its own so that the library knows nothing of argument parsing, terminal output
//! or exit codes: an application that depends on the library compiles none of clap, indicatif or
//! tracing-subscriber, and nothing but this crate may speak of flags and verbs.
//!
//! Every verdict it prints comes from the library's one verdict function through its marker store; nothing here
//! decides. Output for people goes to stdout as text, for scripts as JSON (`--json`, and the
//! `serve` lifecycle events); logs go to stderr through `tracing` (`RUST_LOG`).
//!
//! Exit codes, shared by every verb (see `docs/cli.md`):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done: the target stopped as planned, or the marker was written, or the verb did its work |
//! | 1 | the target stopped, but not as planned (`stop --wait`); `serve` stopped unexpectedly |
//! | 2 | usage error, or the marker directory cannot be used |
//! | 3 | the target accepted the stop but was still draining at the deadline |
//! | 4 | the target was still running at the deadline and had not accepted the stop |
//! | 5 | no process with that pid is running (already gone) |
//! | 6 | refused: the process at that pid is not the one expected (`--start`) |
//! | 7 | undecided: the slot exists but could not be read this time (`inspect`) |
//! | 8 | the target exited without any outcome: not a planned-stop service, or killed (`stop --wait`) |
//! | 9 | the target accepted the stop and was killed before it finished (`stop --wait`) |
//! | 10 | the target stopped but could not record its unfinished work (`stop --wait`) |
//! | 11 | no such item in the state directory (`records release`, `records drop`) |
//! | 12 | the target finished its stop but was still alive at the deadline (`stop --wait`) |
//! | 13 | the target stopped as planned, but its drain was not clean (`stop --wait --require-clean`) |
//! | 14 | the target was still running at the deadline and was killed (`stop --wait --kill`) |
//! | 15 | no service of that name ever started with the database (`records --records`) |
//! | 16 | a restart whose target stopped for good instead (`stop --restart --wait`) |
//! | 17 | a restart in place did not happen; the target keeps serving (`stop --restart --wait`) |
//! | 18 | the target was still running at the deadline; its drain was forced and it ended (`stop --wait --kill`) |

#![forbid(unsafe_code)]

mod demo;
mod error_words;
mod records;
mod serve;
mod status;
mod stop;

use chrono::Utc;
use clap::{Args, Parser, Subcommand};
use error_words::chain;
use planned_stop::Layout;
use planned_stop::marker::{Judgement, MarkerStore, Undecided};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit code: done.
pub const EXIT_OK: u8 = 0;
/// Exit code: stopped, but not as planned.
pub const EXIT_UNEXPECTED: u8 = 1;
/// Exit code: bad arguments, or the marker directory cannot be used.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: accepted but still draining at the deadline.
pub const EXIT_STILL_DRAINING: u8 = 3;
/// Exit code: not accepted by the deadline.
pub const EXIT_NOT_ACCEPTED: u8 = 4;
/// Exit code: no such process.
pub const EXIT_GONE: u8 = 5;
/// Exit code: the process at the pid is not the expected one.
pub const EXIT_REFUSED: u8 = 6;
/// Exit code: the slot exists but could not be read this time.
pub const EXIT_UNDECIDED: u8 = 7;
/// Exit code: the target exited without any outcome (not a planned-stop service, or killed).
pub const EXIT_GONE_UNKNOWN: u8 = 8;
/// Exit code: the target accepted the stop and was killed before it finished.
pub const EXIT_KILLED_WHILE_DRAINING: u8 = 9;
/// Exit code: the target stopped but its unfinished work could not be recorded.
pub const EXIT_RECORD_LOST: u8 = 10;
/// Exit code: no such item in the state directory.
pub const EXIT_NO_SUCH_ITEM: u8 = 11;
/// `stop --wait`: the target finished its stop but was still alive at the deadline.
pub const EXIT_STOPPED_STILL_ALIVE: u8 = 12;
/// `stop --wait --require-clean`: the target stopped as planned, but its drain was not clean.
pub const EXIT_NOT_CLEAN: u8 = 13;
/// `stop --wait --kill`: the target was still running at the deadline and was killed.
pub const EXIT_KILLED_AT_DEADLINE: u8 = 14;
/// `records` with `--records`: no service of that name ever started with this database.
pub const EXIT_UNKNOWN_SERVICE: u8 = 15;
/// `stop --restart`: the target stopped for good instead (a stop under way was accepted first).
pub const EXIT_NOT_RESTARTED: u8 = 16;
/// `stop --restart`: a restart in place did not happen (its successor failed); the target serves.
pub const EXIT_RESTART_FAILED: u8 = 17;
/// `stop --wait --kill`: the target was still running at the deadline; its drain was forced (it
/// recorded what was handed back) and it ended without a SIGKILL.
pub const EXIT_FORCED_AT_DEADLINE: u8 = 18;
/// A plain `stop` whose target restarted instead (a restart request it had accepted first): the
/// process is gone, and its successor (or its supervisor's next start) serves.
pub const EXIT_RESTARTED_INSTEAD: u8 = 19;

/// The version and the features this binary was built with (`--version`).
fn version_text() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let features: Vec<&str> = [
            ("systemd", cfg!(feature = "systemd")),
            ("postgres", cfg!(feature = "postgres")),
        ]
        .into_iter()
        .filter_map(|(name, on)| on.then_some(name))
        .collect();
        format!(
            "{} (features: {})",
            env!("CARGO_PKG_VERSION"),
            if features.is_empty() {
                "none".to_owned()
            } else {
                features.join(", ")
            }
        )
    })
}

/// Planned stops for actix services: stop one specific process, on purpose, exactly once.
#[derive(Debug, Parser)]
#[command(name = "planned-stop", version = version_text(), about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the reference actix service (JSON-lines lifecycle events on stdout).
    Serve(serve::ServeArgs),
    /// Ask a running process to stop, on purpose; optionally wait and report how it went.
    Stop(stop::StopArgs),
    /// Print the verdict a process would reach on its marker, without changing anything.
    Inspect(InspectArgs),
    /// List the slots and outcome files of a marker directory with their verdicts.
    Status(StatusArgs),
    /// Remove a slot, whatever it holds.
    Clear(ClearArgs),
    /// List, release or drop the unfinished items in a state directory.
    Records(records::RecordsArgs),
    /// The main job: run the reference service and stop it through every path, with a timeline.
    Demo,
}

/// Where the markers are: `--dir DIR` (one slot per pid) or `--marker FILE` (one shared file).
#[derive(Debug, Clone, Args)]
#[group(required = false, multiple = false)]
pub struct LayoutArgs {
    /// Directory of per-process slots, `DIR/planned-stop-<PID>.json`.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// One marker file shared by all processes (the single-file layout).
    #[arg(long, value_name = "FILE")]
    pub marker: Option<PathBuf>,
}

impl LayoutArgs {
    /// The layout given, or a usage error.
    /// Paths are made absolute, so every message names the directory unambiguously.
    fn layout(&self) -> Result<Layout, String> {
        match (&self.dir, &self.marker) {
            (Some(dir), None) => Ok(Layout::Slots(absolute(dir))),
            (None, Some(file)) => Ok(Layout::SingleFile(absolute(file))),
            _ => Err("give --dir DIR or --marker FILE".to_owned()),
        }
    }

    /// The flag that named the layout, for a message that asks whether it is right.
    fn flag(&self) -> &'static str {
        if self.marker.is_some() {
            "--marker"
        } else {
            "--dir"
        }
    }
}

/// One slot: a slot or marker file, `--dir DIR --pid PID`, or `--marker FILE`.
#[derive(Debug, Args)]
pub struct SlotArgs {
    /// A slot or marker file (instead of `--dir DIR --pid PID`).
    #[arg(value_name = "FILE", conflicts_with_all = ["dir", "marker"])]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub layout: LayoutArgs,
    /// The process whose slot it is (required with `--dir`).
    #[arg(long)]
    pub pid: Option<u32>,
}

/// Arguments of `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub slot: SlotArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub layout: LayoutArgs,
    /// Also show the last stop record and the unfinished items in this state directory.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// Also show the last stop record and the unfinished items in this PostgreSQL record store.
    #[arg(long, value_name = "URL")]
    pub records: Option<String>,
    /// The service name that scopes the items in the database.
    #[arg(long, default_value = "planned-stop")]
    pub service: String,
    /// Only this process: whether it runs and watches the directory (exit 0), runs without
    /// having announced that (exit 20) or not (exit 3), and its last outcome there — as `pg_ctl
    /// status` and `systemctl is-active`.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub pid: Option<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Exit code of `status --pid`: the process is not running.
pub const EXIT_NOT_RUNNING: u8 = 3;

/// Exit code of `status --pid`: the process runs but has not announced watching this directory
/// (not the service asked about, or one watching another directory).
pub const EXIT_NOT_WATCHING: u8 = 20;

/// Arguments of `clear`.
#[derive(Debug, Args)]
pub struct ClearArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub slot: SlotArgs,
}

fn main() -> ExitCode {
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    run()
}

/// Parses the process arguments and runs the verb.
fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` are answers, not errors; a malformed command line with
        // `--json` is still one JSON object, as every other answer of a `--json` run.
        Err(e) if e.use_stderr() && json_requested() => {
            emit(json!({
                "outcome": "error",
                "code": EXIT_USAGE,
                "message": e.kind().to_string(),
                "detail": e.to_string().trim_end(),
                "request_id": request_id_given(),
            }));
            return ExitCode::from(EXIT_USAGE);
        }
        Err(e) => e.exit(),
    };
    let code = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Stop(args) => stop::run(args),
        Command::Inspect(args) => inspect(args),
        Command::Status(args) => status::status(args),
        Command::Clear(args) => clear(args),
        Command::Records(args) => records::run(args),
        Command::Demo => demo::run(),
    };
    ExitCode::from(code)
}

/// How a verb uses the record store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    /// `serve`: the service's own store, created when missing.
    Serve,
    /// `records list`, `status`: looks only; creates and removes nothing.
    Look,
    /// `records release`, `records drop`: an operator's change to an existing store.
    Change,
}

/// The record store a verb names: `--state DIR`, `--records URL`, or both (the database, with the
/// state directory as its spill). An operator's verb never creates a state directory (a mistyped
/// path is an error), and run as root on one that belongs to another user it acts as that user.
fn record_store(
    state: Option<&Path>,
    records: Option<&str>,
    service: &str,
    allow_shared_state: bool,
    access: Access,
) -> Result<Option<std::sync::Arc<dyn planned_stop::record::RecordStore>>, String> {
    let files = match state {
        Some(dir) => {
            let dir = absolute(dir);
            if access != Access::Serve {
                if dir.exists() && !dir.is_dir() {
                    return Err(format!(
                        "{} exists but is not a directory; give the --state DIR the service \
                         runs with",
                        dir.display()
                    ));
                }
                if !dir.is_dir() {
                    return Err(format!(
                        "no state directory {}; give the --state DIR the service runs with",
                        dir.display()
                    ));
                }
                act_as_owner_of(&dir)?;
            }
            let sharing = if allow_shared_state {
                planned_stop::record::Sharing::Allowed
            } else {
                planned_stop::record::Sharing::Refused
            };
            let opened = match access {
                Access::Look => planned_stop::record::FileRecordStore::open_existing(dir, sharing),
                _ => planned_stop::record::FileRecordStore::open(dir, sharing),
            };
            Some(opened.map_err(|e| chain(&e))?)
        }
        None => None,
    };
    match records {
        None => Ok(files.map(|f| std::sync::Arc::new(f) as _)),
        #[cfg(feature = "postgres")]
        Some(url) => {
            let mut store = planned_stop_postgres::PgRecordStore::from_url(url, service)
                .map_err(|e| chain(&e))?;
            if let Some(files) = files {
                store = store.spill_to(files);
            }
            Ok(Some(std::sync::Arc::new(store)))
        }
        #[cfg(not(feature = "postgres"))]
        Some(_) => {
            let _ = service;
            Err("--records needs a build with the `postgres` feature \
                 (cargo install planned-stop-cli --features postgres)"
                .to_owned())
        }
    }
}

/// An operator verb run as root on a state directory that belongs to another user (a service
/// running as `nobody`) takes that user's uid and gid for the rest of this short-lived process:
/// whatever it creates then belongs to the service, which can still open it, and the service's
/// item files are its own, so they are read rather than refused as another user's. Elsewhere it
/// does nothing.
#[cfg(unix)]
fn act_as_owner_of(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let meta =
        std::fs::metadata(dir).map_err(|e| format!("cannot examine {}: {e}", dir.display()))?;
    let (uid, gid) = (meta.uid(), meta.gid());
    if uid == 0 {
        return Ok(());
    }
    // nix, not rustix: rustix deliberately offers only per-thread credential calls, and the
    // whole process must change (the C library's setgid/setuid apply to every thread). Order
    // matters: the supplementary groups and the group first, while still root.
    use nix::unistd::{Gid, Uid, setgid, setgroups, setuid};
    setgroups(&[])
        .and_then(|()| setgid(Gid::from_raw(gid)))
        .and_then(|()| setuid(Uid::from_raw(uid)))
        .map_err(|e| {
            format!(
                "cannot act as uid {uid} (the owner of {}): {e}; run this as that user",
                dir.display()
            )
        })
}

#[cfg(not(unix))]
fn act_as_owner_of(_: &Path) -> Result<(), String> {
    Ok(())
}

/// Prints an error for a person (and, with `--json`, as one JSON object on stdout, as every
/// other answer of a `--json` run) and returns the usage exit code.
fn fail(message: impl std::fmt::Display) -> u8 {
    eprintln!("planned-stop: {message}");
    if json_requested() {
        emit(json!({ "outcome": "error", "code": EXIT_USAGE, "message": message.to_string() }));
    }
    EXIT_USAGE
}

/// Whether the command line asked for JSON (read from the arguments themselves, so it holds
/// also where the parsed arguments are not at hand, or could not be parsed).
fn json_requested() -> bool {
    std::env::args_os().any(|a| a == "--json")
}

/// The `--request-id` the command line gave, if any (for an answer to a line that did not parse).
fn request_id_given() -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .enumerate()
        .find_map(|(i, a)| match a.strip_prefix("--request-id") {
            Some("") => args.get(i + 1).cloned(),
            Some(rest) => rest.strip_prefix('=').map(str::to_owned),
            None => None,
        })
}

/// `path` made absolute against the working directory (without resolving links); as given when
/// that is impossible.
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// A path as a JSON string. A path that is not valid UTF-8 (possible on Unix) is carried lossily,
/// with U+FFFD for the bytes that are not; `serde_json` would refuse it and `json!` would panic.
fn path_json(path: &Path) -> serde_json::Value {
    serde_json::Value::String(path.to_string_lossy().into_owned())
}

/// Writes one line to stdout and flushes it; a closed stdout is not an error worth dying for.
fn emit(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// The layout and pid a [`SlotArgs`] names.
fn target_slot(args: &SlotArgs) -> Result<(Layout, Option<u32>), String> {
    if let Some(file) = &args.file {
        return Ok(match Layout::of_marker_path(file) {
            (layout @ Layout::Slots(_), pid) => (layout, pid),
            (layout, _) => (layout, args.pid),
        });
    }
    match (args.layout.layout()?, args.pid) {
        (Layout::Slots(_), None) => Err("--dir needs --pid (or give a slot file)".to_owned()),
        (layout, pid) => Ok((layout, pid)),
    }
}

/// A store over what exists, for the operator's verbs: creates nothing, and accepts any directory
/// mode (refusing a shared directory protects the service, not an operator looking at it).
fn existing_store(layout: Layout) -> Result<MarkerStore, String> {
    let store = MarkerStore::builder(layout)
        .create_dir(false)
        .allow_shared_dir(true)
        .open()
        .map_err(|e| chain(&e))?;
    // One answer for a missing directory, whatever the verb: no service can be watching it, so
    // a typo must not read as "nothing there" (0).
    // A bare file name (`inspect planned-stop-42.json`) lives in the working directory.
    let dir = match store.dir() {
        d if d.as_os_str().is_empty() => Path::new("."),
        d => d,
    };
    if !dir.is_dir() {
        return Err(format!(
            "marker directory {} does not exist: is --dir (or --marker, or the file's path) right?",
            absolute(dir).display()
        ));
    }
    // A directory this user cannot read is not "undecided, will retry": nothing here will
    // retry, and no answer about it is possible. Say whom to run as.
    if let Err(e) = std::fs::read_dir(dir)
        && e.kind() == std::io::ErrorKind::PermissionDenied
    {
        return Err(format!(
            "cannot read marker directory {} as this user ({e}): run as {}",
            absolute(dir).display(),
            owner_of(dir)
        ));
    }
    Ok(store)
}

fn inspect(args: InspectArgs) -> u8 {
    let (store, pid) = match target_slot(&args.slot)
        .and_then(|(layout, pid)| Ok((existing_store(layout)?, pid)))
    {
        Ok(x) => x,
        Err(e) => return fail(e),
    };
    // In the single-file layout the owner is whoever the marker names; any pid finds the file.
    let pid = pid.unwrap_or(1);
    let path = store.slot_path(pid);
    let verdict = store.inspect(pid, Utc::now());
    if args.json {
        emit(judgement_json(&path, &verdict));
    } else {
        emit(format!(
            "{}: {}",
            absolute(&path).display(),
            describe(&verdict)
        ));
    }
    if verdict.is_ok() {
        EXIT_OK
    } else {
        EXIT_UNDECIDED
    }
}

fn clear(args: ClearArgs) -> u8 {
    let result = target_slot(&args.slot).and_then(|(layout, pid)| {
        let store = existing_store(layout)?;
        // In the single-file layout any pid names the one file.
        let pid = pid.unwrap_or(1);
        let removed = store.clear(pid).map_err(|e| chain(&e))?;
        Ok((store.slot_path(pid), removed))
    });
    match result {
        Ok((path, true)) => emit(format!("{}: removed", path.display())),
        Ok((path, false)) => emit(format!("{}: nothing to remove", path.display())),
        Err(e) => return fail(e),
    }
    EXIT_OK
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

/// A value in the words `--json` uses for it (`stopped`, `planned`, `record_lost`).
pub fn word(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".to_owned(),
    }
}

/// A stop's cause in words: `marker`, `request`, `signal terminate`.
pub fn cause_words(cause: &planned_stop::StopCause) -> String {
    match serde_json::to_value(cause) {
        Ok(value) => [value["kind"].as_str(), value["signal"].as_str()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" "),
        Err(_) => "?".to_owned(),
    }
}

/// Who owns `path`, for a message that says whom to run as.
#[cfg(unix)]
fn owner_of(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(meta) => format!("its owner (uid {}) or root", meta.uid()),
        Err(_) => "its owner or root".to_owned(),
    }
}

#[cfg(not(unix))]
fn owner_of(_: &Path) -> String {
    "a user who can read it".to_owned()
}

/// A moment as text: RFC 3339 in UTC, to the millisecond (not nine digits of nanoseconds).
pub fn when(at: chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A judgement as one line of text.
pub fn describe(judgement: &Result<Judgement, Undecided>) -> String {
    match judgement {
        Err(e) => format!("undecided: {e}"),
        Ok(Judgement::Absent) => "absent: no marker".to_owned(),
        Ok(Judgement::Malformed(why)) => format!("malformed: {why}"),
        Ok(Judgement::Stale(why)) => format!("stale: {why}"),
        Ok(Judgement::Foreign(m)) => {
            format!("foreign: a stop request for process {}", m.target_pid)
        }
        // A --no-trigger marker stops nothing by itself: it only classifies the next SIGTERM.
        Ok(Judgement::ForSelf(m)) if !m.trigger_watcher => format!(
            "for_self: a --no-trigger marker: the next SIGTERM to process {} counts as planned \
             (its watcher leaves the marker alone){}",
            m.target_pid,
            m.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
        Ok(Judgement::ForSelf(m)) => format!(
            "for_self: process {} will stop as planned if it watches this directory{}",
            m.target_pid,
            m.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
        Ok(other) => other.kind().to_owned(),
    }
}

/// A judgement as a JSON object: `path`, `verdict` (its kind; the key the cli has always printed),
/// `detail`, and `marker` when there is one.
pub fn judgement_json(path: &Path, judgement: &Result<Judgement, Undecided>) -> serde_json::Value {
    let kind = judgement
        .as_ref()
        .map(Judgement::kind)
        .unwrap_or("undecided");
    let marker = match judgement {
        Ok(Judgement::Foreign(m) | Judgement::ForSelf(m)) => serde_json::to_value(m).ok(),
        _ => None,
    };
    json!({
        "path": path_json(path),
        "verdict": kind,
        "detail": describe(judgement),
        "marker": marker,
    })
}

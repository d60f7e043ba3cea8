//! The `planned-stop` command line: argument parsing, output and exit codes. Every verdict it prints
//! comes from [`crate::verdict`] through the [`crate::store`]; nothing here decides.

use crate::store::{Layout, MarkerStore, parse_slot_file_name};
use crate::verdict::{Undecided, Verdict};
use chrono::Utc;
use clap::{Args, Parser, Subcommand};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit code: the command did what was asked.
pub const EXIT_OK: u8 = 0;
/// Exit code: bad arguments, or the marker directory cannot be used.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the slot exists but could not be read this time (nothing decided; retry).
pub const EXIT_UNDECIDED: u8 = 3;

/// Planned stops for actix services: stop one specific process, on purpose, exactly once.
#[derive(Debug, Parser)]
#[command(name = "planned-stop", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The verbs.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the verdict a process would reach on its marker, without changing anything.
    Inspect(InspectArgs),
    /// Show the protocol at work: writes honest and hostile markers for this very process in a
    /// temporary directory and prints the verdict each reaches.
    Demo,
}

/// Where the markers are: `--dir DIR` (one slot per pid) or `--marker FILE` (one shared file).
#[derive(Debug, Args)]
#[group(required = false, multiple = false)]
pub struct LayoutArgs {
    /// Directory of per-process slots, `DIR/planned-stop-<PID>.json`.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// One marker file shared by all processes (the single-file layout).
    #[arg(long, value_name = "FILE")]
    pub marker: Option<PathBuf>,
}

/// Arguments of `inspect`.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A slot or marker file to inspect (instead of `--dir DIR --pid PID`).
    #[arg(value_name = "FILE", conflicts_with_all = ["dir", "marker"])]
    pub file: Option<PathBuf>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub layout: LayoutArgs,
    /// The process whose slot to inspect (required with `--dir`).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Parses the process arguments and runs the verb.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = &mut std::io::stdout().lock();
    let code = match cli.command {
        Command::Inspect(args) => inspect(args, out),
        Command::Demo => demo(out),
    };
    let _ = out.flush();
    ExitCode::from(code)
}

fn fail(message: impl std::fmt::Display) -> u8 {
    eprintln!("planned-stop: {message}");
    EXIT_USAGE
}

fn inspect(args: InspectArgs, out: &mut impl Write) -> u8 {
    let (layout, pid) = match (args.file, args.layout.dir, args.layout.marker, args.pid) {
        (Some(file), ..) => {
            let slot_pid = file
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(parse_slot_file_name);
            match (slot_pid, file.parent()) {
                (Some(pid), Some(dir)) => (Layout::Slots(dir.to_path_buf()), Some(pid)),
                _ => (Layout::SingleFile(file), args.pid),
            }
        }
        (None, Some(dir), None, Some(pid)) => (Layout::Slots(dir), Some(pid)),
        (None, Some(_), None, None) => return fail("--dir needs --pid (or give a slot file)"),
        (None, None, Some(file), pid) => (Layout::SingleFile(file), pid),
        _ => return fail("give a slot file, --dir DIR --pid PID, or --marker FILE"),
    };
    let store = match MarkerStore::builder(layout)
        .create_dir(false)
        .allow_shared_dir(true)
        .open()
    {
        Ok(store) => store,
        Err(e) => return fail(e),
    };
    // In the single-file layout the owner is whoever the marker names; any pid finds the file.
    let pid = pid.unwrap_or(1);
    let path = store.slot_path(pid);
    let verdict = store.inspect(pid, Utc::now());
    let code = if verdict.is_ok() {
        EXIT_OK
    } else {
        EXIT_UNDECIDED
    };
    let written = if args.json {
        writeln!(out, "{}", verdict_json(&path, &verdict))
    } else {
        writeln!(out, "{}: {}", path.display(), describe(&verdict))
    };
    if written.is_err() {
        return EXIT_USAGE;
    }
    code
}

/// A verdict as one line of text.
pub fn describe(verdict: &Result<Verdict, Undecided>) -> String {
    match verdict {
        Err(e) => format!("undecided: {e}"),
        Ok(Verdict::Absent) => "absent: no marker".to_owned(),
        Ok(Verdict::Malformed(why)) => format!("malformed: {why}"),
        Ok(Verdict::Stale(why)) => format!("stale: {why}"),
        Ok(Verdict::Foreign(m)) => format!("foreign: a stop request for process {}", m.target_pid),
        Ok(Verdict::ForSelf(m)) => format!(
            "for_self: process {} will stop as planned{}",
            m.target_pid,
            m.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        ),
    }
}

/// A verdict as a JSON object: `path`, `verdict` (kind), `detail`, and `marker` when there is one.
pub fn verdict_json(
    path: &std::path::Path,
    verdict: &Result<Verdict, Undecided>,
) -> serde_json::Value {
    let kind = verdict.as_ref().map(Verdict::kind).unwrap_or("undecided");
    let marker = match verdict {
        Ok(Verdict::Foreign(m) | Verdict::ForSelf(m)) => serde_json::to_value(m).ok(),
        _ => None,
    };
    json!({
        "path": path,
        "verdict": kind,
        "detail": describe(verdict),
        "marker": marker,
    })
}

fn demo(out: &mut impl Write) -> u8 {
    match run_demo(out) {
        Ok(()) => EXIT_OK,
        Err(e) => fail(e),
    }
}

fn run_demo(out: &mut impl Write) -> Result<(), Box<dyn std::error::Error>> {
    use crate::{Marker, ProcessIdentity};
    use chrono::TimeDelta;

    let temp = std::env::temp_dir().join(format!("planned-stop-demo-{}", std::process::id()));
    let result = (|| -> Result<(), Box<dyn std::error::Error>> {
        let store = MarkerStore::open(Layout::Slots(temp.clone()))?;
        let me = ProcessIdentity::current()?;
        let now = Utc::now();
        writeln!(
            out,
            "marker directory {} (mode 0700), this process is pid {}",
            temp.display(),
            me.pid
        )?;
        let slot = store.slot_path(me.pid);
        let cases: Vec<(&str, Vec<u8>)> = vec![
            (
                "a fresh marker for this process",
                Marker::new(me.pid, Some(me.start), now)
                    .with_reason("demo")
                    .to_json()?,
            ),
            (
                "the same, 2 minutes old",
                Marker::new(me.pid, Some(me.start), now - TimeDelta::minutes(2)).to_json()?,
            ),
            (
                "dated an hour ahead",
                Marker::new(me.pid, Some(me.start), now + TimeDelta::hours(1)).to_json()?,
            ),
            (
                "for an earlier process with our pid",
                Marker::new(me.pid, Some(me.start.wrapping_sub(1)), now).to_json()?,
            ),
            (
                "for another process",
                Marker::new(me.pid.wrapping_add(1).max(1), None, now).to_json()?,
            ),
            (
                "`true` as the pid",
                format!(
                    r#"{{"target_pid":true,"written_at":"{}"}}"#,
                    now.to_rfc3339()
                )
                .into_bytes(),
            ),
            ("garbage", b"{not json".to_vec()),
        ];
        for (what, bytes) in cases {
            let _ = store.clear(me.pid);
            std::fs::write(&slot, &bytes)?;
            let verdict = store.probe(&me, now).map_err(|e| e.to_string());
            let kept = slot.exists();
            let line = match verdict {
                Ok(v) => describe(&Ok(v)),
                Err(e) => e,
            };
            writeln!(
                out,
                "{what:<40} -> {line}{}",
                if kept { "" } else { " [removed]" }
            )?;
        }
        let claimed = store.claim(&me, now)?;
        writeln!(
            out,
            "claim after the last probe: {}",
            if claimed.is_some() {
                "took a marker"
            } else {
                "nothing to take"
            }
        )?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&temp);
    result
}

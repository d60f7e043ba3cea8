//! Wiring planned-stop into a bare actix application.
//!
//! `cargo run --example wire_up`: the application starts a `Jobs` actor, registers it as a drain
//! participant, and runs until it is asked to stop. To show the whole path in one process, it plays
//! the stopper too: a second later it writes a marker for itself, as `planned-stop stop` would from
//! another process. The watcher delivers it, the jobs drain, the stop record lists what was left,
//! and the process exits 0. Run it twice: the second run resumes what the first one left.

use actix::prelude::*;
use chrono::Utc;
use planned_stop::Layout;
use planned_stop::marker::{Marker, MarkerStore};
use planned_stop::{Drain, DrainReport, ServiceBuilder};
use std::process::ExitCode;
use std::time::Duration;

/// An application actor with work in flight.
#[derive(Default)]
struct Jobs {
    in_flight: Vec<String>,
}

impl Actor for Jobs {
    type Context = Context<Self>;
}

impl Handler<Drain> for Jobs {
    type Result = DrainReport;

    fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> DrainReport {
        // A real actor would finish what it can within `drain.within`; this one hands it all back.
        DrainReport::unfinished(std::mem::take(&mut self.in_flight))
    }
}

fn main() -> Result<std::process::ExitCode, Box<dyn std::error::Error>> {
    if let Some(code) = arguments() {
        return Ok(code);
    }
    // Warnings the docs call loud need a subscriber to be seen.
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let base = std::env::temp_dir().join("planned-stop-wire-up");
    let system = System::new();
    let _service = system.block_on(async {
        // --- the wiring -------------------------------------------------------------------------
        let jobs = Jobs {
            in_flight: vec!["invoice-17".into(), "email-4".into()],
        }
        .start();
        let service = ServiceBuilder::new(Layout::Slots(base.join("run")))
            .state_dir(base.join("state"))
            .poll_interval(Duration::from_millis(100))
            .drain_deadline(Duration::from_secs(5))
            .participant("jobs", jobs.recipient())
            .start()?;
        for leased in service.resume().await? {
            say(format_args!(
                "resuming {} ({})",
                leased.item.item, leased.item.id
            ));
            // ... once the work is taken over for good:
            service.acknowledge(&leased).await?;
        }
        service.ready();
        // -----------------------------------------------------------------------------------------
        Ok::<_, Box<dyn std::error::Error>>(service)
    })?;

    // The stopper's side, normally another process (`planned-stop stop --pid PID --dir DIR`).
    let me = planned_stop::ProcessIdentity::current()?;
    let store = MarkerStore::open(Layout::Slots(base.join("run")))?;
    system.block_on(async move {
        actix::spawn(async move {
            actix::clock::sleep(Duration::from_secs(1)).await;
            let marker = Marker::new(me.pid, Some(me.start), Utc::now()).with_reason("example");
            store.write(&marker).expect("write the marker");
            say(format_args!("marker written for pid {}", me.pid));
        });
    });

    let code = system.run_with_code()?;
    say(format_args!(
        "exit code {code}; stop record in {}",
        base.join("state").display()
    ));
    Ok(std::process::ExitCode::from(code as u8))
}

/// What `--help` prints: the example takes no arguments, only its environment.
const HELP: &str = "The library wired up by hand: a service that writes its own stop marker.

Usage: wire_up   (no arguments; stop it with `planned-stop stop --pid PID --dir DIR/run`)

Environment:
  EXAMPLE_DIR   the base directory (default $TMPDIR/planned-stop-wire-up; markers in run/, items in state/)
  RUST_LOG      the log filter (default info)";

/// `--help` (or `-h`): what the example reads, exit 0. Any other argument: exit 2, rather than
/// ignored by a service that would then start serving.
fn arguments() -> Option<ExitCode> {
    let arg = std::env::args().nth(1)?;
    if arg == "--help" || arg == "-h" {
        say(format_args!("{HELP}"));
        return Some(ExitCode::SUCCESS);
    }
    eprintln!("unknown argument {arg:?}: the example takes none (`--help` lists its environment)");
    Some(ExitCode::from(2))
}

/// Prints a line on stdout. A closed stdout (a log shipper gone, a `| head`) is no reason to
/// end a service: the error is ignored, where `println!` would panic.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

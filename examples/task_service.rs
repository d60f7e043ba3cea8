//! Work that is not an actor: jobs as tokio tasks in a `TaskGroup`, spawned from a request
//! handler, handed back at a stop and resumed by a `ResumeLoop` in the next life (or another
//! replica).
//!
//! ```sh
//! cargo run --example task_service --features actix-web
//! curl -X POST http://127.0.0.1:8080/jobs/report-7/20000   # a job of 20 s, from a handler
//! planned-stop stop --pid PID --dir /tmp/planned-stop-task-service/run --wait 30
//! cargo run --example task_service --features actix-web    # starts report-7 again, finishes it
//! ```
//!
//! A task spawned through the group runs on the service's `System`, not on the HTTP worker, so it
//! outlives the ingress phase. At a stop its cancellation token fires; a job that ends
//! `Unfinished` (or is still running at the work phase's deadline) is handed back and recorded,
//! and a resumed one is acknowledged only when its task ends `Done`. A task that panics is a failed
//! attempt; after `max_failed_attempts` the item is held aside for a person. A payload that
//! cannot be recorded is refused at `spawn`, not lost at the stop.
//!
//! The environment can move it (the tests run it this way): `EXAMPLE_DIR` and `EXAMPLE_ADDR`
//! (port 0 picks a free one).

use actix_web::{HttpResponse, HttpServer, web};
use planned_stop::{CancellationToken, JobEnd, Layout, ResumeLoop, ServiceBuilder, TaskGroup};
use serde::{Deserialize, Serialize};
use std::process::ExitCode;
use std::time::Duration;

/// One job: what it is called and how long it takes. What the group records and resumes.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    name: String,
    ms: u64,
}

/// The work of one job: done after `ms`, unfinished when the stop cancels it first.
async fn work(job: Job, stop: CancellationToken) -> JobEnd {
    say(format_args!("start {}", job.name));
    tokio::select! {
        _ = actix_web::rt::time::sleep(Duration::from_millis(job.ms)) => {
            say(format_args!("done {}", job.name));
            JobEnd::Done
        }
        _ = stop.cancelled() => JobEnd::Unfinished,
    }
}

/// `POST /jobs/{name}/{ms}`: spawned into the group, 202; refused once the service is stopping.
async fn spawn_job(
    path: web::Path<(String, u64)>,
    jobs: web::Data<TaskGroup<Job>>,
) -> HttpResponse {
    let (name, ms) = path.into_inner();
    match jobs.spawn(Job { name, ms }) {
        Ok(id) => HttpResponse::Accepted().body(format!("job {}\n", id.number())),
        Err(refused) => HttpResponse::ServiceUnavailable().body(refused.reason.to_string()),
    }
}

#[actix_web::main]
async fn main() -> std::io::Result<ExitCode> {
    if let Some(code) = arguments() {
        return Ok(code);
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let base = std::env::var_os("EXAMPLE_DIR").map_or_else(
        || std::env::temp_dir().join("planned-stop-task-service"),
        std::path::PathBuf::from,
    );
    let addr = std::env::var("EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let stop = match ServiceBuilder::new(Layout::Slots(base.join("run")))
        .state_dir(base.join("state"))
        .drain_deadline(Duration::from_secs(20))
        .start()
    {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("cannot start: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    // The group joins the work phase of the drain, and every job of it runs `work`, spawned or
    // resumed; the loop leases what earlier lives left, at start and every second, into the group.
    let jobs = TaskGroup::new(&stop, "jobs", work);
    ResumeLoop::new(&stop, Duration::from_secs(1))
        .deliver_to(&jobs)
        .start();
    let ready = stop.clone();
    let server = HttpServer::new(move || {
        planned_stop::web::app(&ready)
            .app_data(web::Data::new(jobs.clone()))
            .service(planned_stop::web::readiness("/ready", &ready))
            .route("/jobs/{name}/{ms}", web::post().to(spawn_job))
    })
    .bind(addr)?;
    stop.ready();
    say(format_args!(
        "serving http://{} as pid {}; markers in {}",
        server.addrs()[0],
        std::process::id(),
        base.join("run").display()
    ));
    planned_stop::web::serve(server, &stop)
        .grace(Duration::from_secs(1))
        .await
}

/// What `--help` prints: the example takes no arguments, only its environment.
const HELP: &str = "Jobs spawned from request handlers, handed to the next life at a planned stop.

Usage: task_service   (no arguments; stop it with `planned-stop stop --pid PID --dir DIR/run`)

Environment:
  EXAMPLE_DIR   the base directory (default $TMPDIR/planned-stop-task-service; markers in run/, items in state/)
  EXAMPLE_ADDR  the HTTP address (default 127.0.0.1:8080; port 0 picks a free one)
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

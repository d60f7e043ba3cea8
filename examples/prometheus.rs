//! A service's stops, drains and unfinished items as numbers: the `metrics` feature, scraped by
//! Prometheus from an admin server that outlives the drain.
//!
//! ```sh
//! cargo run --example prometheus --features actix-web,metrics
//! # in another shell, with the pid it prints:
//! planned-stop stop --pid PID --dir /tmp/planned-stop-prometheus/run --wait 30
//! curl http://127.0.0.1:9090/metrics   # while it runs: the stops, drains and items as numbers
//! ```
//!
//! A Prometheus recorder takes what the `metrics` feature records (docs/operations.md, "Metrics"),
//! served at `/metrics` by `planned_stop::web::Admin` — an admin server with status and readiness
//! on an address and a `System` of its own, not the ingress, so it answers during the drain, and
//! after the stop until one scrape has read the stop's last numbers (within the exit grace).
//!
//! So that the numbers have something to count, the service runs jobs in a `WorkSet` (a job
//! resumed from the previous life is acknowledged when it completes; on a drain every job still
//! running is handed back), and its HTTP server runs under `planned_stop::web::serve` as in
//! `actix_web.rs`.
//!
//! The environment can move it (the tests run it this way): `EXAMPLE_DIR` (the base directory),
//! `EXAMPLE_ADDR` and `EXAMPLE_METRICS_ADDR` (port 0 picks a free one; the addresses are printed),
//! `EXAMPLE_JOB_SECS` (how long a job takes).

use actix::prelude::*;
use actix_web::{HttpServer, get};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use planned_stop::{Drain, DrainPhase, DrainReport, Layout, ServiceBuilder, WorkSet};
use serde::{Deserialize, Serialize};
use std::process::ExitCode;
use std::time::Duration;

/// How long `/metrics` stays up after a stop for a last scrape, at most: with the 2 s `main`
/// has to return, the exit grace is 5 s, no longer than the overrun grace, so the stop's bound
/// (drain + 0.3 s + persist 10 s + 5 s, docs/operations.md) is not lengthened by it.
const LAST_SCRAPE: Duration = Duration::from_secs(3);

/// What `--help` prints: the example takes no arguments, only its environment.
const HELP: &str = "A service whose stops, drains and items are scraped as metrics.

Usage: prometheus   (no arguments; stop it with `planned-stop stop --pid PID --dir DIR/run`)

Environment:
  EXAMPLE_DIR           the base directory (markers in run/, resume items in state/)
  EXAMPLE_ADDR          the HTTP address (default 127.0.0.1:8080; port 0 picks a free one)
  EXAMPLE_METRICS_ADDR  the admin address: /metrics, /status, /ready (default 127.0.0.1:9090)
  EXAMPLE_JOB_SECS      how long a job takes (default 20)
  RUST_LOG              the log filter (default info)";

/// Prints a line on stdout. A closed stdout (a log shipper gone, a `| head`) is no reason to
/// end a service: the error is ignored, where `println!` would panic.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// `--help` (or `-h`): the help, exit 0; any other argument is refused (exit 2) rather than
/// ignored by a service that then starts; none: `None`, serve.
fn arguments() -> Option<ExitCode> {
    let arg = std::env::args().nth(1)?;
    if arg == "--help" || arg == "-h" {
        say(format_args!("{HELP}"));
        return Some(ExitCode::SUCCESS);
    }
    eprintln!("unknown argument {arg:?}: the example takes none (`--help` lists its environment)");
    Some(ExitCode::from(2))
}

/// Work the application resumes at its next start.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    id: u32,
}

/// The jobs: each takes `.1`; on a stop, what is still running is handed back.
struct Jobs(WorkSet<Job>, Duration);

impl Actor for Jobs {
    type Context = Context<Self>;
}

/// A job to run: new, or resumed from the previous life.
#[derive(Message)]
#[rtype(result = "()")]
enum Run {
    New(Job),
    Resumed(Box<planned_stop::record::Leased>),
}

impl Handler<Run> for Jobs {
    type Result = ();

    fn handle(&mut self, run: Run, ctx: &mut Context<Self>) {
        let id = match run {
            Run::New(job) => match self.0.add(job) {
                Ok(id) => id,
                Err(e) => return tracing::error!(error = %e, "cannot take a job"),
            },
            Run::Resumed(leased) => match self.0.add_resumed(*leased) {
                Ok(id) => id,
                // Still leased to this process: offered again once this process is gone.
                Err(e) => {
                    return tracing::error!(error = %e, item = %e.job.item.id, "cannot resume an item");
                }
            },
        };
        tracing::info!(job = ?self.0.get(id), resumed = self.0.is_resumed(id), "job started");
        ctx.run_later(self.1, move |jobs, ctx| {
            // Done: a resumed job is acknowledged now, never offered again.
            let completing = jobs.0.complete(id);
            ctx.spawn(actix::fut::wrap_future(async move {
                if let Err(e) = completing.await {
                    tracing::warn!(error = %e, "job done, but not acknowledged");
                }
            }));
        });
    }
}

impl Handler<Drain> for Jobs {
    type Result = DrainReport;

    fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> DrainReport {
        self.0.drain()
    }
}

#[get("/")]
async fn hello() -> &'static str {
    "hello; stop me with `planned-stop stop`\n"
}

#[actix_web::main]
async fn main() -> std::io::Result<ExitCode> {
    if let Some(code) = arguments() {
        return Ok(code);
    }
    // The warnings the docs call loud go somewhere: install a subscriber.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let base = std::env::var_os("EXAMPLE_DIR").map_or_else(
        || std::env::temp_dir().join("planned-stop-prometheus"),
        std::path::PathBuf::from,
    );
    let job_secs = env("EXAMPLE_JOB_SECS", "20").parse().unwrap_or(20);
    // Metrics: installed before the service starts, so it records from the first state on.
    let metrics = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0],
        )
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(std::io::Error::other)?;
    // planned-stop: the runner, the watcher and the previous life's resume list.
    let stop = match ServiceBuilder::new(Layout::Slots(base.join("run")))
        .state_dir(base.join("state"))
        .drain_deadline(Duration::from_secs(25))
        // Room for the last scrape after the stop (below); the process ends with the stop's
        // exit code after this even if `main` has not returned.
        .exit_grace(LAST_SCRAPE + Duration::from_secs(2))
        .start()
    {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("cannot start: {e}"); // Display: it says what to do
            return Ok(ExitCode::from(2));
        }
    };
    // The admin server: metrics, status and readiness on an address and a System of their own,
    // answering through the whole drain and until the process ends.
    let mut admin = planned_stop::web::Admin::new(&stop)
        .readiness("/ready")
        .status("/status")
        .metrics("/metrics", move || {
            metrics.run_upkeep();
            metrics.render()
        })
        .bind(env("EXAMPLE_METRICS_ADDR", "127.0.0.1:9090"))?;
    let metrics_addr = admin.addrs()[0];
    // The participant needs the handle: registered now, before `ready` (a stop waits for it).
    let jobs = Jobs(WorkSet::new(&stop), Duration::from_secs(job_secs)).start();
    stop.add_participant(DrainPhase::Work, "jobs", jobs.clone().recipient());
    for leased in stop.resume().await.map_err(std::io::Error::other)? {
        jobs.do_send(Run::Resumed(Box::new(leased)));
    }
    for id in 1..=2 {
        jobs.do_send(Run::New(Job { id }));
    }
    let ready = stop.clone();
    let server = HttpServer::new(move || {
        planned_stop::web::app(&ready)
            .service(planned_stop::web::readiness("/ready", &ready))
            .service(planned_stop::web::status("/status", &ready))
            .service(hello)
    })
    .bind(env("EXAMPLE_ADDR", "127.0.0.1:8080"))?;
    let addr = server.addrs()[0];
    stop.ready();
    say(format_args!("metrics http://{metrics_addr}/metrics"));
    say(format_args!(
        "serving http://{addr} as pid {}",
        std::process::id()
    ));
    let code = planned_stop::web::serve(server, &stop)
        .grace(Duration::from_secs(2))
        .await;
    // The stop has concluded and its last numbers are recorded: wait for a scrape begun from
    // now on, for `LAST_SCRAPE` at most.
    admin.last_scrape(LAST_SCRAPE).await;
    code
}

//! An actix-web service whose stops go through planned-stop: the common case, and nothing else.
//!
//! ```sh
//! cargo run --example actix_web --features actix-web
//! # in another shell, with the pid it prints:
//! curl http://127.0.0.1:8080/slow &    # a request in flight when the stop comes
//! planned-stop stop --pid PID --dir /tmp/planned-stop-actix-web/run --wait 30
//! ```
//!
//! `planned_stop::web::serve` owns the server's signals (actix-web's own would stop the `System`
//! with 0 before the runner decides), makes the server the ingress drain participant and resolves
//! to the exit code: 0 after a planned stop, 1 otherwise. During the grace `/ready` answers 503
//! so a load balancer stops sending, and the `App` from `web::app` asks pooled keep-alive clients to
//! close; then the listener closes and the requests in flight (`/slow`) finish. The runner owns
//! the process's end, so that code stands whatever `main` returns.

use actix_web::{HttpServer, get};
use planned_stop::{Layout, ServiceBuilder};
use std::process::ExitCode;
use std::time::Duration;

#[get("/")]
async fn hello() -> &'static str {
    "hello; stop me with `planned-stop stop`\n"
}

/// A request that takes three seconds: one in flight when a stop comes is answered in full.
#[get("/slow")]
async fn slow() -> &'static str {
    actix_web::rt::time::sleep(Duration::from_secs(3)).await;
    "finished, although a stop came in between\n"
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
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    // The environment can move it (the tests run it this way; port 0 picks a free one).
    let base = std::env::var_os("EXAMPLE_DIR").map_or_else(
        || std::env::temp_dir().join("planned-stop-actix-web"),
        std::path::PathBuf::from,
    );
    let addr = std::env::var("EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let stop = match ServiceBuilder::new(Layout::Slots(base.join("run")))
        .drain_deadline(Duration::from_secs(25))
        .start()
    {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("cannot start: {e}"); // Display: it says what to do
            return Ok(ExitCode::from(2));
        }
    };
    let ready = stop.clone();
    let server = HttpServer::new(move || {
        planned_stop::web::app(&ready)
            .service(planned_stop::web::readiness("/ready", &ready))
            .service(hello)
            .service(slow)
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
        .grace(Duration::from_secs(2))
        .await
}

/// What `--help` prints: the example takes no arguments, only its environment.
const HELP: &str = "An actix-web service whose stops go through planned-stop.

Usage: actix_web   (no arguments; stop it with `planned-stop stop --pid PID --dir DIR/run`)

Environment:
  EXAMPLE_DIR   the base directory (default $TMPDIR/planned-stop-actix-web; markers in run/)
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

//! A planned restart that refuses no connection: the successor inherits the listening socket.
//!
//! ```sh
//! cargo build --example restart_in_place --features actix-web
//! target/debug/examples/restart_in_place &
//! curl http://127.0.0.1:8080/            # "served by pid PID"
//! planned-stop stop --restart --pid PID --dir /tmp/planned-stop-restart-in-place/run --wait 30
//! curl http://127.0.0.1:8080/            # the same socket, served by the successor's pid
//! ```
//!
//! With `restart_in_place`, a planned restart starts the successor — the executable on disk now,
//! same arguments and environment — with the listening sockets inherited the way systemd hands a
//! `.socket` unit's (`LISTEN_FDS`), waits until it says it is ready, and only then stops
//! accepting, drains and exits 0. `web::listeners_or_bind` takes the sockets a successor (or
//! systemd) was handed, and binds only when there are none; connections meanwhile wait in the
//! socket's queue. If the successor fails or is not ready in time, the old process keeps serving
//! and the stopper is told the restart did not happen.
//!
//! `--dir DIR` is the marker directory (default `/tmp/planned-stop-restart-in-place/run`) and
//! `--addr ADDR` the address to bind when no socket is handed over (default `127.0.0.1:8080`); the
//! environment can set them too (the tests run it this way): `EXAMPLE_DIR` (markers in its `run`)
//! and `EXAMPLE_ADDR` (port 0 picks a free one; the successor serves the same socket, whatever port
//! it got). docs/operations.md runs it under systemd as `myweb`.

use actix_web::{HttpServer, web};
use planned_stop::{Layout, ServiceBuilder};
use std::process::ExitCode;
use std::time::Duration;

#[actix_web::main]
async fn main() -> std::io::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let (dir, addr) = match options() {
        Options::Serve(dir, addr) => (dir, addr),
        Options::Help => {
            say(format_args!("{USAGE}"));
            return Ok(ExitCode::SUCCESS);
        }
        Options::Wrong => {
            eprintln!("{USAGE}");
            return Ok(ExitCode::from(2));
        }
    };
    let stop = match ServiceBuilder::new(Layout::Slots(dir.clone()))
        .drain_deadline(Duration::from_secs(20))
        // A successor has this long to say it is ready, or the restart does not happen.
        .restart_in_place(Duration::from_secs(10))
        .start()
    {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("cannot start: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let app = stop.clone();
    let server = HttpServer::new(move || {
        // The crate's `App`: from the hand-over on, every answer says `Connection: close`, so a
        // keep-alive pool retires its connections to this process after their next answer and
        // opens new ones, which reach the successor; none is cut with a request on it.
        planned_stop::web::app(&app).route(
            "/",
            web::get().to(|| async { format!("served by pid {}\n", std::process::id()) }),
        )
    });
    // The inherited sockets, or new ones when there are none (the first life).
    let server = planned_stop::web::listeners_or_bind(&stop, addr)?
        .into_iter()
        .try_fold(server, HttpServer::listen)?;
    stop.ready();
    say(format_args!(
        "serving http://{} as pid {}; markers in {}",
        server.addrs()[0],
        std::process::id(),
        dir.display()
    ));
    planned_stop::web::serve(server, &stop)
        .grace(Duration::from_secs(1))
        .await
}

/// What `--help` prints.
const USAGE: &str = "usage: restart_in_place [--dir DIR] [--addr ADDR]
  (or EXAMPLE_DIR, the base of the marker directory run/, and EXAMPLE_ADDR; RUST_LOG)";

/// What the command line asks for.
enum Options {
    /// Serve with the marker directory and the address.
    Serve(std::path::PathBuf, String),
    /// `--help` or `-h`.
    Help,
    /// Anything else.
    Wrong,
}

/// Prints a line on stdout. A closed stdout (a log shipper gone, a `| head`) is no reason to
/// end a service: the error is ignored, where `println!` would panic.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// The marker directory and the address, from `--dir` and `--addr` or the environment.
fn options() -> Options {
    let base = std::env::var_os("EXAMPLE_DIR").map_or_else(
        || std::env::temp_dir().join("planned-stop-restart-in-place"),
        std::path::PathBuf::from,
    );
    let mut dir = base.join("run");
    let mut addr = std::env::var("EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:8080".into());
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match (flag.as_str(), args.next()) {
            ("--help" | "-h", None) => return Options::Help,
            ("--dir", Some(value)) => dir = value.into(),
            ("--addr", Some(value)) => addr = value,
            _ => return Options::Wrong,
        }
    }
    Options::Serve(dir, addr)
}

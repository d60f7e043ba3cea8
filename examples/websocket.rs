//! Connections that outlive requests: a WebSocket echo whose sessions are told to go away — a
//! Close frame with 1001 (Going Away) — when a stop is accepted, and counted in the stop record.
//!
//! ```sh
//! cargo run --example websocket --features actix-web
//! # in another shell: connect (websocat ws://127.0.0.1:8081/ws), then, with the pid it prints:
//! planned-stop stop --pid PID --dir /tmp/planned-stop-websocket/run --wait 30
//! ```
//!
//! A WebSocket session is no request: actix-web's drain waits for it until the deadline and then
//! cuts it. `planned_stop::web::LongLived` joins the drain's ingress phase instead: each session
//! holds a connection from it, which says `going_away` when the stop is accepted, and
//! `close_going_away` sends the Close frame and ends the session; the drain waits for the open
//! ones, and the stop record says how they ended.

use actix_web::{HttpServer, web};
use planned_stop::web::LongLived;
use planned_stop::{Layout, ServiceBuilder};
use std::process::ExitCode;
use std::time::Duration;

/// The echo: every text message comes back, until the client closes or the service stops.
async fn echo(
    req: actix_web::HttpRequest,
    body: web::Payload,
    sockets: web::Data<LongLived>,
) -> actix_web::Result<actix_web::HttpResponse> {
    let (response, mut session, mut messages) = actix_ws::handle(&req, body)?;
    let mut connection = sockets.open();
    actix_web::rt::spawn(async move {
        loop {
            tokio::select! {
                _ = connection.going_away() => {
                    return planned_stop::web::close_going_away(session, connection).await;
                }
                message = messages.recv() => match message {
                    Some(Ok(actix_ws::Message::Text(text))) => {
                        if session.text(text).await.is_err() {
                            return;
                        }
                    }
                    Some(Ok(actix_ws::Message::Close(_))) | Some(Err(_)) | None => return,
                    Some(Ok(_)) => {}
                },
            }
        }
    });
    Ok(response)
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
        || std::env::temp_dir().join("planned-stop-websocket"),
        std::path::PathBuf::from,
    );
    let addr = std::env::var("EXAMPLE_ADDR").unwrap_or_else(|_| "127.0.0.1:8081".into());
    let stop = match ServiceBuilder::new(Layout::Slots(base.join("run")))
        .drain_deadline(Duration::from_secs(25))
        .start()
    {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("cannot start: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    // The sessions' group, in the drain: told to go away when a stop is accepted.
    let sockets = LongLived::new("websocket");
    sockets.join(&stop);
    let app = stop.clone();
    let server = HttpServer::new(move || {
        planned_stop::web::app(&app)
            .app_data(web::Data::new(sockets.clone()))
            .route("/ws", web::get().to(echo))
    })
    .bind(addr)?;
    stop.ready();
    say(format_args!(
        "echoing at ws://{}/ws as pid {}; markers in {}",
        server.addrs()[0],
        std::process::id(),
        base.join("run").display()
    ));
    planned_stop::web::serve(server, &stop).await
}

/// What `--help` prints: the example takes no arguments, only its environment.
const HELP: &str = "A WebSocket service whose sessions are told to go away at a planned stop.

Usage: websocket   (no arguments; stop it with `planned-stop stop --pid PID --dir DIR/run`)

Environment:
  EXAMPLE_DIR   the base directory (default $TMPDIR/planned-stop-websocket; markers in run/)
  EXAMPLE_ADDR  the HTTP address (default 127.0.0.1:8081; port 0 picks a free one)
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

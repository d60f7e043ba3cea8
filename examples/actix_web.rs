//! An actix-web server whose stops go through planned-stop.
//!
//! ```sh
//! cargo run --example actix_web --features web
//! # in another shell, with the pid it prints:
//! planned-stop stop --pid PID --dir /tmp/planned-stop-actix-web/run --wait 30
//! ```
//!
//! actix-web handles SIGINT/SIGTERM itself by default and would stop the whole `System` on a bare
//! SIGTERM, leaving no room for the planned/unexpected distinction. So its signal handling is
//! disabled (`disable_signals`), planned-stop's runner receives the signals, and the HTTP server is a
//! drain participant: on `Drain` it stops accepting connections and finishes in-flight requests
//! within the deadline (`ServerHandle::stop(true)`), and reports whether it made it.

use actix::prelude::*;
use actix_web::dev::ServerHandle;
use actix_web::{App, HttpServer, get};
use planned_stop::{Drain, DrainReport, Layout, PlannedStopService};
use std::time::Duration;

#[get("/")]
async fn hello() -> &'static str {
    "hello; stop me with `planned-stop stop`\n"
}

/// The HTTP server as a drain participant.
struct Http {
    server: ServerHandle,
}

impl Actor for Http {
    type Context = Context<Self>;
}

impl Handler<Drain> for Http {
    type Result = ResponseFuture<DrainReport>;

    fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> Self::Result {
        let server = self.server.clone();
        Box::pin(async move {
            // Graceful: stop accepting, let in-flight requests finish (bounded by the deadline).
            match actix::clock::timeout(drain.within, server.stop(true)).await {
                Ok(()) => DrainReport::done(),
                Err(_) => DrainReport::unfinished(["in-flight HTTP requests"]),
            }
        })
    }
}

fn main() -> std::io::Result<std::process::ExitCode> {
    let base = std::env::temp_dir().join("planned-stop-actix-web");
    let system = System::new();
    system.block_on(async {
        let server = HttpServer::new(|| App::new().service(hello))
            .disable_signals() // planned-stop's runner owns the signals
            .shutdown_timeout(20)
            .bind(("127.0.0.1", 8080))?
            .run();
        let http = Http {
            server: server.handle(),
        }
        .start();
        actix::spawn(server);
        let service = PlannedStopService::builder(Layout::Slots(base.join("run")))
            .state_dir(base.join("state"))
            .drain_deadline(Duration::from_secs(20))
            .participant("http", http.recipient())
            .start()
            .map_err(std::io::Error::other)?;
        service.ready();
        println!(
            "serving http://127.0.0.1:8080 as pid {}",
            std::process::id()
        );
        println!(
            "stop: planned-stop stop --pid {} --dir {}",
            std::process::id(),
            base.join("run").display()
        );
        Ok::<_, std::io::Error>(())
    })?;
    let code = system.run_with_code()?;
    Ok(std::process::ExitCode::from(
        u8::try_from(code).unwrap_or(1),
    ))
}

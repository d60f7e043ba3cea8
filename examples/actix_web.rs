//! An actix-web application whose stops go through planned-stop.
//!
//! ```sh
//! cargo run --example actix_web --features actix-web
//! # in another shell, with the pid it prints:
//! planned-stop stop --pid PID --dir /tmp/planned-stop-actix-web/run --wait 30
//! ```
//!
//! `planned_stop::web::serve` owns the server's signals (actix-web's own would stop the `System`
//! with 0 before the runner decides), makes the server the ingress drain participant — readiness
//! says 503 for the grace, then the listener closes and in-flight requests finish — and resolves
//! to the exit code `main` returns: 0 after a planned stop, 1 otherwise. The `jobs` actor is a
//! work-phase participant handing back typed items, which the next start reads back.

use actix::prelude::*;
use actix_web::{App, HttpServer, get};
use planned_stop::{Drain, DrainReport, Layout, PlannedStopService};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Work the application resumes at its next start.
#[derive(Debug, Serialize, Deserialize)]
struct Job {
    id: u32,
}

/// A queue of jobs; on a stop it hands back what it has not done.
struct Jobs(Vec<Job>);

impl Actor for Jobs {
    type Context = Context<Self>;
}

impl Handler<Drain> for Jobs {
    type Result = DrainReport;

    fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> DrainReport {
        DrainReport::unfinished(std::mem::take(&mut self.0))
    }
}

#[get("/")]
async fn hello() -> &'static str {
    "hello; stop me with `planned-stop stop`\n"
}

#[actix_web::main]
async fn main() -> std::io::Result<std::process::ExitCode> {
    let base = std::env::temp_dir().join("planned-stop-actix-web");
    // planned-stop: the runner, the watcher and the previous life's resume list.
    let jobs = Jobs(vec![Job { id: 1 }, Job { id: 2 }]).start();
    let stop = PlannedStopService::builder(Layout::Slots(base.join("run")))
        .state_dir(base.join("state"))
        .drain_deadline(Duration::from_secs(25))
        .participant("jobs", jobs.recipient())
        .start()
        .map_err(std::io::Error::other)?;
    for leased in stop.resume().await.map_err(std::io::Error::other)? {
        println!("resuming {:?}", leased.item.item_as::<Job>());
        // ... once the job is queued again for good:
        stop.acknowledge(&leased)
            .await
            .map_err(std::io::Error::other)?;
    }
    let ready = stop.clone();
    let server = HttpServer::new(move || {
        App::new()
            .service(planned_stop::web::readiness("/ready", &ready))
            .service(hello)
    })
    .bind(("127.0.0.1", 8080))?;
    stop.ready();
    println!(
        "serving http://127.0.0.1:8080 as pid {}",
        std::process::id()
    );
    planned_stop::web::serve(server, &stop)
        .grace(Duration::from_secs(2))
        .await
}

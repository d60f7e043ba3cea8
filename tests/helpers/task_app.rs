//! The helper program of `tests/task_service.rs`: a production-shaped service whose work runs as
//! tokio tasks, not actors — jobs spawned from request handlers and from `main` into a
//! `TaskGroup`, resumed by the library's `ResumeLoop` across lives and replicas — with every knob
//! those tests turn. `examples/task_service.rs` and `examples/restart_in_place.rs` show its two
//! ideas to a reader, one each.
//!
//! What it does:
//!
//! - `POST /jobs/{name}/{ms}` spawns a job from the handler: it runs on the service's `System`,
//!   not on the HTTP worker, so it outlives the ingress phase; at a stop it finishes within the
//!   work phase or sees its cancellation and is handed back for the next life (or replica);
//! - a job whose name starts with `poison` panics: each panic is a failed attempt, and after
//!   `EXAMPLE_MAX_FAILED` the item is held aside for a person (`planned-stop records list`);
//! - `POST /bad` offers a job whose payload cannot be recorded (a map with tuple keys): refused at
//!   once, with 422 and the reason, instead of being lost at the stop;
//! - the `ResumeLoop` takes over, every `EXAMPLE_RESUME_MS`, what stopped or dead replicas left;
//! - `planned_stop::web::Admin` serves status and readiness on an address of its own;
//! - it serves the listening sockets a `.socket` unit (or any supervisor) hands it, so a restart
//!   refuses no connection: they wait in the socket's queue for the next life.
//!
//! The environment moves it (the tests run it this way): `EXAMPLE_DIR` (base directory),
//! `EXAMPLE_ADDR`, `EXAMPLE_ADMIN_ADDR` (port 0 picks a free one; both are printed),
//! `EXAMPLE_JOURNAL` (a file each finished job appends `done NAME` to), `EXAMPLE_MAIN_JOBS`
//! (jobs `main` spawns at start, default 0), `EXAMPLE_JOB_MS` (their length), `EXAMPLE_RESUME_MS`
//! (default 1000), `EXAMPLE_MAX_FAILED` (default 3), `EXAMPLE_READY_AFTER_MS` (a late `ready()`,
//! default 0), `EXAMPLE_BIND_OWN` (bind the server itself, not through the crate),
//! `EXAMPLE_INGRESS_MS` (the ingress phase's deadline), `EXAMPLE_KEEP_ALIVE_S` (the server's
//! keep-alive, default actix-web's 5 s), and with the
//! `postgres` feature
//! `EXAMPLE_RECORDS` (a `postgres://` URL: replicas share their work through it) and
//! `EXAMPLE_SERVICE` (the service name in it).

use actix_web::{App, HttpResponse, HttpServer, web};
use planned_stop::{CancellationToken, JobEnd, Layout, ResumeLoop, ServiceBuilder, TaskGroup};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// One job: its name and how long it takes. `extra` is what an application might carry and
/// cannot record (JSON keys must be strings): set only by `POST /bad`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Job {
    name: String,
    ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    extra: Option<HashMap<(u32, u32), u32>>,
}

/// Where finished jobs are written down, one line each (`O_APPEND`: lines never interleave).
#[derive(Debug, Clone)]
struct Journal(Option<Arc<PathBuf>>);

impl Journal {
    fn done(&self, name: &str) {
        let Some(path) = &self.0 else { return };
        let line = format!("done {name} {}\n", std::process::id());
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path.as_ref());
        if let Err(e) = file.and_then(|mut f| f.write_all(line.as_bytes())) {
            tracing::error!(error = %e, "cannot write the journal");
        }
    }
}

/// The work of one job: done after `ms`, unfinished when the stop cancels it first.
async fn work(job: Job, stop: CancellationToken, journal: Journal) -> JobEnd {
    if job.name.starts_with("poison") {
        panic!("poison job {}", job.name);
    }
    tokio::select! {
        _ = actix_web::rt::time::sleep(Duration::from_millis(job.ms)) => {
            journal.done(&job.name);
            JobEnd::Done
        }
        _ = stop.cancelled() => JobEnd::Unfinished,
    }
}

/// What the handlers share.
#[derive(Clone)]
struct Jobs {
    group: TaskGroup<Job>,
}

impl Jobs {
    /// Spawns `job` into the group: 202, or why not (422: cannot be recorded; 503: stopping).
    fn spawn(&self, job: Job) -> HttpResponse {
        match self.group.spawn(job) {
            Ok(id) => HttpResponse::Accepted().body(format!("job {}\n", id.number())),
            Err(refused) => {
                let reason = refused.reason.to_string();
                match refused.reason {
                    planned_stop::Refusal::NotSerializable(_) => {
                        HttpResponse::UnprocessableEntity().body(reason)
                    }
                    _ => HttpResponse::ServiceUnavailable().body(reason),
                }
            }
        }
    }
}

async fn spawn_job(path: web::Path<(String, u64)>, jobs: web::Data<Jobs>) -> HttpResponse {
    let (name, ms) = path.into_inner();
    jobs.spawn(Job {
        name,
        ms,
        extra: None,
    })
}

async fn bad_job(jobs: web::Data<Jobs>) -> HttpResponse {
    jobs.spawn(Job {
        name: "bad".into(),
        ms: 1,
        extra: Some(HashMap::from([((1, 2), 3)])),
    })
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.into())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// For the tests of restart in place: a successor (started by its predecessor, which names it in
/// `PLANNED_STOP_READY_PID`) that `EXAMPLE_FAIL_AS_SUCCESSOR` tells to `exit` at once, to `hang`
/// before it is ready, to be `slow` (ready a second late, so a test can ask again meanwhile), to
/// `close` its readiness pipe and run on, to `exit_after_ready` (in `main`, right after its
/// `ready()`), or to act as a `wrapper` script that does not `exec`:
/// it starts the service as a child of its own (its pid in `wrapped.pid` under `EXAMPLE_DIR`) and
/// waits for it.
fn fail_as_successor(base: &std::path::Path) {
    let successor =
        std::env::var("PLANNED_STOP_READY_PID").ok() == Some(std::process::id().to_string());
    match std::env::var("EXAMPLE_FAIL_AS_SUCCESSOR").as_deref() {
        Ok("exit") if successor => std::process::exit(3),
        Ok("hang") if successor => loop {
            std::thread::park();
        },
        Ok("slow") if successor => std::thread::sleep(Duration::from_secs(1)),
        Ok("close") if successor => {
            let fd: i32 = env("PLANNED_STOP_READY_FD", "-1").parse().unwrap_or(-1);
            // SAFETY: the predecessor placed the readiness pipe at `fd` for this very process,
            // and nothing in it has taken the descriptor yet: this is the one owner, once.
            drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            loop {
                std::thread::park();
            }
        }
        Ok("wrapper") if successor => {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .env_remove("EXAMPLE_FAIL_AS_SUCCESSOR")
                .env_remove("PLANNED_STOP_READY_PID")
                .env_remove("LISTEN_PID")
                .env_remove("LISTEN_FDS")
                .env("EXAMPLE_ADDR", "127.0.0.1:0")
                .spawn()
                .unwrap();
            std::fs::write(base.join("wrapped.pid"), child.id().to_string()).unwrap();
            let _ = child.wait();
            std::process::exit(0);
        }
        _ => {}
    }
}

/// The record store: PostgreSQL when `EXAMPLE_RECORDS` names one (feature `postgres`), else the
/// state directory under `base`.
fn with_records(
    builder: ServiceBuilder,
    base: &std::path::Path,
) -> std::io::Result<ServiceBuilder> {
    #[cfg(feature = "postgres")]
    if let Ok(url) = std::env::var("EXAMPLE_RECORDS") {
        let store = planned_stop_postgres::PgRecordStore::from_url(
            &url,
            env("EXAMPLE_SERVICE", "task-service"),
        )
        .map_err(std::io::Error::other)?;
        return Ok(builder.record_store(Arc::new(store)));
    }
    Ok(builder.state_dir(base.join("state")))
}

/// The task group, the resume loop that feeds it what earlier lives and other replicas left, and
/// the jobs `main` spawns itself.
fn jobs(stop: &planned_stop::ServiceHandle) -> Jobs {
    let journal = Journal(std::env::var_os("EXAMPLE_JOURNAL").map(|p| Arc::new(p.into())));
    let jobs = Jobs {
        group: TaskGroup::new(stop, "jobs", move |job, cancel| {
            work(job, cancel, journal.clone())
        }),
    };
    // What earlier lives and other replicas left: leased now and every period, into the group.
    ResumeLoop::new(
        stop,
        Duration::from_millis(env_u64("EXAMPLE_RESUME_MS", 1000)),
    )
    .deliver_to(&jobs.group)
    .start();
    let ms = env_u64("EXAMPLE_JOB_MS", 2000);
    for n in 0..env_u64("EXAMPLE_MAIN_JOBS", 0) {
        let name = format!("main-{}-{n}", std::process::id());
        let _ = jobs.spawn(Job {
            name,
            ms,
            extra: None,
        });
    }
    jobs
}

#[actix_web::main]
async fn main() -> std::io::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let base = std::env::var_os("EXAMPLE_DIR").map_or_else(
        || std::env::temp_dir().join("planned-stop-task-service"),
        PathBuf::from,
    );
    let mut builder = ServiceBuilder::new(Layout::Slots(base.join("run")))
        .drain_deadline(Duration::from_secs(20))
        .max_failed_attempts(env_u64("EXAMPLE_MAX_FAILED", 3) as u32);
    if let Some(ms) = std::env::var("EXAMPLE_INGRESS_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        builder =
            builder.phase_deadline(planned_stop::DrainPhase::Ingress, Duration::from_millis(ms));
    }
    if let Some(ms) = std::env::var("EXAMPLE_RESTART_IN_PLACE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        builder = builder.restart_in_place(Duration::from_millis(ms));
    }
    fail_as_successor(&base);
    let stop = match with_records(builder, &base)?.start() {
        Ok(stop) => stop,
        Err(e) => {
            eprintln!("cannot start: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let jobs = jobs(&stop);
    let admin = planned_stop::web::Admin::new(&stop)
        .readiness("/ready")
        .status("/status")
        .bind(env("EXAMPLE_ADMIN_ADDR", "127.0.0.1:9091"))?;
    let ready = stop.clone();
    let server = HttpServer::new(move || {
        App::new()
            .wrap(planned_stop::web::CloseWhenStopping::new(&ready))
            .app_data(web::Data::new(jobs.clone()))
            .service(planned_stop::web::readiness("/ready", &ready))
            .route("/", web::get().to(|| async { "hello\n" }))
            .route("/jobs/{name}/{ms}", web::post().to(spawn_job))
            .route("/bad", web::post().to(bad_job))
    })
    .keep_alive(Duration::from_secs(env_u64("EXAMPLE_KEEP_ALIVE_S", 5)));
    // The sockets systemd (a `.socket` unit) or a supervisor handed over, else new ones: a
    // restart then refuses nothing, the connections wait in the socket's queue.
    let handed = std::env::var_os("LISTEN_FDS").is_some();
    let own = std::env::var_os("EXAMPLE_BIND_OWN").is_some();
    let server = if own || (handed && std::env::var_os("EXAMPLE_IGNORE_INHERITED").is_some()) {
        // For the tests: a socket the crate does not know of (restart in place refuses), or
        // handed-over sockets left unserved (refused by `serve`).
        server.bind(env("EXAMPLE_ADDR", "127.0.0.1:8080"))?
    } else {
        planned_stop::web::listeners_or_bind(&stop, env("EXAMPLE_ADDR", "127.0.0.1:8080"))?
            .into_iter()
            .try_fold(server, HttpServer::listen)?
    };
    let addr = server.addrs()[0];
    // For the test of a restart asked before the service is ready: it starts this much later.
    actix_web::rt::time::sleep(Duration::from_millis(env_u64("EXAMPLE_READY_AFTER_MS", 0))).await;
    stop.ready();
    if std::env::var("EXAMPLE_FAIL_AS_SUCCESSOR").as_deref() == Ok("exit_after_ready")
        && std::env::var("PLANNED_STOP_READY_PID").ok() == Some(std::process::id().to_string())
    {
        std::process::exit(3);
    }
    // Not `println!`: a closed stdout must not end the service (it would panic).
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "admin http://{}", admin.addrs()[0]);
    let _ = writeln!(out, "serving http://{addr} as pid {}", std::process::id());
    drop(out);
    planned_stop::web::serve(server, &stop)
        .grace(Duration::from_millis(env_u64("EXAMPLE_GRACE_MS", 1000)))
        .await
}

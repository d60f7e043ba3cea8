//! A helper program of `tests/service.rs` (not a test, not an example for users): a service that
//! ends the process itself, in the role its first argument names, in `PLANNED_STOP_TEST_DIR`:
//!
//! - `watcher-panics`, `runner-panics`, `watcher-panics-not-owned`: a clock that panics once armed
//!   stands in for a bug in the watcher or the runner;
//! - `blocked-drain`: a participant blocks the event loop past the drain's deadline and grace;
//! - `blocked-persist`: the record store's persist blocks the event loop;
//! - `work-life`: one life of an application whose jobs live in a `WorkSet` (`JOB_MS`,
//!   `NEW_JOB`).
//!
//! Its log goes to stderr, where the test reads it.

// The tests' own participants and faulty store, included whole: this program uses a part.
#[path = "../common/actors.rs"]
#[allow(dead_code)]
mod actors;
#[path = "../common/faulty.rs"]
#[allow(dead_code)]
mod faulty;
mod program;

use actix::prelude::*;
use actors::ParticipantControl;
use chrono::Utc;
use faulty::{Fault, Faulty};
use planned_stop::{Layout, ServiceBuilder, StopRequest};
use program::HELPER_LIFETIME;
use std::path::Path;
use std::time::Duration;

fn main() {
    program::give_up_after_helper_lifetime();
    let role = std::env::args().nth(1).unwrap_or_default();
    let dir = std::path::PathBuf::from(std::env::var("PLANNED_STOP_TEST_DIR").unwrap());
    if role != "work-life" {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    match role.as_str() {
        "watcher-panics" | "runner-panics" | "watcher-panics-not-owned" => {
            panicking_service(&role, &dir)
        }
        "blocked-drain" => blocked_drain(&dir),
        "blocked-persist" => blocked_persist(&dir),
        "work-life" => work_life(&dir),
        other => panic!("no such role: {other:?}"),
    }
}

/// A clock that panics once armed: a stand-in for any bug in the watcher or the runner.
struct Bomb(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl planned_stop::internals::Clock for Bomb {
    fn now(&self) -> chrono::DateTime<Utc> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("clock bomb");
        }
        Utc::now()
    }
}

/// A service whose clock panics once armed: in the watcher (`watcher-panics`, also with
/// `owns_process_exit(false)`: `watcher-panics-not-owned`) or in the runner (`runner-panics`).
fn panicking_service(role: &str, dir: &Path) {
    let armed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    actix::System::new().block_on(async {
        // The watcher probes every 10 ms, or (to let the runner panic first) once an hour.
        let poll = match role {
            "watcher-panics" | "watcher-panics-not-owned" => Duration::from_millis(10),
            _ => Duration::from_secs(3600),
        };
        let owned = role != "watcher-panics-not-owned";
        let h = ServiceBuilder::new(Layout::Slots(dir.join("run")))
            .owns_process_exit(owned)
            .poll_interval(poll)
            .handle_signals(false)
            .events(false)
            .clock(std::sync::Arc::new(Bomb(armed.clone())))
            .start()
            .unwrap();
        h.ready();
        armed.store(true, std::sync::atomic::Ordering::SeqCst);
        if role == "runner-panics" {
            // The runner reads the clock when it accepts the stop.
            h.request_stop(StopRequest::Planned);
        }
        if !owned {
            // The watcher panics within a few polls; the application goes on, then ends.
            actix::clock::sleep(Duration::from_millis(500)).await;
            std::process::exit(0);
        }
        h.stopped().await
    });
    // `main` then returns (), exit 0: the runner's code must stand all the same. Returned, not
    // `std::process::exit(0)`, which on Windows ends the process without the C runtime's exit
    // handlers (Rust calls ExitProcess there), as docs/design.md says.
}

/// A participant that blocks the event loop: the runner's own deadline timers cannot fire.
struct Blocker;

impl Actor for Blocker {
    type Context = Context<Self>;
}

impl Handler<planned_stop::Drain> for Blocker {
    type Result = planned_stop::DrainReport;
    fn handle(&mut self, _: planned_stop::Drain, _: &mut Context<Self>) -> Self::Result {
        std::thread::sleep(HELPER_LIFETIME);
        planned_stop::DrainReport::done()
    }
}

/// A drain whose participant blocks the event loop past the deadline and its grace.
fn blocked_drain(dir: &Path) {
    println!("helper-pid {}", std::process::id());
    actix::System::new().block_on(async {
        let (quick, control) = ParticipantControl::start();
        let h = ServiceBuilder::new(Layout::Slots(dir.join("run")))
            .drain_deadline(Duration::from_millis(200))
            .overrun_grace(Duration::from_millis(300))
            .participant_in(planned_stop::DrainPhase::Ingress, "quick", quick)
            .participant("blocker", Blocker.start().recipient())
            .handle_signals(false)
            .events(false)
            .on_forced_exit(|code, verdict| println!("forced-exit {code} {verdict:?}"))
            .start()
            .unwrap();
        h.ready();
        h.request_stop(StopRequest::Planned);
        control.wait_asked().await;
        assert!(control.finish(&[]));
        h.stopped().await
    });
    std::process::exit(0);
}

/// A stop whose persist blocks the event loop, with one item to make durable.
fn blocked_persist(dir: &Path) {
    actix::System::new().block_on(async {
        let (jobs, control) = ParticipantControl::start();
        let h = ServiceBuilder::new(Layout::Slots(dir.join("run")))
            .record_store(Faulty::new(&dir.join("state"), Fault::PersistBlocks))
            .drain_deadline(Duration::from_millis(200))
            .persist_deadline(Duration::from_millis(100))
            .overrun_grace(Duration::from_millis(300))
            .participant("jobs", jobs)
            .handle_signals(false)
            .events(false)
            .start()
            .unwrap();
        h.ready();
        h.request_stop(StopRequest::Planned);
        control.wait_asked().await;
        assert!(control.finish(&["job-41"]));
        h.stopped().await
    });
    std::process::exit(0);
}

/// A participant built on `WorkSet`: each job runs `JOB_MS`, then completes (a resumed one is
/// acknowledged then); a drain hands back whatever is still running.
struct WorkActor {
    work: planned_stop::WorkSet<String>,
    job: Duration,
}

impl Actor for WorkActor {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
enum Take {
    New(String),
    Resumed(Box<planned_stop::record::Leased>),
}

impl Handler<Take> for WorkActor {
    type Result = ();
    fn handle(&mut self, take: Take, ctx: &mut Context<Self>) {
        let id = match take {
            Take::New(name) => self.work.add(name).unwrap(),
            Take::Resumed(leased) => self.work.add_resumed(*leased).unwrap(),
        };
        let name = self.work.get(id).unwrap().clone();
        println!("started {name} resumed={}", self.work.is_resumed(id));
        ctx.run_later(self.job, move |act, ctx| {
            let completing = act.work.complete(id);
            ctx.spawn(actix::fut::wrap_future(async move {
                completing.await.unwrap();
                println!("acked {name}");
            }));
        });
    }
}

impl Handler<planned_stop::Drain> for WorkActor {
    type Result = planned_stop::DrainReport;
    fn handle(&mut self, _: planned_stop::Drain, _: &mut Context<Self>) -> Self::Result {
        self.work.drain()
    }
}

/// One life of an application whose jobs live in a `WorkSet`.
fn work_life(dir: &Path) {
    let dir = dir.to_path_buf();
    let job = Duration::from_millis(std::env::var("JOB_MS").unwrap().parse().unwrap());
    let new = std::env::var("NEW_JOB").ok().filter(|n| !n.is_empty());
    // main returns whatever; the runner's code is the process's (it owns the end).
    let _code = actix::System::new().block_on(async move {
        let service = ServiceBuilder::new(Layout::Slots(dir.join("run")))
            .state_dir(dir.join("state"))
            .start()
            .unwrap();
        let work = WorkActor {
            work: planned_stop::WorkSet::new(&service),
            job,
        }
        .start();
        service.add_participant(
            planned_stop::DrainPhase::Work,
            "work",
            work.clone().recipient(),
        );
        for leased in service.resume().await.unwrap() {
            work.send(Take::Resumed(Box::new(leased))).await.unwrap();
        }
        if let Some(name) = new {
            work.send(Take::New(name)).await.unwrap();
        }
        service.ready();
        println!("ready");
        service.stopped().await
    });
}

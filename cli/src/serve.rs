//! `planned-stop serve`: the reference actix service built on the crate.
//!
//! It runs `--jobs N` simulated jobs of `--job-ms` each, every job a drain participant. A job that
//! can finish within the drain deadline finishes; one that cannot is handed back unfinished and goes
//! into the record store in `--state DIR`, and a later start leases and resumes exactly those jobs,
//! acknowledging each when it finishes (or handing it back again at its own stop). Lifecycle
//! events go to stdout as JSON lines:
//!
//! - `{"event":"resumed","jobs":K,"items":[...],"ids":[...]}` (with `--state`, before `ready`)
//! - `{"event":"acked","id":I,"item":NAME}` (a resumed job finished and was acknowledged)
//! - `{"event":"ready","pid":N,"start":S,"jobs":J}`
//! - `{"event":"stop_accepted","cause":...,"verdict":...,"request_id":...}`
//! - `{"event":"draining","deadline_ms":D}`
//! - `{"event":"exit","code":C,"verdict":"planned"|"unexpected"}`

use super::{EXIT_USAGE, LayoutArgs, chain, emit, fail};
use actix::clock::Instant;
use actix::prelude::*;
use clap::Args;
use planned_stop::record::Leased;
use planned_stop::{Drain, DrainReport, RunnerStatus, ServiceBuilder, ServiceHandle, StopVerdict};
use serde_json::json;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Arguments of `serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub layout: LayoutArgs,
    /// State directory: the stop record (resume list) is written and read here.
    #[arg(long, value_name = "DIR")]
    pub state: Option<PathBuf>,
    /// How often the watcher probes the marker, in milliseconds.
    #[arg(long, default_value_t = 250)]
    pub poll_ms: u64,
    /// Simulated jobs to run (in addition to resumed ones).
    #[arg(long, default_value_t = 0)]
    pub jobs: u32,
    /// How long each job takes, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub job_ms: u64,
    /// How long the jobs have to drain, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    pub drain_ms: u64,
    /// Accept a marker directory writable by group or others.
    #[arg(long)]
    pub allow_shared_dir: bool,
    /// Accept a state directory writable by group or others.
    #[arg(long)]
    pub allow_shared_state: bool,
    /// Keep unfinished work in PostgreSQL (`postgres://…`; `PG*` variables fill in the rest), so
    /// any replica resumes it; `--state DIR` is then where a stop spills when the database is
    /// unreachable. Needs the `postgres` feature.
    #[arg(long, value_name = "URL")]
    pub records: Option<String>,
    /// The service name that scopes the items in the database (replicas of one service share it).
    #[arg(long, default_value = "planned-stop")]
    pub service: String,
    /// How long a lease lasts for a holder on another host, in milliseconds (at least 5000:
    /// leases are renewed every third of it).
    #[arg(long, default_value_t = 300_000)]
    pub lease_ms: u64,
    /// Lease again every N milliseconds while running, resuming what other replicas left (0: only
    /// at start).
    #[arg(long, default_value_t = 0)]
    pub resume_every_ms: u64,
    /// How many failed attempts (a life that ended holding an item, killed or crashed) an item
    /// may have before it is held aside for a person instead of resumed (`records list` shows
    /// it, `records release` offers it again). At least 1.
    #[arg(long, default_value_t = planned_stop::DEFAULT_MAX_FAILED_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_failed_attempts: u32,
    /// Restart in place: a planned restart starts the successor (this command again, with its
    /// arguments) and waits up to N milliseconds for it to be ready before this process drains
    /// and exits 0; a successor that fails leaves this process running (0: off, a restart exits
    /// 75 for the supervisor).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub restart_in_place_ms: u64,
    /// Poll only: do not use filesystem notifications.
    #[arg(long)]
    pub no_events: bool,
}

/// One simulated job: done `duration` after it started. A drain participant. A resumed job
/// holds its lease: it acknowledges the item when it finishes, or hands it back at a stop.
struct Job {
    name: String,
    started: Instant,
    duration: Duration,
    leased: Option<(Leased, ServiceHandle)>,
    done: bool,
}

impl Job {
    fn remaining(&self) -> Duration {
        self.duration.saturating_sub(self.started.elapsed())
    }

    /// Marks the job done and, for a resumed one, acknowledges its item (once).
    fn finish(&mut self) -> impl ActorFuture<Self, Output = ()> + 'static {
        let ack = match (&self.leased, self.done) {
            (Some((leased, handle)), false) => {
                Some((leased.item.id.clone(), handle.acknowledge(leased)))
            }
            _ => None,
        };
        self.done = true;
        let name = self.name.clone();
        async move {
            if let Some((id, ack)) = ack {
                match ack.await {
                    Ok(()) => emit(json!({ "event": "acked", "id": id, "item": name })),
                    Err(e) => {
                        tracing::error!(error = %chain(&e), id, "cannot acknowledge a resumed job")
                    }
                }
            }
        }
        .into_actor(self)
    }
}

impl Actor for Job {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // A resumed job acknowledges its item as soon as it is done, not only at a stop.
        if self.leased.is_some() {
            ctx.run_later(self.remaining(), |job, ctx| {
                let finish = job.finish();
                ctx.wait(finish);
            });
        }
    }
}

/// How much before the runner's deadline a job answers, so its answer is never late.
const ANSWER_MARGIN: Duration = Duration::from_millis(20);

impl Handler<Drain> for Job {
    type Result = ResponseActFuture<Self, DrainReport>;

    fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> Self::Result {
        if self.done {
            return Box::pin(actix::fut::ready(DrainReport::default()));
        }
        let remaining = self.remaining();
        let budget = drain.within.saturating_sub(ANSWER_MARGIN);
        let finishes = remaining <= budget;
        let wait = if finishes { remaining } else { budget };
        Box::pin(
            actix::clock::sleep(wait)
                .into_actor(self)
                .then(move |(), job, _| {
                    let report = if finishes || job.done {
                        DrainReport::default()
                    } else if let Some((leased, _)) = job.leased.clone() {
                        job.done = true;
                        DrainReport::default().with_handed_back([leased])
                    } else {
                        DrainReport::unfinished([job.name.clone()])
                    };
                    let finish: std::pin::Pin<Box<dyn ActorFuture<Job, Output = ()>>> = if finishes
                    {
                        Box::pin(job.finish())
                    } else {
                        Box::pin(actix::fut::ready(()))
                    };
                    finish.map(move |(), _, _| report)
                }),
        )
    }
}

/// Runs `serve`; returns the process exit code (0 planned, 1 unexpected).
pub fn run(args: ServeArgs) -> u8 {
    let layout = match args.layout.layout() {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let system = System::new();
    let started = system.block_on(start(&args, layout));
    let handle = match started {
        Ok(h) => h,
        Err(e) => return fail(e),
    };
    let code = match system.run_with_code() {
        Ok(code) => code,
        Err(e) => return fail(format!("the actix system failed: {e}")),
    };
    let status = handle.status();
    // A stop with nothing to drain can end before the follower task ran: report it now.
    if !ACCEPTANCE_REPORTED.load(Ordering::SeqCst) {
        report_acceptance(&status, args.drain_ms);
    }
    let verdict = match status.verdict {
        Some(StopVerdict::Planned) => "planned",
        _ => "unexpected",
    };
    emit(json!({ "event": "exit", "code": code, "verdict": verdict }));
    u8::try_from(code).unwrap_or(EXIT_USAGE)
}

/// `serve` runs jobs and serves no socket: sockets handed to it (a `.socket` unit,
/// systemd-socket-activate) would queue connections nobody answers, while it said ready.
fn refuse_handed_sockets(pid: u32) -> Result<(), String> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u32>().ok());
    match var("LISTEN_FDS") {
        Some(n) if n > 0 && var("LISTEN_PID") == Some(pid) => Err(format!(
            "serve serves no sockets, and it was handed {n} (LISTEN_FDS: a .socket unit or \
             systemd-socket-activate): connections to them would wait unanswered; run serve \
             without a socket, or serve them from your own application through \
             planned_stop::web::listeners_or_bind"
        )),
        _ => Ok(()),
    }
}

async fn start(args: &ServeArgs, layout: planned_stop::Layout) -> Result<ServiceHandle, String> {
    let pid = std::process::id();
    refuse_handed_sockets(pid)?;
    // Named by this process's pid, so resumed jobs and new ones never share a name.
    let names: Vec<String> = (0..args.jobs).map(|i| format!("job-{pid}-{i}")).collect();
    let mut builder = ServiceBuilder::new(layout)
        .poll_interval(Duration::from_millis(args.poll_ms.max(1)))
        .drain_deadline(Duration::from_millis(args.drain_ms))
        .allow_shared_dir(args.allow_shared_dir)
        .allow_shared_state(args.allow_shared_state)
        .events(!args.no_events)
        // The library ending the process itself (the overrun watchdog, a guard) still says so
        // on stdout, last, as every exit does.
        .on_forced_exit(|code, verdict| {
            let verdict = match verdict {
                Some(StopVerdict::Planned) => "planned",
                _ => "unexpected",
            };
            emit(json!({ "event": "exit", "code": code, "verdict": verdict }));
        });
    let store = super::record_store(
        args.state.as_deref(),
        args.records.as_deref(),
        &args.service,
        args.allow_shared_state,
        super::Access::Serve,
    )?;
    let keeps_records = store.is_some();
    if let Some(store) = store {
        builder = builder.record_store(store);
    }
    builder = builder
        .lease_for(Duration::from_millis(args.lease_ms))
        .max_failed_attempts(args.max_failed_attempts);
    if args.restart_in_place_ms > 0 {
        builder = builder.restart_in_place(Duration::from_millis(args.restart_in_place_ms));
    }
    let duration = Duration::from_millis(args.job_ms);
    let job = |name: &str, leased| {
        Job {
            name: name.to_owned(),
            started: Instant::now(),
            duration,
            leased,
            done: false,
        }
        .start()
    };
    for name in &names {
        builder = builder.participant(name.clone(), job(name, None).recipient());
    }
    let handle = builder.start().map_err(|e| chain(&e))?;
    // Leased before `ready`: a stop that comes meanwhile is held, and the resumed jobs take part.
    let resumed = if keeps_records {
        resume(&handle, duration).await
    } else {
        0
    };
    if keeps_records && args.resume_every_ms > 0 {
        // The library's loop: at most DEFAULT_RESUME_BATCH items a lease, none once a drain has
        // begun, and what a lease brings after that handed back in the same stop.
        let every = Duration::from_millis(args.resume_every_ms);
        let jobs = handle.clone();
        planned_stop::ResumeLoop::new(&handle, every)
            .otherwise(move |leased| {
                let name = start_resumed(&jobs, duration, &leased);
                emit(json!({ "event": "resumed", "jobs": 1, "items": [name], "ids": [leased.item.id] }));
                None
            })
            .start();
    }
    follow(&handle, args.drain_ms);
    handle.ready();
    let id = planned_stop::ProcessIdentity::current().map_err(|e| e.to_string())?;
    emit(
        json!({ "event": "ready", "pid": id.pid, "start": id.start, "jobs": names.len() + resumed }),
    );
    Ok(handle)
}

/// Leases what is on offer and starts a job per item (a drain participant that acknowledges its
/// item when done); prints `resumed`. Returns how many. A store that cannot be reached is logged
/// and resumes nothing: the items wait for the next try (or another replica).
async fn resume(handle: &ServiceHandle, duration: Duration) -> usize {
    let leased = match handle.resume().await {
        Ok(leased) => leased,
        Err(e) => {
            tracing::error!(error = %chain(&e), "cannot resume the unfinished items now");
            Vec::new()
        }
    };
    let names: Vec<String> = leased
        .iter()
        .map(|item| start_resumed(handle, duration, item))
        .collect();
    let ids: Vec<&str> = leased.iter().map(|l| l.item.id.as_str()).collect();
    emit(json!({ "event": "resumed", "jobs": names.len(), "items": names, "ids": ids }));
    names.len()
}

/// Starts a job for the resumed `item`, a drain participant that acknowledges it when done;
/// returns the job's name.
fn start_resumed(handle: &ServiceHandle, duration: Duration, item: &Leased) -> String {
    // The reference service hands back job names; anything else is resumed under its JSON.
    let name = item
        .item
        .item_as::<String>()
        .unwrap_or_else(|_| item.item.item.to_string());
    let addr = Job {
        name: name.clone(),
        started: Instant::now(),
        duration,
        leased: Some((item.clone(), handle.clone())),
        done: false,
    }
    .start();
    handle.add_participant(
        planned_stop::DrainPhase::Work,
        name.clone(),
        addr.recipient(),
    );
    name
}

/// Whether `stop_accepted` has been printed.
static ACCEPTANCE_REPORTED: AtomicBool = AtomicBool::new(false);

/// Prints `stop_accepted` and `draining` when the runner starts draining.
fn follow(handle: &ServiceHandle, drain_ms: u64) {
    let mut status = handle.subscribe();
    actix::spawn(async move {
        while status.changed().await.is_ok() {
            let now = status.borrow_and_update().clone();
            if now.state.is_stopping() {
                report_acceptance(&now, drain_ms);
                return;
            }
        }
    });
}

/// Prints `stop_accepted` and `draining`, once.
fn report_acceptance(status: &RunnerStatus, drain_ms: u64) {
    if !status.state.is_stopping() || ACCEPTANCE_REPORTED.swap(true, Ordering::SeqCst) {
        return;
    }
    let outcome = status.outcome.as_deref();
    emit(json!({
        "event": "stop_accepted",
        "cause": outcome.map(|o| o.cause),
        "verdict": status.verdict,
        "request_id": outcome.and_then(|o| o.request_id.clone()),
    }));
    emit(json!({ "event": "draining", "deadline_ms": drain_ms }));
}

//! The replica of `tests/chaos.rs` (a helper program, not a test, not an example for users): a
//! small application on the library whose new jobs and resumed items are logged from birth to
//! end in the run's event log, on PostgreSQL or a shared state directory, behind a store wrapper
//! that injects the run's defect, if any. Its environment (`CHAOS_*`) says where and how.

mod chaos_log;
mod program;

use actix::prelude::*;
use chaos_log::{Log, seed};
use planned_stop::Layout;
use planned_stop::internals::SystemClock;
use planned_stop::record::{
    FileRecordStore, ItemState, Leased, Owner, Persisted, RecordError, RecordFuture, RecordStore,
    Sharing, StopRecord,
};
use planned_stop::{Drain, DrainPhase, DrainReport, ServiceBuilder, ServiceHandle};
use planned_stop_postgres::PgRecordStore;
use program::Lcg;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// The replica: a small application on the library.

/// A store with an injected defect, or none. The defects live here, in the test, never in the
/// library.
#[derive(Debug)]
struct Defective {
    inner: Arc<dyn RecordStore>,
    defect: String,
    new_items: AtomicUsize,
    /// Where every lease, hold-aside and release this replica's store makes is logged (`leased`,
    /// `held_aside`, `gave_back`): what the store says this replica holds, whether or not the library then
    /// delivers it to a job (an item it leases again while a job still has it is not).
    log: Log,
    who: String,
}

impl Defective {
    /// The record as the defect would write it: every second new item dropped, hand-backs
    /// acknowledged instead of written back, or each new item written twice under two ids.
    async fn defective_record(&self, stopper: &Owner, record: &StopRecord) -> StopRecord {
        let mut record = record.clone();
        match self.defect.as_str() {
            "persist-drops-new" => record
                .unfinished
                .retain(|u| u.resumed || self.new_items.fetch_add(1, Ordering::Relaxed) % 2 == 1),
            "persist-acks-hand-backs" => {
                let (back, new): (Vec<_>, Vec<_>) =
                    record.unfinished.drain(..).partition(|u| u.resumed);
                for item in back {
                    if let Some(id) = &item.id {
                        let _ = self.inner.acknowledge(stopper, id).await;
                    }
                }
                record.unfinished = new;
            }
            "persist-twice" => {
                let twins: Vec<_> = record
                    .unfinished
                    .iter()
                    .filter(|u| !u.resumed && u.id.is_some())
                    .map(|u| {
                        let mut twin = u.clone();
                        twin.id = u.id.as_ref().map(|id| format!("{id}-twin"));
                        twin
                    })
                    .collect();
                record.unfinished.extend(twins);
            }
            _ => {}
        }
        record
    }
}

impl RecordStore for Defective {
    fn persist<'a>(
        &'a self,
        s: &'a Owner,
        r: std::sync::Arc<StopRecord>,
    ) -> RecordFuture<'a, Persisted> {
        Box::pin(async move {
            let record = self.defective_record(s, &r).await;
            self.inner.persist(s, record.into()).await
        })
    }
    fn lease<'a>(&'a self, o: &'a Owner, m: usize, d: Duration) -> RecordFuture<'a, Vec<Leased>> {
        Box::pin(async move {
            let leased = self.inner.lease(o, m, d).await?;
            for l in &leased {
                let token = l.item.item.as_str().unwrap_or_default();
                let event = json!({"event": "leased", "id": l.item.id, "token": token});
                self.log.event(&self.who, event);
            }
            Ok(leased)
        })
    }
    fn renew<'a>(
        &'a self,
        o: &'a Owner,
        ids: &'a [String],
        d: Duration,
    ) -> RecordFuture<'a, Vec<String>> {
        if self.defect == "renewal-off" {
            let ids = ids.to_vec();
            return Box::pin(async move { Ok(ids) });
        }
        self.inner.renew(o, ids, d)
    }
    fn acknowledge<'a>(&'a self, o: &'a Owner, id: &'a str) -> RecordFuture<'a, ()> {
        if self.defect == "ack-skips-lease" {
            return Box::pin(async move {
                match self.inner.remove(id).await? {
                    true => Ok(()),
                    false => Err(RecordError::UnknownItem { id: id.into() }),
                }
            });
        }
        self.inner.acknowledge(o, id)
    }
    fn release<'a>(&'a self, o: Option<&'a Owner>, id: &'a str) -> RecordFuture<'a, bool> {
        Box::pin(async move {
            let released = self.inner.release(o, id).await?;
            if released && o.is_some() {
                self.log
                    .event(&self.who, json!({"event": "gave_back", "id": id}));
            }
            Ok(released)
        })
    }
    fn hold_aside<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        id: &'a str,
        reason: &'a str,
    ) -> planned_stop::record::RecordFuture<'a, ()> {
        Box::pin(async move {
            self.inner.hold_aside(o, id, reason).await?;
            self.log
                .event(&self.who, json!({"event": "held_aside", "id": id}));
            Ok(())
        })
    }
    fn remove<'a>(&'a self, id: &'a str) -> RecordFuture<'a, bool> {
        self.inner.remove(id)
    }
    fn list(&self) -> RecordFuture<'_, Vec<ItemState>> {
        self.inner.list()
    }
    fn last_stop(&self) -> RecordFuture<'_, Option<StopRecord>> {
        self.inner.last_stop()
    }
}

/// One unit of work: new (its token) or resumed (leased, with the handle that acknowledges it).
/// Acknowledged when done; handed back when a drain comes first.
struct Job {
    token: String,
    leased: Option<(Leased, ServiceHandle)>,
    log: Log,
    who: String,
    duration: Duration,
    done: bool,
}

impl Job {
    fn id(&self) -> Option<&str> {
        self.leased.as_ref().map(|(l, _)| l.item.id.as_str())
    }
}

impl Actor for Job {
    type Context = Context<Self>;
    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.run_later(self.duration, |job, ctx| {
            if job.done {
                return;
            }
            job.done = true;
            let Some((leased, handle)) = job.leased.clone() else {
                return; // new work, finished in its own life: never an item
            };
            let (log, who, token) = (job.log.clone(), job.who.clone(), job.token.clone());
            let id = leased.item.id.clone();
            // Logged before the acknowledgement: one the store recorded for a life killed before
            // it could log `acked` is still work done.
            log.event(
                &who,
                json!({"event": "completing", "id": id, "token": token}),
            );
            let ack = handle.acknowledge(&leased);
            ctx.wait(
                async move {
                    if ack.await.is_ok() {
                        log.event(&who, json!({"event": "acked", "id": id, "token": token}));
                    }
                }
                .into_actor(job),
            );
        });
    }
}

impl Handler<Drain> for Job {
    type Result = DrainReport;
    fn handle(&mut self, _: Drain, _: &mut Context<Self>) -> DrainReport {
        if self.done {
            return DrainReport::done();
        }
        self.done = true;
        let event = json!({"event": "handed_back", "id": self.id(), "token": self.token});
        match self.leased.clone() {
            Some((leased, _)) => {
                self.log.event(&self.who, event);
                DrainReport::done().with_handed_back([leased])
            }
            None => {
                self.log.event(
                    &self.who,
                    json!({"event": "handed_back_new", "token": self.token}),
                );
                DrainReport::unfinished([self.token.clone()])
            }
        }
    }
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

/// The replica's store: PostgreSQL (spilling to its state directory) or the shared directory,
/// behind the defect wrapper. The defect `lease-on-local-clock` judges PostgreSQL's leases on the
/// replica's own (skewed) clock, as the library once did.
fn replica_store(state: &Path, log: &Log, who: &str) -> Arc<Defective> {
    let inner: Arc<dyn RecordStore> = if env("CHAOS_STORE") == "pg" {
        let mut pg = PgRecordStore::from_url(&env("CHAOS_URL"), env("CHAOS_SERVICE"))
            .unwrap()
            .operation_timeout(Duration::from_secs(2))
            .spill_to(FileRecordStore::open(state, Sharing::Refused).unwrap());
        if env("CHAOS_DEFECT") == "lease-on-local-clock" {
            pg = pg.clock(Arc::new(SystemClock));
        }
        Arc::new(pg)
    } else {
        Arc::new(FileRecordStore::open(state, Sharing::Refused).unwrap())
    };
    Arc::new(Defective {
        inner,
        defect: env("CHAOS_DEFECT"),
        new_items: AtomicUsize::new(0),
        log: log.clone(),
        who: who.to_owned(),
    })
}

/// Leases what is on offer every 300 ms while the service runs, and works on each item (in the
/// quiet phase briefly; otherwise most finish within a life and one in five outlasts a lease).
/// Each `resumed` event says when its lease call began (`asked`): the lease happened after it.
/// The defect `delivered-twice` starts a second job on each item it is given, as the library
/// did with an item leased again after an operator's release while its first job still ran.
/// In the run of the defect `ack-skips-lease`, every job lasts 2.5 to 4.5 s: that defect shows
/// only when an operator's release catches a holder mid-job and the holder acknowledges after
/// it, and short jobs made that a matter of luck (one CI run missed it three times in a row).
fn resume_loop(handle: ServiceHandle, log: Log, who: String, quiet: bool) {
    let catch_mid_job = env("CHAOS_DEFECT") == "ack-skips-lease";
    actix::spawn(async move {
        let mut rng = Lcg(seed());
        let deliveries = if env("CHAOS_DEFECT") == "delivered-twice" {
            2
        } else {
            1
        };
        while handle.status().state == planned_stop::ProcessState::Running {
            let asked = chaos_log::now_ns().to_string();
            if let Ok(leased) = handle.resume().await {
                for item in leased
                    .iter()
                    .flat_map(|l| std::iter::repeat_n(l, deliveries))
                {
                    let token = item.item.item.as_str().unwrap_or_default().to_owned();
                    let id = item.item.id.clone();
                    let event =
                        json!({"event": "resumed", "id": id, "token": token, "asked": asked});
                    log.event(&who, event);
                    let duration = match (quiet, rng.below(5)) {
                        (true, _) => 20 + rng.below(80),
                        (false, _) if catch_mid_job => 2500 + rng.below(2000),
                        (false, 0) => 6000 + rng.below(3000),
                        (false, _) => 200 + rng.below(2500),
                    };
                    let job = Job {
                        token,
                        leased: Some((item.clone(), handle.clone())),
                        log: log.clone(),
                        who: who.clone(),
                        duration: Duration::from_millis(duration),
                        done: false,
                    }
                    .start();
                    handle.add_participant(DrainPhase::Work, "resumed", job.recipient());
                }
            }
            actix::clock::sleep(Duration::from_millis(300)).await;
        }
    });
}

/// One life of a replica: its jobs, its resume loop, its stop; every event in the run's log.
fn main() {
    // The ERROR line of a stop that could not record its items is where the checker finds them.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let log = Log::open(Path::new(&env("CHAOS_LOG")));
    let who = format!("{}:{}", env("CHAOS_NAME"), std::process::id());
    let mut rng = Lcg(u64::from(std::process::id()) ^ seed());
    let state = PathBuf::from(env("CHAOS_STATE"));
    let code = actix::System::new().block_on(async {
        let mut builder = ServiceBuilder::new(Layout::Slots(env("CHAOS_RUN").into()))
            .record_store(replica_store(&state, &log, &who))
            .lease_for(planned_stop::MIN_LEASE)
            .drain_deadline(Duration::from_millis(400))
            .poll_interval(Duration::from_millis(20));
        if !env("FAKETIME").is_empty() {
            // libfaketime skews this process's wall clock (and its stopper's) but not the
            // kernel's record of when it started (`/proc`), which on a host whose clock is really
            // off is off by as much: a marker written "10 s before the start" is that artifact,
            // not a stale marker. The slack covers it; the lease rules are what this run tests.
            builder = builder.policy(
                planned_stop::marker::Policy::default().with_start_slack(Duration::from_secs(15)),
            );
        }
        let jobs: u64 = env("CHAOS_JOBS").parse().unwrap_or(0);
        for i in 0..jobs {
            let job = Job {
                // Unique across the run: the pid, the job and this life's seed.
                token: format!("t{}x{i}x{:x}", std::process::id(), rng.below(u64::MAX)),
                leased: None,
                log: log.clone(),
                who: who.clone(),
                duration: Duration::from_millis(500 + rng.below(15_000)),
                done: false,
            }
            .start();
            builder = builder.participant(format!("job-{i}"), job.recipient());
        }
        let handle = builder.start().unwrap();
        handle.ready();
        log.event(&who, json!({"event": "ready"}));
        resume_loop(
            handle.clone(),
            log.clone(),
            who.clone(),
            env("CHAOS_QUIET") == "1",
        );
        handle.stopped().await;
        handle.status().exit_code()
    });
    log.event(&who, json!({"event": "exit", "code": code}));
}

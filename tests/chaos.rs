//! The fleet in chaos (issue 22.16): replicas on PostgreSQL and on a shared state directory, under
//! random planned stops and restarts, SIGKILLs, SIGSTOP/SIGCONT, database pauses and restarts and
//! operator releases and drops, while every life submits new work. Every replica and the harness
//! write their events (with wall-clock nanoseconds, one host) to a log; [`check`] reads it.
//!
//! The checker asserts: every item a planned stop recorded, or a replica resumed, is acknowledged
//! exactly once, dropped by the operator, or still listed at the end; no item is held by two live
//! holders at once (holding runs from `resumed` to the holder's `acked`, `handed_back`, exit or
//! kill, or the operator's release or drop); no acknowledgement comes from a process that does not
//! hold the item. It must be able to fail: the replicas can run with an injected defect (a store
//! wrapper that does not renew, or that acknowledges without the lease check), and the defect runs
//! require a violation.
//!
//! Runs only when asked (`just chaos SECS`): `#[ignore]`d otherwise, with the
//! reason. Needs PostgreSQL's binaries (`ci/postgres.sh` starts a private server) and Unix.

#![cfg(all(unix, feature = "postgres"))]

mod common;
use common::Lcg;

use actix::prelude::*;
use planned_stop::Layout;
use planned_stop::record::{
    FileRecordStore, ItemState, Leased, Owner, Persisted, PgRecordStore, RecordError, RecordFuture,
    RecordStore, Sharing, StopRecord,
};
use planned_stop::{Drain, DrainPhase, DrainReport, PlannedStopService, ServiceHandle};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Wall-clock nanoseconds: every process of the run is on this host, so one clock orders them.
fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// An append-only event log (one JSON object a line), shared by the threads of one process.
#[derive(Clone)]
struct Log(Arc<Mutex<std::fs::File>>);

impl Log {
    fn open(path: &Path) -> Log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        Log(Arc::new(Mutex::new(file)))
    }

    fn event(&self, who: &str, mut fields: Value) {
        fields["at"] = json!(now_ns().to_string());
        fields["who"] = json!(who);
        // One write of the whole line: every process appends to the same file (O_APPEND), and
        // a line written in pieces could interleave with another process's.
        let line = format!("{fields}\n");
        self.0.lock().unwrap().write_all(line.as_bytes()).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// The replica: a small application on the library.

/// A store with an injected defect, or none.
#[derive(Debug)]
struct Defective {
    inner: Arc<dyn RecordStore>,
    defect: String,
}

impl RecordStore for Defective {
    fn persist<'a>(&'a self, s: &'a Owner, r: &'a StopRecord) -> RecordFuture<'a, Persisted> {
        self.inner.persist(s, r)
    }
    fn lease<'a>(&'a self, o: &'a Owner, m: usize, d: Duration) -> RecordFuture<'a, Vec<Leased>> {
        self.inner.lease(o, m, d)
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
        self.inner.release(o, id)
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

/// One unit of work: new (named) or resumed (leased, with the handle that acknowledges it).
/// Acknowledged when done; handed back when a drain comes first.
struct Job {
    name: String,
    leased: Option<(Leased, ServiceHandle)>,
    log: Log,
    who: String,
    duration: Duration,
    done: bool,
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
            let ack = handle.acknowledge(&leased);
            let (log, who) = (job.log.clone(), job.who.clone());
            ctx.wait(
                async move {
                    if ack.await.is_ok() {
                        log.event(&who, json!({"event": "acked", "id": leased.item.id}));
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
        match self.leased.clone() {
            Some((leased, _)) => {
                self.log.event(
                    &self.who,
                    json!({"event": "handed_back", "id": leased.item.id}),
                );
                DrainReport::done().with_handed_back([leased])
            }
            None => {
                self.log.event(
                    &self.who,
                    json!({"event": "handed_back_new", "item": self.name}),
                );
                DrainReport::unfinished([self.name.clone()])
            }
        }
    }
}

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_default()
}

#[test]
#[ignore = "run as a child process by the chaos tests"]
fn helper_replica() {
    if common::helper_role().is_none() {
        return;
    }
    let log = Log::open(Path::new(&env("CHAOS_LOG")));
    let who = format!("{}:{}", env("CHAOS_NAME"), std::process::id());
    let mut rng = Lcg(u64::from(std::process::id()) ^ now_ns() as u64);
    let state = PathBuf::from(env("CHAOS_STATE"));
    let code = actix::System::new().block_on(async {
        let inner: Arc<dyn RecordStore> = if env("CHAOS_STORE") == "pg" {
            Arc::new(
                PgRecordStore::from_url(&env("CHAOS_URL"), env("CHAOS_SERVICE"))
                    .unwrap()
                    .operation_timeout(Duration::from_secs(2))
                    .spill_to(FileRecordStore::open(&state, Sharing::Refused).unwrap()),
            )
        } else {
            Arc::new(FileRecordStore::open(&state, Sharing::Refused).unwrap())
        };
        let store = Arc::new(Defective {
            inner,
            defect: env("CHAOS_DEFECT"),
        });
        let mut builder = PlannedStopService::builder(Layout::Slots(env("CHAOS_RUN").into()))
            .record_store(store)
            .lease_for(planned_stop::MIN_LEASE)
            .drain_deadline(Duration::from_millis(400))
            .poll_interval(Duration::from_millis(20));
        let jobs: u64 = env("CHAOS_JOBS").parse().unwrap_or(0);
        for i in 0..jobs {
            let job = Job {
                name: format!("job-{}-{i}", std::process::id()),
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
        let every = Duration::from_millis(300);
        let resumer = handle.clone();
        let (rlog, rwho) = (log.clone(), who.clone());
        actix::spawn(async move {
            let mut rng = Lcg(now_ns() as u64);
            loop {
                if resumer.status().state != planned_stop::RunnerState::Running {
                    return;
                }
                if let Ok(leased) = resumer.resume().await {
                    for item in leased {
                        rlog.event(&rwho, json!({"event": "resumed", "id": item.item.id}));
                        let job = Job {
                            name: item.item.id.clone(),
                            leased: Some((item, resumer.clone())),
                            log: rlog.clone(),
                            who: rwho.clone(),
                            // Most finish within a life; one in five outlasts a lease.
                            duration: Duration::from_millis(match rng.below(5) {
                                0 => 6000 + rng.below(3000),
                                _ => 200 + rng.below(2500),
                            }),
                            done: false,
                        }
                        .start();
                        resumer.add_participant(DrainPhase::Work, "resumed", job.recipient());
                    }
                }
                actix::clock::sleep(every).await;
            }
        });
        handle.stopped().await;
        handle.status().exit_code
    });
    log.event(&who, json!({"event": "exit", "code": code}));
}

// ---------------------------------------------------------------------------------------------
// The checker: a pure function of the event log and the final listing.

/// What went wrong, one line each; empty when every invariant holds.
///
/// An operator's release or drop takes effect somewhere between the harness's `releasing`
/// (`dropping`) event and its `released` (`dropped`) event. For the two-holders check a holder's
/// time ends at the first (it may have lost the item from then on); for its acknowledgements at
/// the second (it may still have held the item until then): each side errs towards no false alarm.
///
/// `accounted_at_end` is what the stores hold at the end: items still listed, and the ids their
/// acknowledgement records name (an acknowledgement whose process was killed before it could log
/// it is still an acknowledgement).
fn check(events: &[Value], accounted_at_end: &BTreeSet<String>) -> Vec<String> {
    let at = |e: &Value| e["at"].as_str().unwrap().parse::<u128>().unwrap();
    let mut violations = Vec::new();
    let mut open: BTreeMap<(String, String), u128> = BTreeMap::new();
    // Holdings an operator is ending: (who, id) -> (from, when the operator began).
    let mut ending: BTreeMap<(String, String), (u128, u128)> = BTreeMap::new();
    // (who, id) -> until when an operator's release or drop may not yet have reached who.
    let mut late_acks: BTreeMap<(String, String), u128> = BTreeMap::new();
    let mut intervals: BTreeMap<String, Vec<(String, u128, u128)>> = BTreeMap::new();
    let mut acked: BTreeMap<String, usize> = BTreeMap::new();
    let mut dropped: BTreeSet<String> = BTreeSet::new();
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut sorted: Vec<&Value> = events.iter().collect();
    sorted.sort_by_key(|e| at(e));
    for e in sorted {
        let who = e["who"].as_str().unwrap_or_default().to_owned();
        let t = at(e);
        let id = e["id"].as_str().unwrap_or_default().to_owned();
        let mut close = |open: &mut BTreeMap<(String, String), u128>, key: (String, String), t| {
            if let Some(from) = open.remove(&key) {
                intervals.entry(key.1).or_default().push((key.0, from, t));
            }
        };
        match e["event"].as_str().unwrap_or_default() {
            "resumed" => {
                known.insert(id.clone());
                open.insert((who, id), t);
            }
            "acked" => {
                *acked.entry(id.clone()).or_default() += 1;
                let key = (who.clone(), id.clone());
                let within = open.contains_key(&key)
                    || ending.contains_key(&key)
                    || late_acks.get(&key).is_some_and(|until| t <= *until);
                if !within {
                    violations.push(format!("{who} acknowledged {id} without holding it"));
                }
                close(&mut open, key, t);
            }
            "handed_back" => close(&mut open, (who, id), t),
            "exit" | "killed" => {
                let held: Vec<_> = open.keys().filter(|(w, _)| *w == who).cloned().collect();
                for key in held {
                    close(&mut open, key, t);
                }
            }
            "releasing" | "dropping" => {
                let held: Vec<_> = open.keys().filter(|(_, i)| *i == id).cloned().collect();
                for key in held {
                    let from = open.remove(&key).unwrap();
                    ending.insert(key, (from, t));
                }
            }
            "released" | "dropped" => {
                if e["event"] == "dropped" {
                    dropped.insert(id.clone());
                }
                let held: Vec<_> = ending.keys().filter(|(_, i)| *i == id).cloned().collect();
                for key in held {
                    let (from, began) = ending.remove(&key).unwrap();
                    intervals
                        .entry(id.clone())
                        .or_default()
                        .push((key.0.clone(), from, began));
                    late_acks.insert(key, t);
                }
            }
            _ => {}
        }
    }
    for (key, from) in open {
        intervals
            .entry(key.1.clone())
            .or_default()
            .push((key.0, from, u128::MAX));
    }
    for (id, list) in &intervals {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                    violations.push(format!("{id} held by {} and {} at once", a.0, b.0));
                }
            }
        }
    }
    for (id, n) in &acked {
        if *n > 1 {
            violations.push(format!("{id} acknowledged {n} times"));
        }
    }
    for id in &known {
        if !(acked.contains_key(id) || dropped.contains(id) || accounted_at_end.contains(id)) {
            violations.push(format!(
                "{id} was resumed, then neither acknowledged, dropped nor listed"
            ));
        }
    }
    violations
}

// ---------------------------------------------------------------------------------------------
// The harness.

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/postgres.sh")
}

/// A private PostgreSQL server this run may pause and restart.
struct Db {
    dir: PathBuf,
    url: String,
}

impl Db {
    fn start() -> Db {
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let mut lines = text.lines().rev();
        let url = lines.next().unwrap().to_owned();
        Db {
            dir: PathBuf::from(lines.next().unwrap()),
            url,
        }
    }

    fn ctl(&self, verb: &str) {
        let ok = Command::new("bash")
            .arg(script())
            .arg(verb)
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(ok.success(), "ci/postgres.sh {verb}");
    }

    /// Every process of the server (the postmaster and its children).
    fn pids(&self) -> Vec<i32> {
        let pidfile =
            std::fs::read_to_string(self.dir.join("data/postmaster.pid")).unwrap_or_default();
        let Some(main) = pidfile
            .lines()
            .next()
            .and_then(|l| l.trim().parse::<i32>().ok())
        else {
            return Vec::new();
        };
        let children = Command::new("pgrep")
            .arg("-P")
            .arg(main.to_string())
            .output()
            .unwrap();
        let mut pids = vec![main];
        pids.extend(
            String::from_utf8_lossy(&children.stdout)
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok()),
        );
        pids
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        for pid in self.pids() {
            // SAFETY: kill with a pid read from the server's own files; SIGCONT is harmless.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
        let _ = Command::new("bash")
            .arg(script())
            .arg("stop")
            .arg(&self.dir)
            .status();
    }
}

/// A replica process, killed when dropped.
struct Life(std::process::Child);

impl Life {
    fn id(&self) -> u32 {
        self.0.id()
    }
    fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.wait()
    }
}

impl Drop for Life {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One replica slot: its kind, its directories, its current life.
struct Slot {
    name: String,
    pg: bool,
    state: PathBuf,
    run: PathBuf,
    life: Option<Life>,
}

struct Run {
    base: tempfile::TempDir,
    db: Db,
    service: String,
    log_path: PathBuf,
    log: Log,
    defect: String,
    rng: Lcg,
}

impl Run {
    fn spawn(&mut self, slot: &mut Slot) {
        let jobs = (1 + self.rng.below(5)).to_string();
        let mut cmd = common::helper_command("helper_replica", "replica");
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        cmd.env("CHAOS_LOG", &self.log_path)
            .env("CHAOS_NAME", &slot.name)
            .env("CHAOS_STORE", if slot.pg { "pg" } else { "files" })
            .env("CHAOS_URL", &self.db.url)
            .env("CHAOS_SERVICE", &self.service)
            .env("CHAOS_STATE", &slot.state)
            .env("CHAOS_RUN", &slot.run)
            .env("CHAOS_JOBS", jobs)
            .env("CHAOS_DEFECT", &self.defect)
            .env(
                "PLANNED_STOP_HOST",
                if slot.pg {
                    slot.name.as_str()
                } else {
                    "files-host"
                },
            )
            .env("RUST_LOG", "off");
        let life = Life(cmd.spawn().unwrap());
        // Ready once it announces that it watches its directory (a stop before that finds no
        // directory, or nobody to hold it for).
        let presence = slot
            .run
            .join(format!("planned-stop-{}.watching.json", life.id()));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !presence.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "replica {} never started",
                slot.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        slot.life = Some(life);
    }

    /// A planned stop of the slot's life, and its end; a stop that does not end it is a
    /// failure of the run.
    fn stop(&mut self, slot: &mut Slot) -> bool {
        let Some(mut life) = slot.life.take() else {
            return false;
        };
        let out = common::process::stop_json(&slot.run, &life.id().to_string(), &["--wait", "20"]);
        let planned = out.status.code() == Some(0);
        assert!(
            planned || out.status.code() == Some(10),
            "a planned stop of {} failed: {}",
            slot.name,
            String::from_utf8_lossy(&out.stdout)
        );
        let _ = life.wait();
        planned
    }

    fn who(slot: &Slot) -> Option<String> {
        slot.life
            .as_ref()
            .map(|h| format!("{}:{}", slot.name, h.id()))
    }

    fn records(&self, slot: &Slot, args: &[&str]) -> std::process::Output {
        let mut cmd = common::process::planned_stop();
        cmd.arg("records").args(args);
        if slot.pg {
            cmd.args(["--records", &self.db.url, "--service", &self.service]);
        } else {
            cmd.args(["--state", slot.state.to_str().unwrap()]);
        }
        cmd.stdin(Stdio::null()).output().unwrap()
    }

    fn listed(&self, slot: &Slot) -> BTreeSet<String> {
        self.listed_where(slot, |_| true)
    }

    /// The items `records list` shows with a lease: held by a replica, most likely mid-job.
    fn leased(&self, slot: &Slot) -> BTreeSet<String> {
        self.listed_where(slot, |i| i["lease"].is_object())
    }

    fn listed_where(&self, slot: &Slot, keep: impl Fn(&Value) -> bool) -> BTreeSet<String> {
        let out = self.records(slot, &["list", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter(|i| keep(i))
                    .filter_map(|i| i["item"]["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Runs the fleet for `secs` with `defect` injected into every replica; returns the violations
/// and what was done (for the figures).
/// With `calm`, a fault comes every second or so instead of three times a second: lives last
/// long enough for leases to lapse and for releases to catch a holder mid-job.
fn chaos(
    secs: u64,
    defect: &str,
    calm: bool,
) -> (Vec<String>, BTreeMap<&'static str, usize>, usize) {
    let seed = now_ns() as u64;
    eprintln!("chaos: seed {seed}, {secs} s, defect {defect:?}");
    let base = tempfile::tempdir().unwrap();
    let db = Db::start();
    let log_path = base.path().join("events.jsonl");
    let mut run = Run {
        log: Log::open(&log_path),
        log_path,
        db,
        service: format!("chaos-{seed:x}"),
        defect: defect.to_owned(),
        rng: Lcg(seed),
        base,
    };
    let shared_state = run.base.path().join("shared-state");
    let mut slots: Vec<Slot> = (0..8)
        .map(|k| {
            let pg = k < 5;
            let name = if pg {
                format!("pg{k}")
            } else {
                format!("files{k}")
            };
            let state = if pg {
                run.base.path().join(format!("spill-{k}"))
            } else {
                shared_state.clone()
            };
            Slot {
                run: run.base.path().join(format!("run-{k}")),
                name,
                pg,
                state,
                life: None,
            }
        })
        .collect();
    for slot in &mut slots {
        run.spawn(slot);
    }
    let mut done: BTreeMap<&'static str, usize> = BTreeMap::new();
    // A rolling deploy first: every replica stops as planned and hands its work over, so the
    // stores hold items from the start.
    for slot in &mut slots {
        *done.entry("planned stops").or_default() += usize::from(run.stop(slot));
        run.spawn(slot);
    }
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < until {
        let pause = if calm {
            700 + run.rng.below(900)
        } else {
            250 + run.rng.below(400)
        };
        std::thread::sleep(Duration::from_millis(pause));
        let k = run.rng.below(slots.len() as u64) as usize;
        let mut action = run.rng.below(100);
        // An acknowledgement that skips the lease check shows only when an operator releases
        // an item its holder is still working on: that defect's run releases instead of most
        // other faults, so the demonstration does not hang on luck.
        if defect == "ack-skips-lease" && (30..75).contains(&action) {
            action = 75 + action % 15;
        }
        let slot = &mut slots[k];
        let Some(pid) = slot.life.as_ref().map(|h| h.id()) else {
            continue;
        };
        match action {
            0..=29 => {
                // A planned stop, then a new life.
                *done.entry("planned stops").or_default() += usize::from(run.stop(slot));
                run.spawn(slot);
            }
            30..=44 => {
                let who = Run::who(slot).unwrap();
                run.log
                    .event("harness", json!({"event": "killed", "who_killed": who}));
                // The killed life's own record: its holding ends here.
                run.log.event(&who, json!({"event": "killed"}));
                drop(slot.life.take());
                *done.entry("SIGKILLs").or_default() += 1;
                run.spawn(slot);
            }
            45..=59 => {
                // Frozen for well under a lease (5 s), so it stays a live holder throughout.
                // SAFETY: signals to a child of ours that is alive (we hold its handle).
                unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_millis(300 + run.rng.below(1200)));
                unsafe { libc::kill(pid as i32, libc::SIGCONT) };
                *done.entry("SIGSTOP/SIGCONT").or_default() += 1;
            }
            60..=69 => {
                let pids = run.db.pids();
                for p in &pids {
                    // SAFETY: the server's own processes, continued below.
                    unsafe { libc::kill(*p, libc::SIGSTOP) };
                }
                std::thread::sleep(Duration::from_millis(300 + run.rng.below(700)));
                for p in &pids {
                    unsafe { libc::kill(*p, libc::SIGCONT) };
                }
                *done.entry("database pauses").or_default() += 1;
            }
            70..=74 => {
                run.db.ctl("halt");
                std::thread::sleep(Duration::from_millis(200 + run.rng.below(500)));
                run.db.ctl("resume");
                *done.entry("database restarts").or_default() += 1;
            }
            _ => {
                // The defect run releases what a replica holds, so a holder is caught mid-job.
                let listed: Vec<String> = if defect == "ack-skips-lease" {
                    run.leased(slot).into_iter().collect()
                } else {
                    run.listed(slot).into_iter().collect()
                };
                if listed.is_empty() {
                    continue;
                }
                let id = listed[run.rng.below(listed.len() as u64) as usize].clone();
                let verb = if action < 90 { "release" } else { "drop" };
                // It takes effect between these two events (see `check`).
                let (before, after) = if verb == "drop" {
                    ("dropping", "dropped")
                } else {
                    ("releasing", "released")
                };
                run.log
                    .event("operator", json!({"event": before, "id": id}));
                let out = run.records(slot, &[verb, &id]);
                if out.status.code() == Some(0) {
                    run.log.event("operator", json!({"event": after, "id": id}));
                    *done
                        .entry(if verb == "drop" {
                            "operator drops"
                        } else {
                            "operator releases"
                        })
                        .or_default() += 1;
                }
            }
        }
    }
    // The end: every life stopped as planned; what is left must be listed.
    for slot in &mut slots {
        run.stop(slot);
    }
    let mut listed = run.listed(&slots[0]);
    listed.extend(run.listed(&slots[5]));
    for slot in slots.iter().filter(|s| s.pg) {
        // Spilled items wait in each host's spill directory.
        let spill = FileRecordStore::open_existing(&slot.state, Sharing::Refused);
        if let Ok(spill) = spill {
            let items = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap()
                .block_on(spill.list());
            listed.extend(items.unwrap_or_default().into_iter().map(|s| s.item.id));
        }
    }
    // And what the stores say was acknowledged.
    if let Ok(entries) = std::fs::read_dir(shared_state.join("planned-stop-acked")) {
        listed.extend(entries.filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".item.json").map(str::to_owned)
        }));
    }
    let acks = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let (client, connection) = tokio_postgres::connect(&run.db.url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client
                .query(
                    "SELECT id FROM planned_stop_acks WHERE service = $1",
                    &[&run.service],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
        });
    listed.extend(acks);
    let events: Vec<Value> = std::fs::read_to_string(&run.log_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a torn log line {l:?}: {e}")))
        .collect();
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for e in &events {
        let kind = match e["event"].as_str().unwrap_or_default() {
            "exit" => format!("exit {}", e["code"]),
            other => other.to_owned(),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    eprintln!(
        "chaos events: {kinds:?}; {} listed at the end",
        listed.len()
    );
    let items = events.iter().filter(|e| e["event"] == "resumed").count();
    let violations = check(&events, &listed);
    for v in violations.iter().take(3) {
        // The story of each of the first violations' items, for whoever reads the failure.
        if let Some(id) = v.split_whitespace().find(|w| w.len() > 30) {
            let whos: BTreeSet<&str> = events
                .iter()
                .filter(|e| e["id"] == *id)
                .filter_map(|e| e["who"].as_str())
                .collect();
            let story: Vec<&Value> = events
                .iter()
                .filter(|e| {
                    e["id"] == *id
                        || (matches!(e["event"].as_str(), Some("exit" | "killed"))
                            && e["who"].as_str().is_some_and(|w| whos.contains(w)))
                })
                .collect();
            let rows = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let (client, connection) =
                        tokio_postgres::connect(&run.db.url, tokio_postgres::NoTls)
                            .await
                            .unwrap();
                    tokio::spawn(connection);
                    let items = client
                        .query(
                            "SELECT id, lease_owner, quarantined, attempts FROM planned_stop_items \
                             WHERE service = $1 AND id = $2",
                            &[&run.service, &id],
                        )
                        .await
                        .unwrap();
                    let acks = client
                        .query(
                            "SELECT acked_by FROM planned_stop_acks WHERE service = $1 AND id = $2",
                            &[&run.service, &id],
                        )
                        .await
                        .unwrap();
                    format!("{items:?} / acks {acks:?}")
                });
            let spills: Vec<String> = slots
                .iter()
                .map(|slot| {
                    let names: Vec<String> =
                        std::fs::read_dir(slot.state.join("planned-stop-items"))
                            .map(|d| {
                                d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                                    .collect()
                            })
                            .unwrap_or_default();
                    format!("{}: {names:?}", slot.name)
                })
                .collect();
            eprintln!(
                "chaos violation: {v}\n  events of {id}: {story:?}\n  database: {rows}\n  spills: {spills:?}"
            );
        }
    }
    (violations, done, items)
}

fn chaos_secs() -> u64 {
    std::env::var("PLANNED_STOP_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(90)
}

/// The fleet in chaos: no violation.
#[test]
#[ignore = "minutes long and needs PostgreSQL's binaries: `just chaos SECS` runs it"]
fn a_fleet_in_chaos_loses_nothing_and_never_hands_an_item_to_two_live_holders() {
    let (violations, done, resumed) = chaos(chaos_secs(), "", false);
    eprintln!(
        "chaos figures: {resumed} resumptions; {done:?}; {} violations",
        violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(
        done.values().sum::<usize>() > 0 && resumed > 0,
        "nothing happened: {done:?}"
    );
}

/// The checker fails on injected defects: leases not renewed, acknowledgements without the lease
/// check.
#[test]
#[ignore = "minutes long and needs PostgreSQL's binaries: `just chaos SECS` runs it"]
fn the_chaos_checker_reports_injected_defects() {
    for defect in ["renewal-off", "ack-skips-lease"] {
        // Each run draws its faults at random: up to three runs for the defect to show.
        let mut tries = 0;
        let (violations, done) = loop {
            tries += 1;
            let (violations, done, _) = chaos(chaos_secs() / 3, defect, true);
            if !violations.is_empty() || tries == 3 {
                break (violations, done);
            }
            eprintln!("chaos defect {defect}: not shown in run {tries}; again");
        };
        eprintln!(
            "chaos defect {defect}: {} violations, e.g. {:?}; {done:?}",
            violations.len(),
            violations.first()
        );
        assert!(
            !violations.is_empty(),
            "the checker missed the defect {defect}"
        );
    }
}

/// The checker itself, on logs written by hand: each invariant is caught.
#[test]
fn the_checker_catches_each_violation_on_a_written_log() {
    let e = |who: &str, at: u128, event: &str, id: &str| json!({"who": who, "at": at.to_string(), "event": event, "id": id});
    let clean = vec![
        e("a:1", 1, "resumed", "x"),
        e("a:1", 2, "handed_back", "x"),
        e("a:1", 3, "exit", "x"),
        e("b:2", 4, "resumed", "x"),
        e("b:2", 5, "acked", "x"),
    ];
    assert_eq!(check(&clean, &BTreeSet::new()), Vec::<String>::new());
    let two_holders = vec![
        e("a:1", 1, "resumed", "x"),
        e("b:2", 2, "resumed", "x"),
        e("b:2", 3, "acked", "x"),
    ];
    assert!(check(&two_holders, &BTreeSet::new())[0].contains("at once"));
    let released_then_acked = vec![
        e("a:1", 1, "resumed", "x"),
        e("operator", 2, "releasing", "x"),
        e("operator", 3, "released", "x"),
        e("a:1", 4, "acked", "x"),
    ];
    assert!(check(&released_then_acked, &BTreeSet::new())[0].contains("without holding"));
    // While the release is under way, the holder may still acknowledge, and a new holder that
    // leased after the release began overlaps no one.
    let during = vec![
        e("a:1", 1, "resumed", "x"),
        e("operator", 2, "releasing", "x"),
        e("b:2", 3, "resumed", "x"),
        e("operator", 4, "released", "x"),
        e("b:2", 5, "acked", "x"),
    ];
    assert_eq!(check(&during, &BTreeSet::new()), Vec::<String>::new());
    let lost = vec![e("a:1", 1, "resumed", "x"), e("a:1", 2, "exit", "x")];
    assert!(check(&lost, &BTreeSet::new())[0].contains("neither"));
    assert!(
        check(&lost, &BTreeSet::from(["x".to_owned()])).is_empty(),
        "listed at the end"
    );
}

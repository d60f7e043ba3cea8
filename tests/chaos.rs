//! The fleet in chaos: replicas on PostgreSQL and on a shared state
//! directory, under random planned stops and restarts, SIGKILLs, SIGSTOP/SIGCONT, database pauses
//! and restarts and operator releases and drops, while every life submits new work. Two of the
//! PostgreSQL replicas run with their wall clocks 10 s ahead and 10 s behind (libfaketime), as
//! replicas on hosts whose clocks disagree. Every replica and the harness write their events (with
//! the host's monotonic clock, which no replica's skew touches) to a log; [`check`] reads it.
//!
//! Every item is followed from its birth: new work carries a unique token as its payload, logged
//! when a stop hands it back, and every later event of the item names the token. After the faults,
//! a quiet phase restarts every replica without faults or new work until the stores are empty. The
//! checker asserts: every born token is done exactly once (acknowledged once, under any number of
//! ids), dropped by an operator, or ended by a stop that said `record_lost` and found in that
//! life's ERROR line; nothing is still listed after the quiet phase; no acknowledgement in a store
//! without a life completing the work; no item held by two live holders at once (holding runs from
//! `leased` or `resumed` to the holder's `acked`, `handed_back`, hold-aside, give-back, exit or
//! kill, or the operator's release or drop); no acknowledgement from a process that does not hold
//! the item; and, judged on the work done rather than acknowledged, no work done by a job that
//! leased the item after an operator dropped it and none done twice by one holder at once. It must
//! be able to fail: the run can carry an injected defect in the test's store wrapper, replica or
//! operator (leases not renewed, acknowledgements without the lease check, new work dropped at the
//! persist, hand-backs acknowledged instead of written back, new work written under two ids, leases
//! judged on each replica's own clock, a drop that only releases, an item given to its replica
//! twice), and each defect run requires the violation it causes.
//!
//! Runs only when asked (`just chaos SECS`): `#[ignore]`d otherwise, with the
//! reason. Needs PostgreSQL's binaries (`ci/postgres.sh` starts a private server), libfaketime
//! (`apt-get install faketime`) and Unix.

#![cfg(all(unix, feature = "postgres"))]

use crate::common;
use common::Lcg;

use planned_stop::record::{FileRecordStore, RecordStore, Sharing};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

#[path = "helpers/chaos_log.rs"]
mod chaos_log;
use chaos_log::{Log, seed};

// ---------------------------------------------------------------------------------------------
// The checker: a pure function of the event log and the final listing.

/// What the stores and the replicas' logs hold at the end, after the quiet phase.
#[derive(Debug, Default)]
struct End {
    /// Items still listed (id → token): none should be, once the quiet phase has resumed
    /// everything on offer.
    listed: BTreeMap<String, String>,
    /// Ids whose acknowledgement a store recorded (an operator's drop is not one).
    store_acks: BTreeSet<String>,
    /// The stderr of each life whose stop said `record_lost`, by `who`: where its items are.
    lost_lines: BTreeMap<String, String>,
}

fn text<'a>(e: &'a Value, key: &str) -> &'a str {
    e[key].as_str().unwrap_or_default()
}

/// What went wrong, one line each; empty when every invariant holds: [`holdings`] (who held what
/// when) and [`fates`] (what became of every item born).
fn check(events: &[Value], end: &End) -> Vec<String> {
    let at = |e: &Value| text(e, "at").parse::<u128>().unwrap();
    let mut sorted: Vec<&Value> = events.iter().collect();
    sorted.sort_by_key(|e| at(e));
    let mut violations = holdings(&sorted);
    violations.extend(completions(&sorted));
    violations.extend(fates(&sorted, end));
    violations
}

/// The completion invariants, judged on the work done (`completing`), not on what a store
/// acknowledged: no work done by a job that leased the item after an operator dropped it (a job
/// that had it before the drop cannot be called back, so its completion is no violation), and
/// no holder doing the same work twice — two of its jobs on one item at once, the second
/// delivered while the first still ran. A holder that completes an item again later (its first
/// acknowledgement refused after an operator's release, the item handed back by the next holder
/// and offered to it again) is at-least-once by design, and so is a completion redone by another
/// holder after the first was killed before its acknowledgement landed: `fates` counts those by
/// acknowledgement.
///
/// A job's start is when its lease call began (`asked`, logged with `resumed`): a lease that
/// returned before the drop may be logged after it.
fn completions(sorted: &[&Value]) -> Vec<String> {
    let at = |e: &Value| text(e, "at").parse::<u128>().unwrap();
    let mut violations = Vec::new();
    // token -> when an operator's drop had taken effect.
    let mut dropped: BTreeMap<String, u128> = BTreeMap::new();
    // (who, token) -> the starts of its jobs still running, and the ends of those completed.
    let mut running: BTreeMap<(String, String), Vec<u128>> = BTreeMap::new();
    let mut completed: BTreeMap<(String, String), Vec<u128>> = BTreeMap::new();
    for e in sorted {
        let (who, token, t) = (text(e, "who"), text(e, "token"), at(e));
        let key = (who.to_owned(), token.to_owned());
        match text(e, "event") {
            "dropped" => {
                dropped.entry(token.to_owned()).or_insert(t);
            }
            "resumed" => {
                let asked = text(e, "asked").parse::<u128>().unwrap_or(t);
                running.entry(key).or_default().push(asked);
            }
            "completing" => {
                let jobs = running.entry(key.clone()).or_default();
                let start = if jobs.is_empty() { t } else { jobs.remove(0) };
                if dropped.get(token).is_some_and(|&d| start > d) {
                    violations.push(format!(
                        "work {token} was done by {who} after an operator dropped it"
                    ));
                }
                let ends = completed.entry(key).or_default();
                if ends.iter().any(|&end| end > start) {
                    violations.push(format!(
                        "work {token} was done twice by {who}, its second job given while the \
                         first still ran"
                    ));
                }
                ends.push(t);
            }
            "handed_back" => {
                if let Some(jobs) = running.get_mut(&key).filter(|j| !j.is_empty()) {
                    jobs.remove(0);
                }
            }
            "exit" | "killed" => running.retain(|(w, _), _| w != who),
            _ => {}
        }
    }
    violations
}

/// The holding invariants, by id: never two live holders at once, no acknowledgement without
/// holding, none twice.
///
/// An operator's release or drop takes effect somewhere between the harness's `releasing`
/// (`dropping`) event and its `released` (`dropped`) event. For the two-holders check a holder's
/// time ends at the first (it may have lost the item from then on); for its acknowledgements at
/// the second (it may still have held the item until then): each side errs towards no false alarm.
fn holdings(sorted: &[&Value]) -> Vec<String> {
    let at = |e: &Value| text(e, "at").parse::<u128>().unwrap();
    let mut violations = Vec::new();
    let mut open: BTreeMap<(String, String), u128> = BTreeMap::new();
    // Holdings an operator is ending: (who, id) -> (from, when the operator began).
    let mut ending: BTreeMap<(String, String), (u128, u128)> = BTreeMap::new();
    // (who, id) -> until when an operator's release or drop may not yet have reached who.
    let mut late_acks: BTreeMap<(String, String), u128> = BTreeMap::new();
    let mut intervals: BTreeMap<String, Vec<(String, u128, u128)>> = BTreeMap::new();
    let mut acked: BTreeMap<String, usize> = BTreeMap::new();
    for e in sorted {
        let (who, id, t) = (text(e, "who").to_owned(), text(e, "id").to_owned(), at(e));
        let mut close = |open: &mut BTreeMap<(String, String), u128>, key: (String, String), t| {
            if let Some(from) = open.remove(&key) {
                intervals.entry(key.1).or_default().push((key.0, from, t));
            }
        };
        match text(e, "event") {
            // Leased (the store's word: the library may keep an item it leases again while a job
            // still has it, without delivering it) or resumed (delivered to a job).
            "leased" | "resumed" => {
                open.entry((who, id)).or_insert(t);
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
            "handed_back" | "held_aside" | "gave_back" => close(&mut open, (who, id), t),
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
                let held: Vec<_> = ending.keys().filter(|(_, i)| *i == id).cloned().collect();
                for key in held {
                    let (from, began) = ending.remove(&key).unwrap();
                    let entry = intervals.entry(id.clone()).or_default();
                    entry.push((key.0.clone(), from, began));
                    late_acks.insert(key, t);
                }
            }
            _ => {}
        }
    }
    for (key, from) in open {
        let entry = intervals.entry(key.1.clone()).or_default();
        entry.push((key.0, from, u128::MAX));
    }
    violations.extend(overlaps(&intervals));
    for (id, n) in &acked {
        if *n > 1 {
            violations.push(format!("{id} acknowledged {n} times"));
        }
    }
    violations
}

/// Two holders of one item whose holdings (who, from, until) overlap.
fn overlaps(intervals: &BTreeMap<String, Vec<(String, u128, u128)>>) -> Vec<String> {
    let mut violations = Vec::new();
    for (id, list) in intervals {
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if a.0 != b.0 && a.1 < b.2 && b.1 < a.2 {
                    violations.push(format!("{id} held by {} and {} at once", a.0, b.0));
                }
            }
        }
    }
    violations
}

/// What the event log says of the items, by token.
#[derive(Default)]
struct Tokens {
    /// token -> the life whose stop handed it back as new work first.
    born: BTreeMap<String, String>,
    /// id -> token.
    of: BTreeMap<String, String>,
    /// token -> the ids under which its work was done (acknowledged).
    done: BTreeMap<String, BTreeSet<String>>,
    /// Ids some life began to acknowledge, its work completed.
    completing: BTreeSet<String>,
    /// Tokens an operator dropped.
    dropped: BTreeSet<String>,
    /// token -> every life that handed it back (new or resumed).
    handed_back_by: BTreeMap<String, BTreeSet<String>>,
}

impl Tokens {
    fn read(sorted: &[&Value]) -> Tokens {
        let mut t = Tokens::default();
        for e in sorted {
            let (who, id, token) = (text(e, "who"), text(e, "id"), text(e, "token"));
            if !id.is_empty() && !token.is_empty() {
                t.of.insert(id.to_owned(), token.to_owned());
            }
            match text(e, "event") {
                kind @ ("handed_back_new" | "handed_back") => {
                    if kind == "handed_back_new" {
                        t.born
                            .entry(token.to_owned())
                            .or_insert_with(|| who.to_owned());
                    }
                    let by = t.handed_back_by.entry(token.to_owned()).or_default();
                    by.insert(who.to_owned());
                }
                "completing" => {
                    t.completing.insert(id.to_owned());
                }
                "acked" => {
                    t.done
                        .entry(token.to_owned())
                        .or_default()
                        .insert(id.to_owned());
                }
                "dropped" => {
                    t.dropped.insert(token.to_owned());
                }
                _ => {}
            }
        }
        t
    }
}

/// The fate of every item born: done exactly once (under any ids), dropped, or reported lost in
/// the ERROR line of the stop that said `record_lost`; nothing left listed after the quiet phase;
/// no acknowledgement in a store without a life completing the work.
fn fates(sorted: &[&Value], end: &End) -> Vec<String> {
    let mut t = Tokens::read(sorted);
    let mut violations = Vec::new();
    for id in &end.store_acks {
        match t.of.get(id) {
            Some(token) if t.completing.contains(id) => {
                t.done.entry(token.clone()).or_default().insert(id.clone());
            }
            _ => violations.push(format!(
                "{id} is acknowledged in a store, but no life completed its work"
            )),
        }
    }
    let reported_lost = |token: &str| {
        t.handed_back_by.get(token).is_some_and(|whos| {
            whos.iter()
                .any(|w| end.lost_lines.get(w).is_some_and(|l| l.contains(token)))
        })
    };
    for (token, who) in &t.born {
        let ids = t.done.get(token).cloned().unwrap_or_default();
        if ids.len() > 1 {
            violations.push(format!(
                "work {token} was done {} times, as {ids:?}",
                ids.len()
            ));
        }
        if ids.is_empty() && !t.dropped.contains(token) && !reported_lost(token) {
            violations.push(format!(
                "work {token}, handed back by {who}, was never done, dropped or reported lost"
            ));
        }
    }
    for (id, token) in &end.listed {
        violations.push(format!(
            "{id} ({token}) is still listed after the quiet phase: it never came back"
        ));
    }
    violations
}

// ---------------------------------------------------------------------------------------------
// The harness.

fn script() -> PathBuf {
    common::repository().join("ci/postgres.sh")
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

/// One replica slot: its kind, its directories, its clock, its current life.
struct Slot {
    name: String,
    pg: bool,
    state: PathBuf,
    run: PathBuf,
    /// How far its wall clock is off (libfaketime), for it and for its stopper.
    skew: Option<&'static str>,
    life: Option<Life>,
    /// Where the current life's stderr goes (its ERROR lines).
    stderr: PathBuf,
}

impl Slot {
    fn skew_env(&self) -> Vec<(&'static str, &'static str)> {
        self.skew
            .map(common::process::skewed_clock)
            .unwrap_or_default()
    }
}

struct Run {
    base: tempfile::TempDir,
    db: Db,
    service: String,
    log_path: PathBuf,
    log: Log,
    defect: String,
    rng: Lcg,
    lives: usize,
    /// The stderr of each life whose stop said `record_lost`, by `who`.
    lost_lines: BTreeMap<String, String>,
}

impl Run {
    /// A new life in `slot`: with new work, or (`quiet`) with none, working briefly on what it
    /// resumes.
    fn spawn(&mut self, slot: &mut Slot, quiet: bool) {
        let jobs = if quiet { 0 } else { 1 + self.rng.below(5) };
        self.lives += 1;
        slot.stderr = self.base.path().join(format!("stderr-{}", self.lives));
        let mut cmd = Command::new(common::helper_program("chaos_replica"));
        cmd.stdin(Stdio::null());
        cmd.stdout(Stdio::null())
            .stderr(std::fs::File::create(&slot.stderr).unwrap());
        let host = if slot.pg {
            slot.name.as_str()
        } else {
            "files-host"
        };
        cmd.env("CHAOS_LOG", &self.log_path)
            .env("CHAOS_NAME", &slot.name)
            .env("CHAOS_STORE", if slot.pg { "pg" } else { "files" })
            .env("CHAOS_URL", &self.db.url)
            .env("CHAOS_SERVICE", &self.service)
            .env("CHAOS_STATE", &slot.state)
            .env("CHAOS_RUN", &slot.run)
            .env("CHAOS_JOBS", jobs.to_string())
            .env("CHAOS_QUIET", if quiet { "1" } else { "0" })
            .env("CHAOS_DEFECT", &self.defect)
            .env("PLANNED_STOP_HOST", host)
            .env("RUST_LOG", "error")
            .envs(slot.skew_env());
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

    /// A planned stop of the slot's life (by a stopper on the slot's clock), and its end; a stop
    /// that neither stops as planned nor says `record_lost` is a failure of the run.
    fn stop(&mut self, slot: &mut Slot) -> bool {
        let who = Run::who(slot);
        let Some(mut life) = slot.life.take() else {
            return false;
        };
        let pid = life.id().to_string();
        let out = common::process::planned_stop()
            .args(["stop", "--pid", &pid, "--dir", slot.run.to_str().unwrap()])
            .args(["--json", "--wait", "20"])
            .envs(slot.skew_env())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let code = out.status.code();
        assert!(
            code == Some(0) || code == Some(10),
            "a planned stop of {} failed: {}",
            slot.name,
            String::from_utf8_lossy(&out.stdout)
        );
        let _ = life.wait();
        if code == Some(10) {
            let who = who.unwrap();
            self.log
                .event("harness", json!({"event": "record_lost", "who_lost": who}));
            let lines = std::fs::read_to_string(&slot.stderr).unwrap_or_default();
            self.lost_lines.insert(who, lines);
        }
        code == Some(0)
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

    /// The items `records list` shows (id → token); with `leased_only`, those with a lease: held
    /// by a replica, most likely mid-job.
    fn listed(&self, slot: &Slot, leased_only: bool) -> BTreeMap<String, String> {
        let out = self.records(slot, &["list", "--json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let items = v["items"].as_array().cloned().unwrap_or_default();
        items
            .iter()
            .filter(|i| !leased_only || i["lease"].is_object())
            .filter_map(|i| {
                let id = i["item"]["id"].as_str()?.to_owned();
                Some((id, text(&i["item"], "item").to_owned()))
            })
            .collect()
    }

    /// Everything listed anywhere: the database, the shared directory, each host's spill.
    fn everything_listed(&self, slots: &[Slot]) -> BTreeMap<String, String> {
        let mut listed = self.listed(&slots[0], false);
        listed.extend(self.listed(&slots[5], false));
        for slot in slots.iter().filter(|s| s.pg) {
            let Ok(spill) = FileRecordStore::open_existing(&slot.state, Sharing::Refused) else {
                continue;
            };
            let items = runtime().block_on(spill.list()).unwrap_or_default();
            listed.extend(items.into_iter().map(|s| {
                (
                    s.item.id,
                    s.item.item.as_str().unwrap_or_default().to_owned(),
                )
            }));
        }
        listed
    }

    /// The ids whose acknowledgement a store recorded (an operator's drop is not one).
    fn store_acks(&self, shared_state: &Path) -> BTreeSet<String> {
        let mut acks = BTreeSet::new();
        if let Ok(entries) = std::fs::read_dir(shared_state.join("planned-stop-acked")) {
            acks.extend(entries.filter_map(|e| {
                let name = e.ok()?.file_name().into_string().ok()?;
                name.strip_suffix(".item.json").map(str::to_owned)
            }));
        }
        acks.extend(self.sql(
            "SELECT id FROM planned_stop_acks WHERE service = $1 \
             AND acked_by <> 'operator (records drop)'",
            &[&self.service],
        ));
        acks
    }

    /// The first column of a query's rows, as text.
    fn sql(
        &self,
        query: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Vec<String> {
        runtime().block_on(async {
            let (client, connection) = tokio_postgres::connect(&self.db.url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let rows = client.query(query, params).await.unwrap();
            rows.iter().map(|r| r.get::<_, String>(0)).collect()
        })
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The slots: five replicas on PostgreSQL (each its own host; one with its clock 10 s ahead, one
/// 10 s behind) and three on one shared state directory (one host, one clock).
fn slots(base: &Path) -> Vec<Slot> {
    let shared_state = base.join("shared-state");
    (0..8)
        .map(|k| {
            let pg = k < 5;
            Slot {
                name: if pg {
                    format!("pg{k}")
                } else {
                    format!("files{k}")
                },
                state: if pg {
                    base.join(format!("spill-{k}"))
                } else {
                    shared_state.clone()
                },
                run: base.join(format!("run-{k}")),
                skew: match k {
                    1 => Some("+10s"),
                    2 => Some("-10s"),
                    _ => None,
                },
                pg,
                life: None,
                stderr: PathBuf::new(),
            }
        })
        .collect()
}

/// One random fault (or planned stop, or operator's act) on one slot; what it was, for the
/// figures. With `calm`, a fault comes every second or so instead of three times a second: lives
/// last long enough for leases to lapse and for releases to catch a holder mid-job.
fn fault(run: &mut Run, slots: &mut [Slot], calm: bool) -> Option<&'static str> {
    let pause = if calm {
        700 + run.rng.below(900)
    } else {
        250 + run.rng.below(400)
    };
    std::thread::sleep(Duration::from_millis(pause));
    let k = run.rng.below(slots.len() as u64) as usize;
    let mut action = run.rng.below(100);
    // An acknowledgement that skips the lease check shows only when an operator releases an
    // item its holder is still working on: that defect's run releases instead of most other
    // faults, so the demonstration does not hang on luck.
    if run.defect == "ack-skips-lease" && (30..75).contains(&action) {
        action = 75 + action % 15;
    }
    // A drop that only releases shows only when an operator drops: that defect's run drops
    // instead of most other faults.
    if run.defect == "drop-only-releases" && (30..90).contains(&action) {
        action = 90 + action % 10;
    }
    let slot = &mut slots[k];
    let pid = slot.life.as_ref().map(|h| h.id())? as i32;
    match action {
        0..=29 => {
            let planned = run.stop(slot);
            run.spawn(slot, false);
            planned.then_some("planned stops")
        }
        30..=44 => {
            let who = Run::who(slot).unwrap();
            run.log
                .event("harness", json!({"event": "killed", "who_killed": who}));
            // The killed life's own record: its holding ends here.
            run.log.event(&who, json!({"event": "killed"}));
            drop(slot.life.take());
            run.spawn(slot, false);
            Some("SIGKILLs")
        }
        45..=59 => {
            // Frozen for well under a lease (5 s), so it stays a live holder throughout.
            // SAFETY: signals to a child of ours that is alive (we hold its handle).
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::thread::sleep(Duration::from_millis(300 + run.rng.below(1200)));
            unsafe { libc::kill(pid, libc::SIGCONT) };
            Some("SIGSTOP/SIGCONT")
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
            Some("database pauses")
        }
        70..=74 => {
            run.db.ctl("halt");
            std::thread::sleep(Duration::from_millis(200 + run.rng.below(500)));
            run.db.ctl("resume");
            Some("database restarts")
        }
        _ => operator(run, slot, action < 90),
    }
}

/// An operator releases (or drops) one listed item; the defect run that needs a holder caught
/// mid-job releases what a replica holds.
fn operator(run: &mut Run, slot: &Slot, release: bool) -> Option<&'static str> {
    let listed = run.listed(slot, run.defect == "ack-skips-lease");
    if listed.is_empty() {
        return None;
    }
    let k = run.rng.below(listed.len() as u64) as usize;
    let (id, token) = listed.into_iter().nth(k).unwrap();
    let (verb, before, after, figure) = if release {
        ("release", "releasing", "released", "operator releases")
    } else if run.defect == "drop-only-releases" {
        // The injected defect: a drop that only releases the item, answering as a drop does.
        ("release", "dropping", "dropped", "operator drops")
    } else {
        ("drop", "dropping", "dropped", "operator drops")
    };
    // It takes effect between these two events (see `holdings`).
    run.log.event(
        "operator",
        json!({"event": before, "id": id, "token": token}),
    );
    let out = run.records(slot, &[verb, &id]);
    (out.status.code() == Some(0)).then(|| {
        run.log.event(
            "operator",
            json!({"event": after, "id": id, "token": token}),
        );
        figure
    })
}

/// Every slot restarted without faults or new work until the stores hold nothing (each item on
/// offer resumed and done), then stopped as planned. Returns what is still listed at its end.
fn quiet_phase(run: &mut Run, slots: &mut [Slot]) -> BTreeMap<String, String> {
    for slot in slots.iter_mut() {
        run.spawn(slot, true);
    }
    // Leases of killed replicas on other hosts lapse within one lease (5 s); a bound, not a
    // timing guess: what is still listed then is reported.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let mut listed = run.everything_listed(slots);
    while !listed.is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        listed = run.everything_listed(slots);
    }
    for slot in slots.iter_mut() {
        run.stop(slot);
    }
    run.everything_listed(slots)
}

/// Runs the fleet for `secs` with `defect` injected into every replica, then the quiet phase;
/// returns the violations, what was done (for the figures) and how many items were born.
fn chaos(
    secs: u64,
    defect: &str,
    calm: bool,
) -> (Vec<String>, BTreeMap<&'static str, usize>, usize) {
    let seed = seed();
    eprintln!("chaos: seed {seed}, {secs} s, defect {defect:?}");
    let base = tempfile::tempdir().unwrap();
    let log_path = base.path().join("events.jsonl");
    let mut run = Run {
        log: Log::open(&log_path),
        log_path,
        db: Db::start(),
        service: format!("chaos-{seed:x}"),
        defect: defect.to_owned(),
        rng: Lcg(seed),
        lives: 0,
        lost_lines: BTreeMap::new(),
        base,
    };
    let mut slots = slots(run.base.path());
    let mut done: BTreeMap<&'static str, usize> = BTreeMap::new();
    for slot in &mut slots {
        run.spawn(slot, false);
    }
    // A rolling deploy first: every replica stops as planned and hands its work over, so the
    // stores hold items from the start.
    for slot in &mut slots {
        *done.entry("planned stops").or_default() += usize::from(run.stop(slot));
        run.spawn(slot, false);
    }
    let until = std::time::Instant::now() + Duration::from_secs(secs);
    while std::time::Instant::now() < until {
        if let Some(what) = fault(&mut run, &mut slots, calm) {
            *done.entry(what).or_default() += 1;
        }
    }
    for slot in &mut slots {
        run.stop(slot);
    }
    let listed = quiet_phase(&mut run, &mut slots);
    let end = End {
        listed,
        store_acks: run.store_acks(&slots[5].state),
        lost_lines: std::mem::take(&mut run.lost_lines),
    };
    let events: Vec<Value> = std::fs::read_to_string(&run.log_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("a torn log line {l:?}: {e}")))
        .collect();
    let violations = check(&events, &end);
    explain(&run, &events, &violations);
    let born = events
        .iter()
        .filter(|e| e["event"] == "handed_back_new")
        .count();
    (violations, done, born)
}

/// The counts of the log's events and, for each of the first violations, its item's story (its
/// events and its holders' ends) and rows, for whoever reads a failure.
fn explain(run: &Run, events: &[Value], violations: &[String]) {
    let mut kinds: BTreeMap<String, usize> = BTreeMap::new();
    for e in events {
        let kind = match text(e, "event") {
            "exit" => format!("exit {}", e["code"]),
            other => other.to_owned(),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    eprintln!("chaos events: {kinds:?}");
    for v in violations.iter().take(3) {
        let Some(key) = v.split_whitespace().nth(1).filter(|w| w.len() > 8) else {
            eprintln!("chaos violation: {v}");
            continue;
        };
        // The violation names an id (first word) or a token (second word, after "work").
        let key = if v.starts_with("work ") {
            key
        } else {
            v.split_whitespace().next().unwrap()
        };
        let whos: BTreeSet<&str> = events
            .iter()
            .filter(|e| e["id"] == key || e["token"] == key)
            .filter_map(|e| e["who"].as_str())
            .collect();
        let story: Vec<&Value> = events
            .iter()
            .filter(|e| {
                e["id"] == key
                    || e["token"] == key
                    || (matches!(e["event"].as_str(), Some("exit" | "killed"))
                        && e["who"].as_str().is_some_and(|w| whos.contains(w)))
            })
            .collect();
        let rows = run.sql(
            "SELECT id || ' lease ' || coalesce(lease_owner, '-') || ' q ' || \
             coalesce(quarantined, '-') FROM planned_stop_items WHERE service = $1 AND \
             (id = $2 OR item #>> '{}' = $2)",
            &[&run.service, &key],
        );
        eprintln!("chaos violation: {v}\n  events: {story:?}\n  database: {rows:?}");
    }
}

fn chaos_secs() -> u64 {
    std::env::var("PLANNED_STOP_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(90)
}

/// The fleet in chaos: no violation.
#[test]
#[ignore = "minutes long and needs PostgreSQL's binaries and libfaketime: `just chaos SECS` runs it"]
fn a_fleet_in_chaos_loses_nothing_and_never_hands_an_item_to_two_live_holders() {
    let (violations, done, born) = chaos(chaos_secs(), "", false);
    eprintln!(
        "chaos figures: {born} items born; {done:?}; {} violations",
        violations.len()
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert!(
        done.values().sum::<usize>() > 0 && born > 0,
        "nothing happened: {done:?}"
    );
}

/// The defects the checker must report, each with the violation it causes: leases not renewed,
/// acknowledgements without the lease check, new work dropped at the persist, hand-backs
/// acknowledged instead of written back, new work written under two ids, leases judged on each
/// replica's own clock, an operator's drop that only releases the item, and a replica that is
/// given an item it still works on a second time (what the library did after an operator's
/// release, before `resume` kept what it had delivered).
const DEFECTS: [(&str, &str); 8] = [
    ("renewal-off", "at once"),
    ("ack-skips-lease", "without holding"),
    ("persist-drops-new", "never done"),
    ("persist-acks-hand-backs", "no life completed its work"),
    ("persist-twice", "was done 2 times"),
    ("lease-on-local-clock", "at once"),
    ("drop-only-releases", "after an operator dropped it"),
    ("delivered-twice", "done twice by"),
];

/// The checker fails on each injected defect, with the violation that defect causes.
#[test]
#[ignore = "minutes long and needs PostgreSQL's binaries and libfaketime: `just chaos SECS` runs it"]
fn the_chaos_checker_reports_injected_defects() {
    // `PLANNED_STOP_CHAOS_DEFECT=NAME` runs that one defect alone (`just chaos-defect NAME`).
    let only = std::env::var("PLANNED_STOP_CHAOS_DEFECT").unwrap_or_default();
    for (defect, expected) in DEFECTS {
        if !only.is_empty() && only != defect {
            continue;
        }
        // Each run draws its faults at random: up to three runs for the defect to show.
        let mut tries = 0;
        let (violations, done) = loop {
            tries += 1;
            let (violations, done, _) = chaos(chaos_secs() / 4, defect, true);
            if violations.iter().any(|v| v.contains(expected)) || tries == 3 {
                break (violations, done);
            }
            eprintln!("chaos defect {defect}: not shown in run {tries}; again");
        };
        let shown: Vec<&String> = violations.iter().filter(|v| v.contains(expected)).collect();
        eprintln!(
            "chaos defect {defect}: {} violations, {} of them \"{expected}\", e.g. {:?}; {done:?}",
            violations.len(),
            shown.len(),
            shown.first()
        );
        assert!(
            !shown.is_empty(),
            "the checker missed the defect {defect}: {violations:#?}"
        );
    }
}

/// The checker's holdings, on logs written by hand: each invariant is caught.
#[test]
fn the_checker_catches_each_violation_on_a_written_log() {
    let e = |who: &str, at: u128, event: &str, id: &str, token: &str| json!({"who": who, "at": at.to_string(), "event": event, "id": id, "token": token});
    let nothing = End::default();
    let clean = vec![
        e("a:1", 1, "handed_back_new", "", "tok-1"),
        e("b:2", 2, "resumed", "x", "tok-1"),
        e("b:2", 3, "handed_back", "x", "tok-1"),
        e("b:2", 4, "exit", "", ""),
        e("c:3", 5, "resumed", "x", "tok-1"),
        e("c:3", 6, "completing", "x", "tok-1"),
        e("c:3", 7, "acked", "x", "tok-1"),
    ];
    assert_eq!(check(&clean, &nothing), Vec::<String>::new());
    let two_holders = [
        &clean[..2],
        &[
            e("c:3", 3, "resumed", "x", "tok-1"),
            e("c:3", 4, "acked", "x", "tok-1"),
        ],
    ]
    .concat();
    assert!(check(&two_holders, &nothing)[0].contains("at once"));
    let released_then_acked = vec![
        e("a:1", 1, "handed_back_new", "", "tok-1"),
        e("b:2", 2, "resumed", "x", "tok-1"),
        e("operator", 3, "releasing", "x", "tok-1"),
        e("operator", 4, "released", "x", "tok-1"),
        e("b:2", 5, "acked", "x", "tok-1"),
    ];
    assert!(check(&released_then_acked, &nothing)[0].contains("without holding"));
    // Leased again by the same holder after the release (the store's `leased`; the library keeps
    // it with the job that has it, so no `resumed`): its acknowledgement is within its holding.
    let leased_again = [
        &released_then_acked[..4],
        &[
            e("b:2", 5, "leased", "x", "tok-1"),
            e("b:2", 6, "completing", "x", "tok-1"),
            e("b:2", 7, "acked", "x", "tok-1"),
        ],
    ]
    .concat();
    assert_eq!(check(&leased_again, &nothing), Vec::<String>::new());
    // While the release is under way, the holder may still acknowledge, and a new holder that
    // leased after the release began overlaps no one.
    let during = vec![
        e("a:1", 1, "handed_back_new", "", "tok-1"),
        e("b:2", 2, "resumed", "x", "tok-1"),
        e("operator", 3, "releasing", "x", "tok-1"),
        e("c:3", 4, "resumed", "x", "tok-1"),
        e("operator", 5, "released", "x", "tok-1"),
        e("c:3", 6, "acked", "x", "tok-1"),
    ];
    assert_eq!(check(&during, &nothing), Vec::<String>::new());
}

/// The checker's completions, on logs written by hand: work done by a job that leased it after an
/// operator dropped it, and work done twice by one holder at once, are caught; a job that had
/// the item before the drop, and a holder that does the work again later, are not.
#[test]
fn the_checker_judges_completions_on_a_written_log() {
    let e = |who: &str, at: u128, event: &str, id: &str, token: &str| json!({"who": who, "at": at.to_string(), "event": event, "id": id, "token": token});
    let resumed = |who: &str, at: u128, asked: u128| json!({"who": who, "at": at.to_string(), "asked": asked.to_string(), "event": "resumed", "id": "x", "token": "tok-1"});
    let nothing = End::default();
    let born = e("a:1", 1, "handed_back_new", "", "tok-1");
    // Dropped, then leased and done (a drop that only released the item).
    let done_after_drop = vec![
        born.clone(),
        e("operator", 2, "dropping", "x", "tok-1"),
        e("operator", 3, "dropped", "x", "tok-1"),
        resumed("b:2", 5, 4),
        e("b:2", 6, "completing", "x", "tok-1"),
        e("b:2", 7, "acked", "x", "tok-1"),
    ];
    let found = check(&done_after_drop, &nothing);
    assert!(
        found
            .iter()
            .any(|v| v.contains("after an operator dropped it")),
        "{found:?}"
    );
    // Leased before the drop (its lease call began before), logged after it: no violation; nor
    // a job that had it all along and completes after the drop.
    for asked in [2, 1] {
        let before = vec![
            born.clone(),
            e("operator", 2, "dropping", "x", "tok-1"),
            e("operator", 3, "dropped", "x", "tok-1"),
            resumed("b:2", 4, asked),
            e("b:2", 6, "completing", "x", "tok-1"),
        ];
        assert_eq!(check(&before, &nothing), Vec::<String>::new(), "{asked}");
    }
    // Two jobs of one holder on one item at once: done twice.
    let twice_at_once = vec![
        born.clone(),
        resumed("b:2", 3, 2),
        resumed("b:2", 5, 4),
        e("b:2", 6, "completing", "x", "tok-1"),
        e("b:2", 7, "acked", "x", "tok-1"),
        e("b:2", 8, "completing", "x", "tok-1"),
    ];
    let found = check(&twice_at_once, &nothing);
    assert!(
        found.iter().any(|v| v.contains("done twice by b:2")),
        "{found:?}"
    );
    // One holder doing it again later (its acknowledgement refused after an operator's release,
    // the next holder handed it back): at-least-once, no violation of this kind.
    let again_later = vec![
        born,
        resumed("b:2", 3, 2),
        e("operator", 4, "releasing", "x", "tok-1"),
        e("operator", 5, "released", "x", "tok-1"),
        e("b:2", 6, "completing", "x", "tok-1"),
        resumed("c:3", 8, 7),
        e("c:3", 9, "handed_back", "x", "tok-1"),
        e("c:3", 10, "exit", "", ""),
        resumed("b:2", 12, 11),
        e("b:2", 13, "completing", "x", "tok-1"),
        e("b:2", 14, "acked", "x", "tok-1"),
    ];
    assert_eq!(check(&again_later, &nothing), Vec::<String>::new());
}

/// The checker's fates, on logs written by hand: every way an item can be lost or done twice.
#[test]
fn the_checker_follows_every_item_from_its_birth_on_a_written_log() {
    let e = |who: &str, at: u128, event: &str, id: &str, token: &str| json!({"who": who, "at": at.to_string(), "event": event, "id": id, "token": token});
    let nothing = End::default();
    let clean = [
        e("a:1", 1, "handed_back_new", "", "tok-1"),
        e("b:2", 2, "resumed", "x", "tok-1"),
        e("b:2", 3, "handed_back", "x", "tok-1"),
        e("b:2", 4, "exit", "", ""),
        e("c:3", 5, "resumed", "x", "tok-1"),
        e("c:3", 6, "completing", "x", "tok-1"),
        e("c:3", 7, "acked", "x", "tok-1"),
    ];
    // Born and never seen again (a persist that dropped it): lost, unless dropped by an
    // operator or named in the ERROR line of a stop that said record_lost.
    let born = vec![
        e("a:1", 1, "handed_back_new", "", "tok-1"),
        e("a:1", 2, "exit", "", ""),
    ];
    assert!(check(&born, &nothing)[0].contains("never done"));
    let dropped = [&born[..], &[e("operator", 3, "dropped", "x", "tok-1")]].concat();
    assert!(check(&dropped, &nothing).is_empty());
    let mut lost = End::default();
    lost.lost_lines
        .insert("a:1".into(), "ERROR items [\"tok-2\"]".into());
    assert!(
        check(&born, &lost)[0].contains("never done"),
        "another item's line"
    );
    lost.lost_lines
        .insert("a:1".into(), "ERROR items [\"tok-1\"]".into());
    assert!(check(&born, &lost).is_empty());
    // Acknowledged in the store but never completed (a persist that acknowledged a hand-back);
    // completed and acknowledged by a life killed before it logged `acked`: done.
    let handed = &clean[..4];
    let acked_in_store = End {
        store_acks: BTreeSet::from(["x".to_owned()]),
        ..End::default()
    };
    assert!(check(handed, &acked_in_store)[0].contains("no life completed"));
    let completed = [
        handed,
        &[
            e("c:3", 5, "resumed", "x", "tok-1"),
            e("c:3", 6, "completing", "x", "tok-1"),
            e("c:3", 7, "killed", "", ""),
        ],
    ]
    .concat();
    assert!(check(&completed, &acked_in_store).is_empty());
    // Done twice under two ids (a persist that wrote it twice).
    let twice = [
        &clean[..],
        &[
            e("c:3", 8, "resumed", "y", "tok-1"),
            e("c:3", 9, "acked", "y", "tok-1"),
        ],
    ]
    .concat();
    assert!(check(&twice, &nothing)[0].contains("was done 2 times"));
    // Still listed after the quiet phase: it never came back.
    let listed = End {
        listed: BTreeMap::from([("x".to_owned(), "tok-1".to_owned())]),
        ..End::default()
    };
    assert!(
        check(&born, &listed)
            .iter()
            .any(|v| v.contains("still listed"))
    );
}

//! The record store: the conformance suite against the file store, and the resume guarantees
//! with real `serve` processes (kill -9 in the middle of a resume, services sharing a state
//! directory, a record store that fails at the stop).

use crate::common;

use planned_stop::internals::Clock;
use planned_stop::record::{FileRecordStore, RecordStore, Sharing};
use planned_stop::testing::{Backend, Probe, check_conformance};
use std::sync::Arc;

struct Files;

impl Backend for Files {
    fn open(clock: Arc<dyn Clock>, probe: Probe) -> (Arc<dyn RecordStore>, Box<dyn std::any::Any>) {
        let dir = tempfile::tempdir().unwrap();
        let store = FileRecordStore::open(dir.path().join("state"), Sharing::Refused)
            .unwrap()
            .clock(clock)
            .liveness(move |o| probe(o));
        (Arc::new(store), Box::new(dir))
    }
}

use common::cases;

/// The seeds of past failures, run first every time (proptest's file, committed).
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/records.proptest-regressions");

/// Every answer of the file store is the model's, and it lists exactly the model's items.
#[test]
fn the_file_store_conforms() {
    check_conformance::<Files>(cases(), Some(REGRESSIONS));
}

/// A record store written outside the crate, from its public API alone (the item
/// types have constructors, the lease rules and the suite are public): it must pass the same
/// conformance suite as the crate's own stores.
mod outside {
    use chrono::{DateTime, Utc};
    use planned_stop::internals::{Clock, Liveness, failure_at_takeover, holds, is_offered};
    use planned_stop::record::{
        ItemState, Lease, Leased, Owner, Persisted, RecordError, RecordFuture, RecordStore,
        ResumeItem, StopRecord,
    };
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    pub struct Memory {
        items: Mutex<Vec<ItemState>>,
        clock: Arc<dyn Clock>,
        probe: super::Probe,
        /// An injected defect: any owner may acknowledge any item (the suite must catch it).
        pub lax: bool,
    }

    impl std::fmt::Debug for Memory {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Memory")
        }
    }

    fn end(now: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
        now + chrono::TimeDelta::from_std(d).unwrap()
    }

    impl Memory {
        pub fn new(clock: Arc<dyn Clock>, probe: super::Probe) -> Memory {
            Memory {
                items: Mutex::default(),
                clock,
                probe,
                lax: false,
            }
        }

        fn persist_now(&self, stopper: &Owner, record: &StopRecord) {
            let mut items = self.items.lock().unwrap();
            for u in &record.unfinished {
                let id = u.id.clone().unwrap();
                let found = items.iter().position(|s| s.item.id == id);
                match (u.resumed, found) {
                    (false, None) => items.push(ItemState::new(
                        ResumeItem::new(
                            id,
                            &u.participant,
                            u.item.clone(),
                            stopper.clone(),
                            record.finished_at,
                            1,
                        )
                        .with_failures(u32::from(u.failure.is_some()), u.failure.clone()),
                        None,
                    )),
                    (true, Some(i)) if holds(items[i].lease.as_ref(), stopper) => {
                        let old = &items[i].item;
                        let attempts = old.attempts.saturating_add(1);
                        let failures = old.failures + u32::from(u.failure.is_some());
                        let last = u.failure.clone().or_else(|| old.last_failure.clone());
                        items[i] = ItemState::new(
                            ResumeItem::new(
                                id,
                                &u.participant,
                                u.item.clone(),
                                stopper.clone(),
                                record.finished_at,
                                attempts,
                            )
                            .with_failures(failures, last),
                            None,
                        );
                    }
                    _ => {} // someone else's, or gone: left as it is
                }
            }
            items.sort_by(|a, b| {
                (a.item.stopped_at, &a.item.id).cmp(&(b.item.stopped_at, &b.item.id))
            });
        }
    }

    impl RecordStore for Memory {
        fn persist<'a>(
            &'a self,
            stopper: &'a Owner,
            record: std::sync::Arc<StopRecord>,
        ) -> RecordFuture<'a, Persisted> {
            self.persist_now(stopper, &record);
            Box::pin(async { Ok(Persisted::Durable) })
        }

        fn lease<'a>(
            &'a self,
            owner: &'a Owner,
            max: usize,
            lease_for: Duration,
        ) -> RecordFuture<'a, Vec<Leased>> {
            let now = self.clock.now();
            let mut leased = Vec::new();
            for s in self.items.lock().unwrap().iter_mut() {
                let liveness = s
                    .lease
                    .as_ref()
                    .map_or(Liveness::Dead, |l| (self.probe)(&l.owner));
                if leased.len() < max
                    && s.quarantined.is_none()
                    && is_offered(s.lease.as_ref(), now, liveness)
                {
                    if let Some(why) = failure_at_takeover(s.lease.as_ref(), liveness) {
                        s.item = s.item.clone().with_failures(s.item.failures + 1, Some(why));
                    }
                    let lease = Lease::new(owner.clone(), now, end(now, lease_for));
                    s.lease = Some(lease.clone());
                    leased.push(Leased::new(s.item.clone(), lease));
                }
            }
            Box::pin(async { Ok(leased) })
        }

        fn renew<'a>(
            &'a self,
            owner: &'a Owner,
            ids: &'a [String],
            lease_for: Duration,
        ) -> RecordFuture<'a, Vec<String>> {
            let now = self.clock.now();
            let mut renewed = Vec::new();
            let mut items = self.items.lock().unwrap();
            for id in ids {
                if let Some(s) = items
                    .iter_mut()
                    .find(|s| &s.item.id == id && holds(s.lease.as_ref(), owner))
                {
                    s.lease = Some(Lease::new(owner.clone(), now, end(now, lease_for)));
                    renewed.push(id.clone());
                }
            }
            Box::pin(async { Ok(renewed) })
        }

        fn acknowledge<'a>(&'a self, owner: &'a Owner, id: &'a str) -> RecordFuture<'a, ()> {
            let mut items = self.items.lock().unwrap();
            let result = match items.iter().position(|s| s.item.id == id) {
                None => Err(RecordError::UnknownItem { id: id.into() }),
                Some(i) if self.lax || holds(items[i].lease.as_ref(), owner) => {
                    items.remove(i);
                    Ok(())
                }
                Some(i) => Err(RecordError::NotHolder {
                    id: id.into(),
                    holder: items[i].lease.as_ref().map(|l| l.owner.to_string()),
                }),
            };
            Box::pin(async { result })
        }

        fn release<'a>(&'a self, owner: Option<&'a Owner>, id: &'a str) -> RecordFuture<'a, bool> {
            let mut items = self.items.lock().unwrap();
            let result = match items.iter_mut().find(|s| s.item.id == id) {
                None => Err(RecordError::UnknownItem { id: id.into() }),
                Some(s) if owner.is_none() && s.quarantined.is_some() => {
                    let last = s.item.last_failure.clone();
                    *s = ItemState::new(s.item.clone().with_failures(0, last), None);
                    Ok(true)
                }
                Some(s) => match (&s.lease, owner) {
                    (None, _) => Ok(false),
                    (Some(l), Some(o)) if l.owner != *o => Err(RecordError::NotHolder {
                        id: id.into(),
                        holder: Some(l.owner.to_string()),
                    }),
                    (Some(_), _) => {
                        s.lease = None;
                        Ok(true)
                    }
                },
            };
            Box::pin(async { result })
        }

        fn hold_aside<'a>(
            &'a self,
            owner: &'a Owner,
            id: &'a str,
            reason: &'a str,
        ) -> RecordFuture<'a, ()> {
            let mut items = self.items.lock().unwrap();
            let result = match items.iter_mut().find(|s| s.item.id == id) {
                None => Err(RecordError::UnknownItem { id: id.into() }),
                Some(s) if holds(s.lease.as_ref(), owner) => {
                    *s = ItemState::new(s.item.clone(), None).with_quarantine(reason);
                    Ok(())
                }
                Some(s) => Err(RecordError::NotHolder {
                    id: id.into(),
                    holder: s.lease.as_ref().map(|l| l.owner.to_string()),
                }),
            };
            Box::pin(async { result })
        }

        fn remove<'a>(&'a self, id: &'a str) -> RecordFuture<'a, bool> {
            let mut items = self.items.lock().unwrap();
            let before = items.len();
            items.retain(|s| s.item.id != id);
            let removed = items.len() < before;
            Box::pin(async move { Ok(removed) })
        }

        fn list(&self) -> RecordFuture<'_, Vec<ItemState>> {
            let items = self.items.lock().unwrap().clone();
            Box::pin(async { Ok(items) })
        }

        fn last_stop(&self) -> RecordFuture<'_, Option<StopRecord>> {
            Box::pin(async { Ok(None) })
        }
    }
}

struct Outside;

impl Backend for Outside {
    fn open(clock: Arc<dyn Clock>, probe: Probe) -> (Arc<dyn RecordStore>, Box<dyn std::any::Any>) {
        (Arc::new(outside::Memory::new(clock, probe)), Box::new(()))
    }
}

/// The same store with one rule broken: any owner may acknowledge any item.
struct Lax;

impl Backend for Lax {
    fn open(clock: Arc<dyn Clock>, probe: Probe) -> (Arc<dyn RecordStore>, Box<dyn std::any::Any>) {
        let mut store = outside::Memory::new(clock, probe);
        store.lax = true;
        (Arc::new(store), Box::new(()))
    }
}

/// The suite is a checker that fails: a store that lets an owner acknowledge an item it does not
/// hold is reported, with the shrunk sequence of steps.
#[test]
fn the_suite_reports_a_store_that_lets_anyone_acknowledge() {
    let failed = std::panic::catch_unwind(|| check_conformance::<Lax>(200, None))
        .expect_err("the suite passed a store that breaks the holder rule");
    let said = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        said.contains("does not conform to the model") && said.contains("Ack"),
        "{said}"
    );
}

/// A store written outside the crate from its public API passes the same suite.
#[test]
fn a_store_written_outside_the_crate_conforms() {
    check_conformance::<Outside>(cases().min(200), Some(REGRESSIONS));
}

#[cfg(unix)]
mod with_processes {
    use super::common::Lcg;
    use super::common::process::*;
    use serde_json::Value;
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Duration;

    fn stop_wait(d: &Dirs, pid: u32) -> (Option<i32>, Value) {
        let out = stop_json(&d.run, &pid.to_string(), &["--wait", "20"]);
        (out.status.code(), json_of(&out))
    }

    /// The items the record store holds (`records list --json`).
    fn listed(d: &Dirs) -> Vec<Value> {
        let out = run(&["records", "list", "--state", s(&d.state), "--json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        json_of(&out)["items"].as_array().unwrap().clone()
    }

    /// The ids acknowledged so far (the store keeps each acknowledgement for a day).
    fn acknowledged(d: &Dirs) -> Vec<String> {
        let mut ids: Vec<String> = std::fs::read_dir(d.state.join("planned-stop-acked"))
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                name.strip_suffix(".item.json").map(str::to_owned)
            })
            .collect();
        ids.sort();
        ids
    }

    fn strings(v: &Value) -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_owned())
            .collect()
    }

    /// A stop of a service with `jobs` jobs that cannot finish: returns the ids it left.
    fn leave_items(d: &Dirs, jobs: u32) -> Vec<String> {
        let existing = if d.state.exists() {
            listed(d)
        } else {
            Vec::new()
        };
        let before: BTreeSet<String> = existing
            .iter()
            .map(|i| i["item"]["id"].as_str().unwrap().to_owned())
            .collect();
        let jobs = jobs.to_string();
        let mut first = serve(
            d,
            &["--jobs", &jobs, "--job-ms", "600000", "--drain-ms", "50"],
        );
        let (code, report) = stop_wait(d, first.pid());
        assert_eq!(code, Some(0), "{report}");
        assert_eq!(first.exit_code(), Some(0));
        listed(d)
            .iter()
            .map(|i| i["item"]["id"].as_str().unwrap().to_owned())
            .filter(|id| !before.contains(id))
            .collect()
    }

    /// Waits until `serve` has printed an `acked` event per resumed item; returns the ids.
    fn wait_all_acked(serve: &Serve) -> Vec<String> {
        let n = serve.seen("resumed").unwrap()["jobs"].as_u64().unwrap() as usize;
        serve.wait_acked(n)
    }

    #[test]
    fn a_record_that_cannot_be_persisted_is_reported_as_lost_never_as_planned() {
        let d = dirs();
        let mut service = serve(
            &d,
            &["--jobs", "2", "--job-ms", "600000", "--drain-ms", "50"],
        );
        // The store breaks while the service runs: a file where the item directory was.
        let items = d.state.join("planned-stop-items");
        std::fs::remove_dir_all(&items).unwrap();
        std::fs::write(&items, b"in the way").unwrap();
        let (code, report) = stop_wait(&d, service.pid());
        assert_eq!(report["outcome"], "record_lost", "{report}");
        assert_eq!(code, Some(10), "{report}");
        assert_eq!(report["exit_code"], 74);
        assert_eq!(service.exit_code(), Some(74), "never exit 0");
        assert_eq!(service.expect("exit")["code"], 74);
        // The items are on stderr, as JSON, for an operator to resubmit.
        let stderr = service.stderr_after_exit();
        let line = stderr
            .lines()
            .find(|l| l.contains("cannot persist the stop record"))
            .unwrap_or_else(|| panic!("no ERROR line: {stderr}"));
        assert!(line.contains("ERROR"), "{line}");
        let json = &line[line.find("items=").unwrap() + "items=".len()..];
        let json = &json[..=json.find(']').unwrap()];
        let items: Vec<Value> = serde_json::from_str(json).unwrap();
        let names: BTreeSet<&str> = items.iter().map(|i| i["item"].as_str().unwrap()).collect();
        let pid = service.pid();
        assert_eq!(
            names,
            BTreeSet::from([&*format!("job-{pid}-0"), &*format!("job-{pid}-1")])
        );
    }

    #[test]
    fn a_state_directory_that_cannot_be_used_fails_the_start_before_ready() {
        let d = dirs();
        std::fs::create_dir_all(&d.run).unwrap();
        let file = d.run.join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        let state = file.join("state");
        let out = run(&[
            "serve",
            "--dir",
            s(&d.run),
            "--state",
            s(&state),
            "--jobs",
            "1",
        ]);
        assert_eq!(out.status.code(), Some(2));
        assert!(!String::from_utf8_lossy(&out.stdout).contains("ready"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(s(&state)) || stderr.contains(s(&file)),
            "{stderr}"
        );
        // In the state directory's own words, not the marker directory's.
        assert!(stderr.contains("state directory"), "{stderr}");
        assert!(!stderr.contains("marker directory"), "{stderr}");
    }

    #[test]
    fn a_shared_state_directory_is_refused_unless_allowed() {
        use std::os::unix::fs::PermissionsExt;
        let d = dirs();
        std::fs::create_dir_all(&d.state).unwrap();
        std::fs::set_permissions(&d.state, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let out = run(&["serve", "--dir", s(&d.run), "--state", s(&d.state)]);
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("writable"), "{stderr}");
        let service = serve(&d, &["--allow-shared-state"]);
        assert_eq!(service.ready["event"], "ready");
    }

    #[test]
    fn under_umask_0_the_state_directory_is_still_created_private() {
        use std::io::BufRead;
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        let d = dirs();
        let mut cmd = planned_stop();
        cmd.args(["serve", "--dir", s(&d.run), "--state", s(&d.state)])
            .stdout(std::process::Stdio::piped())
            .stdin(std::process::Stdio::null());
        // SAFETY: umask(2) is async-signal-safe and touches only the child.
        unsafe {
            cmd.pre_exec(|| {
                libc::umask(0);
                Ok(())
            });
        }
        let mut child = cmd.spawn().unwrap();
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let ready = stdout
            .lines()
            .map(Result::unwrap)
            .find(|l| l.contains("\"ready\""));
        let _ = child.kill();
        let _ = child.wait();
        assert!(ready.is_some());
        for dir in [d.state.clone(), d.state.join("planned-stop-items")] {
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", dir.display());
        }
    }

    #[test]
    fn a_fifo_at_the_record_path_does_not_block_the_start_or_the_stop() {
        let d = dirs();
        std::fs::create_dir_all(&d.state).unwrap();
        let record = d.state.join("planned-stop-record.json");
        let c = std::ffi::CString::new(s(&record)).unwrap();
        // SAFETY: a valid C string; mkfifo has no other preconditions.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let mut service = serve(
            &d,
            &["--jobs", "1", "--job-ms", "600000", "--drain-ms", "50"],
        );
        let (code, report) = stop_wait(&d, service.pid());
        assert_eq!(code, Some(0), "{report}");
        assert_eq!(service.exit_code(), Some(0));
        assert_eq!(listed(&d).len(), 1, "the item is recorded");
        let taken: Vec<_> = std::fs::read_dir(&d.state)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.contains(".taken-") || n.contains(".tmp-"))
            .collect();
        assert!(taken.is_empty(), "nothing left behind: {taken:?}");
    }

    #[test]
    #[ignore = "needs root (files of another user): .ci/run runs it with --ignored"]
    fn items_in_a_file_owned_by_another_user_are_never_resumed() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("needs root to give a file to another user");
        }
        let d = dirs();
        let ids = leave_items(&d, 2);
        assert_eq!(ids.len(), 2);
        // The stop's batch, both items in it, given to another user.
        let batches: Vec<_> = std::fs::read_dir(d.state.join("planned-stop-batches"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        assert_eq!(batches.len(), 1, "{batches:?}");
        let c = std::ffi::CString::new(s(&batches[0])).unwrap();
        // SAFETY: a valid C string; chown to nobody.
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
        let next = serve(&d, &["--jobs", "0", "--job-ms", "10"]);
        let resumed = next.seen("resumed").unwrap();
        assert_eq!(
            strings(&resumed["ids"]),
            Vec::<String>::new(),
            "nothing another user's file holds"
        );
        next.wait_stderr("skipped");
    }

    /// Gives `path` and everything under it to `nobody` (65534).
    fn give_to_nobody(path: &std::path::Path) {
        let c = std::ffi::CString::new(s(path)).unwrap();
        // SAFETY: a valid C string; lchown never follows a link.
        assert_eq!(unsafe { libc::lchown(c.as_ptr(), 65534, 65534) }, 0);
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                give_to_nobody(&entry.unwrap().path());
            }
        }
    }

    /// Every entry under `path` (itself included) that does not belong to `nobody`.
    fn not_nobodys(path: &std::path::Path) -> Vec<String> {
        use std::os::unix::fs::MetadataExt;
        let mut found = Vec::new();
        if std::fs::symlink_metadata(path).unwrap().uid() != 65534 {
            found.push(s(path).to_owned());
        }
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                found.extend(not_nobodys(&entry.unwrap().path()));
            }
        }
        found
    }

    fn is_root() -> bool {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    }

    /// A state directory that belongs to another user (who could rename what it
    /// holds) is refused at start, even though it is 0700.
    #[test]
    #[ignore = "needs root (files of another user): .ci/run runs it with --ignored"]
    fn a_state_directory_of_another_user_is_refused_at_start() {
        if !is_root() {
            panic!("needs root to give a directory to another user");
        }
        let d = dirs();
        std::fs::create_dir_all(&d.state).unwrap();
        give_to_nobody(&d.state);
        let out = planned_stop()
            .args(["serve", "--dir", s(&d.run), "--state", s(&d.state)])
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("belongs to uid 65534"), "{stderr}");
    }

    /// Root's operator verbs on a `nobody` service's state directory
    /// create nothing when they only look, see the service's items, and act as the service's
    /// user when they change something.
    #[test]
    #[ignore = "needs root (files of another user): .ci/run runs it with --ignored"]
    fn roots_operator_verbs_on_another_users_state_directory_act_as_that_user() {
        if !is_root() {
            panic!("needs root to give a directory to another user");
        }
        let d = dirs();
        // The empty state directory of a service that runs as nobody.
        std::fs::create_dir_all(&d.state).unwrap();
        give_to_nobody(&d.state);
        let out = run(&["records", "list", "--state", s(&d.state), "--json"]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = run(&[
            "status",
            "--dir",
            s(&d.run),
            "--state",
            s(&d.state),
            "--json",
        ]);
        assert!(
            out.status.code().is_some(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            std::fs::read_dir(&d.state).unwrap().count(),
            0,
            "looking created nothing"
        );
        // Items the service left (written here as root, then given to the service's user).
        std::fs::remove_dir(&d.state).unwrap();
        let ids = leave_items(&d, 2);
        give_to_nobody(&d.state);
        assert_eq!(listed(&d).len(), 2, "root sees the service's items");
        let out = run(&["records", "release", "--state", s(&d.state), &ids[0]]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = run(&["records", "drop", "--state", s(&d.state), &ids[1]]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(listed(&d).len(), 1);
        assert_eq!(
            not_nobodys(&d.state),
            Vec::<String>::new(),
            "everything in the directory still belongs to the service's user"
        );
    }

    /// `records list` says whether an item's holder runs: alive while the service that leased it
    /// runs, gone once it was killed (and then offered again at the next lease).
    #[test]
    fn records_list_tells_a_running_holder_from_a_gone_one() {
        let d = dirs();
        let ids = leave_items(&d, 1);
        let holder = serve(&d, &["--jobs", "0", "--job-ms", "600000"]);
        assert_eq!(strings(&holder.seen("resumed").unwrap()["ids"]), ids);
        let items = listed(&d);
        assert_eq!(items.len(), 1, "{items:?}");
        assert_eq!(items[0]["holder_alive"], Value::Bool(true), "{items:?}");
        let text = run(&["records", "list", "--state", s(&d.state)]);
        assert!(
            String::from_utf8_lossy(&text.stdout).contains("(running)"),
            "{}",
            String::from_utf8_lossy(&text.stdout)
        );
        drop(holder); // SIGKILL, reaped
        let items = listed(&d);
        assert_eq!(items[0]["holder_alive"], Value::Bool(false), "{items:?}");
        let text = run(&["records", "list", "--state", s(&d.state)]);
        assert!(
            String::from_utf8_lossy(&text.stdout).contains("gone: offered again"),
            "{}",
            String::from_utf8_lossy(&text.stdout)
        );
    }

    /// Kill -9 at random points of a resume, 20 rounds: two resumers lease together (never the
    /// same item), one is killed; what it held and had not acknowledged is resumed by the next
    /// start. Every item is acknowledged exactly once in all.
    #[test]
    fn kill_9_in_the_middle_of_a_resume_loses_nothing_and_acknowledges_once() {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let mut rng = Lcg(seed);
        let d = dirs();
        let mut all = Vec::new();
        for round in 0..20 {
            let ids = leave_items(&d, 4);
            assert_eq!(ids.len(), 4);
            all.extend(ids.iter().cloned());
            let b = serve(&d, &["--jobs", "0", "--job-ms", "150"]);
            let mut c = serve(&d, &["--jobs", "0", "--job-ms", "150"]);
            let b_ids = strings(&b.seen("resumed").unwrap()["ids"]);
            let c_ids = strings(&c.seen("resumed").unwrap()["ids"]);
            let both: Vec<_> = b_ids.iter().filter(|i| c_ids.contains(i)).collect();
            assert!(
                both.is_empty(),
                "seed {seed} round {round}: leased twice {both:?}"
            );
            std::thread::sleep(Duration::from_millis(rng.below(220)));
            drop(b); // SIGKILL
            wait_all_acked(&c);
            let mut next = serve(&d, &["--jobs", "0", "--job-ms", "5"]);
            wait_all_acked(&next);
            for s in [&mut c, &mut next] {
                s.signal(libc::SIGINT);
                assert_eq!(s.exit_code(), Some(0));
            }
            assert!(
                listed(&d).is_empty(),
                "seed {seed} round {round}: {:?}",
                listed(&d)
            );
            let mut expected = all.clone();
            expected.sort();
            assert_eq!(acknowledged(&d), expected, "seed {seed} round {round}");
        }
    }

    /// An item whose holder is killed at every life is a failed attempt each time,
    /// and after the last allowed one it is held aside: not resumed, listed as quarantined with
    /// its failures and the last one, WARNed; `records release` offers it again, from zero. A
    /// planned stop that hands it back is no failure.
    #[test]
    fn an_item_killed_with_its_holder_at_every_life_is_held_aside_then_released() {
        let d = dirs();
        let ids = leave_items(&d, 1);
        let long = [
            "--jobs",
            "0",
            "--job-ms",
            "600000",
            "--max-failed-attempts",
            "2",
        ];
        // A planned stop hands it back: no failure.
        let mut planned = serve(&d, &long);
        assert_eq!(strings(&planned.seen("resumed").unwrap()["ids"]), ids);
        let (code, report) = stop_wait(&d, planned.pid());
        assert_eq!(code, Some(0), "{report}");
        assert_eq!(planned.exit_code(), Some(0));
        assert_eq!(
            listed(&d)[0]["item"]["failures"],
            0,
            "a deploy is not a failure"
        );
        let mut holder = serve(&d, &long);
        assert_eq!(strings(&holder.seen("resumed").unwrap()["ids"]), ids);
        for failures in 1..=2 {
            drop(holder); // SIGKILL while it holds the item
            holder = serve(&d, &long);
            let resumed = strings(&holder.seen("resumed").unwrap()["ids"]);
            let item = &listed(&d)[0];
            assert_eq!(item["item"]["failures"], failures, "{item}");
            let last = item["item"]["last_failure"].as_str().unwrap();
            assert!(last.contains("killed or crashed"), "{item}");
            if failures < 2 {
                assert_eq!(resumed, ids, "one failure of two allowed: resumed");
                continue;
            }
            assert!(resumed.is_empty(), "held aside, not resumed: {resumed:?}");
            let why = item["quarantined"].as_str().unwrap();
            assert!(why.contains("2 failed attempts"), "{item}");
            assert!(item["lease"].is_null(), "{item}");
        }
        holder.signal(libc::SIGINT);
        assert_eq!(holder.exit_code(), Some(0));
        let stderr = holder.stderr_after_exit();
        assert!(
            stderr
                .lines()
                .any(|l| l.contains("WARN") && l.contains("held aside") && l.contains(&ids[0])),
            "{stderr}"
        );
        let text = run(&["records", "list", "--state", s(&d.state)]);
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(
            text.contains("2 failed") && text.contains("quarantined"),
            "{text}"
        );
        // Still held aside at the next start.
        let mut still = serve(&d, &long);
        assert!(strings(&still.seen("resumed").unwrap()["ids"]).is_empty());
        still.signal(libc::SIGINT);
        assert_eq!(still.exit_code(), Some(0));
        let out = run(&["records", "release", "--state", s(&d.state), &ids[0]]);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let item = &listed(&d)[0];
        assert!(
            item["quarantined"].is_null() && item["item"]["failures"] == 0,
            "{item}"
        );
        let mut again = serve(
            &d,
            &["--jobs", "0", "--job-ms", "5", "--max-failed-attempts", "2"],
        );
        assert_eq!(wait_all_acked(&again), ids, "released: resumed and done");
        again.signal(libc::SIGINT);
        assert_eq!(again.exit_code(), Some(0));
        assert!(listed(&d).is_empty());
    }

    /// Four services share one state directory and are stopped at once; four new ones start at
    /// once: every item of every stopped service is resumed exactly once. 20 rounds.
    #[test]
    fn four_services_sharing_a_state_directory_lose_nothing_and_resume_each_item_once() {
        for _ in 0..20 {
            four_services_round();
        }
    }

    fn four_services_round() {
        let d = dirs();
        let services: Vec<Serve> = (0..4)
            .map(|_| {
                serve(
                    &d,
                    &["--jobs", "3", "--job-ms", "600000", "--drain-ms", "50"],
                )
            })
            .collect();
        let stoppers: Vec<_> = services
            .iter()
            .map(|sv| {
                let pid = sv.pid().to_string();
                let run_dir = d.run.clone();
                std::thread::spawn(move || {
                    run(&[
                        "stop",
                        "--pid",
                        &pid,
                        "--dir",
                        run_dir.to_str().unwrap(),
                        "--json",
                        "--wait",
                        "20",
                    ])
                })
            })
            .collect();
        for t in stoppers {
            let out = t.join().unwrap();
            assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
        }
        let left: BTreeSet<String> = listed(&d)
            .iter()
            .map(|i| i["item"]["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(left.len(), 12, "3 items from each of 4 services: {left:?}");
        // Four starts at once, sharing the state directory.
        let next: Vec<Serve> = std::thread::scope(|scope| {
            let starts: Vec<_> = (0..4)
                .map(|_| scope.spawn(|| serve(&d, &["--jobs", "0", "--job-ms", "5"])))
                .collect();
            starts.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for sv in &next {
            for id in wait_all_acked(sv) {
                *counts.entry(id).or_default() += 1;
            }
        }
        assert_eq!(
            counts.keys().cloned().collect::<BTreeSet<_>>(),
            left,
            "every item resumed"
        );
        assert!(
            counts.values().all(|&n| n == 1),
            "each exactly once: {counts:?}"
        );
        assert!(listed(&d).is_empty());
    }
}

/// The file store's listing, polled once outside any runtime: the store then works on this
/// thread, where a test's log capture is.
fn listed_at_once(
    store: &FileRecordStore,
) -> Result<Vec<planned_stop::record::ItemState>, planned_stop::record::RecordError> {
    let mut listing = store.list();
    let waker = std::task::Waker::noop();
    match listing
        .as_mut()
        .poll(&mut std::task::Context::from_waker(waker))
    {
        std::task::Poll::Ready(listed) => listed,
        std::task::Poll::Pending => panic!("outside a runtime the file store answers at once"),
    }
}

/// A file the store cannot use is reported by path, size and reason — never by its
/// contents (a 2 MiB item once became one 10 MB log line of its bytes).
#[test]
fn an_unusable_item_file_is_reported_without_its_contents() {
    let logs = common::actors::LogCapture::default();
    let _guard = logs.install();
    let dir = tempfile::tempdir().unwrap();
    let store = FileRecordStore::open(dir.path().join("state"), Sharing::Refused).unwrap();
    let items = store.dir().join("planned-stop-items");
    let big = format!("\"SECRET-1{}\"", "x".repeat(2 << 20));
    std::fs::write(items.join("big.item.json"), big).unwrap();
    std::fs::write(
        items.join("bad.item.json"),
        r#"{"id": "bad", "attempts": "SECRET-2"}"#,
    )
    .unwrap();
    let listed = listed_at_once(&store);
    assert!(listed.unwrap().is_empty());
    assert_eq!(logs.count(tracing::Level::WARN, "big.item.json"), 1);
    assert_eq!(logs.count(tracing::Level::WARN, "bad.item.json"), 1);
    assert!(logs.longest() < 1000, "no line carries a file");
    let all = logs.0.lock().unwrap();
    assert!(
        all.iter().all(|(_, line)| !line.contains("SECRET")),
        "{all:?}"
    );
}

/// A valid item under a name that is not an item id (`bad.id.item.json`),
/// or under a name that is not UTF-8, was skipped without the warning cli.md promises, and so
/// never resumed and never heard of. Each is now named in a WARN (path and why, never its
/// contents), and the items with good names are still listed.
#[test]
fn an_item_file_under_a_name_that_is_no_item_id_is_reported() {
    let logs = common::actors::LogCapture::default();
    let _guard = logs.install();
    let dir = tempfile::tempdir().unwrap();
    let store = FileRecordStore::open(dir.path().join("state"), Sharing::Refused).unwrap();
    let items = store.dir().join("planned-stop-items");
    let item = |id: &str| {
        serde_json::json!({"id": id, "participant": "jobs", "item": "SECRET",
            "stopped_by": {"host": "h", "pid": 1, "start": 1},
            "stopped_at": "2026-12-01T00:00:00Z", "attempts": 1})
        .to_string()
    };
    std::fs::write(items.join("good.item.json"), item("good")).unwrap();
    std::fs::write(items.join("bad.id.item.json"), item("bad")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let name = std::ffi::OsStr::from_bytes(b"b\xffd.item.json");
        std::fs::write(items.join(name), item("bd")).unwrap();
    }
    let listed = listed_at_once(&store);
    let ids: Vec<String> = listed.unwrap().into_iter().map(|s| s.item.id).collect();
    assert_eq!(ids, ["good"]);
    assert_eq!(logs.count(tracing::Level::WARN, "bad.id.item.json"), 1);
    #[cfg(unix)]
    assert_eq!(logs.count(tracing::Level::WARN, "not UTF-8"), 1);
    let all = logs.0.lock().unwrap();
    assert!(
        all.iter().all(|(_, line)| !line.contains("SECRET")),
        "{all:?}"
    );
}

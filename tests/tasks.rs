//! Work that runs as spawned tasks takes part in the drain ([`TaskGroup`]).
//!
//! Each test runs a real service (markers and a file record store in a temporary directory) in
//! this process, spawns jobs, requests a planned stop, and reads the stop record and the store:
//! a task that finishes is done (a resumed one acknowledged), one that sees its cancellation is
//! handed back (new work as a new item, resumed work under its id), a panic hands its job back
//! and makes the drain not clean, a payload that cannot be recorded is refused at once, and a
//! job offered once the drain has begun is given back to the caller.

use crate::common;

use planned_stop::record::{FileRecordStore, RecordStore, Sharing, StopRecord};
use planned_stop::{
    JobEnd, Layout, Refusal, ServiceBuilder, ServiceHandle, StopRequest, TaskGroup,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A service in `dir` with the given drain deadline, owning nothing of the process.
fn service(dir: &Path, drain: Duration) -> ServiceHandle {
    ServiceBuilder::new(Layout::Slots(dir.join("run")))
        .owns_process_exit(false)
        .state_dir(dir.join("state"))
        .drain_deadline(drain)
        .handle_signals(false)
        .events(false)
        .start()
        .unwrap()
}

fn record(dir: &Path) -> StopRecord {
    FileRecordStore::read_last_stop(&dir.join("state"))
        .unwrap()
        .expect("a stop record")
}

/// The ids of what the state directory holds, and the ids it acknowledged.
fn store_ids(dir: &Path) -> (Vec<String>, Vec<String>) {
    let state: PathBuf = dir.join("state");
    let store = FileRecordStore::open(&state, Sharing::Refused).unwrap();
    let listed = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(store.list())
        .unwrap();
    let acked = std::fs::read_dir(state.join("planned-stop-acked"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    (listed.into_iter().map(|s| s.item.id).collect(), acked)
}

/// Waits, on the event loop (which the group's tasks need), until `done`; fails the test with
/// `what` after the common event timeout.
async fn until(what: &str, done: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + common::EVENT_TIMEOUT;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        actix::clock::sleep(Duration::from_millis(2)).await;
    }
}

/// A task that works until it is cancelled: unfinished.
async fn until_cancelled(_: String, stop: planned_stop::CancellationToken) -> JobEnd {
    stop.cancelled().await;
    JobEnd::Unfinished
}

/// The tests' one work function, by the job's name: `quick` and `finish-me` are done at once,
/// `poison` panics, each telling `ended` its name first; any other works until it is cancelled.
async fn scripted(
    job: String,
    stop: planned_stop::CancellationToken,
    ended: tokio::sync::mpsc::UnboundedSender<String>,
) -> JobEnd {
    match job.as_str() {
        "quick" | "finish-me" => {
            let _ = ended.send(job);
            JobEnd::Done
        }
        "poison" => {
            let _ = ended.send(job);
            panic!("poison pill");
        }
        _ => until_cancelled(job, stop).await,
    }
}

/// A group of `scripted` jobs, and where their ends are heard.
fn scripted_group(
    h: &ServiceHandle,
) -> (
    TaskGroup<String>,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let group = TaskGroup::new(h, "jobs", move |job, stop| scripted(job, stop, tx.clone()));
    (group, rx)
}

#[test]
fn finished_tasks_are_done_and_cancelled_ones_are_handed_back_as_new_items() {
    let dir = tempfile::tempdir().unwrap();
    let code = actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let (group, mut ended) = scripted_group(&h);
        group.spawn("quick".to_owned()).unwrap();
        group.spawn("slow-1".to_owned()).unwrap();
        group.spawn("slow-2".to_owned()).unwrap();
        h.ready();
        assert_eq!(ended.recv().await.as_deref(), Some("quick"));
        until("the quick job leaves the group", || group.len() == 2).await;
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
        h.status().exit_code()
    });
    assert_eq!(code, Some(0));
    let record = record(dir.path());
    let mut items: Vec<_> = record.unfinished.iter().map(|u| u.item.clone()).collect();
    items.sort_by_key(|v| v.to_string());
    assert_eq!(
        items,
        ["slow-1", "slow-2"],
        "the cancelled two, not the done one"
    );
    assert!(
        record.drained_in_time && record.unanswered.is_empty(),
        "{record:?}"
    );
    // The drain told the tasks to stop: none was still running at its deadline.
    assert!(record.notes.is_empty(), "{:?}", record.notes);
    assert_eq!(store_ids(dir.path()).0.len(), 2);
}

#[test]
fn a_resumed_job_is_acknowledged_only_when_its_task_is_done_and_handed_back_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    // A first life leaves two items.
    actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let group = TaskGroup::new(&h, "jobs", until_cancelled);
        group.spawn("finish-me".to_owned()).unwrap();
        group.spawn("leave-me".to_owned()).unwrap();
        h.ready();
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    let (left, _) = store_ids(dir.path());
    assert_eq!(left.len(), 2);
    // The next resumes both: one finishes, the other sees the cancellation.
    actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let (group, mut ended) = scripted_group(&h);
        for leased in h.resume().await.unwrap() {
            group.spawn_resumed(leased).unwrap();
        }
        h.ready();
        assert_eq!(ended.recv().await.as_deref(), Some("finish-me"));
        until("the finished job leaves the group (acknowledged)", || {
            group.len() == 1
        })
        .await;
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    let record = record(dir.path());
    assert_eq!(record.unfinished.len(), 1, "{record:?}");
    assert!(record.unfinished[0].resumed, "handed back under its id");
    assert_eq!(record.unfinished[0].item, "leave-me");
    let (listed, acked) = store_ids(dir.path());
    assert_eq!(listed, [record.unfinished[0].id.clone().unwrap()]);
    assert_eq!(acked.len(), 1, "the finished one, acknowledged: {acked:?}");
}

#[test]
fn a_panicking_task_hands_its_job_back_and_the_drain_is_not_clean() {
    let dir = tempfile::tempdir().unwrap();
    actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let (group, mut ended) = scripted_group(&h);
        group.spawn("poison".to_owned()).unwrap();
        h.ready();
        assert_eq!(ended.recv().await.as_deref(), Some("poison"));
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    let record = record(dir.path());
    assert_eq!(record.unfinished.len(), 1);
    assert_eq!(record.unfinished[0].item, "poison");
    assert!(!record.drained_in_time, "not clean: {record:?}");
    let notes: Vec<String> = record.notes.iter().map(|n| format!("{n:?}")).collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("panicked") && n.contains("poison pill")),
        "{notes:?}"
    );
}

/// One life of a service allowing `max` failed attempts: resumes what is on offer into a task
/// group whose tasks panic, waits for each panic, and stops as planned. Returns the resumed ids.
fn a_panicking_life(dir: &Path, max: u32, new_job: Option<&str>) -> Vec<String> {
    actix::System::new().block_on(async {
        let h = ServiceBuilder::new(Layout::Slots(dir.join("run")))
            .owns_process_exit(false)
            .state_dir(dir.join("state"))
            .handle_signals(false)
            .events(false)
            .max_failed_attempts(max)
            .start()
            .unwrap();
        let (group, mut ended) = scripted_group(&h);
        let leased = h.resume().await.unwrap();
        let ids: Vec<String> = leased.iter().map(|l| l.item.id.clone()).collect();
        let mut spawned = 0;
        for item in leased {
            group.spawn_resumed(item).unwrap();
            spawned += 1;
        }
        if let Some(job) = new_job {
            group.spawn(job.to_owned()).unwrap();
            spawned += 1;
        }
        h.ready();
        for _ in 0..spawned {
            assert_eq!(ended.recv().await.as_deref(), Some("poison"));
        }
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
        ids
    })
}

/// A job whose task panics in every life counts a failed attempt each time
/// (a planned stop does not), and once it has used them all it is held aside for a person: the
/// next life does not get it, the store lists it with why.
#[test]
fn a_job_that_panics_in_every_life_is_held_aside_after_its_attempts() {
    let dir = tempfile::tempdir().unwrap();
    assert!(a_panicking_life(dir.path(), 3, Some("poison")).is_empty());
    let listed = || {
        let store = FileRecordStore::open(dir.path().join("state"), Sharing::Refused).unwrap();
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(store.list())
            .unwrap()
    };
    let id = listed()[0].item.id.clone();
    for failures in 1..=2 {
        let item = &listed()[0];
        assert_eq!(item.item.failures, failures, "{item:?}");
        let last = item.item.last_failure.as_deref().unwrap();
        assert!(
            last.contains("panicked") && last.contains("poison pill"),
            "{last}"
        );
        assert_eq!(
            a_panicking_life(dir.path(), 3, None),
            std::slice::from_ref(&id)
        );
    }
    let item = &listed()[0];
    assert_eq!(item.item.failures, 3, "{item:?}");
    assert!(
        item.quarantined.is_none(),
        "held aside by the next lease, not by the stop"
    );
    assert!(
        a_panicking_life(dir.path(), 3, None).is_empty(),
        "held aside, not resumed"
    );
    let item = &listed()[0];
    let why = item.quarantined.as_deref().expect("held aside");
    assert!(
        why.contains("3 failed attempts") && why.contains("poison pill"),
        "{why}"
    );
    assert!(
        a_panicking_life(dir.path(), 3, None).is_empty(),
        "still held aside"
    );
}

#[test]
fn a_payload_that_cannot_be_recorded_is_refused_at_once_and_given_back() {
    let dir = tempfile::tempdir().unwrap();
    actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let group: TaskGroup<HashMap<(u32, u32), u32>> =
            TaskGroup::new(&h, "grid", |_, _| async { JobEnd::Done });
        let job = HashMap::from([((1, 2), 3)]);
        let refused = group.spawn(job.clone()).unwrap_err();
        assert!(
            matches!(refused.reason, Refusal::NotSerializable(_)),
            "{refused}"
        );
        assert_eq!(refused.job, job, "given back");
        assert!(
            refused.to_string().contains("cannot be recorded"),
            "{refused}"
        );
        assert!(group.is_empty());
        h.ready();
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
}

#[test]
fn a_job_offered_once_the_drain_has_begun_is_given_back_to_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let group = TaskGroup::new(&h, "jobs", until_cancelled);
        h.ready();
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
        let refused = group.spawn("late".to_owned()).unwrap_err();
        assert!(matches!(refused.reason, Refusal::Stopping), "{refused}");
        assert_eq!(refused.job, "late");
    });
    assert!(record(dir.path()).unfinished.is_empty());
}

#[test]
fn a_job_spawned_from_another_thread_runs_on_the_services_system() {
    let dir = tempfile::tempdir().unwrap();
    actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let (ran_tx, mut ran_rx) = tokio::sync::mpsc::unbounded_channel();
        let group = TaskGroup::new(&h, "jobs", move |job: String, stop| {
            let ran = ran_tx.clone();
            async move {
                let _ = ran.send(std::thread::current().id());
                until_cancelled(job, stop).await
            }
        });
        h.ready();
        let system_thread = std::thread::current().id();
        // As an HTTP worker would: another thread, another runtime, which then ends.
        let other = group.clone();
        std::thread::spawn(move || {
            other.spawn("from-a-worker".to_owned()).unwrap();
        })
        .join()
        .unwrap();
        assert_eq!(ran_rx.recv().await.unwrap(), system_thread);
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    assert_eq!(record(dir.path()).unfinished[0].item, "from-a-worker");
}

/// A file store whose first lease waits until the test opens the gate: the window in which a
/// drain overtakes a lease under way.
#[derive(Debug)]
struct Gate {
    inner: FileRecordStore,
    open: std::sync::Arc<tokio::sync::Notify>,
    leasing: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl RecordStore for Gate {
    fn persist<'a>(
        &'a self,
        s: &'a planned_stop::record::Owner,
        r: std::sync::Arc<StopRecord>,
    ) -> planned_stop::record::RecordFuture<'a, planned_stop::record::Persisted> {
        self.inner.persist(s, r)
    }
    fn lease<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        m: usize,
        d: Duration,
    ) -> planned_stop::record::RecordFuture<'a, Vec<planned_stop::record::Leased>> {
        Box::pin(async move {
            if !self.leasing.swap(true, std::sync::atomic::Ordering::SeqCst) {
                self.open.notified().await;
            }
            self.inner.lease(o, m, d).await
        })
    }
    fn renew<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        ids: &'a [String],
        d: Duration,
    ) -> planned_stop::record::RecordFuture<'a, Vec<String>> {
        self.inner.renew(o, ids, d)
    }
    fn acknowledge<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        id: &'a str,
    ) -> planned_stop::record::RecordFuture<'a, ()> {
        self.inner.acknowledge(o, id)
    }
    fn release<'a>(
        &'a self,
        o: Option<&'a planned_stop::record::Owner>,
        id: &'a str,
    ) -> planned_stop::record::RecordFuture<'a, bool> {
        self.inner.release(o, id)
    }
    fn hold_aside<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        id: &'a str,
        reason: &'a str,
    ) -> planned_stop::record::RecordFuture<'a, ()> {
        self.inner.hold_aside(o, id, reason)
    }
    fn remove<'a>(&'a self, id: &'a str) -> planned_stop::record::RecordFuture<'a, bool> {
        self.inner.remove(id)
    }
    fn list(&self) -> planned_stop::record::RecordFuture<'_, Vec<planned_stop::record::ItemState>> {
        self.inner.list()
    }
    fn last_stop(&self) -> planned_stop::record::RecordFuture<'_, Option<StopRecord>> {
        self.inner.last_stop()
    }
}

/// A resume loop whose lease a drain overtakes. The lease is under way when the stop
/// comes; it brings two items back after the drain began. The loop's own drain waited for it
/// and handed both back in the same stop: they are in its record, under their ids, and pending
/// in the store — not held by a process that will never work on them.
#[test]
fn items_a_lease_brings_after_the_drain_began_are_handed_back_in_the_same_stop() {
    let dir = tempfile::tempdir().unwrap();
    actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let group = TaskGroup::new(&h, "jobs", until_cancelled);
        group.spawn("one".to_owned()).unwrap();
        group.spawn("two".to_owned()).unwrap();
        h.ready();
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    assert_eq!(store_ids(dir.path()).0.len(), 2);
    let gate = std::sync::Arc::new(Gate {
        inner: FileRecordStore::open(dir.path().join("state"), Sharing::Refused).unwrap(),
        open: std::sync::Arc::default(),
        leasing: std::sync::Arc::default(),
    });
    actix::System::new().block_on(async {
        let h = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
            .owns_process_exit(false)
            .record_store(gate.clone())
            .drain_deadline(Duration::from_secs(5))
            .handle_signals(false)
            .events(false)
            .start()
            .unwrap();
        let group = TaskGroup::new(&h, "jobs", until_cancelled);
        planned_stop::ResumeLoop::new(&h, Duration::from_millis(5))
            .deliver_to(&group)
            .start();
        h.ready();
        let leasing = gate.leasing.clone();
        until("the loop's lease is under way", || {
            leasing.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await;
        h.request_stop(StopRequest::Planned);
        let mut status = h.subscribe();
        let _ = status.wait_for(|s| s.state.is_stopping()).await;
        gate.open.notify_one();
        h.stopped().await;
        assert!(group.is_empty(), "nothing was delivered to a drained group");
    });
    let record = record(dir.path());
    let mut back: Vec<_> = record
        .unfinished
        .iter()
        .map(|u| (u.item.clone(), u.resumed))
        .collect();
    back.sort_by_key(|(v, _)| v.to_string());
    assert_eq!(
        back,
        [
            (serde_json::json!("one"), true),
            (serde_json::json!("two"), true)
        ],
        "{record:?}"
    );
    let state = FileRecordStore::open(dir.path().join("state"), Sharing::Refused).unwrap();
    let items = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(state.list())
        .unwrap();
    assert!(
        items.iter().all(|i| i.lease.is_none()),
        "pending again: {items:?}"
    );
}

/// A participant that never answers its `Drain`: only a force ends the stop.
#[cfg(unix)]
struct Stuck;

#[cfg(unix)]
impl actix::Actor for Stuck {
    type Context = actix::Context<Self>;
}

#[cfg(unix)]
impl actix::Handler<planned_stop::Drain> for Stuck {
    type Result = actix::ResponseFuture<planned_stop::DrainReport>;
    fn handle(&mut self, _: planned_stop::Drain, _: &mut actix::Context<Self>) -> Self::Result {
        Box::pin(std::future::pending())
    }
}

/// One life as the process `identity` (a pid that has ended, so the next life sees the lease's
/// holder dead), allowing one failed attempt: leases what is on offer, holds it in a participant
/// that never answers, and ends with a planned stop that is then forced (`stop --kill`'s first
/// step, or a second Ctrl-C). Returns the ids it leased.
#[cfg(unix)]
fn a_forced_life(dir: &Path, identity: planned_stop::ProcessIdentity) -> Vec<String> {
    use actix::Actor;
    actix::System::new().block_on(async {
        let h = ServiceBuilder::new(Layout::Slots(dir.join("run")))
            .owns_process_exit(false)
            .state_dir(dir.join("state"))
            .handle_signals(false)
            .events(false)
            .max_failed_attempts(1)
            .identity(identity)
            .participant("stuck", Stuck.start().recipient())
            .start()
            .unwrap();
        let leased = h.resume().await.unwrap();
        h.ready();
        h.request_stop(StopRequest::Planned);
        let mut status = h.subscribe();
        while !status.borrow_and_update().state.is_stopping() {
            status.changed().await.unwrap();
        }
        h.request_stop(StopRequest::Force);
        assert_eq!(
            h.stopped().await,
            std::process::ExitCode::SUCCESS,
            "planned, forced"
        );
        leased.into_iter().map(|l| l.item.id).collect()
    })
}

/// Issue 48 #4: a forced planned stop counted a failed attempt ("killed or crashed") for every
/// item a participant it cut off held, so under `--max-failed-attempts 1` one deploy reaching
/// `--kill`'s deadline held aside a job that never failed. The forced stop gives such items back
/// now: the next life resumes the job, with no failure counted.
#[cfg(unix)]
#[test]
fn a_forced_planned_stop_is_no_failed_attempt_of_the_items_it_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    // A job left by an earlier planned stop.
    actix::System::new().block_on(async {
        let h = service(dir.path(), Duration::from_secs(5));
        let group = TaskGroup::new(&h, "jobs", until_cancelled);
        group.spawn("long-job".to_owned()).unwrap();
        h.ready();
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    let mut ended = std::process::Command::new("true").spawn().unwrap();
    ended.wait().unwrap();
    let gone = planned_stop::ProcessIdentity::new(ended.id(), 1, chrono::Utc::now());
    let leased = a_forced_life(dir.path(), gone);
    assert_eq!(leased.len(), 1, "the forced life held the job");
    // The next start, allowing one failed attempt, resumes it (it was held aside).
    let resumed = actix::System::new().block_on(async {
        let h = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
            .owns_process_exit(false)
            .state_dir(dir.path().join("state"))
            .handle_signals(false)
            .events(false)
            .max_failed_attempts(1)
            .start()
            .unwrap();
        let mut resumed = Vec::new();
        for leased in h.resume().await.unwrap() {
            assert!(h.release(&leased).await.unwrap(), "{leased:?}");
            resumed.push(leased.item.id);
        }
        resumed
    });
    assert_eq!(resumed, leased, "the job is resumed, not held aside");
    let store = FileRecordStore::open(dir.path().join("state"), Sharing::Refused).unwrap();
    let items = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(store.list())
        .unwrap();
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0].item.failures, 0, "no failed attempt: {items:?}");
    assert!(items[0].quarantined.is_none(), "not held aside: {items:?}");
}

//! How long the actix `System`'s event loop stalls while lease renewal contends with another
//! process for the state directory's lock (docs/performance.md, "The record store and the event
//! loop").
//!
//! One run, two ways side by side: the file store's work run *on* the System thread (as it was
//! before it moved to the blocking threads: the thread waits for the lock and the disk) and run
//! the way the store runs it now (the runtime's blocking threads). Meanwhile another thread,
//! standing in for a second service sharing the directory, holds the lock for 20 ms out of every
//! 25 ms, and a 1 ms ticker on the System measures how late each of its ticks fires.
//!
//! `cargo bench --bench system_stall` (about 10 s).

use planned_stop::record::{FileRecordStore, Owner, RecordStore};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const RUN: Duration = Duration::from_secs(4);
const TICK: Duration = Duration::from_millis(1);

#[derive(Clone, Copy, PartialEq)]
enum Way {
    OnTheSystemThread,
    OffTheSystemThread,
}

struct Figures {
    ticks: usize,
    p50: Duration,
    p99: Duration,
    worst: Duration,
    renewals: usize,
}

fn measure(way: Way) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let (store, owner, ids) = leased_items(dir.path());
    // Another process sharing the directory (another open file description of the lock file).
    let stop = Arc::new(AtomicBool::new(false));
    let contender = contend(store.dir().join(".planned-stop.lock"), stop.clone());
    let figures = actix::System::new().block_on(async move {
        let renewals = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicBool::new(false));
        actix::spawn(renew_until(
            done.clone(),
            renewals.clone(),
            way,
            store,
            owner,
            ids,
        ));
        let mut late = lateness().await;
        done.store(true, Ordering::Relaxed);
        late.sort();
        let at = |q: f64| late[((late.len() - 1) as f64 * q) as usize];
        Figures {
            ticks: late.len(),
            p50: at(0.5),
            p99: at(0.99),
            worst: *late.last().unwrap(),
            renewals: renewals.load(Ordering::Relaxed),
        }
    });
    stop.store(true, Ordering::Relaxed);
    contender.join().unwrap();
    figures
}

/// A runtime without a reactor, which runs the store's work in place.
fn plain() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
}

/// A file store in `dir` holding 20 items, all leased to the owner returned with their ids.
fn leased_items(dir: &std::path::Path) -> (FileRecordStore, Owner, Vec<String>) {
    let store =
        FileRecordStore::open(dir.join("state"), planned_stop::record::Sharing::Refused).unwrap();
    let owner = Owner::new("bench-host", 1, 1);
    let items: Vec<serde_json::Value> = (0..20)
        .map(|i| serde_json::json!(format!("job-{i}")))
        .collect();
    plain()
        .block_on(store.persist(&Owner::new("bench-host", 9, 9), stop_record(items).into()))
        .unwrap();
    let ids: Vec<String> = plain()
        .block_on(store.lease(&owner, usize::MAX, Duration::from_secs(600)))
        .unwrap()
        .into_iter()
        .map(|l| l.item.id)
        .collect();
    (store, owner, ids)
}

/// A thread that holds the lock file for 20 ms out of every 25 ms until `stop`.
fn contend(lock: std::path::PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let file = std::fs::File::open(lock).unwrap();
        while !stop.load(Ordering::Relaxed) {
            file.lock().unwrap();
            std::thread::sleep(Duration::from_millis(20));
            file.unlock().unwrap();
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

/// Renews every item every 2 ms, the store's work run the `way` measured, until `done`.
async fn renew_until(
    done: Arc<AtomicBool>,
    renewals: Arc<AtomicUsize>,
    way: Way,
    store: FileRecordStore,
    owner: Owner,
    ids: Vec<String>,
) {
    while !done.load(Ordering::Relaxed) {
        let renewed = match way {
            // The store's work inline on this thread: a thread without a runtime runs it in
            // place, and the System thread waits for it to finish.
            Way::OnTheSystemThread => std::thread::scope(|s| {
                s.spawn(|| plain().block_on(store.renew(&owner, &ids, Duration::from_secs(600))))
                    .join()
                    .unwrap()
            }),
            Way::OffTheSystemThread => store.renew(&owner, &ids, Duration::from_secs(600)).await,
        };
        assert_eq!(renewed.unwrap().len(), ids.len());
        renewals.fetch_add(1, Ordering::Relaxed);
        actix::clock::sleep(Duration::from_millis(2)).await;
    }
}

/// How late each tick of a 1 ms ticker on the System fires, over the run.
async fn lateness() -> Vec<Duration> {
    let mut late = Vec::new();
    let started = Instant::now();
    let mut next = Instant::now() + TICK;
    while started.elapsed() < RUN {
        actix::clock::sleep_until(next.into()).await;
        let now = Instant::now();
        late.push(now.saturating_duration_since(next));
        next = now + TICK;
    }
    late
}

/// A planned stop's record leaving `items`, as the runner would persist it.
fn stop_record(items: Vec<serde_json::Value>) -> planned_stop::record::StopRecord {
    let at = chrono::Utc::now();
    let unfinished: Vec<_> = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| serde_json::json!({"id": format!("bench-{i:04}"), "participant": "jobs", "item": item}))
        .collect();
    planned_stop::testing::stop_record(9, at, unfinished)
}

fn main() {
    println!("| the file store's work | ticks | tick lateness p50 | p99 | worst | renewals |");
    println!("|---|---|---|---|---|---|");
    for (way, name) in [
        (Way::OnTheSystemThread, "on the System thread (before)"),
        (Way::OffTheSystemThread, "on the blocking threads (now)"),
    ] {
        let f = measure(way);
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms | {} |",
            f.ticks,
            f.p50.as_secs_f64() * 1e3,
            f.p99.as_secs_f64() * 1e3,
            f.worst.as_secs_f64() * 1e3,
            f.renewals
        );
    }
}

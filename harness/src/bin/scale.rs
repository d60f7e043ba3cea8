//! A planned stop at scale: how the stop, the record and the resume grow with the work held.
//!
//! ```sh
//! cargo build --release
//! [PLANNED_STOP_TEST_DATABASE_URL=postgres://…] \
//!     cargo run --release -p planned-stop-harness --bin scale -- [--stores] [N…]
//! ```
//!
//! `--stores` measures the record stores only (three rounds of each N, to show the spread).
//!
//! Two tables, for each N (default 10, 1,000, 10,000, 100,000):
//!
//! - **the record stores**: N unfinished items persisted in one stop (one `StopRecord`, what a
//!   `WorkSet` or `TaskGroup` of N hands back), beside the floor measured in the same run — for the
//!   file store the same bytes written to one file and synced once, for PostgreSQL the same rows
//!   in one `COPY` — then the next start's resume (every item leased in one call, by a new handle)
//!   and its own stop, which hands every item back;
//! - **the reference service** (`planned-stop serve --jobs N --job-ms 6000000 --drain-ms 2000`, each
//!   job a drain participant holding one item it hands back at the deadline; the file store): the
//!   stop's time past the drain, whether it was clean and how many items were handed back, the
//!   resident memory before the stop, and the next start's time to `ready` with every item resumed.
//!
//! - **one participant of N**: a `WorkSet` holding N items, and a `TaskGroup` of N tasks that
//!   never finish, in this process: the stop (the file store; the participant answers at once)
//!   from its request to the runner's stop, every item recorded (persist included), and the next
//!   start's resume.
//!
//! docs/performance.md has the figures.

use planned_stop::record::{FileRecordStore, Owner, RecordStore, Sharing, StopRecord};
use planned_stop_harness as common;
use planned_stop_postgres::PgRecordStore;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The bytes the file store wrote for the items (its batch files), written to one new file and
/// synced once, with the directory.
fn file_floor(dir: &std::path::Path, state: &std::path::Path) -> Duration {
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(state.join("planned-stop-batches")).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with(".batch.json") {
            bytes.extend(std::fs::read(path).unwrap());
        }
    }
    let started = Instant::now();
    let path = dir.join("floor.json");
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&bytes).unwrap();
    file.sync_all().unwrap();
    std::fs::File::open(dir).unwrap().sync_all().unwrap();
    started.elapsed()
}

fn file_store(n: usize) -> (Duration, Duration, Duration, Duration) {
    let dir = tempfile::tempdir().unwrap();
    let record = std::sync::Arc::new(common::record(n, "f"));
    let state = dir.path().join("state");
    let store = FileRecordStore::open(&state, Sharing::Refused).unwrap();
    let rt = common::runtime();
    let started = Instant::now();
    rt.block_on(store.persist(&Owner::new("stopper", 1, 1), std::sync::Arc::clone(&record)))
        .unwrap();
    let persist = started.elapsed();
    let floor = file_floor(dir.path(), &state);
    let next = FileRecordStore::open(&state, Sharing::Refused).unwrap();
    let started = Instant::now();
    let leased = rt
        .block_on(next.lease(
            &Owner::new("next", 2, 1),
            usize::MAX,
            Duration::from_secs(600),
        ))
        .unwrap();
    let resume = started.elapsed();
    assert_eq!(leased.len(), n, "every item resumed");
    let again = rt.block_on(hand_back(&next, &record, 2));
    (floor, persist, resume, again)
}

/// The next start's stop, handing every item it resumed back: its persist time.
async fn hand_back(store: &dyn RecordStore, record: &StopRecord, pid: u32) -> Duration {
    let mut back = record.clone();
    for item in &mut back.unfinished {
        item.resumed = true;
    }
    let back = std::sync::Arc::new(back);
    let started = Instant::now();
    store
        .persist(&Owner::new("next", pid, 1), back)
        .await
        .unwrap();
    started.elapsed()
}

fn postgres(url: &str, n: usize, round: usize) -> (Duration, Duration, Duration, Duration) {
    let rt = common::runtime();
    let service = format!("scale-{}-{n}-{round}", std::process::id());
    let record = std::sync::Arc::new(common::record(n, "p"));
    let open = || {
        PgRecordStore::from_url(url, service.clone())
            .unwrap()
            .operation_timeout(Duration::from_secs(120))
    };
    let store = open();
    let started = Instant::now();
    rt.block_on(store.persist(&Owner::new("stopper", 1, 1), std::sync::Arc::clone(&record)))
        .unwrap();
    let persist = started.elapsed();
    let floor = rt.block_on(copy_floor(url, &record));
    let next = open();
    let started = Instant::now();
    let leased = rt
        .block_on(next.lease(
            &Owner::new("next", 2, 1),
            usize::MAX,
            Duration::from_secs(600),
        ))
        .unwrap();
    let resume = started.elapsed();
    assert_eq!(leased.len(), n, "every item resumed");
    let again = rt.block_on(hand_back(&next, &record, 2));
    (floor, persist, resume, again)
}

/// The same rows in one `COPY` into a table like the store's own (its columns, keys and
/// indexes), in one transaction.
async fn copy_floor(url: &str, record: &StopRecord) -> Duration {
    use futures_util::SinkExt;
    let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS planned_stop_floor (LIKE planned_stop_items INCLUDING ALL); \
             TRUNCATE planned_stop_floor",
        )
        .await
        .unwrap();
    let mut text = String::new();
    for u in &record.unfinished {
        let item = serde_json::to_string(&u.item)
            .unwrap()
            .replace('\\', "\\\\");
        text.push_str(&format!(
            "floor\t{}\t{}\t{item}\tstopper\t1\t1\t{}\t1\t0\n",
            u.id.as_deref().unwrap_or_default(),
            u.participant,
            record.finished_at.to_rfc3339()
        ));
    }
    let started = Instant::now();
    let tx = client.transaction().await.unwrap();
    let sink = tx
        .copy_in(
            "COPY planned_stop_floor (service, id, participant, item, stopped_by_host, \
             stopped_by_pid, stopped_by_start, stopped_at, attempts, failures) FROM STDIN",
        )
        .await
        .unwrap();
    let mut sink = std::pin::pin!(sink);
    sink.send(bytes::Bytes::from(text)).await.unwrap();
    sink.finish().await.unwrap();
    tx.commit().await.unwrap();
    started.elapsed()
}

/// Resident memory of `pid`, in MB.
fn resident_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

// A panic here ends the harness: the child is left to the operator's shell, as a failed
// measurement's processes are in every harness of this crate.
#[allow(clippy::zombie_processes)]
/// Starts `serve` with `jobs` jobs in `base`; returns the child, its stdout lines and when the
/// `ready` event came (with its `jobs` count).
fn serve(
    base: &std::path::Path,
    jobs: usize,
) -> (
    std::process::Child,
    BufReader<std::process::ChildStdout>,
    Duration,
    u64,
) {
    let started = Instant::now();
    let mut child = Command::new(common::planned_stop_binary())
        .args(["serve", "--dir"])
        .arg(base.join("run"))
        .arg("--state")
        .arg(base.join("state"))
        .args([
            "--jobs",
            &jobs.to_string(),
            "--job-ms",
            "6000000",
            "--drain-ms",
            "2000",
        ])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "serve ended before ready"
        );
        let event: serde_json::Value = serde_json::from_str(&line).unwrap();
        if event["event"] == "ready" {
            return (
                child,
                out,
                started.elapsed(),
                event["jobs"].as_u64().unwrap_or(0),
            );
        }
    }
}

fn service(n: usize) {
    let base = tempfile::tempdir().unwrap();
    let (mut child, _out, _, _) = serve(base.path(), n);
    let rss = resident_mb(child.id());
    let started = Instant::now();
    let stop = Command::new(common::planned_stop_binary())
        .args(["stop", "--pid", &child.id().to_string(), "--dir"])
        .arg(base.path().join("run"))
        .args(["--wait", "120", "--json"])
        .output()
        .unwrap();
    let took = started.elapsed();
    let answer: serde_json::Value = serde_json::from_slice(
        stop.stdout
            .rsplit(|&b| b == b'\n')
            .find(|l| !l.is_empty())
            .unwrap_or(b"{}"),
    )
    .unwrap_or_default();
    let code = child.wait().unwrap().code();
    let handed = answer["drain"]["handed_back"].as_u64().unwrap_or(0);
    let (mut next, _out, ready, resumed) = serve(base.path(), 0);
    let _ = next.kill();
    let _ = next.wait();
    println!(
        "| {n} | {} | {} | {} | {handed} | {resumed} | {} | {rss:.0} MB | {} |",
        ms(took.saturating_sub(Duration::from_secs(2))),
        answer["outcome"].as_str().unwrap_or("?"),
        answer["clean"],
        n - (resumed as usize).min(n),
        ms(ready),
    );
    let _ = code;
}

/// A participant holding a `WorkSet` of strings.
struct Held(planned_stop::WorkSet<String>);

impl actix::Actor for Held {
    type Context = actix::Context<Self>;
}

impl actix::Handler<planned_stop::Drain> for Held {
    type Result = planned_stop::DrainReport;
    fn handle(
        &mut self,
        _: planned_stop::Drain,
        _: &mut Self::Context,
    ) -> planned_stop::DrainReport {
        self.0.drain()
    }
}

/// One participant of `n` items (`group`: a `TaskGroup`, else a `WorkSet`): the time from the
/// stop's request to the runner's stop, and the next start's resume of every item.
fn one_participant(n: usize, group: bool) -> (Duration, Duration) {
    use actix::Actor;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let drain = Duration::from_secs(2);
    let builder = || {
        planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots(dir.path().join("run")))
            .owns_process_exit(false)
            .state_dir(&state)
            .drain_deadline(drain)
            .handle_signals(false)
            .events(false)
    };
    let stopped = actix::System::new().block_on(async {
        let h = builder().start().unwrap();
        if group {
            let tasks =
                planned_stop::TaskGroup::new(&h, "jobs", |_: String, cancelled| async move {
                    cancelled.cancelled().await;
                    planned_stop::JobEnd::Unfinished
                });
            for i in 0..n {
                tasks.spawn(format!("job-{i}")).unwrap();
            }
        } else {
            let mut set = planned_stop::WorkSet::new(&h);
            for i in 0..n {
                set.add(format!("job-{i}")).unwrap();
            }
            h.add_participant(
                planned_stop::DrainPhase::Work,
                "jobs",
                Held(set).start().recipient(),
            );
        }
        h.ready();
        let asked = Instant::now();
        h.request_stop(planned_stop::StopRequest::Planned);
        let code = h.stopped().await;
        assert_eq!(code, std::process::ExitCode::SUCCESS);
        asked.elapsed()
    });
    let started = Instant::now();
    let resumed = actix::System::new().block_on(async {
        let h = builder().start().unwrap();
        h.resume().await.unwrap().len()
    });
    assert_eq!(resumed, n, "every item resumed");
    (stopped, started.elapsed())
}

fn main() {
    let sizes: Vec<usize> = common::args().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![10, 1_000, 10_000, 100_000]
    } else {
        sizes
    };
    let stores_only = common::args().any(|a| a == "--stores");
    let rounds = if stores_only { 3 } else { 1 };
    // Each PostgreSQL round its own service name, so no round resumes another's items.
    let mut round = 0..;
    let url = std::env::var("PLANNED_STOP_TEST_DATABASE_URL").ok();
    println!(
        "| store | N | floor | persist | persist / floor | resume (lease all) | all handed back again |"
    );
    println!("|---|---|---|---|---|---|---|");
    for n in sizes.iter().flat_map(|&n| std::iter::repeat_n(n, rounds)) {
        let (floor, persist, resume, again) = file_store(n);
        println!(
            "| file store | {n} | {} | {} | {:.1}× | {} | {} |",
            ms(floor),
            ms(persist),
            persist.as_secs_f64() / floor.as_secs_f64().max(1e-6),
            ms(resume),
            ms(again)
        );
        if let Some(url) = &url {
            let (floor, persist, resume, again) = postgres(url, n, round.next().unwrap_or(0));
            println!(
                "| PostgreSQL | {n} | {} | {} | {:.1}× | {} | {} |",
                ms(floor),
                ms(persist),
                persist.as_secs_f64() / floor.as_secs_f64().max(1e-6),
                ms(resume),
                ms(again)
            );
        }
    }
    if stores_only {
        return;
    }
    println!();
    println!("| one participant of N | N | the stop, persist included | next start's resume |");
    println!("|---|---|---|---|");
    for &n in &sizes {
        for (group, name) in [(false, "`WorkSet`"), (true, "`TaskGroup`")] {
            let (stop, resume) = one_participant(n, group);
            println!("| {name} | {n} | {} | {} |", ms(stop), ms(resume));
        }
    }
    println!();
    println!(
        "| jobs | stop past the 2 s drain | outcome | clean | handed back | resumed | lost | resident before the stop | next start to ready |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for &n in &sizes {
        service(n);
    }
}

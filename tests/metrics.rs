//! The `metrics` feature end to end (`cargo test --features actix-web,metrics --test tests metrics::`):
//! `examples/prometheus.rs`, built by this test with cargo and run as a real process, is scraped
//! over HTTP at `/metrics` (its Prometheus exporter) across a planned stop, the resume of what it
//! handed back in its next life, and an unexpected stop; the numbers are checked against what
//! happened. What a real process cannot be made to do on cue — a renewal that fails, a lease an
//! operator takes away, an item no store may hold — runs in this process on a paused clock, with
//! the same Prometheus recorder installed for the thread the service runs on.

#![cfg(unix)]

use crate::common;

use actix::prelude::*;
use common::actors::{Answering, TokioClock, advance, paused_system};
use common::faulty::{Fault, Faulty, left_by_another_process};
use common::{EVENT_TIMEOUT, http_get, wait_for};
use metrics_exporter_prometheus::PrometheusBuilder;
use planned_stop::record::RecordStore;
use planned_stop::{DrainReport, Layout, ServiceBuilder, StopRequest};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The example running as a child process, killed when dropped.
struct Example {
    child: Child,
    pid: u32,
    /// The port of its admin listener (`/metrics`).
    metrics: u16,
}

impl Example {
    /// Starts the example on free ports, under `base`, with jobs that take `job_secs`.
    fn start(base: &Path, job_secs: u64) -> Example {
        let mut child = Command::new(common::example_binary("prometheus"))
            .env("EXAMPLE_DIR", base)
            .env("EXAMPLE_ADDR", "127.0.0.1:0")
            .env("EXAMPLE_METRICS_ADDR", "127.0.0.1:0")
            .env("EXAMPLE_JOB_SECS", job_secs.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut metrics = None;
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "the example ended at its start"
            );
            if let Some(url) = line.trim().strip_prefix("metrics http://127.0.0.1:") {
                metrics = url.trim_end_matches("/metrics").parse().ok();
            }
            if line.starts_with("serving ") {
                break;
            }
        }
        // Logs go to stdout too: keep reading so the example never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        Example {
            pid: child.id(),
            metrics: metrics.expect("the example prints its metrics address"),
            child,
        }
    }

    /// One scrape, or `None` when the admin listener does not answer.
    fn scrape(&self) -> Option<Scrape> {
        let (status, body) = http_get(self.metrics, "/metrics")?;
        assert_eq!(status, 200, "{body}");
        Some(Scrape::parse(&body))
    }

    /// Scrapes until `done` holds for a scrape, which it returns.
    fn scrape_until(&self, what: &str, done: impl Fn(&Scrape) -> bool) -> Scrape {
        wait_for(format!("the metrics never showed {what}"), || {
            self.scrape().filter(|s| done(s))
        })
    }

    /// `planned-stop stop` of this process, as an operator runs it (without `--wait`: the
    /// metrics are read while the process still serves them).
    fn planned_stop(&self, base: &Path) {
        let out = common::process::run(&[
            "stop",
            "--pid",
            &self.pid.to_string(),
            "--dir",
            base.join("run").to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{out:?}");
    }

    /// The exit code, once the process has ended.
    fn exit_code(mut self) -> Option<i32> {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "the example did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The series of one scrape in Prometheus's text format, by name and labels as printed
/// (`planned_stop_stops_total{cause="marker",verdict="planned"}`), and its `# HELP` lines.
#[derive(Debug)]
struct Scrape(BTreeMap<String, f64>, Vec<String>);

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let series = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').expect("a series and its value");
                (series.to_owned(), value.parse().expect("a number"))
            })
            .collect();
        let help = text
            .lines()
            .filter_map(|l| l.strip_prefix("# HELP "))
            .map(str::to_owned)
            .collect();
        Scrape(series, help)
    }

    /// The value of `series`; 0 when it was never recorded.
    fn get(&self, series: &str) -> f64 {
        self.0.get(series).copied().unwrap_or(0.0)
    }

    fn state(&self) -> Option<&str> {
        ["starting", "running", "draining", "stopped"]
            .into_iter()
            .find(|s| self.get(&format!("planned_stop_state{{state=\"{s}\"}}")) == 1.0)
    }

    /// Every item counter, in the order of docs/operations.md's table.
    fn items(&self) -> [f64; 7] {
        [
            "handed_back",
            "persisted",
            "spilled",
            "lost",
            "leased",
            "renewed",
            "acknowledged",
        ]
        .map(|what| self.get(&format!("planned_stop_items_{what}_total")))
    }
}

#[test]
fn a_planned_stop_and_the_resume_are_in_the_numbers() {
    let base = tempfile::tempdir().unwrap();
    // The first life: two jobs that would take ten minutes.
    let first = Example::start(base.path(), 600);
    let running = first.scrape_until("running", |s| s.state() == Some("running"));
    assert_eq!(
        running.items(),
        [0.0; 7],
        "nothing to resume, nothing stopped: {running:?}"
    );
    assert_eq!(
        running.get("planned_stop_stops_total{cause=\"marker\",verdict=\"planned\"}"),
        0.0
    );
    // The service described its metrics at its start: the exporter explains each one it shows.
    assert!(
        running
            .1
            .iter()
            .any(|h| h.starts_with("planned_stop_state the runner's state")),
        "{:?}",
        running.1
    );

    first.planned_stop(base.path());
    let last = first.scrape_until("the stop's conclusion", |s| s.state() == Some("stopped"));
    let planned = "planned_stop_stops_total{cause=\"marker\",verdict=\"planned\"}";
    assert_eq!(last.get(planned), 1.0, "{last:?}");
    assert_eq!(
        last.get("planned_stop_marker_to_accept_seconds_count"),
        1.0,
        "the marker planned-stop wrote"
    );
    assert_eq!(last.get("planned_stop_drain_seconds_count"), 1.0);
    // The server drained in the ingress phase, the jobs in the work phase; no final phase.
    for (phase, ran) in [("ingress", 1.0), ("work", 1.0), ("final", 0.0)] {
        let series = format!("planned_stop_drain_phase_seconds_count{{phase=\"{phase}\"}}");
        assert_eq!(last.get(&series), ran, "{phase}: {last:?}");
    }
    let drain = last.get("planned_stop_drain_seconds_sum");
    let ingress = last.get("planned_stop_drain_phase_seconds_sum{phase=\"ingress\"}");
    assert!(
        ingress >= 2.0 && drain >= ingress,
        "the ingress held its 2 s grace, within the whole drain: {ingress} of {drain}"
    );
    // Both jobs were running: handed back, and persisted; none lost.
    assert_eq!(
        last.items(),
        [2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        "{last:?}"
    );
    let unanswered = last
        .0
        .keys()
        .filter(|k| k.contains("unanswered") || k.contains("timeouts"));
    assert_eq!(unanswered.count(), 0, "every participant answered in time");
    assert_eq!(first.exit_code(), Some(0), "a planned stop ends 0");

    // The next life resumes both jobs; each finishes at once and is acknowledged.
    let second = Example::start(base.path(), 0);
    let resumed = second.scrape_until("both items acknowledged", |s| {
        s.get("planned_stop_items_acknowledged_total") == 2.0
    });
    assert_eq!(resumed.state(), Some("running"));
    assert_eq!(resumed.get("planned_stop_items_leased_total"), 2.0);
    assert_eq!(resumed.get(planned), 0.0, "a new process counts from zero");

    second.planned_stop(base.path());
    let last = second.scrape_until("the stop's conclusion", |s| s.state() == Some("stopped"));
    assert_eq!(last.get(planned), 1.0);
    // The two new jobs of this life finished at once too: nothing handed back.
    assert_eq!(
        last.items(),
        [0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 2.0],
        "{last:?}"
    );
    assert_eq!(second.exit_code(), Some(0));
}

#[test]
fn an_unexpected_stop_is_counted_as_one() {
    let base = tempfile::tempdir().unwrap();
    let example = Example::start(base.path(), 600);
    example.scrape_until("running", |s| s.state() == Some("running"));
    // A bare SIGTERM: nobody asked this process to stop.
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(example.pid as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let last = example.scrape_until("the stop's conclusion", |s| s.state() == Some("stopped"));
    let series = "planned_stop_stops_total{cause=\"signal_terminate\",verdict=\"unexpected\"}";
    assert_eq!(last.get(series), 1.0, "{last:?}");
    assert_eq!(
        last.get("planned_stop_marker_to_accept_seconds_count"),
        0.0,
        "no marker asked"
    );
    assert_eq!(last.items()[..4], [2.0, 2.0, 0.0, 0.0], "{last:?}");
    assert_eq!(example.exit_code(), Some(1), "an unexpected stop ends 1");
}

/// Runs `body` on a paused actix system with a Prometheus recorder installed for this thread
/// (where the system's actors run); returns what a scrape would read afterwards.
fn recorded(body: impl AsyncFnOnce()) -> Scrape {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, || paused_system().block_on(body()));
    Scrape::parse(&handle.render())
}

/// An item over the size limit is lost (the stop ends `record_lost`), the small one persisted;
/// without a record store both are lost: only the ERROR log line has them.
#[test]
fn items_no_store_holds_are_counted_lost() {
    for with_store in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let scrape = recorded(async || {
            let big = "x".repeat(2 << 20);
            let mut builder = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
                .owns_process_exit(false)
                .handle_signals(false)
                .events(false)
                .clock(TokioClock::new())
                .participant("jobs", Answering::holding(&[&big, "small"]));
            if with_store {
                builder = builder.state_dir(dir.path().join("state"));
            }
            let h = builder.start().unwrap();
            h.ready();
            h.request_stop(StopRequest::Planned);
            h.stopped().await;
        });
        let fates = &scrape.items()[..4];
        if with_store {
            assert_eq!(fates, [2.0, 1.0, 0.0, 1.0], "{scrape:?}");
        } else {
            assert_eq!(fates, [2.0, 0.0, 0.0, 2.0], "{scrape:?}");
        }
        let planned = "planned_stop_stops_total{cause=\"request\",verdict=\"planned\"}";
        assert_eq!(scrape.get(planned), 1.0, "{scrape:?}");
        assert_eq!(scrape.state(), Some("stopped"));
    }
}

/// Items a store keeps on this host because its own place was unreachable are counted as
/// spilled, not persisted and not lost.
#[test]
fn items_kept_in_the_fallback_are_counted_spilled() {
    let dir = tempfile::tempdir().unwrap();
    let store = Faulty::new(dir.path(), Fault::PersistSpills);
    let scrape = recorded(async || {
        let h = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
            .owns_process_exit(false)
            .record_store(store.clone())
            .handle_signals(false)
            .events(false)
            .clock(TokioClock::new())
            .participant("jobs", Answering::holding(&["a", "b"]))
            .start()
            .unwrap();
        h.ready();
        h.request_stop(StopRequest::Planned);
        assert_eq!(common::actors::code_of(h.stopped().await), 0);
    });
    assert_eq!(scrape.items()[..4], [2.0, 0.0, 2.0, 0.0], "{scrape:?}");
}

/// An answer that says work was cut short is counted for its participant and phase; one that
/// does not is not.
#[test]
fn answers_that_cut_work_short_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let scrape = recorded(async || {
        let cut = DrainReport::done().with_cut_short("two uploads were cut");
        let h = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
            .owns_process_exit(false)
            .handle_signals(false)
            .events(false)
            .clock(TokioClock::new())
            .participant("uploads", Answering(Some(cut)).start().recipient())
            .participant("jobs", Answering::holding(&[]))
            .start()
            .unwrap();
        h.ready();
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    let cut = "planned_stop_participants_cut_total{participant=\"uploads\",phase=\"work\"}";
    assert_eq!(scrape.get(cut), 1.0, "{scrape:?}");
    let all = scrape
        .0
        .keys()
        .filter(|k| k.starts_with("planned_stop_participants_cut"));
    assert_eq!(all.count(), 1, "only the participant that cut: {scrape:?}");
}

/// A renewal that fails is counted, and so is each lease kept; an item an operator releases
/// while this process holds it is a lease lost at the next renewal.
#[test]
fn renewals_their_failures_and_lost_leases_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let store = Faulty::new(dir.path(), Fault::FirstRenewalFails);
    let items = ["item-1", "item-2"]
        .map(|id| serde_json::json!({"id": id, "participant": "jobs", "item": id}));
    left_by_another_process(&store.inner, items.to_vec());
    let scrape = recorded(async || {
        let h = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
            .owns_process_exit(false)
            .record_store(store.clone())
            .lease_for(Duration::from_secs(6))
            .handle_signals(false)
            .events(false)
            .clock(TokioClock::new())
            .start()
            .unwrap();
        assert_eq!(h.resume().await.unwrap().len(), 2);
        h.ready();
        // The first renewal fails, its retry renews both.
        while store.renewals.lock().unwrap().len() < 2 {
            advance(Duration::from_millis(50)).await;
        }
        // An operator releases one (`planned-stop records release`): the next renewal keeps
        // only the other.
        assert!(store.inner.release(None, "item-2").await.unwrap());
        while h.items_held() != ["item-1"] {
            advance(Duration::from_millis(50)).await;
        }
        assert_eq!(
            store.renewals.lock().unwrap().len(),
            3,
            "one renewal found it gone"
        );
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    assert_eq!(scrape.get("planned_stop_lease_renewal_failures_total"), 1.0);
    assert_eq!(scrape.get("planned_stop_items_leased_total"), 2.0);
    assert_eq!(
        scrape.get("planned_stop_items_renewed_total"),
        3.0,
        "both at the retry, then the one still held: {scrape:?}"
    );
    assert_eq!(scrape.get("planned_stop_leases_lost_total"), 1.0);
}

/// An item that used up its failed attempts is held aside at the resume, not
/// resumed, and counted under its participant.
#[test]
fn an_item_held_aside_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let store = planned_stop::record::FileRecordStore::open(
        dir.path().join("state"),
        planned_stop::record::Sharing::Refused,
    )
    .unwrap();
    let items = ["poison", "fine"].map(|id| {
        let mut item = serde_json::json!({"id": id, "participant": "jobs", "item": id});
        if id == "poison" {
            item["failure"] = serde_json::json!("its task panicked: poison pill");
        }
        item
    });
    left_by_another_process(&store, items.to_vec());
    let shared = std::sync::Arc::new(store.clone());
    let scrape = recorded(async || {
        let h = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
            .owns_process_exit(false)
            .record_store(shared)
            .max_failed_attempts(1)
            .handle_signals(false)
            .events(false)
            .clock(TokioClock::new())
            .start()
            .unwrap();
        let resumed = h.resume().await.unwrap();
        let ids: Vec<&str> = resumed.iter().map(|l| l.item.id.as_str()).collect();
        assert_eq!(ids, ["fine"]);
        h.ready();
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
    });
    assert_eq!(
        scrape.get("planned_stop_items_held_aside_total{participant=\"jobs\"}"),
        1.0,
        "{scrape:?}"
    );
}

/// The example answers `--help` with what moves it, and starts nothing; another
/// argument is refused.
#[test]
fn the_example_answers_help_without_serving() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    let example = common::example_binary("prometheus");
    // An example that ignores its arguments serves instead: ended after the event timeout.
    let run = |arg: &str| {
        let mut child = Command::new(&example)
            .arg(arg)
            .env("EXAMPLE_DIR", &base)
            .env("EXAMPLE_ADDR", "127.0.0.1:0")
            .env("EXAMPLE_METRICS_ADDR", "127.0.0.1:0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + EVENT_TIMEOUT;
        while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        child.wait_with_output().unwrap()
    };
    let out = run("--help");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("EXAMPLE_DIR") && help.contains("EXAMPLE_ADDR"),
        "{help}"
    );
    assert!(!base.exists(), "--help started nothing");
    let out = run("--serve");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!base.exists(), "an unknown argument started nothing");
}

/// With its stdout a closed pipe (a log shipper gone) the example serves and stops
/// as planned, where `println!` used to panic it (`aborted`, 1) right after it was ready.
#[test]
fn the_example_with_a_closed_stdout_serves_and_stops_as_planned() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    // A free port, chosen here: the example cannot tell its own with no stdout.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(common::example_binary("prometheus"))
        .env("EXAMPLE_DIR", base)
        .env("EXAMPLE_ADDR", format!("127.0.0.1:{port}"))
        .env("EXAMPLE_METRICS_ADDR", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let served = wait_for("the example serves, or ends", || {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(Err(status));
        }
        http_get(port, "/").map(Ok)
    });
    assert_eq!(served.map(|(code, _)| code), Ok(200), "it serves");
    let out = common::process::run(&[
        "stop",
        "--pid",
        &child.id().to_string(),
        "--dir",
        base.join("run").to_str().unwrap(),
        "--wait",
        "30",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

//! The PostgreSQL record store against a real server: the conformance suite of every backend,
//! concurrent claimers, a fleet of `serve` processes handing work over, and a database that goes
//! away during a stop.
//!
//! The server comes from `PLANNED_STOP_TEST_DATABASE_URL` (`.ci/run` starts a throwaway one with
//! `ci/postgres.sh`). Every test that needs it is `#[ignore]`d with that reason, so a run without
//! a server lists them as ignored rather than passing them unrun; `.ci/run` passes
//! `--include-ignored`, and there a missing server fails them. Each test scopes its items by a
//! service name of its own.

use crate::common;

use planned_stop::internals::Clock;
use planned_stop::record::{Owner, RecordStore, Sharing};
use planned_stop::testing::{Backend, Probe, check_conformance};
use planned_stop_postgres::PgRecordStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The test database's URL. The tests that need one are `#[ignore]`d, so a plain run lists them
/// as ignored with the reason; `--include-ignored` (as `.ci/run` passes) runs them, and then a
/// missing URL fails them loudly instead of letting them pass unrun.
fn database() -> String {
    match std::env::var("PLANNED_STOP_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "PLANNED_STOP_TEST_DATABASE_URL is not set: start a server with `bash ci/postgres.sh \
             start` and export the URL it prints"
        ),
    }
}

/// A service name no other test (or earlier run) uses.
fn unique_service(tag: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "test-{tag}-{}-{nanos:x}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

struct Postgres;

impl Backend for Postgres {
    fn open(clock: Arc<dyn Clock>, probe: Probe) -> (Arc<dyn RecordStore>, Box<dyn std::any::Any>) {
        let url = std::env::var("PLANNED_STOP_TEST_DATABASE_URL").unwrap();
        let store = PgRecordStore::from_url(&url, unique_service("conformance"))
            .unwrap()
            .clock(clock)
            .liveness(move |o| probe(o))
            .operation_timeout(Duration::from_secs(30));
        (Arc::new(store), Box::new(()))
    }
}

use common::cases;

/// The seeds of past failures, run first every time (proptest's file, committed).
const REGRESSIONS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/postgres.proptest-regressions");

/// The same suite as the file store's (`tests/records.rs`), unchanged.
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn the_postgres_store_conforms() {
    check_conformance::<Postgres>(cases(), Some(REGRESSIONS));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A stop record leaving `n` items (`item-000000` …), as the runner would persist it.
fn record_with_items(n: usize) -> planned_stop::record::StopRecord {
    let items = (0..n)
        .map(
            |i| serde_json::json!({"id": format!("item-{i:06}"), "participant": "jobs", "item": i}),
        )
        .collect();
    planned_stop::testing::stop_record(1, chrono::Utc::now(), items)
}

/// A stop that leaves 100,000 items: persisted in one transaction, leased by the next start in
/// one call, handed back by it, leased again and acknowledged in one call — every item exactly
/// once each time.
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn a_stop_of_100_000_items_is_resumed_each_exactly_once() {
    const N: usize = 100_000;
    let url = database();
    let service = unique_service("scale");
    let open = || {
        PgRecordStore::from_url(&url, service.clone())
            .unwrap()
            .operation_timeout(Duration::from_secs(120))
    };
    let rt = runtime();
    rt.block_on(open().persist(
        &Owner::new("stopper-host", 1, 1),
        record_with_items(N).into(),
    ))
    .unwrap();
    // The summary for people names a few and counts the rest; the items are all in the store.
    let summary = rt.block_on(open().last_stop()).unwrap().unwrap();
    assert_eq!(
        (summary.unfinished.len(), summary.unfinished_count()),
        (planned_stop::record::SUMMARY_ITEMS, N)
    );
    let exactly_once = |leased: &[planned_stop::record::Leased]| {
        let ids: std::collections::BTreeSet<&str> =
            leased.iter().map(|l| l.item.id.as_str()).collect();
        assert_eq!((leased.len(), ids.len()), (N, N));
    };
    let next = Owner::new("next-host", 2, 1);
    let store = open();
    let leased = rt
        .block_on(store.lease(&next, usize::MAX, Duration::from_secs(600)))
        .unwrap();
    exactly_once(&leased);
    // Handed back by its holder at its own stop: pending again, attempts counted up.
    let mut back = record_with_items(0);
    back.unfinished = leased
        .iter()
        .map(|l| {
            serde_json::from_value(serde_json::json!({"id": l.item.id, "participant":
                l.item.participant, "item": l.item.item, "resumed": true}))
            .unwrap()
        })
        .collect();
    rt.block_on(store.persist(&next, back.clone().into()))
        .unwrap();
    let third = Owner::new("third-host", 3, 1);
    let again = rt
        .block_on(open().lease(&third, usize::MAX, Duration::from_secs(600)))
        .unwrap();
    exactly_once(&again);
    assert!(again.iter().all(|l| l.item.attempts == 2));
    // All acknowledged in one call; an id not held and one unknown are each refused.
    let store = open();
    let mut ids: Vec<String> = again.iter().map(|l| l.item.id.clone()).collect();
    ids.push("no-such-item".into());
    let answers = rt.block_on(store.acknowledge_many(&third, &ids)).unwrap();
    assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), N);
    assert!(matches!(
        answers.last(),
        Some(Err(planned_stop::record::RecordError::UnknownItem { .. }))
    ));
    assert!(rt.block_on(store.list()).unwrap().is_empty());
}

/// New items are written by one `COPY`, and by `INSERT … ON CONFLICT DO NOTHING` when that meets
/// a unique violation: an id taken already, twice in one stop, or one another transaction
/// inserted meanwhile. Either way the first version stands and the stop persists.
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn new_items_whose_id_is_taken_are_left_and_the_stop_persists() {
    let url = database();
    let service = unique_service("taken");
    let rt = runtime();
    let store = store_for(&url, &service);
    let stopper = Owner::new("stopper-host", 1, 1);
    rt.block_on(store.persist(&stopper, record_with_items(3).into()))
        .unwrap();
    // Persisted again (a retried persist): every id is taken, nothing changes.
    rt.block_on(store.persist(&stopper, record_with_items(3).into()))
        .unwrap();
    // An id twice among the new items, beside one taken and one new.
    let mut twice = record_with_items(4);
    twice.unfinished[0].id = Some("item-000003".into());
    twice.unfinished[0].item = serde_json::json!("first");
    rt.block_on(store.persist(&stopper, twice.clone().into()))
        .unwrap();
    let listed = rt.block_on(store.list()).unwrap();
    let ids: Vec<&str> = listed.iter().map(|s| s.item.id.as_str()).collect();
    assert_eq!(
        ids,
        ["item-000000", "item-000001", "item-000002", "item-000003"]
    );
    assert!(listed.iter().all(|s| s.item.attempts == 1));
    assert_eq!(
        listed[3].item.item,
        serde_json::json!("first"),
        "the first version stands"
    );
}

/// 8 claimers, each with its own connection and identity, lease batches of 50 from 10,000 items
/// and acknowledge each: no item is ever handed to a claimer while another holds it, and every
/// item is acknowledged exactly once.
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn eight_concurrent_claimers_over_10_000_items_never_share_one_and_acknowledge_each_once() {
    let url = database();
    let service = unique_service("claimers");
    let stopper = Owner::new("stopper-host", 1, 1);
    let store = PgRecordStore::from_url(&url, service.clone())
        .unwrap()
        .operation_timeout(Duration::from_secs(60));
    runtime()
        .block_on(store.persist(&stopper, record_with_items(10_000).into()))
        .unwrap();
    let held: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>> = Default::default();
    let claimers: Vec<_> = (0..8)
        .map(|k| {
            let (url, service, held) = (url.clone(), service.clone(), held.clone());
            std::thread::spawn(move || {
                // Another host each: no claimer can look another up, so only leases protect.
                let me = Owner::new(format!("claimer-{k}"), 100 + k as u32, 7);
                let store = PgRecordStore::from_url(&url, service)
                    .unwrap()
                    .operation_timeout(Duration::from_secs(60));
                let rt = runtime();
                let mut acked = Vec::new();
                loop {
                    let batch = rt
                        .block_on(store.lease(&me, 50, Duration::from_secs(600)))
                        .unwrap();
                    if batch.is_empty() {
                        return acked;
                    }
                    for leased in &batch {
                        let before = held.lock().unwrap().insert(leased.item.id.clone(), k);
                        assert_eq!(
                            before, None,
                            "{} leased while claimer {before:?} held it",
                            leased.item.id
                        );
                    }
                    for leased in &batch {
                        assert_eq!(held.lock().unwrap().remove(&leased.item.id), Some(k));
                        rt.block_on(store.acknowledge(&me, &leased.item.id))
                            .unwrap();
                        acked.push(leased.item.id.clone());
                    }
                }
            })
        })
        .collect();
    let mut all: Vec<String> = claimers
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    all.sort();
    let expected: Vec<String> = (0..10_000).map(|i| format!("item-{i:06}")).collect();
    assert_eq!(all, expected, "every item acknowledged exactly once");
    assert!(runtime().block_on(store.list()).unwrap().is_empty());
}

#[cfg(unix)]
mod fleet {
    use super::common::process::*;
    use super::{database, unique_service};
    use serde_json::Value;
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// `serve` with `--records URL --service SERVICE`, a state (spill) directory of its own, and
    /// `extra` arguments.
    fn serve(
        base: &Path,
        url: &str,
        service: &str,
        name: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Serve {
        let state = base.join(name);
        let run_dir = base.join("run");
        let mut args = vec![
            "--dir",
            s(&run_dir),
            "--state",
            s(&state),
            "--records",
            url,
            "--service",
            service,
            "--poll-ms",
            "20",
        ];
        args.extend_from_slice(extra);
        Serve::start_with_env(&args, env)
    }

    fn stop_wait(base: &Path, pid: u32) -> Value {
        let out = stop_json(&base.join("run"), &pid.to_string(), &["--wait", "20"]);
        let report = json_of(&out);
        assert_eq!(out.status.code(), Some(0), "{report}");
        report
    }

    /// The service's items, as `records list --json` shows them.
    fn items(url: &str, service: &str) -> Vec<Value> {
        let args = [
            "records",
            "list",
            "--records",
            url,
            "--service",
            service,
            "--json",
        ];
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        json_of(&out)["items"].as_array().unwrap().clone()
    }

    fn listed(url: &str, service: &str) -> Vec<String> {
        items(url, service)
            .iter()
            .map(|i| i["item"]["id"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The earliest lease end among the service's items.
    fn lease_ends(url: &str, service: &str) -> chrono::DateTime<chrono::Utc> {
        items(url, service)
            .iter()
            .map(|i| i["lease"]["expires_at"].as_str().unwrap().parse().unwrap())
            .min()
            .unwrap()
    }

    fn ids(v: &Value) -> Vec<String> {
        v["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_owned())
            .collect()
    }

    /// `records list` for a service name the database never saw (a typo) said "no
    /// unfinished items", 0, as for an empty queue. Every start now registers its service: a
    /// service that started and left nothing is "no unfinished items", 0; a name that never
    /// started is exit 15 with the names the database knows (`service_known: false` with
    /// `--json`), and so is `records release`/`drop` of an id under that name.
    #[test]
    #[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
    fn records_list_tells_an_unknown_service_from_an_empty_one() {
        let url = database();
        let service = unique_service("known");
        let base = tempfile::tempdir().unwrap();
        // Started, and stopped with nothing left: known, and empty.
        let mut replica = serve(
            base.path(),
            &url,
            &service,
            "one",
            &["--jobs", "0", "--drain-ms", "50"],
            &[],
        );
        stop_wait(base.path(), replica.pid());
        assert_eq!(replica.exit_code(), Some(0));
        let typo = format!("{service}-typo");
        let list = |name: &str, json: bool| {
            let mut args = vec![
                "records",
                "list",
                "--records",
                url.as_str(),
                "--service",
                name,
            ];
            if json {
                args.push("--json");
            }
            run(&args)
        };
        let out = list(&service, false);
        assert_eq!(out.status.code(), Some(0));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.contains("no unfinished items"), "{text}");
        let report = json_of(&list(&service, true));
        assert_eq!(report.get("service_known"), None, "{report}");

        let out = list(&typo, true);
        assert_eq!(out.status.code(), Some(15), "{out:?}");
        let report = json_of(&out);
        assert_eq!(report["service_known"], false, "{report}");
        assert!(
            report["services"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s == service.as_str()),
            "{report}"
        );
        let out = list(&typo, false);
        assert_eq!(out.status.code(), Some(15));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.contains("mistyped --service"), "{text}");
        assert!(!text.contains("no unfinished items"), "{text}");
        let on_item = |verb: &str, service: &str| {
            let args = [
                "records",
                verb,
                "--records",
                url.as_str(),
                "--service",
                service,
            ];
            run(&[&args[..], &["item-000000"]].concat())
        };
        for verb in ["release", "drop"] {
            let out = on_item(verb, &typo);
            assert_eq!(out.status.code(), Some(15), "{verb}: {out:?}");
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert!(err.contains("mistyped --service"), "{verb}: {err}");
            // Under the known name, the same unknown id is only an unknown item.
            let out = on_item(verb, &service);
            assert_eq!(out.status.code(), Some(11), "{verb}: {out:?}");
        }
    }

    /// 3 replicas (each its own state directory, one database) stopped as planned with work left;
    /// 2 new replicas start at once: every item is resumed exactly once, by one of them. 20 rounds.
    #[test]
    #[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
    fn a_fleets_unfinished_work_is_resumed_exactly_once_by_the_next_replicas() {
        let url = database();
        for _ in 0..20 {
            fleet_round(&url);
        }
    }

    fn fleet_round(url: &str) {
        let url = url.to_owned();
        let service = unique_service("fleet");
        let base = tempfile::tempdir().unwrap();
        for k in 0..3 {
            let mut replica = serve(
                base.path(),
                &url,
                &service,
                &format!("old-{k}"),
                &["--jobs", "2", "--job-ms", "600000", "--drain-ms", "50"],
                &[],
            );
            let report = stop_wait(base.path(), replica.pid());
            assert_eq!(report["outcome"], "stopped_planned");
            assert_eq!(report["spilled"], false);
            assert_eq!(replica.exit_code(), Some(0));
        }
        let mut left = listed(&url, &service);
        left.sort();
        assert_eq!(left.len(), 6, "{left:?}");
        let next: Vec<Serve> = (0..2)
            .map(|k| {
                let (url, service, base) =
                    (url.clone(), service.clone(), base.path().to_path_buf());
                std::thread::spawn(move || {
                    serve(
                        &base,
                        &url,
                        &service,
                        &format!("new-{k}"),
                        &["--jobs", "0", "--job-ms", "10"],
                        &[],
                    )
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for replica in &next {
            let resumed = replica.seen("resumed").unwrap();
            for id in replica.wait_acked(ids(&resumed).len()) {
                *counts.entry(id).or_default() += 1;
            }
        }
        assert_eq!(
            counts.keys().cloned().collect::<Vec<_>>(),
            left,
            "every item resumed, 0 lost"
        );
        assert!(counts.values().all(|&n| n == 1), "none twice: {counts:?}");
        assert!(listed(&url, &service).is_empty());
    }

    /// A resumer on another host keeps its items past its first lease by renewing them while it
    /// runs; killed with SIGKILL, it stops renewing, and the other replica — which cannot look it
    /// up — takes them over once the lease expires, not before.
    #[test]
    #[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
    fn a_killed_resumers_items_go_to_another_replica_when_its_lease_expires() {
        let url = database();
        let service = unique_service("expiry");
        let base = tempfile::tempdir().unwrap();
        let mut first = serve(
            base.path(),
            &url,
            &service,
            "first",
            &["--jobs", "2", "--job-ms", "600000", "--drain-ms", "50"],
            &[],
        );
        stop_wait(base.path(), first.pid());
        assert_eq!(first.exit_code(), Some(0));
        let holder = serve(
            base.path(),
            &url,
            &service,
            "holder",
            &["--jobs", "0", "--job-ms", "600000", "--lease-ms", "5000"],
            &[("PLANNED_STOP_HOST", "host-b")],
        );
        let held = ids(&holder.seen("resumed").unwrap());
        assert_eq!(held.len(), 2);
        let other = serve(
            base.path(),
            &url,
            &service,
            "other",
            &["--jobs", "0", "--job-ms", "10", "--resume-every-ms", "100"],
            &[("PLANNED_STOP_HOST", "host-c")],
        );
        assert!(
            ids(&other.seen("resumed").unwrap()).is_empty(),
            "the holder's lease is valid"
        );
        // Past the first lease's end, the live holder still holds them: it renewed.
        let first_end = lease_ends(&url, &service);
        while chrono::Utc::now() < first_end + chrono::TimeDelta::milliseconds(500) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let renewed_end = lease_ends(&url, &service);
        assert!(renewed_end > first_end, "renewed while alive");
        other.drain_events();
        assert!(
            other.seen("acked").is_none()
                && other
                    .history
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|e| e["event"] == "resumed")
                    .count()
                    == 1,
            "a live holder keeps its items past its first lease"
        );
        drop(holder); // SIGKILL, mid-resume
        let mut taken = other.wait_acked(2);
        taken.sort();
        let mut held = held;
        held.sort();
        assert_eq!(taken, held, "taken over after the lease expired");
        assert!(listed(&url, &service).is_empty());
    }

    /// Leases are judged on the database's clock. A replica whose clock is 10 s
    /// behind holds two items (`--lease-ms 5000`); one whose clock is 10 s ahead leases every
    /// 100 ms: by its own clock the holder's lease lapsed long ago, yet it takes nothing while the
    /// holder lives and renews — past two lease lengths by the database's clock — and takes both
    /// once the holder is killed and its lease has expired. (Judged on each replica's clock, the
    /// one ahead took both items at its first lease.)
    #[test]
    #[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
    fn replicas_10_s_ahead_and_behind_never_hold_an_item_together() {
        let url = database();
        let service = unique_service("skew");
        let base = tempfile::tempdir().unwrap();
        let mut first = serve(
            base.path(),
            &url,
            &service,
            "first",
            &["--jobs", "2", "--job-ms", "600000", "--drain-ms", "50"],
            &[],
        );
        stop_wait(base.path(), first.pid());
        assert_eq!(first.exit_code(), Some(0));
        let lease = ["--jobs", "0", "--lease-ms", "5000"];
        let behind = [
            skewed_clock("-10s"),
            vec![("PLANNED_STOP_HOST", "host-behind")],
        ]
        .concat();
        let long = [&lease[..], &["--job-ms", "600000"]].concat();
        let holder = serve(base.path(), &url, &service, "behind", &long, &behind);
        let mut held = ids(&holder.seen("resumed").unwrap());
        assert_eq!(held.len(), 2);
        let ahead = [
            skewed_clock("+10s"),
            vec![("PLANNED_STOP_HOST", "host-ahead")],
        ]
        .concat();
        let every = [&lease[..], &["--job-ms", "10", "--resume-every-ms", "100"]].concat();
        let other = serve(base.path(), &url, &service, "ahead", &every, &ahead);
        let taken_by_other = |other: &Serve| -> usize {
            other.drain_events();
            let history = other.history.lock().unwrap();
            history
                .iter()
                .filter(|e| e["event"] == "resumed")
                .map(|e| ids(e).len())
                .sum()
        };
        assert_eq!(taken_by_other(&other), 0, "the holder's lease is valid");
        // Two lease lengths by the database's clock, seen in the leases' own ends: the holder
        // renews while the other keeps asking.
        let first_end = lease_ends(&url, &service);
        let mut end = first_end;
        while end < first_end + chrono::TimeDelta::seconds(5) {
            assert_eq!(taken_by_other(&other), 0, "taken from a live holder");
            std::thread::sleep(std::time::Duration::from_millis(100));
            end = lease_ends(&url, &service);
        }
        assert_eq!(taken_by_other(&other), 0, "taken from a live holder");
        drop(holder); // SIGKILL: it renews no more
        let mut taken = other.wait_acked(2);
        taken.sort();
        held.sort();
        assert_eq!(taken, held, "taken over once the lease expired");
    }

    /// A lease shorter than its renewal can keep is refused at start, with what to
    /// do; at the shortest accepted lease two live replicas on different hosts, both leasing
    /// again every 50 ms for three lease lengths, never take the same item.
    #[test]
    #[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
    fn at_the_shortest_accepted_lease_two_live_replicas_never_take_the_same_item() {
        let url = database();
        let service = unique_service("short-lease");
        let base = tempfile::tempdir().unwrap();
        let run_dir = base.path().join("run");
        let out = run(&[
            "serve",
            "--dir",
            s(&run_dir),
            "--records",
            &url,
            "--service",
            &service,
            "--lease-ms",
            "4999",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("shorter than") && stderr.contains("--lease-ms"),
            "{stderr}"
        );
        let first = serve(
            base.path(),
            &url,
            &service,
            "first",
            &["--jobs", "4", "--job-ms", "600000", "--drain-ms", "50"],
            &[],
        );
        stop_wait(base.path(), first.pid());
        let replica = |name: &str, host: &str| {
            serve(
                base.path(),
                &url,
                &service,
                name,
                &[
                    "--jobs",
                    "0",
                    "--job-ms",
                    "600000",
                    "--lease-ms",
                    "5000",
                    "--resume-every-ms",
                    "50",
                ],
                &[("PLANNED_STOP_HOST", host)],
            )
        };
        let (a, b) = (replica("a", "host-a"), replica("b", "host-b"));
        // A soak of three lease lengths, not a wait for an event.
        std::thread::sleep(std::time::Duration::from_secs(15));
        let taken = |r: &Serve| -> Vec<String> {
            r.drain_events();
            r.history
                .lock()
                .unwrap()
                .iter()
                .filter(|e| e["event"] == "resumed")
                .flat_map(ids)
                .collect()
        };
        let (by_a, by_b) = (taken(&a), taken(&b));
        let both: Vec<&String> = by_a.iter().filter(|id| by_b.contains(id)).collect();
        assert!(both.is_empty(), "taken by both live replicas: {both:?}");
        assert_eq!(by_a.len() + by_b.len(), 4, "a: {by_a:?}, b: {by_b:?}");
    }

    /// A private server for a test that stops it (`ci/postgres.sh`); the test fails where it
    /// cannot start (it is ignored unless asked for, like every test here that needs PostgreSQL).
    struct Private(PathBuf, String);

    impl Private {
        fn start() -> Private {
            let out = Command::new("bash")
                .arg(script())
                .arg("start")
                .output()
                .expect("bash runs ci/postgres.sh");
            assert!(
                out.status.success(),
                "cannot start a private PostgreSQL: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let text = String::from_utf8(out.stdout).unwrap();
            let mut lines = text.lines().rev();
            let url = lines.next().expect("the URL line").to_owned();
            let dir = PathBuf::from(lines.next().expect("the directory line"));
            Private(dir, url)
        }

        fn ctl(&self, verb: &str) {
            let st = Command::new("bash")
                .arg(script())
                .arg(verb)
                .arg(&self.0)
                .status()
                .unwrap();
            assert!(st.success(), "ci/postgres.sh {verb}");
        }
    }

    impl Drop for Private {
        fn drop(&mut self) {
            let _ = Command::new("bash")
                .arg(script())
                .arg("stop")
                .arg(&self.0)
                .status();
        }
    }

    fn script() -> PathBuf {
        crate::common::repository().join("ci/postgres.sh")
    }

    /// How many items the state directory `dir` keeps (a spill).
    fn items_kept(dir: &Path) -> usize {
        let store = planned_stop::record::FileRecordStore::open_existing(
            dir,
            planned_stop::record::Sharing::Refused,
        )
        .unwrap();
        use planned_stop::record::RecordStore;
        super::runtime().block_on(store.list()).unwrap().len()
    }

    /// With the database at `url` unreachable, the operator still sees the two
    /// items spilled under `base` and the marker directory, and is told the database could not
    /// be read.
    fn operator_sees_the_spill(base: &Path, url: &str, service: &str) {
        let state = base.join("state");
        let run_dir = base.join("run");
        let out = run(&[
            "records",
            "list",
            "--records",
            url,
            "--service",
            service,
            "--state",
            s(&state),
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(2), "the database is unreachable");
        let listing = json_of(&out);
        let items = listing["items"].as_array().unwrap();
        assert_eq!(items.len(), 2, "{listing}");
        assert!(items.iter().all(|i| i["spilled"] == true), "{listing}");
        assert!(
            !listing["errors"].as_array().unwrap().is_empty(),
            "{listing}"
        );
        let out = run(&[
            "status",
            "--dir",
            s(&run_dir),
            "--records",
            url,
            "--service",
            service,
            "--state",
            s(&state),
            "--json",
        ]);
        assert_eq!(out.status.code(), Some(2));
        let status = json_of(&out);
        assert_eq!(status["outcomes"].as_array().unwrap().len(), 1, "{status}");
        assert_eq!(status["items"].as_array().unwrap().len(), 2, "{status}");
        assert!(
            !status["store_errors"].as_array().unwrap().is_empty(),
            "{status}"
        );
    }

    /// The database goes away while a replica runs: its planned stop keeps the items on its host
    /// (exit 0, the outcome says `spilled`), and its next start pushes them once the database is
    /// back, then resumes them.
    #[test]
    #[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
    fn a_database_down_at_the_stop_spills_on_the_host_and_the_next_start_pushes() {
        database();
        let pg = Private::start();
        let service = unique_service("spill");
        let base = tempfile::tempdir().unwrap();
        let mut replica = serve(
            base.path(),
            &pg.1,
            &service,
            "state",
            &["--jobs", "2", "--job-ms", "600000", "--drain-ms", "50"],
            &[],
        );
        pg.ctl("halt");
        let report = stop_wait(base.path(), replica.pid());
        assert_eq!(report["outcome"], "stopped_planned", "{report}");
        assert_eq!(report["spilled"], true, "the outcome says so: {report}");
        assert_eq!(replica.exit_code(), Some(0));
        let spilled = base.path().join("state");
        assert_eq!(items_kept(&spilled), 2, "kept on this host");
        operator_sees_the_spill(base.path(), &pg.1, &service);
        pg.ctl("resume");
        let next = serve(
            base.path(),
            &pg.1,
            &service,
            "state",
            &["--jobs", "0", "--job-ms", "10"],
            &[],
        );
        let resumed = ids(&next.seen("resumed").unwrap());
        assert_eq!(resumed.len(), 2, "pushed, then resumed");
        next.wait_acked(2);
        assert_eq!(items_kept(&spilled), 0, "nothing left in the spill");
        assert!(listed(&pg.1, &service).is_empty());
    }
}

/// A raw client on the test database, for rows the crate would never write.
async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// A store for `service` whose owners on `host` are looked up as alive (every other one is on
/// another host: its lease's expiry decides).
fn store_for(url: &str, service: &str) -> PgRecordStore {
    PgRecordStore::from_url(url, service.to_owned())
        .unwrap()
        .liveness(|_| planned_stop::internals::Liveness::Unknown)
        .operation_timeout(Duration::from_secs(30))
}

/// A store for `service` holding two items (`item-000000`, `item-000001`), both leased for an
/// hour to `replica` pid 10.
fn two_items_leased(
    url: &str,
    service: &str,
) -> (
    tokio::runtime::Runtime,
    PgRecordStore,
    Owner,
    Vec<planned_stop::record::Leased>,
) {
    let rt = runtime();
    let store = store_for(url, service);
    rt.block_on(store.persist(&Owner::new("h", 1, 1), record_with_items(2).into()))
        .unwrap();
    let holder = Owner::new("replica", 10, 1);
    let leased = rt
        .block_on(store.lease(&holder, 10, Duration::from_secs(3600)))
        .unwrap();
    (rt, store, holder, leased)
}

/// A spill directory, and a store for `service` whose database cannot be reached, spilling there
/// (a stop on a host that lost the database).
fn unreachable_with_spill(
    service: &str,
) -> (
    tempfile::TempDir,
    planned_stop::record::FileRecordStore,
    PgRecordStore,
) {
    let dir = tempfile::tempdir().unwrap();
    let spill =
        planned_stop::record::FileRecordStore::open(dir.path().join("spill"), Sharing::Refused)
            .unwrap();
    let unreachable = PgRecordStore::from_url("postgres://nobody@127.0.0.1:1/none", service)
        .unwrap()
        .operation_timeout(Duration::from_millis(500))
        .spill_to(spill.clone());
    (dir, spill, unreachable)
}

/// Rows the crate cannot accept never panic, never fail a lease, are quarantined
/// once (listed with the reason, never offered, never multiplied); attempts at the top of
/// `integer` saturate instead of failing the stop.
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn hostile_rows_are_quarantined_and_attempts_saturate() {
    let url = database();
    let service = unique_service("hostile");
    let rt = runtime();
    let store = store_for(&url, &service);
    rt.block_on(store.persist(
        &Owner::new("h", 1, 1),
        record_with_items(1).into(), // item-000000
    ))
    .unwrap();
    let client = rt.block_on(raw(&url));
    rt.block_on(client.execute(
        "UPDATE planned_stop_items SET attempts = 2147483647 WHERE service = $1",
        &[&service],
    ))
    .unwrap();
    // A row whose id is not an item id, and one whose lease lacks its owner's parts and expiry.
    rt.block_on(client.batch_execute(&format!(
        "INSERT INTO planned_stop_items (service, id, participant, item, stopped_by_host, \
         stopped_by_pid, stopped_by_start, stopped_at, attempts) VALUES \
         ('{service}', 'bad.id', 'jobs', '\"x\"', 'h', 1, 1, now(), 1);
         INSERT INTO planned_stop_items (service, id, participant, item, stopped_by_host, \
         stopped_by_pid, stopped_by_start, stopped_at, attempts, lease_owner) VALUES \
         ('{service}', 'half-leased', 'jobs', '\"y\"', 'h', 1, 1, now(), 1, 'h|1|1');"
    )))
    .unwrap();
    for life in 0..3u64 {
        let me = Owner::new("replica", 10, life);
        let leased = rt
            .block_on(store.lease(&me, 10, Duration::from_secs(60)))
            .unwrap();
        let ids: Vec<&str> = leased.iter().map(|l| l.item.id.as_str()).collect();
        assert_eq!(
            ids,
            ["item-000000"],
            "life {life}: only the good row is offered"
        );
        // The next life finds this one's lease expired only through release: hand it back.
        let mut back = record_with_items(0);
        back.unfinished.extend(leased.iter().map(|l| {
            serde_json::from_value(serde_json::json!({
                "id": l.item.id, "participant": "jobs", "item": l.item.item, "resumed": true,
            }))
            .unwrap()
        }));
        rt.block_on(store.persist(&me, back.clone().into()))
            .unwrap();
    }
    let listed = rt.block_on(store.list()).unwrap();
    assert_eq!(listed.len(), 3, "nothing multiplied: {listed:?}");
    let good = listed.iter().find(|s| s.item.id == "item-000000").unwrap();
    assert_eq!(good.item.attempts, i32::MAX as u32, "saturated");
    assert_eq!(good.quarantined, None);
    for id in ["bad.id", "half-leased"] {
        let row = listed.iter().find(|s| s.item.id == id).unwrap();
        assert!(row.quarantined.is_some(), "{id} is quarantined: {row:?}");
        assert!(row.lease.is_none());
    }
}

/// A spilled item the spilling process had leased from the database replaces the
/// database's stale row (newer content, attempts counted up, pending), instead of the stale row
/// winning; one it does not hold there any more is left to its holder.
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn a_spilled_hand_back_replaces_the_stale_row_it_held() {
    let url = database();
    let service = unique_service("spill-push");
    let (rt, store, holder, leased) = two_items_leased(&url, &service);
    assert_eq!(leased.len(), 2);
    // item-000001 is released by an operator and taken by another replica meanwhile.
    assert!(rt.block_on(store.release(None, "item-000001")).unwrap());
    let other = Owner::new("replica", 11, 1);
    assert_eq!(
        rt.block_on(store.lease(&other, 10, Duration::from_secs(3600)))
            .unwrap()
            .len(),
        1
    );
    // The holder's stop finds the database unreachable and spills both, with newer content.
    let (_dir, spill, unreachable) = unreachable_with_spill(&service);
    let mut back = record_with_items(0);
    back.unfinished.extend(leased.iter().map(|l| {
        serde_json::from_value(serde_json::json!({
            "id": l.item.id, "participant": "jobs", "item": "newer", "resumed": true,
        }))
        .unwrap()
    }));
    let how = rt
        .block_on(unreachable.persist(&holder, back.clone().into()))
        .unwrap();
    assert!(
        matches!(how, planned_stop::record::Persisted::Spilled { .. }),
        "{how:?}"
    );
    // The next start on that host pushes.
    let next = store_for(&url, &service).spill_to(spill.clone());
    let taker = Owner::new("replica", 12, 1);
    let leased = rt
        .block_on(next.lease(&taker, 10, Duration::from_secs(3600)))
        .unwrap();
    let got: Vec<(&str, &serde_json::Value, u32)> = leased
        .iter()
        .map(|l| (l.item.id.as_str(), &l.item.item, l.item.attempts))
        .collect();
    assert_eq!(
        got,
        [("item-000000", &serde_json::json!("newer"), 2)],
        "the stale row is replaced and offered; the other replica's item is not"
    );
    let listed = rt.block_on(next.list()).unwrap();
    let theirs = listed.iter().find(|s| s.item.id == "item-000001").unwrap();
    assert_eq!(theirs.lease.as_ref().unwrap().owner, other);
    assert_eq!(theirs.item.item, serde_json::json!(1), "left to its holder");
    assert!(rt.block_on(spill.list()).unwrap().is_empty(), "pushed");
}

/// For the database: an operator's drop wins over the holder's hand-back, also when
/// the hand-back was spilled on the holder's host and pushed later.
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn a_dropped_item_is_not_brought_back_by_its_holder_directly_or_through_the_spill() {
    let url = database();
    let service = unique_service("drop-wins");
    let (rt, store, holder, leased) = two_items_leased(&url, &service);
    assert!(rt.block_on(store.remove("item-000000")).unwrap());
    assert!(rt.block_on(store.remove("item-000001")).unwrap());
    let back_of = |ids: &[&str]| {
        let mut back = record_with_items(0);
        back.unfinished.extend(ids.iter().map(|id| {
            serde_json::from_value(serde_json::json!({
                "id": id, "participant": "jobs", "item": "x", "resumed": true,
            }))
            .unwrap()
        }));
        back
    };
    assert_eq!(leased.len(), 2);
    rt.block_on(store.persist(&holder, back_of(&["item-000000"]).into()))
        .unwrap();
    // The other one through a spill.
    let (_dir, spill, unreachable) = unreachable_with_spill(&service);
    rt.block_on(unreachable.persist(&holder, back_of(&["item-000001"]).into()))
        .unwrap();
    let next = store_for(&url, &service).spill_to(spill);
    let leased = rt
        .block_on(next.lease(&Owner::new("replica", 12, 1), 10, Duration::from_secs(60)))
        .unwrap();
    assert!(leased.is_empty(), "{leased:?}");
    assert!(rt.block_on(next.list()).unwrap().is_empty());
}

/// A lease whose commit outlasts the operation timeout is abandoned by the caller
/// but committed by the server; what it took must not stay leased to the live caller, who never
/// got it. (A deferred trigger makes the commit take 3 s; the timeout is 1 s.)
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn what_a_timed_out_lease_took_is_released_again() {
    let url = database();
    let service = unique_service("slow-commit");
    let rt = runtime();
    let store = store_for(&url, &service);
    rt.block_on(store.persist(&Owner::new("h", 1, 1), record_with_items(2).into()))
        .unwrap();
    let client = rt.block_on(raw(&url));
    let trigger = format!("slow_{}", std::process::id());
    rt.block_on(client.batch_execute(&format!(
        "CREATE OR REPLACE FUNCTION {trigger}() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN IF NEW.service = '{service}' AND NEW.lease_owner IS NOT NULL THEN
           PERFORM pg_sleep(3); END IF; RETURN NULL; END $$;
         CREATE CONSTRAINT TRIGGER {trigger} AFTER UPDATE ON planned_stop_items
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {trigger}();"
    )))
    .unwrap();
    // Its own application name, so the test can see its server processes.
    let app = format!("{trigger}_app");
    let impatient = store_for(&format!("{url}?application_name={app}"), &service)
        .operation_timeout(Duration::from_secs(1));
    let me = Owner::new("replica", 10, 1);
    let result = rt.block_on(async {
        let result = impatient.lease(&me, 10, Duration::from_secs(3600)).await;
        // Once the abandoned call's commit is over (committed, or ended), nothing may stay
        // leased to the live caller (bounded by the test).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let committing = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 \
                     AND wait_event = 'PgSleep'",
                    &[&app],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                > 0;
            let held = store.list().await.unwrap();
            if !committing && held.iter().all(|s| s.lease.is_none()) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "still leased to the live caller: {held:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        result
    });
    rt.block_on(client.batch_execute(&format!(
        "DROP TRIGGER {trigger} ON planned_stop_items; DROP FUNCTION {trigger}();"
    )))
    .unwrap();
    assert!(result.is_err(), "the lease timed out: {result:?}");
    let leased = rt
        .block_on(store.lease(&Owner::new("replica", 11, 1), 10, Duration::from_secs(60)))
        .unwrap();
    assert_eq!(leased.len(), 2, "offered to the next caller");
}

/// Schema 3 adds the service registry: a database of schema 2 is upgraded by the first
/// connection, and every service with a row in it (an item, an acknowledgement, a stop) is
/// known from then on, though it has not started since.
#[test]
#[ignore = "needs PostgreSQL: PLANNED_STOP_TEST_DATABASE_URL and --include-ignored (.ci/run)"]
fn the_upgrade_to_schema_3_knows_the_services_of_schema_2() {
    let url = database();
    let rt = runtime();
    let name = format!("upgrade_{}", unique_service("db").replace('-', "_"));
    let admin = rt.block_on(raw(&url));
    rt.block_on(admin.batch_execute(&format!("CREATE DATABASE {name}")))
        .unwrap();
    let mut config: tokio_postgres::Config = url.parse().unwrap();
    config.dbname(&name);
    let (old, connection) = rt.block_on(config.connect(tokio_postgres::NoTls)).unwrap();
    rt.spawn(connection);
    // Schema 2 as that build created it, with one stop recorded by `before`.
    rt.block_on(old.batch_execute(
        "CREATE TABLE planned_stop_schema (version integer NOT NULL);
         INSERT INTO planned_stop_schema VALUES (2);
         CREATE TABLE planned_stop_items (service text NOT NULL, id text NOT NULL,
            participant text NOT NULL, item jsonb NOT NULL, stopped_by_host text NOT NULL,
            stopped_by_pid bigint NOT NULL, stopped_by_start bigint NOT NULL,
            stopped_at timestamptz NOT NULL, attempts integer NOT NULL, lease_owner text,
            lease_host text, lease_pid bigint, lease_start bigint, leased_at timestamptz,
            lease_expires timestamptz, quarantined text, PRIMARY KEY (service, id));
         CREATE TABLE planned_stop_acks (service text NOT NULL, id text NOT NULL,
            acked_by text NOT NULL, acked_at timestamptz NOT NULL, PRIMARY KEY (service, id));
         CREATE TABLE planned_stop_stops (service text PRIMARY KEY, record jsonb NOT NULL,
            written_at timestamptz NOT NULL);
         INSERT INTO planned_stop_stops VALUES ('before', '{}', now());",
    ))
    .unwrap();
    drop(old);
    let store = PgRecordStore::new(config.clone(), "after".to_owned());
    let known = rt.block_on(store.services()).unwrap();
    assert_eq!(known, vec!["before".to_owned()]);
    drop(store);
    let (upgraded, connection) = rt.block_on(config.connect(tokio_postgres::NoTls)).unwrap();
    rt.spawn(connection);
    let version: i32 = rt
        .block_on(upgraded.query_one("SELECT version FROM planned_stop_schema", &[]))
        .unwrap()
        .get(0);
    assert_eq!(version, planned_stop_postgres::SCHEMA_VERSION);
    drop(upgraded);
    rt.block_on(admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")))
        .unwrap();
}

/// A backend failure keeps the driver's error as its source (not only its text), so
/// a caller can look into it; the message says what was being done, the source what failed.
#[test]
fn a_backend_failure_keeps_the_drivers_error_as_its_source() {
    // A loopback port nothing listens on: the connection is refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = PgRecordStore::from_url(&format!("postgres://nobody@127.0.0.1:{port}/x"), "s")
        .unwrap()
        .operation_timeout(Duration::from_secs(30));
    let err = runtime().block_on(store.connect()).unwrap_err();
    let planned_stop::record::RecordError::Backend { message, .. } = &err else {
        panic!("not a backend error: {err:?}");
    };
    assert_eq!(message, "cannot connect to PostgreSQL");
    let source = std::error::Error::source(&err).expect("the driver's error is kept");
    assert!(
        source.downcast_ref::<tokio_postgres::Error>().is_some(),
        "{source:?}"
    );
}

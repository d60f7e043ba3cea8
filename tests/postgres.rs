//! The PostgreSQL record store against a real server: the conformance suite of every backend,
//! concurrent claimers, a fleet of `serve` processes handing work over, and a database that goes
//! away during a stop.
//!
//! The server comes from `PLANNED_STOP_TEST_DATABASE_URL` (`.ci/run` starts a throwaway one with
//! `ci/postgres.sh`); without it every test prints SKIPPED and passes, so a plain `cargo test`
//! needs nothing installed. Each test scopes its items by a service name of its own.

mod common;

use common::record_conformance::{Backend, Conformance, Probe};
use planned_stop::{Clock, Owner, PgRecordStore, RecordStore};
use proptest::prelude::ProptestConfig;
use proptest_state_machine::prop_state_machine;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The test database's URL, or `None` (and a SKIPPED line) when there is none.
fn database() -> Option<String> {
    match std::env::var("PLANNED_STOP_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("SKIPPED: PLANNED_STOP_TEST_DATABASE_URL is not set (see ci/postgres.sh)");
            None
        }
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
            .with_clock(clock)
            .with_liveness(move |o| probe(o))
            .operation_timeout(Duration::from_secs(30));
        (Arc::new(store), Box::new(()))
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: if database().is_some() { cases() } else { 0 },
        max_shrink_iters: 4096,
        .. ProptestConfig::default()
    })]

    /// The same suite as the file store's (`tests/records.rs`), unchanged.
    #[test]
    fn the_postgres_store_conforms(sequential 1..=30 => Conformance<Postgres>);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A stop record leaving `n` items (`item-000000` …), as the runner would persist it.
fn record_with_items(n: usize) -> planned_stop::StopRecord {
    let items = (0..n)
        .map(
            |i| serde_json::json!({"id": format!("item-{i:06}"), "participant": "jobs", "item": i}),
        )
        .collect();
    common::record_conformance::stop_record(1, chrono::Utc::now(), items)
}

/// 8 claimers, each with its own connection and identity, lease batches of 50 from 10,000 items
/// and acknowledge each: no item is ever handed to a claimer while another holds it, and every
/// item is acknowledged exactly once.
#[test]
fn eight_concurrent_claimers_over_10_000_items_never_share_one_and_acknowledge_each_once() {
    let Some(url) = database() else { return };
    let service = unique_service("claimers");
    let stopper = Owner::new("stopper-host", 1, 1);
    let store = PgRecordStore::from_url(&url, service.clone())
        .unwrap()
        .operation_timeout(Duration::from_secs(60));
    runtime()
        .block_on(store.persist(&stopper, &record_with_items(10_000)))
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

    fn s(p: &Path) -> &str {
        p.to_str().unwrap()
    }

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

    /// 3 replicas (each its own state directory, one database) stopped as planned with work left;
    /// 2 new replicas start at once: every item is resumed exactly once, by one of them. 20 rounds.
    #[test]
    fn a_fleets_unfinished_work_is_resumed_exactly_once_by_the_next_replicas() {
        let Some(url) = database() else { return };
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
    fn a_killed_resumers_items_go_to_another_replica_when_its_lease_expires() {
        let Some(url) = database() else { return };
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
            &["--jobs", "0", "--job-ms", "600000", "--lease-ms", "1500"],
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

    /// A private server for a test that stops it (`ci/postgres.sh`); `None` where it cannot run.
    struct Private(PathBuf, String);

    impl Private {
        fn start() -> Option<Private> {
            let out = Command::new("bash")
                .arg(script())
                .arg("start")
                .output()
                .ok()?;
            if !out.status.success() {
                eprintln!(
                    "SKIPPED: cannot start a private PostgreSQL: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                return None;
            }
            let text = String::from_utf8(out.stdout).unwrap();
            let mut lines = text.lines().rev();
            let url = lines.next()?.to_owned();
            let dir = PathBuf::from(lines.next()?);
            Some(Private(dir, url))
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
        Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/postgres.sh")
    }

    /// The database goes away while a replica runs: its planned stop keeps the items on its host
    /// (exit 0, the outcome says `spilled`), and its next start pushes them once the database is
    /// back, then resumes them.
    #[test]
    fn a_database_down_at_the_stop_spills_on_the_host_and_the_next_start_pushes() {
        if database().is_none() {
            return;
        }
        let Some(pg) = Private::start() else { return };
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
        let spilled = base.path().join("state/planned-stop-items");
        let count = |dir: &Path| {
            std::fs::read_dir(dir)
                .unwrap()
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".item.json")
                })
                .count()
        };
        assert_eq!(count(&spilled), 2, "kept on this host");
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
        assert_eq!(count(&spilled), 0, "nothing left in the spill");
        assert!(listed(&pg.1, &service).is_empty());
    }
}

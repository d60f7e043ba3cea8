//! Record-store throughput and resume latency, the file store and PostgreSQL side by side.
//!
//! ```text
//! PLANNED_STOP_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:PORT/postgres \
//!     cargo run --release -p planned-stop-harness --bin records_bench
//! ```
//!
//! Measures, for each store: lease + acknowledge throughput (items/s) with 1 and 8 claimers
//! (threads, each with its own store handle and identity, leasing batches of 50 and acknowledging
//! each item), and the start-up latency a resume of 100 items adds (lease them all, acknowledge
//! each), median and p95 of 20 runs. Without the variable only the file store is measured.
//! Results go to `docs/performance.md` by hand.

use planned_stop::record::{FileRecordStore, Owner, RecordStore, Sharing};
use planned_stop_harness::{record, runtime};
use planned_stop_postgres::PgRecordStore;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Opens a handle on the store under test (one per claimer).
type Open = Arc<dyn Fn() -> Arc<dyn RecordStore> + Send + Sync>;

fn throughput(name: &str, open: &Open, claimers: usize, items: usize) {
    let stopper = Owner::new("bench-stopper", 1, 1);
    runtime()
        .block_on(open().persist(&stopper, record(items, &format!("t{claimers}")).into()))
        .unwrap();
    let started = Instant::now();
    let threads: Vec<_> = (0..claimers)
        .map(|k| {
            let open = open.clone();
            std::thread::spawn(move || {
                let store = open();
                let me = Owner::new(format!("bench-{k}"), 10 + k as u32, 1);
                let rt = runtime();
                let mut n = 0;
                loop {
                    let batch = rt
                        .block_on(store.lease(&me, 50, Duration::from_secs(600)))
                        .unwrap();
                    if batch.is_empty() {
                        return n;
                    }
                    for l in &batch {
                        rt.block_on(store.acknowledge(&me, &l.item.id)).unwrap();
                        n += 1;
                    }
                }
            })
        })
        .collect();
    let done: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(done, items);
    println!(
        "{name:<12} {claimers} claimer(s)  {items} items  {:>8.0} items/s  ({secs:.2} s)",
        items as f64 / secs
    );
}

fn resume_latency(name: &str, open: &Open) {
    let store = open();
    let rt = runtime();
    let me = Owner::new("bench-resumer", 2, 1);
    let stopper = Owner::new("bench-stopper", 1, 1);
    let (mut leases, mut acks) = (Vec::new(), Vec::new());
    for run in 0..20 {
        rt.block_on(store.persist(&stopper, record(100, &format!("r{run}")).into()))
            .unwrap();
        let started = Instant::now();
        let leased = rt
            .block_on(store.lease(&me, usize::MAX, Duration::from_secs(600)))
            .unwrap();
        leases.push(started.elapsed());
        let started = Instant::now();
        for l in &leased {
            rt.block_on(store.acknowledge(&me, &l.item.id)).unwrap();
        }
        acks.push(started.elapsed());
        assert_eq!(leased.len(), 100);
    }
    leases.sort();
    acks.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{name:<12} resume of 100 items: lease all (added to start-up) median {:.1} ms, p95 {:.1} ms; \
         100 acknowledgements median {:.1} ms, p95 {:.1} ms",
        ms(leases[10]),
        ms(leases[18]),
        ms(acks[10]),
        ms(acks[18])
    );
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut stores: Vec<(&str, Open)> = Vec::new();
    let state = dir.path().join("state");
    stores.push((
        "file store",
        Arc::new(move || {
            Arc::new(FileRecordStore::open(&state, Sharing::Refused).unwrap())
                as Arc<dyn RecordStore>
        }),
    ));
    match std::env::var("PLANNED_STOP_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => {
            let service = format!("bench-{}", std::process::id());
            stores.push((
                "postgres",
                Arc::new(move || {
                    Arc::new(
                        PgRecordStore::from_url(&url, service.clone())
                            .unwrap()
                            .operation_timeout(Duration::from_secs(60)),
                    ) as Arc<dyn RecordStore>
                }),
            ));
        }
        _ => println!("(PLANNED_STOP_TEST_DATABASE_URL not set: the file store only)"),
    }
    for (name, open) in &stores {
        throughput(name, open, 1, 2_000);
        throughput(name, open, 8, 2_000);
        resume_latency(name, open);
    }
}

//! The watcher's hot path: one probe of the slot (absent, ours, foreign, malformed), the parse of a
//! typical marker, the identity read, and one watcher tick including the actor message.
//!
//! `cargo bench --bench probe`; figures in docs/performance.md. `just metrics-cost` compares the
//! watcher tick without and with the `metrics` feature.

use actix::prelude::*;
use chrono::Utc;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use planned_stop::Layout;
use planned_stop::internals::{MarkerProbe, OwnSlot, PlannedStop, WatchStep, next_step};
use planned_stop::marker::{Judgement, Marker, MarkerStore};
use planned_stop::{ProcessIdentity, ProcessState};
use std::hint::black_box;

fn store() -> (tempfile::TempDir, MarkerStore, ProcessIdentity) {
    let dir = tempfile::tempdir().unwrap();
    let store = MarkerStore::open(Layout::Slots(dir.path().to_path_buf())).unwrap();
    (dir, store, ProcessIdentity::current().unwrap())
}

fn typical(me: &ProcessIdentity) -> Marker {
    Marker::new(me.pid, Some(me.start), Utc::now())
        .with_stopper_pid(4242)
        .with_request_id("4242-1796000000000000000")
        .with_reason("rolling deploy 1.4.2")
}

fn probe(c: &mut Criterion) {
    let (_dir, store, me) = store();
    let now = Utc::now();
    let mut g = c.benchmark_group("probe");
    g.bench_function("absent", |b| {
        b.iter(|| black_box(store.probe(&me, now).unwrap()))
    });

    store.write(&typical(&me)).unwrap();
    let now = Utc::now();
    assert!(matches!(
        store.probe(&me, now).unwrap(),
        Judgement::ForSelf(_)
    ));
    g.bench_function("for_self", |b| {
        b.iter(|| black_box(store.probe(&me, now).unwrap()))
    });
    assert!(
        matches!(store.probe(&me, now).unwrap(), Judgement::ForSelf(_)),
        "still there"
    );

    let foreign = Marker::new(me.pid + 1, Some(me.start), now);
    std::fs::write(store.slot_path(me.pid), foreign.to_json().unwrap()).unwrap();
    assert!(matches!(
        store.probe(&me, now).unwrap(),
        Judgement::Foreign(_)
    ));
    g.bench_function("foreign", |b| {
        b.iter(|| black_box(store.probe(&me, now).unwrap()))
    });

    // A malformed slot is removed by the probe, so each iteration plants a new one (not timed).
    let slot = store.slot_path(me.pid);
    g.bench_function("malformed_and_removed", |b| {
        b.iter_batched(
            || std::fs::write(&slot, b"{not valid json").unwrap(),
            |()| black_box(store.probe(&me, now).unwrap()),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn parse_and_identity(c: &mut Criterion) {
    let me = ProcessIdentity::current().unwrap();
    let bytes = typical(&me).to_json().unwrap();
    c.bench_function("parse_typical_marker", |b| {
        b.iter(|| black_box(Marker::parse(black_box(&bytes)).unwrap()))
    });
    c.bench_function("identity_of_own_pid", |b| {
        b.iter(|| black_box(ProcessIdentity::of(black_box(me.pid))))
    });
}

/// Receives the watcher's message.
struct Sink;
impl Actor for Sink {
    type Context = Context<Self>;
}
impl Handler<PlannedStop> for Sink {
    type Result = ();
    fn handle(&mut self, stop: PlannedStop, _: &mut Context<Self>) {
        black_box(stop);
    }
}

/// With the `metrics` feature, a Prometheus recorder is installed first, as an application
/// installs it, so whatever the tick recorded would cost what it costs in production; `just
/// metrics-cost` runs this bench without and with the feature and criterion compares the two.
fn watcher_tick(c: &mut Criterion) {
    #[cfg(feature = "metrics")]
    metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap();
    let (_dir, store, me) = store();
    store.write(&typical(&me)).unwrap();
    let probe = OwnSlot { store, own: me };
    let system = System::new();
    let sink = system.block_on(async { Sink.start().recipient::<PlannedStop>() });
    c.bench_function("watcher_tick_with_message", |b| {
        b.iter(|| {
            system.block_on(async {
                let verdict = probe.probe(Utc::now()).unwrap();
                if let WatchStep::Deliver(stop) = next_step(&verdict, ProcessState::Running) {
                    sink.send(stop).await.unwrap();
                }
            })
        })
    });
}

/// The I/O floor of a probe on this machine: the syscalls it cannot avoid.
fn io_floor(c: &mut Criterion) {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("small.json");
    std::fs::write(&file, [b' '; 250]).unwrap();
    let missing = dir.path().join("missing.json");
    let mut g = c.benchmark_group("io_floor");
    g.bench_function("failed_open", |b| {
        b.iter(|| black_box(std::fs::File::open(&missing).is_err()))
    });
    g.bench_function("lstat", |b| {
        b.iter(|| black_box(std::fs::symlink_metadata(&file).unwrap()))
    });
    g.bench_function("open_read_close_250_bytes", |b| {
        b.iter(|| {
            let mut buf = [0u8; 512];
            let n = std::fs::File::open(&file).unwrap().read(&mut buf).unwrap();
            black_box(n)
        })
    });
    g.finish();
}

criterion_group!(benches, probe, parse_and_identity, watcher_tick, io_floor);
criterion_main!(benches);

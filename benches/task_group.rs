//! What a `TaskGroup` costs per spawned job, beside a bare `tokio::spawn` of the same future
//! (docs/performance.md, "Work that is not an actor").
//!
//! Each iteration spawns a batch of jobs whose future returns at once and waits until every one
//! has ended: through `tokio::spawn` (join handles awaited), and through `TaskGroup::spawn` (the
//! payload recorded as JSON, the task tracked and run on the service's `System`, the job
//! released when its task says done). Both run on the same actix `System`.
//!
//! `cargo bench --bench task_group` (about 20 s).

use criterion::{Criterion, criterion_group, criterion_main};
use planned_stop::{JobEnd, Layout, ServiceBuilder, TaskGroup};
use std::hint::black_box;
use std::time::{Duration, Instant};

const BATCH: u64 = 1_000;

fn bare(iters: u64) -> Duration {
    actix::System::new().block_on(async move {
        let started = Instant::now();
        for _ in 0..iters {
            let handles: Vec<_> = (0..BATCH)
                .map(|i| tokio::spawn(async move { black_box(i) }))
                .collect();
            for handle in handles {
                black_box(handle.await.unwrap());
            }
        }
        started.elapsed()
    })
}

fn grouped(iters: u64) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    actix::System::new().block_on(async move {
        let service = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
            .owns_process_exit(false)
            .handle_signals(false)
            .events(false)
            .start()
            .unwrap();
        let group: TaskGroup<u64> = TaskGroup::new(&service, "jobs", |job, _| async move {
            black_box(job);
            JobEnd::Done
        });
        let started = Instant::now();
        for _ in 0..iters {
            for i in 0..BATCH {
                group.spawn(i).unwrap();
            }
            while !group.is_empty() {
                tokio::task::yield_now().await;
            }
        }
        started.elapsed()
    })
}

fn spawn_cost(c: &mut Criterion) {
    let mut g = c.benchmark_group("spawn and finish 1000 jobs");
    g.bench_function("tokio::spawn", |b| b.iter_custom(bare));
    g.bench_function("TaskGroup::spawn", |b| b.iter_custom(grouped));
    g.finish();
}

criterion_group!(benches, spawn_cost);
criterion_main!(benches);

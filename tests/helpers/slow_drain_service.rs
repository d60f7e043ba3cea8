//! A helper program of `tests/file_system_faults.rs` (not a test, not an example for users): a
//! service whose one participant answers its drain only once the file `FS_GO` exists, its marker
//! directory `FS_RUN` and its state directory `FS_STATE`: the window in which the test fills the
//! marker directory's file system.

mod program;

use actix::Actor;
use std::path::PathBuf;

/// A participant that answers its drain only once the file `go` exists: the window in which a
/// test fills the marker directory.
struct SlowDrain {
    go: PathBuf,
}

impl actix::Actor for SlowDrain {
    type Context = actix::Context<Self>;
}

impl actix::Handler<planned_stop::Drain> for SlowDrain {
    type Result = actix::ResponseFuture<planned_stop::DrainReport>;
    fn handle(&mut self, _: planned_stop::Drain, _: &mut actix::Context<Self>) -> Self::Result {
        let go = self.go.clone();
        Box::pin(async move {
            while !go.exists() {
                actix::clock::sleep(std::time::Duration::from_millis(10)).await;
            }
            planned_stop::DrainReport::unfinished(["first", "second"])
        })
    }
}

fn main() {
    program::give_up_after_helper_lifetime();
    let var = |k: &str| PathBuf::from(std::env::var(k).unwrap());
    let (run_dir, state, go) = (var("FS_RUN"), var("FS_STATE"), var("FS_GO"));
    actix::System::new().block_on(async move {
        let store = planned_stop::record::FileRecordStore::open(
            state,
            planned_stop::record::Sharing::Refused,
        )
        .unwrap();
        let handle = planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots(run_dir))
            .record_store(std::sync::Arc::new(store))
            .drain_deadline(std::time::Duration::from_secs(20))
            .poll_interval(std::time::Duration::from_millis(10))
            .participant("slow", SlowDrain { go }.start().recipient())
            .start()
            .unwrap();
        handle.ready();
        handle.stopped().await;
    });
}

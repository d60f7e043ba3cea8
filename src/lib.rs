//! # planned-stop
//!
//! A *planned stop* for actix applications: a stopper (a shell, systemd's `ExecStop`, a deploy
//! tool, a Kubernetes `preStop` hook) asks one specific running process to stop on purpose, and
//! the process drains its work within a deadline, records what was left for the next start, and
//! exits 0. A stop nobody planned exits non-zero, so supervisors start it again.
//!
//! Guarantees:
//!
//! - a request stops only the process it names, by pid *and* start fingerprint
//!   ([`ProcessIdentity`]), once, on every OS (a JSON [`marker`](marker::Marker) file, since
//!   signals cannot say "planned" and Windows has no SIGTERM handler);
//! - no stale, foreign, forged or malformed file stops, wedges or crashes the process;
//! - every item a stop leaves unfinished is durable before the stop reports success, or the stop
//!   says `record_lost` with the items; the next start resumes each, acknowledged once;
//! - `main` returns the exit code of the verdict ([`ServiceHandle::stopped`]).
//!
//! [`ServiceBuilder::new`] starts the runner and the watcher on the current actix `System`; actors
//! with work take part in the drain by handling [`Drain`] and answering a [`DrainReport`] (a
//! [`WorkSet`] or a [`TaskGroup`] keeps the books). Everything else sits in a module named for
//! what it is: [`marker`], [`record`], [`stopper`], `web` (feature `actix-web`), `testing`
//! (feature `testing`). `docs/api.md` maps the surface; `docs/design.md` explains it. The marker
//! files and the stopper's side are the crate `planned-stop-protocol`, re-exported here.
//!
//! The runner's messages and the test seams are not part of the API, and a store's lease rules
//! live in [`record::rules`], not at the root:
//!
//! ```compile_fail,E0432
//! use planned_stop::{Clock, PlannedStop, RunnerActor, is_offered};
//! ```
//!
//! Features, none on by default: `systemd` (notifications through `$NOTIFY_SOCKET`), `actix-web`
//! (the `HttpServer` as the ingress participant, readiness, the exit code `main` returns),
//! `metrics` (stops, drains and items through the `metrics` facade; nothing compiled without
//! it), `testing` (the conformance suite for a third-party [`record::RecordStore`], and the test
//! seams). A fleet keeps its work in PostgreSQL through the crate `planned-stop-postgres`, a store
//! built on this crate's surface.
//!
//! ```
//! use chrono::Utc;
//! use planned_stop::{Layout, ProcessIdentity};
//! use planned_stop::marker::{Marker, MarkerStore, Judgement};
//!
//! # let dir = tempfile::tempdir().unwrap();
//! # let dir = dir.path().join("run");
//! let store = MarkerStore::open(Layout::Slots(dir))?;
//! let me = ProcessIdentity::current()?;
//! // A stopper (normally another process) asks us to stop.
//! store.write(&Marker::new(me.pid, Some(me.start), Utc::now()).with_reason("deploy"))?;
//! // The watcher probes without consuming; the runner claims.
//! assert!(matches!(store.probe(&me, Utc::now())?, Judgement::ForSelf(_)));
//! let marker = store.claim(&me, Utc::now())?.expect("the marker is ours");
//! assert_eq!(marker.reason.as_deref(), Some("deploy"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![warn(missing_debug_implementations)]
// Checked with `internals` on (as every test build has it): an item only the crate's own tests reach
// through `internals` is `pub`, everything else the crate alone uses is `pub(crate)`.
#![cfg_attr(feature = "internals", deny(unreachable_pub))]
// What stays `unsafe` is what no maintained crate covers (atexit/_exit, the Windows process
// calls); each block says why it is sound.
#![warn(clippy::undocumented_unsafe_blocks)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod clock;
mod events;
// The hand-over works on Unix only; elsewhere a restart falls back to the exit code.
#[cfg_attr(not(unix), allow(dead_code))]
mod handover;
mod lifecycle;
pub mod record;
mod resume;
mod runner;
mod service;
mod signals;
#[cfg(all(unix, feature = "systemd"))]
mod systemd;
mod tasks;
mod telemetry;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
mod watcher;
#[cfg(feature = "actix-web")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix-web")))]
pub mod web;
mod work;

// The file protocol and the stopper's side live in `planned-stop-protocol` (no async runtime);
// re-exported whole, so an application needs this crate alone.
pub use lifecycle::{DrainPhase, ProcessState, SignalKind, StopCause, StopRequest, StopVerdict};
pub use planned_stop_protocol::Layout;
pub use planned_stop_protocol::{IdentityError, ProcessIdentity};
use planned_stop_protocol::{error_chain, identity, judgement, outcome, schema, store};
pub use planned_stop_protocol::{marker, stopper};
pub use resume::{DEFAULT_RESUME_BATCH, ResumeLoop};
pub use runner::{Drain, DrainReport, ExitCodes, RunnerStatus};
pub use service::{
    DEFAULT_MAX_FAILED_ATTEMPTS, MIN_LEASE, ServiceBuilder, ServiceHandle, StartError,
};
pub use tasks::{CancellationToken, JobEnd, TaskGroup};
pub use work::{JobId, Refusal, Refused, WorkSet};

/// The README's Rust blocks, compiled: `tests/readme-blocks.md` holds each with the lines that
/// make it a program hidden, and `tests/layout.rs` checks its visible lines are the README's.
#[cfg(all(doctest, feature = "actix-web"))]
#[doc = include_str!("../tests/readme-blocks.md")]
pub struct ReadmeBlocks;

/// The crate's own pieces, for its tests, benchmarks and fuzz targets only.
///
/// Behind the `internals` feature, which no application should enable: nothing here is part of
/// the API and any of it may change in any release.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod internals {
    pub use crate::clock::{Clock, SystemClock};
    pub use crate::events::{SlotEvents, Wakeups};
    pub use crate::handover::{RestartMode, restart_mode};
    pub use crate::identity::{parse_proc_stat, parse_status_uids};
    pub use crate::judgement::{SlotContent, decide, decide_as_owner};
    pub use crate::lifecycle::{Lifecycle, Step};
    pub use crate::outcome::may_speak_for;
    pub use crate::record::host::{HOST_ENV, local_host};
    pub use crate::record::lease::{
        Liveness, failure_at_takeover, holds, is_held_aside, is_offered, is_valid_item_id,
    };
    pub use crate::runner::{OsSignal, PlannedStop, RunnerActor};
    pub use crate::runner::{Ready, RequestStop, RunnerConfig};
    pub use crate::watcher::{
        MarkerProbe, MarkerWatcherActor, OwnSlot, Watch, WatchSend, WatchStep, next_step,
    };

    /// A runner outside the service, with its drain participants, and its status channel.
    pub fn runner(
        store: crate::store::MarkerStore,
        own: crate::ProcessIdentity,
        config: RunnerConfig,
        clock: std::sync::Arc<dyn Clock>,
        participants: Vec<(crate::DrainPhase, String, actix::Recipient<crate::Drain>)>,
    ) -> (
        RunnerActor,
        tokio::sync::watch::Receiver<crate::RunnerStatus>,
    ) {
        let mut runner = RunnerActor::new(store, own, config, clock);
        for (phase, name, recipient) in participants {
            runner.add_participant(phase, name, recipient);
        }
        let status = runner.subscribe();
        (runner, status)
    }

    /// Resolves once the runner behind `handle` has handled everything sent to it before (the
    /// handle's requests, signals, readiness); at once when the runner is gone. A test waits on
    /// it before asserting that a message changed nothing.
    pub async fn runner_caught_up(handle: &crate::ServiceHandle) {
        let _ = handle.runner.send(crate::runner::CaughtUp).await;
    }

    /// The runner's address behind a service's handle: a test sends it what only the crate's own
    /// pieces send (a [`PlannedStop`] as the watcher would).
    pub fn runner_of(handle: &crate::ServiceHandle) -> actix::Addr<RunnerActor> {
        handle.runner.clone()
    }
}

//! # planned-stop
//!
//! A *planned stop* for actix applications: a stopper (an operator's shell, a service manager's
//! `ExecStop`, a deploy tool, a Kubernetes `preStop` hook) tells one specific running process "stop
//! now, on purpose"; the process acts on that request once, drains its work within a deadline,
//! records what was left so the next start can resume it, and exits 0. A termination nobody planned
//! exits non-zero, so supervisors revive it.
//!
//! ## Why a marker file
//!
//! Signals cannot carry "this is planned": a SIGTERM from a deploy and one from an OOM-killing
//! supervisor look the same, and on Windows there is no SIGTERM handler at all. A small JSON
//! [`Marker`](marker::Marker) in a directory works on every OS. It names its target by pid *and*
//! start fingerprint ([`ProcessIdentity`]), so it can never stop a later process that inherited
//! the pid.
//!
//! ## What you use
//!
//! The crate root holds what an application's `main` and its actors use:
//!
//! - [`ServiceBuilder::new`] starts the runner and the marker watcher on the current actix
//!   `System`; the [`ServiceHandle`] says when the application is ready, leases what earlier stops
//!   left ([`ServiceHandle::resume`]), and resolves to the exit code `main` returns.
//! - Actors with work to finish take part in the drain: they handle [`Drain`] and answer with a
//!   [`DrainReport`] (a [`WorkSet`] keeps the bookkeeping), in the [`DrainPhase`] they belong to.
//! - The runner's life as values: [`RunnerStatus`], [`RunnerState`], [`StopCause`],
//!   [`StopVerdict`], [`StopRequest`], [`SignalKind`], [`ExitCodes`]; the errors of a start
//!   ([`StartError`], [`IdentityError`]).
//!
//! Everything else lives in a module named for what it is:
//!
//! - [`marker`]: the marker, its slot directory ([`marker::MarkerStore`]), the one decision
//!   ([`marker::Verdict`]) and its [`marker::Policy`]; the size limits a stopper must respect.
//! - [`record`]: what a stop leaves for the next start — the [`record::StopRecord`], the resume
//!   items, the [`record::RecordStore`] trait and its stores ([`record::FileRecordStore`], and
//!   with `postgres` the fleet's `PgRecordStore`).
//! - [`stopper`]: the other side — [`stopper::request`] writes a marker for exactly one
//!   [`ProcessIdentity`], and [`stopper::wait`] follows that process to its
//!   [`stopper::Outcome`].
//! - `web` (with `actix-web`): the `HttpServer` as the ingress drain participant, readiness that
//!   says `draining`.
//! - `testing` (with `testing`): the conformance suite for a third-party record store, and the
//!   test seams (a clock, a liveness probe) the crate's stores and builder accept.
//!
//! `docs/api.md` in the repository lists the whole surface by module.
//!
//! Backend rules, the runner's own messages and the test seams are not part of it:
//!
//! ```compile_fail,E0432
//! use planned_stop::{Clock, PlannedStop, RunnerActor, is_offered};
//! ```
//!
//! ## Cargo features
//!
//! None is on by default, and none needs turning off: the `planned-stop` command-line tool is a
//! crate of its own (`planned-stop-cli`), so an application compiles none of clap, indicatif or
//! tracing-subscriber. The features, each off until asked for:
//!
//! - `systemd`: `READY=1`, `STOPPING=1` and status notifications through `$NOTIFY_SOCKET` (Unix).
//! - `actix-web`: `web` — the `HttpServer` as the ingress drain participant,
//!   readiness that says `draining`, and the exit code `main` returns.
//! - `postgres`: `record::PgRecordStore`, the record store every replica of a fleet reaches.
//! - `metrics`: stops by cause and verdict, drain durations per phase, the fate of every
//!   handed-back item, leases and the runner's state, recorded through the `metrics` facade into
//!   the exporter the application installs (the names are in `docs/operations.md`). Nothing of it
//!   is compiled without the feature.
//! - `testing`: `testing`, the conformance suite a third-party [`record::RecordStore`] runs to
//!   show it follows the same rules as the crate's own stores, and the test seams: the builder's
//!   and the stores' `clock`, the stores' `liveness`, the builder's `identity`.
//!
//! ## How the pieces fit
//!
//! The file protocol — the marker, the verdict, process identity, the marker, outcome and
//! presence files, and the stopper's side — is the crate `planned-stop-protocol`, which has no
//! actix and no async runtime; this crate re-exports it whole ([`marker`], [`stopper`],
//! [`ProcessIdentity`], [`Layout`]). Inside, dependencies point one way. The marker schema and its bounded parser, and the **one**
//! verdict function, are pure; the store and the process identity read the file system and the OS
//! and hold no policy of their own; the runner's rules (states, causes, the verdict latch, the
//! drain phases) are pure too, and two actors, the runner and the watcher, act on them; the service
//! wires everything together, and the stopper is the other side. Only what is listed above is
//! public, so every other piece can change without breaking an application. `docs/design.md` in
//! the repository walks through each piece.
//!
//! ```
//! use chrono::Utc;
//! use planned_stop::{Layout, ProcessIdentity};
//! use planned_stop::marker::{Marker, MarkerStore, Verdict};
//!
//! # let dir = tempfile::tempdir().unwrap();
//! # let dir = dir.path().join("run");
//! let store = MarkerStore::open(Layout::Slots(dir))?;
//! let me = ProcessIdentity::current()?;
//! // A stopper (normally another process) asks us to stop.
//! store.write(&Marker::new(me.pid, Some(me.start), Utc::now()).with_reason("deploy"))?;
//! // The watcher probes without consuming; the runner claims.
//! assert!(matches!(store.probe(&me, Utc::now())?, Verdict::ForSelf(_)));
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
pub use lifecycle::{DrainPhase, RunnerState, SignalKind, StopCause, StopRequest, StopVerdict};
pub use planned_stop_protocol::Layout;
pub use planned_stop_protocol::{IdentityError, ProcessIdentity};
use planned_stop_protocol::{error_chain, identity, outcome, schema, store, verdict};
pub use planned_stop_protocol::{marker, stopper};
pub use resume::{DEFAULT_RESUME_BATCH, ResumeLoop};
pub use runner::{Drain, DrainReport, ExitCodes, RunnerStatus};
pub use service::{
    DEFAULT_MAX_FAILED_ATTEMPTS, MIN_LEASE, ServiceBuilder, ServiceHandle, StartError,
};
pub use tasks::{CancellationToken, JobEnd, TaskGroup};
pub use work::{JobId, Refusal, Refused, Unreadable, WorkSet};

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
    pub use crate::lifecycle::{Lifecycle, Step};
    pub use crate::outcome::may_speak_for;
    pub use crate::record::host::{HOST_ENV, local_host};
    pub use crate::record::lease::{
        Liveness, failure_at_takeover, holds, is_held_aside, is_offered, is_valid_item_id,
    };
    pub use crate::runner::{OsSignal, PlannedStop, RunnerActor};
    pub use crate::runner::{Ready, RequestStop, RunnerConfig};
    pub use crate::verdict::{SlotContent, decide, decide_as_owner};
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

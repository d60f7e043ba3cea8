//! The workspace's integration tests, one binary (as ripgrep's `tests/tests.rs`): each module is a
//! file of this directory, named for what it tests; `README.md` says which one a new test joins.
//! `systemd.rs` alone is a binary of its own: it sets `$NOTIFY_SOCKET` for the whole process. The
//! programs they start are binaries of this package (`Cargo.toml`).

/// What the tests share: processes, the paused actix system, HTTP, waits.
mod common;

/// `web::Admin` through the whole drain; the WARN for a half-used actix-web integration.
#[cfg(feature = "actix-web")]
mod admin;
/// The fleet in chaos on PostgreSQL and a shared directory, and the checker's injected defects.
mod chaos;
/// The command line's verbs with real processes: `serve`, `stop`, `status`, `clear`, `inspect`.
mod cli;
/// A wall clock that jumps while markers wait.
mod clock_steps;
/// The examples no other module runs, stopped as their headers say.
#[cfg(feature = "actix-web")]
mod examples;
/// A marker or state directory that turns read-only or fills up.
mod file_system_faults;
/// The source layout: layers, file sizes, the README's blocks.
mod layout;
/// The `metrics` feature scraped over HTTP across real stops.
#[cfg(all(feature = "actix-web", feature = "metrics"))]
mod metrics;
/// Every bounded interleaving of the stop protocol and the record handover (stateright).
mod model;
/// The PostgreSQL store against a real server.
#[cfg(feature = "postgres")]
mod postgres;
/// Stoppers, the watcher and SIGTERM racing on one target.
mod races;
/// The record store: the conformance suite and resumes with real processes.
mod records;
/// The runner and the watcher wired by `ServiceBuilder`, on a paused clock.
mod service;
/// Every sequence of events against a reference model (proptest-state-machine).
mod state_machine;
/// `MarkerStore` against real files: hostile contents, racing claimers, the sweep.
mod store;
/// The task service as real processes: jobs across lives, restart in place, socket activation.
#[cfg(feature = "actix-web")]
mod task_service;
/// `TaskGroup` and `ResumeLoop` in a real service in this process.
mod tasks;
/// The watcher alone, against a recorder.
mod watcher;
/// actix-web applications stopped for real: the layouts of `main`, HTTP during a stop.
#[cfg(feature = "actix-web")]
mod web;

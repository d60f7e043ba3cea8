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
//! [`Marker`] in a directory works on every OS. It names its target by pid *and* start fingerprint
//! ([`ProcessIdentity`]), so it can never stop a later process that inherited the pid.
//!
//! ## How the pieces fit
//!
//! - [`marker`]: the schema and its strict, bounded parser (pure).
//! - [`identity`]: the pid-reuse-proof identity of a process, read one way on both sides.
//! - [`verdict`]: the **one** decision function every other part calls (pure).
//! - [`store`]: the files: atomic symlink-safe writes, a probe that never consumes our own marker, a
//!   claim that exactly one racer wins.
//! - [`lifecycle`]: the runner's rules — states, causes, the verdict latch (pure).
//! - [`runner`] and [`watcher`]: the two actors that act on those rules.
//! - [`record`]: the stop record that lets the next start resume unfinished work.
//! - [`service`]: the builder that wires it all into an actix application.
//! - [`stopper`]: the other side — write a request for one process, wait, read its outcome.
//! - [`signals`], [`events`] and (feature `systemd`) `systemd`: the OS inputs and outputs.
//!
//! ```
//! use chrono::Utc;
//! use planned_stop::{Layout, Marker, MarkerStore, ProcessIdentity, Verdict};
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

#![warn(missing_docs)]

pub mod clock;
pub mod events;
pub mod identity;
pub mod lifecycle;
pub mod marker;
pub mod outcome;
pub mod record;
pub mod runner;
pub mod service;
pub mod signals;
pub mod stopper;
pub mod store;
#[cfg(all(unix, feature = "systemd"))]
pub mod systemd;
pub mod verdict;
pub mod watcher;

pub use identity::{IdentityError, ProcessIdentity};
pub use lifecycle::{RunnerState, SignalKind, StopCause, StopVerdict};
pub use marker::{Marker, MarkerError};
pub use record::{StopRecord, Unfinished};
pub use runner::{Drain, DrainReport, PlannedStop, RunnerActor, RunnerStatus};
pub use service::{PlannedStopService, ServiceBuilder, ServiceHandle};
pub use store::{Layout, MarkerStore, MarkerStoreBuilder, StoreError};
pub use verdict::{Policy, Verdict};

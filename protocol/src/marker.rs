//! The marker and its slot directory: how a stopper asks one process to stop, and how the answer is
//! decided.
//!
//! A stopper writes one small JSON [`Marker`] into the process's slot in a directory (a
//! [`crate::Layout`], which the service's builder takes too); the service's watcher probes the
//! slot, and the runner claims the marker once it acts on it. Whoever reads a slot asks the same question — is this marker *for me, now*? — and
//! the one pure decision answers it with a [`Judgement`], under a [`Policy`] of thresholds.
//! [`MarkerStore`] is the directory: it writes, reads, judges, sweeps and clears slots, and is what
//! an operator's tool uses to look without acting.
//!
//! Why the pieces are split this way: the schema ([`Marker::parse`]) treats every byte as hostile
//! and knows nothing of files; the judgement knows nothing of files either, so a test moves the clock
//! instead of sleeping and a fuzzer calls it a million times a second; only the store touches the
//! file system. The size limits of a marker are public so a stopper written in another language can
//! check its own output: [`MAX_MARKER_BYTES`], [`MAX_REQUEST_ID_CHARS`], [`MAX_REASON_CHARS`].

pub use crate::judgement::{FileKind, Judgement, Malformed, Policy, Stale, Undecided};
pub use crate::schema::{
    MAX_MARKER_BYTES, MAX_REASON_CHARS, MAX_REQUEST_ID_CHARS, Marker, MarkerError, StopAction,
};
pub use crate::store::{MarkerStore, MarkerStoreBuilder, SlotEntry, StoreError, SweepReport};

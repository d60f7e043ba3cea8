//! What can go wrong in the store, each variant naming the path and what to do.
//!
//! The OS error is the variant's `source`, not part of its message: a caller that prints the chain
//! (as the CLI and the logs do) shows it once.

use crate::judgement::Undecided;
use crate::schema::MarkerError;
use std::io;
use std::path::{Path, PathBuf};

/// Why a store operation failed. Each variant names the path and what to do.
///
/// ```
/// use planned_stop_protocol::Layout;
/// use planned_stop_protocol::marker::{Marker, MarkerStore, StoreError};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
/// let bad = Marker::new(1, None, chrono::Utc::now()).with_reason("a\nb");
/// assert!(matches!(store.write(&bad), Err(StoreError::InvalidMarker(_))));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The marker directory could not be created or examined.
    #[error("cannot use marker directory {path}")]
    Directory {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The marker "directory" is something else.
    #[error("marker directory {0} exists but is not a directory")]
    NotADirectory(PathBuf),
    /// The directory is writable by group or others.
    #[error(
        "marker directory {path} is writable by group or others (mode {mode:03o}): anyone who can \
         write there can stop the service; run `chmod 700 {path}`, or use a subdirectory the \
         service creates private (such as {path}/markers: what a shared volume, a Kubernetes \
         emptyDir, needs), or opt in to a shared directory"
    )]
    SharedDirectory {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The state directory (or one of its item directories) is writable by group or others.
    #[error(
        "state directory {path} is writable by group or others (mode {mode:03o}): anyone who can \
         write there can plant work for the service to resume; run `chmod 700 {path}`, or use a \
         subdirectory the service creates private (such as {path}/state), or opt in to a \
         shared state directory"
    )]
    SharedStateDirectory {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A directory whose files the service acts on belongs to another user (not this process's,
    /// not root): that user could replace what it holds.
    #[error(
        "directory {path} belongs to uid {owner}, not to this process's user or root: that user \
         could replace what it holds; run the service as its owner, or `chown` it to the \
         service's user"
    )]
    ForeignDirectory {
        /// The directory.
        path: PathBuf,
        /// Its owner's uid.
        owner: u32,
    },
    /// A file operation failed.
    #[error("cannot {op} {path}")]
    Io {
        /// What was being done (`write`, `rename`, `remove`, ...).
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The marker to write is not valid.
    #[error("refusing to write an invalid marker")]
    InvalidMarker(#[from] MarkerError),
    /// The slot could not be read this time; nothing was decided. Retry later.
    #[error("cannot read marker {path} right now ({kind}); nothing was decided, retry later")]
    Unreadable {
        /// The slot.
        path: PathBuf,
        /// The OS error kind.
        kind: io::ErrorKind,
    },
    /// A directory with contents sits where a marker belongs: a marker cannot be written there and
    /// the store never deletes a directory's contents.
    #[error(
        "{path} is a directory with contents where a marker belongs; the marker store never deletes \
         what a directory holds: look at it and remove it by hand (`rm -r {path}`, or `rmdir /s` \
         on Windows), then retry"
    )]
    DirectoryInTheWay {
        /// The slot.
        path: PathBuf,
    },
    /// The shared single file holds a marker that is still good for another process.
    #[error(
        "{path} holds a pending stop request for process {pid}, good until {expires_at}: wait \
         until process {pid} consumes it or it expires; if process {pid} will never read it, remove \
         it, or use the per-process slot layout"
    )]
    SlotBusy {
        /// The shared file.
        path: PathBuf,
        /// The process the pending marker is for.
        pid: u32,
        /// When the pending marker expires (its `written_at` plus the TTL).
        expires_at: chrono::DateTime<chrono::Utc>,
    },
}

pub(super) fn unreadable(slot: &Path, e: Undecided) -> StoreError {
    StoreError::Unreadable {
        path: slot.to_path_buf(),
        kind: e.0,
    }
}

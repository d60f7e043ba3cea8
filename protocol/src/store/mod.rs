//! Where markers live on disk, and the only code that touches them.
//!
//! Two layouts:
//!
//! - [`Layout::Slots`] (the default): one file per target, `DIR/planned-stop-<PID>.json`.
//!   Stoppers of different processes never touch the same file, so they cannot overwrite each other
//!   (hazard 4 in docs/protocol.md: concurrent stoppers overwrote each other).
//! - [`Layout::SingleFile`]: one path shared by every process, for writers that know only one. A
//!   marker that names another live process is left where it is, and a writer refuses to replace
//!   one that is still good for its target.
//!
//! What the store guarantees:
//!
//! - **Atomic, symlink-safe writes.** A marker is written to a new temporary file in the same
//!   directory (`O_EXCL`, mode 0600), synced, renamed over the slot, and the directory is synced. A
//!   reader sees the old marker or the new one, never half of one, even if the writer is killed; and
//!   a symlink at the slot is replaced, never followed (hazard 5 in docs/protocol.md: a writer
//!   followed a symlink).
//! - **Reads that cannot hang or wander.** The slot is inspected with `lstat` first; a symlink,
//!   directory, FIFO or device is judged without being opened, and the open itself uses `O_NOFOLLOW`
//!   and `O_NONBLOCK`. At most one byte past the size limit is read.
//! - **One decision.** Every method judges what it read with [`crate::judgement`]; the store holds no
//!   rule of its own.
//! - **No lost markers.** Removing and claiming first *take* the file (rename it to a private name,
//!   which exactly one process can do), then judge what they took again. If a stopper replaced the
//!   file in between, the new marker is put back, not deleted.
//! - **A private directory.** A missing directory is created with mode 0700; an existing one that
//!   group or others can write is refused unless the caller opts in, since whoever can write there can
//!   stop the service.

mod builder;
mod error;
pub mod files;
mod layout;
mod naming;
mod outcomes;
mod sweep;

pub use builder::MarkerStoreBuilder;
pub use error::StoreError;
pub use layout::Layout;
pub use sweep::{SlotEntry, SweepReport};

use crate::identity::ProcessIdentity;
use crate::judgement::{self, FileKind, Judgement, Policy, Undecided};
use crate::schema::Marker;
use chrono::{DateTime, Utc};
use error::unreadable;
use files::{Found, read_slot, remove, with_sharing_retries};
use naming::{TAKEN_TAG, TEMP_TAG, parse_slot_file_name, private_file_name, slot_file_name};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The marker files of one layout. Cheap to clone; holds no open files.
///
/// ```
/// use chrono::Utc;
/// use planned_stop_protocol::{Layout, ProcessIdentity};
/// use planned_stop_protocol::marker::{Marker, MarkerStore, Judgement};
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = MarkerStore::open(Layout::Slots(dir.path().join("markers"))).unwrap();
/// let me = ProcessIdentity::current().unwrap();
///
/// store.write(&Marker::new(me.pid, Some(me.start), Utc::now())).unwrap();
/// assert!(matches!(store.probe(&me, Utc::now()).unwrap(), Judgement::ForSelf(_)));
/// let taken = store.claim(&me, Utc::now()).unwrap();
/// assert!(taken.is_some());
/// assert_eq!(store.probe(&me, Utc::now()).unwrap(), Judgement::Absent);
/// ```
#[derive(Debug, Clone)]
pub struct MarkerStore {
    layout: Layout,
    dir: PathBuf,
    policy: Policy,
    /// Whether a directory writable by group or others was accepted on purpose; if not, the
    /// policy is checked again whenever a probe or claim finds a file, since the mode can change
    /// while the service runs.
    allow_shared_dir: bool,
    /// Slots where a directory that cannot be removed was already reported: it is logged once,
    /// not on every poll.
    reported_dirs: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<PathBuf>>>,
    /// The users each process this store has seen running ran as, by pid and start: a target
    /// that exits before its stopper looks again wrote its last files as one of them, and those
    /// files must still speak for it (see `outcomes::MarkerStore::users_of`).
    users_seen: std::sync::Arc<std::sync::Mutex<UsersSeen>>,
}

/// The users (uids) of each process seen running, by pid and start fingerprint.
type UsersSeen = std::collections::HashMap<(u32, u64), Vec<u32>>;

impl MarkerStore {
    /// Opens a store with the default policy and a private directory (see [`MarkerStoreBuilder`]).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().join("run"))).unwrap();
    /// assert_eq!(store.policy(), &planned_stop_protocol::marker::Policy::default());
    /// ```
    pub fn open(layout: Layout) -> Result<MarkerStore, StoreError> {
        MarkerStore::builder(layout).open()
    }

    /// A builder for a store with non-default options.
    ///
    /// ```
    /// # use planned_stop_protocol::Layout;
    /// # use planned_stop_protocol::marker::{MarkerStore, Policy};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let policy = Policy::default().with_ttl(std::time::Duration::from_secs(300));
    /// let store = MarkerStore::builder(Layout::Slots(dir.path().join("run")))
    ///     .policy(policy)
    ///     .open()
    ///     .unwrap();
    /// assert_eq!(store.policy().ttl.as_secs(), 300);
    /// ```
    pub fn builder(layout: Layout) -> MarkerStoreBuilder {
        MarkerStoreBuilder {
            layout,
            policy: Policy::default(),
            allow_shared_dir: false,
            create_dir: true,
        }
    }

    /// The layout this store serves.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let layout = planned_stop_protocol::Layout::Slots(dir.path().into());
    /// let store = planned_stop_protocol::marker::MarkerStore::open(layout.clone()).unwrap();
    /// assert_eq!(store.layout(), &layout);
    /// ```
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The directory the markers live in.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::SingleFile(dir.path().join("m.json"))).unwrap();
    /// assert_eq!(store.dir(), dir.path());
    /// ```
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The policy every judgement of this store uses.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.policy().ttl.as_secs(), 60);
    /// ```
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The slot a marker for `pid` goes to.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.slot_path(42), dir.path().join("planned-stop-42.json"));
    /// ```
    pub fn slot_path(&self, pid: u32) -> PathBuf {
        match &self.layout {
            Layout::Slots(dir) => dir.join(slot_file_name(pid)),
            Layout::SingleFile(file) => file.clone(),
        }
    }

    /// Writes `marker` to its target's slot, atomically (see the module docs), and returns the path.
    /// Not synced: a marker matters only to a running process, which a power failure ends too,
    /// and a stopper's two fsyncs on a busy disk held a restart up to a second.
    ///
    /// In the single-file layout, refuses ([`StoreError::SlotBusy`]) to replace a marker that is
    /// still good for another running process.
    ///
    /// ```
    /// # use planned_stop_protocol::Layout;
    /// # use planned_stop_protocol::marker::{Marker, MarkerStore};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// let slot = store.write(&Marker::new(4242, None, chrono::Utc::now())).unwrap();
    /// assert!(slot.ends_with("planned-stop-4242.json"));
    /// ```
    pub fn write(&self, marker: &Marker) -> Result<PathBuf, StoreError> {
        self.write_observed(marker, &files::Unobserved)
    }

    /// [`MarkerStore::write`], each file step told to `observer`.
    pub(crate) fn write_observed(
        &self,
        marker: &Marker,
        observer: &dyn files::Observer,
    ) -> Result<PathBuf, StoreError> {
        let bytes = marker.to_json()?;
        let slot = self.slot_path(marker.target_pid);
        // A rename cannot replace a non-empty directory; say what is in the way instead of
        // reporting the rename's OS error.
        if fs::symlink_metadata(&slot).is_ok_and(|m| m.is_dir()) && fs::remove_dir(&slot).is_err() {
            return Err(StoreError::DirectoryInTheWay { path: slot });
        }
        if matches!(self.layout, Layout::SingleFile(_)) {
            let found = read_slot(&slot);
            if let Ok(Judgement::ForSelf(pending)) = self.judge_as_owner(&found, None, Utc::now())
                && pending.target_pid != marker.target_pid
            {
                let ttl =
                    chrono::TimeDelta::from_std(self.policy.ttl).unwrap_or(chrono::TimeDelta::MAX);
                return Err(StoreError::SlotBusy {
                    path: slot,
                    pid: pending.target_pid,
                    expires_at: pending
                        .written_at
                        .checked_add_signed(ttl)
                        .unwrap_or(DateTime::<Utc>::MAX_UTC),
                });
            }
        }
        // A root stopper writing for a service that runs as another user gives the marker to the
        // directory's owner (still 0600): a marker its target cannot read stops nothing.
        let readers = files::Readers::of(&self.dir, true);
        let temp = self.private_name(&slot, TEMP_TAG);
        files::write_replacing_for(&slot, &temp, &bytes, false, readers, observer)?;
        Ok(slot)
    }

    /// Reads and judges `own`'s slot without consuming it: a marker for us is left in place for
    /// [`MarkerStore::claim`]; a malformed or stale one is removed; a foreign one is left alone.
    ///
    /// A slot that cannot be read is [`StoreError::Unreadable`]: no decision, try again later.
    ///
    /// ```
    /// # use planned_stop_protocol::{Layout, ProcessIdentity};
    /// # use planned_stop_protocol::marker::{MarkerStore, Judgement};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// let me = ProcessIdentity::current().unwrap();
    /// std::fs::write(store.slot_path(me.pid), b"{not json").unwrap();
    /// assert!(matches!(store.probe(&me, chrono::Utc::now()).unwrap(), Judgement::Malformed(_)));
    /// assert!(!store.slot_path(me.pid).exists(), "removed");
    /// ```
    #[doc(hidden)] // the service's side, for planned-stop's own crates: what only a running service may say
    pub fn probe(
        &self,
        own: &ProcessIdentity,
        now: DateTime<Utc>,
    ) -> Result<Judgement, StoreError> {
        let slot = self.slot_path(own.pid);
        let judge = |found: &Found| judgement::decide(found.content(), own, now, &self.policy);
        let found = read_slot(&slot);
        self.still_private(&found)?;
        let judgement = judge(&found).map_err(|e| unreadable(&slot, e))?;
        if judgement.is_removable() {
            self.discard(&slot, &found, judge)?;
        }
        Ok(judgement)
    }

    /// Consumes `own`'s marker: the authoritative step that makes a stop planned. Returns the marker
    /// when it was for us and this call took it; `None` when there was none for us, or another
    /// claimer won the race (exactly one claimer ever gets `Some`).
    ///
    /// ```
    /// # use planned_stop_protocol::{Layout, ProcessIdentity};
    /// # use planned_stop_protocol::marker::{Marker, MarkerStore};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// let me = ProcessIdentity::current().unwrap();
    /// let now = chrono::Utc::now();
    /// store.write(&Marker::new(me.pid, Some(me.start), now)).unwrap();
    /// assert!(store.claim(&me, now).unwrap().is_some());
    /// assert_eq!(store.claim(&me, now).unwrap(), None, "taken once");
    /// ```
    #[doc(hidden)] // the service's side, for planned-stop's own crates: what only a running service may say
    pub fn claim(
        &self,
        own: &ProcessIdentity,
        now: DateTime<Utc>,
    ) -> Result<Option<Marker>, StoreError> {
        let slot = self.slot_path(own.pid);
        let judge = |found: &Found| judgement::decide(found.content(), own, now, &self.policy);
        let found = read_slot(&slot);
        self.still_private(&found)?;
        match judge(&found).map_err(|e| unreadable(&slot, e))? {
            Judgement::ForSelf(_) => {}
            v if v.is_removable() => {
                self.discard(&slot, &found, judge)?;
                return Ok(None);
            }
            _ => return Ok(None),
        }
        let Some(taken) = self.take(&slot)? else {
            return Ok(None);
        };
        match judge(&read_slot(&taken)) {
            Ok(Judgement::ForSelf(marker)) => {
                remove(&taken)?;
                Ok(Some(marker))
            }
            Ok(v) if v.is_removable() => {
                remove(&taken)?;
                Ok(None)
            }
            Ok(_) => {
                self.restore(&taken, &slot);
                Ok(None)
            }
            Err(e) => {
                self.restore(&taken, &slot);
                Err(unreadable(&slot, e))
            }
        }
    }

    /// The judgement the owner of `pid`'s slot would reach now, changing nothing: what `planned-stop
    /// inspect` prints. In the single-file layout the owner is whoever the marker names.
    ///
    /// ```
    /// # use planned_stop_protocol::Layout;
    /// # use planned_stop_protocol::marker::{MarkerStore, Judgement};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.inspect(4242, chrono::Utc::now()), Ok(Judgement::Absent));
    /// ```
    pub fn inspect(&self, pid: u32, now: DateTime<Utc>) -> Result<Judgement, Undecided> {
        let slot = self.slot_path(pid);
        self.judge_as_owner(&read_slot(&slot), self.owner_of(&slot), now)
    }

    /// Removes `pid`'s slot whatever it holds. Returns `false` when there was none.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// store.write(&planned_stop_protocol::marker::Marker::new(9, None, chrono::Utc::now())).unwrap();
    /// assert!(store.clear(9).unwrap());
    /// assert!(!store.clear(9).unwrap());
    /// ```
    pub fn clear(&self, pid: u32) -> Result<bool, StoreError> {
        let slot = self.slot_path(pid);
        let (removed, is_dir) = match fs::symlink_metadata(&slot) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => (Err(e), false),
            Ok(m) if m.is_dir() => (fs::remove_dir(&slot), true),
            Ok(_) => (fs::remove_file(&slot), false),
        };
        match removed {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(_) if is_dir => Err(StoreError::DirectoryInTheWay { path: slot }),
            Err(source) => Err(StoreError::Io {
                op: "remove",
                path: slot,
                source,
            }),
        }
    }

    /// Refuses to act on a file found in a directory that has become writable by group or
    /// others since the store was opened (unless that was accepted on purpose): anyone could
    /// have planted it. Checked only when something is there, so an empty slot costs nothing.
    fn still_private(&self, found: &Found) -> Result<(), StoreError> {
        if self.allow_shared_dir || matches!(found, Found::Absent) {
            return Ok(());
        }
        files::check_private_dir(&self.dir)
    }

    fn judge_as_owner(
        &self,
        found: &Found,
        owner: Option<u32>,
        now: DateTime<Utc>,
    ) -> Result<Judgement, Undecided> {
        judgement::decide_as_owner(
            found.content(),
            owner,
            ProcessIdentity::of,
            now,
            &self.policy,
        )
    }

    /// The pid a slot belongs to, when the layout says (`None` in the single-file layout).
    fn owner_of(&self, slot: &Path) -> Option<u32> {
        match self.layout {
            Layout::Slots(_) => slot.file_name()?.to_str().and_then(parse_slot_file_name),
            Layout::SingleFile(_) => None,
        }
    }

    /// Removes a slot judged removable, without losing a marker written since it was judged: the file
    /// is taken first and judged again; if it is no longer removable it goes back. Returns whether
    /// something was removed.
    fn discard(
        &self,
        slot: &Path,
        found: &Found,
        judge: impl Fn(&Found) -> Result<Judgement, Undecided>,
    ) -> Result<bool, StoreError> {
        if let Found::NotAFile(FileKind::Directory) = found {
            // A directory cannot be replaced by a marker while we look at it; remove it if empty.
            return match fs::remove_dir(slot) {
                Ok(()) => Ok(true),
                Err(e) => {
                    let first = self
                        .reported_dirs
                        .lock()
                        .map(|mut seen| seen.insert(slot.to_path_buf()))
                        .unwrap_or(true);
                    if first {
                        tracing::warn!(slot = %slot.display(), error = %e,
                            "a directory that cannot be removed sits at the marker slot: no stop \
                             can be delivered through it until it is removed by hand \
                             (logged once)");
                    }
                    Ok(false)
                }
            };
        }
        let Some(taken) = self.take(slot)? else {
            return Ok(false);
        };
        match judge(&read_slot(&taken)) {
            Ok(v) if v.is_removable() => {
                remove(&taken)?;
                tracing::info!(slot = %slot.display(), verdict = v.kind(), "removed marker");
                Ok(true)
            }
            _ => {
                self.restore(&taken, slot);
                Ok(false)
            }
        }
    }

    /// Renames the slot to a name private to this call. Exactly one of several racing callers gets
    /// `Some`; the others find nothing to take.
    fn take(&self, slot: &Path) -> Result<Option<PathBuf>, StoreError> {
        let taken = self.private_name(slot, TAKEN_TAG);
        match with_sharing_retries(|| fs::rename(slot, &taken)) {
            Ok(()) => Ok(Some(taken)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(StoreError::Io {
                op: "take",
                path: slot.to_path_buf(),
                source,
            }),
        }
    }

    /// Puts a taken file back, unless a newer marker has arrived at the slot meanwhile (the newer one
    /// wins). Never fails loudly: the worst case is the loss of a marker that a newer one replaced.
    fn restore(&self, taken: &Path, slot: &Path) {
        match with_sharing_retries(|| fs::hard_link(taken, slot)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                tracing::debug!(slot = %slot.display(), "a newer marker replaced the one taken");
            }
            // Hard links unsupported (some network or FAT file systems): rename back.
            Err(_) => {
                if fs::symlink_metadata(slot).is_err() {
                    let _ = fs::rename(taken, slot);
                }
            }
        }
        let _ = fs::remove_file(taken);
    }

    fn private_name(&self, slot: &Path, tag: &str) -> PathBuf {
        self.dir.join(private_file_name(slot, tag))
    }
}

#[cfg(test)]
mod tests;

//! Where markers live on disk, and the only code that touches them.
//!
//! Two layouts:
//!
//! - [`Layout::Slots`] (the default): one file per target, `DIR/planned-stop-<PID>.json`. Stoppers of
//!   different processes never touch the same file, so they cannot overwrite each other (hazard 4).
//! - [`Layout::SingleFile`]: one path shared by every process, the seed's layout. A marker that names
//!   another live process is left where it is, and a writer refuses to replace one that is still good
//!   for its target.
//!
//! What the store guarantees:
//!
//! - **Atomic, symlink-safe writes.** A marker is written to a new temporary file in the same
//!   directory (`O_EXCL`, mode 0600), synced, renamed over the slot, and the directory is synced. A
//!   reader sees the old marker or the new one, never half of one, even if the writer is killed; and a
//!   symlink at the slot is replaced, never followed (hazard 5).
//! - **Reads that cannot hang or wander.** The slot is inspected with `lstat` first; a symlink,
//!   directory, FIFO or device is judged without being opened, and the open itself uses `O_NOFOLLOW`
//!   and `O_NONBLOCK`. At most one byte past the size limit is read.
//! - **One decision.** Every method judges what it read with [`crate::verdict`]; the store holds no
//!   rule of its own.
//! - **No lost markers.** Removing and claiming first *take* the file (rename it to a private name,
//!   which exactly one process can do), then judge what they took again. If a stopper replaced the
//!   file in between, the new marker is put back, not deleted.
//! - **A private directory.** A missing directory is created with mode 0700; an existing one that
//!   group or others can write is refused unless the caller opts in, since whoever can write there can
//!   stop the service.

use crate::identity::ProcessIdentity;
use crate::marker::{MAX_MARKER_BYTES, Marker, MarkerError};
use crate::outcome::{MAX_OUTCOME_BYTES, Outcome};
use crate::verdict::{self, FileKind, Policy, SlotContent, Undecided, Verdict};
use chrono::{DateTime, Utc};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

const SLOT_PREFIX: &str = "planned-stop-";
const SLOT_SUFFIX: &str = ".json";
const OUTCOME_SUFFIX: &str = ".outcome.json";
const TEMP_TAG: &str = ".tmp-";
const TAKEN_TAG: &str = ".taken-";

/// Where the markers are.
///
/// ```
/// use planned_stop::{Layout, MarkerStore};
/// # let dir = tempfile::tempdir().unwrap();
/// let slots = MarkerStore::open(Layout::Slots(dir.path().join("run"))).unwrap();
/// assert!(slots.slot_path(7).ends_with("planned-stop-7.json"));
/// let single = MarkerStore::open(Layout::SingleFile(dir.path().join("stop.json"))).unwrap();
/// assert_eq!(single.slot_path(7), single.slot_path(8));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// One slot per target pid in this directory: `DIR/planned-stop-<PID>.json`.
    Slots(PathBuf),
    /// One file shared by all processes (the seed's layout).
    SingleFile(PathBuf),
}

impl Layout {
    /// The layout and pid a marker path names, as an operator gives it: a per-process slot
    /// `DIR/planned-stop-<PID>.json` is [`Layout::Slots`] of `DIR` and that pid; any other file is
    /// [`Layout::SingleFile`], whose owner is whoever its marker names (`None`).
    ///
    /// ```
    /// use planned_stop::Layout;
    /// use std::path::Path;
    /// assert_eq!(
    ///     Layout::of_marker_path(Path::new("/run/app/planned-stop-42.json")),
    ///     (Layout::Slots("/run/app".into()), Some(42))
    /// );
    /// assert_eq!(
    ///     Layout::of_marker_path(Path::new("/run/app/stop.json")),
    ///     (Layout::SingleFile("/run/app/stop.json".into()), None)
    /// );
    /// ```
    #[must_use]
    pub fn of_marker_path(path: &Path) -> (Layout, Option<u32>) {
        let slot_pid = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_slot_file_name);
        match (slot_pid, path.parent()) {
            (Some(pid), Some(dir)) => (Layout::Slots(dir.to_path_buf()), Some(pid)),
            _ => (Layout::SingleFile(path.to_path_buf()), None),
        }
    }
}

/// Why a store operation failed. Each variant names the path and what to do.
///
/// ```
/// use planned_stop::{Layout, Marker, MarkerStore, StoreError};
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
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
         write there can stop the service; run `chmod 700 {path}` or opt in to a shared directory"
    )]
    SharedDirectory {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
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
    /// The shared single file holds a marker that is still good for another process.
    #[error(
        "{path} holds a pending stop request for process {pid}; wait until it is consumed or use \
         the per-process slot layout (--dir)"
    )]
    SlotBusy {
        /// The shared file.
        path: PathBuf,
        /// The process the pending marker is for.
        pid: u32,
    },
}

/// Opens a [`MarkerStore`] with options. Safe defaults: [`Policy::default`], private directory.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// let store = planned_stop::MarkerStore::builder(planned_stop::Layout::Slots(dir.path().join("run")))
///     .allow_shared_dir(false)
///     .open()
///     .unwrap();
/// assert!(store.dir().is_dir());
/// ```
#[derive(Debug, Clone)]
#[must_use = "a builder or value that is dropped configures nothing"]
pub struct MarkerStoreBuilder {
    layout: Layout,
    policy: Policy,
    allow_shared_dir: bool,
    create_dir: bool,
}

impl MarkerStoreBuilder {
    /// Sets the policy used for every verdict this store reaches.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let policy = planned_stop::Policy::default().with_future_skew(std::time::Duration::from_secs(30));
    /// let store = planned_stop::MarkerStore::builder(planned_stop::Layout::Slots(dir.path().into())).policy(policy).open().unwrap();
    /// assert_eq!(store.policy().future_skew.as_secs(), 30);
    /// ```
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Accepts a marker directory that group or others can write (default `false`). Only do this
    /// when everyone who can write there is trusted to stop the service.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = planned_stop::MarkerStore::builder(planned_stop::Layout::Slots(dir.path().into())).allow_shared_dir(true).open();
    /// assert!(store.is_ok());
    /// ```
    pub fn allow_shared_dir(mut self, allow: bool) -> Self {
        self.allow_shared_dir = allow;
        self
    }

    /// Whether [`MarkerStoreBuilder::open`] creates a missing directory (default `true`). A reader
    /// that must change nothing (`planned-stop inspect`) passes `false`: a missing directory then
    /// simply holds no markers.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let missing = dir.path().join("not-yet");
    /// let store = planned_stop::MarkerStore::builder(planned_stop::Layout::Slots(missing.clone())).create_dir(false).open().unwrap();
    /// assert!(!missing.exists());
    /// assert_eq!(store.inspect(1, chrono::Utc::now()), Ok(planned_stop::Verdict::Absent));
    /// ```
    pub fn create_dir(mut self, create: bool) -> Self {
        self.create_dir = create;
        self
    }

    /// Creates the directory if missing (mode 0700) and checks its permissions.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = planned_stop::MarkerStore::builder(planned_stop::Layout::Slots(dir.path().join("a/b"))).open().unwrap();
    /// assert!(store.dir().is_dir());
    /// ```
    pub fn open(self) -> Result<MarkerStore, StoreError> {
        let dir = match &self.layout {
            Layout::Slots(dir) => dir.clone(),
            Layout::SingleFile(file) => match file.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            },
        };
        if self.create_dir || dir.exists() {
            prepare_dir(&dir, self.allow_shared_dir)?;
        }
        Ok(MarkerStore {
            layout: self.layout,
            dir,
            policy: self.policy,
        })
    }
}

/// What [`MarkerStore::sweep`] removed.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
/// let report = store.sweep(chrono::Utc::now()).unwrap();
/// assert_eq!(report, planned_stop::SweepReport::default());
/// ```
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SweepReport {
    /// Slots removed as malformed or stale (their owner gone included).
    pub removed_slots: Vec<PathBuf>,
    /// Leftover temporary and taken files removed.
    pub removed_leftovers: Vec<PathBuf>,
}

/// One slot as [`MarkerStore::entries`] lists it.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
/// std::fs::write(store.slot_path(3), b"junk").unwrap();
/// let entries = store.entries(chrono::Utc::now()).unwrap();
/// assert_eq!(entries[0].verdict.as_ref().map(|v| v.kind()), Ok("malformed"));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct SlotEntry {
    /// The slot's path.
    pub path: PathBuf,
    /// The verdict its owner would reach now, or `Err` when it could not be read.
    pub verdict: Result<Verdict, Undecided>,
}

/// The marker files of one layout. Cheap to clone; holds no open files.
///
/// ```
/// use chrono::Utc;
/// use planned_stop::{Layout, Marker, MarkerStore, ProcessIdentity, Verdict};
///
/// let dir = tempfile::tempdir().unwrap();
/// let store = MarkerStore::open(Layout::Slots(dir.path().join("markers"))).unwrap();
/// let me = ProcessIdentity::current().unwrap();
///
/// store.write(&Marker::new(me.pid, Some(me.start), Utc::now())).unwrap();
/// assert!(matches!(store.probe(&me, Utc::now()).unwrap(), Verdict::ForSelf(_)));
/// let taken = store.claim(&me, Utc::now()).unwrap();
/// assert!(taken.is_some());
/// assert_eq!(store.probe(&me, Utc::now()).unwrap(), Verdict::Absent);
/// ```
#[derive(Debug, Clone)]
pub struct MarkerStore {
    layout: Layout,
    dir: PathBuf,
    policy: Policy,
}

impl MarkerStore {
    /// Opens a store with the default policy and a private directory (see [`MarkerStoreBuilder`]).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().join("run"))).unwrap();
    /// assert_eq!(store.policy(), &planned_stop::Policy::default());
    /// ```
    pub fn open(layout: Layout) -> Result<MarkerStore, StoreError> {
        MarkerStore::builder(layout).open()
    }

    /// A builder for a store with non-default options.
    ///
    /// ```
    /// # use planned_stop::{Layout, MarkerStore, Policy};
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
    /// let layout = planned_stop::Layout::Slots(dir.path().into());
    /// let store = planned_stop::MarkerStore::open(layout.clone()).unwrap();
    /// assert_eq!(store.layout(), &layout);
    /// ```
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The directory the markers live in.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = planned_stop::MarkerStore::open(planned_stop::Layout::SingleFile(dir.path().join("m.json"))).unwrap();
    /// assert_eq!(store.dir(), dir.path());
    /// ```
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The policy every verdict of this store uses.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.policy().ttl.as_secs(), 60);
    /// ```
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The slot a marker for `pid` goes to.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.slot_path(42), dir.path().join("planned-stop-42.json"));
    /// ```
    pub fn slot_path(&self, pid: u32) -> PathBuf {
        match &self.layout {
            Layout::Slots(dir) => dir.join(slot_file_name(pid)),
            Layout::SingleFile(file) => file.clone(),
        }
    }

    /// Where the runner of `pid` writes its [`Outcome`]: `DIR/planned-stop-<PID>.outcome.json`, in
    /// both layouts.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.outcome_path(42), dir.path().join("planned-stop-42.outcome.json"));
    /// ```
    pub fn outcome_path(&self, pid: u32) -> PathBuf {
        self.dir.join(outcome_file_name(pid))
    }

    /// Writes the runner's outcome file, atomically.
    pub(crate) fn write_outcome(&self, outcome: &Outcome) -> Result<PathBuf, StoreError> {
        let path = self.outcome_path(outcome.pid);
        let bytes = serde_json::to_vec(outcome).map_err(|e| StoreError::Io {
            op: "serialise",
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        write_atomically(&path, &self.private_name(&path, TEMP_TAG), &bytes)?;
        Ok(path)
    }

    /// Reads the outcome file of `pid`; `None` when there is none or it is not an outcome. Check
    /// [`Outcome::is_from`] before trusting it: the pid may have had an earlier owner.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.read_outcome(42), None);
    /// ```
    pub fn read_outcome(&self, pid: u32) -> Option<Outcome> {
        match read_bounded(&self.outcome_path(pid), MAX_OUTCOME_BYTES) {
            Found::Bytes(bytes) => Outcome::parse(&bytes),
            _ => None,
        }
    }

    /// Every readable outcome file in the directory, by pid.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// assert!(store.outcomes().is_empty());
    /// ```
    pub fn outcomes(&self) -> Vec<Outcome> {
        let mut outcomes: Vec<Outcome> = self
            .outcome_files()
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(pid, _)| self.read_outcome(pid))
            .collect();
        outcomes.sort_by_key(|o| o.pid);
        outcomes
    }

    /// Writes `marker` to its target's slot, atomically (see the module docs), and returns the path.
    ///
    /// In the single-file layout, refuses ([`StoreError::SlotBusy`]) to replace a marker that is
    /// still good for another running process.
    ///
    /// ```
    /// # use planned_stop::{Layout, Marker, MarkerStore};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// let slot = store.write(&Marker::new(4242, None, chrono::Utc::now())).unwrap();
    /// assert!(slot.ends_with("planned-stop-4242.json"));
    /// ```
    pub fn write(&self, marker: &Marker) -> Result<PathBuf, StoreError> {
        let bytes = marker.to_json()?;
        let slot = self.slot_path(marker.target_pid);
        if matches!(self.layout, Layout::SingleFile(_)) {
            let found = read_slot(&slot);
            if let Ok(Verdict::ForSelf(pending)) = self.judge_as_owner(&found, None, Utc::now())
                && pending.target_pid != marker.target_pid
            {
                return Err(StoreError::SlotBusy {
                    path: slot,
                    pid: pending.target_pid,
                });
            }
        }
        write_atomically(&slot, &self.private_name(&slot, TEMP_TAG), &bytes)?;
        Ok(slot)
    }

    /// Reads and judges `own`'s slot without consuming it: a marker for us is left in place for
    /// [`MarkerStore::claim`]; a malformed or stale one is removed; a foreign one is left alone.
    ///
    /// A slot that cannot be read is [`StoreError::Unreadable`]: no decision, try again later.
    ///
    /// ```
    /// # use planned_stop::{Layout, MarkerStore, ProcessIdentity, Verdict};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// let me = ProcessIdentity::current().unwrap();
    /// std::fs::write(store.slot_path(me.pid), b"{not json").unwrap();
    /// assert!(matches!(store.probe(&me, chrono::Utc::now()).unwrap(), Verdict::Malformed(_)));
    /// assert!(!store.slot_path(me.pid).exists(), "removed");
    /// ```
    pub fn probe(&self, own: &ProcessIdentity, now: DateTime<Utc>) -> Result<Verdict, StoreError> {
        let slot = self.slot_path(own.pid);
        let judge = |found: &Found| verdict::decide(found.content(), own, now, &self.policy);
        let found = read_slot(&slot);
        let verdict = judge(&found).map_err(|e| unreadable(&slot, e))?;
        if verdict.is_removable() {
            self.discard(&slot, &found, judge)?;
        }
        Ok(verdict)
    }

    /// Consumes `own`'s marker: the authoritative step that makes a stop planned. Returns the marker
    /// when it was for us and this call took it; `None` when there was none for us, or another
    /// claimer won the race (exactly one claimer ever gets `Some`).
    ///
    /// ```
    /// # use planned_stop::{Layout, Marker, MarkerStore, ProcessIdentity};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// let me = ProcessIdentity::current().unwrap();
    /// let now = chrono::Utc::now();
    /// store.write(&Marker::new(me.pid, Some(me.start), now)).unwrap();
    /// assert!(store.claim(&me, now).unwrap().is_some());
    /// assert_eq!(store.claim(&me, now).unwrap(), None, "taken once");
    /// ```
    pub fn claim(
        &self,
        own: &ProcessIdentity,
        now: DateTime<Utc>,
    ) -> Result<Option<Marker>, StoreError> {
        let slot = self.slot_path(own.pid);
        let judge = |found: &Found| verdict::decide(found.content(), own, now, &self.policy);
        let found = read_slot(&slot);
        match judge(&found).map_err(|e| unreadable(&slot, e))? {
            Verdict::ForSelf(_) => {}
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
            Ok(Verdict::ForSelf(marker)) => {
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

    /// The verdict the owner of `pid`'s slot would reach now, changing nothing: what `planned-stop
    /// inspect` prints. In the single-file layout the owner is whoever the marker names.
    ///
    /// ```
    /// # use planned_stop::{Layout, MarkerStore, Verdict};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.inspect(4242, chrono::Utc::now()), Ok(Verdict::Absent));
    /// ```
    pub fn inspect(&self, pid: u32, now: DateTime<Utc>) -> Result<Verdict, Undecided> {
        let slot = self.slot_path(pid);
        self.judge_as_owner(&read_slot(&slot), self.owner_of(&slot), now)
    }

    /// Every slot in the directory with the verdict its owner would reach, changing nothing.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// store.write(&planned_stop::Marker::new(9, None, chrono::Utc::now())).unwrap();
    /// let entries = store.entries(chrono::Utc::now()).unwrap();
    /// assert_eq!(entries.len(), 1);
    /// ```
    pub fn entries(&self, now: DateTime<Utc>) -> Result<Vec<SlotEntry>, StoreError> {
        let mut entries = Vec::new();
        for path in self.slot_files()? {
            let verdict = self.judge_as_owner(&read_slot(&path), self.owner_of(&path), now);
            entries.push(SlotEntry { path, verdict });
        }
        Ok(entries)
    }

    /// Removes `pid`'s slot whatever it holds. Returns `false` when there was none.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop::MarkerStore::open(planned_stop::Layout::Slots(dir.path().into())).unwrap();
    /// store.write(&planned_stop::Marker::new(9, None, chrono::Utc::now())).unwrap();
    /// assert!(store.clear(9).unwrap());
    /// assert!(!store.clear(9).unwrap());
    /// ```
    pub fn clear(&self, pid: u32) -> Result<bool, StoreError> {
        let slot = self.slot_path(pid);
        let removed = match fs::symlink_metadata(&slot) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => Err(e),
            Ok(m) if m.is_dir() => fs::remove_dir(&slot),
            Ok(_) => fs::remove_file(&slot),
        };
        match removed {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(StoreError::Io {
                op: "remove",
                path: slot,
                source,
            }),
        }
    }

    /// Removes every slot its owner would find malformed or stale (a slot whose owner has exited
    /// included), and temporary or taken files older than the TTL (left by a writer or claimer that
    /// died mid-way). Fresh temporary files are left: their writer may still be at work.
    ///
    /// ```
    /// # use planned_stop::{Layout, MarkerStore};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let store = MarkerStore::open(Layout::Slots(dir.path().into())).unwrap();
    /// std::fs::write(store.slot_path(7), b"garbage").unwrap();
    /// let report = store.sweep(chrono::Utc::now()).unwrap();
    /// assert_eq!(report.removed_slots, vec![store.slot_path(7)]);
    /// ```
    pub fn sweep(&self, now: DateTime<Utc>) -> Result<SweepReport, StoreError> {
        let mut report = SweepReport::default();
        for path in self.slot_files()? {
            let owner = self.owner_of(&path);
            let judge = |found: &Found| self.judge_as_owner(found, owner, now);
            let found = read_slot(&path);
            if let Ok(v) = judge(&found)
                && v.is_removable()
                && self.discard(&path, &found, judge)?
            {
                report.removed_slots.push(path);
            }
        }
        let cutoff = SystemTime::from(now)
            .checked_sub(self.policy.ttl)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        for (pid, path) in self.outcome_files()? {
            let old = fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t < cutoff);
            let owner_alive = match (ProcessIdentity::of(pid), self.read_outcome(pid)) {
                (Some(owner), Some(outcome)) => outcome.is_from(&owner),
                (Some(_), None) => false,
                (None, _) => false,
            };
            if old && !owner_alive && fs::remove_file(&path).is_ok() {
                report.removed_leftovers.push(path);
            }
        }
        for path in self.leftover_files()? {
            let old = fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t < cutoff);
            if old && fs::remove_file(&path).is_ok() {
                report.removed_leftovers.push(path);
            }
        }
        Ok(report)
    }

    fn judge_as_owner(
        &self,
        found: &Found,
        owner: Option<u32>,
        now: DateTime<Utc>,
    ) -> Result<Verdict, Undecided> {
        verdict::decide_as_owner(
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

    /// The slot files present now.
    fn slot_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        match &self.layout {
            Layout::SingleFile(file) => Ok(match fs::symlink_metadata(file) {
                Ok(_) => vec![file.clone()],
                Err(_) => Vec::new(),
            }),
            Layout::Slots(_) => Ok(self
                .dir_names()?
                .filter(|name| parse_slot_file_name(name).is_some())
                .map(|name| self.dir.join(name))
                .collect()),
        }
    }

    /// Outcome files in the directory, with their pids.
    fn outcome_files(&self) -> Result<Vec<(u32, PathBuf)>, StoreError> {
        Ok(self
            .dir_names()?
            .filter_map(|name| {
                let pid = parse_outcome_file_name(&name)?;
                Some((pid, self.dir.join(name)))
            })
            .collect())
    }

    /// Temporary and taken files of this layout's slots.
    fn leftover_files(&self) -> Result<Vec<PathBuf>, StoreError> {
        let base = match &self.layout {
            Layout::SingleFile(file) => file.file_name().map(|n| n.to_string_lossy().into_owned()),
            Layout::Slots(_) => None,
        };
        Ok(self
            .dir_names()?
            .filter(|name| {
                let Some(rest) = name.strip_prefix('.') else {
                    return false;
                };
                let Some(tag) = rest.find(TEMP_TAG).or_else(|| rest.find(TAKEN_TAG)) else {
                    return false;
                };
                let slot = &rest[..tag];
                let is_outcome = parse_outcome_file_name(slot).is_some();
                match &base {
                    Some(base) => slot == base || is_outcome,
                    None => parse_slot_file_name(slot).is_some() || is_outcome,
                }
            })
            .map(|name| self.dir.join(name))
            .collect())
    }

    fn dir_names(&self) -> Result<impl Iterator<Item = String>, StoreError> {
        let read = fs::read_dir(&self.dir).map_err(|source| StoreError::Directory {
            path: self.dir.clone(),
            source,
        })?;
        Ok(read.filter_map(|e| e.ok()?.file_name().into_string().ok()))
    }

    /// Removes a slot judged removable, without losing a marker written since it was judged: the file
    /// is taken first and judged again; if it is no longer removable it goes back. Returns whether
    /// something was removed.
    fn discard(
        &self,
        slot: &Path,
        found: &Found,
        judge: impl Fn(&Found) -> Result<Verdict, Undecided>,
    ) -> Result<bool, StoreError> {
        if let Found::NotAFile(FileKind::Directory) = found {
            // A directory cannot be replaced by a marker while we look at it; remove it if empty.
            return match fs::remove_dir(slot) {
                Ok(()) => Ok(true),
                Err(e) => {
                    tracing::warn!(slot = %slot.display(), error = %e,
                        "a directory sits at the marker slot and cannot be removed; remove it by hand");
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
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let base = slot.file_name().map(|n| n.to_string_lossy().into_owned());
        let base = base.unwrap_or_else(|| "planned-stop".to_owned());
        self.dir
            .join(format!(".{base}{tag}{}-{n}", std::process::id()))
    }
}

/// `planned-stop-<PID>.json`.
pub fn slot_file_name(pid: u32) -> String {
    format!("{SLOT_PREFIX}{pid}{SLOT_SUFFIX}")
}

/// `planned-stop-<PID>.outcome.json`.
pub fn outcome_file_name(pid: u32) -> String {
    format!("{SLOT_PREFIX}{pid}{OUTCOME_SUFFIX}")
}

/// The pid in an outcome file name, or `None` if `name` is not one.
pub fn parse_outcome_file_name(name: &str) -> Option<u32> {
    let digits = name
        .strip_prefix(SLOT_PREFIX)?
        .strip_suffix(OUTCOME_SUFFIX)?;
    parse_slot_file_name(&format!("{SLOT_PREFIX}{digits}{SLOT_SUFFIX}"))
}

/// The pid in a slot file name, or `None` if `name` is not one.
pub fn parse_slot_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(SLOT_PREFIX)?.strip_suffix(SLOT_SUFFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&pid| pid > 0)
}

/// What [`read_slot`] found: [`SlotContent`] with owned bytes.
#[derive(Debug)]
enum Found {
    Absent,
    Bytes(Vec<u8>),
    NotAFile(FileKind),
    Unreadable(io::ErrorKind),
}

impl Found {
    fn content(&self) -> SlotContent<'_> {
        match self {
            Found::Absent => SlotContent::Absent,
            Found::Bytes(b) => SlotContent::Bytes(b),
            Found::NotAFile(k) => SlotContent::NotAFile(*k),
            Found::Unreadable(k) => SlotContent::Unreadable(*k),
        }
    }
}

/// Reads a slot without following a symlink, opening a FIFO or reading more than the limit allows.
fn read_slot(path: &Path) -> Found {
    read_bounded(path, MAX_MARKER_BYTES)
}

/// Reads at most `limit + 1` bytes of a regular file, never following a symlink or opening a FIFO.
fn read_bounded(path: &Path, limit: usize) -> Found {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Found::Absent,
        Err(e) => return Found::Unreadable(e.kind()),
    };
    if let Some(kind) = non_file_kind(&meta) {
        return Found::NotAFile(kind);
    }
    let mut file = match open_no_follow(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Found::Absent,
        Err(e) if is_symlink_loop(&e) => return Found::NotAFile(FileKind::Symlink),
        Err(e) => return Found::Unreadable(e.kind()),
    };
    // The path may have been swapped between lstat and open: judge what was actually opened.
    let size = match file.metadata() {
        Ok(m) => match non_file_kind(&m) {
            Some(kind) => return Found::NotAFile(kind),
            None => m.len(),
        },
        Err(e) => return Found::Unreadable(e.kind()),
    };
    // Read up to the size fstat reported (saving the read that would only confirm the end of the
    // file), never more than the limit plus one byte.
    // A size of 0 may be a lie (procfs and friends): then read up to the limit.
    let want = match usize::try_from(size) {
        Ok(0) | Err(_) => limit + 1,
        Ok(n) => n.min(limit + 1),
    };
    let mut bytes = vec![0u8; want];
    let mut filled = 0;
    while filled < want {
        match file.read(&mut bytes[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Found::Unreadable(e.kind()),
        }
    }
    bytes.truncate(filled);
    Found::Bytes(bytes)
}

fn non_file_kind(meta: &fs::Metadata) -> Option<FileKind> {
    let t = meta.file_type();
    if t.is_symlink() {
        Some(FileKind::Symlink)
    } else if t.is_dir() {
        Some(FileKind::Directory)
    } else if !t.is_file() {
        Some(FileKind::Special)
    } else {
        None
    }
}

#[cfg(unix)]
fn open_no_follow(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).open(path)
}

#[cfg(unix)]
fn is_symlink_loop(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::ELOOP)
}

#[cfg(not(unix))]
fn is_symlink_loop(_: &io::Error) -> bool {
    false
}

/// Writes `bytes` to `path` so that readers see the old file or the new one, never a part: through
/// `temp` (a new file in the same directory), fsync, rename, fsync of the directory.
pub(crate) fn write_atomically(path: &Path, temp: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let result = write_new_file(temp, bytes)
        .and_then(|()| replace(temp, path))
        .and_then(|()| sync_dir(dir));
    if result.is_err() {
        let _ = fs::remove_file(temp);
    }
    result
}

/// Creates `path` (which must not exist, so a symlink planted there is not followed), mode 0600, and
/// writes and syncs `bytes`.
fn write_new_file(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600).custom_flags(libc::O_CLOEXEC);
    }
    let io = |op, source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    };
    let mut file = options.open(path).map_err(|e| io("create", e))?;
    file.write_all(bytes).map_err(|e| io("write", e))?;
    file.sync_all().map_err(|e| io("sync", e))
}

/// Renames `from` over `to`. Where replacing a file that another process has open is refused even
/// after the retries — Windows without POSIX rename semantics (FAT, network shares, Wine) — the old
/// file is deleted first and the rename retried: a reader may then briefly find no file (which it
/// takes as "nothing yet", never as a decision), but never a partial one.
fn replace(from: &Path, to: &Path) -> Result<(), StoreError> {
    match rename(from, to) {
        Err(StoreError::Io { source, .. }) if is_sharing_violation(&source) => {
            tracing::debug!(path = %to.display(), "replace refused while open elsewhere; delete, then rename");
            remove(to)?;
            rename(from, to)
        }
        result => result,
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), StoreError> {
    with_sharing_retries(|| fs::rename(from, to)).map_err(|source| StoreError::Io {
        op: "rename into place",
        path: to.to_path_buf(),
        source,
    })
}

fn remove(path: &Path) -> Result<(), StoreError> {
    match with_sharing_retries(|| fs::remove_file(path)) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(StoreError::Io {
            op: "remove",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// How many times a rename or delete that hits a Windows sharing violation is tried, and how long
/// to wait between tries (about 100 ms in all).
const SHARING_RETRIES: u32 = 10;
const SHARING_RETRY_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// Runs `op`, retrying it briefly while it fails with a sharing violation: on Windows another
/// process that has the file open without `FILE_SHARE_DELETE` (an antivirus scanner, a backup agent,
/// an editor, a stopper's own reader) makes renames and deletes fail with `ERROR_ACCESS_DENIED` (5)
/// or `ERROR_SHARING_VIOLATION` (32) for a moment. After the retries the error is returned: the
/// caller reports it, and a claim or probe never takes it as "no marker".
fn with_sharing_retries<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut tries = 1;
    loop {
        match op() {
            Err(e) if is_sharing_violation(&e) && tries < SHARING_RETRIES => {
                tracing::debug!(error = %e, tries, "sharing violation; retrying");
                tries += 1;
                std::thread::sleep(SHARING_RETRY_WAIT);
            }
            result => return result,
        }
    }
}

/// `ERROR_ACCESS_DENIED` (5) or `ERROR_SHARING_VIOLATION` (32); see "System Error Codes" in the
/// Windows documentation. Never true elsewhere: a Unix rename or unlink does not care who has the
/// file open.
fn is_sharing_violation(e: &io::Error) -> bool {
    cfg!(windows) && matches!(e.raw_os_error(), Some(5) | Some(32))
}

/// Makes a rename durable (see `fsync(2)`: syncing the file does not sync its directory entry).
#[cfg(unix)]
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StoreError::Io {
            op: "sync directory",
            path: dir.to_path_buf(),
            source,
        })
}

/// Windows cannot open a directory as a file without backup semantics; NTFS journals the rename.
#[cfg(not(unix))]
fn sync_dir(_: &Path) -> Result<(), StoreError> {
    Ok(())
}

fn prepare_dir(dir: &Path, allow_shared: bool) -> Result<(), StoreError> {
    let err = |source| StoreError::Directory {
        path: dir.to_path_buf(),
        source,
    };
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(err)?;
    let meta = fs::metadata(dir).map_err(err)?;
    if !meta.is_dir() {
        return Err(StoreError::NotADirectory(dir.to_path_buf()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o022 != 0 && !allow_shared {
            return Err(StoreError::SharedDirectory {
                path: dir.to_path_buf(),
                mode,
            });
        }
    }
    let _ = allow_shared;
    Ok(())
}

fn unreadable(slot: &Path, e: Undecided) -> StoreError {
    StoreError::Unreadable {
        path: slot.to_path_buf(),
        kind: e.0,
    }
}

#[cfg(test)]
mod tests;

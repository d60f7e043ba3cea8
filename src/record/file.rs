//! [`FileRecordStore`]: the record store in a local state directory.
//!
//! The layout and its rules are docs/protocol.md's "The state directory": a stop's items in one
//! batch file, leases in lease files, an item's own file only when it is held aside or released,
//! acknowledgements in their own directory, every operation under one `flock` (a lock held longer
//! than [`LOCK_WAIT`] is an error, never a wedge). Every write is a new exclusive temporary file,
//! fsync, rename and directory fsync; nothing is opened through a symlink, FIFO or device, and
//! another user's file is never read.
//!
//! Leases are judged on this host's wall clock, their owners looked up by pid and start
//! fingerprint: the directory is one host's (a fleet uses `planned-stop-postgres`).
//! The work is blocking, so inside a runtime it runs on the blocking threads, never on the event
//! loop.

mod ack;
mod aside;
mod batch;
mod contract;
mod disk;
mod leases;
mod summary;
mod view;

use disk::{in_state_dir_words, older_than};

use summary::read_record_file;
pub(crate) use summary::record_path;

use super::lease::{self, Lease, Liveness, Owner};
use super::store::{ItemState, Leased, lease_end, oldest_first};
use super::{RecordError, StopRecord};
use crate::clock::{Clock, SystemClock};
use crate::store::files as fsx;
use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use batch::BATCHES_DIR_NAME;

/// The directory of the item files inside the state directory.
pub(crate) const ITEMS_DIR_NAME: &str = "planned-stop-items";
/// The directory acknowledged items are moved to, inside the state directory.
pub(crate) const ACKED_DIR_NAME: &str = "planned-stop-acked";
/// The lock file inside the state directory.
pub(crate) const LOCK_FILE_NAME: &str = ".planned-stop.lock";
/// How long an operation waits for another process's lock on the state directory.
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(2);
/// Largest item or lease file read, in bytes: every item the runner accepts
/// ([`crate::record::MAX_ITEM_BYTES`] of JSON) with room for its envelope (id, participant, owner), and a
/// persist refuses to write a larger file, so whatever is written can be read back.
pub(crate) const MAX_FILE_BYTES: usize = crate::record::MAX_ITEM_BYTES + 64 * 1024;
/// How long an acknowledgement is kept (so `records list` can show it, and a second
/// acknowledgement of the same item is refused), and how old a leftover temporary file must be
/// before it is removed.
pub(crate) const ACK_KEEP: Duration = Duration::from_secs(24 * 3600);

const ITEM: &str = ".item.json";
const LEASE: &str = ".lease.json";

/// Whether a state directory that group or others can write is accepted.
///
/// A choice with a name rather than a positional `true`:
///
/// ```compile_fail,E0308
/// planned_stop::record::FileRecordStore::open("/var/lib/app", true);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Sharing {
    /// Refused (the default): whoever can write there could plant work for the service to
    /// resume.
    #[default]
    Refused,
    /// Accepted, for a directory shared on purpose (a group of service accounts). A directory
    /// that belongs to another user than this process's or root is refused either way.
    Allowed,
}

type LivenessProbe = Arc<dyn Fn(&Owner) -> Liveness + Send + Sync>;

/// The record store in a state directory on this host. See the module docs.
///
/// ```
/// # let dir = tempfile::tempdir().unwrap();
/// use planned_stop::record::{FileRecordStore, RecordStore, Sharing};
/// let store = FileRecordStore::open(dir.path().join("state"), Sharing::Refused).unwrap();
/// let items = tokio::runtime::Builder::new_current_thread().build().unwrap()
///     .block_on(store.list()).unwrap();
/// assert!(items.is_empty(), "nothing stopped here yet");
/// ```
#[derive(Clone)]
pub struct FileRecordStore {
    dir: PathBuf,
    items: PathBuf,
    batches_dir: PathBuf,
    acked: PathBuf,
    /// The batches read so far (immutable once written), shared by the store's clones.
    batches: Arc<std::sync::Mutex<batch::Batches>>,
    clock: Arc<dyn Clock>,
    liveness: LivenessProbe,
    allow_shared: bool,
    /// `false` for a store opened to look ([`FileRecordStore::open_existing`]): it creates and
    /// removes nothing.
    writable: bool,
    /// Told of each file-system step the store takes: nothing does anything with it but the
    /// crash-consistency tests ([`FileRecordStore::observed`]).
    observer: Arc<dyn fsx::Observer>,
}

impl std::fmt::Debug for FileRecordStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileRecordStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl FileRecordStore {
    /// Opens the store in `dir`, creating it (and its item directory) mode 0700. A directory that
    /// group or others can write is refused unless `sharing` is [`Sharing::Allowed`] (whoever can
    /// write there can plant work for this service to resume), and so is one that belongs to
    /// another user than this process's or root, and one this process cannot write (a read-only
    /// mount: it could neither lease nor record).
    pub fn open(dir: impl Into<PathBuf>, sharing: Sharing) -> Result<FileRecordStore, RecordError> {
        let store = FileRecordStore::at(dir.into(), sharing, true);
        store.prepare()?;
        store.probe_writable()?;
        Ok(store)
    }

    /// Makes sure this process can write here (a read-only mount, a directory without write
    /// permission) when the store opens, rather than at the first lease, which would resume
    /// nothing, and the first stop, which could record nothing.
    fn probe_writable(&self) -> Result<(), RecordError> {
        self.locked(|| {
            let probe = self
                .items
                .join(format!(".planned-stop-probe-{}", std::process::id()));
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&probe)
                .and_then(|_| fs::remove_file(&probe))
                .map_err(|source| RecordError::Io {
                    op: "write in the state directory (read-only?)",
                    path: self.items.clone(),
                    source,
                })
        })
    }

    /// Opens an existing store to look at it: creates nothing (no directory, no lock file) and
    /// removes nothing (no leftovers swept), so an operator's `records list` or `status` never
    /// changes a service's state directory. Its writing operations fail. The directory's policy
    /// is checked as by [`FileRecordStore::open`].
    pub fn open_existing(
        dir: impl Into<PathBuf>,
        sharing: Sharing,
    ) -> Result<FileRecordStore, RecordError> {
        let store = FileRecordStore::at(dir.into(), sharing, false);
        let meta = fs::metadata(&store.dir).map_err(|source| RecordError::Io {
            op: "open the state directory",
            path: store.dir.clone(),
            source,
        })?;
        if !meta.is_dir() {
            return Err(in_state_dir_words(crate::store::StoreError::NotADirectory(
                store.dir.clone(),
            )));
        }
        fsx::check_own_dir(&store.dir)?;
        Ok(store)
    }

    fn at(dir: PathBuf, sharing: Sharing, writable: bool) -> FileRecordStore {
        let allow_shared = sharing == Sharing::Allowed;
        FileRecordStore {
            items: dir.join(ITEMS_DIR_NAME),
            batches_dir: dir.join(BATCHES_DIR_NAME),
            acked: dir.join(ACKED_DIR_NAME),
            batches: Arc::default(),
            dir,
            clock: Arc::new(SystemClock),
            liveness: Arc::new(crate::record::host::liveness_here),
            allow_shared,
            writable,
            observer: Arc::new(fsx::Unobserved),
        }
    }

    /// Creates the directories (0700) and checks their policy: at open, and again at each stop
    /// (they may have been removed, opened up or given away meanwhile).
    fn prepare(&self) -> Result<(), RecordError> {
        // Each directory's own entry is made durable too, not only what it holds.
        for dir in [&self.dir, &self.items, &self.batches_dir, &self.acked] {
            fsx::prepare_own_dir(dir, self.allow_shared).map_err(in_state_dir_words)?;
            fsx::sync_dir_of(dir, &*self.observer)?;
        }
        Ok(())
    }

    fn refuse_read_only(&self) -> Result<(), RecordError> {
        if self.writable {
            return Ok(());
        }
        Err(RecordError::Io {
            op: "change (opened to look only)",
            path: self.dir.clone(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        })
    }

    /// Reads the last stop record a file store keeps in `state_dir` (the summary for people; the
    /// items are kept one by one), without opening the store: nothing is created, locked or
    /// removed. `None` when no stop was recorded there; an error for a record that is too large,
    /// not JSON of this kind, not a regular file, or not this user's.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use planned_stop::record::FileRecordStore;
    /// assert!(FileRecordStore::read_last_stop(dir.path()).unwrap().is_none());
    /// ```
    pub fn read_last_stop(state_dir: &Path) -> Result<Option<StopRecord>, RecordError> {
        read_record_file(&record_path(state_dir))
    }

    /// Reads lease times from `clock` instead of the system clock. A test seam, with the `testing`
    /// feature.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    #[must_use]
    pub fn clock(self, clock: Arc<dyn Clock>) -> FileRecordStore {
        self.with_clock(clock)
    }

    /// Tells `observer` of every file-system step from now on (the crash-consistency tests).
    #[cfg(test)]
    pub(crate) fn observed(mut self, observer: Arc<dyn fsx::Observer>) -> FileRecordStore {
        self.observer = observer;
        self
    }

    /// The service's clock, handed down by its builder.
    pub(crate) fn with_clock(mut self, clock: Arc<dyn Clock>) -> FileRecordStore {
        self.clock = clock;
        self
    }

    /// Decides whether a lease's owner still runs with `probe` instead of looking the process up
    /// on this host. A test seam, with the `testing` feature.
    #[cfg(feature = "testing")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
    #[must_use]
    pub fn liveness(
        mut self,
        probe: impl Fn(&Owner) -> Liveness + Send + Sync + 'static,
    ) -> FileRecordStore {
        self.liveness = Arc::new(probe);
        self
    }

    /// The state directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub(super) fn path(&self, id: &str, kind: &str) -> PathBuf {
        self.items.join(format!("{id}{kind}"))
    }

    /// Runs `op` holding the directory's lock. A store opened to look takes the lock when the
    /// lock file exists and creates none (without one, no writer has run here yet).
    fn locked<T>(&self, op: impl FnOnce() -> Result<T, RecordError>) -> Result<T, RecordError> {
        let path = self.dir.join(LOCK_FILE_NAME);
        let opened = if self.writable {
            fsx::open_lock_file(&path)
        } else {
            match fsx::open_existing_lock_file(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => return op(),
                opened => opened,
            }
        };
        let file = opened.map_err(|source| RecordError::Io {
            op: "open the lock file",
            path: path.clone(),
            source,
        })?;
        let started = Instant::now();
        // Short waits first: operations hold the lock for about a millisecond.
        let mut wait = Duration::from_micros(20);
        loop {
            match file.try_lock() {
                Ok(()) => break,
                Err(fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_millis(1));
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(RecordError::Locked {
                        path,
                        waited: LOCK_WAIT,
                    });
                }
                Err(fs::TryLockError::Error(source)) => {
                    return Err(RecordError::Io {
                        op: "lock",
                        path,
                        source,
                    });
                }
            }
        }
        let result = op();
        drop(file); // closing releases the lock
        result
    }

    /// Removes acknowledged items older than [`ACK_KEEP`] (at each stop: rare, and off the
    /// resume's path).
    fn sweep_acked(&self) -> Result<(), RecordError> {
        let Ok(entries) = fs::read_dir(&self.acked) else {
            return Ok(());
        };
        let old: Vec<fs::DirEntry> = (entries.flatten())
            .filter(|entry| older_than(entry, ACK_KEEP))
            .collect();
        if old.is_empty() {
            // Nothing to sweep: the batches are not read for it.
            return Ok(());
        }
        let batches = self.batches()?;
        for entry in old {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let id = name
                .strip_suffix(ITEM)
                .or_else(|| name.strip_suffix(batch::DROPPED));
            // While a batch holds the item, its acknowledgement is what keeps it done.
            if id.is_some_and(|id| batches.holds(id)) {
                continue;
            }
            self.remove_file(&entry.path())?;
        }
        Ok(())
    }

    /// Writes the items from the record as it is, never copying them (100,000 items are
    /// 100,000 JSON values, and the runner keeps the record for the stop's outcome).
    fn persist_now(&self, stopper: &Owner, record: &StopRecord) -> Result<(), RecordError> {
        self.refuse_read_only()?;
        // Again at the stop: the directories may have been removed, opened up or given away.
        self.prepare()?;
        // What is stored, and which ids have an item or a lease file of their own.
        let (existing, own_items, own_leases) = if record.unfinished.is_empty() {
            Default::default()
        } else {
            self.states_and_files()?
        };
        // The summary for people, made now; written last.
        let summary = serde_json::to_vec(&record.summary());
        let mut kept = Vec::with_capacity(record.unfinished.len());
        let mut handed_back = Vec::new();
        for unfinished in &record.unfinished {
            let id =
                super::store::checked_item(unfinished).map_err(|reason| RecordError::Invalid {
                    path: self.items.clone(),
                    reason,
                })?;
            let Some(counts) =
                super::store::counts_after_persist(stopper, unfinished, existing.get(id))
            else {
                continue;
            };
            if unfinished.resumed {
                handed_back.push(id.to_owned());
            }
            kept.push((id, unfinished, counts));
        }
        // A handed-back item's lease in a lease batch ends by a release (lease batches only:
        // the items written below change none of them).
        let leased_in_batches: Vec<String> = if handed_back.is_empty() {
            Vec::new()
        } else {
            let batches = self.batches()?;
            (handed_back.iter())
                .filter(|id| batches.best_lease(id).is_some())
                .cloned()
                .collect()
        };
        // Every item in one write and one sync (a few, for very many): durable before anything
        // else changes. A handed-back item's batch version counts over its older ones (one
        // attempt more), so its own file and lease can go, all made durable by one sync: a
        // lease that came back after a power loss would count a failure that never happened.
        self.write_batches(kept.iter().map(|(id, unfinished, counts)| aside::Line {
            id: *id,
            participant: unfinished.participant.as_str(),
            item: &unfinished.item,
            stopped_by: stopper,
            stopped_at: record.finished_at,
            attempts: counts.attempts,
            failures: counts.failures,
            last_failure: counts.last_failure.as_deref(),
            held_aside: None,
        }))?;
        let release = Lease::new(stopper.clone(), self.clock.now(), self.clock.now());
        self.write_leases(release, leased_in_batches, true)?;
        // Only the files there are: 100,000 removals of files that do not exist cost seconds.
        for id in &handed_back {
            if own_items.contains(id) {
                self.remove_file(&self.path(id, ITEM))?;
            }
            if own_leases.contains(id) {
                self.remove_file(&self.path(id, LEASE))?;
            }
        }
        if let Some(id) = handed_back.first() {
            fsx::sync_dir_of(&self.path(id, LEASE), &*self.observer)?;
        }
        // The summary is for people: the items above are durable whatever happens to it, so a
        // summary that cannot be written is a warning, never a lost stop.
        let path = record_path(&self.dir);
        let written = summary
            .map_err(|e| RecordError::Invalid {
                path: path.clone(),
                reason: e.to_string(),
            })
            .and_then(|bytes| disk::write_unique(&path, &bytes, true, &*self.observer));
        if let Err(e) = written {
            tracing::warn!(error = %crate::error_chain::ErrorChain(&e),
                "cannot write the stop's summary for people; the unfinished items are durable");
        }
        if let Err(e) = self.collect_garbage() {
            tracing::warn!(error = %crate::error_chain::ErrorChain(&e),
                "cannot sweep old batches and acknowledgements; the stop goes on");
        }
        Ok(())
    }

    /// A summary written before items had ids (an earlier version) still holds its items:
    /// turn them into item files once, so upgrading loses nothing.
    fn import_legacy(&self) -> Result<(), RecordError> {
        let mut record = match FileRecordStore::read_last_stop(&self.dir) {
            Ok(Some(record)) => record,
            Ok(None) => return Ok(()),
            Err(e) => {
                // Only the summary for people: the items are in their own files.
                tracing::warn!(error = %crate::error_chain::ErrorChain(&e),
                    "cannot read the last stop's summary; skipped");
                return Ok(());
            }
        };
        if record.unfinished.iter().all(|u| u.id.is_some()) {
            return Ok(());
        }
        let stopper = Owner::new(super::host::local_host(), record.pid, 0);
        for (index, unfinished) in record.unfinished.iter_mut().enumerate() {
            if unfinished.id.is_none() {
                unfinished.id = Some(lease::item_id(&stopper, record.finished_at, index));
            }
        }
        tracing::info!(
            items = record.unfinished.len(),
            "importing the items of an earlier version's stop record"
        );
        self.persist_now(&stopper, &record)
    }

    fn lease_now(
        &self,
        owner: &Owner,
        max: usize,
        lease_for: Duration,
    ) -> Result<Vec<Leased>, RecordError> {
        self.refuse_read_only()?;
        self.import_legacy()?;
        let now = self.clock.now();
        // Any duration, however large, saturates at the end of time rather than overflowing.
        let lease = Lease::new(owner.clone(), now, lease_end(now, lease_for));
        let (states, own, own_leases) = self.states_and_files()?;
        let known: HashSet<String> = states.keys().cloned().collect();
        let mut states: Vec<ItemState> = states.into_values().collect();
        oldest_first(&mut states);
        let mut leased = Vec::new();
        // Failures counted at the take-over: in a batch of their own (one sync), or, for an
        // item with a file of its own (which a batch of equal attempts would not outrank), there.
        let (mut failed, mut failed_own) = (Vec::new(), Vec::new());
        for state in states {
            if leased.len() >= max {
                break;
            }
            let liveness = state
                .lease
                .as_ref()
                .map_or(Liveness::Dead, |l| (self.liveness)(&l.owner));
            if state.quarantined.is_some()
                || !lease::is_offered(state.lease.as_ref(), now, liveness)
            {
                continue;
            }
            let mut item = state.item.clone();
            if let Some(why) = lease::failure_at_takeover(state.lease.as_ref(), liveness) {
                tracing::info!(id = %item.id, why, "offering again an item whose holder is gone or whose lease lapsed: a failed attempt");
                item.failures = item.failures.saturating_add(1);
                item.last_failure = Some(why.clone());
                if own.contains(&item.id) {
                    failed_own.push((state, why));
                } else {
                    failed.push(aside::ItemFile {
                        item: item.clone(),
                        held_aside: None,
                    });
                }
            }
            leased.push(Leased {
                item,
                lease: lease.clone(),
            });
        }
        let ids = leased.iter().map(|l| l.item.id.clone()).collect();
        // The lease first: a crash between the two leaves this life's own failure to count.
        self.write_leases(lease, ids, false)?;
        self.write_batches(
            failed
                .iter()
                .map(|f| f.line(&f.item.stopped_by, f.item.stopped_at)),
        )?;
        for (mut state, why) in failed_own {
            self.count_failure(&mut state, why)?;
        }
        self.tidy_leases(&known, &own_leases)?;
        Ok(leased)
    }

    fn renew_now(
        &self,
        owner: &Owner,
        ids: &[String],
        lease_for: Duration,
    ) -> Result<Vec<String>, RecordError> {
        self.refuse_read_only()?;
        let now = self.clock.now();
        let (states, _, own_leases) = self.states_and_files()?;
        let renewed: Vec<String> = ids
            .iter()
            .filter(|id| {
                states
                    .get(id.as_str())
                    .is_some_and(|s| lease::holds(s.lease.as_ref(), owner))
            })
            .cloned()
            .collect();
        let lease = Lease::new(owner.clone(), now, lease_end(now, lease_for));
        self.write_leases(lease, renewed.clone(), false)?;
        let known: HashSet<String> = states.into_keys().collect();
        self.tidy_leases(&known, &own_leases)?;
        Ok(renewed)
    }

    fn remove_now(&self, id: &str) -> Result<bool, RecordError> {
        self.refuse_read_only()?;
        if self.valid(id).is_none() {
            return Ok(false);
        }
        let existed = self.version(id)?.is_some();
        // A batch is never rewritten: a drop of an item one holds is a file of its own.
        if existed && self.batches()?.holds(id) {
            self.tombstone(id)?;
        }
        // The item first: once it is gone for good, a leftover lease is swept as an orphan.
        self.remove_durably(&self.path(id, ITEM))?;
        self.remove_file(&self.path(id, LEASE))?;
        Ok(existed)
    }

    pub(super) fn valid(&self, id: &str) -> Option<()> {
        lease::is_valid_item_id(id).then_some(())
    }
}

/// A file in the item directory that looks like an item but cannot be one by its name: never
/// resumed, so an operator must hear of it (its path and why; never its contents).
fn misnamed(path: &Path, why: &str) {
    tracing::warn!(path = %path.display(), why,
        "a file in the item directory is not an item, and is never resumed: if it holds one, \
        rename it to the id it holds followed by .item.json; otherwise remove it");
}

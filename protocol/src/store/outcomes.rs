//! The outcome files, `DIR/planned-stop-<PID>.outcome.json`: how a stopper that knows only the
//! directory and the pid follows its target; and the presence files,
//! `DIR/planned-stop-<PID>.watching.json`, how it knows the target watches the directory at all
//! (see `crate::outcome`).

use super::files::{
    Found, Observer, Owned, Readers, Unobserved, read_bounded_with_owner, remove, write_replacing,
    write_replacing_for,
};
use super::naming::{
    TEMP_TAG, outcome_file_name, parse_outcome_file_name, parse_presence_file_name,
    presence_file_name,
};
use super::{MarkerStore, StoreError};
use crate::ProcessState;
use crate::identity::{ProcessIdentity, user_ids_of};
use crate::outcome::{MAX_OUTCOME_BYTES, Outcome, Presence, may_speak_for};
use std::io;
use std::path::{Path, PathBuf};

/// The bytes of the file at `path` and the uid that owns it, when it has no other name (a hard
/// link of a genuine file, placed in a directory its process never announced, proves nothing
/// about that directory); `None` otherwise, with a warning.
fn read_with_owner(path: &Path, pid: u32) -> Option<(Vec<u8>, Option<u32>)> {
    let (found, Owned { owner, links }) = read_bounded_with_owner(path, MAX_OUTCOME_BYTES);
    let Found::Bytes(bytes) = found else {
        return None;
    };
    if links > 1 {
        tracing::warn!(path = %path.display(), pid, links,
            "a file names this process but has other names too (hard links): ignored, it \
            cannot prove it was written for this directory (planted?)");
        return None;
    }
    Some((bytes, owner))
}

/// How many processes' users a store remembers; past it, it starts over (a stopper follows one
/// target, a status listing a directory's).
const USERS_REMEMBERED: usize = 1024;

/// Whether a write failed because the file system (or the user's quota) is full.
fn is_storage_full(e: &StoreError) -> bool {
    matches!(e, StoreError::Io { source, .. }
        if matches!(source.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded))
}

/// This process's effective uid (0 where there are none: Windows, where owners never count).
fn reader_uid() -> u32 {
    #[cfg(unix)]
    return rustix::process::geteuid().as_raw();
    #[cfg(not(unix))]
    return 0;
}

impl MarkerStore {
    /// Where the runner of `pid` writes its [`Outcome`]: `DIR/planned-stop-<PID>.outcome.json`, in
    /// both layouts.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.outcome_path(42), dir.path().join("planned-stop-42.outcome.json"));
    /// ```
    pub fn outcome_path(&self, pid: u32) -> PathBuf {
        self.dir.join(outcome_file_name(pid))
    }

    /// Writes the runner's outcome file, atomically. An accepted stop keeps room for its final
    /// outcome (a reserve file as large as the largest outcome): a directory that fills during
    /// the drain must not leave a stopper with only "draining" and a gone process, which it
    /// could only report as killed. The final outcome frees the reserve when the directory is
    /// full, and in any case once it is written.
    ///
    /// Only a final outcome is synced: it outlives the process. One that says how far a stop has
    /// got matters only while the process runs, which a power failure ends too, and the runner
    /// writes it on the thread that runs the drain, where an fsync on a busy disk stalled every
    /// actor for up to a second.
    #[doc(hidden)] // the service's side, for planned-stop's own crates: what only a running service may say
    pub fn write_outcome(&self, outcome: &Outcome) -> Result<PathBuf, StoreError> {
        self.write_outcome_observed(outcome, &Unobserved)
    }

    /// [`MarkerStore::write_outcome`], each file step told to `observer`.
    pub(crate) fn write_outcome_observed(
        &self,
        outcome: &Outcome,
        observer: &dyn Observer,
    ) -> Result<PathBuf, StoreError> {
        let path = self.outcome_path(outcome.pid);
        let durable = outcome.state.is_final();
        let written = match self.write_json(path.clone(), outcome, durable, observer) {
            Err(e) if durable && is_storage_full(&e) => {
                self.release_outcome_room(outcome.pid);
                self.write_json(path, outcome, durable, observer)
            }
            written => written,
        };
        if outcome.state == ProcessState::Draining {
            if let Err(e) = self.reserve_outcome_room(outcome.pid) {
                tracing::warn!(error = %crate::error_chain::ErrorChain(&e), "cannot keep room \
                    for the final outcome; a directory that fills during the drain may hide it");
            }
        } else if outcome.state.is_final() {
            self.release_outcome_room(outcome.pid);
        }
        written
    }

    /// Removes the reserve (a failure only delays it to the sweep).
    fn release_outcome_room(&self, pid: u32) {
        if let Err(e) = remove(&self.outcome_reserve_path(pid)) {
            tracing::debug!(error = %crate::error_chain::ErrorChain(&e), "cannot remove the \
                outcome's reserve; the sweep removes it");
        }
    }

    /// Where an accepted stop keeps room for its final outcome: named as a leftover of the
    /// outcome file, so a sweep removes it once old if its process died.
    fn outcome_reserve_path(&self, pid: u32) -> PathBuf {
        self.dir
            .join(format!(".{}{TEMP_TAG}reserve", outcome_file_name(pid)))
    }

    /// Writes the reserve: as many bytes as the largest outcome, so the file system has given
    /// them to it. Through a new file renamed into place, as every write here, so a symlink
    /// planted under the reserve's name is replaced, never followed (not synced: a crash loses
    /// only the reserve).
    fn reserve_outcome_room(&self, pid: u32) -> Result<(), StoreError> {
        let path = self.outcome_reserve_path(pid);
        // Named as a leftover of the outcome file, so one a crash leaves is swept.
        let temp = self.private_name(&self.outcome_path(pid), TEMP_TAG);
        write_replacing(&path, &temp, &vec![b' '; MAX_OUTCOME_BYTES], false)
    }

    /// Where the runner of `pid` announces that it watches this directory:
    /// `DIR/planned-stop-<PID>.watching.json`, in both layouts.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.presence_path(42), dir.path().join("planned-stop-42.watching.json"));
    /// ```
    pub fn presence_path(&self, pid: u32) -> PathBuf {
        self.dir.join(presence_file_name(pid))
    }

    /// Writes the runner's presence file, atomically; not synced, as it matters only while the
    /// process runs (see [`MarkerStore::write_outcome`]).
    #[doc(hidden)] // the service's side, for planned-stop's own crates: what only a running service may say
    pub fn write_presence(&self, presence: &Presence) -> Result<PathBuf, StoreError> {
        self.write_json(
            self.presence_path(presence.pid),
            presence,
            false,
            &Unobserved,
        )
    }

    /// Removes the presence file of `pid` if it is `identity`'s (a process never removes the
    /// announcement of a later owner of its pid); a missing file is not an error.
    #[doc(hidden)] // the service's side, for planned-stop's own crates: what only a running service may say
    pub fn remove_presence(&self, identity: &ProcessIdentity) -> Result<(), StoreError> {
        match self.read_presence(identity.pid) {
            Some(presence) if presence.is_from(identity) => {
                remove(&self.presence_path(identity.pid))
            }
            _ => Ok(()),
        }
    }

    /// Reads the presence file of `pid`; `None` when there is none, it is not one, it names
    /// another pid inside, or it was written by a user the process `pid` does not run as (nor
    /// root): a file another user planted never speaks for a process (see protocol.md, "Whose
    /// files count"). Check [`Presence::is_from`] before trusting it.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.read_presence(42), None);
    /// ```
    pub fn read_presence(&self, pid: u32) -> Option<Presence> {
        self.read_speaking(&self.presence_path(pid), pid, Presence::parse, |p| {
            (p.pid, p.start)
        })
    }

    /// The file at `path` as `parse` reads it, when it names `pid` (`named`: the pid and start
    /// inside) and its owner may speak for the process it names ([`may_speak_for`]: that
    /// process's user, or root); `None` otherwise, with a warning for another user's file (a
    /// planted file must never choose whom a stopper signals).
    fn read_speaking<T>(
        &self,
        path: &Path,
        pid: u32,
        parse: fn(&[u8]) -> Option<T>,
        named: fn(&T) -> (u32, u64),
    ) -> Option<T> {
        let (bytes, owner) = read_with_owner(path, pid)?;
        let value = parse(&bytes).filter(|v| named(v).0 == pid)?;
        let users = self.users_of(pid, named(&value).1);
        if may_speak_for(owner, users.as_deref(), reader_uid()) {
            return Some(value);
        }
        tracing::warn!(path = %path.display(), pid, owner, users = ?users,
            "a file names this process but another user wrote it: ignored, it cannot say who \
            watches or how a stop went (planted?)");
        None
    }

    /// The users (real and saved uids) of the process `pid` that started at `start`: read now
    /// while it runs, and remembered by this store (and its clones), so that once it is gone the
    /// files it wrote as its own user still speak for it. A target may answer a stop and exit
    /// before its stopper looks again: the stopper saw it running when it wrote the request.
    /// `None` for a process this store never saw running.
    pub(crate) fn users_of(&self, pid: u32, start: u64) -> Option<Vec<u32>> {
        let now =
            user_ids_of(pid).filter(|_| ProcessIdentity::of(pid).map(|i| i.start) == Some(start));
        let mut seen = self
            .users_seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match now {
            Some(users) => {
                if seen.len() >= USERS_REMEMBERED && !seen.contains_key(&(pid, start)) {
                    seen.clear();
                }
                seen.insert((pid, start), users.clone());
                Some(users)
            }
            None => seen.get(&(pid, start)).cloned(),
        }
    }

    /// Whether the process `identity` has announced in this directory that it reads its markers
    /// here: a presence file, or an outcome file (a stop already under way), of its own. `false`
    /// for a process that is not a planned-stop service watching this directory (a wrong
    /// directory, another program), for one whose files in it another user wrote, and for a
    /// service of an older version of the protocol, which reads markers without announcing.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// let me = planned_stop_protocol::ProcessIdentity::current().unwrap();
    /// assert!(!store.is_watched_by(&me));
    /// ```
    pub fn is_watched_by(&self, identity: &ProcessIdentity) -> bool {
        self.read_presence(identity.pid)
            .is_some_and(|p| p.is_from(identity))
            || self
                .read_outcome(identity.pid)
                .is_some_and(|o| o.is_from(identity))
    }

    /// The presence or outcome file of `pid` that this user may not read (permission denied:
    /// the file's mode, or a directory it cannot enter), if there is one. Whether the process
    /// watches this directory then cannot be told — which is not the same as "it does not", and
    /// a stopper says so rather than suspect a wrong pid.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.unreadable_announcement(42), None, "nothing there: nothing denied");
    /// ```
    pub fn unreadable_announcement(&self, pid: u32) -> Option<PathBuf> {
        [self.presence_path(pid), self.outcome_path(pid)]
            .into_iter()
            .find(|path| crate::store::files::permission_denied(path))
    }

    /// Serialises `value` and writes it to `path` atomically, synced when `durable`.
    fn write_json(
        &self,
        path: PathBuf,
        value: &impl serde::Serialize,
        durable: bool,
        observer: &dyn Observer,
    ) -> Result<PathBuf, StoreError> {
        let bytes = serde_json::to_vec(value).map_err(|e| StoreError::Io {
            op: "serialise",
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        // Root's files in another user's directory are readable there: that user may ask for a
        // stop and must read the answer (they still count as root's; see `Readers::Directory`).
        let readers = Readers::of(&self.dir, false);
        let temp = self.private_name(&path, TEMP_TAG);
        write_replacing_for(&path, &temp, &bytes, durable, readers, observer)?;
        Ok(path)
    }

    /// Reads the outcome file of `pid`; `None` when there is none, it is not an outcome, it names
    /// another pid inside, or its writer may not speak for the process it names (another user's
    /// file, as for [`MarkerStore::read_presence`]; for a process that is gone, only the files of
    /// the users this store saw it run as, this user's and root's count). Check
    /// [`Outcome::is_from`] before trusting it: the pid may have had an earlier owner.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert_eq!(store.read_outcome(42), None);
    /// ```
    pub fn read_outcome(&self, pid: u32) -> Option<Outcome> {
        self.read_speaking(&self.outcome_path(pid), pid, Outcome::parse, |o| {
            (o.pid, o.start)
        })
    }

    /// Every readable outcome file in the directory, by pid.
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert!(store.outcomes()?.is_empty());
    /// # Ok::<(), planned_stop_protocol::marker::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// The directory cannot be listed (removed, or not readable by this user): an empty list
    /// would say "no outcomes" where the truth is unknown.
    pub fn outcomes(&self) -> Result<Vec<Outcome>, StoreError> {
        Ok(read_each(self.outcome_files()?, |pid| {
            self.read_outcome(pid)
        }))
    }

    /// Every readable presence file in the directory, by pid: the processes that announced they
    /// watch it (check [`Presence::is_from`] against the running process before trusting one;
    /// a killed process leaves its announcement until a sweep).
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let store = planned_stop_protocol::marker::MarkerStore::open(planned_stop_protocol::Layout::Slots(dir.path().into())).unwrap();
    /// assert!(store.presences()?.is_empty());
    /// # Ok::<(), planned_stop_protocol::marker::StoreError>(())
    /// ```
    ///
    /// # Errors
    /// The directory cannot be listed, as for [`MarkerStore::outcomes`].
    pub fn presences(&self) -> Result<Vec<Presence>, StoreError> {
        Ok(read_each(self.presence_files()?, |pid| {
            self.read_presence(pid)
        }))
    }

    /// Outcome files in the directory, with their pids.
    pub(super) fn outcome_files(&self) -> Result<Vec<(u32, PathBuf)>, StoreError> {
        self.pid_files(parse_outcome_file_name)
    }

    /// Presence files in the directory, with their pids.
    pub(super) fn presence_files(&self) -> Result<Vec<(u32, PathBuf)>, StoreError> {
        self.pid_files(parse_presence_file_name)
    }

    fn pid_files(&self, parse: fn(&str) -> Option<u32>) -> Result<Vec<(u32, PathBuf)>, StoreError> {
        Ok(self
            .dir_names()?
            .filter_map(|name| {
                let pid = parse(&name)?;
                Some((pid, self.dir.join(name)))
            })
            .collect())
    }
}

/// What `read` makes of each file, in pid order; files that are not what they should be are left out.
fn read_each<T>(files: Vec<(u32, PathBuf)>, read: impl Fn(u32) -> Option<T>) -> Vec<T> {
    let mut pids: Vec<u32> = files.into_iter().map(|(pid, _)| pid).collect();
    pids.sort_unstable();
    pids.into_iter().filter_map(read).collect()
}

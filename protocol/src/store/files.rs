//! The file-system primitives the store is built on, and nothing else: bounded reads that never
//! follow a link or block on a FIFO, atomic writes (temporary file, fsync, rename, directory fsync),
//! removal and renames that retry Windows sharing violations, and the private directory policy.
//!
//! Platform differences live in the `os` module at the end, one twin per OS.

use super::StoreError;
use crate::judgement::{FileKind, SlotContent};
use crate::schema::MAX_MARKER_BYTES;
use os::{is_symlink_loop, open_no_follow};
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::path::Path;

/// What `read_slot` found: [`SlotContent`] with owned bytes.
#[derive(Debug)]
pub enum Found {
    Absent,
    Bytes(Vec<u8>),
    NotAFile(FileKind),
    Unreadable(io::ErrorKind),
    /// A regular file owned by another user (uid), refused by [`read_private`].
    Foreign(u32),
}

impl Found {
    /// What was found, for a log line: the kind, size or owner, never the bytes.
    pub fn describe(&self, limit: usize) -> String {
        match self {
            Found::Absent => "absent".to_owned(),
            Found::Bytes(b) if b.len() > limit => {
                format!("larger than the limit of {limit} bytes")
            }
            Found::Bytes(b) => format!("{} bytes", b.len()),
            Found::NotAFile(kind) => format!("a {kind:?}, not a regular file"),
            Found::Unreadable(kind) => format!("unreadable ({kind})"),
            Found::Foreign(uid) => format!("owned by uid {uid}, not by this user"),
        }
    }

    pub(super) fn content(&self) -> SlotContent<'_> {
        match self {
            Found::Absent => SlotContent::Absent,
            Found::Bytes(b) => SlotContent::Bytes(b),
            Found::NotAFile(k) => SlotContent::NotAFile(*k),
            Found::Unreadable(k) => SlotContent::Unreadable(*k),
            Found::Foreign(_) => SlotContent::Unreadable(io::ErrorKind::PermissionDenied),
        }
    }
}

/// Reads a slot without following a symlink, opening a FIFO or reading more than the limit allows.
pub(super) fn read_slot(path: &Path) -> Found {
    read_bounded(path, MAX_MARKER_BYTES)
}

/// Reads at most `limit + 1` bytes of a regular file, never following a symlink or opening a FIFO.
pub(super) fn read_bounded(path: &Path, limit: usize) -> Found {
    read_checked(path, limit, false)
}

/// `read_bounded`, and refuses ([`Found::Foreign`]) a file this process's user does not own:
/// files only this user may write (records it will act on).
pub fn read_private(path: &Path, limit: usize) -> Found {
    read_checked(path, limit, true)
}

fn read_checked(path: &Path, limit: usize, own_only: bool) -> Found {
    read_owned(path, limit, own_only).0
}

/// Who owns a file that was read, and how many names it has.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Owned {
    /// Its owner's uid (`None` where files have no owner uid: Windows).
    pub(crate) owner: Option<u32>,
    /// Its hard links: more than one, and another directory may hold the same file.
    pub(crate) links: u64,
}

/// [`read_bounded`], and who owns the file read and how many names it has: for files that speak
/// for a process only when its user wrote them, for the directory they are in.
pub(crate) fn read_bounded_with_owner(path: &Path, limit: usize) -> (Found, Owned) {
    read_owned(path, limit, false)
}

/// What was found, and who owns what was opened (no owner when nothing was, or on Windows).
fn read_owned(path: &Path, limit: usize, own_only: bool) -> (Found, Owned) {
    let none = Owned::default();
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return (Found::Absent, none),
        Err(e) => return (Found::Unreadable(e.kind()), none),
    };
    if let Some(kind) = non_file_kind(&meta) {
        return (Found::NotAFile(kind), none);
    }
    let mut file = match open_no_follow(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return (Found::Absent, none),
        Err(e) if is_symlink_loop(&e) => return (Found::NotAFile(FileKind::Symlink), none),
        Err(e) => return (Found::Unreadable(e.kind()), none),
    };
    // The path may have been swapped between lstat and open: judge what was actually opened.
    let (size, owner) = match file.metadata() {
        Ok(m) => match non_file_kind(&m) {
            Some(kind) => return (Found::NotAFile(kind), none),
            None => match os::foreign_owner(&m) {
                Some(uid) if own_only => {
                    let owned = Owned {
                        owner: Some(uid),
                        links: os::links(&m),
                    };
                    return (Found::Foreign(uid), owned);
                }
                _ => (
                    m.len(),
                    Owned {
                        owner: os::owner_of(&m),
                        links: os::links(&m),
                    },
                ),
            },
        },
        Err(e) => return (Found::Unreadable(e.kind()), none),
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
            Err(e) => return (Found::Unreadable(e.kind()), owner),
        }
    }
    bytes.truncate(filled);
    (Found::Bytes(bytes), owner)
}

/// Whether this user may not open `path` for reading (permission denied), found out without ever
/// blocking: opened non-blocking and never through a symlink, so a FIFO planted there answers at
/// once instead of waiting for a writer.
pub(crate) fn permission_denied(path: &Path) -> bool {
    os::open_no_follow(path).is_err_and(|e| e.kind() == io::ErrorKind::PermissionDenied)
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

/// Writes `bytes` to `path` so that readers see the old file or the new one, never a part: through
/// `temp` (a new file in the same directory), then rename; with `durable`, an fsync of the file
/// before and of the directory after, so a power failure cannot bring the old one back (without,
/// for files whose loss only repeats work, such as a lease, it may).
pub(crate) fn write_replacing(
    path: &Path,
    temp: &Path,
    bytes: &[u8],
    durable: bool,
) -> Result<(), StoreError> {
    write_replacing_for(path, temp, bytes, durable, Readers::Writer, &Unobserved)
}

/// `write_replacing`, each step told to `observer`.
pub fn write_replacing_observed(
    path: &Path,
    temp: &Path,
    bytes: &[u8],
    durable: bool,
    observer: &dyn Observer,
) -> Result<(), StoreError> {
    write_replacing_for(path, temp, bytes, durable, Readers::Writer, observer)
}

/// Who may read a new file besides the process that writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readers {
    /// Its writer only: mode 0600.
    Writer,
    /// Its new owner (uid, gid), to whom it is given before it takes its place, still mode 0600:
    /// root writing a marker for a service that runs as the directory's owner.
    GivenTo(u32, u32),
    /// Whoever can reach the directory: mode 0644, still the writer's. Root's presence and
    /// outcome files in another user's directory: that user, who may ask for a stop there, can
    /// read the answer, and the files still count as root's (`outcome::may_speak_for`); the
    /// directory's own mode decides who can reach them.
    Directory,
}

impl Readers {
    /// Who must read what this process writes into `dir`: when it runs as root and `dir` is
    /// another user's, that user — `GivenTo` them for a file they act on (a marker), `Directory`
    /// for one they only read (presence, outcome). `Writer` otherwise.
    pub(crate) fn of(dir: &Path, acted_on: bool) -> Readers {
        match os::reader_of(dir) {
            Some((uid, gid)) if acted_on => Readers::GivenTo(uid, gid),
            Some(_) => Readers::Directory,
            None => Readers::Writer,
        }
    }
}

/// [`write_replacing`] for `readers` other than this process's user (see [`Readers`]), each step
/// told to `observer`.
pub(crate) fn write_replacing_for(
    path: &Path,
    temp: &Path,
    bytes: &[u8],
    durable: bool,
    readers: Readers,
    observer: &dyn Observer,
) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let result = write_new_file(temp, bytes, durable, readers, observer)
        .and_then(|()| replace(temp, path, observer))
        .and_then(|()| {
            if durable {
                sync_dir(dir, observer)
            } else {
                Ok(())
            }
        });
    if result.is_err() {
        let _ = fs::remove_file(temp);
    }
    result
}

/// Creates `path` (which must not exist, so a symlink planted there is not followed), mode 0600
/// (0644 for [`Readers::Directory`]), and writes and syncs `bytes`.
fn write_new_file(
    path: &Path,
    bytes: &[u8],
    durable: bool,
    readers: Readers,
    observer: &dyn Observer,
) -> Result<(), StoreError> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    os::new_file(&mut options, readers == Readers::Directory);
    let io = |op, source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    };
    let mut file = options.open(path).map_err(|e| io("create", e))?;
    if let Readers::GivenTo(uid, gid) = readers {
        os::give_to(&file, (uid, gid)).map_err(|e| io("give to the directory's owner", e))?;
    }
    file.write_all(bytes).map_err(|e| io("write", e))?;
    if durable {
        file.sync_all().map_err(|e| io("sync", e))?;
    }
    observer.took(Step::Write {
        path,
        bytes,
        synced: durable,
    });
    Ok(())
}

/// Renames `from` over `to`. Where replacing a file that another process has open is refused even
/// after the retries — Windows without POSIX rename semantics (FAT, network shares, Wine) — the old
/// file is deleted first and the rename retried: a reader may then briefly find no file (which it
/// takes as "nothing yet", never as a decision), but never a partial one.
fn replace(from: &Path, to: &Path, observer: &dyn Observer) -> Result<(), StoreError> {
    match rename(from, to, observer) {
        Err(StoreError::Io { source, .. }) if is_sharing_violation(&source) => {
            tracing::debug!(path = %to.display(), "replace refused while open elsewhere; delete, then rename");
            remove_observed(to, observer)?;
            rename(from, to, observer)
        }
        result => result,
    }
}

fn rename(from: &Path, to: &Path, observer: &dyn Observer) -> Result<(), StoreError> {
    rename_file(from, to, observer).map_err(|source| StoreError::Io {
        op: "rename into place",
        path: to.to_path_buf(),
        source,
    })
}

/// Renames `from` to `to` (retrying Windows sharing violations).
pub fn rename_file(from: &Path, to: &Path, observer: &dyn Observer) -> io::Result<()> {
    with_sharing_retries(|| fs::rename(from, to))?;
    observer.took(Step::Rename { from, to });
    Ok(())
}

/// Makes the entries of `dir` durable.
fn sync_dir(dir: &Path, observer: &dyn Observer) -> Result<(), StoreError> {
    os::sync_dir(dir)?;
    observer.took(Step::SyncDir { dir });
    Ok(())
}

/// Removes `path`; one that is already gone is fine.
pub(crate) fn remove(path: &Path) -> Result<(), StoreError> {
    remove_observed(path, &Unobserved)
}

/// `remove`, the step told to `observer`.
pub fn remove_observed(path: &Path, observer: &dyn Observer) -> Result<(), StoreError> {
    match with_sharing_retries(|| fs::remove_file(path)) {
        Ok(()) => {
            observer.took(Step::Remove { path });
            Ok(())
        }
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
pub(super) fn with_sharing_retries<T>(mut op: impl FnMut() -> io::Result<T>) -> io::Result<T> {
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
    os::is_sharing_violation(e)
}

pub(crate) fn prepare_dir(dir: &Path, allow_shared: bool) -> Result<(), StoreError> {
    let err = |source| StoreError::Directory {
        path: dir.to_path_buf(),
        source,
    };
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true);
    os::private_dir(&mut builder);
    if let Err(e) = builder.create(dir) {
        // A file (or a link to one) where the directory should be: say so, not "File exists".
        let file = e.kind() == io::ErrorKind::AlreadyExists
            && fs::metadata(dir).is_ok_and(|meta| !meta.is_dir());
        return Err(match file {
            true => StoreError::NotADirectory(dir.to_path_buf()),
            false => err(e),
        });
    }
    let meta = fs::metadata(dir).map_err(err)?;
    if !meta.is_dir() {
        return Err(StoreError::NotADirectory(dir.to_path_buf()));
    }
    refuse_shared(dir, &meta, allow_shared)
}

/// `prepare_dir` for a directory whose files this process acts on as its own (the state
/// directory): also refused when it belongs to another user than this process's or root, who
/// could rename or replace whatever it holds even though they cannot read it.
pub fn prepare_own_dir(dir: &Path, allow_shared: bool) -> Result<(), StoreError> {
    // The same rule as for the marker directory, said in the state directory's words and flag.
    prepare_dir(dir, allow_shared).map_err(|e| match e {
        StoreError::SharedDirectory { path, mode } => {
            StoreError::SharedStateDirectory { path, mode }
        }
        other => other,
    })?;
    check_own_dir(dir)
}

/// The owner half of [`prepare_own_dir`], for a directory that must already exist.
pub fn check_own_dir(dir: &Path) -> Result<(), StoreError> {
    let meta = fs::metadata(dir).map_err(|source| StoreError::Directory {
        path: dir.to_path_buf(),
        source,
    })?;
    match os::foreign_owner(&meta) {
        Some(owner) if owner != 0 => Err(StoreError::ForeignDirectory {
            path: dir.to_path_buf(),
            owner,
        }),
        _ => Ok(()),
    }
}

/// Makes a rename into or out of `path`'s directory durable.
pub fn sync_dir_of(path: &Path, observer: &dyn Observer) -> Result<(), StoreError> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir, observer),
        _ => sync_dir(Path::new("."), observer),
    }
}

/// Opens (creating it, mode 0600, never through a symlink) a file to take an advisory lock on.
pub fn open_lock_file(path: &Path) -> io::Result<fs::File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    os::new_file(&mut options, false);
    open_lock(path, options)
}

/// Opens an existing lock file to lock it without creating one (a look that must change nothing).
pub fn open_existing_lock_file(path: &Path) -> io::Result<fs::File> {
    let mut options = OpenOptions::new();
    options.read(true);
    open_lock(path, options)
}

/// Opens `path` with `options`, never through a symlink or a FIFO, and only if it is a file.
fn open_lock(path: &Path, mut options: OpenOptions) -> io::Result<fs::File> {
    os::no_follow(&mut options);
    let file = options.open(path)?;
    match non_file_kind(&file.metadata()?) {
        None => Ok(file),
        Some(kind) => Err(io::Error::other(format!(
            "a {kind:?} is in the way of the lock file"
        ))),
    }
}

/// Checks again that `dir` is private (see [`prepare_dir`]): whoever can write there can stop
/// the service, and the mode can change while it runs.
pub(super) fn check_private_dir(dir: &Path) -> Result<(), StoreError> {
    let meta = fs::metadata(dir).map_err(|source| StoreError::Directory {
        path: dir.to_path_buf(),
        source,
    })?;
    refuse_shared(dir, &meta, false)
}

fn refuse_shared(dir: &Path, meta: &fs::Metadata, allow_shared: bool) -> Result<(), StoreError> {
    match os::shared_mode(meta) {
        Some(mode) if !allow_shared => Err(StoreError::SharedDirectory {
            path: dir.to_path_buf(),
            mode,
        }),
        _ => Ok(()),
    }
}

/// One file-system step of a write, a rename, a removal or a directory sync, as it is taken.
/// The record store tells its [`Observer`] each: the crash-consistency tests replay every prefix
/// of an operation and keep only what was made durable, as a power loss at that point would
/// (`src/record/tests/crash.rs`).
#[derive(Debug, Clone, Copy)]
// Read by the tests' observer only.
#[cfg_attr(not(test), allow(dead_code))]
pub enum Step<'a> {
    /// A new file with these bytes, synced or not (its name is durable only once its directory
    /// is synced).
    Write {
        path: &'a Path,
        bytes: &'a [u8],
        synced: bool,
    },
    Rename {
        from: &'a Path,
        to: &'a Path,
    },
    Remove {
        path: &'a Path,
    },
    /// The directory's entries are durable from here on.
    SyncDir {
        dir: &'a Path,
    },
}

/// What is told of each [`Step`] taken: nothing, but for the stores a test opens to watch.
pub trait Observer: Send + Sync {
    /// The step was taken (it succeeded).
    fn took(&self, step: Step<'_>);
}

/// The observer of every production path: it is told, and does nothing.
#[derive(Debug)]
pub struct Unobserved;

impl Observer for Unobserved {
    fn took(&self, _: Step<'_>) {}
}

#[cfg(unix)]
#[path = "files/os_unix.rs"]
mod os;

#[cfg(not(unix))]
#[path = "files/os_other.rs"]
mod os;

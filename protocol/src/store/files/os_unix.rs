//! The file helpers' OS-specific half (Unix).

use super::super::StoreError;
use std::fs::{DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::path::Path;

/// The open(2) flags, as `OpenOptionsExt::custom_flags` takes them.
fn flags(flags: rustix::fs::OFlags) -> i32 {
    flags.bits() as i32
}

pub(super) fn open_no_follow(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .read(true)
        .custom_flags(flags(
            rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::NONBLOCK
                | rustix::fs::OFlags::CLOEXEC,
        ))
        .open(path)
}

pub(super) fn is_symlink_loop(e: &io::Error) -> bool {
    e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
}

/// Makes a rename durable (see `fsync(2)`: syncing the file does not sync its directory entry).
pub(super) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| StoreError::Io {
            op: "sync directory",
            path: dir.to_path_buf(),
            source,
        })
}

/// Mode 0600 (0644 when the directory's other readers must read it) and close-on-exec for
/// a new file (`open(2)`).
pub(super) fn new_file(options: &mut OpenOptions, readable: bool) {
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if readable { 0o644 } else { 0o600 };
    options
        .mode(mode)
        .custom_flags(flags(rustix::fs::OFlags::CLOEXEC));
}

/// Mode 0700 for a new directory (`mkdir(2)`; the umask can only remove bits).
pub(super) fn private_dir(builder: &mut DirBuilder) {
    use std::os::unix::fs::DirBuilderExt;
    builder.mode(0o700);
}

/// The permission bits of a directory that group or others can write, `None` for a private one.
pub(super) fn shared_mode(meta: &Metadata) -> Option<u32> {
    use std::os::unix::fs::PermissionsExt;
    let mode = meta.permissions().mode() & 0o7777;
    (mode & 0o022 != 0).then_some(mode)
}

/// Gives `file` to `uid`:`gid` (`fchown(2)`), keeping its mode.
pub(super) fn give_to(file: &File, (uid, gid): (u32, u32)) -> io::Result<()> {
    std::os::unix::fs::fchown(file, Some(uid), Some(gid))
}

/// The owner a file written into `dir` must have for the directory's owner to read it: the
/// directory's owner, when this process runs as root and the directory is someone else's (a
/// root stopper writing for a service that runs as another user). `None` otherwise.
pub(crate) fn reader_of(dir: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    if !rustix::process::geteuid().is_root() {
        return None;
    }
    let meta = std::fs::metadata(dir).ok()?;
    (meta.uid() != 0).then_some((meta.uid(), meta.gid()))
}

/// The uid that owns a file.
pub(super) fn owner_of(meta: &Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    Some(meta.uid())
}

/// The file's hard links.
pub(super) fn links(meta: &Metadata) -> u64 {
    use std::os::unix::fs::MetadataExt;
    meta.nlink()
}

/// The owner of a file this process's effective user does not own.
pub(super) fn foreign_owner(meta: &Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    (meta.uid() != me).then_some(meta.uid())
}

/// Never follow a symlink at the last component, never block on a FIFO.
pub(super) fn no_follow(options: &mut OpenOptions) {
    use std::os::unix::fs::OpenOptionsExt;
    options.custom_flags(flags(
        rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::CLOEXEC,
    ));
}

/// Unix has no sharing violations: an open file can be renamed over or removed.
pub(super) fn is_sharing_violation(_: &io::Error) -> bool {
    false
}

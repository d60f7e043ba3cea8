//! The file helpers' OS-specific half (not Unix).

use super::super::StoreError;
use std::fs::{DirBuilder, File, Metadata, OpenOptions};
use std::io;
use std::path::Path;

pub(super) fn open_no_follow(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).open(path)
}

pub(super) fn is_symlink_loop(_: &io::Error) -> bool {
    false
}

/// Windows cannot open a directory as a file without backup semantics; NTFS journals the rename.
pub(super) fn sync_dir(_: &Path) -> Result<(), StoreError> {
    Ok(())
}

/// Windows files get their access from the directory's ACL: nothing to hand over.
pub(super) fn give_to(_: &File, _: (u32, u32)) -> io::Result<()> {
    Ok(())
}

/// No owner uid to hand a file to on Windows.
pub(crate) fn reader_of(_: &Path) -> Option<(u32, u32)> {
    None
}

/// No owner uids here.
pub(super) fn owner_of(_: &Metadata) -> Option<u32> {
    None
}

/// Not read here (std has no stable count on Windows), where every file counts anyway.
pub(super) fn links(_: &Metadata) -> u64 {
    1
}

/// Files belong to whoever the directory's ACL lets in: there is no owner uid to compare.
pub(super) fn foreign_owner(_: &Metadata) -> Option<u32> {
    None
}

/// Windows opens a symlink's target only with explicit flags, and has no FIFOs in the file system.
pub(super) fn no_follow(_: &mut OpenOptions) {}

/// Windows ACLs are inherited from the directory; there are no mode bits to set.
pub(super) fn new_file(_: &mut OpenOptions, _: bool) {}

/// Windows ACLs are inherited from the parent; there are no mode bits to set.
pub(super) fn private_dir(_: &mut DirBuilder) {}

/// No group/other mode bits to check: a directory's ACL is the administrator's to set.
pub(super) fn shared_mode(_: &Metadata) -> Option<u32> {
    None
}

/// `ERROR_ACCESS_DENIED` (5) or `ERROR_SHARING_VIOLATION` (32): another process has the file
/// open without `FILE_SHARE_DELETE` (see the Win32 `MoveFileEx` and `DeleteFile` docs).
pub(super) fn is_sharing_violation(e: &io::Error) -> bool {
    cfg!(windows) && matches!(e.raw_os_error(), Some(5) | Some(32))
}

//! Filesystem notifications for the marker slot: event-driven delivery.
//!
//! Polling costs a probe per interval and a marker waits up to one interval to be seen. With
//! notifications (inotify on Linux, FSEvents on macOS, `ReadDirectoryChangesW` on Windows, through
//! the [`notify`] crate) the watcher probes as soon as the slot changes, typically within a
//! millisecond. Notifications are an accelerator, never the only path: events can be missed (a
//! queue overflow, a network file system, a directory replaced under the watch), so the watcher
//! keeps polling as a safety net and a missed event costs at most one poll interval.
//!
//! [`SlotEvents`] watches the slot's directory (not the slot itself, which comes and goes) and
//! sends a wake-up for every event that touches the slot's name, and for every overflow or error
//! (after which the truth is unknown, so the watcher should look).

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use std::ffi::OsString;
use std::path::Path;
use tokio::sync::mpsc;

/// A live directory watch; dropping it stops the notifications.
pub struct SlotEvents {
    _watcher: RecommendedWatcher,
}

impl std::fmt::Debug for SlotEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SlotEvents")
    }
}

/// Wake-ups from [`SlotEvents`]: one `()` per relevant event (the watcher coalesces bursts).
pub type Wakeups = mpsc::UnboundedReceiver<()>;

impl SlotEvents {
    /// Watches the directory of `slot` for changes to `slot`. Fails where the OS has no
    /// notifications for that file system, or the directory cannot be watched; callers fall back to
    /// polling alone.
    pub fn watch(slot: &Path) -> Result<(SlotEvents, Wakeups), notify::Error> {
        let dir = match slot.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let name: Option<OsString> = slot.file_name().map(|n| n.to_owned());
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let relevant = match &event {
                    // After an error or an overflow ("rescan") the truth is unknown: look.
                    Err(_) => true,
                    Ok(e) if e.need_rescan() => true,
                    Ok(e) => e.paths.iter().any(|p| p.file_name() == name.as_deref()),
                };
                if relevant {
                    let _ = tx.send(());
                }
            })?;
        watcher.watch(&dir, RecursiveMode::NonRecursive)?;
        Ok((SlotEvents { _watcher: watcher }, rx))
    }
}

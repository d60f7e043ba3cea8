//! Filesystem notifications for the marker slot: event-driven delivery.
//!
//! Polling costs a probe per interval and a marker waits up to one interval to be seen. With
//! notifications (inotify on Linux, through the `inotify` crate; FSEvents on macOS and
//! `ReadDirectoryChangesW` on Windows, through the `notify` crate) the watcher probes as soon as
//! the slot changes, typically within a millisecond. Notifications are an accelerator, never the
//! only path: events can be missed (a queue overflow, a network file system, a directory replaced
//! under the watch), so the watcher keeps polling as a safety net and a missed event costs at most
//! one poll interval.
//!
//! [`SlotEvents`] watches the slot's directory (not the slot itself, which comes and goes) and
//! sends a wake-up for every event that touches the slot's name, and for every overflow or error
//! (after which the truth is unknown, so the watcher should look).
//!
//! On Linux it uses inotify itself rather than the generic watcher, asking only for what can
//! bring a marker — a file renamed into the directory (`IN_MOVED_TO`, how every writer of this
//! crate delivers one) or a file written in place and closed (`IN_CLOSE_WRITE`) — and compares
//! the name before anything else runs. Many services share one directory, and every marker
//! written for one of them is an event for all: through the generic watcher each cost every other
//! service about 70 µs of CPU (opens, modifications and temporary files included), so stopping N
//! services one by one cost O(N²).

#[cfg(not(target_os = "linux"))]
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use std::ffi::OsString;
use std::path::Path;
use tokio::sync::mpsc;

/// A live directory watch; dropping it stops the notifications.
pub struct SlotEvents {
    #[cfg(not(target_os = "linux"))]
    _watcher: RecommendedWatcher,
    #[cfg(target_os = "linux")]
    _watcher: linux::InotifySlot,
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
    pub fn watch(slot: &Path) -> std::io::Result<(SlotEvents, Wakeups)> {
        let dir = match slot.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let name: Option<OsString> = slot.file_name().map(|n| n.to_owned());
        let (tx, rx) = mpsc::unbounded_channel();
        #[cfg(target_os = "linux")]
        {
            let name = name.unwrap_or_default();
            let watch = linux::InotifySlot::watch(&dir, name, tx)?;
            Ok((SlotEvents { _watcher: watch }, rx))
        }
        #[cfg(not(target_os = "linux"))]
        Self::watch_generic(dir, name, tx, rx).map_err(std::io::Error::other)
    }

    #[cfg(not(target_os = "linux"))]
    fn watch_generic(
        dir: std::path::PathBuf,
        name: Option<OsString>,
        tx: mpsc::UnboundedSender<()>,
        rx: Wakeups,
    ) -> Result<(SlotEvents, Wakeups), notify::Error> {
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

#[cfg(target_os = "linux")]
mod linux {
    //! inotify through the `inotify` crate, with this crate's own mask and name filter: a thread
    //! blocked in `poll(2)` (rustix) on the inotify descriptor and an eventfd that ends it.

    use inotify::{EventMask, Inotify, WatchMask};
    use rustix::event::{EventfdFlags, PollFd, PollFlags};
    use std::ffi::OsString;
    use std::io;
    use std::os::fd::OwnedFd;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::Arc;
    use tokio::sync::mpsc::UnboundedSender;

    /// The inotify watch and its reader thread; dropping it wakes the thread, which ends. The
    /// eventfd is shared, so it stays open (its number never reused) until both are done with it.
    pub(super) struct InotifySlot {
        stop: Arc<OwnedFd>,
    }

    impl Drop for InotifySlot {
        fn drop(&mut self) {
            // Adds 1 to the eventfd's counter, which wakes the thread. It cannot block (the
            // counter is nowhere near its maximum); should it fail, the thread stays parked in
            // `poll` until the process ends, holding only its descriptors.
            let _ = rustix::io::write(&*self.stop, &1u64.to_ne_bytes());
        }
    }

    /// What can bring a marker: a rename into the directory, a file written in place; and what
    /// means the watch itself is gone.
    const MASK: WatchMask = WatchMask::MOVED_TO
        .union(WatchMask::CLOSE_WRITE)
        .union(WatchMask::DELETE_SELF)
        .union(WatchMask::MOVE_SELF)
        .union(WatchMask::ONLYDIR);

    /// Whether an event with `mask` naming `event_name` must wake the watcher of slot `own`: one
    /// that names the slot, or any that means events were lost or the watch is gone (then the
    /// truth is unknown and the watcher should look).
    pub(super) fn wakes(mask: EventMask, event_name: &[u8], own: &[u8]) -> bool {
        let lost = EventMask::Q_OVERFLOW
            | EventMask::IGNORED
            | EventMask::DELETE_SELF
            | EventMask::MOVE_SELF;
        mask.intersects(lost) || event_name == own
    }

    #[cfg(test)]
    #[test]
    fn only_the_own_slot_or_a_lost_watch_wakes() {
        let own = b"planned-stop-7.json";
        assert!(wakes(EventMask::MOVED_TO, own, own));
        assert!(wakes(EventMask::CLOSE_WRITE, own, own));
        assert!(!wakes(EventMask::MOVED_TO, b"planned-stop-8.json", own));
        assert!(!wakes(
            EventMask::CLOSE_WRITE,
            b".planned-stop-7.json.tmp-1",
            own
        ));
        assert!(!wakes(EventMask::MOVED_TO, b"planned-stop-7.json.x", own));
        for lost in [
            EventMask::Q_OVERFLOW,
            EventMask::IGNORED,
            EventMask::DELETE_SELF,
            EventMask::MOVE_SELF,
        ] {
            assert!(wakes(lost, b"", own));
        }
    }

    impl InotifySlot {
        pub(super) fn watch(
            dir: &Path,
            name: OsString,
            tx: UnboundedSender<()>,
        ) -> io::Result<Self> {
            // Non-blocking and close-on-exec: the thread below reads only what `poll` announced.
            let inotify = Inotify::init()?;
            inotify.watches().add(dir, MASK)?;
            let stop = Arc::new(rustix::event::eventfd(
                0,
                EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
            )?);
            let wake = stop.clone();
            std::thread::Builder::new()
                .name("planned-stop-inotify".into())
                .spawn(move || read_events(inotify, &wake, name.as_bytes(), &tx))?;
            Ok(InotifySlot { stop })
        }
    }

    /// Reads events until `stop` is signalled or the receiver is gone; sends a wake-up for an
    /// event naming `name`, an overflow, or the loss of the watch. A failure of the watch itself
    /// sends one last wake-up and ends the thread: the watcher's polling carries on alone.
    fn read_events(mut inotify: Inotify, stop: &OwnedFd, name: &[u8], tx: &UnboundedSender<()>) {
        // Room for 64 events with the longest names (an event is 16 bytes and its name).
        let mut buf = vec![0u8; 64 * (16 + 256)];
        loop {
            let stopped = {
                let mut fds = [
                    PollFd::new(&inotify, PollFlags::IN),
                    PollFd::new(stop, PollFlags::IN),
                ];
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) => !fds[1].revents().is_empty(),
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "the marker directory's watch failed; polling only"
                        );
                        let _ = tx.send(());
                        return;
                    }
                }
            };
            if stopped {
                return;
            }
            let mut relevant = false;
            loop {
                match inotify.read_events(&mut buf) {
                    Ok(events) => {
                        for event in events {
                            let event_name = event.name.map(|n| n.as_bytes()).unwrap_or_default();
                            relevant |= wakes(event.mask, event_name, name);
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        tracing::warn!(
                            error = %e,
                            "cannot read the marker directory's watch; polling only"
                        );
                        let _ = tx.send(());
                        return;
                    }
                }
            }
            if relevant && tx.send(()).is_err() {
                return;
            }
        }
    }
}

//! Filesystem notifications for the marker slot: event-driven delivery.
//!
//! Polling waits up to one interval to see a marker; with notifications (inotify on Linux through
//! the `inotify` crate, FSEvents and `ReadDirectoryChangesW` elsewhere through `notify`) the
//! watcher probes as soon as the slot changes. Events can be missed (an overflow, a network file
//! system, a replaced directory), so they only accelerate: the watcher keeps polling.
//!
//! [`SlotEvents`] watches the slot's directory and sends a wake-up for every event that touches the
//! slot's name, and for every overflow or error. On Linux it asks only for what can bring a marker
//! (a rename into the directory, a file closed after writing) and compares the name first, since
//! every marker written for one of many services in a directory is an event for all of them.
//! Dropping it removes the watch at once and closes the instance a second later: closing (or
//! exiting with) an instance that still has a watch waits for a kernel grace period.

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

    use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask, Watches};
    use rustix::event::{EventfdFlags, PollFd, PollFlags};
    use std::ffi::OsString;
    use std::io;
    use std::os::fd::OwnedFd;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::sync::mpsc::UnboundedSender;

    /// How long the reader thread keeps its inotify instance open once it has removed the watch:
    /// far past the kernel's reaping of the watch (a clock tick, then a grace period), so that the
    /// close has nothing to wait for (see the module's docs).
    const CLOSE_AFTER_REMOVAL: Duration = Duration::from_secs(1);

    /// The inotify watch and its reader thread. Dropping it removes the watch at once and wakes
    /// the thread, which closes the instance later (see the module's docs). The thread lives until
    /// it is woken, so it always holds the instance's last reference and the close never runs on
    /// the dropping (actix) thread. The eventfd is shared, so it stays open (its number never
    /// reused) until both are done with it.
    pub(super) struct InotifySlot {
        stop: Arc<OwnedFd>,
        watches: Watches,
        watch: WatchDescriptor,
    }

    impl Drop for InotifySlot {
        fn drop(&mut self) {
            // Removing a watch never waits for the kernel's reaping of it; a removal that fails
            // (the watch is gone already) changes nothing.
            let _ = self.watches.remove(self.watch.clone());
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

    impl InotifySlot {
        pub(super) fn watch(
            dir: &Path,
            name: OsString,
            tx: UnboundedSender<()>,
        ) -> io::Result<Self> {
            // Non-blocking and close-on-exec: the thread below reads only what `poll` announced.
            let inotify = Inotify::init()?;
            let mut watches = inotify.watches();
            let watch = watches.add(dir, MASK)?;
            let stop = Arc::new(rustix::event::eventfd(
                0,
                EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
            )?);
            let wake = stop.clone();
            std::thread::Builder::new()
                .name("planned-stop-inotify".into())
                .spawn(move || {
                    let mut inotify = inotify;
                    read_events(&mut inotify, &wake, name.as_bytes(), &tx);
                    // After a failure, the thread still holds the instance until it is told to
                    // stop; when it was told, the eventfd stays readable and this returns at once.
                    wait_for(&wake);
                    // The watch is removed before the thread is woken: a second later the
                    // kernel has reaped it, and the close waits for nothing.
                    std::thread::sleep(CLOSE_AFTER_REMOVAL);
                    drop(inotify);
                })?;
            Ok(InotifySlot {
                stop,
                watches,
                watch,
            })
        }
    }

    /// Reads events until `stop` is signalled or the receiver is gone; sends a wake-up for an
    /// event naming `name`, an overflow, or the loss of the watch. A failure of the watch itself
    /// sends one last wake-up and ends the reading: the watcher's polling carries on alone.
    fn read_events(inotify: &mut Inotify, stop: &OwnedFd, name: &[u8], tx: &UnboundedSender<()>) {
        // Room for 64 events with the longest names (an event is 16 bytes and its name).
        let mut buf = vec![0u8; 64 * (16 + 256)];
        loop {
            let stopped = {
                let mut fds = [
                    PollFd::new(&*inotify, PollFlags::IN),
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

    /// Parks until `stop` is signalled (the watch is dropped; nothing reads the eventfd, so once
    /// signalled it stays readable): the thread holds the instance's last reference until then.
    fn wait_for(stop: &OwnedFd) {
        loop {
            let mut fds = [PollFd::new(stop, PollFlags::IN)];
            match rustix::event::poll(&mut fds, None) {
                Err(rustix::io::Errno::INTR) => continue,
                Ok(_) if fds[0].revents().is_empty() => continue,
                // Signalled, or the eventfd cannot be polled at all: nothing left to wait for.
                _ => return,
            }
        }
    }

    #[cfg(test)]
    mod tests;
}

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
//!
//! On Linux it uses inotify directly, asking only for what can bring a marker — a file renamed
//! into the directory (`IN_MOVED_TO`, how every writer of this crate delivers one) or a file
//! written in place and closed (`IN_CLOSE_WRITE`) — and compares the name before anything else
//! runs. Many services share one directory, and every marker written for one of them is an event
//! for all: through the generic watcher each cost every other service about 70 µs of CPU (opens,
//! modifications and temporary files included), so stopping N services one by one cost O(N²).

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
    pub fn watch(slot: &Path) -> Result<(SlotEvents, Wakeups), notify::Error> {
        let dir = match slot.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => std::path::PathBuf::from("."),
        };
        let name: Option<OsString> = slot.file_name().map(|n| n.to_owned());
        let (tx, rx) = mpsc::unbounded_channel();
        #[cfg(target_os = "linux")]
        {
            let name = name.unwrap_or_default();
            let watch = linux::InotifySlot::watch(&dir, name, tx).map_err(notify::Error::io)?;
            Ok((SlotEvents { _watcher: watch }, rx))
        }
        #[cfg(not(target_os = "linux"))]
        Self::watch_generic(dir, name, tx, rx)
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
    //! inotify, directly: a thread blocked in `poll(2)` on the inotify descriptor and an eventfd
    //! that ends it.

    use std::ffi::{CString, OsString};
    use std::io;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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
            let one: u64 = 1;
            // SAFETY: writes 8 bytes from a valid u64 to an eventfd that is open (we hold it).
            unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        }
    }

    /// What can bring a marker: a rename into the directory, a file written in place; and what
    /// means the watch itself is gone.
    const MASK: u32 = libc::IN_MOVED_TO
        | libc::IN_CLOSE_WRITE
        | libc::IN_DELETE_SELF
        | libc::IN_MOVE_SELF
        | libc::IN_ONLYDIR;

    /// Whether an event with `mask` naming `event_name` must wake the watcher of slot `own`: one
    /// that names the slot, or any that means events were lost or the watch is gone (then the
    /// truth is unknown and the watcher should look).
    pub(super) fn wakes(mask: u32, event_name: &[u8], own: &[u8]) -> bool {
        let lost =
            libc::IN_Q_OVERFLOW | libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF;
        mask & lost != 0 || event_name == own
    }

    #[cfg(test)]
    #[test]
    fn only_the_own_slot_or_a_lost_watch_wakes() {
        let own = b"planned-stop-7.json";
        assert!(wakes(libc::IN_MOVED_TO, own, own));
        assert!(wakes(libc::IN_CLOSE_WRITE, own, own));
        assert!(!wakes(libc::IN_MOVED_TO, b"planned-stop-8.json", own));
        assert!(!wakes(
            libc::IN_CLOSE_WRITE,
            b".planned-stop-7.json.tmp-1",
            own
        ));
        assert!(!wakes(libc::IN_MOVED_TO, b"planned-stop-7.json.x", own));
        for lost in [
            libc::IN_Q_OVERFLOW,
            libc::IN_IGNORED,
            libc::IN_DELETE_SELF,
            libc::IN_MOVE_SELF,
        ] {
            assert!(wakes(lost, b"", own));
        }
    }

    /// A new descriptor from a system call's result, or its error.
    fn owned(fd: i32) -> io::Result<OwnedFd> {
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor the system call just returned, owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    impl InotifySlot {
        pub(super) fn watch(
            dir: &Path,
            name: OsString,
            tx: UnboundedSender<()>,
        ) -> io::Result<Self> {
            let path = CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
                io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path")
            })?;
            // SAFETY: plain system calls; the results are owned at once.
            let inotify =
                owned(unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) })?;
            // SAFETY: a valid inotify descriptor and C string.
            if unsafe { libc::inotify_add_watch(inotify.as_raw_fd(), path.as_ptr(), MASK) } < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: as above.
            let stop = Arc::new(owned(unsafe {
                libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK)
            })?);
            let wake = stop.clone();
            std::thread::Builder::new()
                .name("planned-stop-inotify".into())
                .spawn(move || read_events(&inotify, &wake, name.as_bytes(), &tx))?;
            Ok(InotifySlot { stop })
        }
    }

    /// Reads events until `stop` is signalled or the receiver is gone; sends a wake-up for an
    /// event naming `name`, an overflow, or the loss of the watch.
    fn read_events(inotify: &OwnedFd, stop: &OwnedFd, name: &[u8], tx: &UnboundedSender<()>) {
        let header = std::mem::size_of::<libc::inotify_event>();
        let mut buf = vec![0u8; 64 * (header + 256)];
        loop {
            let mut fds = [
                libc::pollfd {
                    fd: inotify.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: stop.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: two valid pollfds; no timeout (the eventfd ends the wait).
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                let _ = tx.send(());
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            let mut relevant = false;
            loop {
                // SAFETY: reads into a buffer of the given length.
                let len =
                    unsafe { libc::read(inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                let Ok(len) = usize::try_from(len) else {
                    break; // EAGAIN: everything read
                };
                if len == 0 {
                    break;
                }
                let mut at = 0;
                while at + header <= len {
                    // SAFETY: the kernel wrote whole inotify_events (a read never splits one);
                    // read_unaligned copes with the byte buffer's alignment.
                    let event: libc::inotify_event =
                        unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                    let end = (at + header + event.len as usize).min(len);
                    let raw = &buf[at + header..end];
                    let event_name = raw.split(|&b| b == 0).next().unwrap_or_default();
                    relevant |= wakes(event.mask, event_name, name);
                    at = end;
                }
            }
            if relevant && tx.send(()).is_err() {
                return;
            }
        }
    }
}

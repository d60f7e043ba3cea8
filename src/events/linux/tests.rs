//! The inotify watch of the marker directory: which events wake the watcher, and how the watch
//! ends (the watch removed at once, the instance closed later, by its own thread).

use super::*;
use inotify::EventMask;
use std::path::Path;
use std::time::Duration;

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

/// The inotify watches that descriptor `fd` of this process holds on inode `ino`, or `None`
/// when `fd` is not (or no longer) an inotify instance.
fn watches_on(fd: &std::ffi::OsStr, ino: u64) -> Option<usize> {
    let fd = Path::new("/proc/self/fd").join(fd);
    let link = std::fs::read_link(&fd).ok()?;
    if link.as_os_str() != "anon_inode:inotify" {
        return None;
    }
    let info = std::fs::read_to_string(Path::new("/proc/self/fdinfo").join(fd.file_name()?));
    let on_ino = format!(" ino:{ino:x} ");
    let watches = info
        .ok()?
        .lines()
        .filter(|l| l.starts_with("inotify wd:") && l.contains(&on_ino))
        .count();
    Some(watches)
}

/// A watch of a fresh directory's slot, with the directory's inode and the descriptor of the
/// inotify instance that watches it.
fn watched() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    u64,
    std::ffi::OsString,
    (crate::events::SlotEvents, crate::events::Wakeups),
) {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let ino = std::fs::metadata(dir.path()).unwrap().ino();
    let slot = dir.path().join("planned-stop-1.json");
    let watch = crate::events::SlotEvents::watch(&slot).unwrap();
    let fd = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| Some(e.ok()?.file_name()))
        .find(|fd| watches_on(fd, ino) == Some(1))
        .expect("an inotify instance watches the directory");
    (dir, slot, ino, fd, watch)
}

#[test]
fn ending_removes_the_watch_first_and_keeps_the_instance_open() {
    let (_dir, _slot, ino, fd, (events, _wakeups)) = watched();
    drop(events);
    // Closed at once, the instance would make an exit wait for the kernel's grace period.
    assert_eq!(
        watches_on(&fd, ino),
        Some(0),
        "the watch is removed and the instance is still open"
    );
}

#[test]
fn every_write_of_the_slot_wakes_the_watcher_not_only_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let slot = dir.path().join("planned-stop-1.json");
    let (_events, mut wakeups) = crate::events::SlotEvents::watch(&slot).unwrap();
    for write in 1..=3 {
        std::fs::write(&slot, b"{}").unwrap();
        // The thread reads the event in real time: wait for its wake-up, bounded.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while wakeups.try_recv().is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "no wake-up for write {write}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

#[test]
fn after_its_reading_failed_the_thread_still_closes_the_instance_after_the_drop() {
    let (_dir, slot, ino, fd, (events, wakeups)) = watched();
    // Nobody listens: the event naming the slot ends the thread's reading.
    drop(wakeups);
    std::fs::write(&slot, b"{}").unwrap();
    // Past the close delay: a thread that let go of the instance when its reading ended
    // would have left the drop below to close it, on the dropping thread.
    std::thread::sleep(CLOSE_AFTER_REMOVAL + Duration::from_millis(500));
    drop(events);
    assert_eq!(
        watches_on(&fd, ino),
        Some(0),
        "the thread holds the instance until it is told to stop"
    );
}

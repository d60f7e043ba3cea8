//! Where the markers are: one slot per process in a directory, or one shared file.

use super::naming::parse_slot_file_name;
use std::path::{Path, PathBuf};

/// Where the markers are.
///
/// ```
/// use planned_stop_protocol::Layout;
/// use planned_stop_protocol::marker::MarkerStore;
/// # let dir = tempfile::tempdir().unwrap();
/// let slots = MarkerStore::open(Layout::Slots(dir.path().join("run"))).unwrap();
/// assert!(slots.slot_path(7).ends_with("planned-stop-7.json"));
/// let single = MarkerStore::open(Layout::SingleFile(dir.path().join("stop.json"))).unwrap();
/// assert_eq!(single.slot_path(7), single.slot_path(8));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Layout {
    /// One slot per target pid in this directory: `DIR/planned-stop-<PID>.json`.
    Slots(PathBuf),
    /// One file shared by all processes, for writers that know only one path per service.
    SingleFile(PathBuf),
}

impl Layout {
    /// The layout and pid a marker path names, as an operator gives it: a per-process slot
    /// `DIR/planned-stop-<PID>.json` is [`Layout::Slots`] of `DIR` and that pid; any other file is
    /// [`Layout::SingleFile`], whose owner is whoever its marker names (`None`).
    ///
    /// ```
    /// use planned_stop_protocol::Layout;
    /// use std::path::Path;
    /// assert_eq!(
    ///     Layout::of_marker_path(Path::new("/run/app/planned-stop-42.json")),
    ///     (Layout::Slots("/run/app".into()), Some(42))
    /// );
    /// assert_eq!(
    ///     Layout::of_marker_path(Path::new("/run/app/stop.json")),
    ///     (Layout::SingleFile("/run/app/stop.json".into()), None)
    /// );
    /// ```
    #[must_use]
    pub fn of_marker_path(path: &Path) -> (Layout, Option<u32>) {
        let slot_pid = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(parse_slot_file_name);
        match (slot_pid, path.parent()) {
            (Some(pid), Some(dir)) => (Layout::Slots(dir.to_path_buf()), Some(pid)),
            _ => (Layout::SingleFile(path.to_path_buf()), None),
        }
    }
}

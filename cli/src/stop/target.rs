//! Which process a stop without `--pid` is for: the one that announced watching the directory.

use crate::chain;
use planned_stop::marker::MarkerStore;

/// The one live process that announced watching `store`'s directory, for a stop without --pid.
pub(super) fn the_watcher(store: &MarkerStore, flag: &str) -> Result<(u32, u64), String> {
    let live: Vec<_> = store
        .presences()
        .map_err(|e| chain(&e))?
        .into_iter()
        .filter(|p| planned_stop::ProcessIdentity::is_running(p.pid, p.start))
        .collect();
    match live.as_slice() {
        [one] => Ok((one.pid, one.start)),
        [] => Err(format!(
            "no running process has announced watching {}: give --pid (is {flag} right?)",
            store.dir().display()
        )),
        several => Err(format!(
            "{} processes watch {} (pids {}): give --pid",
            several.len(),
            store.dir().display(),
            several
                .iter()
                .map(|p| p.pid.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

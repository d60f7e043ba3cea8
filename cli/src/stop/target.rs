//! Which process a stop without `--pid` is for: the one that announced watching the directory,
//! or, when none runs any more, the one whose final outcome is the latest here (so a repeated
//! stop is answered as with `--pid`: `already_stopped`).

use crate::chain;
use planned_stop::marker::MarkerStore;

/// The process a stop without --pid is for (pid and start fingerprint): the one live process
/// that announced watching `store`'s directory; with none (`--dir`), the process gone most
/// recently whose final outcome is here (a repeated stop: it is answered from that outcome).
pub(super) fn the_target(store: &MarkerStore, flag: &str) -> Result<(u32, u64), String> {
    match the_watcher(store, flag) {
        // The slot layout only: a shared marker file (`--marker`) names no one process.
        Err(none)
            if flag == "--dir"
                && store.presences().is_ok_and(|p| {
                    p.iter()
                        .all(|p| !planned_stop::ProcessIdentity::is_running(p.pid, p.start))
                }) =>
        {
            last_gone(store).ok_or(none)
        }
        found => found,
    }
}

/// The process whose final outcome here is the latest, among those no longer running.
fn last_gone(store: &MarkerStore) -> Option<(u32, u64)> {
    let outcomes = store.outcomes().ok()?;
    outcomes
        .into_iter()
        .filter(|o| o.state.is_final())
        .filter(|o| !planned_stop::ProcessIdentity::is_running(o.pid, o.start))
        .max_by_key(|o| o.finished_at)
        .map(|o| (o.pid, o.start))
}

/// The one live process that announced watching `store`'s directory.
fn the_watcher(store: &MarkerStore, flag: &str) -> Result<(u32, u64), String> {
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

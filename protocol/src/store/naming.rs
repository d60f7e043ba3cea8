//! File names in the marker directory: slots, outcome files, and the private names of files
//! being written or taken, which the sweep recognises as leftovers of a killed process.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

const SLOT_PREFIX: &str = "planned-stop-";
const SLOT_SUFFIX: &str = ".json";
const OUTCOME_SUFFIX: &str = ".outcome.json";
const PRESENCE_SUFFIX: &str = ".watching.json";
pub(crate) const TEMP_TAG: &str = ".tmp-";
pub(crate) const TAKEN_TAG: &str = ".taken-";

/// `planned-stop-<PID>.json`.
pub(crate) fn slot_file_name(pid: u32) -> String {
    format!("{SLOT_PREFIX}{pid}{SLOT_SUFFIX}")
}

/// `planned-stop-<PID>.outcome.json`.
pub(crate) fn outcome_file_name(pid: u32) -> String {
    format!("{SLOT_PREFIX}{pid}{OUTCOME_SUFFIX}")
}

/// `planned-stop-<PID>.watching.json`.
pub(crate) fn presence_file_name(pid: u32) -> String {
    format!("{SLOT_PREFIX}{pid}{PRESENCE_SUFFIX}")
}

/// The pid in an outcome file name, or `None` if `name` is not one.
pub(crate) fn parse_outcome_file_name(name: &str) -> Option<u32> {
    parse_pid_file_name(name, OUTCOME_SUFFIX)
}

/// The pid in a presence file name, or `None` if `name` is not one.
pub(crate) fn parse_presence_file_name(name: &str) -> Option<u32> {
    parse_pid_file_name(name, PRESENCE_SUFFIX)
}

/// The pid in `planned-stop-<PID><suffix>`.
fn parse_pid_file_name(name: &str, suffix: &str) -> Option<u32> {
    let digits = name.strip_prefix(SLOT_PREFIX)?.strip_suffix(suffix)?;
    parse_slot_file_name(&format!("{SLOT_PREFIX}{digits}{SLOT_SUFFIX}"))
}

/// The pid in a slot file name, or `None` if `name` is not one.
pub(crate) fn parse_slot_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_prefix(SLOT_PREFIX)?.strip_suffix(SLOT_SUFFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&pid| pid > 0)
}

/// The private name of a file being written (`TEMP_TAG`) or taken (`TAKEN_TAG`) in place of
/// `slot`: hidden, unique within this process (a counter) and across processes (the pid).
pub(crate) fn private_file_name(slot: &Path, tag: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let base = slot.file_name().map(|n| n.to_string_lossy().into_owned());
    let base = base.unwrap_or_else(|| "planned-stop".to_owned());
    format!(".{base}{tag}{}-{n}", std::process::id())
}

/// Whether `name` is a private name [`private_file_name`] made for a slot, an outcome file or a
/// presence file of this directory: in the single-file layout (`single_file` names the shared file) for that file,
/// otherwise for any per-process slot.
pub(crate) fn is_leftover_name(name: &str, single_file: Option<&str>) -> bool {
    let Some(rest) = name.strip_prefix('.') else {
        return false;
    };
    let Some(tag) = rest.find(TEMP_TAG).or_else(|| rest.find(TAKEN_TAG)) else {
        return false;
    };
    let slot = &rest[..tag];
    let is_outcome =
        parse_outcome_file_name(slot).is_some() || parse_presence_file_name(slot).is_some();
    match single_file {
        Some(base) => slot == base || is_outcome,
        None => parse_slot_file_name(slot).is_some() || is_outcome,
    }
}

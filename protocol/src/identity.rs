//! Who a process is: its pid plus a start fingerprint that survives pid reuse.
//!
//! A pid alone names a process only while it lives: once it exits the OS hands the number to the next
//! process, and a marker meant for the dead one must not stop the newcomer (hazard 2 in
//! docs/protocol.md). The fingerprint is the finest start time the OS gives cheaply, and both
//! sides — the stopper writing a marker and the target judging it — read it through the one
//! function in this module, so the two values are comparable by construction.
//!
//! - Linux: field 22 (`starttime`, clock ticks since boot) of `/proc/<pid>/stat`, found by counting
//!   fields after the *last* `)`, because the command name before it may itself contain spaces
//!   and parentheses (hazard 9 in docs/protocol.md: process names with spaces or `)` broke the
//!   stat split).
//! - Windows: the creation time from `GetProcessTimes` (100 ns ticks since 1601).
//! - Elsewhere: `sysinfo`'s process start time (seconds since the Unix epoch).
//!
//! The fingerprint is opaque and only compared for equality. [`ProcessIdentity::started_at`] is the
//! same instant on the wall clock, used for the "written after our start" guard when a marker carries
//! no fingerprint.

use chrono::{DateTime, Utc};

/// A process as the planned-stop protocol names it.
///
/// ```
/// let me = planned_stop_protocol::ProcessIdentity::current().unwrap();
/// assert!(me.started_at <= chrono::Utc::now() + chrono::TimeDelta::seconds(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ProcessIdentity {
    /// The OS process id.
    pub pid: u32,
    /// The start fingerprint (OS-specific units; see the module docs).
    pub start: u64,
    /// When the process started, by the wall clock (to about a second).
    pub started_at: DateTime<Utc>,
}

/// Why the current process could not read its own identity.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read the start time of this process (pid {pid}); on Linux check that /proc is mounted \
     and readable"
)]
///
/// ```
/// match planned_stop_protocol::ProcessIdentity::current() {
///     Ok(me) => assert_eq!(me.pid, std::process::id()),
///     Err(e) => eprintln!("{e}"), // names the pid and what to check
/// }
/// ```
#[non_exhaustive]
pub struct IdentityError {
    /// Our own pid.
    pub pid: u32,
}

impl ProcessIdentity {
    /// An identity from its parts: a process id, its start fingerprint (as [`ProcessIdentity::of`]
    /// reads it on this OS) and its wall-clock start. For a stopper that learned them elsewhere
    /// (a presence file, a pid file) and for tests; [`ProcessIdentity::of`] reads a live one.
    pub fn new(pid: u32, start: u64, started_at: DateTime<Utc>) -> ProcessIdentity {
        ProcessIdentity {
            pid,
            start,
            started_at,
        }
    }

    /// The identity of the calling process. Read it once at start-up and keep it: the answer never
    /// changes, and reading it per tick would put a `/proc` read on the watcher's hot path.
    ///
    /// ```
    /// let me = planned_stop_protocol::ProcessIdentity::current().unwrap();
    /// assert_eq!(me.pid, std::process::id());
    /// ```
    pub fn current() -> Result<ProcessIdentity, IdentityError> {
        let pid = std::process::id();
        ProcessIdentity::of(pid).ok_or(IdentityError { pid })
    }

    /// The identity of the process `pid`, or `None` when no such process is running (a zombie counts
    /// as gone: it will never act on a marker).
    ///
    /// ```
    /// use planned_stop_protocol::ProcessIdentity;
    /// let me = ProcessIdentity::current().unwrap();
    /// assert_eq!(ProcessIdentity::of(me.pid), Some(me));
    /// assert_eq!(ProcessIdentity::of(0), None);
    /// ```
    pub fn of(pid: u32) -> Option<ProcessIdentity> {
        if pid == 0 {
            return None;
        }
        os::identity_of(pid)
    }

    /// Whether the process `pid` that started with fingerprint `start` is still running (its pid
    /// not reused since): the owner check of the files a process leaves in the marker directory.
    ///
    /// ```
    /// use planned_stop_protocol::ProcessIdentity;
    /// let me = ProcessIdentity::current().unwrap();
    /// assert!(ProcessIdentity::is_running(me.pid, me.start));
    /// assert!(!ProcessIdentity::is_running(me.pid, me.start + 1));
    /// ```
    pub fn is_running(pid: u32, start: u64) -> bool {
        ProcessIdentity::of(pid).is_some_and(|owner| owner.start == start)
    }
}

/// The users who may signal the process `pid` besides root, as kill(2) decides: its real and
/// saved uids (on Linux; its real uid alone where the saved one cannot be read), or `None` when
/// they cannot be read: the process is gone, or the OS has no uids (Windows). What decides
/// whether a file in a shared directory may speak for the process
/// ([`crate::outcome::may_speak_for`]): never looser than the kernel's own check, so a file
/// cannot make root signal a process its owner could not signal itself — a process that runs
/// with the *effective* uid of its file's owner but real and saved uid root (a privilege drop
/// that can be undone) included.
pub(crate) fn user_ids_of(pid: u32) -> Option<Vec<u32>> {
    if pid == 0 {
        return None;
    }
    os::user_ids_of(pid)
}

/// The real and saved uids of a `/proc/<pid>/status` text (its `Uid:` line holds the real,
/// effective, saved and file-system uids: the first and the third are the ones kill(2) compares
/// with a sender's), or `None` when the line is missing or malformed. Pure: the text is another
/// process's.
///
/// ```
/// use planned_stop_protocol::identity::parse_status_uids;
/// assert_eq!(parse_status_uids("Name:\tx\nUid:\t0\t65534\t0\t65534\n"), Some(vec![0, 0]));
/// assert_eq!(parse_status_uids("Uid:\t1000\t1000\t1000\t1000\n"), Some(vec![1000, 1000]));
/// assert_eq!(parse_status_uids("Uid:\t0\t65534\n"), None, "no saved uid");
/// assert_eq!(parse_status_uids("Uid:\tnone\n"), None);
/// ```
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub fn parse_status_uids(text: &str) -> Option<Vec<u32>> {
    let line = text.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let uids: Vec<u32> = line
        .split_whitespace()
        .map_while(|field| field.parse().ok())
        .collect();
    match uids[..] {
        [real, _effective, saved, ..] => Some(vec![real, saved]),
        _ => None,
    }
}

/// The `starttime` field of a `/proc/<pid>/stat` line, and whether the process is still alive (not a
/// zombie or dead). Pure, so it can be tested (and fuzzed) on any input.
///
/// The command name in parentheses is free text chosen by the process, so the fields are counted from
/// the *last* `)`. Returns `None` for anything malformed.
pub fn parse_proc_stat(line: &[u8]) -> Option<ProcStat> {
    let close = line.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&line[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    // `rest` starts at field 3 (state); starttime is field 22.
    let state = fields.next()?;
    let start = fields.nth(22 - 4)?.parse::<u64>().ok()?;
    let alive = !matches!(state, "Z" | "X" | "x");
    Some(ProcStat { start, alive })
}

/// What [`parse_proc_stat`] reads from a stat line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Field 22, `starttime`, in clock ticks since boot.
    pub start: u64,
    /// `false` for a zombie (`Z`) or dead (`X`) process.
    pub alive: bool,
}

/// The start time of `pid` as [`sysinfo`] reports it, in seconds since the Unix epoch, or `None` when
/// the process is gone or a zombie. The fingerprint on every OS but Linux and Windows, and a
/// cross-check of the finer ones in the tests.
#[cfg(any(test, not(any(target_os = "linux", windows))))]
pub(crate) fn sysinfo_start_time(pid: u32) -> Option<u64> {
    use sysinfo::{Pid, ProcessRefreshKind, ProcessStatus, ProcessesToUpdate, System};
    let pid = Pid::from_u32(pid);
    let mut system = System::new().ok()?;
    system.refresh_processes_specifics(
        ProcessesToUpdate::Some(&[pid]),
        true,
        ProcessRefreshKind::nothing(),
    );
    let process = system.process(pid)?;
    if matches!(
        process.status(),
        ProcessStatus::Zombie | ProcessStatus::Dead
    ) {
        return None;
    }
    Some(process.start_time())
}

#[cfg(target_os = "linux")]
mod os {
    use super::{ProcessIdentity, parse_proc_stat};
    use chrono::{DateTime, TimeDelta, Utc};
    use std::sync::OnceLock;

    /// The `Uid:` line of `/proc/<pid>/status` (see `proc_pid_status(5)`).
    pub(super) fn user_ids_of(pid: u32) -> Option<Vec<u32>> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        super::parse_status_uids(&text)
    }

    /// Reads `/proc/<pid>/stat` (see `proc_pid_stat(5)`).
    pub(super) fn identity_of(pid: u32) -> Option<ProcessIdentity> {
        let line = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
        let stat = parse_proc_stat(&line)?;
        if !stat.alive {
            return None;
        }
        Some(ProcessIdentity {
            pid,
            start: stat.start,
            started_at: wall_clock_of(stat.start),
        })
    }

    /// Boot time (`btime` in `/proc/stat`, see `proc_stat(5)`) plus `ticks / CLK_TCK`.
    fn wall_clock_of(ticks: u64) -> DateTime<Utc> {
        static BOOT: OnceLock<(i64, u64)> = OnceLock::new();
        let &(btime, hz) = BOOT.get_or_init(|| {
            let btime = std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<i64>().ok())
                })
                .unwrap_or(0);
            let hz = rustix::param::clock_ticks_per_second();
            (btime, if hz > 0 { hz } else { 100 })
        });
        let secs = i64::try_from(ticks / hz).unwrap_or(i64::MAX / 2);
        let nanos = i64::try_from((ticks % hz) * 1_000_000_000 / hz).unwrap_or(0);
        DateTime::from_timestamp(btime.saturating_add(secs), 0)
            .and_then(|t| t.checked_add_signed(TimeDelta::nanoseconds(nanos)))
            .unwrap_or(DateTime::UNIX_EPOCH)
    }
}

#[cfg(windows)]
mod os {
    use super::ProcessIdentity;
    use chrono::DateTime;
    use windows_sys::Win32::Foundation::{CloseHandle, FILETIME, STILL_ACTIVE};
    use windows_sys::Win32::System::Threading::{
        GetExitCodeProcess, GetProcessTimes, OpenProcess, PROCESS_QUERY_LIMITED_INFORMATION,
    };

    /// Windows has no uids: access to a marker directory is its ACL's to decide.
    pub(super) fn user_ids_of(_: u32) -> Option<Vec<u32>> {
        None
    }

    /// 1601-01-01 (the FILETIME epoch) to 1970-01-01, in 100 ns ticks.
    const UNIX_EPOCH_TICKS: u64 = 116_444_736_000_000_000;

    /// The creation time from `GetProcessTimes` (100 ns ticks since 1601, see "GetProcessTimes
    /// function" and "FILETIME structure" in the Windows documentation): fine enough that a pid
    /// Windows recycles within the same second still gets another fingerprint. A process whose
    /// exit code is no longer `STILL_ACTIVE` is gone.
    pub(super) fn identity_of(pid: u32) -> Option<ProcessIdentity> {
        // SAFETY: OpenProcess has no memory preconditions; a null handle means failure.
        let handle = unsafe { OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, 0, pid) };
        if handle.is_null() {
            return None;
        }
        let zero = FILETIME {
            dwLowDateTime: 0,
            dwHighDateTime: 0,
        };
        let (mut creation, mut exit, mut kernel, mut user) = (zero, zero, zero, zero);
        let mut code = 0u32;
        // SAFETY: a valid process handle and pointers to locals; the handle is closed once.
        let ok = unsafe {
            let ok = GetProcessTimes(handle, &mut creation, &mut exit, &mut kernel, &mut user) != 0
                && GetExitCodeProcess(handle, &mut code) != 0;
            CloseHandle(handle);
            ok
        };
        if !ok || code != STILL_ACTIVE as u32 {
            return None;
        }
        let ticks = (u64::from(creation.dwHighDateTime) << 32) | u64::from(creation.dwLowDateTime);
        let since_unix = ticks.checked_sub(UNIX_EPOCH_TICKS)?;
        let started_at = DateTime::from_timestamp(
            i64::try_from(since_unix / 10_000_000).ok()?,
            u32::try_from(since_unix % 10_000_000 * 100).ok()?,
        )?;
        Some(ProcessIdentity {
            pid,
            start: ticks,
            started_at,
        })
    }
}

#[cfg(not(any(target_os = "linux", windows)))]
mod os {
    use super::{ProcessIdentity, sysinfo_start_time};
    use chrono::DateTime;

    /// The real uid as `sysinfo` reports it (no `/proc` to read here, and no saved uid: a
    /// process whose real uid is not its owner's is not its owner's to speak for).
    pub(super) fn user_ids_of(pid: u32) -> Option<Vec<u32>> {
        use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System, UpdateKind};
        let pid = Pid::from_u32(pid);
        let mut system = System::new().ok()?;
        system.refresh_processes_specifics(
            ProcessesToUpdate::Some(&[pid]),
            true,
            ProcessRefreshKind::nothing().with_user(UpdateKind::Always),
        );
        let process = system.process(pid)?;
        process.user_id().map(|uid| vec![**uid])
    }

    pub(super) fn identity_of(pid: u32) -> Option<ProcessIdentity> {
        let start = sysinfo_start_time(pid)?;
        Some(ProcessIdentity {
            pid,
            start,
            started_at: DateTime::from_timestamp(i64::try_from(start).ok()?, 0)?,
        })
    }
}

#[cfg(test)]
mod tests;

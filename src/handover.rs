//! Restart in place: a planned restart starts the successor — the executable on disk now, with
//! this process's arguments and environment — hands it the listening sockets this process serves,
//! and waits until it says it is ready; only then does this process drain and exit.
//!
//! Why: a restart that leaves the new process to a supervisor closes the listening socket first,
//! and every connection until the next bind is refused. Handed over, the socket itself stays open
//! across the swap (never re-bound, no `SO_REUSEPORT`): old and new accept from one queue until
//! the old one stops accepting. The successor finds its sockets the way a systemd-activated
//! service does (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`: descriptors 3 and up), so one code
//! path serves both (`web::listeners_or_bind`). It says it is ready over an inherited pipe
//! (`PLANNED_STOP_READY_FD`, for the pid `PLANNED_STOP_READY_PID`): its `ServiceHandle::ready()`
//! writes one line and closes it. A successor that exits, or is not ready in time (it is killed
//! then), leaves this process serving as before, and the restart is reported as failed.
//!
//! The descriptors are placed with `command-fds`. `LISTEN_PID` must be the successor's own pid,
//! known only after the fork, and setting a variable between fork and exec is not safe in a
//! threaded process; so the successor is started through `/bin/sh`, which exports its own pid
//! (`$$`) and then execs the executable, keeping that pid. It is started detached, in a process
//! group of its own, so that the service manager adopts it and a failed one is ended whole
//! (`DETACHED`). This is what Unix offers; elsewhere
//! (and for PID 1 of a container, whose exit ends the container) a restart falls back to the
//! supervisor's way: exit with the restart code.

mod sockets;

use std::io;
#[cfg(unix)]
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Mutex;
#[cfg(unix)]
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The variable naming the descriptor a successor writes its readiness to.
pub(crate) const READY_FD_ENV: &str = "PLANNED_STOP_READY_FD";
/// The pid that descriptor is meant for (a variable inherited further is ignored).
pub(crate) const READY_PID_ENV: &str = "PLANNED_STOP_READY_PID";
/// What a ready successor writes.
const READY_LINE: &[u8] = b"READY\n";

/// Why a restart in place did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum HandoverError {
    /// The successor could not be started at all.
    #[error(
        "cannot start the successor {exe}: {source}; check that the executable is there and runs"
    )]
    Spawn {
        /// The executable.
        exe: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The successor ended before it said it was ready.
    #[error("the successor (pid {pid}) ended before it was ready ({status}); its log says why")]
    EndedBeforeReady {
        /// Its pid.
        pid: u32,
        /// How it ended.
        status: String,
    },
    /// This process listens on sockets it did not give the crate: a successor could not bind
    /// them while this process serves them, so no successor is started.
    #[error(
        "restart in place cannot work here: this process listens on {0} socket(s) that were not \
         bound through planned_stop::web::listeners_or_bind (or web::Admin), so a successor \
         could not bind them while this process serves; bind every listening socket through \
         listeners_or_bind, or restart by exit code instead of in place"
    )]
    Unoffered(usize),
    /// The successor did not say it was ready in time, and was killed.
    #[error(
        "the successor (pid {pid}) was not ready within {within:?} and was killed; give it more \
         time to get ready, or find what holds its start"
    )]
    NotReadyInTime {
        /// Its pid.
        pid: u32,
        /// The time it had.
        within: Duration,
    },
}

/// How a planned restart is carried out here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartMode {
    /// The successor is started and handed the sockets.
    InPlace,
    /// The process exits with the restart code, for its supervisor; the reason, when restart in
    /// place was asked for and cannot work here.
    BySupervisor(Option<&'static str>),
}

/// The one decision: restart in place when it was asked for, on Unix, and not as PID 1.
///
/// ```
/// use planned_stop::internals::{RestartMode, restart_mode};
/// assert_eq!(restart_mode(false, 4242, true), RestartMode::BySupervisor(None));
/// assert_eq!(restart_mode(true, 4242, true), RestartMode::InPlace);
/// assert!(matches!(restart_mode(true, 1, true), RestartMode::BySupervisor(Some(_))));
/// assert!(matches!(restart_mode(true, 4242, false), RestartMode::BySupervisor(Some(_))));
/// ```
pub fn restart_mode(asked: bool, pid: u32, unix: bool) -> RestartMode {
    match (asked, pid, unix) {
        (false, _, _) => RestartMode::BySupervisor(None),
        (true, _, false) => {
            RestartMode::BySupervisor(Some("restart in place needs Unix descriptor passing"))
        }
        (true, 1, true) => RestartMode::BySupervisor(Some(
            "this process is PID 1 (of a container): its exit ends the container and the \
             successor with it; the orchestrator's rolling update is the restart there",
        )),
        (true, _, true) => RestartMode::InPlace,
    }
}

/// The name a handed-over socket carries in `LISTEN_FDNAMES` for the admin server
/// (`web::Admin`); every other socket is the application's (`http`).
pub(crate) const ADMIN_SOCKET: &str = "admin";
/// The name of the application's own sockets (`web::listeners_or_bind`).
pub(crate) const APP_SOCKET: &str = "http";

/// The sockets this process serves, each with its name, for a successor.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    listeners: Mutex<Vec<(&'static str, std::net::TcpListener)>>,
}

impl Handover {
    /// Keeps a duplicate of `listener`, to hand to a successor under `name` (`APP_SOCKET`,
    /// `ADMIN_SOCKET`).
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(crate) fn offer(
        &self,
        name: &'static str,
        listener: &std::net::TcpListener,
    ) -> io::Result<()> {
        let copy = listener.try_clone()?;
        if let Ok(mut listeners) = self.listeners.lock() {
            listeners.push((name, copy));
        }
        Ok(())
    }

    /// Duplicates of the sockets offered, with their names, for one successor.
    #[cfg(unix)]
    fn sockets(&self) -> io::Result<Vec<(&'static str, OwnedFd)>> {
        let listeners = self
            .listeners
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?;
        let mut sockets = listeners
            .iter()
            .map(|(name, l)| l.try_clone().map(|l| (*name, OwnedFd::from(l))))
            .collect::<io::Result<Vec<_>>>()?;
        // The application's first, at descriptors 3, 4, …, whenever the admin server was bound.
        sockets.sort_by_key(|(name, _)| *name != APP_SOCKET);
        Ok(sockets)
    }
}

/// A successor started and not yet ready.
#[cfg(unix)]
#[derive(Debug)]
pub(crate) struct Starting {
    /// The process group the successor runs in (the pid of the shell that started it, which has
    /// exited): a failed hand-over ends the whole group, wrapper scripts' children included.
    group: u32,
    ready: OwnedFd,
}

/// The shell that starts the successor detached: it starts a second shell in the background,
/// which exports its own pid (`$$`) for the sockets and the readiness pipe and then becomes the
/// executable (`exec` keeps the pid); the first shell tells that pid over the readiness pipe and
/// exits. Why twice: the successor must not be this process's child. A process that is the unit's
/// main process (`MAINPID=`) but not systemd's own child is "alien" to systemd, which then does not
/// wait for it at a stop and SIGKILLs it at once (it did so under a real systemd). Orphaned, the
/// successor is adopted by the service manager (PID 1 or the nearest subreaper) before it is ready.
/// `<&0` keeps standard input (a background job's would be /dev/null).
#[cfg(unix)]
const DETACHED: &str = "/bin/sh -c 'export LISTEN_PID=$$ PLANNED_STOP_READY_PID=$$; \
                        exec \"$0\" \"$@\"' \"$0\" \"$@\" <&0 & \
                        echo \"PID $!\" >&\"$PLANNED_STOP_READY_FD\"";

#[cfg(unix)]
impl Handover {
    /// Starts the successor with the sockets and the readiness pipe.
    pub(crate) fn start_successor(&self) -> Result<Starting, HandoverError> {
        use command_fds::{CommandFdExt, FdMapping};
        use std::os::unix::process::CommandExt;
        let exe = executable_on_disk();
        let spawn = |source| HandoverError::Spawn {
            exe: exe.clone(),
            source,
        };
        let sockets = self.sockets().map_err(spawn)?;
        let (ready, ready_w) = cloexec_pipe().map_err(|e| spawn(e.into()))?;
        let n = sockets.len();
        let names: Vec<&str> = sockets.iter().map(|(name, _)| *name).collect();
        let mut command = std::process::Command::new("/bin/sh");
        command
            .args(["-c", DETACHED])
            .arg(&exe)
            .args(std::env::args_os().skip(1))
            .env("LISTEN_FDS", n.to_string())
            .env("LISTEN_FDNAMES", names.join(":"))
            .env(READY_FD_ENV, (3 + n).to_string())
            .process_group(0);
        let mut mappings: Vec<FdMapping> = sockets
            .into_iter()
            .enumerate()
            .map(|(i, (_, fd))| FdMapping {
                parent_fd: fd,
                child_fd: 3 + i as i32,
            })
            .collect();
        mappings.push(FdMapping {
            parent_fd: ready_w,
            child_fd: 3 + n as i32,
        });
        command
            .fd_mappings(mappings)
            .map_err(|e| spawn(io::Error::other(e)))?;
        let mut shell = command.spawn().map_err(spawn)?;
        // The command (and with it this process's copy of the pipe's write end) is dropped here:
        // the pipe reads end-of-file once the successor has closed or lost its end.
        drop(command);
        // The first shell exits as soon as the successor is started in the background.
        let _ = shell.wait();
        let group = shell.id();
        tracing::info!(group, exe = %exe.display(), sockets = n,
            "restart in place: the successor is starting");
        Ok(Starting { group, ready })
    }
}

/// In a hand-over's slot: the stop that cancelled the hand-over came before the successor
/// was spawned.
pub(crate) const CANCELLED: u32 = u32::MAX;

/// Ends the process group `group` (a successor and whatever it started) with `signal`.
#[cfg(unix)]
pub(crate) fn end_group(group: u32, signal: rustix::process::Signal) {
    if let Some(pgid) = rustix::process::Pid::from_raw(group as i32).filter(|_| group != CANCELLED)
    {
        let _ = rustix::process::kill_process_group(pgid, signal);
    }
}

/// What a readiness pipe said so far: the successor's pid (from the shell that started it) and
/// whether it said it is ready. Pure, so every reading goes through one parser.
#[cfg(unix)]
fn readiness(said: &[u8]) -> (Option<u32>, bool) {
    let text = String::from_utf8_lossy(said);
    let mut pid = None;
    let mut ready = false;
    // Only whole lines count: the last one may still be arriving.
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    for line in complete.lines() {
        if let Some(n) = line.strip_prefix("PID ") {
            pid = n.trim().parse().ok();
        } else if line.as_bytes() == &READY_LINE[..READY_LINE.len() - 1] {
            ready = true;
        }
    }
    (pid, ready)
}

#[cfg(unix)]
impl Starting {
    /// Puts the successor's process group in `slot`, unless a stop cancelled the hand-over
    /// first: the successor is stopped then (SIGTERM), and the hand-over ends as failed.
    pub(crate) fn unless_cancelled(
        self,
        slot: &std::sync::atomic::AtomicU32,
    ) -> Result<Starting, HandoverError> {
        match slot.compare_exchange(0, self.group, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => Ok(self),
            Err(_) => {
                end_group(self.group, rustix::process::Signal::TERM);
                Err(HandoverError::EndedBeforeReady {
                    pid: self.group,
                    status: "stopped: a stop of this process began first".into(),
                })
            }
        }
    }

    /// Blocks until the successor says it is ready (its pid), or fails: it closed its end of the
    /// pipe first (it ended, or closed it and runs on), or `within` passed. A failed successor's
    /// whole process group is killed, so exactly this process is left serving. Runs on a
    /// blocking thread.
    pub(crate) fn wait_ready(self, within: Duration) -> Result<u32, HandoverError> {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let deadline = std::time::Instant::now() + within;
        let mut said = Vec::new();
        let failed = |said: &[u8], e: HandoverError| {
            end_group(self.group, rustix::process::Signal::KILL);
            tracing::warn!(
                group = self.group,
                pid = readiness(said).0,
                "the successor's process group was killed"
            );
            Err(e)
        };
        loop {
            let (pid, ready) = readiness(&said);
            if ready {
                return Ok(pid.unwrap_or(self.group));
            }
            let pid = pid.unwrap_or(self.group);
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let timeout = Timespec::try_from(left).ok();
            let mut fds = [PollFd::new(&self.ready, PollFlags::IN)];
            let polled = rustix::event::poll(&mut fds, timeout.as_ref());
            if matches!(polled, Ok(0)) || left.is_zero() {
                return failed(&said, HandoverError::NotReadyInTime { pid, within });
            }
            let mut buf = [0u8; 64];
            match rustix::io::read(&self.ready, &mut buf) {
                Ok(0) => {
                    let status = "it closed its readiness pipe without saying it is ready (it \
                                  ended, or runs on without it)";
                    return failed(
                        &said,
                        HandoverError::EndedBeforeReady {
                            pid,
                            status: status.into(),
                        },
                    );
                }
                // A successor that says more than a few lines is not one of ours.
                Ok(n) if said.len() + n <= 256 => said.extend_from_slice(&buf[..n]),
                Ok(_) => {
                    let status = "its readiness pipe carried something else than READY".into();
                    return failed(&said, HandoverError::EndedBeforeReady { pid, status });
                }
                Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
                Err(e) => {
                    let status = format!("its readiness pipe failed: {e}");
                    return failed(&said, HandoverError::EndedBeforeReady { pid, status });
                }
            }
        }
    }
}

/// A pipe whose ends are not inherited by anything else this process starts meanwhile.
#[cfg(unix)]
fn cloexec_pipe() -> rustix::io::Result<(OwnedFd, OwnedFd)> {
    #[cfg(not(any(target_os = "macos", target_os = "ios")))]
    {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
    }
    // Apple has no pipe2: the flags are set right after (a fork in that instant could inherit
    // them; it would hold the pipe open, which only delays a failed successor's end-of-file).
    #[cfg(any(target_os = "macos", target_os = "ios"))]
    {
        let (r, w) = rustix::pipe::pipe()?;
        for fd in [&r, &w] {
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)?;
        }
        Ok((r, w))
    }
}

/// The executable as it is on disk now: a deploy replaces the file, and `/proc/self/exe` then
/// names the old one's path with " (deleted)" after it.
fn executable_on_disk() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    match exe.to_str().and_then(|s| s.strip_suffix(" (deleted)")) {
        Some(path) => PathBuf::from(path),
        None => exe,
    }
}

/// The listening sockets handed to this process (`LISTEN_FDS`, `LISTEN_FDNAMES` for its own
/// pid), each with its name and whether it was taken: read once, the first time anything asks.
/// One place for the fact "handed and taken", shared by the web server, the admin server and
/// the readiness check.
static HANDED: Mutex<Option<Vec<(i32, String, bool)>>> = Mutex::new(None);

/// Runs `f` on the handed-over sockets, reading them first if nothing has.
fn with_handed<T>(f: impl FnOnce(&mut Vec<(i32, String, bool)>) -> T) -> io::Result<T> {
    let mut handed = HANDED
        .lock()
        .map_err(|_| io::Error::other("the handed-over sockets' registry is poisoned"))?;
    if handed.is_none() {
        #[cfg(unix)]
        let read: Vec<(i32, String, bool)> = {
            #[cfg(any(feature = "actix-web", feature = "systemd"))]
            let fds: Vec<i32> = sd_notify::listen_fds()?.collect();
            // Without the web server nothing here can serve them; they are only counted.
            #[cfg(not(any(feature = "actix-web", feature = "systemd")))]
            let fds: Vec<i32> = {
                let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<i32>().ok());
                let mine = var("LISTEN_PID") == i32::try_from(std::process::id()).ok();
                let n = var("LISTEN_FDS")
                    .filter(|_| mine)
                    .unwrap_or(0)
                    .clamp(0, 1024);
                (3..3 + n).collect()
            };
            // Names that do not match the count (or none) name nothing: "unknown", as
            // sd_listen_fds_with_names(3) says, so every socket is the application's.
            let names: Vec<String> = std::env::var("LISTEN_FDNAMES")
                .ok()
                .map(|names| names.split(':').map(str::to_owned).collect())
                .filter(|names: &Vec<String>| names.len() == fds.len())
                .unwrap_or_else(|| vec!["unknown".into(); fds.len()]);
            fds.into_iter()
                .zip(names)
                .map(|(fd, name)| (fd, name, false))
                .collect()
        };
        #[cfg(not(unix))]
        let read = Vec::new();
        *handed = Some(read);
    }
    Ok(f(handed.get_or_insert_with(Vec::new)))
}

/// Takes the handed-over sockets for the admin server (`admin`: those named `ADMIN_SOCKET`)
/// or for the application (every other one): their descriptors, each taken once. Empty when
/// none was handed for that role; an error when they were, and were taken already.
#[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
pub(crate) fn take_handed(admin: bool) -> io::Result<Vec<i32>> {
    with_handed(|handed| {
        let mine = |name: &str| (name == ADMIN_SOCKET) == admin;
        let all = handed.iter().filter(|(_, name, _)| mine(name)).count();
        let taken: Vec<i32> = handed
            .iter_mut()
            .filter(|(_, name, taken)| mine(name) && !*taken)
            .map(|(fd, _, taken)| {
                *taken = true;
                *fd
            })
            .collect();
        if all > 0 && taken.is_empty() {
            return Err(io::Error::other(
                "the listening sockets handed to this process were taken already: take them once",
            ));
        }
        Ok(taken)
    })?
}

/// How many listening sockets were handed to this process and not taken (by the application or
/// the admin server).
pub(crate) fn untaken_sockets() -> usize {
    with_handed(|handed| handed.iter().filter(|(_, _, taken)| !taken).count()).unwrap_or(0)
}

/// Whether this process already told its predecessor it is ready.
#[cfg(unix)]
static SIGNALLED: AtomicBool = AtomicBool::new(false);

/// In a successor: tells the predecessor this process is ready (once); returns whether it did. A
/// no-op in a process no predecessor started (the variables are absent, or meant for another
/// pid).
pub(crate) fn signal_ready() -> bool {
    #[cfg(unix)]
    {
        let meant_for_me = std::env::var(READY_PID_ENV)
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            == Some(std::process::id());
        let fd = std::env::var(READY_FD_ENV)
            .ok()
            .and_then(|f| f.parse::<i32>().ok());
        let (true, Some(fd)) = (meant_for_me, fd) else {
            return false;
        };
        if fd < 3 || SIGNALLED.load(Ordering::SeqCst) {
            return false;
        }
        if let Err(what) = inherited_pipe(fd) {
            tracing::warn!(
                fd,
                "{READY_FD_ENV} names descriptor {fd} for this process, but {what}: it is not a \
                 readiness pipe a predecessor handed over, so it is left alone (remove the \
                 variable from the environment if no restart in place started this process)"
            );
            return false;
        }
        if SIGNALLED.swap(true, Ordering::SeqCst) {
            return false;
        }
        use std::os::fd::FromRawFd;
        // SAFETY: `fd` is the write end of a pipe inherited across this process's exec
        // (`inherited_pipe`: nothing this process opened itself is without close-on-exec), meant
        // for this very pid (checked above); nothing else in this process owns it, and
        // `SIGNALLED` makes this the one place that takes it, once.
        let pipe = unsafe { OwnedFd::from_raw_fd(fd) };
        if let Err(e) = rustix::io::write(&pipe, READY_LINE) {
            tracing::warn!(error = %e, "cannot tell the predecessor this process is ready");
        }
        drop(pipe);
        tracing::info!("told the predecessor this process is ready: it stops accepting now");
        true
    }
    #[cfg(not(unix))]
    false
}

/// Whether `fd` is provably the readiness pipe a predecessor handed over, or what it is instead:
/// open, a pipe, its write end only, and inherited across the exec (without close-on-exec).
/// Everything Rust's standard library, tokio and mio open is close-on-exec, so a descriptor the
/// runtime owns fails the last test even when the environment names it for this pid.
#[cfg(unix)]
fn inherited_pipe(fd: i32) -> Result<(), &'static str> {
    use rustix::fs::{FileType, OFlags};
    // SAFETY: the borrow is used only for the three queries below, each a system call the
    // kernel checks (a descriptor that is not open fails with EBADF); nothing is read, written
    // or closed through it.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let stat = rustix::fs::fstat(fd).map_err(|_| "it is not open")?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Fifo {
        return Err("it is not a pipe");
    }
    let mode = rustix::fs::fcntl_getfl(fd).map_err(|_| "its mode cannot be read")?;
    if mode & OFlags::RWMODE != OFlags::WRONLY {
        return Err("it is not a pipe's write end");
    }
    let flags = rustix::io::fcntl_getfd(fd).map_err(|_| "its flags cannot be read")?;
    if flags.contains(rustix::io::FdFlags::CLOEXEC) {
        return Err("this process opened it itself (close-on-exec)");
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::{cloexec_pipe, inherited_pipe, readiness};
    use std::os::fd::AsRawFd;

    #[test]
    fn only_an_inherited_pipe_write_end_counts_as_the_readiness_pipe() {
        let (r, w) = cloexec_pipe().unwrap();
        assert_eq!(
            inherited_pipe(w.as_raw_fd()),
            Err("this process opened it itself (close-on-exec)")
        );
        rustix::io::fcntl_setfd(&w, rustix::io::FdFlags::empty()).unwrap();
        rustix::io::fcntl_setfd(&r, rustix::io::FdFlags::empty()).unwrap();
        assert_eq!(inherited_pipe(w.as_raw_fd()), Ok(()));
        assert_eq!(
            inherited_pipe(r.as_raw_fd()),
            Err("it is not a pipe's write end")
        );
        let file = tempfile::tempfile().unwrap();
        rustix::io::fcntl_setfd(&file, rustix::io::FdFlags::empty()).unwrap();
        assert_eq!(inherited_pipe(file.as_raw_fd()), Err("it is not a pipe"));
        // A number no process can have open (above any descriptor limit).
        assert_eq!(inherited_pipe(i32::MAX), Err("it is not open"));
    }

    #[test]
    fn the_readiness_pipe_is_read_in_whole_lines() {
        assert_eq!(readiness(b""), (None, false));
        assert_eq!(readiness(b"PID 42\n"), (Some(42), false));
        assert_eq!(readiness(b"PID 42\nREADY\n"), (Some(42), true));
        // A line still arriving counts for nothing yet.
        assert_eq!(readiness(b"PID 4"), (None, false));
        assert_eq!(readiness(b"PID 42\nREAD"), (Some(42), false));
        // A successor of an earlier release says READY without the shell's pid line.
        assert_eq!(readiness(b"READY\n"), (None, true));
        assert_eq!(readiness(b"PID x\nREADYX\n"), (None, false));
    }
}

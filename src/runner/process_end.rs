//! The end of the process: `main` owns it; the runner only keeps its code.
//!
//! `main` returns the code [`crate::ServiceHandle::stopped`] (or `web::serve`) resolves to. But
//! `main` can be written many ways: `main -> io::Result<()>` returns `Ok(())` (exit 0) after an
//! unexpected stop, a panic exits 101, a server run with `block_on` never returns. None of that
//! may turn a verdict into another exit code, so when the runner owns the process's exit (the
//! builder's `owns_process_exit`, on by default):
//!
//! - once `main` has returned (or anything calls `exit`) with another code, an `atexit` handler
//!   ends the process with the verdict's code instead (`_exit`; Rust's stdout is flushed and
//!   `main`'s error or panic printed before `exit` is reached);
//! - a concluded stop whose `main` has not returned within the exit grace is ended by a thread;
//! - the overrun watchdog ends a drain past all its deadlines ([`end_forced`]).
//!
//! Nothing else ends the process. With the switch off, nothing here is armed.

use crate::lifecycle::StopVerdict;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// No owned runner: the process ends as `main` says.
const UNOWNED: i64 = i64::MIN;
/// An owned runner is running; the low 32 bits hold its unexpected code.
const RUNNING: i64 = 1 << 40;
/// The stop concluded; the low 32 bits hold the code the process must end with.
const CONCLUDED: i64 = 2 << 40;

static STATE: AtomicI64 = AtomicI64::new(UNOWNED);

fn pack(tag: i64, code: i32) -> i64 {
    tag | i64::from(code as u32)
}

fn unpack(state: i64) -> Option<(i64, i32)> {
    (state != UNOWNED).then_some((state & !0xffff_ffff, state as u32 as i32))
}

/// `code` as the status the OS reports: one that does not fit in a byte is a failure, never 0
/// (the OS would keep only its low byte, and 256 would read as success).
pub(crate) fn status_of(code: i32) -> u8 {
    u8::try_from(code).unwrap_or(1)
}

/// An owned runner started: from now on the process must not end with another code than the
/// runner's. Installs the `atexit` handler (once per process).
pub(crate) fn arm(unexpected: i32) {
    install_at_exit();
    STATE.store(pack(RUNNING, unexpected), Ordering::SeqCst);
}

/// The stop concluded with `code`: the process ends with it, by `main`'s return within `grace`
/// or by a thread after it.
pub(crate) fn concluded(code: i32, verdict: Option<StopVerdict>, grace: Duration) {
    STATE.store(pack(CONCLUDED, code), Ordering::SeqCst);
    let spawned = std::thread::Builder::new()
        .name("planned-stop-exit".into())
        .spawn(move || {
            std::thread::sleep(grace);
            tracing::warn!(
                code,
                grace_ms = grace.as_millis() as u64,
                "the stop concluded but main has not returned within the exit grace (a server \
                 run by block_on, which stopping the actix System does not end?); ending the process with the \
                 verdict's code"
            );
            end_forced(code, verdict);
        });
    if let Err(e) = spawned {
        // The `atexit` handler still keeps the code; only a `main` that never returns is left.
        tracing::warn!(error = %e, "cannot start the exit thread; the process ends when main returns");
    }
}

/// A runner dropped before its stop concluded (its `System` ended, it panicked): the process
/// ends with `code` whenever and however `main` ends. No thread: `main` is ending already, or
/// goes on and says so itself.
pub(crate) fn aborted(code: i32) {
    STATE.store(pack(CONCLUDED, code), Ordering::SeqCst);
}

/// What the application is told when the library ends the process itself: see
/// [`crate::ServiceBuilder::on_forced_exit`].
pub(crate) type ForcedExitHook = Box<dyn Fn(i32, Option<StopVerdict>) + Send + Sync>;

static HOOK: OnceLock<ForcedExitHook> = OnceLock::new();

/// Sets the hook [`end_forced`] calls (the first one set stays: there is one process end).
pub(crate) fn on_forced_exit(hook: ForcedExitHook) {
    let _ = HOOK.set(hook);
}

/// Ends the process with `code` because the library decided so, not `main` (a guard, the
/// watchdog, the exit grace passing): the application's hook has its last word first.
pub(crate) fn end_forced(code: i32, verdict: Option<StopVerdict>) -> ! {
    STATE.store(pack(CONCLUDED, code), Ordering::SeqCst);
    if let Some(hook) = HOOK.get() {
        hook(code, verdict);
    }
    end(code)
}

/// Ends the process with `code` now, and makes sure nothing changes it on the way out.
fn end(code: i32) -> ! {
    STATE.store(pack(CONCLUDED, code), Ordering::SeqCst);
    std::process::exit(i32::from(status_of(code)))
}

fn install_at_exit() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `atexit` (C11 7.22.4.2; the Windows CRT has it too) registers a function with
        // no arguments, called once during `exit` on the thread that called `exit`. No
        // maintained crate wraps it (rustix does not; the std library has no hook for the
        // process's end). The handler reads an atomic and may call `_exit`, which is allowed
        // in an `atexit` handler.
        let registered = unsafe { libc::atexit(at_exit) };
        if registered != 0 {
            tracing::warn!(
                "cannot register the exit handler: a main that returns another code than the \
                 verdict's is not corrected"
            );
        }
    });
}

/// Called by `exit` (from `main`'s return, `std::process::exit`, libtest): keeps the runner's
/// code.
extern "C" fn at_exit() {
    let Some((tag, code)) = unpack(STATE.load(Ordering::SeqCst)) else {
        return;
    };
    if tag == RUNNING {
        // Not through `tracing`: subscribers may already be torn down.
        eprintln!(
            "planned-stop: the process is ending while its runner has not concluded a stop; \
             exiting with the unexpected code {code}"
        );
    }
    // SAFETY: `_exit` ends the process at once with the given status; it never returns and has
    // no preconditions. `exit` must not be called again from an `atexit` handler, `_exit` may.
    unsafe { libc::_exit(i32::from(status_of(code))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip_with_any_code() {
        for code in [0, 1, 75, 255, 256, -1, i32::MIN, i32::MAX] {
            assert_eq!(unpack(pack(RUNNING, code)), Some((RUNNING, code)));
            assert_eq!(unpack(pack(CONCLUDED, code)), Some((CONCLUDED, code)));
        }
        assert_eq!(unpack(UNOWNED), None);
    }

    #[test]
    fn a_code_that_does_not_fit_a_byte_is_a_failure() {
        assert_eq!(status_of(0), 0);
        assert_eq!(status_of(75), 75);
        assert_eq!(status_of(256), 1);
        assert_eq!(status_of(-1), 1);
    }
}

//! OS signals and Windows console events, turned into [`OsSignal`] messages for the runner.
//!
//! Signals feed the same state machine as markers: the runner decides what each one means (see
//! [`crate::lifecycle`]). This module only listens and forwards:
//!
//! | OS | event | becomes |
//! |---|---|---|
//! | Unix | `SIGTERM` | [`SignalKind::Terminate`]: planned only if our marker is there to claim |
//! | Unix | `SIGINT` (Ctrl-C) | [`SignalKind::Interrupt`]: planned; a second one forces the stop |
//! | Unix | `SIGHUP` | [`SignalKind::Hangup`]: like `SIGTERM` — a closed terminal is nobody's plan |
//! | Windows | `CTRL_C_EVENT`, `CTRL_BREAK_EVENT` | [`SignalKind::Interrupt`] |
//! | Windows | `CTRL_CLOSE_EVENT`, `CTRL_SHUTDOWN_EVENT` | [`SignalKind::Terminate`] |
//!
//! `SIGQUIT` and `SIGKILL` are left alone: the first asks for a core dump, the second cannot be caught.
//! On Windows a service stopped with `TerminateProcess` (`taskkill /F`) gets no event at all, which is
//! why the marker exists.
//!
//! Installing a handler replaces the OS default for the life of the process (tokio never uninstalls
//! one), so it is done once, by [`listen`], when the service starts.

use crate::lifecycle::SignalKind;
use crate::runner::OsSignal;
use actix::Recipient;
use std::io;

/// Starts forwarding signals to `runner` on the current actix system. Errors when a handler cannot
/// be installed (for example, no signal support on this platform).
pub(crate) fn listen(runner: Recipient<OsSignal>) -> io::Result<()> {
    os::listen(runner)
}

/// Hands one signal to the runner. Never dropped: `do_send` queues even when the runner's
/// mailbox is full (a burst of messages must not cost the process its SIGTERM). Returns `false`
/// once the runner is gone, so the listener can end.
fn forward(runner: &Recipient<OsSignal>, kind: SignalKind) -> bool {
    if !runner.connected() {
        return false;
    }
    runner.do_send(OsSignal(kind));
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix::prelude::*;
    use std::sync::{Arc, Mutex};

    /// A runner stand-in with a mailbox of one.
    struct Tiny(Arc<Mutex<Vec<SignalKind>>>);

    impl Actor for Tiny {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Context<Self>) {
            ctx.set_mailbox_capacity(1);
        }
    }

    impl Handler<OsSignal> for Tiny {
        type Result = ();
        fn handle(&mut self, OsSignal(kind): OsSignal, _: &mut Context<Self>) {
            self.0.lock().unwrap().push(kind);
        }
    }

    #[test]
    fn signals_are_delivered_even_when_the_runner_mailbox_is_full() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let delivered = System::new().block_on({
            let seen = seen.clone();
            async move {
                let runner = Tiny(seen).start();
                tokio::task::yield_now().await;
                // Five signals before the runner gets to run: four over its mailbox capacity.
                let recipient = runner.recipient();
                let all = [
                    SignalKind::Hangup,
                    SignalKind::Terminate,
                    SignalKind::Interrupt,
                ];
                let sent: Vec<bool> = all
                    .iter()
                    .cycle()
                    .take(5)
                    .map(|&kind| forward(&recipient, kind))
                    .collect();
                for _ in 0..16 {
                    tokio::task::yield_now().await;
                }
                sent
            }
        });
        assert_eq!(delivered, [true; 5]);
        assert_eq!(seen.lock().unwrap().len(), 5, "none dropped");
    }
}

#[cfg(unix)]
mod os {
    use super::*;
    use tokio::signal::unix::{SignalKind as Unix, signal};

    /// See `signal(7)`.
    pub(super) fn listen(runner: Recipient<OsSignal>) -> io::Result<()> {
        let mut term = signal(Unix::terminate())?;
        let mut int = signal(Unix::interrupt())?;
        let mut hup = signal(Unix::hangup())?;
        actix::spawn(async move {
            loop {
                let kind = tokio::select! {
                    Some(()) = term.recv() => SignalKind::Terminate,
                    Some(()) = int.recv() => SignalKind::Interrupt,
                    Some(()) = hup.recv() => SignalKind::Hangup,
                    else => break,
                };
                if !forward(&runner, kind) {
                    break;
                }
            }
        });
        Ok(())
    }
}

#[cfg(windows)]
mod os {
    use super::*;
    use tokio::signal::windows::{ctrl_break, ctrl_c, ctrl_close, ctrl_shutdown};

    /// See "SetConsoleCtrlHandler" and "HandlerRoutine" in the Windows console documentation.
    pub(super) fn listen(runner: Recipient<OsSignal>) -> io::Result<()> {
        let mut c = ctrl_c()?;
        let mut brk = ctrl_break()?;
        let mut close = ctrl_close()?;
        let mut shutdown = ctrl_shutdown()?;
        actix::spawn(async move {
            loop {
                let kind = tokio::select! {
                    Some(()) = c.recv() => SignalKind::Interrupt,
                    Some(()) = brk.recv() => SignalKind::Interrupt,
                    Some(()) = close.recv() => SignalKind::Terminate,
                    Some(()) = shutdown.recv() => SignalKind::Terminate,
                    else => break,
                };
                if !forward(&runner, kind) {
                    break;
                }
            }
        });
        Ok(())
    }
}

#[cfg(not(any(unix, windows)))]
mod os {
    use super::*;

    pub(super) fn listen(_: Recipient<OsSignal>) -> io::Result<()> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no signal support on this platform",
        ))
    }
}

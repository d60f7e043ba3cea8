//! Listening sockets handed to this process, the way systemd hands them (`LISTEN_FDS`,
//! `LISTEN_PID`, `LISTEN_FDNAMES`): by a `.socket` unit, `systemd-socket-activate`, or any
//! supervisor that keeps the socket open across a restart.
//!
//! Why: a service that binds its own socket closes it when it stops, and every connection between
//! that close and the next start's bind is refused. A socket held by the service manager stays
//! open across the restart — the kernel keeps queueing connections while no process accepts — so
//! the next life serves them: a plain restart refuses nothing. [`listeners_or_bind`] takes such
//! sockets when the process has them and binds only when it has none; [`super::serve`] refuses to
//! run a server while sockets handed to this process lie unused, since a server bound elsewhere
//! would leave the handed-over sockets' queues to nobody.

use crate::service::ServiceHandle;
use std::io;
use std::net::{TcpListener, ToSocketAddrs};

/// The listening sockets handed to this process, or, when it has none, new ones bound to `addr`.
/// Pass each to `HttpServer::listen`:
///
/// ```no_run
/// # use actix_web::{App, HttpServer};
/// # fn g(stop: &planned_stop::ServiceHandle) -> std::io::Result<()> {
/// let server = planned_stop::web::listeners_or_bind(stop, "127.0.0.1:8080")?
///     .into_iter()
///     .try_fold(HttpServer::new(App::new), HttpServer::listen)?;
/// # Ok(()) }
/// ```
///
/// A handed-over socket that is not a listening TCP socket is an error naming it, as is a second
/// call once the sockets were taken.
pub fn listeners_or_bind(
    service: &ServiceHandle,
    addr: impl ToSocketAddrs,
) -> io::Result<Vec<TcpListener>> {
    let inherited = inherited_listeners()?;
    let listeners = if inherited.is_empty() {
        let mut bound = Vec::new();
        for addr in addr.to_socket_addrs()? {
            bound.push(TcpListener::bind(addr)?);
        }
        if bound.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no address to bind: give listeners_or_bind at least one",
            ));
        }
        bound
    } else {
        tracing::info!(
            sockets = inherited.len(),
            "serving the listening sockets handed to this process"
        );
        inherited
    };
    // Kept for a restart in place: the successor is handed these very sockets.
    for listener in &listeners {
        service
            .handover
            .offer(crate::handover::APP_SOCKET, listener)?;
    }
    Ok(listeners)
}

/// The listening TCP sockets handed to this process (`LISTEN_FDS` for its own pid) for the
/// application — every one but those named `admin` (`LISTEN_FDNAMES`), which are [`super::Admin`]'s
/// — taken once; empty when there are none.
pub fn inherited_listeners() -> io::Result<Vec<TcpListener>> {
    taken(false)
}

/// The handed-over sockets for the admin server (`admin`) or the application, as listeners.
pub(crate) fn taken(admin: bool) -> io::Result<Vec<TcpListener>> {
    #[cfg(unix)]
    {
        crate::handover::take_handed(admin)?
            .into_iter()
            .map(listener_of)
            .collect()
    }
    #[cfg(not(unix))]
    {
        let _ = admin;
        Ok(Vec::new())
    }
}

/// How many sockets were handed to this process and not taken, if any.
pub(crate) fn unused_inherited() -> Option<usize> {
    let untaken = crate::handover::untaken_sockets();
    (untaken > 0).then_some(untaken)
}

#[cfg(unix)]
fn listener_of(fd: std::os::fd::RawFd) -> io::Result<TcpListener> {
    use rustix::net::{SocketType, sockopt};
    use std::os::fd::{BorrowedFd, FromRawFd};
    // SAFETY: `fd` is one of the descriptors LISTEN_FDS hands to this very process (sd-notify
    // checked LISTEN_PID), open for the life of the process, and only borrowed here.
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    let listening = sockopt::socket_type(borrowed).is_ok_and(|t| t == SocketType::STREAM)
        && sockopt::socket_acceptconn(borrowed).unwrap_or(false);
    if !listening {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "descriptor {fd} handed to this process (LISTEN_FDS) is not a listening stream \
                 socket; hand over listening TCP sockets only"
            ),
        ));
    }
    // SAFETY: as above; `handover::take_handed` hands each descriptor out once, so this is its
    // one owner.
    Ok(unsafe { TcpListener::from_raw_fd(fd) })
}

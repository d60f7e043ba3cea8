//! What the descriptor table says of the sockets a process serves: listeners the application
//! bound itself (a successor could not bind them), and the connections a process that handed
//! over still holds. Reading the table is the one way Unix offers; no crate does it portably.

#[cfg(all(unix, feature = "actix-web"))]
use super::APP_SOCKET;
use super::Handover;

impl Handover {
    /// How many listening TCP sockets this process has open that were not offered: bound by the
    /// application itself, so a successor could not bind them while this process serves (it
    /// would fail with "address in use"). Reads the process's descriptor table (`/proc/self/fd`,
    /// or `/dev/fd`): blocking, for a blocking thread.
    #[cfg(unix)]
    pub(crate) fn unoffered_listeners(&self) -> usize {
        let offered: Vec<_> = match self.listeners.lock() {
            Ok(listeners) => listeners
                .iter()
                .filter_map(|(_, l)| rustix::fs::fstat(l).ok())
                .map(|st| (st.st_dev, st.st_ino))
                .collect(),
            Err(_) => return 0,
        };
        count_inet_sockets(|fd, st| {
            rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(false)
                && !offered.contains(&(st.st_dev, st.st_ino))
        })
    }

    /// How many connections this process holds, accepted on the application's offered sockets
    /// and not yet closed (queued to a worker or served): what a process that handed over waits
    /// for. Reads the descriptor table, as [`Self::unoffered_listeners`]: blocking.
    #[cfg(all(unix, feature = "actix-web"))]
    pub(crate) fn served_connections(&self) -> usize {
        let served: Vec<std::net::SocketAddr> = match self.listeners.lock() {
            Ok(listeners) => listeners
                .iter()
                .filter(|(name, _)| *name == APP_SOCKET)
                .filter_map(|(_, l)| l.local_addr().ok())
                .collect(),
            Err(_) => return 0,
        };
        if served.is_empty() {
            return 0;
        }
        count_inet_sockets(|fd, _| {
            let local = rustix::net::getsockname(fd)
                .ok()
                .and_then(|addr| std::net::SocketAddr::try_from(addr).ok());
            local.is_some_and(|local| served.iter().any(|l| accepted_on(*l, local)))
                && rustix::net::getpeername(fd).is_ok_and(|peer| peer.is_some())
                && !rustix::net::sockopt::socket_acceptconn(fd).unwrap_or(true)
        })
    }

    /// Elsewhere there is no restart in place, so nothing was handed over.
    #[cfg(all(not(unix), feature = "actix-web"))]
    pub(crate) fn served_connections(&self) -> usize {
        0
    }
}

/// Whether a connection whose local address is `local` was accepted on a listener bound to
/// `listener` (a wildcard address accepts on every address of its port).
#[cfg(all(unix, feature = "actix-web"))]
fn accepted_on(listener: std::net::SocketAddr, local: std::net::SocketAddr) -> bool {
    listener.port() == local.port()
        && (listener.ip().is_unspecified() || listener.ip() == local.ip())
}

/// Counts this process's open IPv4 and IPv6 sockets for which `counts` holds, from its
/// descriptor table (`/proc/self/fd`, or `/dev/fd`): blocking, for a blocking thread.
#[cfg(unix)]
fn count_inet_sockets(
    mut counts: impl FnMut(std::os::fd::BorrowedFd<'_>, &rustix::fs::Stat) -> bool,
) -> usize {
    use rustix::fs::FileType;
    let dir = std::fs::read_dir("/proc/self/fd").or_else(|_| std::fs::read_dir("/dev/fd"));
    let Ok(dir) = dir else { return 0 };
    dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&fd| {
            // SAFETY: only borrowed for the queries below, each a system call the kernel checks
            // (a descriptor closed meanwhile fails with EBADF); nothing is read, written or
            // closed through it.
            let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let Ok(st) = rustix::fs::fstat(fd) else {
                return false;
            };
            let inet = rustix::net::getsockname(fd).is_ok_and(|addr| {
                let family = addr.address_family();
                family == rustix::net::AddressFamily::INET
                    || family == rustix::net::AddressFamily::INET6
            });
            FileType::from_raw_mode(st.st_mode) == FileType::Socket && inet && counts(fd, &st)
        })
        .count()
}

#[cfg(all(test, unix, feature = "actix-web"))]
mod tests {
    use super::super::{ADMIN_SOCKET, APP_SOCKET, Handover};
    use std::net::{TcpListener, TcpStream};

    /// The connections a process that handed over waits for: those accepted on the
    /// application's offered sockets, queued or served, until they are closed; not the admin
    /// server's, not its own outgoing ones.
    #[test]
    fn a_connection_counts_from_its_accept_until_it_is_closed() {
        let handover = Handover::default();
        let app = TcpListener::bind("127.0.0.1:0").unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").unwrap();
        handover.offer(APP_SOCKET, &app).unwrap();
        handover.offer(ADMIN_SOCKET, &admin).unwrap();
        assert_eq!(
            handover.served_connections(),
            0,
            "listeners are no connections"
        );
        let _client = TcpStream::connect(app.local_addr().unwrap()).unwrap();
        let (accepted, _) = app.accept().unwrap();
        let _scraper = TcpStream::connect(admin.local_addr().unwrap()).unwrap();
        let (_scraped, _) = admin.accept().unwrap();
        assert_eq!(handover.served_connections(), 1, "the accepted one alone");
        drop(accepted);
        assert_eq!(handover.served_connections(), 0);
    }

    #[test]
    fn a_wildcard_listener_accepts_on_every_address_of_its_port() {
        let at = |s: &str| s.parse::<std::net::SocketAddr>().unwrap();
        assert!(super::accepted_on(at("0.0.0.0:80"), at("10.0.0.1:80")));
        assert!(super::accepted_on(at("[::]:80"), at("[::1]:80")));
        assert!(super::accepted_on(at("127.0.0.1:80"), at("127.0.0.1:80")));
        assert!(!super::accepted_on(at("127.0.0.1:80"), at("127.0.0.2:80")));
        assert!(!super::accepted_on(at("0.0.0.0:80"), at("10.0.0.1:81")));
    }
}

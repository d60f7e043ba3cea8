//! This host as the leases see it: its name and its process table.
//!
//! The lease rules (`lease.rs`) are pure and take an owner's [`Liveness`] as an argument; this is
//! where it is looked up. A store asks it through a probe it holds, so tests (and the conformance
//! suite) hand in their own answer instead of the process table.

use super::lease::{Liveness, Owner};
use crate::identity::ProcessIdentity;

/// The environment variable that names this host for leases instead of the system's host name
/// (containers whose host names repeat, tests that play several hosts).
pub const HOST_ENV: &str = "PLANNED_STOP_HOST";

/// This host's name for leases (read once): `PLANNED_STOP_HOST` when set, else the system's host
/// name, else `localhost`.
pub fn local_host() -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        std::env::var(HOST_ENV)
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                gethostname::gethostname()
                    .into_string()
                    .ok()
                    .filter(|h| !h.is_empty())
            })
            .unwrap_or_else(|| "localhost".to_owned())
    })
    .clone()
}

/// The process `identity` on this host, as the owner of leases.
pub(crate) fn this_process(identity: &ProcessIdentity) -> Owner {
    Owner::new(local_host(), identity.pid, identity.start)
}

/// Whether `owner` still runs, as far as this host can tell: a process on this host is looked up
/// by pid and start fingerprint, one on another host is [`Liveness::Unknown`].
pub fn liveness_here(owner: &Owner) -> Liveness {
    if owner.host != local_host() {
        return Liveness::Unknown;
    }
    if ProcessIdentity::is_running(owner.pid, owner.start) {
        Liveness::Alive
    } else {
        Liveness::Dead
    }
}

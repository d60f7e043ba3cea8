//! Whether the actix-web integration is used whole: pieces that only work under
//! [`crate::web::serve`] (readiness, status, `CloseWhenStopping`) mounted in an application whose
//! server runs without it are a silent half-integration — the server stops on its own with the
//! listener, in-flight requests are cut while the outcome says clean, and the application answers
//! after readiness says stopped. The service says so once, as a WARN naming what to do.
//!
//! Why events rather than one check at `ready()`: an `App` factory runs when the server's workers
//! start, which may be before or after `ready()`; whichever of "ready" and "mounted" comes last
//! decides, and `serve` is called before the server runs, so a whole integration never warns.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// What the application did so far.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Use {
    /// `ServiceHandle::ready` was called.
    pub(crate) ready: bool,
    /// The pieces mounted in an `App`, by name.
    pub(crate) mounted: Vec<&'static str>,
    /// A server runs under `web::serve`.
    pub(crate) served: bool,
    /// The warning was given.
    pub(crate) warned: bool,
}

/// Whether `u` is a half-used integration not yet told: ready, something mounted, nothing served.
pub(crate) fn half_used(u: &Use) -> bool {
    u.ready && !u.mounted.is_empty() && !u.served && !u.warned
}

/// The name [`crate::web::CloseWhenStopping`] is mounted under.
pub(crate) const CLOSE_WHEN_STOPPING: &str = "planned_stop::web::CloseWhenStopping";

/// Whether a server under `web::serve` keeps its keep-alive connections through a stop: no `App`
/// of `u`'s mounted `CloseWhenStopping`. Judged at the stop, since the `App` factories run when
/// the workers start, after `serve`.
pub(crate) fn keeps_connections(u: &Use) -> bool {
    !u.mounted.contains(&CLOSE_WHEN_STOPPING)
}

/// The service's record of it, shared by every clone of the handle.
#[derive(Debug, Default)]
pub(crate) struct Integration(Mutex<Use>);

impl Integration {
    /// What was recorded; a few flags and names stay meaningful whatever panicked while holding
    /// them, so a poisoned lock neither silences a warning nor hides a missing piece.
    fn lock(&self) -> MutexGuard<'_, Use> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies `change`; warns (once) when the integration is now half used. Returns whether it
    /// warned.
    fn note(&self, change: impl FnOnce(&mut Use)) -> bool {
        let mut u = self.lock();
        change(&mut u);
        if !half_used(&u) {
            return false;
        }
        u.warned = true;
        let mounted = u.mounted.join(", ");
        tracing::warn!(
            mounted,
            "planned_stop::web pieces are mounted in an App whose HttpServer does not run under \
             planned_stop::web::serve: that server stops on its own when the System does, cutting \
             in-flight requests while the stop says clean, and answering after readiness says \
             stopped. Run the server with planned_stop::web::serve(server, &service).await, or \
             mount status and readiness on planned_stop::web::Admin"
        );
        true
    }

    /// `ready()` was called.
    pub(crate) fn readied(&self) -> bool {
        self.note(|u| u.ready = true)
    }

    /// `what` was mounted in an application's `App`.
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(crate) fn mounted(&self, what: &'static str) -> bool {
        self.note(|u| {
            if !u.mounted.contains(&what) {
                u.mounted.push(what);
            }
        })
    }

    /// Whether the application's server keeps its keep-alive connections through a stop
    /// ([`keeps_connections`]).
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(crate) fn keeps_connections(&self) -> bool {
        keeps_connections(&self.lock())
    }

    /// A server runs under `web::serve`.
    #[cfg_attr(not(feature = "actix-web"), allow(dead_code))]
    pub(crate) fn served(&self) -> bool {
        self.note(|u| u.served = true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_used_integration_warns_once_whatever_the_order() {
        // ready, then mounted
        let i = Integration::default();
        assert!(!i.readied());
        assert!(i.mounted("readiness"));
        assert!(!i.mounted("status"), "once");
        // mounted, then ready
        let i = Integration::default();
        assert!(!i.mounted("CloseWhenStopping"));
        assert!(i.readied());
    }

    #[test]
    fn only_an_app_that_mounted_close_when_stopping_retires_its_connections() {
        let i = Integration::default();
        assert!(i.keeps_connections());
        i.mounted("readiness");
        assert!(i.keeps_connections());
        i.mounted(CLOSE_WHEN_STOPPING);
        assert!(!i.keeps_connections());
    }

    #[test]
    fn a_poisoned_record_still_warns_and_still_tells_what_was_mounted() {
        let i = std::sync::Arc::new(Integration::default());
        let poisoner = i.clone();
        let _ = std::thread::spawn(move || {
            let _held = poisoner.0.lock();
            panic!("poison the lock");
        })
        .join();
        assert!(i.0.is_poisoned());
        assert!(i.keeps_connections(), "nothing mounted: it keeps them");
        assert!(!i.readied());
        assert!(i.mounted("readiness"), "the half-used integration is told");
    }

    #[test]
    fn a_whole_integration_never_warns() {
        let i = Integration::default();
        assert!(!i.served());
        assert!(!i.readied());
        assert!(!i.mounted("readiness"));
        // served after ready but before the workers mount (the documented order)
        let i = Integration::default();
        assert!(!i.readied());
        assert!(!i.served());
        assert!(!i.mounted("readiness"));
        // nothing mounted: nothing to say
        let i = Integration::default();
        assert!(!i.readied());
    }
}

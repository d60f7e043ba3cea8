//! Wall-clock time for verdicts, replaceable in tests.
//!
//! Markers carry wall-clock times, so verdicts need "now" by the wall clock. The actors read it
//! through [`Clock`] rather than calling [`Utc::now`] themselves, so a test can drive marker ages
//! with tokio's paused clock instead of sleeping.

use chrono::{DateTime, Utc};

/// A source of the current wall-clock time.
///
/// ```
/// use planned_stop::internals::{Clock, SystemClock};
/// let before = chrono::Utc::now();
/// assert!(SystemClock.now() >= before);
/// ```
pub trait Clock: Send + Sync + 'static {
    /// Now.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
///
/// ```
/// use planned_stop::internals::{Clock, SystemClock};
/// let clock: std::sync::Arc<dyn Clock> = std::sync::Arc::new(SystemClock);
/// let _now = clock.now();
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

//! Stops, drains and the resume record as numbers, through the [`metrics`] facade (the `metrics`
//! feature).
//!
//! Why: an operator of a fleet graphs and alerts on what is otherwise only in logs and files —
//! planned versus unexpected stops, drains that overrun, items handed back but lost. A library
//! records through the facade and the application installs the exporter it wants (Prometheus,
//! StatsD, OpenTelemetry); without an installed recorder a recording costs a check of one
//! pointer.
//!
//! Every recording goes through one function here, named for the event, called where the event
//! happens: the runner (a stop accepted, a participant's answer, the stop concluded, the state)
//! and the service handle (a lease, a renewal, an acknowledgement). What an event counts as — an
//! item persisted, spilled or lost — is decided by the pure functions below ([`item_fates`],
//! the labels), shared by every caller. The names and labels are the table in
//! `docs/operations.md` ("Metrics"); `on::NAMES` is that table's first column, and a test keeps the
//! two the same.
//!
//! The recordings themselves are in `on` (names, labels, the facade's calls), compiled with the
//! feature only; without it the same functions are empty (`off`) and nothing of the facade is
//! compiled.

use crate::record::{Persisted, RecordError};

#[cfg(feature = "metrics")]
mod on;
#[cfg(feature = "metrics")]
pub(crate) use on::*;

#[cfg(not(feature = "metrics"))]
pub(crate) use off::*;

/// The same functions as `on`'s, empty: a build without the feature records nothing and
/// compiles nothing of the facade.
#[cfg(not(feature = "metrics"))]
mod off {
    use super::ItemFates;
    use crate::lifecycle::{DrainPhase, ProcessState, StopCause, StopVerdict};
    use crate::record::StopRecord;
    use chrono::{DateTime, Utc};

    pub(crate) fn describe() {}
    pub(crate) fn stop_accepted(
        _: StopCause,
        _: StopVerdict,
        _: Option<DateTime<Utc>>,
        _: DateTime<Utc>,
    ) {
    }
    pub(crate) fn participant_answered(_: &str, _: DrainPhase, _: bool) {}
    pub(crate) fn stop_concluded(_: &StopRecord, _: ItemFates) {}
    pub(crate) fn state(_: ProcessState) {}
    pub(crate) fn leased(_: usize) {}
    pub(crate) fn renewed(_: usize, _: usize) {}
    pub(crate) fn renewal_failed() {}
    pub(crate) fn task_panicked(_: &str) {}
    pub(crate) fn held_aside(_: &str) {}
    pub(crate) fn acknowledged() {}
}

/// Where the items a stop's participants handed back ended up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ItemFates {
    /// Everything handed back: the sum of the three below.
    pub(crate) handed_back: usize,
    /// Durable in the record store.
    pub(crate) persisted: usize,
    /// Durable in the store's fallback on this host.
    pub(crate) spilled: usize,
    /// In an ERROR log line only: no store configured, the persist failed, or the item is one no
    /// store may hold.
    pub(crate) lost: usize,
}

/// The one rule for [`ItemFates`]: `recorded` items went to the store (`persisted` says how
/// that went; `None` when no store is configured) and `unrecorded` ones (over the size limit,
/// or under an invalid id) were kept out of it.
pub(crate) fn item_fates(
    recorded: usize,
    unrecorded: usize,
    persisted: Option<&Result<Persisted, RecordError>>,
) -> ItemFates {
    let (persisted, spilled, lost) = match persisted {
        Some(Ok(Persisted::Durable)) => (recorded, 0, unrecorded),
        Some(Ok(Persisted::Spilled { .. })) => (0, recorded, unrecorded),
        Some(Err(_)) | None => (0, 0, recorded + unrecorded),
    };
    ItemFates {
        handed_back: recorded + unrecorded,
        persisted,
        spilled,
        lost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_handed_back_item_has_exactly_one_fate() {
        let failed: Result<Persisted, RecordError> = Err(RecordError::backend("down"));
        let spilled = Ok(Persisted::Spilled {
            reason: "down".into(),
        });
        let durable = Ok(Persisted::Durable);
        for (persisted, want) in [
            (Some(&durable), (3, 0, 2)),
            (Some(&spilled), (0, 3, 2)),
            (Some(&failed), (0, 0, 5)),
            (None, (0, 0, 5)),
        ] {
            let fates = item_fates(3, 2, persisted);
            assert_eq!((fates.persisted, fates.spilled, fates.lost), want);
            assert_eq!(fates.handed_back, 5);
        }
        assert_eq!(item_fates(0, 0, None), ItemFates::default());
    }
}

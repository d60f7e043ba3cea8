//! The recordings through the [`metrics`] facade, compiled with the `metrics` feature only:
//! every name, label and call of the facade is here, so one `cfg` keeps all of it out of a
//! build without the feature (`super` has the same functions, empty, for that build).

use super::ItemFates;
use crate::lifecycle::{DrainPhase, ProcessState, StopCause, StopVerdict};
use crate::record::StopRecord;
use chrono::{DateTime, Utc};

/// The metrics this crate records, with their kind and help text (the exporter's `# HELP`).
pub(crate) const NAMES: [(&str, Kind, &str); 19] = [
    (STOPS, Kind::Counter, "stops accepted, by cause and verdict"),
    (
        MARKER_TO_ACCEPT,
        Kind::Histogram,
        "seconds from a marker's writing to the stop's acceptance",
    ),
    (
        DRAIN,
        Kind::Histogram,
        "seconds from a stop's acceptance to the end of its drain",
    ),
    (DRAIN_PHASE, Kind::Histogram, "seconds each drain phase ran"),
    (
        PHASE_TIMEOUTS,
        Kind::Counter,
        "drain phases that ended at their deadline with answers missing",
    ),
    (
        UNANSWERED,
        Kind::Counter,
        "drain participants that never answered (their work is unknown)",
    ),
    (
        CUT,
        Kind::Counter,
        "drain answers that said work was cut short (in-flight requests, connections)",
    ),
    (
        HANDED_BACK,
        Kind::Counter,
        "items the participants handed back at a drain",
    ),
    (
        PERSISTED,
        Kind::Counter,
        "handed-back items made durable in the record store",
    ),
    (
        SPILLED,
        Kind::Counter,
        "handed-back items kept on this host because the record store was unreachable",
    ),
    (
        LOST,
        Kind::Counter,
        "handed-back items recorded nowhere but in an ERROR log line",
    ),
    (
        LEASED,
        Kind::Counter,
        "items leased to this process to resume",
    ),
    (RENEWED, Kind::Counter, "item leases renewed"),
    (
        ACKNOWLEDGED,
        Kind::Counter,
        "resumed items acknowledged (never offered again)",
    ),
    (
        LEASES_LOST,
        Kind::Counter,
        "leases this process held and found gone at a renewal (released, or taken over)",
    ),
    (
        RENEWAL_FAILURES,
        Kind::Counter,
        "lease renewals that failed (the record store was unreachable)",
    ),
    (
        STATE,
        Kind::Gauge,
        "the runner's state: 1 for the current one, 0 for the others",
    ),
    (
        TASK_PANICS,
        Kind::Counter,
        "tasks of a task group that panicked (their jobs are handed back at the drain)",
    ),
    (
        HELD_ASIDE,
        Kind::Counter,
        "resumed items held aside for a person after too many failed attempts",
    ),
];

const STOPS: &str = "planned_stop_stops_total";
const MARKER_TO_ACCEPT: &str = "planned_stop_marker_to_accept_seconds";
const DRAIN: &str = "planned_stop_drain_seconds";
const DRAIN_PHASE: &str = "planned_stop_drain_phase_seconds";
const PHASE_TIMEOUTS: &str = "planned_stop_drain_phase_timeouts_total";
const UNANSWERED: &str = "planned_stop_participants_unanswered_total";
const CUT: &str = "planned_stop_participants_cut_total";
const HANDED_BACK: &str = "planned_stop_items_handed_back_total";
const PERSISTED: &str = "planned_stop_items_persisted_total";
const SPILLED: &str = "planned_stop_items_spilled_total";
const LOST: &str = "planned_stop_items_lost_total";
const LEASED: &str = "planned_stop_items_leased_total";
const RENEWED: &str = "planned_stop_items_renewed_total";
const ACKNOWLEDGED: &str = "planned_stop_items_acknowledged_total";
const LEASES_LOST: &str = "planned_stop_leases_lost_total";
const RENEWAL_FAILURES: &str = "planned_stop_lease_renewal_failures_total";
const STATE: &str = "planned_stop_state";
const TASK_PANICS: &str = "planned_stop_task_panics_total";
const HELD_ASIDE: &str = "planned_stop_items_held_aside_total";

/// What a metric is, for its description.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Counter,
    Histogram,
    Gauge,
}

/// The `cause` label: `marker`, `signal_terminate`, `signal_interrupt`, `signal_hangup` or
/// `request`.
pub(crate) fn cause_label(cause: StopCause) -> &'static str {
    cause.as_str()
}

/// The `verdict` label: `planned` or `unexpected`.
pub(crate) fn verdict_label(verdict: StopVerdict) -> &'static str {
    verdict.as_str()
}

/// The `phase` label: `ingress`, `work` or `final`.
pub(crate) fn phase_label(phase: DrainPhase) -> &'static str {
    match phase {
        DrainPhase::Ingress => "ingress",
        DrainPhase::Work => "work",
        DrainPhase::Final => "final",
    }
}

/// The `state` label: `starting` (or held), `running` (or handing over), `draining` or `stopped`
/// (in any final state): four values a dashboard can count on.
pub(crate) fn state_label(state: ProcessState) -> &'static str {
    match state {
        state if state.is_starting() => "starting",
        state if state.is_serving() => "running",
        ProcessState::Draining => "draining",
        _ => "stopped",
    }
}

/// Every state's label, for the gauge's zeroes.
const STATES: [ProcessState; 4] = [
    ProcessState::Starting,
    ProcessState::Running,
    ProcessState::Draining,
    ProcessState::Stopped,
];

/// Gives every metric its help text and unit, once per process (at the first service start), so
/// an exporter's output explains itself.
pub(crate) fn describe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (name, kind, help) in NAMES {
            let unit = if name.ends_with("_seconds") {
                metrics::Unit::Seconds
            } else {
                metrics::Unit::Count
            };
            match kind {
                Kind::Counter => metrics::describe_counter!(name, unit, help),
                Kind::Histogram => metrics::describe_histogram!(name, unit, help),
                Kind::Gauge => metrics::describe_gauge!(name, unit, help),
            }
        }
    });
}

/// A stop was accepted (the drain begins): counted by cause and verdict, and, when a marker
/// asked for it, the time from the marker's writing to now.
pub(crate) fn stop_accepted(
    cause: StopCause,
    verdict: StopVerdict,
    written_at: Option<DateTime<Utc>>,
    accepted_at: DateTime<Utc>,
) {
    metrics::counter!(STOPS, "cause" => cause_label(cause), "verdict" => verdict_label(verdict))
        .increment(1);
    if let Some(written_at) = written_at {
        metrics::histogram!(MARKER_TO_ACCEPT).record(seconds_between(written_at, accepted_at));
    }
}

/// A drain participant answered; `cut`: it said work was cut short.
pub(crate) fn participant_answered(participant: &str, phase: DrainPhase, cut: bool) {
    if cut {
        metrics::counter!(CUT, "participant" => participant.to_owned(), "phase" => phase_label(phase))
            .increment(1);
    }
}

/// A stop concluded with `record`: its drain's durations, who never answered, and where its
/// items ended up.
pub(crate) fn stop_concluded(record: &StopRecord, fates: ItemFates) {
    metrics::histogram!(DRAIN).record(seconds_between(record.accepted_at, record.finished_at));
    for phase in &record.phases {
        let label = phase_label(phase.phase);
        metrics::histogram!(DRAIN_PHASE, "phase" => label)
            .record(seconds_between(phase.started_at, phase.finished_at));
        if phase.timed_out {
            metrics::counter!(PHASE_TIMEOUTS, "phase" => label).increment(1);
        }
    }
    for participant in &record.unanswered {
        metrics::counter!(UNANSWERED, "participant" => participant.clone()).increment(1);
    }
    metrics::counter!(HANDED_BACK).increment(count(fates.handed_back));
    metrics::counter!(PERSISTED).increment(count(fates.persisted));
    metrics::counter!(SPILLED).increment(count(fates.spilled));
    metrics::counter!(LOST).increment(count(fates.lost));
}

/// The runner's state changed to `state`.
pub(crate) fn state(state: ProcessState) {
    for each in STATES {
        let value = if state_label(each) == state_label(state) {
            1.0
        } else {
            0.0
        };
        metrics::gauge!(STATE, "state" => state_label(each)).set(value);
    }
}

/// `n` items were leased to this process.
pub(crate) fn leased(n: usize) {
    metrics::counter!(LEASED).increment(count(n));
}

/// A renewal: `renewed` leases kept, `lost` found gone.
pub(crate) fn renewed(renewed: usize, lost: usize) {
    metrics::counter!(RENEWED).increment(count(renewed));
    if lost > 0 {
        metrics::counter!(LEASES_LOST).increment(count(lost));
    }
}

/// A renewal failed (the record store was unreachable).
pub(crate) fn renewal_failed() {
    metrics::counter!(RENEWAL_FAILURES).increment(1);
}

/// A task of the task group `participant` panicked.
pub(crate) fn task_panicked(participant: &str) {
    metrics::counter!(TASK_PANICS, "participant" => participant.to_owned()).increment(1);
}

/// An item of participant `participant` failed too often and was held aside for a person.
pub(crate) fn held_aside(participant: &str) {
    metrics::counter!(HELD_ASIDE, "participant" => participant.to_owned()).increment(1);
}

/// A resumed item was acknowledged.
pub(crate) fn acknowledged() {
    metrics::counter!(ACKNOWLEDGED).increment(1);
}

/// Seconds from `from` to `to`, 0 when the clock stepped back.
fn seconds_between(from: DateTime<Utc>, to: DateTime<Utc>) -> f64 {
    (to - from).to_std().map_or(0.0, |d| d.as_secs_f64())
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operations_guide_lists_every_metric() {
        let guide = include_str!("../../docs/operations.md");
        for (name, _, _) in NAMES {
            assert!(
                guide.contains(&format!("| `{name}`")),
                "docs/operations.md has no row for {name}"
            );
        }
        let rows = guide
            .lines()
            .filter(|l| l.starts_with("| `planned_stop_"))
            .count();
        assert_eq!(
            rows,
            NAMES.len(),
            "a row in docs/operations.md names no metric"
        );
    }

    #[test]
    fn labels_are_the_documented_snake_case_names() {
        use crate::lifecycle::SignalKind;
        // The labels are the JSON names of the same values, so a dashboard and a stop record
        // say the same thing.
        for state in STATES {
            let json = serde_json::to_value(state).unwrap();
            assert_eq!(json, state_label(state));
        }
        for phase in DrainPhase::ALL {
            assert_eq!(serde_json::to_value(phase).unwrap(), phase_label(phase));
        }
        for verdict in [StopVerdict::Planned, StopVerdict::Unexpected] {
            assert_eq!(
                serde_json::to_value(verdict).unwrap(),
                verdict_label(verdict)
            );
        }
        assert_eq!(cause_label(StopCause::Marker), "marker");
        assert_eq!(
            cause_label(StopCause::Signal(SignalKind::Hangup)),
            "signal_hangup"
        );
    }
}

//! Rows to items and back: every column read checked (a hand-edited row is reported and
//! quarantined, never a panic), and the encodings the queries compare.

use super::backend;
use planned_stop::record::RecordError;
use planned_stop::record::rules;
use planned_stop::record::{ItemState, Lease, Owner, ResumeItem};
use tokio_postgres::Row;

/// The encoded owner, one column the queries compare: `host|pid|start`.
pub(super) fn owner_key(owner: &Owner) -> String {
    format!("{}|{}|{}", owner.host, owner.pid, owner.start)
}

/// A fingerprint as PostgreSQL's `bigint`, bit for bit (and back).
pub(super) fn as_i64(v: u64) -> i64 {
    v as i64
}

/// One column of a row, or its type's default with the problem noted: a hand-edited row (a NULL,
/// another type) is reported, never a panic.
pub(super) fn col<T>(row: &Row, name: &str, problems: &mut Vec<String>) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a> + Default,
{
    match row.try_get::<_, Option<T>>(name) {
        Ok(Some(value)) => value,
        Ok(None) => {
            problems.push(format!("{name} is NULL"));
            T::default()
        }
        Err(e) => {
            problems.push(format!("{name}: {e}"));
            T::default()
        }
    }
}

/// A process id from its `bigint` column, noting one out of range.
pub(super) fn pid_of(value: i64, name: &str, problems: &mut Vec<String>) -> u32 {
    u32::try_from(value).unwrap_or_else(|_| {
        problems.push(format!("{name} {value} is not a process id"));
        0
    })
}

/// An item row as the crate reads it, and why it cannot be accepted, if it cannot (a NULL where
/// a value belongs, an id that is not an item id, a negative count, a lease without its owner or
/// expiry, or a quarantine already recorded). A row with a problem is quarantined: listed, never
/// offered, never handed out under a new id.
pub(super) fn item_of(row: &Row) -> (ItemState, Option<String>) {
    let mut problems = Vec::new();
    let p = &mut problems;
    let id: String = col(row, "id", p);
    if !rules::is_valid_item_id(&id) {
        p.push(format!(
            "{id:?} is not an item id (1 to 128 of A-Z a-z 0-9 - _)"
        ));
    }
    let attempts: i32 = col(row, "attempts", p);
    if attempts < 0 {
        p.push(format!("attempts {attempts} is negative"));
    }
    let failures: i32 = col(row, "failures", p);
    if failures < 0 {
        p.push(format!("failures {failures} is negative"));
    }
    let last_failure = row
        .try_get::<_, Option<String>>("last_failure")
        .unwrap_or_else(|e| {
            p.push(format!("last_failure: {e}"));
            None
        });
    let by_pid: i64 = col(row, "stopped_by_pid", p);
    let item = ResumeItem::new(
        id,
        col::<String>(row, "participant", p),
        col(row, "item", p),
        Owner::new(
            col::<String>(row, "stopped_by_host", p),
            pid_of(by_pid, "stopped_by_pid", p),
            col::<i64>(row, "stopped_by_start", p) as u64,
        ),
        col(row, "stopped_at", p),
        u32::try_from(attempts).unwrap_or(0),
    )
    .with_failures(u32::try_from(failures).unwrap_or(0), last_failure);
    let lease = match row.try_get::<_, Option<String>>("lease_owner") {
        Ok(None) => None,
        Ok(Some(_)) => {
            let pid: i64 = col(row, "lease_pid", p);
            Some(Lease::new(
                Owner::new(
                    col::<String>(row, "lease_host", p),
                    pid_of(pid, "lease_pid", p),
                    col::<i64>(row, "lease_start", p) as u64,
                ),
                col(row, "leased_at", p),
                col(row, "lease_expires", p),
            ))
        }
        Err(e) => {
            p.push(format!("lease_owner: {e}"));
            None
        }
    };
    let recorded = row
        .try_get::<_, Option<String>>("quarantined")
        .ok()
        .flatten();
    let problem = recorded.or_else(|| (!problems.is_empty()).then(|| problems.join("; ")));
    let state = ItemState::new(item, lease);
    let state = match &problem {
        Some(reason) => state.with_quarantine(reason.clone()),
        None => state,
    };
    (state, problem)
}

pub(super) const COLUMNS: &str = "id, participant, item, stopped_by_host, stopped_by_pid, stopped_by_start, \
    stopped_at, attempts, failures, last_failure, lease_owner, lease_host, lease_pid, lease_start, \
    leased_at, lease_expires, quarantined";

/// Marks a row the crate cannot accept, once: it keeps its data for the operator (`records list`
/// shows it with the reason) and loses any lease, and no lease ever offers it again.
pub(super) async fn quarantine(
    tx: &tokio_postgres::Transaction<'_>,
    service: &str,
    id: &str,
    reason: &str,
) -> Result<(), RecordError> {
    tracing::warn!(
        id,
        reason,
        "an item row the crate cannot accept is quarantined: never \
        offered again until an operator releases or removes it"
    );
    tx.execute(
        "UPDATE planned_stop_items SET quarantined = $3, lease_owner = NULL, lease_host = NULL, \
         lease_pid = NULL, lease_start = NULL, leased_at = NULL, lease_expires = NULL \
         WHERE service = $1 AND id = $2",
        &[&service, &id, &reason],
    )
    .await
    .map(|_| ())
    .map_err(|e| backend("quarantine an item row", e))
}

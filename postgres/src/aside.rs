//! Failed attempts and items held aside, in the database: a stop's items as the columns its
//! statements take (each with its failure, if its attempt failed), the failures a takeover
//! counts, and holding an item aside for a person.
//!
//! Why the reason goes in `quarantined`: an item held aside and a row the crate cannot accept are
//! the same to a lease (never offered) and to an operator (listed with why, released or dropped),
//! so one column serves both and every query that skips one skips the other.

use super::rows::owner_key;
use super::{PgRecordStore, backend};
use planned_stop::record::Owner;
use planned_stop::record::rules::checked_item;
use planned_stop::record::{RecordError, StopRecord};

/// One kind of a stop's items (new or handed back), as parallel columns for `unnest`.
#[derive(Default)]
pub(super) struct Columns {
    pub(super) ids: Vec<String>,
    pub(super) participants: Vec<String>,
    pub(super) values: Vec<serde_json::Value>,
    pub(super) failures: Vec<Option<String>>,
}

/// A stop's items, checked, as columns: new work, then handed-back items.
pub(super) fn columns_of(record: &StopRecord) -> Result<(Columns, Columns), RecordError> {
    let (mut new, mut back) = (Columns::default(), Columns::default());
    for unfinished in &record.unfinished {
        let id = checked_item(unfinished).map_err(|reason| RecordError::Invalid {
            path: "postgres".into(),
            reason,
        })?;
        let to = if unfinished.resumed {
            &mut back
        } else {
            &mut new
        };
        to.ids.push(id.to_owned());
        to.participants.push(unfinished.participant.clone());
        to.values.push(unfinished.item.clone());
        to.failures.push(unfinished.failure.clone());
    }
    Ok((new, back))
}

/// Counts one failed attempt for each of `ids` (taken over from a holder that is gone), with why.
pub(super) async fn count_failures(
    tx: &tokio_postgres::Transaction<'_>,
    service: &str,
    ids: &[String],
    why: &[String],
) -> Result<(), RecordError> {
    if ids.is_empty() {
        return Ok(());
    }
    tx.execute(
        "UPDATE planned_stop_items AS i SET \
         failures = LEAST(GREATEST(i.failures, 0), 2147483646) + 1, last_failure = f.why \
         FROM unnest($2::text[], $3::text[]) AS f(id, why) WHERE i.service = $1 AND i.id = f.id",
        &[&service, &ids, &why],
    )
    .await
    .map(|_| ())
    .map_err(|e| backend("count the failed attempts", e))
}

impl PgRecordStore {
    pub(super) async fn hold_aside_db(
        &self,
        owner: &Owner,
        id: &str,
        reason: &str,
    ) -> Result<(), RecordError> {
        let service = self.service.clone();
        let key = owner_key(owner);
        let (id, reason) = (id.to_owned(), reason.to_owned());
        self.run(move |client| {
            Box::pin(async move {
                let done = client
                    .execute(
                        "UPDATE planned_stop_items SET quarantined = $4, lease_owner = NULL, \
                         lease_host = NULL, lease_pid = NULL, lease_start = NULL, leased_at = NULL, \
                         lease_expires = NULL WHERE service = $1 AND id = $2 AND lease_owner = $3",
                        &[&service, &id, &key, &reason],
                    )
                    .await
                    .map_err(|e| backend("hold an item aside", e))?;
                if done > 0 {
                    tracing::warn!(id, reason, "an item is held aside for a person: it is not \
                        offered again until an operator releases it");
                    return Ok(());
                }
                let row = client
                    .query_opt(
                        "SELECT lease_owner FROM planned_stop_items WHERE service = $1 AND id = $2",
                        &[&service, &id],
                    )
                    .await
                    .map_err(|e| backend("read an item", e))?;
                Err(match row {
                    None => RecordError::UnknownItem { id },
                    Some(row) => RecordError::NotHolder {
                        id,
                        holder: row.try_get::<_, Option<String>>(0).ok().flatten(),
                    },
                })
            })
        })
        .await
    }
}

/// An operator's release of an item held aside (or a row quarantined): offered again, its
/// failures counted from zero. A row that still cannot be accepted is quarantined again at the
/// next lease.
pub(super) async fn offer_again(
    tx: &tokio_postgres::Transaction<'_>,
    service: &str,
    id: &str,
) -> Result<(), RecordError> {
    tx.execute(
        "UPDATE planned_stop_items SET quarantined = NULL, failures = 0, lease_owner = NULL, \
         lease_host = NULL, lease_pid = NULL, lease_start = NULL, leased_at = NULL, \
         lease_expires = NULL WHERE service = $1 AND id = $2",
        &[&service, &id],
    )
    .await
    .map(|_| ())
    .map_err(|e| backend("offer an item held aside again", e))
}

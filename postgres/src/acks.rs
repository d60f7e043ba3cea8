//! Acknowledgements in PostgreSQL: the item's row goes and its acknowledgement comes in one
//! statement, only for the lease's holder; many at once in one statement too.

use super::rows::owner_key;
use super::{PgRecordStore, backend, db_now};
use planned_stop::record::Owner;
use planned_stop::record::RecordError;
use std::collections::HashMap;

impl PgRecordStore {
    pub(super) async fn acknowledge_db(&self, owner: &Owner, id: &str) -> Result<(), RecordError> {
        let service = self.service.clone();
        let owner = owner_key(owner);
        let id = id.to_owned();
        let clock = self.clock.clone();
        self.run(move |client| {
            Box::pin(async move {
                let now = db_now(clock.as_ref(), client).await?;
                // One statement: the item goes and its acknowledgement comes, only if it is ours.
                let done = client
                    .query_opt(
                        "WITH gone AS (DELETE FROM planned_stop_items WHERE service = $1 AND id = $2 \
                         AND lease_owner = $3 RETURNING id) \
                         INSERT INTO planned_stop_acks (service, id, acked_by, acked_at) \
                         SELECT $1, id, $3, $4 FROM gone RETURNING id",
                        &[&service, &id, &owner, &now],
                    )
                    .await
                    .map_err(|e| backend("acknowledge an item", e))?;
                if done.is_some() {
                    return Ok(());
                }
                let row = client
                    .query_opt(
                        "SELECT lease_owner FROM planned_stop_items WHERE service = $1 AND id = $2",
                        &[&service, &id],
                    )
                    .await
                    .map_err(|e| backend("read an item", e))?;
                match row {
                    None => Err(RecordError::UnknownItem { id }),
                    Some(row) => Err(RecordError::NotHolder {
                        id,
                        holder: row.try_get::<_, Option<String>>(0).ok().flatten(),
                    }),
                }
            })
        })
        .await
    }

    /// Every acknowledgement of `ids` in one statement (and, for those refused, one more to say
    /// why), in one transaction.
    pub(super) async fn acknowledge_many_db(
        &self,
        owner: &Owner,
        ids: &[String],
    ) -> Result<Vec<Result<(), RecordError>>, RecordError> {
        let service = self.service.clone();
        let owner = owner_key(owner);
        let ids = ids.to_vec();
        let clock = self.clock.clone();
        self.run(move |client| {
            Box::pin(async move {
                let now = db_now(clock.as_ref(), client).await?;
                let tx = client
                    .transaction()
                    .await
                    .map_err(|e| backend("begin", e))?;
                let done: std::collections::HashSet<String> = tx
                    .query(
                        "WITH gone AS (DELETE FROM planned_stop_items WHERE service = $1 \
                         AND id = ANY($2) AND lease_owner = $3 RETURNING id) \
                         INSERT INTO planned_stop_acks (service, id, acked_by, acked_at) \
                         SELECT $1, id, $3, $4 FROM gone RETURNING id",
                        &[&service, &ids, &owner, &now],
                    )
                    .await
                    .map_err(|e| backend("acknowledge items", e))?
                    .iter()
                    .filter_map(|r| r.try_get(0).ok())
                    .collect();
                let refused: Vec<&String> = ids.iter().filter(|id| !done.contains(*id)).collect();
                let holders: HashMap<String, Option<String>> = if refused.is_empty() {
                    HashMap::new()
                } else {
                    tx.query(
                        "SELECT id, lease_owner FROM planned_stop_items WHERE service = $1 \
                         AND id = ANY($2)",
                        &[&service, &refused],
                    )
                    .await
                    .map_err(|e| backend("read items", e))?
                    .iter()
                    .filter_map(|r| Some((r.try_get(0).ok()?, r.try_get(1).ok()?)))
                    .collect()
                };
                tx.commit()
                    .await
                    .map_err(|e| backend("commit the acknowledgements", e))?;
                Ok(ids
                    .iter()
                    .map(|id| match (done.contains(id), holders.get(id)) {
                        (true, _) => Ok(()),
                        (false, None) => Err(RecordError::UnknownItem { id: id.clone() }),
                        (false, Some(holder)) => Err(RecordError::NotHolder {
                            id: id.clone(),
                            holder: holder.clone(),
                        }),
                    })
                    .collect())
            })
        })
        .await
    }
}

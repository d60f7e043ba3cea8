//! The store's operations on the database: persist a stop, push what a stop spilled, lease,
//! release what a failed lease may have taken, acknowledge, release. Each runs in one
//! transaction through [`PgRecordStore::run`](super::PgRecordStore), within the operation timeout.

use super::aside::columns_of;
use super::offer::Offer;
use super::rows::{as_i64, col, owner_key, pid_of};
use super::{PgRecordStore, backend, db_now};
use planned_stop::record::rules::{Liveness, lease_end};
use planned_stop::record::{Leased, Owner, RecordStore, ResumeItem};
use planned_stop::record::{RecordError, StopRecord};
use std::collections::HashMap;
use std::time::Duration;

impl PgRecordStore {
    pub(super) async fn persist_db(
        &self,
        stopper: &Owner,
        record: &std::sync::Arc<StopRecord>,
    ) -> Result<(), RecordError> {
        let service = self.service.clone();
        let stopper = stopper.clone();
        let record = std::sync::Arc::clone(record);
        self.run(move |client| {
            Box::pin(async move {
                // New work and handed-back items apart: a handed-back item is written again only
                // while this process holds it (`attempts_after_persist`, the rule every store
                // follows), so an acknowledgement or an operator's drop is never undone.
                let (new, back) = columns_of(&record)?;
                let by = (&stopper.host, as_i64(u64::from(stopper.pid)), as_i64(stopper.start));
                let mut tx = client.transaction().await.map_err(|e| backend("begin", e))?;
                // Items this process holds come back pending, their attempts counted up (saturating:
                // a row with attempts at the top of `integer` must not fail the stop).
                let handed_back = tx
                    .execute(
                        "UPDATE planned_stop_items AS i SET participant = n.participant, item = n.item, \
                         stopped_by_host = $4, stopped_by_pid = $5, stopped_by_start = $6, stopped_at = $7, \
                         attempts = LEAST(GREATEST(i.attempts, 0), 2147483646) + 1, \
                         failures = LEAST(GREATEST(i.failures, 0), 2147483646) + (n.failure IS NOT NULL)::int, \
                         last_failure = COALESCE(n.failure, i.last_failure), lease_owner = NULL, \
                         lease_host = NULL, lease_pid = NULL, lease_start = NULL, leased_at = NULL, \
                         lease_expires = NULL \
                         FROM unnest($2::text[], $3::text[], $9::jsonb[], $10::text[]) AS n(id, participant, item, failure) \
                         WHERE i.service = $1 AND i.id = n.id AND i.lease_owner = $8 AND i.quarantined IS NULL",
                        &[&service, &back.ids, &back.participants, by.0, &by.1, &by.2, &record.finished_at, &owner_key(&stopper), &back.values, &back.failures],
                    )
                    .await
                    .map_err(|e| backend("hand items back", e))?;
                // New items: written once.
                let inserted = insert_new(&mut tx, &service, by, &record.finished_at, &new).await?;
                let left_alone = (back.ids.len() as u64).saturating_sub(handed_back)
                    + (new.ids.len() as u64).saturating_sub(inserted);
                if left_alone > 0 {
                    tracing::warn!(left_alone, "items handed back that are not this process's any \
                        more (acknowledged, dropped or released by an operator, or taken over), or \
                        new items whose id was taken; left as they are");
                }
                let summary = serde_json::to_value(record.summary()).map_err(|e| backend("encode the stop record", e))?;
                tx.execute(
                    "INSERT INTO planned_stop_stops (service, record, written_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (service) DO UPDATE SET record = EXCLUDED.record, written_at = EXCLUDED.written_at",
                    &[&service, &summary, &record.finished_at],
                )
                .await
                .map_err(|e| backend("write the stop record", e))?;
                tx.commit().await.map_err(|e| backend("commit the stop record", e))
            })
        })
        .await
    }

    /// Pushes what a stop spilled on this host to the database: each item once (an item already
    /// acknowledged in the database is not brought back), then removes it from the spill.
    pub(super) async fn push_spilled(&self) -> Result<(), RecordError> {
        let Some(spill) = &self.spill else {
            return Ok(());
        };
        let spilled = spill.list().await?;
        if spilled.is_empty() {
            return Ok(());
        }
        let service = self.service.clone();
        let items: Vec<ResumeItem> = spilled.iter().map(|s| s.item.clone()).collect();
        let summary = spill.last_stop().await.ok().flatten();
        self.run(move |client| {
            Box::pin(async move {
                let tx = client.transaction().await.map_err(|e| backend("begin", e))?;
                // All in one statement, however many: a new item is inserted unless it was
                // acknowledged or dropped meanwhile; an item the spilling process had leased
                // from the database replaces the stale row (newer content, attempts counted up,
                // pending) while that process still holds it there, and is left to whoever
                // holds it otherwise.
                let column = |f: &dyn Fn(&ResumeItem) -> String| items.iter().map(f).collect::<Vec<String>>();
                let ids = column(&|i| i.id.clone());
                let participants = column(&|i| i.participant.clone());
                let hosts = column(&|i| i.stopped_by.host.clone());
                let holders = column(&|i| owner_key(&i.stopped_by));
                let values: Vec<&serde_json::Value> = items.iter().map(|i| &i.item).collect();
                let pids: Vec<i64> = items.iter().map(|i| as_i64(u64::from(i.stopped_by.pid))).collect();
                let starts: Vec<i64> = items.iter().map(|i| as_i64(i.stopped_by.start)).collect();
                let stopped: Vec<chrono::DateTime<chrono::Utc>> = items.iter().map(|i| i.stopped_at).collect();
                let attempts: Vec<i32> = items.iter().map(|i| i32::try_from(i.attempts).unwrap_or(i32::MAX)).collect();
                let failures: Vec<i32> = items.iter().map(|i| i32::try_from(i.failures).unwrap_or(i32::MAX)).collect();
                let last: Vec<Option<&str>> = items.iter().map(|i| i.last_failure.as_deref()).collect();
                tx.execute(
                    "WITH n AS (SELECT * FROM unnest($2::text[], $3::text[], $4::jsonb[], $5::text[], \
                     $6::int8[], $7::int8[], $8::timestamptz[], $9::int4[], $10::text[], $11::int4[], \
                     $12::text[]) AS n(id, participant, item, host, pid, start, stopped_at, attempts, \
                     holder, failures, last_failure)), \
                     back AS (UPDATE planned_stop_items AS i SET participant = n.participant, item = n.item, \
                     stopped_by_host = n.host, stopped_by_pid = n.pid, stopped_by_start = n.start, \
                     stopped_at = n.stopped_at, \
                     attempts = LEAST(GREATEST(i.attempts, 0), 2147483646) + 1, \
                     failures = LEAST(GREATEST(i.failures, 0)::int8 + n.failures, 2147483647)::int4, \
                     last_failure = COALESCE(n.last_failure, i.last_failure), \
                     lease_owner = NULL, lease_host = NULL, lease_pid = NULL, lease_start = NULL, \
                     leased_at = NULL, lease_expires = NULL \
                     FROM n WHERE i.service = $1 AND i.id = n.id AND i.lease_owner = n.holder \
                     AND i.quarantined IS NULL) \
                     INSERT INTO planned_stop_items (service, id, participant, item, stopped_by_host, \
                     stopped_by_pid, stopped_by_start, stopped_at, attempts, failures, last_failure) \
                     SELECT $1, n.id, n.participant, n.item, n.host, n.pid, n.start, n.stopped_at, \
                     n.attempts, n.failures, n.last_failure FROM n WHERE NOT EXISTS \
                     (SELECT 1 FROM planned_stop_acks a WHERE a.service = $1 AND a.id = n.id) \
                     ON CONFLICT (service, id) DO NOTHING",
                    &[
                        &service, &ids, &participants, &values, &hosts, &pids, &starts, &stopped,
                        &attempts, &holders, &failures, &last,
                    ],
                )
                .await
                .map_err(|e| backend("push the spilled items", e))?;
                if let Some(summary) = &summary {
                    let record = serde_json::to_value(summary).map_err(|e| backend("encode", e))?;
                    tx.execute(
                        "INSERT INTO planned_stop_stops (service, record, written_at) VALUES ($1, $2, $3) \
                         ON CONFLICT (service) DO UPDATE SET record = EXCLUDED.record, written_at = EXCLUDED.written_at \
                         WHERE planned_stop_stops.written_at < EXCLUDED.written_at",
                        &[&service, &record, &summary.finished_at],
                    )
                    .await
                    .map_err(|e| backend("push the spilled stop record", e))?;
                }
                tx.commit().await.map_err(|e| backend("commit the spilled items", e))
            })
        })
        .await?;
        spill
            .remove_all(spilled.iter().map(|s| s.item.id.clone()).collect())
            .await?;
        tracing::info!(
            items = spilled.len(),
            "pushed the items a stop had spilled on this host to PostgreSQL"
        );
        Ok(())
    }

    pub(super) async fn lease_db(
        &self,
        owner: &Owner,
        max: usize,
        lease_for: Duration,
        stamp: std::sync::Arc<std::sync::Mutex<Option<chrono::DateTime<chrono::Utc>>>>,
    ) -> Result<Vec<Leased>, RecordError> {
        let clock = self.clock.clone();
        let service = self.service.clone();
        let owner = owner.clone();
        let liveness = self.liveness.clone();
        self.run(move |client| {
            Box::pin(async move {
                let seen = holders(client, &service, liveness.as_ref()).await?;
                let tx = client
                    .transaction()
                    .await
                    .map_err(|e| backend("begin", e))?;
                // Expiry is judged on the database's clock, the one every replica shares.
                let now = db_now(clock.as_ref(), &tx).await?;
                if let Ok(mut stamp) = stamp.lock() {
                    *stamp = Some(now);
                }
                // A start leases: the name is registered, so `records list` knows it from now on.
                tx.execute(
                    "INSERT INTO planned_stop_services (service, first_seen, last_seen) \
                     VALUES ($1, $2, $2) ON CONFLICT (service) DO UPDATE SET last_seen = $2",
                    &[&service, &now],
                )
                .await
                .map_err(|e| backend("register the service", e))?;
                let offer = Offer {
                    service: &service,
                    owner: &owner,
                    now,
                    expires_at: lease_end(now, lease_for),
                    seen: &seen,
                };
                let mut examined: Vec<String> = Vec::new();
                let mut leased = Vec::new();
                let limit = i64::try_from(max).unwrap_or(i64::MAX);
                loop {
                    let want = limit - leased.len() as i64;
                    if want <= 0 {
                        break;
                    }
                    match offer.lease_batch(&tx, want, &mut examined).await? {
                        Some((batch, more)) => {
                            leased.extend(batch);
                            if !more {
                                break;
                            }
                        }
                        None => break,
                    }
                }
                tx.commit()
                    .await
                    .map_err(|e| backend("commit the leases", e))?;
                // Oldest first across batches (a later batch can only hold later items).
                Ok(leased)
            })
        })
        .await
    }

    /// A lease call failed, perhaps after the server committed it (the commit outlasted the
    /// operation timeout): the caller got nothing, so nothing it might have been given may stay
    /// leased to this live process. Releases, in the background until it succeeds (at most a few
    /// minutes), every item leased to `owner` by that call (`leased_at` = `stamp`).
    pub(super) fn release_uncertain(&self, owner: &Owner, stamp: chrono::DateTime<chrono::Utc>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key) = (self.clone(), owner_key(owner));
        let abandoned = self
            .backends
            .lock()
            .ok()
            .and_then(|mut b| b.abandoned.take());
        runtime.spawn(async move {
            let mut wait = Duration::from_millis(100);
            for _ in 0..20 {
                let (service, key) = (store.service.clone(), key.clone());
                let released = store
                    .run(move |client| {
                        Box::pin(async move {
                            // The abandoned call may still be committing on the server: end it
                            // and wait until its server process is gone, so what it did is final
                            // (committed or rolled back) before the release looks.
                            if let Some(pid) = abandoned {
                                let _ = client.execute("SELECT pg_terminate_backend($1)", &[&pid]).await;
                                let gone = client
                                    .query_one(
                                        "SELECT NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)",
                                        &[&pid],
                                    )
                                    .await
                                    .map_err(|e| backend("look for the abandoned call", e))?
                                    .try_get::<_, bool>(0)
                                    .unwrap_or(false);
                                if !gone {
                                    return Err(RecordError::backend(
                                        "the abandoned call is still running in PostgreSQL",
                                    ));
                                }
                            }
                            client
                                .execute(
                                    "UPDATE planned_stop_items SET lease_owner = NULL, lease_host = NULL, \
                                     lease_pid = NULL, lease_start = NULL, leased_at = NULL, lease_expires = NULL \
                                     WHERE service = $1 AND lease_owner = $2 AND leased_at = $3",
                                    &[&service, &key, &stamp],
                                )
                                .await
                                .map_err(|e| backend("release what a failed lease took", e))
                        })
                    })
                    .await;
                match released {
                    Ok(n) => {
                        if n > 0 {
                            tracing::warn!(items = n, "a lease call failed after the database \
                                had taken items for it; they are pending again");
                        }
                        return;
                    }
                    Err(e) => {
                        tracing::debug!(error = %planned_stop_protocol::error_chain::ErrorChain(&e),
                            "cannot release what a failed lease may have taken yet; retrying");
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(Duration::from_secs(10));
                    }
                }
            }
            tracing::error!("could not release what a failed lease call may have taken: such \
                items stay leased to this process until it exits, or until an operator \
                releases them");
        });
    }

    pub(super) async fn release_db(
        &self,
        owner: Option<&Owner>,
        id: &str,
    ) -> Result<bool, RecordError> {
        let service = self.service.clone();
        let owner = owner.map(owner_key);
        let id = id.to_owned();
        self.run(move |client| {
            Box::pin(async move {
                let tx = client.transaction().await.map_err(|e| backend("begin", e))?;
                let row = tx
                    .query_opt(
                        "SELECT lease_owner, quarantined IS NOT NULL FROM planned_stop_items \
                         WHERE service = $1 AND id = $2 FOR UPDATE",
                        &[&service, &id],
                    )
                    .await
                    .map_err(|e| backend("read an item", e))?;
                let Some(row) = row else {
                    return Err(RecordError::UnknownItem { id });
                };
                if owner.is_none() && row.try_get::<_, bool>(1).unwrap_or(false) {
                    super::aside::offer_again(&tx, &service, &id).await?;
                    tx.commit().await.map_err(|e| backend("commit the release", e))?;
                    return Ok(true);
                }
                let holder: Option<String> = row
                    .try_get(0)
                    .map_err(|e| backend("an item row does not fit this schema", e))?;
                let Some(holder) = holder else {
                    return Ok(false);
                };
                if let Some(owner) = owner
                    && owner != holder
                {
                    return Err(RecordError::NotHolder { id, holder: Some(holder) });
                }
                tx.execute(
                    "UPDATE planned_stop_items SET lease_owner = NULL, lease_host = NULL, lease_pid = NULL, \
                     lease_start = NULL, leased_at = NULL, lease_expires = NULL WHERE service = $1 AND id = $2",
                    &[&service, &id],
                )
                .await
                .map_err(|e| backend("release an item", e))?;
                tx.commit().await.map_err(|e| backend("commit the release", e))?;
                Ok(true)
            })
        })
        .await
    }
}

/// The holders of `service`'s leases, each as alive as it can be told from here: owners on this
/// host can be looked up, so the dead ones' items are on offer now. A holder with a missing part
/// is not looked up: its row is examined (and quarantined) when it is offered.
async fn holders(
    client: &tokio_postgres::Client,
    service: &str,
    liveness: &(dyn Fn(&Owner) -> Liveness + Send + Sync),
) -> Result<HashMap<String, Liveness>, RecordError> {
    let rows = client
        .query(
            "SELECT DISTINCT lease_host, lease_pid, lease_start, lease_owner FROM planned_stop_items \
             WHERE service = $1 AND lease_owner IS NOT NULL AND quarantined IS NULL",
            &[&service],
        )
        .await
        .map_err(|e| backend("list the lease holders", e))?;
    let mut seen = HashMap::new();
    for row in &rows {
        let mut problems = Vec::new();
        let host: String = col(row, "lease_host", &mut problems);
        let pid: i64 = col(row, "lease_pid", &mut problems);
        let start: i64 = col(row, "lease_start", &mut problems);
        let key: String = col(row, "lease_owner", &mut problems);
        let pid = pid_of(pid, "lease_pid", &mut problems);
        if problems.is_empty() {
            seen.insert(key, liveness(&Owner::new(host, pid, start as u64)));
        }
    }
    Ok(seen)
}

/// Inserts `new` items, each unless a row has its id already; returns how many were inserted.
/// A binary `COPY` in a savepoint first: it writes the rows as fast as the database can take
/// them (the floor `docs/performance.md` measures against), where a multi-row `INSERT` binds
/// every value as an array parameter and unnests it again. A row with one of the ids already
/// (taken before, or inserted meanwhile by another transaction), or an id twice among `new`,
/// makes the `COPY` a unique violation; then `INSERT … ON CONFLICT DO NOTHING` does the same
/// work the slow way.
async fn insert_new(
    tx: &mut tokio_postgres::Transaction<'_>,
    service: &str,
    by: (&String, i64, i64),
    at: &chrono::DateTime<chrono::Utc>,
    new: &super::aside::Columns,
) -> Result<u64, RecordError> {
    const INSERT: &str = "INSERT INTO planned_stop_items (service, id, participant, item, \
        stopped_by_host, stopped_by_pid, stopped_by_start, stopped_at, attempts, failures, \
        last_failure) SELECT $1, n.id, n.participant, n.item, $4, $5, $6, $7, 1, \
        (n.failure IS NOT NULL)::int, n.failure FROM unnest($2::text[], $3::text[], $8::jsonb[], \
        $9::text[]) AS n(id, participant, item, failure) ON CONFLICT DO NOTHING";
    if new.ids.is_empty() {
        return Ok(0);
    }
    let savepoint = tx
        .savepoint("new_items")
        .await
        .map_err(|e| backend("insert the items", e))?;
    match copy_new(&savepoint, service, by, at, new).await {
        Ok(inserted) => {
            savepoint
                .commit()
                .await
                .map_err(|e| backend("insert the items", e))?;
            Ok(inserted)
        }
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
            savepoint
                .rollback()
                .await
                .map_err(|e| backend("insert the items", e))?;
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 9] = [
                &service,
                &new.ids,
                &new.participants,
                by.0,
                &by.1,
                &by.2,
                at,
                &new.values,
                &new.failures,
            ];
            tx.execute(INSERT, &params)
                .await
                .map_err(|e| backend("insert the items", e))
        }
        Err(e) => Err(backend("insert the items", e)),
    }
}

/// `new` written by one binary `COPY`; returns the rows written.
async fn copy_new(
    tx: &tokio_postgres::Transaction<'_>,
    service: &str,
    by: (&String, i64, i64),
    at: &chrono::DateTime<chrono::Utc>,
    new: &super::aside::Columns,
) -> Result<u64, tokio_postgres::Error> {
    use tokio_postgres::binary_copy::BinaryCopyInWriter;
    use tokio_postgres::types::Type;
    let sink = tx
        .copy_in(
            "COPY planned_stop_items (service, id, participant, item, stopped_by_host, \
             stopped_by_pid, stopped_by_start, stopped_at, attempts, failures, last_failure) \
             FROM STDIN BINARY",
        )
        .await?;
    let types = [
        Type::TEXT,
        Type::TEXT,
        Type::TEXT,
        Type::JSONB,
        Type::TEXT,
        Type::INT8,
        Type::INT8,
        Type::TIMESTAMPTZ,
        Type::INT4,
        Type::INT4,
        Type::TEXT,
    ];
    let writer = BinaryCopyInWriter::new(sink, &types);
    let mut writer = std::pin::pin!(writer);
    let rows = new.ids.iter().zip(&new.participants).zip(&new.values);
    for (((id, participant), value), failure) in rows.zip(&new.failures) {
        let failures = i32::from(failure.is_some());
        writer
            .as_mut()
            .write(&[
                &service,
                id,
                participant,
                value,
                by.0,
                &by.1,
                &by.2,
                at,
                &1i32,
                &failures,
                failure,
            ])
            .await?;
    }
    writer.finish().await
}

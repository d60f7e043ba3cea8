//! One lease call's look at what is on offer: which rows it examines, which it may take (the
//! shared lease rules decide), and the lease written to those it takes.

use super::aside::count_failures;
use super::backend;
use super::rows::{COLUMNS, as_i64, item_of, owner_key, quarantine};
use planned_stop::record::RecordError;
use planned_stop::record::rules::{self, Liveness};
use planned_stop::record::{Lease, Leased, Owner};
use std::collections::HashMap;

/// One lease call's terms: whose items, to whom, on the database's clock, and what is known of
/// the holders of the items on offer.
pub(super) struct Offer<'a> {
    pub(super) service: &'a str,
    pub(super) owner: &'a Owner,
    pub(super) now: chrono::DateTime<chrono::Utc>,
    pub(super) expires_at: chrono::DateTime<chrono::Utc>,
    pub(super) seen: &'a HashMap<String, Liveness>,
}

impl Offer<'_> {
    /// Examines the next `want` rows not yet `examined` and leases those on offer, with whether
    /// more rows may be left (all `want` were examined); `None` when no row is left. Rows the
    /// crate cannot accept are quarantined; an item taken over from a holder that is gone counts
    /// one failed attempt.
    pub(super) async fn lease_batch(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        want: i64,
        examined: &mut Vec<String>,
    ) -> Result<Option<(Vec<Leased>, bool)>, RecordError> {
        let dead: Vec<&String> = self
            .seen
            .iter()
            .filter(|(_, l)| **l == Liveness::Dead)
            .map(|(k, _)| k)
            .collect();
        let rows = tx
            .query(
                &format!(
                    "SELECT {COLUMNS}, ctid::text AS address FROM planned_stop_items WHERE service = $1 AND quarantined IS NULL \
                     AND (lease_owner IS NULL OR lease_expires IS NULL OR lease_expires <= $2 \
                     OR lease_owner = ANY($3)) \
                     AND NOT (id = ANY($4)) ORDER BY stopped_at, id LIMIT $5 FOR UPDATE SKIP LOCKED"
                ),
                &[&self.service, &self.now, &dead, &*examined, &want],
            )
            .await
            .map_err(|e| backend("find items on offer", e))?;
        if rows.is_empty() {
            return Ok(None);
        }
        // Fewer than asked for: nothing else is on offer now (a row locked by another lease is
        // skipped again), so no second look, which would send every id examined.
        let more = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= want;
        let (mut taken, mut addresses) = (Vec::new(), Vec::new());
        let (mut failed, mut why) = (Vec::new(), Vec::new());
        for row in &rows {
            let (state, problem) = item_of(row);
            examined.push(state.item.id.clone());
            if let Some(reason) = problem {
                quarantine(tx, self.service, &state.item.id, &reason).await?;
                continue;
            }
            let holder = state.lease.as_ref().map_or(Liveness::Dead, |l| {
                *self
                    .seen
                    .get(&owner_key(&l.owner))
                    .unwrap_or(&Liveness::Unknown)
            });
            if rules::is_offered(state.lease.as_ref(), self.now, holder) {
                let mut item = state.item;
                if let Some(failure) = rules::failure_at_takeover(state.lease.as_ref(), holder) {
                    item.failures = item.failures.saturating_add(1);
                    item.last_failure = Some(failure.clone());
                    failed.push(item.id.clone());
                    why.push(failure);
                }
                taken.push(item);
                addresses.push(
                    row.try_get::<_, String>("address")
                        .map_err(|e| backend("read a row's address", e))?,
                );
            }
        }
        // The lease first: it finds the rows by the addresses this look read, which the counting
        // of failures would move.
        self.take(tx, &addresses).await?;
        count_failures(tx, self.service, &failed, &why).await?;
        let leased = taken
            .into_iter()
            .map(|item| {
                Leased::new(
                    item,
                    Lease::new(self.owner.clone(), self.now, self.expires_at),
                )
            })
            .collect();
        Ok(Some((leased, more)))
    }

    /// Writes the lease of the rows at `addresses` (their `ctid`, as this transaction's look read
    /// them) to this call's owner. By address rather than by id: the rows are locked by this
    /// transaction (`FOR UPDATE`), so they cannot move, and matching 100,000 addresses costs a
    /// fraction of 100,000 primary-key lookups (the planner scans the service's rows and filters
    /// them by address). Most of the time left is writing the rows (docs/performance.md).
    async fn take(
        &self,
        tx: &tokio_postgres::Transaction<'_>,
        addresses: &[String],
    ) -> Result<(), RecordError> {
        if addresses.is_empty() {
            return Ok(());
        }
        let owner = self.owner;
        tx.execute(
            "UPDATE planned_stop_items SET lease_owner = $3, lease_host = $4, lease_pid = $5, \
             lease_start = $6, leased_at = $7, lease_expires = $8 \
             WHERE ctid = ANY($2::text[]::tid[]) AND service = $1",
            &[
                &self.service,
                &addresses,
                &owner_key(owner),
                &owner.host,
                &as_i64(u64::from(owner.pid)),
                &as_i64(owner.start),
                &self.now,
                &self.expires_at,
            ],
        )
        .await
        .map_err(|e| backend("lease the items", e))?;
        Ok(())
    }
}

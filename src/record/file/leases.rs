//! Leases in batches: one file for every item one call leases (or renews), beside the batches of
//! items.
//!
//! Why: a start that resumes a hundred thousand items, and a holder that renews them, would write
//! a lease file per item — a create and a rename each, seconds for the lot. So a lease or renewal
//! of many items is one file, `planned-stop-batches/<n>.leases.json` (`lease`, `ids`, and
//! `released` for a batch that ends the leases of the items a stop hands back). An item's own
//! `<id>.lease.json` stays for what concerns one item (a release, a hold aside), with `released`
//! when it ends a lease a batch gave.
//!
//! Which lease of an item counts: the latest written, by sequence number — a batch's is in its
//! name, an own file's is the highest one when it was written (so any batch written after it
//! has a higher one), and the own file wins a tie; none when that one is a release. Clocks play no
//! part in it. A lease batch none of whose items it still holds is removed at the next lease,
//! renewal or stop (never the file with the highest number, so numbers only grow).

use super::{FileRecordStore, LEASE};
use crate::record::RecordError;
use crate::record::lease::Lease;
use crate::store::files::{self as fsx, Found};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// The suffix of a lease batch.
pub(super) const LEASES: &str = ".leases.json";

/// A lease batch's contents.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LeaseBatch {
    pub(super) lease: Lease,
    pub(super) ids: Vec<String>,
    /// Ends the leases of `ids` rather than giving them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) released: bool,
}

/// An item's own lease file.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct LeaseFile {
    #[serde(flatten)]
    pub(super) lease: Lease,
    /// Ends the lease a batch gave (a release, a hold aside): the item is not held.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) released: bool,
    /// The highest batch number when it was written (0 in files of earlier versions).
    #[serde(default)]
    pub(super) seq: u64,
}

/// The lease that counts, from the item's own lease file and the latest lease batch naming it
/// (with its number).
pub(super) fn resolve(
    own: Option<LeaseFile>,
    batched: Option<(u64, &LeaseBatch)>,
) -> Option<Lease> {
    let (lease, released) = match (own, batched) {
        (Some(own), Some((seq, b))) if seq > own.seq => (b.lease.clone(), b.released),
        (Some(own), _) => (own.lease, own.released),
        (None, Some((_, b))) => (b.lease.clone(), b.released),
        (None, None) => return None,
    };
    (!released).then_some(lease)
}

impl FileRecordStore {
    /// The lease of `id` that counts.
    pub(super) fn lease_of(&self, id: &str) -> Result<Option<Lease>, RecordError> {
        let own = self.read_json::<LeaseFile>(&self.path(id, LEASE));
        let batches = self.batches()?;
        Ok(resolve(own, batches.best_lease(id)))
    }

    /// Writes one lease batch: `lease` for `ids` (or, `released`, the end of their leases). A
    /// lease is not synced (a power loss that takes it back only offers the items again, which
    /// at-least-once allows); a release is.
    pub(super) fn write_leases(
        &self,
        lease: Lease,
        ids: Vec<String>,
        released: bool,
    ) -> Result<(), RecordError> {
        if ids.is_empty() {
            return Ok(());
        }
        let batch = LeaseBatch {
            lease,
            ids,
            released,
        };
        let path = self.batches_dir.join(self.next_name(LEASES)?);
        self.write_json_as(&path, &batch, released)
    }

    /// Ends `id`'s lease durably, whoever gave it: its own lease file goes, and when a lease
    /// batch names it, a release in its own file takes that batch's place.
    pub(super) fn end_lease(&self, id: &str) -> Result<(), RecordError> {
        let (batched, seq) = {
            let batches = self.batches()?;
            (
                batches.best_lease(id).map(|(_, b)| b.lease.clone()),
                batches.top(),
            )
        };
        match batched {
            Some(lease) => {
                let now = self.clock.now();
                let release = LeaseFile {
                    lease: Lease::new(lease.owner, now, now),
                    released: true,
                    seq,
                };
                self.write_json(&self.path(id, LEASE), &release)
            }
            None => self.remove_durably(&self.path(id, LEASE)),
        }
    }

    /// Removes the lease batches no longer needed (see [the module docs](self)), given the items that count
    /// (`known`) and those with a lease file of their own; a failure to remove only leaves files
    /// behind, so it is a warning.
    pub(super) fn tidy_leases(
        &self,
        known: &HashSet<String>,
        own_leases: &HashSet<String>,
    ) -> Result<(), RecordError> {
        let ids: Vec<String> = (self.batches()?.leased_ids())
            .filter(|id| known.contains(*id))
            .map(str::to_owned)
            .collect();
        let current = self.current_leases(ids.into_iter(), own_leases)?;
        if let Err(e) = self.remove_spent_leases(&current) {
            tracing::warn!(error = %crate::error_chain::ErrorChain(&e),
                "cannot remove spent batches of leases; they are tried again later");
        }
        Ok(())
    }

    pub(super) fn read_leases(&self, path: &Path) -> Option<LeaseBatch> {
        match fsx::read_private(path, super::batch::BATCH_BYTES) {
            Found::Bytes(bytes) => match serde_json::from_slice(&bytes) {
                Ok(batch) => return Some(batch),
                Err(e) => tracing::warn!(path = %path.display(),
                    problem = %crate::record::json_problem(&e),
                    "a batch of leases that cannot be read, skipped: its items count as not leased by it"),
            },
            Found::Absent => {}
            found => tracing::warn!(path = %path.display(),
                found = %found.describe(super::batch::BATCH_BYTES),
                "a batch of leases that cannot be read, skipped: its items count as not leased by it"),
        }
        None
    }

    /// Removes the lease batches no longer needed: one that gives leases when no item's lease
    /// that counts is one of its (`current`: by id, the lease batch whose lease counts), then a
    /// release when no lease batch left names any of its items.
    pub(super) fn remove_spent_leases(
        &self,
        current: &HashMap<String, String>,
    ) -> Result<(), RecordError> {
        let spent: Vec<String> = {
            let batches = self.batches()?;
            let giving: Vec<(&String, &LeaseBatch)> = batches
                .lease_files()
                .filter(|(_, b)| !b.released)
                .map(|(n, b)| (n, &**b))
                .collect();
            let spent_giving: HashSet<&String> = giving
                .iter()
                .filter(|(name, b)| !b.ids.iter().any(|id| current.get(id) == Some(*name)))
                .map(|(name, _)| *name)
                .collect();
            let still_named: HashSet<&str> = giving
                .iter()
                .filter(|(name, _)| !spent_giving.contains(name))
                .flat_map(|(_, b)| b.ids.iter().map(String::as_str))
                .collect();
            let spent_releases = batches
                .lease_files()
                .filter(|(_, b)| b.released)
                .filter(|(_, b)| !b.ids.iter().any(|id| still_named.contains(id.as_str())))
                .map(|(name, _)| name);
            spent_giving
                .iter()
                .copied()
                .chain(spent_releases)
                .cloned()
                .collect()
        };
        let top = self.batches()?.top();
        for name in spent
            .iter()
            .filter(|n| super::batch::sequence(n) != Some(top))
        {
            self.remove_file(&self.batches_dir.join(name))?;
        }
        Ok(())
    }

    /// The lease batch whose lease counts, by id, among the items `ids` (`own_leases`: the ids
    /// with a lease file of their own), for [`Self::remove_spent_leases`].
    pub(super) fn current_leases(
        &self,
        ids: impl Iterator<Item = String>,
        own_leases: &HashSet<String>,
    ) -> Result<HashMap<String, String>, RecordError> {
        let mut current = HashMap::new();
        let batches = self.batches()?;
        for id in ids {
            let Some((seq, batch)) = batches.best_lease(&id) else {
                continue;
            };
            let name = format!("{seq:020}{LEASES}");
            let own = if own_leases.contains(&id) {
                self.read_json::<LeaseFile>(&self.path(&id, LEASE))
            } else {
                None
            };
            let own_counts = own.is_some_and(|o| o.seq >= seq);
            if !own_counts && !batch.released {
                current.insert(id, name);
            }
        }
        Ok(current)
    }
}

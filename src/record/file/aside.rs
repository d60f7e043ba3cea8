//! Items kept aside in the state directory: an item that failed too often is held aside for a
//! person (its file says why), its failed attempts are counted where a lease is taken over, and an
//! operator's release offers it again.
//!
//! Why in the item file itself: the item and the reason it is held aside change together, in one
//! atomic rename, so no crash leaves an item held aside without its reason or offered with one.

use super::{FileRecordStore, ITEM};
use crate::record::RecordError;
use crate::record::lease::{self, Owner};
use crate::record::store::{ItemState, ResumeItem};
use serde::{Deserialize, Serialize};

/// An item file: the item, and why it is held aside when it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ItemFile {
    #[serde(flatten)]
    pub(super) item: ResumeItem,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) held_aside: Option<String>,
}

impl FileRecordStore {
    /// Writes `item`'s file again (durably), held aside for `held_aside` or offered.
    pub(super) fn rewrite_item(
        &self,
        item: ResumeItem,
        held_aside: Option<String>,
    ) -> Result<(), RecordError> {
        let path = self.path(&item.id, ITEM);
        self.write_json(&path, &ItemFile { item, held_aside })
    }

    /// Counts the failed attempt `why` of `state`, whose lease is being taken over.
    pub(super) fn count_failure(
        &self,
        state: &mut ItemState,
        why: String,
    ) -> Result<(), RecordError> {
        state.item.failures = state.item.failures.saturating_add(1);
        state.item.last_failure = Some(why);
        self.rewrite_item(state.item.clone(), None)
    }

    pub(super) fn hold_aside_now(
        &self,
        owner: &Owner,
        id: &str,
        reason: &str,
    ) -> Result<(), RecordError> {
        self.refuse_read_only()?;
        let unknown = || RecordError::UnknownItem { id: id.to_owned() };
        if !lease::is_valid_item_id(id) {
            return Err(unknown());
        }
        let state = self.state_of(id).ok_or_else(unknown)?;
        if !lease::holds(state.lease.as_ref(), owner) {
            return Err(RecordError::NotHolder {
                id: id.to_owned(),
                holder: state.lease.map(|l| l.owner.to_string()),
            });
        }
        tracing::warn!(
            id,
            reason,
            "an item is held aside for a person: it is not offered again \
            until an operator releases it"
        );
        self.rewrite_item(state.item, Some(reason.to_owned()))?;
        self.end_lease(id)
    }

    /// An operator's release of an item held aside: offered again, its failures counted from
    /// zero (its last failure stays, for the record).
    pub(super) fn offer_again(&self, mut state: ItemState) -> Result<(), RecordError> {
        state.item.failures = 0;
        let id = state.item.id.clone();
        self.rewrite_item(state.item, None)?;
        self.end_lease(&id)
    }

    /// Ends `owner`'s lease of `id` (any lease with `None`, an operator's release, which also
    /// offers an item held aside again).
    pub(super) fn release_now(&self, owner: Option<&Owner>, id: &str) -> Result<bool, RecordError> {
        self.refuse_read_only()?;
        let Some(state) = self.valid(id).and_then(|()| self.state_of(id)) else {
            return Err(RecordError::UnknownItem { id: id.to_owned() });
        };
        if owner.is_none() && state.quarantined.is_some() {
            self.offer_again(state)?;
            return Ok(true);
        }
        let Some(lease) = state.lease else {
            return Ok(false);
        };
        if let Some(owner) = owner
            && lease.owner != *owner
        {
            return Err(RecordError::NotHolder {
                id: id.to_owned(),
                holder: Some(lease.owner.to_string()),
            });
        }
        self.end_lease(id)?;
        Ok(true)
    }
}

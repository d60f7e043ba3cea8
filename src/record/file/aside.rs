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
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// An item file: the item, and why it is held aside when it is. On disk its fields are the
/// item's, side by side with `held_aside` ([`Line`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "Line<Owner, DateTime<Utc>, String, serde_json::Value>")]
pub(super) struct ItemFile {
    pub(super) item: ResumeItem,
    pub(super) held_aside: Option<String>,
}

/// An item file's JSON: the item's fields and `held_aside`, in one object. Spelled out rather
/// than `#[serde(flatten)]`, which writes through serde's generic map and reads by buffering
/// every field first. Generic so a batch can write what its items share (their stopper and the
/// stop's time) formatted once ([`serde_json::value::RawValue`]) and borrow the rest.
#[derive(Serialize, Deserialize)]
pub(super) struct Line<B, T, S, V> {
    pub(super) id: S,
    pub(super) participant: S,
    pub(super) item: V,
    pub(super) stopped_by: B,
    pub(super) stopped_at: T,
    pub(super) attempts: u32,
    #[serde(default)]
    pub(super) failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) last_failure: Option<S>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) held_aside: Option<S>,
}

impl ItemFile {
    /// The file's JSON with what the item shares with others given already formatted.
    pub(super) fn line<B, T>(
        &self,
        stopped_by: B,
        stopped_at: T,
    ) -> Line<B, T, &str, &serde_json::Value> {
        Line {
            id: &self.item.id,
            participant: &self.item.participant,
            item: &self.item.item,
            stopped_by,
            stopped_at,
            attempts: self.item.attempts,
            failures: self.item.failures,
            last_failure: self.item.last_failure.as_deref(),
            held_aside: self.held_aside.as_deref(),
        }
    }
}

impl<'i, B, T> Line<B, T, &'i str, &'i serde_json::Value> {
    /// The same line with its stopper and time replaced (by the forms a batch formatted once).
    pub(super) fn sharing<B2, T2>(
        self,
        stopped_by: B2,
        stopped_at: T2,
    ) -> Line<B2, T2, &'i str, &'i serde_json::Value> {
        Line {
            id: self.id,
            participant: self.participant,
            item: self.item,
            stopped_by,
            stopped_at,
            attempts: self.attempts,
            failures: self.failures,
            last_failure: self.last_failure,
            held_aside: self.held_aside,
        }
    }
}

impl Serialize for ItemFile {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.line(&self.item.stopped_by, &self.item.stopped_at)
            .serialize(serializer)
    }
}

impl From<Line<Owner, DateTime<Utc>, String, serde_json::Value>> for ItemFile {
    fn from(line: Line<Owner, DateTime<Utc>, String, serde_json::Value>) -> ItemFile {
        let item = ResumeItem::new(
            line.id,
            line.participant,
            line.item,
            line.stopped_by,
            line.stopped_at,
            line.attempts,
        )
        .with_failures(line.failures, line.last_failure);
        ItemFile {
            item,
            held_aside: line.held_aside,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::ItemFile;

    /// The form item files and batches have had since items had ids: read, and written, the same.
    #[test]
    fn an_item_file_reads_and_writes_the_form_it_always_had() {
        let line = r#"{"id":"a-1","participant":"jobs","item":{"n":7},"stopped_by":{"host":"h","pid":4,"start":9},"stopped_at":"2026-12-06T23:29:05.625847971Z","attempts":3,"failures":2,"last_failure":"killed","held_aside":"too often"}"#;
        let file: ItemFile = serde_json::from_str(line).unwrap();
        assert_eq!(
            (file.item.id.as_str(), file.item.participant.as_str()),
            ("a-1", "jobs")
        );
        assert_eq!(file.item.item, serde_json::json!({"n": 7}));
        assert_eq!(
            (file.item.stopped_by.pid, file.item.stopped_by.start),
            (4, 9)
        );
        assert_eq!((file.item.attempts, file.item.failures), (3, 2));
        assert_eq!(file.item.last_failure.as_deref(), Some("killed"));
        assert_eq!(file.held_aside.as_deref(), Some("too often"));
        assert_eq!(serde_json::to_string(&file).unwrap(), line);
        // Written before failures were counted: none counted, none held aside.
        let old = r#"{"id":"a-1","participant":"jobs","item":1,"stopped_by":{"host":"h","pid":4,"start":9},"stopped_at":"2026-12-06T23:29:05Z","attempts":1}"#;
        let file: ItemFile = serde_json::from_str(old).unwrap();
        assert_eq!(
            (file.item.failures, file.item.last_failure, file.held_aside),
            (0, None, None)
        );
    }
}

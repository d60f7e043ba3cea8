//! The [`RecordStore`] contract for the file store: each operation runs under the directory's
//! lock, off the actix event loop.

use super::FileRecordStore;
use crate::record::lease::Owner;
use crate::record::store::{ItemState, Leased, Persisted, RecordFuture, RecordStore};
use crate::record::{RecordError, StopRecord};
use std::time::Duration;

impl RecordStore for FileRecordStore {
    fn persist<'a>(
        &'a self,
        stopper: &'a Owner,
        record: std::sync::Arc<StopRecord>,
    ) -> RecordFuture<'a, Persisted> {
        let stopper = stopper.clone();
        self.off_thread(move |s| {
            s.persist_now(&stopper, &record)
                .map(|()| Persisted::Durable)
        })
    }

    fn lease<'a>(
        &'a self,
        owner: &'a Owner,
        max: usize,
        lease_for: Duration,
    ) -> RecordFuture<'a, Vec<Leased>> {
        let owner = owner.clone();
        self.off_thread(move |s| s.lease_now(&owner, max, lease_for))
    }

    fn renew<'a>(
        &'a self,
        owner: &'a Owner,
        ids: &'a [String],
        lease_for: Duration,
    ) -> RecordFuture<'a, Vec<String>> {
        let (owner, ids) = (owner.clone(), ids.to_vec());
        self.off_thread(move |s| s.renew_now(&owner, &ids, lease_for))
    }

    fn acknowledge<'a>(&'a self, owner: &'a Owner, id: &'a str) -> RecordFuture<'a, ()> {
        let (owner, id) = (owner.clone(), id.to_owned());
        self.off_thread(move |s| s.acknowledge_now(&owner, &id))
    }

    fn acknowledge_many<'a>(
        &'a self,
        owner: &'a Owner,
        ids: &'a [String],
    ) -> RecordFuture<'a, Vec<Result<(), RecordError>>> {
        let (owner, ids) = (owner.clone(), ids.to_vec());
        self.off_thread(move |s| s.acknowledge_many_now(&owner, &ids))
    }

    fn release<'a>(&'a self, owner: Option<&'a Owner>, id: &'a str) -> RecordFuture<'a, bool> {
        let (owner, id) = (owner.cloned(), id.to_owned());
        self.off_thread(move |s| s.release_now(owner.as_ref(), &id))
    }

    fn hold_aside<'a>(
        &'a self,
        owner: &'a Owner,
        id: &'a str,
        reason: &'a str,
    ) -> RecordFuture<'a, ()> {
        let (owner, id, reason) = (owner.clone(), id.to_owned(), reason.to_owned());
        self.off_thread(move |s| s.hold_aside_now(&owner, &id, &reason))
    }

    fn remove<'a>(&'a self, id: &'a str) -> RecordFuture<'a, bool> {
        let id = id.to_owned();
        self.off_thread(move |s| s.remove_now(&id))
    }

    fn list(&self) -> RecordFuture<'_, Vec<ItemState>> {
        self.off_thread(FileRecordStore::all)
    }

    fn last_stop(&self) -> RecordFuture<'_, Option<StopRecord>> {
        self.off_thread(|s| FileRecordStore::read_last_stop(&s.dir))
    }
}

impl FileRecordStore {
    /// Runs `op` holding the directory's lock, on the tokio runtime's blocking threads when
    /// polled inside one (the actix `System`: its event loop never waits on the disk or on
    /// another process's lock), else right here.
    pub(super) fn off_thread<T: Send + 'static>(
        &self,
        op: impl FnOnce(&FileRecordStore) -> Result<T, RecordError> + Send + 'static,
    ) -> RecordFuture<'static, T> {
        let store = self.clone();
        Box::pin(async move {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => runtime
                    .spawn_blocking(move || store.locked(|| op(&store)))
                    .await
                    .unwrap_or_else(|e| {
                        Err(RecordError::backend_caused_by(
                            "the state directory's worker thread failed",
                            e,
                        ))
                    }),
                Err(_) => store.locked(|| op(&store)),
            }
        })
    }
}

//! A record store with one fault, and items another process left: the record store's failures
//! as the service meets them.

use chrono::Utc;
use planned_stop::record::{FileRecordStore, RecordStore, Sharing, StopRecord};
use std::time::Duration;

/// What a [`Faulty`] record store does wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// Its persist never ends (a database that does not answer, a store without a timeout).
    PersistHangs,
    /// Its persist blocks the thread it runs on (the event loop): only the watchdog can help.
    PersistBlocks,
    /// Its first renewal fails (a database unreachable for a moment).
    FirstRenewalFails,
    /// Its own place is unreachable at the persist: the items go to its fallback on this host
    /// (a database store's spill directory; here the inner file store).
    PersistSpills,
    /// None: a plain file store that records how its acknowledgements came.
    None,
}

/// A file store with one fault; it records when each renewal came (on the paused clock).
#[derive(Debug)]
pub struct Faulty {
    pub inner: planned_stop::record::FileRecordStore,
    fault: Fault,
    pub renewals: std::sync::Mutex<Vec<tokio::time::Instant>>,
    /// How many items each acknowledging call carried (1 for `acknowledge`).
    pub acknowledged_in: std::sync::Mutex<Vec<usize>>,
}

impl Faulty {
    pub fn new(state: &std::path::Path, fault: Fault) -> std::sync::Arc<Faulty> {
        std::sync::Arc::new(Faulty {
            inner: FileRecordStore::open(state, Sharing::Refused).unwrap(),
            fault,
            renewals: std::sync::Mutex::default(),
            acknowledged_in: std::sync::Mutex::default(),
        })
    }
}

impl RecordStore for Faulty {
    fn persist<'a>(
        &'a self,
        s: &'a planned_stop::record::Owner,
        r: std::sync::Arc<StopRecord>,
    ) -> planned_stop::record::RecordFuture<'a, planned_stop::record::Persisted> {
        match self.fault {
            Fault::PersistHangs => Box::pin(std::future::pending()),
            Fault::PersistBlocks => Box::pin(async {
                std::thread::sleep(super::HELPER_LIFETIME);
                Ok(planned_stop::record::Persisted::Durable)
            }),
            Fault::FirstRenewalFails | Fault::None => self.inner.persist(s, r),
            Fault::PersistSpills => Box::pin(async move {
                self.inner.persist(s, r).await?;
                Ok(planned_stop::record::Persisted::Spilled {
                    reason: "the database is unreachable".into(),
                })
            }),
        }
    }
    fn lease<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        m: usize,
        d: Duration,
    ) -> planned_stop::record::RecordFuture<'a, Vec<planned_stop::record::Leased>> {
        self.inner.lease(o, m, d)
    }
    fn renew<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        ids: &'a [String],
        d: Duration,
    ) -> planned_stop::record::RecordFuture<'a, Vec<String>> {
        let mut renewals = self.renewals.lock().unwrap();
        renewals.push(tokio::time::Instant::now());
        if self.fault == Fault::FirstRenewalFails && renewals.len() == 1 {
            return Box::pin(async {
                Err(planned_stop::record::RecordError::backend(
                    "unreachable for a moment",
                ))
            });
        }
        self.inner.renew(o, ids, d)
    }
    fn acknowledge<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        id: &'a str,
    ) -> planned_stop::record::RecordFuture<'a, ()> {
        self.acknowledged_in.lock().unwrap().push(1);
        self.inner.acknowledge(o, id)
    }
    fn acknowledge_many<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        ids: &'a [String],
    ) -> planned_stop::record::RecordFuture<'a, Vec<Result<(), planned_stop::record::RecordError>>>
    {
        self.acknowledged_in.lock().unwrap().push(ids.len());
        self.inner.acknowledge_many(o, ids)
    }
    fn release<'a>(
        &'a self,
        o: Option<&'a planned_stop::record::Owner>,
        id: &'a str,
    ) -> planned_stop::record::RecordFuture<'a, bool> {
        self.inner.release(o, id)
    }
    fn hold_aside<'a>(
        &'a self,
        o: &'a planned_stop::record::Owner,
        id: &'a str,
        reason: &'a str,
    ) -> planned_stop::record::RecordFuture<'a, ()> {
        self.inner.hold_aside(o, id, reason)
    }
    fn remove<'a>(&'a self, id: &'a str) -> planned_stop::record::RecordFuture<'a, bool> {
        self.inner.remove(id)
    }
    fn list(&self) -> planned_stop::record::RecordFuture<'_, Vec<planned_stop::record::ItemState>> {
        self.inner.list()
    }
    fn last_stop(&self) -> planned_stop::record::RecordFuture<'_, Option<StopRecord>> {
        self.inner.last_stop()
    }
}

/// Persists `items` in `store` as a stop of another process left them, before the service under
/// test starts (outside any runtime of the test's).
pub fn left_by_another_process(store: &dyn RecordStore, items: Vec<serde_json::Value>) {
    let record = planned_stop::testing::stop_record(1, Utc::now(), items);
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(store.persist(
            &planned_stop::record::Owner::new("elsewhere", 1, 1),
            record.clone().into(),
        ))
        .unwrap();
}

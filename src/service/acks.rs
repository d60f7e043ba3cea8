//! Acknowledgements gathered: those asked for at the same moment go to the record store together.
//!
//! Why: work that finishes together — a `WorkSet` of thousands of items, the resumed jobs of a
//! start — would otherwise be acknowledged one store operation at a time, each with its own syncs
//! or its own statement. The first acknowledgement of a moment starts a flush that yields until a
//! turn of the event loop brings no more, so every acknowledgement asked for meanwhile joins it,
//! and then makes one
//! [`RecordStore::acknowledge_many`] call for all of them; each caller gets its own answer.

use crate::record::{Owner, RecordError, RecordStore};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

type Waiting = Vec<(String, oneshot::Sender<Result<(), RecordError>>)>;

/// The acknowledgements waiting for the next flush (see the module docs).
#[derive(Default)]
pub(crate) struct Acks {
    waiting: Mutex<Waiting>,
}

impl std::fmt::Debug for Acks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acks").finish_non_exhaustive()
    }
}

impl Acks {
    /// Acknowledges `id` for `owner` in `store`, together with the others of this moment.
    pub(crate) async fn acknowledge(
        self: &Arc<Self>,
        store: Arc<dyn RecordStore>,
        owner: Owner,
        id: String,
    ) -> Result<(), RecordError> {
        let (answer, answered) = oneshot::channel();
        let first = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
            waiting.push((id, answer));
            waiting.len() == 1
        };
        if first {
            let flush = Arc::clone(self).flush(store, owner);
            match tokio::runtime::Handle::try_current() {
                // A task of its own: a caller that stops waiting never strands the others.
                Ok(runtime) => drop(runtime.spawn(flush)),
                Err(_) => flush.await,
            }
        }
        answered.await.unwrap_or_else(|_| {
            Err(RecordError::backend(
                "the acknowledgement was never made (its flush ended early); nothing changed is \
                 known: acknowledge the item again",
            ))
        })
    }

    async fn flush(self: Arc<Self>, store: Arc<dyn RecordStore>, owner: Owner) {
        // Every acknowledgement asked for while this task waits joins this one: it yields until
        // a turn brings none (others are still arriving while the event loop runs their tasks).
        loop {
            let before = self.waiting.lock().unwrap_or_else(|e| e.into_inner()).len();
            tokio::task::yield_now().await;
            if self.waiting.lock().unwrap_or_else(|e| e.into_inner()).len() == before {
                break;
            }
        }
        let batch = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        let ids: Vec<String> = batch.iter().map(|(id, _)| id.clone()).collect();
        match store.acknowledge_many(&owner, &ids).await {
            Ok(answers) if answers.len() == batch.len() => {
                for ((_, waiting), answer) in batch.into_iter().zip(answers) {
                    let _ = waiting.send(answer);
                }
            }
            Ok(_) => {
                for (_, waiting) in batch {
                    let _ = waiting.send(Err(RecordError::backend(
                        "the record store answered a different number of acknowledgements than \
                         it was asked: none is known to be made; acknowledge the items again",
                    )));
                }
            }
            Err(e) => {
                let why = crate::error_chain::ErrorChain(&e).to_string();
                for (_, waiting) in batch {
                    let _ = waiting.send(Err(RecordError::backend(why.clone())));
                }
            }
        }
    }
}

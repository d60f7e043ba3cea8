//! [`ResumeLoop`]: while the service runs, it takes over what stopped or dead replicas left.
//!
//! Why this exists: [`ServiceHandle::resume`] is one lease, usually at start. In a fleet a
//! stopped replica's items would then wait until some process starts, unless every application
//! wrote its own loop — and the loops written by hand race the drain: an item leased just after
//! its participant drained is neither handed back nor acknowledged, and stays leased to a
//! process that will never work on it until that process exits. This loop leases at a period the
//! application sets, at most a given number of items at a time (so replicas share), delivers each
//! item to the participant or task group that owns it (by the participant name it was recorded
//! under), and stops leasing once a drain has begun. The loop is a drain participant itself: its
//! drain waits for a lease under way (within the phase's deadline) and hands back whatever that
//! lease brought, in the same stop; anything nobody here takes is released at once, on offer
//! again to another replica or version.

use crate::lifecycle::DrainPhase;
use crate::record::Leased;
use crate::runner::{Drain, DrainReport};
use crate::service::ServiceHandle;
use crate::tasks::TaskGroup;
use actix::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The participant name the loop drains under.
const PARTICIPANT: &str = "resume loop";

/// Takes a resumed item (`None`), or gives it back (`Some`) when it cannot: then it is released.
type Deliver = Box<dyn FnMut(Leased) -> Option<Leased>>;

/// The default of [`ResumeLoop::at_most`]: items taken by one lease.
pub const DEFAULT_RESUME_BATCH: usize = 32;

/// A loop that leases what stopped or dead replicas left while the service runs: at a period the
/// application sets, at most [`ResumeLoop::at_most`] items a lease (so replicas share), each
/// delivered to the participant or task group it was recorded under; it stops leasing once a drain
/// has begun, and as a drain participant itself hands back in the same stop what a lease under way
/// brought after that.
///
/// ```
/// # use planned_stop::{Layout, ServiceBuilder, JobEnd, ResumeLoop, TaskGroup};
/// # use std::time::Duration;
/// # let dir = tempfile::tempdir().unwrap();
/// actix::System::new().block_on(async {
///     let service = ServiceBuilder::new(Layout::Slots(dir.path().join("run")))
///         .state_dir(dir.path().join("state"))
///         .owns_process_exit(false)
///         .handle_signals(false)
///         .start()
///         .unwrap();
///     let emails = TaskGroup::new(&service, "emails", |email: String, stop| async move {
///         tokio::select! {
///             _ = stop.cancelled() => JobEnd::Unfinished,
///             _ = send(&email) => JobEnd::Done,
///         }
///     });
///     ResumeLoop::new(&service, Duration::from_secs(10))
///         .at_most(16)
///         .deliver_to(&emails)
///         .start();
///     service.ready();
/// #   async fn send(_: &str) {}
/// });
/// ```
pub struct ResumeLoop {
    service: ServiceHandle,
    every: Duration,
    at_most: usize,
    routes: HashMap<String, Deliver>,
    /// Where items of a participant without a route go; `None`: they are released.
    otherwise: Option<Deliver>,
    shared: Arc<Shared>,
}

/// What the loop and its drain share.
#[derive(Default)]
struct Shared {
    late: Mutex<Late>,
    /// A lease under way has landed.
    landed: tokio::sync::Notify,
}

#[derive(Default)]
struct Late {
    /// A lease is under way.
    leasing: bool,
    /// The drain has answered: nothing can be handed back any more.
    answered: bool,
    /// What a lease brought after the drain began, for the drain to hand back.
    items: Vec<Leased>,
}

impl std::fmt::Debug for ResumeLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResumeLoop")
            .field("every", &self.every)
            .field("at_most", &self.at_most)
            .field("routes", &self.routes.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ResumeLoop {
    /// A loop for `service` that leases every `every` (at least 1 ms), at most
    /// [`DEFAULT_RESUME_BATCH`] items at a time.
    pub fn new(service: &ServiceHandle, every: Duration) -> ResumeLoop {
        ResumeLoop {
            service: service.clone(),
            every: every.max(Duration::from_millis(1)),
            at_most: DEFAULT_RESUME_BATCH,
            routes: HashMap::new(),
            otherwise: None,
            shared: Arc::default(),
        }
    }

    /// At most `n` items (at least 1) a lease: what is left stays on offer to other replicas.
    #[must_use]
    pub fn at_most(mut self, n: usize) -> ResumeLoop {
        self.at_most = n.max(1);
        self
    }

    /// Items recorded under the participant name `participant` go to `deliver`, which takes one
    /// (answers `None`, and from then on owns its acknowledgement or hand-back) or gives it back
    /// (answers `Some(item)`: it is released).
    #[must_use]
    pub fn deliver(
        mut self,
        participant: impl Into<String>,
        deliver: impl FnMut(Leased) -> Option<Leased> + 'static,
    ) -> ResumeLoop {
        self.routes.insert(participant.into(), Box::new(deliver));
        self
    }

    /// Items recorded under a participant name no [`ResumeLoop::deliver`] names go to `deliver`
    /// (without it they are released, for another replica or version).
    #[must_use]
    pub fn otherwise(
        mut self,
        deliver: impl FnMut(Leased) -> Option<Leased> + 'static,
    ) -> ResumeLoop {
        self.otherwise = Some(Box::new(deliver));
        self
    }

    /// Items recorded under `group`'s name run as its tasks, with the group's own work function
    /// ([`TaskGroup::spawn_resumed`]).
    #[must_use]
    pub fn deliver_to<T>(self, group: &TaskGroup<T>) -> ResumeLoop
    where
        T: Serialize + DeserializeOwned + Send + 'static,
    {
        let (name, group) = (group.name().to_owned(), group.clone());
        self.deliver(name, move |leased| {
            group.spawn_resumed(leased).err().map(|refused| refused.job)
        })
    }

    /// Starts the loop on the current actix `System` (the service's), and registers its drain
    /// participant (in the work phase): call it before [`ServiceHandle::ready`]. The loop ends
    /// once the service is no longer running.
    pub fn start(mut self) {
        let participant = LoopDrain(self.shared.clone()).start();
        self.service
            .add_participant(DrainPhase::Work, PARTICIPANT, participant.recipient());
        actix::spawn(async move {
            while !self.service.status().state.is_stopping() {
                self.once().await;
                actix::clock::sleep(self.every).await;
            }
        });
    }

    /// One lease, while the service runs, and the delivery of what it brought.
    async fn once(&mut self) {
        if !self.service.status().state.is_serving() {
            return;
        }
        match self.shared.late.lock() {
            Ok(mut late) if !late.answered => late.leasing = true,
            _ => return,
        }
        let leased = self.service.resume_at_most(self.at_most).await;
        let leased = match leased {
            Ok(leased) => leased,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain::ErrorChain(&e),
                    "cannot lease the items on offer now; trying again at the next period");
                Vec::new()
            }
        };
        // Decided after the lease returned: what a drain overtook goes to the drain.
        let running = self.service.status().state.is_serving();
        let leased = self.land(leased, running);
        for item in leased {
            let route = match self.routes.get_mut(&item.item.participant) {
                Some(deliver) => Some(deliver),
                None => self.otherwise.as_mut(),
            };
            let refused = match route {
                Some(deliver) => deliver(item),
                None => {
                    tracing::warn!(participant = %item.item.participant, id = %item.item.id,
                        "a resumed item belongs to no participant this loop delivers to; \
                        released for another replica or version");
                    Some(item)
                }
            };
            if let Some(item) = refused {
                self.release(item);
            }
        }
    }

    /// The lease has landed: what it brought is delivered (returned) while the service runs,
    /// handed to the drain once one began, and released when the drain has answered already.
    fn land(&self, leased: Vec<Leased>, running: bool) -> Vec<Leased> {
        let mut leased = Some(leased);
        if let Ok(mut late) = self.shared.late.lock() {
            late.leasing = false;
            if !running && !late.answered {
                late.items.extend(leased.take().unwrap_or_default());
            }
        }
        self.shared.landed.notify_waiters();
        match leased {
            Some(leased) if !running => {
                for item in leased {
                    self.release(item);
                }
                Vec::new()
            }
            Some(leased) => leased,
            None => Vec::new(),
        }
    }

    /// Gives `item` up at once: on offer again, to the next life or another replica.
    fn release(&self, item: Leased) {
        let releasing = self.service.release(&item);
        actix::spawn(async move {
            if let Err(e) = releasing.await {
                tracing::warn!(id = %item.item.id, error = %crate::error_chain::ErrorChain(&e),
                    "cannot release a resumed item this process will not work on: it is \
                    offered again once this process is gone");
            }
        });
    }
}

/// The loop as a drain participant: it waits for a lease under way and hands back what it
/// brought.
struct LoopDrain(Arc<Shared>);

impl Actor for LoopDrain {
    type Context = Context<Self>;
}

impl Handler<Drain> for LoopDrain {
    type Result = ResponseFuture<DrainReport>;

    fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> Self::Result {
        let shared = self.0.clone();
        // Answer a little before the phase's deadline, so the answer counts as in time.
        let deadline = tokio::time::Instant::now() + drain.within.saturating_sub(drain.within / 20);
        Box::pin(async move {
            loop {
                let landed = shared.landed.notified();
                tokio::pin!(landed);
                landed.as_mut().enable();
                if let Ok(mut late) = shared.late.lock()
                    && (!late.leasing || tokio::time::Instant::now() >= deadline)
                {
                    late.answered = true;
                    return DrainReport::done().with_handed_back(std::mem::take(&mut late.items));
                }
                let _ = tokio::time::timeout_at(deadline, landed).await;
            }
        })
    }
}

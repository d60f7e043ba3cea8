//! The participants' answers of the running phase, each in a slot the runner can look into.
//!
//! Why: an answer is a message on its way back, and with thousands of participants answering at
//! their deadline the event loop needs a while to hand each one to the runner (tokio polls a task
//! a bounded number of times before it must yield). An answer that has reached the runner's slot
//! must count even if the runner's own phase timer comes first, so the timer looks into every
//! slot before it names anyone as unanswered.

use super::DrainReport;
use actix::MailboxError;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

type Request = Pin<Box<dyn Future<Output = Result<DrainReport, MailboxError>>>>;

/// One participant's answer on its way: polled by the runner's context as it arrives, or looked
/// into at the phase's end ([`Slot::delivered`]); whichever comes first takes it.
#[derive(Clone)]
pub(super) struct Slot(Rc<RefCell<Option<Request>>>);

impl Slot {
    pub(super) fn new(
        request: impl Future<Output = Result<DrainReport, MailboxError>> + 'static,
    ) -> Slot {
        Slot(Rc::new(RefCell::new(Some(Box::pin(request)))))
    }

    /// The answer, when it is there and nobody has taken it yet; never waits.
    pub(super) fn delivered(&self) -> Option<Result<DrainReport, MailboxError>> {
        let mut cx = Context::from_waker(Waker::noop());
        match self.poll_slot(&mut cx) {
            Poll::Ready(answer) => answer,
            Poll::Pending => None,
        }
    }

    /// Resolves to the answer, or to `None` when [`Slot::delivered`] took it first.
    pub(super) fn arrival(self) -> impl Future<Output = Option<Result<DrainReport, MailboxError>>> {
        std::future::poll_fn(move |cx| self.poll_slot(cx))
    }

    fn poll_slot(&self, cx: &mut Context<'_>) -> Poll<Option<Result<DrainReport, MailboxError>>> {
        let mut slot = self.0.borrow_mut();
        let Some(request) = slot.as_mut() else {
            return Poll::Ready(None);
        };
        // Not subject to tokio's cooperative budget: a delivered answer is taken even when the
        // runner's task has used up its budget on the answers before it.
        let answer = std::pin::pin!(tokio::task::unconstrained(request.as_mut())).poll(cx);
        if answer.is_ready() {
            *slot = None;
        }
        answer.map(Some)
    }
}

//! The runner's mailbox: each message turned into a call on the actor, where the rules are.

use super::drain::Requester;
use super::{
    AddParticipant, HeldStop, OsSignal, Participant, PlannedStop, Ready, RequestStop, RunnerActor,
};
use crate::lifecycle::{ProcessState, Step};
use actix::prelude::*;

impl Handler<HeldStop> for RunnerActor {
    type Result = ();

    fn handle(&mut self, HeldStop(stop): HeldStop, _: &mut Context<Self>) {
        if !self.lifecycle.state().is_starting() {
            return;
        }
        // A warning: the stopper waits (and a deploy with it) while the application serves
        // without having said it is ready, which is a bug in the application more often than not.
        tracing::warn!(
            request_id = stop.request_id.as_deref(),
            "a planned stop is held until the application is ready (its handle's ready())"
        );
        let held = self.planned_outcome(&stop, ProcessState::Held);
        self.publish_outcome(held);
    }
}

#[cfg(feature = "internals")]
impl Handler<super::messages::CaughtUp> for RunnerActor {
    type Result = ();

    fn handle(&mut self, _: super::messages::CaughtUp, _: &mut Context<Self>) {}
}

impl Handler<Ready> for RunnerActor {
    type Result = ();

    fn handle(&mut self, _: Ready, ctx: &mut Context<Self>) {
        self.check_restart_in_place(ctx);
        let step = self.lifecycle.ready();
        let requester = self.held.take().map(Requester::from).unwrap_or_default();
        if matches!(step, Step::Drain(..)) {
            self.claim();
        }
        self.act(step, requester, ctx);
    }
}

impl Handler<PlannedStop> for RunnerActor {
    type Result = ();

    fn handle(&mut self, stop: PlannedStop, ctx: &mut Context<Self>) {
        let _in_stop = self.in_stop();
        let Some(stop) = self.take_for_restart(stop, ctx) else {
            return;
        };
        let step = self.lifecycle.planned_stop();
        match step {
            Step::Hold => self.held = Some(stop),
            Step::Drain(..) => {
                // The watcher's probe already judged the marker ours; consume it so it cannot be
                // seen again, and prefer what the claimed file says.
                let requester = self.claim().map(|m| PlannedStop::from(&m)).unwrap_or(stop);
                return self.act(step, requester.into(), ctx);
            }
            _ => {}
        }
        self.act(step, Requester::default(), ctx);
    }
}

impl Handler<OsSignal> for RunnerActor {
    type Result = ();

    fn handle(&mut self, OsSignal(kind): OsSignal, ctx: &mut Context<Self>) {
        let _in_stop = self.in_stop();
        tracing::info!(signal = ?kind, "signal received");
        let claimed = if self.lifecycle.awaits_classification() {
            self.claim()
        } else {
            None
        };
        let step = self.lifecycle.signal(kind, claimed.is_some());
        if kind == crate::lifecycle::SignalKind::Interrupt
            && matches!(step, Step::Ignore(_))
            && self.lifecycle.state() == ProcessState::Draining
        {
            tracing::warn!(
                "Ctrl-C while draining: the drain goes on; a second Ctrl-C forces the stop, \
                 cutting it short"
            );
        }
        let requester = match (claimed, self.held.take()) {
            (Some(m), _) => PlannedStop::from(&m).into(),
            (None, Some(held)) => held.into(),
            (None, None) => Requester::default(),
        };
        self.act(step, requester, ctx);
    }
}

impl Handler<RequestStop> for RunnerActor {
    type Result = ();

    fn handle(&mut self, request: RequestStop, ctx: &mut Context<Self>) {
        let _in_stop = self.in_stop();
        let step = self.lifecycle.request(request.0);
        self.act(step, Requester::default(), ctx);
    }
}

impl Handler<AddParticipant> for RunnerActor {
    type Result = ();

    fn handle(&mut self, add: AddParticipant, _: &mut Context<Self>) {
        let _in_stop = self.in_stop();
        if self.lifecycle.state().is_stopping() {
            tracing::warn!(participant = %add.name, "too late to join the drain: already stopping");
            return;
        }
        self.participants.push(Participant {
            phase: add.phase,
            name: add.name,
            recipient: add.recipient,
        });
    }
}

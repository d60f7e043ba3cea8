//! The end of a stop: the drain's answers become the stop record, which is persisted (within
//! the persist deadline) before the outcome and the exit code are published.

use super::restart::Stage;
use super::{RunnerActor, process_end, wall_deadline};
use crate::error_chain::ErrorChain;
use crate::lifecycle::{ProcessState, StopVerdict};
use crate::outcome::Outcome;
use crate::record::{
    Note, Persisted, RecordError, StopRecord, Unfinished, is_valid_item_id, item_id, unstorable,
};
use actix::prelude::*;
use std::sync::Arc;

impl RunnerActor {
    /// Every phase has answered or run out of time: the stop's exit code, its items (new work
    /// gets an id, an item no store may hold is kept out and makes the stop `record_lost`), and
    /// the stop record, handed to the record store within the persist deadline.
    pub(super) fn finish(&mut self, ctx: &mut Context<Self>) {
        let _in_stop = self.in_stop();
        let Some(verdict) = self.lifecycle.stopped() else {
            return;
        };
        let Some(run) = self.drain.take() else {
            return;
        };
        self.status
            .send_if_modified(|status| status.drain_phase.take().is_some());
        // A marker a racing stopper wrote after the one accepted would otherwise stay behind for
        // this pid once the process is gone: consume it now.
        if let Some(late) = self.claim() {
            tracing::info!(
                request_id = late.request_id.as_deref(),
                "a later stop request for this process is consumed: a stop was already under way"
            );
        }
        let finished_at = self.clock.now();
        let action = run.requester.action;
        let successor = self.successor_serving(run.requester.successor);
        let code = match (verdict, action, successor) {
            // Restarted in place: the successor serves, this process stops as planned. A
            // successor that ended since its ready serves nothing: the restart code then, for
            // the supervisor to start the service again.
            (StopVerdict::Planned, crate::schema::StopAction::Restart, None) => {
                i32::from(self.config.exit_codes.restart)
            }
            _ => i32::from(self.config.exit_codes.code(run.cause, verdict)),
        };
        let names: Vec<&str> = self.participants.iter().map(|p| p.name.as_str()).collect();
        let drained_in_time = run.drained_in_time(&names);
        let unanswered = run.unanswered(&names);
        let stopper = crate::record::host::this_process(&self.own);
        let (unfinished, unrecorded, notes) = sort_out_items(
            &stopper,
            finished_at,
            run.unfinished,
            run.unrecordable,
            run.notes,
        );
        // The summary says the code the process will end with.
        let code = if unrecorded.is_empty() || self.config.records.is_none() {
            code
        } else {
            i32::from(self.config.exit_codes.record_lost_code(run.cause))
        };
        self.unrecorded = unrecorded;
        let record = StopRecord {
            pid: self.own.pid,
            cause: run.cause,
            verdict,
            request_id: run.requester.request_id,
            reason: run.requester.reason,
            stopper_pid: run.requester.stopper_pid,
            accepted_at: run.accepted_at,
            drain_deadline: wall_deadline(run.accepted_at, run.within),
            finished_at,
            drained_in_time,
            forced: run.forced,
            unfinished,
            unfinished_omitted: 0,
            unanswered,
            notes,
            phases: run.phases,
            action,
            exit_code: code,
        };
        debug_assert_eq!(record.verdict, run.verdict);
        if let Ok(mut pending) = self.pending.lock() {
            *pending = Some(items_json(&record.unfinished, &self.unrecorded));
        }
        let given_back = self.given_back(&record);
        self.persist(record, stopper, given_back, ctx);
    }

    /// The items a forced planned stop gives back: those this process holds that no participant
    /// handed back (their holders were cut off by the force, or never answered). A deploy that
    /// reaches `--kill`'s deadline, or a second Ctrl-C, is no failed attempt of theirs; left
    /// leased, the next start would count one for each ("killed or crashed").
    fn given_back(&self, record: &StopRecord) -> Vec<String> {
        if !record.forced || record.verdict != StopVerdict::Planned {
            return Vec::new();
        }
        let handed_back: std::collections::BTreeSet<&str> = record
            .unfinished
            .iter()
            .filter(|u| u.resumed)
            .filter_map(|u| u.id.as_deref())
            .collect();
        let held = match self.leased.lock() {
            Ok(held) => held.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        held.into_iter()
            .filter(|id| !handed_back.contains(id.as_str()))
            .collect()
    }

    /// Hands `record` to the record store within the persist deadline, and concludes with what
    /// it answers. Persisted before anything reports the stop: the outcome, the status and the
    /// exit code all wait for the items to be durable, within the persist's own budget. Without
    /// a store the items go to one ERROR line.
    fn persist(
        &mut self,
        record: StopRecord,
        stopper: crate::record::Owner,
        given_back: Vec<String>,
        ctx: &mut Context<Self>,
    ) {
        let Some(store) = self.config.records.clone() else {
            if !record.unfinished.is_empty() || !self.unrecorded.is_empty() {
                tracing::error!(
                    items = %items_json(&record.unfinished, &self.unrecorded),
                    "no record store is configured (neither a state directory nor a \
                     database); the unfinished items are only in this log line"
                );
            }
            return self.conclude(record, Ok(Persisted::Durable), ctx);
        };
        let budget = self.config.persist_deadline;
        let record = Arc::new(record);
        let persisting = async move {
            let recording = async {
                let persisted = store.persist(&stopper, Arc::clone(&record)).await?;
                give_back(store.as_ref(), &stopper, &given_back).await;
                Ok(persisted)
            };
            let result = match actix::clock::timeout(budget, recording).await {
                Ok(result) => result,
                Err(_) => Err(RecordError::backend(format!(
                    "the record store did not finish persisting within {budget:?} (the persist \
                     deadline); is it reachable?"
                ))),
            };
            // The store is done with it, unless it is still at work past the deadline.
            let record =
                Arc::try_unwrap(record).unwrap_or_else(|shared| StopRecord::clone(&shared));
            (record, result)
        };
        // The store's own log lines (a retry, a spill) belong to this stop too.
        let persisting = tracing::Instrument::instrument(
            persisting,
            self.stop_span.clone().unwrap_or_else(tracing::Span::none),
        );
        ctx.wait(
            persisting
                .into_actor(self)
                .map(|(record, result), act, ctx| act.conclude(record, result, ctx)),
        );
    }

    /// Ends the stop once the record is persisted (or could not be): the final outcome, the
    /// status, the exit code.
    fn conclude(
        &mut self,
        mut record: StopRecord,
        persisted: Result<Persisted, RecordError>,
        ctx: &mut Context<Self>,
    ) {
        let _in_stop = self.in_stop();
        let unrecorded = std::mem::take(&mut self.unrecorded);
        let store = self.config.records.is_some();
        let fates = crate::telemetry::item_fates(
            record.unfinished.len(),
            unrecorded.len(),
            store.then_some(&persisted),
        );
        let (state, spilled) = self.final_state(&mut record, persisted, &unrecorded);
        if let Ok(mut pending) = self.pending.lock() {
            *pending = None;
        }
        crate::telemetry::stop_concluded(&record, fates);
        let code = record.exit_code;
        tracing::info!(
            verdict = ?record.verdict,
            code,
            drained_in_time = record.drained_in_time,
            "stopped"
        );
        let mut concluded = Outcome::accepted(
            &self.own,
            record.cause,
            record.verdict,
            record.accepted_at,
            record.drain_deadline,
        )
        .concluded(state, record.finished_at, code);
        concluded.request_id = record.request_id.clone();
        concluded.spilled = spilled;
        concluded.drain = Some((&record).into());
        concluded.action = record.action;
        (concluded.successor, concluded.note) = match std::mem::take(&mut self.stage) {
            Stage::HandedTo(successor) => (Some(successor.pid), None),
            Stage::SuccessorLost(why) => (None, Some(why)),
            Stage::Idle | Stage::Starting { .. } => (None, None),
        };
        self.publish_outcome(concluded);
        if self.config.owns_process_exit {
            if let Some(system) = System::try_current() {
                system.stop_with_code(i32::from(process_end::status_of(code)));
            }
            // Whatever main does next (returns another code, or never returns because it runs
            // a server with block_on), the process ends with this code.
            process_end::concluded(code, Some(record.verdict), self.config.exit_grace);
        }
        ctx.stop();
    }

    /// The successor this stop handed over to, if it still runs (the same process that said it
    /// was ready); otherwise `None`, with the reason kept for the final outcome's note.
    fn successor_serving(&mut self, handed_over: Option<u32>) -> Option<u32> {
        let pid = handed_over?;
        let runs = matches!(&self.stage,
            Stage::HandedTo(at_ready) if crate::ProcessIdentity::is_running(pid, at_ready.start));
        if runs {
            return Some(pid);
        }
        let why = format!(
            "its successor, pid {pid}, ended after it said it was ready: nothing serves from \
             the handed-over sockets, so this process ends with the restart code for its \
             supervisor to start the service again; the successor's log says why it ended"
        );
        tracing::error!(successor = pid, "{why}");
        self.stage = Stage::SuccessorLost(why);
        None
    }

    /// How the stop ends, from what the store answered: `stopped` (and whether its items
    /// spilled to this host), or `record_lost` — the store failed, or items no store may hold
    /// were handed back — with the record-lost exit code set on `record`. Each said in its log.
    fn final_state(
        &self,
        record: &mut StopRecord,
        persisted: Result<Persisted, RecordError>,
        unrecorded: &[Unfinished],
    ) -> (ProcessState, bool) {
        let store = self.config.records.is_some();
        let mut spilled = false;
        let state = match persisted {
            // Without a store every item is only in the log line `finish` wrote, and the exit
            // code stays the verdict's: the application chose to keep nothing.
            Ok(_) if !unrecorded.is_empty() && store => {
                record.exit_code = i32::from(self.config.exit_codes.record_lost_code(record.cause));
                tracing::error!(
                    code = record.exit_code,
                    items = %items_json(&[], unrecorded),
                    "items no record store may hold were handed back (over the size limit \
                     MAX_ITEM_BYTES, holding a NUL character, under an id that is not an item id, \
                     or not serialisable as JSON): they are not recorded anywhere but in this log \
                     line; resubmit them, and hand back small JSON items (an id of the work, not \
                     the work itself). The other items are durable"
                );
                ProcessState::RecordLost
            }
            Ok(how) => {
                if let Persisted::Spilled { reason } = &how {
                    spilled = true;
                    tracing::warn!(
                        reason,
                        unfinished = record.unfinished.len(),
                        "the record store was unreachable; the unfinished items are kept on this \
                         host until the next start here pushes them"
                    );
                } else if store {
                    tracing::info!(
                        unfinished = record.unfinished.len(),
                        "stop record and unfinished items persisted"
                    );
                }
                ProcessState::Stopped
            }
            Err(e) => {
                record.exit_code = i32::from(self.config.exit_codes.record_lost_code(record.cause));
                tracing::error!(
                    error = %ErrorChain(&e),
                    code = record.exit_code,
                    items = %items_json(&record.unfinished, unrecorded),
                    "cannot persist the stop record: the unfinished items are not recorded \
                     anywhere but in this log line; resubmit them, then fix the record store"
                );
                ProcessState::RecordLost
            }
        };
        (state, spilled)
    }
}

/// The items of a stop as one JSON array, for the log line that is their last trace.
fn items_json(recorded: &[Unfinished], unrecorded: &[Unfinished]) -> String {
    let all: Vec<&Unfinished> = recorded.iter().chain(unrecorded).collect();
    serde_json::to_string(&all).unwrap_or_default()
}

/// The stop's items sorted out, pure: new work gets its id (a handed-back item keeps the one it
/// came with, never a new one, which would multiply it); an item no store may hold — too large,
/// handed back under an id that is not an item id, or one that could not even be serialised —
/// is kept out of the record (unrecorded: the stop ends `record_lost`, the item in the ERROR log
/// line, never dropped silently), and a note says so. Returns (recorded, unrecorded, notes).
fn sort_out_items(
    stopper: &crate::record::Owner,
    finished_at: chrono::DateTime<chrono::Utc>,
    mut unfinished: Vec<Unfinished>,
    unrecordable: Vec<Note>,
    mut notes: Vec<Note>,
) -> (Vec<Unfinished>, Vec<Unfinished>, Vec<Note>) {
    for (index, item) in unfinished.iter_mut().enumerate() {
        if !item.resumed {
            item.id = Some(item_id(stopper, finished_at, index));
        }
    }
    let (unfinished, mut unrecorded): (Vec<_>, Vec<_>) = unfinished.into_iter().partition(|u| {
        unstorable(&u.item).is_none() && u.id.as_deref().is_some_and(is_valid_item_id)
    });
    for item in &unrecorded {
        let id = item.id.as_deref().unwrap_or_default();
        let why = match unstorable(&item.item) {
            Some(why) => format!("item {id} is {why}"),
            None => format!("item {id:?} was handed back under an id that is not an item id"),
        };
        notes.push(Note {
            participant: item.participant.clone(),
            note: format!("{why}: not recorded (it is in the ERROR log line)"),
        });
    }
    // Its reason stands in for an unserialisable item in the ERROR log line.
    for lost in unrecordable {
        notes.push(Note {
            participant: lost.participant.clone(),
            note: format!(
                "{}: not recorded (lost; named in the ERROR log line)",
                lost.note
            ),
        });
        unrecorded.push(Unfinished::new(
            lost.participant,
            serde_json::json!({ "unserialisable": lost.note }),
        ));
    }
    (unfinished, unrecorded, notes)
}

/// Makes `ids`, held by `holder`, pending again (no failed attempt), after a forced planned stop.
/// One that cannot be given back stays leased: the next start counts it as failed, as before.
async fn give_back(
    store: &dyn crate::record::RecordStore,
    holder: &crate::record::Owner,
    ids: &[String],
) {
    let mut given = 0;
    for id in ids {
        match store.release(Some(holder), id).await {
            Ok(true) => given += 1,
            Ok(false) => {}
            Err(e) => tracing::warn!(id, error = %ErrorChain(&e),
                "cannot give back an item the forced stop cut off; the next start counts it as a failed attempt"),
        }
    }
    if given > 0 {
        tracing::info!(
            given,
            "items the forced stop cut off are offered again (no failed attempt)"
        );
    }
}

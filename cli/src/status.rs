//! `planned-stop status`: what a marker directory, its outcome files and the record store say,
//! for a person or (`--json`) a script.

use super::{
    EXIT_NOT_RUNNING, EXIT_NOT_WATCHING, EXIT_OK, StatusArgs, cause_words, chain, describe, emit,
    existing_store, fail, file_name, judgement_json, path_json, records, when, word,
};
use chrono::Utc;
use planned_stop::ProcessState;
use planned_stop::marker::MarkerStore;
use planned_stop::stopper::{Outcome, WaitOutcome};
use serde_json::json;

/// `status --pid N`: one process, with running and watching / running elsewhere / not running
/// as the exit code.
fn status_of_process(store: &MarkerStore, pid: u32, as_json: bool) -> u8 {
    let identity = planned_stop::ProcessIdentity::of(pid);
    let watching = identity.is_some_and(|id| store.is_watched_by(&id));
    // Its own outcome: written by the process now at that pid, or the last one left there.
    let outcome = store
        .read_outcome(pid)
        .filter(|o| identity.is_none_or(|id| o.is_from(&id)));
    let code = match (identity.is_some(), watching) {
        (true, true) => EXIT_OK,
        (true, false) => EXIT_NOT_WATCHING,
        (false, _) => EXIT_NOT_RUNNING,
    };
    if as_json {
        emit(json!({
            "pid": pid,
            "running": identity.is_some(),
            "start": identity.map(|id| id.start),
            "watching": watching,
            "outcome": outcome.as_ref().map(outcome_json),
            "code": code,
        }));
        return code;
    }
    let state = match (identity, watching) {
        (Some(_), true) => "running, watching this directory".to_owned(),
        (Some(_), false) => "running, but not announced as watching this directory".to_owned(),
        (None, _) => "not running".to_owned(),
    };
    emit(format!("process {pid}: {state}"));
    if let Some(o) = &outcome {
        emit(format!("  last outcome here: {}", outcome_words(o)));
    }
    code
}

pub(super) fn status(args: StatusArgs) -> u8 {
    let store = match args.layout.layout().and_then(existing_store) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    if let Some(pid) = args.pid {
        return status_of_process(&store, pid, args.json);
    }
    let listing = match Listing::read(&args, &store) {
        Ok(listing) => listing,
        Err(e) => return fail(e),
    };
    if args.json {
        print_json(&args, &store, &listing);
    } else {
        print_text(&args, &store, &listing);
    }
    records::report_errors(&listing.found)
}

/// What `status` shows of a directory: its slots, outcomes and presences, and the stop record
/// and items of the store it was given.
struct Listing {
    entries: Vec<planned_stop::marker::SlotEntry>,
    outcomes: Vec<Outcome>,
    presences: Vec<planned_stop::stopper::Presence>,
    found: records::Found,
}

impl Listing {
    fn read(args: &StatusArgs, store: &MarkerStore) -> Result<Listing, String> {
        Ok(Listing {
            entries: store.entries(Utc::now()).map_err(|e| chain(&e))?,
            outcomes: store.outcomes().map_err(|e| chain(&e))?,
            presences: store.presences().map_err(|e| chain(&e))?,
            found: stop_records(args)?,
        })
    }
}

/// `status --json`: one object.
fn print_json(args: &StatusArgs, store: &MarkerStore, listing: &Listing) {
    let Listing {
        entries,
        outcomes,
        presences,
        found,
    } = listing;
    let slots: Vec<_> = entries
        .iter()
        .map(|e| judgement_json(&e.path, &e.judgement))
        .collect();
    emit(json!({
        "dir": path_json(store.dir()),
        "slots": slots,
        "outcomes": outcomes.iter().map(outcome_json).collect::<Vec<_>>(),
        "watching": presences.iter().map(|p| json!({
            "pid": p.pid,
            "start": p.start,
            "since": p.since,
            "owner_alive": planned_stop::ProcessIdentity::is_running(p.pid, p.start),
        })).collect::<Vec<_>>(),
        "stop_record": found.last_stop,
        // No store was asked for: nothing is known about items (not "none").
        "items": (args.state.is_some() || args.records.is_some())
            .then(|| records::items_json(found)),
        "store_errors": found.errors,
    }));
}

/// `status` for a person: a line per slot, watcher and outcome, then the record and the items.
fn print_text(args: &StatusArgs, store: &MarkerStore, listing: &Listing) {
    emit(format!("marker directory {}", store.dir().display()));
    if listing.entries.is_empty() {
        emit("  no slots");
    }
    for e in &listing.entries {
        emit(format!(
            "  {}: {}",
            file_name(&e.path),
            describe(&e.judgement)
        ));
    }
    for p in &listing.presences {
        let gone = if planned_stop::ProcessIdentity::is_running(p.pid, p.start) {
            ""
        } else {
            " (gone: killed or crashed)"
        };
        emit(format!(
            "  watching: pid {} since {}{gone}",
            p.pid,
            when(p.since)
        ));
    }
    for o in &listing.outcomes {
        let gone = if planned_stop::ProcessIdentity::is_running(o.pid, o.start) {
            ""
        } else if matches!(
            WaitOutcome::after_exit(Some(o.clone())),
            WaitOutcome::KilledWhileDraining { .. }
        ) {
            // The rule `stop --wait` answers `killed_while_draining` with, not a copy of it.
            " (gone: killed before it finished)"
        } else {
            " (gone)"
        };
        emit(format!(
            "  outcome of pid {}: {}{gone}",
            o.pid,
            outcome_words(o)
        ));
    }
    if let Some(r) = &listing.found.last_stop {
        emit(format!(
            "stop record: pid {} stopped, {} ({}), {} unfinished item(s) to resume",
            r.pid,
            word(&r.verdict),
            cause_words(&r.cause),
            r.unfinished_count()
        ));
    }
    if args.state.is_some() || args.records.is_some() {
        print_items(&listing.found);
    }
}

/// The store's items, pending, leased and spilled.
fn print_items(found: &records::Found) {
    let leased = found.items.iter().filter(|s| s.lease.is_some()).count();
    emit(format!(
        "unfinished items: {} pending, {leased} leased, {} spilled on this host",
        found.items.len() - leased,
        found.spilled.len()
    ));
    for s in &found.items {
        emit(format!(
            "  {}",
            records::describe_item(s, chrono::Utc::now())
        ));
    }
    for s in &found.spilled {
        emit(format!(
            "  {} [spilled]",
            records::describe_item(s, chrono::Utc::now())
        ));
    }
}

fn stop_records(args: &StatusArgs) -> Result<records::Found, String> {
    let state = args.state.clone().filter(|d| d.exists());
    if args.records.is_none() && state.is_none() {
        return Ok(records::Found::default());
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let names = records::StateArgs {
        state,
        records: args.records.clone(),
        service: args.service.clone(),
        allow_shared_state: true,
    };
    records::look(&runtime, &names)
}

/// An outcome file as `status --json` shows it: its fields plus `owner_alive`.
fn outcome_json(outcome: &Outcome) -> serde_json::Value {
    let mut value = serde_json::to_value(outcome).unwrap_or_default();
    if let Some(fields) = value.as_object_mut() {
        fields.insert(
            "owner_alive".into(),
            planned_stop::ProcessIdentity::is_running(outcome.pid, outcome.start).into(),
        );
    }
    value
}

/// An outcome in words: its phase and verdict (`stopped, planned, exit code 0`); a restart in
/// place that did not happen says why and that the process serves on, since no stop is under way
/// and the verdict it would have carried out means nothing.
fn outcome_words(o: &Outcome) -> String {
    if o.state == ProcessState::RestartFailed {
        let why = o.note.as_deref().unwrap_or("no reason given");
        return format!("restart_failed ({why}); it did not stop and serves on");
    }
    format!(
        "{}, {}{}",
        word(&o.state),
        word(&o.verdict),
        o.exit_code
            .map(|c| format!(", exit code {c}"))
            .unwrap_or_default()
    )
}

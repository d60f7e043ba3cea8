//! `planned-stop records`: what the record store in a state directory holds, for operators.
//!
//! - `records list --state DIR [--json]`: every unfinished item, oldest first, with its lease (who
//!   resumes it, and whether that process still runs);
//! - `records release --state DIR ID`: makes a leased item pending again, so the next start
//!   resumes it (its holder is wedged, or was moved to another host);
//! - `records drop --state DIR ID`: removes an item for good (the work was done by hand).
//!
//! The state directory must exist: a mistyped path is an error, never a new empty store. With
//! `--records URL` (the `postgres` feature) the same actions work on the database.

use super::{
    Access, EXIT_NO_SUCH_ITEM, EXIT_OK, EXIT_UNKNOWN_SERVICE, EXIT_USAGE, absolute, chain, emit,
    fail, record_store,
};
use clap::{Args, Subcommand};
use planned_stop::record::rules::{Liveness, liveness_here};
use planned_stop::record::{ItemState, RecordError, RecordStore};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `records`.
#[derive(Debug, Args)]
pub struct RecordsArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: RecordsAction,
}

/// Where the items are, shared by every `records` action: `--state DIR` or `--records URL`.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// The state directory (`serve --state DIR`).
    #[arg(long, value_name = "DIR", required_unless_present = "records")]
    pub state: Option<PathBuf>,
    /// The PostgreSQL record store (`serve --records URL`); with `--state DIR` as well, the
    /// items spilled there are listed too.
    #[arg(long, value_name = "URL")]
    pub records: Option<String>,
    /// The service name that scopes the items in the database.
    #[arg(long, default_value = "planned-stop")]
    pub service: String,
    /// Accept a state directory writable by group or others.
    #[arg(long)]
    pub allow_shared_state: bool,
}

impl StateArgs {
    fn describe(&self) -> String {
        match (&self.records, &self.state) {
            (Some(_), _) => format!("PostgreSQL, service {}", self.service),
            (None, Some(dir)) => format!("state directory {}", absolute(dir).display()),
            (None, None) => String::new(),
        }
    }
}

/// The `records` actions.
#[derive(Debug, Subcommand)]
pub enum RecordsAction {
    /// List the unfinished items and their leases.
    List {
        #[command(flatten)]
        #[allow(missing_docs)]
        state: StateArgs,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Make a leased item pending again, or offer an item held aside again (its failures
    /// counted from zero).
    Release {
        #[command(flatten)]
        #[allow(missing_docs)]
        state: StateArgs,
        /// The item id (from `records list`).
        id: String,
    },
    /// Remove an item for good.
    Drop {
        #[command(flatten)]
        #[allow(missing_docs)]
        state: StateArgs,
        /// The item id (from `records list`).
        id: String,
    },
}

fn open(state: &StateArgs, access: Access) -> Result<Arc<dyn RecordStore>, String> {
    let store = record_store(
        state.state.as_deref(),
        state.records.as_deref(),
        &state.service,
        state.allow_shared_state,
        access,
    )?;
    store.ok_or_else(|| "give --state DIR or --records URL".to_owned())
}

/// Runs `records`.
pub fn run(args: RecordsArgs) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start a runtime: {e}")),
    };
    match args.action {
        RecordsAction::List { state, json } => {
            let found = match look(&runtime, &state) {
                Ok(found) => found,
                Err(e) => return fail(e),
            };
            // Nothing listed for a name that never started with the database: a mistyped
            // name, not an empty queue (every start registers its service).
            let unknown = if found.items.is_empty() {
                unknown_service(&runtime, &state)
            } else {
                None
            };
            print_list(&state, &found, json, unknown)
        }
        RecordsAction::Release { state, id } => {
            let store = match open(&state, Access::Change) {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            match runtime.block_on(store.release(None, &id)) {
                Ok(true) => emit(format!("{id}: released; the next start resumes it")),
                Ok(false) => emit(format!(
                    "{id}: not leased or held aside; nothing to release"
                )),
                Err(e) => return item_error(&runtime, &state, &e),
            }
            EXIT_OK
        }
        RecordsAction::Drop { state, id } => {
            let store = match open(&state, Access::Change) {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            match runtime.block_on(store.remove(&id)) {
                Ok(true) => {
                    emit(format!("{id}: dropped; it will not be resumed"));
                    EXIT_OK
                }
                Ok(false) => item_error(&runtime, &state, &RecordError::UnknownItem { id }),
                Err(e) => item_error(&runtime, &state, &e),
            }
        }
    }
}

/// With `--records`, a `--service` that never started with this database (every start
/// registers its name): the names it knows, for the message. `None` when the name is known, or
/// the database cannot say (then the list's own errors speak).
#[cfg(feature = "postgres")]
fn unknown_service(runtime: &tokio::runtime::Runtime, state: &StateArgs) -> Option<Vec<String>> {
    let url = state.records.as_deref()?;
    let store = planned_stop_postgres::PgRecordStore::from_url(url, &state.service).ok()?;
    let known = runtime.block_on(store.services()).ok()?;
    (!known.contains(&state.service)).then_some(known)
}

/// The sentence for an unknown service: the name, and the names the database knows.
fn unknown_service_words(service: &str, known: &[String]) -> String {
    let others = if known.is_empty() {
        "no service has started with it yet".to_owned()
    } else {
        format!("it knows {}", known.join(", "))
    };
    format!(
        "no service named {service:?} ever started with this database ({others}): a mistyped \
         --service?"
    )
}

#[cfg(not(feature = "postgres"))]
fn unknown_service(_: &tokio::runtime::Runtime, _: &StateArgs) -> Option<Vec<String>> {
    None
}

/// What an operator sees of a record store: its items, the spilled ones apart, the last stop,
/// and every part that could not be read. The database and the spill directory are read
/// separately, so an unreachable database still shows what its stops spilled on this host.
#[derive(Debug, Default)]
pub struct Found {
    /// The store's own items (the database's, or the state directory's without `--records`).
    pub items: Vec<ItemState>,
    /// Items a stop kept in the spill directory because the database was unreachable; the next
    /// start on this host pushes them.
    pub spilled: Vec<ItemState>,
    /// The last stop's summary.
    pub last_stop: Option<planned_stop::record::StopRecord>,
    /// What could not be read, each with its cause.
    pub errors: Vec<String>,
}

/// Reads what `state` names, changing nothing (see [`Found`]).
pub fn look(runtime: &tokio::runtime::Runtime, state: &StateArgs) -> Result<Found, String> {
    let mut found = Found::default();
    let database = StateArgs {
        state: None,
        ..state.clone()
    };
    if state.records.is_some() {
        let store = open(&database, Access::Look)?;
        match runtime.block_on(store.list()) {
            Ok(items) => found.items = items,
            Err(e) => found.errors.push(format!("the database: {}", chain(&e))),
        }
        match runtime.block_on(store.last_stop()) {
            Ok(last) => found.last_stop = last,
            Err(e) if found.errors.is_empty() => {
                found.errors.push(format!("the last stop: {}", chain(&e)));
            }
            Err(_) => {}
        }
    }
    if state.state.is_some() {
        let files = StateArgs {
            records: None,
            ..state.clone()
        };
        let store = open(&files, Access::Look)?;
        let items = match runtime.block_on(store.list()) {
            Ok(items) => items,
            Err(e) => {
                found
                    .errors
                    .push(format!("the state directory: {}", chain(&e)));
                Vec::new()
            }
        };
        if state.records.is_some() {
            found.spilled = items;
        } else {
            found.items = items;
            match runtime.block_on(store.last_stop()) {
                Ok(last) => found.last_stop = last,
                Err(e) => found.errors.push(format!("the last stop: {}", chain(&e))),
            }
        }
    }
    Ok(found)
}

/// An unknown item is its own exit code, so a script can tell it from a broken store; an unknown
/// item of a service that never started with the database is an unknown service.
fn item_error(runtime: &tokio::runtime::Runtime, state: &StateArgs, e: &RecordError) -> u8 {
    if let RecordError::UnknownItem { .. } = e
        && let Some(known) = unknown_service(runtime, state)
    {
        eprintln!(
            "planned-stop: {}",
            unknown_service_words(&state.service, &known)
        );
        return EXIT_UNKNOWN_SERVICE;
    }
    eprintln!("planned-stop: {}", chain(e));
    match e {
        RecordError::UnknownItem { .. } => EXIT_NO_SUCH_ITEM,
        _ => EXIT_USAGE,
    }
}

/// Whether the item's holder runs: `None` for a pending item or one whose holder runs on another
/// host (its lease's expiry decides).
fn holder_alive(state: &ItemState) -> Option<bool> {
    match liveness_here(&state.lease.as_ref()?.owner) {
        Liveness::Alive => Some(true),
        Liveness::Dead => Some(false),
        _ => None, // another host: its lease's expiry decides
    }
}

/// Prints the list; `unknown` holds the services the database knows when the one asked for is
/// not among them.
fn print_list(state: &StateArgs, found: &Found, as_json: bool, unknown: Option<Vec<String>>) -> u8 {
    let place = state.describe();
    if as_json {
        let mut out = json!({
            "store": place,
            // The same as fields, for scripts: which kind of store, which service, which directory.
            "store_kind": if state.records.is_some() { "postgres" } else { "state_directory" },
            "service": state.records.as_ref().map(|_| state.service.as_str()),
            "state_dir": state.state.as_deref().map(|d| super::path_json(&absolute(d))),
            "items": items_json(found),
            "errors": found.errors,
        });
        if let Some(known) = &unknown {
            out["service_known"] = json!(false);
            out["services"] = json!(known);
        }
        emit(out);
    } else {
        emit(place);
        if let Some(known) = &unknown {
            emit(format!(
                "  {}",
                unknown_service_words(&state.service, known)
            ));
        } else if found.items.is_empty() && found.spilled.is_empty() && found.errors.is_empty() {
            emit("  no unfinished items");
        }
        for s in &found.items {
            emit(format!("  {}", describe_item(s, chrono::Utc::now())));
        }
        for s in &found.spilled {
            emit(format!(
                "  {} [spilled on this host: pushed at the next start here]",
                describe_item(s, chrono::Utc::now())
            ));
        }
    }
    match report_errors(found) {
        EXIT_OK if unknown.is_some() => EXIT_UNKNOWN_SERVICE,
        code => code,
    }
}

/// The items as JSON: each with `holder_alive`, and `spilled: true` for the spilled ones.
pub fn items_json(found: &Found) -> Vec<serde_json::Value> {
    let tagged = found
        .items
        .iter()
        .map(|s| (s, false))
        .chain(found.spilled.iter().map(|s| (s, true)));
    tagged
        .map(|(s, spilled)| {
            let mut value = serde_json::to_value(s).unwrap_or_default();
            if let Some(fields) = value.as_object_mut() {
                fields.insert("holder_alive".into(), json!(holder_alive(s)));
                if spilled {
                    fields.insert("spilled".into(), json!(true));
                }
            }
            value
        })
        .collect()
}

/// Says on stderr what could not be read; exit 2 when anything could not (after showing the rest).
pub fn report_errors(found: &Found) -> u8 {
    for e in &found.errors {
        eprintln!("planned-stop: cannot read {e}; the rest is shown");
    }
    if found.errors.is_empty() {
        EXIT_OK
    } else {
        EXIT_USAGE
    }
}

/// One item as a line of text, as of `now` (a lease that lapsed says so).
pub fn describe_item(s: &ItemState, now: chrono::DateTime<chrono::Utc>) -> String {
    let mut what = format!(
        "{} ({}: {}), left by pid {} at {}, attempt {}",
        s.item.id,
        s.item.participant,
        s.item.item,
        s.item.stopped_by.pid,
        super::when(s.item.stopped_at),
        s.item.attempts
    );
    if s.item.failures > 0 {
        what.push_str(&format!(
            ", {} failed (last: {})",
            s.item.failures,
            s.item.last_failure.as_deref().unwrap_or("unknown")
        ));
    }
    if let Some(why) = &s.quarantined {
        return format!(
            "{what}: quarantined ({why}); never offered: `records release` offers it again, \
             `records drop` removes it"
        );
    }
    match (&s.lease, holder_alive(s)) {
        (None, _) => format!("{what}: pending"),
        (Some(l), Some(true)) => format!("{what}: leased by {} (running)", l.owner),
        (Some(l), Some(false)) => format!(
            "{what}: leased by {} (gone: offered again at the next lease)",
            l.owner
        ),
        (Some(l), _) if l.expires_at <= now => format!(
            "{what}: leased by {} (another host; the lease lapsed at {}: offered again at the \
             next lease)",
            l.owner,
            super::when(l.expires_at)
        ),
        (Some(l), _) => format!(
            "{what}: leased by {} (another host; renewed while it runs, offered again after {})",
            l.owner,
            super::when(l.expires_at)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, Utc};
    use planned_stop::record::{Lease, ResumeItem};

    /// A lease held on another host that lapsed is not "offered again after" a time
    /// already past.
    #[test]
    fn a_lapsed_lease_on_another_host_says_it_lapsed() {
        let now = Utc::now();
        let owner = planned_stop::record::Owner::new("another-host.example", 4242, 1);
        let item = ResumeItem::new("id-1", "jobs", json!("job"), owner.clone(), now, 1);
        let lease = |expires| Some(Lease::new(owner.clone(), now, expires));
        let later = now + TimeDelta::seconds(60);
        let live = describe_item(&ItemState::new(item.clone(), lease(later)), now);
        assert!(live.contains("offered again after"), "{live}");
        let lapsed = describe_item(&ItemState::new(item, lease(now)), later);
        assert!(lapsed.contains("lapsed at"), "{lapsed}");
        assert!(!lapsed.contains("offered again after"), "{lapsed}");
    }
}

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
    Access, EXIT_NO_SUCH_ITEM, EXIT_OK, EXIT_USAGE, absolute, chain, emit, fail, record_store,
};
use clap::{Args, Subcommand};
use planned_stop::{ItemState, Liveness, Owner, RecordError, RecordStore};
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
    /// Make a leased item pending again.
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
            let store = match open(&state, Access::Look) {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            match runtime.block_on(store.list()) {
                Ok(items) => print_list(&state.describe(), &items, json),
                Err(e) => fail(chain(&e)),
            }
        }
        RecordsAction::Release { state, id } => {
            let store = match open(&state, Access::Change) {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            match runtime.block_on(store.release(None, &id)) {
                Ok(true) => emit(format!("{id}: released; the next start resumes it")),
                Ok(false) => emit(format!("{id}: not leased; nothing to release")),
                Err(e) => return item_error(&e),
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
                Ok(false) => item_error(&RecordError::UnknownItem { id }),
                Err(e) => item_error(&e),
            }
        }
    }
}

/// An unknown item is its own exit code, so a script can tell it from a broken store.
fn item_error(e: &RecordError) -> u8 {
    eprintln!("planned-stop: {}", chain(e));
    match e {
        RecordError::UnknownItem { .. } => EXIT_NO_SUCH_ITEM,
        _ => EXIT_USAGE,
    }
}

/// Whether the item's holder runs: `None` for a pending item, `Some(None)` when it runs on
/// another host (its lease's expiry decides).
fn holder_liveness(state: &ItemState) -> Option<Liveness> {
    state.lease.as_ref().map(|l| Owner::liveness_here(&l.owner))
}

fn holder_alive(state: &ItemState) -> Option<bool> {
    match holder_liveness(state) {
        Some(Liveness::Alive) => Some(true),
        Some(Liveness::Dead) => Some(false),
        _ => None,
    }
}

fn print_list(place: &str, items: &[ItemState], as_json: bool) -> u8 {
    if as_json {
        let items: Vec<_> = items
            .iter()
            .map(|s| {
                let mut value = serde_json::to_value(s).unwrap_or_default();
                if let Some(fields) = value.as_object_mut() {
                    fields.insert("holder_alive".into(), json!(holder_alive(s)));
                }
                value
            })
            .collect();
        emit(json!({ "store": place, "items": items }));
        return EXIT_OK;
    }
    emit(place.to_owned());
    if items.is_empty() {
        emit("  no unfinished items");
    }
    for s in items {
        emit(format!("  {}", describe_item(s)));
    }
    EXIT_OK
}

/// One item as a line of text.
pub fn describe_item(s: &ItemState) -> String {
    let what = format!(
        "{} ({}: {}), left by pid {} at {}, attempt {}",
        s.item.id,
        s.item.participant,
        s.item.item,
        s.item.stopped_by.pid,
        s.item.stopped_at,
        s.item.attempts
    );
    match (&s.lease, holder_liveness(s)) {
        (None, _) => format!("{what}: pending"),
        (Some(l), Some(Liveness::Alive)) => format!("{what}: leased by {} (running)", l.owner),
        (Some(l), Some(Liveness::Dead)) => format!(
            "{what}: leased by {} (gone: offered again at the next lease)",
            l.owner
        ),
        (Some(l), _) => format!(
            "{what}: leased by {} (another host; renewed while it runs, offered again after {})",
            l.owner, l.expires_at
        ),
    }
}

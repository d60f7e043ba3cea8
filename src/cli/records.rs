//! `planned-stop records`: what the record store in a state directory holds, for operators.
//!
//! - `records list --state DIR [--json]`: every unfinished item, oldest first, with its lease (who
//!   resumes it, and whether that process still runs);
//! - `records release --state DIR ID`: makes a leased item pending again, so the next start
//!   resumes it (its holder is wedged, or was moved to another host);
//! - `records drop --state DIR ID`: removes an item for good (the work was done by hand).
//!
//! The state directory must exist: a mistyped path is an error, never a new empty store.

use super::{EXIT_NO_SUCH_ITEM, EXIT_OK, EXIT_USAGE, absolute, chain, emit, fail, path_json};
use clap::{Args, Subcommand};
use planned_stop::{FileRecordStore, ItemState, Liveness, Owner, RecordError, RecordStore};
use serde_json::json;
use std::path::PathBuf;

/// Arguments of `records`.
#[derive(Debug, Args)]
pub struct RecordsArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: RecordsAction,
}

/// The state directory, shared by every `records` action.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// The state directory (`serve --state DIR`).
    #[arg(long, value_name = "DIR")]
    pub state: PathBuf,
    /// Accept a state directory writable by group or others.
    #[arg(long)]
    pub allow_shared_state: bool,
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

fn open(state: &StateArgs) -> Result<FileRecordStore, String> {
    let dir = absolute(&state.state);
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a directory", dir.display())),
        Err(e) => {
            return Err(format!(
                "no state directory {} ({e}); give the --state DIR the service runs with",
                dir.display()
            ));
        }
    }
    FileRecordStore::open(dir, state.allow_shared_state).map_err(|e| chain(&e))
}

/// Runs `records`.
pub fn run(args: RecordsArgs) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread().build() {
        Ok(r) => r,
        Err(e) => return fail(format!("cannot start a runtime: {e}")),
    };
    match args.action {
        RecordsAction::List { state, json } => {
            let store = match open(&state) {
                Ok(s) => s,
                Err(e) => return fail(e),
            };
            match runtime.block_on(store.list()) {
                Ok(items) => print_list(&store, &items, json),
                Err(e) => fail(chain(&e)),
            }
        }
        RecordsAction::Release { state, id } => {
            let store = match open(&state) {
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
            let store = match open(&state) {
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

fn holder_alive(state: &ItemState) -> Option<bool> {
    state
        .lease
        .as_ref()
        .map(|l| Owner::liveness_here(&l.owner) == Liveness::Alive)
}

fn print_list(store: &FileRecordStore, items: &[ItemState], as_json: bool) -> u8 {
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
        emit(json!({ "state": path_json(store.dir()), "items": items }));
        return EXIT_OK;
    }
    emit(format!("state directory {}", store.dir().display()));
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
    match (&s.lease, holder_alive(s)) {
        (None, _) => format!("{what}: pending"),
        (Some(l), Some(true)) => format!("{what}: leased by {} (running)", l.owner),
        (Some(l), _) => format!(
            "{what}: leased by {} (gone: offered again at the next start)",
            l.owner
        ),
    }
}

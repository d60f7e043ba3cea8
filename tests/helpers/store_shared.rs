//! What `tests/store.rs` and its helper program `tests/helpers/marker_processes.rs` share: the
//! marker directory both open, and the claiming rounds both run.

#![allow(dead_code)] // each side uses its part

use chrono::Utc;
use planned_stop::marker::MarkerStore;
use planned_stop::{Layout, ProcessIdentity};
use std::path::Path;

/// The marker store of slots in `dir`.
pub fn slots_store(dir: &Path) -> MarkerStore {
    MarkerStore::open(Layout::Slots(dir.to_path_buf())).unwrap()
}

/// How many markers the claimers race for.
pub const ROUNDS: u32 = 1000;

/// A synthetic target per round, so one directory holds a slot per round.
pub fn round_identity(round: u32) -> ProcessIdentity {
    ProcessIdentity::new(round + 1, 7, chrono::DateTime::UNIX_EPOCH)
}

/// Claims every round's marker in order; returns the rounds this claimer won.
pub fn claim_all(store: &MarkerStore, before_each: impl Fn()) -> Vec<u32> {
    let mut won = Vec::new();
    for round in 0..ROUNDS {
        before_each();
        if store
            .claim(&round_identity(round), Utc::now())
            .unwrap()
            .is_some()
        {
            won.push(round);
        }
    }
    won
}

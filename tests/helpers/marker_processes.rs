//! A helper program of `tests/store.rs` (not a test, not an example for users): a second process
//! on a marker directory, in the role its first argument names, the directory in `DIR`.
//!
//! - `writer`: writes markers for pid 4242 in a loop until killed, printing `started` once the
//!   first one is in place (the test kills it mid-write).
//! - `claimer`: waits for a `go` file, then claims every round's marker and prints the rounds it
//!   won, one per line (two race for each marker).

mod program;
mod store_shared;

use chrono::Utc;
use planned_stop::marker::Marker;
use program::HELPER_LIFETIME;
use std::path::PathBuf;
use store_shared::{claim_all, slots_store};

fn main() {
    program::give_up_after_helper_lifetime();
    match std::env::args().nth(1).as_deref() {
        Some("writer") => writer(),
        Some("claimer") => claimer(),
        other => panic!("no such role: {other:?}"),
    }
}

fn writer() {
    let dir = PathBuf::from(std::env::var_os("DIR").unwrap());
    let store = slots_store(&dir);
    let reason = "r".repeat(256);
    let deadline = std::time::Instant::now() + HELPER_LIFETIME;
    for i in 0u64.. {
        if std::time::Instant::now() > deadline {
            return;
        }
        let marker = Marker::new(4242, Some(i), Utc::now()).with_reason(reason.clone());
        store.write(&marker).unwrap();
        if i == 0 {
            println!("started");
        }
    }
}

fn claimer() {
    let dir = PathBuf::from(std::env::var_os("DIR").unwrap());
    let store = slots_store(&dir.join("slots"));
    println!("ready");
    let deadline = std::time::Instant::now() + HELPER_LIFETIME;
    while !dir.join("go").exists() {
        assert!(std::time::Instant::now() < deadline, "never told to go");
        std::hint::spin_loop();
    }
    for round in claim_all(&store, || {}) {
        println!("won {round}");
    }
}

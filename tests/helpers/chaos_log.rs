//! What `tests/chaos.rs` and its replica program `tests/helpers/chaos_replica.rs` share: the
//! event log every process of a run appends to, on one clock, and the seed of a random choice.

#![allow(dead_code)] // each side uses its part

use serde_json::{Value, json};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Nanoseconds of the host's monotonic clock: one clock for every process of the run, which the
/// replicas' skewed wall clocks (libfaketime leaves the monotonic clock alone) do not touch.
pub fn now_ns() -> u128 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    assert_eq!(
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) },
        0
    );
    t.tv_sec as u128 * 1_000_000_000 + t.tv_nsec as u128
}

/// A seed from the wall clock.
pub fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// An append-only event log (one JSON object a line), shared by the threads of one process.
#[derive(Clone, Debug)]
pub struct Log(Arc<Mutex<std::fs::File>>);

impl Log {
    pub fn open(path: &Path) -> Log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        Log(Arc::new(Mutex::new(file)))
    }

    pub fn event(&self, who: &str, mut fields: Value) {
        fields["at"] = json!(now_ns().to_string());
        fields["who"] = json!(who);
        // One write of the whole line: every process appends to the same file (O_APPEND), and
        // a line written in pieces could interleave with another process's.
        let line = format!("{fields}\n");
        self.0.lock().unwrap().write_all(line.as_bytes()).unwrap();
    }
}

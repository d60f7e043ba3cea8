//! What a marker written (and removed) for one process costs every *other* service watching the
//! same directory: N `planned-stop serve` processes share one slot directory; the harness writes
//! and removes M markers for a process none of them is, and sums the CPU time (every thread, from
//! `/proc/PID/task/*/schedstat`) the services spent, less what they spent idle over the same time.
//!
//! ```text
//! cargo build --release && cargo run --release -p planned-stop-harness --bin crowd_cost -- 200 200
//! ```
//!
//! Linux only (it reads `/proc`). Results go to `docs/performance.md` by hand.

use planned_stop_harness as common;

use planned_stop::marker::{Marker, MarkerStore};
use planned_stop::{Layout, ProcessIdentity};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// CPU nanoseconds process `pid` has used, all threads.
fn cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}

fn total(children: &[Child]) -> u64 {
    children.iter().map(|c| cpu_ns(c.id())).sum()
}

fn main() {
    let mut args = common::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let m: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    assert!(
        common::planned_stop_binary().exists(),
        "build the binary first: cargo build --release"
    );
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let mut children = Vec::new();
    for _ in 0..n {
        let mut child = Command::new(common::planned_stop_binary())
            // A long poll: what is measured is the notifications, not the safety net.
            .args([
                "serve",
                "--dir",
                run_dir.to_str().unwrap(),
                "--poll-ms",
                "600000",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        while !line.contains("\"ready\"") {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "serve exited early");
        }
        children.push(child);
    }
    std::thread::sleep(Duration::from_secs(1));
    let store = MarkerStore::open(Layout::Slots(run_dir.clone())).unwrap();
    // The harness itself: a live process none of the services is.
    let me = ProcessIdentity::current().unwrap();
    let pace = Duration::from_millis(5);

    // Idle: the same wall time and pace, nothing written.
    let before = total(&children);
    let started = Instant::now();
    for _ in 0..m {
        std::thread::sleep(pace);
    }
    let idle_wall = started.elapsed();
    let idle = total(&children) - before;

    let before = total(&children);
    let started = Instant::now();
    for _ in 0..m {
        store
            .write(&Marker::new(me.pid, Some(me.start), chrono::Utc::now()))
            .unwrap();
        store.clear(me.pid).unwrap();
        std::thread::sleep(pace);
    }
    let busy_wall = started.elapsed();
    std::thread::sleep(Duration::from_millis(200)); // let the last events be handled
    let busy = total(&children) - before;

    let extra = busy.saturating_sub(idle) as f64;
    println!(
        "{n} services, {m} markers written and removed for another process \
         (idle {:.2} s, busy {:.2} s of wall time)",
        idle_wall.as_secs_f64(),
        busy_wall.as_secs_f64()
    );
    println!(
        "CPU of all services: idle {:.1} ms, with the markers {:.1} ms",
        idle as f64 / 1e6,
        busy as f64 / 1e6
    );
    println!(
        "per uninvolved service per marker write: {:.1} µs",
        extra / 1e3 / (n as f64) / (m as f64)
    );
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

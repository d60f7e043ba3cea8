//! End-to-end latency of planned stops of real `planned-stop serve` processes.
//!
//! ```sh
//! cargo build --release && cargo run --release -p planned-stop-harness --bin latency -- 200
//! ```
//!
//! For each delivery mode (polling every 100 ms, every 500 ms, and event-driven) it stops N
//! services (default 200, ten at a time, each marker written at a random moment so it lands at a
//! random phase of the poll) and measures, from the moment the marker is in place:
//! *delivered* — the service's `stop_accepted` event is read from its stdout; *exited* — the
//! process has exited. Prints p50 / p99 / max in milliseconds as a Markdown table.

use planned_stop_harness as common;

use planned_stop::Layout;
use planned_stop::marker::MarkerStore;
use planned_stop::stopper::{self, StopOptions};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BATCH: usize = 10;

struct Running {
    child: Child,
    lines: mpsc::Receiver<(Instant, String)>,
}

fn start(dir: &Path, mode_args: &[&str]) -> Running {
    let mut child = Command::new(common::planned_stop_binary())
        .arg("serve")
        .arg("--dir")
        .arg(dir)
        .args(["--drain-ms", "0"])
        .args(mode_args)
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .spawn()
        .expect("run `cargo build --release` first");
    let out = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send((Instant::now(), line));
        }
    });
    let running = Running { child, lines };
    wait_for(&running, "\"ready\"");
    running
}

fn wait_for(r: &Running, needle: &str) -> Instant {
    loop {
        let (at, line) = r
            .lines
            .recv_timeout(Duration::from_secs(30))
            .expect("service event");
        if line.contains(needle) {
            return at;
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() {
    let n: usize = common::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let modes: [(&str, &[&str]); 3] = [
        ("poll 100 ms", &["--poll-ms", "100", "--no-events"]),
        ("poll 500 ms", &["--poll-ms", "500", "--no-events"]),
        ("events (poll 500 ms as safety net)", &["--poll-ms", "500"]),
    ];
    println!("| mode | stops | delivered p50 | p99 | max | exited p50 | p99 | max |");
    println!("|---|---|---|---|---|---|---|---|");
    for (name, args) in modes {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("run");
        let store = MarkerStore::open(Layout::Slots(dir.clone())).unwrap();
        let (mut delivered, mut exited) = (Vec::new(), Vec::new());
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        while delivered.len() < n {
            let batch: Vec<Running> = (0..BATCH.min(n - delivered.len()))
                .map(|_| start(&dir, args))
                .collect();
            // Each stop in its own thread, its marker written at a random moment within 600 ms, so
            // it lands at a random phase of the service's poll.
            let stops: Vec<_> = batch
                .into_iter()
                .map(|mut r| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    let delay = Duration::from_micros(seed % 600_000);
                    let store = store.clone();
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        stopper::request(&store, r.child.id(), &StopOptions::new()).unwrap();
                        let written = Instant::now();
                        let at = wait_for(&r, "stop_accepted");
                        r.child.wait().unwrap();
                        let gone = Instant::now();
                        (
                            at.saturating_duration_since(written).as_secs_f64() * 1e3,
                            gone.saturating_duration_since(written).as_secs_f64() * 1e3,
                        )
                    })
                })
                .collect();
            for stop in stops {
                let (d, e) = stop.join().unwrap();
                delivered.push(d);
                exited.push(e);
            }
        }
        delivered.sort_by(f64::total_cmp);
        exited.sort_by(f64::total_cmp);
        println!(
            "| {name} | {n} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
            percentile(&delivered, 0.5),
            percentile(&delivered, 0.99),
            delivered[n - 1],
            percentile(&exited, 0.5),
            percentile(&exited, 0.99),
            exited[n - 1],
        );
    }
}

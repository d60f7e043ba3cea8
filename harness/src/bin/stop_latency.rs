//! How long `planned-stop stop --wait` takes, from starting the stopper to its report, against a
//! target that drains at once, in several set-ups measured in the same run, rounds interleaved:
//!
//! 1. the stopper told of the exit by the OS (a pidfd on Linux), the target woken by inotify (the
//!    defaults);
//! 2. the stopper looking every 20 ms (`stop --no-events`, what `stop --wait` did before), the same
//!    target;
//! 3. the stopper told by the OS, the target polling every 2 ms without inotify (`serve
//!    --no-events --poll-ms 2`): the protocol without notifications, to compare with the first
//!    (a process that exits holding an inotify watch waits for an SRCU grace period of the kernel,
//!    about 14 ms here; the watcher removes its watch when it delivers, so that the exit does not);
//! 4. the stopper told by the OS and sending SIGTERM after its marker (`stop --signal`), the target
//!    without inotify (`serve --no-events`, polling every 250 ms): woken by the signal at once, the
//!    fastest stop there is on Linux today;
//! 5. a baseline, no stop at all: `planned-stop stop` for a pid nobody has, i.e. starting the
//!    stopper process, its refusal and its exit. Everything above includes this once;
//! 6. with `PLANNED_STOP_BASELINE=PATH`, the first set-up again with another build's binary (an
//!    earlier commit), stopper and target both: a change measured against what it changed, in the
//!    same run.
//!
//! ```sh
//! cargo build --release && cargo run --release -p planned-stop-harness --bin stop_latency -- 200
//! ```
//!
//! Each round starts a fresh `planned-stop serve --jobs 0` (nothing to drain) per set-up, waits for
//! its `ready` line, then times one `planned-stop stop --pid PID --dir DIR --wait 5 --json` as a
//! child process: the stopper's own start-up, the marker, the target's wake-up, claim, outcome files
//! and exit, and the report. The marker directory is on tmpfs (`/dev/shm`) when there is one, as
//! `/run` is in production; `--disk` puts it under the target directory instead. Results go into
//! docs/performance.md.

use planned_stop_harness as common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = common::args().skip(1).collect();
    let rounds: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(200);
    let disk = args.iter().any(|a| a == "--disk");
    let binary = common::planned_stop_binary();
    let base = if !disk && Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        binary
            .parent()
            .expect("the binary has a directory")
            .to_path_buf()
    };
    let dir = tempfile::Builder::new()
        .prefix("stop-latency-")
        .tempdir_in(&base)
        .expect("a marker directory");
    println!(
        "{rounds} rounds per mode, marker directory {} ({})",
        dir.path().display(),
        if disk { "disk" } else { "tmpfs when available" }
    );
    let setups = [
        Setup {
            name: "stopper: exit event; target: inotify",
            stopper: &[],
            target: Some(&[]),
            binary: None,
        },
        Setup {
            name: "stopper: polls 20 ms; target: inotify",
            stopper: &["--no-events"],
            target: Some(&[]),
            binary: None,
        },
        Setup {
            name: "stopper: exit event; target: polls 2 ms",
            stopper: &[],
            target: Some(&["--no-events", "--poll-ms", "2"]),
            binary: None,
        },
        Setup {
            name: "stopper: exit event + SIGTERM; target: no inotify",
            stopper: &["--signal"],
            target: Some(&["--no-events"]),
            binary: None,
        },
        Setup {
            name: "baseline: stopper start-up, no target",
            stopper: &[],
            target: None,
            binary: None,
        },
    ];
    let baseline = std::env::var_os("PLANNED_STOP_BASELINE").map(PathBuf::from);
    let setups: Vec<Setup> = setups
        .into_iter()
        .chain(baseline.map(|binary| Setup {
            name: "baseline build: the defaults",
            stopper: &[],
            target: Some(&[]),
            binary: Some(binary),
        }))
        .collect();
    let mut samples = vec![Vec::with_capacity(rounds); setups.len()];
    for _ in 0..rounds {
        for (i, setup) in setups.iter().enumerate() {
            let binary = setup.binary.as_deref().unwrap_or(&binary);
            samples[i].push(one_stop(binary, dir.path(), setup));
        }
    }
    for (setup, samples) in setups.iter().zip(&mut samples) {
        report(setup.name, samples);
    }
}

/// One way of stopping: the stopper's extra flags, the target's (`None`: no target at all), and
/// the binary of both (`None`: this build's).
struct Setup {
    name: &'static str,
    stopper: &'static [&'static str],
    target: Option<&'static [&'static str]>,
    binary: Option<PathBuf>,
}

fn one_stop(binary: &Path, dir: &Path, setup: &Setup) -> Duration {
    let Some(target_args) = setup.target else {
        // A pid no process has (the kernel's pid_max is at most 2^22): refused at once.
        let started = Instant::now();
        let output = stopper(binary, dir, "4294967294", setup.stopper)
            .output()
            .expect("stop runs");
        let took = started.elapsed();
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("\"outcome\":\"already_gone\""),
            "the baseline stops nothing"
        );
        return took;
    };
    let mut target = Command::new(binary)
        .args(["serve", "--jobs", "0", "--dir"])
        .arg(dir)
        .args(target_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(target.stdout.take().expect("piped")).lines();
    let ready = lines
        .next()
        .expect("serve prints a line")
        .expect("readable");
    assert!(ready.contains("\"ready\""), "serve said {ready}");
    let mut stop = stopper(binary, dir, &target.id().to_string(), setup.stopper);
    let started = Instant::now();
    let output = stop.output().expect("stop runs");
    let took = started.elapsed();
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        report.contains("\"outcome\":\"stopped_planned\""),
        "stop said {report}"
    );
    // Drain the target's remaining lines and reap it.
    lines.for_each(drop);
    target.wait().expect("the target is reaped");
    took
}

/// `planned-stop stop --wait 5 --json --pid PID --dir DIR` with `extra` flags.
fn stopper(binary: &Path, dir: &Path, pid: &str, extra: &[&str]) -> Command {
    let mut stop = Command::new(binary);
    stop.args(["stop", "--wait", "5", "--json", "--pid", pid, "--dir"])
        .arg(dir)
        .args(extra)
        .stderr(Stdio::null());
    stop
}

fn report(mode: &str, samples: &mut [Duration]) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 * q).ceil() as usize).clamp(1, samples.len()) - 1;
        samples[i].as_secs_f64() * 1000.0
    };
    println!(
        "{mode:<42} p50 {:>6.2} ms  p90 {:>6.2} ms  p99 {:>6.2} ms  max {:>6.2} ms",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
}

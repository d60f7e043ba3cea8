//! Idle cost of the watcher: CPU and resident memory over a window (default 60 s) of an idle
//! runner + watcher, polling at 100 ms and event-driven, against a bare actix System doing nothing
//! and one with a no-op 100 ms timer (the cost of waking up at all), all in this one binary so their
//! baselines compare; and, for reference, the `planned-stop serve` binary. Linux only (it reads
//! `/proc`).
//!
//! ```sh
//! cargo build --release && cargo run --release -p planned-stop-harness --bin idle_cost -- 60
//! ```

#[cfg(target_os = "linux")]
use planned_stop_harness as common;

#[cfg(target_os = "linux")]
use std::path::PathBuf;
#[cfg(target_os = "linux")]
use std::process::{Child, Command, Stdio};
#[cfg(target_os = "linux")]
use std::time::Duration;

/// CPU time spent on the CPU, in nanoseconds, over all threads (the first field of
/// /proc/PID/schedstat of each task; finer than the 10 ms ticks of /proc/PID/stat).
#[cfg(target_os = "linux")]
fn cpu_ns(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

#[cfg(target_os = "linux")]
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[cfg(not(target_os = "linux"))]
fn main() {
    eprintln!("idle_cost reads /proc: Linux only");
}

#[cfg(target_os = "linux")]
fn main() {
    if let Some(mode) = common::args().nth(1).filter(|m| m.starts_with("child-")) {
        child(&mode);
        return;
    }
    let secs: u64 = common::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(60);
    let base = tempfile::tempdir().unwrap();
    let spawn = |args: &[&str]| -> Child {
        Command::new(common::planned_stop_binary())
            .arg("serve")
            .arg("--dir")
            .arg(base.path().join("run"))
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("run `cargo build --release` first")
    };
    let me = std::env::current_exe().unwrap();
    let own = |mode: &str| -> Child {
        Command::new(&me)
            .arg(mode)
            .arg(base.path())
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut procs: Vec<(&str, Child)> = vec![
        ("bare actix System (this example binary)", own("child-bare")),
        (
            "bare actix System + a no-op 100 ms timer",
            own("child-timer"),
        ),
        ("runner + watcher, polling every 100 ms", own("child-poll")),
        (
            "runner + watcher, events + 1 s safety poll",
            own("child-events"),
        ),
        (
            "`planned-stop serve --poll-ms 100 --no-events`",
            spawn(&["--poll-ms", "100", "--no-events"]),
        ),
    ];
    std::thread::sleep(Duration::from_secs(2)); // let start-up finish before measuring
    let before: Vec<u64> = procs.iter().map(|(_, c)| cpu_ns(c.id())).collect();
    std::thread::sleep(Duration::from_secs(secs));
    println!("| process | CPU over {secs} s (% of one core) | CPU time | RSS (KiB) |");
    println!("|---|---|---|---|");
    for ((name, child), before) in procs.iter_mut().zip(before) {
        let ns = cpu_ns(child.id()) - before;
        let pct = ns as f64 / 1e9 / secs as f64 * 100.0;
        println!(
            "| {name} | {pct:.4} % | {:.1} ms | {} |",
            ns as f64 / 1e6,
            rss_kib(child.id())
        );
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The measured processes, all in this binary so their baselines compare.
#[cfg(target_os = "linux")]
fn child(mode: &str) {
    use actix::prelude::*;
    use planned_stop::{Layout, ServiceBuilder};

    struct Nop;
    impl Actor for Nop {
        type Context = Context<Self>;
        fn started(&mut self, ctx: &mut Context<Self>) {
            ctx.run_interval(Duration::from_millis(100), |_, _| {});
        }
    }

    let dir = PathBuf::from(common::args().nth(2).unwrap()).join(mode);
    let system = System::new();
    system.block_on(async {
        let service = |events: bool, poll: u64| {
            ServiceBuilder::new(Layout::Slots(dir.clone()))
                .events(events)
                .poll_interval(Duration::from_millis(poll))
                .start()
                .unwrap()
        };
        match mode {
            "child-timer" => {
                Nop.start();
            }
            "child-poll" => service(false, 100).ready(),
            "child-events" => service(true, 1000).ready(),
            _ => {}
        }
    });
    system.block_on(std::future::pending::<()>());
}

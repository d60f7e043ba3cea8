//! `planned-stop demo`: the README's main job.
//!
//! Starts the reference service (`planned-stop serve`) as a child in a private temporary directory
//! and stops it through every path, printing a timeline in milliseconds: a marker stop (written →
//! delivered → draining → exit 0), the next start resuming the jobs left, hostile markers that are
//! ignored, an unmarked SIGTERM (exit 1, Unix), and a marker followed at once by SIGTERM (exit 0).
//! It checks each outcome, exits 0 only if all were as designed, and removes its files.

use super::{EXIT_OK, EXIT_UNEXPECTED, chain, emit};
use chrono::Utc;
use planned_stop::marker::{Judgement, Marker, MarkerStore};
use planned_stop::stopper::{self, StopOptions};
use planned_stop::{Layout, ProcessIdentity};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

const POLL_MS: u64 = 50;
const JOBS: u32 = 3;
const EVENT_TIMEOUT: Duration = Duration::from_secs(10);

type DemoResult<T> = Result<T, String>;

/// Runs the demo; returns the exit code.
pub fn run() -> u8 {
    let dir = std::env::temp_dir().join(format!("planned-stop-demo-{}", std::process::id()));
    let result = Demo::new(&dir).and_then(|mut demo| demo.run());
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(()) => {
            emit("\nall stops behaved as designed; temporary files removed");
            EXIT_OK
        }
        Err(e) => {
            emit(format!("\ndemo FAILED: {e}"));
            EXIT_UNEXPECTED
        }
    }
}

/// A running `serve` child and its stdout events.
struct Service {
    child: Child,
    events: Receiver<(Instant, Value)>,
    identity: ProcessIdentity,
}

impl Service {
    /// Waits for the event named `name`; returns when it came and the event.
    fn expect(&self, name: &str) -> DemoResult<(Instant, Value)> {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (at, event) = self.events.recv_timeout(left).map_err(|_| {
                format!("no `{name}` event from the service within {EVENT_TIMEOUT:?}")
            })?;
            if event["event"] == name {
                return Ok((at, event));
            }
        }
    }

    /// Whether any event arrived (without waiting).
    fn quiet(&self) -> DemoResult<()> {
        match self.events.try_recv() {
            Ok((_, e)) => Err(format!("unexpected event {e}")),
            Err(_) => Ok(()),
        }
    }

    /// Waits for the `exit` event and the process's exit, prints the exit on the timeline that
    /// started at `t0`, and checks the code is `want`.
    fn expect_exit(&mut self, t0: Instant, what: &str, want: i32) -> DemoResult<()> {
        let (at, exit) = self.expect("exit")?;
        step(
            t0,
            at,
            &format!("exit code {} ({})", exit["code"], exit["verdict"]),
        );
        expect_eq(what, self.exit_code()?, Some(want))
    }

    fn exit_code(&mut self) -> DemoResult<Option<i32>> {
        self.child.wait().map(|s| s.code()).map_err(|e| chain(&e))
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Demo {
    run_dir: PathBuf,
    state_dir: PathBuf,
    store: MarkerStore,
}

impl Demo {
    fn new(dir: &Path) -> DemoResult<Demo> {
        let run_dir = dir.join("run");
        let store = MarkerStore::open(Layout::Slots(run_dir.clone())).map_err(|e| chain(&e))?;
        Ok(Demo {
            run_dir,
            state_dir: dir.join("state"),
            store,
        })
    }

    fn start(&self) -> DemoResult<(Service, Value)> {
        let exe = std::env::current_exe().map_err(|e| chain(&e))?;
        let mut child = Command::new(exe)
            .arg("serve")
            .arg("--dir")
            .arg(&self.run_dir)
            .arg("--state")
            .arg(&self.state_dir)
            .args([
                "--poll-ms",
                &POLL_MS.to_string(),
                "--jobs",
                &JOBS.to_string(),
            ])
            .args(["--job-ms", "60000", "--drain-ms", "300"])
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start the service: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, events) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && tx.send((Instant::now(), v)).is_err()
                {
                    break;
                }
            }
        });
        let mut service = Service {
            child,
            events,
            identity: ProcessIdentity::new(0, 0, Utc::now()),
        };
        let (_, resumed) = service.expect("resumed")?;
        service.expect("ready")?;
        service.identity = ProcessIdentity::of(service.child.id()).ok_or("the service died")?;
        Ok((service, resumed))
    }

    fn run(&mut self) -> DemoResult<()> {
        emit(format!(
            "planned-stop demo: the reference service with {JOBS} jobs of 60 s, a 300 ms drain, \
             polling every {POLL_MS} ms\nmarkers in {}\n",
            self.run_dir.display()
        ));

        emit("1. a planned stop through the marker");
        let (mut service, _) = self.start()?;
        emit(format!(
            "   service running as pid {}",
            service.identity.pid
        ));
        let options = StopOptions::new().with_reason("demo: planned stop");
        let t0 = Instant::now();
        stopper::request(&self.store, service.identity.pid, &options).map_err(|e| chain(&e))?;
        step(t0, t0, "marker written");
        let (at, accepted) = service.expect("stop_accepted")?;
        step(
            t0,
            at,
            &format!("delivered: stop accepted, verdict {}", accepted["verdict"]),
        );
        let (at, _) = service.expect("draining")?;
        step(
            t0,
            at,
            "draining (jobs that cannot finish in 300 ms are handed back)",
        );
        service.expect_exit(t0, "exit code of a planned stop", 0)?;

        emit("\n2. the next start resumes what was left");
        let (service2, resumed) = self.start()?;
        emit(format!(
            "   resumed {} jobs: {}",
            resumed["jobs"], resumed["items"]
        ));
        expect_eq(
            "jobs resumed",
            resumed["jobs"].as_u64(),
            Some(u64::from(JOBS)),
        )?;
        let mut service = service2;

        emit("\n3. hostile markers are ignored");
        self.hostile(&service)?;

        emit("\n4. a bare SIGTERM, with no marker, is unexpected");
        self.unmarked_sigterm(&mut service)?;

        emit("\n5. a marker followed at once by SIGTERM (systemd's order) is planned");
        let (mut service, resumed) = self.start()?;
        emit(format!(
            "   resumed {} jobs after the unexpected stop",
            resumed["jobs"]
        ));
        let options = StopOptions::new().with_signal(true);
        let t0 = Instant::now();
        let requested =
            stopper::request(&self.store, service.identity.pid, &options).map_err(|e| chain(&e))?;
        step(
            t0,
            t0,
            &format!("marker written, SIGTERM sent: {}", requested.signalled),
        );
        service.expect_exit(t0, "exit code of marker + SIGTERM", 0)
    }

    fn hostile(&self, service: &Service) -> DemoResult<()> {
        let me = service.identity;
        let slot = self.store.slot_path(me.pid);
        let now = Utc::now();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("garbage", b"{\"target_pid\": true, \x00".to_vec()),
            (
                "a dead predecessor's marker (same pid, other start)",
                to_json(Marker::new(me.pid, Some(me.start.wrapping_sub(1)), now))?,
            ),
            (
                "a marker dated an hour ahead",
                to_json(Marker::new(
                    me.pid,
                    Some(me.start),
                    now + chrono::TimeDelta::hours(1),
                ))?,
            ),
            (
                "a marker two minutes old",
                to_json(Marker::new(
                    me.pid,
                    Some(me.start),
                    now - chrono::TimeDelta::minutes(2),
                ))?,
            ),
        ];
        let staging = self.run_dir.join("staging");
        for (what, bytes) in cases {
            // What the service will conclude: the same decision function it uses.
            let judged = Ok(Judgement::judge(
                &bytes,
                &me,
                Utc::now(),
                self.store.policy(),
            ));
            // Put in place the way a stopper does (write aside, rename), so it is seen whole.
            std::fs::write(&staging, &bytes).map_err(|e| chain(&e))?;
            std::fs::rename(&staging, &slot).map_err(|e| chain(&e))?;
            // The service's watcher removes what it judged malformed or stale.
            let deadline = Instant::now() + EVENT_TIMEOUT;
            while slot.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            service.quiet()?;
            let alive = ProcessIdentity::of(me.pid) == Some(me);
            let removed = !slot.exists();
            emit(format!(
                "   {what:<52} -> {}; still running: {alive}, removed: {removed}",
                super::describe(&judged).split(':').next().unwrap_or("?")
            ));
            if !alive || !removed {
                return Err(format!("{what} was not ignored and cleaned up"));
            }
        }
        Ok(())
    }

    #[cfg(unix)]
    fn unmarked_sigterm(&self, service: &mut Service) -> DemoResult<()> {
        let t0 = Instant::now();
        let pid = i32::try_from(service.identity.pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| format!("pid {} is no process id", service.identity.pid))?;
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
            .map_err(|e| format!("cannot send SIGTERM to our own child: {e}"))?;
        step(t0, t0, "SIGTERM sent, no marker");
        service.expect_exit(t0, "exit code of an unmarked SIGTERM", 1)
    }

    #[cfg(not(unix))]
    fn unmarked_sigterm(&self, service: &mut Service) -> DemoResult<()> {
        emit("   (no SIGTERM on this OS; stopping through the marker instead)");
        stopper::request(&self.store, service.identity.pid, &StopOptions::new())
            .map_err(|e| chain(&e))?;
        service.expect("exit")?;
        expect_eq("exit code", service.exit_code()?, Some(0))
    }
}

fn to_json(marker: Marker) -> DemoResult<Vec<u8>> {
    marker.to_json().map_err(|e| chain(&e))
}

fn step(t0: Instant, at: Instant, what: &str) {
    let ms = at.saturating_duration_since(t0).as_secs_f64() * 1000.0;
    emit(format!("   +{ms:>7.1} ms  {what}"));
}

fn expect_eq<T: PartialEq + std::fmt::Debug>(what: &str, got: T, want: T) -> DemoResult<()> {
    if got == want {
        Ok(())
    } else {
        Err(format!("{what}: got {got:?}, expected {want:?}"))
    }
}

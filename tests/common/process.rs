//! Real processes: the `planned-stop` binary as a service and as a stopper.

use planned_stop::ProcessIdentity;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any single expected event may take before a test fails (not a timing assumption: a
/// generous bound so a broken build fails instead of hanging).
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(20);

/// The binary under test (`cli/`, built as [`super::command_line_binary`] says).
pub fn planned_stop() -> Command {
    Command::new(super::command_line_binary())
}

/// Runs `planned-stop ARGS` to completion; returns its output.
pub fn run(args: &[&str]) -> Output {
    planned_stop()
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// The single JSON object a `--json` invocation printed.
pub fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The environment that runs a process with its wall clock `offset` (`"+10s"`, `"-10s"`) away
/// from the host's, as a process on a host whose clock is off: libfaketime, preloaded, with the
/// monotonic clock left alone (timers run true). Panics, saying what to install, without it.
pub fn skewed_clock(offset: &'static str) -> Vec<(&'static str, &'static str)> {
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("libfaketime skews a process's clock: apt-get install faketime (.ci/run does)");
    vec![
        ("LD_PRELOAD", lib),
        ("FAKETIME", offset),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ("FAKETIME_NO_CACHE", "1"),
    ]
}

/// `planned-stop stop --pid PID --dir DIR --json` and `extra` (`--wait SECS`, ...): the stopper as
/// an operator runs it.
pub fn stop_json(dir: &Path, pid: &str, extra: &[&str]) -> Output {
    let mut args = vec!["stop", "--pid", pid, "--dir", s(dir), "--json"];
    args.extend_from_slice(extra);
    run(&args)
}

/// A running `planned-stop serve`, killed when dropped.
pub struct Serve {
    pub child: Child,
    events: Receiver<Value>,
    pub stderr: Arc<Mutex<Vec<String>>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
    pub identity: ProcessIdentity,
    pub ready: Value,
    /// Every event received so far, in order.
    pub history: Mutex<Vec<Value>>,
}

impl Serve {
    /// Starts `planned-stop serve ARGS` (with trace logs of the watcher on stderr) and waits for
    /// its `ready` event.
    pub fn start(args: &[&str]) -> Serve {
        Serve::start_with_env(args, &[])
    }

    /// [`Serve::start`] with extra environment variables.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Serve {
        let mut child = planned_stop()
            .arg("serve")
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "planned_stop::watcher=trace,warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, events) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("stdout line {line:?}: {e}"));
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = stderr.clone();
        let err = child.stderr.take().unwrap();
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let mut serve = Serve {
            identity: ProcessIdentity::of(child.id()).expect("serve is running"),
            child,
            events,
            stderr,
            stderr_reader: Some(stderr_reader),
            ready: Value::Null,
            history: Mutex::new(Vec::new()),
        };
        serve.ready = serve.expect("ready");
        serve
    }

    pub fn pid(&self) -> u32 {
        self.identity.pid
    }

    pub fn pid_arg(&self) -> String {
        self.identity.pid.to_string()
    }

    /// Waits for the next event named `name` (skipping others).
    pub fn expect(&self, name: &str) -> Value {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.events.recv_timeout(left) {
                Ok(v) => {
                    self.history.lock().unwrap().push(v.clone());
                    if v["event"] == name {
                        return v;
                    }
                }
                Err(e) => panic!(
                    "no {name:?} event ({e}); stderr: {:?}",
                    self.stderr.lock().unwrap()
                ),
            }
        }
    }

    /// The events received since the last look, without waiting.
    pub fn drain_events(&self) -> Vec<Value> {
        let new: Vec<Value> = self.events.try_iter().collect();
        self.history.lock().unwrap().extend(new.iter().cloned());
        new
    }

    /// The first event named `name` received so far.
    pub fn seen(&self, name: &str) -> Option<Value> {
        self.drain_events();
        self.history
            .lock()
            .unwrap()
            .iter()
            .find(|v| v["event"] == name)
            .cloned()
    }

    /// How many probes with verdict `kind` the watcher has logged so far (its own trace line per
    /// probe: an explicit event, not a guess at timing).
    pub fn probes(&self, kind: &str) -> usize {
        let needle = format!("verdict=\"{kind}\"");
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("marker probed") && l.contains(&needle))
            .count()
    }

    /// Waits until the watcher has logged `n` probes with verdict `kind` in all (count from the
    /// start: with notifications a probe may come before the caller looks).
    pub fn wait_probes_total(&self, kind: &str, n: usize) {
        super::wait_until(format!("fewer than {n} {kind} probes logged"), || {
            self.probes(kind) >= n
        });
    }

    /// Waits until the watcher has logged `n` *more* probes with verdict `kind` — for verdicts that
    /// recur at every poll, such as `absent`.
    pub fn wait_probes(&self, kind: &str, n: usize) {
        self.wait_probes_total(kind, self.probes(kind) + n);
    }

    /// Waits until `n` `acked` events (a resumed job's item acknowledged) have been printed in
    /// all, counting those already received; returns their item ids.
    pub fn wait_acked(&self, n: usize) -> Vec<String> {
        let acked = |history: &[Value]| -> Vec<String> {
            history
                .iter()
                .filter(|e| e["event"] == "acked")
                .map(|e| e["id"].as_str().unwrap().to_owned())
                .collect()
        };
        self.drain_events();
        let mut ids = acked(&self.history.lock().unwrap());
        while ids.len() < n {
            // `expect` records the event in the history as well.
            self.expect("acked");
            ids = acked(&self.history.lock().unwrap());
        }
        ids
    }

    /// Sends a Unix signal.
    #[cfg(unix)]
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0);
    }

    /// Waits for the process to exit; returns its exit code.
    pub fn exit_code(&mut self) -> Option<i32> {
        super::wait_for("serve did not exit", || self.child.try_wait().unwrap()).code()
    }

    /// Everything the process wrote to stderr, once it has exited (waits for the exit, then for
    /// the last lines to be read: a line written just before the exit is never missed).
    pub fn stderr_after_exit(&mut self) -> String {
        self.exit_code();
        if let Some(reader) = self.stderr_reader.take() {
            reader.join().expect("the stderr reader");
        }
        self.stderr.lock().unwrap().join("\n")
    }

    /// Waits until a stderr line contains `needle` (the line is the event: it may be read after
    /// a stdout event the caller has already seen); returns all of stderr so far.
    pub fn wait_stderr(&self, needle: &str) -> String {
        super::wait_for(format!("no stderr line with {needle:?}"), || {
            let text = self.stderr.lock().unwrap().join("\n");
            text.contains(needle).then_some(text)
        })
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `--dir DIR` arguments.
pub fn dir_args(dir: &Path) -> Vec<String> {
    vec!["--dir".into(), dir.display().to_string()]
}

/// A marker directory (`run`) and a state directory (`state`) in a new temporary directory, which
/// lives as long as this.
pub struct Dirs {
    _base: tempfile::TempDir,
    pub run: std::path::PathBuf,
    pub state: std::path::PathBuf,
}

/// New [`Dirs`].
pub fn dirs() -> Dirs {
    let base = tempfile::tempdir().unwrap();
    Dirs {
        run: base.path().join("run"),
        state: base.path().join("state"),
        _base: base,
    }
}

/// A path as an argument (the tests' paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `serve` on `d` (polling every 20 ms besides notifications) with `extra` arguments.
pub fn serve(d: &Dirs, extra: &[&str]) -> Serve {
    let mut args = vec![
        "--dir",
        s(&d.run),
        "--state",
        s(&d.state),
        "--poll-ms",
        "20",
    ];
    args.extend_from_slice(extra);
    Serve::start(&args)
}

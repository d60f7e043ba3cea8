//! Helpers shared by the integration tests.

#![allow(dead_code)]

pub mod actors;
pub mod faulty;
pub mod process;

pub use process::EVENT_TIMEOUT;

/// How far a life has got, for asserting that a process's state only moves forward: starting
/// (or held), serving (or handing over), draining, ended.
pub fn life_rank(state: planned_stop::ProcessState) -> u8 {
    use planned_stop::ProcessState::*;
    match state {
        Starting | Held => 0,
        Running | HandingOver | RestartFailed => 1,
        Draining => 2,
        _ => 3,
    }
}

#[path = "../helpers/program.rs"]
mod program;
#[allow(unused_imports)] // not every test file uses each
pub use program::{HELPER_LIFETIME, Lcg};

use chrono::{DateTime, TimeDelta, Utc};
use planned_stop::ProcessIdentity;
use planned_stop::marker::Marker;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A helper child process that is killed when dropped, so a failing test leaves nothing running.
pub struct Helper(pub Child, Option<tempfile::TempDir>);

impl Helper {
    /// A helper started by hand (from [`helper_program`] with more set up).
    #[allow(dead_code)]
    pub fn new(child: Child) -> Helper {
        Helper(child, None)
    }
}

impl std::ops::Deref for Helper {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Helper {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fixed instant a little after `me` started, so verdicts do not depend on how long the tests ran.
pub fn shortly_after_start(me: &ProcessIdentity) -> DateTime<Utc> {
    me.started_at + TimeDelta::seconds(5)
}

/// A marker for `me` written at `at`, as bytes.
pub fn self_marker(me: &ProcessIdentity, at: DateTime<Utc>) -> Vec<u8> {
    Marker::new(me.pid, Some(me.start), at).to_json().unwrap()
}

/// Reads lines from a helper's stdout until one equals `wanted` (libtest prints its own lines
/// first). Panics if the helper closes its stdout before.
pub fn wait_for_line(out: &mut impl std::io::BufRead, wanted: &str) {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "helper ended before printing {wanted:?}"
        );
        // libtest prints "test NAME ... " without a newline before the helper's first line.
        if line.trim_end().ends_with(wanted) {
            return;
        }
    }
}

/// A live process that is not us, killed when dropped: an idle `planned-stop serve` watching a
/// directory of its own (so markers elsewhere never reach it). Portable, unlike `sleep`.
pub fn other_live_process() -> Helper {
    let dir = tempfile::tempdir().unwrap();
    let child = process::planned_stop()
        .args(["serve", "--poll-ms", "1000", "--no-events", "--dir"])
        .arg(dir.path().join("run"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("the planned-stop binary runs");
    Helper(child, Some(dir))
}

/// A marker path in the single-file layout, as an application that shares one file names it.
pub fn shared_marker(dir: &Path) -> PathBuf {
    dir.join(".gateway-planned-stop.json")
}

/// A marker for this process, optionally backdated past the TTL.
pub fn write_self_marker(marker: &Path, stale: bool) -> Marker {
    let me = ProcessIdentity::current().unwrap();
    let written_at = if stale {
        "2000-01-01T00:00:00+00:00".parse().unwrap()
    } else {
        Utc::now()
    };
    let m = Marker::new(me.pid, Some(me.start), written_at).with_stopper_pid(me.pid);
    std::fs::write(marker, m.to_json().unwrap()).unwrap();
    m
}

/// Checks `done` every few milliseconds until it holds; fails the test with `what` after
/// [`EVENT_TIMEOUT`]. For what a test can only see from outside — an HTTP answer, a refused
/// connection, a log line, a child's exit — never for what an explicit event announces.
pub fn wait_until(what: impl std::fmt::Display, mut done: impl FnMut() -> bool) {
    wait_for(what, || done().then_some(()))
}

/// Asks `probe` every few milliseconds until it answers; fails the test with `what` after
/// [`EVENT_TIMEOUT`].
pub fn wait_for<T>(what: impl std::fmt::Display, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
    loop {
        if let Some(answer) = probe() {
            return answer;
        }
        assert!(std::time::Instant::now() < deadline, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A WebSocket session opened at `/ws` of `addr`: the upgrade answered with 101, its headers read;
/// what follows on the stream is the server's frames.
pub fn websocket_open(
    addr: impl std::net::ToSocketAddrs,
) -> std::io::BufReader<std::net::TcpStream> {
    use std::io::{BufRead, Write};
    let mut ws = std::io::BufReader::new(std::net::TcpStream::connect(addr).unwrap());
    ws.get_ref().set_read_timeout(Some(EVENT_TIMEOUT)).unwrap();
    write!(
        ws.get_mut(),
        "GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    .unwrap();
    let mut line = String::new();
    ws.read_line(&mut line).unwrap();
    assert!(line.contains(" 101 "), "not upgraded: {line}");
    while line != "\r\n" {
        line.clear();
        ws.read_line(&mut line).unwrap();
    }
    ws
}

/// `GET path` over a new HTTP/1.1 connection to 127.0.0.1:`port` (closed after the answer): the
/// status and the body, or `None` when nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(EVENT_TIMEOUT)).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    Some((status, body))
}

/// One HTTP/1.1 exchange on a kept-alive connection: the status, whether the response said
/// `Connection: close`, and the body; an error when the connection ended before the whole answer.
pub fn exchange(
    stream: &mut std::io::BufReader<std::net::TcpStream>,
    path: &str,
) -> std::io::Result<(u16, bool, String)> {
    use std::io::{BufRead, Read, Write};
    let cut = || std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
    write!(
        stream.get_mut(),
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )?;
    let mut status = String::new();
    if stream.read_line(&mut status)? == 0 {
        return Err(cut());
    }
    let code = status
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(cut)?;
    let (mut close, mut length) = (false, 0usize);
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line)? == 0 {
            return Err(cut());
        }
        let line = line.trim_end().to_ascii_lowercase();
        if line.is_empty() {
            break;
        }
        if let Some(value) = line.strip_prefix("content-length:") {
            length = value.trim().parse().map_err(|_| cut())?;
        }
        close |= line == "connection: close";
    }
    let mut body = vec![0; length];
    stream.read_exact(&mut body)?;
    Ok((code, close, String::from_utf8_lossy(&body).into_owned()))
}

/// The program `name` of this package (`Cargo.toml`: a helper of `helpers/`, an example as
/// `example-NAME`, or `planned-stop-under-test`), as cargo built it for this test run.
///
/// `env!` needs a literal, so each binary is named once here; one that needs a feature this build
/// lacks is not built, and asking for it is a test's mistake. Under Wine the path cargo gave is
/// the host's, and the program is found by its file name beside the test's own executable.
pub fn helper_program(name: &str) -> PathBuf {
    let built = match name {
        "planned-stop-under-test" => env!("CARGO_BIN_EXE_planned-stop-under-test"),
        "marker_processes" => env!("CARGO_BIN_EXE_marker_processes"),
        "service_processes" => env!("CARGO_BIN_EXE_service_processes"),
        "slow_drain_service" => env!("CARGO_BIN_EXE_slow_drain_service"),
        #[cfg(feature = "systemd")]
        "watchdog_service" => env!("CARGO_BIN_EXE_watchdog_service"),
        #[cfg(feature = "postgres")]
        "chaos_replica" => env!("CARGO_BIN_EXE_chaos_replica"),
        #[cfg(feature = "actix-web")]
        "web_app" => env!("CARGO_BIN_EXE_web_app"),
        #[cfg(feature = "actix-web")]
        "task_app" => env!("CARGO_BIN_EXE_task_app"),
        #[cfg(feature = "actix-web")]
        "example-actix_web" => env!("CARGO_BIN_EXE_example-actix_web"),
        #[cfg(feature = "actix-web")]
        "example-websocket" => env!("CARGO_BIN_EXE_example-websocket"),
        #[cfg(feature = "actix-web")]
        "example-task_service" => env!("CARGO_BIN_EXE_example-task_service"),
        #[cfg(feature = "actix-web")]
        "example-restart_in_place" => env!("CARGO_BIN_EXE_example-restart_in_place"),
        #[cfg(feature = "actix-web")]
        "example-wire_up" => env!("CARGO_BIN_EXE_example-wire_up"),
        #[cfg(all(feature = "actix-web", feature = "metrics"))]
        "example-prometheus" => env!("CARGO_BIN_EXE_example-prometheus"),
        other => panic!("no program {other} in this build (tests/Cargo.toml, its features)"),
    };
    let built = PathBuf::from(built);
    if cfg!(windows) {
        let exe = std::env::current_exe().unwrap();
        let profile = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/…/debug/deps/");
        return profile.join(built.file_name().expect("a program's file name"));
    }
    built
}

/// The `planned-stop` command line, built by this package from the command-line crate's source.
pub fn command_line_binary() -> PathBuf {
    helper_program("planned-stop-under-test")
}

/// The example `name` (`examples/NAME.rs`), built by this package.
pub fn example_binary(name: &str) -> PathBuf {
    helper_program(&format!("example-{name}"))
}

/// Starts helper program `name` with `args`, `DIR` set to `dir`, stdin closed and stdout piped.
pub fn spawn_helper_program(name: &str, args: &[&str], dir: &Path) -> Helper {
    let mut cmd = Command::new(helper_program(name));
    cmd.args(args)
        .env("DIR", dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    Helper(cmd.spawn().unwrap(), None)
}

/// The repository's root (this package is its `tests/`).
pub fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// How many cases a property test runs: 1,000, or `PLANNED_STOP_RECORD_CASES` (the Windows run
/// under Wine, where every file operation costs about forty times as much, takes 100), or
/// `PROPTEST_CASES`. One rule for every property test.
#[allow(dead_code)]
pub fn cases() -> u32 {
    ["PLANNED_STOP_RECORD_CASES", "PROPTEST_CASES"]
        .iter()
        .find_map(|k| std::env::var(k).ok().and_then(|v| v.parse().ok()))
        .unwrap_or(1000)
}

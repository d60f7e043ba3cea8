//! The examples that no other test runs, as real processes: each does what its header says when
//! stopped as its header says (`examples/README.md`). `prometheus.rs` is `metrics.rs`'s.

use crate::common;

use common::process::planned_stop;
use common::{EVENT_TIMEOUT, http_get};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::time::Instant;

/// An example started with its base directory and a free port; its output and address.
struct Example {
    child: Child,
    /// Its stdout, line by line, read by a thread so that a wait for a line is bounded.
    out: Receiver<String>,
    dir: PathBuf,
    addr: String,
}

impl Example {
    /// Starts example `name` in `dir` and reads its address from the line that starts with
    /// `prefix`.
    fn start(name: &str, dir: &Path, prefix: &str) -> Example {
        let mut child = Command::new(common::example_binary(name))
            .env("EXAMPLE_DIR", dir)
            .env("EXAMPLE_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (lines, out) = channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        let mut example = Example {
            child,
            out,
            dir: dir.to_path_buf(),
            addr: String::new(),
        };
        let rest = example.line_after(prefix);
        example.addr = rest.split(['/', ' ']).next().unwrap().to_owned();
        example
    }

    /// The rest of the next line of its output that starts with `prefix` (within
    /// `EVENT_TIMEOUT`).
    fn line_after(&mut self, prefix: &str) -> String {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.trim_end().to_owned();
                    }
                }
                Err(e) => panic!("no line {prefix:?} ({e})"),
            }
        }
    }

    fn port(&self) -> u16 {
        self.addr.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// `planned-stop stop --pid PID --dir DIR/run --wait 30 ARGS`, which must succeed; its JSON
    /// answer when `--json` is among `args`.
    fn stop_with(&self, pid: u32, args: &[&str]) -> String {
        let out = planned_stop()
            .args(["stop", "--pid", &pid.to_string(), "--dir"])
            .arg(self.dir.join("run"))
            .args(["--wait", "30"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A planned stop of this example: its exit code.
    fn stop(&mut self) -> Option<i32> {
        self.stop_with(self.child.id(), &[]);
        self.child.wait().unwrap().code()
    }
}

/// `actix_web.rs`: a request in flight when the stop comes is answered in full, and the
/// process ends with 0.
#[test]
fn the_actix_web_example_answers_a_request_in_flight_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut example = Example::start("actix_web", dir.path(), "serving http://");
    let mut slow = TcpStream::connect(&example.addr).unwrap();
    slow.set_read_timeout(Some(EVENT_TIMEOUT)).unwrap();
    write!(
        slow,
        "GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    assert_eq!(example.stop(), Some(0));
    let mut answer = String::new();
    slow.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("finished, although a stop came"),
        "{answer}"
    );
}

/// `websocket.rs`: an open session receives a Close frame with 1001 (Going Away), and the
/// process ends with 0.
#[test]
fn the_websocket_example_tells_an_open_session_to_go_away() {
    let dir = tempfile::tempdir().unwrap();
    let mut example = Example::start("websocket", dir.path(), "echoing at ws://");
    let mut ws = common::websocket_open(example.addr.as_str());
    assert_eq!(example.stop(), Some(0));
    let mut head = [0u8; 4];
    ws.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0x88, "a Close frame: {head:?}");
    assert_eq!(u16::from_be_bytes([head[2], head[3]]), 1001);
}

/// `task_service.rs`: a job spawned from a handler finishes; a long one (a minute: it cannot
/// finish in the first life) is handed back at the stop (exit 0) and the next life starts it
/// again.
#[test]
fn the_task_service_example_hands_a_job_to_its_next_life() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Example::start("task_service", dir.path(), "serving http://");
    let post = |port: u16, path: &str| {
        let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(EVENT_TIMEOUT)).unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        answer
    };
    assert!(post(first.port(), "/jobs/quick/50").starts_with("HTTP/1.1 202"));
    assert_eq!(first.line_after("done "), "quick");
    assert!(post(first.port(), "/jobs/long/60000").starts_with("HTTP/1.1 202"));
    assert_eq!(first.line_after("start "), "long");
    assert_eq!(first.stop(), Some(0));
    let mut second = Example::start("task_service", dir.path(), "serving http://");
    assert_eq!(
        second.line_after("start "),
        "long",
        "resumed in the next life"
    );
    assert_eq!(second.stop(), Some(0));
}

/// `restart_in_place.rs`: `stop --restart` hands the socket to a successor, which serves the
/// same port; the predecessor exits 0.
#[test]
fn the_restart_in_place_example_hands_its_socket_to_the_successor() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Example::start("restart_in_place", dir.path(), "serving http://");
    let served_by = |port: u16| http_get(port, "/").map(|(_, body)| body.trim().to_owned());
    let pid = first.child.id();
    assert_eq!(
        served_by(first.port()),
        Some(format!("served by pid {pid}"))
    );
    let answer = first.stop_with(pid, &["--restart", "--json"]);
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let successor = answer["successor"]
        .as_u64()
        .expect("the answer names the successor");
    assert_eq!(first.child.wait().unwrap().code(), Some(0), "{answer}");
    assert_eq!(
        served_by(first.port()),
        Some(format!("served by pid {successor}"))
    );
    first.stop_with(u32::try_from(successor).unwrap(), &[]);
}

/// From the successor's ready on, every new connection reaches the successor: the predecessor
/// stops accepting at the hand-over, not after its grace (the example's is 1 s). Four clients
/// open a fresh connection per request across a restart; once the successor has answered 50
/// of them, no request opened after that reaches the old process.
#[test]
fn a_restart_in_place_sends_every_new_connection_to_the_successor_at_once() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    let dir = tempfile::tempdir().unwrap();
    let mut first = Example::start("restart_in_place", dir.path(), "serving http://");
    let (port, old) = (first.port(), first.child.id());
    let old_pid = format!("served by pid {old}");
    let stop = Arc::new(AtomicBool::new(false));
    // Per request: the successor's answers counted when it was opened, and who answered.
    let seen: Arc<Mutex<Vec<(usize, String)>>> = Arc::default();
    let by_successor = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (stop, seen, by_successor, old_pid) = (
                stop.clone(),
                seen.clone(),
                by_successor.clone(),
                old_pid.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let opened = by_successor.load(Ordering::SeqCst);
                    let Some((200, body)) = http_get(port, "/") else {
                        continue;
                    };
                    let body = body.trim().to_owned();
                    if body != old_pid {
                        by_successor.fetch_add(1, Ordering::SeqCst);
                    }
                    seen.lock().unwrap().push((opened, body));
                }
            })
        })
        .collect();
    let answer = first.stop_with(old, &["--restart", "--json"]);
    let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
    let successor = answer["successor"].as_u64().expect("a successor");
    common::wait_until("the successor to answer 50 requests and more", || {
        by_successor.load(Ordering::SeqCst) >= 60
    });
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    let late: Vec<_> = seen
        .iter()
        .filter(|(opened, body)| *opened >= 50 && *body == old_pid)
        .collect();
    assert!(
        late.is_empty(),
        "{} requests reached the old process after the successor had answered 50: {:?}",
        late.len(),
        late.first()
    );
    assert!(
        seen.iter()
            .any(|(_, body)| *body == format!("served by pid {successor}"))
    );
    assert_eq!(first.child.wait().unwrap().code(), Some(0));
    first.stop_with(u32::try_from(successor).unwrap(), &[]);
}

/// A keep-alive pool that writes its next request the moment an answer ends loses nothing across
/// restarts in place of an application that builds its `App` with `web::app` and mounts nothing
/// else (the example): from the hand-over on, the old process answers each connection's next
/// request with `Connection: close` and closes it after that answer, never under a request. A
/// request is lost when its connection ends after it was written and before its whole answer.
#[test]
fn pooled_keep_alive_connections_lose_nothing_across_a_restart_in_place() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let first = Example::start("restart_in_place", dir.path(), "serving http://");
    let port = first.port();
    let (stop, lost, answers) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(std::sync::Mutex::new(Vec::<String>::new())),
    );
    let pool: Vec<_> = (0..8)
        .map(|_| {
            let (stop, lost, answers) = (stop.clone(), lost.clone(), answers.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) else {
                        continue;
                    };
                    stream.set_read_timeout(Some(EVENT_TIMEOUT)).unwrap();
                    let mut connection = BufReader::new(stream);
                    while !stop.load(Ordering::SeqCst) {
                        match common::exchange(&mut connection, "/") {
                            Ok((200, close, body)) => {
                                answers.lock().unwrap().push(body.trim().to_owned());
                                if close {
                                    break;
                                }
                            }
                            Ok((code, ..)) => panic!("answered {code}"),
                            Err(_) => {
                                lost.fetch_add(1, Ordering::SeqCst);
                                break;
                            }
                        }
                    }
                }
            })
        })
        .collect();
    let served_by = |pid: u64| {
        let answers = answers.clone();
        move || {
            let answers = answers.lock().unwrap();
            let by = format!("served by pid {pid}");
            answers.iter().filter(|a| **a == by).count() >= 100
        }
    };
    let mut pid = u64::from(first.child.id());
    common::wait_until("the pool to be served", served_by(pid));
    for round in 0..3 {
        let answer = first.stop_with(u32::try_from(pid).unwrap(), &["--restart", "--json"]);
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        pid = answer["successor"].as_u64().expect("a successor");
        common::wait_until(
            format!("round {round}: the successor serves the pool"),
            served_by(pid),
        );
    }
    stop.store(true, Ordering::SeqCst);
    for connection in pool {
        connection.join().unwrap();
    }
    let answered = answers.lock().unwrap().len();
    assert_eq!(
        lost.load(Ordering::SeqCst),
        0,
        "requests lost after they were written ({answered} answered)"
    );
    first.stop_with(u32::try_from(pid).unwrap(), &[]);
}

/// A pooled connection whose client pauses across the hand-over (a GC pause, a busy machine) is
/// retired by its next answer, not closed while idle: the old process stops accepting at the
/// hand-over but waits for the connections it has, each answered once more with
/// `Connection: close`, and exits 0 once they are gone. The client writes its next request only
/// after the old process has begun draining and a pause well past what a closing process waits
/// for its workers; closed idle then, that request would be lost.
#[test]
fn a_pooled_connection_that_pauses_across_a_restart_in_place_is_answered() {
    use planned_stop::marker::MarkerStore;
    let dir = tempfile::tempdir().unwrap();
    let mut first = Example::start("restart_in_place", dir.path(), "serving http://");
    let old = first.child.id();
    let mut connection = kept_alive(&first);
    let markers = MarkerStore::open(planned_stop::Layout::Slots(dir.path().join("run"))).unwrap();
    let answer = std::thread::scope(|scope| {
        let restart = scope.spawn(|| {
            planned_stop()
                .args(["stop", "--pid", &old.to_string(), "--dir"])
                .arg(dir.path().join("run"))
                .args(["--wait", "30", "--restart", "--json"])
                .output()
                .unwrap()
        });
        common::wait_until("the old process to drain after the hand-over", || {
            markers
                .read_outcome(old)
                .is_some_and(|o| o.state == planned_stop::ProcessState::Draining)
        });
        // The client's pause.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (code, close, body) = common::exchange(&mut connection, "/")
            .expect("the request written after the pause is answered");
        assert_eq!((code, close), (200, true), "answered, and retired");
        assert_eq!(body.trim(), format!("served by pid {old}"));
        restart.join().unwrap()
    });
    assert!(answer.status.success(), "{answer:?}");
    let answer: serde_json::Value = serde_json::from_slice(&answer.stdout).unwrap();
    let successor = answer["successor"].as_u64().expect("a successor");
    assert_eq!(first.child.wait().unwrap().code(), Some(0), "{answer}");
    first.stop_with(u32::try_from(successor).unwrap(), &[]);
}

/// A connection that stays idle across a restart in place does not keep the old process: the
/// server's keep-alive timer closes it (actix-web's 5 s) with nothing written on it, and the old
/// process then exits 0.
#[test]
fn an_idle_connection_does_not_keep_the_old_process_after_a_restart_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Example::start("restart_in_place", dir.path(), "serving http://");
    let old = first.child.id();
    let mut connection = kept_alive(&first);
    let answer: serde_json::Value =
        serde_json::from_str(&first.stop_with(old, &["--restart", "--json"])).unwrap();
    assert_eq!(first.child.wait().unwrap().code(), Some(0), "{answer}");
    let mut rest = Vec::new();
    assert_eq!(
        connection.read_to_end(&mut rest).unwrap(),
        0,
        "closed with nothing more said"
    );
    let successor = answer["successor"].as_u64().expect("a successor");
    first.stop_with(u32::try_from(successor).unwrap(), &[]);
}

/// A connection to `example` that one answered request has left open (kept alive).
fn kept_alive(example: &Example) -> BufReader<TcpStream> {
    let stream = TcpStream::connect(("127.0.0.1", example.port())).unwrap();
    stream.set_read_timeout(Some(EVENT_TIMEOUT)).unwrap();
    let mut connection = BufReader::new(stream);
    let (code, close, body) = common::exchange(&mut connection, "/").unwrap();
    assert_eq!((code, close), (200, false), "kept alive");
    assert_eq!(body.trim(), format!("served by pid {}", example.child.id()));
    connection
}

/// The examples a test starts as an operator would, with the environment each reads.
const SERVICES: [&str; 5] = [
    "actix_web",
    "websocket",
    "task_service",
    "restart_in_place",
    "wire_up",
];

/// Runs example `name` with `args` in `base` and a free port until it ends, or kills it after
/// the event timeout (an example that ignores its arguments serves instead).
fn run_briefly(name: &str, args: &[&str], base: &Path) -> std::process::Output {
    let mut child = Command::new(common::example_binary(name))
        .args(args)
        .env("EXAMPLE_DIR", base)
        .env("EXAMPLE_ADDR", "127.0.0.1:0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + EVENT_TIMEOUT;
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    child.wait_with_output().unwrap()
}

/// Issue 48 #10: the examples started serving on `--help`. Each answers it (exit 0, what it
/// reads, nothing started) and refuses an argument it does not know (exit 2, nothing started).
#[test]
fn every_example_answers_help_and_refuses_what_it_does_not_know() {
    for name in SERVICES {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("base");
        let out = run_briefly(name, &["--help"], &base);
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{name}: {out:?}");
        assert!(said.to_lowercase().contains("usage"), "{name}: {said}");
        assert!(said.contains("EXAMPLE_DIR"), "{name}: {said}");
        assert!(!base.exists(), "{name}: --help started nothing");
        let out = run_briefly(name, &["--serve-please"], &base);
        assert_eq!(out.status.code(), Some(2), "{name}: {out:?}");
        assert!(
            !base.exists(),
            "{name}: an unknown argument started nothing"
        );
    }
}

/// Issue 48 #10: with stdout a closed pipe (a log shipper gone) `println!` panicked each
/// example right after it was ready (`aborted`, 1), and the log carried colour codes into files
/// and the journal. With stdout closed, each serves and stops as planned; with stdout and stderr
/// files, neither holds a colour code.
#[cfg(unix)]
#[test]
fn the_examples_serve_with_a_closed_stdout_and_write_no_colour_codes_into_files() {
    for name in ["actix_web", "websocket", "task_service", "restart_in_place"] {
        for closed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let stdout = if closed {
                let (reader, writer) = std::io::pipe().unwrap();
                drop(reader);
                Stdio::from(writer)
            } else {
                Stdio::from(std::fs::File::create(dir.path().join("stdout")).unwrap())
            };
            let (code, log) = served_and_stopped(name, dir.path(), stdout);
            let said = std::fs::read_to_string(dir.path().join("stdout")).unwrap_or_default();
            assert_eq!(code, Some(0), "{name} (stdout closed: {closed}): {log}");
            assert!(!log.contains("failed printing"), "{name}: {log}");
            assert!(!log.contains('\u{1b}'), "{name}: colour codes: {log:?}");
            assert!(!said.contains('\u{1b}'), "{name}: colour codes: {said:?}");
            assert!(
                closed || log.contains("INFO") || said.contains("INFO"),
                "{name}: a log to look at: {log}{said}"
            );
        }
    }
}

/// Starts example `name` in `dir` on a free port with `stdout`, waits until it answers there,
/// stops it as planned and returns its exit code and what it wrote to stderr.
#[cfg(unix)]
fn served_and_stopped(name: &str, dir: &Path, stdout: Stdio) -> (Option<i32>, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(common::example_binary(name))
        .env("EXAMPLE_DIR", dir)
        .env("EXAMPLE_ADDR", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Serving: it answers on its port (a closed stdout cannot say so).
    common::wait_until(format!("{name} serves"), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let stopped = planned_stop()
        .args(["stop", "--pid", &child.id().to_string(), "--dir"])
        .arg(dir.join("run"))
        .args(["--wait", "30"])
        .output()
        .unwrap();
    let ended = child.wait_with_output().unwrap();
    let log = format!(
        "{}\n(the stopper said: {})",
        String::from_utf8_lossy(&ended.stderr),
        String::from_utf8_lossy(&stopped.stdout)
    );
    (ended.status.code(), log)
}

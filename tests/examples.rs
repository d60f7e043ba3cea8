//! The examples that no other test runs, as real processes: each does what its header says when
//! stopped as its header says (`examples/README.md`). `prometheus.rs` is `metrics.rs`'s.

mod common;

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
        let mut child = Command::new(common::example_binary(name, "actix-web"))
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

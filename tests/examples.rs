//! The examples that no other test runs, as real processes: each does what its header says when
//! stopped as its header says (`examples/README.md`). `prometheus.rs` is `metrics.rs`'s and
//! `task_service.rs` is `task_service.rs`'s.

mod common;

use common::EVENT_TIMEOUT;
use common::process::planned_stop;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// An example started with its base directory and a free port; its pid and address.
struct Example {
    child: Child,
    dir: tempfile::TempDir,
    addr: String,
}

impl Example {
    /// Starts example `name` and reads its address from the line that starts with `prefix`.
    fn start(name: &str, prefix: &str) -> Example {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(common::example_binary(name, "actix-web"))
            .env("EXAMPLE_DIR", dir.path())
            .env("EXAMPLE_ADDR", "127.0.0.1:0")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let addr = loop {
            line.clear();
            assert!(out.read_line(&mut line).unwrap() > 0, "{name} ended early");
            if let Some(rest) = line.strip_prefix(prefix) {
                break rest.split(['/', ' ']).next().unwrap().to_owned();
            }
        };
        Example { child, dir, addr }
    }

    /// `planned-stop stop --wait` of this example: its exit code is the stopper's.
    fn stop(&mut self) -> Option<i32> {
        let out = planned_stop()
            .args(["stop", "--pid", &self.child.id().to_string(), "--dir"])
            .arg(self.dir.path().join("run"))
            .args(["--wait", "30"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.child.wait().unwrap().code()
    }
}

/// `actix_web.rs`: a request in flight when the stop comes is answered in full, and the
/// process ends with 0.
#[test]
fn the_actix_web_example_answers_a_request_in_flight_and_exits_0() {
    let mut example = Example::start("actix_web", "serving http://");
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
    let mut example = Example::start("websocket", "echoing at ws://");
    let mut ws = common::websocket_open(example.addr.as_str());
    assert_eq!(example.stop(), Some(0));
    let mut head = [0u8; 4];
    ws.read_exact(&mut head).unwrap();
    assert_eq!(head[0], 0x88, "a Close frame: {head:?}");
    assert_eq!(u16::from_be_bytes([head[2], head[3]]), 1001);
}

//! The `systemd` feature against a real `$NOTIFY_SOCKET`: a Unix datagram socket this test binds.
//! Run with `cargo test --features systemd --test systemd`.

#![cfg(all(unix, feature = "systemd"))]

mod common;

use chrono::Utc;
use common::actors::*;
use planned_stop::Layout;
use planned_stop::marker::{Marker, MarkerStore};
use planned_stop::{ProcessIdentity, ServiceBuilder};
use std::os::unix::net::UnixDatagram;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(100);
const DRAIN: Duration = Duration::from_secs(5);

#[test]
fn the_lifecycle_is_reported_to_systemd_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_nonblocking(true).unwrap();
    // SAFETY: the other test here only spawns a child through std (which takes std's environment
    // lock); nothing reads the environment through libc meanwhile.
    unsafe { std::env::set_var("NOTIFY_SOCKET", &socket_path) };
    let markers = dir.path().join("run");
    let me = ProcessIdentity::current().unwrap();

    let sys = paused_system();
    let code = sys.block_on(async {
        let (participant, control) = ParticipantControl::start();
        let h = ServiceBuilder::new(Layout::Slots(markers.clone()))
            .owns_process_exit(false)
            .poll_interval(POLL)
            .drain_deadline(DRAIN)
            .persist_deadline(Duration::from_secs(2))
            .overrun_grace(Duration::from_secs(1))
            .handle_signals(false)
            .events(false)
            .clock(TokioClock::new())
            .participant("jobs", participant)
            .start()
            .unwrap();
        h.ready();
        caught_up(&h).await;
        let store = MarkerStore::open(Layout::Slots(markers.clone())).unwrap();
        store
            .write(&Marker::new(me.pid, Some(me.start), Utc::now()))
            .unwrap();
        advance(POLL).await;
        // A drain longer than a short TimeoutStopSec: the extension is renewed every second.
        for _ in 0..3 {
            advance(Duration::from_secs(1)).await;
        }
        assert!(control.finish(&[]));
        code_of(h.stopped().await)
    });
    assert_eq!(code, 0);

    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = socket.recv(&mut buf) {
        messages.push(String::from_utf8_lossy(&buf[..n]).trim_end().to_owned());
    }
    let extend = |m: &String| {
        m.strip_prefix("EXTEND_TIMEOUT_USEC=")
            .map(|v| v.parse::<u64>().unwrap())
    };
    assert_eq!(messages[0], "READY=1\nSTATUS=running", "{messages:#?}");
    assert_eq!(
        messages[1], "STOPPING=1\nSTATUS=draining (planned stop)",
        "{messages:#?}"
    );
    let extensions: Vec<u64> = messages[2..].iter().filter_map(extend).collect();
    assert_eq!(
        extensions.len(),
        4,
        "one at the start and one per second: {messages:#?}"
    );
    // The whole stop's bound, not only the drain's — the drain (5 s), two answer graces a
    // phase (0.6 s), the persist deadline (2 s) and the longer of the overrun grace (1 s) and
    // the exit grace (2 s) — plus a second for the next renewal: the record's write after the
    // drain is covered, and the service's own overrun watchdog fires before systemd's SIGKILL.
    assert_eq!(extensions[0], 10_600_000, "the stop's bound plus a second");
    assert!(
        extensions.windows(2).all(|w| w[1] < w[0]),
        "counting down: {extensions:?}"
    );
    assert_eq!(extensions[3], 7_600_000);
    assert_eq!(
        messages.last().unwrap(),
        "STATUS=stopped, exit code 0",
        "{messages:#?}"
    );
    assert_eq!(messages.len(), 7, "{messages:#?}");
}

/// The watchdog heartbeat comes from the System's own loop: a real process (a helper) with
/// `WATCHDOG_USEC` set sends `WATCHDOG=1` every half interval, sends none while its loop is
/// blocked, and sends again once the loop runs again.
#[test]
fn the_watchdog_is_fed_from_the_event_loop_and_starves_while_it_is_blocked() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("watchdog.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_nonblocking(true).unwrap();
    let mut cmd = std::process::Command::new(common::helper_program("watchdog_service"));
    cmd.env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "200000") // WatchdogSec=200ms: a heartbeat every 100 ms
        .env_remove("WATCHDOG_PID")
        .env("PLANNED_STOP_TEST_DIR", dir.path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let heartbeats = |socket: &UnixDatagram| {
        let mut buf = [0u8; 4096];
        let mut n = 0;
        while let Ok(len) = socket.recv(&mut buf) {
            n += usize::from(buf[..len].trim_ascii_end() == b"WATCHDOG=1");
        }
        n
    };
    common::wait_for_line(&mut out, "blocking");
    let before = heartbeats(&socket);
    assert!(before >= 2, "fed while the loop ran: {before}");
    common::wait_for_line(&mut out, "unblocked");
    // The helper's loop is still blocked until it reads our line: nothing can have been sent.
    assert_eq!(
        heartbeats(&socket),
        0,
        "no heartbeat while the loop was blocked"
    );
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "go on").unwrap();
    }
    // Fed again once the loop runs: wait for the next heartbeat (bounded).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut after = 0;
    while after == 0 {
        assert!(std::time::Instant::now() < deadline, "never fed again");
        std::thread::sleep(Duration::from_millis(20));
        after += heartbeats(&socket);
    }
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {}
    assert_eq!(child.wait().unwrap().code(), Some(0));
}

/// Under systemd a restart in place must move the unit's main process to the
/// successor before the predecessor exits, or systemd takes that exit for the service's. A real
/// `serve --restart-in-place-ms` with `$NOTIFY_SOCKET` set: the successor sends `MAINPID=` with
/// its own pid, then its own `READY=1`; the predecessor exits 0.
#[test]
fn a_successor_tells_systemd_it_is_the_main_process() {
    use common::process::{dirs, json_of, stop_json};
    let d = dirs();
    let socket_path = d.run.parent().unwrap().join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(common::EVENT_TIMEOUT))
        .unwrap();
    let mut service = common::process::Serve::start_with_env(
        &[
            "--dir",
            common::process::s(&d.run),
            "--state",
            common::process::s(&d.state),
            "--restart-in-place-ms",
            "10000",
        ],
        &[("NOTIFY_SOCKET", socket_path.to_str().unwrap())],
    );
    let out = stop_json(&d.run, &service.pid_arg(), &["--restart", "--wait", "20"]);
    let report = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    let successor = report["successor"].as_u64().expect("a successor") as u32;
    assert_eq!(service.exit_code(), Some(0));
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let main_pid = format!("MAINPID={successor}");
    while !seen.iter().any(|m: &String| m.contains(&main_pid)) {
        let n = socket
            .recv(&mut buf)
            .expect("the successor notifies systemd");
        seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    let out = stop_json(&d.run, &successor.to_string(), &["--wait", "20"]);
    assert_eq!(out.status.code(), Some(0), "{}", json_of(&out));
}

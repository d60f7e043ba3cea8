//! The `systemd` feature against a real `$NOTIFY_SOCKET`: a Unix datagram socket this test binds.
//! Run with `cargo test --features systemd --test systemd`.

#![cfg(all(unix, feature = "systemd"))]

mod common;

use chrono::Utc;
use common::actors::*;
use planned_stop::{Layout, Marker, MarkerStore, PlannedStopService, ProcessIdentity};
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
    // SAFETY: this test binary has this one test, so no other thread reads the environment.
    unsafe { std::env::set_var("NOTIFY_SOCKET", &socket_path) };
    let markers = dir.path().join("run");
    let me = ProcessIdentity::current().unwrap();

    let sys = paused_system();
    let stop = sys.stop_future();
    let code = sys.block_on(async {
        let (participant, control) = ParticipantControl::start();
        let h = PlannedStopService::builder(Layout::Slots(markers.clone()))
            .poll_interval(POLL)
            .drain_deadline(DRAIN)
            .handle_signals(false)
            .events(false)
            .clock(TokioClock::new())
            .participant("jobs", participant)
            .start()
            .unwrap();
        h.ready();
        settle().await;
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
        stop.await.unwrap()
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
    assert_eq!(extensions[0], 6_000_000, "the whole drain plus a second");
    assert!(
        extensions.windows(2).all(|w| w[1] < w[0]),
        "counting down: {extensions:?}"
    );
    assert_eq!(extensions[3], 3_000_000);
    assert_eq!(
        messages.last().unwrap(),
        "STATUS=stopped, exit code 0",
        "{messages:#?}"
    );
    assert_eq!(messages.len(), 7, "{messages:#?}");
}

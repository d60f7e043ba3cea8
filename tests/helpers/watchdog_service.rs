//! A helper program of `tests/systemd.rs` (not a test, not an example for users): a service that,
//! once ready and fed by the systemd watchdog for a while, blocks its own event loop for a second
//! (and until the test writes a line), then stops as planned. The test counts the heartbeats it
//! sends to `NOTIFY_SOCKET` meanwhile.

mod program;

use planned_stop::{Layout, ServiceBuilder};
use std::time::Duration;

fn main() {
    program::give_up_after_helper_lifetime();
    let dir = std::path::PathBuf::from(std::env::var("PLANNED_STOP_TEST_DIR").unwrap());
    let system = actix::System::new();
    let code = system.block_on(async {
        let h = ServiceBuilder::new(Layout::Slots(dir.join("run")))
            .handle_signals(false)
            .events(false)
            .start()
            .unwrap();
        h.ready();
        actix::clock::sleep(Duration::from_millis(450)).await;
        println!("blocking");
        // The loop's own thread sleeps: no task on this System runs meanwhile.
        std::thread::sleep(Duration::from_secs(1));
        println!("unblocked");
        // Still blocked until the test has counted the heartbeats.
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        actix::clock::sleep(Duration::from_millis(300)).await;
        h.request_stop(planned_stop::StopRequest::Planned);
        h.stopped().await
    });
    std::process::exit(if code == std::process::ExitCode::SUCCESS {
        0
    } else {
        1
    });
}

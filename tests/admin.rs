//! The actix-web integration is loud when it is half used, and the admin server
//! answers through the whole drain and after the application's `System` has ended.
//!
//! Each test runs a real service in this process with real HTTP over 127.0.0.1.

use crate::common;

use common::actors::{LogCapture, ParticipantControl};
use common::http_get;
use planned_stop::web::Admin;
use planned_stop::{DrainPhase, Layout, ServiceBuilder, ServiceHandle, StopRequest};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

fn service(dir: &Path) -> ServiceHandle {
    ServiceBuilder::new(Layout::Slots(dir.join("run")))
        .owns_process_exit(false)
        .handle_signals(false)
        .events(false)
        .start()
        .unwrap()
}

/// `http_get` off the event loop (the runner and the servers keep running meanwhile).
async fn get(port: u16, path: &'static str) -> Option<(u16, String)> {
    tokio::task::spawn_blocking(move || http_get(port, path))
        .await
        .unwrap()
}

/// Polls `path` until `done` holds of its answer, within the common event timeout.
async fn until(port: u16, path: &'static str, done: impl Fn(u16, &str) -> bool) -> String {
    let deadline = std::time::Instant::now() + common::EVENT_TIMEOUT;
    loop {
        if let Some((code, body)) = get(port, path).await
            && done(code, &body)
        {
            return body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{path} never answered as expected"
        );
        actix::clock::sleep(Duration::from_millis(5)).await;
    }
}

fn state_is(want: &'static str) -> impl Fn(u16, &str) -> bool {
    move |code, body| {
        code == 200
            && serde_json::from_str::<serde_json::Value>(body).is_ok_and(|v| v["state"] == want)
    }
}

#[test]
fn the_admin_server_answers_through_the_drain_and_after_the_system_ended() {
    let dir = tempfile::tempdir().unwrap();
    let rendered = Arc::new(AtomicU64::new(0));
    let counter = rendered.clone();
    let mut admin = None;
    let port = actix::System::new().block_on(async {
        let h = service(dir.path());
        let (slow, control) = ParticipantControl::start();
        h.add_participant(DrainPhase::Work, "slow", slow);
        let server = Admin::new(&h)
            .readiness("/ready")
            .status("/status")
            .metrics("/metrics", move || {
                format!("renders {}\n", counter.fetch_add(1, Ordering::SeqCst) + 1)
            })
            .bind("127.0.0.1:0")
            .unwrap();
        let port = server.addrs()[0].port();
        h.ready();
        until(port, "/status", state_is("running")).await;
        assert_eq!(get(port, "/ready").await.unwrap().0, 200);
        // A pooled connection (a scraper's, a probe's): kept alive while the service runs.
        let mut pooled =
            std::io::BufReader::new(std::net::TcpStream::connect(("127.0.0.1", port)).unwrap());
        let (code, close, _) = common::exchange(&mut pooled, "/status").unwrap();
        assert_eq!((code, close), (200, false), "kept alive while running");
        h.request_stop(StopRequest::Planned);
        let mut asks = control.asks.clone();
        asks.wait_for(|n| *n > 0).await.unwrap();
        // The work phase runs: the application's ingress would be closed by now.
        let status = until(port, "/status", state_is("draining")).await;
        assert!(status.contains("\"work\""), "{status}");
        // Retired after its next answer, as the application's are: a client reconnects (to the
        // successor of a restart in place, which accepts from the same socket) instead of
        // writing into a connection cut when this process ends.
        let (code, close, _) = common::exchange(&mut pooled, "/status").unwrap();
        assert_eq!((code, close), (200, true), "retired once stopping");
        assert_eq!(get(port, "/ready").await.unwrap().0, 503);
        assert_eq!(get(port, "/metrics").await.unwrap().0, 200);
        assert!(control.finish(&[]), "the participant was waiting");
        h.stopped().await;
        admin = Some(server);
        port
    });
    // The application's System has ended; the admin server still answers until the process does.
    let (code, body) = http_get(port, "/status").expect("the admin server answers");
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["state"], "stopped", "{status}");
    assert_eq!(status["exit_code"], 0, "{status}");
    let before = rendered.load(Ordering::SeqCst);
    let (code, body) = http_get(port, "/metrics").unwrap();
    assert_eq!((code, body), (200, format!("renders {}\n", before + 1)));
    // `last_scrape` waits for a scrape begun after it, and says when none came.
    let mut admin = admin.unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let scraper = std::thread::spawn(move || {
        // Scrape until `last_scrape` has seen one and stopped the server; the last answer
        // before that is whole.
        let mut answers = Vec::new();
        while let Some(answer) = http_get(port, "/metrics") {
            answers.push(answer);
        }
        answers
    });
    assert!(runtime.block_on(admin.last_scrape(common::EVENT_TIMEOUT)));
    let answers = scraper.join().unwrap();
    assert!(!answers.is_empty(), "a scrape was answered");
    assert!(
        answers
            .iter()
            .all(|(code, body)| *code == 200 && body.starts_with("renders "))
    );
    assert!(
        http_get(port, "/metrics").is_none(),
        "stopped after the last scrape"
    );
    assert!(
        !runtime.block_on(admin.last_scrape(Duration::from_millis(50))),
        "no scrape came"
    );
}

/// A scrape that began before `last_scrape` was called rendered the numbers of that moment, which
/// may precede the stop's last ones: however late its answer ends, it is not the last scrape.
#[test]
fn a_scrape_begun_before_last_scrape_is_not_the_last() {
    use std::sync::mpsc;
    let dir = tempfile::tempdir().unwrap();
    let (began_tx, began) = mpsc::channel();
    let (release, release_rx) = mpsc::channel::<()>();
    let release_rx = std::sync::Mutex::new(release_rx);
    let renders = AtomicU64::new(0);
    let mut admin = actix::System::new().block_on(async {
        let h = service(dir.path());
        // Each render says it began, then waits for the test to let it end.
        let render = move || {
            let n = renders.fetch_add(1, Ordering::SeqCst) + 1;
            began_tx.send(n).unwrap();
            let _ = release_rx.lock().unwrap().recv();
            format!("render {n}\n")
        };
        Admin::new(&h)
            .metrics("/metrics", render)
            .bind("127.0.0.1:0")
            .unwrap()
    });
    let port = admin.addrs()[0].port();
    let first = std::thread::spawn(move || http_get(port, "/metrics"));
    assert_eq!(began.recv().unwrap(), 1, "the first render runs");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (came, second) = runtime.block_on(async {
        let mut last = std::pin::pin!(admin.last_scrape(common::EVENT_TIMEOUT));
        // Its first poll takes the count of the scrapes begun so far.
        let first_poll =
            std::future::poll_fn(|cx| std::task::Poll::Ready(last.as_mut().poll(cx).is_pending()));
        assert!(first_poll.await, "no scrape began after the call yet");
        let then = async {
            // The scrape begun before the call ends now, with its answer whole.
            release.send(()).unwrap();
            let first = tokio::task::spawn_blocking(move || first.join().unwrap());
            assert_eq!(first.await.unwrap(), Some((200, "render 1\n".into())));
            // The admin still answers: a scrape begun now is the last one.
            let second = tokio::task::spawn_blocking(move || http_get(port, "/metrics"));
            let began =
                tokio::task::spawn_blocking(move || began.recv_timeout(common::EVENT_TIMEOUT));
            assert_eq!(began.await.unwrap(), Ok(2), "a second render began");
            release.send(()).unwrap();
            second.await.unwrap()
        };
        tokio::join!(last, then)
    });
    assert!(came, "the scrape begun after the call came");
    assert_eq!(second, Some((200, "render 2\n".into())));
    assert!(http_get(port, "/metrics").is_none(), "stopped after it");
}

/// How the application runs its `HttpServer`, with readiness mounted at `/ready`.
#[derive(Clone, Copy)]
enum Run {
    /// Plainly, without `web::serve`.
    Plain,
    /// Under `web::serve`, its `App` from `App::new()`.
    Served,
    /// Under `web::serve`, its `App` from `web::app`.
    ServedCrateApp,
}

/// Runs an `HttpServer` as `run` says, waits until its workers mounted the route, then calls
/// `ready()` and stops as planned; returns what was logged.
fn logs_of_a_life(run: Run) -> LogCapture {
    let dir = tempfile::tempdir().unwrap();
    let logs = LogCapture::default();
    let _guard = logs.install();
    actix::System::new().block_on(async {
        let h = service(dir.path());
        let mounted = h.clone();
        macro_rules! bind {
            ($server:expr) => {
                $server
                    .workers(1)
                    .disable_signals()
                    .bind("127.0.0.1:0")
                    .unwrap()
            };
        }
        let (port, running) = match run {
            Run::Plain | Run::Served => {
                let server = bind!(actix_web::HttpServer::new(move || {
                    actix_web::App::new().service(planned_stop::web::readiness("/ready", &mounted))
                }));
                let port = server.addrs()[0].port();
                let running: std::pin::Pin<Box<dyn Future<Output = ()>>> =
                    if matches!(run, Run::Served) {
                        let serve = planned_stop::web::serve(server, &h);
                        Box::pin(async move { drop(serve.await) })
                    } else {
                        let server = server.run();
                        Box::pin(async move { drop(server.await) })
                    };
                (port, running)
            }
            Run::ServedCrateApp => {
                let server = bind!(actix_web::HttpServer::new(move || {
                    planned_stop::web::app(&mounted)
                        .service(planned_stop::web::readiness("/ready", &mounted))
                }));
                let port = server.addrs()[0].port();
                let serve = planned_stop::web::serve(server, &h);
                let running: std::pin::Pin<Box<dyn Future<Output = ()>>> =
                    Box::pin(async move { drop(serve.await) });
                (port, running)
            }
        };
        let running = actix::spawn(running);
        // The App factory has run (readiness answers 503 "starting"), and only now is it ready.
        until(port, "/ready", |code, _| code == 503).await;
        h.ready();
        until(port, "/ready", |code, _| code == 200).await;
        h.request_stop(StopRequest::Planned);
        h.stopped().await;
        running.abort();
    });
    logs
}

/// The WARN of a half-used integration.
const NOT_SERVED: &str = "does not run under planned_stop::web::serve";

/// The WARN of an `App` that keeps its keep-alive connections through a stop.
const NOT_RETIRED: &str = "does not retire its keep-alive connections";

#[test]
fn readiness_mounted_without_serve_is_a_warning_at_ready() {
    assert_eq!(
        logs_of_a_life(Run::Plain).count(tracing::Level::WARN, NOT_SERVED),
        1
    );
}

#[test]
fn readiness_mounted_under_serve_is_no_warning() {
    for run in [Run::Served, Run::ServedCrateApp] {
        assert_eq!(
            logs_of_a_life(run).count(tracing::Level::WARN, NOT_SERVED),
            0
        );
    }
}

/// Under `web::serve`, an `App` that does not retire its keep-alive connections at a stop (not
/// built by `web::app`, no `CloseWhenStopping`) loses a pooled request per connection: said at
/// the stop, naming `web::app`. An `App` from `web::app` is not.
#[test]
fn an_app_that_keeps_its_connections_through_a_stop_is_a_warning_at_the_stop() {
    let logs = logs_of_a_life(Run::Served);
    assert_eq!(logs.count(tracing::Level::WARN, NOT_RETIRED), 1);
    assert_eq!(
        logs.count(tracing::Level::WARN, "planned_stop::web::app"),
        1
    );
    let logs = logs_of_a_life(Run::ServedCrateApp);
    assert_eq!(logs.count(tracing::Level::WARN, NOT_RETIRED), 0);
}

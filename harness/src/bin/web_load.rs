//! Load during a planned stop: does an actix-web service under `planned_stop::web::serve` answer
//! every request it accepted?
//!
//! ```sh
//! cargo run --release -p planned-stop-harness --bin web_load -- [SECONDS_BEFORE] [CLIENTS]
//! ```
//!
//! The example re-runs itself as the server (a child process: the runner owns that process's
//! exit). Client threads send `GET /work` (5 ms of simulated work) over a fresh 127.0.0.1
//! connection each, as fast as they can; after `SECONDS_BEFORE` (default 3) it asks for a planned
//! stop through the marker, exactly as `planned-stop stop` does. The server counts the requests it
//! handled and prints the count as it exits; the clients count the 200s they received. Every
//! request the server accepted must have been answered: `handled - ok = 0`. Connections refused
//! after the listener closed, or reset while still in the kernel's accept queue, were never
//! accepted and are counted apart. Latency p50/p99 is reported for the requests sent before the
//! stop and for those sent during the drain.

use planned_stop_harness as common;

use actix_web::{App, HttpServer, get};
use planned_stop::marker::MarkerStore;
use planned_stop::stopper::{self, StopOptions};
use planned_stop::{Layout, ServiceBuilder};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

static HANDLED: AtomicU64 = AtomicU64::new(0);

#[get("/work")]
async fn work() -> &'static str {
    HANDLED.fetch_add(1, Ordering::Relaxed);
    actix::clock::sleep(Duration::from_millis(5)).await;
    "done"
}

/// The server: planned-stop around an actix-web app, 1 s of grace, a 10 s ingress deadline.
fn serve(base: &str) -> std::io::Result<std::process::ExitCode> {
    let base = std::path::PathBuf::from(base);
    let code = actix_web::rt::System::new().block_on(async {
        let stop = ServiceBuilder::new(Layout::Slots(base.join("run")))
            .state_dir(base.join("state"))
            .phase_deadline(planned_stop::DrainPhase::Ingress, Duration::from_secs(10))
            .start()
            .map_err(std::io::Error::other)?;
        let ready = stop.clone();
        let server = HttpServer::new(move || {
            App::new()
                .service(planned_stop::web::readiness("/ready", &ready))
                .service(work)
        })
        .workers(2)
        .backlog(1024)
        .bind(("127.0.0.1", 0))?;
        println!("listening {}", server.addrs()[0].port());
        std::io::stdout().flush()?;
        stop.ready();
        planned_stop::web::serve(server, &stop)
            .grace(Duration::from_secs(1))
            .await
    })?;
    println!("handled {}", HANDLED.load(Ordering::Relaxed));
    Ok(code)
}

/// What one request came to.
enum Answer {
    Ok(Duration),
    /// Refused, or reset with no byte of answer: never accepted by the server.
    NotAccepted,
    /// Accepted (some answer came) but not a 200.
    Failed,
}

fn request(port: u16) -> Answer {
    let started = Instant::now();
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return Answer::NotAccepted;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    if stream
        .write_all(b"GET /work HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return Answer::NotAccepted;
    }
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    if response.is_empty() {
        Answer::NotAccepted
    } else if response.starts_with(b"HTTP/1.1 200") {
        Answer::Ok(started.elapsed())
    } else {
        Answer::Failed
    }
}

#[derive(Default)]
struct Tally {
    ok_before: Vec<Duration>,
    ok_during: Vec<Duration>,
    not_accepted: u64,
    failed: u64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// The clients: threads sending requests until `done`, each answer tallied as before or during
/// the stop.
struct Load {
    tally: Arc<Mutex<Tally>>,
    stop_requested: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(clients: usize, port: u16) -> Load {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let stop_requested = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let threads = (0..clients)
            .map(|_| {
                let (tally, stop_requested, done, sent) = (
                    tally.clone(),
                    stop_requested.clone(),
                    done.clone(),
                    sent.clone(),
                );
                std::thread::spawn(move || {
                    while !done.load(Ordering::Relaxed) {
                        let during = stop_requested.load(Ordering::Relaxed);
                        sent.fetch_add(1, Ordering::Relaxed);
                        let answer = request(port);
                        let mut t = tally.lock().expect("tally");
                        match answer {
                            Answer::Ok(latency) if during => t.ok_during.push(latency),
                            Answer::Ok(latency) => t.ok_before.push(latency),
                            Answer::NotAccepted => {
                                t.not_accepted += 1;
                                drop(t);
                                std::thread::sleep(Duration::from_millis(1));
                            }
                            Answer::Failed => t.failed += 1,
                        }
                    }
                })
            })
            .collect();
        Load {
            tally,
            stop_requested,
            done,
            sent,
            threads,
        }
    }

    /// Stops the clients; what they saw, sorted.
    fn finish(self) -> Tally {
        self.done.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        let mut t = std::mem::take(&mut *self.tally.lock().expect("tally"));
        t.ok_before.sort();
        t.ok_during.sort();
        t
    }
}

/// The server (this program, `serve DIR`) started, and the port it printed.
fn start_server(
    base: &std::path::Path,
) -> std::io::Result<(
    std::process::Child,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
    u16,
)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", base.to_str().unwrap_or(".")])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let port: u16 = loop {
        let line = lines.next().expect("the server printed its port")?;
        if let Some(port) = line.strip_prefix("listening ") {
            break port.parse().expect("a port");
        }
    };
    Ok((child, lines, port))
}

fn main() -> std::io::Result<std::process::ExitCode> {
    let args: Vec<String> = common::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        return serve(&args[2]);
    }
    let before_secs: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let clients: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(16);
    let base = tempfile::tempdir()?;
    let (mut child, lines, port) = start_server(base.path())?;
    let load = Load::start(clients, port);

    let load_started = Instant::now();
    std::thread::sleep(Duration::from_secs(before_secs));
    let sent_before = load.sent.load(Ordering::Relaxed);
    let store =
        MarkerStore::open(Layout::Slots(base.path().join("run"))).map_err(std::io::Error::other)?;
    let stop_at = Instant::now();
    load.stop_requested.store(true, Ordering::Relaxed);
    stopper::request(&store, child.id(), &StopOptions::new()).map_err(std::io::Error::other)?;
    let mut handled = None;
    for line in lines.map_while(Result::ok) {
        if let Some(n) = line.strip_prefix("handled ") {
            handled = n.parse::<u64>().ok();
        }
    }
    let status = child.wait()?;
    let drain = stop_at.elapsed();
    let t = load.finish();

    let ok = (t.ok_before.len() + t.ok_during.len()) as u64;
    let handled = handled.unwrap_or(0);
    let rate = sent_before as f64 / stop_at.duration_since(load_started).as_secs_f64();
    println!("clients                         {clients}");
    println!("load before the stop            {rate:.0} requests/s for {before_secs} s");
    println!("server exit code                {:?}", status.code());
    report(&t, drain, handled, ok);
    let clean = status.code() == Some(0) && handled == ok && t.failed == 0;
    Ok(if clean {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    })
}

/// The rest of the table: the drain, what was answered, the latencies.
fn report(t: &Tally, drain: Duration, handled: u64, ok: u64) {
    println!(
        "stop to exit                    {:.2} s (grace 1 s)",
        drain.as_secs_f64()
    );
    println!("requests handled by the server  {handled}");
    println!("200s received by the clients    {ok}");
    println!(
        "accepted but not answered       {}",
        handled.saturating_sub(ok)
    );
    println!("answered but not 200            {}", t.failed);
    println!("never accepted (refused/reset)  {}", t.not_accepted);
    println!(
        "latency before the stop         p50 {:.1} ms, p99 {:.1} ms ({} requests)",
        percentile(&t.ok_before, 0.5),
        percentile(&t.ok_before, 0.99),
        t.ok_before.len()
    );
    println!(
        "latency during the drain        p50 {:.1} ms, p99 {:.1} ms ({} requests)",
        percentile(&t.ok_during, 0.5),
        percentile(&t.ok_during, 0.99),
        t.ok_during.len()
    );
}

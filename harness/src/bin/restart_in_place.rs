//! Planned restarts of a web service under load, three ways side by side: restart in place,
//! today's restart by exit code (75, a supervisor loop starting it again), and a plain actix-web
//! stop and start.
//!
//! ```sh
//! cargo run --release -p planned-stop-harness --bin restart_in_place -- [RESTARTS] [FRESH] [POOLED]
//! ```
//!
//! The load: FRESH clients (default 16) opening a new connection per request, and a POOLED
//! (default 16) connection keep-alive pool that writes on its connections without looking and
//! reconnects when an answer says `Connection: close` or the server closed one. RESTARTS (default
//! 100) restarts in a row, each variant on a server of its own (this harness re-run as a child):
//!
//! - `in place`: the shipped example `restart_in_place` (`ServiceBuilder::restart_in_place`, the
//!   listener from `web::listeners_or_bind`, `CloseWhenStopping`), `planned-stop stop --restart
//!   --wait`: the successor takes over the same socket;
//! - `in place, bare`: the same without `CloseWhenStopping` (what an application that mounts
//!   nothing loses on its pooled connections);
//! - `exit 75`: the same service without it: the restart exits 75 and this harness, as the
//!   supervisor, starts it again at once (it binds the port anew);
//! - `actix-web`: a plain `HttpServer` (its own signals), SIGTERM, started again at once.
//!
//! Counted: requests answered 200, answers other than 200, refused connects, resets of new
//! connections (no answer to a fresh connection's request), requests lost after being written to
//! a pooled connection, and the restart time (the request to the old process gone: for a restart
//! in place, the successor ready and the old one drained) p50/p99. That the work handed across a
//! restart is done exactly once is a test (`tests/task_service.rs`). docs/performance.md has the
//! figures. A restart over 500 ms is named on stderr (the pids and when), to find in the servers'
//! log: `SERVER_LOG` is their `RUST_LOG` (default `error`), and `ONLY=in-place` (or another
//! variant) measures one variant alone.

use planned_stop_harness as common;

use actix_web::{App, HttpServer, web};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The server of this harness: `in-place-bare` (restart in place without `CloseWhenStopping`),
/// `exit-75` (planned-stop without restart in place) or `plain`. (`in-place` is the shipped
/// example.)
fn serve(variant: &str, base: &str, port: u16) -> std::io::Result<std::process::ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let base = std::path::PathBuf::from(base);
    actix_web::rt::System::new().block_on(async move {
        let app = || App::new().route("/", web::get().to(|| async { "hello" }));
        if variant == "plain" {
            HttpServer::new(app)
                .bind(("127.0.0.1", port))?
                .run()
                .await?;
            return Ok(std::process::ExitCode::SUCCESS);
        }
        let mut builder =
            planned_stop::ServiceBuilder::new(planned_stop::Layout::Slots(base.join("run")))
                .state_dir(base.join("state"));
        if variant == "in-place-bare" {
            builder = builder.restart_in_place(Duration::from_secs(30));
        }
        let stop = builder.start().map_err(std::io::Error::other)?;
        let ready = stop.clone();
        let bare = variant == "in-place-bare";
        let server = HttpServer::new(move || {
            let close = planned_stop::web::CloseWhenStopping::new(&ready);
            app().wrap(actix_web::middleware::Condition::new(!bare, close))
        });
        let server = planned_stop::web::listeners_or_bind(&stop, ("127.0.0.1", port))?
            .into_iter()
            .try_fold(server, HttpServer::listen)?;
        stop.ready();
        planned_stop::web::serve(server, &stop).await
    })
}

/// What the load saw.
#[derive(Default, Debug, Clone)]
struct Tally {
    ok: u64,
    not_200: u64,
    refused: u64,
    reset_new: u64,
    lost_pooled: u64,
}

fn status_of(answer: &[u8]) -> Option<u16> {
    std::str::from_utf8(answer)
        .ok()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// One request on a new connection.
fn fresh(port: u16, tally: &Mutex<Tally>) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        tally.lock().unwrap().refused += 1;
        // As a client backs off: a refused connect is counted once a millisecond at most.
        std::thread::sleep(Duration::from_millis(1));
        return;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut answer = Vec::new();
    let sent = stream.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let read = stream.read_to_end(&mut answer);
    let mut t = tally.lock().unwrap();
    match (sent.is_ok() && read.is_ok(), status_of(&answer)) {
        (true, Some(200)) => t.ok += 1,
        (true, Some(_)) => t.not_200 += 1,
        _ => t.reset_new += 1,
    }
}

/// One pooled connection's life: requests until the server closes it or `stop`.
fn pooled(port: u16, tally: &Mutex<Tally>, stop: &AtomicBool) {
    let Ok(stream) = TcpStream::connect(("127.0.0.1", port)) else {
        tally.lock().unwrap().refused += 1;
        std::thread::sleep(Duration::from_millis(1));
        return;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(stream);
    let mut answered = 0;
    while !stop.load(Ordering::Relaxed) {
        let written = reader
            .get_mut()
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .is_ok();
        let answer = written.then(|| read_answer(&mut reader)).flatten();
        let mut t = tally.lock().unwrap();
        match answer {
            Some((code, close)) => {
                answered += 1;
                if code == 200 {
                    t.ok += 1
                } else {
                    t.not_200 += 1
                }
                if close {
                    return;
                }
            }
            None if answered > 0 => {
                t.lost_pooled += 1;
                return;
            }
            None => {
                t.reset_new += 1;
                return;
            }
        }
    }
}

/// One answer: its status and whether it said `Connection: close`.
fn read_answer(reader: &mut BufReader<TcpStream>) -> Option<(u16, bool)> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let code = status_of(line.as_bytes())?;
    let (mut close, mut length) = (false, 0usize);
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let lower = line.to_ascii_lowercase();
        if lower == "\r\n" {
            break;
        }
        close |= lower.starts_with("connection: close");
        if let Some(n) = lower.strip_prefix("content-length:") {
            length = n.trim().parse().ok()?;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((code, close))
}

/// The shipped example `restart_in_place`, built beside this harness
/// (`cargo build --release --example restart_in_place --features actix-web`).
fn shipped_example() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().unwrap();
    profile.join("examples").join("restart_in_place")
}

/// A server of `variant` on `port` under `base`: the child and its pid.
fn start(variant: &str, base: &std::path::Path, port: u16) -> Child {
    let mut command = if variant == "in-place" {
        let mut command = Command::new(shipped_example());
        command
            .arg("--dir")
            .arg(base.join("run"))
            .args(["--addr", &format!("127.0.0.1:{port}")]);
        command
    } else {
        let mut command = Command::new(std::env::current_exe().unwrap());
        command.args([
            "--serve",
            variant,
            base.to_str().unwrap(),
            &port.to_string(),
        ]);
        command
    };
    let child = command
        .env(
            "RUST_LOG",
            std::env::var("SERVER_LOG").unwrap_or_else(|_| "error".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(1));
    }
    child
}

/// `planned-stop stop --pid PID --dir BASE/run --wait 60 --json` and `extra`; the answer.
fn stopper(base: &std::path::Path, pid: u32, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(common::planned_stop_binary())
        .args(["stop", "--pid", &pid.to_string(), "--dir"])
        .arg(base.join("run"))
        .args(["--wait", "60", "--json"])
        .args(extra)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_default()
}

/// One restart of `variant` whose current process is `pid` (and `child`, when this harness
/// started it); returns the process serving afterwards.
fn restart(
    variant: &str,
    base: &std::path::Path,
    port: u16,
    pid: u32,
    child: Option<Child>,
) -> (u32, Option<Child>) {
    match variant {
        "in-place" | "in-place-bare" => {
            let answer = stopper(base, pid, &["--restart"]);
            let successor = answer["successor"].as_u64().expect("a successor") as u32;
            if let Some(mut child) = child {
                let _ = child.wait();
            }
            (successor, None)
        }
        "exit-75" => {
            let answer = stopper(base, pid, &["--restart"]);
            assert_eq!(answer["exit_code"], 75, "{answer}");
            if let Some(mut child) = child {
                let _ = child.wait();
            }
            let next = start(variant, base, port);
            (next.id(), Some(next))
        }
        _ => {
            // SAFETY: kill(2) of this harness's own child.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
            if let Some(mut child) = child {
                let _ = child.wait();
            }
            let next = start(variant, base, port);
            (next.id(), Some(next))
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn measure(variant: &str, restarts: usize, fresh_clients: usize, pool: usize) {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let first = start(variant, base, port);
    let (mut pid, mut child) = (first.id(), Some(first));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for i in 0..fresh_clients + pool {
        let (tally, stop) = (tally.clone(), stop.clone());
        load.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if i < fresh_clients {
                    fresh(port, &tally);
                } else {
                    pooled(port, &tally, &stop);
                }
            }
        }));
    }
    let started = Instant::now();
    let mut times = Vec::new();
    for _ in 0..restarts {
        std::thread::sleep(Duration::from_millis(50));
        let began = Instant::now();
        let old = pid;
        (pid, child) = restart(variant, base, port, pid, child.take());
        times.push(began.elapsed());
        if began.elapsed() > Duration::from_millis(500) {
            eprintln!(
                "slow restart of {old} -> {pid}: {:?}, ended at {}",
                began.elapsed(),
                chrono::Utc::now()
            );
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    for l in load {
        let _ = l.join();
    }
    let secs = started.elapsed().as_secs_f64();
    // SAFETY: kill(2) of the last server, started by this harness or by its predecessor.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    if let Some(mut child) = child {
        let _ = child.wait();
    }
    times.sort();
    let t = tally.lock().unwrap().clone();
    println!(
        "| {variant} | {restarts} | {:.0} | {} | {} | {} | {} | {} | {:.0} ms | {:.0} ms |",
        t.ok as f64 / secs,
        t.ok,
        t.not_200,
        t.refused,
        t.reset_new,
        t.lost_pooled,
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
    );
}

fn main() {
    let args: Vec<String> = common::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve") {
        let port = args[3].parse().unwrap();
        let _ = serve(&args[1], &args[2], port);
        return;
    }
    let arg =
        |i: usize, default: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let (restarts, fresh_clients, pool) = (arg(0, 100), arg(1, 16), arg(2, 16));
    println!(
        "| variant | restarts | 200/s | answered 200 | not 200 | refused | reset (new) | lost (pooled) | restart p50 | restart p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let only = std::env::var("ONLY").ok();
    for variant in ["in-place", "in-place-bare", "exit-75", "plain"] {
        if only.as_deref().is_some_and(|o| o != variant) {
            continue;
        }
        measure(variant, restarts, fresh_clients, pool);
    }
}

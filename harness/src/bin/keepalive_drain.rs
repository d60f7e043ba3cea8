//! Pooled keep-alive clients during a stop: how many requests written to a connection are lost
//! because the server closed it, with planned-stop and with plain actix-web, side by side.
//!
//! ```sh
//! cargo run --release -p planned-stop-harness --bin keepalive_drain -- [ROUNDS] [CONNECTIONS] [GRACE_MS]
//! ```
//!
//! A client that behaves like a load balancer's connection pool: CONNECTIONS (default 16)
//! persistent HTTP/1.1 connections, each sending `GET /work` back to back after a random idle gap
//! (0–20 ms on three connections of four, 0–200 ms on the fourth, 1–3 s on the last one, which
//! may sleep through the whole grace), reconnecting when the server
//! closes the connection (and, as pools do, looking before reuse whether the server closed an idle
//! one), and never looking at readiness (the worst case: a balancer that has not
//! noticed yet). The pool comes in two kinds: one that writes on a pooled connection without
//! looking, and one that first looks whether the server closed it while it was idle (hyper's and
//! nginx's pools do). Each round starts a server (this example re-run as a child process) for each
//! server kind with each pool kind, loads it for 1.5 s, stops it and keeps loading until it has
//! exited. The server kinds:
//!
//! - `planned-stop`: `planned_stop::web::serve` with a grace (GRACE_MS, default 5 s: actix-web's
//!   keep-alive timeout) and `CloseWhenStopping`, stopped
//!   by a marker as `planned-stop stop` writes one;
//! - `actix-web`: a plain `HttpServer` with its own signal handling, stopped by SIGTERM (its
//!   graceful shutdown).
//!
//! Counted per variant: requests answered; requests **lost after being written** to a pooled
//! connection (one that had carried an answered request; the connection ended without a
//! response); first requests reset on a new connection (still in the accept queue when the
//! listener closed: never accepted, retried by a balancer like a refused connect); responses that
//! said `Connection: close`; refused connects (the listener was closed: a balancer routes those
//! elsewhere, nothing was lost); latency p50/p99 before the stop and during it; stop to exit.
//! docs/performance.md has the figures.

use planned_stop_harness as common;

use actix_web::{App, HttpServer, get};
use planned_stop::marker::MarkerStore;
use planned_stop::stopper::{self, StopOptions};
use planned_stop::{Layout, ServiceBuilder};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[get("/work")]
async fn work() -> &'static str {
    actix::clock::sleep(Duration::from_millis(1)).await;
    "done"
}

/// The server, as `planned` (planned-stop) or `plain` (actix-web alone).
fn serve(variant: &str, base: &str) -> std::io::Result<std::process::ExitCode> {
    let base = std::path::PathBuf::from(base);
    actix_web::rt::System::new().block_on(async {
        if variant == "plain" {
            let server = HttpServer::new(|| App::new().service(work))
                .workers(2)
                .bind(("127.0.0.1", 0))?;
            println!("listening {}", server.addrs()[0].port());
            std::io::stdout().flush()?;
            server.run().await?;
            return Ok(std::process::ExitCode::SUCCESS);
        }
        let stop = ServiceBuilder::new(Layout::Slots(base.join("run")))
            .phase_deadline(planned_stop::DrainPhase::Ingress, Duration::from_secs(10))
            .start()
            .map_err(std::io::Error::other)?;
        let ready = stop.clone();
        let server = HttpServer::new(move || {
            App::new()
                .wrap(planned_stop::web::CloseWhenStopping::new(&ready))
                .service(planned_stop::web::readiness("/ready", &ready))
                .service(work)
        })
        .workers(2)
        .bind(("127.0.0.1", 0))?;
        println!("listening {}", server.addrs()[0].port());
        std::io::stdout().flush()?;
        stop.ready();
        planned_stop::web::serve(server, &stop)
            .grace(Duration::from_millis(
                std::env::var("KEEPALIVE_GRACE_MS")
                    .ok()
                    .and_then(|g| g.parse().ok())
                    .unwrap_or(5000),
            ))
            .await
    })
}

/// What one connection saw.
#[derive(Default)]
struct Tally {
    before: Vec<Duration>,
    during: Vec<Duration>,
    /// Lost on a connection that had already carried an answered request (a pooled one).
    lost: u64,
    /// Reset with no answer on a new connection's first request: most likely still in the
    /// kernel's accept queue when the listener closed, never accepted by the server (a balancer
    /// retries those, as it does refused connects).
    reset_new: u64,
    close_headers: u64,
    /// Pooled connections found closed by the server before reuse (a pool checks, as hyper's and
    /// nginx's do): nothing was written to them.
    closed_idle: u64,
    refused: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.before.extend(other.before);
        self.during.extend(other.during);
        self.lost += other.lost;
        self.reset_new += other.reset_new;
        self.close_headers += other.close_headers;
        self.closed_idle += other.closed_idle;
        self.refused += other.refused;
    }
}

/// How one request on a kept-alive connection ended.
enum Exchange {
    Answered {
        close: bool,
    },
    /// Written, then the connection ended without a (complete) response.
    Lost,
    /// Could not be written: the connection was already gone (nothing was sent).
    NotWritten,
}

fn exchange(stream: &mut BufReader<TcpStream>) -> Exchange {
    if stream
        .get_mut()
        .write_all(b"GET /work HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return Exchange::NotWritten;
    }
    let mut line = String::new();
    if !matches!(stream.read_line(&mut line), Ok(n) if n > 0) || !line.starts_with("HTTP/1.1") {
        return Exchange::Lost;
    }
    let (mut close, mut length) = (false, 0usize);
    loop {
        line.clear();
        if !matches!(stream.read_line(&mut line), Ok(n) if n > 0) {
            return Exchange::Lost;
        }
        let header = line.trim_end().to_ascii_lowercase();
        if header.is_empty() {
            break;
        }
        if let Some(value) = header.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        }
        close |= header == "connection: close";
    }
    let mut body = vec![0; length];
    if stream.read_exact(&mut body).is_err() {
        return Exchange::Lost;
    }
    Exchange::Answered { close }
}

/// One pooled connection's life through a round, until `exited`.
fn connection(
    port: u16,
    (min_gap_ms, max_gap_ms): (u64, u64),
    seed: u64,
    checks: bool,
    stopping: &AtomicBool,
    exited: &AtomicBool,
) -> Tally {
    let mut tally = Tally::default();
    let mut rng = seed | 1;
    let mut next = move |below: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (rng >> 33) % below.max(1)
    };
    let mut stream: Option<BufReader<TcpStream>> = None;
    // Whether the connection has carried an answered request.
    let mut reused = false;
    while !exited.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(
            min_gap_ms + next(max_gap_ms - min_gap_ms + 1),
        ));
        // Before reusing a pooled connection, look whether the server closed it meanwhile.
        if checks
            && stream
                .as_ref()
                .is_some_and(|conn| closed_by_peer(conn.get_ref()))
        {
            tally.closed_idle += 1;
            stream = None;
        }
        let conn = match stream.as_mut() {
            Some(conn) => conn,
            None => match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
                    reused = false;
                    stream.insert(BufReader::new(s))
                }
                Err(_) => {
                    tally.refused += 1;
                    continue;
                }
            },
        };
        let during = stopping.load(Ordering::Relaxed);
        let started = Instant::now();
        match exchange(conn) {
            Exchange::Answered { close } => {
                let took = started.elapsed();
                if during {
                    tally.during.push(took);
                } else {
                    tally.before.push(took);
                }
                reused = true;
                if close {
                    tally.close_headers += 1;
                    stream = None;
                }
            }
            Exchange::Lost => {
                if reused {
                    tally.lost += 1;
                } else {
                    tally.reset_new += 1;
                }
                stream = None;
            }
            Exchange::NotWritten => stream = None,
        }
    }
    tally
}

/// Whether the server has closed `stream` (an EOF is waiting), without blocking.
fn closed_by_peer(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let mut byte = [0u8; 1];
    let closed =
        !matches!(stream.peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
    let _ = stream.set_nonblocking(false);
    closed
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// The planned-stop server's grace (the third argument, in ms; default 5,000).
static GRACE_MS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();

fn start(variant: &str, base: &std::path::Path) -> std::io::Result<(Child, u16)> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", variant, base.to_str().unwrap_or(".")])
        .env(
            "KEEPALIVE_GRACE_MS",
            GRACE_MS.get().unwrap_or(&5000).to_string(),
        )
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let port = loop {
        let line = lines.next().expect("the server printed its port")?;
        if let Some(port) = line.strip_prefix("listening ") {
            break port.parse().expect("a port");
        }
    };
    Ok((child, port))
}

/// One round of `variant`: its tally, the load before the stop (requests/s) and stop to exit.
fn round(
    variant: &str,
    checks: bool,
    connections: usize,
    seed: u64,
) -> std::io::Result<(Tally, f64, Duration)> {
    let base = tempfile::tempdir()?;
    let (mut child, port) = start(variant, base.path())?;
    let stopping = Arc::new(AtomicBool::new(false));
    let exited = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let threads: Vec<_> = (0..connections)
        .map(|k| {
            let (stopping, exited, tally) = (stopping.clone(), exited.clone(), tally.clone());
            // Three of four connections busy, the fourth slower, and the last idle for longer
            // than the grace at times (it may sleep through the whole of it).
            let gaps = match k {
                _ if k + 1 == connections && connections > 1 => (1_000, 3_000),
                _ if k % 4 == 3 => (0, 200),
                _ => (0, 20),
            };
            std::thread::spawn(move || {
                let seed = seed ^ (k as u64) << 17;
                let mine = connection(port, gaps, seed, checks, &stopping, &exited);
                tally.lock().expect("tally").add(mine);
            })
        })
        .collect();
    let load = Duration::from_millis(1500);
    std::thread::sleep(load);
    let stop_at = Instant::now();
    stopping.store(true, Ordering::Relaxed);
    if variant == "plain" {
        // SAFETY: kill(2) on our own child, which is alive (not yet waited for).
        #[cfg(unix)]
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM)
        };
        // actix-web's own graceful shutdown starts at SIGTERM: the comparison is Unix-only.
        #[cfg(not(unix))]
        return Err(std::io::Error::other(
            "the actix-web side is stopped by SIGTERM: run this harness on Unix",
        ));
    } else {
        let store = MarkerStore::open(Layout::Slots(base.path().join("run")))
            .map_err(std::io::Error::other)?;
        stopper::request(&store, child.id(), &StopOptions::new()).map_err(std::io::Error::other)?;
    }
    child.wait()?;
    let stop_to_exit = stop_at.elapsed();
    exited.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let tally = std::mem::take(&mut *tally.lock().expect("tally"));
    let rate = tally.before.len() as f64 / load.as_secs_f64();
    Ok((tally, rate, stop_to_exit))
}

fn main() -> std::io::Result<()> {
    let args: Vec<String> = common::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        serve(&args[2], &args[3])?;
        return Ok(());
    }
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(20);
    let connections: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(16);
    let grace_ms: u64 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(5000);
    GRACE_MS.get_or_init(|| grace_ms);
    // Each server with each pool: one that writes on a pooled connection without looking, and
    // one that looks first whether the server closed it (hyper's and nginx's pools do).
    let variants = [
        ("planned-stop", "planned", false),
        ("actix-web", "plain", false),
        ("planned-stop, pool checks before reuse", "planned", true),
        ("actix-web, pool checks before reuse", "plain", true),
    ];
    let mut totals: Vec<(Tally, Vec<f64>, Vec<Duration>)> = variants
        .iter()
        .map(|_| (Tally::default(), Vec::new(), Vec::new()))
        .collect();
    for r in 0..rounds {
        for (v, (name, variant, checks)) in variants.iter().enumerate() {
            let (tally, rate, stop_to_exit) = round(variant, *checks, connections, r as u64 + 1)?;
            eprintln!(
                "round {r} {name}: lost {} reset-new {} closed-idle {} close {} refused {} ({rate:.0} req/s, exit after {:.2} s)",
                tally.lost,
                tally.reset_new,
                tally.closed_idle,
                tally.close_headers,
                tally.refused,
                stop_to_exit.as_secs_f64()
            );
            totals[v].0.add(tally);
            totals[v].1.push(rate);
            totals[v].2.push(stop_to_exit);
        }
    }
    println!(
        "{rounds} stops per variant, {connections} pooled keep-alive connections, planned-stop grace {grace_ms} ms"
    );
    println!(
        "| variant | answered | lost after written (pooled connection) | reset on a new connection | closed while idle (seen before reuse) | `Connection: close` | refused connects | load before (req/s) | p50 / p99 before (ms) | p50 / p99 during (ms) | stop to exit p50 / max (s) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for ((name, _, _), (tally, rates, exits)) in variants.iter().zip(totals.iter_mut()) {
        tally.before.sort();
        tally.during.sort();
        exits.sort();
        let rate = rates.iter().sum::<f64>() / rates.len().max(1) as f64;
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} | {rate:.0} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |",
            tally.before.len() + tally.during.len(),
            tally.lost,
            tally.reset_new,
            tally.closed_idle,
            tally.close_headers,
            tally.refused,
            percentile(&tally.before, 0.5),
            percentile(&tally.before, 0.99),
            percentile(&tally.during, 0.5),
            percentile(&tally.during, 0.99),
            exits[exits.len() / 2].as_secs_f64(),
            exits.last().map_or(0.0, Duration::as_secs_f64),
        );
    }
    Ok(())
}

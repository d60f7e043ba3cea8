//! A helper program of `tests/web.rs` (not a test, not an example for users): an actix-web
//! application whose `main` is written in the layout its first argument names
//! (`web_layouts.rs`), serving jobs spawned as tasks, a WebSocket, server-sent events, readiness
//! and status and a slow endpoint, with a work participant that answers after `JOBS_MS`. It says
//! `listening PORT` on stdout once it serves; the test stops it and reads what it answered.

mod program;
mod web_shared;

use planned_stop::{Drain, DrainPhase, DrainReport, Layout, ServiceBuilder};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;
use web_shared::{AppLayout, Job};

/// Hands back one typed job, after `0` of work.
struct Jobs(Duration);

impl actix::Actor for Jobs {
    type Context = actix::Context<Self>;
}

impl actix::Handler<Drain> for Jobs {
    type Result = actix::ResponseFuture<DrainReport>;
    fn handle(&mut self, _: Drain, _: &mut actix::Context<Self>) -> Self::Result {
        let work = self.0;
        Box::pin(async move {
            actix::clock::sleep(work).await;
            DrainReport::unfinished([Job {
                name: "job-1".into(),
            }])
        })
    }
}

#[actix_web::get("/slow")]
async fn slow_endpoint() -> &'static str {
    println!("slow-started");
    actix::clock::sleep(Duration::from_secs(2)).await;
    "slow done"
}

/// A WebSocket endpoint on actix-web's own WebSocket support (actix-ws): told to go away at a stop.
async fn ws_endpoint(
    req: actix_web::HttpRequest,
    body: actix_web::web::Payload,
    sockets: actix_web::web::Data<planned_stop::web::LongLived>,
) -> actix_web::Result<actix_web::HttpResponse> {
    let (response, session, mut messages) = actix_ws::handle(&req, body)?;
    let mut connection = sockets.open();
    actix_web::rt::spawn(async move {
        tokio::select! {
            _ = connection.going_away() => {
                planned_stop::web::close_going_away(session, connection).await
            }
            _ = async { while let Some(Ok(_)) = messages.recv().await {} } => {}
        }
    });
    Ok(response)
}

/// The SSE streams' registry (a type of its own, apart from the WebSocket one in `app_data`).
#[derive(Clone)]
struct SseStreams(planned_stop::web::LongLived);

/// A Server-Sent Events stream: one event at once, then, at a stop, a last event and its end.
struct Sse {
    hello: bool,
    waiting: Option<
        std::pin::Pin<
            Box<dyn std::future::Future<Output = planned_stop::web::LongLivedConnection>>,
        >,
    >,
}

impl actix_web::body::MessageBody for Sse {
    type Error = std::convert::Infallible;

    fn size(&self) -> actix_web::body::BodySize {
        actix_web::body::BodySize::Stream
    }

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<actix_web::web::Bytes, Self::Error>>> {
        use std::task::Poll;
        if !self.hello {
            self.hello = true;
            return Poll::Ready(Some(Ok(actix_web::web::Bytes::from_static(
                b"data: hello\n\n",
            ))));
        }
        let Some(waiting) = self.waiting.as_mut() else {
            return Poll::Ready(None);
        };
        match waiting.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(connection) => {
                self.waiting = None;
                connection.closed_for_stop();
                Poll::Ready(Some(Ok(actix_web::web::Bytes::from_static(
                    b"event: bye\ndata: the server is stopping\n\n",
                ))))
            }
        }
    }
}

async fn sse_endpoint(streams: actix_web::web::Data<SseStreams>) -> actix_web::HttpResponse {
    let mut connection = streams.0.open();
    let waiting = Box::pin(async move {
        connection.going_away().await;
        connection
    });
    actix_web::HttpResponse::Ok()
        .content_type("text/event-stream")
        .body(Sse {
            hello: false,
            waiting: Some(waiting),
        })
}

/// Stops the actix `System` from a handler, as an application might to shut itself down.
#[actix_web::get("/quit")]
async fn quit_endpoint() -> &'static str {
    actix::System::current().stop();
    "stopping"
}

/// Spawns a job into the application's task group from a request handler: it
/// sleeps `ms`, then is done (`finish`: it ignores the cancellation, so the drain waits for it)
/// or, told to stop first, unfinished (`yield`). It prints `task-done NAME` when done.
#[actix_web::get("/spawn/{name}/{ms}/{mode}")]
async fn spawn_endpoint(
    path: actix_web::web::Path<(String, u64, String)>,
    tasks: actix_web::web::Data<planned_stop::TaskGroup<Task>>,
) -> actix_web::HttpResponse {
    let (name, ms, mode) = path.into_inner();
    let task = Task {
        name,
        ms,
        yields: mode == "yield",
    };
    match tasks.spawn(task) {
        Ok(_) => actix_web::HttpResponse::Accepted().body("spawned"),
        Err(refused) => actix_web::HttpResponse::ServiceUnavailable().body(refused.to_string()),
    }
}

/// A job of the task group: what `/spawn` asked for.
#[derive(serde::Serialize, serde::Deserialize)]
struct Task {
    name: String,
    ms: u64,
    /// Whether it stops when told to (else it ignores the cancellation).
    yields: bool,
}

/// The task group's work: sleeps, then is done, unless it yields to a stop first.
async fn run_task(task: Task, stop: planned_stop::CancellationToken) -> planned_stop::JobEnd {
    let work = actix::clock::sleep(Duration::from_millis(task.ms));
    if task.yields {
        tokio::select! {
            _ = stop.cancelled() => return planned_stop::JobEnd::Unfinished,
            _ = work => {}
        }
    } else {
        work.await;
    }
    println!("task-done {}", task.name);
    std::io::stdout().flush().unwrap();
    planned_stop::JobEnd::Done
}

#[actix_web::get("/")]
async fn hello_endpoint() -> &'static str {
    "hello"
}

fn env_ms(name: &str) -> Option<Duration> {
    std::env::var(name)
        .ok()?
        .parse()
        .ok()
        .map(Duration::from_millis)
}

/// The application: its `main` in the layout the first argument names.
fn main() -> std::io::Result<()> {
    let role = std::env::args().nth(1).unwrap_or_default();
    let Some(layout) = AppLayout::of_role(&role) else {
        panic!("no such layout: {role:?}");
    };
    let app = HelperApp {
        layout,
        base: PathBuf::from(std::env::var("BASE").unwrap()),
        grace: env_ms("GRACE_MS").unwrap_or_default(),
        ingress: env_ms("INGRESS_MS"),
        jobs: env_ms("JOBS_MS").unwrap_or_default(),
        ready_after: env_ms("READY_MS").unwrap_or_default(),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    program::give_up_after_helper_lifetime();
    let code: i32 = match layout {
        AppLayout::RunWithCode => app.run_with_code(),
        AppLayout::ActixMain => app.actix_main(),
        AppLayout::ActixWebMain => app.actix_web_main(),
        AppLayout::ActixMainReturnsEarly => actix::System::new().block_on(async {
            let stop = app.start();
            stop.ready();
            announce(0);
            0 // the mistake: returns "success" without awaiting stop.stopped()
        }),
        AppLayout::OwnServerBlockOn | AppLayout::NotOwnedNeverEnds => {
            app.own_server_block_on().unwrap();
            return Ok(()); // exit 0 as far as main is concerned
        }
        AppLayout::ServeThenOk => {
            app.serve_then_ok().unwrap();
            return Ok(());
        }
        AppLayout::ErrAfterStart => {
            // The newcomer's mistake: main's own error, after the service started.
            return actix_web::rt::System::new().block_on(async {
                let stop = app.start();
                stop.ready();
                announce(0);
                Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    "the application's own bind failed",
                ))
            });
        }
        AppLayout::PanicsAfterStop => {
            actix_web::rt::System::new().block_on(async {
                let stop = app.start();
                let (http, port) = app_server(&stop);
                announce(port);
                stop.ready();
                let _ = planned_stop::web::serve(http, &stop).grace(app.grace).await;
            });
            panic!("main panics after the stop");
        }
        AppLayout::PanicsAtOnce => {
            actix::System::new().block_on(async {
                let stop = app.start();
                stop.ready();
                announce(0);
                panic!("main panics before any stop");
            });
            return Ok(());
        }
        AppLayout::OwnServerWithSignals => app.own_server_with_signals(),
    };
    std::process::exit(code);
}

/// What the helper application is told by its environment.
struct HelperApp {
    layout: AppLayout,
    base: PathBuf,
    grace: Duration,
    ingress: Option<Duration>,
    jobs: Duration,
    ready_after: Duration,
}

impl HelperApp {
    /// The planned stop, with a jobs participant whose jobs last `jobs`.
    fn start(&self) -> planned_stop::ServiceHandle {
        use actix::Actor;
        let mut builder = ServiceBuilder::new(Layout::Slots(self.base.join("run")))
            .state_dir(self.base.join("state"))
            .drain_deadline(Duration::from_secs(10))
            .owns_process_exit(self.layout != AppLayout::NotOwnedNeverEnds)
            // Short, so the layouts whose main never returns by itself end quickly.
            .exit_grace(Duration::from_millis(300))
            .participant("jobs", Jobs(self.jobs).start().recipient());
        if let Some(ms) = self.ingress {
            builder = builder.phase_deadline(DrainPhase::Ingress, ms);
        }
        builder.start().unwrap()
    }

    /// Starts the stop and the server, serving in a task of its own, and says it is ready:
    /// what the layouts whose `main` does not await `serve` share. Inside the `System`.
    fn serve_in_background(&self) -> planned_stop::ServiceHandle {
        let stop = self.start();
        let (http, port) = app_server(&stop);
        let serving = planned_stop::web::serve(http, &stop).grace(self.grace);
        actix::spawn(async move {
            let _ = serving.await;
        });
        stop.ready();
        announce(port);
        stop
    }

    /// `System::run_with_code` after serving from a `block_on`.
    fn run_with_code(&self) -> i32 {
        let system = actix::System::new();
        system.block_on(async {
            self.serve_in_background();
        });
        system.run_with_code().unwrap()
    }

    /// `#[actix::main]`: serving spawned, `main` awaits `stopped()`.
    fn actix_main(&self) -> i32 {
        actix::System::new().block_on(async {
            let stop = self.serve_in_background();
            program::code_of(stop.stopped().await)
        })
    }

    /// `#[actix_web::main]`: `main` awaits `serve`; ready `ready_after` later.
    fn actix_web_main(&self) -> i32 {
        actix_web::rt::System::new().block_on(async {
            let stop = self.start();
            let (http, port) = app_server(&stop);
            announce(port);
            let later = stop.clone();
            let ready_after = self.ready_after;
            actix::spawn(async move {
                actix::clock::sleep(ready_after).await;
                later.ready();
            });
            let code = planned_stop::web::serve(http, &stop)
                .grace(self.grace)
                .await
                .unwrap();
            program::code_of(code)
        })
    }

    /// What `#[actix_web::main] async fn main() -> io::Result<()>` expands to, the server run
    /// by the application itself.
    fn own_server_block_on(&self) -> std::io::Result<()> {
        use actix_web::{App, HttpServer};
        actix_web::rt::System::new().block_on(async {
            let stop = self.start();
            let http =
                HttpServer::new(|| App::new().service(hello_endpoint).service(quit_endpoint))
                    .workers(1)
                    .bind(("127.0.0.1", 0))?;
            announce(http.addrs()[0].port());
            stop.ready();
            http.run().await
        })
    }

    /// `serve` wrapped in the application's own function, `main` returning `Ok(())`.
    fn serve_then_ok(&self) -> std::io::Result<()> {
        actix_web::rt::System::new().block_on(async {
            let stop = self.start();
            let (http, port) = app_server(&stop);
            announce(port);
            stop.ready();
            // Wrapped in the application's own function: one bound to name.
            fn run_app(
                server: impl planned_stop::web::Servable,
                stop: &planned_stop::ServiceHandle,
                grace: Duration,
            ) -> planned_stop::web::Serve {
                planned_stop::web::serve(server, stop).grace(grace)
            }
            run_app(http, &stop, self.grace).await?;
            Ok(())
        })
    }

    /// A server not handed to planned_stop: actix-server handles SIGTERM itself and stops the
    /// System with 0.
    fn own_server_with_signals(&self) -> i32 {
        use actix_web::{App, HttpServer};
        let system = actix::System::new();
        system.block_on(async {
            let stop = self.start();
            let http = HttpServer::new(|| App::new().service(hello_endpoint))
                .workers(1)
                .bind(("127.0.0.1", 0))
                .unwrap();
            let port = http.addrs()[0].port();
            actix::spawn(http.run());
            stop.ready();
            announce(port);
        });
        system.run_with_code().unwrap()
    }
}

/// The application's server: jobs spawned as tasks, a WebSocket, server-sent events, readiness
/// and status, a slow endpoint; HTTP/2 with prior knowledge too when `H2C` is set.
fn app_server(stop: &planned_stop::ServiceHandle) -> (impl planned_stop::web::Servable, u16) {
    use actix_web::{App, HttpServer};
    let ready = stop.clone();
    let sockets = planned_stop::web::LongLived::new("websocket");
    sockets.join(stop);
    let streams = SseStreams(planned_stop::web::LongLived::new("sse"));
    streams.0.join(stop);
    let tasks = planned_stop::TaskGroup::new(stop, "tasks", run_task);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(actix_web::web::Data::new(tasks.clone()))
            .service(spawn_endpoint)
            .app_data(actix_web::web::Data::new(sockets.clone()))
            .route("/ws", actix_web::web::get().to(ws_endpoint))
            .app_data(actix_web::web::Data::new(streams.clone()))
            .route("/sse", actix_web::web::get().to(sse_endpoint))
            .wrap(planned_stop::web::CloseWhenStopping::new(&ready))
            .service(planned_stop::web::readiness("/ready", &ready))
            .service(planned_stop::web::status("/status", &ready))
            .service(slow_endpoint)
            .service(hello_endpoint)
            .service(quit_endpoint)
    })
    .workers(1);
    // `H2C` set: HTTP/1.1 and HTTP/2 with prior knowledge on the one port.
    let server = if std::env::var_os("H2C").is_some() {
        server.bind_auto_h2c(("127.0.0.1", 0)).unwrap()
    } else {
        server.bind(("127.0.0.1", 0)).unwrap()
    };
    let port = server.addrs()[0].port();
    (server, port)
}

/// Tells the test the port the application listens on.
fn announce(port: u16) {
    println!("listening {port}");
    std::io::stdout().flush().unwrap();
}

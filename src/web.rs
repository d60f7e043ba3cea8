//! actix-web integration (feature `actix-web`): planned stops that hold in a real web application.
//!
//! Why this exists: an `HttpServer` left to itself handles SIGTERM and SIGINT on its own and then
//! stops the whole actix `System` with exit code 0, before the runner has decided whether the stop
//! was planned; and the usual `#[actix_web::main]` layout returns from `main` (exit 0) as soon as
//! the server future ends, whatever the runner decided. Neither may happen here.
//!
//! [`serve`] takes the application's `HttpServer` (bound, not yet running) and:
//!
//! - turns the server's own signal handling off, so the runner alone decides what a signal means;
//! - registers the server as the **ingress** drain participant ([`DrainPhase::Ingress`]), which
//!   on a stop keeps the listener open for an optional grace period while [`readiness`] already
//!   answers 503 (so a load balancer or Kubernetes endpoints stop routing to it), then closes the
//!   listener and lets in-flight requests finish within the phase's deadline; requests still
//!   running at the deadline are cut and reported in the stop record's notes;
//! - with the `App` built by [`app`] (which carries [`CloseWhenStopping`]), answers every request
//!   from the moment the stop is accepted with `Connection: close`, so pooled keep-alive
//!   connections of load balancers and proxies are retired cleanly during the grace; a served
//!   `App` without it is a WARN at the stop;
//! - returns a future that `main` awaits: it resolves once the runner has stopped, to the exit
//!   code of its verdict, so a planned stop ends the process with 0 and anything else does not.
//!
//! [`readiness`], [`status`] and [`CloseWhenStopping`] only tell the truth under [`serve`]: mounted
//! in an `App` whose server runs without it, the service logs one WARN (at `ready()`, or when the
//! `App` is built, whichever is later) naming what to do. [`Admin`] serves readiness, status and
//! metrics on an address and a `System` of their own, which answer through the whole drain and
//! until the process ends, so the stop's last numbers can be scraped.
//!
//! ```no_run
//! use actix_web::{HttpServer, get};
//! use planned_stop::{Layout, ServiceBuilder};
//!
//! #[get("/")]
//! async fn hello() -> &'static str {
//!     "hello"
//! }
//!
//! #[actix_web::main]
//! async fn main() -> std::io::Result<std::process::ExitCode> {
//!     let stop = ServiceBuilder::new(Layout::Slots("/run/app".into()))
//!         .state_dir("/var/lib/app")
//!         .start()
//!         .map_err(std::io::Error::other)?;
//!     let ready = stop.clone();
//!     let server = HttpServer::new(move || {
//!         planned_stop::web::app(&ready)
//!             .service(planned_stop::web::readiness("/ready", &ready))
//!             .service(hello)
//!     })
//!     .bind(("127.0.0.1", 8080))?;
//!     stop.ready();
//!     planned_stop::web::serve(server, &stop)
//!         .grace(std::time::Duration::from_secs(5))
//!         .await
//! }
//! ```

mod admin;
mod close;
mod listen;

pub use admin::{Admin, AdminServer};
pub use close::CloseWhenStopping;
pub use listen::{inherited_listeners, listeners_or_bind};

use crate::error_chain::ErrorChain;
use crate::lifecycle::DrainPhase;
use crate::lifecycle::ProcessState;
use crate::runner::{Drain, DrainReport};
use crate::service::ServiceHandle;
use actix::prelude::*;
use actix_http::Request;
use actix_service::IntoServiceFactory;
use actix_web::body::MessageBody;
use actix_web::dev::{
    AppConfig, Response, Server, ServerHandle, Service, ServiceFactory, ServiceRequest,
    ServiceResponse,
};
use actix_web::{HttpResponse, HttpServer, Resource};
use std::future::{Future, IntoFuture};
use std::io;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

/// The name the HTTP server has in the stop record and the logs.
pub const INGRESS_NAME: &str = "http";

/// How long actix-server itself waits for workers on a graceful stop: long enough that the
/// ingress phase's own deadline is always what cuts requests, never actix-server's default 30 s.
const SERVER_SHUTDOWN_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

/// A readiness endpoint at `path`: `200 ready` while the runner is running, `503` with the state
/// (`starting`, `draining`, `stopped`) otherwise. Mount it in the `App` factory; it answers 503
/// from the moment a stop is accepted, during the grace period and until the listener closes.
///
/// ```no_run
/// # use actix_web::{App, HttpServer};
/// # fn f(stop: planned_stop::ServiceHandle) {
/// let server = HttpServer::new(move || {
///     App::new().service(planned_stop::web::readiness("/ready", &stop))
/// });
/// # }
/// ```
pub fn readiness(path: &str, service: &ServiceHandle) -> Resource {
    service.integration.mounted("planned_stop::web::readiness");
    readiness_resource(path, service)
}

/// [`readiness`] without noting that the application mounted it (the admin server's own).
fn readiness_resource(path: &str, service: &ServiceHandle) -> Resource {
    let status = service.subscribe();
    actix_web::web::resource(path).to(move || {
        let state = status.borrow().state;
        async move {
            match state {
                state if state.is_serving() => HttpResponse::Ok().body("ready"),
                other => HttpResponse::ServiceUnavailable().body(state_name(other)),
            }
        }
    })
}

/// A status endpoint at `path`: this process's planned-stop state as JSON, for a person or a
/// monitoring system looking at one instance — what `planned-stop status` shows of a process,
/// from inside it. Always `200`; readiness is [`readiness`]'s job.
///
/// ```json
/// {"pid": 4242, "start": 123456, "state": "draining", "verdict": "planned",
///  "drain_phase": "ingress", "exit_code": null, "items_held": ["a1b2-4242-…-000000"],
///  "outcome": {"phase": "draining", "request_id": "deploy-7", "…": "…"}}
/// ```
///
/// `state` is the [`ProcessState`] (`starting`, `held`, `running`, `handing_over`, `draining`,
/// then the outcome's final state); `verdict` `planned` or `unexpected` once a stop has latched
/// one, `null` before; `drain_phase` the phase running now (`ingress`, `work`, `final`), `null`
/// outside the drain; `exit_code` the final outcome's, `null` before; `items_held` the resume
/// items this process leased and has not acknowledged or released; `outcome` the acknowledgement
/// or final outcome a stopper reads from the outcome file, `null` before a stop.
///
/// ```no_run
/// # use actix_web::{App, HttpServer};
/// # fn f(stop: planned_stop::ServiceHandle) {
/// let server = HttpServer::new(move || {
///     App::new()
///         .service(planned_stop::web::readiness("/ready", &stop))
///         .service(planned_stop::web::status("/status", &stop))
/// });
/// # }
/// ```
pub fn status(path: &str, service: &ServiceHandle) -> Resource {
    service.integration.mounted("planned_stop::web::status");
    status_resource(path, service)
}

/// [`status`] without noting that the application mounted it (the admin server's own).
fn status_resource(path: &str, service: &ServiceHandle) -> Resource {
    let service = service.clone();
    actix_web::web::resource(path).to(move || {
        let body = status_json(&service);
        async move { HttpResponse::Ok().json(body) }
    })
}

/// The body of [`status`].
fn status_json(service: &ServiceHandle) -> serde_json::Value {
    let status = service.status();
    let own = service.identity();
    serde_json::json!({
        "pid": own.pid,
        "start": own.start,
        "state": status.state,
        "verdict": status.verdict,
        "drain_phase": status.drain_phase,
        "exit_code": status.exit_code(),
        "items_held": service.items_held(),
        "outcome": status.outcome.as_deref(),
    })
}

/// The body of a `503` from [`readiness`].
fn state_name(state: ProcessState) -> &'static str {
    match state {
        state if state.is_starting() => "starting",
        ProcessState::Draining => "draining",
        _ => "stopped",
    }
}

/// The application's `App`, to build on in the `HttpServer` factory instead of `App::new()`: it
/// carries [`CloseWhenStopping`], so a keep-alive connection is retired after its next answer
/// from the moment a stop (or the hand-over of a restart in place) is accepted, and none is cut
/// with a request on it. Add routes, services, data and middleware to it as to any `App`.
///
/// ```no_run
/// # use actix_web::{HttpServer, web};
/// # fn f(stop: planned_stop::ServiceHandle) {
/// let server = HttpServer::new(move || {
///     planned_stop::web::app(&stop).route("/", web::get().to(|| async { "hello" }))
/// });
/// # }
/// ```
pub fn app(
    service: &ServiceHandle,
) -> actix_web::App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<actix_web::body::BoxBody>,
        Error = actix_web::Error,
        InitError = (),
    > + use<>,
> {
    actix_web::App::new().wrap(CloseWhenStopping::new(service))
}

/// An `HttpServer` that [`serve`] can run: implemented for every `HttpServer` actix-web can run.
/// A function of the application that wraps `serve` names this one bound instead of copying
/// actix-web's ten (some of whose traits `actix_web::dev` does not re-export):
///
/// ```no_run
/// fn run(server: impl planned_stop::web::Servable, stop: &planned_stop::ServiceHandle) -> planned_stop::web::Serve {
///     planned_stop::web::serve(server, stop).grace(std::time::Duration::from_secs(5))
/// }
/// ```
pub trait Servable {
    /// The server, started with its own signal handling off (an error when it is not bound or
    /// there is no actix `System`). Called by [`serve`].
    fn start_under_runner(self) -> io::Result<Server>;
}

impl<F, I, S, B> Servable for HttpServer<F, I, S, B>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: std::fmt::Debug,
    S::Response: Into<Response<B>> + 'static,
    <S::Service as Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    fn start_under_runner(self) -> io::Result<Server> {
        if self.addrs().is_empty() {
            Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the HttpServer has no bound address: call bind() or listen() before \
                 planned_stop::web::serve",
            ))
        } else if System::try_current().is_none() {
            Err(io::Error::other(
                "planned_stop::web::serve must be called inside a running actix System \
                 (in main's async body)",
            ))
        } else {
            Ok(self
                .disable_signals()
                .shutdown_timeout(SERVER_SHUTDOWN_TIMEOUT_SECS)
                .run())
        }
    }
}

/// Runs `server` under the planned-stop runner of `service` (see the module docs); await what it
/// returns. Call it inside the actix `System` (in `main`'s async body).
///
/// The server must already be bound (`bind`, `listen`); an unbound one, or a call outside an
/// actix `System`, is an error when awaited, never a panic. The server's own signal handling is
/// turned off, and it becomes the ingress drain participant.
pub fn serve(server: impl Servable, service: &ServiceHandle) -> Serve {
    service.integration.served();
    let server = match listen::unused_inherited() {
        Some(handed) => Err(ignored_sockets(handed)),
        None => server.start_under_runner(),
    };
    Serve {
        server,
        service: service.clone(),
        grace: Duration::ZERO,
    }
}

/// The error (and ERROR line) of a server that ignores the sockets handed to this process.
fn ignored_sockets(handed: usize) -> io::Error {
    let e = io::Error::other(format!(
        "{handed} listening socket(s) were handed to this process (LISTEN_FDS) and the server \
             does not serve them: connections queued on them would wait for nobody; bind the \
             server through planned_stop::web::listeners_or_bind"
    ));
    tracing::error!(error = %e, "refusing to serve");
    e
}

/// An `HttpServer` running under the runner; `.await` it (see [`serve`]).
#[must_use = "the server is stopped by the runner only when this is awaited"]
pub struct Serve {
    server: io::Result<Server>,
    service: ServiceHandle,
    grace: Duration,
}

impl std::fmt::Debug for Serve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Serve")
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}

impl Serve {
    /// How long the listener stays open after a stop is accepted while readiness already says
    /// `draining`, so load balancers stop routing new requests before connections are refused.
    /// Counted within the ingress phase's deadline. Default 0.
    ///
    /// Make it at least the server's keep-alive timeout (actix-web's default 5 s): when the
    /// listener closes, actix-web closes the connections idle at that moment, and a pool that
    /// writes to one without looking loses that request. With the grace that long, every pooled
    /// connection has either carried a request during it (and been retired by
    /// [`CloseWhenStopping`]) or been closed by the keep-alive timer, as at any other time.
    ///
    /// A stop that hands over to the successor of a restart in place has no grace: the successor
    /// accepts from the same sockets, so this process stops accepting at once. It then waits for
    /// the connections it has, each retired by its next answer (with [`CloseWhenStopping`]) or
    /// closed by the keep-alive timer, for at most half of the ingress phase's deadline.
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }
}

impl IntoFuture for Serve {
    /// The exit code of the runner's verdict once it has stopped (0 after a planned stop); an
    /// error when the server could not run.
    type Output = io::Result<ExitCode>;
    type IntoFuture = Pin<Box<dyn Future<Output = io::Result<ExitCode>>>>;

    fn into_future(self) -> Self::IntoFuture {
        let Serve {
            server,
            service,
            grace,
        } = self;
        Box::pin(async move {
            let server = server?;
            let ingress = Ingress {
                server: server.handle(),
                grace,
                status: service.subscribe(),
                integration: service.integration.clone(),
                handover: service.handover.clone(),
            }
            .start();
            service.add_participant(DrainPhase::Ingress, INGRESS_NAME, ingress.recipient());
            let handle = server.handle();
            let running = actix::spawn(server);
            let code = service.stopped().await;
            // The ingress phase stopped the server; if the runner stopped without a drain (or
            // the server outlived it), stop it now so nothing keeps serving after the verdict.
            handle.stop(false).await;
            match running.await {
                Ok(Ok(())) => Ok(code),
                Ok(Err(e)) => {
                    tracing::error!(error = %ErrorChain(&e), "the HTTP server failed");
                    Err(e)
                }
                Err(e) => Err(io::Error::other(e)),
            }
        })
    }
}

/// How long the workers have to dispatch the connections already accepted, between the pause of
/// the accept loop and the graceful stop (dispatching takes microseconds; see `Ingress`), where
/// nothing says when they have.
const DISPATCH_SETTLE: Duration = Duration::from_millis(50);

/// How often a process that handed over counts the connections it still has.
const RETIRE_POLL: Duration = Duration::from_millis(10);

/// The HTTP server as the ingress drain participant.
struct Ingress {
    server: ServerHandle,
    grace: Duration,
    /// Whether the stop hands over to a successor (then there is no grace: see `handle`).
    status: tokio::sync::watch::Receiver<crate::RunnerStatus>,
    /// What the application's `App` mounted: whether it retires keep-alive connections.
    integration: std::sync::Arc<crate::service::integration::Integration>,
    /// The sockets handed over, whose connections this process counts after a hand-over.
    handover: std::sync::Arc<crate::handover::Handover>,
}

impl Actor for Ingress {
    type Context = Context<Self>;
}

impl Handler<Drain> for Ingress {
    type Result = ResponseFuture<DrainReport>;

    fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> Self::Result {
        let began = actix::clock::Instant::now();
        let server = self.server.clone();
        let keeps_connections = self.integration.keeps_connections();
        if keeps_connections {
            tracing::warn!(
                "the application's App does not retire its keep-alive connections at a stop: \
                 a connection idle when the listener closes is closed while its client may be \
                 writing the next request, which is lost (a 502 at a load balancer); build the \
                 App with planned_stop::web::app"
            );
        }
        // Handed over to a successor of a restart in place, which accepts from the same sockets
        // already: this process stops accepting at once, so every new connection reaches the
        // successor (its readiness says ready; this one's would say draining). The grace is for
        // load balancers that must stop routing to a process that goes away; here none does.
        let handed_over = self
            .status
            .borrow()
            .outcome
            .as_ref()
            .is_some_and(|o| o.successor.is_some());
        let grace = if handed_over {
            Duration::ZERO
        } else {
            self.grace.min(drain.within)
        };
        // After a hand-over nobody waits for this process: the connections it has are retired
        // one by one, each after its next answer (`Connection: close`), instead of being closed
        // idle while a client may be writing to one.
        let retire = (handed_over && !keeps_connections).then(|| self.handover.clone());
        Box::pin(async move {
            if !grace.is_zero() {
                tracing::info!(
                    grace_ms = grace.as_millis() as u64,
                    "readiness says draining; listener still open"
                );
                actix::clock::sleep(grace).await;
            }
            // Stop accepting first, and give the workers a moment to dispatch what the accept
            // thread queued for them: a worker that begins its graceful stop drops the
            // connections queued to it but not yet dispatched (actix-server's `Shutdown` state),
            // each a connection reset or closed without an answer. Paused, nothing new is queued;
            // connections keep waiting in the socket's own queue — for the next life, when the
            // socket is held by a supervisor (`listeners_or_bind`). After a hand-over, wait
            // instead until the connections are gone, which counts the queued ones too; half of
            // what is left at most: the rest is for the requests then in flight.
            server.pause().await;
            let left = drain.within.saturating_sub(began.elapsed());
            match retire {
                Some(handover) => connections_retired(handover, left / 2).await,
                None => actix::clock::sleep(DISPATCH_SETTLE.min(left)).await,
            }
            let left = drain.within.saturating_sub(began.elapsed());
            tracing::info!("closing the HTTP listener; finishing in-flight requests");
            match actix::clock::timeout(left, server.stop(true)).await {
                Ok(()) => DrainReport::done(),
                Err(_) => {
                    // Answer now, at the deadline; the forced stop finishes in the background.
                    actix::spawn(async move { server.stop(false).await });
                    DrainReport::done()
                        .with_cut_short("in-flight HTTP requests were cut at the ingress deadline")
                }
            }
        })
    }
}

/// Waits until this process has had no connection on the sockets it handed over for
/// `DISPATCH_SETTLE` in a row — each retired by its next answer, or closed by the server's
/// keep-alive timer — or until `bound` has passed. A connection queued to a worker counts too,
/// so none is dropped by the graceful stop that follows; the quiet spell is for the accept
/// thread, which may still accept a few after the pause (actix-server says nothing of when it
/// has paused), each then counted and retired in turn. Nothing announces a closed connection,
/// so it counts them every `RETIRE_POLL`, on a blocking thread.
async fn connections_retired(handover: std::sync::Arc<crate::handover::Handover>, bound: Duration) {
    let now = actix::clock::Instant::now;
    let until = now() + bound;
    let mut quiet_since = None;
    let mut said = false;
    loop {
        let counting = handover.clone();
        let open = tokio::task::spawn_blocking(move || counting.served_connections())
            .await
            .unwrap_or(0);
        if open == 0 {
            let since = *quiet_since.get_or_insert_with(now);
            if since.elapsed() >= DISPATCH_SETTLE {
                return;
            }
        } else {
            quiet_since = None;
        }
        if now() >= until {
            if open > 0 {
                tracing::info!(
                    open,
                    "closing the connections still open after the hand-over"
                );
            }
            return;
        }
        if open > 0 && !said {
            tracing::info!(
                open,
                "handed over: retiring each connection after its next answer"
            );
            said = true;
        }
        actix::clock::sleep(RETIRE_POLL).await;
    }
}

/// Long-lived connections — WebSocket sessions, Server-Sent Events streams — as one drain
/// participant of the ingress phase.
///
/// Why: a long-lived connection never finishes by itself, so a drain that only waits for
/// in-flight requests cuts it at the deadline with no word to the client. Registered here, each
/// connection learns the moment a stop is accepted ([`LongLivedConnection::going_away`]), says
/// goodbye — a WebSocket Close frame with 1001 (Going Away) through [`close_going_away`], or the
/// end of an SSE stream — and the drain waits for them, within the phase's deadline. The stop
/// record's notes say how many were open and how they ended.
///
/// ```no_run
/// use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
/// use planned_stop::web::{LongLived, close_going_away};
///
/// async fn ws(req: HttpRequest, body: web::Payload, sockets: web::Data<LongLived>) -> actix_web::Result<HttpResponse> {
///     let (response, session, mut messages) = actix_ws::handle(&req, body)?;
///     let mut connection = sockets.open();
///     actix_web::rt::spawn(async move {
///         tokio::select! {
///             _ = connection.going_away() => close_going_away(session, connection).await,
///             _ = async { while let Some(Ok(_)) = messages.recv().await {} } => {}
///         }
///     });
///     Ok(response)
/// }
/// # fn f(stop: planned_stop::ServiceHandle) {
/// let sockets = LongLived::new("websocket");
/// sockets.join(&stop);
/// let server = HttpServer::new(move || {
///     App::new().app_data(web::Data::new(sockets.clone())).route("/ws", web::get().to(ws))
/// });
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct LongLived {
    shared: std::sync::Arc<LongLivedShared>,
}

/// What the registry and its connections share: the stop's cancellation, which tells every
/// connection to go away, and a tracker that counts the open ones (each holds a token of it),
/// which the drain closes and waits on. tokio-util does both; only how connections ended is
/// counted here.
#[derive(Debug)]
struct LongLivedShared {
    kind: String,
    going_away: tokio_util::sync::CancellationToken,
    open: tokio_util::task::TaskTracker,
    ends: std::sync::Mutex<LongLivedEnds>,
}

/// How the connections of a stop ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct LongLivedEnds {
    open_at_stop: usize,
    closed_for_stop: usize,
    ended_otherwise: usize,
}

impl LongLivedShared {
    fn ends(&self) -> std::sync::MutexGuard<'_, LongLivedEnds> {
        // The counts stay meaningful whatever panicked while holding them.
        self.ends
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl LongLived {
    /// A registry of long-lived connections of one `kind` (`"websocket"`, `"sse"`): the name
    /// of its drain participant and of its notes in the stop record.
    pub fn new(kind: impl Into<String>) -> Self {
        LongLived {
            shared: std::sync::Arc::new(LongLivedShared {
                kind: kind.into(),
                going_away: tokio_util::sync::CancellationToken::new(),
                open: tokio_util::task::TaskTracker::new(),
                ends: std::sync::Mutex::default(),
            }),
        }
    }

    /// Registers the connections as a drain participant of `service`'s ingress phase. Call it
    /// before [`ServiceHandle::ready`], inside the actix `System`.
    pub fn join(&self, service: &ServiceHandle) {
        let participant = LongLivedDrain {
            shared: self.shared.clone(),
        }
        .start();
        service.add_participant(
            DrainPhase::Ingress,
            self.shared.kind.clone(),
            participant.recipient(),
        );
    }

    /// A connection opens: keep the returned value for its life. One opened after the stop was
    /// accepted is told to go away at once.
    pub fn open(&self) -> LongLivedConnection {
        LongLivedConnection {
            shared: self.shared.clone(),
            _open: self.shared.open.token(),
            ended: false,
        }
    }

    /// How many connections are open now.
    pub fn open_now(&self) -> usize {
        self.shared.open.len()
    }
}

/// One long-lived connection of a [`LongLived`]; dropping it counts the connection as closed.
#[derive(Debug)]
pub struct LongLivedConnection {
    shared: std::sync::Arc<LongLivedShared>,
    /// Counts this connection as open until it is dropped.
    _open: tokio_util::task::task_tracker::TaskTrackerToken,
    ended: bool,
}

impl LongLivedConnection {
    /// Resolves once a stop is accepted: then close the connection (WebSocket:
    /// [`close_going_away`]; SSE: end the stream) and call [`Self::closed_for_stop`].
    pub async fn going_away(&mut self) {
        self.shared.going_away.cancelled().await;
    }

    /// Whether a stop has been accepted.
    pub fn is_going_away(&self) -> bool {
        self.shared.going_away.is_cancelled()
    }

    /// The connection was closed because of the stop (Going Away sent, stream ended).
    pub fn closed_for_stop(mut self) {
        self.end(true);
    }

    fn end(&mut self, for_stop: bool) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        let away = self.is_going_away();
        let mut ends = self.shared.ends();
        if for_stop {
            ends.closed_for_stop += 1;
        } else if away {
            ends.ended_otherwise += 1;
        }
    }
}

impl Drop for LongLivedConnection {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// The WebSocket close code a planned stop sends: 1001, Going Away (RFC 6455, 7.4.1).
pub const GOING_AWAY: u16 = 1001;

/// Closes a WebSocket session because the server is stopping: a Close frame with code 1001
/// (Going Away) and a reason, so the client reconnects — to another instance — rather than
/// seeing the connection cut. Counts the connection as closed for the stop.
pub async fn close_going_away(session: actix_ws::Session, connection: LongLivedConnection) {
    let reason = actix_ws::CloseReason {
        code: actix_ws::CloseCode::Away,
        description: Some("the server is stopping (planned stop); reconnect".into()),
    };
    if let Err(e) = session.close(Some(reason)).await {
        tracing::debug!(error = %e, "the WebSocket session was already closed");
    }
    connection.closed_for_stop();
}

/// The drain participant of a [`LongLived`].
struct LongLivedDrain {
    shared: std::sync::Arc<LongLivedShared>,
}

impl Actor for LongLivedDrain {
    type Context = Context<Self>;
}

impl Handler<Drain> for LongLivedDrain {
    type Result = ResponseFuture<DrainReport>;

    fn handle(&mut self, drain: Drain, _: &mut Context<Self>) -> Self::Result {
        let shared = self.shared.clone();
        Box::pin(async move {
            shared.ends().open_at_stop = shared.open.len();
            shared.going_away.cancel();
            // Closed: the wait ends once the last open connection is gone. A connection opened
            // after this is told to go away at once, and counted until it goes.
            shared.open.close();
            let closed = actix::clock::timeout(drain.within, shared.open.wait()).await;
            let ends = *shared.ends();
            let open = shared.open.len();
            // The record names the participant (the kind) before the note: not again here.
            let note = format!(
                "{} open at the stop; {} told to go away and closed, {} ended otherwise, {} still \
                 open at the deadline",
                ends.open_at_stop, ends.closed_for_stop, ends.ended_otherwise, open
            );
            let report = DrainReport::done().with_note(note);
            match closed {
                Ok(()) => report,
                Err(_) => report.with_cut_short(format!(
                    "{open} {} connections were cut at the ingress deadline",
                    shared.kind
                )),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Drain, DrainPhase, StopVerdict};
    use std::time::Duration;

    /// The drain tells every open connection to go away, counts how each ended, and cuts what
    /// is still open at the deadline; one opened after the stop is told at once.
    #[test]
    fn the_drain_counts_how_connections_ended_and_cuts_the_rest() {
        actix::System::new().block_on(async {
            let sockets = LongLived::new("websocket");
            let drain = LongLivedDrain {
                shared: sockets.shared.clone(),
            }
            .start();
            let mut polite = sockets.open();
            let rude = sockets.open();
            let stubborn = sockets.open();
            assert_eq!(sockets.open_now(), 3);
            assert!(!polite.is_going_away());
            let asked = drain.send(Drain::new(
                Duration::from_millis(200),
                StopVerdict::Planned,
                DrainPhase::Ingress,
            ));
            let report = async {
                polite.going_away().await;
                polite.closed_for_stop();
                drop(rude);
                let mut late = sockets.open();
                assert!(late.is_going_away(), "opened after the stop: told at once");
                late.going_away().await;
                late.closed_for_stop();
                asked.await.unwrap()
            }
            .await;
            assert_eq!(
                report.notes,
                vec![
                    "3 open at the stop; 2 told to go away and closed, 1 ended otherwise, 1 still \
                     open at the deadline"
                        .to_owned(),
                    "1 websocket connections were cut at the ingress deadline".to_owned(),
                ]
            );
            assert!(report.cut, "the stubborn one was cut: {report:?}");
            assert_eq!(sockets.open_now(), 1);
            drop(stubborn);
            assert_eq!(sockets.open_now(), 0);
        });
    }
}

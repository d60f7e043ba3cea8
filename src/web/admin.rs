//! [`Admin`]: readiness, status and metrics on an address and an actix `System` of their own.
//!
//! Why: the application's server is the ingress drain participant — its listener closes during
//! the drain and it ends with the application's `System` — so `/metrics` mounted there cannot be
//! scraped for the stop's last numbers, and `/status` cannot be read while the work phase runs.
//! The admin server runs on a thread and a `System` no stop touches: it answers through the whole
//! drain and until the process ends. Its readiness and status are the same as [`super::readiness`]
//! and [`super::status`].

use crate::service::ServiceHandle;
use actix_web::dev::ServerHandle;
use actix_web::{App, HttpServer};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// The admin server's routes, before it is bound.
///
/// ```no_run
/// # fn f(stop: planned_stop::ServiceHandle) -> std::io::Result<()> {
/// let admin = planned_stop::web::Admin::new(&stop)
///     .readiness("/ready")
///     .status("/status")
///     .metrics("/metrics", || "# the recorder's rendering, e.g. PrometheusHandle::render\n".into())
///     .bind("127.0.0.1:9090")?;
/// println!("admin on http://{}", admin.addrs()[0]);
/// # Ok(()) }
/// ```
#[must_use = "an admin server that is not bound serves nothing"]
pub struct Admin {
    service: ServiceHandle,
    readiness: Option<String>,
    status: Option<String>,
    metrics: Option<(String, Render)>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("readiness", &self.readiness)
            .field("status", &self.status)
            .field("metrics", &self.metrics.as_ref().map(|(path, _)| path))
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// An admin server for `service`, with no routes yet.
    pub fn new(service: &ServiceHandle) -> Admin {
        Admin {
            service: service.clone(),
            readiness: None,
            status: None,
            metrics: None,
        }
    }

    /// [`super::readiness`] at `path`.
    pub fn readiness(mut self, path: &str) -> Admin {
        self.readiness = Some(path.to_owned());
        self
    }

    /// [`super::status`] at `path`.
    pub fn status(mut self, path: &str) -> Admin {
        self.status = Some(path.to_owned());
        self
    }

    /// `render`'s text at `path` (`text/plain`): the metrics recorder's exposition, such as
    /// `metrics_exporter_prometheus::PrometheusHandle::render`. Each answer counts as a scrape
    /// for [`AdminServer::last_scrape`].
    pub fn metrics(
        mut self,
        path: &str,
        render: impl Fn() -> String + Send + Sync + 'static,
    ) -> Admin {
        self.metrics = Some((path.to_owned(), Arc::new(render)));
        self
    }

    /// Binds `addr` (port 0 picks a free one) and starts serving on a thread and `System` of its
    /// own; an address that cannot be bound is the error, before anything runs. A process handed
    /// sockets named `admin` (`LISTEN_FDNAMES`: by its predecessor's restart in place, or a
    /// `.socket` unit's `FileDescriptorName=admin`) serves those instead of binding. Its sockets
    /// are handed to the successor of a restart in place, which serves them from its ready on:
    /// this server then stops accepting, and the successor's answers on the same port.
    pub fn bind(self, addr: impl ToSocketAddrs) -> io::Result<AdminServer> {
        let mut listeners = super::listen::taken(true)?;
        if listeners.is_empty() {
            for addr in addr.to_socket_addrs()? {
                listeners.push(std::net::TcpListener::bind(addr)?);
            }
        }
        if listeners.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no address to bind: give the admin endpoint at least one",
            ));
        }
        for listener in &listeners {
            self.service
                .handover
                .offer(crate::handover::ADMIN_SOCKET, listener)?;
        }
        let (scraped_tx, scraped) = watch::channel(0_u64);
        let (bound_tx, bound) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("planned-stop-admin".into())
            .spawn(move || {
                actix_web::rt::System::new().block_on(self.run(listeners, scraped_tx, bound_tx));
            })?;
        let (addrs, handle) = bound
            .recv()
            .map_err(|_| io::Error::other("the admin server's thread ended before it bound"))??;
        Ok(AdminServer {
            addrs,
            scraped,
            handle,
        })
    }

    /// The server, on its own `System`: runs until the process ends.
    async fn run(
        self,
        listeners: Vec<std::net::TcpListener>,
        scraped: watch::Sender<u64>,
        bound: std::sync::mpsc::Sender<io::Result<(Vec<SocketAddr>, ServerHandle)>>,
    ) {
        let scraped = Arc::new(scraped);
        let Admin {
            service,
            readiness,
            status,
            metrics,
        } = self;
        let mut handed_over = service.subscribe();
        let server = HttpServer::new(move || {
            // Its keep-alive connections are retired once the service stops, as the
            // application's are ([`super::CloseWhenStopping`], not counted as the application
            // mounting it): a scraper or probe reconnects, to the successor of a restart in
            // place, instead of writing into a connection cut when this process ends.
            let retire = super::CloseWhenStopping::unmounted(&service);
            let mut app = App::new().wrap(retire);
            if let Some(path) = &readiness {
                app = app.service(super::readiness_resource(path, &service));
            }
            if let Some(path) = &status {
                app = app.service(super::status_resource(path, &service));
            }
            if let Some((path, render)) = &metrics {
                let (render, scraped) = (render.clone(), scraped.clone());
                app = app.route(
                    path,
                    actix_web::web::get().to(move || {
                        // Counted as it begins: `last_scrape` waits for a scrape that renders
                        // after its call, and a render under way then may read earlier numbers.
                        scraped.send_modify(|n| *n += 1);
                        std::future::ready(render())
                    }),
                );
            }
            app
        })
        .workers(1)
        .disable_signals();
        let server = listeners.into_iter().try_fold(server, HttpServer::listen);
        let server = match server {
            Ok(server) => server,
            Err(e) => return bound.send(Err(e)).unwrap_or(()),
        };
        let addrs = server.addrs();
        let server = server.run();
        let handle = server.handle();
        let _ = bound.send(Ok((addrs, handle.clone())));
        // Handed over to the successor of a restart in place, which serves the same sockets from
        // its ready on: this server stops accepting, so every new connection (a readiness probe
        // among them) reaches the successor; connections it has finish as usual.
        actix_web::rt::spawn(async move {
            let successor = handed_over.wait_for(|status| {
                status
                    .outcome
                    .as_ref()
                    .is_some_and(|o| o.successor.is_some())
            });
            if successor.await.is_ok() {
                handle.pause().await;
                tracing::info!("admin server: handed over to the successor; no longer accepting");
            }
        });
        if let Err(e) = server.await {
            tracing::error!(error = %crate::error_chain::ErrorChain(&e), "the admin server failed");
        }
    }
}

/// A running admin server: it answers until the process ends.
pub struct AdminServer {
    addrs: Vec<SocketAddr>,
    scraped: watch::Receiver<u64>,
    handle: ServerHandle,
}

impl std::fmt::Debug for AdminServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminServer")
            .field("addrs", &self.addrs)
            .finish_non_exhaustive()
    }
}

impl AdminServer {
    /// The addresses it listens on.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Waits until a metrics scrape begins after this call, or `within` has passed, then stops
    /// the admin server gracefully, so that scrape renders and its answer is written in full
    /// before the process ends; returns whether one came. Await it after the stop (once
    /// [`ServiceHandle::stopped`] resolved) and before `main` returns, so the stop's last numbers
    /// are read; keep `within` inside the service's exit grace.
    pub async fn last_scrape(&mut self, within: Duration) -> bool {
        let before = *self.scraped.borrow_and_update();
        let came = actix_web::rt::time::timeout(within, self.scraped.wait_for(|n| *n > before))
            .await
            .is_ok_and(|r| r.is_ok());
        self.handle.stop(true).await;
        came
    }
}

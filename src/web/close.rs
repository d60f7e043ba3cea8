//! [`CloseWhenStopping`]: the middleware that retires keep-alive connections once a stop is
//! accepted.
//!
//! Why a middleware: the crate cannot add `Connection: close` to an `App` it did not build, so
//! the application wraps it (or builds on [`super::app`], which does).

use crate::service::ServiceHandle;
use actix_web::dev::{Service, ServiceRequest, ServiceResponse, Transform};
use std::future::Future;
use std::pin::Pin;

/// Middleware for the application's `App`: from the moment a stop is accepted, every response
/// says `Connection: close`, and actix-web closes its connection once the response is written.
/// A load balancer's or proxy's pooled keep-alive connection is then retired cleanly during the
/// readiness grace — after an answered request, never with a request in flight — instead of being
/// cut when the listener closes (each such cut is a lost request: a 502 at the balancer).
/// [`app`](super::app) is an `App` with it; wrap it yourself where the `App` comes from elsewhere.
///
/// HTTP/1.1 only: HTTP/2 has no `Connection: close`, and actix-web sends no GOAWAY when it stops,
/// so an HTTP/2 connection stays open until the ingress deadline (docs/operations.md).
///
/// ```no_run
/// # use actix_web::{App, HttpServer};
/// # fn f(stop: planned_stop::ServiceHandle) {
/// let server = HttpServer::new(move || {
///     App::new()
///         .wrap(planned_stop::web::CloseWhenStopping::new(&stop))
///         .service(planned_stop::web::readiness("/ready", &stop))
/// });
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct CloseWhenStopping {
    status: tokio::sync::watch::Receiver<crate::RunnerStatus>,
}

impl CloseWhenStopping {
    /// The middleware for the runner of `service`.
    pub fn new(service: &ServiceHandle) -> Self {
        service
            .integration
            .mounted(crate::service::integration::CLOSE_WHEN_STOPPING);
        CloseWhenStopping::unmounted(service)
    }

    /// The middleware, not counted as the application mounting it (the admin server's own).
    pub(super) fn unmounted(service: &ServiceHandle) -> Self {
        CloseWhenStopping {
            status: service.subscribe(),
        }
    }
}

impl<S, B> Transform<S, ServiceRequest> for CloseWhenStopping
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Transform = CloseWhenStoppingService<S>;
    type InitError = ();
    type Future = std::future::Ready<Result<Self::Transform, ()>>;

    fn new_transform(&self, service: S) -> Self::Future {
        std::future::ready(Ok(CloseWhenStoppingService {
            service,
            status: self.status.clone(),
        }))
    }
}

/// The service [`CloseWhenStopping`] wraps around the application's: public only because
/// `Transform` names it, and not re-exported, so no application names it.
#[derive(Debug)]
pub struct CloseWhenStoppingService<S> {
    service: S,
    status: tokio::sync::watch::Receiver<crate::RunnerStatus>,
}

impl<S, B> Service<ServiceRequest> for CloseWhenStoppingService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: 'static,
{
    type Response = ServiceResponse<B>;
    type Error = actix_web::Error;
    type Future = Pin<Box<dyn Future<Output = Result<ServiceResponse<B>, actix_web::Error>>>>;

    actix_web::dev::forward_ready!(service);

    fn call(&self, request: ServiceRequest) -> Self::Future {
        let status = self.status.clone();
        let answer = self.service.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            // Decided when the response leaves, not when the request came: a request that was
            // in flight when the stop was accepted closes its connection too.
            if status.borrow().state.is_stopping() {
                response
                    .response_mut()
                    .head_mut()
                    .set_connection_type(actix_web::http::ConnectionType::Close);
            }
            Ok(response)
        })
    }
}

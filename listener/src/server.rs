//! The HTTP server for `/metrics` (OpenMetrics text) and `/healthz`.
//!
//! Paths are matched by hand rather than through the router, so any configured `metrics_endpoint` works (a value
//! ending in `/` covers the subtree, as with Go's `ServeMux`) and no value can make route registration panic.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::HEALTH_PATH;
use crate::error::{Error, Result};
use crate::health::Health;
use crate::metrics::{CONTENT_TYPE, Metrics};

/// What one server answers.
#[derive(Debug, Clone)]
pub struct Routes {
    /// Metrics and their path, if served here.
    pub metrics: Option<(Arc<Metrics>, String)>,
    /// Whether `/healthz` is served here.
    pub health: bool,
    /// The loop's progress record (health, and the poll age metric).
    pub progress: Health,
}

/// A server whose socket is bound, so binding problems surface before the loop starts.
#[derive(Debug)]
pub struct BoundServer {
    what: &'static str,
    listener: TcpListener,
    routes: Arc<Routes>,
}

impl BoundServer {
    /// Binds `addr` with Go's `host:port` conventions: an empty host (`:8080`) means every interface.
    pub async fn bind(what: &'static str, addr: &str, routes: Routes) -> Result<Self> {
        let bind_error = |source| Error::BindServer {
            what,
            addr: addr.to_owned(),
            source,
        };
        let listener = match addr.strip_prefix(':') {
            // Dual-stack where the host supports IPv6, IPv4 otherwise.
            Some(port) => match TcpListener::bind(format!("[::]:{port}")).await {
                Ok(listener) => listener,
                Err(_) => TcpListener::bind(format!("0.0.0.0:{port}"))
                    .await
                    .map_err(bind_error)?,
            },
            None => TcpListener::bind(addr).await.map_err(bind_error)?,
        };
        Ok(Self {
            what,
            listener,
            routes: Arc::new(routes),
        })
    }

    /// The bound address (useful with port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown` is cancelled, then finishes the requests in flight.
    pub async fn serve(self, shutdown: CancellationToken) -> Result<()> {
        let what = self.what;
        tracing::info!(addr = ?self.local_addr(), what, "HTTP server starting");
        let app = Router::new().fallback(handle).with_state(self.routes);
        let result = axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
            .map_err(|source| Error::Serve { what, source });
        tracing::info!(what, "HTTP server stopped");
        result
    }
}

fn path_matches(pattern: &str, path: &str) -> bool {
    path == pattern || (pattern.ends_with('/') && path.starts_with(pattern))
}

async fn handle(State(routes): State<Arc<Routes>>, uri: Uri) -> Response {
    let path = uri.path();
    if routes.health && path == HEALTH_PATH {
        return health(&routes.progress);
    }
    if let Some((metrics, pattern)) = &routes.metrics
        && path_matches(pattern, path)
    {
        let age = routes.progress.last_poll_age().as_secs_f64();
        return match metrics.encode(age) {
            Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
            Err(e) => {
                tracing::error!(error = %e, "encoding metrics failed");
                StatusCode::INTERNAL_SERVER_ERROR.into_response()
            }
        };
    }
    StatusCode::NOT_FOUND.into_response()
}

fn health(progress: &Health) -> Response {
    if progress.is_healthy() {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        let message = format!(
            "unhealthy: no poll of the message queue completed for {:.0} s (limit {} s)\n",
            progress.last_poll_age().as_secs_f64(),
            progress.limit().as_secs()
        );
        (StatusCode::SERVICE_UNAVAILABLE, message).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_match_like_go_serve_mux() {
        assert!(path_matches("/metrics", "/metrics"));
        assert!(!path_matches("/metrics", "/metrics/x"));
        assert!(!path_matches("/metrics", "/"));
        assert!(path_matches("/m/", "/m/"));
        assert!(path_matches("/m/", "/m/anything"));
        assert!(!path_matches("/m/", "/m"));
    }
}

//! The manager's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (alive) and `/readyz` (watches listed
//! and controllers running).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::listener_tasks::ListenerTasks;
use crate::manager::Readiness;

/// Parses a Go-style bind address as ARC's flags take it: `:8080` (all interfaces), `host:port`, or `0`/empty
/// for "disabled" (`None`).
pub fn parse_bind_address(value: &str) -> std::result::Result<Option<SocketAddr>, String> {
    let value = value.trim();
    if value.is_empty() || value == "0" {
        return Ok(None);
    }
    let full = if value.starts_with(':') {
        format!("0.0.0.0{value}")
    } else {
        value.to_owned()
    };
    full.parse::<SocketAddr>()
        .map(Some)
        .map_err(|e| format!("{value:?} is not a bind address (e.g. :8080 or 127.0.0.1:8080): {e}"))
}

/// What `/metrics` shows: the manager's registry, and in the manager's listener mode every listener's metrics
/// (the families merged, one series set per scale set, as separate listener pods would each show theirs).
#[derive(Clone)]
pub struct Exposition {
    pub registry: Arc<Registry>,
    pub listeners: Option<Arc<ListenerTasks>>,
}

impl Exposition {
    /// The text exposition of everything.
    pub fn encode(&self) -> String {
        let own = crate::metrics::encode(&self.registry);
        let Some(listeners) = self.listeners.as_ref().filter(|tasks| !tasks.is_empty()) else {
            return own;
        };
        let theirs = listeners.encode_metrics();
        crate::metrics::merge_texts(
            std::iter::once(own.as_str()).chain(theirs.iter().map(String::as_str)),
        )
    }
}

impl From<Arc<Registry>> for Exposition {
    fn from(registry: Arc<Registry>) -> Self {
        Self {
            registry,
            listeners: None,
        }
    }
}

/// `/metrics` for `exposition`.
pub fn metrics_routes(exposition: impl Into<Exposition>) -> Router {
    Router::new().route(
        "/metrics",
        get(|State(exposition): State<Exposition>| async move {
            (
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                exposition.encode(),
            )
        })
        .with_state(exposition.into()),
    )
}

/// `/healthz` and `/readyz`.
pub fn health_routes(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(readiness): State<Readiness>| async move {
                if readiness.is_ready() {
                    (StatusCode::OK, "ok").into_response()
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
                }
            })
            .with_state(readiness),
        )
}

/// Serves `router` on `addr` until `shutdown`.
pub async fn serve(addr: SocketAddr, router: Router, shutdown: CancellationToken) -> Result<()> {
    let serve_error = |source| Error::Serve {
        addr: addr.to_string(),
        source,
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(serve_error)?;
    tracing::info!(%addr, "serving HTTP");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(serve_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_addresses() {
        assert_eq!(
            parse_bind_address(":8080").unwrap(),
            Some("0.0.0.0:8080".parse().unwrap())
        );
        assert_eq!(
            parse_bind_address("127.0.0.1:9").unwrap(),
            Some("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(parse_bind_address("0").unwrap(), None);
        assert_eq!(parse_bind_address("").unwrap(), None);
        assert!(parse_bind_address("localhost").is_err());
    }

    #[tokio::test]
    async fn readiness_and_metrics_are_served() {
        let readiness = Readiness::default();
        let mut registry = Registry::default();
        let metrics = crate::metrics::Metrics::register(&mut registry);
        metrics.record_reconcile("ephemeralrunner", std::time::Instant::now(), None);
        let router = metrics_routes(Arc::new(registry)).merge(health_routes(readiness.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(serve(addr, router, shutdown.clone()));
        let get = |path: &'static str| async move {
            for _ in 0..50 {
                if let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let request =
                        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
                    stream.write_all(request.as_bytes()).await.unwrap();
                    let mut response = String::new();
                    stream.read_to_string(&mut response).await.unwrap();
                    return response;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            panic!("server did not start");
        };
        assert!(get("/readyz").await.starts_with("HTTP/1.1 503"));
        readiness.set(true);
        assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(
            get("/metrics")
                .await
                .contains("controller_runtime_reconcile_total")
        );
        shutdown.cancel();
        server.await.unwrap().unwrap();
    }
}

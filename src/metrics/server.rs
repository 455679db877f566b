//! The HTTP endpoint: `/metrics` and `/healthz`, served by the crate's one HTTP server
//! ([`crate::http`]: a connection cap, header and idle timeouts, accept errors retried) on a
//! one-thread tokio runtime of its own. `/healthz` reads two atomics and never waits for
//! anything; `/metrics` renders on the runtime's one blocking thread (its table figures may
//! need a query), so a scrape never holds up a health check.
//!
//! It answers whatever `Host` a request names: Prometheus scrapes by address, an
//! orchestrator probes by address or by a service name, and the endpoint only reads. (The
//! dashboard, which can change things, checks `Host`: `src/web/guard.rs`.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::registry::Registry;

use super::gauges::{Gauges, Live, TableSample};
use super::Metrics;
use crate::error::{Error, Result};
use crate::http::{Background, Grace};

/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of every other answer.
const PLAIN_TEXT: &str = "text/plain; charset=utf-8";
/// How long a stopping endpoint lets the answers under way finish.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// A running metrics endpoint; dropping it stops the server and waits for its thread.
pub(crate) struct MetricsServer {
    addr: SocketAddr,
    /// Stopped and joined when the endpoint is dropped.
    _server: Background,
}

/// What the endpoint serves.
struct Endpoint {
    metrics: Arc<Metrics>,
    live: Arc<Live>,
    table: Arc<TableSample>,
    gauges: Registry,
}

/// A metrics endpoint bound to its address, not serving yet: bound before the worker
/// registers its node, so that an address in use leaves nothing behind.
pub(crate) struct BoundServer {
    listener: std::net::TcpListener,
    addr: SocketAddr,
}

impl BoundServer {
    /// Binds `addr`. Fails with [`Error::MetricsServer`] naming the address when it cannot
    /// be bound (in use, not an address of this machine, a privileged port).
    pub(crate) fn bind(addr: SocketAddr) -> Result<BoundServer> {
        let failed = |e: std::io::Error| Error::MetricsServer {
            addr: addr.to_string(),
            reason: e.to_string(),
        };
        let listener = std::net::TcpListener::bind(addr).map_err(failed)?;
        listener.set_nonblocking(true).map_err(failed)?;
        let bound = listener.local_addr().map_err(failed)?;
        Ok(BoundServer {
            listener,
            addr: bound,
        })
    }

    /// Serves `metrics` and the gauges of `live` and `table` on a thread of its own.
    pub(crate) fn serve(
        self,
        metrics: Arc<Metrics>,
        live: Live,
        table: TableSample,
    ) -> Result<MetricsServer> {
        let BoundServer {
            listener,
            addr: bound,
        } = self;
        let live = Arc::new(live);
        let table = Arc::new(table);
        let mut gauges = Registry::with_prefix("outbox");
        gauges.register_collector(Box::new(Gauges {
            live: Arc::clone(&live),
            table: Arc::clone(&table),
        }));
        let endpoint = Arc::new(Endpoint {
            metrics,
            live,
            table,
            gauges,
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .max_blocking_threads(1)
            .thread_name("outbox-metrics")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|source| Error::Thread {
                thread: "metrics runtime",
                source,
            })?;
        let app = Router::new()
            .route("/metrics", get(scrape))
            .route("/healthz", get(health))
            .fallback(no_such_path)
            .method_not_allowed_fallback(wrong_method)
            .with_state(endpoint);
        let grace = Grace {
            requests: STOP_GRACE,
            // A scrape's table read still under way is not waited for.
            blocking: Duration::ZERO,
        };
        let server =
            Background::spawn("metrics", runtime, listener, app, grace).map_err(|source| {
                Error::Thread {
                    thread: "metrics",
                    source,
                }
            })?;
        log::info!("metrics on http://{bound}/metrics, health on http://{bound}/healthz");
        Ok(MetricsServer {
            addr: bound,
            _server: server,
        })
    }
}

impl MetricsServer {
    /// The address it listens on (the port chosen by the system when asked for port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// `GET /metrics`: the whole exposition, rendered on the blocking thread.
async fn scrape(State(endpoint): State<Arc<Endpoint>>) -> Response {
    match tokio::task::spawn_blocking(move || endpoint.render()).await {
        Ok(text) => ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], text).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, PLAIN_TEXT)],
            format!("the metrics could not be rendered: {e}\n"),
        )
            .into_response(),
    }
}

/// `GET /healthz`: 200 while the heartbeat is fresh, 503 once it is not.
async fn health(State(endpoint): State<Arc<Endpoint>>) -> Response {
    let live = &endpoint.live;
    let age = (live.heartbeat_age)();
    let node = (live.node_id)();
    let (status, body) = if live.healthy() {
        (
            StatusCode::OK,
            format!("ok: node {node} heartbeat {:.1}s ago\n", age.as_secs_f64()),
        )
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "stale: node {node} last heartbeat {:.1}s ago, dead after {:.1}s\n",
                age.as_secs_f64(),
                live.dead_after.as_secs_f64()
            ),
        )
    };
    (status, [(header::CONTENT_TYPE, PLAIN_TEXT)], body).into_response()
}

async fn no_such_path(method: Method) -> Response {
    if method == Method::GET || method == Method::HEAD {
        let body = "not found: try /metrics or /healthz\n";
        (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, PLAIN_TEXT)],
            body,
        )
            .into_response()
    } else {
        wrong_method().await
    }
}

async fn wrong_method() -> Response {
    let body = "method not allowed: GET /metrics or /healthz\n";
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::CONTENT_TYPE, PLAIN_TEXT)],
        body,
    )
        .into_response()
}

impl Endpoint {
    /// The whole exposition: counters and histograms, then the gauges.
    fn render(&self) -> String {
        self.table.refresh_if_stale();
        let mut text = String::with_capacity(16 * 1024);
        self.metrics.encode(&mut text);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.gauges);
        text
    }
}

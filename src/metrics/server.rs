//! The HTTP endpoint: `/metrics` and `/healthz` on a blocking server (`tiny_http`) with one
//! thread of its own, which answers one request at a time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use prometheus_client::registry::Registry;
use tiny_http::{Header, Method, Request, Response, Server};

use super::gauges::{Gauges, Live, TableSample};
use super::Metrics;
use crate::error::{Error, Result};

/// The content type of the Prometheus text format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A running metrics endpoint; dropping it stops the server and waits for its thread.
pub(crate) struct MetricsServer {
    server: Arc<Server>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
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
    server: Server,
    addr: SocketAddr,
}

impl BoundServer {
    /// Binds `addr`. Fails with [`Error::MetricsServer`] naming the address when it cannot
    /// be bound (in use, not an address of this machine, a privileged port).
    pub(crate) fn bind(addr: SocketAddr) -> Result<BoundServer> {
        let server = Server::http(addr).map_err(|e| Error::MetricsServer {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| Error::MetricsServer {
                addr: addr.to_string(),
                reason: "not bound to an IP address".into(),
            })?;
        Ok(BoundServer {
            server,
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
            server,
            addr: bound,
        } = self;
        let server = Arc::new(server);
        let (live, table) = (Arc::new(live), Arc::new(table));
        let mut gauges = Registry::with_prefix("outbox");
        gauges.register_collector(Box::new(Gauges {
            live: Arc::clone(&live),
            table: Arc::clone(&table),
        }));
        let endpoint = Endpoint {
            metrics,
            live,
            table,
            gauges,
        };
        let serving = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("outbox-metrics".into())
            .spawn(move || {
                for request in serving.incoming_requests() {
                    endpoint.answer(request);
                }
            })
            .map_err(|source| Error::Thread {
                thread: "metrics",
                source,
            })?;
        log::info!("metrics on http://{bound}/metrics, health on http://{bound}/healthz");
        Ok(MetricsServer {
            server,
            addr: bound,
            thread: Some(thread),
        })
    }
}

impl MetricsServer {
    /// The address it listens on (the port chosen by the system when asked for port 0).
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Endpoint {
    fn answer(&self, request: Request) {
        let path = request.url().split('?').next().unwrap_or("");
        let (status, content_type, body) = match (request.method(), path) {
            (Method::Get | Method::Head, "/metrics") => (200, PROMETHEUS_TEXT, self.render()),
            (Method::Get | Method::Head, "/healthz") => self.health(),
            (Method::Get | Method::Head, _) => (
                404,
                "text/plain; charset=utf-8",
                "not found: try /metrics or /healthz\n".to_owned(),
            ),
            _ => (
                405,
                "text/plain; charset=utf-8",
                "method not allowed: GET /metrics or /healthz\n".to_owned(),
            ),
        };
        let header = Header::from_bytes("Content-Type", content_type).expect("a valid header");
        let response = Response::from_string(body)
            .with_status_code(status)
            .with_header(header);
        if let Err(e) = request.respond(response) {
            log::debug!("metrics: could not answer a request: {e}");
        }
    }

    /// The whole exposition: counters and histograms, then the gauges.
    fn render(&self) -> String {
        self.table.refresh_if_stale();
        let mut text = String::with_capacity(16 * 1024);
        self.metrics.encode(&mut text);
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &self.gauges);
        text
    }

    fn health(&self) -> (u16, &'static str, String) {
        let age = (self.live.heartbeat_age)();
        let node = (self.live.node_id)();
        let dead_after = self.live.dead_after;
        if self.live.healthy() {
            (
                200,
                "text/plain; charset=utf-8",
                format!("ok: node {node} heartbeat {:.1}s ago\n", age.as_secs_f64()),
            )
        } else {
            (
                503,
                "text/plain; charset=utf-8",
                format!(
                    "stale: node {node} last heartbeat {:.1}s ago, dead after {:.1}s\n",
                    age.as_secs_f64(),
                    dead_after.as_secs_f64()
                ),
            )
        }
    }
}

//! The server: a tokio runtime of its own on a thread of its own, the routes, and the state
//! every request shares. Database work runs on the runtime's blocking threads through a
//! small pool, so a slow query never holds up the other requests. Connections are served by
//! the crate's one HTTP server, with its bounds ([`crate::http`]: a connection cap, header
//! and idle timeouts, accept errors retried).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::http::{Background, Grace};
use axum::routing::{get, post};
use axum::Router;

use super::problem::Problem;
use super::{actions, audit, fleet, guard, overview, problem, tasks, WebConfig, POOL_SIZE};
use crate::db::{DatabaseUrl, DbConnection, DbPool};
use crate::error::{Error, OpContext, Result};
use crate::migrate::ensure_migrated;

/// How long a stopping dashboard lets the requests under way finish.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What every request of one dashboard shares.
pub(super) struct AppState {
    pool: DbPool,
    /// Whether the buttons are shown and their `POST`s accepted.
    pub(super) actions: bool,
    /// Who the audit names.
    pub(super) actor: String,
    /// The forms' token.
    pub(super) token: String,
    /// Names accepted in `Host` besides addresses and `localhost`.
    pub(super) allowed_hosts: Vec<String>,
    /// Seconds between the browser's reloads.
    pub(super) refresh_secs: u64,
}

impl AppState {
    /// Runs `work` with a pooled connection on a blocking thread.
    pub(super) async fn db<T, F>(self: &Arc<Self>, work: F) -> Result<T, Problem>
    where
        T: Send + 'static,
        F: FnOnce(&mut DbConnection) -> Result<T> + Send + 'static,
    {
        let pool = self.pool.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let mut conn = pool.get().op("web request")?;
            work(&mut conn)
        })
        .await;
        match joined {
            Ok(result) => result.map_err(Problem::from),
            Err(e) => Err(Problem::internal(format!(
                "the request's database work failed: {e}"
            ))),
        }
    }
}

/// A running dashboard: serves until [`Dashboard::stop`] or until dropped.
#[derive(Debug)]
pub struct Dashboard {
    addr: SocketAddr,
    actions: bool,
    server: Background,
}

impl Dashboard {
    /// Checks `config`, connects to the migrated database at `url`, listens on
    /// `config.addr` and serves the dashboard on a thread of its own.
    ///
    /// Fails, having started nothing, with [`Error::InvalidConfig`] for a bad configuration,
    /// the errors of [`DatabaseUrl::require_existing`], [`DatabaseUrl::pool`] and
    /// [`crate::migrate::ensure_migrated`], and [`Error::Listen`] when the address is in
    /// use or not this machine's.
    pub fn start(url: &DatabaseUrl, config: WebConfig) -> Result<Dashboard> {
        config.validate()?;
        url.require_existing()?;
        let pool = url.pool(POOL_SIZE)?;
        crate::db::pool::on_live_conn(&pool, "web start", ensure_migrated)?;
        let listen = |source| Error::Listen {
            addr: config.addr,
            source,
        };
        let listener = std::net::TcpListener::bind(config.addr).map_err(listen)?;
        listener.set_nonblocking(true).map_err(listen)?;
        let addr = listener.local_addr().map_err(listen)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(2 * POOL_SIZE as usize)
            .thread_name("outbox-web")
            .enable_io()
            .enable_time()
            .build()
            .map_err(|source| Error::Thread {
                thread: "web runtime",
                source,
            })?;
        let state = Arc::new(AppState {
            pool,
            actions: config.allow_actions,
            actor: config.actor(),
            token: guard::new_token()?,
            allowed_hosts: config.allowed_hosts.clone(),
            refresh_secs: config.refresh.as_secs(),
        });
        let app = router(state);
        let grace = Grace {
            requests: STOP_GRACE,
            blocking: Duration::from_secs(1),
        };
        let server = Background::spawn("web", runtime, listener, app, grace).map_err(|source| {
            Error::Thread {
                thread: "web",
                source,
            }
        })?;
        log::info!("web: serving http://{addr}/");
        Ok(Dashboard {
            addr,
            actions: config.allow_actions,
            server,
        })
    }

    /// The address it listens on (the port chosen when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether its buttons are shown and their `POST`s accepted.
    pub fn actions_allowed(&self) -> bool {
        self.actions
    }

    /// Stops listening, lets the requests under way finish (up to 5 s), and returns.
    pub fn stop(mut self) {
        self.server.stop();
    }
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(overview::show))
        .route("/tasks", get(tasks::list))
        .route("/tasks/{id}", get(tasks::show))
        .route("/tasks/{id}/retry", post(actions::retry))
        .route("/tasks/{id}/cancel", post(actions::cancel))
        .route("/pause", post(actions::pause))
        .route("/resume", post(actions::resume))
        .route("/nodes", get(fleet::nodes))
        .route("/domains", get(fleet::domains))
        .route("/schedules", get(fleet::schedules))
        .route("/audit", get(audit::show))
        .fallback(problem::no_such_page)
        .method_not_allowed_fallback(problem::wrong_method)
        // An action's form is a token, a name and a path: a body past this is refused (413)
        // before it is read whole (axum's default would read 2 MiB a request).
        .layer(axum::extract::DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            guard::check,
        ))
        .with_state(state)
}

/// The largest form body an action takes.
pub(crate) const MAX_FORM_BYTES: usize = 4 * 1024;

//! Database URLs: which backend a string names, and what is handed to its driver.

use std::fmt;
use std::time::Duration;

use super::reply::ReplyTimeout;
use super::secret::{libpq_misreading, MaskedUrl, Secrets};
use super::{Backend, DbConnection};
use crate::driver::driver;
use crate::error::{Error, Result};

#[path = "url_text.rs"]
mod text;
use text::{
    looks_like_keyword_value, parse_on_off, parse_reply_timeout, query_value, scheme_of,
    with_libpq_defaults, without_parameter,
};

/// The database URL used when neither `--database-url` nor `DATABASE_URL` is given.
pub const DEFAULT_DATABASE_URL: &str = "outbox.db";

/// How long opening a PostgreSQL connection may take before it fails, unless the URL sets
/// libpq's `connect_timeout` itself. Without it, a host that drops packets blocks a claim for
/// minutes (the kernel's TCP retries), and a server that accepts but never answers, forever.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection may be silent before TCP keepalive probes start, unless the URL
/// sets libpq's `keepalives_idle` (PostgreSQL; on MySQL it is set on the socket).
pub const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(30);

/// Between keepalive probes, unless the URL sets libpq's `keepalives_interval`.
pub const DEFAULT_KEEPALIVES_INTERVAL: Duration = Duration::from_secs(10);

/// Unanswered keepalive probes before the connection is dropped, unless the URL sets
/// libpq's `keepalives_count`.
pub const DEFAULT_KEEPALIVES_COUNT: u32 = 3;

/// How long sent data, or a keepalive probe, may stay unacknowledged before the kernel drops
/// the connection (`TCP_USER_TIMEOUT`), unless the URL sets libpq's `tcp_user_timeout`.
///
/// With the keepalives above, a connection whose peer is gone or cut off by a partition
/// fails within about a minute, whether a statement was being sent, its reply awaited, or
/// the connection sat idle: without them a statement sent before the link died waits for
/// its reply for ever (nothing is unacknowledged, so TCP never notices), and one sent after
/// it waits for the kernel's retransmissions, about 15 minutes.
pub const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);

/// The URL query parameter that sets a connection's reply timeout (outbox's own, removed
/// before the URL reaches the driver; see [`super::reply`]).
pub const REPLY_TIMEOUT_PARAMETER: &str = "reply_timeout";

/// The URL query parameter that turns a PostgreSQL connection's prepared-statement cache off:
/// `statement_cache=off` (outbox's own, removed before the URL reaches libpq).
///
/// diesel names each cached statement (`__diesel_stmt_N`) on its connection. Behind PgBouncer in
/// transaction mode (1.18, Debian's; 1.21+ can track them) a client's statements run on whichever
/// server connection is free, where that name belongs to another client or to no one: "prepared
/// statement \"__diesel_stmt_1\" already exists". Off, every statement is sent with its text in one
/// round trip (an unnamed statement, parsed and planned each time): measured, strict drains 35 %
/// slower and batched ones 13 % (docs/guide/src/postgresql.md, "Behind PgBouncer"). On by default;
/// PostgreSQL URLs only.
pub const STATEMENT_CACHE_PARAMETER: &str = "statement_cache";

/// A validated database URL: the backend and the string to hand to its driver.
///
/// The backend follows from the text alone, and never falls back to the other one:
/// `postgres://…` and `postgresql://…` name PostgreSQL; `mysql://…` names MySQL or MariaDB;
/// `sqlite://PATH`, `sqlite:PATH` or a plain file path name an SQLite file.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    backend: Backend,
    /// The URL for PostgreSQL (with libpq's timeouts and keepalives) and MySQL, without
    /// outbox's own parameters; the file path for SQLite.
    target: String,
    original: String,
    /// How long a statement may wait for its reply (server backends).
    reply_timeout: ReplyTimeout,
    /// Whether PostgreSQL connections cache their prepared statements
    /// ([`STATEMENT_CACHE_PARAMETER`]).
    statement_cache: bool,
}

impl DatabaseUrl {
    /// Parses a URL, refusing anything that names neither backend plainly.
    ///
    /// Refused, with [`Error::InvalidDatabaseUrl`]: an empty string; any other `scheme://`
    /// or `scheme:` (a `postgres:/host` missing a slash is not taken for a file); a libpq
    /// keyword/value string (`dbname=app host=db`, which is not a URL: write
    /// `postgres://db/app`); control characters; a PostgreSQL URL whose user or password
    /// holds an unescaped `@` or `/`, or a `%` not followed by two hex digits (libpq would
    /// misread it and quote a piece of the password in its error: percent-encode them, `/` as
    /// `%2F`); a path ending in `/`; an in-memory SQLite
    /// database, which the worker's pooled connections could not share; a backend this build
    /// lacks (its cargo feature is off: `mysql` is not a default one); a `reply_timeout` that
    /// is not a duration of at least a second, `0` or `off`.
    ///
    /// A PostgreSQL URL gets libpq's `connect_timeout` ([`DEFAULT_CONNECT_TIMEOUT`]),
    /// `keepalives=1`, `keepalives_idle` ([`DEFAULT_KEEPALIVES_IDLE`]), `keepalives_interval`
    /// ([`DEFAULT_KEEPALIVES_INTERVAL`]), `keepalives_count` ([`DEFAULT_KEEPALIVES_COUNT`]) and
    /// `tcp_user_timeout` ([`DEFAULT_TCP_USER_TIMEOUT`]), each unless it sets it itself; a
    /// MySQL connection's socket gets the same keepalives and user timeout when it opens. A
    /// PostgreSQL or MySQL URL may set `reply_timeout` (see [`DatabaseUrl::reply_timeout`]).
    ///
    /// ```
    /// use outbox::db::{Backend, DatabaseUrl};
    /// assert_eq!(DatabaseUrl::parse("postgres://u@h/db").unwrap().backend(), Backend::Postgres);
    /// assert_eq!(DatabaseUrl::parse("outbox.db").unwrap().backend(), Backend::Sqlite);
    /// # #[cfg(feature = "mysql")]
    /// assert_eq!(DatabaseUrl::parse("mysql://u@h/db").unwrap().backend(), Backend::Mysql);
    /// assert!(DatabaseUrl::parse("mariadb://u@h/db").is_err());
    /// assert!(DatabaseUrl::parse("dbname=app").is_err());
    /// ```
    pub fn parse(url: &str) -> Result<DatabaseUrl> {
        let invalid = |reason: String| Error::InvalidDatabaseUrl {
            url: MaskedUrl(url).to_string(),
            reason,
        };
        let text = url.trim();
        if text.is_empty() {
            return Err(invalid("it is empty".into()));
        }
        if text.chars().any(char::is_control) {
            return Err(invalid("it contains a control character".into()));
        }
        let (backend, target) = if text.starts_with("postgres://")
            || text.starts_with("postgresql://")
        {
            // libpq's errors would quote a piece of the password it misread.
            if let Some(reason) = libpq_misreading(text) {
                return Err(invalid(reason.into()));
            }
            (Backend::Postgres, with_libpq_defaults(text))
        } else if text.starts_with("mysql://") {
            (Backend::Mysql, text.to_owned())
        } else if let Some(path) = text
            .strip_prefix("sqlite://")
            .or_else(|| text.strip_prefix("sqlite:"))
        {
            (Backend::Sqlite, path.to_owned())
        } else if let Some(scheme) = scheme_of(text) {
            return Err(invalid(format!(
                "unsupported scheme {scheme:?}; use postgres://, postgresql://, mysql://, sqlite:// or a file path"
            )));
        } else if looks_like_keyword_value(text) {
            return Err(invalid(
                "it looks like a libpq keyword/value string, not a URL or a file path; write \
                 PostgreSQL as postgres://[user[:password]@]host[:port]/database"
                    .into(),
            ));
        } else {
            (Backend::Sqlite, text.to_owned())
        };
        if !backend.is_built() {
            return Err(invalid(format!(
                "this build of outbox has no {backend} backend; build it with the cargo feature `{backend}`"
            )));
        }
        if backend == Backend::Sqlite {
            if target.is_empty() {
                return Err(invalid("the SQLite path is empty".into()));
            }
            if target == ":memory:" || target.contains("mode=memory") {
                return Err(invalid(
                    "an in-memory SQLite database cannot be shared by the worker's connections; use a file"
                        .into(),
                ));
            }
            if target.ends_with('/') {
                return Err(invalid(
                    "the SQLite path names a directory, not a file".into(),
                ));
            }
        }
        let (target, reply_timeout) = match backend {
            Backend::Sqlite => (target, ReplyTimeout::Default),
            Backend::Postgres | Backend::Mysql => {
                let timeout = match query_value(&target, REPLY_TIMEOUT_PARAMETER) {
                    None => ReplyTimeout::Default,
                    Some(value) => parse_reply_timeout(value).map_err(invalid)?,
                };
                (without_parameter(&target, REPLY_TIMEOUT_PARAMETER), timeout)
            }
        };
        let (target, statement_cache) = match (backend, query_value(&target, STATEMENT_CACHE_PARAMETER)) {
            (_, None) => (target, true),
            (Backend::Postgres, Some(value)) => {
                let on = parse_on_off(value).ok_or_else(|| {
                    invalid(format!(
                        "{STATEMENT_CACHE_PARAMETER} is on or off, not {value:?}"
                    ))
                })?;
                (without_parameter(&target, STATEMENT_CACHE_PARAMETER), on)
            }
            (_, Some(_)) => {
                return Err(invalid(format!(
                    "{STATEMENT_CACHE_PARAMETER} is a PostgreSQL URL's parameter (PgBouncer), not {backend}'s"
                )))
            }
        };
        Ok(DatabaseUrl {
            backend,
            target,
            original: text.to_owned(),
            reply_timeout,
            statement_cache,
        })
    }

    /// How long a statement on a connection to this database may wait for its reply before
    /// the connection is closed and the statement fails as on a lost connection; `None` for
    /// no limit (SQLite, whose statements run in this process, or `reply_timeout=off`).
    ///
    /// Set by the URL's `reply_timeout` (`90s`, `10m`), or [`DatabaseUrl::with_reply_timeout`];
    /// otherwise [`super::reply::DEFAULT_REPLY_TIMEOUT`] (6 minutes), raised to a worker's task
    /// timeout plus [`super::reply::REPLY_MARGIN`] when a worker of this process has a longer
    /// one (its handlers' statements run on these connections). It must outlast every
    /// legitimate statement, a handler's included. See [`super::reply`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox::db::DatabaseUrl;
    ///
    /// let url = DatabaseUrl::parse("postgres://app@db/app?reply_timeout=15m").unwrap();
    /// assert_eq!(url.reply_timeout(), Some(Duration::from_secs(900)));
    /// assert!(DatabaseUrl::parse("postgres://db/app").unwrap().reply_timeout().is_some());
    /// assert_eq!(DatabaseUrl::parse("app.db").unwrap().reply_timeout(), None);
    /// ```
    pub fn reply_timeout(&self) -> Option<Duration> {
        match self.backend {
            Backend::Sqlite => None,
            Backend::Postgres | Backend::Mysql => self.reply_timeout.get(),
        }
    }

    /// This URL with its reply timeout set (`None`: no limit), whatever the URL's text says.
    /// See [`DatabaseUrl::reply_timeout`].
    pub fn with_reply_timeout(mut self, timeout: Option<Duration>) -> DatabaseUrl {
        self.reply_timeout = match timeout {
            Some(timeout) if !timeout.is_zero() => ReplyTimeout::Set(timeout),
            _ => ReplyTimeout::Off,
        };
        self
    }

    /// This URL without a reply timeout unless its text sets one: for statements that may
    /// rightly run for a long time, such as a migration's.
    pub(crate) fn unless_reply_timeout_set(mut self) -> DatabaseUrl {
        if self.reply_timeout == ReplyTimeout::Default {
            self.reply_timeout = ReplyTimeout::Off;
        }
        self
    }

    /// The backend the URL selects.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The URL as given (with its password, if it has one: do not print it; see
    /// [`DatabaseUrl::masked`]).
    pub fn as_str(&self) -> &str {
        &self.original
    }

    /// The URL with its password masked, for messages.
    ///
    /// The password is everything between the userinfo's first `:` and its last `@` (a
    /// base64 password's `/` included), and any `password=` query parameter up to its `&`.
    ///
    /// ```
    /// use outbox::DatabaseUrl;
    /// let url = DatabaseUrl::parse("postgres://app:c2Vj%2FcmV0@db/app?sslmode=disable").unwrap();
    /// assert_eq!(url.masked(), "postgres://app:***@db/app?sslmode=disable");
    /// ```
    pub fn masked(&self) -> String {
        MaskedUrl(&self.original).to_string()
    }

    /// The URL's password, as written and decoded, to keep out of messages and of a hook's
    /// environment.
    pub(crate) fn secrets(&self) -> Secrets {
        Secrets::of(&self.original)
    }

    /// Fails with [`Error::Connect`] when the URL names an SQLite file that does not exist:
    /// commands that work an existing database call this first, so that a mistyped path is
    /// an error and leaves no empty file behind (opening an SQLite path creates the file).
    pub fn require_existing(&self) -> Result<()> {
        if self.backend == Backend::Sqlite && !std::path::Path::new(&self.target).exists() {
            return Err(Error::Connect {
                url: self.masked(),
                source: "the SQLite file does not exist; `outbox migrate` creates it".into(),
            });
        }
        Ok(())
    }

    /// Opens one connection, configured as the pool configures its own (on SQLite: WAL, a
    /// busy timeout, foreign keys; see [`crate::db::pool`]). A producer of another process
    /// should open its SQLite connections this way, or configure them the same, or its writes
    /// get `database is locked` while a worker runs.
    ///
    /// Fails with [`Error::Connect`], carrying the server's own message, when the server is
    /// down or refuses; an SQLite file is created if it does not exist.
    pub fn connect(&self) -> Result<DbConnection> {
        let connect_error = |source: Box<dyn std::error::Error + Send + Sync>| Error::Connect {
            url: self.masked(),
            source,
        };
        let mut conn = self.establish().map_err(|e| connect_error(Box::new(e)))?;
        driver(&mut conn)
            .connection_configure()
            .map_err(|e| connect_error(Box::new(e)))?;
        Ok(conn)
    }

    /// Opens a bare connection with the backend's own driver (no session settings); on a
    /// server backend its socket is found and bounded: keepalives (MySQL: libpq sets
    /// PostgreSQL's from the URL) and the reply timeout.
    ///
    /// Every connection outbox opens comes through here, so the driver's error is scrubbed of
    /// the password here: libpq quotes pieces of the URL in its messages.
    pub(crate) fn establish(&self) -> std::result::Result<DbConnection, diesel::ConnectionError> {
        self.establish_unscrubbed().map_err(|e| {
            let secrets = self.secrets();
            let message = e.to_string();
            match secrets.found_in(&message) {
                true => diesel::ConnectionError::BadConnection(secrets.scrub(&message).into()),
                false => e,
            }
        })
    }

    fn establish_unscrubbed(&self) -> std::result::Result<DbConnection, diesel::ConnectionError> {
        use diesel::Connection;
        match self.backend {
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                diesel::sqlite::SqliteConnection::establish(&self.target).map(DbConnection::Sqlite)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => self.establish_bounded(|target| {
                let mut conn = diesel::pg::PgConnection::establish(target)?;
                if !self.statement_cache {
                    conn.set_prepared_statement_cache_size(diesel::connection::CacheSize::Disabled);
                }
                Ok(DbConnection::Pg(conn))
            }),
            #[cfg(feature = "mysql")]
            Backend::Mysql => self.establish_bounded(|target| {
                diesel::mysql::MysqlConnection::establish(target).map(DbConnection::Mysql)
            }),
            #[allow(unreachable_patterns)]
            backend => Err(diesel::ConnectionError::BadConnection(format!(
                "this build of outbox has no {backend} backend (cargo feature `{backend}`)"
            ))),
        }
    }

    /// Opens a server connection with `open`, then finds its socket and bounds it.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    fn establish_bounded(
        &self,
        open: impl FnOnce(&str) -> std::result::Result<DbConnection, diesel::ConnectionError>,
    ) -> std::result::Result<DbConnection, diesel::ConnectionError> {
        use super::{exit, reply, socket};
        let counted = exit::Connecting::start()?;
        let opening = socket::Opening::start(&self.target);
        let mut conn = open(&self.target)?;
        drop(counted);
        let socket = match opening.finish(default_port(self.backend)) {
            Ok(socket) => Some(socket),
            Err(unfound) => {
                log::warn!(
                    "{}: the new connection's socket could not be told ({unfound}): it goes \
                     without the keepalives outbox sets on MySQL and without a reply timeout",
                    self.masked()
                );
                None
            }
        };
        if let (Backend::Mysql, Some(socket)) = (self.backend, &socket) {
            if let Err(e) = socket.bound_tcp(&socket::TcpBounds {
                idle: DEFAULT_KEEPALIVES_IDLE,
                interval: DEFAULT_KEEPALIVES_INTERVAL,
                count: DEFAULT_KEEPALIVES_COUNT,
                user_timeout: DEFAULT_TCP_USER_TIMEOUT,
            }) {
                log::warn!("{}: TCP keepalives could not be set: {e}", self.masked());
            }
        }
        reply::watch(&mut conn, socket, self.reply_timeout, self.backend);
        Ok(conn)
    }
}

/// The port a server backend listens on when the URL names none.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn default_port(backend: Backend) -> u16 {
    match backend {
        Backend::Mysql => 3306,
        Backend::Postgres | Backend::Sqlite => 5432,
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseUrl")
            .field("backend", &self.backend)
            .field("url", &self.masked())
            .finish()
    }
}

#[cfg(test)]
#[path = "url_tests.rs"]
mod tests;

//! Connections: the backend a URL names ([`url`]), the connection enum handlers receive, the
//! r2d2 pool ([`pool`]), write transactions that are `IMMEDIATE` on SQLite
//! ([`transaction`]), and the reply timeout of server connections ([`reply`]).

#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
mod exit;
pub mod pool;
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
pub mod reply;
pub(crate) mod secret;
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
mod socket;
pub mod transaction;
pub mod url;

pub use exit::prepare_exit;
pub use multi::DbConnection;
#[cfg(feature = "sqlite")]
pub use pool::configure_sqlite;
pub use pool::{ConnectionManager, DbPool, PooledConnection, SQLITE_BUSY_TIMEOUT};
pub use reply::{DEFAULT_REPLY_TIMEOUT, REPLY_MARGIN};
pub use transaction::write_transaction;
pub use url::{
    DatabaseUrl, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DATABASE_URL, DEFAULT_KEEPALIVES_COUNT,
    DEFAULT_KEEPALIVES_IDLE, DEFAULT_KEEPALIVES_INTERVAL, DEFAULT_TCP_USER_TIMEOUT,
    REPLY_TIMEOUT_PARAMETER, STATEMENT_CACHE_PARAMETER,
};

#[cfg(not(any(feature = "postgres", feature = "sqlite", feature = "mysql")))]
compile_error!(
    "outbox needs at least one backend: enable the `postgres`, `sqlite` or `mysql` feature"
);

// The derive generates public helper types without docs; they live in their own module.
#[allow(missing_docs)]
mod multi {
    /// A connection to the database: what a handler's [`crate::TaskTx::conn`] returns, inside
    /// the task's transaction.
    ///
    /// Code written with diesel's DSL runs on every variant; where a handler needs SQL that
    /// only one backend has, it matches on the variant. A variant exists when its backend's
    /// cargo feature (`postgres`, `sqlite`, both by default; `mysql`) is enabled.
    ///
    /// ```no_run
    /// use outbox::DbConnection;
    ///
    /// fn backend_name(conn: &mut DbConnection) -> &'static str {
    ///     match conn {
    ///         DbConnection::Pg(_) => "postgres",
    ///         DbConnection::Sqlite(_) => "sqlite",
    ///         # #[cfg(feature = "mysql")]
    ///         # DbConnection::Mysql(_) => "mysql",
    ///     }
    /// }
    /// ```
    #[derive(diesel::MultiConnection)]
    pub enum DbConnection {
        /// A PostgreSQL connection (the fleet backend).
        #[cfg(feature = "postgres")]
        Pg(diesel::pg::PgConnection),
        /// An SQLite connection (the embedded backend).
        #[cfg(feature = "sqlite")]
        Sqlite(diesel::sqlite::SqliteConnection),
        /// A MySQL or MariaDB connection (feature `mysql`).
        #[cfg(feature = "mysql")]
        Mysql(diesel::mysql::MysqlConnection),
    }
}

/// Which database a URL names. Chosen from the scheme alone: there is no fallback from one
/// backend to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// `postgres://` or `postgresql://`.
    Postgres,
    /// `sqlite://PATH`, `sqlite:PATH`, or a plain file path.
    Sqlite,
    /// `mysql://` (MySQL 8 or MariaDB 10.6 and later).
    Mysql,
}

impl Backend {
    /// The backend's name as printed in reports: `postgres`, `sqlite` or `mysql`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
            Backend::Mysql => "mysql",
        }
    }

    /// Whether this build includes the backend (its cargo feature is enabled).
    pub fn is_built(self) -> bool {
        match self {
            Backend::Postgres => cfg!(feature = "postgres"),
            Backend::Sqlite => cfg!(feature = "sqlite"),
            Backend::Mysql => cfg!(feature = "mysql"),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl DbConnection {
    /// The backend of this connection.
    pub fn backend(&self) -> Backend {
        match self {
            #[cfg(feature = "postgres")]
            DbConnection::Pg(_) => Backend::Postgres,
            #[cfg(feature = "sqlite")]
            DbConnection::Sqlite(_) => Backend::Sqlite,
            #[cfg(feature = "mysql")]
            DbConnection::Mysql(_) => Backend::Mysql,
        }
    }
}

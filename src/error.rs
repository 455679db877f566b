//! The library's error type.

/// Everything that can go wrong in an outbox operation, named after the operation that failed.
///
/// Input errors ([`Error::InvalidKeyword`], [`Error::InvalidBizId`], [`Error::InvalidPayload`],
/// [`Error::PayloadTooLarge`], [`Error::InvalidTask`]) are detected before anything is written:
/// a failed enqueue leaves the caller's transaction as it was.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The keyword is empty, longer than 64 characters, or has a character outside
    /// `[a-z0-9._:-]`.
    #[error("invalid keyword {keyword:?}: {reason}")]
    InvalidKeyword {
        /// The keyword as given.
        keyword: String,
        /// Which rule it breaks.
        reason: &'static str,
    },

    /// The biz_id is empty or longer than 128 bytes.
    #[error("invalid biz_id for keyword {keyword:?}: {reason}")]
    InvalidBizId {
        /// The keyword of the task whose biz_id is invalid.
        keyword: String,
        /// Which rule it breaks.
        reason: &'static str,
    },

    /// The payload is not valid JSON, or holds a `\u0000` character, which PostgreSQL's
    /// `jsonb` rejects.
    #[error("invalid payload for {keyword}/{biz_id}: {reason}")]
    InvalidPayload {
        /// The task's keyword.
        keyword: String,
        /// The task's biz_id.
        biz_id: String,
        /// What is wrong with it (the parser's message, never the payload itself).
        reason: String,
    },

    /// The payload is larger than the configured limit.
    #[error("payload for {keyword}/{biz_id} is {size} bytes, over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The task's keyword.
        keyword: String,
        /// The task's biz_id.
        biz_id: String,
        /// The payload's size in bytes.
        size: usize,
        /// The configured limit in bytes.
        limit: usize,
    },

    /// Another field of a task is out of range (max attempts below 1, a tenant too long…).
    #[error("invalid task {keyword}/{biz_id}: {reason}")]
    InvalidTask {
        /// The task's keyword.
        keyword: String,
        /// The task's biz_id.
        biz_id: String,
        /// Which rule it breaks.
        reason: String,
    },

    /// The database URL is malformed or names an unsupported scheme.
    #[error("invalid database URL {url}: {reason}")]
    InvalidDatabaseUrl {
        /// The URL with any password masked.
        url: String,
        /// Why it was refused.
        reason: String,
    },

    /// A setting is out of range (a worker's, a prune's, an enqueue option).
    #[error("invalid configuration: {setting} {reason}")]
    InvalidConfig {
        /// The setting, as the CLI flag or builder method names it (`threads`, `queue`…).
        setting: &'static str,
        /// What is wrong with its value, as a predicate of the setting ("must be at least
        /// 10ms").
        reason: String,
    },

    /// Connecting to the database failed (server down, bad credentials, unreadable file):
    /// the source is the server's or the driver's own message.
    #[error("cannot connect to {url}: {source}")]
    Connect {
        /// The URL with any password masked.
        url: String,
        /// What the driver or the pool said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// Applying or checking the embedded migrations failed.
    #[error("{operation} failed: {source}")]
    Migration {
        /// `migrate` or `migration check`.
        operation: &'static str,
        /// What the migration harness or the database said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// No task has this id or key.
    #[error("no task {task}")]
    TaskNotFound {
        /// The id, or `keyword biz_id`, as asked for.
        task: String,
    },

    /// An operator answered no when asked to confirm a change (`outbox retry --all` of more
    /// than 1,000 tasks); nothing was written.
    #[error("{change} not confirmed; nothing written")]
    NotConfirmed {
        /// The change, as the question named it.
        change: String,
    },

    /// An enqueue would take a tenant past its `max_queued` (`async_tenant`); nothing of the
    /// batch was written. On PostgreSQL the failed statement aborts the caller's transaction,
    /// as any failed statement does (enqueue inside a nested `transaction`, a savepoint, to
    /// carry on without it); on SQLite the transaction is left as it was.
    #[error("tenant {tenant:?} is at its max_queued of {limit} queued tasks")]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// Its `max_queued`.
        limit: i64,
    },

    /// No tenant has this name (`async_tenant`).
    #[error("no tenant {tenant:?}")]
    TenantNotFound {
        /// The tenant as asked for.
        tenant: String,
    },

    /// A domain's configuration is invalid: a bad name or keyword, a keyword another domain
    /// lists, a `MAX` over the node's threads, `RESERVED` threads that leave `default` none.
    #[error("domain {domain:?}: {reason}")]
    InvalidDomain {
        /// The domain at fault.
        domain: String,
        /// What is wrong with it.
        reason: String,
    },

    /// No domain or keyword has this name (in `async_domain`, or on a live node).
    #[error("no domain or keyword {name:?} (see `outbox domain list`)")]
    DomainNotFound {
        /// The name as given.
        name: String,
    },

    /// A cron schedule is invalid: its expression, its keyword, its backfill or data, or a
    /// line of a crontab file (each named).
    #[error(transparent)]
    Schedule(#[from] crate::schedule::ScheduleError),

    /// The schema is older than this build: `outbox migrate` has not been run.
    #[error("the database schema is not up to date ({pending} pending migration(s)); run `outbox migrate`")]
    NotMigrated {
        /// How many migrations are pending.
        pending: usize,
    },

    /// A database statement failed.
    #[error("{operation} failed: {source}")]
    Database {
        /// The operation, entity first (`task claim`, `task enqueue`, `node register`…).
        operation: &'static str,
        /// diesel's error.
        #[source]
        source: diesel::result::Error,
    },

    /// Taking a connection from the pool failed (timeout, database unreachable).
    #[error("{operation} failed: no database connection: {source}")]
    Pool {
        /// The operation that needed the connection.
        operation: &'static str,
        /// r2d2's error, which carries the last connection error.
        #[source]
        source: r2d2::Error,
    },

    /// A thread the worker needs could not be started.
    #[error("cannot start the {thread} thread: {source}")]
    Thread {
        /// Which thread (`heartbeat`, `rescue`, `watchdog`, `claiming`, `execution pool`).
        thread: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// The metrics endpoint could not listen on its address (in use, not an address of this
    /// machine, a privileged port).
    #[error("cannot serve metrics on {addr}: {reason}")]
    MetricsServer {
        /// The address asked for (`--metrics-addr`).
        addr: String,
        /// The operating system's reason.
        reason: String,
    },

    /// The SIGINT/SIGTERM handlers could not be installed.
    #[error("cannot install the signal handlers: {source}")]
    Signal {
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// `outbox web` could not listen on its address: in use, not an address of this
    /// machine, or a privileged port.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },

    /// A worker thread panicked outside any handler (handlers' panics are caught and counted
    /// as the task's failure); its tasks are left to rescue.
    #[error("the {thread} thread panicked")]
    Panicked {
        /// Which thread.
        thread: &'static str,
    },

    /// The node has not recorded a heartbeat for so long that other nodes may rescue its
    /// tasks: it does not claim more until a heartbeat succeeds again.
    #[error(
        "node {node_id} has not recorded a heartbeat for {since:?}; not claiming until it does"
    )]
    HeartbeatStale {
        /// This node.
        node_id: i64,
        /// Time since its last successful heartbeat.
        since: std::time::Duration,
    },

    /// After a stop signal, tasks still ran when the shutdown timeout expired; the process
    /// exits and rescue recovers them.
    #[error("{running} task(s) still running {timeout:?} after the stop signal; exiting, rescue will recover them")]
    ShutdownTimeout {
        /// Tasks still in flight.
        running: u64,
        /// The shutdown timeout.
        timeout: std::time::Duration,
    },

    // A worker serving several databases (`crate::Fleet`).
    /// What failed on one of the databases a [`crate::Fleet`] serves.
    #[error("database {database}: {source}")]
    OnDatabase {
        /// The database's URL, its password masked.
        database: String,
        /// What failed there.
        source: Box<Error>,
    },
}

/// The library's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A bare diesel error reaching the library's error type comes from a transaction's own
/// `BEGIN`, `COMMIT` or `ROLLBACK` (see [`crate::db::write_transaction`]); statements name
/// their operation through `.op(…)`.
impl From<diesel::result::Error> for Error {
    fn from(source: diesel::result::Error) -> Self {
        Error::Database {
            operation: "transaction",
            source,
        }
    }
}

/// Attach an operation name to diesel errors: `.op("task claim")?`.
pub(crate) trait OpContext<T> {
    fn op(self, operation: &'static str) -> Result<T>;
}

impl<T> OpContext<T> for std::result::Result<T, diesel::result::Error> {
    fn op(self, operation: &'static str) -> Result<T> {
        self.map_err(|source| Error::Database { operation, source })
    }
}

impl<T> OpContext<T> for std::result::Result<T, r2d2::Error> {
    fn op(self, operation: &'static str) -> Result<T> {
        self.map_err(|source| Error::Pool { operation, source })
    }
}

impl Error {
    /// Whether a statement failed because its connection was found dead (a backend
    /// terminated while the connection sat idle in the pool, a server restart).
    /// This error as one of `url`'s, for a worker serving several databases.
    pub(crate) fn on_database(self, url: &crate::db::DatabaseUrl) -> Error {
        Error::OnDatabase {
            database: url.masked(),
            source: Box::new(self),
        }
    }

    pub(crate) fn is_connection_lost(&self) -> bool {
        use crate::db::transaction::is_connection_error;
        match self {
            Error::Database { source, .. } => is_connection_error(source),
            // The migration check's read, on a connection found dead.
            Error::Migration { source, .. } => source
                .downcast_ref::<diesel::result::Error>()
                .is_some_and(is_connection_error),
            _ => false,
        }
    }

    /// Whether a statement failed because a lock it waited for was not granted within the
    /// session's lock timeout: PostgreSQL's `lock_timeout` (SQLSTATE 55P03), InnoDB's
    /// `innodb_lock_wait_timeout` (error 1205). Matched by the messages' openings.
    pub(crate) fn is_lock_timeout(&self) -> bool {
        matches!(self, Error::Database {
            source: diesel::result::Error::DatabaseError(_, info), ..
        } if ["canceling statement due to lock timeout", "Lock wait timeout exceeded"]
            .iter()
            .any(|opening| info.message().starts_with(opening)))
    }
}

/// Shortens a message to at most `max` bytes on a character boundary, marking the cut.
pub(crate) fn truncate(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_owned();
    }
    let mut end = max.saturating_sub(3);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncates_on_char_boundary() {
        assert_eq!(truncate("hello", 10), "hello");
        assert_eq!(truncate("hello world", 8), "hello...");
        let cut = truncate("ééééé", 6);
        assert!(cut.len() <= 6 && cut.ends_with("..."), "{cut}");
    }
}

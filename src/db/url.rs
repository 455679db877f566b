//! Database URLs: which backend a string names, and what is handed to its driver.

use std::fmt;
use std::time::Duration;

use super::{Backend, DbConnection};
use crate::driver::driver;
use crate::error::{Error, Result};

/// The database URL used when neither `--database-url` nor `DATABASE_URL` is given.
pub const DEFAULT_DATABASE_URL: &str = "outbox.db";

/// How long opening a PostgreSQL connection may take before it fails, unless the URL sets
/// libpq's `connect_timeout` itself. Without it, a host that drops packets blocks a claim for
/// minutes (the kernel's TCP retries), and a server that accepts but never answers, forever.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A validated database URL: the backend and the string to hand to its driver.
///
/// The backend follows from the text alone, and never falls back to the other one:
/// `postgres://…` and `postgresql://…` name PostgreSQL; `mysql://…` names MySQL or MariaDB;
/// `sqlite://PATH`, `sqlite:PATH` or a plain file path name an SQLite file.
#[derive(Clone, PartialEq, Eq)]
pub struct DatabaseUrl {
    backend: Backend,
    /// The URL for PostgreSQL (with a connect timeout), the file path for SQLite.
    target: String,
    original: String,
}

impl DatabaseUrl {
    /// Parses a URL, refusing anything that names neither backend plainly.
    ///
    /// Refused, with [`Error::InvalidDatabaseUrl`]: an empty string; any other `scheme://`
    /// or `scheme:` (a `postgres:/host` missing a slash is not taken for a file); a libpq
    /// keyword/value string (`dbname=app host=db`, which is not a URL: write
    /// `postgres://db/app`); control characters; a path ending in `/`; an in-memory SQLite
    /// database, which the worker's pooled connections could not share; a backend this build
    /// lacks (its cargo feature is off: `mysql` is not a default one). A PostgreSQL URL
    /// without `connect_timeout` gets [`DEFAULT_CONNECT_TIMEOUT`].
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
            (Backend::Postgres, with_connect_timeout(text))
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
        Ok(DatabaseUrl {
            backend,
            target,
            original: text.to_owned(),
        })
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
    pub fn masked(&self) -> String {
        MaskedUrl(&self.original).to_string()
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

    /// Opens a bare connection with the backend's own driver (no session settings).
    pub(crate) fn establish(&self) -> std::result::Result<DbConnection, diesel::ConnectionError> {
        use diesel::Connection;
        match self.backend {
            #[cfg(feature = "postgres")]
            Backend::Postgres => {
                diesel::pg::PgConnection::establish(&self.target).map(DbConnection::Pg)
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                diesel::sqlite::SqliteConnection::establish(&self.target).map(DbConnection::Sqlite)
            }
            #[cfg(feature = "mysql")]
            Backend::Mysql => {
                diesel::mysql::MysqlConnection::establish(&self.target).map(DbConnection::Mysql)
            }
            #[allow(unreachable_patterns)]
            backend => Err(diesel::ConnectionError::BadConnection(format!(
                "this build of outbox has no {backend} backend (cargo feature `{backend}`)"
            ))),
        }
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

/// The scheme of `text` if it starts like a URL (`scheme:`), other than SQLite's.
fn scheme_of(text: &str) -> Option<&str> {
    let colon = text.find(':')?;
    let scheme = &text[..colon];
    let mut chars = scheme.chars();
    let first_is_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    (first_is_letter && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
        .then_some(scheme)
}

/// Whether `text` reads like libpq's `keyword=value …` connection string.
fn looks_like_keyword_value(text: &str) -> bool {
    let before_slash = text.split('/').next().unwrap_or(text);
    match before_slash.split_once('=') {
        Some((key, _)) => {
            let key = key.trim();
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

/// `url` with libpq's `connect_timeout` set, unless it sets one.
fn with_connect_timeout(url: &str) -> String {
    if url.contains("connect_timeout=") {
        return url.to_owned();
    }
    let separator = if url.contains('?') { '&' } else { '?' };
    format!(
        "{url}{separator}connect_timeout={}",
        DEFAULT_CONNECT_TIMEOUT.as_secs()
    )
}

/// Displays a URL with its password replaced by `***`, for error messages and logs.
pub(crate) struct MaskedUrl<'a>(pub &'a str);

impl fmt::Display for MaskedUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let url = self.0;
        if let Some(scheme_end) = url.find("://") {
            let rest = &url[scheme_end + 3..];
            let authority_end = rest.find('/').unwrap_or(rest.len());
            if let Some(at) = rest[..authority_end].rfind('@') {
                if let Some(colon) = rest[..at].find(':') {
                    return write!(
                        f,
                        "{}{}:***{}",
                        &url[..scheme_end + 3],
                        &rest[..colon],
                        &rest[at..]
                    );
                }
            }
        }
        // A keyword/value string may carry `password=…`.
        if let Some(at) = url.find("password=") {
            let end = url[at..].find(' ').map_or(url.len(), |e| at + e);
            return write!(f, "{}password=***{}", &url[..at], &url[end..]);
        }
        f.write_str(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_schemes() {
        let pg = DatabaseUrl::parse("postgresql://u:p@h/db").unwrap();
        assert_eq!(pg.backend(), Backend::Postgres);
        assert_eq!(pg.masked(), "postgresql://u:***@h/db");
        let s = DatabaseUrl::parse("sqlite:///tmp/x.db").unwrap();
        assert_eq!(
            (s.backend(), s.target.as_str()),
            (Backend::Sqlite, "/tmp/x.db")
        );
        let s = DatabaseUrl::parse("sqlite:x.db").unwrap();
        assert_eq!(s.target, "x.db");
        let s = DatabaseUrl::parse("./data/outbox.db").unwrap();
        assert_eq!(s.target, "./data/outbox.db");
        let s = DatabaseUrl::parse("data/x=1.db").unwrap();
        assert_eq!(
            s.target, "data/x=1.db",
            "an = after a slash is part of a path"
        );
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_urls_select_mysql() {
        let url = DatabaseUrl::parse("mysql://u:secret@h:3306/db").unwrap();
        assert_eq!(url.backend(), Backend::Mysql);
        assert_eq!(url.masked(), "mysql://u:***@h:3306/db");
    }

    /// A build without the feature refuses the URL at parse, naming the feature: a usage
    /// error, not a connection that fails later (scripts/test.sh runs this without it).
    #[cfg(not(feature = "mysql"))]
    #[test]
    fn a_mysql_url_without_the_feature_names_the_feature() {
        let message = DatabaseUrl::parse("mysql://h/db").unwrap_err().to_string();
        assert!(message.contains("cargo feature `mysql`"), "{message}");
    }

    #[test]
    fn strings_that_name_no_backend_plainly_are_refused() {
        for bad in [
            "",
            "  ",
            "mariadb://h/db",
            "sqlite://",
            ":memory:",
            "sqlite::memory:",
            "dbname=app",
            "host=db dbname=app user=u",
            "postgres:/h/db",
            "postgresql:h",
            "file.db\0",
            "data/",
        ] {
            assert!(
                matches!(
                    DatabaseUrl::parse(bad),
                    Err(Error::InvalidDatabaseUrl { .. })
                ),
                "{bad:?} must be refused"
            );
        }
        let message = DatabaseUrl::parse("dbname=app password=hunter2")
            .unwrap_err()
            .to_string();
        assert!(message.contains("keyword/value"), "{message}");
        assert!(
            !message.contains("hunter2"),
            "the password is masked: {message}"
        );
    }

    #[test]
    fn postgres_urls_get_a_connect_timeout_unless_they_set_one() {
        let target = |url: &str| DatabaseUrl::parse(url).unwrap().target;
        assert_eq!(
            target("postgres://h/db"),
            "postgres://h/db?connect_timeout=10"
        );
        assert_eq!(
            target("postgres://h/db?sslmode=disable"),
            "postgres://h/db?sslmode=disable&connect_timeout=10"
        );
        assert_eq!(
            target("postgres://h/db?connect_timeout=3"),
            "postgres://h/db?connect_timeout=3"
        );
        let url = DatabaseUrl::parse("postgres://u:secret@h/db").unwrap();
        assert_eq!(url.as_str(), "postgres://u:secret@h/db");
        assert!(!format!("{url:?}").contains("secret"));
    }

    #[test]
    fn masks_password_only() {
        assert_eq!(
            MaskedUrl("postgres://u:secret@h:5432/db").to_string(),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            MaskedUrl("postgres://u@h/db").to_string(),
            "postgres://u@h/db"
        );
        assert_eq!(MaskedUrl("outbox.db").to_string(), "outbox.db");
        assert_eq!(
            MaskedUrl("host=h password=x user=u").to_string(),
            "host=h password=*** user=u"
        );
    }
}

//! Tests of `url.rs`.

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
fn postgres_urls_get_timeouts_and_keepalives_unless_they_set_them() {
    const DEFAULTS: &str = "connect_timeout=10&keepalives=1&keepalives_idle=30\
        &keepalives_interval=10&keepalives_count=3&tcp_user_timeout=60000";
    let target = |url: &str| DatabaseUrl::parse(url).unwrap().target;
    assert_eq!(
        target("postgres://h/db"),
        format!("postgres://h/db?{DEFAULTS}")
    );
    assert_eq!(
        target("postgres://h/db?sslmode=disable"),
        format!("postgres://h/db?sslmode=disable&{DEFAULTS}")
    );
    // What the URL sets stays as it is, and only that is not added; `keepalives_idle`
    // is not taken for `keepalives`.
    assert_eq!(
        target("postgres://h/db?connect_timeout=3&keepalives_idle=5&tcp_user_timeout=0"),
        "postgres://h/db?connect_timeout=3&keepalives_idle=5&tcp_user_timeout=0\
         &keepalives=1&keepalives_interval=10&keepalives_count=3"
    );
    assert_eq!(
        target("postgres://h/db?keepalives=0"),
        "postgres://h/db?keepalives=0&connect_timeout=10&keepalives_idle=30\
         &keepalives_interval=10&keepalives_count=3&tcp_user_timeout=60000"
    );
    let url = DatabaseUrl::parse("postgres://u:secret@h/db").unwrap();
    assert_eq!(url.as_str(), "postgres://u:secret@h/db");
    assert!(!format!("{url:?}").contains("secret"));
}

#[test]
fn reply_timeouts_are_read_from_server_urls_and_not_passed_on() {
    let url = DatabaseUrl::parse("postgres://h/db?reply_timeout=90s&sslmode=disable").unwrap();
    assert_eq!(url.reply_timeout(), Some(Duration::from_secs(90)));
    assert!(!url.target.contains("reply_timeout"), "{}", url.target);
    assert!(url.target.starts_with("postgres://h/db?sslmode=disable&"));
    assert!(url.as_str().contains("reply_timeout=90s"), "kept as given");
    let url = DatabaseUrl::parse("postgres://h/db?reply_timeout=off").unwrap();
    assert_eq!(url.reply_timeout(), None);
    assert!(DatabaseUrl::parse("postgres://h/db")
        .unwrap()
        .reply_timeout()
        .is_some_and(|t| t >= super::super::reply::DEFAULT_REPLY_TIMEOUT));
    for bad in ["soon", "500ms", "-1s"] {
        let message = DatabaseUrl::parse(&format!("postgres://h/db?reply_timeout={bad}"))
            .unwrap_err()
            .to_string();
        assert!(message.contains("reply_timeout"), "{message}");
    }
    let url = DatabaseUrl::parse("postgres://h/db")
        .unwrap()
        .with_reply_timeout(Some(Duration::from_secs(5)));
    assert_eq!(url.reply_timeout(), Some(Duration::from_secs(5)));
    assert_eq!(
        url.clone().unless_reply_timeout_set().reply_timeout(),
        url.reply_timeout()
    );
    let unset = DatabaseUrl::parse("postgres://h/db").unwrap();
    assert_eq!(unset.unless_reply_timeout_set().reply_timeout(), None);
}

#[test]
fn the_statement_cache_is_set_on_postgres_urls_and_not_passed_on() {
    let url = DatabaseUrl::parse("postgres://h/db?statement_cache=off&sslmode=disable").unwrap();
    assert!(!url.statement_cache);
    assert!(!url.target.contains("statement_cache"), "{}", url.target);
    assert!(url.target.contains("sslmode=disable"), "{}", url.target);
    assert!(
        DatabaseUrl::parse("postgres://h/db?statement_cache=ON")
            .unwrap()
            .statement_cache
    );
    assert!(
        DatabaseUrl::parse("postgres://h/db")
            .unwrap()
            .statement_cache
    );
    let message = DatabaseUrl::parse("postgres://h/db?statement_cache=no")
        .unwrap_err()
        .to_string();
    assert!(message.contains("on or off"), "{message}");
    let message = DatabaseUrl::parse("sqlite://a.db?statement_cache=off")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(message.contains("PostgreSQL"), "{message}");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_urls_keep_their_parameters_but_the_reply_timeout() {
    let url = DatabaseUrl::parse("mysql://u@h/db?reply_timeout=2m&ssl_mode=disabled").unwrap();
    assert_eq!(url.target, "mysql://u@h/db?ssl_mode=disabled");
    assert_eq!(url.reply_timeout(), Some(Duration::from_secs(120)));
    assert_eq!(
        DatabaseUrl::parse("mysql://u@h/db?reply_timeout=1m")
            .unwrap()
            .target,
        "mysql://u@h/db"
    );
}

/// libpq quotes a bad percent-escape whole, the password's included: what reaches the
/// caller is scrubbed (`parse` refuses such a URL first; this one is built past it).
#[cfg(feature = "postgres")]
#[test]
fn what_libpq_says_is_scrubbed_of_the_password() {
    let text = "postgres://w:Se%zzcret2@127.0.0.1:1/db";
    let url = DatabaseUrl {
        backend: Backend::Postgres,
        target: text.to_owned(),
        original: text.to_owned(),
        reply_timeout: ReplyTimeout::Off,
        statement_cache: true,
    };
    let message = url
        .connect()
        .err()
        .expect("libpq refuses the URL")
        .to_string();
    assert!(
        message.contains("percent-encoded"),
        "libpq's own message: {message}"
    );
    assert!(!message.contains("zzcret2"), "{message}");
    assert!(matches!(
        DatabaseUrl::parse(text),
        Err(Error::InvalidDatabaseUrl { url, .. }) if url == "postgres://w:***@127.0.0.1:1/db"
    ));
}

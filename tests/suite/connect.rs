//! Connections: errors carry the database's own message; a server that never answers fails
//! within the connect timeout; MySQL sessions read English messages.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::Connection;
use outbox::{
    enqueue_batch, Backend, ClaimStyle, DatabaseUrl, NewTask, Registry, Worker, WorkerConfig,
    DEFAULT_CONNECT_TIMEOUT,
};

use crate::support::pg_server_url;
use crate::write_ledger;

every_backend! {
    fn a_pool_that_cannot_open_a_connection_reports_the_databases_own_message(db: &TestDb) {
        let pool = db.url.pool(2).unwrap();
        // The database goes away after the pool was built.
        let expected = match db.backend() {
            Backend::Postgres => {
                let name = db.url_text.rsplit('/').next().unwrap();
                diesel::pg::PgConnection::establish(pg_server_url())
                    .unwrap()
                    .batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)"))
                    .unwrap();
                "does not exist"
            }
            Backend::Sqlite => {
                let dir = std::path::Path::new(&db.url_text).parent().unwrap();
                std::fs::remove_dir_all(dir).unwrap();
                "nable to open the database file"
            }
            Backend::Mysql => {
                let name = db.url_text.rsplit('/').next().unwrap();
                db.exec(&format!("DROP DATABASE {name}"));
                "Unknown database"
            }
        };
        let error = match pool.get_timeout(Duration::from_secs(2)) {
            Ok(_) => panic!("a connection to a database that is gone"),
            Err(e) => e.to_string(),
        };
        assert!(error.contains(expected), "{error}");
    }
}

/// A server that accepts the TCP connection and never answers (a black-holed host, a hung
/// server) fails the connection within the connect timeout instead of blocking for good.
#[test]
fn a_server_that_never_answers_fails_within_the_connect_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = DatabaseUrl::parse(&format!("postgres://outbox@127.0.0.1:{port}/app")).unwrap();
    let (done, result) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = done.send(url.connect().map(|_| ()).map_err(|e| e.to_string()));
    });
    let outcome = result
        .recv_timeout(DEFAULT_CONNECT_TIMEOUT + Duration::from_secs(20))
        .expect("connect() did not return within the connect timeout");
    let error = outcome.expect_err("a server that never answers");
    assert!(
        error.contains("cannot connect to postgres://outbox@127.0.0.1"),
        "{error}"
    );
    assert!(started.elapsed() >= DEFAULT_CONNECT_TIMEOUT - Duration::from_secs(1));
    drop(listener);
}

every_backend! {
    fn a_worker_runs_on_a_pool_of_the_callers_own(db: &TestDb) {
        use outbox::db::ConnectionManager;
        let id = outbox::enqueue(&mut db.conn(), &outbox::NewTask::new("ledger", "1")).unwrap().id;
        let config = || outbox::WorkerConfig::default().threads(2);
        let pool_of = |size| r2d2::Pool::builder().max_size(size).build(ConnectionManager::new(&db.url)).unwrap();
        // Fewer connections than threads + 2 could starve the claim of one: refused, named.
        let small = outbox::Worker::with_pool(&db.url, pool_of(3), crate::ledger_registry("ledger"), config());
        assert!(matches!(small, Err(outbox::Error::InvalidConfig { setting: "pool size", .. })));
        let worker = outbox::Worker::with_pool(&db.url, pool_of(4), crate::ledger_registry("ledger"), config()).unwrap();
        assert_eq!(worker.drain().unwrap().tally.done, 1);
        assert_eq!(db.ledger_rows(id), 1);
    }
}

/// The pool does not test connections on checkout: after every idle connection of a worker
/// was terminated (a failover, a `pg_terminate_backend` sweep), each is found dead at its next
/// use. A drain takes another connection at once rather than failing or backing off, whatever
/// the claim style.
#[test]
fn a_worker_whose_idle_connections_were_all_terminated_drains_at_once() {
    for style in [ClaimStyle::Lock, ClaimStyle::Stamp] {
        let db = &crate::support::TestDb::postgres();
        let mut registry = Registry::new();
        registry.register("ledger", write_ledger);
        let config = WorkerConfig::default()
            .threads(2)
            .commit_batch(5)
            .claim_style(style);
        let w = Worker::new(&db.url, registry, config).unwrap();
        let tasks: Vec<NewTask> = (1..=20)
            .map(|i| NewTask::new("ledger", i.to_string()))
            .collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        assert_eq!(w.drain().unwrap().tally.done, 20, "{style}");
        // However many connections the drain happened to open at once, the pool holds three
        // idle ones.
        let held: Vec<_> = (0..3).map(|_| w.pool().get().unwrap()).collect();
        drop(held);
        // Every other session of the database: the pool's idle connections.
        let terminated = db.count(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        );
        assert!(terminated >= 3, "{style}: {terminated} sessions terminated");
        let tasks: Vec<NewTask> = (21..=40)
            .map(|i| NewTask::new("ledger", i.to_string()))
            .collect();
        enqueue_batch(&mut db.conn(), &tasks).unwrap();
        let report = w.drain().unwrap_or_else(|e| panic!("{style}: {e}"));
        assert_eq!(report.tally.done, 20, "{style}: {:?}", report.tally);
        assert_eq!(
            db.count("SELECT count(DISTINCT task_id) FROM test_ledger"),
            40
        );
    }
}

/// A worker started on a pool whose idle connections were terminated since they were opened
/// (a failover or a `pg_terminate_backend` sweep between the pool's start and the worker's):
/// its start-up check and registration take another connection, as a drain does, instead of
/// failing with "terminating connection" (a process started during a sweep would exit 1).
#[test]
fn a_worker_starts_on_a_pool_whose_idle_connections_were_terminated() {
    let db = &crate::support::TestDb::postgres();
    let pool = db.url.pool(4).unwrap();
    let held: Vec<_> = (0..4).map(|_| pool.get().unwrap()).collect();
    drop(held);
    let terminated = db.count(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    assert!(terminated >= 4, "{terminated} sessions terminated");
    let mut registry = Registry::new();
    registry.register("ledger", write_ledger);
    let config = WorkerConfig::default().threads(2);
    let w = Worker::with_pool(&db.url, pool, registry, config)
        .unwrap_or_else(|e| panic!("the worker did not start: {e}"));
    enqueue_batch(&mut db.conn(), &[NewTask::new("ledger", "1")]).unwrap();
    assert_eq!(w.drain().unwrap().tally.done, 1);
}

/// MySQL: outbox tells InnoDB's deadlock victim, its lock wait timeout and a lost session from
/// a task's failure by the server's message, so every session it opens asks for English
/// messages, whatever language the server speaks by default (`lc_messages`). The server speaks
/// German to new sessions only for the milliseconds two connections take to open, a bare one
/// and outbox's: the bare one shows that it did. (Other tests' sessions opened meanwhile are
/// outbox's, English by the same setting, or bare ones that read no message.)
#[cfg(feature = "mysql")]
#[test]
fn outbox_reads_mysql_messages_in_english_from_a_server_set_to_another_language() {
    use diesel::mysql::MysqlConnection;

    let db = &crate::support::TestDb::mysql();
    db.exec("CREATE TABLE lang_rows (id INT PRIMARY KEY)");
    db.exec("INSERT INTO lang_rows (id) VALUES (1)");
    #[derive(diesel::QueryableByName)]
    struct Language {
        #[diesel(sql_type = diesel::sql_types::Text)]
        lc: String,
    }
    let global = |conn: &mut outbox::DbConnection| -> String {
        use diesel::RunQueryDsl;
        diesel::sql_query("SELECT @@GLOBAL.lc_messages AS lc")
            .get_result::<Language>(conn)
            .unwrap()
            .lc
    };
    let mut admin = db.conn();
    let before = global(&mut admin);
    admin
        .batch_execute("SET GLOBAL lc_messages = 'de_DE'")
        .expect("the test's MySQL user may set a global variable (SUPER)");
    let opened = (MysqlConnection::establish(&db.url_text), db.url.connect());
    admin
        .batch_execute(&format!("SET GLOBAL lc_messages = '{before}'"))
        .unwrap();
    assert_eq!(global(&mut admin), before, "the server's language restored");
    let (mut bare, mut configured) = (opened.0.unwrap(), opened.1.unwrap());
    let session = "SELECT @@SESSION.lc_messages AS lc";
    {
        use diesel::RunQueryDsl;
        let bare_lc = diesel::sql_query(session).get_result::<Language>(&mut bare);
        assert_eq!(bare_lc.unwrap().lc, "de_DE", "the bare session's language");
        let outbox_lc = diesel::sql_query(session).get_result::<Language>(&mut configured);
        assert_eq!(
            outbox_lc.unwrap().lc,
            "en_US",
            "outbox's session's language"
        );
    }
    let mut locker = db.conn();
    locker
        .batch_execute("BEGIN; SELECT id FROM lang_rows WHERE id = 1 FOR UPDATE")
        .unwrap();
    let wait = "SET SESSION innodb_lock_wait_timeout = 1;
                SELECT id FROM lang_rows WHERE id = 1 FOR UPDATE";
    let german = bare.batch_execute(wait).unwrap_err().to_string();
    assert!(
        german.starts_with("Beim Warten auf eine Sperre"),
        "the bare session's lock wait timeout: {german}"
    );
    let english = configured.batch_execute(wait).unwrap_err().to_string();
    assert!(
        english.starts_with("Lock wait timeout exceeded"),
        "outbox's session read: {english}"
    );
    locker.batch_execute("COMMIT").unwrap();
}

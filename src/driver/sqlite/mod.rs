//! The driver on SQLite: one writer at a time, so the claim needs no `SKIP LOCKED`; times
//! are text written by SQLite's own clock; migrations in an exclusive transaction.

// Every time column is written with this expression (millisecond precision, UTC), so that
// times compare correctly as text. The migrations' column defaults write the same text with
// `strftime('%Y-%m-%d %H:%M:%f', 'now')`; `datetime(…, 'subsec')` spells it with integer
// arithmetic where `strftime`'s `%f` formats a float (about a microsecond less per call, and
// a completion makes two; the test below holds the two to the same text).
macro_rules! now {
    () => {
        "datetime('now', 'subsec')"
    };
}

mod enqueue;
mod fair;
mod maintenance;
mod ops;
mod task;

// The backend's functions of the [`Driver`] methods it shares the shape of, under their names.
pub(super) use enqueue::{
    find_many as task_find_many, insert_many as task_insert_many, link_parents as task_link_parents,
};
pub(super) use maintenance::prune_tasks as task_prune_batch;
pub(super) use ops::retry as task_retry;
pub(super) use task::{
    claim_limited as task_claim_limited, claim_page as task_claim_page,
    claim_plan as task_claim_plan, claim_suspect as task_claim_suspect, complete as task_complete,
    complete_many as task_complete_many, rescue_dying as task_rescue_dying,
    rescue_many as task_rescue_many, suspects_exist as task_suspects_exist,
};

use std::time::{Duration, Instant};

use diesel::connection::{AnsiTransactionManager, SimpleConnection};
use diesel::sqlite::SqliteConnection;
use diesel::QueryResult;
use diesel_migrations::{embed_migrations, EmbeddedMigrations};

use super::{
    migrations_apply, rollback_unless_applied, rolled_back, Conn, Driver, LeaseDriver,
    MigrationError, TxMark,
};
use crate::db::SQLITE_BUSY_TIMEOUT;

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// How long a migration run waits for another one's lock at most.
const MIGRATION_WAIT: std::time::Duration = std::time::Duration::from_secs(300);

// No lock claims (see `LeaseDriver`).
impl LeaseDriver for SqliteConnection {}

impl Driver for SqliteConnection {
    fn conn(&mut self) -> Conn<'_> {
        Conn::Sqlite(self)
    }

    /// WAL so readers never block the writer, `synchronous=NORMAL` (durable at checkpoints,
    /// never corrupt), a busy timeout so that competing writers queue instead of failing,
    /// and foreign keys on.
    ///
    /// Switching a new file to WAL needs an exclusive lock and SQLite reports `database is
    /// locked` at once, without consulting the busy timeout, when another process holds the
    /// file (five `migrate`s at once on a new file): that is retried until the busy timeout.
    fn connection_configure(&mut self) -> QueryResult<()> {
        self.batch_execute(&format!(
            "PRAGMA busy_timeout = {};",
            SQLITE_BUSY_TIMEOUT.as_millis()
        ))?;
        let give_up = Instant::now() + SQLITE_BUSY_TIMEOUT;
        loop {
            match self.batch_execute("PRAGMA journal_mode = WAL;") {
                Err(diesel::result::Error::DatabaseError(_, info))
                    if info.message().contains("locked") && Instant::now() < give_up =>
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                other => break other,
            }
        }?;
        self.batch_execute("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
    }

    fn transaction_begin(&mut self, _mark: Option<TxMark>) -> QueryResult<()> {
        AnsiTransactionManager::begin_transaction_sql(self, "BEGIN IMMEDIATE")
    }

    /// In an `EXCLUSIVE` transaction: diesel's harness runs each migration in a savepoint
    /// inside it, and a second process waits instead of racing: for the busy timeout, then
    /// again, up to [`MIGRATION_WAIT`] in all (another run on a large file may hold the lock
    /// for minutes), as PostgreSQL's and MySQL's runs wait for their locks.
    fn migrations_run(&mut self) -> Result<Vec<String>, MigrationError> {
        let started = std::time::Instant::now();
        loop {
            let mut applied = Err(MigrationError::from("not run"));
            let began = std::cell::Cell::new(false);
            let run = self.exclusive_transaction(|conn| -> QueryResult<()> {
                began.set(true);
                applied = migrations_apply(conn, MIGRATIONS);
                rollback_unless_applied(&applied)
            });
            match run {
                Err(e)
                    if !began.get()
                        && crate::db::transaction::is_infrastructure(&e)
                        && started.elapsed() < MIGRATION_WAIT =>
                {
                    // (A connection without a busy timeout is refused at once.)
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    continue;
                }
                run => run.or_else(rolled_back)?,
            }
            return applied;
        }
    }

    fn migrations_known(&self) -> Result<Vec<String>, MigrationError> {
        super::migration_versions::<diesel::sqlite::Sqlite>(&MIGRATIONS)
    }

    fn atomically(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Driver) -> QueryResult<()>,
    ) -> QueryResult<()> {
        if crate::db::transaction::depth_of(self) == Some(0) {
            self.immediate_transaction(|conn| f(conn))
        } else {
            diesel::Connection::transaction(self, |conn| f(conn))
        }
    }
}

#[cfg(test)]
mod tests {
    use diesel::sql_types::{BigInt, Text};
    use diesel::{Connection, QueryableByName, RunQueryDsl, SqliteConnection};

    #[derive(QueryableByName)]
    struct Pair {
        #[diesel(sql_type = Text)]
        by_strftime: String,
        #[diesel(sql_type = Text)]
        by_datetime: String,
    }

    /// `datetime(t, 'subsec')` (what the engine writes) and `strftime('%Y-%m-%d %H:%M:%f', t)`
    /// (what the migrations' defaults write) give the same text for every millisecond: both
    /// kinds of row compare and sort together.
    #[test]
    fn both_clock_spellings_write_the_same_text() {
        let mut conn = SqliteConnection::establish(":memory:").expect("in-memory SQLite");
        // Every millisecond of two seconds that end a minute, a day and a year, and a spread
        // of instants from 1970 to 9999.
        let mut starts: Vec<i64> = vec![1_798_761_598_000, 1_700_006_398_000, 59_000];
        starts.extend((0..200).map(|i| i * 1_267_650_600_228 + 123));
        for start in starts {
            let pairs: Vec<Pair> = diesel::sql_query(
                "WITH RECURSIVE ms(t) AS (SELECT ?1 UNION ALL SELECT t + 1 FROM ms WHERE t < ?1 + 1999)
                 SELECT strftime('%Y-%m-%d %H:%M:%f', t / 1000.0, 'unixepoch') AS by_strftime,
                        datetime(t / 1000.0, 'unixepoch', 'subsec') AS by_datetime FROM ms",
            )
            .bind::<BigInt, _>(start)
            .load(&mut conn)
            .expect("the query runs");
            assert_eq!(pairs.len(), 2000);
            for p in pairs {
                assert_eq!(p.by_strftime, p.by_datetime, "from {start}");
                assert_eq!(p.by_datetime.len(), 23, "{}", p.by_datetime);
            }
        }
        let now: Vec<Pair> = diesel::sql_query(concat!(
            "SELECT strftime('%Y-%m-%d %H:%M:%f', 'now') AS by_strftime, ",
            now!(),
            " AS by_datetime"
        ))
        .load(&mut conn)
        .expect("the query runs");
        assert_eq!(now[0].by_strftime, now[0].by_datetime);
    }
}

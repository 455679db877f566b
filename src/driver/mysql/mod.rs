//! The driver on MySQL 8 and MariaDB 10.6+: seed 003's claim, one `UPDATE … ORDER BY …
//! LIMIT` over rows picked with `SKIP LOCKED`, the page read back by owner and claim token
//! (MySQL has no `UPDATE … RETURNING`); times are UTC `DATETIME(3)` written by the server's
//! clock (every session's time zone is UTC); migrations under a named lock.

// Every time column is written with this expression (millisecond precision, UTC: the
// session's time zone is set to UTC when the connection is configured).
macro_rules! now {
    () => {
        "UTC_TIMESTAMP(3)"
    };
}

// The SQL mode of every connection (see `connection_configure`).
macro_rules! sql_mode {
    () => {
        "'STRICT_ALL_TABLES,NO_ZERO_DATE,NO_ZERO_IN_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION,PIPES_AS_CONCAT,ANSI_QUOTES,NO_BACKSLASH_ESCAPES'"
    };
}

// Opens the engine's `UPDATE`s of `async_task` that write only its own columns, with values
// the rules allow: a claim's stamp, a completion, rescue's charges. MariaDB evaluates every
// CHECK of a row at every UPDATE of it, whichever columns change: the payload's `JSON_VALID`
// and scans among them, about 40 µs a row for a payload of 4 KB, and a row that breaks a rule
// (written with the checks off) would fail every claim of its page and every rescue pass
// (docs/notes/2026-11-26-mariadb-checks.md). MariaDB runs these without the CHECKs, in the
// engine's strict mode whatever a handler made of the session's: a NULL state is still
// refused (`task::is_refused`). Only the mode's run-time flags apply to a statement already
// parsed; these statements use no quoting, `||` or backslash that its parse-time flags would
// change. A MariaDB-only executable comment: MySQL reads a comment and checks as before.
macro_rules! engine_update {
    () => {
        concat!(
            "/*M!100300 SET STATEMENT check_constraint_checks = 0, sql_mode = ",
            sql_mode!(),
            " FOR */ UPDATE async_task"
        )
    };
}

mod chain;
mod claim;
mod enqueue;
mod fair;
mod lease;
mod list;
mod maintenance;
mod operate;
mod session;
mod task;

// The backend's functions of the [`Driver`] methods it shares the shape of, under their names.
pub(super) use claim::{
    claim_limited as task_claim_limited, claim_page as task_claim_page,
    claim_plan as task_claim_plan, claim_suspect as task_claim_suspect,
    suspects_exist as task_suspects_exist,
};
pub(super) use enqueue::{
    find_many as task_find_many, insert_many as task_insert_many, link_parents as task_link_parents,
};
pub(super) use maintenance::prune_tasks as task_prune_batch;
pub(super) use operate::retry as task_retry;
pub(super) use task::{
    complete as task_complete, complete_many as task_complete_many,
    rescue_dying as task_rescue_dying, rescue_many as task_rescue_many,
};

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::{QueryResult, RunQueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};

use super::rows::IdRow;
use super::{Claim, Conn, Driver, MigrationError, TaskFilter, TxMark};
use crate::sql::Statement;

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/mysql");

/// The named lock that serialises concurrent migration runs (`GET_LOCK`).
const MIGRATION_LOCK: &str = "outbox.migrations";

/// How long a migration run waits for another one's lock, in seconds.
const MIGRATION_LOCK_WAIT_S: u32 = 300;

impl Driver for MysqlConnection {
    fn conn(&mut self) -> Conn<'_> {
        Conn::Mysql(self)
    }

    /// UTC as the session's time zone (every time is the server's UTC clock), `utf8mb4`,
    /// strict SQL mode (a value out of range is an error, never truncated), standard SQL
    /// strings (`||` concatenates, `"` quotes names, a backslash is an ordinary character),
    /// English messages (the engine tells InnoDB's deadlock victim, its lock wait timeout and
    /// a killed session from a task's failure by the server's message, `db::transaction`, and
    /// reads `KILL`'s answer),
    /// and READ
    /// COMMITTED: a claim's or rescue's re-check reads the latest committed rows, as on
    /// PostgreSQL, and InnoDB takes no gap locks on the claim index.
    fn connection_configure(&mut self) -> QueryResult<()> {
        self.batch_execute(concat!(
            "SET time_zone = '+00:00', NAMES utf8mb4 COLLATE utf8mb4_bin, lc_messages = 'en_US', \
             sql_mode = ",
            sql_mode!(),
            "; SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"
        ))
    }

    fn transaction_begin(&mut self, _mark: Option<TxMark>) -> QueryResult<()> {
        AnsiTransactionManager::begin_transaction(self)
    }

    /// Under a named lock (`GET_LOCK`): a second process waits instead of racing. MySQL's
    /// DDL is not transactional, so a migration that fails half-way leaves its first
    /// statements applied; each migration of this tree is written to be re-run after a
    /// failure (`IF NOT EXISTS`).
    fn migrations_run(&mut self) -> Result<Vec<String>, MigrationError> {
        #[derive(diesel::QueryableByName)]
        struct Locked {
            #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Integer>)]
            locked: Option<i32>,
        }
        let locked: Locked = diesel::sql_query(format!(
            "SELECT GET_LOCK('{MIGRATION_LOCK}', {MIGRATION_LOCK_WAIT_S}) AS locked"
        ))
        .get_result(self)?;
        if locked.locked != Some(1) {
            return Err(format!(
                "timed out after {MIGRATION_LOCK_WAIT_S} s waiting for another process's migrations (lock {MIGRATION_LOCK})"
            )
            .into());
        }
        let applied = super::migrations_apply(self, MIGRATIONS);
        let unlocked = self.batch_execute(&format!("DO RELEASE_LOCK('{MIGRATION_LOCK}')"));
        let applied = applied?;
        unlocked?;
        Ok(applied)
    }

    fn migrations_known(&self) -> Result<Vec<String>, MigrationError> {
        super::migration_versions::<diesel::mysql::Mysql>(&MIGRATIONS)
    }

    // No trigger cancels a task's descendants here: the cancels do, their own way.
    fn task_fail_dead(&mut self, claim: &Claim, error: &str) -> QueryResult<usize> {
        diesel::Connection::transaction(self, |conn| {
            let n = super::record_sql::task_fail_dead(conn.conn(), claim, error)?;
            if n == 1 {
                chain::cancel_descendants_of(conn, &[claim.id], "dead")?;
            }
            Ok(n)
        })
    }

    fn task_cancel(&mut self, id: i64) -> QueryResult<usize> {
        operate::cancel(self, id)
    }

    fn task_cancel_matching(&mut self, filter: &TaskFilter<'_>, dry_run: bool) -> QueryResult<i64> {
        operate::cancel_matching(self, filter, dry_run)
    }

    fn backend_pid(&mut self) -> QueryResult<Option<i32>> {
        maintenance::connection_id(self).map(Some)
    }

    fn backend_cancel(&mut self, pid: i32) -> QueryResult<bool> {
        maintenance::kill_query(self, pid)
    }

    fn transaction_lock_wait_bounded(&mut self, bounded: bool) -> QueryResult<()> {
        self.batch_execute(match bounded {
            true => "SET SESSION innodb_lock_wait_timeout = 2",
            false => "SET SESSION innodb_lock_wait_timeout = DEFAULT",
        })
    }
}

/// Runs a rescue statement's transaction `f` with InnoDB's lock wait timeout at 2 s for this
/// session, then back to the server's. Its locks of tasks and leases pass over rows another
/// transaction holds (`SKIP LOCKED`), but a dead task's descendants are cancelled with locks
/// that wait (`chain::cancel_descendants`), and a completion frozen while it holds one would
/// hold the pass for the server's timeout (50 s by default). Past 2 s the statement fails:
/// rescue charges a dying parent in a statement of its own, and leaves one that fails so for a
/// later pass (`worker/rescue.rs`).
pub(super) fn rescue_waiting_briefly<T>(
    conn: &mut MysqlConnection,
    f: impl FnOnce(&mut MysqlConnection) -> QueryResult<T>,
) -> QueryResult<T> {
    conn.transaction_lock_wait_bounded(true)?;
    let result = f(conn);
    // A failure here fails the connection's statement, and the pool drops the connection
    // (`db/reply.rs`) rather than hand it out with the short timeout.
    let reset = conn.transaction_lock_wait_bounded(false);
    let value = result?;
    reset.map(|()| value)
}

/// The ids `statement` reads (its column `id`), in its order.
fn load_ids(conn: &mut MysqlConnection, statement: Statement<Mysql>) -> QueryResult<Vec<i64>> {
    let rows: Vec<IdRow> = statement.load(conn)?;
    Ok(rows.into_iter().map(|r| r.id).collect())
}

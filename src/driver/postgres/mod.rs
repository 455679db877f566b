//! The driver on PostgreSQL: `SKIP LOCKED` claims, `jsonb` payloads, `NOTIFY` on enqueue, an
//! advisory lock around migrations.

// How long a statement of a transaction that must not wait for ever waits for a lock: a
// rescue's, a charge's (PostgreSQL has no lock timeout by default). Defined before the
// modules, which use it.
macro_rules! lock_wait_bound {
    () => {
        "SET LOCAL lock_timeout = '2s'"
    };
}

mod fair;
mod lease;
mod maintenance;
mod ops;
mod payload;
mod session;
mod task;
mod tenant;

// The backend's functions of the [`Driver`] methods it shares the shape of, under their names.
pub(super) use maintenance::prune_tasks as task_prune_batch;
pub(super) use ops::retry as task_retry;
pub(super) use task::{
    claim_page as task_claim_page, claim_plan as task_claim_plan,
    claim_suspect as task_claim_suspect, complete as task_complete,
    complete_many as task_complete_many, find_many as task_find_many,
    insert_many as task_insert_many, link_parents as task_link_parents,
    rescue_dying as task_rescue_dying, rescue_many as task_rescue_many,
    suspects_exist as task_suspects_exist,
};
pub(super) use tenant::claim_limited as task_claim_limited;

use diesel::connection::{AnsiTransactionManager, SimpleConnection, TransactionManager};
use diesel::pg::PgConnection;
use diesel::QueryResult;
use diesel_migrations::{embed_migrations, EmbeddedMigrations};

use super::claim_commit::{finish, CommitUnknown};
use super::{
    migrations_apply, rollback_unless_applied, rolled_back, Conn, Driver, MigrationError, TxMark,
};

/// The channel on which enqueues of due tasks notify idle workers (the enqueue statement
/// names it too).
const NOTIFY_CHANNEL: &str = "outbox_task";

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// The advisory lock key that serialises concurrent migration runs ("outbox" in ASCII).
const MIGRATION_LOCK_KEY: i64 = 0x6f7574626f78;

/// Opens a transaction with `sql`: `BEGIN` and what must run first in it, in one round trip.
/// When what follows `BEGIN` fails (a lock that times out, a setting the server lacks), the
/// server is left inside an aborted transaction block that diesel does not count; it is
/// rolled back here, or the pool would hand the connection out again with every statement on
/// it failing.
fn begin_with(conn: &mut PgConnection, sql: &str) -> QueryResult<()> {
    AnsiTransactionManager::begin_transaction_sql(conn, sql).inspect_err(|_| {
        let _ = conn.batch_execute("ROLLBACK");
    })
}

/// The statement that takes a transaction's mark: the shared advisory locks of its node and
/// of its run, by which rescue and the domain watchdog find its session in `pg_locks` (see
/// [`crate::driver::Driver::transaction_begin`]). Numbers, not text from elsewhere.
fn marks(mark: TxMark) -> String {
    marks_keyed(mark.node, session::key(mark.run))
}

/// [`marks`] with the run's key as given.
fn marks_keyed(node: i64, run: i32) -> String {
    format!(
        "SELECT pg_advisory_xact_lock_shared({}, {}), pg_advisory_xact_lock_shared({}, {run})",
        session::NODE_CLASS,
        session::key(node),
        session::RUN_CLASS,
    )
}

/// The run key of the mark of a claim's or a rescue's transaction: negative, which no run's
/// key is ([`session::key`] keeps 31 bits), so that neither the domain watchdog, which ends a
/// run, nor a late lease's chunk ever names it: only its node's death ends it.
const UPKEEP_RUN_KEY: i32 = -1;

/// Runs a claim of `node`'s with PostgreSQL's JIT compilation off for its transaction (`SET
/// LOCAL jit = off`): in a transaction of its own, begun in the same round trip, or in the
/// caller's.
///
/// The planner's estimate for a claim grows with the backlog (the fair claim's ring of
/// tenants is costed as if each step read many rows), and past `jit_above_cost` PostgreSQL
/// compiles the plan with LLVM at every execution: 709 ms for the first claim of a drain at a
/// backlog of 1,000,000, for a statement that then ran in under a millisecond. A claim reads
/// a page through an index and never gains from it. Set for the claim's transaction only, so
/// it holds behind PgBouncer in transaction mode and reaches no other statement.
pub(super) fn without_jit<T>(
    conn: &mut PgConnection,
    node: i64,
    claim: impl FnOnce(&mut PgConnection) -> QueryResult<T>,
) -> QueryResult<T> {
    with_local(conn, "SET LOCAL jit = off", node, claim)
}

/// What a rescue statement's transaction sets. JIT off, as for a claim: its estimate grows
/// with the running tasks, and it reads them through an index. A lock timeout: its locks of
/// tasks and leases pass over rows another transaction holds (`SKIP LOCKED`), but the chains'
/// trigger cancels a dead task's descendants with locks that wait, and a frozen transaction
/// holding one of them would hold the pass, and every later one, for as long as its session
/// lived (PostgreSQL has no lock timeout by default). Past 2 s the statement fails, rolled
/// back whole: rescue charges a dying parent in a statement of its own, and leaves one that
/// fails so for a later pass (`worker/rescue.rs`).
pub(super) const RESCUE_SETTINGS: &str = concat!("SET LOCAL jit = off; ", lock_wait_bound!());

/// Runs `f` in a transaction of `node`'s whose `settings` (`SET LOCAL …`) are applied first:
/// a transaction of its own, begun in the same round trip, or the caller's. Either way it
/// holds `node`'s mark (run [`UPKEEP_RUN_KEY`]): a process frozen inside it, with the rows its
/// statement locked, is ended by a rescue pass once its node is dead, as its tasks'
/// transactions are.
pub(super) fn with_local<T>(
    conn: &mut PgConnection,
    settings: &'static str,
    node: i64,
    f: impl FnOnce(&mut PgConnection) -> QueryResult<T>,
) -> QueryResult<T> {
    if !begin_local(conn, "BEGIN", settings, node)? {
        return f(conn);
    }
    let result = f(conn);
    finish(conn, result, |_, error| Err(error))
}

/// [`without_jit`] for a claim: a COMMIT of its own transaction that fails gives the claim's
/// rows back unconfirmed ([`crate::driver::Picked::unconfirmed`]). `begin` opens that
/// transaction (`BEGIN`, or with an isolation level).
pub(super) fn claim_without_jit<T: CommitUnknown>(
    conn: &mut PgConnection,
    begin: &'static str,
    node: i64,
    claim: impl FnOnce(&mut PgConnection) -> QueryResult<T>,
) -> QueryResult<T> {
    if !begin_local(conn, begin, "SET LOCAL jit = off", node)? {
        return claim(conn);
    }
    let claimed = claim(conn);
    finish(conn, claimed, T::commit_failed)
}

/// Applies `settings` and `node`'s mark (see [`with_local`]) in the caller's transaction
/// (`false`), or in a transaction of its own opened by `begin` in the same round trip
/// (`true`).
fn begin_local(
    conn: &mut PgConnection,
    begin: &'static str,
    settings: &'static str,
    node: i64,
) -> QueryResult<bool> {
    let local = format!("{settings}; {}", marks_keyed(node, UPKEEP_RUN_KEY));
    match crate::db::transaction::depth_of(conn) {
        Some(0) => {}
        Some(_) => {
            conn.batch_execute(&local)?;
            return Ok(false);
        }
        None => return Err(diesel::result::Error::BrokenTransactionManager),
    }
    begin_with(conn, &format!("{begin}; {local}"))?;
    Ok(true)
}

impl Driver for PgConnection {
    fn conn(&mut self) -> Conn<'_> {
        Conn::Pg(self)
    }

    fn connection_configure(&mut self) -> QueryResult<()> {
        Ok(())
    }

    fn transaction_begin(&mut self, mark: Option<TxMark>) -> QueryResult<()> {
        match mark {
            // One round trip for both.
            Some(mark) => begin_with(self, &format!("BEGIN; {}", marks(mark))),
            None => AnsiTransactionManager::begin_transaction(self),
        }
    }

    /// In one transaction holding a transaction-scoped advisory lock: a second process waits
    /// instead of racing, and behind PgBouncer in transaction mode the lock is held by the
    /// server connection that runs the migrations (a session lock would be taken on one server
    /// connection and released on another, or never). diesel's harness runs each migration in
    /// a savepoint inside it; PostgreSQL's DDL is transactional, so a failure applies nothing.
    fn migrations_run(&mut self) -> Result<Vec<String>, MigrationError> {
        let mut applied = Err(MigrationError::from("not run"));
        diesel::Connection::transaction(self, |conn| -> QueryResult<()> {
            conn.batch_execute(&format!(
                "SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})"
            ))?;
            applied = migrations_apply(conn, MIGRATIONS);
            rollback_unless_applied(&applied)
        })
        .or_else(rolled_back)?;
        applied
    }

    fn transaction_lock_wait_bounded(&mut self, bounded: bool) -> QueryResult<()> {
        // `SET LOCAL`: it ends with the transaction.
        match bounded {
            true => self.batch_execute(lock_wait_bound!()),
            false => Ok(()),
        }
    }

    fn migrations_known(&self) -> Result<Vec<String>, MigrationError> {
        super::migration_versions::<diesel::pg::Pg>(&MIGRATIONS)
    }

    fn task_payload_len(&self, _json: &str, value: &serde_json::Value) -> usize {
        payload::jsonb_text_len(value)
    }

    fn listen_start(&mut self) -> QueryResult<bool> {
        self.batch_execute(&format!("LISTEN {NOTIFY_CHANNEL}"))?;
        Ok(true)
    }

    fn listen_poll(&mut self) -> QueryResult<bool> {
        let mut woke = false;
        for notification in self.notifications_iter() {
            notification?;
            woke = true;
        }
        Ok(woke)
    }
}

//! The one interface between the engine and the database. No SQL of the engine lives outside
//! this module.
//!
//! A query whose meaning is the same on every backend is written once, with diesel's query
//! builder and `crate::schema` (the `*_sql.rs` files): on [`crate::db::DbConnection`], or,
//! for a method a producer calls on its own connection, on the backend's connection that
//! [`Driver::conn`] lends (`on_backend!` compiles the one body for each backend).
//! The few words the backends spell differently (the clock, JSON, an upsert's key) are
//! expressions of their own (`clock.rs`, `dialect.rs`). Each backend's module (`postgres/`,
//! `sqlite/`, `mysql/`, with its own migrations) holds the SQL that differs in meaning or in
//! speed — the claims (`SKIP LOCKED` or not, `RETURNING` or `LAST_INSERT_ID`), the hot
//! completion, what triggers do elsewhere on MySQL, prune — each saying why; the trait's
//! methods reach it through `per_backend!`.
//!
//! Operations are named entity first (`task_claim_page`, `node_register`) so that they sort
//! by table. Every write to a claimed task is fenced: it names the task's id, owner and claim
//! token and requires `state = 'running'`, so a node whose claim was taken over writes nothing.
//!
//! The items here are `pub` only so that the sealed [`crate::EnqueueConnection`] can name
//! them; the module itself is private.

#[cfg(any(feature = "postgres", feature = "mysql"))]
mod claim_commit;
mod clock;
mod dialect;
mod domain_sql;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
mod fair_sql;
mod lease;
mod migrations;
#[cfg(feature = "mysql")]
mod mysql;
mod node_sql;
mod operate_sql;
pub(crate) mod ops;
#[cfg(feature = "postgres")]
mod postgres;
mod record_sql;
mod ring_sql;
mod rows;
pub(crate) mod schedule;
#[cfg(feature = "sqlite")]
mod sqlite;
mod strategy_sql;
mod task_list_sql;
mod task_sql;
mod tenant_sql;

use diesel::QueryResult;

pub use rows::{
    AuditEntry, ChunkRuns, Claim, ClaimRow, ClaimState, Claiming, DomainRow, DomainWrite,
    InsertRow, KeywordStateCount, LeaseCharge, NodeDomainsRow, Passes, Pick, Picked, PruneBatch,
    PrunedBatch, RescueParams, RescuedRow, TaskFilter, TaskKey, TaskRecord, TenantRow, TenantSet,
    TxMark,
};

pub use dialect::Conn;
pub(crate) use domain_sql::{domain_rows, keyword_paused};
pub use lease::LeaseDriver;
pub use migrations::MigrationError;
use migrations::{migration_versions, migrations_apply};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use migrations::{rollback_unless_applied, rolled_back};
pub(crate) use node_sql::{
    node_domains, node_mark_gone, task_cancelled_among, task_count_due, tenant_run_limited,
};
pub use strategy_sql::Due;
pub(crate) use strategy_sql::{node_strategies, node_strategy_publish};

use dialect::{on_backend, per_backend};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use task_sql::rescue_params;
use task_sql::{counts_by_state, fence, lapsed, prunable, UNFINISHED_CHILD};

use crate::db::DbConnection;

/// The database interface of the engine.
pub trait Driver: LeaseDriver + ops::OpsDriver {
    /// The backend's own connection, which the statements written once run on.
    fn conn(&mut self) -> Conn<'_>;

    /// Applies the session settings every connection needs (SQLite: WAL, busy timeout).
    fn connection_configure(&mut self) -> QueryResult<()>;

    /// Opens a write transaction (`BEGIN IMMEDIATE` on SQLite). On PostgreSQL, with `mark`,
    /// the transaction holds two shared advisory locks for its length, of its node and of
    /// its run (taken in the same round trip): what [`Driver::session_end`] and
    /// [`Driver::session_end_stale`] find its session by, in `pg_locks`.
    fn transaction_begin(&mut self, mark: Option<TxMark>) -> QueryResult<()>;

    /// Applies the pending migrations, serialised against other processes doing the same;
    /// returns the versions applied.
    fn migrations_run(&mut self) -> Result<Vec<String>, MigrationError>;

    /// The versions of the migrations this build has (as `__diesel_schema_migrations` stores
    /// them).
    fn migrations_known(&self) -> Result<Vec<String>, MigrationError>;

    /// The size of a payload as this backend stores it, in bytes: what the schema bounds (SQLite:
    /// the JSON text; MySQL: the text as given, its column `JSON`, MariaDB's `LONGTEXT` checked
    /// by `JSON_VALID`; PostgreSQL: jsonb's text form of `value`).
    fn task_payload_len(&self, json: &str, value: &serde_json::Value) -> usize {
        let _ = value;
        json.len()
    }

    /// Inserts `rows` (at least one), skipping those whose `(keyword, biz_id)` exists;
    /// returns the keys of the rows it created. All or nothing.
    fn task_insert_many(&mut self, rows: &[InsertRow<'_>]) -> QueryResult<Vec<TaskKey>> {
        // Per backend: one JSON bind for the batch (PostgreSQL), a bind per value (SQLite), no
        // RETURNING (MySQL).
        per_backend!(self.task_insert_many(rows))
    }

    /// Runs `f` all or nothing: in a savepoint inside the open transaction, or in a
    /// transaction of its own (`BEGIN IMMEDIATE` on SQLite) when none is open.
    fn atomically(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Driver) -> QueryResult<()>,
    ) -> QueryResult<()> {
        on_backend!(self.conn(), |c| diesel::Connection::transaction(c, |c| f(
            c
        )))
    }

    /// Links each `(child, parent)` of `links` in `async_task_parent`, whose trigger blocks the
    /// child on an unfinished parent, or cancels it with a dead or cancelled one
    /// (docs/guide/src/chains.md); returns the links inserted.
    fn task_link_parents(&mut self, links: &[(i64, i64)]) -> QueryResult<usize> {
        // Per backend: a trigger does the rest on PostgreSQL and SQLite, the driver on MySQL.
        per_backend!(self.task_link_parents(links))
    }

    /// The ids of the existing tasks among `keys` (a JSON array of `{"k":…, "b":…}`).
    fn task_find_many(&mut self, keys_json: &str) -> QueryResult<Vec<TaskKey>> {
        // Per backend: each reads the JSON keys its own way (or binds them, MySQL).
        per_backend!(self.task_find_many(keys_json))
    }

    /// Claims up to `claim.limit` due pending tasks of `claim.due` for `claim.owner`, in one
    /// statement: state running, owner set, claim token bumped, deadline `claim.timeout_ms`
    /// from now. The page is shared
    /// fairly between the tasks without a tenant and the tenants, by weight, the tenants visited in
    /// tenant order after [`Pick::Fair`]'s `after` (docs/guide/src/tenants.md, "Fair claiming").
    /// Tasks of the tenants `claim.except` (those with a `max_running`) are left to
    /// [`Driver::task_claim_limited`].
    ///
    /// With [`Pick::Solo`] (PostgreSQL), the claim takes one participant's tasks only, in a
    /// statement much cheaper to plan, and says whether another participant has pending
    /// tasks (`crowded`: the next claim should be fair again).
    ///
    /// A task is due for the claim when it is pending, its `run_at` has come, its keyword is
    /// one of `due.keywords` and, with a partition (claim strategies `id_hash` and
    /// `weight`), when this node owns it or it has been due for longer than the partition's
    /// grace period; so in every claim below. A claim whose COMMIT fails returns its rows
    /// with [`Picked::unconfirmed`] (so do the claims below).
    fn task_claim_page(&mut self, claim: &Claiming<'_>, pick: &Pick<'_>) -> QueryResult<Picked> {
        // Per backend: the claim (`SKIP LOCKED`, the write lock, or pick-then-mark without RETURNING).
        per_backend!(self.task_claim_page(claim, pick))
    }

    /// Claims, as [`Driver::task_claim_page`] does, up to `claim.limit` due tasks of the tenants
    /// `tenants`, none past its `max_running` counted fleet-wide: on PostgreSQL in a
    /// transaction that first takes each tenant's claim lock (a tenant whose lock another
    /// node holds is skipped this time), so that the count it then reads is not stale; on
    /// SQLite in one statement under the write lock.
    fn task_claim_limited(
        &mut self,
        claim: &Claiming<'_>,
        tenants: &[String],
    ) -> QueryResult<Picked> {
        // Per backend: each serialises a tenant's claims its own way (advisory lock, write lock, row lock).
        per_backend!(self.task_claim_limited(claim, tenants))
    }

    /// The plan of the claim statement (`EXPLAIN`), one line per row: to show that the
    /// claim stays an index range scan however long the backlog.
    fn task_claim_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>> {
        // Per backend: each backend's `EXPLAIN` of its own claim.
        per_backend!(self.task_claim_plan(due, limit))
    }

    /// Claims for `owner`, as [`Driver::task_claim_page`] does, the first due suspect (a task
    /// held by two processes or more that died: `suspect >= 2`) of `due`'s keywords and
    /// partition, not of the tenants `except`.
    fn task_claim_suspect(
        &mut self,
        owner: i64,
        due: &Due<'_>,
        except: &[String],
        timeout_ms: i64,
    ) -> QueryResult<Picked> {
        // Per backend: a claim, as `task_claim_page`.
        per_backend!(self.task_claim_suspect(owner, due, except, timeout_ms))
    }

    /// Whether some pending task is a suspect (`suspect >= 2`).
    fn task_suspects_exist(&mut self) -> QueryResult<bool> {
        // Per backend: SQLite and MySQL name the partial index, which their planners would pass over.
        per_backend!(self.task_suspects_exist())
    }

    /// Marks a claimed task done (fenced); returns the rows touched, 0 or 1.
    fn task_complete(&mut self, claim: &Claim) -> QueryResult<usize> {
        // Per backend: the hot completion.
        per_backend!(self.task_complete(claim))
    }

    /// Marks done every task of `claims` (`(id, claim_token)` pairs, all owned by `owner`)
    /// still held by that claim, in one statement; returns how many it marked. The caller
    /// compares with the number of claims: fewer means a claim was taken over.
    fn task_complete_many(&mut self, owner: i64, claims: &[(i64, i64)]) -> QueryResult<usize> {
        // Per backend: the hot completion, of a batch.
        per_backend!(self.task_complete_many(owner, claims))
    }

    /// Records a failure and schedules the next attempt `delay_ms` from now (fenced).
    fn task_fail_retry(&mut self, claim: &Claim, error: &str, delay_ms: i64) -> QueryResult<usize> {
        record_sql::task_fail_retry(self.conn(), claim, error, delay_ms)
    }

    /// Records a failure and marks the task dead (fenced).
    fn task_fail_dead(&mut self, claim: &Claim, error: &str) -> QueryResult<usize> {
        record_sql::task_fail_dead(self.conn(), claim, error)
    }

    /// Puts a claimed task back to pending without counting a failure (fenced); `note`, when
    /// given, replaces `last_error` (why it was released after its handler may have run).
    fn task_release(&mut self, claim: &Claim, note: Option<&str>) -> QueryResult<usize> {
        record_sql::task_release(self.conn(), claim, note)
    }

    /// Holds a claimed task `timeout_ms` more from now (fenced), leaving it running: its
    /// deadline moved, `note` (when given) in its `last_error`; returns the rows touched: 0
    /// when the claim is no longer held.
    fn task_hold(
        &mut self,
        claim: &Claim,
        note: Option<&str>,
        timeout_ms: i64,
    ) -> QueryResult<usize> {
        record_sql::task_hold(self.conn(), claim, note, timeout_ms)
    }

    /// Cancels the task `id` if it is pending, blocked or running (state `cancelled`,
    /// finished now); returns the rows touched, 0 or 1. A running task's completion is then
    /// fenced out.
    fn task_cancel(&mut self, id: i64) -> QueryResult<usize> {
        operate_sql::task_cancel(self.conn(), id)
    }

    /// Cancels every pending, blocked or running task that `filter` matches, as
    /// [`Driver::task_cancel`] does one; with `dry_run`, only counts them. Returns how many.
    fn task_cancel_matching(&mut self, filter: &TaskFilter<'_>, dry_run: bool) -> QueryResult<i64> {
        operate_sql::task_cancel_matching(self.conn(), filter, dry_run)
    }

    /// Puts the task `id` back to pending, due now with no failure counted, if it is dead or
    /// cancelled (to `blocked` instead while one of its parents is not done, its parents
    /// locked first so that none completes unseen; not at all when one of its parents was
    /// pruned, its outcome gone); returns the rows touched, 0 or 1.
    fn task_retry(&mut self, id: i64) -> QueryResult<usize> {
        // Per backend: the parents are locked first on PostgreSQL, under the write lock on SQLite,
        // and MySQL does what the others' triggers do.
        per_backend!(self.task_retry(id))
    }

    /// Writes one row of `async_audit`.
    fn audit_insert(&mut self, audit: &AuditEntry<'_>) -> QueryResult<usize> {
        operate_sql::audit_write(self.conn(), audit)
    }

    /// Where a task stands now: its state, owner and claim token (`None`: no such task).
    fn task_get_claim(&mut self, id: i64) -> QueryResult<Option<ClaimState>> {
        task_sql::task_get_claim(self.conn(), id)
    }

    /// The task `(keyword, biz_id)`, as stored.
    fn task_get_by_key(&mut self, keyword: &str, biz_id: &str) -> QueryResult<Option<TaskRecord>> {
        task_sql::task_get_by_key(self.conn(), keyword, biz_id)
    }

    /// Returns to pending (or dead, at max attempts) every running task whose owner is not a
    /// live node (no heartbeat for `dead_after_ms`, gone, unknown; the rescuing node,
    /// `rescue.node`, is live to itself while its row is alive) or whose deadline has passed,
    /// counting a failure; a task whose row another transaction holds is passed over,
    /// for a later pass.
    fn task_rescue_many(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>> {
        // Per backend: the tasks locked `SKIP LOCKED` and charged, in each backend's words (MySQL
        // has no `WITH … UPDATE` and cascades without triggers).
        per_backend!(self.task_rescue_many(rescue))
    }

    /// The dying parents among the lapsed tasks, stamped or leased, by id: at their last
    /// attempt, with children. Cancelling a task's descendants at its death waits for their
    /// locks, so rescue charges these one at a time, apart from the rest (`rescue.only`).
    /// None on SQLite, whose rescue waits for no row.
    fn task_rescue_dying(&mut self, rescue: &RescueParams) -> QueryResult<Vec<i64>> {
        per_backend!(self.task_rescue_dying(rescue))
    }

    /// Task counts per keyword and state, with the age of the oldest due pending task.
    fn task_count_by_keyword_state(&mut self) -> QueryResult<Vec<KeywordStateCount>> {
        task_sql::task_count_by_keyword_state(self.conn())
    }

    /// Deletes one batch of finished tasks (see [`crate::prune`]), in the caller's write
    /// transaction.
    fn task_prune_batch(&mut self, batch: &PruneBatch<'_>) -> QueryResult<PrunedBatch> {
        // Per backend: each walks its own index (see each `prune_tasks`).
        per_backend!(self.task_prune_batch(batch))
    }

    /// Creates or changes a tenant's row and writes `audit`, in one transaction (a savepoint
    /// inside the caller's).
    fn tenant_set(
        &mut self,
        tenant: &str,
        set: &TenantSet,
        audit: &AuditEntry<'_>,
    ) -> QueryResult<TenantRow> {
        tenant_sql::tenant_set(self.conn(), tenant, set, audit)
    }

    /// Deletes a tenant's row and writes `audit`, in one transaction; returns the rows
    /// deleted, 0 or 1.
    fn tenant_remove(&mut self, tenant: &str, audit: &AuditEntry<'_>) -> QueryResult<usize> {
        tenant_sql::tenant_remove(self.conn(), tenant, audit)
    }

    /// Every tenant's row, by name.
    fn tenant_list(&mut self) -> QueryResult<Vec<TenantRow>> {
        tenant_sql::tenant_rows(self.conn(), None)
    }

    /// Of `tenants` (each with the number of tasks a refused batch had for it), the one with a
    /// `max_queued` whose queued tasks plus the batch's exceed it by the most, with that
    /// limit: the tenant an enqueue was refused for.
    fn tenant_over_max_queued(
        &mut self,
        tenants: &[(String, i64)],
    ) -> QueryResult<Option<(String, i64)>> {
        tenant_sql::tenant_over_max_queued(self.conn(), tenants)
    }

    /// Registers a worker process; returns its node id.
    fn node_register(&mut self, name: &str) -> QueryResult<i64> {
        node_sql::node_register(self.conn(), name)
    }

    /// Records a live node's heartbeat with the database clock, and the domains it publishes
    /// (JSON of [`crate::domain::NodeDomains`]); returns the rows touched: 0 when the node is
    /// marked gone or its row was deleted.
    fn node_heartbeat(&mut self, node_id: i64, domains: &str) -> QueryResult<usize> {
        node_sql::node_heartbeat(self.conn(), node_id, domains)
    }

    /// This connection's id on MySQL, for the domain watchdog's `KILL QUERY`; `None` on
    /// PostgreSQL, whose task transactions are named instead (see [`Driver::session_end`]),
    /// and on SQLite.
    fn backend_pid(&mut self) -> QueryResult<Option<i32>> {
        Ok(None)
    }

    /// Cancels the statement the connection `pid` runs now (MySQL's `KILL QUERY`); whether
    /// it was sent. Does nothing on PostgreSQL and SQLite.
    fn backend_cancel(&mut self, pid: i32) -> QueryResult<bool> {
        let _ = pid;
        Ok(false)
    }

    /// `bounded`, in a transaction: its lock waits fail after 2 s (PostgreSQL, for the
    /// transaction; MySQL, for the session until called again without, its default
    /// `innodb_lock_wait_timeout` 50 s; SQLite's busy timeout bounds them already).
    fn transaction_lock_wait_bounded(&mut self, bounded: bool) -> QueryResult<()> {
        let _ = bounded;
        Ok(())
    }

    /// Deletes one batch of rows of stopped nodes (see [`crate::prune`]); returns how many.
    fn node_prune_batch(
        &mut self,
        older_than_ms: i64,
        silent_ms: i64,
        limit: i64,
    ) -> QueryResult<usize> {
        node_sql::node_prune_batch(self.conn(), older_than_ms, silent_ms, limit)
    }

    /// Starts listening for the notifications an enqueue of a due task sends; `false` when
    /// the backend has none (SQLite).
    fn listen_start(&mut self) -> QueryResult<bool> {
        Ok(false)
    }

    /// Whether notifications arrived since the last call (consumes them; never waits).
    fn listen_poll(&mut self) -> QueryResult<bool> {
        Ok(false)
    }

    /// Serialises operators' changes of domains and paused keywords, until the open
    /// transaction ends (PostgreSQL: a lock on `async_domain` that conflicts only with
    /// itself and writers, so heartbeats still read it; SQLite: nothing, a write
    /// transaction already holds the database's write lock). Call it first in the
    /// transaction, before reading what the change is checked against.
    fn domain_lock(&mut self) -> QueryResult<()> {
        domain_sql::domain_lock(self.conn())
    }

    /// Creates or overwrites the row `row.name` of `async_domain` (version + 1, updated at
    /// the database clock, by `audit.actor`) and writes `audit`, in one transaction (a
    /// savepoint inside the caller's); returns the row as stored.
    fn domain_write(
        &mut self,
        row: &DomainWrite<'_>,
        audit: &AuditEntry<'_>,
    ) -> QueryResult<DomainRow> {
        domain_sql::domain_write(self.conn(), row, audit)
    }

    /// Pauses `keyword` on its own (a row of `async_pause` by `audit.actor`) and writes
    /// `audit`, in one transaction; returns the rows inserted: 0, and no audit, when it was
    /// paused already.
    fn keyword_pause(&mut self, keyword: &str, audit: &AuditEntry<'_>) -> QueryResult<usize> {
        domain_sql::keyword_pause(self.conn(), keyword, audit)
    }

    /// Deletes `keyword`'s row of `async_pause` and writes `audit`, in one transaction;
    /// returns the rows deleted: 0, and no audit, when it was not paused.
    fn keyword_resume(&mut self, keyword: &str, audit: &AuditEntry<'_>) -> QueryResult<usize> {
        domain_sql::keyword_resume(self.conn(), keyword, audit)
    }
}

/// The driver behind a connection.
pub(crate) fn driver(conn: &mut DbConnection) -> &mut dyn Driver {
    match conn {
        #[cfg(feature = "postgres")]
        DbConnection::Pg(c) => c,
        #[cfg(feature = "sqlite")]
        DbConnection::Sqlite(c) => c,
        #[cfg(feature = "mysql")]
        DbConnection::Mysql(c) => c,
    }
}

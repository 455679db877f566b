//! The one interface between the engine and the database. Each backend implements it with
//! its own SQL and its own migrations (`postgres/`, `sqlite/`): diesel's `MultiConnection`
//! covers only what both share, and the claim needs `SKIP LOCKED` on PostgreSQL and nothing
//! of the kind on SQLite. No SQL of the engine lives outside this module.
//!
//! Operations are named entity first (`task_claim_page`, `node_register`) so that they sort
//! by table. Every write to a claimed task is fenced: it names the task's id, owner and claim
//! token and requires `state = 'running'`, so a node whose claim was taken over writes nothing.
//!
//! The items here are `pub` only so that the sealed [`crate::EnqueueConnection`] can name
//! them; the module itself is private.

mod clock;
mod domain_sql;
#[cfg(feature = "mysql")]
mod mysql;
mod node_sql;
pub(crate) mod ops;
#[cfg(feature = "postgres")]
mod postgres;
mod ring_sql;
mod rows;
pub(crate) mod schedule;
#[cfg(feature = "sqlite")]
mod sqlite;
mod strategy_sql;
mod task_sql;

use diesel::backend::Backend;
use diesel::sql_types::{BigInt, HasSqlType, Text};
use diesel::QueryResult;

pub use rows::{
    AuditEntry, ChunkRuns, Claim, ClaimRow, ClaimState, DomainRow, DomainWrite, InsertRow,
    KeywordStateCount, LeaseCharge, NodeDomainsRow, Passes, Pick, Picked, PruneBatch, PrunedBatch,
    RescueParams, RescuedRow, TaskFilter, TaskKey, TaskRecord, TenantRow, TenantSet, TxMark,
};

pub(crate) use domain_sql::{domain_rows, keyword_paused};
pub(crate) use node_sql::{
    node_domains, node_mark_gone, task_cancelled_among, task_count_due, tenant_run_limited,
};
pub use strategy_sql::Due;
pub(crate) use strategy_sql::{node_strategies, node_strategy_publish};

use domain_sql::keyword_pause_delete;
// MySQL has no `ON CONFLICT … RETURNING`: its upsert and pause are its own.
#[cfg(feature = "mysql")]
use domain_sql::DOMAIN_COLUMNS_MYSQL;
#[cfg(feature = "postgres")]
use domain_sql::DOMAIN_COLUMNS_PG;
#[cfg(feature = "sqlite")]
use domain_sql::DOMAIN_COLUMNS_SQLITE;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use domain_sql::{domain_upsert, keyword_pause_insert};

use task_sql::claim_state;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
use task_sql::rescue_params;

use crate::db::DbConnection;
use crate::sql::Statement;
use crate::task::TaskState;

/// An error of the migration harness.
pub type MigrationError = Box<dyn std::error::Error + Send + Sync>;

/// The versions of the migrations of `source`, as diesel records them once applied.
fn migration_versions<DB: Backend>(
    source: &impl diesel::migration::MigrationSource<DB>,
) -> Result<Vec<String>, MigrationError> {
    Ok(source
        .migrations()?
        .iter()
        .map(|m| m.name().version().to_string())
        .collect())
}

/// The database interface of the engine.
pub trait Driver {
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

    /// The size of a payload as this backend stores it, in bytes: what the schema bounds
    /// (SQLite: the JSON text itself; PostgreSQL: jsonb's text form of `value`).
    fn task_payload_len(&self, json: &str, value: &serde_json::Value) -> usize;

    /// Inserts `rows` (at least one), skipping those whose `(keyword, biz_id)` exists;
    /// returns the keys of the rows it created. All or nothing.
    fn task_insert_many(&mut self, rows: &[InsertRow<'_>]) -> QueryResult<Vec<TaskKey>>;

    /// Runs `f` all or nothing: in a savepoint inside the open transaction, or in a
    /// transaction of its own (`BEGIN IMMEDIATE` on SQLite) when none is open.
    fn atomically(
        &mut self,
        f: &mut dyn FnMut(&mut dyn Driver) -> QueryResult<()>,
    ) -> QueryResult<()>;

    /// Links each `(child, parent)` of `links` in `async_task_parent`, whose trigger blocks the
    /// child on an unfinished parent, or cancels it with a dead or cancelled one
    /// (docs/guide/src/chains.md); returns the links inserted.
    fn task_link_parents(&mut self, links: &[(i64, i64)]) -> QueryResult<usize>;

    /// The ids of the existing tasks among `keys` (a JSON array of `{"k":…, "b":…}`).
    fn task_find_many(&mut self, keys_json: &str) -> QueryResult<Vec<TaskKey>>;

    /// Claims up to `limit` due pending tasks of `due` for `owner`, in one statement: state
    /// running, owner set, claim token bumped, deadline `timeout_ms` from now. The page is shared
    /// fairly between the tasks without a tenant and the tenants, by weight, the tenants visited in
    /// tenant order after [`Pick::Fair`]'s `after` (docs/guide/src/tenants.md, "Fair claiming").
    /// Tasks of the tenants `except` (those with a `max_running`) are left to
    /// [`Driver::task_claim_limited`].
    ///
    /// With [`Pick::Solo`] (PostgreSQL), the claim takes one participant's tasks only, in a
    /// statement much cheaper to plan, and says whether another participant has pending
    /// tasks (`crowded`: the next claim should be fair again).
    ///
    /// A task is due for the claim when it is pending, its `run_at` has come, its keyword is
    /// one of `due.keywords` and, with a partition (claim strategies `id_hash` and
    /// `weight`), when this node owns it or it has been due for longer than the partition's
    /// grace period; so in every claim below.
    fn task_claim_page(
        &mut self,
        owner: i64,
        due: &Due<'_>,
        except: &[String],
        pick: &Pick<'_>,
        limit: i64,
        timeout_ms: i64,
    ) -> QueryResult<Picked>;

    /// Claims, as [`Driver::task_claim_page`] does, up to `limit` due tasks of the tenants
    /// `tenants`, none past its `max_running` counted fleet-wide: on PostgreSQL in a
    /// transaction that first takes each tenant's claim lock (a tenant whose lock another
    /// node holds is skipped this time), so that the count it then reads is not stale; on
    /// SQLite in one statement under the write lock.
    fn task_claim_limited(
        &mut self,
        owner: i64,
        due: &Due<'_>,
        tenants: &[String],
        limit: i64,
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>>;

    /// The plan of the claim statement (`EXPLAIN`), one line per row: to show that the
    /// claim stays an index range scan however long the backlog.
    fn task_claim_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>>;

    /// Leases up to `limit` due pending tasks of `due` for `owner` (a lock claim; PostgreSQL
    /// only), chosen as [`Driver::task_claim_page`] chooses: a row of `async_lease` per task
    /// with a deadline `timeout_ms` from now, committed by this statement alone; the task rows
    /// are not written and stay pending. A leased task is taken by no other claim. The page
    /// is cut, in claim order, into chunks of `chunk.per` tasks; the i-th chunk's leases
    /// name the run `chunk.first + i` (that of the [`TxMark`] its transaction will hold).
    /// Returns the page and, for each of its rows, its chunk's run.
    #[allow(clippy::too_many_arguments)]
    fn task_lease_page(
        &mut self,
        owner: i64,
        chunk: ChunkRuns,
        due: &Due<'_>,
        except: &[String],
        pick: &Pick<'_>,
        limit: i64,
        timeout_ms: i64,
    ) -> QueryResult<(Picked, Vec<i64>)>;

    /// The plan of the lease statement (`EXPLAIN`), one line per row (PostgreSQL only).
    fn task_lease_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>>;

    /// In the transaction of the chunk's leases (opened by [`Driver::transaction_begin`]): marks
    /// done the tasks `ids` still leased by `owner` under their tokens, deleting the leases,
    /// recording `owner` and a new claim token; returns how many it marked.
    fn task_complete_leased(&mut self, owner: i64, ids: &[i64]) -> QueryResult<usize>;

    /// After a chunk rolled back: claims, the stamping way, those of the tasks `ids` still
    /// leased by `owner` and pending, deleting their leases, in one statement.
    fn task_claim_leased(
        &mut self,
        owner: i64,
        ids: &[i64],
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>>;

    /// Deletes `owner`'s leases of `ids` (their chunk never ran): the tasks are free again,
    /// no failure counted. Returns how many it deleted.
    fn task_release_leased(&mut self, owner: i64, ids: &[i64]) -> QueryResult<usize>;

    /// Ends a chunk for one of its tasks that ran past its timeout: deletes `owner`'s leases
    /// of the chunk and charges that task a failure (retried after the delay, or dead at
    /// max attempts, with a new claim token); the chunk's other tasks are free, uncharged.
    /// Returns the charged task's new state, `None` when it had left its lease.
    fn task_charge_leased(
        &mut self,
        owner: i64,
        charge: &LeaseCharge<'_>,
    ) -> QueryResult<Option<String>>;

    /// Deletes the leases of nodes that are not live (as [`Driver::task_rescue_many`] judges
    /// them) and those past their deadline, charging each task still pending under its
    /// lease a failure (and, when its node died, counting the death in `suspect`). None on
    /// SQLite and MySQL,
    /// which have no lock claims.
    fn task_rescue_leases(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>>;

    /// Claims for `owner`, as [`Driver::task_claim_page`] does, the first due suspect (a task
    /// held by two processes or more that died: `suspect >= 2`) of `due`'s keywords and
    /// partition, not of the tenants `except`.
    fn task_claim_suspect(
        &mut self,
        owner: i64,
        due: &Due<'_>,
        except: &[String],
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>>;

    /// Whether some pending task is a suspect (`suspect >= 2`).
    fn task_suspects_exist(&mut self) -> QueryResult<bool>;

    /// Ends (`pg_terminate_backend`) the sessions of the engine's transactions whose node is
    /// not live (no heartbeat for `dead_after_ms`, gone, unknown) or whose chunk's lease is
    /// past its deadline, so that what they hold (locks of rows a handler wrote) is free
    /// and nothing they write later lands; returns how many. 0 on SQLite and MySQL.
    fn session_end_stale(&mut self, dead_after_ms: i64) -> QueryResult<i64>;

    /// Ends the session of the transaction marked `mark` (see [`Driver::transaction_begin`]),
    /// if one still runs; whether one did. `false` on SQLite and MySQL.
    fn session_end(&mut self, mark: TxMark) -> QueryResult<bool>;

    /// Marks a claimed task done (fenced); returns the rows touched, 0 or 1.
    fn task_complete(&mut self, claim: &Claim) -> QueryResult<usize>;

    /// Marks done every task of `claims` (`(id, claim_token)` pairs, all owned by `owner`)
    /// still held by that claim, in one statement; returns how many it marked. The caller
    /// compares with the number of claims: fewer means a claim was taken over.
    fn task_complete_many(&mut self, owner: i64, claims: &[(i64, i64)]) -> QueryResult<usize>;

    /// Records a failure and schedules the next attempt `delay_ms` from now (fenced).
    fn task_fail_retry(&mut self, claim: &Claim, error: &str, delay_ms: i64) -> QueryResult<usize>;

    /// Records a failure and marks the task dead (fenced).
    fn task_fail_dead(&mut self, claim: &Claim, error: &str) -> QueryResult<usize>;

    /// Puts a claimed task back to pending without counting a failure (fenced); `note`, when
    /// given, replaces `last_error` (why it was released after its handler may have run).
    fn task_release(&mut self, claim: &Claim, note: Option<&str>) -> QueryResult<usize>;

    /// Cancels the task `id` if it is pending, blocked or running (state `cancelled`,
    /// finished now); returns the rows touched, 0 or 1. A running task's completion is then
    /// fenced out.
    fn task_cancel(&mut self, id: i64) -> QueryResult<usize>;

    /// Cancels every pending, blocked or running task that `filter` matches, as
    /// [`Driver::task_cancel`] does one; with `dry_run`, only counts them. Returns how many.
    fn task_cancel_matching(&mut self, filter: &TaskFilter<'_>, dry_run: bool) -> QueryResult<i64>;

    /// Puts the task `id` back to pending, due now with no failure counted, if it is dead or
    /// cancelled (to `blocked` instead while one of its parents is not done, its parents
    /// locked first so that none completes unseen; not at all when one of its parents was
    /// pruned, its outcome gone); returns the rows touched, 0 or 1.
    fn task_retry(&mut self, id: i64) -> QueryResult<usize>;

    /// Writes one row of `async_audit`.
    fn audit_insert(&mut self, audit: &AuditEntry<'_>) -> QueryResult<usize>;

    /// Where a task stands now: its state, owner and claim token (`None`: no such task).
    fn task_get_claim(&mut self, id: i64) -> QueryResult<Option<ClaimState>>;

    /// The task `(keyword, biz_id)`, as stored.
    fn task_get_by_key(&mut self, keyword: &str, biz_id: &str) -> QueryResult<Option<TaskRecord>>;

    /// Returns to pending (or dead, at max attempts) every running task whose owner is not a
    /// live node (no heartbeat for `dead_after_ms`, gone, unknown) or whose deadline has
    /// passed, counting a failure. One statement that re-checks those conditions itself.
    fn task_rescue_many(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>>;

    /// Task counts per keyword and state, with the age of the oldest due pending task.
    fn task_count_by_keyword_state(&mut self) -> QueryResult<Vec<KeywordStateCount>>;

    /// Deletes one batch of finished tasks (see [`crate::prune`]), in the caller's write
    /// transaction.
    fn task_prune_batch(&mut self, batch: &PruneBatch<'_>) -> QueryResult<PrunedBatch>;

    /// Creates or changes a tenant's row and writes `audit`, in one transaction (a savepoint
    /// inside the caller's).
    fn tenant_set(
        &mut self,
        tenant: &str,
        set: &TenantSet,
        audit: &AuditEntry<'_>,
    ) -> QueryResult<TenantRow>;

    /// Deletes a tenant's row and writes `audit`, in one transaction; returns the rows
    /// deleted, 0 or 1.
    fn tenant_remove(&mut self, tenant: &str, audit: &AuditEntry<'_>) -> QueryResult<usize>;

    /// Every tenant's row, by name.
    fn tenant_list(&mut self) -> QueryResult<Vec<TenantRow>>;

    /// Of `tenants` (each with the number of tasks a refused batch had for it), the one with a
    /// `max_queued` whose queued tasks plus the batch's exceed it by the most, with that
    /// limit: the tenant an enqueue was refused for.
    fn tenant_over_max_queued(
        &mut self,
        tenants: &[(String, i64)],
    ) -> QueryResult<Option<(String, i64)>>;

    /// Registers a worker process; returns its node id.
    fn node_register(&mut self, name: &str) -> QueryResult<i64>;

    /// Records a live node's heartbeat with the database clock, and the domains it publishes
    /// (JSON of [`crate::domain::NodeDomains`]); returns the rows touched: 0 when the node is
    /// marked gone or its row was deleted.
    fn node_heartbeat(&mut self, node_id: i64, domains: &str) -> QueryResult<usize>;

    /// This connection's id on MySQL, for the domain watchdog's `KILL QUERY`; `None` on
    /// PostgreSQL, whose task transactions are named instead (see [`Driver::session_end`]),
    /// and on SQLite.
    fn backend_pid(&mut self) -> QueryResult<Option<i32>>;

    /// Cancels the statement the connection `pid` runs now (MySQL's `KILL QUERY`); whether
    /// it was sent. Does nothing on PostgreSQL and SQLite.
    fn backend_cancel(&mut self, pid: i32) -> QueryResult<bool>;

    /// Deletes one batch of rows of stopped nodes (see [`crate::prune`]); returns how many.
    fn node_prune_batch(
        &mut self,
        older_than_ms: i64,
        silent_ms: i64,
        limit: i64,
    ) -> QueryResult<usize>;

    /// Starts listening for the notifications an enqueue of a due task sends; `false` when
    /// the backend has none (SQLite).
    fn listen_start(&mut self) -> QueryResult<bool>;

    /// Whether notifications arrived since the last call (consumes them; never waits).
    fn listen_poll(&mut self) -> QueryResult<bool>;

    /// Serialises operators' changes of domains and paused keywords, until the open
    /// transaction ends (PostgreSQL: a lock on `async_domain` that conflicts only with
    /// itself and writers, so heartbeats still read it; SQLite: nothing, a write
    /// transaction already holds the database's write lock). Call it first in the
    /// transaction, before reading what the change is checked against.
    fn domain_lock(&mut self) -> QueryResult<()>;

    /// Creates or overwrites the row `row.name` of `async_domain` (version + 1, updated at
    /// the database clock, by `audit.actor`) and writes `audit`, in one transaction (a
    /// savepoint inside the caller's); returns the row as stored.
    fn domain_write(
        &mut self,
        row: &DomainWrite<'_>,
        audit: &AuditEntry<'_>,
    ) -> QueryResult<DomainRow>;

    /// Pauses `keyword` on its own (a row of `async_pause` by `audit.actor`) and writes
    /// `audit`, in one transaction; returns the rows inserted: 0, and no audit, when it was
    /// paused already.
    fn keyword_pause(&mut self, keyword: &str, audit: &AuditEntry<'_>) -> QueryResult<usize>;

    /// Deletes `keyword`'s row of `async_pause` and writes `audit`, in one transaction;
    /// returns the rows deleted: 0, and no audit, when it was not paused.
    fn keyword_resume(&mut self, keyword: &str, audit: &AuditEntry<'_>) -> QueryResult<usize>;
}

/// Appends the fence of a claimed task to an `UPDATE async_task SET …` statement.
fn fence<DB>(set: Statement<DB>, claim: &Claim) -> Statement<DB>
where
    DB: Backend + HasSqlType<BigInt>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
{
    set.sql(" WHERE id = ")
        .bind::<BigInt, _>(claim.id)
        .sql(" AND owner = ")
        .bind::<BigInt, _>(claim.owner)
        .sql(" AND claim_token = ")
        .bind::<BigInt, _>(claim.token)
        .sql(" AND state = 'running'")
}

/// Appends `INSERT INTO async_audit (…) VALUES (…)` of `audit` to `head`; `detail_cast`
/// follows the detail's bind (`::jsonb` on PostgreSQL, nothing on SQLite).
fn audit_insert<DB>(
    head: Statement<DB>,
    audit: &AuditEntry<'_>,
    detail_cast: &'static str,
) -> Statement<DB>
where
    DB: Backend + HasSqlType<BigInt> + HasSqlType<Text>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
    String: diesel::serialize::ToSql<Text, DB>,
{
    head.sql("INSERT INTO async_audit (actor, action, target, detail, affected) VALUES (")
        .bind::<Text, _>(audit.actor.to_owned())
        .sql(", ")
        .bind::<Text, _>(audit.action.to_owned())
        .sql(", ")
        .bind::<Text, _>(audit.target.to_owned())
        .sql(", ")
        .bind::<Text, _>(audit.detail.to_owned())
        .sql(detail_cast)
        .sql(", ")
        .bind::<BigInt, _>(audit.affected)
        .sql(")")
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

/// The states as SQL literals, for a statement's `state IN (…)` (never from user text: the
/// states come from [`TaskState`]).
fn state_literals(states: &[TaskState]) -> String {
    states
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Deleted-row counts per state, as the prune statements report them.
fn counts_by_state(rows: impl Iterator<Item = (String, i64)>) -> Vec<(TaskState, u64)> {
    let mut counts: Vec<(TaskState, u64)> = Vec::new();
    for (state, n) in rows {
        let state = state
            .parse::<TaskState>()
            .expect("prune deletes rows in a known state");
        let n = u64::try_from(n).unwrap_or(0);
        match counts.iter_mut().find(|(s, _)| *s == state) {
            Some((_, total)) => *total += n,
            None => counts.push((state, n)),
        }
    }
    counts
}

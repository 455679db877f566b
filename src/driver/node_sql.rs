//! The statements of the nodes' own rows and of the worker's small reads that mean the same
//! on every backend: written once, with diesel's query builder on [`DbConnection`], and
//! cached as prepared statements like any query of the builder. (A node's id is read back
//! and stopped nodes' rows are deleted in each backend's words, the conditions written once.)

use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel::sql_types::BigInt;
use diesel::QueryResult;

use super::clock::{db_ago, DbNow};
use super::dialect::{on_backend, Conn};
use super::NodeDomainsRow;
use crate::db::DbConnection;
use crate::sql::Statement;

use super::dialect::DbBackend;
use crate::schema::{async_node, async_task, async_tenant};
use crate::task::TaskState;

/// See [`super::Driver::node_register`]: the new row's id by `RETURNING`, or on MySQL, which
/// has none, by `LAST_INSERT_ID()` (this connection's last insert).
pub(super) fn node_register(conn: Conn<'_>, name: &str) -> QueryResult<i64> {
    let insert = diesel::insert_into(async_node::table).values(async_node::name.eq(name));
    match conn {
        #[cfg(feature = "postgres")]
        Conn::Pg(c) => insert.returning(async_node::id).get_result(c),
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(c) => insert.returning(async_node::id).get_result(c),
        #[cfg(feature = "mysql")]
        Conn::Mysql(c) => {
            insert.execute(c)?;
            diesel::select(diesel::dsl::sql::<BigInt>(
                "CAST(LAST_INSERT_ID() AS SIGNED)",
            ))
            .get_result(c)
        }
    }
}

/// See [`super::Driver::node_prune_batch`]: deletes up to `limit` rows of stopped nodes (no
/// heartbeat for `older_than_ms`, gone or silent for `silent_ms`, holding no running task),
/// by id.
pub(super) fn node_prune_batch(
    conn: Conn<'_>,
    older_than_ms: i64,
    silent_ms: i64,
    limit: i64,
) -> QueryResult<usize> {
    // Each deletes the rows it picks its own way. PostgreSQL locks them first: FOR UPDATE
    // re-checks the conditions on a row that a heartbeat is updating at that moment (after
    // waiting for it), so a node that beats just now stays; the DELETE takes the ids as one
    // array, each looked up by key. SQLite holds the write lock, so nothing changes between
    // the SELECT and the DELETE. MySQL refuses a DELETE that reads its own table in a
    // subquery (error 1093), and its DELETE takes ORDER BY and LIMIT itself.
    let (pick, picked) = match conn {
        #[cfg(feature = "postgres")]
        Conn::Pg(_) => (
            "DELETE FROM async_node WHERE id = ANY (ARRAY(SELECT id FROM async_node WHERE ",
            " FOR UPDATE))",
        ),
        #[cfg(feature = "sqlite")]
        Conn::Sqlite(_) => (
            "DELETE FROM async_node WHERE id IN (SELECT id FROM async_node WHERE ",
            ")",
        ),
        #[cfg(feature = "mysql")]
        Conn::Mysql(_) => ("DELETE FROM async_node WHERE ", ""),
    };
    // SQLite and MySQL find running tasks through their lease index.
    let leased = if conn.has_lease_index() {
        "t.deadline_at IS NOT NULL AND "
    } else {
        ""
    };
    on_backend!(conn, |c| Statement::new(pick)
        .sql("heartbeat_at < ")
        .expr(db_ago(older_than_ms))
        .sql(" AND (state = 'gone' OR heartbeat_at < ")
        .expr(db_ago(silent_ms))
        .sql(
            ") AND NOT EXISTS (SELECT 1 FROM async_task t
                                WHERE t.owner = async_node.id AND "
        )
        .sql(leased)
        .sql("t.state = 'running') ORDER BY id LIMIT ")
        .bind::<BigInt, _>(limit)
        .sql(picked)
        .execute(c))
}

/// Marks a node gone (clean exit).
pub(crate) fn node_mark_gone(conn: &mut DbConnection, node_id: i64) -> QueryResult<usize> {
    diesel::update(async_node::table)
        .filter(async_node::id.eq(node_id))
        .set((
            async_node::state.eq("gone"),
            async_node::heartbeat_at.eq(DbNow),
        ))
        .execute(conn)
}

/// The nodes marked alive whose last heartbeat is at most `within_ms` old, by id.
pub(super) fn live_nodes(within_ms: i64) -> async_node::BoxedQuery<'static, DbBackend> {
    async_node::table
        .filter(async_node::state.eq("alive"))
        .filter(async_node::heartbeat_at.ge(db_ago(within_ms)))
        .order(async_node::id)
        .into_boxed()
}

/// The nodes marked alive whose last heartbeat is at most `within_ms` old, with what they
/// published, by id.
pub(crate) fn node_domains(
    conn: &mut DbConnection,
    within_ms: i64,
) -> QueryResult<Vec<NodeDomainsRow>> {
    live_nodes(within_ms)
        .select((async_node::id, async_node::name, async_node::domains))
        .load(conn)
}

/// Pending tasks of `keywords` due now, of every tenant.
pub(crate) fn task_count_due(conn: &mut DbConnection, keywords: &[String]) -> QueryResult<i64> {
    async_task::table
        .filter(async_task::state.eq(TaskState::Pending.as_str()))
        .filter(async_task::run_at.le(DbNow))
        .filter(async_task::keyword.eq_any(keywords))
        .select(count_star())
        .get_result(conn)
}

/// Those of the tasks `ids` that are cancelled.
pub(crate) fn task_cancelled_among(conn: &mut DbConnection, ids: &[i64]) -> QueryResult<Vec<i64>> {
    async_task::table
        .filter(async_task::state.eq(TaskState::Cancelled.as_str()))
        .filter(async_task::id.eq_any(ids))
        .select(async_task::id)
        .load(conn)
}

/// The tenants that have a `max_running`.
pub(crate) fn tenant_run_limited(conn: &mut DbConnection) -> QueryResult<Vec<String>> {
    async_tenant::table
        .filter(async_tenant::max_running.is_not_null())
        .order(async_tenant::tenant)
        .select(async_tenant::tenant)
        .load(conn)
}

/// See [`super::Driver::node_heartbeat`].
pub(super) fn node_heartbeat(conn: Conn<'_>, node_id: i64, domains: &str) -> QueryResult<usize> {
    on_backend!(conn, |c| diesel::update(async_node::table)
        .filter(async_node::id.eq(node_id))
        .filter(async_node::state.eq("alive"))
        .set((
            async_node::heartbeat_at.eq(DbNow),
            async_node::domains.eq(domains),
        ))
        .execute(c))
}

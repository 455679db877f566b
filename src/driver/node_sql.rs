//! The statements of the nodes' own rows and of the worker's small reads that mean the same
//! on every backend: written once, with diesel's query builder on [`DbConnection`], and
//! cached as prepared statements like any query of the builder.

use diesel::dsl::count_star;
use diesel::prelude::*;
use diesel::QueryResult;

use super::clock::{db_ago, DbNow};
use super::dialect::{on_backend, Conn};
use super::NodeDomainsRow;
use crate::db::DbConnection;

/// The backend of [`DbConnection`].
type DbBackend = <DbConnection as diesel::Connection>::Backend;
use crate::schema::{async_node, async_task, async_tenant};
use crate::task::TaskState;

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

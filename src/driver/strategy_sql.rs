//! The claim strategies' SQL (see [`crate::strategy`]): the filter a partitioned node's
//! claim adds to its due-task predicate on each backend, and the nodes' published strategies.

use diesel::prelude::*;
use diesel::query_builder::QueryFragment;
use diesel::sql_types::BigInt;

#[cfg(feature = "mysql")]
use diesel::mysql::Mysql;
#[cfg(feature = "postgres")]
use diesel::pg::Pg;
#[cfg(feature = "sqlite")]
use diesel::sqlite::Sqlite;

use super::clock::{db_ago, DbAgo};
use super::node_sql::live_nodes;
use crate::db::DbConnection;
use crate::schema::async_node;
use crate::sql::Statement;
use crate::strategy::Partition;

/// What a claim may take: the pending tasks whose time has come of the keywords it has
/// handlers for and, for a node that partitions the ids (claim strategies `id_hash` and
/// `weight`), those it owns or that have been due for longer than the grace period.
#[derive(Debug, Clone, Copy)]
pub struct Due<'a> {
    /// The keywords claimed.
    pub keywords: &'a [String],
    /// This node's share of the ids (`None`: every id).
    pub partition: Option<Partition>,
    /// The suspects (tasks held by two processes or more that died, `suspect >= 2`): left
    /// out (`Some(false)`, the claims of pages and chunks), the only ones taken (`Some(true)`,
    /// the claim of one suspect run alone), or either (`None`: the claims of tenants with a
    /// `max_running`, whose count every claim of theirs must see).
    pub suspect: Option<bool>,
}

impl<'a> Due<'a> {
    /// Any due task of `keywords` that is not a suspect.
    pub fn any(keywords: &'a [String]) -> Self {
        Due {
            keywords,
            partition: None,
            suspect: Some(false),
        }
    }
}

/// A live node's strategy, weight and tasks held, as it published them at its last beat.
#[derive(Debug, Clone, PartialEq, Eq, Queryable)]
pub struct NodeStrategyRow {
    pub id: i64,
    pub strategy: String,
    pub weight: i32,
    pub running: i64,
}

/// Publishes a live node's claim strategy, weight and the tasks it holds now (claimed, not
/// finished); returns the rows touched: 0 when the node is marked gone or its row was
/// deleted. The same on every backend: written once, with the query builder.
pub(crate) fn node_strategy_publish(
    conn: &mut DbConnection,
    node_id: i64,
    strategy: &str,
    weight: i32,
    running: i64,
) -> QueryResult<usize> {
    diesel::update(async_node::table)
        .filter(async_node::id.eq(node_id))
        .filter(async_node::state.eq("alive"))
        .set((
            async_node::strategy.eq(strategy),
            async_node::weight.eq(weight),
            async_node::running.eq(running),
        ))
        .execute(conn)
}

/// The nodes marked alive whose last heartbeat is at most `within_ms` old, with the
/// strategy, weight and tasks held they last published, by id. Written once.
pub(crate) fn node_strategies(
    conn: &mut DbConnection,
    within_ms: i64,
) -> QueryResult<Vec<NodeStrategyRow>> {
    live_nodes(within_ms)
        .select((
            async_node::id,
            async_node::strategy,
            async_node::weight,
            async_node::running,
        ))
        .load(conn)
}

/// Appends to a claim's due-task predicate the tasks `partition` lets this node take: those
/// it owns (`id % modulus` in its range) and any other due for longer than the grace period
/// (the database clock that long ago, within `(SELECT …)` when `once`). Nothing without a
/// partition. The claim still reads the claim index in claim order; the filter only passes
/// over other nodes' tasks. `t` names the task's table (`t.` on PostgreSQL, whose claims
/// alias it; empty elsewhere).
fn partition_filter<DB>(
    statement: Statement<DB>,
    partition: Option<Partition>,
    t: &'static str,
    once: bool,
) -> Statement<DB>
where
    DB: diesel::backend::Backend + diesel::sql_types::HasSqlType<BigInt>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
    DbAgo: QueryFragment<DB>,
{
    let Some(p) = partition else { return statement };
    statement
        .sql(" AND (")
        .sql(t)
        .sql("id % ")
        .bind::<BigInt, _>(p.modulus)
        .sql(" BETWEEN ")
        .bind::<BigInt, _>(p.lo)
        .sql(" AND ")
        .bind::<BigInt, _>(p.last())
        .sql(" OR ")
        .sql(t)
        .sql(if once {
            "run_at <= (SELECT "
        } else {
            "run_at <= "
        })
        .expr(db_ago(p.grace_ms))
        .sql(if once { "))" } else { ")" })
}

/// [`partition_filter`] of a PostgreSQL claim on `t`.
#[cfg(feature = "postgres")]
pub(crate) fn partition_pg(
    statement: Statement<Pg>,
    partition: Option<Partition>,
) -> Statement<Pg> {
    partition_filter(statement, partition, "t.", false)
}

/// [`partition_filter`] on SQLite. The grace's cutoff is a scalar subquery: computed once
/// per statement, not per row.
#[cfg(feature = "sqlite")]
pub(crate) fn partition_sqlite(
    statement: Statement<Sqlite>,
    partition: Option<Partition>,
) -> Statement<Sqlite> {
    partition_filter(statement, partition, "", true)
}

/// [`partition_filter`] on MySQL.
#[cfg(feature = "mysql")]
pub(crate) fn partition_mysql(
    statement: Statement<Mysql>,
    partition: Option<Partition>,
) -> Statement<Mysql> {
    partition_filter(statement, partition, "", false)
}

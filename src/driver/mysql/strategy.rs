//! Nodes' claim strategies on MySQL: what a node publishes at each beat, and the live nodes'
//! publications.

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::NodeStrategyRow;
use crate::sql::Statement;

/// See [`crate::driver::Driver::node_strategy_publish`].
pub(super) fn publish(
    conn: &mut MysqlConnection,
    node_id: i64,
    strategy: &str,
    weight: i32,
    running: i64,
) -> QueryResult<usize> {
    Statement::<Mysql>::new("UPDATE async_node SET strategy = ")
        .bind::<Text, _>(strategy.to_owned())
        .sql(", weight = ")
        .bind::<Integer, _>(weight)
        .sql(", running = ")
        .bind::<BigInt, _>(running)
        .sql(" WHERE id = ")
        .bind::<BigInt, _>(node_id)
        .sql(" AND state = 'alive'")
        .execute(conn)
}

/// See [`crate::driver::Driver::node_strategies`].
pub(super) fn live(
    conn: &mut MysqlConnection,
    within_ms: i64,
) -> QueryResult<Vec<NodeStrategyRow>> {
    Statement::<Mysql>::new(concat!(
        "SELECT id, strategy, weight, running FROM async_node WHERE state = 'alive'
         AND heartbeat_at >= ",
        now!(),
        " - INTERVAL "
    ))
    .bind::<BigInt, _>(within_ms)
    .sql(" * 1000 MICROSECOND ORDER BY id")
    .load(conn)
}

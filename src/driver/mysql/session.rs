//! A session's node on MySQL, and rescue ending the sessions of nodes no longer live.
//!
//! MySQL has no lock a transaction holds to its end and another session can list, as
//! PostgreSQL's advisory locks are (`postgres/lease.rs`). So a worker's connection, when the
//! worker takes it for its work (claims, tasks, chunks, charges, rescue, cron: the worker's
//! `heartbeat::node_conn`), holds a named lock `outbox-node-<node>-<id>`
//! (`GET_LOCK`, a session's lock, kept while the connection lives; `<id>` its
//! `CONNECTION_ID()`), taken once and moved only when the node's id changes. A name holds
//! its session's own id, so `IS_USED_LOCK` of it proves which session works for which node:
//! an id the server gave again after a restart to a session that took no such lock proves
//! nothing.
//!
//! Rescue reads the sessions of this database and of its own user (`information_schema.PROCESSLIST`:
//! a user sees its own with no privilege) and ends (`KILL CONNECTION`, allowed on one's own
//! user's) each whose lock names a node that stopped heartbeating. A node that exited
//! cleanly (`gone`) is not one: it stopped its work, and its pool may live on in its process
//! (`Worker::with_pool`), its connections still tagged. A frozen claim (its page locked
//! between its pick and its commit), a frozen chunk or handler transaction holding the rows
//! it wrote: the server rolls each back and lets its locks go, and what the process does
//! when it wakes fails on a lost connection and is fenced out by the claim token. Unlike
//! PostgreSQL's, an idle connection of such a node is ended too (a transaction's end does not
//! let its session's lock go); the pool replaces it. `PROCESSLIST` and named locks are one
//! server's: behind a proxy that spreads sessions over several servers, a rescuer sees only
//! the sessions of its own server. A handler that calls `RELEASE_ALL_LOCKS()` drops its
//! connection's tag.
//!
//! The nodes looked at are those that beat in the last day, so that a table of nodes never
//! pruned does not make the pass a product of every session and every node that ever ran; a
//! node silent longer had its sessions ended long before (the session of a node whose row was
//! pruned is not found, unlike on PostgreSQL).

use diesel::connection::SimpleConnection;
use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::BigInt;
use diesel::{QueryResult, RunQueryDsl};

use crate::db::reply::{session_node, set_session_node};
use crate::driver::rows::CountRow;
use crate::sql::Statement;

/// The named lock by which the session `$session` (an SQL expression) says it works for the
/// node `$node` (one): `outbox-node-<node>-<session>`, at most 52 characters (MySQL 8 refuses
/// names over 64).
macro_rules! lock_name {
    ($node:expr, $session:expr) => {
        concat!("CONCAT('outbox-node-', ", $node, ", '-', ", $session, ")")
    };
}

/// Makes `conn`'s session hold the lock that names `node` (and no longer the one of the node
/// it worked for before): one statement when it changes, none when the connection holds it
/// already (noted on the connection, see `db::reply`). A connection without that note (its
/// instrumentation replaced) is not tagged, and rescue will not find it.
pub(super) fn tag(conn: &mut MysqlConnection, node: i64) -> QueryResult<()> {
    let Some(old) = session_node(conn) else {
        return Ok(());
    };
    if old == node {
        return Ok(());
    }
    let take = format!(lock_name!("{}", "CONNECTION_ID()"), node);
    let statement = match old {
        0 => format!("DO GET_LOCK({take}, 0)"),
        old => format!(
            concat!(
                "DO RELEASE_LOCK(",
                lock_name!("{}", "CONNECTION_ID()"),
                "), GET_LOCK({}, 0)"
            ),
            old, take
        ),
    };
    // Noted only once the server has it; a failure leaves the note as it was, and the
    // connection is not reused (a statement failed on it: `db::reply`).
    conn.batch_execute(&statement)?;
    set_session_node(conn, node);
    Ok(())
}

/// See [`crate::driver::LeaseDriver::session_end_stale`]: the sessions of this user whose
/// lock names a node that is not live (no heartbeat for `dead_after_ms`; never `node`, the
/// node that asks) and did not exit cleanly (`gone`: a node that stopped its work, whose pool
/// may live on in its process, in an application's hands); then waits briefly for the server
/// to have let what they held go, so that the pass's charges reach their rows. A `KILL` that
/// fails is passed over when its session has left already; otherwise the first such error is
/// returned, after the others were ended and waited for. Returns how many it ended.
pub(super) fn end_stale(
    conn: &mut MysqlConnection,
    dead_after_ms: i64,
    node: i64,
) -> QueryResult<i64> {
    let stale = Statement::<Mysql>::new(
        "SELECT CAST(p.ID AS SIGNED) AS id
           FROM information_schema.PROCESSLIST p JOIN async_node n
             ON IS_USED_LOCK(",
    )
    .sql(concat!(
        lock_name!("n.id", "p.ID"),
        ") = p.ID
          WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID()
            AND p.USER = SUBSTRING_INDEX(USER(), '@', 1)
            AND n.state = 'alive' AND n.heartbeat_at >= ",
        now!(),
        " - INTERVAL 1 DAY AND n.heartbeat_at < ",
        now!(),
        " - INTERVAL "
    ))
    .bind::<BigInt, _>(dead_after_ms)
    .sql(" * 1000 MICROSECOND AND n.id <> ")
    .bind::<BigInt, _>(node);
    let mut ended = Vec::new();
    let mut failed = None;
    for session in super::load_ids(conn, stale)? {
        match conn.batch_execute(&format!("KILL CONNECTION {session}")) {
            Ok(()) => ended.push(session),
            // Gone already (ER_NO_SUCH_THREAD), told apart by the list, not the message's words.
            Err(e) => match listed(conn, &[session]) {
                Ok(0) => {}
                _ => {
                    failed.get_or_insert(e);
                }
            },
        }
    }
    wait_gone(conn, &ended)?;
    match failed {
        Some(e) => Err(e),
        None => Ok(i64::try_from(ended.len()).unwrap_or(i64::MAX)),
    }
}

/// How long [`end_stale`] waits for the sessions it ended to leave the server.
const GONE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits until none of the sessions `ids` is listed any longer (the server lists a killed
/// session until it has rolled its transaction back), at most [`GONE_WAIT`]: a session still
/// there then holds its rows for a later pass, which passes over them meanwhile.
fn wait_gone(conn: &mut MysqlConnection, ids: &[i64]) -> QueryResult<()> {
    let until = std::time::Instant::now() + GONE_WAIT;
    while !ids.is_empty() && listed(conn, ids)? > 0 && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    Ok(())
}

/// How many of the sessions `ids` the server lists.
fn listed(conn: &mut MysqlConnection, ids: &[i64]) -> QueryResult<i64> {
    let list = ids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let listed: CountRow = diesel::sql_query(format!(
        "SELECT count(*) AS n FROM information_schema.PROCESSLIST WHERE ID IN ({list})"
    ))
    .get_result(conn)?;
    Ok(listed.n)
}

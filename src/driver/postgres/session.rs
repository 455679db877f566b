//! The sessions of the engine's transactions on PostgreSQL, found by their marks.
//!
//! Each transaction of the engine holds two shared advisory locks, of its node and of its
//! run ([`TxMark`], see `Driver::transaction_begin`): `pg_locks` then tells which session
//! runs which, for the whole transaction and not a moment after (a pooled session that has
//! moved on holds neither), through PgBouncer too, and a cancel of another role's session
//! is never needed to find it.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::BigInt;
use diesel::{QueryResult, RunQueryDsl};

use crate::driver::rows::CountRow;
use crate::driver::TxMark;
use crate::sql::Statement;

/// The advisory lock class of a transaction's node (`'obn'`, then 1): two-key advisory
/// locks, apart from the one-key ones (the migrations' lock) and from the tenants' claim
/// locks (class `'or'`).
pub(super) const NODE_CLASS: i32 = 0x6f62_6e01;
/// The advisory lock class of a transaction's run (`'obr'`, then 1).
pub(super) const RUN_CLASS: i32 = 0x6f62_7201;

/// A node id or run number as the second key of an advisory lock: its low 31 bits (two
/// live transactions 2³¹ runs apart are all it could confuse).
pub(super) fn key(n: i64) -> i32 {
    i32::try_from(n & 0x7fff_ffff).expect("31 bits fit")
}

/// The sessions holding the advisory locks of the engine's transactions (`pg_locks`), in
/// this database, but this session: `marks(pid, node, run, may_end)`. `may_end`: this role
/// may end the session (`pg_terminate_backend` refuses, with an error that would end the
/// whole statement, another role's session unless this one is a member of it, or of
/// `pg_signal_backend` for a session that is not a superuser's).
const MARKS: &str = "WITH marks AS (
        SELECT n.pid, n.objid::bigint AS node, r.objid::bigint AS run,
               COALESCE((SELECT pg_has_role(s.usesysid, 'MEMBER')
                                OR (pg_has_role('pg_signal_backend', 'MEMBER') AND NOT u.rolsuper)
                           FROM pg_stat_activity s JOIN pg_roles u ON u.oid = s.usesysid
                          WHERE s.pid = n.pid), false) AS may_end
          FROM pg_locks n JOIN pg_locks r ON r.pid = n.pid
         WHERE n.locktype = 'advisory' AND n.objsubid = 2 AND n.granted
           AND n.database = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND r.locktype = 'advisory' AND r.objsubid = 2 AND r.granted
           AND r.database = n.database
           AND n.classid = 1868721665::oid AND r.classid = 1868722689::oid
           AND n.pid <> pg_backend_pid())";

/// Ends the sessions whose transactions' marks name a node that is not live (never `node`'s,
/// the node that asks), or a run whose lease is past its deadline; how many.
pub(super) fn end_stale(
    conn: &mut PgConnection,
    dead_after_ms: i64,
    node: i64,
) -> QueryResult<i64> {
    // Reading pg_locks takes the lock manager's partition locks for a moment: once a pass.
    // `pg_terminate_backend` returns before the ended session has let its locks go: a row
    // it still holds when the rescue statements after this reach it is passed over (`SKIP
    // LOCKED`) and charged at the next pass.
    let ended: CountRow = Statement::<Pg>::new(MARKS)
        .sql(
            "
        SELECT count(*) FILTER (WHERE CASE WHEN m.may_end THEN pg_terminate_backend(m.pid) END) AS n
          FROM (SELECT DISTINCT pid, node, run, may_end FROM marks) m
         WHERE NOT EXISTS (SELECT 1 FROM async_node a
                            WHERE a.id & 2147483647 = m.node AND a.state = 'alive'
                              AND (a.id = ",
        )
        .bind::<BigInt, _>(node)
        .sql(" OR a.heartbeat_at >= now() - ")
        .bind::<BigInt, _>(dead_after_ms)
        .sql(
            " * interval '1 millisecond'))
            OR EXISTS (SELECT 1 FROM async_lease l
                        WHERE l.node_id & 2147483647 = m.node AND l.chunk = m.run
                          AND l.deadline_at < now())",
        )
        .get_result(conn)?;
    Ok(ended.n)
}

/// Ends the sessions of the transactions marked `mark`; whether there was one.
pub(super) fn end(conn: &mut PgConnection, mark: TxMark) -> QueryResult<bool> {
    let ended: CountRow = Statement::<Pg>::new(MARKS)
        .sql(
            "
        SELECT count(*) FILTER (WHERE CASE WHEN may_end THEN pg_terminate_backend(pid) END) AS n
          FROM (SELECT DISTINCT pid, may_end FROM marks WHERE node = ",
        )
        .bind::<BigInt, _>(i64::from(key(mark.node)))
        .sql(" AND run = ")
        .bind::<BigInt, _>(i64::from(key(mark.run)))
        .sql(") m")
        .get_result(conn)?;
    Ok(ended.n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marks_query_names_the_lock_classes_the_transactions_take() {
        assert!(MARKS.contains(&format!("n.classid = {NODE_CLASS}::oid")));
        assert!(MARKS.contains(&format!("r.classid = {RUN_CLASS}::oid")));
    }

    #[test]
    fn a_key_is_the_low_31_bits() {
        assert_eq!(key(7), 7);
        assert_eq!(key(0x7fff_ffff), 0x7fff_ffff);
        assert_eq!(key(0x8000_0005), 5);
    }
}

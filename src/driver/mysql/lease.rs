//! Lock claims on MySQL: a chunk's tasks leased in `async_lease` by the claim's transaction
//! (the pick locks the rows `SKIP LOCKED`, as a stamping claim's does, and inserts a lease
//! each instead of stamping them), then run in a transaction of their own and marked done in
//! it as their leases are deleted: one write of the task row, against a stamped claim's two,
//! each of which moves the row's entries in every index that leads with its state. A lease
//! that outlives its chunk is rescued.
//!
//! Unlike PostgreSQL's, the lease table is logged (InnoDB: see the migration), and a chunk's
//! transaction carries no mark: rescue finds a frozen chunk by its session's node
//! (`session.rs`), and ends it once the node is no longer live, as a stamped chunk's. Its
//! late completion finds its leases gone, or taken again under a new token (by this node
//! too: every write names the chunk's tokens), and writes nothing.
//! The domain watchdog kills a hung handler's statement (`KILL QUERY`).

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Bool, Text};
use diesel::Connection;
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::chain::OnLocked;
use super::claim::{chunk_of, mark, take_page, Take};
use super::task::Taken;
use super::{list, session, task};
use crate::db::transaction::depth_of;
use crate::driver::ops::CANCELLED_RUNNING;
use crate::driver::{
    lapsed, ChunkRuns, ClaimRow, Claiming, Due, LeaseCharge, LeaseDriver, Pick, Picked,
    RescueParams, RescuedRow,
};
use crate::sql::Statement;

/// A lease and its task, locked together.
#[derive(QueryableByName)]
struct Held {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = BigInt)]
    node_id: i64,
    /// Past its deadline.
    #[diesel(sql_type = Bool)]
    late: bool,
    /// The task is still pending under the lease's token: the lease holds it.
    #[diesel(sql_type = Bool)]
    holds: bool,
}

/// The tasks of `ids` and their leases that pass `test` (on `l`, the lease), locked
/// together, task then lease, in id order: every locking read of leases takes this order
/// (the task row first, through its primary key, as every completion's: see
/// docs/notes/2026-11-25-mysql-hang.md), so that a completion and rescue never lock the same
/// pair the other way round.
fn lock_with_leases(
    conn: &mut MysqlConnection,
    ids: &[i64],
    test: impl FnOnce(Statement<Mysql>) -> Statement<Mysql>,
    on_locked: OnLocked,
) -> QueryResult<Vec<Held>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Statement::<Mysql>::new(concat!(
        "SELECT STRAIGHT_JOIN t.id, l.node_id, l.deadline_at < ",
        now!(),
        " AS late, t.state = 'pending' AND t.claim_token = l.token AS holds
           FROM async_task t FORCE INDEX (PRIMARY)
           JOIN async_lease l FORCE INDEX (PRIMARY) ON l.task_id = t.id
          WHERE t.id IN "
    ))
    .with(|s| list::ids(s, ids))
    .sql(" AND ")
    .with(test)
    .sql(" ORDER BY t.id")
    .sql(on_locked.clause())
    .load(conn)
}

/// The ids of `claims` (`(id, token)`).
fn ids_of(claims: &[(i64, i64)]) -> Vec<i64> {
    claims.iter().map(|&(id, _)| id).collect()
}

/// `owner`'s leases on the tasks of `claims`, under those tokens: a newer lease of the same
/// node on the same task (taken after this chunk's was rescued) is not this chunk's.
fn owned(statement: Statement<Mysql>, owner: i64, claims: &[(i64, i64)]) -> Statement<Mysql> {
    statement
        .sql("l.node_id = ")
        .bind::<BigInt, _>(owner)
        .sql(" AND (l.task_id, l.token) IN ")
        .with(|s| list::pairs(s, claims))
}

/// The tasks of `claims` under `owner`'s leases, locked with their leases.
fn lock_owned(
    conn: &mut MysqlConnection,
    owner: i64,
    claims: &[(i64, i64)],
) -> QueryResult<Vec<Held>> {
    lock_with_leases(
        conn,
        &ids_of(claims),
        |s| owned(s, owner, claims),
        OnLocked::Wait,
    )
}

/// The ids of the tasks of `locked` that their leases still hold.
fn holding(locked: &[Held]) -> Vec<i64> {
    locked.iter().filter(|h| h.holds).map(|h| h.id).collect()
}

/// The tasks of `ids` found cancelled, noted [`CANCELLED_RUNNING`] before their leases go: a
/// cancel that read the leases before the lease committed wrote nothing. The engine's
/// `UPDATE` (no CHECK evaluated), so that a row written against a rule fails no claim again,
/// charge or rescue pass.
fn note_cancelled(conn: &mut MysqlConnection, ids: &[i64]) -> QueryResult<()> {
    if ids.is_empty() {
        return Ok(());
    }
    Statement::<Mysql>::new(concat!(engine_update!(), " SET last_error = "))
        .bind::<Text, _>(CANCELLED_RUNNING)
        .sql(concat!(
            ", updated_at = ",
            now!(),
            " WHERE state = 'cancelled' AND id IN "
        ))
        .with(|s| list::ids(s, ids))
        .execute(conn)?;
    Ok(())
}

/// The deletion of leases by task, then the list of tasks. Through the primary key, named:
/// a young table's statistics led the optimizer to read the whole table, and every chunk's
/// completion then waited for the leases the others had locked (deadlocks, each chunk rolled
/// back). Only the multiple-table form of `DELETE` takes an index hint.
const DELETE_LEASES: &str = "DELETE l FROM async_lease l FORCE INDEX (PRIMARY) WHERE l.task_id IN ";

/// Deletes `owner`'s leases of `claims`; how many.
fn drop_leases(
    conn: &mut MysqlConnection,
    owner: i64,
    claims: &[(i64, i64)],
) -> QueryResult<usize> {
    if claims.is_empty() {
        return Ok(0);
    }
    Statement::<Mysql>::new(DELETE_LEASES)
        .with(|s| list::ids(s, &ids_of(claims)))
        .sql(" AND ")
        .with(|s| owned(s, owner, claims))
        .execute(conn)
}

impl LeaseDriver for MysqlConnection {
    fn session_tag(&mut self, node: i64) -> QueryResult<()> {
        session::tag(self, node)
    }

    fn session_end_stale(&mut self, rescue: &RescueParams) -> QueryResult<i64> {
        session::end_stale(self, rescue.dead_after_ms, rescue.node)
    }

    fn task_lease_page(
        &mut self,
        claim: &Claiming<'_>,
        chunk: ChunkRuns,
        pick: &Pick<'_>,
    ) -> QueryResult<(Picked, Vec<i64>)> {
        // The pick's test for a lease reads with the statement's view, which may predate a
        // lease another claim committed while the pick walked: it then locks that task once
        // the other claim has let it go, and its insert meets the other's lease (a duplicate
        // key). The claim rolls back whole; the worker takes it again (`worker/locked.rs`).
        let picked = take_page(self, claim, pick, Take::Lease(chunk))?;
        let runs = (0..picked.rows.len())
            .map(|i| i64::from(chunk_of(chunk, i)))
            .collect();
        Ok((picked, runs))
    }

    fn task_lease_plan(&mut self, due: &Due<'_>, limit: i64) -> QueryResult<Vec<String>> {
        // The lease claim picks as the stamp claim does.
        super::claim::claim_plan(self, due, limit)
    }

    fn task_complete_leased(&mut self, owner: i64, claims: &[(i64, i64)]) -> QueryResult<usize> {
        // Only in the chunk's own transaction: a handler that ended it left the rest to
        // autocommit, and the completion must not pretend to be atomic with the handlers.
        if !matches!(depth_of(self), Some(depth) if depth > 0) {
            return Ok(0);
        }
        // The leases and their tasks locked first, so that the check for links of the
        // completion's UPDATE reads after every lock (see `task::finish_held`).
        let held = holding(&lock_owned(self, owner, claims)?);
        let n = task::finish_held(self, &held, "pending", |s| {
            s.sql(", owner = ").bind::<BigInt, _>(owner).sql(concat!(
                ", claim_token = claim_token + 1, claimed_at = ",
                now!()
            ))
        })?;
        drop_leases(self, owner, claims)?;
        Ok(n)
    }

    fn task_claim_leased(
        &mut self,
        owner: i64,
        claims: &[(i64, i64)],
        ran: &[i64],
        timeout_ms: i64,
    ) -> QueryResult<Vec<ClaimRow>> {
        self.transaction(|conn| {
            let locked = lock_owned(conn, owner, claims)?;
            let ran: Vec<i64> = locked
                .iter()
                .map(|h| h.id)
                .filter(|id| ran.contains(id))
                .collect();
            note_cancelled(conn, &ran)?;
            drop_leases(conn, owner, claims)?;
            mark(conn, owner, &holding(&locked), timeout_ms)
        })
    }

    fn task_release_leased(
        &mut self,
        owner: i64,
        claims: &[(i64, i64)],
        ran: &[i64],
        note: &str,
    ) -> QueryResult<usize> {
        if ran.is_empty() {
            return drop_leases(self, owner, claims);
        }
        // The tasks of `ran` first, then the chunk's leases: a charge of the same chunk that
        // locks them the other way round deadlocks with it, and the worker retries. A task
        // cancelled by a cancel that read the leases before this chunk's committed wrote no
        // note: it gets its own.
        self.transaction(|conn| {
            Statement::<Mysql>::new(concat!(
                engine_update!(),
                " SET updated_at = ",
                now!(),
                ", last_error = CASE state WHEN 'cancelled' THEN "
            ))
            .bind::<Text, _>(CANCELLED_RUNNING)
            .sql(" ELSE ")
            .bind::<Text, _>(note.to_owned())
            .sql(" END WHERE state IN ('cancelled', 'pending') AND id IN ")
            .with(|s| list::ids(s, ran))
            .sql(" AND EXISTS (SELECT 1 FROM async_lease l WHERE l.task_id = async_task.id AND ")
            .with(|s| owned(s, owner, claims))
            .sql(")")
            .execute(conn)?;
            drop_leases(conn, owner, claims)
        })
    }

    fn task_charge_leased(
        &mut self,
        owner: i64,
        lease: &LeaseCharge<'_>,
    ) -> QueryResult<Option<String>> {
        // Every lease of the chunk goes; only the hung task is charged. The others are free
        // at once, under a new token (as on PostgreSQL), and the chunk's late statements find
        // no lease of its own.
        self.transaction(|conn| {
            // The chunk's tasks and leases locked first, in the order every locking read of
            // leases takes.
            let locked = lock_owned(conn, owner, lease.chunk)?;
            let (held, freed): (Vec<i64>, Vec<i64>) = holding(&locked)
                .into_iter()
                .partition(|&id| id == lease.task);
            drop_leases(conn, owner, lease.chunk)?;
            // A task cancelled by a cancel that read the leases before this one committed
            // wrote no note: written with the lease's end, since the process may exit next
            // (the hang watchdog).
            let ours: Vec<i64> = locked.iter().map(|h| h.id).collect();
            note_cancelled(conn, &ours)?;
            // The others may run again elsewhere after their handlers ran in this chunk: the
            // note says why (on PostgreSQL the chunk's transaction id tells it; InnoDB gives a
            // handler no id to record).
            if !freed.is_empty() {
                Statement::<Mysql>::new(
                    "UPDATE async_task SET claim_token = claim_token + 1,
                            last_error = CONCAT('released: task ', ",
                )
                .bind::<BigInt, _>(lease.task)
                .sql(concat!(
                    ", ' of its chunk ran past its timeout'), updated_at = ",
                    now!(),
                    " WHERE state = 'pending' AND id IN "
                ))
                .with(|s| list::ids(s, &freed))
                .execute(conn)?;
            }
            let taken = Taken::Leased {
                node: owner,
                error: lease.error,
                suspect: 0,
            };
            let delay = |s: Statement<Mysql>| {
                s.sql(concat!(now!(), " + INTERVAL "))
                    .bind::<BigInt, _>(lease.delay_ms)
                    .sql(" * 1000 MICROSECOND")
            };
            task::charge(conn, &held, taken, delay, lease.default_max_attempts)?;
            Ok(task::charged(conn, &held)?
                .into_iter()
                .next()
                .map(|r| r.state))
        })
    }

    fn task_rescue_leases(&mut self, rescue: &RescueParams) -> QueryResult<Vec<RescuedRow>> {
        #[derive(QueryableByName)]
        struct Lapsed {
            #[diesel(sql_type = BigInt)]
            task_id: i64,
        }
        // The leases of nodes that are not live (dead, frozen, cut off, gone), and those past
        // their deadline: found without locks, then locked with their tasks and the test
        // repeated. A pair another transaction holds is passed over (`OnLocked::Skip`): a
        // completion under way deletes its leases; one frozen midway holds them as long as
        // its session, and waiting for it held up the rescue of every other lease.
        let lapsed = |s| {
            let s = lapsed(s, ("l.deadline_at", "l.node_id"), rescue);
            match rescue.only {
                Some(only) => s.sql(" AND l.task_id = ").bind::<BigInt, _>(only),
                None => task::dying(
                    s.sql(
                        " AND NOT EXISTS (SELECT 1 FROM async_task d WHERE d.id = l.task_id AND ",
                    ),
                    "d",
                    rescue,
                )
                .sql(")"),
            }
        };
        super::rescue_waiting_briefly(self, |conn| {
            conn.transaction(|conn| {
                let found: Vec<Lapsed> =
                    Statement::<Mysql>::new("SELECT task_id FROM async_lease l WHERE ")
                        .with(lapsed)
                        .load(conn)?;
                if found.is_empty() {
                    return Ok(Vec::new());
                }
                let found: Vec<i64> = found.into_iter().map(|l| l.task_id).collect();
                let locked = lock_with_leases(conn, &found, lapsed, OnLocked::Skip)?;
                // Each node's tasks charged apart, late leases apart from a dead node's: the
                // reason and the count of deaths differ.
                let mut groups: Vec<(i64, bool, Vec<i64>)> = Vec::new();
                for held in locked.iter().filter(|h| h.holds) {
                    match groups
                        .iter_mut()
                        .find(|(node, late, _)| *node == held.node_id && *late == held.late)
                    {
                        Some((_, _, ids)) => ids.push(held.id),
                        None => groups.push((held.node_id, held.late, vec![held.id])),
                    }
                }
                for (node, late, ids) in &groups {
                    let why = match late {
                        true => "its lock-claimed chunk ran past its deadline",
                        false => "the node stopped heartbeating",
                    };
                    let error = format!("rescued from node {node}: {why}");
                    let taken = Taken::Leased {
                        node: *node,
                        error: &error,
                        suspect: i32::from(!late),
                    };
                    let backoff = |s| task::backoff_after(s, rescue);
                    task::charge(conn, ids, taken, backoff, rescue.default_max_attempts)?;
                }
                // A cancelled task's lease goes with the cancel's note (a cancel that missed
                // the lease wrote none).
                let gone: Vec<i64> = locked.iter().map(|h| h.id).collect();
                note_cancelled(conn, &gone)?;
                Statement::<Mysql>::new(DELETE_LEASES)
                    .with(|s| list::ids(s, &gone))
                    .execute(conn)?;
                let mut ids: Vec<i64> = groups.into_iter().flat_map(|(_, _, ids)| ids).collect();
                ids.sort_unstable();
                task::charged(conn, &ids)
            })
        })
    }
}

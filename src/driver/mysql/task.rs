//! Task statements on MySQL: completion, failure, release, rescue (cancellation is in
//! `operate.rs`). A task that ends done releases its children, one that ends dead or
//! cancelled cancels its descendants, in the same transaction (see `chain.rs`: no trigger may
//! do it on MySQL). A task without children, the common case, completes in one statement
//! with no look-up of children.

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Double, Integer, Text};
use diesel::Connection;
use diesel::{QueryResult, RunQueryDsl};

use super::chain::{self, OnLocked};
use super::{list, load_ids};
use crate::db::transaction::depth_of;
use crate::driver::{fence, lapsed, Claim, RescueParams, RescuedRow};
use crate::sql::Statement;

// The columns a completion sets: done, now.
macro_rules! done {
    () => {
        concat!("finished_at = ", now!(), ", updated_at = ", now!())
    };
}

/// The `UPDATE … SET` of a completion that may not release children, for tasks known to be
/// without them (`has_children` false). A producer's `parent_id` shorthand cannot set the
/// flag (its trigger is on `async_task` itself), so the statement checks for a link too,
/// once the row is locked: its read then sees every link committed (a shorthand producer
/// holds the parent's row in share mode until it commits; one that links later waits for
/// this transaction and finds the parent done). A link found makes the state NULL, which
/// strict mode refuses (error 1048, [`is_refused`]): the caller then takes the way that
/// releases children. The read is the statement's first, so it is fresh only for a row
/// locked before the statement or as its only one: an `UPDATE` of several rows that waits
/// for a later row's lock reads with the view its first row opened.
const SET_DONE_CHILDLESS: &str = concat!(
    engine_update!(),
    " SET state = CASE WHEN EXISTS (
        SELECT 1 FROM async_task_parent l WHERE l.parent_id = async_task.id) THEN NULL ELSE 'done' END, ",
    done!()
);

/// The `UPDATE … SET` of a completion that releases the task's children (the caller then
/// does): `has_children` made true if a link shows any.
const SET_DONE_RELEASING: &str = concat!(
    engine_update!(),
    " SET state = 'done', ",
    done!(),
    ", has_children = has_children
        OR EXISTS (SELECT 1 FROM async_task_parent l WHERE l.parent_id = async_task.id)"
);

/// Whether `error` is [`SET_DONE_CHILDLESS`] refusing a task that has children: the NULL
/// refused by strict mode (outbox's connections set it, and on MariaDB the statement itself:
/// `engine_update!`), or, on MySQL, on a connection whose `sql_mode` a handler cleared, the empty
/// text MySQL stores instead refused by the state's CHECK (MySQL's error 3819 names the
/// constraint, as MariaDB's 4025 does; MySQL enforces CHECK from 8.0.16).
fn is_refused(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind, Error};
    match error {
        Error::DatabaseError(DatabaseErrorKind::NotNullViolation, info) => {
            info.message().contains("'state'")
        }
        Error::DatabaseError(_, info) => info.message().contains("async_task_state_check"),
        _ => false,
    }
}

/// Completes a claimed task. One without children (the common case) in one statement, in
/// the caller's transaction if one is open, with no look-up of children; a parent, or a
/// task whose claim was taken over, in a transaction (a savepoint in the caller's) that
/// releases its children.
pub(in crate::driver) fn complete(conn: &mut MysqlConnection, claim: &Claim) -> QueryResult<usize> {
    match fence(Statement::new(SET_DONE_CHILDLESS), claim)
        .sql(" AND NOT has_children")
        .execute(conn)
    {
        Ok(1) => return Ok(1),
        Ok(_) => {}
        Err(e) if is_refused(&e) => {}
        Err(e) => return Err(e),
    }
    conn.transaction(|conn| {
        let n = fence(Statement::new(SET_DONE_RELEASING), claim).execute(conn)?;
        if n == 1 {
            chain::release_children(conn, &[claim.id])?;
        }
        Ok(n)
    })
}

/// Completes a chunk's tasks still held by `claims`: locked by key, then marked done; the
/// children of those that have any released (looked up only when one has). In the chunk's
/// transaction, with no savepoint of its own (an error rolls the chunk back whole), or in
/// one of its own when none is open.
pub(in crate::driver) fn complete_many(
    conn: &mut MysqlConnection,
    owner: i64,
    claims: &[(i64, i64)],
) -> QueryResult<usize> {
    let ids: Vec<i64> = claims.iter().map(|&(id, _)| id).collect();
    in_transaction(conn, |conn| {
        // The tasks still held by these claims, locked through the primary key: those this
        // completion ends. A locking read the optimizer led through the state index locked
        // the entries of every running task of this node on its way, and deadlocked with
        // the completions of other chunks and tasks (docs/notes/2026-11-25-mysql-hang.md).
        // Locked before the UPDATE, so that its check for links reads after every lock.
        let held = chain::lock_by_key(conn, &ids, |s| {
            s.sql("state = 'running' AND owner = ")
                .bind::<BigInt, _>(owner)
                .sql(" AND (id, claim_token) IN ")
                .with(|s| list::pairs(s, claims))
        })?;
        finish_held(conn, &held, "running", |s| s)
    })
}

/// Marks done the tasks `held` (locked by this transaction, in the state `from`), `set`
/// appending to the `SET` of each `UPDATE`, and releases the children of those that have
/// any (looked up only when one has). Returns how many it marked.
pub(super) fn finish_held(
    conn: &mut MysqlConnection,
    held: &[i64],
    from: &'static str,
    set: impl Fn(Statement<Mysql>) -> Statement<Mysql>,
) -> QueryResult<usize> {
    if held.is_empty() {
        return Ok(0);
    }
    let childless = set(Statement::<Mysql>::new(SET_DONE_CHILDLESS))
        .sql(" WHERE state = '")
        .sql(from)
        .sql("' AND NOT has_children AND id IN ")
        .with(|s| list::ids(s, held))
        .execute(conn);
    // A parent among them: a refused statement changed nothing; one that passed over the
    // tasks flagged as parents marked the others.
    let childless = match childless {
        Ok(n) if n == held.len() => return Ok(n),
        Ok(n) => n,
        Err(e) if is_refused(&e) => 0,
        Err(e) => return Err(e),
    };
    let parents = set(Statement::<Mysql>::new(SET_DONE_RELEASING))
        .sql(" WHERE state = '")
        .sql(from)
        .sql("' AND id IN ")
        .with(|s| list::ids(s, held))
        .execute(conn)?;
    chain::release_children(conn, held)?;
    Ok(childless + parents)
}

/// Runs `f` in the transaction open on `conn`, or in one of its own when none is.
fn in_transaction<T>(
    conn: &mut MysqlConnection,
    f: impl FnOnce(&mut MysqlConnection) -> QueryResult<T>,
) -> QueryResult<T> {
    match depth_of(conn) {
        Some(depth) if depth > 0 => f(conn),
        _ => conn.transaction(f),
    }
}

/// Appends that the task `task` (a table or alias) is a dying parent: at its last attempt,
/// with children, whose cancelling at its death (`chain::cancel_descendants`) waits for
/// locks. By its links, not `has_children`: a producer's `parent_id` shorthand cannot set that
/// flag on MySQL while the parent runs.
pub(super) fn dying(
    statement: Statement<Mysql>,
    task: &'static str,
    rescue: &RescueParams,
) -> Statement<Mysql> {
    statement
        .sql(task)
        .sql(".failures + 1 >= COALESCE(")
        .sql(task)
        .sql(".max_attempts, ")
        .bind::<Integer, _>(rescue.default_max_attempts)
        .sql(") AND EXISTS (SELECT 1 FROM async_task_parent k WHERE k.parent_id = ")
        .sql(task)
        .sql(".id)")
}

/// See [`crate::driver::Driver::task_rescue_dying`]: stamped, then leased, read without locks.
pub(in crate::driver) fn rescue_dying(
    conn: &mut MysqlConnection,
    rescue: &RescueParams,
) -> QueryResult<Vec<i64>> {
    let statement = Statement::<Mysql>::new(
        "SELECT id FROM async_task FORCE INDEX (async_task_deadline_idx)
          WHERE state = 'running' AND ",
    );
    let statement = lapsed(statement, ("deadline_at", "async_task.owner"), rescue);
    let statement = dying(statement.sql(" AND "), "async_task", rescue).sql(
        " UNION SELECT l.task_id AS id FROM async_lease l JOIN async_task d ON d.id = l.task_id
          WHERE ",
    );
    let statement = lapsed(statement, ("l.deadline_at", "l.node_id"), rescue);
    super::rescue_waiting_briefly(conn, |conn| {
        load_ids(
            conn,
            dying(statement.sql(" AND "), "d", rescue).sql(" ORDER BY id"),
        )
    })
}

/// Appends when a rescued task runs again: now, plus its backoff after `failures` failures
/// (doubling from `rescue.backoff_base_ms` up to its max, with its jitter). Read before
/// `failures` changes.
pub(super) fn backoff_after(
    statement: Statement<Mysql>,
    rescue: &RescueParams,
) -> Statement<Mysql> {
    statement
        .sql(concat!(now!(), " + INTERVAL ROUND(LEAST(LEAST("))
        .bind::<BigInt, _>(rescue.backoff_base_ms)
        .sql(" * POW(2, LEAST(failures, 40)), ")
        .bind::<BigInt, _>(rescue.backoff_max_ms)
        .sql(") * (1 - ")
        .bind::<Double, _>(rescue.backoff_jitter)
        .sql(" + 2 * ")
        .bind::<Double, _>(rescue.backoff_jitter)
        .sql(" * RAND()), ")
        .bind::<BigInt, _>(rescue.backoff_max_ms)
        .sql(") * 1000) MICROSECOND")
}

/// Rescue: the running tasks past their deadline or whose owner is not a live node, locked
/// (one another transaction holds, a completion under way or frozen midway, is passed over
/// until a later pass), each returned to pending after a backoff or, at max attempts, dead
/// (its descendants cancelled), counting a failure; then read back.
pub(in crate::driver) fn rescue_many(
    conn: &mut MysqlConnection,
    rescue: &RescueParams,
) -> QueryResult<Vec<RescuedRow>> {
    let lapsed = |s: Statement<Mysql>| {
        let s = lapsed(
            s.sql("state = 'running' AND "),
            ("deadline_at", "async_task.owner"),
            rescue,
        );
        match rescue.only {
            Some(only) => s.sql(" AND id = ").bind::<BigInt, _>(only),
            None => dying(s.sql(" AND NOT ("), "async_task", rescue).sql(")"),
        }
    };
    super::rescue_waiting_briefly(conn, |conn| {
        conn.transaction(|conn| {
            // Found without locks, then locked through the primary key with the test repeated
            // (`chain::lock_by_key`: a locking read through the deadline index deadlocked with
            // completions), a row held by another transaction passed over (`OnLocked::Skip`: a
            // completion under way, a rescuer, or a chunk frozen midway). The test's read of
            // `async_node` locks nothing (READ COMMITTED), so heartbeats never wait on it.
            // One task alone (a dying parent) by its key, the rest through the deadline index.
            let index = match rescue.only {
                Some(_) => "SELECT id FROM async_task FORCE INDEX (PRIMARY) WHERE ",
                None => "SELECT id FROM async_task FORCE INDEX (async_task_deadline_idx) WHERE ",
            };
            // None found, or none locked: the charge and the read-back run no statement.
            let found = load_ids(conn, Statement::<Mysql>::new(index).with(lapsed))?;
            let ids = chain::lock_by_key_or(conn, &found, lapsed, OnLocked::Skip)?;
            let backoff = |s| backoff_after(s, rescue);
            charge(
                conn,
                &ids,
                Taken::Stamped,
                backoff,
                rescue.default_max_attempts,
            )?;
            charged(conn, &ids)
        })
    })
}

/// Whose claims a [`charge`] ends: what it writes besides the failure.
pub(super) enum Taken<'a> {
    /// Stamped, the tasks running: the reason read from the owner and the deadline (a death
    /// counted unless the deadline passed), the owner kept, the deadline cleared.
    Stamped,
    /// Leased by `node`, the tasks pending: `error` the reason, `suspect` the deaths counted,
    /// `node` the owner of a task that ends dead, a new claim token.
    Leased {
        node: i64,
        error: &'a str,
        suspect: i32,
    },
}

/// Charges the tasks `ids` (locked by this transaction, claimed as `taken` says) a failure:
/// pending again at the time `delay` appends or, at max attempts (`default_max_attempts` for
/// a task without its own), dead. Rescue's charge and a lease's, one statement; the caller
/// reads the tasks back with [`charged`], which cancels the descendants of the dead.
///
/// MySQL assigns `SET`'s columns left to right, each seeing the ones before: every column
/// that reads `failures`, `owner` or `deadline_at` (`delay` may) comes before they change.
pub(super) fn charge(
    conn: &mut MysqlConnection,
    ids: &[i64],
    taken: Taken<'_>,
    delay: impl FnOnce(Statement<Mysql>) -> Statement<Mysql>,
    default_max_attempts: i32,
) -> QueryResult<()> {
    if ids.is_empty() {
        return Ok(());
    }
    let at_max = |s: Statement<Mysql>| {
        s.sql("failures + 1 >= COALESCE(max_attempts, ")
            .bind::<Integer, _>(default_max_attempts)
            .sql(")")
    };
    let (extra, from) = match taken {
        Taken::Stamped => ("deadline_at = NULL", "'running'"),
        Taken::Leased { .. } => ("claim_token = claim_token + 1", "'pending'"),
    };
    let statement = Statement::<Mysql>::new(concat!(engine_update!(), " SET last_error = "));
    let statement = match taken {
        Taken::Stamped => statement.sql(concat!(
            "CONCAT('rescued from node ', COALESCE(owner, '(none)'), ': ',
                CASE WHEN deadline_at < ",
            now!(),
            " THEN 'running past its deadline' ELSE 'the node stopped heartbeating' END),
                suspect = suspect + CASE WHEN deadline_at < ",
            now!(),
            " THEN 0 ELSE 1 END"
        )),
        Taken::Leased { error, suspect, .. } => statement
            .bind::<Text, _>(error.to_owned())
            .sql(", suspect = suspect + ")
            .bind::<Integer, _>(suspect),
    };
    statement
        .sql(", run_at = CASE WHEN ")
        .with(at_max)
        .sql(" THEN run_at ELSE ")
        .with(delay)
        .sql(" END, finished_at = CASE WHEN ")
        .with(at_max)
        .sql(concat!(" THEN ", now!(), " END, owner = CASE WHEN "))
        .with(at_max)
        .sql(" THEN ")
        .with(|s| match taken {
            Taken::Stamped => s.sql("owner"),
            Taken::Leased { node, .. } => s.bind::<BigInt, _>(node),
        })
        .sql(" END, state = CASE WHEN ")
        .with(at_max)
        .sql(" THEN 'dead' ELSE 'pending' END, ")
        .sql(extra)
        .sql(concat!(
            ", updated_at = ",
            now!(),
            ", failures = failures + 1 WHERE state = "
        ))
        .sql(from)
        .sql(" AND id IN ")
        .with(|s| list::ids(s, ids))
        .execute(conn)?;
    Ok(())
}

/// The tasks `ids`, read back after a charge; the descendants of those that ended dead
/// cancelled.
pub(super) fn charged(conn: &mut MysqlConnection, ids: &[i64]) -> QueryResult<Vec<RescuedRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<RescuedRow> = Statement::<Mysql>::new(
        "SELECT id, state, last_error AS reason, keyword, biz_id, tenant
           FROM async_task WHERE id IN ",
    )
    .with(|s| list::ids(s, ids))
    .sql(" ORDER BY id")
    .load(conn)?;
    let dead: Vec<i64> = rows
        .iter()
        .filter(|r| r.state == "dead")
        .map(|r| r.id)
        .collect();
    chain::cancel_descendants_of(conn, &dead, "dead")?;
    Ok(rows)
}

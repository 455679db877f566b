//! Lock claims on PostgreSQL: a chunk's tasks locked with `FOR UPDATE SKIP LOCKED` in the
//! transaction that runs their handlers, and marked done in it: one row version per task.

use diesel::pg::{Pg, PgConnection};
use diesel::sql_types::{Array, BigInt, Integer, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::task::{picked, plan_lines, stamp_picked, PickedRow};
use crate::driver::{Claim, ClaimRow, Due, LockHolder, Passes, Pick, Picked};
use crate::sql::Statement;

/// A locked row and the transaction that holds its lock.
#[derive(QueryableByName)]
struct LockedRow {
    #[diesel(embed)]
    picked: PickedRow,
    #[diesel(sql_type = Integer)]
    backend: i32,
    #[diesel(sql_type = BigInt)]
    xact: i64,
}

/// See [`crate::driver::Driver::task_lock_page`].
pub(super) fn lock_page(
    conn: &mut PgConnection,
    due: &Due<'_>,
    except: &[String],
    pick: &Pick<'_>,
    limit: i64,
) -> QueryResult<(LockHolder, Picked)> {
    let rows: Vec<LockedRow> = lock_statement("", due, except, pick, limit).load(conn)?;
    let holder = rows.first().map_or(
        LockHolder {
            backend: 0,
            xact: 0,
        },
        |r| LockHolder {
            backend: r.backend,
            xact: r.xact,
        },
    );
    let rows = rows.into_iter().map(|r| r.picked).collect();
    Ok((holder, picked(conn, rows, except, pick, limit)?))
}

/// See [`crate::driver::Driver::task_lock_plan`].
pub(super) fn lock_plan(
    conn: &mut PgConnection,
    due: &Due<'_>,
    limit: i64,
) -> QueryResult<Vec<String>> {
    let fair = Pick::Fair {
        after: "",
        lap: "",
        passes: &Passes::default(),
    };
    plan_lines(
        conn,
        lock_statement("EXPLAIN (COSTS OFF) ", due, &[], &fair, limit),
    )
}

/// The lock statement, after `prefix` (empty, or `EXPLAIN …` to show its plan).
fn lock_statement(
    prefix: &'static str,
    due: &Due<'_>,
    except: &[String],
    pick: &Pick<'_>,
    limit: i64,
) -> Statement<Pg> {
    // The rows other transactions hold are skipped: concurrent chunks never wait on each
    // other nor take the same task. Nothing is written; the locks last until the chunk's
    // transaction ends.
    const COLUMNS: &str = "SELECT t.id, t.keyword, t.biz_id, t.biz_data::text AS biz_data,
                t.tenant, t.failures, t.max_attempts, t.claim_token,
                t.priority::integer AS priority, pg_backend_pid() AS backend,
                pg_current_xact_id()::text::bigint AS xact";
    match pick {
        // One participant: `fair::solo_scan`.
        Pick::Solo { tenant, .. } => {
            let statement =
                super::fair::crowded(Statement::<Pg>::new(prefix).sql(COLUMNS), except, pick)
                    .sql(" FROM async_task t WHERE ");
            super::fair::solo_scan(statement, due, *tenant, limit)
        }
        // The fair choice (`fair::picked`), its rows locked as they are read; a
        // participant's rows read past the page (at most one per participant) stay locked
        // with the chunk's, and are claimed later.
        Pick::Fair { .. } => {
            let statement = super::fair::pick(prefix, due, except, pick, limit)
                .sql("\n            ) ")
                .sql(COLUMNS);
            super::fair::crowded(statement, except, pick)
                .sql(" FROM async_task t JOIN picked ON picked.id = t.id")
        }
    }
}

/// See [`crate::driver::Driver::task_complete_locked`].
pub(super) fn complete_locked(
    conn: &mut PgConnection,
    owner: i64,
    ids: &[i64],
) -> QueryResult<usize> {
    // The owner and a new claim token record who ran the task; `now()` is the start of the
    // chunk's transaction, when the lock was taken.
    Statement::<Pg>::new(
        "UPDATE async_task
         SET state = 'done', owner = ",
    )
    .bind::<BigInt, _>(owner)
    .sql(
        ", claim_token = claim_token + 1, claimed_at = now(),
             finished_at = clock_timestamp(), updated_at = clock_timestamp()
         WHERE id = ANY(",
    )
    .bind::<Array<BigInt>, _>(ids.to_vec())
    .sql(") AND state = 'pending'")
    .execute(conn)
}

/// See [`crate::driver::Driver::task_claim_ids`].
pub(super) fn claim_ids(
    conn: &mut PgConnection,
    owner: i64,
    ids: &[i64],
    timeout_ms: i64,
) -> QueryResult<Vec<ClaimRow>> {
    let picked = Statement::<Pg>::new(
        "WITH picked AS (
            SELECT id FROM async_task
            WHERE id = ANY(",
    )
    .bind::<Array<BigInt>, _>(ids.to_vec())
    .sql(
        ") AND state = 'pending' AND run_at <= now()
            FOR UPDATE SKIP LOCKED",
    );
    stamp_picked(picked, owner, timeout_ms).load(conn)
}

/// See [`crate::driver::Driver::task_charge_hung`].
pub(super) fn charge_hung(
    conn: &mut PgConnection,
    holder: LockHolder,
    claim: &Claim,
    error: &str,
    delay_ms: i64,
    default_max_attempts: i32,
) -> QueryResult<usize> {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    conn.transaction(|conn| {
        // The terminated backend rolls its transaction back and releases its locks; the
        // UPDATE waits for that, a bounded time. If another chunk has locked the task since,
        // the UPDATE waits for it in turn and then finds it done, or charges it.
        conn.batch_execute("SET LOCAL lock_timeout = '10s'")?;
        // Only while that backend still runs the chunk's transaction: a process id alone
        // may by now name another session.
        Statement::<Pg>::new(
            "SELECT pg_terminate_backend(pid) AS terminated FROM pg_stat_activity WHERE pid = ",
        )
        .bind::<Integer, _>(holder.backend)
        .sql(" AND backend_xid::text::bigint = ")
        .bind::<BigInt, _>(holder.xact)
        .sql(" % 4294967296")
        .execute(conn)?;
        Statement::<Pg>::new(
            "UPDATE async_task SET
                failures = failures + 1,
                state = CASE WHEN failures + 1 >= COALESCE(max_attempts, ",
        )
        .bind::<Integer, _>(default_max_attempts)
        .sql(
            ") THEN 'dead' ELSE 'pending' END,
                run_at = CASE WHEN failures + 1 >= COALESCE(max_attempts, ",
        )
        .bind::<Integer, _>(default_max_attempts)
        .sql(") THEN run_at ELSE now() + ")
        .bind::<BigInt, _>(delay_ms)
        .sql(
            " * interval '1 millisecond' END,
                finished_at = CASE WHEN failures + 1 >= COALESCE(max_attempts, ",
        )
        .bind::<Integer, _>(default_max_attempts)
        .sql(") THEN now() END, last_error = ")
        .bind::<Text, _>(error.to_owned())
        .sql(", updated_at = now() WHERE id = ")
        .bind::<BigInt, _>(claim.id)
        .sql(" AND state = 'pending' AND claim_token = ")
        .bind::<BigInt, _>(claim.token)
        .execute(conn)
    })
}

/// See [`crate::driver::Driver::xact_committed`].
pub(super) fn xact_committed(conn: &mut PgConnection, xact: i64) -> QueryResult<Option<bool>> {
    #[derive(QueryableByName)]
    struct Status {
        #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
        status: Option<String>,
    }
    let status: Status = Statement::<Pg>::new("SELECT pg_xact_status(")
        .bind::<BigInt, _>(xact)
        .sql("::text::xid8) AS status")
        .get_result(conn)?;
    Ok(match status.status.as_deref() {
        Some("committed") => Some(true),
        Some("aborted") => Some(false),
        // In progress (the server has not yet noticed the connection's end), or too old.
        _ => None,
    })
}

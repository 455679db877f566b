//! The claim on MySQL, seed 003's: in one transaction, the due rows are picked in claim
//! order and locked (`SELECT id … ORDER BY priority, run_at, id LIMIT n FOR UPDATE SKIP
//! LOCKED`: a concurrent claimer passes over them instead of waiting), marked running by one
//! `UPDATE … WHERE id IN (…)`, in one transaction. The rows stay locked by this transaction
//! from the pick to the commit, so what the UPDATE claimed is the rows picked, with their
//! token one more: a pick of one participant's tasks reads them whole, and the page needs
//! no read-back (MySQL has no `UPDATE … RETURNING`); a fair page, picked from several
//! participants' ranks, is read back by id and owner.

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Integer, Nullable, Text};
use diesel::{OptionalExtension, QueryResult, QueryableByName, RunQueryDsl};

use super::fair::{self, page_ids, pick_statement};
use super::list;
use crate::db::transaction::is_connection_error;
use crate::driver::claim_commit::claim_transaction;
use crate::driver::fair_sql::{
    choose_page, first_suspect, shares_statement, suspects_exist as suspects, DueList, Found,
};
use crate::driver::{ChunkRuns, ClaimRow, Claiming, Due, Pick, Picked};
use crate::sql::Statement;

/// What a claim does with the rows it picks and locks: stamps them (running, owner, token,
/// deadline), or leases them for their chunks' transactions (`lease.rs`: a row of
/// `async_lease` each, the task rows not written).
#[derive(Clone, Copy)]
pub(super) enum Take {
    Stamp,
    Lease(ChunkRuns),
}

/// See [`crate::driver::Driver::task_claim_page`]: [`take_page`] stamping.
pub(in crate::driver) fn claim_page(
    conn: &mut MysqlConnection,
    claim: &Claiming<'_>,
    pick: &Pick<'_>,
) -> QueryResult<Picked> {
    take_page(conn, claim, pick, Take::Stamp)
}

/// Picks a page as `pick` says, in one transaction, and takes it as `take` says.
pub(super) fn take_page(
    conn: &mut MysqlConnection,
    claim: &Claiming<'_>,
    pick: &Pick<'_>,
    take: Take,
) -> QueryResult<Picked> {
    let (owner, limit, timeout_ms) = (claim.owner, claim.limit, claim.timeout_ms);
    let due = DueList::<Mysql>::of(claim.due);
    claim_transaction(conn, |conn| {
        choose_page(
            conn,
            claim,
            pick,
            &due,
            |conn, tenant| pick_page(conn, tenant, &due, limit, (owner, timeout_ms), take),
            |conn, shares| {
                let ids = page_ids(conn, shares, &due, limit)?;
                match take {
                    Take::Stamp => mark(conn, owner, &ids, timeout_ms),
                    Take::Lease(runs) => {
                        let rows = read_back(conn, &ids, |s| s.sql("state = 'pending'"))?;
                        lease(conn, owner, &rows, runs, timeout_ms)?;
                        Ok(rows)
                    }
                }
            },
        )
    })
}

/// The columns of a [`ClaimRow`] as the claim leaves it: its token one more.
const CLAIMED: &str = "id, keyword, biz_id, biz_data, tenant, failures, max_attempts,
    claim_token + 1 AS claim_token, priority";

/// The columns of a [`ClaimRow`] as a lease leaves it: the task row is not written.
const LEASED: &str = "id, keyword, biz_id, biz_data, tenant, failures, max_attempts,
    claim_token, priority";

/// Claims the first `limit` due tasks of `tenant` (`None`: those without one) for `owner`,
/// their deadline `timeout_ms` from now: picked and read whole by one locking read, then
/// stamped or leased (see [`stamp`], [`lease`]). Locked from the pick to the commit, the
/// rows read are the rows taken: no read-back.
fn pick_page(
    conn: &mut MysqlConnection,
    tenant: Option<&str>,
    due: &DueList<Mysql>,
    limit: i64,
    (owner, timeout_ms): (i64, i64),
    take: Take,
) -> QueryResult<Vec<ClaimRow>> {
    let columns = match take {
        Take::Stamp => CLAIMED,
        Take::Lease(_) => LEASED,
    };
    let rows: Vec<ClaimRow> = pick_statement("", columns, tenant, due, limit).load(conn)?;
    match take {
        Take::Stamp => {
            let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
            stamp(conn, owner, &ids, timeout_ms)?;
        }
        Take::Lease(runs) => lease(conn, owner, &rows, runs, timeout_ms)?,
    }
    Ok(rows)
}

/// The tasks `ids` (locked by this transaction) that pass `test`, whole as they are now
/// ([`LEASED`]), in claim order; none, with no statement, for no ids.
fn read_back(
    conn: &mut MysqlConnection,
    ids: &[i64],
    test: impl FnOnce(Statement<Mysql>) -> Statement<Mysql>,
) -> QueryResult<Vec<ClaimRow>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    Statement::<Mysql>::new("SELECT ")
        .sql(LEASED)
        .sql(" FROM async_task WHERE ")
        .with(test)
        .sql(" AND id IN ")
        .with(|s| list::ids(s, ids))
        .sql(" ORDER BY priority, run_at, id")
        .load(conn)
}

/// Leases the tasks `rows` (locked by this transaction, pending, in claim order) for
/// `owner`: a row of `async_lease` each, with the task's token, its chunk's run (`runs`,
/// as [`chunk_of`] numbers it) and a deadline `timeout_ms` from now.
fn lease(
    conn: &mut MysqlConnection,
    owner: i64,
    rows: &[ClaimRow],
    runs: ChunkRuns,
    timeout_ms: i64,
) -> QueryResult<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let statement = Statement::<Mysql>::new(
        "INSERT INTO async_lease (task_id, node_id, token, chunk, deadline_at) VALUES ",
    );
    list::rows(statement, rows.iter().enumerate(), |s, (i, row)| {
        s.bind::<BigInt, _>(row.id)
            .sql(", ")
            .bind::<BigInt, _>(owner)
            .sql(", ")
            .bind::<BigInt, _>(row.claim_token)
            .sql(", ")
            .bind::<Integer, _>(chunk_of(runs, i))
            .sql(concat!(", ", now!(), " + INTERVAL "))
            .bind::<BigInt, _>(timeout_ms)
            .sql(" * 1000 MICROSECOND")
    })
    .execute(conn)?;
    Ok(())
}

/// The run of the chunk of a page's `i`-th task (from 0): pages are cut in claim order into
/// chunks of `runs.per`, numbered from `runs.first`, as a lease's `chunk` (an `INT`: the
/// low 31 bits, as on PostgreSQL).
pub(super) fn chunk_of(runs: ChunkRuns, i: usize) -> i32 {
    let i = i64::try_from(i).unwrap_or(i64::MAX);
    let run = (runs.first + i / runs.per.max(1)) & 0x7fff_ffff;
    i32::try_from(run).expect("31 bits fit")
}

/// The first `limit` due tasks of `tenant` (`None`: those without one), locked.
fn pick_ids(
    conn: &mut MysqlConnection,
    tenant: Option<&str>,
    due: &DueList<Mysql>,
    limit: i64,
) -> QueryResult<Vec<i64>> {
    let picked: Vec<fair::Picked> =
        pick_statement("", fair::PICKED, tenant, due, limit).load(conn)?;
    Ok(picked.into_iter().map(|p| p.id).collect())
}

/// Claims the tasks `ids` (locked by this transaction, pending) for `owner`: running,
/// claim token bumped, deadline `timeout_ms` from now; returns the page in claim order.
pub(super) fn mark(
    conn: &mut MysqlConnection,
    owner: i64,
    ids: &[i64],
    timeout_ms: i64,
) -> QueryResult<Vec<ClaimRow>> {
    stamp(conn, owner, ids, timeout_ms)?;
    read_back(conn, ids, |s| {
        s.sql("state = 'running' AND owner = ")
            .bind::<BigInt, _>(owner)
    })
}

/// Marks the tasks `ids` (locked by this transaction, pending) running for `owner`: claim
/// token bumped, deadline `timeout_ms` from now.
fn stamp(conn: &mut MysqlConnection, owner: i64, ids: &[i64], timeout_ms: i64) -> QueryResult<()> {
    if ids.is_empty() {
        return Ok(());
    }
    // UTC_TIMESTAMP is the statement's start: one time for every row.
    Statement::<Mysql>::new(concat!(
        engine_update!(),
        " SET state = 'running', owner = "
    ))
    .bind::<BigInt, _>(owner)
    .sql(concat!(
        ", claim_token = claim_token + 1, claimed_at = ",
        now!(),
        ", updated_at = ",
        now!(),
        ", deadline_at = ",
        now!(),
        " + INTERVAL "
    ))
    .bind::<BigInt, _>(timeout_ms)
    // The links a producer's `parent_id` shorthand wrote under a pending task, which
    // could not set its `has_children`: set now, so that its completion takes the way
    // that releases children at once (`task::complete`, whose own check is what
    // guarantees it; this one only spares it a refused statement).
    .sql(
        " * 1000 MICROSECOND, has_children = has_children
                OR EXISTS (SELECT 1 FROM async_task_parent l WHERE l.parent_id = async_task.id)
              WHERE state = 'pending' AND id IN ",
    )
    .with(|s| list::ids(s, ids))
    .execute(conn)?;
    Ok(())
}

/// The plan of the claim: the ring's statement, then the pick of tasks without a tenant,
/// one line per row of `EXPLAIN`.
pub(in crate::driver) fn claim_plan(
    conn: &mut MysqlConnection,
    due: &Due<'_>,
    limit: i64,
) -> QueryResult<Vec<String>> {
    #[derive(QueryableByName)]
    struct Line {
        #[diesel(sql_type = Nullable<Text>)]
        select_type: Option<String>,
        #[diesel(sql_type = Nullable<Text>)]
        table: Option<String>,
        #[diesel(sql_type = Nullable<Text>)]
        r#type: Option<String>,
        #[diesel(sql_type = Nullable<Text>)]
        key: Option<String>,
        #[diesel(sql_type = Nullable<Text>, column_name = "ref")]
        key_ref: Option<String>,
        #[diesel(sql_type = Nullable<Text>, column_name = "Extra")]
        extra: Option<String>,
    }
    let due = DueList::of(due);
    let mut lines: Vec<Line> =
        shares_statement("EXPLAIN ", &due, None, ("", ""), limit).load(conn)?;
    lines.extend(pick_statement("EXPLAIN ", fair::PICKED, None, &due, limit).load::<Line>(conn)?);
    let text = |v: Option<String>| v.unwrap_or_else(|| "-".to_owned());
    Ok(lines
        .into_iter()
        .map(|l| {
            format!(
                "{} {} type={} key={} ref={} {}",
                text(l.select_type),
                text(l.table),
                text(l.r#type),
                text(l.key),
                text(l.key_ref),
                text(l.extra)
            )
        })
        .collect())
}

/// See [`crate::driver::Driver::task_claim_limited`]. In one transaction: for each tenant
/// in turn, its claim lock is taken (a tenant another node is claiming for is skipped this
/// time, as PostgreSQL skips a tenant whose claim lock is taken), so that the running count
/// read next is exact; then its room (its limit less what runs), and at most that many of
/// its first due tasks, until the page is full. The locks are let go after the commit.
pub(in crate::driver) fn claim_limited(
    conn: &mut MysqlConnection,
    claim: &Claiming<'_>,
    tenants: &[String],
) -> QueryResult<Picked> {
    let due = DueList::<Mysql>::of(claim.due);
    let (owner, limit, timeout_ms) = (claim.owner, claim.limit, claim.timeout_ms);
    #[derive(QueryableByName)]
    struct Limit {
        #[diesel(sql_type = BigInt)]
        max_running: i64,
    }
    #[derive(QueryableByName)]
    struct Running {
        #[diesel(sql_type = BigInt)]
        running: i64,
    }

    let mut locked: Vec<&String> = Vec::new();
    let page = claim_transaction(conn, |conn| {
        let mut page = Vec::new();
        for tenant in tenants {
            let left = limit - i64::try_from(page.len()).unwrap_or(i64::MAX);
            if left <= 0 {
                break;
            }
            if !tenant_claim_lock(conn, "GET_LOCK(", tenant, ", 0)")? {
                continue;
            }
            locked.push(tenant);
            let max: Option<Limit> = Statement::<Mysql>::new(
                "SELECT CAST(max_running AS SIGNED) AS max_running FROM async_tenant
                  WHERE max_running IS NOT NULL AND tenant = ",
            )
            .bind::<Text, _>(tenant.clone())
            .get_result(conn)
            .optional()?;
            let Some(max) = max else { continue };
            let running: Running = Statement::<Mysql>::new(
                "SELECT count(*) AS running FROM async_task FORCE INDEX (async_task_claim_idx)
                  WHERE state = 'running' AND tenant = ",
            )
            .bind::<Text, _>(tenant.clone())
            .get_result(conn)?;
            let take = (max.max_running - running.running).min(left);
            if take <= 0 {
                continue;
            }
            let ids = pick_ids(conn, Some(tenant), &due, take)?;
            page.extend(mark(conn, owner, &ids, timeout_ms)?);
        }
        Ok(Picked::of(page))
    });
    // After the commit: a page claimed is the caller's even if a release fails (then on a
    // broken connection, whose session's end lets its locks go). After a failed claim the
    // connection is not used again (a statement failed on it: `db::reply`), and its
    // session's end lets them go; so after a COMMIT lost with its connection.
    let page = page?;
    if page.unconfirmed.as_ref().is_some_and(is_connection_error) {
        return Ok(page);
    }
    for tenant in locked {
        if let Err(e) = tenant_claim_lock(conn, "RELEASE_LOCK(", tenant, ")") {
            log::warn!("tenant {tenant:?}: its claim lock was not released: {e}");
        }
    }
    Ok(page)
}

/// `call` (`GET_LOCK(`, or `RELEASE_LOCK(`) of the named lock that takes `tenant`'s claims in
/// turn, then `rest`; whether it answered 1. Not the tenant's row, locked `FOR UPDATE`: a
/// producer's enqueue for the tenant locks it (its `max_queued` trigger, and under
/// REPEATABLE READ whatever its limits) until the producer commits, and a claim that skipped
/// it would pass the tenant over for as long as producers' transactions overlap. A named
/// lock is the server's, not the database's: the database's name is part of it.
fn tenant_claim_lock(
    conn: &mut MysqlConnection,
    call: &'static str,
    tenant: &str,
    rest: &'static str,
) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Answer {
        #[diesel(sql_type = Nullable<Integer>)]
        answer: Option<i32>,
    }
    let answer: Answer = Statement::<Mysql>::new("SELECT ")
        .sql(call)
        .sql("CONCAT('outbox.claim.', SHA1(CONCAT(DATABASE(), '/', ")
        .bind::<Text, _>(tenant.to_owned())
        .sql(")))")
        .sql(rest)
        .sql(" AS answer")
        .get_result(conn)?;
    Ok(answer.answer == Some(1))
}

/// See [`crate::driver::Driver::task_claim_suspect`]: the suspect index's first due task, in
/// claim order, locked and stamped as any claim.
pub(in crate::driver) fn claim_suspect(
    conn: &mut MysqlConnection,
    owner: i64,
    due: &Due<'_>,
    except: &[String],
    timeout_ms: i64,
) -> QueryResult<Picked> {
    let due = DueList::of(&Due {
        suspect: Some(true),
        ..*due
    });
    let except = (!except.is_empty()).then_some(except.to_vec());
    claim_transaction(conn, |conn| {
        let statement = Statement::<Mysql>::new("SELECT ")
            .sql(fair::PICKED)
            .sql(" FROM ");
        let picked: Vec<fair::Picked> = first_suspect(statement, except.as_ref(), &due)
            .sql(" FOR UPDATE SKIP LOCKED")
            .load(conn)?;
        let ids: Vec<i64> = picked.into_iter().map(|p| p.id).collect();
        Ok(Picked::of(mark(conn, owner, &ids, timeout_ms)?))
    })
}

/// See [`crate::driver::Driver::task_suspects_exist`].
pub(in crate::driver) fn suspects_exist(conn: &mut MysqlConnection) -> QueryResult<bool> {
    Ok(suspects::<Mysql>().get_result::<Found>(conn)?.found())
}

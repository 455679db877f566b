//! The fair claim on SQLite: the same choice as on PostgreSQL (see `driver/postgres/fair.rs`),
//! made in the claim's write transaction by two statements: one walks the ring of tenants
//! and reads each participant's weight, the other takes the page in one UPDATE. With no
//! tenant due, the UPDATE is the claim of tasks without a tenant alone. A solo claim (one
//! participant alone) is the UPDATE alone, and [`others_pending`] when it probes.

use diesel::sql_types::{BigInt, Double, Text};
use diesel::sqlite::{Sqlite, SqliteConnection};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use crate::driver::ring_sql::{passes_lap, shares_of, walk, window, Share, ShareRow};
use crate::driver::strategy_sql::partition_sqlite;
use crate::driver::{Due, Passes};
use crate::sql::Statement;
use crate::strategy::Partition;

/// Whether a participant other than `tenant` (`None`: the tasks without one) has pending
/// tasks, tenants in `except` (a JSON array) left out: asked by a solo claim, so that the
/// next claim is fair again when another comes.
pub(super) fn others_pending(
    conn: &mut SqliteConnection,
    tenant: Option<&str>,
    except: Option<&str>,
) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Found {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        found: bool,
    }
    let except = except.unwrap_or("[]").to_owned();
    let statement = match tenant {
        None => Statement::<Sqlite>::new("SELECT EXISTS (SELECT 1 FROM ")
            .sql(TENANT_IDX)
            .sql(" WHERE ")
            .sql(PENDING_OF_TENANT)
            .sql(" AND tenant NOT IN (SELECT value FROM json_each(")
            .bind::<Text, _>(except)
            .sql("))) AS found"),
        Some(tenant) => Statement::<Sqlite>::new(
            "SELECT EXISTS (SELECT 1 FROM async_task INDEXED BY async_task_claim_idx
                             WHERE tenant IS NULL AND state = 'pending'",
        )
        .sql(concat!(
            " AND run_at <= ",
            now!(),
            ") OR EXISTS (SELECT 1 FROM "
        ))
        .sql(TENANT_IDX)
        .sql(" WHERE tenant < ")
        .bind::<Text, _>(tenant.to_owned())
        .sql(" AND ")
        .sql(PENDING_OF_TENANT)
        .sql(" AND tenant NOT IN (SELECT value FROM json_each(")
        .bind::<Text, _>(except.clone())
        .sql("))) OR EXISTS (SELECT 1 FROM ")
        .sql(TENANT_IDX)
        .sql(" WHERE tenant > ")
        .bind::<Text, _>(tenant.to_owned())
        .sql(" AND ")
        .sql(PENDING_OF_TENANT)
        .sql(" AND tenant NOT IN (SELECT value FROM json_each(")
        .bind::<Text, _>(except)
        .sql("))) AS found"),
    };
    Ok(statement.get_result::<Found>(conn)?.found)
}

/// The tenant index, its predicate's terms repeated (SQLite uses a partial index only then).
const TENANT_IDX: &str = "async_task INDEXED BY async_task_tenant_idx";
const PENDING_OF_TENANT: &str = "tenant IS NOT NULL AND state = 'pending'
    AND state IN ('pending', 'blocked', 'running')";
/// The first tenant with a pending task, for the ring to wrap around to.
const FIRST_TENANT: &str = "(SELECT tenant FROM async_task INDEXED BY async_task_tenant_idx
    WHERE tenant IS NOT NULL AND state = 'pending' AND state IN ('pending', 'blocked', 'running')
    ORDER BY tenant LIMIT 1)";
/// The next tenant with a pending task after the tenant `$tenant` (a column), wrapping
/// around to the first.
macro_rules! next_tenant {
    ($tenant:literal) => {
        concat!(
            "COALESCE((SELECT tenant FROM async_task INDEXED BY async_task_tenant_idx
            WHERE tenant > ",
            $tenant,
            " AND tenant IS NOT NULL AND state = 'pending'
              AND state IN ('pending', 'blocked', 'running') ORDER BY tenant LIMIT 1),
            (SELECT tenant FROM async_task INDEXED BY async_task_tenant_idx
            WHERE tenant IS NOT NULL AND state = 'pending' AND state IN ('pending', 'blocked', 'running')
            ORDER BY tenant LIMIT 1))"
        )
    };
}
/// Due for the claim: the time come, one of the keywords (a JSON array bound next).
const DUE: &str = concat!(
    " AND run_at <= ",
    now!(),
    " AND keyword IN (SELECT value FROM json_each("
);

/// What a claim may take ([`Due`]), its keywords as one JSON array: the form SQLite binds a
/// list in.
pub(super) struct DueJson {
    pub(super) keywords: String,
    pub(super) partition: Option<Partition>,
    pub(super) suspect: Option<bool>,
}

impl DueJson {
    pub(super) fn of(due: &Due<'_>) -> DueJson {
        DueJson {
            keywords: serde_json::to_string(due.keywords).expect("a list of strings serialises"),
            partition: due.partition,
            suspect: due.suspect,
        }
    }
}

/// Appends that a task is due for a claim of `due`: [`DUE`], its keywords, and the node's
/// partition if it has one (a claim strategy's filter, `partition_sqlite`).
pub(super) fn due_for(statement: Statement<Sqlite>, due: &DueJson) -> Statement<Sqlite> {
    let statement = statement
        .sql(DUE)
        .bind::<Text, _>(due.keywords.clone())
        .sql("))");
    let statement = match due.suspect {
        Some(false) => statement.sql(" AND suspect < 2"),
        Some(true) => statement.sql(" AND suspect >= 2"),
        None => statement,
    };
    partition_sqlite(statement, due.partition)
}

/// The participants of a claim of `limit` tasks of `keywords` (a JSON array): at most
/// `limit` tenants with a task due, in ring order after `after` up to where it would pass
/// `lap`, none of `except` (a JSON array, or `None`), then the tasks without a tenant if one
/// is due. Returns them in ring order, each with its pass from `passes`; the last tenant the
/// ring walked to; and whether the ring stopped at its bound (see [`crate::driver::Picked`]).
pub(super) fn shares(
    conn: &mut SqliteConnection,
    due: &DueJson,
    except: Option<&str>,
    (after, lap): (&str, &str),
    passes: &Passes,
    limit: i64,
) -> QueryResult<(Vec<Share>, Option<String>, bool)> {
    let rows: Vec<ShareRow> = shares_statement("", due, except, (after, lap), limit).load(conn)?;
    Ok(shares_of(rows, passes, limit))
}

/// The statement of [`shares`], after `prefix` (empty, or `EXPLAIN QUERY PLAN`). The ring
/// (as on PostgreSQL, `driver/postgres/fair.rs`) carries each tenant's next (`nx`), so that
/// the next tenant is probed once per step: SQLite's recursive step cannot join laterally.
pub(super) fn shares_statement(
    prefix: &'static str,
    due: &DueJson,
    except: Option<&str>,
    (after, lap): (&str, &str),
    limit: i64,
) -> Statement<Sqlite> {
    let statement = Statement::<Sqlite>::new(prefix)
        .sql("WITH RECURSIVE ring(tenant, n, nx) AS (SELECT s.t0, 1, ")
        .sql(next_tenant!("s.t0"))
        .sql(" FROM (SELECT COALESCE((SELECT tenant FROM ")
        .sql(TENANT_IDX)
        .sql(" WHERE tenant > ")
        .bind::<Text, _>(after.to_owned())
        .sql(" AND ")
        .sql(PENDING_OF_TENANT)
        .sql(" ORDER BY tenant LIMIT 1), ")
        .sql(FIRST_TENANT)
        .sql(") AS t0, ")
        .bind::<Text, _>(after.to_owned())
        .sql(" AS prev) s WHERE s.t0 IS NOT NULL");
    // A claim that goes on in a lap another began starts nowhere if that one ended it.
    let statement = if after == lap {
        statement
    } else {
        passes_lap(statement.sql(" AND NOT "), "s.prev", "s.t0", lap)
    };
    let statement = statement
        .sql(" UNION ALL SELECT r.nx, r.n + 1, ")
        .sql(next_tenant!("r.nx"))
        .sql(" FROM ring r WHERE r.n < ")
        .bind::<BigInt, _>(walk(limit))
        .sql(" AND NOT ")
        .with(|s| passes_lap(s, "r.tenant", "r.nx", lap))
        .sql(
            ")
            SELECT s.tenant, s.weight, s.pos, e.ring_end, e.ring_len
              FROM (SELECT 1) one
              LEFT JOIN (SELECT tenant AS ring_end, n AS ring_len FROM ring ORDER BY n DESC LIMIT 1) e ON 1
              LEFT JOIN (
            SELECT tenant, weight, pos FROM (
                SELECT r.tenant, COALESCE(a.weight, 1) AS weight, r.n AS pos
                  FROM ring r LEFT JOIN async_tenant a ON a.tenant = r.tenant
                 WHERE EXISTS (SELECT 1 FROM async_task INDEXED BY async_task_tenant_idx
                                WHERE tenant = r.tenant AND state = 'pending'
                                  AND state IN ('pending', 'blocked', 'running')",
        )
        .with(|s| due_for(s, due))
        .sql(")");
    let statement = match except {
        None => statement,
        Some(except) => statement
            .sql(" AND r.tenant NOT IN (SELECT value FROM json_each(")
            .bind::<Text, _>(except.to_owned())
            .sql("))"),
    };
    statement
        .sql(" ORDER BY r.n LIMIT ")
        .bind::<BigInt, _>(window(limit))
        .sql(
            ")
            UNION ALL
            SELECT NULL, 1, 0 WHERE EXISTS (SELECT 1 FROM async_task INDEXED BY async_task_claim_idx
                                          WHERE tenant IS NULL AND state = 'pending'",
        )
        .with(|s| due_for(s, due))
        .sql(")) s ON 1")
}

/// Appends to `statement` (an `UPDATE … WHERE id IN (`, left open) the ids of the page: each
/// participant's first `ceil(limit × weight / total)` due tasks, ranked as on PostgreSQL (by
/// priority, then turn: pass plus rank over weight, then age, then ring position).
pub(super) fn page_ids(
    statement: Statement<Sqlite>,
    shares: &[Share],
    due: &DueJson,
    limit: i64,
) -> Statement<Sqlite> {
    let total: i64 = shares.iter().map(|s| s.weight).sum::<i64>().max(1);
    let mut statement = statement.sql("SELECT id FROM (");
    for (i, share) in shares.iter().enumerate() {
        let k = (limit.saturating_mul(share.weight) + total - 1) / total;
        if i > 0 {
            statement = statement.sql(" UNION ALL ");
        }
        statement = statement
            .sql("SELECT * FROM (SELECT id, priority, run_at, ")
            .bind::<BigInt, _>(share.pos)
            .sql(" AS pos, ")
            .bind::<Double, _>(share.pass)
            .sql(" + row_number() OVER (ORDER BY priority, run_at, id) * 1.0 / ")
            .bind::<Double, _>(share.weight as f64)
            .sql(" AS turn FROM (SELECT id, priority, run_at FROM ");
        statement = match &share.tenant {
            Some(tenant) => statement
                .sql(TENANT_IDX)
                .sql(" WHERE tenant = ")
                .bind::<Text, _>(tenant.clone())
                .sql(" AND state = 'pending' AND state IN ('pending', 'blocked', 'running')"),
            None => statement
                .sql("async_task INDEXED BY async_task_claim_idx WHERE tenant IS NULL AND state = 'pending'"),
        };
        statement = due_for(statement, due)
            .sql(" ORDER BY priority, run_at, id LIMIT ")
            .bind::<BigInt, _>(k)
            .sql("))");
    }
    statement
        .sql(") ORDER BY priority, turn, run_at, pos, id LIMIT ")
        .bind::<BigInt, _>(limit)
}

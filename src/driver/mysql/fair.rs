//! The fair claim on MySQL: the same choice as on PostgreSQL (see `driver/postgres/fair.rs`),
//! made in the claim's transaction: one statement walks the ring of tenants and reads each
//! participant's weight; then each participant's first due tasks are locked (`FOR UPDATE
//! SKIP LOCKED`, as many as its share could take) and the page is ranked from them here, by
//! the same order as on the other backends. With no tenant due, the claim is the one of tasks
//! without a tenant alone. A solo claim (one participant alone) takes that participant's
//! tasks, and asks [`others_pending`] when it probes.

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::list;
use crate::driver::ring_sql::{passes_lap, shares_of, walk, window, Share, ShareRow};
use crate::driver::strategy_sql::partition_mysql;
use crate::driver::{Due, Passes};
use crate::sql::Statement;
use crate::strategy::Partition;

/// Whether a participant other than `tenant` (`None`: the tasks without one) has pending
/// tasks, tenants in `except` left out: asked by a solo claim, so that the next claim is
/// fair again when another comes.
pub(super) fn others_pending(
    conn: &mut MysqlConnection,
    tenant: Option<&str>,
    except: &[String],
) -> QueryResult<bool> {
    #[derive(QueryableByName)]
    struct Found {
        #[diesel(sql_type = BigInt)]
        found: i64,
    }
    let tenants = |s: Statement<Mysql>| {
        let s = s.sql(
            "EXISTS (SELECT 1 FROM async_task FORCE INDEX (async_task_pending_tenant_idx)
                      WHERE state = 'pending' AND tenant IS NOT NULL",
        );
        let s = match tenant {
            None => s,
            Some(t) => s.sql(" AND tenant <> ").bind::<Text, _>(t.to_owned()),
        };
        let s = if except.is_empty() {
            s
        } else {
            s.sql(" AND tenant NOT IN ")
                .with(|s| list::texts(s, except))
        };
        s.sql(")")
    };
    let statement = match tenant {
        None => Statement::<Mysql>::new("SELECT ").with(tenants),
        Some(_) => Statement::<Mysql>::new(concat!(
            "SELECT EXISTS (SELECT 1 FROM async_task FORCE INDEX (async_task_claim_idx)
                             WHERE tenant IS NULL AND state = 'pending' AND run_at <= ",
            now!(),
            ") OR "
        ))
        .with(tenants),
    };
    Ok(statement.sql(" AS found").get_result::<Found>(conn)?.found != 0)
}

/// The pending tasks of one tenant: the claim index's range for it.
const PENDING_OF_TENANT: &str = "FROM async_task FORCE INDEX (async_task_claim_idx)
    WHERE state = 'pending' AND tenant = ";
/// The first tenant with a pending task, for the ring to wrap around to.
const FIRST_TENANT: &str =
    "(SELECT tenant FROM async_task FORCE INDEX (async_task_pending_tenant_idx)
    WHERE state = 'pending' AND tenant IS NOT NULL ORDER BY tenant LIMIT 1)";
/// The next tenant with a pending task after the tenant `$tenant` (a column), wrapping
/// around to the first.
macro_rules! next_tenant {
    ($tenant:literal) => {
        concat!(
            "COALESCE((SELECT tenant FROM async_task FORCE INDEX (async_task_pending_tenant_idx)
            WHERE state = 'pending' AND tenant > ",
            $tenant,
            " ORDER BY tenant LIMIT 1),
            (SELECT tenant FROM async_task FORCE INDEX (async_task_pending_tenant_idx)
            WHERE state = 'pending' AND tenant IS NOT NULL ORDER BY tenant LIMIT 1))"
        )
    };
}

/// What a claim may take ([`Due`]), owned.
pub(super) struct DueList {
    pub(super) keywords: Vec<String>,
    pub(super) partition: Option<Partition>,
    pub(super) suspect: Option<bool>,
}

impl DueList {
    pub(super) fn of(due: &Due<'_>) -> DueList {
        DueList {
            keywords: due.keywords.to_vec(),
            partition: due.partition,
            suspect: due.suspect,
        }
    }
}

/// Appends that a task is due for a claim of `due`: its time has come, one of the keywords,
/// and the node's partition if it has one (a claim strategy's filter, `partition_mysql`).
pub(super) fn due_for(statement: Statement<Mysql>, due: &DueList) -> Statement<Mysql> {
    let statement = statement
        .sql(concat!(" AND run_at <= ", now!(), " AND keyword IN "))
        .with(|s| list::texts(s, &due.keywords));
    let statement = match due.suspect {
        Some(false) => statement.sql(" AND suspect < 2"),
        Some(true) => statement.sql(" AND suspect >= 2"),
        None => statement,
    };
    partition_mysql(statement, due.partition)
}

/// The participants of a claim of `limit` tasks of `due`: at most `limit` tenants with a
/// task due, in ring order after `after` up to where it would pass `lap`, none of `except`,
/// then the tasks without a tenant if one is due. Returns them in ring order, each with its
/// pass from `passes`; the last tenant the ring walked to; and whether the ring stopped at
/// its bound (see [`crate::driver::Picked`]).
pub(super) fn shares(
    conn: &mut MysqlConnection,
    due: &DueList,
    except: &[String],
    (after, lap): (&str, &str),
    passes: &Passes,
    limit: i64,
) -> QueryResult<(Vec<Share>, Option<String>, bool)> {
    let rows: Vec<ShareRow> = shares_statement("", due, except, (after, lap), limit).load(conn)?;
    Ok(shares_of(rows, passes, limit))
}

/// The statement of [`shares`], after `prefix` (empty, or `EXPLAIN`). The ring (as on
/// PostgreSQL, `driver/postgres/fair.rs`) carries each tenant's next (`nx`), so that the
/// next tenant is probed once per step.
pub(super) fn shares_statement(
    prefix: &'static str,
    due: &DueList,
    except: &[String],
    (after, lap): (&str, &str),
    limit: i64,
) -> Statement<Mysql> {
    let statement = Statement::<Mysql>::new(prefix)
        .sql("WITH RECURSIVE ring (tenant, n, nx) AS (SELECT s0.t0, 1, ")
        .sql(next_tenant!("s0.t0"))
        .sql(" FROM (SELECT COALESCE((SELECT tenant FROM async_task FORCE INDEX (async_task_pending_tenant_idx) WHERE state = 'pending' AND tenant > ")
        .bind::<Text, _>(after.to_owned())
        .sql(" ORDER BY tenant LIMIT 1), ")
        .sql(FIRST_TENANT)
        .sql(") AS t0, ")
        .bind::<Text, _>(after.to_owned())
        .sql(" AS prev) s0 WHERE s0.t0 IS NOT NULL");
    // A claim that goes on in a lap another began starts nowhere if that one ended it.
    let statement = if after == lap {
        statement
    } else {
        passes_lap(statement.sql(" AND NOT "), "s0.prev", "s0.t0", lap)
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
              FROM (SELECT 1 AS one) one
              LEFT JOIN (SELECT tenant AS ring_end, CAST(n AS SIGNED) AS ring_len FROM ring
                          ORDER BY n DESC LIMIT 1) e ON TRUE
              LEFT JOIN (
            SELECT tenant, weight, pos FROM (
                SELECT r.tenant, CAST(COALESCE(a.weight, 1) AS SIGNED) AS weight,
                       CAST(r.n AS SIGNED) AS pos
                  FROM ring r LEFT JOIN async_tenant a ON a.tenant = r.tenant
                 WHERE (SELECT 1 ",
        )
        .sql(PENDING_OF_TENANT)
        .sql("r.tenant")
        .with(|s| due_for(s, due))
        // A scalar subquery, not EXISTS: MariaDB turns EXISTS into a semi-join that
        // materialises every pending task instead of probing the claim index per tenant.
        .sql(" LIMIT 1) IS NOT NULL");
    let statement = if except.is_empty() {
        statement
    } else {
        statement
            .sql(" AND r.tenant NOT IN ")
            .with(|s| list::texts(s, except))
    };
    statement
        .sql(" ORDER BY r.n LIMIT ")
        .bind::<BigInt, _>(window(limit))
        .sql(
            ") w
            UNION ALL
            SELECT NULL, 1, 0 FROM DUAL WHERE EXISTS (SELECT 1 FROM async_task FORCE INDEX (async_task_claim_idx)
                                          WHERE tenant IS NULL AND state = 'pending'",
        )
        .with(|s| due_for(s, due))
        .sql(")) s ON TRUE")
}

/// The due tasks of one participant, locked, in claim order: at most `limit`, their
/// `columns` ([`PICKED`] for a [`Picked`]), after `prefix` (empty, or `EXPLAIN`).
pub(super) fn pick_statement(
    prefix: &'static str,
    columns: &'static str,
    tenant: Option<&str>,
    due: &DueList,
    limit: i64,
) -> Statement<Mysql> {
    let statement = Statement::<Mysql>::new(prefix)
        .sql("SELECT ")
        .sql(columns)
        .sql(" FROM async_task FORCE INDEX (async_task_claim_idx) WHERE ");
    let statement = match tenant {
        None => statement.sql("tenant IS NULL"),
        Some(t) => statement.sql("tenant = ").bind::<Text, _>(t.to_owned()),
    };
    due_for(statement.sql(" AND state = 'pending'"), due)
        .sql(" ORDER BY priority, run_at, id LIMIT ")
        .bind::<BigInt, _>(limit)
        .sql(" FOR UPDATE SKIP LOCKED")
}

/// The columns of a [`Picked`].
pub(super) const PICKED: &str = "id, priority, CAST(run_at AS CHAR) AS due_at";

/// A due task locked for a claim, with what ranks it.
#[derive(Debug, QueryableByName)]
pub(super) struct Picked {
    #[diesel(sql_type = BigInt)]
    pub(super) id: i64,
    #[diesel(sql_type = Integer)]
    priority: i32,
    #[diesel(sql_type = Text)]
    due_at: String,
}

/// The ids of the page, locked: each participant's first `ceil(limit × weight / total)` due
/// tasks, ranked as on PostgreSQL (by priority, then turn: pass plus rank over weight, then
/// age, then ring position). The tasks locked but not taken stay locked until the claim
/// commits (other claims skip them meanwhile).
pub(super) fn page_ids(
    conn: &mut MysqlConnection,
    shares: &[Share],
    due: &DueList,
    limit: i64,
) -> QueryResult<Vec<i64>> {
    let total: i64 = shares.iter().map(|s| s.weight).sum::<i64>().max(1);
    let mut ranked: Vec<(i32, f64, String, i64, i64)> = Vec::new();
    for share in shares {
        let k = (limit.saturating_mul(share.weight) + total - 1) / total;
        let picked: Vec<Picked> =
            pick_statement("", PICKED, share.tenant.as_deref(), due, k).load(conn)?;
        for (rank, p) in picked.into_iter().enumerate() {
            let turn = share.pass + (rank as f64 + 1.0) / share.weight.max(1) as f64;
            ranked.push((p.priority, turn, p.due_at, share.pos, p.id));
        }
    }
    ranked.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then(a.1.total_cmp(&b.1))
            .then_with(|| a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
            .then(a.4.cmp(&b.4))
    });
    ranked.truncate(usize::try_from(limit).unwrap_or(0));
    Ok(ranked.into_iter().map(|r| r.4).collect())
}

//! The fair claim on PostgreSQL: which due tasks a claim takes when tenants share the table.
//!
//! The tasks without a tenant are served from the claim index and each tenant's from the
//! tenant index, as one participant each. A claim visits the tenants with pending tasks in
//! tenant order from where this node's last claim of these keywords stopped (a ring: a
//! loose index scan, one probe per tenant, wrapping around), keeps the first [`window`] of
//! them that have a task due for these keywords, and gives each participant a share of the
//! page in proportion to its weight (tasks without a tenant weigh 1): at most
//! `ceil(limit × weight / total)` of its first tasks in claim order, locked as they are read
//! (`SKIP LOCKED`). The page is then the `limit` first of those by priority, then by turn
//! (the participant's pass, what this node's claims served it over its weight, plus the
//! task's rank within it over its weight), then by age, then by ring position. Every step is
//! an index range scan bounded by the page, whatever the backlog.

use diesel::pg::Pg;
use diesel::sql_types::{Array, BigInt, Double, Text};

use crate::driver::ring_sql::{passes_lap, walk, window};
use crate::driver::rows::FoundRow;
use crate::driver::strategy_sql::partition_pg;
use crate::driver::{Due, Passes, Pick};

use crate::sql::Statement;

/// What a claim's `picked` reads of each task it locks: all that the claim returns, so that
/// the rest of the statement need not look the tasks up again (in its snapshot, older than
/// the locks).
const PICKED: &str = "t.id, t.claim_token, t.keyword, t.biz_id, t.biz_data, t.tenant, t.failures,
    t.max_attempts, t.priority";

/// A task of `t` is due for the claim: pending, its time come, one of the keywords bound next.
const DUE: &str = "t.state = 'pending' AND t.run_at <= now() AND t.keyword = ANY(";

/// Appends that a task of `t` is due for a claim of `due`: [`DUE`], its keywords, and the
/// node's partition if it has one (a claim strategy's filter, `partition_pg`).
pub(super) fn due_for(statement: Statement<Pg>, due: &Due<'_>) -> Statement<Pg> {
    let statement = statement
        .sql(DUE)
        .bind::<Array<Text>, _>(due.keywords.to_vec())
        .sql(")");
    // A leased task is a lock claim's until its chunk ends or rescue frees it; one probe of
    // the lease's primary key per candidate (the table holds the chunks in flight).
    let statement = match due.suspect {
        Some(false) => statement.sql(" AND t.suspect < 2"),
        Some(true) => statement.sql(" AND t.suspect >= 2"),
        None => statement,
    }
    .sql(" AND NOT EXISTS (SELECT 1 FROM async_lease l WHERE l.task_id = t.id)");
    partition_pg(statement, due.partition)
}

/// The first tenant with a pending task, for the ring to wrap around to.
const FIRST_TENANT: &str = "(SELECT tenant FROM async_task WHERE tenant IS NOT NULL
    AND state = 'pending' ORDER BY tenant LIMIT 1)";

/// `WITH RECURSIVE ring(tenant, n) AS (…)`: from the first tenant with a pending task after
/// `after` (wrapping around), each step one probe of the tenant index for the next, until
/// the next step would pass `lap` (it came round to the lap's first tenant) or it has walked
/// `walk` tenants. A claim that begins its lap (`after` = `lap`) starts at its first tenant;
/// one that goes on where another stopped starts nowhere if that one finished the lap.
fn ring(prefix: &'static str, after: &str, lap: &str, walk: i64) -> Statement<Pg> {
    let statement = Statement::<Pg>::new(prefix)
        .sql(
            "WITH RECURSIVE ring(tenant, n) AS (
                SELECT s.tenant, 1 FROM (SELECT COALESCE(
                    (SELECT tenant FROM async_task WHERE tenant > ",
        )
        .bind::<Text, _>(after.to_owned())
        .sql(
            " AND tenant IS NOT NULL AND state = 'pending' ORDER BY tenant LIMIT 1),
                    ",
        )
        .sql(FIRST_TENANT)
        .sql(") AS tenant, ")
        .bind::<Text, _>(after.to_owned())
        .sql("::text AS prev OFFSET 0) s WHERE s.tenant IS NOT NULL");
    let statement = if after == lap {
        statement
    } else {
        passes_lap(statement.sql(" AND NOT "), "s.prev", "s.tenant", lap)
    };
    statement
        .sql(
            "
              UNION ALL
                SELECT nx.tenant, r.n + 1 FROM ring r CROSS JOIN LATERAL (
                    SELECT COALESCE(
                    (SELECT tenant FROM async_task WHERE tenant > r.tenant AND tenant IS NOT NULL
                        AND state = 'pending' ORDER BY tenant LIMIT 1),
                    ",
        )
        .sql(FIRST_TENANT)
        // OFFSET 0 keeps the next tenant a column probed once per step: pulled up into the
        // step's filter, its probe would run once for each mention there.
        .sql(") AS tenant OFFSET 0) nx WHERE r.n < ")
        .bind::<BigInt, _>(walk)
        .sql(" AND NOT ")
        .with(|s| passes_lap(s, "r.tenant", "nx.tenant", lap))
        .sql(")")
}

/// The last tenant a fair claim of `limit` after `after`, in the lap begun at `lap`, walks
/// to (`None`: no tenant has a pending task, or the lap was done), and how many tenants it
/// walked: where the next claim starts when this one found too little to fill its page.
pub(super) fn ring_end(
    conn: &mut diesel::pg::PgConnection,
    after: &str,
    lap: &str,
    limit: i64,
) -> diesel::QueryResult<(Option<String>, i64)> {
    use diesel::{OptionalExtension, RunQueryDsl};
    #[derive(diesel::QueryableByName)]
    struct End {
        #[diesel(sql_type = Text)]
        tenant: String,
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let end: Option<End> = ring("", after, lap, walk(limit))
        .sql(" SELECT tenant, n::bigint AS n FROM ring ORDER BY n DESC LIMIT 1")
        .get_result(conn)
        .optional()?;
    Ok(end.map_or((None, 0), |e| (Some(e.tenant), e.n)))
}

/// `WITH RECURSIVE …, picked AS (SELECT id, claim_token, weight, <the task> …` (left open) choosing at
/// most `limit` pending tasks due for `due`, locked, fairly across tenants as the module
/// says; the ring starts after `after` (`""`: at the first tenant) and ends before it passes
/// `lap` (see [`ring`]). Tenants in `except` (those with a
/// `max_running`, claimed apart) are left out. Each participant's rank starts from its pass
/// in `passes` (what this node's claims have served it, over its weight).
pub(super) fn picked(
    prefix: &'static str,
    due: &Due<'_>,
    except: &[String],
    (after, lap): (&str, &str),
    passes: &Passes,
    limit: i64,
) -> Statement<Pg> {
    let statement = ring(prefix, after, lap, walk(limit))
        .sql(
            ", share AS (
                (SELECT r.tenant, COALESCE(a.weight, 1) AS weight, r.n AS pos,
                        COALESCE(pp.pass, ",
        )
        .bind::<Double, _>(passes.base)
        .sql(
            ") AS pass
                   FROM ring r CROSS JOIN LATERAL (
                       SELECT 1 FROM async_task t WHERE t.tenant = r.tenant AND ",
        )
        .with(|s| due_for(s, due))
        .sql(
            "
                        ORDER BY t.priority, t.run_at, t.id LIMIT 1) due
                   LEFT JOIN async_tenant a ON a.tenant = r.tenant
                   LEFT JOIN unnest(",
        )
        .bind::<Array<Text>, _>(passes.tenants.clone())
        .sql("::text[], ")
        .bind::<Array<Double>, _>(passes.values.clone())
        .sql("::float8[]) AS pp(tenant, pass) ON pp.tenant = r.tenant");
    let statement = if except.is_empty() {
        statement
    } else {
        statement
            .sql(" WHERE r.tenant <> ALL(")
            .bind::<Array<Text>, _>(except.to_vec())
            .sql(")")
    };
    statement
        .sql(" ORDER BY r.n LIMIT ")
        .bind::<BigInt, _>(window(limit))
        .sql(
            ")
                UNION ALL
                SELECT NULL, 1, 0, ",
        )
        .bind::<Double, _>(passes.none)
        .sql(" FROM (SELECT 1 FROM async_task t WHERE t.tenant IS NULL AND ")
        .with(|s| due_for(s, due))
        .sql(
            "
                     ORDER BY t.priority, t.run_at, t.id LIMIT 1) due
            ), quota AS (
                SELECT tenant, weight, pos, pass, ceil(",
        )
        .bind::<BigInt, _>(limit)
        .sql(
            "::numeric * weight / sum(weight) OVER ())::bigint AS k FROM share
            ), candidate AS (
                SELECT q.tenant, q.weight, q.pos, q.pass, c.* FROM quota q CROSS JOIN LATERAL (
                    SELECT t.id, t.claim_token, t.priority, t.run_at, t.keyword, t.biz_id,
                           t.biz_data, t.failures, t.max_attempts FROM async_task t
                     WHERE t.tenant = q.tenant AND ",
        )
        .with(|s| due_for(s, due))
        .sql(
            "
                     ORDER BY t.priority, t.run_at, t.id LIMIT q.k FOR UPDATE SKIP LOCKED) c
                 WHERE q.tenant IS NOT NULL
                UNION ALL
                SELECT q.tenant, q.weight, q.pos, q.pass, c.* FROM quota q CROSS JOIN LATERAL (
                    SELECT t.id, t.claim_token, t.priority, t.run_at, t.keyword, t.biz_id,
                           t.biz_data, t.failures, t.max_attempts FROM async_task t
                     WHERE t.tenant IS NULL AND ",
        )
        .with(|s| due_for(s, due))
        .sql(
            "
                     ORDER BY t.priority, t.run_at, t.id LIMIT q.k FOR UPDATE SKIP LOCKED) c
                 WHERE q.tenant IS NULL
            ), picked AS (
                SELECT id, claim_token, weight, tenant, keyword, biz_id, biz_data, failures,
                       max_attempts, priority FROM (
                    SELECT id, claim_token, priority, run_at, pos, weight, tenant, keyword, biz_id,
                           biz_data, failures, max_attempts, pass + row_number() OVER (
                               PARTITION BY tenant ORDER BY priority, run_at, id)::float8 / weight AS turn
                      FROM candidate) ranked
                 ORDER BY priority, turn, run_at, pos, id
                 LIMIT ",
        )
        .bind::<BigInt, _>(limit)
}

/// What a claim takes (see [`Pick`]): `WITH …, picked AS (SELECT id, claim_token, <the
/// task> …` left open ([`PICKED`]'s columns).
pub(super) fn pick(
    prefix: &'static str,
    due: &Due<'_>,
    except: &[String],
    pick: &Pick<'_>,
    limit: i64,
) -> Statement<Pg> {
    match pick {
        Pick::Fair { after, lap, passes } => {
            picked(prefix, due, except, (after, lap), passes, limit)
        }
        Pick::Solo { tenant, .. } => solo(prefix, due, *tenant, limit),
    }
}

/// One participant's first due tasks, locked: the statement of a claim before it, when that
/// claim found no other participant (`WITH picked AS (SELECT <PICKED> …`, left open).
fn solo(prefix: &'static str, due: &Due<'_>, tenant: Option<&str>, limit: i64) -> Statement<Pg> {
    let statement = Statement::<Pg>::new(prefix)
        .sql("WITH picked AS (SELECT ")
        .sql(PICKED)
        .sql(" FROM async_task t WHERE ");
    solo_scan(statement, due, tenant, limit)
}

/// `<tenant's> AND <due> ORDER BY … LIMIT n FOR UPDATE SKIP LOCKED` after `WHERE`, for the
/// tasks of `t` of one participant: its index's range scan in claim order, locked as it is
/// read. The sort keys name the table's columns: `priority` alone would be an output's
/// integer cast, which no index provides, and the plan would sort every pending row.
pub(super) fn solo_scan(
    statement: Statement<Pg>,
    due: &Due<'_>,
    tenant: Option<&str>,
    limit: i64,
) -> Statement<Pg> {
    let statement = match tenant {
        Some(tenant) => statement
            .sql("t.tenant = ")
            .bind::<Text, _>(tenant.to_owned())
            .sql(" AND "),
        None => statement.sql("t.tenant IS NULL AND "),
    };
    statement
        .with(|s| due_for(s, due))
        .sql(" ORDER BY t.priority, t.run_at, t.id LIMIT ")
        .bind::<BigInt, _>(limit)
        .sql(" FOR UPDATE SKIP LOCKED")
}

/// Whether a participant other than `tenant` (`None`: the tasks without one) has pending
/// tasks, the tenants `except` left out: `async_task_others_pending`, asked on its own.
pub(super) fn others_pending(
    conn: &mut diesel::pg::PgConnection,
    tenant: Option<&str>,
    except: &[String],
) -> diesel::QueryResult<bool> {
    use diesel::RunQueryDsl;
    let found: FoundRow = Statement::<Pg>::new("SELECT async_task_others_pending(")
        .bind::<diesel::sql_types::Nullable<Text>, _>(tenant.map(str::to_owned))
        .sql(", ")
        .bind::<Array<Text>, _>(except.to_vec())
        .sql(") AS found")
        .get_result(conn)?;
    Ok(found.found)
}

/// `, <whether another participant has pending tasks> AS crowded`, for the output of a claim
/// of `pick` (false for a fair one, and for a solo one that does not probe):
/// `async_task_others_pending`, a few index probes, once per statement; then a fair claim's
/// weights, the ring's end and length, and the participants that shared the page.
pub(super) fn crowded(
    statement: Statement<Pg>,
    except: &[String],
    pick: &Pick<'_>,
) -> Statement<Pg> {
    match pick {
        Pick::Fair { .. } => statement.sql(
            ", false AS crowded, picked.weight AS weight,
               (SELECT tenant FROM ring ORDER BY n DESC LIMIT 1) AS ring_end,
               (SELECT count(*) FROM ring) AS ring_len,
               (SELECT array_agg(tenant) FROM share) AS shared",
        ),
        Pick::Solo { probe: false, .. } => statement.sql(
            ", false AS crowded, 1 AS weight, NULL::text AS ring_end, 0::bigint AS ring_len,
               NULL::text[] AS shared",
        ),
        Pick::Solo { tenant, .. } => statement
            .sql(", (SELECT async_task_others_pending(")
            .bind::<diesel::sql_types::Nullable<Text>, _>(tenant.map(str::to_owned))
            .sql(", ")
            .bind::<Array<Text>, _>(except.to_vec())
            .sql(
                ")) AS crowded, 1 AS weight, NULL::text AS ring_end, 0::bigint AS ring_len,
                   NULL::text[] AS shared",
            ),
    }
}

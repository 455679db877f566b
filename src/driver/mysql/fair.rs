//! The fair claim on MySQL: the same choice as on PostgreSQL (see `driver/postgres/fair.rs`),
//! made in the claim's transaction: one statement walks the ring of tenants and reads each
//! participant's weight (`fair_sql::shares_statement`); then each participant's first due
//! tasks are locked (`FOR UPDATE SKIP LOCKED`, as many as its share could take) and the page
//! is ranked from them here, by the same order as on the other backends ([`page_ids`]). With
//! no tenant due, the claim is the one of tasks without a tenant alone. A solo claim (one
//! participant alone) takes that participant's tasks, and asks `fair_sql::others_pending`
//! when it probes.

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::{BigInt, Integer, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::list;
use crate::driver::fair_sql::{first_due, DueList, FairSql};
use crate::driver::ring_sql::Share;
use crate::driver::strategy_sql::partition_mysql;
use crate::sql::Statement;
use crate::strategy::Partition;

/// `FORCE INDEX`: each statement reads the index it was tuned for by `EXPLAIN`, whatever the
/// optimizer's statistics say.
impl FairSql for Mysql {
    const NOW: &'static str = now!();
    const CLAIM_INDEX: &'static str = "async_task FORCE INDEX (async_task_claim_idx)";
    // (pending_tenant): the tenants with pending tasks, in order.
    const TENANT_INDEX: &'static str = "async_task FORCE INDEX (async_task_pending_tenant_idx)";
    // (tenant, state, priority, run_at, id): one tenant's tasks in claim order as well.
    const TASKS_OF_TENANT_INDEX: &'static str = Self::CLAIM_INDEX;
    // (pending_suspect, priority, run_at, id).
    const SUSPECT_INDEX: &'static str = "async_task FORCE INDEX (async_task_suspect_idx)";
    const PENDING: &'static str = "state = 'pending'";
    // MySQL has no partial indexes: the tenant index and the suspects' are on generated
    // columns, NULL but while the task is pending (migration 000018), so that a task without
    // a tenant, or not a suspect, never moves in them when its state changes.
    const TENANT_KEY: &'static str = "pending_tenant";
    const TENANT_PENDING: &'static str = "pending_tenant IS NOT NULL";
    const SUSPECT_PENDING: &'static str = "pending_suspect = 1";
    // One probe of the lease's primary key per candidate (the table holds the chunks in
    // flight), run per row after the row's lock, as a consistent read: it may not see a lease
    // committed after the statement's view was taken (the lease claim then meets it at its
    // insert and is taken again, `lease.rs`).
    const NOT_LEASED: &'static str =
        " AND NOT EXISTS (SELECT 1 FROM async_lease l WHERE l.task_id = async_task.id)";
    // The ring's counter and a weight are read as BIGINT only so cast.
    const BIGINT: [&'static str; 2] = ["CAST(", " AS SIGNED)"];
    // A scalar subquery, not EXISTS: MariaDB turns EXISTS into a semi-join that
    // materialises every pending task instead of probing the claim index per tenant.
    const FOUND: [&'static str; 2] = ["(", " LIMIT 1) IS NOT NULL"];
    // A SELECT with a WHERE needs a FROM.
    const NO_TABLE: &'static str = " FROM DUAL";
    // The range optimizer reads `tenant <> ?` as the two ranges around it.
    const OTHER_THAN: &'static [&'static str] = &["<>"];

    /// One bind per item (`list::texts`).
    type List = Vec<String>;

    fn list(texts: &[String]) -> Vec<String> {
        texts.to_vec()
    }

    fn in_list(statement: Statement<Mysql>, list: &Vec<String>) -> Statement<Mysql> {
        list::texts(statement, list)
    }

    fn partition(statement: Statement<Mysql>, partition: Option<Partition>) -> Statement<Mysql> {
        partition_mysql(statement, partition)
    }

    /// Two loose index scans of the tenant index (`GROUP BY pending_tenant`: one seek per
    /// tenant, "Using index for group-by"), the tenants after `after` then those from the
    /// first, numbered. Not a recursive step as on SQLite: MariaDB plans the correlated probe
    /// of the next tenant before it knows the tenant, and read every pending task of the
    /// tenants before at every step of the ring (docs/notes/2026-11-26-mysql-speed.md).
    ///
    /// The walk stops before it would pass `lap` (`ring_sql::passes_lap`): a claim that
    /// begins a lap (`after` is `lap`, byte for byte, as the worker tells them apart) visits
    /// the whole ring once; one that goes on visits the tenants after `after` up to `lap`
    /// going round, none when the database finds them equal (PAD SPACE: `'a '` is `'a'`), its
    /// lap done. The comparisons are the database's, in its collation.
    fn ring(statement: Statement<Mysql>, after: &str, lap: &str, walk: i64) -> Statement<Mysql> {
        let new_lap = after == lap;
        let after = |s: Statement<Mysql>| s.bind::<Text, _>(after.to_owned());
        let lap = |s: Statement<Mysql>| s.bind::<Text, _>(lap.to_owned());
        let part = |statement: Statement<Mysql>, n: &'static str| {
            statement
                .sql("(SELECT ")
                .sql(n)
                .sql(" AS part, pending_tenant AS tenant FROM ")
                .sql(Self::TENANT_INDEX)
                .sql(" WHERE ")
        };
        let tail = |statement: Statement<Mysql>| {
            statement
                .sql(" GROUP BY pending_tenant ORDER BY pending_tenant LIMIT ")
                .bind::<BigInt, _>(walk)
                .sql(")")
        };
        let statement = statement.sql(
            "WITH ring (tenant, n) AS (
            SELECT tenant, n FROM (
                SELECT tenant, ROW_NUMBER() OVER (ORDER BY part, tenant) AS n FROM (",
        );
        // After `after` to the end (or to `lap`, when the lap ends before the end), then
        // from the first tenant to `after` (a new lap) or to `lap` (one past the end).
        let statement = match new_lap {
            true => part(statement, "1")
                .sql("pending_tenant > ")
                .with(after)
                .with(tail)
                .sql(" UNION ALL ")
                .with(|s| part(s, "2"))
                .sql("pending_tenant <= ")
                .with(after),
            false => part(statement, "1")
                .sql("pending_tenant > ")
                .with(after)
                .sql(" AND (")
                .with(after)
                .sql(" > ")
                .with(lap)
                .sql(" OR pending_tenant <= ")
                .with(lap)
                .sql(")")
                .with(tail)
                .sql(" UNION ALL ")
                .with(|s| part(s, "2"))
                .with(after)
                .sql(" > ")
                .with(lap)
                .sql(" AND pending_tenant <= ")
                .with(lap),
        };
        statement
            .with(tail)
            .sql(") parts) numbered WHERE n <= ")
            .bind::<BigInt, _>(walk)
            .sql(")")
    }
}

/// The due tasks of one participant, locked, in claim order: at most `limit`, their
/// `columns` ([`PICKED`] for a [`Picked`]), after `prefix` (empty, or `EXPLAIN`).
pub(super) fn pick_statement(
    prefix: &'static str,
    columns: &'static str,
    tenant: Option<&str>,
    due: &DueList<Mysql>,
    limit: i64,
) -> Statement<Mysql> {
    let statement = Statement::<Mysql>::new(prefix)
        .sql("SELECT ")
        .sql(columns)
        .sql(" FROM ");
    first_due(statement, tenant, due, limit).sql(" FOR UPDATE SKIP LOCKED")
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
/// commits (other claims skip them meanwhile). Ranked here, not by SQL as on SQLite: the
/// locking reads are one per participant.
pub(super) fn page_ids(
    conn: &mut MysqlConnection,
    shares: &[Share],
    due: &DueList<Mysql>,
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

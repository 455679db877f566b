//! The fair claim on SQLite: the same choice as on PostgreSQL (see `driver/postgres/fair.rs`),
//! made in the claim's write transaction by two statements: one walks the ring of tenants
//! and reads each participant's weight (`fair_sql::shares_statement`), the other takes the
//! page in one UPDATE ([`page_ids`]). With no tenant due, the UPDATE is the claim of tasks
//! without a tenant alone. A solo claim (one participant alone) is the UPDATE alone, and
//! `fair_sql::others_pending` when it probes.

use diesel::sql_types::{BigInt, Double, Text};
use diesel::sqlite::Sqlite;

use crate::driver::fair_sql::{first_due, pending_tenant, DueList, FairSql};
use crate::driver::ring_sql::{passes_lap, Share};
use crate::driver::strategy_sql::partition_sqlite;
use crate::sql::Statement;
use crate::strategy::Partition;

/// SQLite uses a partial index only when the query repeats its predicate's terms: `state =
/// 'pending'` alone does not imply the tenant index's `state IN (…)`. `INDEXED BY`: left to
/// itself, the planner serves `keyword IN (…)` from the unique (keyword, biz_id) index and
/// sorts every task of those keywords, done ones included.
impl FairSql for Sqlite {
    const NOW: &'static str = now!();
    const CLAIM_INDEX: &'static str = "async_task INDEXED BY async_task_claim_idx";
    const TENANT_INDEX: &'static str = "async_task INDEXED BY async_task_tenant_idx";
    // (tenant, state, priority, run_at, id): one tenant's tasks in claim order as well.
    const TASKS_OF_TENANT_INDEX: &'static str = Self::TENANT_INDEX;
    const SUSPECT_INDEX: &'static str = "async_task INDEXED BY async_task_suspect_idx";
    // The tenant index's predicate repeated (see above).
    const PENDING: &'static str =
        "state = 'pending' AND state IN ('pending', 'blocked', 'running')";
    const TENANT_KEY: &'static str = "tenant";
    const TENANT_PENDING: &'static str =
        "tenant IS NOT NULL AND state = 'pending' AND state IN ('pending', 'blocked', 'running')";
    // The suspects' index's predicate.
    const SUSPECT_PENDING: &'static str = "state = 'pending' AND suspect >= 2";
    // No lock claims on SQLite: no leases.
    const NOT_LEASED: &'static str = "";
    // Integers are 64-bit already.
    const BIGINT: [&'static str; 2] = ["", ""];
    const FOUND: [&'static str; 2] = ["EXISTS (", ")"];
    // A SELECT needs no FROM.
    const NO_TABLE: &'static str = "";
    // `tenant <> ?` reads the whole tenant index; two ranges each seek.
    const OTHER_THAN: &'static [&'static str] = &["<", ">"];

    /// A JSON array, one bind (`json_each`).
    type List = String;

    fn list(texts: &[String]) -> String {
        serde_json::to_string(texts).expect("a list of strings serialises")
    }

    fn in_list(statement: Statement<Sqlite>, list: &String) -> Statement<Sqlite> {
        statement
            .sql("(SELECT value FROM json_each(")
            .bind::<diesel::sql_types::Text, _>(list.clone())
            .sql("))")
    }

    fn partition(statement: Statement<Sqlite>, partition: Option<Partition>) -> Statement<Sqlite> {
        partition_sqlite(statement, partition)
    }

    /// A recursive step that carries each tenant's next (`nx`), so that the next tenant is
    /// probed once per step (as on PostgreSQL, `driver/postgres/fair.rs`, whose step joins
    /// laterally; SQLite's cannot): each probe a seek of the tenant index.
    fn ring(statement: Statement<Sqlite>, after: &str, lap: &str, walk: i64) -> Statement<Sqlite> {
        let statement = statement
            .sql("WITH RECURSIVE ring (tenant, n, nx) AS (SELECT s0.t0, 1, ")
            .with(|s| next_tenant(s, |s| s.sql("s0.t0")))
            .sql(" FROM (SELECT ")
            .with(|s| next_tenant(s, |s| s.bind::<Text, _>(after.to_owned())))
            .sql(" AS t0, ")
            .bind::<Text, _>(after.to_owned())
            .sql(" AS prev) s0 WHERE s0.t0 IS NOT NULL");
        // A claim that goes on in a lap another began starts nowhere if that one ended it.
        let statement = if after == lap {
            statement
        } else {
            passes_lap(statement.sql(" AND NOT "), "s0.prev", "s0.t0", lap)
        };
        statement
            .sql(" UNION ALL SELECT r.nx, r.n + 1, ")
            .with(|s| next_tenant(s, |s| s.sql("r.nx")))
            .sql(" FROM ring r WHERE r.n < ")
            .bind::<BigInt, _>(walk)
            .sql(" AND NOT ")
            .with(|s| passes_lap(s, "r.tenant", "r.nx", lap))
            .sql(")")
    }
}

/// Appends the next tenant with a pending task after the tenant that `after` appends (a
/// column or a bind), wrapping around to the first.
fn next_tenant(
    statement: Statement<Sqlite>,
    after: impl FnOnce(Statement<Sqlite>) -> Statement<Sqlite>,
) -> Statement<Sqlite> {
    let statement = statement
        .sql("COALESCE((SELECT tenant FROM ")
        .sql(<Sqlite as FairSql>::TENANT_INDEX)
        .sql(" WHERE tenant > ");
    after(statement)
        .sql(" AND ")
        .with(pending_tenant::<Sqlite>)
        .sql(" ORDER BY tenant LIMIT 1), (SELECT tenant FROM ")
        .sql(<Sqlite as FairSql>::TENANT_INDEX)
        .sql(" WHERE ")
        .with(pending_tenant::<Sqlite>)
        .sql(" ORDER BY tenant LIMIT 1))")
}

/// Appends to `statement` (an `UPDATE … WHERE id IN (`, left open) the ids of the page: each
/// participant's first `ceil(limit × weight / total)` due tasks, ranked as on PostgreSQL (by
/// priority, then turn: pass plus rank over weight, then age, then ring position).
pub(super) fn page_ids(
    statement: Statement<Sqlite>,
    shares: &[Share],
    due: &DueList<Sqlite>,
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
        statement = first_due(statement, share.tenant.as_deref(), due, k).sql("))");
    }
    statement
        .sql(") ORDER BY priority, turn, run_at, pos, id LIMIT ")
        .bind::<BigInt, _>(limit)
}

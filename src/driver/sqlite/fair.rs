//! The fair claim on SQLite: the same choice as on PostgreSQL (see `driver/postgres/fair.rs`),
//! made in the claim's write transaction by two statements: one walks the ring of tenants
//! and reads each participant's weight (`fair_sql::shares_statement`), the other takes the
//! page in one UPDATE ([`page_ids`]). With no tenant due, the UPDATE is the claim of tasks
//! without a tenant alone. A solo claim (one participant alone) is the UPDATE alone, and
//! `fair_sql::others_pending` when it probes.

use diesel::sql_types::{BigInt, Double};
use diesel::sqlite::Sqlite;

use crate::driver::fair_sql::{first_due, DueList, FairSql};
use crate::driver::ring_sql::Share;
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
    const PENDING_AFTER: &'static str =
        "tenant IS NOT NULL AND state = 'pending' AND state IN ('pending', 'blocked', 'running')";
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

//! The ring of tenants that a fair claim walks (docs/guide/src/tenants.md, "Fair claiming"), in
//! what every backend writes alike: how far one statement walks, and where a walk that goes on over
//! several claims stops.
//!
//! A claim visits the tenants with pending tasks in tenant order from where this node's last
//! claim stopped, wrapping around: a ring. One statement walks at most [`walk`] of them, so
//! that its cost stays bounded whatever the number of tenants; when that bound stops it
//! short of a full turn and its page is not full, the node's next claim goes on from where
//! it stopped, in the same lap, until the lap comes round to where it began
//! ([`passes_lap`]).

use diesel::backend::Backend;
use diesel::sql_types::{HasSqlType, Text};

use crate::sql::Statement;

/// How many tenants a statement visits at most, for each tenant its window may hold: tenants
/// whose pending tasks are all delayed, or of other keywords, are stepped over, up to this.
const WALK_PER_TASK: i64 = 2;

/// The fewest tenants a claim's window holds, however small its page: weights are compared
/// within the window, so a page of one task still serves them in proportion.
const MIN_WINDOW: i64 = 16;

/// The tenants a claim of `limit` tasks shares its page between, at most.
pub(super) fn window(limit: i64) -> i64 {
    limit.max(MIN_WINDOW)
}

/// How many tenants one statement of a claim of `limit` tasks walks at most.
pub(super) fn walk(limit: i64) -> i64 {
    window(limit).saturating_mul(WALK_PER_TASK)
}

/// Appends whether the ring's step from the tenant `from` to the next one, `to` (column
/// expressions), passes `lap`, in parentheses: whether `lap` lies in `[from, to)` going round
/// the ring, so that `to` is the lap's first tenant again (a step that wraps around, `to` not
/// after `from`, passes it unless `lap` lies between them). Compared by the database, in
/// the order of its tenant index, whatever its collation.
pub(super) fn passes_lap<DB>(
    statement: Statement<DB>,
    from: &'static str,
    to: &'static str,
    lap: &str,
) -> Statement<DB>
where
    DB: Backend + HasSqlType<Text>,
    String: diesel::serialize::ToSql<Text, DB>,
{
    let lap = || lap.to_owned();
    statement
        .sql("(CASE WHEN ")
        .sql(to)
        .sql(" > ")
        .sql(from)
        .sql(" THEN ")
        .sql(from)
        .sql(" <= ")
        .bind::<Text, _>(lap())
        .sql(" AND ")
        .bind::<Text, _>(lap())
        .sql(" < ")
        .sql(to)
        .sql(" ELSE ")
        .sql(from)
        .sql(" <= ")
        .bind::<Text, _>(lap())
        .sql(" OR ")
        .bind::<Text, _>(lap())
        .sql(" < ")
        .sql(to)
        .sql(" END)")
}

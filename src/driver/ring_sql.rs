//! The ring of tenants that a fair claim walks (docs/guide/src/tenants.md, "Fair claiming"), in
//! what every backend writes alike: how far one statement walks, and where a walk that goes on over
//! several claims stops.
//!
//! A claim visits the tenants with pending tasks in tenant order from where this node's last
//! claim stopped, wrapping around: a ring. One statement walks at most [`walk`] of them, so
//! that its cost stays bounded whatever the number of tenants; when that bound stops it
//! short of a full turn and its page is not full, the node's next claim goes on from where
//! it stopped, in the same lap, until the lap comes round to where it began
//! (`passes_lap` on PostgreSQL and SQLite; MySQL walks it in `mysql/fair.rs`).

use diesel::sql_types::Text;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
use diesel::sql_types::{BigInt, Nullable};

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
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(super) fn passes_lap<DB>(
    statement: crate::sql::Statement<DB>,
    from: &'static str,
    to: &'static str,
    lap: &str,
) -> crate::sql::Statement<DB>
where
    DB: diesel::backend::Backend + diesel::sql_types::HasSqlType<Text>,
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

/// A participant of a claim (SQLite and MySQL, which share the page out in Rust): a tenant
/// with a task due, or (`None`) the tasks without one; its weight, its place in the ring (0
/// for the tasks without a tenant) and its pass.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
#[derive(Debug)]
pub(super) struct Share {
    pub(super) tenant: Option<String>,
    pub(super) weight: i64,
    pub(super) pos: i64,
    pub(super) pass: f64,
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
impl Share {
    /// A tenant alone (its weight and pass do not matter then).
    #[cfg(feature = "sqlite")]
    pub(super) fn of(tenant: &str) -> Share {
        Share {
            tenant: Some(tenant.to_owned()),
            weight: 1,
            pos: 0,
            pass: 0.0,
        }
    }
}

/// A row of the shares' statement of SQLite and MySQL: a participant, or (weight NULL) none,
/// with the ring's end and length either way.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
#[derive(Debug, diesel::QueryableByName)]
pub(super) struct ShareRow {
    #[diesel(sql_type = Nullable<Text>)]
    tenant: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    weight: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pos: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    ring_end: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    ring_len: Option<i64>,
}

/// The participants of a claim of `limit` tasks in the shares' `rows`, in ring order, each
/// with its pass from `passes`; the last tenant the ring walked to; and whether the ring
/// stopped at its bound (see [`super::Picked`]).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) fn shares_of(
    rows: Vec<ShareRow>,
    passes: &super::Passes,
    limit: i64,
) -> (Vec<Share>, Option<String>, bool) {
    let ring_end = rows.first().and_then(|r| r.ring_end.clone());
    let ring_cut = rows
        .first()
        .and_then(|r| r.ring_len)
        .is_some_and(|n| n >= walk(limit));
    let mut shares: Vec<Share> = rows
        .into_iter()
        .filter_map(|r| {
            let pass = match &r.tenant {
                None => passes.none,
                Some(t) => passes
                    .tenants
                    .iter()
                    .position(|p| p == t)
                    .map_or(passes.base, |i| passes.values[i]),
            };
            Some(Share {
                weight: r.weight?,
                pos: r.pos.unwrap_or(0),
                tenant: r.tenant,
                pass,
            })
        })
        .collect();
    shares.sort_by_key(|s| s.pos);
    (shares, ring_end, ring_cut)
}

/// A fair claim's [`super::Picked`]: its `rows`, taken from `shares`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(super) fn picked(
    rows: Vec<super::ClaimRow>,
    shares: &[Share],
    ring_end: Option<String>,
    ring_cut: bool,
) -> super::Picked {
    super::Picked {
        rows,
        weights: shares
            .iter()
            .map(|s| {
                (
                    s.tenant.clone(),
                    i32::try_from(s.weight).unwrap_or(i32::MAX),
                )
            })
            .collect(),
        crowded: false,
        ring_end,
        ring_cut,
        shared: shares.iter().map(|s| s.tenant.clone()).collect(),
        unconfirmed: None,
    }
}

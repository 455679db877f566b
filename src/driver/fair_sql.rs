//! The fair claim's statements of SQLite and MySQL, written once: the walk of the ring of
//! tenants with each participant's weight ([`shares_statement`]), the due tasks of one
//! participant ([`first_due`]), the probe of a solo claim ([`others_pending`]) and the
//! suspects' ([`first_suspect`], [`suspects_exist`]), and the choice between them that a
//! claim makes ([`choose_page`]). PostgreSQL's ring is a `LATERAL` join of its own
//! (`driver/postgres/fair.rs`).
//!
//! What the two spell differently is [`FairSql`], implemented beside each backend's claim
//! (`sqlite/fair.rs`, `mysql/fair.rs`): the index hints, tuned by `EXPLAIN` on each; how a
//! list is bound; a cast, a table-less `SELECT`, a test for a row.

use diesel::backend::Backend;
use diesel::connection::LoadConnection;
use diesel::query_dsl::LoadQuery;
use diesel::serialize::ToSql;
use diesel::sql_types::{BigInt, HasSqlType, Text};
use diesel::{QueryResult, RunQueryDsl};

use super::ring_sql::{picked, shares_of, walk, window, Share, ShareRow};
use super::{ClaimRow, Claiming, Due, Pick, Picked};
use crate::sql::Statement;
use crate::strategy::Partition;

/// What the fair claim's statements spell differently on a backend. Each constant is SQL
/// text; its implementation says why the backend writes it so.
pub(super) trait FairSql: Backend + HasSqlType<Text> + HasSqlType<BigInt> + Sized {
    /// The database clock.
    const NOW: &'static str;
    /// `async_task` read by its claim index: the tasks without a tenant, in claim order.
    const CLAIM_INDEX: &'static str;
    /// `async_task` read by the index that the ring walks: the tenants with pending tasks,
    /// in tenant order.
    const TENANT_INDEX: &'static str;
    /// `async_task` read by the index of one tenant's pending tasks, in claim order.
    const TASKS_OF_TENANT_INDEX: &'static str;
    /// `async_task` read by the suspects' index.
    const SUSPECT_INDEX: &'static str;
    /// That a task is pending, in the terms the claim index and the index of one tenant's
    /// tasks are read by.
    const PENDING: &'static str;
    /// The tenant index's key: a pending task's tenant.
    const TENANT_KEY: &'static str;
    /// That a task is pending and has a tenant, in the tenant index's terms.
    const TENANT_PENDING: &'static str;
    /// That a task is a pending suspect, in the suspects' index's terms.
    const SUSPECT_PENDING: &'static str;
    /// ` AND` that a task of `async_task` has no lease (a lock claim's, until its chunk ends
    /// or rescue frees it), or nothing where there are no lock claims.
    const NOT_LEASED: &'static str;
    /// Around an integer expression: read as a `BIGINT`.
    const BIGINT: [&'static str; 2];
    /// Around `SELECT 1 FROM … WHERE …`: true when it finds a row.
    const FOUND: [&'static str; 2];
    /// The `FROM` of a `SELECT` of no table that has a `WHERE`.
    const NO_TABLE: &'static str;
    /// The comparisons that together find every tenant but one (`tenant <op> ?`), each
    /// read as its own range of the tenant index.
    const OTHER_THAN: &'static [&'static str];

    /// A list of texts, as the backend binds one.
    type List;
    /// `texts` as a [`Self::List`].
    fn list(texts: &[String]) -> Self::List;
    /// Appends `list` as the right side of `IN`, in parentheses.
    fn in_list(statement: Statement<Self>, list: &Self::List) -> Statement<Self>;
    /// Appends a claim strategy's filter of `partition` (`strategy_sql::partition_filter`).
    fn partition(statement: Statement<Self>, partition: Option<Partition>) -> Statement<Self>;
    /// Appends `WITH … ring (tenant, n, …) AS (…)`: the tenants with pending tasks in ring
    /// order after `after`, up to where the walk would pass `lap`, at most `walk` of them,
    /// numbered from 1 (`super::ring_sql`). How each backend walks its tenant index with a
    /// seek per tenant differs: a recursive step that probes the next tenant, or a loose
    /// index scan.
    fn ring(statement: Statement<Self>, after: &str, lap: &str, walk: i64) -> Statement<Self>;
}

/// What a claim may take ([`Due`]), owned, its keywords bound as the backend binds a list.
pub(super) struct DueList<B: FairSql> {
    keywords: B::List,
    partition: Option<Partition>,
    suspect: Option<bool>,
}

impl<B: FairSql> DueList<B> {
    pub(super) fn of(due: &Due<'_>) -> Self {
        DueList {
            keywords: B::list(due.keywords),
            partition: due.partition,
            suspect: due.suspect,
        }
    }
}

/// Appends that a task is due for a claim of `due`: its time has come, one of the keywords,
/// the suspects left out or alone as it says, and the node's partition if it has one.
pub(super) fn due_for<B: FairSql>(statement: Statement<B>, due: &DueList<B>) -> Statement<B> {
    let statement = statement
        .sql(" AND run_at <= ")
        .sql(B::NOW)
        .sql(" AND keyword IN ")
        .with(|s| B::in_list(s, &due.keywords));
    let statement = match due.suspect {
        Some(false) => statement.sql(" AND suspect < 2"),
        Some(true) => statement.sql(" AND suspect >= 2"),
        None => statement,
    };
    B::partition(statement.sql(B::NOT_LEASED), due.partition)
}

/// Appends, after a `FROM`, the first `limit` due tasks of `tenant` (`None`: those without
/// one) in claim order: `async_task … ORDER BY priority, run_at, id LIMIT ?`.
pub(super) fn first_due<B: FairSql>(
    statement: Statement<B>,
    tenant: Option<&str>,
    due: &DueList<B>,
    limit: i64,
) -> Statement<B>
where
    String: ToSql<Text, B>,
    i64: ToSql<BigInt, B>,
{
    let statement = match tenant {
        Some(tenant) => statement
            .sql(B::TASKS_OF_TENANT_INDEX)
            .sql(" WHERE tenant = ")
            .bind::<Text, _>(tenant.to_owned())
            .sql(" AND ")
            .sql(B::PENDING),
        None => statement
            .sql(B::CLAIM_INDEX)
            .sql(" WHERE tenant IS NULL AND state = 'pending'"),
    };
    due_for(statement, due)
        .sql(" ORDER BY priority, run_at, id LIMIT ")
        .bind::<BigInt, _>(limit)
}

/// Appends that a task is pending and has a tenant, in the tenant index's terms.
pub(super) fn pending_tenant<B: FairSql>(statement: Statement<B>) -> Statement<B> {
    statement.sql(B::TENANT_PENDING)
}

/// The statement of the participants of a claim of `limit` tasks of `due`, after `prefix`
/// (empty, or the backend's `EXPLAIN`): at most `limit` tenants with a task due, in ring
/// order after `after` up to where it would pass `lap`, none of `except`, then the tasks
/// without a tenant if one is due; rows of [`super::ring_sql::ShareRow`]. The ring is the
/// backend's ([`FairSql::ring`]).
pub(super) fn shares_statement<B: FairSql>(
    prefix: &'static str,
    due: &DueList<B>,
    except: Option<&B::List>,
    (after, lap): (&str, &str),
    limit: i64,
) -> Statement<B>
where
    String: ToSql<Text, B>,
    i64: ToSql<BigInt, B>,
{
    let statement = B::ring(Statement::<B>::new(prefix), after, lap, walk(limit));
    let [bigint, as_bigint] = B::BIGINT;
    let [found, is_found] = B::FOUND;
    let statement = statement
        .sql(
            "
            SELECT s.tenant, s.weight, s.pos, e.ring_end, e.ring_len
              FROM (SELECT 1 AS one) one
              LEFT JOIN (SELECT tenant AS ring_end, ",
        )
        .sql(bigint)
        .sql("n")
        .sql(as_bigint)
        .sql(
            " AS ring_len FROM ring ORDER BY n DESC LIMIT 1) e ON TRUE
              LEFT JOIN (
            SELECT tenant, weight, pos FROM (
                SELECT r.tenant, ",
        )
        .sql(bigint)
        .sql("COALESCE(a.weight, 1)")
        .sql(as_bigint)
        .sql(" AS weight, ")
        .sql(bigint)
        .sql("r.n")
        .sql(as_bigint)
        .sql(
            " AS pos
                  FROM ring r LEFT JOIN async_tenant a ON a.tenant = r.tenant
                 WHERE ",
        )
        .sql(found)
        .sql("SELECT 1 FROM ")
        .sql(B::TASKS_OF_TENANT_INDEX)
        .sql(" WHERE tenant = r.tenant AND ")
        .sql(B::PENDING)
        .with(|s| due_for(s, due))
        .sql(is_found);
    let statement = match except {
        None => statement,
        Some(except) => statement
            .sql(" AND r.tenant NOT IN ")
            .with(|s| B::in_list(s, except)),
    };
    statement
        .sql(" ORDER BY r.n LIMIT ")
        .bind::<BigInt, _>(window(limit))
        .sql(
            ") w
            UNION ALL
            SELECT NULL, 1, 0",
        )
        .sql(B::NO_TABLE)
        .sql(" WHERE EXISTS (SELECT 1 FROM ")
        .sql(B::CLAIM_INDEX)
        .sql(" WHERE tenant IS NULL AND state = 'pending'")
        .with(|s| due_for(s, due))
        .sql(")) s ON TRUE")
}

/// Whether a participant other than `tenant` (`None`: the tasks without one) has pending
/// tasks, tenants in `except` left out: asked by a solo claim, so that the next claim is
/// fair again when another comes. One row of [`Found`].
pub(super) fn others_pending<B: FairSql>(
    tenant: Option<&str>,
    except: Option<&B::List>,
) -> Statement<B>
where
    String: ToSql<Text, B>,
{
    let tenants = |statement: Statement<B>, op: Option<&'static str>| {
        let statement = statement
            .sql("EXISTS (SELECT 1 FROM ")
            .sql(B::TENANT_INDEX)
            .sql(" WHERE ");
        let statement = match (op, tenant) {
            (Some(op), Some(tenant)) => statement
                .sql(B::TENANT_KEY)
                .sql(" ")
                .sql(op)
                .sql(" ")
                .bind::<Text, _>(tenant.to_owned())
                .sql(" AND "),
            _ => statement,
        };
        let statement = pending_tenant(statement);
        match except {
            None => statement,
            Some(except) => statement
                .sql(" AND ")
                .sql(B::TENANT_KEY)
                .sql(" NOT IN ")
                .with(|s| B::in_list(s, except)),
        }
        .sql(")")
    };
    let statement = match tenant {
        None => tenants(Statement::new("SELECT "), None),
        Some(_) => {
            let mut statement = Statement::<B>::new("SELECT EXISTS (SELECT 1 FROM ")
                .sql(B::CLAIM_INDEX)
                .sql(" WHERE tenant IS NULL AND state = 'pending' AND run_at <= ")
                .sql(B::NOW)
                .sql(")");
            for op in B::OTHER_THAN {
                statement = tenants(statement.sql(" OR "), Some(op));
            }
            statement
        }
    };
    statement.sql(" AS found")
}

/// A row of a statement of whether something exists.
#[derive(diesel::QueryableByName)]
pub(super) struct Found {
    #[diesel(sql_type = BigInt)]
    found: i64,
}

impl Found {
    /// Whether it does.
    pub(super) fn found(&self) -> bool {
        self.found != 0
    }
}

/// Appends, after a `FROM`, the suspects' index's first due task in claim order, of no
/// tenant in `except`.
pub(super) fn first_suspect<B: FairSql>(
    statement: Statement<B>,
    except: Option<&B::List>,
    due: &DueList<B>,
) -> Statement<B> {
    let statement = statement
        .sql(B::SUSPECT_INDEX)
        .sql(" WHERE ")
        .sql(B::SUSPECT_PENDING);
    let statement = match except {
        None => statement,
        Some(except) => statement
            .sql(" AND (tenant IS NULL OR tenant NOT IN ")
            .with(|s| B::in_list(s, except))
            .sql(")"),
    };
    due_for(statement, due).sql(" ORDER BY priority, run_at, id LIMIT 1")
}

/// Whether a suspect is pending: one row of [`Found`].
pub(super) fn suspects_exist<B: FairSql>() -> Statement<B> {
    Statement::new("SELECT EXISTS (SELECT 1 FROM ")
        .sql(B::SUSPECT_INDEX)
        .sql(" WHERE ")
        .sql(B::SUSPECT_PENDING)
        .sql(") AS found")
}

/// The page a claim of SQLite or MySQL takes as `pick` says, in the claim's transaction: a
/// solo claim takes its participant's first due tasks (`solo`) and, when asked to or when it
/// found none, probes for another participant; a fair claim walks the ring for the shares and
/// takes the page from them (`shared`), or the tasks without a tenant alone as a solo claim
/// does. `solo` and `shared` take the rows the backend's way (stamped, or leased).
pub(super) fn choose_page<B: FairSql, C: LoadConnection<Backend = B>>(
    conn: &mut C,
    claim: &Claiming<'_>,
    pick: &Pick<'_>,
    due: &DueList<B>,
    mut solo: impl FnMut(&mut C, Option<&str>) -> QueryResult<Vec<ClaimRow>>,
    shared: impl FnOnce(&mut C, &[Share]) -> QueryResult<Vec<ClaimRow>>,
) -> QueryResult<Picked>
where
    String: ToSql<Text, B>,
    i64: ToSql<BigInt, B>,
    Statement<B>: for<'q> LoadQuery<'q, C, ShareRow> + for<'q> LoadQuery<'q, C, Found>,
{
    let except = (!claim.except.is_empty()).then(|| B::list(claim.except));
    let (after, lap, passes) = match pick {
        Pick::Fair { after, lap, passes } => (after, lap, passes),
        Pick::Solo { tenant, probe } => {
            let rows = solo(conn, *tenant)?;
            let crowded = (*probe || rows.is_empty())
                && others_pending(*tenant, except.as_ref())
                    .get_result::<Found>(conn)?
                    .found();
            return Ok(Picked {
                weights: vec![(tenant.map(str::to_owned), 1)],
                rows,
                crowded,
                ring_end: None,
                ring_cut: false,
                shared: Vec::new(),
                unconfirmed: None,
            });
        }
    };
    let limit = claim.limit;
    let (shares, ring_end, ring_cut) = shares_of(
        shares_statement("", due, except.as_ref(), (after, lap), limit).load(conn)?,
        passes,
        limit,
    );
    let rows = match shares.as_slice() {
        [] => Vec::new(),
        [only] if only.tenant.is_none() => solo(conn, None)?,
        _ => shared(conn, &shares)?,
    };
    Ok(picked(rows, &shares, ring_end, ring_cut))
}

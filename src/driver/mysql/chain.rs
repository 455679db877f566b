//! Chains on MySQL (docs/guide/src/chains.md): what the other backends' triggers on `async_task`
//! do when a parent finishes, done by the driver in the transaction of the change. MySQL
//! forbids a trigger to change the table whose statement fired it (error 1442), so a
//! parent's completion cannot release its children from a trigger on `async_task` (linking
//! is a trigger on `async_task_parent`, which may). Children are found through
//! `async_task_parent` (a producer's `parent_id` shorthand links there but cannot set the
//! parent's `has_children`), and locked in id order before they change, as on PostgreSQL:
//! two parents finishing at once that share children wait for each other instead of
//! deadlocking.

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::sql_types::Text;
use diesel::{QueryResult, RunQueryDsl};

use super::{list, load_ids};
use crate::sql::Statement;

/// Releases the children of `parents` (tasks that have just become done, in this
/// transaction): each blocked child waits for as many parents fewer as it has among them,
/// and is pending once it waits for none.
pub(crate) fn release_children(conn: &mut MysqlConnection, parents: &[i64]) -> QueryResult<()> {
    if parents.is_empty() {
        return Ok(());
    }
    let linked = children_of(conn, parents, "")?;
    let children = lock_by_key(conn, &linked, |s| s.sql("state = 'blocked'"))?;
    if children.is_empty() {
        return Ok(());
    }
    // MySQL assigns SET's columns left to right, each seeing the ones before: the state is
    // decided on the count of parents before it is lowered.
    let done_parents = |s: Statement<Mysql>| {
        s.sql(
            "(SELECT count(*) FROM async_task_parent l
               WHERE l.child_id = async_task.id AND l.parent_id IN ",
        )
        .with(|s| list::ids(s, parents))
        .sql(")")
    };
    Statement::<Mysql>::new("UPDATE async_task SET state = CASE WHEN blocked_by <= ")
        .with(done_parents)
        .sql(" THEN 'pending' ELSE 'blocked' END, blocked_by = blocked_by - ")
        .with(done_parents)
        .sql(concat!(
            ", updated_at = ",
            now!(),
            " WHERE state = 'blocked' AND id IN "
        ))
        .with(|s| list::ids(s, &children))
        .execute(conn)?;
    Ok(())
}

/// Locks the tasks `ids` that still match `test`, through the primary key in id order, and
/// returns them. The children's ids come from `async_task_parent` without locks (rescue's
/// from a read without locks too), and the lock is taken by key whatever plan the optimizer
/// would pick for a join: one that reached the tasks through an index on their state would
/// lock that index's entry before the row, and a completion, which holds the row and then
/// changes that entry, deadlocks with it (as rescue did). For a completion's children, a
/// link added meanwhile waits for the parent's row, which the completion has changed, and
/// then finds the parent done.
pub(super) fn lock_by_key(
    conn: &mut MysqlConnection,
    ids: &[i64],
    test: impl FnOnce(Statement<Mysql>) -> Statement<Mysql>,
) -> QueryResult<Vec<i64>> {
    lock_by_key_or(conn, ids, test, OnLocked::Wait)
}

/// What a locking read does with a row another transaction holds.
#[derive(Clone, Copy)]
pub(super) enum OnLocked {
    /// Waits for it, then reads it as that transaction left it.
    Wait,
    /// Passes it over (rescue: a row held is a completion under way, or one frozen midway,
    /// whose locks last as long as its session; waiting for it held up every other rescue).
    Skip,
}

impl OnLocked {
    /// The locking clause.
    pub(super) fn clause(self) -> &'static str {
        match self {
            OnLocked::Wait => " FOR UPDATE",
            OnLocked::Skip => " FOR UPDATE SKIP LOCKED",
        }
    }
}

/// [`lock_by_key`], a row another transaction holds waited for or passed over.
pub(super) fn lock_by_key_or(
    conn: &mut MysqlConnection,
    ids: &[i64],
    test: impl FnOnce(Statement<Mysql>) -> Statement<Mysql>,
    on_locked: OnLocked,
) -> QueryResult<Vec<i64>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let statement =
        Statement::<Mysql>::new("SELECT id FROM async_task FORCE INDEX (PRIMARY) WHERE id IN ");
    let statement = list::ids(statement, ids).sql(" AND ").with(test);
    load_ids(conn, statement.sql(" ORDER BY id").sql(on_locked.clause()))
}

/// Cancels the blocked and pending descendants of `root` (not `root` itself), however deep
/// the tree, saying `why`.
///
/// The tree is read ([`descendants`]), then its unfinished tasks are locked by key and
/// cancelled; then read again, until a reading finds nothing left to cancel. A child linked
/// under a descendant while this runs either committed before that descendant was locked
/// (the next reading sees it) or waits for the lock and then finds its parent cancelled (its
/// link trigger cancels it).
pub(crate) fn cancel_descendants(
    conn: &mut MysqlConnection,
    root: i64,
    why: &str,
) -> QueryResult<usize> {
    let mut cancelled = 0;
    loop {
        let tree = descendants(conn, root)?;
        let ids = lock_by_key(conn, &tree, |s| s.sql("state IN ('blocked', 'pending')"))?;
        if ids.is_empty() {
            return Ok(cancelled);
        }
        cancelled += Statement::<Mysql>::new(concat!(
            "UPDATE async_task SET state = 'cancelled', finished_at = ",
            now!(),
            ", updated_at = ",
            now!(),
            ", last_error = "
        ))
        .bind::<Text, _>(why.to_owned())
        .sql(" WHERE state IN ('blocked', 'pending') AND id IN ")
        .with(|s| list::ids(s, &ids))
        .execute(conn)?;
    }
}

/// Every task below `root` in the chains, read a generation at a time with locking reads
/// (`LOCK IN SHARE MODE`), which see the newest committed links whatever the transaction's
/// isolation: a plain read of a REPEATABLE READ transaction (MySQL's default, and the
/// caller's connection may run at it) would see its snapshot's links on every reading, and
/// miss a child linked after it. (MariaDB refuses a locking clause inside a recursive CTE,
/// and one on its outer query still reads the snapshot's links, as tried on 10.11: hence a
/// generation at a time.) The links read stay share-locked until the transaction ends, as
/// the tasks cancelled stay locked.
fn descendants(conn: &mut MysqlConnection, root: i64) -> QueryResult<Vec<i64>> {
    let mut seen: std::collections::BTreeSet<i64> = std::collections::BTreeSet::new();
    let mut generation = vec![root];
    while !generation.is_empty() {
        generation = children_of(conn, &generation, " LOCK IN SHARE MODE")?
            .into_iter()
            .filter(|&id| seen.insert(id))
            .collect();
    }
    Ok(seen.into_iter().collect())
}

/// The children of `parents`, each once, read from their links with `lock` appended (empty,
/// or the locking clause of [`descendants`]).
fn children_of(
    conn: &mut MysqlConnection,
    parents: &[i64],
    lock: &'static str,
) -> QueryResult<Vec<i64>> {
    let statement = Statement::<Mysql>::new(
        "SELECT DISTINCT child_id AS id FROM async_task_parent WHERE parent_id IN ",
    );
    load_ids(conn, list::ids(statement, parents).sql(lock))
}

/// Cancels the descendants of each of `roots`, tasks that have just ended dead or cancelled
/// (`state`), as [`cancel_descendants`] does.
pub(crate) fn cancel_descendants_of(
    conn: &mut MysqlConnection,
    roots: &[i64],
    state: &str,
) -> QueryResult<()> {
    if roots.is_empty() {
        return Ok(());
    }
    // Only the roots that are anyone's parent: one index read for all of them (a locking
    // read: the newest links, as `descendants` reads them).
    let statement = Statement::<Mysql>::new(
        "SELECT DISTINCT parent_id AS id FROM async_task_parent WHERE parent_id IN ",
    );
    let statement = list::ids(statement, roots).sql(" ORDER BY parent_id LOCK IN SHARE MODE");
    for parent in load_ids(conn, statement)? {
        cancel_descendants(conn, parent, &format!("parent task {parent} is {state}"))?;
    }
    Ok(())
}

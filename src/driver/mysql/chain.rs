//! Chains on MySQL (README, "Chains"): what the other backends' triggers do, done by the
//! driver in the transaction of the change that causes it. MySQL forbids a trigger to change
//! the table whose statement fired it (error 1442), so a parent's completion cannot release
//! its children from a trigger on `async_task`. Children are found through
//! `async_task_parent` (a producer's `parent_id` shorthand links there, but cannot set the
//! parent's `has_children`), and locked in id order before they change, as on PostgreSQL:
//! two parents finishing at once that share children wait for each other instead of
//! deadlocking.

use diesel::mysql::{Mysql, MysqlConnection};
use diesel::result::{DatabaseErrorKind, Error};
use diesel::sql_types::{BigInt, Text};
use diesel::{QueryResult, QueryableByName, RunQueryDsl};

use super::list;
use crate::sql::Statement;

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// Releases the children of `parents` (tasks that have just become done, in this
/// transaction): each blocked child waits for as many parents fewer as it has among them,
/// and is pending once it waits for none.
pub(crate) fn release_children(conn: &mut MysqlConnection, parents: &[i64]) -> QueryResult<()> {
    if parents.is_empty() {
        return Ok(());
    }
    let children: Vec<Id> = Statement::<Mysql>::new(
        "SELECT id FROM async_task WHERE state = 'blocked' AND id IN
           (SELECT child_id FROM async_task_parent WHERE parent_id IN ",
    )
    .with(|s| list::ids(s, parents))
    .sql(") ORDER BY id FOR UPDATE")
    .load(conn)?;
    if children.is_empty() {
        return Ok(());
    }
    let children: Vec<i64> = children.into_iter().map(|c| c.id).collect();
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

/// Cancels the blocked and pending descendants of `root` (not `root` itself), however deep
/// the tree, saying `why`.
pub(crate) fn cancel_descendants(
    conn: &mut MysqlConnection,
    root: i64,
    why: &str,
) -> QueryResult<usize> {
    let descendants: Vec<Id> = Statement::<Mysql>::new(
        "WITH RECURSIVE d (id) AS (
             SELECT child_id FROM async_task_parent WHERE parent_id = ",
    )
    .bind::<BigInt, _>(root)
    .sql(
        "
             UNION
             SELECT l.child_id FROM async_task_parent l JOIN d ON l.parent_id = d.id)
         SELECT id FROM async_task WHERE state IN ('blocked', 'pending')
            AND id IN (SELECT id FROM d) ORDER BY id FOR UPDATE",
    )
    .load(conn)?;
    if descendants.is_empty() {
        return Ok(0);
    }
    let ids: Vec<i64> = descendants.into_iter().map(|d| d.id).collect();
    Statement::<Mysql>::new(concat!(
        "UPDATE async_task SET state = 'cancelled', finished_at = ",
        now!(),
        ", updated_at = ",
        now!(),
        ", last_error = "
    ))
    .bind::<Text, _>(why.to_owned())
    .sql(" WHERE state IN ('blocked', 'pending') AND id IN ")
    .with(|s| list::ids(s, &ids))
    .execute(conn)
}

/// Links each `(child, parent)` of `links` (in parent order), as the other backends'
/// trigger on `async_task_parent` does: the parents are locked (a completion of one waits
/// for this transaction, and then sees the link) and marked as having children; a child
/// waits for an unfinished parent, is cancelled with its descendants by a dead or cancelled
/// one, and is left as it is by a done one. A link that exists already changes nothing.
/// Returns the links inserted.
pub(crate) fn link_parents(conn: &mut MysqlConnection, links: &[(i64, i64)]) -> QueryResult<usize> {
    #[derive(QueryableByName)]
    struct Task {
        #[diesel(sql_type = BigInt)]
        id: i64,
        #[diesel(sql_type = Text)]
        state: String,
    }
    let mut parents: Vec<i64> = links.iter().map(|&(_, p)| p).collect();
    parents.sort_unstable();
    parents.dedup();
    let locked: Vec<Task> =
        Statement::<Mysql>::new("SELECT id, state FROM async_task WHERE id IN ")
            .with(|s| list::ids(s, &parents))
            .sql(" ORDER BY id FOR UPDATE")
            .load(conn)?;
    if let Some(missing) = parents.iter().find(|p| !locked.iter().any(|t| t.id == **p)) {
        return Err(refused(
            DatabaseErrorKind::ForeignKeyViolation,
            format!("async_task_parent: parent task {missing} does not exist"),
        ));
    }
    Statement::<Mysql>::new(
        "UPDATE async_task SET has_children = TRUE WHERE has_children = FALSE AND id IN ",
    )
    .with(|s| list::ids(s, &parents))
    .execute(conn)?;
    let mut inserted = 0;
    for &(child, parent) in links {
        // Both as they are now: an earlier link of this call may have changed either.
        let tasks: Vec<Task> =
            Statement::<Mysql>::new("SELECT id, state FROM async_task WHERE id IN (")
                .bind::<BigInt, _>(child)
                .sql(", ")
                .bind::<BigInt, _>(parent)
                .sql(") ORDER BY id FOR UPDATE")
                .load(conn)?;
        let find = |id: i64| tasks.iter().find(|t| t.id == id);
        let parent_state = find(parent).map_or("", |t| t.state.as_str()).to_owned();
        let child_state = match find(child) {
            Some(t) if ["pending", "blocked", "cancelled"].contains(&t.state.as_str()) => {
                t.state.clone()
            }
            _ => {
                return Err(refused(
                    DatabaseErrorKind::CheckViolation,
                    format!(
                        "async_task_parent: child task {child} does not exist or has started \
                         (a parent is added before its child starts)"
                    ),
                ))
            }
        };
        let linked =
            Statement::<Mysql>::new("INSERT INTO async_task_parent (child_id, parent_id) VALUES (")
                .bind::<BigInt, _>(child)
                .sql(", ")
                .bind::<BigInt, _>(parent)
                .sql(")")
                .execute(conn);
        match linked {
            Ok(_) => inserted += 1,
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => continue,
            Err(e) => return Err(e),
        }
        let set_parent = |head: &'static str| {
            Statement::<Mysql>::new(head)
                .bind::<BigInt, _>(parent)
                .sql(") WHERE id = ")
                .bind::<BigInt, _>(child)
        };
        if child_state == "cancelled" || parent_state == "done" {
            set_parent("UPDATE async_task SET parent_id = COALESCE(parent_id, ").execute(conn)?;
        } else if parent_state == "dead" || parent_state == "cancelled" {
            let why = format!("parent task {parent} is {parent_state}");
            Statement::<Mysql>::new(concat!(
                "UPDATE async_task SET state = 'cancelled', finished_at = ",
                now!(),
                ", updated_at = ",
                now!(),
                ", last_error = "
            ))
            .bind::<Text, _>(why.clone())
            .sql(", parent_id = COALESCE(parent_id, ")
            .bind::<BigInt, _>(parent)
            .sql(") WHERE id = ")
            .bind::<BigInt, _>(child)
            .execute(conn)?;
            cancel_descendants(conn, child, &why)?;
        } else {
            set_parent(
                "UPDATE async_task SET state = 'blocked', blocked_by = blocked_by + 1, \
                 parent_id = COALESCE(parent_id, ",
            )
            .execute(conn)?;
        }
    }
    Ok(inserted)
}

fn refused(kind: DatabaseErrorKind, message: String) -> Error {
    Error::DatabaseError(kind, Box::new(message))
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
    // Only the roots that are anyone's parent: one index read for all of them.
    let parents: Vec<Id> = Statement::<Mysql>::new(
        "SELECT DISTINCT parent_id AS id FROM async_task_parent WHERE parent_id IN ",
    )
    .with(|s| list::ids(s, roots))
    .sql(" ORDER BY parent_id")
    .load(conn)?;
    for parent in parents {
        cancel_descendants(
            conn,
            parent.id,
            &format!("parent task {} is {state}", parent.id),
        )?;
    }
    Ok(())
}

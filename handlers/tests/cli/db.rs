//! Looking into databases: the test database and the ones the binary made by itself.

use diesel::prelude::*;
use diesel::sql_types::BigInt;
use outbox::DatabaseUrl;

use crate::support::TestDb;

/// `SELECT (sql)` as a number, on a database that is not a [`TestDb`].
pub fn count_at(url: &str, sql: &str) -> i64 {
    #[derive(QueryableByName)]
    struct N {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut conn = DatabaseUrl::parse(url)
        .expect("database url")
        .connect()
        .expect("connect");
    let row: N = diesel::sql_query(format!("SELECT ({sql}) AS n"))
        .get_result(&mut conn)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    row.n
}

/// Tasks in `state`.
pub fn tasks_in(db: &TestDb, state: &str) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM async_task WHERE state = '{state}'"
    ))
}

/// Undoes the migrations the [`TestDb`] applied, leaving a database `outbox migrate` has
/// never touched.
pub fn unmigrate(db: &TestDb) {
    db.exec(
        "DROP TABLE async_task_parent; DROP TABLE async_task; DROP TABLE async_node; DROP TABLE async_tenant; DROP TABLE async_domain; DROP TABLE async_pause; \
         DROP TABLE async_audit; DROP TABLE async_schedule; DROP TABLE IF EXISTS async_lease; DROP TABLE IF EXISTS async_tenant_late_enqueue; \
         DROP TABLE __diesel_schema_migrations;",
    );
}

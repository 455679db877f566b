//! `src/schema.rs` agrees with each backend's migrations: a fresh database, migrated, has
//! exactly the tables and columns that `table!` declares, each column with the declared
//! nullability and a type the declared SQL type loads on that backend. A migration that adds,
//! drops or renames a column, or a declaration that drifts, fails here.

use std::any::type_name;
use std::collections::BTreeMap;

use diesel::debug_query;
use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::sql_types::Text;
use outbox::schema::*;
use outbox::Backend;

use crate::support::TestDb;

/// What `table!` or a catalogue says of one column.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Column {
    nullable: bool,
    /// Declared: the diesel SQL type's name (`BigInt`, `Timestamp`, …). In a catalogue: the
    /// backend's own type name.
    sql_type: String,
}

/// Table → column → what is said of it.
type Tables = BTreeMap<String, BTreeMap<String, Column>>;

/// Declared tables and columns that exist on one backend only, for that backend's own
/// mechanism (`table` or `table.column`).
const ONLY_ON: &[(&str, Backend)] = &[
    ("async_lock", Backend::Mysql),
    ("async_tenant_late_enqueue", Backend::Mysql),
    ("async_tenant.enqueue_seq", Backend::Mysql),
    // MySQL's stand-ins for partial indexes (generated, never written).
    ("async_task.pending_tenant", Backend::Mysql),
    ("async_task.pending_suspect", Backend::Mysql),
];

/// Declared tables that exist on every backend but one: the leases of lock claims, which
/// SQLite has not.
const NOT_ON: &[(&str, Backend)] = &[("async_lease", Backend::Sqlite)];

/// JSON columns: `jsonb` on PostgreSQL, declared `Text` (see src/schema.rs).
const JSON_ON_POSTGRES: &[&str] = &["async_audit.detail", "async_task.biz_data"];

/// Tables in a migrated test database that are not the outbox's.
const NOT_OURS: &[&str] = &[
    "__diesel_schema_migrations",
    "sqlite_sequence",
    "test_ledger",
];

/// The tables of `src/schema.rs`, each read through diesel: its columns' names from the SQL
/// of `SELECT all_columns`, their SQL types from the table's `SqlType`.
macro_rules! declared {
    ($($table:ident),* $(,)?) => {{
        let mut tables = Tables::new();
        $(
            let sql = debug_query::<Pg, _>(&$table::table.select($table::all_columns)).to_string();
            let types = type_name::<<$table::table as diesel::query_builder::AsQuery>::SqlType>();
            tables.insert(stringify!($table).to_owned(), declared_columns(&sql, types));
        )*
        tables
    }};
}

fn declared() -> Tables {
    let tables = declared!(
        async_audit,
        async_domain,
        async_lease,
        async_lock,
        async_node,
        async_pause,
        async_schedule,
        async_task,
        async_task_parent,
        async_tenant,
        async_tenant_late_enqueue,
    );
    // A table added to src/schema.rs is added to the list above too.
    let in_file: Vec<&str> = include_str!("../../src/schema.rs")
        .split("diesel::table! {")
        .skip(1)
        .map(|block| {
            let line = block
                .lines()
                .find(|l| l.trim_end().ends_with(") {"))
                .expect("a table! block names its table");
            line.trim().split([' ', '(']).next().expect("table name")
        })
        .collect();
    assert_eq!(
        in_file,
        tables.keys().map(String::as_str).collect::<Vec<_>>(),
        "the tables of src/schema.rs (in its order) and the list in this test"
    );
    tables
}

/// The columns of one declared table, from `SELECT "t"."a", "t"."b" FROM "t"` and the type
/// name of `(A, Nullable<B>)`.
fn declared_columns(select_sql: &str, types: &str) -> BTreeMap<String, Column> {
    let list = select_sql
        .strip_prefix("SELECT ")
        .and_then(|s| s.split(" FROM ").next())
        .unwrap_or_else(|| panic!("unexpected SQL {select_sql}"));
    let names: Vec<String> = list
        .split(", ")
        .map(|c| {
            c.rsplit('.')
                .next()
                .expect("column")
                .trim_matches('"')
                .to_owned()
        })
        .collect();
    let sql_types: Vec<&str> = types
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .unwrap_or_else(|| panic!("unexpected SqlType {types}"))
        .split(", ")
        .map(|t| t.trim_end_matches(','))
        .collect();
    assert_eq!(
        names.len(),
        sql_types.len(),
        "every column of {select_sql} has a type in {types}"
    );
    let columns: BTreeMap<String, Column> = names
        .into_iter()
        .zip(sql_types)
        .map(|(name, sql_type)| {
            let (nullable, inner) = match sql_type.split_once("Nullable<") {
                Some((_, inner)) => (true, inner.trim_end_matches('>')),
                None => (false, sql_type),
            };
            let sql_type = inner.rsplit("::").next().expect("type name").to_owned();
            (name, Column { nullable, sql_type })
        })
        .collect();
    columns
}

#[derive(QueryableByName)]
struct CatalogueRow {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    column_name: String,
    /// `YES` or `NO`.
    #[diesel(sql_type = Text)]
    is_nullable: String,
    #[diesel(sql_type = Text)]
    data_type: String,
}

/// The tables and columns of the test database, as its catalogue lists them.
fn catalogue(db: &TestDb) -> Tables {
    let sql = match db.backend() {
        Backend::Postgres => {
            "SELECT table_name::text AS table_name, column_name::text AS column_name,
                    is_nullable::text AS is_nullable, data_type::text AS data_type
               FROM information_schema.columns WHERE table_schema = current_schema()"
        }
        Backend::Mysql => {
            "SELECT table_name AS table_name, column_name AS column_name,
                    is_nullable AS is_nullable, data_type AS data_type
               FROM information_schema.columns WHERE table_schema = DATABASE()"
        }
        // An INTEGER PRIMARY KEY is the rowid, never null, though table_info says nullable.
        Backend::Sqlite => {
            "SELECT m.name AS table_name, p.name AS column_name,
                    CASE WHEN p.\"notnull\" = 0 AND NOT (p.pk = 1 AND p.type = 'INTEGER')
                         THEN 'YES' ELSE 'NO' END AS is_nullable,
                    p.type AS data_type
               FROM sqlite_master m, pragma_table_info(m.name) p WHERE m.type = 'table'"
        }
    };
    let rows: Vec<CatalogueRow> = diesel::sql_query(sql)
        .load(&mut db.conn())
        .expect("read the catalogue");
    let mut tables = Tables::new();
    for row in rows {
        if NOT_OURS.contains(&row.table_name.as_str()) {
            continue;
        }
        let column = Column {
            nullable: row.is_nullable == "YES",
            sql_type: row.data_type,
        };
        tables
            .entry(row.table_name)
            .or_default()
            .insert(row.column_name, column);
    }
    tables
}

/// Whether a column the backend stores as `found` is loaded by the declared SQL type.
fn loads(backend: Backend, json: bool, declared: &str, found: &str) -> bool {
    match backend {
        // PostgreSQL's loads check the width of integers.
        Backend::Postgres => {
            matches!(
                (declared, found),
                ("BigInt", "bigint")
                    | ("Integer", "integer")
                    | ("SmallInt", "smallint")
                    | ("Bool", "boolean")
                    | ("Text", "text")
                    | ("Timestamp", "timestamp with time zone")
            ) || (json && declared == "Text" && found == "jsonb")
        }
        // SQLite's INTEGER is 64-bit and holds flags as 0/1; its times are text.
        Backend::Sqlite => match declared {
            "BigInt" | "Integer" | "SmallInt" | "Bool" => found == "INTEGER",
            "Text" | "Timestamp" => found == "TEXT",
            _ => false,
        },
        // MySQL's loads narrow an integer that fits (priority is INT there, SMALLINT on
        // PostgreSQL).
        Backend::Mysql => match declared {
            "BigInt" => found == "bigint",
            "Integer" => found == "int",
            "SmallInt" => matches!(found, "smallint" | "int"),
            "Bool" => found == "tinyint",
            "Text" => matches!(found, "varchar" | "text" | "longtext"),
            "Timestamp" => found == "datetime",
            _ => false,
        },
    }
}

/// What src/schema.rs declares for `backend`: without what is another backend's only, or
/// what it has not.
fn declared_for(backend: Backend) -> Tables {
    let mut tables = declared();
    for (name, on) in ONLY_ON {
        if *on == backend {
            continue;
        }
        match name.split_once('.') {
            Some((table, column)) => {
                let columns = tables
                    .get_mut(table)
                    .expect("ONLY_ON names a declared table");
                columns
                    .remove(column)
                    .expect("ONLY_ON names a declared column");
            }
            None => {
                tables
                    .remove(*name)
                    .expect("ONLY_ON names a declared table");
            }
        }
    }
    for (name, on) in NOT_ON {
        if *on == backend {
            tables.remove(*name).expect("NOT_ON names a declared table");
        }
    }
    tables
}

every_backend! {
    fn schema_rs_matches_the_migrations(db: &TestDb) {
        let backend = db.backend();
        let declared = declared_for(backend);
        let found = catalogue(db);
        let mut problems = Vec::new();
        for table in declared.keys().filter(|t| !found.contains_key(*t)) {
            problems.push(format!("{table}: declared, not in the database"));
        }
        for table in found.keys().filter(|t| !declared.contains_key(*t)) {
            problems.push(format!("{table}: in the database, not declared"));
        }
        for (table, columns) in &declared {
            let Some(found) = found.get(table) else { continue };
            for name in columns.keys().filter(|c| !found.contains_key(*c)) {
                problems.push(format!("{table}.{name}: declared, not in the database"));
            }
            for name in found.keys().filter(|c| !columns.contains_key(*c)) {
                problems.push(format!("{table}.{name}: in the database, not declared"));
            }
            for (name, column) in columns {
                let Some(stored) = found.get(name) else { continue };
                let json = JSON_ON_POSTGRES.contains(&format!("{table}.{name}").as_str());
                if column.nullable != stored.nullable
                    || !loads(backend, json, &column.sql_type, &stored.sql_type)
                {
                    problems.push(format!(
                        "{table}.{name}: declared {}{}, stored {}{}",
                        column.sql_type,
                        if column.nullable { " (nullable)" } else { "" },
                        stored.sql_type,
                        if stored.nullable { " (nullable)" } else { "" },
                    ));
                }
            }
        }
        assert!(
            problems.is_empty(),
            "src/schema.rs and the {} migrations differ:\n  {}",
            backend.name(),
            problems.join("\n  ")
        );
    }
}

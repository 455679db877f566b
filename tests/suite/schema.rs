//! The schema refuses what the API refuses: a producer's plain INSERT, in any language, is held
//! to the same rules as `enqueue`. Each rule is tried through the API and through raw SQL, at
//! its boundary (accepted by both) and past it (refused by both).

use std::time::Duration;

use diesel::prelude::*;
use outbox::{enqueue, Backend, EnqueueOptions, Error, NewTask};

use crate::support::TestDb;

/// A plain `INSERT` of one task as a producer in another language writes it: `columns` and
/// `values` are SQL text. `Err` holds the database's message.
fn raw_insert(db: &TestDb, columns: &str, values: &str) -> Result<(), String> {
    diesel::sql_query(format!(
        "INSERT INTO async_task (keyword, biz_id{columns}) VALUES ({values})"
    ))
    .execute(&mut db.conn())
    .map(|_| ())
    .map_err(|e| e.to_string())
}

fn refused(db: &TestDb, what: &str, columns: &str, values: &str) {
    assert!(
        raw_insert(db, columns, values).is_err(),
        "the database accepted {what}: ({columns}) = ({values})"
    );
}

fn accepted(db: &TestDb, what: &str, columns: &str, values: &str) {
    if let Err(e) = raw_insert(db, columns, values) {
        panic!("the database refused {what}: {e}");
    }
}

fn api(db: &TestDb, task: NewTask) -> outbox::Result<outbox::Enqueued> {
    enqueue(&mut db.conn(), &task)
}

/// SQL for a string of `n` copies of `c` (no literal of 64 KiB in the statement text).
fn repeat_sql(db: &TestDb, c: char, n: usize) -> String {
    match db.backend() {
        Backend::Postgres => format!("repeat('{c}', {n})"),
        Backend::Sqlite => format!("replace(printf('%.{n}c', 'x'), 'x', '{c}')"),
        Backend::Mysql => format!("REPEAT('{c}', {n})"),
    }
}

/// SQL that appends a NUL character to `text` (PostgreSQL cannot even express one).
fn with_nul(db: &TestDb, text: &str) -> String {
    match db.backend() {
        Backend::Postgres => format!("'{text}' || chr(0)"),
        Backend::Sqlite => format!("'{text}' || char(0)"),
        Backend::Mysql => format!("CONCAT('{text}', CHAR(0))"),
    }
}

/// The SQL of the time `seconds` from now, in the backend's stored form.
fn time_from_now(db: &TestDb, seconds: i64) -> String {
    match db.backend() {
        Backend::Postgres => format!("now() + {seconds} * interval '1 second'"),
        Backend::Sqlite => {
            format!("strftime('%Y-%m-%d %H:%M:%f', 'now', '{seconds:+} seconds')")
        }
        Backend::Mysql => format!("UTC_TIMESTAMP(3) + INTERVAL {seconds} SECOND"),
    }
}

const DAY: i64 = 86_400;

every_backend! {
    fn states_json_and_keyword_edges_hold_in_the_schema(db: &TestDb) {
        // A producer in another language inserts with plain SQL; the CHECK constraints hold
        // the same rules.
        let mut conn = db.conn();
        for bad in [
            "INSERT INTO async_task (keyword, biz_id) VALUES ('Bad Keyword', '1')",
            "INSERT INTO async_task (keyword, biz_id) VALUES ('k', '')",
            "INSERT INTO async_task (keyword, biz_id, state) VALUES ('k', '1', 'finished')",
            "INSERT INTO async_task (keyword, biz_id, biz_data) VALUES ('k', '1', 'not json')",
        ] {
            assert!(diesel::sql_query(bad).execute(&mut conn).is_err(), "{bad}");
        }
        diesel::sql_query("INSERT INTO async_task (keyword, biz_id, biz_data) VALUES ('points.credit', '42', '{\"user_id\": 7}')")
            .execute(&mut conn)
            .unwrap();
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'pending'"), 1);

        // The keyword rule, at its edges, is the same in the schema as in `enqueue`.
        let max = "k".repeat(64);
        let too_long = "k".repeat(65);
        for (n, keyword) in [
            "", "a", "a.b_c:d-9", &max, &too_long, "Upper", "a b", "a\nb", "a\n", "é", "a*", "a/b",
        ]
        .into_iter()
        .enumerate()
        {
            let sql = format!("INSERT INTO async_task (keyword, biz_id) VALUES ('{keyword}', 'edge-{n}')");
            let stored = diesel::sql_query(&sql).execute(&mut conn).is_ok();
            assert_eq!(stored, outbox::validate_keyword(keyword).is_ok(), "{keyword:?}");
        }
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE biz_id LIKE 'edge-%'"), 3);
    }

    fn keyword_rule_holds_in_the_schema(db: &TestDb) {
        for (keyword, sql) in [
            (String::new(), "''".to_owned()),
            ("a".repeat(65), format!("'{}'", "a".repeat(65))),
            ("Points".to_owned(), "'Points'".to_owned()),
            ("a b".to_owned(), "'a b'".to_owned()),
            ("a\0".to_owned(), with_nul(db, "a")),
        ] {
            assert!(
                matches!(api(db, NewTask::new(keyword.clone(), "1")), Err(Error::InvalidKeyword { .. })),
                "the API accepted keyword {keyword:?}"
            );
            refused(db, "a bad keyword", "", &format!("{sql}, '1'"));
        }
        let longest = "a".repeat(64);
        api(db, NewTask::new(longest.clone(), "api")).unwrap();
        accepted(db, "a 64-character keyword", "", &format!("'{longest}', 'sql'"));
    }

    fn biz_id_rule_holds_in_the_schema(db: &TestDb) {
        for (biz_id, sql) in [
            (String::new(), "''".to_owned()),
            ("é".repeat(65), format!("'{}'", "é".repeat(65))), // 130 bytes
            ("1\0".to_owned(), with_nul(db, "1")),
        ] {
            assert!(
                matches!(api(db, NewTask::new("k", biz_id.clone())), Err(Error::InvalidBizId { .. })),
                "the API accepted biz_id {biz_id:?}"
            );
            refused(db, "a bad biz_id", "", &format!("'k', {sql}"));
        }
        api(db, NewTask::new("k", "é".repeat(64))).unwrap();
        accepted(db, "a 128-byte biz_id", "", &format!("'sql', '{}'", "é".repeat(64)));
    }

    fn tenant_rule_holds_in_the_schema(db: &TestDb) {
        for (tenant, sql) in [
            (String::new(), "''".to_owned()),
            ("t".repeat(129), format!("'{}'", "t".repeat(129))),
            ("t\0".to_owned(), with_nul(db, "t")),
        ] {
            assert!(
                matches!(api(db, NewTask::new("k", "1").tenant(tenant.clone())), Err(Error::InvalidTask { .. })),
                "the API accepted tenant {tenant:?}"
            );
            refused(db, "a bad tenant", ", tenant", &format!("'k', '1', {sql}"));
        }
        api(db, NewTask::new("k", "api").tenant("t".repeat(128))).unwrap();
        accepted(db, "a 128-byte tenant", ", tenant", &format!("'k', 'sql', '{}'", "t".repeat(128)));
        accepted(db, "no tenant", ", tenant", "'k', 'none', NULL");
    }

    fn payload_size_rule_holds_in_the_schema(db: &TestDb) {
        // A JSON string of n characters is n + 2 bytes in both stored forms.
        let limit = 65_536;
        api(db, NewTask::new("k", "api").payload(&"x".repeat(limit - 2))).unwrap();
        assert!(matches!(
            api(db, NewTask::new("k", "api-big").payload(&"x".repeat(limit - 1))),
            Err(Error::PayloadTooLarge { size: 65_537, limit: 65_536, .. })
        ));
        let json = |n: usize| {
            let text = format!("'\"' || {} || '\"'", repeat_sql(db, 'x', n));
            match db.backend() {
                Backend::Postgres => format!("({text})::jsonb"),
                Backend::Sqlite | Backend::Mysql => text,
            }
        };
        accepted(db, "a 64 KiB payload", ", biz_data", &format!("'k', 'sql', {}", json(limit - 2)));
        refused(db, "a payload over 64 KiB", ", biz_data", &format!("'k', 'sql-big', {}", json(limit - 1)));
        refused(db, "a 70 KB payload", ", biz_data", &format!("'k', 'sql-70k', {}", json(70_000)));
        // An UPDATE is held to the same bound (on PostgreSQL by a trigger after the update,
        // which locks no row: migration 000017).
        let grow = format!("UPDATE async_task SET biz_data = {} WHERE biz_id = 'sql'", json(70_000));
        assert!(
            diesel::RunQueryDsl::execute(diesel::sql_query(grow), &mut db.conn()).is_err(),
            "an UPDATE made a payload over 64 KiB"
        );

        // PostgreSQL stores jsonb, whose text form has a space after each ',' and ':': the
        // API measures that form there, so both agree on a payload that is short as written.
        let ones = format!("[{}]", vec!["1"; 22_000].join(","));
        assert_eq!(ones.len(), 44_001);
        let by_api = api(db, NewTask::new("k", "ones").payload_json(ones.clone()));
        let by_sql = raw_insert(db, ", biz_data", &format!("'k', 'ones-sql', '{ones}'"));
        match db.backend() {
            Backend::Postgres => {
                assert!(
                    matches!(by_api, Err(Error::PayloadTooLarge { size: 66_000, .. })),
                    "{by_api:?}"
                );
                assert!(by_sql.is_err(), "PostgreSQL stored 66,000 bytes of jsonb text");
            }
            // The text as written, on both.
            Backend::Sqlite | Backend::Mysql => {
                by_api.unwrap();
                by_sql.unwrap();
            }
        }

        // A lowered limit is the API's own; a raised one would exceed the schema's.
        let small = EnqueueOptions::default().max_payload_bytes(10);
        assert!(matches!(
            small.enqueue(&mut db.conn(), &NewTask::new("k", "small").payload(&"x".repeat(9))),
            Err(Error::PayloadTooLarge { size: 11, limit: 10, .. })
        ));
        let large = EnqueueOptions::default().max_payload_bytes(limit + 1);
        assert!(matches!(
            large.enqueue(&mut db.conn(), &NewTask::new("k", "large")),
            Err(Error::InvalidConfig { setting: "max_payload_bytes", .. })
        ));
    }

    fn payload_measure_on_postgres_is_the_stored_one(db: &TestDb) {
        // Padding a varied payload (nesting, escapes, non-ASCII, numbers in every form
        // serde writes) to exactly the limit in the database's own count: the API accepts it,
        // and refuses it one byte longer.
        if db.backend() != Backend::Postgres {
            return;
        }
        let base = |pad: usize| {
            serde_json::json!({
                "nested": {"list": [1, -2, 3.5, 1e-7, 1e300, 0.1, null, true, false, [], {}]},
                "text": "tab\tquote\"back\\slash\u{1}é€😀/",
                "pad": "x".repeat(pad),
            })
        };
        #[derive(QueryableByName)]
        struct Len {
            #[diesel(sql_type = diesel::sql_types::Integer)]
            len: i32,
        }
        let stored = |value: &serde_json::Value| -> usize {
            let row: Len = diesel::sql_query("SELECT octet_length(($1)::jsonb::text) AS len")
                .bind::<diesel::sql_types::Text, _>(value.to_string())
                .get_result(&mut db.conn())
                .unwrap();
            row.len as usize
        };
        let pad = 65_536 - stored(&base(0));
        assert_eq!(stored(&base(pad)), 65_536);
        let id = api(db, NewTask::new("k", "exact").payload(&base(pad))).unwrap().id;
        assert_eq!(db.count(&format!("SELECT CAST(octet_length(biz_data::text) AS BIGINT) FROM async_task WHERE id = {id}")), 65_536);
        assert!(matches!(
            api(db, NewTask::new("k", "over").payload(&base(pad + 1))),
            Err(Error::PayloadTooLarge { size: 65_537, .. })
        ));
    }

    fn payload_shape_rule_holds_in_the_schema(db: &TestDb) {
        for (json, sql) in [
            ("{", "'{'".to_owned()),
            (r#"{"a":"\u0000"}"#, r#"'{"a":"\u0000"}'"#.to_owned()),
            (r#"{"a":"\\\u0000"}"#, r#"'{"a":"\\\u0000"}'"#.to_owned()),
            ("{}\0", with_nul(db, "{}")),
        ] {
            assert!(
                matches!(api(db, NewTask::new("k", "1").payload_json(json)), Err(Error::InvalidPayload { .. })),
                "the API accepted payload {json:?}"
            );
            refused(db, "a bad payload", ", biz_data", &format!("'k', '1', {sql}"));
        }
        // An escaped backslash followed by the text u0000 is no NUL.
        let text = r#"{"a":"\\u0000"}"#;
        api(db, NewTask::new("k", "api").payload_json(text)).unwrap();
        accepted(db, "a backslash before u0000", ", biz_data", &format!("'k', 'sql', '{text}'"));
    }

    fn priority_and_max_attempts_rules_hold_in_the_schema(db: &TestDb) {
        // The API's types (i16, i32 of at least 1) are the rule.
        assert!(matches!(
            api(db, NewTask::new("k", "1").max_attempts(0)),
            Err(Error::InvalidTask { .. })
        ));
        for (what, columns, value) in [
            ("priority 40000", ", priority", "40000"),
            ("priority -40000", ", priority", "-40000"),
            ("priority 'abc'", ", priority", "'abc'"),
            ("max_attempts 0", ", max_attempts", "0"),
            ("max_attempts 'abc'", ", max_attempts", "'abc'"),
            ("max_attempts 2^31", ", max_attempts", "2147483648"),
        ] {
            refused(db, what, columns, &format!("'k', '1', {value}"));
        }
        // A fraction: SQLite would store it as it is; PostgreSQL's assignment cast rounds it
        // to an integer before any check sees it (documented), so the column holds one.
        let fractions = ", priority, max_attempts";
        match db.backend() {
            Backend::Sqlite => {
                refused(db, "priority 2.5", ", priority", "'k', '1', 2.5");
                refused(db, "max_attempts 2.5", ", max_attempts", "'k', '1', 2.5");
            }
            // Both round a fraction given for an integer column before any check sees it.
            Backend::Postgres | Backend::Mysql => {
                accepted(db, "fractions", fractions, "'k', 'fractions', 2.5, 2.5");
                assert_eq!(db.count("SELECT count(*) FROM async_task WHERE priority = 3 AND max_attempts = 3"), 1);
            }
        }
        api(db, NewTask::new("k", "api").priority(i16::MIN).max_attempts(i32::MAX)).unwrap();
        accepted(db, "the extreme priority and max_attempts", ", priority, max_attempts", "'k', 'sql', 32767, 2147483647");
        accepted(db, "numbers written as text", ", priority, max_attempts", "'k', 'sql-text', '5', '3'");
    }

    fn run_at_rule_holds_in_the_schema(db: &TestDb) {
        let ten_years = Duration::from_secs(3650 * DAY as u64);
        api(db, NewTask::new("k", "api").delay(ten_years)).unwrap();
        assert!(matches!(
            api(db, NewTask::new("k", "api-late").delay(ten_years + Duration::from_secs(60))),
            Err(Error::InvalidTask { .. })
        ));
        accepted(db, "a run_at 3650 days ahead", ", run_at", &format!("'k', 'sql', {}", time_from_now(db, 3650 * DAY - 60)));
        refused(db, "a run_at 3650 days and a minute ahead", ", run_at", &format!("'k', 'sql-late', {}", time_from_now(db, 3650 * DAY + 60)));
        refused(db, "a run_at 20 years ahead", ", run_at", &format!("'k', 'sql-20y', {}", time_from_now(db, 7300 * DAY)));
        // A retry's backoff is not an enqueue: once a failure is counted, any run_at goes.
        db.exec(&format!(
            "UPDATE async_task SET failures = failures + 1, run_at = {} WHERE biz_id = 'sql'",
            time_from_now(db, 7300 * DAY)
        ));
    }

    fn time_text_rule_holds_in_the_schema(db: &TestDb) {
        // SQLite keeps times as text that must compare correctly with the engine's; PostgreSQL
        // parses any time it is given into a timestamptz.
        let (iso, no_millis) = ("'2026-01-02T03:04:05.678Z'", "'2026-01-02 03:04:05'");
        match db.backend() {
            Backend::Sqlite => {
                refused(db, "an ISO T run_at", ", run_at", &format!("'k', '1', {iso}"));
                refused(db, "a run_at without milliseconds", ", run_at", &format!("'k', '1', {no_millis}"));
                refused(db, "a run_at that is no time", ", run_at", "'k', '1', 'soon'");
                refused(db, "an ISO T created_at", ", created_at", &format!("'k', '1', {iso}"));
                accepted(db, "a run_at in the stored form", ", run_at", "'k', 'ok', '2026-01-02 03:04:05.678'");
            }
            Backend::Postgres => {
                accepted(db, "an ISO T run_at", ", run_at", &format!("'k', 'iso', {iso}"));
                assert_eq!(
                    db.count("SELECT count(*) FROM async_task WHERE run_at = '2026-01-02 03:04:05.678+00'"),
                    1
                );
            }
            // A DATETIME(3) column: a time, or an error in strict mode; times are UTC.
            Backend::Mysql => {
                refused(db, "a run_at that is no time", ", run_at", "'k', '1', 'soon'");
                accepted(db, "a run_at in the stored form", ", run_at", "'k', 'ok', '2026-01-02 03:04:05.678'");
                assert_eq!(
                    db.count("SELECT count(*) FROM async_task WHERE run_at = '2026-01-02 03:04:05.678'"),
                    1
                );
            }
        }
    }
}

// MySQL's migration tree starts at the schema the other two reach at their last version.
sqlite_and_postgres! {
    fn migration_000005_keeps_every_task_and_the_id_counter(db: &TestDb) {
        // Back to version 4, with tasks in several states; the newest is deleted (pruned), so
        // the id counter is ahead of the largest id. The later migrations go first (000005
        // rebuilds the table as it was at version 4), and come back after.
        let downs: &[&str] = match db.backend() {
            Backend::Postgres => &[
                include_str!("../../migrations/postgres/2026-11-28-000024_link_refuses_a_leased_child/down.sql"),
                include_str!("../../migrations/postgres/2026-11-26-000017_payload_check_after_update/down.sql"),
                include_str!("../../migrations/postgres/2026-11-26-000016_lease_by_task/down.sql"),
                include_str!("../../migrations/postgres/2026-11-25-000015_lease_claims/down.sql"),
                include_str!("../../migrations/postgres/2026-11-24-000010_task_chains/down.sql"),
                include_str!("../../migrations/postgres/2026-11-24-000005_task_rules/down.sql"),
            ],
            Backend::Sqlite => &[
                include_str!("../../migrations/sqlite/2026-11-27-000021_text_keys/down.sql"),
                include_str!("../../migrations/sqlite/2026-11-26-000020_state_check_by_comparisons/down.sql"),
                include_str!("../../migrations/sqlite/2026-11-25-000015_lease_claims/down.sql"),
                include_str!("../../migrations/sqlite/2026-11-24-000010_task_chains/down.sql"),
                include_str!("../../migrations/sqlite/2026-11-24-000005_task_rules/down.sql"),
            ],
            Backend::Mysql => unreachable!("not generated for MySQL"),
        };
        for down in downs {
            db.exec(down);
        }
        db.exec("DELETE FROM __diesel_schema_migrations WHERE version IN ('20261124000005', '20261124000010', '20261125000015', '20261126000016', '20261126000017', '20261126000020', '20261127000021', '20261128000024')");
        let mut conn = db.conn();
        for i in 0..5 {
            enqueue(&mut conn, &NewTask::new("k", i.to_string()).tenant("t").payload(&serde_json::json!({"i": i}))).unwrap();
        }
        db.exec("UPDATE async_task SET state = 'done' WHERE biz_id = '1'");
        db.exec("DELETE FROM async_task WHERE biz_id = '4'");

        let applied = outbox::run_migrations(&mut conn).unwrap();
        assert_eq!(applied.len(), downs.len(), "{applied:?}");
        assert_eq!(db.count("SELECT count(*) FROM async_task"), 4);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'done' AND biz_id = '1' AND tenant = 't'"), 1);
        let next = enqueue(&mut conn, &NewTask::new("k", "next")).unwrap();
        assert_eq!(next.id, 6, "an id is never handed out twice");
        // The rules are in force, and the claim's and the running tasks' indexes are there.
        refused(db, "an empty tenant", ", tenant", "'k', 'x', ''");
        let indexes = match db.backend() {
            Backend::Postgres => "SELECT count(*) FROM pg_indexes WHERE tablename = 'async_task'
                                  AND indexname IN ('async_task_claim_idx', 'async_task_owner_idx')",
            Backend::Sqlite => "SELECT count(*) FROM sqlite_master WHERE type = 'index'
                                AND name IN ('async_task_claim_idx', 'async_task_lease_idx')",
            Backend::Mysql => unreachable!("not generated for MySQL"),
        };
        assert_eq!(db.count(indexes), 2);
    }
}

/// Migration 000020 spells SQLite's state rule as comparisons, in place (an `IN` list of more
/// than two constants is a temporary b-tree that every statement checking the rule builds
/// again): on a file with a task in each state, every task stays, the file is sound, the rule
/// holds on a new connection and on one that read the schema before the migration.
#[test]
fn sqlite_state_rule_is_respelled_in_place_and_still_holds() {
    let db = &TestDb::sqlite();
    db.exec(include_str!(
        "../../migrations/sqlite/2026-11-26-000020_state_check_by_comparisons/down.sql"
    ));
    db.exec("DELETE FROM __diesel_schema_migrations WHERE version = '20261126000020'");
    let in_list = "SELECT count(*) FROM sqlite_schema WHERE name = 'async_task'
                   AND sql LIKE '%CHECK (state IN (%'";
    assert_eq!(db.count(in_list), 1, "down.sql spells the rule as the list");
    let states = ["pending", "running", "done", "dead", "cancelled", "blocked"];
    for state in states {
        accepted(
            db,
            "a known state",
            ", state",
            &format!("'k', 'before-{state}', '{state}'"),
        );
    }
    let mut before = db.conn();
    diesel::sql_query("UPDATE async_task SET state = 'done' WHERE id = -1")
        .execute(&mut before)
        .unwrap();
    let applied = outbox::run_migrations(&mut db.conn()).unwrap();
    assert_eq!(applied, ["20261126000020"]);
    assert_eq!(db.count(in_list), 0, "the rule is spelled as comparisons");
    assert_eq!(
        db.count("SELECT count(*) FROM pragma_integrity_check WHERE integrity_check = 'ok'"),
        1
    );
    for state in states {
        let n = format!(
            "SELECT count(*) FROM async_task WHERE biz_id = 'before-{state}' AND state = '{state}'"
        );
        assert_eq!(db.count(&n), 1, "{state}");
        accepted(
            db,
            "a known state",
            ", state",
            &format!("'k', 'after-{state}', '{state}'"),
        );
    }
    refused(db, "an unknown state", ", state", "'k', 'x', 'finished'");
    refused(
        db,
        "a state in another case",
        ", state",
        "'k', 'x', 'Pending'",
    );
    refused(db, "no state", ", state", "'k', 'x', NULL");
    let stale = diesel::sql_query(
        "INSERT INTO async_task (keyword, biz_id, state) VALUES ('k', 'x', 'finished')",
    )
    .execute(&mut before);
    assert!(
        stale.is_err(),
        "a connection that read the schema before the migration keeps the rule"
    );
    assert_eq!(db.count("SELECT count(*) FROM async_task"), 12);
}

/// On MariaDB the engine's claims, completions and rescue charges run without the table's
/// CHECKs: MariaDB evaluates every CHECK of a row at every UPDATE of it, the payload's among
/// them, and these statements write only the engine's own columns. Shown by tasks whose
/// `biz_id` breaks its rule (written with the checks off, as an operator could): one is
/// claimed and completed in strict mode and in batched mode under both claim styles, and a
/// rescue pass charges such a task, stamped or leased, with a sound one beside it; each
/// failed on the rule before (the claim; the whole pass). A producer's write is still held to
/// every rule. (MariaDB only: the test writes with `SET STATEMENT`, which MySQL 8 has not.)
#[cfg(feature = "mysql")]
#[test]
fn mariadb_claims_completions_and_rescue_do_not_check_the_producers_rules_again() {
    use outbox::{ClaimStyle, Worker};
    let db = &TestDb::mysql();
    let long = "b".repeat(200);
    let configs = [
        ("strict", crate::small_config().threads(1)),
        (
            "batched, stamp claims",
            crate::small_config()
                .threads(1)
                .commit_batch(5)
                .claim_style(ClaimStyle::Stamp),
        ),
        (
            "batched, lock claims",
            crate::small_config()
                .threads(1)
                .commit_batch(5)
                .queue(0)
                .claim_style(ClaimStyle::Lock),
        ),
    ];
    // Two each, on one thread: a cached statement's second run is held to the same.
    for (i, (name, config)) in configs.into_iter().enumerate() {
        db.exec(&format!(
            "SET STATEMENT check_constraint_checks = 0 FOR
             INSERT INTO async_task (keyword, biz_id) VALUES ('k', '{i}a{long}'), ('k', '{i}b{long}')"
        ));
        let w = Worker::new(&db.url, crate::ledger_registry("k"), config).expect("worker");
        let tally = w.drain().unwrap_or_else(|e| panic!("{name}: {e}")).tally;
        assert_eq!(tally.done, 2, "{name}");
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM async_task WHERE biz_id LIKE '{i}_{long}' AND state = 'done'"
            )),
            2,
            "{name}"
        );
    }
    refused(db, "a biz_id over 128 bytes", "", &format!("'k', '{long}'"));
    // Lapsed: two stamped tasks of a node that never lived (one breaking the rule) and a
    // leased one breaking it.
    let lapsed = |biz_id: &str, state: &str| {
        db.exec(&format!(
            "SET STATEMENT check_constraint_checks = 0 FOR
             INSERT INTO async_task (keyword, biz_id, state, owner, claim_token, claimed_at, deadline_at)
             VALUES ('k', '{biz_id}', '{state}', 999, 1, UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE,
                     UTC_TIMESTAMP(3) - INTERVAL 1 SECOND)"
        ));
    };
    lapsed(&format!("stamped{long}"), "running");
    lapsed("stamped-sound", "running");
    lapsed(&format!("leased{long}"), "pending");
    db.exec(&format!(
        "INSERT INTO async_lease (task_id, node_id, token, chunk, deadline_at)
         SELECT id, 999, claim_token, 1, UTC_TIMESTAMP(3) - INTERVAL 1 SECOND
           FROM async_task WHERE biz_id = 'leased{long}'"
    ));
    let report = crate::rescue::quiet_worker(db)
        .rescue_once()
        .expect("the rescue pass charges every lapsed task");
    assert_eq!(report.pending, 3, "{report:?}");
    assert_eq!(
        db.count("SELECT count(*) FROM async_task WHERE owner = 999 OR state = 'running'"),
        0
    );
    assert_eq!(db.count("SELECT count(*) FROM async_lease"), 0);

    db.exec("INSERT INTO async_task (keyword, biz_id) VALUES ('other', 'fine')");
    assert!(
        diesel::sql_query("UPDATE async_task SET biz_data = 'not json' WHERE biz_id = 'fine'")
            .execute(&mut db.conn())
            .is_err(),
        "a producer's UPDATE is held to the payload's rule"
    );
}

/// SQLite's key rules test the value's type (migration 000021): a BLOB keyword, biz_id or
/// tenant, which SQLite would keep as a BLOB beside the text key of the same bytes, is
/// refused; text keys pass. Applied to a file migrated before it (whose rows it leaves as
/// they are), the rules hold from then on.
#[test]
fn sqlite_keys_are_text_only() {
    let db = &TestDb::sqlite();
    db.exec(include_str!(
        "../../migrations/sqlite/2026-11-27-000021_text_keys/down.sql"
    ));
    db.exec("DELETE FROM __diesel_schema_migrations WHERE version = '20261127000021'");
    accepted(
        db,
        "a BLOB biz_id, before 000021",
        "",
        "'k', CAST('0' AS BLOB)",
    );
    let applied = outbox::run_migrations(&mut db.conn()).unwrap();
    assert_eq!(applied, ["20261127000021"]);
    accepted(db, "text keys", ", tenant", "'k', '1', 't'");
    refused(db, "a BLOB biz_id", "", "'k', CAST('2' AS BLOB)");
    refused(db, "a BLOB keyword", "", "CAST('k' AS BLOB), '3'");
    refused(
        db,
        "a BLOB tenant",
        ", tenant",
        "'k', '4', CAST('t' AS BLOB)",
    );
    assert_eq!(
        db.count("SELECT count(*) FROM async_task"),
        2,
        "the row written before stays"
    );
}

/// SQLite: a migration run that meets another process's (its exclusive transaction held past
/// the busy timeout, as a long migration of a large file holds it) waits for it, as
/// PostgreSQL's and MySQL's do, rather than fail with `database is locked`; then it applies
/// what is still pending.
#[test]
fn sqlite_migrations_wait_for_another_run_past_the_busy_timeout() {
    let db = &TestDb::sqlite();
    db.exec(include_str!(
        "../../migrations/sqlite/2026-11-27-000021_text_keys/down.sql"
    ));
    db.exec("DELETE FROM __diesel_schema_migrations WHERE version = '20261127000021'");
    use diesel::connection::SimpleConnection;
    let mut other = db.conn();
    other.batch_execute("BEGIN EXCLUSIVE").unwrap();
    let held = std::time::Instant::now();
    std::thread::scope(|s| {
        let run = s.spawn(|| outbox::run_migrations(&mut db.conn()));
        std::thread::sleep(outbox::db::SQLITE_BUSY_TIMEOUT + Duration::from_secs(2));
        other.batch_execute("COMMIT").unwrap();
        let applied = run.join().unwrap();
        assert!(held.elapsed() > outbox::db::SQLITE_BUSY_TIMEOUT);
        assert_eq!(applied.unwrap(), ["20261127000021"]);
    });
}

//! `schedules`, and `--crontab` on `drain` and `run`: a good file schedules registered
//! keywords; a bad one stops the command at start-up (exit 2) naming the file, the line and
//! what is wrong.

use serde_json::Value;

use crate::binary::{outbox, outbox_on, run, workdir};
use crate::every_backend;
use crate::support::TestDb;

/// Writes `text` as `jobs.cron` in `dir`; returns its path.
fn crontab(dir: &std::path::Path, text: &str) -> String {
    let path = dir.join("jobs.cron");
    std::fs::write(&path, text).expect("write crontab");
    path.to_str().expect("utf-8 path").to_owned()
}

/// The schedules' JSON lines.
fn listed(db: &TestDb, dir: &std::path::Path) -> Vec<Value> {
    let out = run(outbox_on(db, dir).args(["schedules", "--json"])).expect_code(0);
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn schedules_help_names_its_flags() {
    let dir = workdir();
    run(outbox(dir.path()).args(["schedules", "--help"]))
        .expect_code(0)
        .stdout_has("Usage: outbox schedules")
        .stdout_has("--json");
    run(outbox(dir.path()).args(["run", "--help"]))
        .expect_code(0)
        .stdout_has("--crontab <FILE>");
    run(outbox(dir.path()).args(["drain", "--help"]))
        .expect_code(0)
        .stdout_has("--crontab <FILE>");
}

every_backend! {
    fn schedules_lists_what_a_crontab_scheduled(db: &TestDb) {
        let dir = workdir();
        run(outbox_on(db, dir.path()).arg("schedules"))
            .expect_code(0)
            .stdout_has("no schedules");
        assert!(listed(db, dir.path()).is_empty());

        let file = crontab(
            dir.path(),
            "# sec min hour dom mon dow keyword data\n\
             0 0 * * * *   points.credit  {\"user_id\": 7, \"amount_cents\": 100}\n\
             TZ=Europe/Paris 0 0 3 1 1 ?  coupon.grant?fill=2h\n",
        );
        // The first drain sees both schedules for the first time: no tick before now runs.
        run(outbox_on(db, dir.path()).args(["drain", "--crontab", &file])).expect_code(0);
        let rows = listed(db, dir.path());
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0]["keyword"], "coupon.grant");
        assert_eq!(rows[0]["expression"], "TZ=Europe/Paris 0 0 3 1 1 ?");
        assert_eq!(rows[1]["keyword"], "points.credit");
        for row in &rows {
            assert!(row["last_tick"].is_null() && row["last_task_state"].is_null(), "{row}");
            assert!(row["next_tick"].as_str().is_some_and(|t| t.ends_with('Z')), "{row}");
        }

        // Every node was down for a day: the next drain enqueues the latest hourly tick.
        let day_ago = match db.backend() {
            outbox::Backend::Postgres => "now() - interval '1 day'",
            outbox::Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 days')",
            outbox::Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 1 DAY",
        };
        db.exec(&format!("UPDATE async_schedule SET since = {day_ago} WHERE keyword = 'points.credit'"));
        run(outbox_on(db, dir.path()).args(["drain", "--crontab", &file])).expect_code(0);
        let rows = listed(db, dir.path());
        let tick = rows[1]["last_tick"].as_str().expect("a tick").to_owned();
        assert!(tick.ends_with(":00:00Z"), "an hour's tick: {tick}");
        assert!(rows[1]["next_tick"].as_str().unwrap() > tick.as_str());
        // Its task ran (the handler refuses a biz_id that is no order number: dead).
        assert_eq!(rows[1]["last_task_state"], "dead", "{}", rows[1]);
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE keyword = 'points.credit'"), 1);
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM async_task WHERE biz_id = 'cron:{tick}' AND state = 'dead'")),
            1
        );
        let out = run(outbox_on(db, dir.path()).arg("schedules")).expect_code(0);
        let line = out.stdout.lines().find(|l| l.starts_with("points.credit")).expect("a line");
        assert!(line.contains("0 0 * * * *") && line.contains(&tick) && line.contains(" dead"), "{line}");
    }

    fn a_bad_crontab_stops_drain_and_run_naming_file_line_and_what(db: &TestDb) {
        let dir = workdir();
        let cases = [
            ("0 0 3 * * * points.credit\n0 0 25 * * * coupon.grant\n", "line 2: cron expression \"0 0 25 * * *\": "),
            ("\n\n0 0 3 * * * report.daily\n", "line 3: keyword \"report.daily\" has no handler in this program (its keywords: coupon.grant, points.credit)"),
            ("0 0 3 * * * points.credit {\"user_id\": }\n", "line 1: data for keyword \"points.credit\" is not valid JSON: "),
            ("0 0 3 * * points.credit\n", "line 1: 6 words where a schedule needs 7 or more: six cron fields with seconds first (sec min hour dom mon dow), then a keyword, then optional JSON data; a five-field crontab line (min hour dom mon dow) takes its seconds first: \"0 0 0 3 * * points.credit\""),
            ("0 0 3 * * * points.credit\n0 0 4 * * * points.credit\n", "line 2: keyword \"points.credit\" is scheduled again (first on line 1)"),
        ];
        for (text, message) in cases {
            let file = crontab(dir.path(), text);
            for command in ["drain", "run"] {
                run(outbox_on(db, dir.path()).args([command, "--crontab", &file]))
                    .expect_code(2)
                    .stderr_has(&format!("outbox: crontab {file} {message}"));
            }
        }
        let missing = dir.path().join("missing.cron");
        run(outbox_on(db, dir.path()).args(["run", "--crontab", missing.to_str().unwrap()]))
            .expect_code(2)
            .stderr_has(&format!("crontab {}: cannot read it: ", missing.display()));
        assert_eq!(db.count("SELECT count(*) FROM async_node"), 0, "no worker started");
        assert_eq!(db.count("SELECT count(*) FROM async_schedule"), 0);
    }
}

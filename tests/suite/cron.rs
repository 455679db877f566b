//! Cron schedules: each tick is one task `(keyword, "cron:<tick>")` however many workers see
//! it; a schedule starts from when it is first seen; after an outage only the latest missed
//! tick runs, unless the schedule backfills (bounded); the listing; `drain` and `run`.
//!
//! Time moves by rewriting `async_schedule`'s `since` and `last_tick`, never by sleeping
//! (the one test of `run`'s timer waits, bounded, for real ticks).

use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use diesel::prelude::*;
use diesel::sql_types::Text;
use outbox::schedule::{tick_biz_id, Schedule, MAX_TICKS};
use outbox::{Backend, CronPass, Registry, TaskState, Worker};

use crate::support::TestDb;
use crate::{small_config, write_ledger};

/// Every second.
const EVERY_SECOND: &str = "*/1 * * * * *";

/// A worker with `write_ledger` under `keyword` on `schedule`.
fn scheduled_worker(db: &TestDb, keyword: &str, schedule: Schedule) -> Worker {
    let mut registry = Registry::new();
    registry.register(keyword, write_ledger);
    registry.add_schedule(keyword, schedule).unwrap();
    Worker::new(&db.url, registry, small_config()).unwrap()
}

/// Sets the schedule's `since` and `last_tick` to `t` (time travel: the schedule was last
/// enqueued at `t`).
fn rewind(db: &TestDb, keyword: &str, t: DateTime<Utc>) {
    let text = t.format("%Y-%m-%d %H:%M:%S%.3f").to_string();
    let value = match db.backend() {
        Backend::Postgres => format!("'{text}'::timestamp AT TIME ZONE 'UTC'"),
        Backend::Sqlite | Backend::Mysql => format!("'{text}'"),
    };
    db.exec(&format!(
        "UPDATE async_schedule SET since = {value}, last_tick = {value} WHERE keyword = '{keyword}'"
    ));
}

/// The biz_ids of `keyword`'s tasks, sorted.
fn tick_tasks(db: &TestDb, keyword: &str) -> Vec<String> {
    #[derive(QueryableByName)]
    struct B {
        #[diesel(sql_type = Text)]
        biz_id: String,
    }
    diesel::sql_query(format!(
        "SELECT biz_id FROM async_task WHERE keyword = '{keyword}' ORDER BY biz_id"
    ))
    .load::<B>(&mut db.conn())
    .unwrap()
    .into_iter()
    .map(|b| b.biz_id)
    .collect()
}

/// The schedule's `last_tick` as the listing reads it.
fn last_tick(db: &TestDb, keyword: &str) -> Option<DateTime<Utc>> {
    outbox::schedule::list(&mut db.conn())
        .unwrap()
        .into_iter()
        .find(|s| s.keyword == keyword)
        .and_then(|s| s.last_tick)
}

/// The first pass of a new schedule: it writes the row and enqueues nothing.
fn first_sight(w: &Worker, keyword: &str) -> DateTime<Utc> {
    let pass = w.schedule_once().unwrap();
    assert_eq!(pass.first_seen, [keyword]);
    assert!(pass.ticks.is_empty(), "{pass:?}");
    pass.now.unwrap()
}

/// `n` consecutive ticks of an every-second schedule, ending at `last`, as biz_ids.
fn seconds_up_to(last: DateTime<Utc>, n: i64) -> Vec<String> {
    (0..n)
        .rev()
        .map(|back| tick_biz_id(last - TimeDelta::seconds(back)))
        .collect()
}

fn created(pass: &CronPass) -> usize {
    pass.ticks.iter().filter(|t| t.created).count()
}

every_backend! {
    fn a_schedule_seen_for_the_first_time_starts_from_now(db: &TestDb) {
        // Once a year at 03:00 on 1 January: its latest tick is in the past, and never runs.
        let w = scheduled_worker(db, "report.yearly", Schedule::parse("0 0 3 1 1 ?").unwrap());
        assert_eq!(db.count("SELECT count(*) FROM async_schedule"), 0);
        first_sight(&w, "report.yearly");
        assert_eq!(db.count("SELECT count(*) FROM async_schedule WHERE keyword = 'report.yearly' AND last_tick IS NULL"), 1);
        let again = w.schedule_once().unwrap();
        assert!(again.first_seen.is_empty() && again.ticks.is_empty(), "{again:?}");
        assert_eq!(tick_tasks(db, "report.yearly"), Vec::<String>::new(), "no catch-up before the schedule existed");
        assert!(again.next.unwrap() > again.now.unwrap());
    }

    fn a_due_tick_is_one_task_even_when_two_workers_see_it(db: &TestDb) {
        let schedule = Schedule::parse("0 * * * * *").unwrap();
        let a = scheduled_worker(db, "report.minute", schedule.clone());
        let b = scheduled_worker(db, "report.minute", schedule.clone());
        let now = first_sight(&a, "report.minute");
        let latest = schedule.latest_until(now).unwrap();
        let before = schedule.latest_until(latest - TimeDelta::seconds(1)).unwrap();
        rewind(db, "report.minute", before);

        let by_a = a.schedule_once().unwrap();
        // (A minute may have begun since the first pass: its tick is then the one due.)
        let latest = schedule.latest_until(by_a.now.unwrap()).unwrap();
        assert_eq!(by_a.ticks.len(), 1, "{by_a:?}");
        assert!(by_a.ticks[0].created);
        assert_eq!(by_a.ticks[0].tick, latest);
        assert_eq!(last_tick(db, "report.minute"), Some(latest));
        // B read the schedule before A's transaction committed: the same tick is due for it.
        rewind(db, "report.minute", before);
        let by_b = b.schedule_once().unwrap();
        assert_eq!(by_b.ticks.len(), 1, "{by_b:?}");
        assert_eq!(by_b.ticks[0].tick, latest);
        assert!(!by_b.ticks[0].created, "B found A's task");
        assert_eq!(by_b.ticks[0].task_id, by_a.ticks[0].task_id);
        assert_eq!(tick_tasks(db, "report.minute"), [tick_biz_id(latest)]);
        assert_eq!(last_tick(db, "report.minute"), Some(latest));
        // And nothing is due for either now.
        assert!(a.schedule_once().unwrap().ticks.is_empty());
        assert!(b.schedule_once().unwrap().ticks.is_empty());
    }

    fn ticks_late_by_less_than_dead_after_all_run(db: &TestDb) {
        let schedule = Schedule::parse(EVERY_SECOND).unwrap();
        let w = scheduled_worker(db, "tick", schedule.clone());
        let now = first_sight(&w, "tick");
        // The last tick was enqueued 5 s ago (dead-after is 15 s): a slow node, no outage.
        let last = schedule.latest_until(now).unwrap() - TimeDelta::seconds(5);
        rewind(db, "tick", last);
        let pass = w.schedule_once().unwrap();
        let latest = schedule.latest_until(pass.now.unwrap()).unwrap();
        let n = (latest - last).num_seconds();
        assert!(n >= 5, "{pass:?}");
        assert_eq!(tick_tasks(db, "tick"), seconds_up_to(latest, n), "every tick since the last, none skipped");
        assert_eq!(created(&pass), n as usize);
        assert!(pass.skipped.is_empty(), "{pass:?}");
    }

    fn a_schedule_whose_enqueue_fails_does_not_hold_up_the_others(db: &TestDb) {
        let schedule = Schedule::parse(EVERY_SECOND).unwrap();
        let mut registry = Registry::new();
        for keyword in ["a.first", "b.second"] {
            registry.register(keyword, write_ledger);
            registry.add_schedule(keyword, schedule.clone()).unwrap();
        }
        let w = Worker::new(&db.url, registry, small_config()).unwrap();
        let now = w.schedule_once().unwrap().now.unwrap();
        for keyword in ["a.first", "b.second"] {
            rewind(db, keyword, schedule.latest_until(now).unwrap() - TimeDelta::seconds(3));
        }
        // The database refuses every task of the first schedule (in registry order).
        db.exec(match db.backend() {
            Backend::Postgres => {
                "CREATE FUNCTION refuse_a() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION 'refused for the test'; END $$;
                 CREATE TRIGGER refuse_a BEFORE INSERT ON async_task FOR EACH ROW
                     WHEN (NEW.keyword = 'a.first') EXECUTE FUNCTION refuse_a();"
            }
            Backend::Sqlite => {
                "CREATE TRIGGER refuse_a BEFORE INSERT ON async_task WHEN NEW.keyword = 'a.first'
                 BEGIN SELECT RAISE(ABORT, 'refused for the test'); END;"
            }
            Backend::Mysql => {
                "CREATE TRIGGER refuse_a BEFORE INSERT ON async_task FOR EACH ROW
                 BEGIN IF NEW.keyword = 'a.first' THEN
                     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'refused for the test';
                 END IF; END"
            }
        });
        let error = w.schedule_once().unwrap_err();
        assert!(error.to_string().contains("refused for the test"), "{error}");
        assert!(tick_tasks(db, "a.first").is_empty());
        assert!(tick_tasks(db, "b.second").len() >= 3, "the second schedule's ticks were enqueued");
    }

    fn only_the_latest_missed_tick_runs_after_an_outage(db: &TestDb) {
        let schedule = Schedule::parse(EVERY_SECOND).unwrap();
        let w = scheduled_worker(db, "tick", schedule.clone());
        let now = first_sight(&w, "tick");
        // Every node was down for an hour.
        rewind(db, "tick", now - TimeDelta::hours(1));
        let pass = w.schedule_once().unwrap();
        let latest = schedule.latest_until(pass.now.unwrap()).unwrap();
        assert_eq!(tick_tasks(db, "tick"), [tick_biz_id(latest)]);
        assert_eq!(pass.skipped.len(), 1);
        assert_eq!(pass.skipped[0].1, MAX_TICKS as u64, "counted up to the cap: {pass:?}");
        assert_eq!(last_tick(db, "tick"), Some(latest));
        // The hour is not made up later either.
        let after = w.schedule_once().unwrap();
        assert!(after.ticks.iter().all(|t| t.tick > latest), "{after:?}");
    }

    fn backfill_runs_the_missed_ticks_within_its_window_and_no_more(db: &TestDb) {
        let schedule = Schedule::parse(EVERY_SECOND).unwrap().backfill(Duration::from_secs(30));
        let w = scheduled_worker(db, "tick", schedule.clone());
        let now = first_sight(&w, "tick");
        rewind(db, "tick", now - TimeDelta::hours(1));
        let pass = w.schedule_once().unwrap();
        let latest = schedule.latest_until(pass.now.unwrap()).unwrap();
        assert_eq!(tick_tasks(db, "tick"), seconds_up_to(latest, 30), "the 30 s window, to the second");
        assert_eq!(created(&pass), 30);

        // A week's window of an every-second schedule is bounded by the tick cap.
        let week = Schedule::parse(EVERY_SECOND).unwrap().backfill(outbox::schedule::MAX_BACKFILL);
        let w2 = scheduled_worker(db, "tock", week.clone());
        let now = first_sight(&w2, "tock");
        rewind(db, "tock", now - TimeDelta::days(2));
        let pass = w2.schedule_once().unwrap();
        let latest = week.latest_until(pass.now.unwrap()).unwrap();
        assert_eq!(created(&pass), MAX_TICKS);
        assert_eq!(tick_tasks(db, "tock"), seconds_up_to(latest, MAX_TICKS as i64), "the latest ones");
        assert_eq!(last_tick(db, "tock"), Some(latest));
    }

    fn a_bad_expression_is_refused_at_start_up_naming_it(db: &TestDb) {
        let dir = tempfile::tempdir().unwrap();
        let crontab = dir.path().join("jobs.cron");
        std::fs::write(&crontab, "# jobs\n0 0 3 * * * ledger\n0 0 25 * * * other\n").unwrap();
        let mut registry = Registry::new();
        registry.register("ledger", write_ledger).register("other", write_ledger);
        let err = registry.clone().add_crontab(&crontab).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "crontab {} line 3: cron expression \"0 0 25 * * *\": Component error: Number out of bounds.",
                crontab.display()
            )
        );
        // Through the CLI: exit 2 with that message, before any database work.
        let code = outbox::cli::main_from(
            ["outbox", "drain", "--database-url", &db.url_text, "--crontab", crontab.to_str().unwrap()],
            registry,
        );
        assert_eq!(code, std::process::ExitCode::from(2));
        assert_eq!(db.count("SELECT count(*) FROM async_node"), 0, "no worker started");
        assert_eq!(db.count("SELECT count(*) FROM async_schedule"), 0);
        let err = Schedule::parse("0/10 * * * *").unwrap_err().to_string();
        assert_eq!(err, "cron expression \"0/10 * * * *\": expected six fields (second minute hour day-of-month month day-of-week), found 5");
    }

    fn the_listing_shows_each_schedule_its_ticks_and_its_last_tasks_state(db: &TestDb) {
        let schedule = Schedule::parse("0 * * * * *").unwrap().data(serde_json::json!({"format": "pdf"}));
        let mut registry = Registry::new();
        registry.register("report.minute", write_ledger).register("report.yearly", write_ledger);
        registry.add_schedule("report.minute", schedule.clone()).unwrap();
        registry.add_schedule("report.yearly", Schedule::parse("TZ=Europe/Paris 0 0 3 1 1 ?").unwrap()).unwrap();
        let w = Worker::new(&db.url, registry, small_config()).unwrap();
        let pass = w.schedule_once().unwrap();
        assert_eq!(pass.first_seen, ["report.minute", "report.yearly"]);
        let now = pass.now.unwrap();
        rewind(db, "report.minute", schedule.latest_until(now).unwrap() - TimeDelta::minutes(1));
        let pass = w.schedule_once().unwrap();
        let tick = pass.ticks.last().unwrap().clone();

        let listed = outbox::schedule::list(&mut db.conn()).unwrap();
        assert_eq!(listed.len(), 2);
        let (minute, yearly) = (&listed[0], &listed[1]);
        assert_eq!((minute.keyword.as_str(), minute.expression.as_str()), ("report.minute", "0 * * * * *"));
        assert_eq!(minute.last_tick, Some(tick.tick));
        assert_eq!(minute.last_task_id, Some(tick.task_id));
        assert_eq!(minute.last_task_state, Some(TaskState::Pending));
        let next = minute.next_tick.unwrap();
        assert!(next > pass.now.unwrap() && next - pass.now.unwrap() <= TimeDelta::minutes(1), "{minute:?}");
        assert!(minute.updated_by.contains(':'), "host:pid");
        assert_eq!(yearly.expression, "TZ=Europe/Paris 0 0 3 1 1 ?");
        assert_eq!((yearly.last_tick, yearly.last_task_id, yearly.last_task_state), (None, None, None));
        assert_eq!(chrono::Timelike::hour(&yearly.next_tick.unwrap()), 2, "03:00 in Paris in January is 02:00 UTC");

        // The tick's task carries the schedule's data, and runs.
        let stored = outbox::testing::assert_enqueued(&mut db.conn(), "report.minute", &tick_biz_id(tick.tick));
        assert_eq!(stored.payload, serde_json::json!({"format": "pdf"}));
        assert_eq!(w.drain().unwrap().tally.done, 1);
        let listed = outbox::schedule::list(&mut db.conn()).unwrap();
        assert_eq!(listed[0].last_task_state, Some(TaskState::Done));
        // Pruned: the tick stays, its task is gone.
        db.exec("DELETE FROM async_task");
        let listed = outbox::schedule::list(&mut db.conn()).unwrap();
        assert_eq!((listed[0].last_tick, listed[0].last_task_id), (Some(tick.tick), None));
        let json = serde_json::to_value(&listed[0]).unwrap();
        assert_eq!(json["last_tick"], serde_json::json!(tick.tick.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
    }

    fn drain_enqueues_the_due_ticks_and_runs_them(db: &TestDb) {
        let schedule = Schedule::parse(EVERY_SECOND).unwrap();
        let w = scheduled_worker(db, "tick", schedule.clone());
        let now = first_sight(&w, "tick");
        rewind(db, "tick", schedule.latest_until(now).unwrap() - TimeDelta::seconds(3));
        let report = w.drain().unwrap();
        let ticks = tick_tasks(db, "tick");
        assert!(ticks.len() >= 3, "{ticks:?}");
        assert_eq!(report.tally.done as usize, ticks.len());
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), ticks.len() as i64);
    }

    fn run_enqueues_each_tick_as_it_comes_due(db: &TestDb) {
        let schedule = Schedule::parse(EVERY_SECOND).unwrap();
        let mut registry = Registry::new();
        registry.register("tick", write_ledger);
        registry.add_schedule("tick", schedule).unwrap();
        let config = small_config().poll_interval(Duration::from_millis(50));
        let w = Worker::new(&db.url, registry, config).unwrap();
        let stop = w.stop_flag();
        let done = std::thread::scope(|s| {
            let running = s.spawn(|| w.run().unwrap());
            // Bounded: three ticks come due within four seconds.
            let deadline = Instant::now() + Duration::from_secs(30);
            while db.count("SELECT count(*) FROM test_ledger") < 3 {
                assert!(Instant::now() < deadline, "three ticks did not run within 30 s");
                std::thread::sleep(Duration::from_millis(50));
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            running.join().unwrap().tally.done
        });
        let ticks = tick_tasks(db, "tick");
        assert!(ticks.len() >= 3 && done as usize >= 3, "{ticks:?}");
        // Consecutive seconds, each once.
        let times: Vec<DateTime<Utc>> = ticks.iter().map(|b| outbox::schedule::tick_of(b).unwrap()).collect();
        for pair in times.windows(2) {
            assert_eq!(pair[1] - pair[0], TimeDelta::seconds(1), "{ticks:?}");
        }
    }
}

/// The same race for real on PostgreSQL: two workers' passes both read the schedule before
/// either commits. The test holds the schedule's row locked, so that neither pass can
/// record its tick; it lets them go once both wait on a lock (one on the row, the other on
/// the first one's uncommitted task), which means both have read the tick as due.
#[test]
fn two_overlapping_passes_enqueue_one_task_on_postgres() {
    let db = &TestDb::postgres();
    let schedule = Schedule::parse("0 * * * * *").unwrap();
    let a = scheduled_worker(db, "report.minute", schedule.clone());
    let b = scheduled_worker(db, "report.minute", schedule.clone());
    let now = first_sight(&a, "report.minute");
    let latest = schedule.latest_until(now).unwrap();
    rewind(db, "report.minute", latest - TimeDelta::minutes(1));
    let waiting = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
                    WHERE NOT l.granted AND s.datname = current_database()";
    let passes: Vec<CronPass> = std::thread::scope(|s| {
        let mut holder = db.conn();
        let handles = holder
            .transaction(|conn| -> QueryResult<_> {
                diesel::sql_query("SELECT keyword FROM async_schedule FOR UPDATE").execute(conn)?;
                let handles = [
                    s.spawn(|| a.schedule_once().unwrap()),
                    s.spawn(|| b.schedule_once().unwrap()),
                ];
                let deadline = Instant::now() + Duration::from_secs(30);
                while db.count(waiting) < 2 {
                    assert!(
                        Instant::now() < deadline,
                        "the two passes never both waited"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(handles)
            })
            .unwrap();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let latest = schedule.latest_until(passes[0].now.unwrap()).unwrap();
    let ticks: Vec<_> = passes.iter().flat_map(|p| p.ticks.clone()).collect();
    // The second to take the row finds it moved past the tick, and leaves it to the first.
    assert_eq!(ticks.len(), 1, "one pass enqueued the tick: {passes:?}");
    assert!(ticks[0].tick == latest && ticks[0].created, "{ticks:?}");
    assert_eq!(tick_tasks(db, "report.minute"), [tick_biz_id(latest)]);
    assert_eq!(last_tick(db, "report.minute"), Some(latest));
}

/// `worker`'s pass while the schedule's row is held locked (PostgreSQL): once the pass waits
/// for the row, it having read the schedule, another node's pass lands, recording `moved_to`
/// as the last tick; then the row goes.
fn pass_while_another_node_moves(
    db: &TestDb,
    worker: &Worker,
    moved_to: DateTime<Utc>,
) -> CronPass {
    let waiting = "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
                    WHERE NOT l.granted AND s.datname = current_database()";
    std::thread::scope(|s| {
        let mut holder = db.conn();
        let handle = holder
            .transaction(|conn| -> QueryResult<_> {
                diesel::sql_query("SELECT keyword FROM async_schedule FOR UPDATE").execute(conn)?;
                let handle = s.spawn(|| worker.schedule_once().unwrap());
                let deadline = Instant::now() + Duration::from_secs(30);
                while db.count(waiting) < 1 {
                    assert!(Instant::now() < deadline, "the pass never waited");
                    std::thread::sleep(Duration::from_millis(10));
                }
                let text = moved_to.format("%Y-%m-%d %H:%M:%S%.3f");
                diesel::sql_query(format!(
                    "UPDATE async_schedule SET last_tick = '{text}'::timestamp AT TIME ZONE 'UTC'"
                ))
                .execute(conn)?;
                Ok(handle)
            })
            .unwrap();
        handle.join().unwrap()
    })
}

/// A pass whose read of the schedule is stale when it writes: another node enqueued the tick
/// meanwhile, and its task ran and was pruned (`prune --older-than 0s`, or a pass frozen for
/// longer than the retention). The unique key cannot tell a pruned tick, so the pass must
/// see the row moved, and enqueue nothing.
#[test]
fn a_pass_that_read_the_schedule_before_another_node_moved_it_enqueues_nothing() {
    let db = &TestDb::postgres();
    let schedule = Schedule::parse("0 * * * * *").unwrap();
    let a = scheduled_worker(db, "report.minute", schedule.clone());
    let now = first_sight(&a, "report.minute");
    let latest = schedule.latest_until(now).unwrap();
    rewind(db, "report.minute", latest - TimeDelta::minutes(1));
    // The other node's pass recorded the tick (its task is gone).
    let pass = pass_while_another_node_moves(db, &a, latest);
    assert!(pass.ticks.is_empty(), "{pass:?}");
    assert_eq!(
        tick_tasks(db, "report.minute"),
        Vec::<String>::new(),
        "no tick enqueued again"
    );
    assert_eq!(last_tick(db, "report.minute"), Some(latest));
}

/// The same with the other node a little behind: it enqueued only the first of the ticks this
/// pass read as due (it read the schedule a second earlier). The pass, finding the row moved,
/// reads it again and enqueues the ticks after it: none is left for a later pass.
#[test]
fn a_pass_that_read_the_schedule_before_another_node_moved_it_enqueues_the_ticks_after() {
    let db = &TestDb::postgres();
    let schedule = Schedule::parse(EVERY_SECOND).unwrap();
    let a = scheduled_worker(db, "tick", schedule.clone());
    let now = first_sight(&a, "tick");
    let last = schedule.latest_until(now).unwrap() - TimeDelta::seconds(5);
    rewind(db, "tick", last);
    let other_node = last + TimeDelta::seconds(1);
    let pass = pass_while_another_node_moves(db, &a, other_node);
    let latest = schedule.latest_until(pass.now.unwrap()).unwrap();
    let n = (latest - other_node).num_seconds();
    assert!(n >= 4, "{pass:?}");
    assert_eq!(created(&pass), n as usize, "{pass:?}");
    assert_eq!(
        tick_tasks(db, "tick"),
        seconds_up_to(latest, n),
        "the ticks after the other node's"
    );
    assert_eq!(last_tick(db, "tick"), Some(latest));
}

/// A cron pass's transaction is marked as a task's is, on PostgreSQL: a node frozen inside
/// one (the schedule's row locked, its ticks not committed) would hold every other node's
/// pass of that schedule until its session ended, and only a marked session is ended by a
/// rescue pass. The pass here is held inside its transaction by a lock of the schedule's row
/// that another session holds, a stand-in for a freeze there. The rescue pass ends it.
#[test]
fn a_rescue_pass_ends_a_dead_nodes_cron_pass_inside_its_transaction() {
    use crate::rescue::{kill_heartbeat, quiet_worker};
    let db = &TestDb::postgres();
    let schedule = Schedule::parse(EVERY_SECOND).unwrap();
    let mut registry = Registry::new();
    registry.register("tick", write_ledger);
    registry.add_schedule("tick", schedule.clone()).unwrap();
    let config = small_config()
        .heartbeat(Duration::from_secs(3600))
        .dead_after(Duration::from_secs(7200));
    let dying = Worker::new(&db.url, registry, config).unwrap();
    let now = first_sight(&dying, "tick");
    rewind(
        db,
        "tick",
        schedule.latest_until(now).unwrap() - TimeDelta::seconds(5),
    );
    let waiting = "SELECT count(*) FROM pg_stat_activity
                    WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let mut holder = db.conn();
    let (pass, report) = holder
        .transaction(|conn| -> QueryResult<_> {
            diesel::sql_query("SELECT keyword FROM async_schedule FOR UPDATE").execute(conn)?;
            let node = dying.node_id();
            let (sent, passed) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = sent.send(dying.schedule_once().map_err(|e| e.to_string()));
            });
            let deadline = Instant::now() + Duration::from_secs(10);
            while db.count(waiting) == 0 {
                assert!(Instant::now() < deadline, "the pass never waited");
                std::thread::sleep(Duration::from_millis(10));
            }
            kill_heartbeat(db, node);
            let report = quiet_worker(db).rescue_once().unwrap();
            // Ended, the pass returns (its connection gone); not ended, it waits on.
            Ok((passed.recv_timeout(Duration::from_secs(10)), report))
        })
        .unwrap();
    let pass = pass.expect("the pass's session was not ended");
    assert!(pass.is_err(), "{pass:?}");
    assert_eq!(report.sessions_ended, 1);
    assert_eq!(tick_tasks(db, "tick"), Vec::<String>::new());
}

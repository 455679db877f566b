//! Heartbeats: the database clock decides liveness; a node that is no longer registered as
//! alive registers again; a slow rescue pass never delays a beat.

use std::time::{Duration, Instant};

use diesel::prelude::*;
use outbox::{Error, Worker};

use crate::rescue::{enqueue_n, kill_heartbeat, quiet_worker};
use crate::support::TestDb;
use crate::{ledger_registry, small_config};

/// `async_node.heartbeat_at` of `node` as text (`None`: no such row).
fn heartbeat_at(db: &TestDb, node: i64) -> Option<String> {
    #[derive(QueryableByName)]
    struct Beat {
        #[diesel(sql_type = diesel::sql_types::Text)]
        at: String,
    }
    let text = match db.backend() {
        outbox::Backend::Mysql => "CHAR",
        _ => "TEXT",
    };
    diesel::sql_query(format!(
        "SELECT CAST(heartbeat_at AS {text}) AS at FROM async_node WHERE id = {node}"
    ))
    .get_result::<Beat>(&mut db.conn())
    .optional()
    .unwrap()
    .map(|b| b.at)
}

fn node_state(db: &TestDb, node: i64) -> String {
    #[derive(QueryableByName)]
    struct State {
        #[diesel(sql_type = diesel::sql_types::Text)]
        state: String,
    }
    diesel::sql_query(format!("SELECT state FROM async_node WHERE id = {node}"))
        .get_result::<State>(&mut db.conn())
        .map_or_else(|_| "(no row)".to_owned(), |s| s.state)
}

every_backend! {
    fn a_heartbeat_records_the_database_clock(db: &TestDb) {
        let w = quiet_worker(db);
        kill_heartbeat(db, w.node_id());
        w.heartbeat_once().unwrap();
        let fresh = match db.backend() {
            outbox::Backend::Postgres => "heartbeat_at > now() - interval '1 minute'",
            outbox::Backend::Sqlite => "heartbeat_at > strftime('%Y-%m-%d %H:%M:%f', 'now', '-1 minutes')",
            outbox::Backend::Mysql => "heartbeat_at > UTC_TIMESTAMP(3) - INTERVAL 1 MINUTE",
        };
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM async_node WHERE id = {} AND state = 'alive' AND {fresh}", w.node_id())),
            1
        );
    }

    fn a_node_marked_gone_stays_gone_and_registers_again(db: &TestDb) {
        let w = quiet_worker(db);
        let old = w.node_id();
        // Marked gone (a shutdown past its timeout, an operator): others rescue its tasks.
        db.exec(&format!("UPDATE async_node SET state = 'gone' WHERE id = {old}"));
        w.heartbeat_once().unwrap();
        assert_eq!(node_state(db, old), "gone", "a beat does not bring a gone node back");
        let new = w.node_id();
        assert_ne!(new, old);
        assert_eq!(node_state(db, new), "alive");
    }

    fn a_node_whose_row_was_pruned_registers_again_and_its_old_claims_are_fenced_out(db: &TestDb) {
        enqueue_n(db, 2);
        let w = quiet_worker(db);
        let old = w.node_id();
        let stale_page = w.claim().unwrap();
        assert_eq!(stale_page.len(), 2);
        // The process was paused for an hour and prune deleted its row.
        db.exec(&format!("DELETE FROM async_node WHERE id = {old}"));
        w.heartbeat_once().unwrap();
        let new = w.node_id();
        assert_ne!(new, old, "registered under a new id");
        assert_eq!(node_state(db, new), "alive");
        // The fleet treats the old id as dead: its claims are rescued, and the late
        // completions of the paused handlers are fenced out.
        assert_eq!(w.rescue_once().unwrap().pending, 2);
        assert_eq!(w.execute(stale_page).lost, 2);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 0);
        // It claims again, as the new node.
        db.make_all_due();
        assert_eq!(w.drain().unwrap().tally.done, 2);
        assert_eq!(db.count(&format!("SELECT count(*) FROM async_task WHERE owner = {new} AND state = 'done'")), 2);
        assert_eq!(db.count("SELECT count(*) FROM test_ledger"), 2);
    }

    fn a_slow_rescue_pass_never_delays_a_heartbeat(db: &TestDb) {
        // Beats every 100 ms; the rescue pass runs as often, on the worker's pool.
        let config = small_config().heartbeat(Duration::from_millis(100)).dead_after(Duration::from_secs(60));
        let w = Worker::new(&db.url, ledger_registry("ledger"), config).unwrap();
        // Every pooled connection is taken: a rescue pass waits for one (10 s, the pool's
        // checkout timeout), as it waits for a database that is slow to answer.
        let held: Vec<_> = (0..w.pool().max_size()).map(|_| w.pool().get().unwrap()).collect();
        let node = w.node_id();
        let mut seen = vec![heartbeat_at(db, node).unwrap()];
        let give_up = Instant::now() + Duration::from_secs(5);
        while seen.len() < 4 && Instant::now() < give_up {
            let at = heartbeat_at(db, node).unwrap();
            if seen.last() != Some(&at) {
                seen.push(at);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(held);
        assert!(seen.len() >= 4, "three more beats while rescue waited: {seen:?}");
    }

    fn a_node_whose_heartbeat_keeps_failing_stops_claiming(db: &TestDb) {
        enqueue_n(db, 1);
        // The claim after the heartbeat that succeeds again, at the end, must come within
        // dead_after − heartbeat of it: 500 ms, for a loaded machine.
        let config = small_config().heartbeat(Duration::from_millis(500)).dead_after(Duration::from_millis(1_000));
        let w = Worker::new(&db.url, ledger_registry("ledger"), config).unwrap();
        // The node table is out of reach, so every heartbeat fails from now on.
        db.exec("ALTER TABLE async_node RENAME TO async_node_away");
        assert!(w.heartbeat_once().is_err());
        // Past dead_after − heartbeat (500 ms) since the registration, the last success.
        std::thread::sleep(Duration::from_millis(600));
        assert!(matches!(w.claim(), Err(Error::HeartbeatStale { .. })));
        assert!(matches!(w.run_once(), Err(Error::HeartbeatStale { .. })));
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'pending'"), 1);
        // Once a heartbeat succeeds again, it claims.
        db.exec("ALTER TABLE async_node_away RENAME TO async_node");
        w.heartbeat_once().unwrap();
        assert_eq!(w.run_once().unwrap().done, 1);
    }
}

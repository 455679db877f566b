//! Fencing: every write to a claimed task names its owner and claim token, so a node whose
//! claim was taken over (rescued, re-claimed) writes nothing and its effects roll back.

use outbox::{enqueue, HandlerResult, NewTask, Registry, TaskContext, TaskTx};

use crate::support::TestDb;
use crate::worker;

/// What rescue and a re-claim by node 999 do to a task: a new owner and a new token.
fn take_over(db: &TestDb, id: i64) {
    crate::take_over(&db.url, id);
}

every_backend! {
    fn a_completion_whose_claim_was_taken_over_rolls_back_its_effect(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let w = worker(db, crate::ledger_registry("ledger"));
        let page = w.claim().unwrap();
        assert_eq!(page.len(), 1);
        let claimed = db.task(id);
        assert_eq!((claimed.state.as_str(), claimed.owner), ("running", Some(w.node_id())));
        assert_eq!(claimed.claim_token, page[0].claim_token);

        take_over(db, id);
        let tally = w.execute(page);
        assert_eq!((tally.done, tally.lost), (0, 1));
        assert_eq!(db.ledger_rows(id), 0, "the handler's effect rolled back");
        let row = db.task(id);
        assert_eq!((row.state.as_str(), row.owner, row.failures), ("running", Some(999), 0));
    }

    fn a_failure_whose_claim_was_taken_over_is_not_recorded(db: &TestDb) {
        fn fail(_: &TaskContext, _: &mut TaskTx) -> HandlerResult {
            Err(anyhow::anyhow!("boom").into())
        }
        let id = enqueue(&mut db.conn(), &NewTask::new("fail", "1")).unwrap().id;
        let mut registry = Registry::new();
        registry.register("fail", fail);
        let w = worker(db, registry);
        let page = w.claim().unwrap();
        take_over(db, id);
        assert_eq!(w.execute(page).lost, 1);
        let row = db.task(id);
        assert_eq!((row.state.as_str(), row.failures, row.last_error), ("running", 0, None));
    }

    fn a_task_finished_elsewhere_is_not_completed_twice(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let w = worker(db, crate::ledger_registry("ledger"));
        let page = w.claim().unwrap();
        // An operator cancelled it while it was claimed.
        db.exec(&format!("UPDATE async_task SET state = 'cancelled' WHERE id = {id}"));
        assert_eq!(w.execute(page).lost, 1);
        assert_eq!(db.task(id).state, "cancelled");
        assert_eq!(db.ledger_rows(id), 0);
    }

    fn every_claim_bumps_the_token(db: &TestDb) {
        let id = enqueue(&mut db.conn(), &NewTask::new("ledger", "1")).unwrap().id;
        let w = worker(db, crate::ledger_registry("ledger"));
        let first = w.claim().unwrap()[0].claim_token;
        // Put it back as rescue would, and claim again.
        db.exec(&format!("UPDATE async_task SET state = 'pending', owner = NULL WHERE id = {id}"));
        let page = w.claim().unwrap();
        assert_eq!(page[0].claim_token, first + 1);
        assert_eq!(w.execute(page).done, 1);
    }
}

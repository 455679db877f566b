//! The operator's library (`outbox::ops`): listing in keyset pages, one task whole with its
//! chain, retry by filter audited in the change's transaction, nodes, the audit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox::ops::{
    self, AuditQuery, Filter, NodeInfo, NodeQuery, NodeStatus, TaskQuery, MAX_PAGE_LIMIT,
};
use outbox::{
    enqueue, write_transaction, Backend, Error, HandlerError, HandlerResult, NewTask, Registry,
    TaskContext, TaskState, TaskTx, Worker,
};

use crate::support::TestDb;
use crate::{small_config, write_ledger};

const ACTOR: &str = "tester@host";

/// A handler that fails for good: its task is dead at once, with this error.
fn doomed(task: &TaskContext, _: &mut TaskTx) -> HandlerResult {
    Err(HandlerError::permanent(anyhow::anyhow!(
        "no mailbox for {}",
        task.biz_id()
    )))
}

/// Enqueues `keyword` tasks with the biz_ids `from..to` (and `tenant`); returns their ids.
fn tasks(
    db: &TestDb,
    keyword: &str,
    range: std::ops::Range<u32>,
    tenant: Option<&str>,
) -> Vec<i64> {
    let mut conn = db.conn();
    range
        .map(|i| {
            let mut task = NewTask::new(keyword, i.to_string());
            if let Some(tenant) = tenant {
                task = task.tenant(tenant);
            }
            enqueue(&mut conn, &task).unwrap().id
        })
        .collect()
}

/// Runs every due task of `keyword` once through `doomed`: each ends dead.
fn kill(db: &TestDb, keyword: &str) -> u64 {
    let mut registry = Registry::new();
    registry.register(keyword, doomed);
    let w = Worker::new(&db.url, registry, small_config()).unwrap();
    let mut dead = 0;
    loop {
        let tally = w.run_once().unwrap();
        if tally.claimed == 0 {
            return dead;
        }
        dead += tally.dead;
    }
}

/// Moves the creation of the tasks `ids` two hours back (time travel by the database's
/// own clock).
fn created_two_hours_ago(db: &TestDb, ids: &[i64]) {
    let list = ids
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let earlier = match db.backend() {
        Backend::Postgres => "now() - interval '2 hours'",
        Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-7200 seconds')",
        Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 2 HOUR",
    };
    db.exec(&format!(
        "UPDATE async_task SET created_at = {earlier}, run_at = {earlier} WHERE id IN ({list})"
    ));
}

fn ids(page: &ops::Page) -> Vec<i64> {
    page.tasks.iter().map(|t| t.id).collect()
}

fn audits(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM async_audit")
}

every_backend! {
    fn a_listing_pages_through_more_tasks_than_a_page_once_each(db: &TestDb) {
        let mail = tasks(db, "mail.send", 0..25, None);
        tasks(db, "sms.send", 0..3, None);
        let mut conn = db.conn();
        let mut query = TaskQuery::new(Filter::default().keyword("mail.send")).limit(10);
        let mut seen = Vec::new();
        let mut pages = 0;
        loop {
            let page = ops::list_tasks(&mut conn, &query).unwrap();
            pages += 1;
            assert!(page.tasks.len() <= 10);
            seen.extend(ids(&page));
            match page.next_after_id {
                Some(id) => {
                    assert_eq!(Some(id), page.tasks.last().map(|t| t.id));
                    query = query.after_id(id);
                }
                None => break,
            }
        }
        assert_eq!(pages, 3);
        assert_eq!(seen, mail, "every task once, in id order");
        // Exactly a page left: the last page says so, no empty page follows.
        let last = ops::list_tasks(&mut conn, &TaskQuery::new(Filter::default().keyword("mail.send")).limit(5).after_id(mail[19])).unwrap();
        assert_eq!((ids(&last), last.next_after_id), (mail[20..].to_vec(), None));
        // Newest first: the cursor goes down.
        let newest = ops::list_tasks(&mut conn, &TaskQuery::new(Filter::default()).limit(4).newest_first(true)).unwrap();
        let top = ids(&newest);
        assert!(top.windows(2).all(|w| w[0] > w[1]), "{top:?}");
        let next = ops::list_tasks(&mut conn, &TaskQuery::new(Filter::default()).limit(4).newest_first(true).after_id(newest.next_after_id.unwrap())).unwrap();
        assert!(ids(&next)[0] < top[3]);
        // A listing shows what an operator needs, and no payload.
        let task = &newest.tasks[0];
        assert_eq!((task.state, task.failures, task.priority), (TaskState::Pending, 0, 0));
        assert!(task.age_secs >= 0.0 && task.age_secs < 600.0, "{}", task.age_secs);
        let json = serde_json::to_value(task).unwrap();
        assert_eq!(json["state"], "pending");
        assert!(json.get("biz_data").is_none());
    }

    fn a_listing_filters_by_state_keyword_tenant_biz_id_and_age(db: &TestDb) {
        let acme = tasks(db, "mail.send", 0..4, Some("acme"));
        let other = tasks(db, "mail.send", 4..6, Some("other"));
        let sms = tasks(db, "sms.send", 0..2, None);
        assert_eq!(kill(db, "sms.send"), 2);
        created_two_hours_ago(db, &acme[..2]);
        let mut conn = db.conn();
        let mut list = |filter: Filter| ids(&ops::list_tasks(&mut conn, &TaskQuery::new(filter)).unwrap());
        assert_eq!(list(Filter::default().state(TaskState::Dead)), sms);
        assert_eq!(list(Filter::default().state(TaskState::Dead).state(TaskState::Pending).keyword("sms.send")), sms);
        assert_eq!(list(Filter::default().tenant("acme")), acme);
        assert_eq!(list(Filter::default().keyword("mail.send").biz_id("5")), vec![other[1]]);
        let hour = Duration::from_secs(3600);
        assert_eq!(list(Filter::default().older_than(hour)), acme[..2].to_vec());
        let recent = list(Filter::default().newer_than(hour));
        assert_eq!(recent.len(), 6);
        assert!(!recent.contains(&acme[0]) && recent.contains(&acme[2]));
        // Nothing matches: an empty last page.
        let none = ops::list_tasks(&mut conn, &TaskQuery::new(Filter::default().tenant("nobody"))).unwrap();
        assert_eq!((none.tasks.len(), none.next_after_id), (0, None));
        // The dead ones carry their error.
        let dead = ops::list_tasks(&mut conn, &TaskQuery::new(Filter::default().state(TaskState::Dead))).unwrap();
        assert_eq!(dead.tasks[0].last_error.as_deref(), Some("no mailbox for 0"));
        assert!(dead.tasks[0].finished_at.is_some());
    }

    fn bad_queries_are_refused_before_anything_is_read(db: &TestDb) {
        let mut conn = db.conn();
        for limit in [0, MAX_PAGE_LIMIT + 1] {
            let error = ops::list_tasks(&mut conn, &TaskQuery::new(Filter::default()).limit(limit)).unwrap_err();
            assert!(matches!(error, Error::InvalidConfig { setting: "limit", .. }), "{error}");
        }
        let error = ops::list_tasks(&mut conn, &TaskQuery::new(Filter::default().keyword("Mail"))).unwrap_err();
        assert!(matches!(error, Error::InvalidKeyword { .. }), "{error}");
        let error = ops::audit_list(&mut conn, &AuditQuery::default().action("task retry")).unwrap_err();
        assert!(matches!(error, Error::InvalidConfig { setting: "action", .. }), "{error}");
        let error = ops::nodes(&mut conn, &NodeQuery::default().limit(0)).unwrap_err();
        assert!(matches!(error, Error::InvalidConfig { setting: "limit", .. }), "{error}");
    }

    fn show_has_every_column_the_parents_children_and_error_chain(db: &TestDb) {
        let mut conn = db.conn();
        let task = NewTask::new("order.pack", "42").tenant("acme").priority(-2).max_attempts(3)
            .payload_json(r#"{"order": 42}"#);
        let parent = enqueue(&mut conn, &task).unwrap().id;
        let child = enqueue(&mut conn, &NewTask::new("order.ship", "42").after(parent)).unwrap().id;
        let sibling = enqueue(&mut conn, &NewTask::new("order.mail", "42").after(parent)).unwrap().id;
        let grandchild = enqueue(&mut conn, &NewTask::new("invoice.send", "42").after(child)).unwrap().id;

        let blocked = ops::show_task(&mut conn, child).unwrap();
        assert_eq!((blocked.task.state, blocked.blocked_by), (TaskState::Blocked, 1));
        assert_eq!(blocked.parent_id, Some(parent));
        assert!(blocked.error_chain.is_empty());

        assert_eq!(kill(db, "order.pack"), 1);
        let p = ops::show_task(&mut conn, parent).unwrap();
        assert_eq!((p.task.state, p.task.failures, p.task.max_attempts), (TaskState::Dead, 1, Some(3)));
        assert_eq!((p.task.tenant.as_deref(), p.task.priority), (Some("acme"), -2));
        assert_eq!(p.biz_data, serde_json::json!({"order": 42}));
        assert!(p.task.owner.is_some() && p.claim_token == 1 && p.claimed_at.is_some() && p.task.finished_at.is_some());
        assert!(p.parents.is_empty());
        let children: Vec<(i64, TaskState)> = p.children.iter().map(|c| (c.id, c.state)).collect();
        assert_eq!(children, [(child, TaskState::Cancelled), (sibling, TaskState::Cancelled)]);
        assert_eq!(p.children_total, 2);
        assert_eq!(p.error_chain.len(), 1);
        assert_eq!(p.error_chain[0].last_error.as_deref(), Some("no mailbox for 42"));

        // The grandchild's error chain leads up to the task that died, and why.
        let g = ops::show_task(&mut conn, grandchild).unwrap();
        assert_eq!(g.task.state, TaskState::Cancelled);
        assert_eq!(g.parents.iter().map(|l| l.id).collect::<Vec<_>>(), [child]);
        let chain: Vec<(i64, TaskState)> = g.error_chain.iter().map(|l| (l.id, l.state)).collect();
        assert_eq!(chain, [(grandchild, TaskState::Cancelled), (child, TaskState::Cancelled), (parent, TaskState::Dead)]);
        assert_eq!(g.error_chain[2].last_error.as_deref(), Some("no mailbox for 42"));
        let json = serde_json::to_value(&g).unwrap();
        assert_eq!((json["id"].as_i64(), json["state"].as_str()), (Some(grandchild), Some("cancelled")));
        assert_eq!(json["error_chain"][2]["keyword"], "order.pack");

        let error = ops::show_task(&mut conn, grandchild + 1000).unwrap_err();
        assert!(matches!(error, Error::TaskNotFound { .. }), "{error}");
        assert_eq!(error.to_string(), format!("no task {}", grandchild + 1000));
    }

    fn retry_by_filter_counts_in_a_dry_run_then_retries_and_audits_what_it_did(db: &TestDb) {
        let dead = tasks(db, "mail.send", 0..3, Some("acme"));
        let other = tasks(db, "sms.send", 0..1, Some("acme"));
        assert_eq!(kill(db, "mail.send") + kill(db, "sms.send"), 4);
        let cancelled = tasks(db, "mail.send", 3..4, None)[0];
        assert!(outbox::cancel(&mut db.conn(), cancelled).unwrap().cancelled);
        let pending = tasks(db, "mail.send", 4..5, None)[0];
        let mut conn = db.conn();

        let mail = Filter::default().keyword("mail.send");
        let would = ops::retry_matching(&mut conn, &mail, true, ACTOR).unwrap();
        assert_eq!((would.matched, would.changed, would.dry_run), (4, 0, true));
        assert_eq!(db.task(dead[0]).state, "dead", "a dry run writes nothing");
        assert_eq!(audits(db), 0, "a dry run is not audited");

        let dead_mail = Filter::default().state(TaskState::Dead).keyword("mail.send").tenant("acme");
        let done = ops::retry_matching(&mut conn, &dead_mail, false, ACTOR).unwrap();
        assert_eq!((done.matched, done.changed, done.dry_run), (3, 3, false));
        for id in &dead {
            let row = db.task(*id);
            assert_eq!((row.state.as_str(), row.failures, row.owner, row.due), ("pending", 0, None, 1), "task {id}");
        }
        for (id, state) in [(other[0], "dead"), (cancelled, "cancelled"), (pending, "pending")] {
            assert_eq!(db.task(id).state, state, "task {id} is not matched");
        }
        let audit = ops::audit_list(&mut conn, &AuditQuery::default()).unwrap().records;
        assert_eq!(audit.len(), 1);
        let row = &audit[0];
        assert_eq!((row.actor.as_str(), row.action.as_str(), row.affected), (ACTOR, "task.retry", 3));
        assert_eq!(row.target, "state=dead keyword=mail.send tenant=acme");
        assert_eq!(row.detail["states"], serde_json::json!(["dead"]));
        assert_eq!(row.detail["tenant"], "acme");

        // Nothing matches: nothing written, nothing audited.
        let none = ops::retry_matching(&mut conn, &Filter::default().keyword("nothing.here"), false, ACTOR).unwrap();
        assert_eq!((none.matched, none.changed), (0, 0));
        assert_eq!(audits(db), 1);
        // A state retry cannot take: refused before anything is read.
        let error = ops::retry_matching(&mut conn, &Filter::default().state(TaskState::Pending), false, ACTOR).unwrap_err();
        assert!(matches!(error, Error::InvalidConfig { setting: "state", .. }), "{error}");
        assert_eq!(error.to_string(), "invalid configuration: state of a retry must be dead or cancelled, not pending");
    }

    fn a_retry_by_filter_and_its_audit_row_commit_or_roll_back_together(db: &TestDb) {
        let dead = tasks(db, "mail.send", 0..2, None);
        assert_eq!(kill(db, "mail.send"), 2);
        let filter = Filter::default().state(TaskState::Dead);
        let mut conn = db.conn();
        // In the caller's transaction, which rolls back: neither the retry nor its audit row.
        let rolled_back: Result<(), Error> = write_transaction(&mut conn, |conn| {
            let done = ops::retry_matching(conn, &filter, false, ACTOR)?;
            assert_eq!(done.changed, 2);
            Err(diesel::result::Error::RollbackTransaction.into())
        });
        assert!(rolled_back.is_err());
        assert_eq!((db.task(dead[0]).state.as_str(), audits(db)), ("dead", 0));

        // The audit row cannot be written: the retry does not happen either.
        match db.backend() {
            Backend::Postgres => db.exec(
                "CREATE FUNCTION refuse_audit() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION 'audit refused'; END $$;
                 CREATE TRIGGER refuse_audit BEFORE INSERT ON async_audit FOR EACH ROW
                 WHEN (NEW.actor = 'refused') EXECUTE FUNCTION refuse_audit();",
            ),
            Backend::Sqlite => db.exec(
                "CREATE TRIGGER refuse_audit BEFORE INSERT ON async_audit
                 WHEN NEW.actor = 'refused' BEGIN SELECT RAISE(ABORT, 'audit refused'); END;",
            ),
            Backend::Mysql => db.exec(
                "CREATE TRIGGER refuse_audit BEFORE INSERT ON async_audit FOR EACH ROW
                 BEGIN IF NEW.actor = 'refused' THEN
                     SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'audit refused';
                 END IF; END",
            ),
        }
        let error = ops::retry_matching(&mut conn, &filter, false, "refused").unwrap_err();
        assert!(error.to_string().contains("audit refused"), "{error}");
        assert_eq!(db.count("SELECT count(*) FROM async_task WHERE state = 'dead'"), 2);
        assert_eq!(audits(db), 0);
        // The one-task retry and cancel are held to the same rule.
        assert!(ops::retry_task(&mut conn, dead[0], "refused").is_err());
        assert_eq!(db.task(dead[0]).state, "dead");

        // Committed: both.
        assert_eq!(ops::retry_matching(&mut conn, &filter, false, ACTOR).unwrap().changed, 2);
        assert_eq!((db.task(dead[1]).state.as_str(), audits(db)), ("pending", 1));
    }

    fn a_child_retried_with_its_parent_waits_for_it_then_runs(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("step", "p")).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("step", "c").after(parent)).unwrap().id;
        assert_eq!(kill(db, "step"), 1);
        assert_eq!((db.task(parent).state.as_str(), db.task(child).state.as_str()), ("dead", "cancelled"));
        let done = ops::retry_matching(&mut db.conn(), &Filter::default().keyword("step"), false, ACTOR).unwrap();
        assert_eq!(done.changed, 2);
        let c = ops::show_task(&mut db.conn(), child).unwrap();
        assert_eq!((c.task.state, c.blocked_by), (TaskState::Blocked, 1), "its parent is not done");
        assert_eq!(db.task(parent).state, "pending");
        let mut registry = Registry::new();
        registry.register("step", write_ledger);
        let w = Worker::new(&db.url, registry, small_config()).unwrap();
        assert_eq!(w.run_once().unwrap().done, 1);
        assert_eq!(db.task(child).state, "pending", "released by its parent's completion");
        assert_eq!(w.run_once().unwrap().done, 1);
        assert_eq!(db.ledger_rows(child), 1);
    }

    fn retry_by_filter_leaves_a_child_whose_parent_was_pruned_as_retry_of_one_does(db: &TestDb) {
        let parent = enqueue(&mut db.conn(), &NewTask::new("order.pack", "p")).unwrap().id;
        let child = enqueue(&mut db.conn(), &NewTask::new("order.ship", "c").after(parent)).unwrap().id;
        let lone = tasks(db, "order.ship", 0..1, None)[0];
        assert_eq!(kill(db, "order.pack") + kill(db, "order.ship"), 2);
        assert_eq!(db.task(child).state, "cancelled", "cancelled with its dead parent");
        // The dead parent alone is old enough to go.
        db.exec(&format!("UPDATE async_task SET finished_at = {} WHERE id = {parent}", db.ago_sql(7_200_000)));
        let pruned = outbox::prune::prune(&mut db.conn(), &outbox::prune::PruneParams::new(Duration::from_secs(3600))).unwrap();
        assert_eq!(pruned.tasks(), 1);

        let mut conn = db.conn();
        let one = ops::retry_task(&mut conn, child, ACTOR).unwrap();
        assert_eq!((one.retried, one.state, one.parent_pruned), (false, TaskState::Cancelled, true), "retry ID refuses it");
        let every = Filter::default();
        let would = ops::retry_matching(&mut conn, &every, true, ACTOR).unwrap();
        assert_eq!((would.matched, would.skipped), (1, 1), "a dry run counts only the lone dead task");
        let done = ops::retry_matching(&mut conn, &every, false, ACTOR).unwrap();
        assert_eq!((done.matched, done.changed, done.skipped), (1, 1, 1));
        assert_eq!(db.task(lone).state, "pending");
        assert_eq!(db.task(child).state, "cancelled", "retry --all refuses it as retry ID does");
        assert_eq!(db.count("SELECT count(*) FROM async_audit WHERE action = 'task.retry' AND affected = 1"), 1);
    }

    fn retry_and_cancel_of_one_task_are_audited_and_an_unknown_id_is_named(db: &TestDb) {
        let id = tasks(db, "mail.send", 0..1, None)[0];
        let mut conn = db.conn();
        assert!(ops::cancel_task(&mut conn, id, ACTOR).unwrap().cancelled);
        assert!(!ops::cancel_task(&mut conn, id, ACTOR).unwrap().cancelled, "already cancelled");
        let retried = ops::retry_task(&mut conn, id, ACTOR).unwrap();
        assert_eq!((retried.retried, retried.state), (true, TaskState::Pending));
        assert!(!ops::retry_task(&mut conn, id, ACTOR).unwrap().retried, "pending: nothing to do");
        let by_key = ops::cancel_task_by_key(&mut conn, "mail.send", "0", ACTOR).unwrap();
        assert_eq!((by_key.id, by_key.cancelled), (id, true));
        let actions: Vec<String> = ops::audit_list(&mut conn, &AuditQuery::default()).unwrap()
            .records.into_iter().map(|r| format!("{} {} {}", r.action, r.target, r.affected)).collect();
        assert_eq!(actions, [format!("task.cancel {id} 1"), format!("task.retry {id} 1"), format!("task.cancel {id} 1")]);
        for result in [
            ops::retry_task(&mut conn, id + 1000, ACTOR).map(|_| ()),
            ops::cancel_task(&mut conn, id + 1000, ACTOR).map(|_| ()),
        ] {
            assert_eq!(result.unwrap_err().to_string(), format!("no task {}", id + 1000));
        }
        assert_eq!(audits(db), 3);
    }

    fn the_audit_lists_newest_first_by_action_family_a_page_at_a_time(db: &TestDb) {
        let ids = tasks(db, "mail.send", 0..3, None);
        let mut conn = db.conn();
        for id in &ids {
            ops::cancel_task(&mut conn, *id, ACTOR).unwrap();
        }
        ops::retry_task(&mut conn, ids[0], ACTOR).unwrap();
        outbox::set_tenant(&mut conn, "acme", &outbox::TenantLimits::default().weight(2), ACTOR).unwrap();
        let all = ops::audit_list(&mut conn, &AuditQuery::default()).unwrap();
        let actions: Vec<&str> = all.records.iter().map(|r| r.action.as_str()).collect();
        assert_eq!(actions, ["tenant.set", "task.retry", "task.cancel", "task.cancel", "task.cancel"]);
        assert!(all.records.windows(2).all(|w| w[0].id > w[1].id && w[0].at >= w[1].at));
        assert_eq!(all.next_before_id, None);
        let tasks_only = ops::audit_list(&mut conn, &AuditQuery::default().action("task")).unwrap();
        assert_eq!(tasks_only.records.len(), 4);
        let retries = ops::audit_list(&mut conn, &AuditQuery::default().action("task.retry")).unwrap();
        assert_eq!(retries.records.len(), 1);
        assert!(ops::audit_list(&mut conn, &AuditQuery::default().action("tas")).unwrap().records.is_empty(), "a family is a whole word");
        // Two at a time, older pages by the cursor.
        let mut query = AuditQuery::default().limit(2);
        let mut seen = Vec::new();
        loop {
            let page = ops::audit_list(&mut conn, &query).unwrap();
            seen.extend(page.records.iter().map(|r| r.id));
            match page.next_before_id {
                Some(id) => query = query.before_id(id),
                None => break,
            }
        }
        assert_eq!(seen, all.records.iter().map(|r| r.id).collect::<Vec<_>>());
    }

    fn nodes_are_listed_live_silent_or_gone_with_their_running_tasks(db: &TestDb) {
        let id = tasks(db, "mail.send", 0..1, None)[0];
        let gone = Worker::new(&db.url, crate::ledger_registry("mail.send"), small_config()).unwrap();
        gone.mark_gone().unwrap();
        let stale = match db.backend() {
            Backend::Postgres => "now() - interval '2 minutes'",
            Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now', '-120 seconds')",
            Backend::Mysql => "UTC_TIMESTAMP(3) - INTERVAL 120 SECOND",
        };
        db.exec(&format!("INSERT INTO async_node (name, heartbeat_at) VALUES ('killed:1', {stale})"));
        // What the operator sees while the live node runs the task.
        let seen: Arc<Mutex<Vec<NodeInfo>>> = Arc::default();
        let (seen_in, url) = (Arc::clone(&seen), db.url.clone());
        let mut registry = Registry::new();
        registry.register("mail.send", move |task: &TaskContext, tx: &mut TaskTx| -> HandlerResult {
            *seen_in.lock().unwrap() = ops::nodes(&mut url.connect()?, &NodeQuery::default())?;
            write_ledger(task, tx)
        });
        let live = Worker::new(&db.url, registry, small_config()).unwrap();
        assert_eq!(live.run_once().unwrap().done, 1);
        let seen = seen.lock().unwrap().clone();
        let by_id = |node: i64| seen.iter().find(|n| n.id == node).unwrap_or_else(|| panic!("node {node} in {seen:?}"));
        let l = by_id(live.node_id());
        assert_eq!((l.status, l.running), (NodeStatus::Live, 1), "{l:?}");
        assert!(l.heartbeat_age_secs < 15.0, "{l:?}");
        let g = by_id(gone.node_id());
        assert_eq!((g.status, g.running), (NodeStatus::Gone, 0));
        let k = seen.iter().find(|n| n.name == "killed:1").unwrap();
        assert_eq!(k.status, NodeStatus::Silent);
        assert!(k.heartbeat_age_secs >= 119.0 && k.heartbeat_age_secs < 600.0, "{k:?}");
        assert_eq!(seen[0].id, live.node_id(), "the most recent heartbeat first");
        assert_eq!(seen.len(), 3);
        // A wider threshold counts the silent node as live; after the run, nothing runs.
        let now = ops::nodes(&mut db.conn(), &NodeQuery::default().live_within(Duration::from_secs(3600))).unwrap();
        assert!(now.iter().all(|n| n.running == 0 && n.status != NodeStatus::Silent), "{now:?}");
        assert_eq!(db.ledger_rows(id), 1);
        let json = serde_json::to_value(&now[0]).unwrap();
        assert_eq!(json["status"], "live");
    }
}

every_backend! {
    fn retries_by_filter_and_by_id_of_overlapping_chains_at_once_never_deadlock(db: &TestDb) {
        let mut conn = db.conn();
        let chains: Vec<(i64, i64)> = (0..40)
            .map(|i| {
                let parent = enqueue(&mut conn, &NewTask::new("chain.parent", i.to_string())).unwrap().id;
                let child = enqueue(&mut conn, &NewTask::new("chain.child", i.to_string()).after(parent)).unwrap().id;
                (parent, child)
            })
            .collect();
        for round in 0..5 {
            // Every parent dead, every child cancelled with it (by the schema's triggers).
            db.exec("UPDATE async_task SET state = 'dead' WHERE keyword = 'chain.parent'");
            db.exec("UPDATE async_task SET state = 'cancelled' WHERE keyword = 'chain.child'");
            let barrier = std::sync::Barrier::new(2);
            let (by_filter, by_id) = std::thread::scope(|s| {
                let filter = s.spawn(|| {
                    let mut conn = db.conn();
                    barrier.wait();
                    ops::retry_matching(&mut conn, &Filter::default().keyword("chain.child"), false, ACTOR)
                        .map(|m| m.changed)
                });
                let one_by_one = s.spawn(|| {
                    let mut conn = db.conn();
                    barrier.wait();
                    let mut n = 0;
                    // The other way round: parents (and so children) from the highest id.
                    for (_, child) in chains.iter().rev() {
                        if ops::retry_task(&mut conn, *child, ACTOR)?.retried {
                            n += 1;
                        }
                    }
                    Ok::<u64, Error>(n)
                });
                (filter.join().unwrap(), one_by_one.join().unwrap())
            });
            let (by_filter, by_id) = (by_filter.unwrap(), by_id.unwrap());
            assert_eq!(by_filter + by_id, 40, "round {round}: each child retried once");
            assert_eq!(db.count("SELECT count(*) FROM async_task WHERE keyword = 'chain.child' AND state = 'blocked' AND blocked_by = 1"), 40);
        }
    }
}

//! The harness's own invariants (beside `invariants::check_and_publish`'s, which it also
//! runs): what producers committed and rolled back, limits sampled while the faults run, a
//! paused domain held, chains in order, no stall, no node left alive, no charge without a
//! fault that charges one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use diesel::connection::{SimpleConnection, TransactionManager};
use diesel::Connection;
use outbox::{Backend, DatabaseUrl, NewTask};

use super::plan::{Fault, Plan};
use crate::db::Db;
use crate::report::Report;
use crate::scenario::{Proc, Scenario};

/// How long due work may wait with nothing finishing (per database, not counting a database
/// whose handlers' table the test holds locked): a dead or frozen worker's tasks wait its
/// `--dead-after` (1.5 s) and a rescue pass; a hung handler its timeout and the exit.
const STALL: Duration = Duration::from_secs(12);

/// How long a database may finish nothing while another's handlers are blocked and it has
/// work waiting.
const PACE: Duration = Duration::from_secs(3);

/// The transaction manager of the library's connection.
type Manager = <outbox::DbConnection as Connection>::TransactionManager;

/// How long after a worker froze the tasks it held must be finished, or given back, by others:
/// its `--dead-after` (1.5 s), a rescue pass's heartbeat and the tasks' own run. A worker's
/// exit meanwhile starts the bound again (the chaos loop): what the exited worker held waits
/// for rescue too.
pub const FROZEN_BOUND: Duration = Duration::from_millis(6_500);

/// The tasks a node holds, each by the claim it holds it with.
#[derive(Debug, Default)]
pub struct Held {
    /// Running under the node: id and claim token.
    stamped: Vec<(i64, i64)>,
    /// Leased by the node (lock claims): id and lease token.
    leased: Vec<(i64, i64)>,
    /// Row-locked by the node's sessions (lock claims before leases).
    locked: Vec<i64>,
}

impl Held {
    pub fn len(&self) -> usize {
        self.stamped.len() + self.leased.len() + self.locked.len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn ids(&self) -> Vec<i64> {
        let claimed = self.stamped.iter().chain(&self.leased).map(|&(id, _)| id);
        claimed.chain(self.locked.iter().copied()).collect()
    }
}

/// The tasks `proc`'s node holds now: running under it, leased by it (lock claims), or —
/// before leases — row-locked by its sessions.
pub fn held_by(db: &Db, proc: &Proc) -> Held {
    let Some(node) = db.node_id(&proc.node_name()) else {
        return Held::default();
    };
    let mut held = Held {
        stamped: db.pairs(&format!(
            "SELECT id AS a, claim_token AS b FROM async_task WHERE owner = {node} AND state = 'running'"
        )),
        ..Held::default()
    };
    if db.backend() == Backend::Postgres {
        if has_leases(db) {
            held.leased = db.pairs(&format!(
                "SELECT task_id AS a, token AS b FROM async_lease WHERE node_id = {node}"
            ));
        } else {
            held.locked = db.numbers(&format!(
                "SELECT t.id AS n FROM async_task t JOIN pg_stat_activity a ON a.backend_xid = t.xmax
                  WHERE a.datname = current_database() AND a.application_name = '{}'
                    AND t.state = 'pending'",
                proc.app
            ));
        }
    }
    held
}

/// Each database but `locked`: its index, finished tasks and unfinished ones.
pub fn progress_of_others(dbs: &[&Db], locked: usize) -> Vec<(usize, i64, i64)> {
    dbs.iter()
        .enumerate()
        .filter(|(i, _)| *i != locked)
        .map(|(i, db)| (i, finished(db), unfinished(db)))
        .collect()
}

/// Tasks due now and waiting: pending with their time come (not those in a retry's backoff).
fn due_waiting(db: &Db) -> i64 {
    let now = match db.backend() {
        Backend::Postgres => "now()",
        Backend::Sqlite => "strftime('%Y-%m-%d %H:%M:%f', 'now')",
        Backend::Mysql => "UTC_TIMESTAMP(3)",
    };
    db.count(&format!(
        "SELECT count(*) FROM async_task WHERE state = 'pending' AND run_at <= {now}
           AND (tenant IS NULL OR tenant NOT LIKE 'idle-%')"
    ))
}

fn finished(db: &Db) -> i64 {
    db.count("SELECT count(*) FROM async_task WHERE state IN ('done', 'dead', 'cancelled')")
}

/// Tasks neither done, dead nor cancelled, but for the idle tenants' (due in an hour).
pub fn unfinished(db: &Db) -> i64 {
    db.count(
        "SELECT count(*) FROM async_task WHERE state NOT IN ('done', 'dead', 'cancelled')
           AND (tenant IS NULL OR tenant NOT LIKE 'idle-%')",
    )
}

/// The first unfinished tasks, each with its state, keyword and its parents' states: a
/// liveness failure explains itself (the seed's database is gone after the run).
pub fn stuck(db: &Db) -> Vec<String> {
    let ids = db.numbers(
        "SELECT id AS n FROM async_task WHERE state NOT IN ('done', 'dead', 'cancelled')
           AND (tenant IS NULL OR tenant NOT LIKE 'idle-%') ORDER BY id LIMIT 5",
    );
    ids.into_iter()
        .map(|id| {
            let parents: Vec<String> = db
                .numbers(&format!(
                    "SELECT parent_id AS n FROM async_task_parent WHERE child_id = {id}"
                ))
                .into_iter()
                .map(|p| format!("{p} {}", db.task_state(p)))
                .collect();
            format!(
                "task {id} {} {} (parents: {parents:?})",
                db.task_state(id),
                db.text(&format!(
                    "SELECT COALESCE(MAX(keyword), '') AS t FROM async_task WHERE id = {id}"
                ))
            )
        })
        .collect()
}

/// What the harness saw and found.
pub struct Checks {
    backend: Backend,
    /// Keys of tasks whose producer committed, by database URL, and rolled back.
    committed: HashMap<String, HashSet<(String, String)>>,
    rolled_back: HashSet<(String, String)>,
    /// Enqueues refused by a tenant's `max_queued` (nothing written).
    refused: usize,
    /// Child id → its parents' ids.
    parents: HashMap<i64, Vec<i64>>,
    pruned: bool,
    /// A worker was sent a second SIGTERM while it stopped: it exited at once, and rescue
    /// charges what its handlers held.
    forced: bool,
    /// The paused domain's keywords' done count and what ran or was held then.
    pause_mark: Option<(i64, i64)>,
    max_sampled: BTreeMap<String, i64>,
    samples: usize,
    producer_errors: Vec<String>,
    operator_calls: usize,
    violations: Vec<String>,
}

impl Checks {
    pub fn new(plan: &Plan) -> Checks {
        Checks {
            backend: plan.backend,
            committed: HashMap::new(),
            rolled_back: HashSet::new(),
            refused: 0,
            parents: HashMap::new(),
            pruned: plan
                .operations
                .iter()
                .any(|(_, op)| matches!(op, super::plan::Operation::Prune)),
            forced: false,
            pause_mark: None,
            max_sampled: BTreeMap::new(),
            samples: 0,
            producer_errors: Vec::new(),
            operator_calls: 0,
            violations: Vec::new(),
        }
    }

    /// No worker's own rescue pass charged that worker's own node for its heartbeat (seed
    /// 6621): a node is live to itself. `logs`: every worker process's stderr; `dbs`: the
    /// databases they served, where a node's id names its process. A process whose node
    /// registered again (its row marked gone meanwhile) may rescue its old id.
    pub fn self_rescues(&mut self, logs: &[std::path::PathBuf], dbs: &[&Db]) {
        for log in logs {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let names_of = |node: &str| -> Vec<String> {
                dbs.iter()
                    .map(|db| {
                        db.text(&format!(
                            "SELECT COALESCE(MAX(name), '') AS t FROM async_node WHERE id = {node}"
                        ))
                    })
                    .filter(|name| !name.is_empty())
                    .collect()
            };
            let rescued = own_rescues(&text, names_of);
            if !rescued.is_empty() {
                self.violation(format!(
                    "a node rescued its own tasks for its heartbeat ({}): {rescued:?}",
                    log.display()
                ));
            }
        }
    }

    /// A worker was sent a second SIGTERM while it stopped (see [`Checks::forced`]).
    pub fn forced_exit(&mut self) {
        self.forced = true;
    }

    /// The keys committed in `db`.
    fn committed_in(&mut self, db: &Db) -> &mut HashSet<(String, String)> {
        self.committed.entry(db.url().to_owned()).or_default()
    }

    pub fn violation(&mut self, text: String) {
        if !self.violations.contains(&text) {
            self.violations.push(text);
        }
    }

    /// Enqueues `tasks` with the library, one at a time, in one transaction per 500: a task
    /// over its tenant's `max_queued` is refused (and, with it, its batch), as promised.
    pub fn enqueue(&mut self, db: &Db, tasks: &[NewTask]) {
        let mut conn = connect(db);
        for batch in tasks.chunks(500) {
            match outbox::enqueue_batch(&mut conn, batch) {
                Ok(_) => self.committed_in(db).extend(batch.iter().map(key)),
                Err(outbox::Error::QuotaExceeded { .. }) => self.refused += batch.len(),
                Err(e) => panic!("enqueue: {e}"),
            }
        }
    }

    /// A parent (of `keyword`) and a child after it.
    pub fn chain(&mut self, db: &Db, _url: &str, keyword: &str, n: usize) {
        let mut conn = connect(db);
        let parent = outbox::enqueue(
            &mut conn,
            &NewTask::new(keyword, format!("parent-{n}")).max_attempts(2),
        )
        .expect("enqueue a parent");
        let child = NewTask::new("fault.ledger", format!("child-{n}")).after(parent.id);
        let child_id = outbox::enqueue(&mut conn, &child)
            .expect("enqueue a child")
            .id;
        let committed = self.committed_in(db);
        committed.insert((keyword.to_owned(), format!("parent-{n}")));
        committed.insert(key(&child));
        self.parents.insert(child_id, vec![parent.id]);
    }

    /// One producer transaction: a few tasks, committed or (a fifth of the time) rolled back.
    pub fn produce(&mut self, plan: &Plan, _url: &str, db: &Db, rng: &mut fastrand::Rng) {
        let mut conn = connect(db);
        if self.backend == Backend::Mysql && rng.bool() {
            // MySQL's own default isolation, which a producer may keep.
            let _ = conn.batch_execute("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ");
        }
        let tasks: Vec<NewTask> = (0..rng.usize(1..=5))
            .map(|_| {
                let keyword = if plan.databases > 1 || rng.u8(..4) != 0 {
                    "fault.ledger"
                } else {
                    "fault.external"
                };
                let mut t = NewTask::new(keyword, format!("p-{}", rng.u64(..u64::MAX)));
                if !plan.tenants.is_empty() && rng.bool() {
                    t = t.tenant(&plan.tenants[rng.usize(..plan.tenants.len())].name);
                }
                t
            })
            .collect();
        let roll_back = rng.u8(..5) == 0;
        if Manager::begin_transaction(&mut conn).is_err() {
            return;
        }
        let enqueued = outbox::enqueue_batch(&mut conn, &tasks);
        let ended = match (&enqueued, roll_back) {
            (Ok(_), false) => Manager::commit_transaction(&mut conn).map(|()| true),
            _ => Manager::rollback_transaction(&mut conn).map(|()| false),
        };
        match (enqueued, ended) {
            (Ok(_), Ok(true)) => self.committed_in(db).extend(tasks.iter().map(key)),
            (Ok(_), Ok(false)) => self.rolled_back.extend(tasks.iter().map(key)),
            (Err(outbox::Error::QuotaExceeded { .. }), _) => self.refused += tasks.len(),
            (Err(e), _) => self.producer_errors.push(format!("enqueue: {e}")),
            (Ok(_), Err(e)) => self.producer_errors.push(format!("commit: {e}")),
        }
    }

    /// The guide's cancel (docs/guide/src/cancel.md), in a producer's transaction: an order locked
    /// (its row updated), then its coupon task cancelled by key, then commit. The order is one
    /// whose task is about to run (the third unfinished, in claim order): its handler, once it
    /// runs, waits for the producer's lock on the order.
    pub fn cancel_order(&mut self, db: &Db) {
        let next = db.numbers(
            "SELECT id AS n FROM async_task WHERE keyword = 'fault.order'
               AND state NOT IN ('done', 'dead', 'cancelled') ORDER BY id LIMIT 3",
        );
        let Some(&task) = next.last() else { return };
        let order = db.text(&format!(
            "SELECT COALESCE(MAX(biz_id), '') AS t FROM async_task WHERE id = {task}"
        ));
        let mut conn = connect(db);
        let result = (|| -> Result<(), String> {
            Manager::begin_transaction(&mut conn).map_err(|e| e.to_string())?;
            let body = (|| -> Result<(), String> {
                conn.batch_execute(&format!(
                    "UPDATE fault_orders SET n = n + 1000 WHERE id = {order}"
                ))
                .map_err(|e| e.to_string())?;
                outbox::cancel_by_key(&mut conn, "fault.order", &order)
                    .map_err(|e| e.to_string())?;
                Ok(())
            })();
            match body {
                Ok(()) => Manager::commit_transaction(&mut conn).map_err(|e| e.to_string()),
                Err(e) => {
                    let _ = Manager::rollback_transaction(&mut conn);
                    Err(e)
                }
            }
        })();
        self.operator_calls += 1;
        if let Err(e) = result {
            // PostgreSQL's `deadlock detected`, MySQL's `Deadlock found …`.
            if e.to_ascii_lowercase().contains("deadlock") {
                self.violation(format!(
                    "a producer's cancel of order {order} in its own transaction deadlocked \
                     with a worker: {e}"
                ));
            } else {
                self.producer_errors
                    .push(format!("cancel of order {order}: {e}"));
            }
        }
    }

    /// An operator's command ended: its error, if any.
    pub fn operator(&mut self, what: &str, stderr: &str, code: Option<i32>) {
        self.operator_calls += 1;
        if code != Some(0) {
            let text = format!("`{what}` exited {code:?}: {}", stderr.trim());
            if stderr.to_ascii_lowercase().contains("deadlock") || code.is_none() {
                self.violation(format!("an operator's command deadlocked or hung: {text}"));
            } else {
                self.producer_errors.push(text);
            }
        }
    }

    fn paused_keywords(plan: &Plan) -> String {
        plan.domains
            .first()
            .map(|d| {
                d.keywords
                    .iter()
                    .map(|k| format!("'{k}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "''".into())
    }

    /// The pause has been applied by every node (a heartbeat after the command): its
    /// keywords' done count, and what of them is in flight then (running, or leased).
    pub fn paused(&mut self, plan: &Plan, db: &Db) {
        let keywords = Self::paused_keywords(plan);
        let done = db.count(&format!(
            "SELECT count(*) FROM async_task WHERE keyword IN ({keywords}) AND state = 'done'"
        ));
        let held = db.count(&format!(
            "SELECT count(*) FROM async_task WHERE keyword IN ({keywords}) AND state = 'running'"
        )) + match db.backend() {
            Backend::Postgres if has_leases(db) => db.count(&format!(
                "SELECT count(*) FROM async_lease l JOIN async_task t ON t.id = l.task_id
                  WHERE t.keyword IN ({keywords})"
            )),
            _ => 0,
        };
        self.pause_mark = Some((done, held));
    }

    /// The pause's mark no longer holds (a node thawed, which applies the pause later): nothing
    /// is judged until [`Checks::paused`] marks it again.
    pub fn unmark_pause(&mut self) {
        self.pause_mark = None;
    }

    /// The domain is about to be resumed: once every node applied the pause, no more of its
    /// tasks finished than were in flight then.
    pub fn resumed(&mut self, plan: &Plan, db: &Db) {
        let Some((done_before, held)) = self.pause_mark.take() else {
            return;
        };
        let keywords = Self::paused_keywords(plan);
        let done = db.count(&format!(
            "SELECT count(*) FROM async_task WHERE keyword IN ({keywords}) AND state = 'done'"
        ));
        if done - done_before > held {
            self.violation(format!(
                "pause: {} task(s) of the paused domain's keywords finished while it was paused \
                 (in flight when every node had applied it: {held})",
                done - done_before
            ));
        }
    }

    /// While one database's handlers were blocked, each other database that had work left
    /// finished some: a blocked database holds its share of the process, not all of it.
    pub fn others_kept_pace(&mut self, dbs: &[&Db], before: &[(usize, i64, i64)]) {
        for &(i, done_before, left) in before {
            if left > 0 && finished(dbs[i]) == done_before {
                self.violation(format!(
                    "database {i} finished nothing while another database's handlers were \
                     blocked ({left} task(s) waiting)"
                ));
            }
        }
    }

    /// The tasks a frozen worker held when it froze are finished, or no longer held by the
    /// claims it held them with (given back by rescue, charged, to wait their turn: behind a
    /// backlog of due tasks, a rescued task's run waits for those before it), the bound after:
    /// a frozen worker holds nothing for long. A task it held by a row lock (no token to tell
    /// by) must be finished.
    pub fn frozen_held_run(&mut self, db: &Db, held: &Held) {
        if held.is_empty() {
            return;
        }
        let list = |ids: &[i64]| {
            ids.iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let unfinished: HashSet<i64> = db
            .numbers(&format!(
                "SELECT id AS n FROM async_task WHERE id IN ({})
                   AND state NOT IN ('done', 'dead', 'cancelled')",
                list(&held.ids())
            ))
            .into_iter()
            .collect();
        let still = |table: &str, id: &str, token: &str, claims: &[(i64, i64)], running: &str| {
            let claims: Vec<(i64, i64)> = claims
                .iter()
                .copied()
                .filter(|(id, _)| unfinished.contains(id))
                .collect();
            if claims.is_empty() {
                return Vec::new();
            }
            let pairs: Vec<String> = claims.iter().map(|(i, t)| format!("({i}, {t})")).collect();
            db.numbers(&format!(
                "SELECT {id} AS n FROM {table} WHERE ({id}, {token}) IN ({}){running}",
                pairs.join(", ")
            ))
        };
        let mut left = still(
            "async_task",
            "id",
            "claim_token",
            &held.stamped,
            " AND state = 'running'",
        );
        left.extend(still("async_lease", "task_id", "token", &held.leased, ""));
        left.extend(held.locked.iter().filter(|id| unfinished.contains(id)));
        if !left.is_empty() {
            left.sort_unstable();
            self.violation(format!(
                "a frozen worker's tasks still held by its claims {FROZEN_BOUND:?} after it \
                 froze: {left:?} of the {} it held",
                held.len()
            ));
        }
    }

    /// After the run, on database `i`: producers' tasks, chains, idle tenants, nodes.
    pub fn after(&mut self, plan: &Plan, db: &Db, _i: usize, _procs: &[Proc]) {
        let existing: HashSet<(String, String)> = keys(db);
        let mut found = Vec::new();
        for k in &self.rolled_back {
            if existing.contains(k) {
                found.push(format!("a task of a rolled-back producer exists: {k:?}"));
            }
        }
        if !self.pruned {
            let missing: Vec<&(String, String)> = self
                .committed
                .get(db.url())
                .into_iter()
                .flatten()
                .filter(|k| !existing.contains(*k))
                .take(5)
                .collect();
            if !missing.is_empty() {
                self.violation(format!(
                    "tasks committed by their producer are missing: {missing:?}"
                ));
            }
        }
        // Children: run (a ledger row) only once every parent was done.
        for (child, parents) in &self.parents {
            let ran = db.count(&format!(
                "SELECT count(*) FROM fault_ledger WHERE task_id = {child}"
            )) > 0;
            if !ran {
                continue;
            }
            for p in parents {
                // Pruned or not.
                let state = db.task_state(*p);
                if state != "done" {
                    found.push(format!(
                        "task {child} ran though its parent {p} ended {state:?}, not done"
                    ));
                }
            }
        }
        for v in found {
            self.violation(v);
        }
        // Without a fault that charges a failure (a kill, a freeze, a second SIGTERM to a
        // worker still stopping, a handler that aborts or hangs), tasks whose handlers succeed
        // are charged none: ended sessions release what they interrupt (the guide's failure
        // table). Not on SQLite, which meets none of these faults, and whose write lock a
        // handler may wait for past the task timeout (a hang, charged).
        let charging = self.forced
            || plan
                .faults
                .iter()
                .any(|(_, f)| matches!(f, Fault::Kill(_) | Fault::Freeze(..)))
            || plan
                .initial
                .iter()
                .any(|(k, ..)| *k == "fault.abort" || k.starts_with("fault.hang"));
        // A cut or a restart may hold a release past its task's 2 s deadline (seed 7139: a
        // cut of 2.8 s with a restart in it), and keep a node's beats out long enough for
        // another to rescue it, both of which the guide allows: there, only a node's rescue
        // of itself is judged ([`Checks::self_rescues`]).
        let outage = plan.cuts_replies() || plan.restarts_server().is_some();
        if !charging && !outage && plan.backend != Backend::Sqlite {
            let charged = db.numbers(
                "SELECT id AS n FROM async_task
                  WHERE keyword IN ('fault.ledger', 'fault.external', 'fault.order')
                    AND failures > 0 ORDER BY id",
            );
            if !charged.is_empty() {
                self.violation(format!(
                    "{} task(s) charged a failure with no fault that charges one: {:?}; {}",
                    charged.len(),
                    &charged[..charged.len().min(5)],
                    db.text(&format!(
                        "SELECT COALESCE(MAX(last_error), '') AS t FROM async_task WHERE id = {}",
                        charged[0]
                    ))
                ));
            }
        }
        // A hung handler of a domain with a timeout is charged by the domain's watchdog at
        // that timeout, before the process's own hang watchdog (`--task-timeout`) would.
        for domain in plan.domains.iter().filter(|d| d.timeout.is_some()) {
            for keyword in domain
                .keywords
                .iter()
                .filter(|k| k.starts_with("fault.hang"))
            {
                // Dead, and never charged by the process's hang watchdog (`running past its
                // deadline`): by the domain's (`timed out`), or by rescue when a process
                // died holding it.
                let wrong = db.numbers(&format!(
                    "SELECT id AS n FROM async_task WHERE keyword = '{keyword}'
                       AND (state <> 'dead' OR last_error LIKE 'running past its deadline%')"
                ));
                if !wrong.is_empty() {
                    self.violation(format!(
                        "{keyword} task(s) {wrong:?} of domain {} (timeout {:?}) not dead by its \
                         timeout: {:?}",
                        domain.name,
                        domain.timeout,
                        db.text(&format!(
                            "SELECT COALESCE(MAX(concat(state, ' ', last_error)), '') AS t FROM async_task WHERE keyword = '{keyword}'"
                        ))
                    ));
                }
            }
        }
        if plan.idle_tenants > 0 {
            let early = db.count(
                "SELECT count(*) FROM async_task WHERE tenant LIKE 'idle-%' AND state <> 'pending'",
            );
            if early > 0 {
                self.violation(format!("{early} idle tenant task(s), due in an hour, ran"));
            }
            // Not due within the run: out of the suite's count of unfinished tasks.
            db.exec("DELETE FROM async_task WHERE tenant LIKE 'idle-%' AND state = 'pending'");
        }
        let fresh = match db.backend() {
            Backend::Postgres => "SELECT count(*) FROM async_node WHERE state = 'alive' AND heartbeat_at > now() - interval '1500 milliseconds'",
            Backend::Sqlite => "SELECT count(*) FROM async_node WHERE state = 'alive' AND heartbeat_at > strftime('%Y-%m-%d %H:%M:%f', 'now', '-1.5 seconds')",
            Backend::Mysql => "SELECT count(*) FROM async_node WHERE state = 'alive' AND heartbeat_at > UTC_TIMESTAMP(3) - INTERVAL 1500000 MICROSECOND",
        };
        // The last beats of the workers stopped just now are at most a heartbeat old.
        std::thread::sleep(Duration::from_millis(1600));
        let alive = db.count(fresh);
        if alive > 0 {
            self.violation(format!(
                "{alive} node(s) still beating after every worker process ended"
            ));
        }
    }

    /// Adds the harness's figures and violations to `report`, then publishes it with the
    /// suite's invariants (`check_and_publish_chaos`, on every database); fails naming every
    /// violation.
    /// `crash`: what the harness knew of a crash of the server.
    pub fn publish(
        &self,
        sc: &Scenario,
        dbs: &[&Db],
        mut report: Report,
        crash: Option<&crate::invariants::Crash>,
    ) {
        report.add(
            "producers",
            format!(
                "{} task(s) committed, {} rolled back, {} refused by max_queued; {} error(s){}",
                self.committed.values().map(HashSet::len).sum::<usize>(),
                self.rolled_back.len(),
                self.refused,
                self.producer_errors.len(),
                if self.producer_errors.is_empty() {
                    String::new()
                } else {
                    format!(
                        ": {:?}",
                        &self.producer_errors[..self.producer_errors.len().min(3)]
                    )
                }
            ),
        );
        report.add("operator commands", self.operator_calls);
        report.add(
            "limits sampled",
            format!(
                "{} sample(s); highest seen: {:?}",
                self.samples, self.max_sampled
            ),
        );
        report.add(
            "harness invariants",
            if self.violations.is_empty() {
                "OK".to_owned()
            } else {
                format!("VIOLATED: {}", self.violations.join("; "))
            },
        );
        if self.violations.is_empty() {
            crate::invariants::check_and_publish_chaos(sc, dbs, report, crash);
        } else {
            sc.publish(&report);
            panic!("seed invariants violated:\n{}", self.violations.join("\n"));
        }
    }
}

/// The lines of a worker's log `text` where its rescue pass charged, for its heartbeat, a
/// node of its own process (three at most). The log names a node by id, and a process serving
/// several databases has a node, and an id, in each: `names_of(id)` gives the names of the
/// nodes with that id, one per database that has one, and a rescue is judged the process's
/// own only when every one of them is the process's (its log's start lines name it). None
/// when the process registered again (a node marked gone may be rescued by its successor).
fn own_rescues(text: &str, names_of: impl Fn(&str) -> Vec<String>) -> Vec<&str> {
    if text.contains("registered again as node") {
        return Vec::new();
    }
    let own: HashSet<&str> = text
        .lines()
        .filter_map(|l| {
            l.split("] node ")
                .nth(1)?
                .split_once(" (")?
                .1
                .split_once(") started on ")
        })
        .map(|(name, _)| name)
        .collect();
    text.lines()
        .filter(|l| l.contains("the node stopped heartbeating"))
        .filter(|l| {
            l.split("rescued from node ")
                .nth(1)
                .and_then(|r| r.split(':').next())
                .is_some_and(|node| {
                    let names = names_of(node);
                    !names.is_empty() && names.iter().all(|n| own.contains(n.as_str()))
                })
        })
        .take(3)
        .collect()
}

/// Samples the limits and progress of one database at each tick.
#[derive(Default)]
pub struct Sampler {
    finished: i64,
    since: Option<Instant>,
}

impl Sampler {
    /// Counts the pace from `away` after now: the server just came back after `away`, and the
    /// workers' backoff (doubling) brings them back within about as long again.
    pub fn excuse(&mut self, away: Duration) {
        self.since = Some(Instant::now() + away);
    }

    pub fn sample(
        &mut self,
        plan: &Plan,
        db: &Db,
        checks: &mut Checks,
        i: usize,
        locked: Option<usize>,
        stopping: bool,
    ) {
        checks.samples += 1;
        for tenant in &plan.tenants {
            if let Some(max) = tenant.max_running {
                let running = db.count(&format!(
                    "SELECT count(*) FROM async_task WHERE tenant = '{}' AND state = 'running'",
                    tenant.name
                ));
                note_max(checks, &format!("{} running", tenant.name), running);
                if running > max {
                    checks.violation(format!(
                        "tenant {}: {running} running, max_running {max}",
                        tenant.name
                    ));
                }
            }
            if let Some(max) = tenant.max_queued {
                let queued = db.count(&format!(
                    "SELECT count(*) FROM async_task WHERE tenant = '{}' AND state IN ('pending', 'blocked')",
                    tenant.name
                ));
                note_max(checks, &format!("{} queued", tenant.name), queued);
                if queued > max {
                    checks.violation(format!(
                        "tenant {}: {queued} queued, max_queued {max}",
                        tenant.name
                    ));
                }
            }
        }
        // A domain's MAX, as its nodes publish their slots.
        for domain in &plan.domains {
            let published = db.text(&format!(
                "SELECT COALESCE(MAX({}), '') AS t FROM async_node WHERE state = 'alive'",
                match db.backend() {
                    Backend::Postgres => "domains::text",
                    Backend::Mysql => "CAST(domains AS CHAR)",
                    Backend::Sqlite => "domains",
                }
            ));
            if let Ok(value) = serde_json::from_str::<serde_json::Value>(&published) {
                for d in value["domains"].as_array().into_iter().flatten() {
                    if d["domain"] == domain.name {
                        let running = d["running"].as_i64().unwrap_or(0);
                        note_max(checks, &format!("domain {} running", domain.name), running);
                        if running > domain.max as i64 {
                            checks.violation(format!(
                                "domain {}: {running} running on a node, MAX {}",
                                domain.name, domain.max
                            ));
                        }
                    }
                }
            }
        }
        // Progress: while due work waits, something finishes within the stall bound.
        let finished = db
            .count("SELECT count(*) FROM async_task WHERE state IN ('done', 'dead', 'cancelled')");
        let waiting = due_waiting(db) > 0;
        if finished != self.finished || !waiting || locked == Some(i) || stopping {
            self.finished = finished;
            self.since = Some(Instant::now());
        } else if let Some(since) = self.since {
            // While another database's handlers are blocked, this one keeps its pace: a
            // blocked database holds its share of the process, not all of it.
            // (Not for `drain`s: a database's loop ends once it has nothing due, and what is
            // enqueued for it after waits for the next drain, whatever the others do.)
            if locked.is_some() && !plan.drains && since.elapsed() > PACE {
                checks.violation(format!(
                    "database {i}: nothing finished for {PACE:?} while another database's \
                     handlers were blocked and {} due task(s) waited",
                    due_waiting(db)
                ));
                self.since = Some(Instant::now());
            } else if since.elapsed() > STALL {
                checks.violation(format!(
                    "database {i}: nothing finished for {STALL:?} while {} due task(s) waited: {:?}",
                    due_waiting(db),
                    db.states()
                ));
                self.since = Some(Instant::now());
            }
        } else {
            self.since = Some(Instant::now());
        }
    }
}

/// Whether the database has lock claims' leases (a schema before them has not).
fn has_leases(db: &Db) -> bool {
    db.count("SELECT count(*) FROM pg_tables WHERE tablename = 'async_lease'") > 0
}

fn note_max(checks: &mut Checks, what: &str, n: i64) {
    let e = checks.max_sampled.entry(what.to_owned()).or_default();
    *e = (*e).max(n);
}

fn key(t: &NewTask) -> (String, String) {
    (t.keyword().to_owned(), t.biz_id().to_owned())
}

fn keys(db: &Db) -> HashSet<(String, String)> {
    #[derive(diesel::QueryableByName)]
    struct K {
        #[diesel(sql_type = diesel::sql_types::Text)]
        keyword: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        biz_id: String,
    }
    use diesel::RunQueryDsl;
    db.with("keys", |c| {
        diesel::sql_query("SELECT keyword, biz_id FROM async_task").load::<K>(c)
    })
    .into_iter()
    .map(|k| (k.keyword, k.biz_id))
    .collect()
}

fn connect(db: &Db) -> outbox::DbConnection {
    DatabaseUrl::parse(db.url())
        .expect("url")
        .connect()
        .expect("connect")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seed 6621's node 1, before the fix, rescued its own tasks; another node's rescue of it,
    /// or a process that registered again and rescues its old id, is not that.
    #[test]
    fn a_nodes_rescue_of_itself_is_told_from_its_log() {
        let started = "[2026-11-28T09:18:13Z INFO  outbox::worker::engine] node 1 (vm:11309) \
                       started on mysql: keywords [\"fault.ledger\"]\n";
        let rescued = "[2026-11-28T09:18:17Z WARN  outbox::worker::rescue] task 191: rescued \
                       from node 1: the node stopped heartbeating → pending\n";
        let other = "[2026-11-28T09:18:13Z INFO  outbox::worker::engine] node 2 (vm:11310) \
                     started on mysql: keywords [\"fault.ledger\"]\n";
        let again = "[2026-11-28T09:18:16Z WARN  outbox::worker::heartbeat] node 1 (vm:11309) \
                     is no longer registered as alive (…): registered again as node 3\n";
        // Node 1 is vm:11309's in each database given.
        let one = |names: &'static [&'static str]| {
            move |node: &str| match node {
                "1" => names.iter().map(|n| (*n).to_owned()).collect(),
                _ => Vec::new(),
            }
        };
        let found =
            |text: String, names: &'static [&'static str]| own_rescues(&text, one(names)).len();
        assert_eq!(found(format!("{started}{rescued}"), &["vm:11309"]), 1);
        assert_eq!(found(format!("{other}{rescued}"), &["vm:11309"]), 0);
        assert_eq!(
            found(format!("{started}{again}{rescued}"), &["vm:11309"]),
            0
        );
        // A fleet's process has a node in each database: id 1 is its own in both, or its
        // own in one and another process's in the other (a rescue there of the other's).
        let fleet = format!("{started}{}", started.replace("node 1 ", "node 2 "));
        assert_eq!(
            found(format!("{fleet}{rescued}"), &["vm:11309", "vm:11309"]),
            1
        );
        assert_eq!(
            found(format!("{fleet}{rescued}"), &["vm:11309", "vm:11310"]),
            0
        );
    }
}

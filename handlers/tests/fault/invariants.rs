//! The invariants checked after each scenario, and the figures they are checked on.
//!
//! With lock claims a chunk that rolls back (its process killed, its connection terminated,
//! the server restarted) leaves no trace in its tasks' rows, and runs their external effects
//! again: at least once, as promised, but with no `last_error`. There the external file's
//! lines name the chunk's transaction, and an extra run is accepted when its transaction
//! rolled back (see [`Figures::explain_rolled_back`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::Path;

use diesel::prelude::*;

use crate::db::{Db, StateCount};
use crate::report::Report;
use crate::scenario::Scenario;
use crate::DEFAULT_MAX_ATTEMPTS;

/// What a finished scenario left in the database and the external file.
#[derive(Debug, Default)]
pub struct Figures {
    tasks: i64,
    done: i64,
    dead: i64,
    /// Cancelled: finished, in a scenario whose operators or producers cancel.
    cancelled: i64,
    cancels: bool,
    states: BTreeMap<String, i64>,
    ledger_rows: i64,
    /// Ledger task ids with more than one row.
    ledger_dups: i64,
    /// Done `fault.ledger` tasks without a row.
    ledger_missing: i64,
    /// Rows for tasks that are not done `fault.ledger` tasks.
    ledger_stray: i64,
    /// Rows written by a handler that found a parent of its task not done.
    ledger_early: i64,
    external_lines: usize,
    /// Done `fault.external` tasks not in the file.
    external_missing: usize,
    /// Tasks in the file more than once, and their extra lines.
    external_dup_tasks: usize,
    external_dup_lines: usize,
    /// Of those, tasks with no `last_error` (a silent second run).
    external_dup_unexplained: Vec<i64>,
    /// Tasks of that kind that a worker logged as a claim taken over, in a scenario where a
    /// server crash can lose a claim (see [`Figures::explain_lost_claims`]).
    external_dup_lost_claim: usize,
    /// Tasks of that kind whose extra runs were all in transactions that rolled back (lock
    /// claims, see [`Figures::explain_rolled_back`]).
    external_dup_rolled_back: usize,
    /// External lines by what the transaction they name did (lock claims).
    external_xact_lines: BTreeMap<String, usize>,
    /// Each external line's task and the transaction it names, if any.
    external_runs: Vec<(i64, Option<String>)>,
    /// Tasks with a line naming a transaction that neither completed the task nor rolled
    /// back, or with two lines naming the one that completed it.
    external_committed_wrong: Vec<i64>,
    /// Ids in the file that are not `fault.external` tasks.
    external_unknown: usize,
    /// Tasks with more failures than their max attempts.
    over_max: i64,
    /// Tasks charged at least one failure, by the start of their `last_error`.
    pub charged: BTreeMap<String, i64>,
}

/// The ledger rows of tasks that are not done `fault.ledger` or `fault.order` tasks, pruned or
/// not.
pub const LEDGER_STRAY: &str =
    "SELECT count(*) FROM fault_ledger l WHERE NOT EXISTS (SELECT 1 FROM fault_tasks t
   WHERE t.id = l.task_id AND t.keyword IN ('fault.ledger', 'fault.order') AND t.state = 'done')";

impl Figures {
    fn collect(db: &Db, external: &Path) -> Figures {
        let states = db.states();
        let get = |s: &str| states.get(s).copied().unwrap_or(0);
        let mut f = Figures {
            tasks: states.values().sum(),
            done: get("done"),
            dead: get("dead"),
            cancelled: get("cancelled"),
            ledger_rows: db.count("SELECT count(*) FROM fault_ledger"),
            ledger_dups: db.count(
                "SELECT count(*) FROM (SELECT task_id FROM fault_ledger GROUP BY task_id HAVING count(*) > 1) d",
            ),
            ledger_missing: db.count(
                "SELECT count(*) FROM async_task t WHERE t.keyword IN ('fault.ledger', 'fault.order') AND t.state = 'done'
                   AND NOT EXISTS (SELECT 1 FROM fault_ledger l WHERE l.task_id = t.id)",
            ),
            ledger_early: db.count("SELECT count(*) FROM fault_ledger WHERE early > 0"),
            ledger_stray: db.count(LEDGER_STRAY),
            over_max: db.count(&format!(
                "SELECT count(*) FROM async_task WHERE failures > COALESCE(max_attempts, {DEFAULT_MAX_ATTEMPTS})"
            )),
            charged: db
                .with("charged failures", |c| {
                    diesel::sql_query(
                        "SELECT CASE
                           WHEN last_error LIKE 'rescued from node %: the node stopped heartbeating'
                             THEN 'rescued: node stopped heartbeating'
                           WHEN last_error LIKE 'rescued from node %: running past its deadline'
                             THEN 'rescued: past its deadline'
                           ELSE COALESCE(substr(last_error, 1, 50), '(none)') END AS state,
                           count(*) AS n
                         FROM async_task WHERE failures > 0 GROUP BY 1",
                    )
                    .load::<StateCount>(c)
                })
                .into_iter()
                .map(|r| (r.state, r.n))
                .collect(),
            states,
            ..Figures::default()
        };

        let text = std::fs::read_to_string(external).unwrap_or_default();
        let mut seen: HashMap<i64, usize> = HashMap::new();
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let id: i64 = fields
                .next()
                .unwrap_or_default()
                .parse()
                .unwrap_or_else(|e| panic!("external file line {line:?}: {e}"));
            let xid = fields.next().map(str::to_owned);
            assert!(fields.next().is_none(), "external file line {line:?}");
            *seen.entry(id).or_default() += 1;
            f.external_lines += 1;
            f.external_runs.push((id, xid));
        }
        let external: HashSet<i64> = db
            .numbers("SELECT id AS n FROM fault_tasks WHERE keyword = 'fault.external'")
            .into_iter()
            .collect();
        let done: Vec<i64> = db.numbers(
            "SELECT id AS n FROM async_task WHERE keyword = 'fault.external' AND state = 'done'",
        );
        let without_error: HashSet<i64> = db
            .numbers("SELECT id AS n FROM async_task WHERE keyword = 'fault.external' AND last_error IS NULL")
            .into_iter()
            .collect();
        f.external_missing = done.iter().filter(|id| !seen.contains_key(id)).count();
        f.external_unknown = seen.keys().filter(|id| !external.contains(id)).count();
        for (&id, &times) in &seen {
            if times > 1 {
                f.external_dup_tasks += 1;
                f.external_dup_lines += times - 1;
                if without_error.contains(&id) {
                    f.external_dup_unexplained.push(id);
                }
            }
        }
        f.external_dup_unexplained.sort_unstable();
        f
    }

    /// Accepts a silent second run of the tasks in `lost_claims`: a claim commits without waiting
    /// for its WAL flush (docs/guide/src/failure.md, "Choices"), so a server crash can lose it; the
    /// task then runs again with no `last_error`, and the worker that ran it first logs that its
    /// claim was taken over. Only for scenarios that crash the server.
    fn explain_lost_claims(&mut self, lost_claims: &HashSet<i64>) {
        let before = self.external_dup_unexplained.len();
        self.external_dup_unexplained
            .retain(|id| !lost_claims.contains(id));
        self.external_dup_lost_claim += before - self.external_dup_unexplained.len();
    }

    /// Accepts a silent second run of a task whose claim a crash lost: exactly two lines, both
    /// outside a transaction, one written between the crash's mark and the server's return
    /// ([`Crash::lines`]), one after. A claim committed before the mark survives the crash (the
    /// mark's commit flushed it), and a run's line comes after its claim; a claim the crash
    /// kept leaves its task running, and whoever frees it notes it. The first worker may have
    /// ended before it could log the lost claim (killed, or aborted by another task of its
    /// page).
    fn explain_crash_reruns(&mut self, crash: &Crash) {
        let (mark, back) = crash.lines;
        // Per task: lines before the mark, in the window, after it, and in a transaction.
        let mut lines: HashMap<i64, (usize, usize, usize, usize)> = HashMap::new();
        for (at, (id, xid)) in self.external_runs.iter().enumerate() {
            let e = lines.entry(*id).or_default();
            if xid.is_some() {
                e.3 += 1;
            } else if at < mark {
                e.0 += 1;
            } else if at < back {
                e.1 += 1;
            } else {
                e.2 += 1;
            }
        }
        let n = self.external_dup_unexplained.len();
        self.external_dup_unexplained
            .retain(|id| lines.get(id) != Some(&(0, 1, 1, 0)));
        self.external_dup_lost_claim += n - self.external_dup_unexplained.len();
    }

    /// Accepts the extra runs of an external effect made in transactions that rolled back
    /// (lock claims). A line naming the transaction that completed its task (the done row's
    /// `xmin`) is that task's completing run, at most one per task. Any other line naming a
    /// transaction is a run whose transaction did not complete the task, so it must have
    /// rolled back (`pg_xact_status`); after a server crash (`crashed`), a transaction the
    /// crash lost may have left its id to a later one, which may have committed, so there a
    /// committed status is accepted too (and counted), and so is a line that names the
    /// completing transaction before that transaction's own line (the crash lost the first
    /// run and left its id to the rerun that completed the task). A task whose lines, less those of
    /// rolled-back runs, number at most one ran its effect once outside them. A line without
    /// a transaction (a run outside a chunk, after a chunk rolled back) is counted as before.
    ///
    /// `crash`: the server crashed, and the transaction ids from `.0` on, named by the first
    /// `.1` lines, may have been lost and given again (`(0, usize::MAX)`: any of the run's).
    fn explain_rolled_back(&mut self, db: &Db, crash: Option<(u64, usize)>) {
        let xids: BTreeSet<&str> = self
            .external_runs
            .iter()
            .filter_map(|(_, xid)| xid.as_deref())
            .collect();
        if xids.is_empty() {
            return;
        }
        let status = xact_status(db, &xids, crash.is_some());
        // The done rows' xmin: a 32-bit transaction id, the low half of the full one (of the
        // pruned ones, as saved before the prune).
        let completed_in: HashMap<i64, u64> = db
            .with("completing transactions", |c| {
                diesel::sql_query(
                    "SELECT id AS n, CAST(CAST(xmin AS text) AS BIGINT) AS m FROM async_task
                     WHERE keyword = 'fault.external' AND state = 'done'
                     UNION ALL
                     SELECT DISTINCT p.id AS n, p.completed_xmin AS m FROM fault_pruned p
                     WHERE p.keyword = 'fault.external' AND p.state = 'done'
                       AND p.completed_xmin IS NOT NULL
                       AND NOT EXISTS (SELECT 1 FROM async_task t WHERE t.id = p.id)",
                )
                .load::<IdXmin>(c)
            })
            .into_iter()
            .map(|r| (r.n, r.m as u64))
            .collect();
        let mut completing: HashMap<i64, usize> = HashMap::new();
        let mut kept: HashMap<i64, usize> = HashMap::new();
        let mut wrong = BTreeSet::new();
        // After a crash, a transaction the crash lost may have left its id to the one that
        // later completed the same task (a chunk rerun after the restart): the task's lines
        // then name the completing transaction twice, the lost run first. The last such line
        // is the completing run; the earlier ones are the lost transaction's.
        let last_line: HashMap<(i64, &str), usize> = self
            .external_runs
            .iter()
            .enumerate()
            .filter_map(|(at, (id, xid))| xid.as_deref().map(|xid| ((*id, xid), at)))
            .collect();
        for (at, (id, xid)) in self.external_runs.iter().enumerate() {
            let Some(xid) = xid else {
                *self.external_xact_lines.entry("none".into()).or_default() += 1;
                *kept.entry(*id).or_default() += 1;
                continue;
            };
            let full: u64 = xid.parse().expect("a transaction id");
            let crashed = crash.is_some_and(|(from, lines)| full >= from && at < lines);
            let completes = completed_in.get(id) == Some(&(full & 0xffff_ffff));
            let kind = if completes && crashed && last_line[&(*id, xid.as_str())] != at {
                "id reused after the crash"
            } else if completes {
                *completing.entry(*id).or_default() += 1;
                *kept.entry(*id).or_default() += 1;
                "completing"
            } else {
                match status[xid.as_str()].as_str() {
                    "aborted" => "rolled back",
                    "lost in the crash" if crashed => "lost in the crash",
                    "committed" if crashed => "id reused after the crash",
                    other => {
                        wrong.insert(*id);
                        *kept.entry(*id).or_default() += 1;
                        if other == "committed" {
                            "committed, not completing"
                        } else {
                            "other"
                        }
                    }
                }
            };
            *self.external_xact_lines.entry(kind.to_owned()).or_default() += 1;
        }
        wrong.extend(
            completing
                .iter()
                .filter(|(_, n)| **n > 1)
                .map(|(id, _)| *id),
        );
        self.external_committed_wrong = wrong.into_iter().collect();
        let before = self.external_dup_unexplained.len();
        self.external_dup_unexplained
            .retain(|id| kept.get(id).copied().unwrap_or(0) > 1);
        self.external_dup_rolled_back = before - self.external_dup_unexplained.len();
    }

    /// Tasks neither done nor dead (nor, where the scenario cancels, cancelled).
    fn lost(&self) -> i64 {
        let cancelled = if self.cancels { self.cancelled } else { 0 };
        self.tasks - self.done - self.dead - cancelled
    }

    /// Every invariant that does not hold.
    fn violations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.lost() != 0 {
            v.push(format!(
                "{} task(s) neither done nor dead{}: {:?}",
                self.lost(),
                if self.cancels { " nor cancelled" } else { "" },
                self.states
            ));
        }
        if self.ledger_dups != 0 {
            v.push(format!(
                "{} ledger task(s) with more than one row",
                self.ledger_dups
            ));
        }
        if self.ledger_missing != 0 {
            v.push(format!(
                "{} done fault.ledger task(s) without a ledger row",
                self.ledger_missing
            ));
        }
        if self.ledger_stray != 0 {
            v.push(format!(
                "{} ledger row(s) for tasks that are not done fault.ledger tasks",
                self.ledger_stray
            ));
        }
        if self.ledger_early != 0 {
            v.push(format!(
                "{} ledger row(s) written while a parent of the task was not done",
                self.ledger_early
            ));
        }
        if self.external_missing != 0 {
            v.push(format!(
                "{} done fault.external task(s) missing from the external file",
                self.external_missing
            ));
        }
        if self.external_unknown != 0 {
            v.push(format!(
                "{} id(s) in the external file are not fault.external tasks",
                self.external_unknown
            ));
        }
        if !self.external_dup_unexplained.is_empty() {
            v.push(format!(
                "{} task(s) ran their external effect more than once with no last_error: {:?}",
                self.external_dup_unexplained.len(),
                &self.external_dup_unexplained[..self.external_dup_unexplained.len().min(20)]
            ));
        }
        if !self.external_committed_wrong.is_empty() {
            v.push(format!(
                "{} task(s) with an external run in a transaction that neither completed them nor rolled back, or two in the one that did: {:?}",
                self.external_committed_wrong.len(),
                &self.external_committed_wrong[..self.external_committed_wrong.len().min(20)]
            ));
        }
        if self.over_max != 0 {
            v.push(format!(
                "{} task(s) with failures > max_attempts",
                self.over_max
            ));
        }
        v
    }

    fn add_to(&self, report: &mut Report) {
        report.add(
            "done / dead / lost",
            format!("{} / {} / {}", self.done, self.dead, self.lost()),
        );
        report.add(
            "ledger rows",
            format!(
                "{} ({} duplicated, {} missing, {} stray, {} before a parent was done)",
                self.ledger_rows,
                self.ledger_dups,
                self.ledger_missing,
                self.ledger_stray,
                self.ledger_early
            ),
        );
        report.add(
            "external duplicates",
            format!(
                "{} task(s), {} extra line(s) of {} ({} without last_error, {} more after a claim lost in a crash{})",
                self.external_dup_tasks,
                self.external_dup_lines,
                self.external_lines,
                self.external_dup_unexplained.len(),
                self.external_dup_lost_claim,
                if self.external_xact_lines.is_empty() {
                    String::new()
                } else {
                    format!(", {} more only in rolled-back chunks", self.external_dup_rolled_back)
                }
            ),
        );
        if !self.external_xact_lines.is_empty() {
            report.add(
                "external lines by xact",
                format!("{:?}", self.external_xact_lines),
            );
        }
        report.add("failures > max", self.over_max);
        report.add(
            "charged a failure",
            format!(
                "{} task(s) {:?}",
                self.charged.values().sum::<i64>(),
                self.charged
            ),
        );
    }
}

/// Collects the figures, adds them to the report, publishes it, and fails the test if an
/// invariant does not hold (or, with `expect_no_dead`, if any task died).
pub fn check_and_publish(sc: &Scenario, db: &Db, report: Report, expect_no_dead: bool) -> Figures {
    check_and_publish_after_crash(sc, db, report, expect_no_dead, &HashSet::new(), false)
}

/// [`check_and_publish`] for a scenario that restarted the server: a silent second run of a
/// task in `lost_claims` is not a violation ([`Figures::explain_lost_claims`]); `crashed`:
/// the server crashed (`-m immediate`), losing transactions whose ids may be reused
/// ([`Figures::explain_rolled_back`]).
pub fn check_and_publish_after_crash(
    sc: &Scenario,
    db: &Db,
    mut report: Report,
    expect_no_dead: bool,
    lost_claims: &HashSet<i64>,
    crashed: bool,
) -> Figures {
    let mut figures = Figures::collect(db, &sc.external_file());
    figures.explain_lost_claims(lost_claims);
    if sc.locks() {
        figures.explain_rolled_back(db, crashed.then_some((0, usize::MAX)));
    }
    figures.add_to(&mut report);
    let mut violations = figures.violations();
    if expect_no_dead && figures.dead != 0 {
        violations.push(format!(
            "{} task(s) dead, none expected in this scenario",
            figures.dead
        ));
    }
    report.add(
        "invariants",
        if violations.is_empty() {
            "OK".to_owned()
        } else {
            format!("VIOLATED: {}", violations.join("; "))
        },
    );
    sc.publish(&report);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    figures
}

/// [`check_and_publish_after_crash`] for a failover (the primary stopped `-m immediate`, its
/// standby promoted): a crash for the claims the standby had not received, whatever the
/// claim style; `lock_claims`: the scenario's workers take lock claims whatever
/// `OUTBOX_FAULT_CLAIM` says (batched mode's default on PostgreSQL), so an extra external run
/// in a transaction that rolled back is accepted ([`Figures::explain_rolled_back`]).
pub fn check_and_publish_failover(
    sc: &Scenario,
    db: &Db,
    mut report: Report,
    lost_claims: &HashSet<i64>,
    lock_claims: bool,
) -> Figures {
    let mut figures = Figures::collect(db, &sc.external_file());
    figures.explain_lost_claims(lost_claims);
    if lock_claims || sc.locks() {
        figures.explain_rolled_back(db, Some((0, usize::MAX)));
    }
    figures.add_to(&mut report);
    let mut violations = figures.violations();
    if figures.dead != 0 {
        violations.push(format!(
            "{} task(s) dead, none expected in this scenario",
            figures.dead
        ));
    }
    report.add(
        "invariants",
        if violations.is_empty() {
            "OK".to_owned()
        } else {
            format!("VIOLATED: {}", violations.join("; "))
        },
    );
    sc.publish(&report);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
    figures
}

/// What the seeded harness knew of a crash of a PostgreSQL server (a restart `immediate`).
pub struct Crash {
    /// The tasks whose claims the processes alive at the crash logged as taken over from the
    /// crash on.
    pub lost_claims: HashSet<i64>,
    /// Lines of the external file at the crash's mark ([`durable_xid`]), and once the server
    /// was back.
    pub lines: (usize, usize),
    /// The mark's transaction id: no transaction that committed before it is lost, and no id
    /// up to it is given again.
    pub xid_from: u64,
}

/// [`check_and_publish`] for the seeded harness: cancelled tasks are finished (its operators
/// and producers cancel), and on PostgreSQL an extra external run in a transaction that rolled
/// back is accepted whatever the claim style (its workers' styles vary by seed). `crash`: the
/// server crashed ([`Crash`]): a silent rerun of a task whose claim it lost is accepted, and a
/// run in a transaction it lost. Every database of `dbs` is checked alike; the figures of the
/// second and later are reported under their number (`database 2: …`).
pub fn check_and_publish_chaos(
    sc: &Scenario,
    dbs: &[&Db],
    mut report: Report,
    crash: Option<&Crash>,
) {
    let mut violations = Vec::new();
    for (i, db) in dbs.iter().enumerate() {
        let mut figures = Figures::collect(db, &sc.external_file());
        figures.cancels = true;
        if let Some(crash) = crash {
            figures.explain_lost_claims(&crash.lost_claims);
        }
        if db.backend() == outbox::Backend::Postgres {
            figures.explain_rolled_back(db, crash.map(|c| (c.xid_from, c.lines.1)));
        }
        if let Some(crash) = crash {
            figures.explain_crash_reruns(crash);
        }
        let prefix = match i {
            0 => String::new(),
            _ => format!("database {}: ", i + 1),
        };
        let mut own = Report::new();
        figures.add_to(&mut own);
        for (key, value) in own.lines {
            report.add(&format!("{prefix}{key}"), value);
        }
        violations.extend(
            figures
                .violations()
                .into_iter()
                .map(|v| format!("{prefix}{v}")),
        );
    }
    report.add(
        "invariants",
        if violations.is_empty() {
            "OK".to_owned()
        } else {
            format!("VIOLATED: {}", violations.join("; "))
        },
    );
    sc.publish(&report);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// `pg_xact_status` of each transaction id (`committed`, `aborted`, `in progress`).
/// After a crash (`crashed`), an id the server has not given since (a transaction the crash
/// lost, whose id is still ahead) is `lost in the crash`: `pg_xact_status` refuses an id from
/// the future.
fn xact_status(db: &Db, xids: &BTreeSet<&str>, crashed: bool) -> HashMap<String, String> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = diesel::sql_types::Text)]
        xid: String,
        #[diesel(sql_type = diesel::sql_types::Text)]
        status: String,
    }
    let mut status = HashMap::new();
    let next = match crashed {
        true => next_xid(db),
        false => u64::MAX,
    };
    let (ahead, xids): (Vec<&str>, Vec<&str>) = xids
        .iter()
        .copied()
        .partition(|x| x.parse::<u64>().is_ok_and(|x| x >= next));
    for xid in ahead {
        status.insert(xid.to_owned(), "lost in the crash".to_owned());
    }
    for chunk in xids.chunks(1_000) {
        let values: Vec<String> = chunk
            .iter()
            .map(|x| {
                assert!(
                    x.bytes().all(|b| b.is_ascii_digit()),
                    "transaction id {x:?}"
                );
                format!("('{x}')")
            })
            .collect();
        let sql = format!(
            "SELECT v.xid, COALESCE(pg_xact_status(CAST(v.xid AS xid8)), 'unknown') AS status
             FROM (VALUES {}) AS v(xid)",
            values.join(", ")
        );
        for row in db.with("transaction status", |c| {
            diesel::sql_query(&sql).load::<Row>(c)
        }) {
            status.insert(row.xid, row.status);
        }
    }
    status
}

/// A transaction id no transaction has reached yet (`pg_current_snapshot`'s xmax: every id
/// from it on is unfinished or not given yet).
pub fn next_xid(db: &Db) -> u64 {
    db.count("SELECT CAST(CAST(pg_snapshot_xmax(pg_current_snapshot()) AS text) AS BIGINT)") as u64
}

/// A mark before a crash: a transaction id taken, written in a row and committed, so that its
/// commit waits for its flush (`synchronous_commit` is on; a transaction that writes no WAL
/// would not wait). Every commit before it is then in the log: the crash loses none of them,
/// and recovery gives no id up to it again.
pub fn durable_xid(db: &Db) -> u64 {
    db.exec("CREATE TABLE IF NOT EXISTS fault_crash_mark (xid BIGINT NOT NULL)");
    db.numbers(
        "INSERT INTO fault_crash_mark (xid)
         VALUES (CAST(CAST(pg_current_xact_id() AS text) AS BIGINT)) RETURNING xid AS n",
    )[0] as u64
}

#[derive(QueryableByName)]
struct IdXmin {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    m: i64,
}

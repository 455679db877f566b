//! The seeded fault harness (`scripts/chaos.sh`): from a seed, a configuration (backend,
//! strict or batched, claim style, domains, tenants, chains, cron, strategy, one or two
//! databases), a workload (producers in transactions, some rolled back; handlers that succeed,
//! fail, panic, abort the process, hang in SQL and outside it; operators cancelling,
//! retrying, pausing, pruning) and a schedule of faults (SIGKILL, SIGSTOP/SIGCONT, SIGTERM,
//! sessions ended by the server, a lock held on a handler's table, replies lost with their
//! connection after the server ran the statement, the server restarted or crashed), run on
//! the real binaries and servers; then the invariants of `shared/DESIGN.md` checked, each with
//! its figures.
//!
//! `seed N` is printed first; `scripts/chaos.sh --seed N` replays it: the same plan, run
//! again (the same configuration, workload and fault schedule; the processes' own timing
//! differs from run to run).
//!
//! What it checks (see [`checks`]): every committed task done, dead or cancelled within the
//! bound after the faults stop, and no task of a rolled-back producer; each in-database effect
//! exactly once, external ones at least once, more only for rescued or released tasks; no
//! limit passed (a domain's MAX as its nodes publish it, a tenant's `max_running` and
//! `max_queued`), sampled every tick; no child run before its parents were done; a paused
//! domain's keywords not run while paused; no stall longer than the bound while due work
//! waits (per database); no node alive after its process ended; no producer's or operator's
//! call failing with a deadlock; no task whose handler succeeds charged a failure without a
//! fault that charges one.

mod checks;
mod cut;
mod plan;

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use outbox::{Backend, NewTask};

use crate::cluster::Cluster;
use crate::db::{fault_db, task, Db};
use crate::invariants::{durable_xid, Crash};
use crate::logs::lost_claim_ids;
use crate::report::{secs, Report};
use crate::scenario::{Proc, Scenario};
use crate::COMMAND_LIMIT;
use checks::{Checks, Sampler};
use plan::{Fault, Operation, Plan};

/// How long the tasks have, after the faults stop, to be done, dead or cancelled.
const BOUND: Duration = Duration::from_secs(90);

/// One tick of the run loop.
const TICK: Duration = Duration::from_millis(100);

/// A database of the run: the test's handle (none on a server of the seed's own), its view,
/// its URL.
struct Database {
    _test_db: Option<crate::support::TestDb>,
    db: Db,
    url: String,
    /// The workers' way to the database when the plan cuts replies.
    proxy: Option<cut::CutProxy>,
}

/// A crash of the PostgreSQL server (a restart `immediate`), as the harness saw it.
struct CrashMark {
    /// The mark's transaction id ([`durable_xid`]).
    xid: u64,
    /// When the mark was taken.
    at: SystemTime,
    /// The external file's lines at the mark, and once the server was back.
    lines: (usize, usize),
    /// The logs of the workers alive at the crash.
    alive: Vec<PathBuf>,
}

/// A worker slot: its process now, how many times it was started.
struct Slot {
    proc: Option<Proc>,
    starts: usize,
    frozen_until: Option<Instant>,
    /// Sent SIGTERM and not yet exited: it claims nothing more, on any of its databases.
    stopping: bool,
    /// The stderr of each of its processes.
    logs: Vec<PathBuf>,
}

/// Runs the plan of `seed` and checks it; panics naming every violated invariant.
pub fn run_seed(seed: u64) {
    let plan = Plan::from_seed(seed, cfg!(feature = "mysql"));
    eprintln!("seed {seed}");
    let sc = Scenario::start(&format!("chaos_seed_{seed}"), plan.backend.name());
    let mut report = Report::new();
    for (key, value) in plan.describe() {
        report.add(&key, value);
    }
    // A plan that restarts the server runs on a server of its own, the shared one left alone.
    let cluster = plan
        .restarts_server()
        .map(|_| Cluster::start(&sc, plan.backend));
    let databases: Vec<Database> = (0..plan.databases)
        .map(|i| {
            let (test_db, db) = match &cluster {
                Some(cluster) => {
                    let url = cluster.create_database(&format!("chaos_{i}"));
                    sc.spawn("migrate", &url, &["migrate".to_owned()])
                        .expect_exit_0(COMMAND_LIMIT);
                    let db = Db::new(&url);
                    db.create_fault_ledger();
                    (None, db)
                }
                None => {
                    let (test_db, db) = fault_db(plan.backend);
                    (Some(test_db), db)
                }
            };
            let url = db.url().to_owned();
            Database {
                _test_db: test_db,
                db,
                proxy: plan
                    .cuts_replies()
                    .then(|| cut::CutProxy::start(&url, seed)),
                url,
            }
        })
        .collect();
    let mut checks = Checks::new(&plan);
    for database in &databases {
        setup(&sc, &plan, database, &mut checks);
    }
    let crontab = plan.cron.then(|| {
        let path = sc.path("jobs.cron");
        std::fs::write(&path, "*/2 * * * * * fault.ledger {}\n").expect("crontab");
        path
    });
    let mut slots: Vec<Slot> = (0..plan.workers)
        .map(|_| Slot {
            proc: None,
            starts: 0,
            frozen_until: None,
            stopping: false,
            logs: Vec::new(),
        })
        .collect();
    // The workers' URLs: through the proxy when the plan cuts replies (operators, producers
    // and the checks connect directly).
    let urls: Vec<&str> = databases
        .iter()
        .map(|d| d.proxy.as_ref().map_or(d.url.as_str(), |p| p.url.as_str()))
        .collect();
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5eed);
    let started = Instant::now();
    let mut faults = plan.faults.iter().peekable();
    let mut operations = plan.operations.iter().peekable();
    let mut producer_at = plan.window / (plan.producer_batches as u32 + 1);
    let mut produced = 0;
    let mut samplers: Vec<Sampler> = databases.iter().map(|_| Sampler::default()).collect();
    let mut timeline: Vec<String> = Vec::new();
    let mut lock_holder: Option<(usize, diesel_holder::Holder, Instant)> = None;
    // What the other databases had finished, and had left, when one's table was locked.
    let mut lock_progress: Option<Vec<(usize, i64, i64)>> = None;
    // The tasks each frozen worker held, to be finished by others by the instant given.
    let mut frozen_checks: Vec<(Instant, checks::Held)> = Vec::new();
    let mut pause: Option<Instant> = None;
    // When every node has applied the pause (a heartbeat and more after the command).
    let mut pause_applied: Option<Instant> = None;
    // While the proxies cut replies: until when. The bound counts from the faults' end: the
    // window's, or a cut's or a restart's that goes on past it.
    let mut cut_until: Option<Instant> = None;
    let mut faults_end = plan.window;
    let mut crash: Option<CrashMark> = None;

    // The faults' window, then the bound for the tasks to finish.
    loop {
        let now = started.elapsed();
        let in_window = now < plan.window;
        let thaws: Vec<Option<Instant>> = slots.iter().map(|s| s.frozen_until).collect();
        let restarted = supervise(
            &sc,
            &plan,
            &mut slots,
            &urls,
            crontab.as_ref(),
            in_window,
            &mut timeline,
            now,
        );
        // On SQLite a worker frozen while it writes holds the one write lock, and this loop's
        // producers wait for it (up to their busy timeout, each): the thaw then comes late,
        // and nothing of anyone's could finish meanwhile. The bound follows the thaw.
        if plan.backend == Backend::Sqlite {
            let late = thaws
                .iter()
                .zip(&slots)
                .filter(|(until, slot)| until.is_some() && slot.frozen_until.is_none())
                .filter_map(|(until, _)| Instant::now().checked_duration_since((*until)?))
                .max();
            if let Some(late) = late {
                for (until, _) in &mut frozen_checks {
                    *until += late;
                }
            }
        }
        // A node frozen while a pause was applied applies it at its first heartbeat after
        // its thaw, and may claim with its old plan until then (the guide: a pause holds from
        // each node's next heartbeat): the pause's mark waits for that, taken again.
        let thawed = thaws
            .iter()
            .zip(&slots)
            .any(|(until, slot)| until.is_some() && slot.frozen_until.is_none());
        if thawed && pause.is_some() {
            checks.unmark_pause();
            pause_applied = Some(Instant::now() + PAUSE_APPLIED);
        }
        if restarted {
            // A worker that exits (a hang past the task timeout, a kill) leaves what it held
            // to rescue after its `--dead-after`: the frozen worker's tasks it had taken over
            // too, when it is the only one. The bound counts from the last exit.
            let by = Instant::now() + checks::FROZEN_BOUND;
            for (until, _) in &mut frozen_checks {
                *until = (*until).max(by);
            }
        }
        while let Some((at, fault)) = faults.peek() {
            if *at > now {
                break;
            }
            if let Fault::CutReplies(d) = fault {
                for database in &databases {
                    database.proxy.as_ref().expect("a proxy").cut(true);
                }
                cut_until = Some(Instant::now() + *d);
                timeline.push(format!("{}: replies cut for {}", secs(now), secs(*d)));
                faults.next();
                continue;
            }
            if let Fault::RestartServer(how) = fault {
                // Before a crash of PostgreSQL, a mark of the harness's own, flushed: no commit
                // before it can be lost (MariaDB's test server writes its log at every commit:
                // a killed server loses none).
                let external_lines =
                    || std::fs::read_to_string(sc.external_file()).map_or(0, |t| t.lines().count());
                // The lines counted first: each counted line's claim committed before the mark.
                let mark = (*how == "immediate" && plan.backend == Backend::Postgres).then(|| {
                    let lines = external_lines();
                    (durable_xid(&databases[0].db), SystemTime::now(), lines)
                });
                let alive: Vec<PathBuf> = slots
                    .iter()
                    .filter_map(|s| s.proc.as_ref())
                    .map(|p| p.stderr.clone())
                    .collect();
                // The loop waits: no producer, operator or check meets the server away.
                let began = Instant::now();
                cluster
                    .as_ref()
                    .expect("a server of the seed's own")
                    .script(&sc, &["restart", how]);
                let away = began.elapsed();
                timeline.push(format!(
                    "{}: server restarted ({how}) in {}",
                    secs(now),
                    secs(away)
                ));
                if let Some((xid, at, at_mark)) = mark {
                    let back = external_lines();
                    timeline.push(format!(
                        "(the crash's mark: transaction {xid}, external lines {at_mark}, \
                         {back} once back)"
                    ));
                    crash = Some(CrashMark {
                        xid,
                        at,
                        lines: (at_mark, back),
                        alive,
                    });
                }
                // The workers come back within their backoff: what a frozen worker held, and
                // each database's pace, count from the server's return.
                let by = Instant::now() + checks::FROZEN_BOUND;
                for (until, _) in &mut frozen_checks {
                    *until = (*until).max(by);
                }
                for sampler in &mut samplers {
                    sampler.excuse(away);
                }
                faults_end = faults_end.max(started.elapsed());
                faults.next();
                continue;
            }
            apply_fault(
                &sc,
                &plan,
                *fault,
                &mut slots,
                &databases,
                &mut lock_holder,
                &mut frozen_checks,
                &mut checks,
                &mut timeline,
                now,
            );
            if let Some((db, _, _)) = &lock_holder {
                if lock_progress.is_none() {
                    let dbs: Vec<&Db> = databases.iter().map(|d| &d.db).collect();
                    lock_progress = Some(checks::progress_of_others(&dbs, *db));
                }
            }
            faults.next();
        }
        while let Some((at, op)) = operations.peek() {
            if *at > now {
                break;
            }
            operate(
                &sc,
                &plan,
                *op,
                &databases,
                &mut checks,
                &mut pause,
                &mut pause_applied,
                &mut timeline,
                now,
            );
            operations.next();
        }
        if in_window && plan.focus == plan::Focus::CancelInTransaction {
            checks.cancel_order(&databases[0].db);
        }
        if in_window && produced < plan.producer_batches && now >= producer_at {
            for database in &databases {
                checks.produce(&plan, database.url.as_str(), &database.db, &mut rng);
            }
            produced += 1;
            producer_at += plan.window / (plan.producer_batches as u32 + 1);
        }
        if let Some((db, holder, until)) = &lock_holder {
            if Instant::now() >= *until {
                timeline.push(format!(
                    "{}: lock on fault_ledger of database {db} released",
                    secs(now)
                ));
                if let Some(before) = lock_progress.take() {
                    let dbs: Vec<&Db> = databases.iter().map(|d| &d.db).collect();
                    checks.others_kept_pace(&dbs, &before);
                }
                holder.release();
                lock_holder = None;
            }
        }
        // A thaw due but not sent yet (this loop was held up, above) is sent, and the bound
        // moved, at the next turn's `supervise`: judge nothing before it.
        let thaw_due = |s: &Slot| s.frozen_until.is_some_and(|u| Instant::now() >= u);
        let thaw_pending = plan.backend == Backend::Sqlite && slots.iter().any(thaw_due);
        frozen_checks.retain(|(by, held)| {
            if thaw_pending || Instant::now() < *by {
                return true;
            }
            checks.frozen_held_run(&databases[0].db, held);
            false
        });
        if cut_until.is_some_and(|until| Instant::now() >= until) {
            let cuts: usize = databases
                .iter()
                .filter_map(|d| d.proxy.as_ref())
                .map(|p| {
                    p.cut(false);
                    p.cuts()
                })
                .sum();
            timeline.push(format!("{}: replies whole again, {cuts} cut", secs(now)));
            cut_until = None;
            faults_end = faults_end.max(now);
        }
        if pause_applied.is_some_and(|at| Instant::now() >= at) {
            checks.paused(&plan, &databases[0].db);
            pause_applied = None;
        }
        if let Some(until) = pause {
            if Instant::now() >= until {
                resume(&sc, &plan, &databases, &mut checks, &mut timeline, now);
                pause = None;
            }
        }
        // While a worker stops (SIGTERM: no more claims, its tasks in flight waited for), the
        // others' pace is not judged: a stopping process claims for none of its databases.
        let stopping = slots.iter().any(|s| s.stopping);
        for (i, database) in databases.iter().enumerate() {
            samplers[i].sample(
                &plan,
                &database.db,
                &mut checks,
                i,
                lock_holder.as_ref().map(|(d, _, _)| *d),
                stopping,
            );
        }
        if !in_window && lock_holder.is_none() && pause.is_none() && cut_until.is_none() {
            let left: i64 = databases.iter().map(|d| checks::unfinished(&d.db)).sum();
            if left == 0 {
                break;
            }
            if now > faults_end + BOUND {
                checks.violation(format!(
                    "liveness: {left} task(s) not done, dead or cancelled {BOUND:?} after the faults \
                     stopped: {:?}; {:?}",
                    databases.iter().map(|d| d.db.states()).collect::<Vec<_>>(),
                    databases
                        .iter()
                        .flat_map(|d| checks::stuck(&d.db))
                        .collect::<Vec<_>>()
                ));
                break;
            }
        }
        std::thread::sleep(TICK);
    }
    let finished = started.elapsed();
    let procs = stop(&mut slots);
    // A worker's cron may enqueue a tick between the last look above and its stop (seed 98):
    // a drain without the crontab finishes such ticks, so that the checks see the run's end.
    // Only when nothing else is left: any other unfinished task is the checks' to report.
    // With the `default` strategy: under a partition (`id_hash`, `weight`) a node killed a
    // moment before still counts as live, and the drain leaves its share of the ids to the
    // partition's grace period (seed 3957: the last tick, of the other share, left pending).
    let left = |db: &Db, ticks: bool| {
        db.count(&format!(
            "SELECT count(*) FROM async_task WHERE state NOT IN ('done', 'dead', 'cancelled')
               AND biz_id {} LIKE 'cron:%'",
            if ticks { "" } else { "NOT" }
        ))
    };
    if crontab.is_some()
        && databases.iter().all(|d| left(&d.db, false) == 0)
        && databases.iter().any(|d| left(&d.db, true) > 0)
    {
        let drain = Plan {
            drains: true,
            strategy: "default",
            ..plan.clone()
        };
        let mut proc = sc.spawn(
            "final-drain",
            urls[0],
            &worker_args(&sc, &drain, 0, &urls, None),
        );
        proc.expect_exit_0(Duration::from_secs(60));
        timeline.push(format!(
            "{}: a drain finished the cron ticks enqueued as the workers stopped",
            secs(started.elapsed())
        ));
    }
    for (i, database) in databases.iter().enumerate() {
        checks.after(&plan, &database.db, i, &procs);
    }
    let logs: Vec<PathBuf> = slots.iter().flat_map(|s| s.logs.iter().cloned()).collect();
    checks.self_rescues(&logs, &databases.iter().map(|d| &d.db).collect::<Vec<_>>());
    // After a crash, a claim whose commit was not flushed is lost, and its task may run again
    // without a note: its first worker, alive at the crash, logs that its claim was taken
    // over, from the crash on.
    let crash = crash.map(|mark| {
        // Truncated to the second, as the log's times are: no line after the mark is earlier.
        let since = humantime::format_rfc3339_seconds(mark.at).to_string();
        Crash {
            lost_claims: mark
                .alive
                .iter()
                .flat_map(|log| {
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    lost_claim_ids(&text, &since)
                })
                .collect(),
            lines: mark.lines,
            xid_from: mark.xid,
        }
    });
    report.add("faults and operations", timeline.join("; "));
    report.add(
        "run",
        format!(
            "window {}, all finished at {}, {} worker start(s)",
            secs(plan.window),
            secs(finished),
            slots.iter().map(|s| s.starts).sum::<usize>()
        ),
    );
    checks.publish(
        &sc,
        &databases.iter().map(|d| &d.db).collect::<Vec<_>>(),
        report,
        crash.as_ref(),
    );
}

/// The database's tables and first tasks.
fn setup(sc: &Scenario, plan: &Plan, database: &Database, checks: &mut Checks) {
    let db = &database.db;
    db.exec("CREATE TABLE fault_orders (id BIGINT PRIMARY KEY, n BIGINT NOT NULL DEFAULT 0)");
    for tenant in &plan.tenants {
        let mut args = vec!["tenant".to_owned(), "set".to_owned(), tenant.name.clone()];
        if let Some(q) = tenant.max_queued {
            args.extend(["--max-queued".to_owned(), q.to_string()]);
        }
        if let Some(r) = tenant.max_running {
            args.extend(["--max-running".to_owned(), r.to_string()]);
        }
        args.extend(["--weight".to_owned(), tenant.weight.to_string()]);
        cli(sc, &database.url, &args);
    }
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let mut tasks: Vec<NewTask> = Vec::new();
    let mut n = 0;
    for &(keyword, count, sleep_ms, max_attempts) in &plan.initial {
        for _ in 0..count {
            n += 1;
            let mut t = task(keyword, n, sleep_ms, max_attempts);
            if keyword == "fault.order" {
                db.exec(&format!("INSERT INTO fault_orders (id) VALUES ({n})"));
            }
            if !plan.tenants.is_empty() && rng.bool() {
                t = t.tenant(&plan.tenants[rng.usize(..plan.tenants.len())].name);
            }
            tasks.push(t);
        }
    }
    checks.enqueue(db, &tasks);
    // Chains: a parent (failing or not) and its child, each a ledger task.
    for c in 0..plan.chains {
        let parent_kw = if c % 2 == 0 {
            "fault.fail"
        } else {
            "fault.ledger"
        };
        checks.chain(db, &database.url, parent_kw, c);
    }
    // Idle tenants, each with a task an hour ahead, then one with a due task, last.
    if plan.idle_tenants > 0 {
        let idle: Vec<NewTask> = (0..plan.idle_tenants)
            .map(|i| {
                NewTask::new("fault.ledger", format!("idle-{i}"))
                    .tenant(format!("idle-{i:04}"))
                    .delay(Duration::from_secs(3600))
            })
            .collect();
        checks.enqueue(db, &idle);
        checks.enqueue(db, &[NewTask::new("fault.ledger", "zz-due").tenant("zz")]);
    }
}

/// How long after a pause every node has applied it: a heartbeat (500 ms), and a margin.
const PAUSE_APPLIED: Duration = Duration::from_millis(1_200);

/// How long an operator's command may take: one that waits longer (on a lock a frozen or
/// hung worker holds, say) is a violation.
const COMMAND_BOUND: Duration = Duration::from_secs(20);

/// `outbox-fault ARGS` on `url`, waited for at most [`COMMAND_BOUND`]; returns its stdout,
/// stderr and exit code (`None`, and stderr saying so, when it was killed at the bound).
pub fn cli(sc: &Scenario, url: &str, args: &[String]) -> (String, String, Option<i32>) {
    let out = sc.path(&format!("cli-{}.out", fastrand::u64(..)));
    let err = sc.path(&format!("cli-{}.err", fastrand::u64(..)));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-fault"))
        .args(args)
        .current_dir(sc.path(""))
        .env("DATABASE_URL", url)
        .env("USER", "chaos")
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("outbox-fault {args:?}: {e}"));
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status.code());
        }
        if started.elapsed() > COMMAND_BOUND {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    match code {
        Some(code) => (read(&out), read(&err), code),
        None => (
            read(&out),
            format!("did not return within {COMMAND_BOUND:?} (killed): waiting for a lock a worker holds?"),
            None,
        ),
    }
}

/// The worker command line of slot `i`.
fn worker_args(
    sc: &Scenario,
    plan: &Plan,
    i: usize,
    urls: &[&str],
    crontab: Option<&PathBuf>,
) -> Vec<String> {
    let command = if plan.drains { "drain" } else { "run" };
    let batch = plan.commit_batch.to_string();
    let threads = plan.threads.to_string();
    let overrides: Vec<(&str, &str)> = vec![
        ("--commit-batch", &batch),
        ("--claim", plan.claim),
        ("--threads", &threads),
        ("--strategy", plan.strategy),
    ];
    // Handlers blocked on a lock for seconds are not hung: the hang watchdog's exit would
    // free the process and hide whether the other database kept its pace.
    let mut overrides = overrides;
    if plan.focus == plan::Focus::SlowDatabase {
        overrides.push(("--task-timeout", "30s"));
    }
    let domains: Vec<String> = plan
        .domains
        .iter()
        .filter(|d| !d.first_only || i == 0)
        .map(|d| {
            let mut spec = format!("{}:{}:max={}", d.name, d.keywords.join(","), d.max);
            if let Some(t) = d.timeout {
                spec.push_str(&format!(":timeout={}ms", t.as_millis()));
            }
            spec
        })
        .collect();
    let mut args = sc.worker_args(command, &overrides);
    for spec in domains {
        args.extend(["--domain".to_owned(), spec]);
    }
    if let Some(crontab) = crontab {
        if !plan.drains {
            args.extend(["--crontab".to_owned(), crontab.display().to_string()]);
        }
    }
    if urls.len() > 1 {
        for url in urls {
            args.extend(["--database-url".to_owned(), (*url).to_owned()]);
        }
    }
    args
}

/// Starts the workers that are not running (a supervisor's restart), noting each exit; a
/// `drain` that ends is started again while work may be left (cron). Returns whether a worker
/// exited otherwise than a drain that ended.
#[allow(clippy::too_many_arguments)]
fn supervise(
    sc: &Scenario,
    plan: &Plan,
    slots: &mut [Slot],
    urls: &[&str],
    crontab: Option<&PathBuf>,
    in_window: bool,
    timeline: &mut Vec<String>,
    now: Duration,
) -> bool {
    let mut restarted = false;
    for (i, slot) in slots.iter_mut().enumerate() {
        if let (Some(proc), Some(until)) = (slot.proc.as_ref(), slot.frozen_until) {
            if Instant::now() >= until {
                proc.thaw();
                slot.frozen_until = None;
                timeline.push(format!("{}: worker {i} resumed (SIGCONT)", secs(now)));
            }
            continue;
        }
        if let Some(proc) = slot.proc.as_mut() {
            match proc.poll() {
                None => continue,
                Some(status) => {
                    if !(plan.drains && status.success()) {
                        timeline.push(format!("{}: worker {i} exited ({status})", secs(now)));
                        restarted = true;
                    }
                }
            }
        }
        let _ = in_window;
        slot.stopping = false;
        slot.starts += 1;
        let label = format!("w{i}-{}", slot.starts);
        let proc = sc.spawn(&label, urls[0], &worker_args(sc, plan, i, urls, crontab));
        slot.logs.push(proc.stderr.clone());
        slot.proc = Some(proc);
    }
    restarted
}

#[allow(clippy::too_many_arguments)]
fn apply_fault(
    sc: &Scenario,
    plan: &Plan,
    fault: Fault,
    slots: &mut [Slot],
    databases: &[Database],
    lock_holder: &mut Option<(usize, diesel_holder::Holder, Instant)>,
    frozen_checks: &mut Vec<(Instant, checks::Held)>,
    checks: &mut Checks,
    timeline: &mut Vec<String>,
    now: Duration,
) {
    let _ = (sc, plan);
    let frozen_checks = &mut *frozen_checks;
    let running = |slot: &mut Slot| {
        slot.frozen_until.is_none() && slot.proc.as_mut().is_some_and(|p| p.poll().is_none())
    };
    match fault {
        Fault::Kill(i) if running(&mut slots[i]) => {
            slots[i].proc.as_mut().expect("running").kill9();
            timeline.push(format!("{}: worker {i} SIGKILL", secs(now)));
        }
        Fault::Term(i) if running(&mut slots[i]) => {
            // A second signal to a worker still stopping exits it at once, its handlers
            // running: what they held is rescue's, charged, as after a kill (seed 7478).
            let again = slots[i].stopping;
            // A worker still starting may exit first (its connection cut: seed 5761).
            if slots[i].proc.as_mut().expect("running").terminate() {
                slots[i].stopping = true;
                if again {
                    checks.forced_exit();
                }
                timeline.push(format!(
                    "{}: worker {i} SIGTERM{}",
                    secs(now),
                    if again {
                        " again (it exits at once)"
                    } else {
                        ""
                    }
                ));
            } else {
                timeline.push(format!(
                    "{}: worker {i} exited before its SIGTERM",
                    secs(now)
                ));
            }
        }
        Fault::Freeze(i, d) if running(&mut slots[i]) => {
            let proc = slots[i].proc.as_ref().expect("running");
            proc.freeze();
            slots[i].frozen_until = Some(Instant::now() + d);
            let held = checks::held_by(&databases[0].db, proc);
            timeline.push(format!(
                "{}: worker {i} SIGSTOP for {} holding {} task(s)",
                secs(now),
                secs(d),
                held.len()
            ));
            frozen_checks.push((Instant::now() + checks::FROZEN_BOUND, held));
        }
        Fault::KillSessions => {
            let n = crate::db::terminate_other_sessions(&databases[0].db);
            timeline.push(format!(
                "{}: {n} worker session(s) ended by the server",
                secs(now)
            ));
        }
        Fault::LockLedger(db, d) => {
            let holder = diesel_holder::Holder::lock(&databases[db].url);
            *lock_holder = Some((db, holder, Instant::now() + d));
            timeline.push(format!(
                "{}: fault_ledger of database {db} locked for {}",
                secs(now),
                secs(d)
            ));
        }
        other => timeline.push(format!(
            "{}: {other:?} skipped (worker not running)",
            secs(now)
        )),
    }
}

#[allow(clippy::too_many_arguments)]
fn operate(
    sc: &Scenario,
    plan: &Plan,
    op: Operation,
    databases: &[Database],
    checks: &mut Checks,
    pause: &mut Option<Instant>,
    pause_applied: &mut Option<Instant>,
    timeline: &mut Vec<String>,
    now: Duration,
) {
    let database = &databases[0];
    match op {
        Operation::Cancel => {
            let ids = database.db.numbers(
                "SELECT id AS n FROM async_task WHERE state IN ('pending', 'running', 'blocked')
                  AND keyword IN ('fault.external', 'fault.ledger')
                  AND (tenant IS NULL OR tenant NOT LIKE 'idle-%') ORDER BY id DESC LIMIT 5",
            );
            for id in &ids {
                let (_, err, code) = cli(sc, &database.url, &["cancel".to_owned(), id.to_string()]);
                checks.operator(&format!("cancel {id}"), &err, code);
            }
            timeline.push(format!("{}: cancel {ids:?}", secs(now)));
        }
        Operation::RetryAll => {
            // Two commands, as an operator types them, then the dead once more: a chain's
            // parent that died between the two cancelled its child, which the second
            // brought back `blocked` behind it, and the guide's rule is to retry the parent
            // too (`chains.md`; seed 5260 stayed blocked without the third).
            for state in ["dead", "cancelled", "dead"] {
                let args: Vec<String> = ["retry", "--all", "--state", state]
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect();
                let (out, err, code) = cli(sc, &database.url, &args);
                checks.operator(&format!("retry --all --state {state}"), &err, code);
                timeline.push(format!(
                    "{}: retry --all --state {state}: {}",
                    secs(now),
                    out.trim()
                ));
            }
        }
        Operation::Prune => {
            let args: Vec<String> = ["prune", "--older-than", "0s"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
            let (out, err, code) = cli(sc, &database.url, &args);
            checks.operator("prune", &err, code);
            timeline.push(format!("{}: prune: {}", secs(now), out.trim()));
        }
        Operation::Pause(d) => {
            let domain = plan.domains.first().map_or("default", |d| d.name);
            let (out, err, code) = cli(sc, &database.url, &["pause".to_owned(), domain.to_owned()]);
            checks.operator(&format!("pause {domain}"), &err, code);
            if code == Some(0) {
                *pause = Some(Instant::now() + d);
                *pause_applied = Some(Instant::now() + PAUSE_APPLIED);
            }
            timeline.push(format!("{}: pause {domain}: {}", secs(now), out.trim()));
        }
    }
}

fn resume(
    sc: &Scenario,
    plan: &Plan,
    databases: &[Database],
    checks: &mut Checks,
    timeline: &mut Vec<String>,
    now: Duration,
) {
    let database = &databases[0];
    let domain = plan.domains.first().map_or("default", |d| d.name);
    checks.resumed(plan, &database.db);
    let (out, err, code) = cli(sc, &database.url, &["resume".to_owned(), domain.to_owned()]);
    checks.operator(&format!("resume {domain}"), &err, code);
    timeline.push(format!("{}: resume {domain}: {}", secs(now), out.trim()));
}

/// Stops every worker: SIGCONT to a frozen one, SIGTERM, then SIGKILL past the stop limit.
/// Returns the processes, ended.
fn stop(slots: &mut [Slot]) -> Vec<Proc> {
    let mut procs = Vec::new();
    for slot in slots.iter_mut() {
        if let Some(mut proc) = slot.proc.take() {
            if slot.frozen_until.take().is_some() {
                proc.thaw();
            }
            if proc.poll().is_none()
                && proc.terminate()
                && proc.wait_for_exit(crate::STOP_LIMIT).is_none()
            {
                proc.kill9();
            }
            procs.push(proc);
        }
    }
    procs
}

/// A transaction of the test's own that holds a table lock until released.
mod diesel_holder {
    use std::sync::mpsc;
    use std::thread::JoinHandle;

    use diesel::connection::SimpleConnection;
    use outbox::{Backend, DatabaseUrl};

    pub struct Holder {
        release: mpsc::Sender<()>,
        thread: Option<JoinHandle<()>>,
    }

    impl Holder {
        /// Locks `fault_ledger` in a transaction on a thread of its own.
        pub fn lock(url: &str) -> Holder {
            let url = DatabaseUrl::parse(url).expect("url");
            let (release, wait) = mpsc::channel::<()>();
            let (locked, is_locked) = mpsc::channel::<()>();
            let thread = std::thread::spawn(move || {
                let mut conn = url.connect().expect("connect to lock");
                let lock = match url.backend() {
                    Backend::Postgres => "BEGIN; LOCK TABLE fault_ledger IN ACCESS EXCLUSIVE MODE",
                    Backend::Mysql => "LOCK TABLES fault_ledger WRITE",
                    Backend::Sqlite => "BEGIN IMMEDIATE",
                };
                conn.batch_execute(lock).expect("lock fault_ledger");
                let _ = locked.send(());
                let _ = wait.recv();
                let unlock = match url.backend() {
                    Backend::Mysql => "UNLOCK TABLES",
                    _ => "ROLLBACK",
                };
                let _ = conn.batch_execute(unlock);
            });
            let _ = is_locked.recv();
            Holder {
                release,
                thread: Some(thread),
            }
        }

        pub fn release(&self) {
            let _ = self.release.send(());
        }
    }

    impl Drop for Holder {
        fn drop(&mut self) {
            let _ = self.release.send(());
            if let Some(thread) = self.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

/// The seeds `scripts/test.sh` runs, each found to hold (and, before the fix of the defect
/// its focus names, to fail: see `docs/notes/`).
macro_rules! fixed_seeds {
    ($($name:ident = $seed:expr;)*) => {
        $(
            #[test]
            fn $name() {
                run_seed($seed);
            }
        )*
    };
}

// Each found its defect of the liveness issue before that defect's fix (run against the commit
// before it; docs/guide/src/fault-harness.md): 28 a handler that aborts its process in a
// lock-claimed chunk; 4 a frozen worker holding its chunks (and a `cancel` waiting on them); 8 a
// handler hung outside SQL past its domain's timeout; 12 idle tenants that ended a `drain` with due
// work left; 18 one database's blocked handlers stalling the other's; 7 a cancel in the producer's
// transaction deadlocking with a chunk; 19 a pause not held by a node without the domain.
// 307 (found by `--seeds 20 --first 300`, on MySQL): a stamped chunk rolled back by its
// sessions' end, whose rerun skipped a task when the check that it still held it failed on a
// lost connection, leaving it running under a live node until its deadline.
// 281 (found running MySQL's idle-tenant seeds by hand): a batched chunk that a panicking
// handler rolled back ran its other tasks' external effects again with no `last_error`
// saying so (the guide promises one for every duplicate but a crash's lost claim).
// 47 (found running MySQL's lock-claim seeds by hand, when MySQL took lock claims): a handler
// hung in a leased chunk past its timeout freed the chunk's other tasks, which ran their external
// effects again elsewhere with no `last_error` saying so (MySQL gives a handler no transaction id
// to tell a rolled-back run by).
// 1515 (found by `--seeds 24 --first 1500`, on PostgreSQL): under lock claims with a tenant's
// `max_running`, a database whose handlers blocked had a chunk waiting for its thread, and that
// chunk was counted against the threads the other database could lock chunks for: the other
// claimed nothing while the first blocked
// (`shards::under_lock_claims_with_a_tenants_limit_a_blocked_database_leaves_the_other_its_pace`).
// 4290 (found by `--seeds 200 --first 4258`, on PostgreSQL; it failed about one run in three):
// a stamped chunk of a limited tenant's tasks rolled back by the server's end of every worker
// session; the check before each rerun, which notes that the task ran in the chunk, met the
// pool's dead connections, and the tasks ran their external effects again with no
// `last_error` (`batched::a_task_run_again_after_its_chunk_rolled_back_says_so_after_a_sweep_of_sessions`).
// 7478 (found by `--seeds 300 --first 7286`, on PostgreSQL; the harness's own defect): a
// second SIGTERM reached a worker still stopping (its handlers waited for the locked ledger),
// which exited at once as the guide says, and rescue charged what its handlers held; the
// check that tasks whose handlers succeed are charged nothing without a charging fault did
// not count that second signal as one.
// Seed 503 (SQLite: a domain's suspects left pending for good) is not among them: whether its
// SIGSTOP ends on time depends on the machine's load, and when it ends late the progress
// check fails whatever the fix; `rescue::a_suspect_of_a_domain_is_claimed_when_the_lane_before_it_has_none`
// holds that defect instead. Nor is seed 2811 (MySQL: a domain's timeout whose charge met the
// server's end of every session was never charged again, and the task died of its task timeout
// instead): it fails only when the kill lands during the charge;
// `domain::a_timeouts_charge_that_meets_a_dead_connection_is_made_at_the_next_pass` holds it.
fixed_seeds! {
    seed_28 = 28;
    seed_4 = 4;
    seed_8 = 8;
    seed_12 = 12;
    seed_18 = 18;
    seed_7 = 7;
    seed_19 = 19;
    seed_307 = 307;
    seed_281 = 281;
    seed_47 = 47;
    seed_1515 = 1515;
    seed_4290 = 4290;
    seed_7478 = 7478;
}

/// `scripts/chaos.sh`: the seed `OUTBOX_CHAOS_SEED`, or `OUTBOX_CHAOS_SEEDS` random seeds
/// (printed) for at most `OUTBOX_CHAOS_MINUTES`. Ignored by `cargo test`.
#[test]
#[ignore = "run by scripts/chaos.sh"]
fn from_env() {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(seed) = var("OUTBOX_CHAOS_SEED") {
        run_seed(seed.parse().expect("OUTBOX_CHAOS_SEED is a number"));
        return;
    }
    let count: u64 = var("OUTBOX_CHAOS_SEEDS")
        .map_or(20, |v| v.parse().expect("OUTBOX_CHAOS_SEEDS is a number"));
    let minutes: u64 = var("OUTBOX_CHAOS_MINUTES")
        .map_or(30, |v| v.parse().expect("OUTBOX_CHAOS_MINUTES is a number"));
    let first: u64 = var("OUTBOX_CHAOS_FIRST").map_or_else(
        || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs() % 1_000_000)
        },
        |v| v.parse().expect("OUTBOX_CHAOS_FIRST is a number"),
    );
    let started = Instant::now();
    let mut failed = Vec::new();
    for seed in first..first + count {
        if started.elapsed() > Duration::from_secs(minutes * 60) {
            eprintln!("time is up after {} seed(s)", seed - first);
            break;
        }
        if std::panic::catch_unwind(|| run_seed(seed)).is_err() {
            failed.push(seed);
        }
    }
    assert!(failed.is_empty(), "seeds that failed: {failed:?}");
}

/// `scripts/chaos.sh --soak`: `OUTBOX_CHAOS_SOAK_MINUTES` (default 60) of continuous work on
/// PostgreSQL — producers, two `run` workers (batched with lock claims, and strict), a fault
/// every 20–40 s (SIGKILL, SIGTERM, SIGSTOP, sessions ended) — sampling each worker's resident
/// memory, threads and server connections every 10 s. A worker's figures must stay bounded:
/// within each process's life, the last quarter's highest at most 1.5 × the first quarter's
/// highest plus a small allowance (memory: 16 MiB; threads: 4; connections: 4). Ignored by
/// `cargo test`.
#[test]
#[ignore = "run by scripts/chaos.sh --soak"]
fn soak() {
    let minutes: u64 = std::env::var("OUTBOX_CHAOS_SOAK_MINUTES")
        .ok()
        .filter(|v| !v.is_empty())
        .map_or(60, |v| {
            v.parse().expect("OUTBOX_CHAOS_SOAK_MINUTES is a number")
        });
    let sc = Scenario::start("chaos_soak", "postgres");
    let (test_db, db) = fault_db(Backend::Postgres);
    let url = test_db.url_text.clone();
    let mut rng = fastrand::Rng::with_seed(minutes);
    let args = [
        sc.worker_args(
            "run",
            &[
                ("--commit-batch", "20"),
                ("--claim", "lock"),
                ("--threads", "4"),
            ],
        ),
        sc.worker_args("run", &[("--threads", "4")]),
    ];
    let mut procs: Vec<Proc> = args
        .iter()
        .enumerate()
        .map(|(i, a)| sc.spawn(&format!("soak{i}-1"), &url, a))
        .collect();
    let mut starts = [1usize, 1];
    // Per process life: (label, samples of (rss KiB, threads, connections)).
    let mut lives: Vec<(String, Vec<Sample>)> =
        procs.iter().map(|p| (p.app.clone(), Vec::new())).collect();
    let mut current = [0usize, 1];
    let started = Instant::now();
    let end = Duration::from_secs(minutes * 60);
    let mut next_fault = Duration::from_secs(rng.u64(20..=40));
    let mut next_sample = Duration::ZERO;
    let mut enqueued = 0u64;
    let mut timeline = Vec::new();
    let mut frozen: Option<(usize, Instant)> = None;
    while started.elapsed() < end {
        let now = started.elapsed();
        // Producers: about 200 tasks a second.
        let batch: Vec<NewTask> = (0..20)
            .map(|_| {
                enqueued += 1;
                let keyword = if enqueued.is_multiple_of(4) {
                    "fault.external"
                } else {
                    "fault.ledger"
                };
                task(keyword, enqueued as usize, rng.u64(0..=3), 20)
            })
            .collect();
        db.enqueue(&batch);
        if let Some((i, until)) = frozen {
            if Instant::now() >= until {
                procs[i].thaw();
                frozen = None;
            }
        }
        for i in 0..procs.len() {
            if frozen.is_some_and(|(f, _)| f == i) {
                continue;
            }
            if procs[i].poll().is_some() {
                starts[i] += 1;
                procs[i] = sc.spawn(&format!("soak{i}-{}", starts[i]), &url, &args[i]);
                lives.push((procs[i].app.clone(), Vec::new()));
                current[i] = lives.len() - 1;
            }
        }
        if now >= next_fault && frozen.is_none() {
            let i = rng.usize(..procs.len());
            let what = match rng.u8(..4) {
                0 => {
                    procs[i].kill9();
                    "SIGKILL"
                }
                1 => {
                    procs[i].signal(libc::SIGTERM);
                    "SIGTERM"
                }
                2 => {
                    procs[i].freeze();
                    frozen = Some((i, Instant::now() + Duration::from_secs(3)));
                    "SIGSTOP 3s"
                }
                _ => {
                    crate::db::terminate_other_sessions(&db);
                    "sessions ended"
                }
            };
            timeline.push(format!("{}: {what} (worker {i})", secs(now)));
            next_fault = now + Duration::from_secs(rng.u64(20..=40));
        }
        if now >= next_sample {
            for i in 0..procs.len() {
                if let Some((rss, threads)) = proc_status(&procs[i]) {
                    let connections = db.count(&format!(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{}'",
                        procs[i].app
                    ));
                    lives[current[i]].1.push((rss, threads, connections));
                }
            }
            next_sample = now + Duration::from_secs(10);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut workers = procs;
    if let Some((i, _)) = frozen {
        workers[i].thaw();
    }
    crate::scenario::stop_all(&mut workers);
    let mut report = Report::new();
    report.add(
        "soak",
        format!(
            "{minutes} min, {enqueued} tasks enqueued, {} fault(s)",
            timeline.len()
        ),
    );
    report.add("faults", timeline.join("; "));
    let mut violations = Vec::new();
    for (label, samples) in &lives {
        if samples.len() < 8 {
            continue;
        }
        let quarter = samples.len() / 4;
        let high = |xs: &[Sample], f: fn(&Sample) -> i64| xs.iter().map(f).max().unwrap_or(0);
        let (first, last) = (&samples[..quarter], &samples[samples.len() - quarter..]);
        for (what, f, allowance) in [
            (
                "resident memory (KiB)",
                (|s: &Sample| s.0 as i64) as fn(&Sample) -> i64,
                16 * 1024,
            ),
            ("threads", |s: &Sample| s.1 as i64, 4),
            ("connections", |s: &Sample| s.2, 4),
        ] {
            let (a, b) = (high(first, f), high(last, f));
            report.add(
                &format!("{label} {what}"),
                format!(
                    "first quarter's highest {a}, last quarter's {b} ({} samples)",
                    samples.len()
                ),
            );
            if b > a * 3 / 2 + allowance {
                violations.push(format!("{label}: {what} grew from {a} to {b}"));
            }
        }
    }
    report.add(
        "bounded",
        if violations.is_empty() {
            "OK".to_owned()
        } else {
            violations.join("; ")
        },
    );
    // The batched worker takes lease claims by its own flag (not OUTBOX_FAULT_CLAIM): a chunk
    // that rolls back (its process killed, its sessions ended) reruns its tasks, so an external
    // effect's first run in an aborted transaction is explained as in a seed's check.
    crate::invariants::check_and_publish_chaos(&sc, &[&db], report, None);
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// A soak sample of one process: resident memory (KiB), threads, server connections.
type Sample = (u64, u64, i64);

/// A process's resident memory (KiB) and threads, from /proc.
fn proc_status(proc: &Proc) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{}/status", proc.id())).ok()?;
    let field = |name: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("Threads:")?))
}

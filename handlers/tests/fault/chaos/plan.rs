//! What a seed stands for: a configuration, a workload and a schedule of faults, all drawn
//! from one random generator seeded with it, so that the same seed gives the same run.

use std::fmt::Write as _;
use std::time::Duration;

use outbox::Backend;

/// What a run stresses most: each seed draws one, then the rest of its configuration at
/// random. Every focus is a place where two features meet and a fault hits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    /// A handler that aborts its process, in batched chunks (lock claims on PostgreSQL and
    /// MySQL).
    AbortInChunk,
    /// A worker frozen (SIGSTOP) while it holds tasks, resumed later.
    Frozen,
    /// A domain with a timeout, and handlers that hang outside SQL and in SQL.
    Hang,
    /// Many tenants with only delayed tasks, and a `drain` from cron.
    IdleTenants,
    /// One process serving two databases, a lock held on one's handler table.
    SlowDatabase,
    /// Chains whose parents die, pruned, then `retry --all`.
    PrunedParents,
    /// Producers that cancel an order's task in their own transaction, the order locked.
    CancelInTransaction,
    /// A domain paused by an operator, on workers of which only some define it.
    PausedDomain,
    /// Everything at random.
    Mixed,
}

impl Focus {
    const ALL: [Focus; 9] = [
        Focus::AbortInChunk,
        Focus::Frozen,
        Focus::Hang,
        Focus::IdleTenants,
        Focus::SlowDatabase,
        Focus::PrunedParents,
        Focus::CancelInTransaction,
        Focus::PausedDomain,
        Focus::Mixed,
    ];
}

/// A fault, at a time after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL of worker `n` (then restarted, as a supervisor would).
    Kill(usize),
    /// SIGSTOP of worker `n`, SIGCONT after the duration.
    Freeze(usize, Duration),
    /// SIGTERM of worker `n` (then restarted).
    Term(usize),
    /// Every worker session of the database ended by the server (`pg_terminate_backend`,
    /// `KILL CONNECTION`).
    KillSessions,
    /// The handlers' table (`fault_ledger`) locked by the test for the duration, in the
    /// database `n`.
    LockLedger(usize, Duration),
    /// For the duration, the workers' connections (through [`super::cut::CutProxy`]) lose
    /// the answer to one message in a dozen, the connection with it: most often run by the
    /// server, unheard by the worker.
    CutReplies(Duration),
    /// The server restarted: `pg.sh restart HOW` (or `mysql.sh`), `fast` (a clean shutdown)
    /// or `immediate` (a crash), on a server of the seed's own.
    RestartServer(&'static str),
}

/// An operator's action, at a time after the start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `cancel` a few tasks by id.
    Cancel,
    /// `retry --all --state dead`, `--state cancelled`, then `--state dead` again.
    RetryAll,
    /// `pause DOMAIN`, `resume DOMAIN` after the duration.
    Pause(Duration),
    /// `prune --older-than 0s`.
    Prune,
}

/// A domain every worker (or, with [`Focus::PausedDomain`], only the first) defines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainPlan {
    pub name: &'static str,
    pub keywords: Vec<&'static str>,
    pub max: usize,
    pub timeout: Option<Duration>,
    /// Defined only by worker 0.
    pub first_only: bool,
}

/// A tenant and its limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantPlan {
    pub name: String,
    pub max_queued: Option<i64>,
    pub max_running: Option<i64>,
    pub weight: i64,
}

/// One seed's run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub seed: u64,
    pub focus: Focus,
    pub backend: Backend,
    pub commit_batch: usize,
    pub claim: &'static str,
    pub threads: usize,
    pub workers: usize,
    /// `run` workers, or `drain` runs started again and again (cron).
    pub drains: bool,
    pub strategy: &'static str,
    pub databases: usize,
    pub domains: Vec<DomainPlan>,
    pub tenants: Vec<TenantPlan>,
    /// Tasks enqueued before the workers start, by keyword: (keyword, count, sleep ms, max
    /// attempts).
    pub initial: Vec<(&'static str, usize, u64, i32)>,
    /// Parent → child chains of fault.ledger tasks, some parents failing.
    pub chains: usize,
    /// Producer transactions while the faults run; a fifth of them roll back.
    pub producer_batches: usize,
    /// Idle tenants, each with one task delayed an hour.
    pub idle_tenants: usize,
    pub cron: bool,
    pub faults: Vec<(Duration, Fault)>,
    pub operations: Vec<(Duration, Operation)>,
    /// How long the faults and operations go on.
    pub window: Duration,
}

/// The first seed whose focus, whatever it is, may draw a claim strategy other than
/// `default` (before it, only [`Focus::Mixed`] did).
const EVERY_FOCUS_DRAWS_A_STRATEGY: u64 = 2300;

/// The first seed that may draw [`Fault::CutReplies`], from a generator of its own: the
/// seeds before keep their plans, the fixed seeds among them.
pub const FIRST_CUTTING_SEED: u64 = 5500;

/// The first seed that may draw [`Fault::RestartServer`], from a generator of its own: the
/// seeds before keep their plans.
pub const FIRST_RESTARTING_SEED: u64 = 6600;

/// The first seed whose workers may each serve two databases (a fleet) outside
/// [`Focus::SlowDatabase`], from a generator of its own: the seeds before keep their plans.
pub const FIRST_FLEET_SEED: u64 = 7600;

impl Plan {
    /// Whether it cuts the workers' replies ([`Fault::CutReplies`]).
    pub fn cuts_replies(&self) -> bool {
        self.faults
            .iter()
            .any(|(_, f)| matches!(f, Fault::CutReplies(_)))
    }

    /// How it restarts the server ([`Fault::RestartServer`]), if it does.
    pub fn restarts_server(&self) -> Option<&'static str> {
        self.faults.iter().find_map(|(_, f)| match f {
            Fault::RestartServer(how) => Some(*how),
            _ => None,
        })
    }

    /// The plan of `seed`. `mysql`: whether MySQL may be drawn (the feature is on).
    pub fn from_seed(seed: u64, mysql: bool) -> Plan {
        let mut rng = fastrand::Rng::with_seed(seed);
        let focus = Focus::ALL[rng.usize(..Focus::ALL.len())];
        let backend = match (focus, rng.u8(..8)) {
            // Where a server's sessions, a second database or row locks matter: PostgreSQL
            // (lock claims) or MySQL.
            (Focus::Frozen | Focus::SlowDatabase | Focus::CancelInTransaction, n) => {
                if mysql && n < 2 {
                    Backend::Mysql
                } else {
                    Backend::Postgres
                }
            }
            (_, 0..=3) => Backend::Postgres,
            (_, 4..=5) => Backend::Sqlite,
            (_, _) if mysql => Backend::Mysql,
            _ => Backend::Sqlite,
        };
        let batched = match focus {
            Focus::AbortInChunk | Focus::CancelInTransaction | Focus::Hang => true,
            _ => rng.bool(),
        };
        let commit_batch = if batched { rng.usize(4..=20) } else { 1 };
        let claim = match (backend, batched, rng.u8(..4)) {
            (Backend::Postgres | Backend::Mysql, true, 0) => "stamp",
            (Backend::Postgres | Backend::Mysql, true, _) => "lock",
            _ => "auto",
        };
        let threads = rng.usize(1..=4);
        let workers = match focus {
            Focus::Frozen | Focus::PausedDomain => 2,
            Focus::SlowDatabase => 1,
            _ => rng.usize(1..=3),
        };
        let drains = match focus {
            Focus::IdleTenants | Focus::AbortInChunk => true,
            Focus::Frozen | Focus::PausedDomain | Focus::Hang => false,
            _ => rng.u8(..4) == 0,
        };
        // From seed `EVERY_FOCUS_DRAWS_A_STRATEGY` on, every focus meets the strategies too
        // (`least_count`'s wait beside `Hang`'s blocked domain, say), from draws that gave
        // `default` before; the seeds before keep their plans, the fixed seeds among them.
        let every = seed >= EVERY_FOCUS_DRAWS_A_STRATEGY;
        let strategy = match (focus, rng.u8(..8)) {
            (Focus::Mixed, 0) => "id_hash",
            (Focus::Mixed, 1) => "least_count",
            (Focus::Mixed, 2) => "weight",
            (_, 5) if every => "least_count",
            (_, 6) if every => "id_hash",
            (_, 7) if every => "weight",
            _ => "default",
        };
        let databases = if focus == Focus::SlowDatabase { 2 } else { 1 };

        let mut domains = Vec::new();
        match focus {
            Focus::Hang => domains.push(DomainPlan {
                name: "slow",
                keywords: vec!["fault.hang", "fault.hang_sql", "fault.external"],
                max: 1,
                timeout: Some(Duration::from_secs(1)),
                first_only: false,
            }),
            Focus::PausedDomain => domains.push(DomainPlan {
                name: "held",
                keywords: vec!["fault.external"],
                max: 1,
                timeout: None,
                first_only: true,
            }),
            _ if databases == 1 && rng.u8(..3) == 0 => domains.push(DomainPlan {
                name: "mail",
                keywords: vec!["fault.external"],
                // A MAX over the node's threads is refused at start.
                max: rng.usize(1..=2).min(threads),
                timeout: rng.bool().then_some(Duration::from_secs(1)),
                first_only: false,
            }),
            _ => {}
        }

        let mut tenants = Vec::new();
        if focus == Focus::Mixed || rng.u8(..3) == 0 {
            for i in 0..rng.usize(1..=3) {
                tenants.push(TenantPlan {
                    name: format!("t{i}"),
                    max_queued: rng.bool().then(|| rng.i64(40..=120)),
                    max_running: rng.bool().then(|| rng.i64(1..=3)),
                    weight: rng.i64(1..=4),
                });
            }
        }

        let mut initial = vec![
            ("fault.ledger", rng.usize(100..=300), rng.u64(0..=5), 20),
            ("fault.external", rng.usize(30..=100), rng.u64(0..=5), 20),
        ];
        let poison = |rng: &mut fastrand::Rng,
                      initial: &mut Vec<(&'static str, usize, u64, i32)>| {
            initial.push(("fault.fail", rng.usize(1..=3), 0, rng.i32(2..=3)));
            if rng.bool() {
                initial.push(("fault.panic", 1, 0, 2));
            }
        };
        match focus {
            Focus::AbortInChunk => {
                // First in claim order, so that it lands in the first chunks.
                initial.insert(0, ("fault.abort", 1, 0, 3));
            }
            Focus::Hang => {
                initial.push(("fault.hang", 1, 0, 2));
                initial.push(("fault.hang_sql", 1, 0, 2));
            }
            Focus::Frozen => initial[0].2 = 20,
            // Work left in every database for the whole lock.
            Focus::SlowDatabase => {
                initial[0].1 = rng.usize(600..=900);
                initial[0].2 = rng.u64(5..=10);
            }
            Focus::PausedDomain => {
                // Enough of the paused domain's tasks, slow enough, to still be there.
                initial[1].1 = rng.usize(200..=300);
                initial[1].2 = 20;
            }
            Focus::Mixed => {
                poison(&mut rng, &mut initial);
                if rng.u8(..4) == 0 {
                    initial.push(("fault.abort", 1, 0, 2));
                }
            }
            _ => {
                if rng.bool() {
                    poison(&mut rng, &mut initial);
                }
            }
        }
        if focus == Focus::CancelInTransaction {
            initial.push(("fault.order", rng.usize(20..=40), 30, 20));
        }
        if databases > 1 {
            // The external file names tasks by id, which two databases share.
            for entry in &mut initial {
                if entry.0 == "fault.external" {
                    entry.0 = "fault.ledger";
                }
            }
        }
        let chains = match focus {
            Focus::PrunedParents => rng.usize(5..=10),
            Focus::Mixed => rng.usize(0..=5),
            _ => 0,
        };
        let idle_tenants = if focus == Focus::IdleTenants {
            rng.usize(60..=200)
        } else {
            0
        };
        let window = Duration::from_millis(rng.u64(6_000..=10_000));
        let at = |rng: &mut fastrand::Rng| {
            Duration::from_millis(rng.u64(500..window.as_millis() as u64))
        };
        let mut faults = Vec::new();
        match focus {
            Focus::Frozen => faults.push((
                Duration::from_millis(rng.u64(300..=1000)),
                // Longer than --dead-after (1.5 s) and the margin the check allows (5 s): the
                // others must have run what it held before it resumes.
                Fault::Freeze(0, Duration::from_millis(rng.u64(9_000..=12_000))),
            )),
            Focus::SlowDatabase => faults.push((
                Duration::from_millis(200),
                Fault::LockLedger(0, Duration::from_millis(rng.u64(5_000..=7_000))),
            )),
            _ => {}
        }
        if !drains {
            for _ in 0..rng.usize(0..=3) {
                let worker = rng.usize(..workers);
                let fault = match rng.u8(..6) {
                    0 | 1 => Fault::Kill(worker),
                    2 => Fault::Term(worker),
                    3 => Fault::Freeze(worker, Duration::from_millis(rng.u64(500..=3_000))),
                    _ if backend != Backend::Sqlite => Fault::KillSessions,
                    _ => Fault::Kill(worker),
                };
                faults.push((at(&mut rng), fault));
            }
        }
        // Not with the foci whose checks time a pace (a frozen worker's tasks run by the
        // others, a slow database's neighbour, a paused domain's hand-over): cuts slow every
        // claim. A random freeze of another focus may meet a cut, and its check with it.
        let mut cut_rng = fastrand::Rng::with_seed(seed ^ 0xc075_0b5e);
        if seed >= FIRST_CUTTING_SEED
            && backend != Backend::Sqlite
            && !matches!(
                focus,
                Focus::Frozen | Focus::SlowDatabase | Focus::PausedDomain
            )
            && cut_rng.bool()
        {
            let start = cut_rng.u64(500..window.as_millis() as u64 - 1_000);
            faults.push((
                Duration::from_millis(start),
                Fault::CutReplies(Duration::from_millis(cut_rng.u64(1_000..=3_000))),
            ));
        }
        // From `FIRST_RESTARTING_SEED` on, a server restart, on a server of the seed's own
        // (`crate::cluster::Cluster`); not with the foci whose checks time a pace, as cuts,
        // nor with `Hang`, whose check tells the domain's charge from the process's hang
        // watchdog by which came first (the charge waits out its backoff while the server is
        // away, the watchdog does not).
        let mut restart_rng = fastrand::Rng::with_seed(seed ^ 0x2e57_a27e);
        if seed >= FIRST_RESTARTING_SEED
            && backend != Backend::Sqlite
            && !matches!(
                focus,
                Focus::Frozen | Focus::SlowDatabase | Focus::PausedDomain | Focus::Hang
            )
            && restart_rng.bool()
        {
            let start = restart_rng.u64(1_000..window.as_millis() as u64 - 1_500);
            let how = if restart_rng.bool() {
                "immediate"
            } else {
                "fast"
            };
            faults.push((Duration::from_millis(start), Fault::RestartServer(how)));
        }
        // From `FIRST_FLEET_SEED` on, a third of the seeds of `Mixed` and `AbortInChunk` serve
        // two databases from each worker process (a fleet), so that one meets the kills,
        // freezes, ended sessions, cuts and restarts drawn above, with `SlowDatabase`'s pace
        // left to its own seeds. A fleet takes no domains; its tasks name no external effect,
        // since the external file names a task by id, which two databases share, and form no
        // chains, since the checks know a chain by its ids.
        let mut fleet_rng = fastrand::Rng::with_seed(seed ^ 0xf1ee_7000);
        let fleet = seed >= FIRST_FLEET_SEED
            && matches!(focus, Focus::Mixed | Focus::AbortInChunk)
            && fleet_rng.u8(..3) == 0;
        let (databases, chains) = if fleet {
            domains.clear();
            for entry in &mut initial {
                if entry.0 == "fault.external" {
                    entry.0 = "fault.ledger";
                }
            }
            (2, 0)
        } else {
            (databases, chains)
        };
        faults.sort_by_key(|(at, _)| *at);
        let mut operations = Vec::new();
        match focus {
            Focus::PrunedParents => {
                operations.push((window / 2, Operation::Prune));
                operations.push((window * 3 / 4, Operation::RetryAll));
            }
            // Once the nodes have published their domains (a heartbeat is 500 ms).
            Focus::PausedDomain => operations.push((
                Duration::from_millis(rng.u64(1_000..=1_500)),
                Operation::Pause(Duration::from_millis(rng.u64(3_000..=5_000))),
            )),
            _ => {
                if rng.u8(..3) == 0 {
                    operations.push((at(&mut rng), Operation::Cancel));
                }
                if rng.u8(..4) == 0 {
                    operations.push((at(&mut rng), Operation::RetryAll));
                }
            }
        }
        operations.sort_by_key(|(at, _)| *at);
        Plan {
            seed,
            focus,
            backend,
            commit_batch,
            claim,
            threads,
            workers,
            drains,
            strategy,
            databases,
            domains,
            tenants,
            initial,
            chains,
            producer_batches: rng.usize(5..=20),
            idle_tenants,
            cron: rng.u8(..4) == 0,
            faults,
            operations,
            window,
        }
    }

    /// The plan, in a few lines for the report.
    pub fn describe(&self) -> Vec<(String, String)> {
        let mut lines = Vec::new();
        lines.push((
            "seed".into(),
            format!("{} (focus {:?})", self.seed, self.focus),
        ));
        lines.push((
            "configuration".into(),
            format!(
                "{}; {}; claim {}; {} thread(s); {} {} worker(s); strategy {}; {} database(s)",
                self.backend.name(),
                if self.commit_batch > 1 {
                    format!("batched, --commit-batch {}", self.commit_batch)
                } else {
                    "strict".to_owned()
                },
                self.claim,
                self.threads,
                self.workers,
                if self.drains { "drain" } else { "run" },
                self.strategy,
                self.databases
            ),
        ));
        let mut text = String::new();
        for d in &self.domains {
            let _ = write!(
                text,
                "{} {:?} MAX {}{}{}; ",
                d.name,
                d.keywords,
                d.max,
                d.timeout
                    .map_or(String::new(), |t| format!(" timeout {t:?}")),
                if d.first_only { " (worker 0 only)" } else { "" }
            );
        }
        lines.push((
            "domains".into(),
            if text.is_empty() { "none".into() } else { text },
        ));
        let tenants: Vec<String> = self
            .tenants
            .iter()
            .map(|t| {
                format!(
                    "{} (max_queued {:?}, max_running {:?}, weight {})",
                    t.name, t.max_queued, t.max_running, t.weight
                )
            })
            .collect();
        lines.push(("tenants".into(), format!("{tenants:?}")));
        lines.push((
            "workload".into(),
            format!(
                "{:?}; {} chain(s); {} producer batch(es); {} idle tenant(s); cron {}",
                self.initial, self.chains, self.producer_batches, self.idle_tenants, self.cron
            ),
        ));
        lines.push(("faults".into(), format!("{:?}", self.faults)));
        lines.push(("operations".into(), format!("{:?}", self.operations)));
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `OUTBOX_CHAOS_LIST=N cargo test … -- --ignored chaos::plan::tests::list --nocapture`:
    /// the focus, backend and claim style of seeds 1 to N, to pick seeds by what they stress.
    #[test]
    #[ignore = "prints plans on demand"]
    fn list() {
        let n: u64 =
            std::env::var("OUTBOX_CHAOS_LIST").map_or(100, |v| v.parse().expect("a number"));
        for seed in 1..=n {
            let p = Plan::from_seed(seed, true);
            println!(
                "{seed}: {:?} {} batch {} claim {} workers {} drains {} dbs {} strategy {} \
                 cuts {} restarts {:?}",
                p.focus,
                p.backend.name(),
                p.commit_batch,
                p.claim,
                p.workers,
                p.drains,
                p.databases,
                p.strategy,
                p.cuts_replies(),
                p.restarts_server()
            );
        }
    }

    /// Seeds from `EVERY_FOCUS_DRAWS_A_STRATEGY` on give every focus each strategy; the
    /// seeds before give one only to `Mixed`, as when the fixed seeds were chosen.
    #[test]
    fn strategies_meet_every_focus_from_their_first_seed_on() {
        let before = (1..EVERY_FOCUS_DRAWS_A_STRATEGY).map(|s| Plan::from_seed(s, true));
        for p in before.filter(|p| p.focus != Focus::Mixed) {
            assert_eq!(p.strategy, "default", "seed {}", p.seed);
        }
        let after: Vec<Plan> = (EVERY_FOCUS_DRAWS_A_STRATEGY..EVERY_FOCUS_DRAWS_A_STRATEGY + 2000)
            .map(|s| Plan::from_seed(s, true))
            .collect();
        for focus in Focus::ALL {
            for strategy in ["default", "id_hash", "least_count", "weight"] {
                assert!(
                    after
                        .iter()
                        .any(|p| p.focus == focus && p.strategy == strategy),
                    "{focus:?} never draws {strategy}"
                );
            }
        }
    }

    /// FNV-1a over the plans (`Debug`) of seeds 1 to `FIRST_CUTTING_SEED - 1`, MySQL drawn,
    /// as ad25801 drew them, before replies were cut.
    const PLANS_BEFORE_CUTS: u64 = 0x8b39_c9ca_0949_a6b3;

    /// FNV-1a over the plans (`Debug`) of seeds 1 to `FIRST_RESTARTING_SEED - 1`, MySQL drawn,
    /// as 03b8a4f drew them, before servers were restarted.
    const PLANS_BEFORE_RESTARTS: u64 = 0x4236_e28b_b4a8_9f94;

    /// FNV-1a over the plans (`Debug`) of seeds 1 to `FIRST_FLEET_SEED - 1`, MySQL drawn, as
    /// 7031ab0 drew them, before fleets were drawn outside `SlowDatabase`.
    const PLANS_BEFORE_FLEETS: u64 = 0x0801_4d37_c71b_8a39;

    /// FNV-1a over the `Debug` text of the plans of `seeds`, MySQL drawn.
    fn fingerprint(seeds: std::ops::Range<u64>) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for seed in seeds {
            for byte in format!("{:?}", Plan::from_seed(seed, true)).bytes() {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        hash
    }

    /// The seeds before `FIRST_CUTTING_SEED`, those before `FIRST_RESTARTING_SEED` and those
    /// before `FIRST_FLEET_SEED`, the fixed seeds among them, keep their plans.
    #[test]
    fn seeds_before_the_first_cutting_restarting_and_fleet_ones_keep_their_plans() {
        let changed = "drew another plan (or `Plan`'s `Debug` text changed: a field added, say; \
                       then take the new value, once the old plans are checked equal)";
        assert_eq!(
            fingerprint(1..FIRST_CUTTING_SEED),
            PLANS_BEFORE_CUTS,
            "a seed before {FIRST_CUTTING_SEED} {changed}"
        );
        assert_eq!(
            fingerprint(1..FIRST_RESTARTING_SEED),
            PLANS_BEFORE_RESTARTS,
            "a seed before {FIRST_RESTARTING_SEED} {changed}"
        );
        assert_eq!(
            fingerprint(1..FIRST_FLEET_SEED),
            PLANS_BEFORE_FLEETS,
            "a seed before {FIRST_FLEET_SEED} {changed}"
        );
    }

    /// From `FIRST_CUTTING_SEED` on, replies are cut on both server backends, never on SQLite
    /// (no connection to cut), nor with a focus whose checks time a pace.
    #[test]
    fn replies_are_cut_from_their_first_seed_on_server_backends_only() {
        let after: Vec<Plan> = (FIRST_CUTTING_SEED..FIRST_CUTTING_SEED + 500)
            .map(|s| Plan::from_seed(s, true))
            .collect();
        for backend in [Backend::Postgres, Backend::Mysql] {
            assert!(
                after
                    .iter()
                    .any(|p| p.backend == backend && p.cuts_replies()),
                "{backend:?} never cut"
            );
        }
        assert!(!after
            .iter()
            .any(|p| p.backend == Backend::Sqlite && p.cuts_replies()));
        assert!(!after.iter().any(|p| p.cuts_replies()
            && matches!(
                p.focus,
                Focus::Frozen | Focus::SlowDatabase | Focus::PausedDomain
            )));
    }

    /// From `FIRST_RESTARTING_SEED` on, servers are restarted both ways on both server
    /// backends, never on SQLite, nor with a focus whose checks time a pace or the order of
    /// two charges; never before. A restarting plan before `FIRST_FLEET_SEED` has one
    /// database (a fleet's, after it, has no external task, for which the checks' lost claims
    /// name tasks by id: `fleets_meet_other_faults_from_their_first_seed`), and none has a lock
    /// held by the test or a pause (the harness's own connections for them would meet the
    /// server away).
    #[test]
    fn servers_restart_from_their_first_seed_on_server_backends_only() {
        assert!(!(1..FIRST_RESTARTING_SEED)
            .any(|s| Plan::from_seed(s, true).restarts_server().is_some()));
        let after: Vec<Plan> = (FIRST_RESTARTING_SEED..FIRST_RESTARTING_SEED + 500)
            .map(|s| Plan::from_seed(s, true))
            .collect();
        for backend in [Backend::Postgres, Backend::Mysql] {
            for how in ["fast", "immediate"] {
                assert!(
                    after
                        .iter()
                        .any(|p| p.backend == backend && p.restarts_server() == Some(how)),
                    "{backend:?} never restarted {how}"
                );
            }
        }
        for p in after.iter().filter(|p| p.restarts_server().is_some()) {
            assert_ne!(p.backend, Backend::Sqlite, "seed {}", p.seed);
            assert!(
                !matches!(
                    p.focus,
                    Focus::Frozen | Focus::SlowDatabase | Focus::PausedDomain | Focus::Hang
                ),
                "seed {}",
                p.seed
            );
            assert_eq!(p.databases, 1, "seed {}", p.seed);
            assert!(
                !p.faults
                    .iter()
                    .any(|(_, f)| matches!(f, Fault::LockLedger(..))),
                "seed {}",
                p.seed
            );
            assert!(
                !p.operations
                    .iter()
                    .any(|(_, o)| matches!(o, Operation::Pause(_))),
                "seed {}",
                p.seed
            );
        }
    }

    /// From `FIRST_FLEET_SEED` on, fleets are drawn outside `SlowDatabase` too, on every
    /// backend, meeting restarts and cuts; each without domains, external tasks or chains.
    #[test]
    fn fleets_meet_other_faults_from_their_first_seed() {
        let fleet = |p: &Plan| p.databases > 1 && p.focus != Focus::SlowDatabase;
        assert!(!(1..FIRST_FLEET_SEED).any(|s| fleet(&Plan::from_seed(s, true))));
        let fleets: Vec<Plan> = (FIRST_FLEET_SEED..FIRST_FLEET_SEED + 1_000)
            .map(|s| Plan::from_seed(s, true))
            .filter(fleet)
            .collect();
        for backend in [Backend::Postgres, Backend::Mysql, Backend::Sqlite] {
            assert!(
                fleets.iter().any(|p| p.backend == backend),
                "no fleet on {backend:?}"
            );
        }
        assert!(fleets.iter().any(|p| p.cuts_replies()));
        // A PostgreSQL crash, whose checks bound what it may excuse with one mark for both.
        assert!(fleets
            .iter()
            .any(|p| p.backend == Backend::Postgres && p.restarts_server() == Some("immediate")));
        for fault in ["Kill", "Freeze", "KillSessions"] {
            assert!(
                fleets.iter().any(|p| p
                    .faults
                    .iter()
                    .any(|(_, f)| format!("{f:?}").split('(').next() == Some(fault))),
                "no fleet meets {fault}"
            );
        }
        for p in &fleets {
            assert_eq!(p.databases, 2, "seed {}", p.seed);
            assert!(
                matches!(p.focus, Focus::Mixed | Focus::AbortInChunk),
                "seed {}",
                p.seed
            );
            assert!(p.domains.is_empty(), "seed {}", p.seed);
            assert_eq!(p.chains, 0, "seed {}", p.seed);
            assert!(
                p.initial.iter().all(|(k, ..)| *k != "fault.external"),
                "seed {}",
                p.seed
            );
        }
    }

    #[test]
    fn a_seed_gives_the_same_plan_every_time() {
        for seed in [1, 2, 3, 42, 1000] {
            let a = format!("{:?}", Plan::from_seed(seed, true));
            let b = format!("{:?}", Plan::from_seed(seed, true));
            assert_eq!(a, b);
        }
    }
}

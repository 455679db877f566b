//! The fault suite: real `outbox-fault` worker processes against a real PostgreSQL (and SQLite
//! where the fault applies), while the test kills them, terminates their connections,
//! restarts the server, stops them mid-batch, feeds them poison tasks, overlaps drains and
//! races migrations. After each scenario the invariants of DESIGN.md are checked:
//!
//! - every task is done or dead (none pending, none running: nothing is lost);
//! - exactly one `fault_ledger` row per done `fault.ledger` task, none for any other task
//!   (effects in the database happen exactly once);
//! - every done `fault.external` task is in the external file at least once, and a task that
//!   is there more than once carries a `last_error` (it was rescued, released after a
//!   database error, or failed: at least once, never silently twice); with lock claims, whose
//!   rolled-back chunks leave no trace in the rows, a silent extra run is accepted when its
//!   transaction rolled back, and none runs in a committed transaction that did not complete
//!   the task (see `invariants`);
//! - `failures <= COALESCE(max_attempts, 20)`.
//!
//! Scenarios (PostgreSQL unless a name ends in `_sqlite` or `_mysql`): `kill_9_during_a_run`,
//! `connections_terminated_in_a_loop`, `postgres_restarted_mid_run_{fast,immediate}` (on a
//! cluster of their own), `sigterm_mid_batch_*`, `poison_tasks_*` (fail, panic, abort),
//! `poison_hang_*`, `sigterm_past_the_shutdown_timeout`, `overlapping_drains`,
//! `concurrent_migrations_*`, `chains_of_three_with_kills`,
//! `cron_fleet_runs_every_tick_exactly_once`, the claim strategies' fleets
//! `strategy_{id_hash,weight,least_count}` (three real nodes each: the distribution, then a
//! kill and a join), and `failover::primary_stopped_and_standby_promoted_{strict,batched}` (a
//! primary and its synchronous standby, clusters of their own, the primary stopped `-m
//! immediate` and the standby promoted; batched mode takes its default lock claims in every
//! run, and neither runs again in the lock-claims run).
//!
//! Besides the scenarios, two checks of a single process: the CLI exits only once no
//! connection is being opened (`exit`, PostgreSQL), and the checks know every task a prune
//! deleted (`drains::a_task_pruned_right_after_it_finished_stays_known_to_the_checks*`, every
//! backend).
//!
//! MySQL (feature `mysql`; MariaDB from scripts/mysql.sh): every scenario above but the claim
//! strategies' fleets also runs as `NAME_mysql`, with the same assertions; the server restart
//! is `restarted_mid_run_{fast,immediate}_mysql` on a MariaDB server of its own
//! (`mysql.sh restart fast` is a clean shutdown, `immediate` a SIGKILL of the server). Lock
//! claims (`OUTBOX_FAULT_CLAIM=lock`) run on both servers, not on SQLite.
//!
//! Scenarios run one at a time (they are heavy). `OUTBOX_FAULT_PROFILE=long` runs the long
//! profile (more kills, terminations, restarts, drains, repetitions); unset or `short` is the
//! default. `OUTBOX_FAULT_CLAIM=lock` runs every PostgreSQL and MySQL worker with lock claims
//! (`--claim lock --commit-batch 20`, a scenario's own flags still applied over them; SQLite
//! workers unchanged), and the scenarios assert what lock claims promise where it differs
//! from stamping (see [`Claim`]); unset runs the workers with their default claims. Each
//! scenario appends a block of figures to `$CARGO_TARGET_TMPDIR/fault-report.txt`
//! (`fault-report-lock.txt` with lock claims; truncated by the first scenario of a run) and
//! prints it. Each process's stderr (with
//! `RUST_LOG=info`) goes to a file in the scenario's temporary directory; on failure the
//! tails are printed and the directory is kept.
//!
//! Layout: one module per scenario family (`kill`, `freeze`, `chains`, `connections`, `restart`,
//! `sigterm`, `poison`, `drains`, `migrations`, `cron`, `failover`, `exit`), so a test's full name is, e.g.,
//! `kill::kill_9_during_a_run`; the modules they share are listed below.

#[path = "../../../tests/suite/relay.rs"]
mod relay;
#[path = "../../../tests/suite/support.rs"]
mod support;

// Support: the report, scenarios and their processes, the test's view of the database, the
// invariants, what the processes logged, a server of a scenario's own.
mod cluster;
mod db;
mod invariants;
mod logs;
mod report;
mod scenario;

// The scenario families, and the seeded harness.
mod chains;
mod chaos;
mod connections;
mod cron;
mod drains;
mod exit;
mod failover;
mod freeze;
mod kill;
mod migrations;
mod poison;
mod restart;
mod sigterm;
mod strategy;

use std::time::Duration;

// ---------------------------------------------------------------------------------------------
// Profiles and limits
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Profile {
    Short,
    Long,
}

fn profile() -> Profile {
    match std::env::var("OUTBOX_FAULT_PROFILE").as_deref() {
        Ok("long") => Profile::Long,
        Ok("short") | Ok("") | Err(_) => Profile::Short,
        Ok(other) => panic!("OUTBOX_FAULT_PROFILE must be `short` or `long`, not {other:?}"),
    }
}

/// The short profile's value or the long profile's.
fn by_profile<T>(short: T, long: T) -> T {
    match profile() {
        Profile::Short => short,
        Profile::Long => long,
    }
}

// ---------------------------------------------------------------------------------------------
// Claim styles
// ---------------------------------------------------------------------------------------------

/// How the scenarios' PostgreSQL and MySQL workers claim tasks (`OUTBOX_FAULT_CLAIM`).
///
/// With lock claims a chunk's tasks are leased (a row of `async_lease` each), not marked
/// running, and nothing is written to them until the chunk commits: a process that dies
/// mid-chunk rolls its transaction back and leaves its leases, which rescue charges as it
/// charges a stamped claim's tasks; a hung handler is charged by the watchdog as it ends the
/// chunk. The scenarios assert what differs from stamping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// The workers' default (`--claim auto`: stamping in strict mode).
    Default,
    /// `--claim lock --commit-batch` [`LOCK_COMMIT_BATCH`] on PostgreSQL and MySQL.
    Lock,
}

/// The chunk size of lock claims in the suite: several chunks in flight per worker, each
/// long enough that a fault lands mid-chunk.
const LOCK_COMMIT_BATCH: &str = "20";

fn claim() -> Claim {
    match std::env::var("OUTBOX_FAULT_CLAIM").as_deref() {
        Ok("lock") => Claim::Lock,
        Ok("") | Err(_) => Claim::Default,
        Ok(other) => panic!("OUTBOX_FAULT_CLAIM must be `lock` or unset, not {other:?}"),
    }
}

/// Whether the workers of a scenario on `backend` take lock claims.
fn locks(backend: &str) -> bool {
    claim() == Claim::Lock && backend != "sqlite"
}

/// How often a bounded wait re-checks its condition.
const POLL: Duration = Duration::from_millis(50);
/// How long the workers may take to finish every task of a scenario (generous: debug build,
/// two cores, faults that slow everything down).
fn work_limit() -> Duration {
    by_profile(Duration::from_secs(180), Duration::from_secs(600))
}
/// The workers' `--shutdown-timeout`.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a worker may take to exit after SIGTERM: its shutdown timeout and a margin.
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// How long a one-shot command (`migrate`, `pg.sh`) may take.
const COMMAND_LIMIT: Duration = Duration::from_secs(120);
/// How long the test's own queries keep retrying while the database is unreachable
/// (terminated connections, a restarting server).
const DB_RETRY_LIMIT: Duration = Duration::from_secs(90);
/// The longest acceptable rescue latency after a SIGKILL: dead-after (1.5 s) plus a
/// heartbeat (0.5 s), with a wide margin for a loaded two-core machine.
const RESCUE_LATENCY_LIMIT: Duration = Duration::from_secs(15);
/// How long the workers may go without finishing a single task while work is left: far
/// longer than any backoff or rescue delay in these scenarios.
const STALL_LIMIT: Duration = Duration::from_secs(45);
/// The worker's default `--max-attempts`, which the invariant uses for tasks without one.
const DEFAULT_MAX_ATTEMPTS: i64 = 20;

/// Tasks that must still be left when the last fault hits, so that every worker has work
/// to resume afterwards.
const LEFT_AFTER_LAST_FAULT: i64 = 500;

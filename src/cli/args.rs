//! The flags shared by the commands that run tasks.

use std::time::Duration;

use clap::Args;

use super::parse_duration;
use crate::db::Backend;
use crate::error::Result;
use crate::registry::Registry;
use crate::worker::{ClaimStyle, WorkerConfig, DEFAULT_MAX_ATTEMPTS};

/// Settings shared by the commands that run tasks (`drain`, `run`, and a binary's own).
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Execution threads [default: 4 × cores, at most 16; 1 on SQLite].
    #[arg(long)]
    threads: Option<usize>,
    /// Tasks claimed per claim statement, at most [default: 100; with --commit-batch K,
    /// enough for a chunk per thread and queue slot: (threads + queue + 1) × K].
    #[arg(long = "page")]
    page_size: Option<usize>,
    /// Tasks that may wait for a thread before the claiming thread runs them itself
    /// [default: 8 × threads; 128 on SQLite unless --threads is given; with --commit-batch,
    /// as many chunks as threads].
    #[arg(long)]
    queue: Option<usize>,
    /// Attempts for tasks that do not set their own.
    #[arg(long, default_value_t = DEFAULT_MAX_ATTEMPTS)]
    max_attempts: i32,
    /// How often this node records its heartbeat and rescues the tasks of dead nodes.
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    heartbeat: Duration,
    /// A node silent for this long is dead and its running tasks are rescued
    /// [default: 3 heartbeats].
    #[arg(long, value_parser = parse_duration)]
    dead_after: Option<Duration>,
    /// How long a handler may run. A claimed task is rescued as hung past its deadline: its
    /// claim plus this (times --commit-batch); if a handler is still running a heartbeat past
    /// this, the process exits with status 3 to free what it holds.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    task_timeout: Duration,
    /// On SIGINT/SIGTERM, how long in-flight tasks may take to finish before the process
    /// exits anyway (leaving them to rescue).
    #[arg(long, value_parser = parse_duration, default_value = "30s")]
    shutdown_timeout: Duration,
    /// Tasks per transaction: 1 is strict mode (one transaction per task); K > 1 runs up to K
    /// tasks in one transaction with one fenced completion, re-running a failed chunk task by
    /// task (external effects of a rolled-back chunk then happen again).
    #[arg(long, default_value_t = 1)]
    commit_batch: usize,
    /// How tasks are claimed: `stamp` writes owner, token and deadline at the claim and
    /// completes with a second write; `lock` (PostgreSQL) leases a chunk's tasks for the
    /// transaction that runs it, one write per task, for short handlers; `auto` is lock with
    /// --commit-batch > 1 on PostgreSQL (and no --queue), stamp otherwise.
    #[arg(long = "claim", default_value_t = ClaimStyle::Auto)]
    claim_style: ClaimStyle,
    /// Task domains from a TOML file: `[[domain]]` tables with `name`, `keywords`, one of
    /// `max` / `reserved`, and optionally `queue` and `timeout` (docs/guide/src/domains.md).
    #[arg(long, value_name = "FILE")]
    domains: Option<std::path::PathBuf>,
    /// A task domain: NAME:KEYWORD,…:max=N or reserved=N, then optionally :queue=N and
    /// :timeout=D (repeatable; with --domains, both count).
    #[arg(long = "domain", value_name = "SPEC")]
    domain: Vec<String>,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub(super) json: bool,
    /// Cron schedules for registered keywords, one per line: the six cron fields (seconds
    /// first; `TZ=Area/City` before them for a time zone), the keyword (`KEYWORD?fill=2h` to
    /// backfill after an outage), optional JSON data; `#` comments (docs/guide/src/cron.md).
    #[arg(long, value_name = "FILE")]
    crontab: Option<std::path::PathBuf>,
    /// Metrics, health and the dead-task hook.
    #[command(flatten)]
    observe: super::observe::ObserveArgs,
    #[command(flatten)]
    strategy: super::StrategyArgs,
}

impl WorkerArgs {
    /// The worker configuration these flags describe (the process exits with status 3 when a
    /// handler hangs), checked against `backend`'s defaults ([`crate::Error::InvalidConfig`]
    /// naming the flag out of range).
    pub fn config(&self, backend: Backend) -> Result<WorkerConfig> {
        let mut config = WorkerConfig::default()
            .max_attempts(self.max_attempts)
            .heartbeat(self.heartbeat)
            .task_timeout(self.task_timeout)
            .exit_on_hang(true)
            .commit_batch(self.commit_batch)
            .claim_style(self.claim_style);
        config.threads = self.threads;
        config.queue = self.queue;
        config.page_size = self.page_size;
        config.dead_after = self.dead_after;
        if let Some(file) = &self.domains {
            config.domains = crate::domain::parse_domains_file(file)?;
        }
        for flag in &self.domain {
            config = config.domain(crate::domain::parse_domain_flag(flag)?);
        }
        let config = self.observe.apply(config);
        let config = self.strategy.apply(config);
        config.resolve(backend)?;
        Ok(config)
    }

    /// Adds the schedules of `--crontab` to `registry` ([`Registry::add_crontab`]): a bad
    /// line, or a keyword `registry` has no handler for, is an error naming the file and
    /// the line.
    pub fn add_crontab(&self, registry: &mut Registry) -> Result<()> {
        if let Some(file) = &self.crontab {
            let n = registry.add_crontab(file)?;
            log::info!("crontab {}: {n} schedule(s)", file.display());
        }
        Ok(())
    }

    /// `--shutdown-timeout`.
    pub fn shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Test {
        #[command(flatten)]
        worker: WorkerArgs,
    }

    #[test]
    fn flags_left_out_take_the_backends_defaults() {
        let args = Test::try_parse_from(["t", "--threads", "3"])
            .unwrap()
            .worker;
        let config = args.config(Backend::Postgres).unwrap();
        assert_eq!((config.threads, config.queue), (Some(3), None));
        let settings = config.resolve(Backend::Postgres).unwrap();
        assert_eq!((settings.threads, settings.queue), (3, 24));
        assert!(settings.exit_on_hang);
    }
}

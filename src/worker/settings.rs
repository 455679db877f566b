//! What a worker runs with: its [`WorkerConfig`] with every default of its backend filled
//! in, checked ([`Settings`]).

use std::time::Duration;

use super::config::{
    default_threads, WorkerConfig, DEFAULT_DEAD_AFTER_BEATS, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE,
    MAX_TASK_TIMEOUT, QUEUE_PER_THREAD, SQLITE_DEFAULT_QUEUE,
};
use super::strategy::StrategySettings;
use crate::backoff::Backoff;
use crate::db::Backend;
use crate::domain::{validate_domains, Domain};
use crate::error::{Error, Result};

impl WorkerConfig {
    /// The settings for `backend`, every default filled in, checked.
    ///
    /// Fails with [`Error::InvalidConfig`] naming the setting out of range.
    pub(crate) fn resolve(&self, backend: Backend) -> Result<Settings> {
        // No duration longer than 100 years, first: the multiples of them and the instants
        // made of them fit.
        for (setting, d) in [
            ("poll-interval", Some(self.poll_interval)),
            ("heartbeat", Some(self.heartbeat)),
            ("dead-after", self.dead_after),
            ("task-timeout", Some(self.task_timeout)),
            ("on-dead-timeout", Some(self.on_dead_timeout)),
        ] {
            if let Some(d) = d.filter(|&d| d > MAX_TASK_TIMEOUT) {
                return Err(Error::InvalidConfig {
                    setting,
                    reason: format!("must be at most 100 years, not {d:?}"),
                });
            }
        }
        let threads = self.threads.unwrap_or(match backend {
            Backend::Postgres | Backend::Mysql => default_threads(),
            Backend::Sqlite => 1,
        });
        let lock = self
            .claim_style
            .locks(backend, self.commit_batch, self.queue)?;
        validate_domains(&self.domains, threads)?;
        // A lock claim starts each chunk at once: a queued chunk would hold its leases, their
        // deadline running, while it waited.
        let queue = self
            .queue
            .unwrap_or(match (self.commit_batch > 1, self.threads, backend) {
                _ if lock => 0,
                (true, _, _) => threads,
                (false, Some(threads), _) => threads * QUEUE_PER_THREAD,
                (false, None, Backend::Postgres | Backend::Mysql) => threads * QUEUE_PER_THREAD,
                (false, None, Backend::Sqlite) => SQLITE_DEFAULT_QUEUE,
            });
        let page_size = self.page_size.unwrap_or(if self.commit_batch > 1 {
            ((threads + queue + 1) * self.commit_batch).min(MAX_PAGE_SIZE)
        } else {
            DEFAULT_PAGE_SIZE
        });
        let dead_after = self
            .dead_after
            .unwrap_or(self.heartbeat.saturating_mul(DEFAULT_DEAD_AFTER_BEATS));
        let settings = Settings {
            strategy: StrategySettings::resolve(self, threads, dead_after)?,
            threads,
            queue,
            page_size,
            max_attempts: self.max_attempts,
            backoff: self.backoff,
            poll_interval: self.poll_interval,
            listen: self.listen,
            heartbeat: self.heartbeat,
            dead_after,
            task_timeout: self.task_timeout,
            exit_on_hang: self.exit_on_hang,
            commit_batch: self.commit_batch,
            lock,
            domains: self.domains.clone(),
            metrics_addr: self.metrics_addr,
            on_dead: self.on_dead.clone(),
            on_dead_timeout: self.on_dead_timeout,
        };
        settings.validate()?;
        Ok(settings)
    }
}

/// A [`WorkerConfig`] with every default filled in for one backend.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) threads: usize,
    pub(crate) queue: usize,
    pub(crate) page_size: usize,
    pub(crate) max_attempts: i32,
    pub(crate) backoff: Backoff,
    pub(crate) poll_interval: Duration,
    pub(crate) listen: bool,
    pub(crate) heartbeat: Duration,
    pub(crate) dead_after: Duration,
    pub(crate) task_timeout: Duration,
    pub(crate) exit_on_hang: bool,
    pub(crate) commit_batch: usize,
    /// Whether chunks are claimed by locking their rows ([`super::style::ClaimStyle::Lock`]).
    pub(crate) lock: bool,
    pub(crate) domains: Vec<Domain>,
    pub(crate) metrics_addr: Option<std::net::SocketAddr>,
    pub(crate) on_dead: Option<String>,
    pub(crate) on_dead_timeout: Duration,
    pub(crate) strategy: StrategySettings,
}

impl Settings {
    /// Checks every setting, naming the one out of range.
    fn validate(&self) -> Result<()> {
        let bad =
            |setting: &'static str, reason: String| Err(Error::InvalidConfig { setting, reason });
        if !(1..=1024).contains(&self.threads) {
            return bad(
                "threads",
                format!("must be between 1 and 1024, not {}", self.threads),
            );
        }
        if self.queue > 100_000 {
            return bad(
                "queue",
                format!("must be at most 100000, not {}", self.queue),
            );
        }
        if !(1..=MAX_PAGE_SIZE).contains(&self.page_size) {
            return bad(
                "page",
                format!(
                    "must be between 1 and {MAX_PAGE_SIZE}, not {}",
                    self.page_size
                ),
            );
        }
        if self.max_attempts < 1 {
            return bad(
                "max-attempts",
                format!("must be at least 1, not {}", self.max_attempts),
            );
        }
        if self.poll_interval < Duration::from_millis(10) {
            return bad("poll-interval", "must be at least 10ms".into());
        }
        if self.heartbeat < Duration::from_millis(100) {
            return bad("heartbeat", "must be at least 100ms".into());
        }
        if self.dead_after < self.heartbeat * 2 {
            return bad(
                "dead-after",
                format!(
                    "({:?}) must be at least two heartbeats ({:?})",
                    self.dead_after,
                    self.heartbeat * 2
                ),
            );
        }
        if !(1..=1000).contains(&self.commit_batch) {
            return bad(
                "commit-batch",
                format!("must be between 1 and 1000, not {}", self.commit_batch),
            );
        }
        if self.task_timeout < Duration::from_millis(100) {
            return bad("task-timeout", "must be at least 100ms".into());
        }
        // The deadline of a chunk's tasks is the timeout times the chunk size.
        if self.task_timeout * self.commit_batch as u32 > MAX_TASK_TIMEOUT {
            return bad(
                "task-timeout",
                format!(
                    "times commit-batch must be at most 100 years, not {:?}",
                    self.task_timeout * self.commit_batch as u32
                ),
            );
        }
        if self.on_dead.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return bad("on-dead", "must be a command, not empty".into());
        }
        if self.on_dead_timeout < Duration::from_millis(100) {
            return bad("on-dead-timeout", "must be at least 100ms".into());
        }
        self.backoff
            .validate()
            .map_err(|reason| Error::InvalidConfig {
                setting: "backoff",
                reason,
            })
    }

    /// The most tasks one claim may take: every thread, the queue, and the claiming thread,
    /// each with a chunk of `commit_batch` tasks.
    pub(crate) fn claim_capacity(&self) -> usize {
        (self.threads + self.queue + 1) * self.commit_batch
    }

    /// How long a claimed task has, in the database, before it is rescued as hung: the task
    /// timeout per handler of its chunk.
    pub(crate) fn claim_timeout(&self) -> Duration {
        self.task_timeout * self.commit_batch as u32
    }

    /// Connections the worker's pool needs: one per thread, one for the claiming thread
    /// (which also runs tasks when the pool is full and, on PostgreSQL, while it waits for
    /// room), one for the rescue pass. The heartbeat has its own connection outside the
    /// pool.
    pub(crate) fn pool_size(&self) -> u32 {
        u32::try_from(self.threads + 2).unwrap_or(u32::MAX)
    }
}

/// `duration` in whole milliseconds, as the statements take durations (saturating).
pub(crate) fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;

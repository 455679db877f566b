//! The domains' watchdog (seed 004's Watchdog): a handler of a domain with a timeout that
//! runs past it has its database work cancelled (PostgreSQL: `pg_cancel_backend` of its
//! connection's backend, so the statement it waits on fails and its transaction rolls
//! back), its task is charged a failure (retried after the backoff, or dead at its last
//! attempt), and its slot counts as stuck until the handler returns: a Rust thread cannot be
//! killed, so the slot is not reused meanwhile. The charge moves the task out of `running`
//! under its claim, which fences out the late completion.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::config::Settings;
use super::observers::Observers;
use super::on_dead::DeadTask;
use super::slots::Lanes;
use crate::db::{DbConnection, DbPool};
use crate::driver::{driver, Claim};
use crate::error::{OpContext, Result};
use crate::task::ClaimedTask;

/// One watched handler.
#[derive(Debug, Clone)]
struct Watched {
    lane: usize,
    started: Instant,
    timeout: Duration,
    /// Its connection's backend (PostgreSQL).
    backend: Option<i32>,
    claim: Claim,
    failures: i32,
    max_attempts: Option<i32>,
    stuck: bool,
    /// What the metrics and the dead-task hook are told if the timeout makes it dead.
    keyword: String,
    biz_id: String,
    tenant: Option<String>,
    claimed_at: Instant,
}

/// The handlers of domains with a timeout, while they run.
pub(crate) struct Timeouts {
    running: Mutex<HashMap<(i64, i64), Watched>>,
    lanes: Arc<Lanes>,
}

/// Watches one handler until dropped; a stuck slot is freed then.
pub(crate) struct TimeoutWatch<'w> {
    timeouts: &'w Timeouts,
    key: (i64, i64),
}

impl Drop for TimeoutWatch<'_> {
    fn drop(&mut self) {
        let removed = self.timeouts.lock().remove(&self.key);
        if let Some(watched) = removed.filter(|w| w.stuck) {
            self.timeouts.lanes.lock().unstick(watched.lane);
            log::warn!(
                "task {}: its handler returned after {:?}, past its domain's timeout; its slot \
                 is free again",
                watched.claim.id,
                watched.started.elapsed()
            );
        }
    }
}

impl Timeouts {
    pub(crate) fn new(lanes: Arc<Lanes>) -> Timeouts {
        Timeouts {
            running: Mutex::default(),
            lanes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(i64, i64), Watched>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Watches `task`'s handler, of `lane`, from now, for `timeout`; `backend` is its
    /// connection's backend process, to cancel.
    pub(crate) fn watch(
        &self,
        task: &ClaimedTask,
        lane: usize,
        timeout: Duration,
        backend: Option<i32>,
    ) -> TimeoutWatch<'_> {
        let claim = task.claim();
        let key = (claim.id, claim.token);
        self.lock().insert(
            key,
            Watched {
                lane,
                started: Instant::now(),
                timeout,
                backend,
                claim,
                failures: task.failures,
                max_attempts: task.max_attempts,
                stuck: false,
                keyword: task.context.keyword.clone(),
                biz_id: task.context.biz_id.clone(),
                tenant: task.context.tenant.clone(),
                claimed_at: task.claimed_at,
            },
        );
        TimeoutWatch {
            timeouts: self,
            key,
        }
    }

    /// Ends each handler past its timeout not ended yet: marks its slot stuck, cancels its
    /// backend's statement and charges its task a failure. Returns how many it ended.
    pub(crate) fn run_once(
        &self,
        pool: &DbPool,
        settings: &Settings,
        observers: &Observers,
    ) -> usize {
        let now = Instant::now();
        let late: Vec<Watched> = {
            let mut running = self.lock();
            running
                .values_mut()
                .filter(|w| !w.stuck && now.saturating_duration_since(w.started) > w.timeout)
                .map(|w| {
                    w.stuck = true;
                    w.clone()
                })
                .collect()
        };
        for watched in &late {
            self.lanes.lock().mark_stuck(watched.lane);
            match pool
                .get()
                .op("task timeout")
                .and_then(|mut conn| charge(&mut conn, settings, watched))
            {
                Ok(Some(error)) => observers.dead_at_timeout(
                    DeadTask {
                        id: watched.claim.id,
                        keyword: watched.keyword.clone(),
                        biz_id: watched.biz_id.clone(),
                        tenant: watched.tenant.clone(),
                        error,
                    },
                    watched.claimed_at,
                ),
                Ok(None) => {}
                Err(e) => {
                    log::error!(
                        "task {}: past its domain's timeout, and its failure could not be \
                     counted ({e}); its deadline in the database still rescues it",
                        watched.claim.id
                    );
                }
            }
        }
        late.len()
    }
}

/// Cancels the backend's statement and charges the task a failure under its claim; returns
/// the error stored when that made the task dead.
fn charge(
    conn: &mut DbConnection,
    settings: &Settings,
    watched: &Watched,
) -> Result<Option<String>> {
    let ran = watched.started.elapsed();
    if let Some(backend) = watched.backend {
        driver(conn).backend_cancel(backend).op("task timeout")?;
    }
    let failures = watched.failures.saturating_add(1);
    let max = watched.max_attempts.unwrap_or(settings.max_attempts);
    let error = format!(
        "timed out: its handler ran for {ran:?}, past its domain's timeout of {:?}",
        watched.timeout
    );
    let charged = if failures >= max {
        driver(conn).task_fail_dead(&watched.claim, &error)
    } else {
        let delay = settings
            .backoff
            .delay(failures.unsigned_abs(), fastrand::f64());
        let delay_ms = i64::try_from(delay.as_millis()).unwrap_or(i64::MAX);
        driver(conn).task_fail_retry(&watched.claim, &error, delay_ms)
    }
    .op("task timeout")?;
    log::error!(
        "task {}: {error}; {}",
        watched.claim.id,
        if charged == 0 {
            "it had already left its claim"
        } else if failures >= max {
            "dead; its slot is stuck until the handler returns"
        } else {
            "a failure counted; its slot is stuck until the handler returns"
        }
    );
    Ok((charged > 0 && failures >= max).then_some(error))
}

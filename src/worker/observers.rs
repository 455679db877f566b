//! What watches a worker from outside: its metrics ([`crate::metrics`]) and its dead-task
//! hook ([`super::on_dead`]), each optional. With neither, every call here is one branch.

use std::sync::Arc;
use std::time::Instant;

use super::on_dead::{DeadHook, DeadTask};
use super::tally::Outcome;
use crate::driver::RescuedRow;
use crate::metrics::{Finished, Metrics};
use crate::task::ClaimedTask;

/// A worker's metrics and dead-task hook, shared with its services.
#[derive(Clone, Default)]
pub(crate) struct Observers {
    pub(crate) metrics: Option<Arc<Metrics>>,
    pub(crate) on_dead: Option<Arc<DeadHook>>,
}

impl Observers {
    /// A task's attempt ended with `outcome` (only done, retried and dead are counted).
    pub(crate) fn finished(&self, task: &ClaimedTask, outcome: Outcome) {
        let Some(metrics) = &self.metrics else {
            return;
        };
        let finished = match outcome {
            Outcome::Done => Finished::Done,
            Outcome::Retried => Finished::Retried,
            Outcome::Dead => Finished::Dead,
            Outcome::Lost | Outcome::Released | Outcome::Abandoned => return,
        };
        metrics.finished(task, finished);
    }

    /// Every task of `tasks` is done.
    pub(crate) fn all_done(&self, tasks: &[ClaimedTask]) {
        if self.metrics.is_some() {
            for task in tasks {
                self.finished(task, Outcome::Done);
            }
        }
    }

    /// The task is dead now, its last error `error`: its hook runs.
    pub(crate) fn dead(&self, task: &ClaimedTask, error: &str) {
        if let Some(hook) = &self.on_dead {
            hook.dead(DeadTask {
                id: task.context.id,
                keyword: task.context.keyword.clone(),
                biz_id: task.context.biz_id.clone(),
                tenant: task.context.tenant.clone(),
                error: error.to_owned(),
            });
        }
    }

    /// A task was made dead by its domain's timeout while its handler still ran (the
    /// handler's own outcome is then fenced out, so it is counted here).
    pub(crate) fn dead_at_timeout(&self, task: DeadTask, claimed_at: Instant) {
        if let Some(metrics) = &self.metrics {
            metrics.finished_at(&task.keyword, claimed_at, Finished::Dead);
        }
        if let Some(hook) = &self.on_dead {
            hook.dead(task);
        }
    }

    /// A task was charged by its domain's timeout and will run again (its handler's own
    /// outcome is fenced out, so it is counted here).
    pub(crate) fn retried_at_timeout(&self, keyword: &str, claimed_at: Instant) {
        if let Some(metrics) = &self.metrics {
            metrics.finished_at(keyword, claimed_at, Finished::Retried);
        }
    }

    /// A claim statement, asked at `started`, returned.
    pub(crate) fn claimed(&self, started: Instant) {
        if let Some(metrics) = &self.metrics {
            metrics.claimed(started);
        }
    }

    /// A rescue pass moved these tasks: counted, and the hook runs for those now dead.
    pub(crate) fn rescued(&self, rows: &[RescuedRow]) {
        for row in rows {
            if let Some(metrics) = &self.metrics {
                metrics.rescued(&row.keyword, &row.state);
            }
            if let (Some(hook), "dead") = (&self.on_dead, row.state.as_str()) {
                hook.dead(DeadTask {
                    id: row.id,
                    keyword: row.keyword.clone(),
                    biz_id: row.biz_id.clone(),
                    tenant: row.tenant.clone(),
                    error: row.reason.clone(),
                });
            }
        }
    }
}

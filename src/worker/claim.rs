//! The claim: one statement that takes a page of due tasks for this node.

use std::time::{Duration, Instant};

use std::sync::Arc;

use super::engine::Worker;
use super::fairness::{participants, Took};
use super::heartbeat::may_claim;
use super::settings::millis;
use crate::db::transaction::DiscardBroken;
use crate::driver::{driver, ClaimRow, Claiming, Driver, Due, Picked};
use crate::error::{Error, OpContext, Result};
use crate::handler::TaskContext;
use crate::task::ClaimedTask;

impl Worker {
    /// Claims one page of due tasks for registered keywords, in one statement: state
    /// running, owner this node, claim token bumped. The first half of [`Worker::run_once`]
    /// with stamping claims; this is a stamping claim whatever the worker's claim style.
    ///
    /// Fails with [`Error::HeartbeatStale`] when this node has not recorded a heartbeat for
    /// `dead_after − heartbeat`: other nodes may soon rescue its tasks, so it must not claim.
    ///
    /// With domains, it claims for every domain that is not paused, whatever its room.
    pub fn claim(&self) -> Result<Vec<ClaimedTask>> {
        let keywords = self.services.domains.plan().keywords();
        self.claim_up_to(&keywords, self.claim_limit(), self.settings.claim_timeout())
    }

    /// Claims at most `limit` due tasks of `keywords` (see [`Worker::claim`]), each with
    /// `timeout` to run: those of the tenants with a `max_running`, within it, and the
    /// others. Neither kind may starve the other while it has a backlog: which is claimed
    /// first alternates from claim to claim. The claim strategy may lower `limit`
    /// (`least_count`) and narrows what is due (`id_hash`, `weight`).
    pub(super) fn claim_up_to(
        &self,
        keywords: &[String],
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<ClaimedTask>> {
        let limit = self.services.strategy.cap(limit);
        if limit == 0 {
            return Ok(Vec::new());
        }
        // A suspect first, alone (see `suspects`), when one may be due.
        let mut page: Vec<ClaimedTask> =
            self.claim_suspect(keywords, timeout)?.into_iter().collect();
        let limit = limit - page.len();
        if limit == 0 {
            return Ok(page);
        }
        if self.services.limits.tenants().is_empty() {
            page.extend(self.claim_plain(keywords, limit, timeout)?);
            return Ok(page);
        }
        self.take_both_kinds(limit, |limited, n| {
            let claimed = if limited {
                self.claim_limited_up_to(keywords, n, timeout)?
            } else {
                self.claim_plain(keywords, n, timeout)?
            };
            let taken = claimed.len();
            page.extend(claimed);
            Ok(taken)
        })?;
        Ok(page)
    }

    /// Takes up to `limit` tasks with `take(limited, n)`, of one kind and then, for what is
    /// left, of the other, which kind first alternating from call to call; returns how many
    /// it took. An error of the second kind after tasks of the first were taken is logged
    /// (they run; the next claim meets the error).
    pub(super) fn take_both_kinds(
        &self,
        limit: usize,
        mut take: impl FnMut(bool, usize) -> Result<usize>,
    ) -> Result<usize> {
        let limited_first = self.services.limits.next_turn() % 2 == 0;
        let first = take(limited_first, limit)?;
        if first >= limit {
            return Ok(first);
        }
        match take(!limited_first, limit - first) {
            Ok(second) => Ok(first + second),
            Err(e) if first > 0 => {
                log::debug!("a claim failed after another: {e}");
                Ok(first)
            }
            Err(e) => Err(e),
        }
    }

    /// The stamp claim of tasks not of a tenant with a `max_running`: the fair claim. A
    /// page shared by several participants (tenants, and the tasks without one) comes back
    /// short when one of them had fewer tasks due than its share while another had more:
    /// the rest is claimed again at once, twice at most. A page that comes back short while
    /// tenants further along the ring were not visited ([`FairClaims::goes_on`]) is claimed
    /// on at once until the ring has come round: an empty page means that nothing is due.
    ///
    /// [`FairClaims::goes_on`]: super::fairness::FairClaims::goes_on
    fn claim_plain(
        &self,
        keywords: &[String],
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<ClaimedTask>> {
        let fair = &self.services.limits.fair;
        let mut page = self.claim_fair(keywords, limit, timeout)?;
        let mut shortfalls = 0;
        while page.len() < limit {
            if !fair.goes_on(keywords) {
                if shortfalls == 2 || participants(&page).len() < 2 {
                    break;
                }
                shortfalls += 1;
            }
            match self.claim_fair(keywords, limit - page.len(), timeout) {
                Ok(more) if more.is_empty() && !fair.goes_on(keywords) => break,
                Ok(more) => page.extend(more),
                // Nothing claimed yet: the error is the claim's (an empty page would say
                // that nothing is due).
                Err(e) if page.is_empty() => return Err(e),
                // What was claimed runs; the next claim meets the error.
                Err(e) => {
                    log::debug!("a claim failed after another: {e}");
                    break;
                }
            }
        }
        Ok(page)
    }

    /// One claim statement: fair (docs/guide/src/tenants.md, "Fair claiming"), its ring of tenants
    /// starting after where the last one left off, or solo while one participant is alone.
    fn claim_fair(
        &self,
        keywords: &[String],
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<ClaimedTask>> {
        let fair = &self.services.limits.fair;
        let mut picked_by = None;
        let mut took = (Vec::new(), false, None, false, Vec::new());
        let page = self.claim_statement(
            keywords,
            Some(false),
            limit,
            timeout,
            |driver, owner, due, except, n, timeout| {
                // The pick and the claim see one list of the tenants claimed apart.
                let pick = picked_by.insert(fair.next_pick(keywords, except));
                let claim = Claiming {
                    owner,
                    due,
                    except,
                    limit: n,
                    timeout_ms: timeout,
                };
                let mut picked = driver.task_claim_page(&claim, &pick.as_pick())?;
                took = (
                    std::mem::take(&mut picked.weights),
                    picked.crowded,
                    picked.ring_end.take(),
                    picked.ring_cut,
                    std::mem::take(&mut picked.shared),
                );
                Ok(picked)
            },
        )?;
        if let Some(pick) = picked_by {
            let (weights, crowded, ring_end, ring_cut, shared) = took;
            let took = Took {
                page: &page,
                weights: &weights,
                crowded,
                ring_end,
                ring_cut,
                shared,
                limit,
            };
            fair.picked(keywords, &pick, took);
        }
        Ok(page)
    }

    /// Claims at most `limit` due tasks of the tenants with a `max_running`, within it (none
    /// when no tenant has one): a stamping claim whatever the claim style, since the
    /// fleet-wide count is of `running` rows. The tenants are handed over in an order that
    /// rotates from claim to claim (SQLite serves them in turn until the page is full).
    pub(super) fn claim_limited_up_to(
        &self,
        keywords: &[String],
        limit: usize,
        timeout: Duration,
    ) -> Result<Vec<ClaimedTask>> {
        let tenants = self.services.limits.tenants();
        if tenants.is_empty() {
            return Ok(Vec::new());
        }
        let mut rotated = tenants.to_vec();
        let turn = self.services.limits.next_rotation() % rotated.len() as u64;
        rotated.rotate_left(usize::try_from(turn).unwrap_or(0));
        // Their suspects too: they are not claimed alone (see `suspects`).
        self.claim_statement(
            keywords,
            None,
            limit,
            timeout,
            |driver, owner, due, except, n, timeout| {
                let claim = Claiming {
                    owner,
                    due,
                    except,
                    limit: n,
                    timeout_ms: timeout,
                };
                driver.task_claim_limited(&claim, &rotated)
            },
        )
    }

    /// Runs one claim statement of `limit` tasks of `keywords` for this node, with the
    /// heartbeat check, the writer's turn and the deadline every claim has (`timeout` from
    /// now); `claim` is given the driver, the owner, what is due (the keywords and the claim
    /// strategy's partition), the tenants with a `max_running`, the limit and the timeout.
    /// Claims nothing for no keyword. `suspect` says which suspects are due (see [`Due`]).
    fn claim_statement(
        &self,
        keywords: &[String],
        suspect: Option<bool>,
        limit: usize,
        timeout: Duration,
        claim: impl FnOnce(
            &mut dyn Driver,
            i64,
            &Due<'_>,
            &[String],
            i64,
            i64,
        ) -> diesel::QueryResult<Picked>,
    ) -> Result<Vec<ClaimedTask>> {
        if keywords.is_empty() {
            return Ok(Vec::new());
        }
        self.ensure_heartbeat_fresh()?;
        let limited = self.services.limits.tenants();
        let _claiming = self.node.claim_turn();
        let mut conn = self.engine_conn().op("task claim")?;
        let owner = self.node.id();
        // The local deadline starts before the statement, so it never ends after the
        // database's.
        let asked = Instant::now();
        let deadline = asked + timeout;
        let picked = {
            let _turn = self.writer_turn.take();
            let due = Due {
                keywords,
                partition: self.services.strategy.partition(),
                suspect,
            };
            claim(
                driver(&mut conn),
                owner,
                &due,
                &limited,
                i64::try_from(limit).unwrap_or(i64::MAX),
                millis(timeout),
            )
            .discard_broken(&mut conn)
        };
        drop(conn);
        let rows = self
            .confirmed(picked, false, deadline)
            .op("task claim")?
            .rows;
        self.observers.claimed(asked);
        Ok(claimed_tasks(rows, owner, deadline))
    }

    /// The claim statement's plan (`EXPLAIN`) for this worker's keywords and page (with lock
    /// claims, the lock statement's for a chunk), one line per row: for operators checking
    /// that the claim stays an index range scan at their backlog.
    pub fn claim_plan(&self) -> Result<Vec<String>> {
        let mut conn = self.pool.get().op("task claim plan")?;
        let due = Due {
            keywords: &self.keywords,
            partition: self.services.strategy.partition(),
            suspect: Some(false),
        };
        if self.settings.lock {
            let limit = i64::try_from(self.settings.commit_batch).unwrap_or(i64::MAX);
            return driver(&mut conn)
                .task_lease_plan(&due, limit)
                .op("task claim plan");
        }
        let limit = i64::try_from(self.claim_limit()).unwrap_or(i64::MAX);
        driver(&mut conn)
            .task_claim_plan(&due, limit)
            .op("task claim plan")
    }

    /// The most tasks one claim takes: a page, but never more than can start at once (a
    /// claimed task's deadline runs from its claim, so it must not wait for more than the
    /// queue ahead of it).
    pub(super) fn claim_limit(&self) -> usize {
        self.settings.page_size.min(self.settings.claim_capacity())
    }

    /// Fails with [`Error::HeartbeatStale`] when this node has not recorded a heartbeat for
    /// so long that other nodes may soon rescue its tasks; tries one heartbeat first.
    pub(super) fn ensure_heartbeat_fresh(&self) -> Result<()> {
        let heartbeat = &self.services.heartbeat;
        let fresh = |since| may_claim(since, self.settings.heartbeat, self.settings.dead_after);
        if fresh(heartbeat.since_last_ok()) {
            return Ok(());
        }
        let _ = heartbeat.run_once();
        let since = heartbeat.since_last_ok();
        if fresh(since) {
            return Ok(());
        }
        Err(Error::HeartbeatStale {
            node_id: self.node.id(),
            since,
        })
    }
}

/// The claimed tasks of `rows`, in claim order (priority first, then age: `RETURNING` and
/// the lock give no order).
pub(super) fn claimed_tasks(
    mut rows: Vec<ClaimRow>,
    owner: i64,
    deadline: Instant,
) -> Vec<ClaimedTask> {
    rows.sort_by_key(|row| (row.priority, row.id));
    let claimed_at = Instant::now();
    rows.into_iter()
        .map(|row| ClaimedTask {
            context: TaskContext {
                id: row.id,
                keyword: row.keyword,
                biz_id: row.biz_id,
                tenant: row.tenant,
                attempt: row.failures.saturating_add(1),
                payload: row.biz_data,
                cancelled: std::sync::Arc::default(),
            },
            failures: row.failures,
            max_attempts: row.max_attempts,
            claim_token: row.claim_token,
            owner,
            deadline,
            claimed_at,
            solo: None,
        })
        .collect()
}

impl Worker {
    /// Claims the first due suspect of `keywords` (see [`super::suspects`]), to run alone
    /// with `timeout`, unless this process runs one already (or none may be due). The
    /// tenants with a `max_running` are left out: their claims, which count what runs, take
    /// their suspects like any task.
    pub(super) fn claim_suspect(
        &self,
        keywords: &[String],
        timeout: Duration,
    ) -> Result<Option<ClaimedTask>> {
        if keywords.is_empty() || !self.services.suspects.maybe() {
            return Ok(None);
        }
        let Some(hold) = self.dispatcher.solo_turn().take() else {
            self.services.suspects.passed_over();
            return Ok(None);
        };
        match self.claim_one_suspect(keywords, timeout)? {
            Some(mut task) => {
                log::info!(
                    "task {}: a suspect (its process died under it), claimed to run alone",
                    task.context.id
                );
                task.solo = Some(Arc::new(hold));
                Ok(Some(task))
            }
            // None due: none for the next claims either, until a rescue pass marks some, but
            // only when this claim looked at every keyword the worker serves. A domain's lane
            // looks at its own: had the lane before it said "none", the suspects of the lanes
            // after it would wait for ever (the harness's seed 503).
            None => {
                if keywords.len() >= self.services.domains.plan().keywords().len() {
                    self.services.suspects.found(false);
                }
                Ok(None)
            }
        }
    }

    fn claim_one_suspect(
        &self,
        keywords: &[String],
        timeout: Duration,
    ) -> Result<Option<ClaimedTask>> {
        self.ensure_heartbeat_fresh()?;
        let limited = self.services.limits.tenants();
        let _claiming = self.node.claim_turn();
        let mut conn = self.engine_conn().op("task claim")?;
        let owner = self.node.id();
        let asked = Instant::now();
        let picked = {
            let _turn = self.writer_turn.take();
            let due = Due {
                keywords,
                partition: self.services.strategy.partition(),
                suspect: Some(true),
            };
            driver(&mut conn)
                .task_claim_suspect(owner, &due, &limited, millis(timeout))
                .discard_broken(&mut conn)
        };
        drop(conn);
        let rows = self
            .confirmed(picked, false, asked + timeout)
            .op("task claim")?
            .rows;
        self.observers.claimed(asked);
        Ok(claimed_tasks(rows, owner, asked + timeout)
            .into_iter()
            .next())
    }
}

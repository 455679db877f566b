//! The cron timer (seed 002's cron, without a leader): the registry's schedules enqueue
//! their ticks as they come due, by the database clock.
//!
//! Every live node with a schedule runs the same pass ([`Worker::schedule_once`]): it reads
//! the database clock and each schedule's row, and enqueues each due tick as the task
//! `(keyword, "cron:<tick>")` in one transaction that first records the latest as the row's
//! `last_tick` (which never moves back), unless the row's `last_tick` has reached the first
//! of them since the pass read it: another node enqueued them first (their tasks may be done
//! and pruned since, so the unique key `(keyword, biz_id)` alone would not tell): the pass
//! reads the row again and enqueues only the ticks after it. The row's lock orders two passes
//! that read it at once: the second finds it moved. So a tick is one task however many nodes
//! run it, with no leader and no lock of our own.
//!
//! Which ticks are due: those after the row's last tick (or, for a schedule seen for the
//! first time, after the moment its row was written: no catch-up) up to now. A tick that no
//! node enqueued within `dead_after` of its time was missed — no node with the schedule was
//! live, as the fleet counts liveness — and when the oldest due tick is missed, the pass
//! enqueues only the latest due tick, or with a backfill window every due tick within it
//! ([`crate::schedule::MAX_TICKS`] at most). Otherwise every due tick is enqueued: a node
//! that is late by less than that (a slow pass, a short restart) skips none.
//!
//! `Worker::run` runs the pass on a thread and a connection of its own (not the heartbeat's,
//! not the pool's): at each next tick, and at least every heartbeat; `Worker::drain` runs it
//! once at start, on a pooled connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::engine::Worker;
use crate::db::transaction::{mark_broken, write_transaction_marked};
use crate::db::DbConnection;
use crate::driver::schedule::{
    schedule_advance, schedule_insert, schedule_read, time_of, time_text, ScheduleRow,
};
use crate::enqueue::{enqueue_batch, Enqueued};
use crate::error::{Error, OpContext, Result};
use crate::log_label;
use crate::schedule::{tick_biz_id, Schedule, MAX_TICKS};
use crate::task::NewTask;

/// How long past a tick the timer wakes: the database clock has passed it by then even if
/// the local clock runs a little fast.
const TICK_MARGIN: Duration = Duration::from_millis(5);
/// How long the timer waits after a failed pass before it tries again.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// One tick a pass enqueued.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScheduledTick {
    /// The scheduled keyword.
    pub keyword: String,
    /// The tick (UTC).
    pub tick: DateTime<Utc>,
    /// Its task's id.
    pub task_id: i64,
    /// `false` when another node had enqueued it first (nothing was written).
    pub created: bool,
}

/// What one cron pass did ([`Worker::schedule_once`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CronPass {
    /// The database clock when the pass read the schedules (`None`: no schedule, no read).
    pub now: Option<DateTime<Utc>>,
    /// The ticks it enqueued, each keyword's oldest first.
    pub ticks: Vec<ScheduledTick>,
    /// The schedules seen for the first time: their row is written, and they start from now.
    pub first_seen: Vec<String>,
    /// The schedules some of whose due ticks were not enqueued (missed while the fleet was
    /// down, or past [`MAX_TICKS`]), with how many (counted up to [`MAX_TICKS`]).
    pub skipped: Vec<(String, u64)>,
    /// The earliest next tick of the schedules, after `now`.
    pub next: Option<DateTime<Utc>>,
}

impl Worker {
    /// Runs one cron pass now: enqueues the due ticks of the registry's schedules (see the
    /// module's rules), as `run`'s cron thread does at each tick and `drain` once at start.
    /// Each schedule's ticks are enqueued in one transaction with its `last_tick`; a pass
    /// that fails part-way leaves the schedules it did not reach for the next pass.
    pub fn schedule_once(&self) -> Result<CronPass> {
        let schedules: Vec<(&str, &Schedule)> = self.registry.schedules().collect();
        if schedules.is_empty() {
            return Ok(CronPass::default());
        }
        let mut conn = self.engine_conn().op("schedule read")?;
        let result = self.pass(&mut conn, &schedules);
        if matches!(&result, Err(e) if e.is_connection_lost()) {
            mark_broken(&mut conn);
        }
        result
    }

    fn pass(&self, conn: &mut DbConnection, schedules: &[(&str, &Schedule)]) -> Result<CronPass> {
        let keywords: Vec<String> = schedules.iter().map(|(k, _)| (*k).to_owned()).collect();
        let rows = schedule_read(conn, &keywords).op("schedule read")?;
        let now = rows
            .first()
            .and_then(|r| time_of(&r.db_now))
            .ok_or(Error::Database {
                operation: "schedule read",
                source: diesel::result::Error::NotFound,
            })?;
        let mut pass = CronPass {
            now: Some(now),
            ..CronPass::default()
        };
        // A schedule that fails (its enqueue refused, say) is logged and the others still
        // run: the pass returns the first failure after trying them all.
        let mut first_error = None;
        for &(keyword, schedule) in schedules {
            let done = match rows.iter().find(|r| r.keyword.as_deref() == Some(keyword)) {
                None => {
                    let _turn = self.writer_turn.take();
                    let inserted =
                        schedule_insert(conn, keyword, schedule.expression(), self.node.name())
                            .op("schedule insert");
                    if inserted.is_ok() {
                        log::info!(
                            "schedule {keyword} ({}) first seen: its ticks run from now on",
                            schedule.expression()
                        );
                        pass.first_seen.push(keyword.to_owned());
                    }
                    inserted.map(drop)
                }
                Some(row) => self.enqueue_due(conn, keyword, schedule, row, now, &mut pass),
            };
            if let Err(e) = done {
                if e.is_connection_lost() {
                    return Err(e);
                }
                log::warn!("schedule {keyword}: {e}");
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        pass.next = schedules
            .iter()
            .filter_map(|(_, s)| s.next_after(now))
            .min();
        Ok(pass)
    }

    /// Enqueues `keyword`'s due ticks, with its `last_tick`, in one transaction.
    fn enqueue_due(
        &self,
        conn: &mut DbConnection,
        keyword: &str,
        schedule: &Schedule,
        row: &ScheduleRow,
        now: DateTime<Utc>,
        pass: &mut CronPass,
    ) -> Result<()> {
        let since = row.since.as_deref().and_then(time_of);
        let last = row.last_tick.as_deref().and_then(time_of);
        let Some(cursor) = since.max(last) else {
            return Ok(());
        };
        let Some(oldest) = schedule.next_after(cursor).filter(|t| *t <= now) else {
            return Ok(());
        };
        let missed = (now - oldest).to_std().unwrap_or_default() > self.settings.dead_after;
        let from = if missed {
            let window = chrono::TimeDelta::from_std(schedule.backfill_window())
                .unwrap_or(chrono::TimeDelta::MAX);
            cursor.max(now.checked_sub_signed(window).unwrap_or(cursor))
        } else {
            cursor
        };
        let mut ticks = schedule.ticks_between(from, now, MAX_TICKS);
        if ticks.is_empty() {
            // Missed, and no tick within the backfill window: the latest due one runs.
            ticks.extend(schedule.latest_until(now));
        }
        let Some(&latest) = ticks.last() else {
            return Ok(());
        };
        if ticks[0] > oldest {
            // The ticks after the cursor and before the first one enqueued.
            let skipped = schedule.ticks_between(cursor, ticks[0], MAX_TICKS + 1);
            let n = skipped.len().saturating_sub(1) as u64;
            let more = if n >= MAX_TICKS as u64 {
                "or more "
            } else {
                ""
            };
            log::warn!(
                "schedule {keyword}: {n} {more}due ticks from {} were not enqueued \
                 ({}); enqueueing {} tick(s) up to {}",
                tick_biz_id(oldest),
                if missed {
                    "missed: no live node had the schedule within dead-after of them"
                } else {
                    "more than the most one pass enqueues"
                },
                ticks.len(),
                tick_biz_id(latest)
            );
            pass.skipped.push((keyword.to_owned(), n));
        }
        let data = schedule.payload().cloned();
        let task_of = |tick: DateTime<Utc>| {
            let task = NewTask::new(keyword, tick_biz_id(tick));
            match &data {
                Some(data) => task.payload(data),
                None => task,
            }
        };
        let node = self.node.name();
        let (ticks, enqueued): (Vec<DateTime<Utc>>, Vec<Enqueued>) = {
            let _turn = self.writer_turn.take();
            // Marked as a task's transaction is: a node frozen inside it holds the schedule's
            // row from every other node's pass until a rescue pass ends its session.
            write_transaction_marked(conn, self.tx_mark(), |conn| -> Result<_> {
                let mut ticks = ticks;
                // Twice at most: a schedule another node moved since the read is read again
                // (its row locked by the first attempt), and the ticks it has not reached
                // are this pass's.
                for _ in 0..2 {
                    let (first, last) = (time_text(ticks[0]), time_text(latest));
                    let range = (first.as_str(), last.as_str());
                    let advanced =
                        schedule_advance(conn, keyword, schedule.expression(), range, node)
                            .op("schedule advance")?;
                    if advanced > 0 {
                        let tasks: Vec<NewTask> = ticks.iter().map(|&t| task_of(t)).collect();
                        let enqueued = enqueue_batch(conn, &tasks)?;
                        return Ok((ticks, enqueued));
                    }
                    let rows = schedule_read(conn, &[keyword.to_owned()]).op("schedule read")?;
                    let moved = rows
                        .first()
                        .and_then(|r| r.last_tick.as_deref())
                        .and_then(time_of);
                    ticks.retain(|&tick| Some(tick) > moved);
                    if ticks.is_empty() {
                        break;
                    }
                }
                log::debug!("schedule {keyword}: another node enqueued its ticks first");
                Ok((Vec::new(), Vec::new()))
            })?
        };
        for (&tick, e) in ticks.iter().zip(enqueued) {
            if e.created {
                log::info!(
                    "node {} ({node}) enqueued tick {} of schedule {keyword} as task {}",
                    self.node.id(),
                    tick_biz_id(tick),
                    e.id
                );
            }
            pass.ticks.push(ScheduledTick {
                keyword: keyword.to_owned(),
                tick,
                task_id: e.id,
                created: e.created,
            });
        }
        Ok(())
    }

    /// Runs `work` (the claim loop of `run`) with the cron timer on a thread of its own
    /// beside it, when the registry has schedules; stops the timer when `work` returns.
    pub(super) fn with_cron_timer<T>(&self, work: impl FnOnce() -> T) -> Result<T> {
        if self.registry.schedules().next().is_none() {
            return Ok(work());
        }
        let done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name(format!("outbox-cron-{}", self.node.id()))
                .spawn_scoped(scope, log_label::inherited(|| self.cron_timer(&done)))
                .map_err(|source| Error::Thread {
                    thread: "cron",
                    source,
                })?;
            let result = work();
            done.store(true, Ordering::Relaxed);
            Ok(result)
        })
    }

    /// The timer: a pass, then a wait until the next tick (at most a heartbeat), until
    /// `done` or the worker's stop flag is set. Logs once when passes start failing and
    /// once when they recover.
    ///
    /// The timer's passes run on a connection of its own, outside the pool (reopened after
    /// a failure), as the heartbeat's do: a pool whose connections long handlers hold must
    /// not make a tick late.
    fn cron_timer(&self, done: &AtomicBool) {
        let stopped = || done.load(Ordering::Relaxed) || self.is_stopping();
        let schedules: Vec<(&str, &Schedule)> = self.registry.schedules().collect();
        let mut conn: Option<DbConnection> = None;
        let mut failing = false;
        while !stopped() {
            let started = Instant::now();
            let result = match conn.as_mut() {
                Some(c) => self.pass(c, &schedules),
                None => self
                    .url
                    .connect()
                    .and_then(|c| self.pass(conn.insert(c), &schedules)),
            };
            if result.is_err() {
                // A fresh connection next time: this one may be dead.
                conn = None;
            }
            let wait = match result {
                Ok(pass) => {
                    if failing {
                        log::warn!("node {}: cron passes recovered", self.node.id());
                        failing = false;
                    }
                    let until_next = match (pass.now, pass.next) {
                        (Some(now), Some(next)) => (next - now).to_std().unwrap_or_default(),
                        _ => self.settings.heartbeat,
                    };
                    // The clock was read at the pass's start.
                    (until_next + TICK_MARGIN)
                        .saturating_sub(started.elapsed())
                        .min(self.settings.heartbeat)
                }
                Err(e) => {
                    if !failing {
                        log::error!("node {}: cron pass failed: {e}", self.node.id());
                        failing = true;
                    }
                    RETRY_AFTER_FAILURE
                }
            };
            let until = Instant::now() + wait;
            while !stopped() && Instant::now() < until {
                std::thread::sleep(
                    until
                        .saturating_duration_since(Instant::now())
                        .min(Duration::from_millis(20)),
                );
            }
        }
    }
}

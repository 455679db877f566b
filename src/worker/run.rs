//! The claim loops: one page ([`Worker::run_once`]), until nothing is due
//! ([`Worker::drain`]), until stopped ([`Worker::run`]).

use std::sync::atomic::Ordering;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::dispatch::Feed;
use super::engine::Worker;
use super::listen::Listener;
use super::plan::Plan;
use super::record::record_or_unwind;
use super::tally::{Outcome, Report, Tally};
use super::ticker::sleep_unless;
use crate::error::Result;
use crate::task::ClaimedTask;

/// The first pause after a claim failed for want of the database; it doubles up to
/// [`MAX_OUTAGE_PAUSE`].
pub(super) const FIRST_OUTAGE_PAUSE: Duration = Duration::from_millis(100);
/// The longest pause between two claims while the database is unavailable.
pub(super) const MAX_OUTAGE_PAUSE: Duration = Duration::from_secs(30);

impl Worker {
    /// Runs a claimed page in the execution pool and waits for all of it. The second half
    /// of [`Worker::run_once`].
    pub fn execute(&self, page: Vec<ClaimedTask>) -> Tally {
        let tally = Mutex::new(Tally::default());
        self.dispatcher
            .scope(&self.stopping, |feed| self.submit_page(feed, page, &tally));
        tally.into_inner().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands a claimed page to the execution pool, a task (or, in batched mode, a chunk) at a
    /// time; outcomes are counted in `tally` and in the worker's totals as they come.
    /// Each task runs on a slot of its keyword's domain; a chunk holds one domain's tasks.
    pub(super) fn submit_page<'s>(
        &'s self,
        feed: &Feed<'s>,
        page: Vec<ClaimedTask>,
        tally: &'s Mutex<Tally>,
    ) {
        let record = self.recorder(page.len(), tally);
        let plan = self.services.domains.plan();
        // A suspect runs alone, never in a chunk (see `suspects`).
        let (solo, page): (Vec<ClaimedTask>, Vec<ClaimedTask>) =
            page.into_iter().partition(|task| task.solo.is_some());
        for task in solo {
            let lane = plan.lane_of(&task.context.keyword);
            self.dispatcher.submit(feed, lane, move |release| {
                record_or_unwind(self, 1, || vec![self.execute_task(&task, release)], &record)
            });
        }
        if self.settings.commit_batch > 1 {
            for (lane, tasks) in by_lane(&plan, page) {
                let mut tasks = tasks.into_iter().peekable();
                while tasks.peek().is_some() {
                    let chunk: Vec<ClaimedTask> =
                        tasks.by_ref().take(self.settings.commit_batch).collect();
                    self.dispatcher.submit(feed, lane, move |release| {
                        let n = chunk.len() as u64;
                        record_or_unwind(self, n, || self.execute_chunk(chunk, release), &record)
                    });
                }
            }
        } else {
            for task in page {
                let lane = plan.lane_of(&task.context.keyword);
                self.dispatcher.submit(feed, lane, move |release| {
                    record_or_unwind(self, 1, || vec![self.execute_task(&task, release)], &record)
                });
            }
        }
    }

    /// Counts `n` tasks claimed, in `tally` and the worker's totals, and returns what counts
    /// their outcomes as they come.
    pub(super) fn recorder<'s>(
        &'s self,
        n: usize,
        tally: &'s Mutex<Tally>,
    ) -> impl Fn(&[Outcome]) + Copy + Send + 's {
        let n = n as u64;
        lock(tally).claimed += n;
        lock(&self.totals).claimed += n;
        self.in_flight.fetch_add(n, Ordering::Relaxed);
        move |outcomes: &[Outcome]| {
            self.in_flight
                .fetch_sub(outcomes.len() as u64, Ordering::Relaxed);
            let mut tally = lock(tally);
            let mut totals = lock(&self.totals);
            for &outcome in outcomes {
                tally.count(outcome);
                totals.count(outcome);
            }
        }
    }

    /// Claims one page and runs it; returns what happened to it. An empty tally means
    /// nothing was due.
    ///
    /// With lock claims ([`crate::ClaimStyle::Lock`]) the page is locked chunk by chunk, each
    /// chunk run in the transaction that holds its locks.
    pub fn run_once(&self) -> Result<Tally> {
        let plan = self.services.domains.plan();
        if self.settings.lock && !plan.by_lanes() {
            let tally = Mutex::new(Tally::default());
            self.dispatcher.scope(&self.stopping, |feed| {
                self.refill_lock_style(feed, &tally, &plan.lanes[0], self.claim_limit())
                    .map(|_| ())
            })?;
            return Ok(tally.into_inner().unwrap_or_else(PoisonError::into_inner));
        }
        if plan.by_lanes() {
            let tally = Mutex::new(Tally::default());
            self.dispatcher.scope(&self.stopping, |feed| {
                self.refill_lanes(feed, &tally, &plan).map(|_| ())
            })?;
            return Ok(tally.into_inner().unwrap_or_else(PoisonError::into_inner));
        }
        let page = self.claim()?;
        Ok(self.execute(page))
    }

    /// Rescues the tasks of dead nodes and enqueues the cron ticks due now
    /// ([`Worker::schedule_once`]), then works until nothing is due (or the stop flag is
    /// set), then returns once the tasks it claimed have finished. For cron.
    ///
    /// Claims overlap execution: a new page is claimed as soon as half the pool is free. An
    /// empty claim while tasks are still running waits for them and claims once more, so
    /// that what they make due (a follow-up task a handler enqueued, a retry with a short
    /// backoff) is run by this drain too.
    pub fn drain(&self) -> Result<Report> {
        self.retry_dead_connections(|| self.rescue_once())?;
        // The cron ticks due now (docs/guide/src/cron.md).
        self.retry_dead_connections(|| self.schedule_once())?;
        self.drain_at_most(u64::MAX)
    }

    /// [`crate::db::pool::retry_dead_connections`], up to once per connection of the pool.
    pub(super) fn retry_dead_connections<T>(&self, f: impl FnMut() -> Result<T>) -> Result<T> {
        crate::db::pool::retry_dead_connections(self.settings.pool_size(), f)
    }

    /// [`Worker::drain`] without its rescue pass, stopping once `max` tasks have been claimed
    /// (the last claim may take a few more): a drain whose work is bounded, such as a cron run
    /// that must end, or a benchmark's timed part.
    pub fn drain_at_most(&self, max: u64) -> Result<Report> {
        let started = Instant::now();
        let tally = Mutex::new(Tally::default());
        self.dispatcher
            .scope(&self.stopping, |feed| self.drain_on(feed, &tally, max))?;
        Ok(Report::new(
            tally.into_inner().unwrap_or_else(PoisonError::into_inner),
            started.elapsed(),
        ))
    }

    /// [`Worker::drain_at_most`]'s loop, on `feed` (a [`crate::Fleet`]'s, shared by the
    /// loops of its databases, or this worker's own).
    pub(super) fn drain_on<'s>(
        &'s self,
        feed: &Feed<'s>,
        tally: &'s Mutex<Tally>,
        max: u64,
    ) -> Result<()> {
        while !self.is_stopping() && lock(tally).claimed < max {
            // Whether anything was running before the claim: a task that commits a
            // follow-up after the claim looked, and finishes before the check below,
            // must still be followed by one more claim.
            let busy_before = self.busy();
            // And what each lane held: a task that ends while the claim runs shows as less.
            let loads_before = self.lane_loads();
            let refilled = self.retry_dead_connections(|| self.refill(feed, tally))?;
            if refilled.claimed == 0 {
                if !busy_before && self.suspects_wait_for_the_turn() {
                    continue;
                }
                if !busy_before || self.is_stopping() {
                    break;
                }
                self.wait_after_empty_claim(feed, &refilled.starved, &loads_before);
            }
        }
        self.release_queued_at_stop(feed);
        Ok(())
    }

    /// After an empty claim with nothing of this worker's running: when the claim passed
    /// its suspects over because another database of the fleet ran one (the process's turn,
    /// see [`super::suspects`]), waits until the turn is free (or the stop) and says so, so
    /// that the drain claims again rather than end with its suspects pending.
    fn suspects_wait_for_the_turn(&self) -> bool {
        if !self.services.suspects.take_passed_over() {
            return false;
        }
        let turn = self.dispatcher.solo_turn();
        self.dispatcher.wait_for(|| !turn.taken(), &self.stopping);
        !self.is_stopping()
    }

    /// When stopping: releases at once what this worker's lanes still queue (a fleet's
    /// database, its own lane's), rather than leave it for a slot of a lane whose handlers
    /// block ([`super::dispatch::Dispatcher::run_queued_at_stop`]).
    fn release_queued_at_stop(&self, feed: &Feed<'_>) {
        if !self.is_stopping() {
            return;
        }
        let lanes: Vec<usize> = match self.own_lane() {
            Some(lane) => vec![lane],
            None => (0..self.dispatcher.slots().len()).collect(),
        };
        self.dispatcher.run_queued_at_stop(feed, &lanes);
    }

    /// This database's own lane on a fleet's shared pool, when it has one.
    pub(super) fn own_lane(&self) -> Option<usize> {
        let home = self.services.domains.plan().home;
        (home != 0).then_some(home)
    }

    /// Whether tasks this worker handed to the pool have not finished: on a fleet's shared
    /// pool, those of its own lane (the others' databases are not its business); otherwise
    /// any.
    pub(super) fn busy(&self) -> bool {
        match self.own_lane() {
            Some(lane) => !self.dispatcher.slots().idle(lane),
            None => self.dispatcher.in_flight() > 0,
        }
    }

    /// After a drain's empty claim while tasks run: waits until what they make due may be
    /// claimed. Without lanes, until they have finished ([`Worker::wait_until_idle`]); by
    /// lanes, not for every lane's tasks (a domain's may block for as long as its handler
    /// does), but until one of the lanes `starved` (passed over for want of room) has room,
    /// or a task of this worker's has finished since the claim began (`before`, of
    /// [`Worker::lane_loads`]: it may have made a task due, of any lane), or nothing is busy.
    fn wait_after_empty_claim(&self, feed: &Feed<'_>, starved: &[usize], before: &[usize]) {
        if !self.services.domains.plan().by_lanes() {
            return self.wait_until_idle(feed);
        }
        let ready = || {
            let ended = || {
                let now = self.lane_loads();
                now.iter().zip(before).any(|(now, then)| now < then)
            };
            !self.busy() || self.has_room_in(starved) || ended()
        };
        self.dispatcher.wait_for(ready, &self.stopping);
    }

    /// What each lane of this worker's holds, running or queued
    /// ([`super::slots::Slots::load`]): on a fleet's shared pool its own lane's; otherwise
    /// every lane's, paused ones' too.
    fn lane_loads(&self) -> Vec<usize> {
        let slots = self.dispatcher.slots();
        match self.own_lane() {
            Some(lane) => vec![slots.load(lane)],
            None => (0..slots.len()).map(|lane| slots.load(lane)).collect(),
        }
    }

    /// Whether one of `lanes` would be claimed for now: worth a claim
    /// ([`super::slots::Slots::worth_claiming_for`]) and, under lock claims, with a chunk
    /// it can start at once ([`super::slots::Slots::lock_room`]), as
    /// [`Worker::refill_lanes`] asks.
    fn has_room_in(&self, lanes: &[usize]) -> bool {
        let slots = self.dispatcher.slots();
        lanes.iter().any(|&lane| {
            slots.worth_claiming_for(lane) && (!self.settings.lock || slots.lock_room(lane) > 0)
        })
    }

    /// Waits until what [`Worker::busy`] looks at has finished, or the worker is stopping.
    fn wait_until_idle(&self, feed: &Feed<'_>) {
        match self.own_lane() {
            Some(lane) => self.dispatcher.wait_for_lanes_idle(&[lane], &self.stopping),
            None => self
                .dispatcher
                .wait_for_room(feed, self.dispatcher.capacity(), &self.stopping),
        }
    }

    /// Works until the stop flag is set: claims while there is work, otherwise waits for the
    /// poll interval (±10% jitter, so that a fleet does not poll in step) or, on PostgreSQL
    /// with `listen`, until a producer's `NOTIFY`. A database outage is waited out with
    /// capped exponential backoff, logging once when it starts and once when it ends.
    ///
    /// Meanwhile a thread of its own enqueues the registry's cron ticks as they come due
    /// (docs/guide/src/cron.md).
    pub fn run(&self) -> Result<Report> {
        self.with_cron_timer(|| self.claim_until_stopped())?
    }

    /// [`Worker::run`]'s claim loop.
    fn claim_until_stopped(&self) -> Result<Report> {
        let started = Instant::now();
        let tally = Mutex::new(Tally::default());
        self.dispatcher
            .scope(&self.stopping, |feed| self.claim_on(feed, &tally));
        Ok(Report::new(
            tally.into_inner().unwrap_or_else(PoisonError::into_inner),
            started.elapsed(),
        ))
    }

    /// [`Worker::claim_until_stopped`]'s loop, on `feed` (see [`Worker::drain_on`]).
    pub(super) fn claim_on<'s>(&'s self, feed: &Feed<'s>, tally: &'s Mutex<Tally>) {
        let mut listener: Option<Listener> = None;
        // Whether to (re)connect a listener: not when asked not to, nor on a backend that
        // has no notifications.
        let mut listen = self.settings.listen;
        let mut outage: Option<(Instant, Duration)> = None;
        while !self.is_stopping() {
            if listener.is_none() && listen {
                match Listener::connect(&self.url) {
                    Ok(Some(l)) => listener = Some(l),
                    Ok(None) => listen = false,
                    Err(e) => log::debug!("LISTEN not available yet: {e}"),
                }
            }
            match self.retry_dead_connections(|| self.refill(feed, tally)) {
                Ok(refilled) => {
                    if let Some((since, _)) = outage.take() {
                        log::warn!("database reachable again after {:?}", since.elapsed());
                    }
                    // A full claim means more may be due: claim again at once.
                    if refilled.claimed >= refilled.limit {
                        continue;
                    }
                    let jitter = 0.9 + 0.2 * fastrand::f64();
                    let wait = self.settings.poll_interval.mul_f64(jitter);
                    // A lane passed over for want of room may have tasks due: claim again
                    // as soon as it has room, not after the poll interval.
                    let starved = &refilled.starved;
                    let room = || !starved.is_empty() && self.has_room_in(starved);
                    match listener.as_mut() {
                        Some(l) => {
                            if let Err(e) = l.wait(wait, &self.stopping, room) {
                                log::debug!("LISTEN connection lost: {e}");
                                listener = None;
                            }
                        }
                        None if starved.is_empty() => sleep_unless(wait, &self.stopping),
                        None => {
                            let until = Instant::now() + wait;
                            let ready = || Instant::now() >= until || room();
                            self.dispatcher.wait_for(ready, &self.stopping);
                        }
                    }
                }
                Err(e) => {
                    let pause = match outage {
                        None => {
                            log::error!(
                                "database {} unavailable, retrying with backoff: {e}",
                                self.url.masked()
                            );
                            FIRST_OUTAGE_PAUSE
                        }
                        Some((_, last)) => (last * 2).min(MAX_OUTAGE_PAUSE),
                    };
                    outage = Some((outage.map_or_else(Instant::now, |(since, _)| since), pause));
                    listener = None;
                    sleep_unless(pause, &self.stopping);
                }
            }
        }
        self.release_queued_at_stop(feed);
    }
}

/// A page's tasks grouped by the lane their keyword runs on, in claim order within each.
fn by_lane(plan: &Plan, page: Vec<ClaimedTask>) -> Vec<(usize, Vec<ClaimedTask>)> {
    if plan.lanes.len() <= 1 {
        return vec![(plan.home, page)];
    }
    let mut lanes: Vec<(usize, Vec<ClaimedTask>)> = Vec::new();
    for task in page {
        let lane = plan.lane_of(&task.context.keyword);
        match lanes.iter_mut().find(|(l, _)| *l == lane) {
            Some((_, tasks)) => tasks.push(task),
            None => lanes.push((lane, vec![task])),
        }
    }
    lanes
}

fn lock(tally: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    tally.lock().unwrap_or_else(PoisonError::into_inner)
}

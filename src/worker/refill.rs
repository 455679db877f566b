//! When a claim is made and how much it takes: the room in the pool (and in each domain's
//! lane), a connection to claim with, and the claim itself, stamping or leasing; the claimed
//! tasks are handed to the pool ([`super::dispatch`]) without waiting for them.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::dispatch::Feed;
use super::engine::Worker;
use super::plan::{Plan, PlanLane};
use super::tally::Tally;
use crate::error::{OpContext, Result};
use crate::task::ClaimedTask;

/// How long a claim looks for a pooled connection before it checks the stop flag again
/// ([`Worker::wait_for_connection`]).
const CONNECTION_LOOK: Duration = Duration::from_millis(100);
/// r2d2's message for a checkout that timed out with no connection error to tell.
const BARE_CHECKOUT_TIMEOUT: &str = "timed out waiting for connection";

/// What a claim took: how many tasks, the most it could have taken, and the lanes that have
/// keywords to claim but had no room worth a claim ([`super::slots::Slots::worth_claiming_for`]):
/// more of their tasks may be due, so an empty claim does not mean that nothing is.
pub(super) struct Refilled {
    pub(super) claimed: usize,
    pub(super) limit: usize,
    pub(super) starved: Vec<usize>,
}

impl Refilled {
    fn of(claimed: usize, limit: usize) -> Refilled {
        Refilled {
            claimed,
            limit,
            starved: Vec::new(),
        }
    }
}

impl Worker {
    /// Waits until at least half of the units that can start (threads + queue + the claiming
    /// thread) are free, claims as many tasks as can start, and hands them to the pool
    /// without waiting for them: the next claim overlaps the end of this page. Returns how
    /// many it claimed and the most it could have claimed; claims nothing once stopping.
    pub(super) fn refill<'s>(
        &'s self,
        feed: &Feed<'s>,
        tally: &'s Mutex<Tally>,
    ) -> Result<Refilled> {
        self.wait_while_capped();
        let plan = self.services.domains.plan();
        if plan.by_lanes() {
            self.dispatcher
                .wait_for_lane_room(&plan.claiming(), &self.stopping);
            if !self.wait_for_connection()? {
                return Ok(Refilled::of(0, 0));
            }
            return self.refill_lanes(feed, tally, &plan);
        }
        let units = self.dispatcher.capacity();
        self.dispatcher
            .wait_for_room(feed, units.div_ceil(2), &self.stopping);
        if !self.wait_for_connection()? {
            return Ok(Refilled::of(0, 0));
        }
        let room = self.dispatcher.room().max(1);
        // The claim strategy's cap (`least_count`): a claim that reaches it is full, and the
        // next waits for a task to finish (`wait_while_capped`), not for the poll interval.
        let limit = self.services.strategy.cap(
            self.settings
                .page_size
                .min(room * self.settings.commit_batch),
        );
        if limit == 0 {
            return Ok(Refilled::of(0, 1));
        }
        let default = &plan.lanes[0];
        if self.settings.lock {
            let claimed = self.refill_lock_style(feed, tally, default, limit)?;
            return Ok(Refilled::of(claimed, limit));
        }
        let page = self.claim_up_to(&default.keywords, limit, default.timeout)?;
        let claimed = page.len();
        self.submit_page(feed, page, tally);
        Ok(Refilled::of(claimed, limit))
    }

    /// With domains: claims, lane by lane, as many of its tasks as it can start now or queue
    /// ([`super::slots::Slots::room`]; under lock claims, as many chunks as it can start
    /// now, [`super::slots::Slots::lock_room`]), and hands them to the pool. Returns how many
    /// it claimed and the most it could have, the two equal when some lane's claim came back
    /// full (more may be due: claim again at once), and the lanes passed over for want of
    /// room.
    pub(super) fn refill_lanes<'s>(
        &'s self,
        feed: &Feed<'s>,
        tally: &'s Mutex<Tally>,
        plan: &Plan,
    ) -> Result<Refilled> {
        // Only the lanes worth a claim (two thirds of their room free): one statement per
        // domain per claim costs a round trip each, so a lane with a task or two of room
        // waits for more.
        let (rooms, mut starved): (Vec<(&PlanLane, usize)>, Vec<usize>) = {
            let slots = self.dispatcher.slots();
            let (worth, starved): (Vec<&PlanLane>, Vec<&PlanLane>) = plan
                .lanes
                .iter()
                .filter(|l| !l.keywords.is_empty())
                .partition(|l| slots.worth_claiming_for(l.lane));
            (
                worth.into_iter().map(|l| (l, slots.room(l.lane))).collect(),
                starved.into_iter().map(|l| l.lane).collect(),
            )
        };
        let (mut claimed, mut limit, mut full) = (0, 0, false);
        for (lane, room) in rooms {
            // Under lock claims the chunks locked for the lanes before count against this
            // one's room: none of them waits for a slot with its locks held.
            let room = match self.settings.lock {
                true => self.dispatcher.slots().lock_room(lane.lane),
                false => room,
            };
            if room == 0 {
                starved.push(lane.lane);
                continue;
            }
            let n = self.services.strategy.cap(
                self.settings
                    .page_size
                    .min(room * self.settings.commit_batch),
            );
            if n == 0 {
                continue;
            }
            limit += n;
            let took = if self.settings.lock {
                self.refill_lock_style(feed, tally, lane, n)
            } else {
                self.claim_up_to(&lane.keywords, n, lane.timeout)
                    .map(|page| {
                        let took = page.len();
                        self.submit_page(feed, page, tally);
                        took
                    })
            };
            match took {
                Ok(took) => {
                    claimed += took;
                    // Under lock claims a claim may stop short for want of threads (what it
                    // stamped first took them): full too, so that the next claim waits for
                    // the lane's room rather than for the poll interval.
                    full |= took >= n
                        || (self.settings.lock
                            && took > 0
                            && self.dispatcher.slots().lock_room(lane.lane) == 0);
                }
                // What was claimed runs; the next claim meets the error.
                Err(e) if claimed > 0 => {
                    log::debug!("a domain's claim failed after another's: {e}");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Refilled {
            claimed,
            limit: if full {
                claimed
            } else {
                limit.max(claimed + 1)
            },
            starved,
        })
    }

    /// Waits until the pool can hand out a connection, as long as a checkout would wait (the
    /// pool's connection timeout), or until the worker is stopping; returns whether to claim
    /// (false: stopping). A checkout cannot be interrupted: a claim that waited for one from
    /// a database that refuses connections would hold a stop up for the whole timeout, so
    /// the claim's own checkout comes after this one found a connection (it then takes that
    /// one at once). Fails as the claim's checkout would, with the last connection error.
    fn wait_for_connection(&self) -> Result<bool> {
        let deadline = Instant::now() + self.pool.connection_timeout();
        let mut failure: Option<r2d2::Error> = None;
        loop {
            if self.is_stopping() {
                return Ok(false);
            }
            let look = CONNECTION_LOOK.min(deadline.saturating_duration_since(Instant::now()));
            match self.pool.get_timeout(look) {
                Ok(_) => return Ok(true),
                Err(e) => {
                    // r2d2 hands the last connection error to one failed checkout only: keep
                    // the one that says why.
                    let e = match failure.take() {
                        Some(kept) if e.to_string() == BARE_CHECKOUT_TIMEOUT => kept,
                        _ => e,
                    };
                    if Instant::now() >= deadline {
                        return Err(e).op("task claim");
                    }
                    failure = Some(e);
                }
            }
        }
    }

    /// Under lock claims: the tasks of tenants with a `max_running` claimed the stamping way
    /// (their limit counts `running` rows) and handed to the pool, and chunks locked for the
    /// rest of `limit`; which comes first alternates from claim to claim
    /// ([`Worker::take_both_kinds`]). All of `lane`'s keywords. Returns how many tasks it
    /// took.
    pub(super) fn refill_lock_style<'s>(
        &'s self,
        feed: &Feed<'s>,
        tally: &'s Mutex<Tally>,
        lane: &PlanLane,
        limit: usize,
    ) -> Result<usize> {
        // The claim strategy's page (`least_count`), for the chunks and stamps together.
        let limit = self.services.strategy.cap(limit);
        if limit == 0 {
            return Ok(0);
        }
        // A suspect first, claimed the stamping way to run alone (see `suspects`).
        let solo: Vec<ClaimedTask> = self
            .claim_suspect(&lane.keywords, lane.timeout)?
            .into_iter()
            .collect();
        let (limit, solo_n) = (limit - solo.len(), solo.len());
        if solo_n > 0 {
            self.submit_page(feed, solo, tally);
        }
        if limit == 0 {
            return Ok(solo_n);
        }
        if self.services.limits.tenants().is_empty() {
            return Ok(solo_n + self.refill_locked(feed, tally, lane, limit)?);
        }
        let took = self.take_both_kinds(limit, |limited, n| {
            if limited {
                let page = self.claim_limited_up_to(&lane.keywords, n, lane.timeout)?;
                let stamped = page.len();
                self.submit_page(feed, page, tally);
                Ok(stamped)
            } else {
                self.refill_locked(feed, tally, lane, n)
            }
        })?;
        Ok(solo_n + took)
    }

    /// At most `limit` tasks to lease for `lane` now: no more chunks than can start at once,
    /// read again before each page, after what this refill claimed the stamping way first (a
    /// suspect, a tenant's limited tasks) or leased already: a leased chunk never waits for a
    /// thread with its leases' deadline running. When claims go lane by lane (domains, or a
    /// database of a fleet), the lane's room ([`super::slots::Slots::lock_room`]); without
    /// lanes, the pool's, whose claiming thread runs a chunk itself when every thread is busy
    /// (CallerRuns).
    pub(super) fn leasable(&self, lane: &PlanLane, limit: usize) -> usize {
        let room = if lane.lane == 0 && !self.services.domains.plan().by_lanes() {
            self.dispatcher.room()
        } else {
            self.dispatcher.slots().lock_room(lane.lane)
        };
        limit.min(room * self.settings.commit_batch)
    }

    /// Under `least_count`, while this node holds more than half of what it may hold (the
    /// least-loaded other node's tasks plus its slack), waits until enough of them finish,
    /// counted as tasks (or until none of its own is running): claims of half that at least,
    /// rather than one at a time. Not a wait for room in the pool, counted in units: a chunk
    /// of many tasks is one unit, and a unit of a blocked domain (or, on a fleet's shared
    /// pool, of another database) may not finish for as long as its handler blocks.
    fn wait_while_capped(&self) {
        let strategy = &self.services.strategy;
        let half_free = || {
            strategy
                .least_count_bound()
                .is_none_or(|(most, held)| most.saturating_sub(held) >= most.div_ceil(2))
        };
        if half_free() {
            return;
        }
        self.dispatcher
            .wait_for(|| !self.busy() || half_free(), &self.stopping);
    }
}

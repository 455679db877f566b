//! The claiming thread's waits on the execution pool: for room to claim, for a lane worth
//! claiming for, for a database's lanes to be idle. Each is woken when a unit finishes, as
//! [`Dispatcher`]'s `wanted` says, not at every task.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::dispatch::{Dispatcher, Feed, LANE_ROOM};
use super::slots::Slots;

impl Dispatcher {
    /// Waits until there is room for `want` units (at most the whole bound plus one), or
    /// `stop` is set.
    ///
    /// With `caller_helps`, the waiting (claiming) thread runs queued units meanwhile, one at
    /// a time, while more units are queued than the pool has threads: otherwise its
    /// connection would sit idle while the pool's threads work through the queue. It checks
    /// for room after each unit, so a claim waits at most for one unit's run. As with
    /// CallerRuns, a long task taken this way delays the next claim by up to its length;
    /// leaving at least a unit per thread in the queue keeps the pool busy for a while
    /// meanwhile, and with a short queue the claiming thread only waits.
    pub(crate) fn wait_for_room(&self, feed: &Feed<'_>, want: usize, stop: &AtomicBool) {
        let want = want.clamp(1, self.bound() + 1);
        while self.caller_helps
            && self.room() < want
            && !stop.load(Ordering::Relaxed)
            && feed.queued() > self.threads
        {
            let Some(job) = feed.try_pop(self, 0) else {
                break;
            };
            self.help(feed, job);
        }
        if self.room() >= want {
            return;
        }
        self.wait_until(want, || self.room() >= want || stop.load(Ordering::Relaxed));
    }

    /// Waits until `ready`, woken when a unit finishes as `want` asks (see [`Self::wanted`]).
    fn wait_until(&self, want: usize, ready: impl Fn() -> bool) {
        let mut waiting = self.finished.0.lock().unwrap_or_else(|e| e.into_inner());
        // Set under the lock: a finishing thread that sees it takes the lock to notify, so
        // it cannot notify between our check and our wait.
        waiting.push(want);
        self.wanted.store(least(&waiting), Ordering::SeqCst);
        while !ready() {
            waiting = self
                .finished
                .1
                .wait_timeout(waiting, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if let Some(i) = waiting.iter().position(|&w| w == want) {
            waiting.swap_remove(i);
        }
        self.wanted.store(least(&waiting), Ordering::SeqCst);
    }

    /// Waits until one of `lanes` is worth a claim ([`Slots::worth_claiming_for`]),
    /// nothing is in flight, or `stop` is set: with several domains, or on a fleet's shared
    /// pool, the claim's trigger. Returns at once when `lanes` is empty (nothing to claim
    /// for).
    pub(crate) fn wait_for_lane_room(&self, lanes: &[usize], stop: &AtomicBool) {
        if lanes.is_empty() {
            return;
        }
        self.wait_for_lanes(stop, |slots| {
            lanes.iter().any(|&lane| slots.worth_claiming_for(lane))
        });
    }

    /// Waits until `ready` holds or `stop` is set, looking again whenever a unit finishes.
    pub(crate) fn wait_for(&self, ready: impl Fn() -> bool, stop: &AtomicBool) {
        let ready = || stop.load(Ordering::Relaxed) || ready();
        if !ready() {
            self.wait_until(1, ready);
        }
    }

    /// Waits until nothing of `lanes` runs or waits ([`Slots::idle`]), or `stop` is set: a
    /// database of a fleet waiting for its own tasks, not the others'.
    pub(crate) fn wait_for_lanes_idle(&self, lanes: &[usize], stop: &AtomicBool) {
        self.wait_for_lanes(stop, |slots| lanes.iter().all(|&lane| slots.idle(lane)));
    }

    /// Waits until `ready` holds of the slots, nothing is in flight, or `stop` is set.
    fn wait_for_lanes(&self, stop: &AtomicBool, ready: impl Fn(&Slots) -> bool) {
        let ready =
            || self.in_flight() == 0 || stop.load(Ordering::Relaxed) || ready(&self.slots());
        if !ready() {
            // A unit finishing wakes this waiter only when it leaves a lane worth claiming
            // for (an idle lane not paused is one), or nothing in flight; a change of the
            // domains is seen within the wait's poll.
            self.wait_until(LANE_ROOM, ready);
        }
    }
}

/// What the waiters need before one of them is woken: the least room any waits for; 0 when
/// nobody waits.
fn least(waiting: &[usize]) -> usize {
    waiting.iter().copied().min().unwrap_or(0)
}

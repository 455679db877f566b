//! The node's thread slots, shared between its domains (seed 004's ResourceController).
//!
//! Lane 0 is `default`. The node's `total` threads are split into the threads `RESERVED`
//! domains hold and the *shared* rest, which `default`, the `MAX` domains and the borrowing
//! `RESERVED` domains take in turn. A task starts only on a slot its lane may take; a claim
//! asks, per lane, for what it can start now plus the room in its queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::domain::{DomainMode, DomainUse, DEFAULT_DOMAIN};

/// The slots under their lock, and their in-flight bound outside it (read at every task).
#[derive(Debug)]
pub(crate) struct Lanes {
    slots: Mutex<Slots>,
    bound: AtomicUsize,
}

impl Lanes {
    pub(crate) fn new(slots: Slots) -> Lanes {
        Lanes {
            bound: AtomicUsize::new(slots.bound()),
            slots: Mutex::new(slots),
        }
    }

    /// The slots, locked.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// [`Slots::bound`] as of the last configuration.
    pub(crate) fn bound(&self) -> usize {
        self.bound.load(Ordering::SeqCst)
    }

    /// [`Slots::apply`], and the bound taken again.
    pub(crate) fn apply(&self, specs: Vec<LaneSpec>) -> Vec<usize> {
        let mut slots = self.lock();
        let lanes = slots.apply(specs);
        self.bound.store(slots.bound(), Ordering::SeqCst);
        lanes
    }

    /// [`Slots::share_out`], and the bound taken again.
    pub(crate) fn share_out(&self, databases: usize, queue: usize) -> Vec<Share> {
        let mut slots = self.lock();
        let shares = slots.share_out(databases, queue);
        self.bound.store(slots.bound(), Ordering::SeqCst);
        shares
    }

    /// [`Slots::set`], and the bound taken again.
    pub(crate) fn set(&self, lane: usize, spec: LaneSpec) {
        let mut slots = self.lock();
        slots.set(lane, spec);
        self.bound.store(slots.bound(), Ordering::SeqCst);
    }
}

/// One database's part of a [`crate::Fleet`]'s execution pool ([`Slots::share_out`]): a lane
/// of its own, on which at most `threads` of its tasks run at once and `queue` more wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Share {
    pub(crate) lane: usize,
    pub(crate) threads: usize,
    pub(crate) queue: usize,
}

/// How one lane (domain) holds slots, as configured now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LaneSpec {
    pub(crate) name: String,
    pub(crate) mode: DomainMode,
    /// `MAX`: its limit; `RESERVED`: the threads kept for it. Unused for `default`.
    pub(crate) threads: usize,
    /// Claimed tasks that may wait for a slot.
    pub(crate) queue: usize,
    pub(crate) paused: bool,
    /// Force-released: its reserved threads count 0 (and it is paused).
    pub(crate) released: bool,
    pub(crate) timeout_ms: u64,
}

/// Which kind of slot a started task holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// One of its lane's reserved threads.
    Own,
    /// One of the shared threads.
    Shared,
}

#[derive(Debug)]
struct Lane {
    spec: LaneSpec,
    own: usize,
    shared: usize,
    queued: usize,
    stuck: usize,
}

/// Slot use per lane, under one lock.
#[derive(Debug)]
pub(crate) struct Slots {
    total: usize,
    lanes: Vec<Lane>,
}

impl Slots {
    /// `total` threads, all of them `default`'s, whose queue is `queue`.
    pub(crate) fn new(total: usize, queue: usize, timeout_ms: u64) -> Slots {
        let default = LaneSpec {
            name: DEFAULT_DOMAIN.to_owned(),
            mode: DomainMode::Max,
            threads: total,
            queue,
            paused: false,
            released: false,
            timeout_ms,
        };
        Slots {
            total,
            lanes: vec![Lane::new(default)],
        }
    }

    /// How many lanes there are (lanes are never removed while the node runs).
    pub(crate) fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Lane `i`'s configuration.
    pub(crate) fn spec(&self, lane: usize) -> &LaneSpec {
        &self.lanes[lane].spec
    }

    /// Applies a new configuration: `specs[0]` is `default`'s. Lanes are matched by name; a
    /// new name gets a new lane; a lane no longer configured is paused (what it has queued
    /// is given back, what runs finishes on shared threads). Returns each spec's lane index.
    pub(crate) fn apply(&mut self, specs: Vec<LaneSpec>) -> Vec<usize> {
        let mut seen = vec![false; self.lanes.len()];
        let mut indexes = Vec::with_capacity(specs.len());
        for spec in specs {
            let i = match self.lanes.iter().position(|l| l.spec.name == spec.name) {
                Some(i) => {
                    self.lanes[i].spec = spec;
                    i
                }
                None => {
                    self.lanes.push(Lane::new(spec));
                    seen.push(false);
                    self.lanes.len() - 1
                }
            };
            seen[i] = true;
            indexes.push(i);
        }
        for (lane, seen) in self.lanes.iter_mut().zip(seen) {
            if !seen {
                lane.spec.mode = DomainMode::Max;
                lane.spec.threads = self.total;
                lane.spec.paused = true;
            }
        }
        indexes
    }

    /// Splits the threads and the queue between the `databases` of a fleet, as evenly as
    /// they go (the first ones one more, so that the shares add up): a `MAX` lane for each,
    /// paused until its worker sets it ([`Slots::set`]). `default` is left paused and without
    /// a queue: in a fleet no task runs on it. The shares never overlap, so a database whose
    /// handlers block holds its own threads and no other's. The caller gives the pool a
    /// thread per database at least.
    pub(crate) fn share_out(&mut self, databases: usize, queue: usize) -> Vec<Share> {
        let default = &mut self.lanes[0].spec;
        default.queue = 0;
        default.paused = true;
        let timeout_ms = default.timeout_ms;
        let part = |whole: usize, k: usize| whole / databases + usize::from(k < whole % databases);
        (0..databases)
            .map(|k| {
                let share = Share {
                    lane: self.lanes.len(),
                    threads: part(self.total, k),
                    queue: part(queue, k),
                };
                self.lanes.push(Lane::new(LaneSpec {
                    name: format!("database {k}"),
                    mode: DomainMode::Max,
                    threads: share.threads,
                    queue: share.queue,
                    paused: true,
                    released: false,
                    timeout_ms,
                }));
                share
            })
            .collect()
    }

    /// Sets lane `i`'s configuration, and no other's: how the worker of one database of a
    /// fleet applies its own lane ([`Slots::apply`] pauses the lanes it is not given).
    pub(crate) fn set(&mut self, i: usize, spec: LaneSpec) {
        self.lanes[i].spec = spec;
    }

    /// Lane `i`'s tasks running or queued; it is idle with none.
    pub(crate) fn load(&self, i: usize) -> usize {
        self.lanes[i].running() + self.lanes[i].queued
    }

    pub(crate) fn idle(&self, i: usize) -> bool {
        self.load(i) == 0
    }

    fn reserved(spec: &LaneSpec) -> usize {
        match spec.mode {
            DomainMode::Reserved if !spec.released => spec.threads,
            _ => 0,
        }
    }

    /// The threads no `RESERVED` lane holds.
    pub(crate) fn shared_capacity(&self) -> usize {
        let reserved: usize = self.lanes[1..]
            .iter()
            .map(|l| Self::reserved(&l.spec))
            .sum();
        self.total.saturating_sub(reserved)
    }

    /// A released lane's tasks on its own threads hold them (shared now) until they return.
    fn shared_free(&self) -> usize {
        let beyond_own = |l: &Lane| l.own.saturating_sub(Self::reserved(&l.spec));
        let used: usize = self.lanes.iter().map(|l| l.shared + beyond_own(l)).sum();
        self.shared_capacity().saturating_sub(used)
    }

    /// The slot lane `i` would start its next task on now, if any.
    fn free_slot(&self, i: usize) -> Option<Slot> {
        let lane = &self.lanes[i];
        if i > 0 && lane.spec.mode == DomainMode::Reserved && lane.own < Self::reserved(&lane.spec)
        {
            return Some(Slot::Own);
        }
        let capped = i > 0 && lane.spec.mode == DomainMode::Max;
        if capped && lane.running() >= lane.spec.threads {
            return None;
        }
        (self.shared_free() > 0).then_some(Slot::Shared)
    }

    /// Takes a slot for lane `i`'s next queued task, if it may start now.
    pub(crate) fn start(&mut self, i: usize) -> Option<Slot> {
        let slot = self.free_slot(i)?;
        let lane = &mut self.lanes[i];
        match slot {
            Slot::Own => lane.own += 1,
            Slot::Shared => lane.shared += 1,
        }
        lane.queued = lane.queued.saturating_sub(1);
        Some(slot)
    }

    /// A task of lane `i` was queued.
    pub(crate) fn queued(&mut self, i: usize) {
        self.lanes[i].queued += 1;
    }

    /// A queued task of lane `i` was taken to run without a slot (by the claiming thread,
    /// which is one more executor for `default`).
    pub(crate) fn unqueue(&mut self, i: usize) {
        self.lanes[i].queued = self.lanes[i].queued.saturating_sub(1);
    }

    /// A task of lane `i` that held `slot` ended.
    pub(crate) fn finish(&mut self, i: usize, slot: Slot) {
        let lane = &mut self.lanes[i];
        match slot {
            Slot::Own => lane.own = lane.own.saturating_sub(1),
            Slot::Shared => lane.shared = lane.shared.saturating_sub(1),
        }
    }

    /// The watchdog found a handler of lane `i` past its timeout: its slot counts as stuck
    /// until the handler returns ([`Slots::unstick`]); it stays taken meanwhile.
    pub(crate) fn mark_stuck(&mut self, i: usize) {
        self.lanes[i].stuck += 1;
    }

    /// A stuck handler of lane `i` returned.
    pub(crate) fn unstick(&mut self, i: usize) {
        self.lanes[i].stuck = self.lanes[i].stuck.saturating_sub(1);
    }

    /// How many tasks lane `i` could start at once with every slot it may take free now.
    fn startable(&self, i: usize) -> usize {
        let lane = &self.lanes[i];
        let own = Self::reserved(&lane.spec).saturating_sub(lane.own);
        let shared = self.shared_free();
        match lane.spec.mode {
            DomainMode::Max if i > 0 => {
                lane.spec.threads.saturating_sub(lane.running()).min(shared)
            }
            _ => own + shared,
        }
    }

    /// The most tasks lane `i` may have claimed and not started: what it can start now plus
    /// its queue, less what is queued; 0 when paused.
    pub(crate) fn room(&self, i: usize) -> usize {
        let lane = &self.lanes[i];
        if lane.spec.paused || lane.spec.released {
            return 0;
        }
        (self.startable(i) + lane.spec.queue).saturating_sub(lane.queued)
    }

    /// Under lock claims (no queues): how many chunks lane `i` can start now with no wait,
    /// counting every lane's tasks not yet started that could take a shared thread now as
    /// taking it first ([`Slots::queued_for_shared`]).
    pub(crate) fn lock_room(&self, i: usize) -> usize {
        let lane = &self.lanes[i];
        if lane.spec.paused || lane.spec.released {
            return 0;
        }
        // Each chunk not yet started that could start on a shared thread counted on one: at
        // worst a chunk waits a moment for one of its lane's own.
        let queued: usize = (0..self.lanes.len())
            .map(|j| self.queued_for_shared(j))
            .sum();
        let shared = self.shared_free().saturating_sub(queued);
        match lane.spec.mode {
            DomainMode::Max if i > 0 => lane
                .spec
                .threads
                .saturating_sub(lane.running() + lane.queued)
                .min(shared),
            // Its own threads free, less its tasks waiting for them.
            _ => {
                Self::reserved(&lane.spec)
                    .saturating_sub(lane.own)
                    .saturating_sub(lane.queued)
                    + shared
            }
        }
    }

    /// [`Slots::room`] with nothing running or queued anywhere.
    fn capacity(&self, i: usize) -> usize {
        let lane = &self.lanes[i];
        let own = Self::reserved(&lane.spec);
        let shared = self.shared_capacity();
        let start = match lane.spec.mode {
            DomainMode::Max if i > 0 => lane.spec.threads.min(shared),
            _ => own + shared,
        };
        start + lane.spec.queue
    }

    /// Whether some lane is worth a claim ([`Slots::worth_claiming_for`]).
    pub(crate) fn worth_claiming(&self) -> bool {
        (0..self.lanes.len()).any(|i| self.worth_claiming_for(i))
    }

    /// How many of lane `i`'s queued tasks would take a shared thread were one free now: those
    /// beyond its own free threads, and for a `MAX` domain (a fleet database's share) no more
    /// than its cap leaves. A lane at its cap starts nothing until one of its tasks ends, and
    /// then on the slot that task leaves: it must not count against the others' lock room.
    fn queued_for_shared(&self, i: usize) -> usize {
        let lane = &self.lanes[i];
        let own_free = Self::reserved(&lane.spec).saturating_sub(lane.own);
        let beyond_own = lane.queued.saturating_sub(own_free);
        match lane.spec.mode {
            DomainMode::Max if i > 0 => {
                beyond_own.min(lane.spec.threads.saturating_sub(lane.running()))
            }
            _ => beyond_own,
        }
    }

    /// Whether lane `i` is not paused and has two thirds of its capacity free (a claim takes
    /// a useful page: a lane's claim is a statement; measured 3% faster than half with 3
    /// domains), is idle with room (other lanes' blocked handlers may hold the shared threads
    /// for good), or is `RESERVED` with a reserved thread free and nothing queued.
    pub(crate) fn worth_claiming_for(&self, i: usize) -> bool {
        let room = self.room(i);
        let lane = &self.lanes[i];
        let idle_own = i > 0 && lane.queued == 0 && lane.own < Self::reserved(&lane.spec);
        room > 0 && (room * 3 >= self.capacity(i) * 2 || idle_own || self.idle(i))
    }

    /// Tasks that can be in flight at most: every thread and every lane's queue.
    pub(crate) fn bound(&self) -> usize {
        self.total + self.lanes.iter().map(|l| l.spec.queue).sum::<usize>()
    }

    /// Each lane's configuration and use, `default` first, for the node's publication.
    pub(crate) fn usage(&self) -> Vec<DomainUse> {
        let shared = self.shared_capacity();
        self.lanes
            .iter()
            .enumerate()
            .map(|(i, lane)| {
                let reserved = Self::reserved(&lane.spec);
                DomainUse {
                    domain: lane.spec.name.clone(),
                    mode: lane.spec.mode.as_str().to_owned(),
                    keywords: Vec::new(),
                    threads: if i == 0 { shared } else { lane.spec.threads },
                    reserved: if i == 0 { 0 } else { reserved },
                    borrowed: match lane.spec.mode {
                        DomainMode::Reserved if i > 0 => lane.shared,
                        _ => 0,
                    },
                    running: lane.running(),
                    queued: lane.queued,
                    stuck: lane.stuck,
                    queue: lane.spec.queue,
                    timeout_ms: lane.spec.timeout_ms,
                    paused: lane.spec.paused,
                    released: lane.spec.released,
                }
            })
            .collect()
    }
}

impl Lane {
    fn new(spec: LaneSpec) -> Lane {
        Lane {
            spec,
            own: 0,
            shared: 0,
            queued: 0,
            stuck: 0,
        }
    }

    fn running(&self) -> usize {
        self.own + self.shared
    }
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;

//! The execution pool: a rayon pool with a bounded number of tasks in flight, and
//! CallerRuns when the bound is reached.
//!
//! This is seed 003's `ThreadPoolExecutor(…, new ArrayBlockingQueue(n), new CallerRunsPolicy())`:
//! when every thread is busy and the queue is full, the claiming thread runs the next task
//! itself. That bounds memory, and it slows claiming down exactly as much as execution lags.
//! Nothing task-specific lives in thread-local state, so running on the caller is safe.
//!
//! Optionally (PostgreSQL) the claiming thread also helps: while it waits for room to claim
//! again, or for a page to finish, it runs queued tasks itself instead of leaving its
//! connection idle, so that `threads + 1` connections commit at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::slots::{Lanes, Slot, Slots};

/// A rayon pool with an in-flight bound.
///
/// The pool's threads do not take a rayon job per task: each runs one loop that blocks on the
/// scope's [`Feed`] until work comes. A rayon thread that runs out of jobs spins on
/// `sched_yield` for a while before it sleeps; with a task every few hundred microseconds it
/// would spin most of the time, taking the CPU the database (often on the same machine)
/// needs (`docs/notes/performance.md`).
pub(crate) struct Dispatcher {
    pool: rayon::ThreadPool,
    pub(super) threads: usize,
    in_flight: AtomicUsize,
    /// Which lane (domain) may start a task on which thread, and the in-flight bound.
    lanes: Arc<Lanes>,
    caller_runs: AtomicU64,
    /// Queued units the claiming thread took from the queue and ran while it waited.
    helped: AtomicU64,
    /// Whether the claiming thread runs queued work while it waits for room (see
    /// [`Self::wait_for_room`]).
    pub(super) caller_helps: bool,
    /// Signalled when a unit of work finishes on the pool and there is then room for what
    /// [`Self::wait_for_room`] waits for. Holds what each waiting claim loop waits for (one
    /// per database of a [`crate::Fleet`], which share the pool).
    pub(super) finished: (Mutex<Vec<usize>>, Condvar),
    /// The least room a waiter waits for, or [`LANE_ROOM`]; 0 when nobody waits.
    /// Finishing work wakes the waiters only once there is that much room (or a lane worth
    /// claiming for, or nothing in flight), not at every task.
    pub(super) wanted: AtomicUsize,
    /// Held for the length of a [`Self::scope`].
    scope_lock: Mutex<()>,
    /// The turn to run a suspect alone (see `suspects`): one for the whole pool.
    solo: super::suspects::SoloTurn,
}

/// How often a scope's stop watcher looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// What [`Dispatcher::wait_for_lane_room`] waits for: some lane worth claiming for.
pub(super) const LANE_ROOM: usize = usize::MAX;

/// A unit of work. Its argument: whether it gives its tasks back unstarted, none of their
/// handlers run (at a stop, or its lane paused while it waited), rather than run them.
pub(super) type Job<'j> = Box<dyn FnOnce(bool) + Send + 'j>;

/// The queues of one [`Dispatcher::scope`], one per lane (domain), and whether the scope has
/// closed.
struct Queues<'j> {
    lanes: Vec<VecDeque<Job<'j>>>,
    closed: bool,
    /// The lane the next look for a startable task begins with (turns between lanes).
    next: usize,
}

/// The work queues of one [`Dispatcher::scope`]. Their lengths are bounded by the claims
/// (each asks per lane for what fits), not by themselves.
pub(crate) struct Feed<'j> {
    jobs: Mutex<Queues<'j>>,
    ready: Condvar,
    /// Signalled when the feed closes, and when a pool thread leaves it closed and empty:
    /// the scope's stop watcher waits on it.
    closing: Condvar,
    /// The first panic that escaped a job: re-raised when the scope ends, after the pool's
    /// threads have carried on with the other jobs.
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

impl<'j> Feed<'j> {
    fn lock(&self) -> MutexGuard<'_, Queues<'j>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, dispatcher: &Dispatcher, lane: usize, job: Job<'j>) {
        let mut jobs = self.lock();
        if jobs.lanes.len() <= lane {
            jobs.lanes.resize_with(lane + 1, VecDeque::new);
        }
        jobs.lanes[lane].push_back(job);
        dispatcher.slots().queued(lane);
        self.ready.notify_one();
    }

    /// No more jobs: the threads finish what is queued and return.
    fn close(&self) {
        let mut jobs = self.lock();
        jobs.closed = true;
        self.ready.notify_all();
        self.closing.notify_all();
    }

    /// The scope's stop watcher, on a thread of its own: once `stop` is set, gives back
    /// every queued job's tasks, of any lane, slot or not (their handlers never start), and
    /// while a lane is paused (its domain paused, or force-released), that lane's. At once,
    /// even while every pool thread, and the claiming thread itself (CallerRuns), run
    /// handlers that may take long. Returns once the feed is closed and empty: a scope that
    /// claimed, closed and left its queued jobs to the pool (`run_once`, a drain that reached
    /// its count) is watched until the last of them starts.
    fn release_at_stop(&self, dispatcher: &Dispatcher, stop: &AtomicBool) {
        let mut jobs = self.lock();
        loop {
            let stopping = stop.load(Ordering::Relaxed);
            let held = {
                let slots = dispatcher.slots();
                jobs.lanes.iter().enumerate().position(|(lane, q)| {
                    !q.is_empty() && (stopping || (lane < slots.len() && slots.spec(lane).paused))
                })
            };
            if let Some(lane) = held {
                let job = jobs.lanes[lane].pop_front().expect("not empty");
                dispatcher.slots().unqueue(lane);
                drop(jobs);
                self.run(dispatcher, lane, None, job, true);
                jobs = self.lock();
                continue;
            }
            if jobs.closed && jobs.lanes.iter().all(VecDeque::is_empty) {
                return;
            }
            // The stop is a flag: looked at every poll.
            jobs = (self.closing.wait_timeout(jobs, STOP_POLL))
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// A pool thread's loop: run jobs, each once its lane may take a slot, until the feed is
    /// closed and empty.
    fn work(&self, dispatcher: &Dispatcher) {
        loop {
            let (lane, slot, job, paused) = {
                let mut jobs = self.lock();
                loop {
                    if let Some(startable) = Self::pop_startable(&mut jobs, dispatcher) {
                        break startable;
                    }
                    if jobs.closed && jobs.lanes.iter().all(VecDeque::is_empty) {
                        self.closing.notify_all();
                        return;
                    }
                    jobs = self
                        .ready
                        .wait(jobs)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            };
            self.run(dispatcher, lane, Some(slot), job, paused);
        }
    }

    /// The first queued job, lanes taken in turn, whose lane may start it now, with the slot
    /// it takes and whether its lane is paused (the job then gives its tasks back, as the
    /// stop watcher would have).
    fn pop_startable(
        jobs: &mut Queues<'j>,
        dispatcher: &Dispatcher,
    ) -> Option<(usize, Slot, Job<'j>, bool)> {
        let n = jobs.lanes.len();
        if jobs.lanes.iter().all(VecDeque::is_empty) {
            return None;
        }
        let mut slots = dispatcher.slots();
        for k in 0..n {
            let lane = (jobs.next + k) % n;
            if jobs.lanes[lane].is_empty() {
                continue;
            }
            if let Some(slot) = slots.start(lane) {
                jobs.next = (lane + 1) % n;
                let job = jobs.lanes[lane].pop_front().expect("not empty");
                return Some((lane, slot, job, slots.spec(lane).paused));
            }
        }
        None
    }

    /// `default`'s jobs waiting for a thread.
    pub(super) fn queued(&self) -> usize {
        self.lock().lanes.first().map_or(0, VecDeque::len)
    }

    /// The next queued job of `lane`, if any, without waiting, for the claiming thread to
    /// run without a slot (one more executor for `default`; at a stop, for any lane).
    pub(super) fn try_pop(&self, dispatcher: &Dispatcher, lane: usize) -> Option<Job<'j>> {
        let mut jobs = self.lock();
        let job = jobs.lanes.get_mut(lane)?.pop_front()?;
        dispatcher.slots().unqueue(lane);
        Some(job)
    }

    /// Runs one job taken from the queue (on a pool thread with its lane's `slot`, or on the
    /// claiming thread when it helps), or with `release` gives its tasks back, and counts it
    /// finished.
    fn run(
        &self,
        dispatcher: &Dispatcher,
        lane: usize,
        slot: Option<Slot>,
        job: Job<'j>,
        release: bool,
    ) {
        // Tasks catch their handlers' panics; this catches the rest (a bug, or a handler
        // error whose Display panics), so that the count stays right and this thread keeps
        // serving the queue.
        let job = || job(release);
        if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)) {
            let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
            slot.get_or_insert(panic);
        }
        if let Some(slot) = slot {
            let several_lanes = {
                let mut slots = dispatcher.slots();
                slots.finish(lane, slot);
                slots.len() > 1
            };
            // A freed slot may let another lane's queued job start. Under the queues' lock,
            // so that no thread between its look and its wait misses it.
            if several_lanes {
                let _jobs = self.lock();
                self.ready.notify_all();
            }
        }
        let left = dispatcher.in_flight.fetch_sub(1, Ordering::SeqCst) - 1;
        let wanted = dispatcher.wanted.load(Ordering::SeqCst);
        // The lanes are looked at only while the claiming thread waits for one (after this
        // task's slot was given back, so the look sees it).
        let wake = match wanted {
            0 => false,
            LANE_ROOM => left == 0 || dispatcher.slots().worth_claiming(),
            _ => dispatcher.room() >= wanted,
        };
        if wake {
            let _guard = dispatcher
                .finished
                .0
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            dispatcher.finished.1.notify_all();
        }
    }
}

/// Closes a feed when dropped, so that the pool's threads return even if the scope's body
/// panics.
struct CloseOnDrop<'a, 'j>(&'a Feed<'j>);

impl Drop for CloseOnDrop<'_, '_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Dispatcher {
    /// A pool of `threads` threads accepting up to `threads + queue` units in flight; with
    /// `caller_helps`, the claiming thread runs queued units too while it waits.
    pub(crate) fn new(
        threads: usize,
        queue: usize,
        timeout_ms: u64,
        caller_helps: bool,
    ) -> Result<Self, rayon::ThreadPoolBuildError> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("outbox-task-{i}"))
            .build()?;
        Ok(Dispatcher {
            pool,
            threads,
            in_flight: AtomicUsize::new(0),
            lanes: Arc::new(Lanes::new(Slots::new(threads, queue, timeout_ms))),
            caller_runs: AtomicU64::new(0),
            helped: AtomicU64::new(0),
            caller_helps,
            finished: (Mutex::new(Vec::new()), Condvar::new()),
            wanted: AtomicUsize::new(0),
            scope_lock: Mutex::new(()),
            solo: super::suspects::SoloTurn::default(),
        })
    }

    /// Runs `f` with a feed to which [`Self::submit`] hands work; returns when `f` has
    /// returned and all submitted work has finished.
    ///
    /// One scope at a time: each keeps every pool thread in its feed until it ends, so a
    /// second caller (two `drain`s on one worker) waits here for the first to finish.
    /// A panic that escaped a job is re-raised here, once everything else has finished.
    ///
    /// Once `stop` is set, what is queued is released at once by a thread of the scope's
    /// own ([`Feed::release_at_stop`]), not when a busy thread frees.
    pub(crate) fn scope<'j, R>(&self, stop: &AtomicBool, f: impl FnOnce(&Feed<'j>) -> R) -> R {
        let _one_at_a_time = self.scope_lock.lock().unwrap_or_else(|e| e.into_inner());
        let feed = Feed {
            jobs: Mutex::new(Queues {
                lanes: vec![VecDeque::new()],
                closed: false,
                next: 0,
            }),
            ready: Condvar::new(),
            closing: Condvar::new(),
            panic: Mutex::new(None),
        };
        let result = std::thread::scope(|threads| {
            let watcher = std::thread::Builder::new()
                .name("outbox-stop".into())
                .spawn_scoped(threads, || feed.release_at_stop(self, stop));
            if let Err(e) = watcher {
                log::warn!("no thread to release the queued tasks at a stop: {e}");
            }
            self.pool.in_place_scope(|scope| {
                for _ in 0..self.threads {
                    scope.spawn(|_| feed.work(self));
                }
                let _close = CloseOnDrop(&feed);
                let result = f(&feed);
                // What is still queued, the calling thread helps to run rather than wait for.
                if self.caller_helps {
                    while let Some(job) = feed.try_pop(self, 0) {
                        self.help(&feed, job);
                    }
                }
                result
            })
        });
        if let Some(panic) = feed.panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
            std::panic::resume_unwind(panic);
        }
        result
    }

    /// The turn to run a suspect alone, shared by every database of the pool.
    pub(crate) fn solo_turn(&self) -> &super::suspects::SoloTurn {
        &self.solo
    }

    /// Work handed out and not finished yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Room for every unit: nothing in flight.
    pub(crate) fn capacity(&self) -> usize {
        self.bound() + 1
    }

    pub(super) fn bound(&self) -> usize {
        self.lanes.bound()
    }

    /// The slots, locked.
    pub(crate) fn slots(&self) -> MutexGuard<'_, Slots> {
        self.lanes.lock()
    }

    /// The slots, to share with the services that reconfigure them and report their use.
    pub(crate) fn shared_lanes(&self) -> Arc<Lanes> {
        Arc::clone(&self.lanes)
    }

    /// Hands `work` of `lane` to the pool. A task of `default` past the bound of tasks in
    /// flight runs on the calling thread (CallerRuns) before this returns; a domain's task is
    /// always queued, since its claim asked for no more than its room.
    pub(crate) fn submit<'j, F>(&self, feed: &Feed<'j>, lane: usize, work: F)
    where
        F: FnOnce(bool) + Send + 'j,
    {
        if self.in_flight.fetch_add(1, Ordering::SeqCst) < self.bound() || lane != 0 {
            feed.push(self, lane, Box::new(work));
        } else {
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
            self.caller_runs.fetch_add(1, Ordering::Relaxed);
            work(false);
        }
    }

    /// Units that can start now without waiting: free threads and queue slots, plus one for
    /// the calling thread.
    pub(crate) fn room(&self) -> usize {
        (self.bound() + 1).saturating_sub(self.in_flight.load(Ordering::SeqCst))
    }

    /// At a stop: runs every job queued in `lanes` on the calling thread, slot or not (each
    /// releases its tasks at once), rather than leave it for a blocked lane's slot.
    pub(crate) fn run_queued_at_stop(&self, feed: &Feed<'_>, lanes: &[usize]) {
        for &lane in lanes {
            while let Some(job) = feed.try_pop(self, lane) {
                feed.run(self, lane, None, job, true);
            }
        }
    }

    /// Runs a queued `job` of `default` on the claiming thread, which helps while it waits.
    pub(super) fn help<'j>(&self, feed: &Feed<'j>, job: Job<'j>) {
        self.helped.fetch_add(1, Ordering::Relaxed);
        feed.run(self, 0, None, job, false);
    }

    /// How many units the calling thread has run itself because the pool was full.
    pub(crate) fn caller_runs(&self) -> u64 {
        self.caller_runs.load(Ordering::Relaxed)
    }

    /// How many queued units the calling thread has run while it waited (`caller_helps`).
    pub(crate) fn helped(&self) -> u64 {
        self.helped.load(Ordering::Relaxed)
    }
}

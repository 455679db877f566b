//! The worker's background services: the heartbeat, the rescue pass and the hang watchdog,
//! each on a thread of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cancels::CancelWatch;
use super::domains::DomainControl;
use super::heartbeat::{Heartbeat, Node};
use super::observers::Observers;
use super::rescue::Rescuer;
use super::settings::{millis, Settings};
use super::strategy::StrategyControl;
use super::suspects::Suspects;
use super::tenants::RunLimits;
use super::ticker;
use super::timeouts::Timeouts;
use super::watchdog::{charge_hung, Watchdog};
use crate::db::{DatabaseUrl, DbPool};
use crate::driver::RescueParams;
use crate::error::{OpContext, Result};

/// The worker's background services and their threads.
pub(super) struct Services {
    pub(super) heartbeat: Arc<Heartbeat>,
    pub(super) cancels: Arc<CancelWatch>,
    pub(super) limits: Arc<RunLimits>,
    pub(super) domains: Arc<DomainControl>,
    pub(super) strategy: Arc<StrategyControl>,
    pub(super) timeouts: Arc<Timeouts>,
    pub(super) rescuer: Arc<Rescuer>,
    pub(super) watchdog: Arc<Watchdog>,
    pub(super) suspects: Arc<Suspects>,
    pub(super) stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Services {
    // Each argument is a part of the worker the services share; a struct of them would only
    // be built here.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn start(
        settings: &Settings,
        url: &DatabaseUrl,
        pool: &DbPool,
        node: &Arc<Node>,
        stopping: &Arc<AtomicBool>,
        domains: DomainControl,
        timeouts: Timeouts,
        observers: &Observers,
    ) -> Result<Self> {
        let cancels = Arc::new(CancelWatch::default());
        let limits = Arc::new(RunLimits::default());
        let domains = Arc::new(domains);
        let strategy = Arc::new(StrategyControl::new(settings.strategy, settings.dead_after));
        {
            let mut conn = pool.get().op("tenant limits read")?;
            limits.refresh(&mut conn)?;
            domains.refresh(&mut conn)?;
            // Published before the first claim, so that the first claims already take
            // this node's share only, and the others see it at their next beat.
            strategy.refresh(&mut conn, node.id())?;
        }
        let suspects = Arc::new(Suspects::default());
        let services = Services {
            heartbeat: Arc::new(Heartbeat::new(
                url.clone(),
                Arc::clone(node),
                Arc::clone(&cancels),
                Arc::clone(&limits),
                Arc::clone(&domains),
                Arc::clone(&strategy),
            )),
            cancels,
            limits,
            domains,
            strategy,
            timeouts: Arc::new(timeouts),
            rescuer: Arc::new(Rescuer::new(
                pool.clone(),
                Arc::clone(node),
                RescueParams {
                    node: node.id(),
                    dead_after_ms: millis(settings.dead_after),
                    default_max_attempts: settings.max_attempts,
                    backoff_base_ms: millis(settings.backoff.base),
                    backoff_max_ms: millis(settings.backoff.max),
                    backoff_jitter: settings.backoff.jitter,
                    only: None,
                },
                observers.clone(),
                Arc::clone(&suspects),
            )),
            suspects,
            watchdog: Arc::new(Watchdog::new(
                settings
                    .exit_on_hang
                    .then(|| settings.task_timeout + settings.heartbeat),
            )),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::default(),
        };
        let id = node.id();
        let beat = settings.heartbeat;
        let heartbeat = Arc::clone(&services.heartbeat);
        services.spawn(
            "heartbeat",
            id,
            move || beat,
            move || {
                let _ = heartbeat.run_once();
            },
        )?;
        // Only a node that is itself alive rescues others.
        let (rescuer, heartbeat) = (
            Arc::clone(&services.rescuer),
            Arc::clone(&services.heartbeat),
        );
        let dead_after = settings.dead_after;
        services.spawn(
            "rescue",
            id,
            move || ticker::jittered(beat, 0.1),
            move || {
                if heartbeat.since_last_ok() < dead_after {
                    if let Err(e) = rescuer.run_once() {
                        log::warn!("rescue failed: {e}");
                    }
                }
            },
        )?;
        // The domains' timeouts, checked ten times a second.
        let (timeouts, pool_, settings_, observers_, node_) = (
            Arc::clone(&services.timeouts),
            pool.clone(),
            settings.clone(),
            observers.clone(),
            Arc::clone(node),
        );
        services.spawn(
            "timeouts",
            id,
            || Duration::from_millis(100),
            move || {
                timeouts.run_once((&pool_, node_.id()), &settings_, &observers_);
            },
        )?;
        // Apart from the heartbeat: on SQLite a beat can wait the whole busy timeout on the
        // write lock, which is what a hung handler holds.
        if services.watchdog.limit().is_some() {
            let (watchdog, node) = (Arc::clone(&services.watchdog), Arc::clone(node));
            let (pool, settings) = (pool.clone(), settings.clone());
            let stopping = Arc::clone(stopping);
            services.spawn(
                "watchdog",
                id,
                || Duration::from_millis(100),
                move || {
                    watchdog.exit_if_hung(node.id(), |hung| {
                        // No more claims: a chunk that rolls back as its hung neighbour's
                        // transaction ends must not claim its tasks for the exit to strand.
                        stopping.store(true, Ordering::SeqCst);
                        charge_hung(&pool, &settings, node.id(), hung);
                    });
                },
            )?;
        }
        Ok(services)
    }

    fn spawn(
        &self,
        thread: &'static str,
        node_id: i64,
        interval: impl Fn() -> Duration + Send + 'static,
        tick: impl Fn() + Send + 'static,
    ) -> Result<()> {
        let handle = ticker::spawn(
            thread,
            format!("outbox-{thread}-{node_id}"),
            Arc::clone(&self.stop),
            interval,
            tick,
        )?;
        self.threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(handle);
        Ok(())
    }

    /// Stops every service thread and waits for it until `deadline`. A thread still busy
    /// then (a rescue pass waiting for a connection from a database that refuses them) is
    /// left to end on its own: it sees the stop flag once its statement returns.
    pub(super) fn stop_by(&self, deadline: Instant) {
        self.stop.store(true, Ordering::Relaxed);
        let threads =
            std::mem::take(&mut *self.threads.lock().unwrap_or_else(PoisonError::into_inner));
        for thread in threads {
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                log::debug!(
                    "{} still busy at the stop; left to end on its own",
                    thread.thread().name().unwrap_or("a service thread")
                );
            }
        }
    }
}

//! The worker: claims pages of due tasks and runs them in a rayon pool, with its background
//! services (heartbeat, rescue, cron, hang watchdog, domain timeouts), one file each.
//!
//! A task goes one way: configuration → claim → dispatch → execute → record. The modules
//! are declared below in that order, in groups: a module imports modules of its own group
//! or of the groups above it, never of one below (`crate::layout_tests` checks that no
//! import goes round in a circle, and that no module the worker uses imports the worker).
//! The services sit beside the path: the path reads their state, and none of them calls
//! into the path.
//!
//! - what everything shares: the outcomes and their tally, the claim style, the dead-task
//!   hook, the slots of the execution pool and the claim plan's lanes, the fair claim's
//!   state, the suspects' flags, the background threads' ticker, `LISTEN`;
//! - configuration: [`WorkerConfig`] and its defaults, the claim strategy's settings, the
//!   resolved settings, and a lock claim's lease (what its chunk's transaction is);
//! - the services' state and loops: domains (and their rows, `domain_rows`), tenant limits,
//!   cancels, the claim strategy at run time, observers, the heartbeat, the rescue pass, the
//!   hang watchdog, the domains' timeouts, and `services`, which starts their threads;
//! - the execution pool (`dispatch`, and the claiming thread's `waits` on it), then the
//!   [`Worker`] itself (`engine`), which holds all of the above;
//! - the task's path, each module adding its part of `impl Worker`: `claim` (and the claim
//!   of a suspect), `run` (the loops: `drain`, `run`, `run_once`), `refill` (when a claim is
//!   made and how much it takes), `locked` (lock claims), `execute`, `chunk` (a batched
//!   chunk), `record`, `unconfirmed` (a claim whose COMMIT failed); and `cron`, which enqueues the schedules' ticks;
//! - what stands on the worker: a [`Fleet`] of several databases, and `shutdown` (signals
//!   and the grace period).

// What everything shares.
mod fairness;
mod listen;
mod on_dead;
mod plan;
mod slots;
mod style;
mod suspects;
mod tally;
mod ticker;

// Configuration.
mod config;
mod lease;
mod settings;
mod strategy;

// The background services and the state the path reads.
mod cancels;
mod domain_rows;
mod domains;
mod heartbeat;
mod observers;
mod rescue;
mod services;
mod tenants;
mod timeouts;
mod watchdog;

// The execution pool, and the worker that holds all of the above.
mod dispatch;
mod engine;
mod waits;

// The task's path: claim → dispatch → execute → record, and the loops that drive it.
mod chunk;
mod claim;
mod cron;
mod execute;
mod locked;
mod record;
mod refill;
mod run;
mod unconfirmed;

// On the worker.
mod fleet;
mod members;
mod shutdown;

pub use config::{
    default_threads, WorkerConfig, DEFAULT_DEAD_AFTER_BEATS, DEFAULT_HEARTBEAT,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_PAGE_SIZE, DEFAULT_POLL_INTERVAL, DEFAULT_TASK_TIMEOUT,
    MAX_DEFAULT_THREADS, MAX_ERROR_LEN, MAX_PAGE_SIZE, MAX_TASK_TIMEOUT, QUEUE_PER_THREAD,
    SQLITE_DEFAULT_QUEUE,
};
pub use cron::{CronPass, ScheduledTick};
pub use engine::{Worker, STOP_DATABASE_WAIT};
pub use fleet::{DatabaseReport, Fleet};
pub use on_dead::{DEFAULT_ON_DEAD_TIMEOUT, ON_DEAD_QUEUE};
pub use rescue::RescueReport;
pub use style::ClaimStyle;
pub use tally::{Report, Tally};

//! What a worker did: outcomes per task, counted.

use std::time::Duration;

/// How a task's attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The handler succeeded and the completion committed with its effects.
    Done,
    /// The handler failed; the task is pending again after a backoff.
    Retried,
    /// The handler failed permanently or at max attempts; the task is dead.
    Dead,
    /// The claim was taken over before the completion: effects rolled back, nothing written.
    Lost,
    /// Not run (shutdown) or not recorded (database error): back to pending, no failure.
    Released,
    /// The database could not be reached to record anything before the task's deadline;
    /// rescue will recover it.
    Abandoned,
}

/// Counts of what a worker did with the tasks it claimed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tally {
    /// Tasks claimed.
    pub claimed: u64,
    /// Handlers succeeded; completions committed.
    pub done: u64,
    /// Handlers failed; the tasks will run again after a backoff.
    pub retried: u64,
    /// Handlers failed permanently or at max attempts.
    pub dead: u64,
    /// Claims taken over before completion (effects rolled back, nothing recorded).
    pub lost: u64,
    /// Put back to pending without a failure (shutdown, database error).
    pub released: u64,
    /// Left running because the database could not be reached before their deadline;
    /// rescue recovers them.
    pub abandoned: u64,
}

impl Tally {
    pub(crate) fn count(&mut self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Done => &mut self.done,
            Outcome::Retried => &mut self.retried,
            Outcome::Dead => &mut self.dead,
            Outcome::Lost => &mut self.lost,
            Outcome::Released => &mut self.released,
            Outcome::Abandoned => &mut self.abandoned,
        };
        *counter += 1;
    }

    /// Adds another tally to this one.
    pub fn merge(&mut self, other: Tally) {
        self.claimed += other.claimed;
        self.done += other.done;
        self.retried += other.retried;
        self.dead += other.dead;
        self.lost += other.lost;
        self.released += other.released;
        self.abandoned += other.abandoned;
    }

    /// Tasks whose attempt ended with an outcome recorded: done, retried or dead.
    pub fn finished(&self) -> u64 {
        self.done + self.retried + self.dead
    }
}

/// What a `drain` or `run` did, and how long it took.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Report {
    /// The counts.
    pub tally: Tally,
    /// Wall time from start to finish.
    pub elapsed: Duration,
}

impl Report {
    pub(crate) fn new(tally: Tally, elapsed: Duration) -> Self {
        Report { tally, elapsed }
    }

    /// Finished tasks (done, retried, dead) per second.
    pub fn tasks_per_sec(&self) -> f64 {
        self.tally.finished() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

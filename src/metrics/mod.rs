//! Prometheus metrics and a health check for a worker (docs/guide/src/metrics.md).
//!
//! A worker started with [`crate::WorkerConfig::metrics_addr`] (`outbox run --metrics-addr
//! 127.0.0.1:9187`) serves, on a thread of its own:
//!
//! - `GET /metrics`: the Prometheus text format (version 0.0.4), written by the
//!   `prometheus-client` crate;
//! - `GET /healthz`: `200` with a one-line body while the node's last successful heartbeat is
//!   younger than its `dead_after` (others do not consider it dead), `503` otherwise.
//!
//! The metrics, all prefixed `outbox_`:
//!
//! | name | type | labels | what |
//! |---|---|---|---|
//! | `outbox_tasks_finished_total` | counter | `keyword`, `outcome` | attempts this node ended:
//! `done`, `retried` (failed, will run again), `dead` |
//! | `outbox_tasks_rescued_total` | counter | `keyword`, `to` | tasks this node's rescue passes
//! took from dead nodes or past their deadline, `to` `pending` or `dead` |
//! | `outbox_claim_latency_seconds` | histogram | | one claim statement, from asking to the claimed
//! rows |
//! | `outbox_completion_latency_seconds` | histogram | `keyword` | a task from its claim to its
//! outcome recorded (queue wait, handler, commit) |
//! | `outbox_queue_depth` | gauge | `keyword` | pending tasks due now, in the whole table |
//! | `outbox_oldest_due_age_seconds` | gauge | `keyword` | how long the oldest due pending task has
//! waited (0: none due) |
//! | `outbox_tasks` | gauge | `keyword`, `state` | tasks in the table per state |
//! | `outbox_domain_threads`, `…_reserved_threads`, `…_borrowed_threads`, `…_running`, `…_queued`,
//! `…_stuck` | gauge | `domain` | this node's slot use per domain, as `outbox stats` shows it |
//! | `outbox_node_heartbeat_age_seconds` | gauge | `node` | time since this node's last successful
//! heartbeat |
//! | `outbox_metrics_sample_age_seconds` | gauge | | age of the table's figures served (they are
//! read at most every few seconds) |
//!
//! The counters and histograms are atomic additions on the worker's threads (no lock, no
//! allocation per task). The table's figures (`outbox_queue_depth`, `outbox_tasks`,
//! `outbox_oldest_due_age_seconds`) come from one grouped count of `async_task` — the one
//! `outbox stats` runs — asked for by a scrape when the last one is older than
//! [`SAMPLE_INTERVAL`], so that scrapes, however frequent, read the table at most that
//! often, and made on a thread of its own, which a scrape waits for at most a second; every
//! node of a fleet reports the same table figures.

mod gauges;
mod histogram;
mod server;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

pub(crate) use gauges::{Live, TableSample};
pub(crate) use histogram::LatencyHistogram;
pub(crate) use server::{BoundServer, MetricsServer};

use crate::task::ClaimedTask;

/// The least time between two reads of the table's figures (`outbox_queue_depth`,
/// `outbox_tasks`, `outbox_oldest_due_age_seconds`).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// Labels of a per-keyword counter with a second label (`outcome` or `to`).
type KeywordAnd = [(&'static str, String); 2];
/// Labels of a per-keyword metric.
type KeywordOnly = [(&'static str, String); 1];

/// How an attempt ended, as the metrics count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finished {
    Done,
    Retried,
    Dead,
}

/// One registered keyword's counters and histogram, held apart from their families so that
/// counting is an atomic addition, not a lookup under the family's lock.
#[derive(Debug)]
struct KeywordMetrics {
    done: Counter,
    retried: Counter,
    dead: Counter,
    completion: LatencyHistogram,
}

/// A worker's counters and histograms.
#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    keywords: HashMap<String, KeywordMetrics>,
    claim_latency: LatencyHistogram,
    rescued: Family<KeywordAnd, Counter>,
}

impl Metrics {
    /// The metrics of a worker serving `keywords`.
    pub(crate) fn new<'k>(keywords: impl IntoIterator<Item = &'k str>) -> Metrics {
        let finished = Family::<KeywordAnd, Counter>::default();
        let completion = Family::<KeywordOnly, LatencyHistogram>::default();
        let rescued = Family::<KeywordAnd, Counter>::default();
        let claim_latency = LatencyHistogram::default();
        let keywords: HashMap<String, KeywordMetrics> = keywords
            .into_iter()
            .map(|keyword| {
                let counter = |outcome: &'static str| {
                    finished.get_or_create_owned(&[
                        ("keyword", keyword.to_owned()),
                        ("outcome", outcome.to_owned()),
                    ])
                };
                let metrics = KeywordMetrics {
                    done: counter("done"),
                    retried: counter("retried"),
                    dead: counter("dead"),
                    completion: completion.get_or_create_owned(&[("keyword", keyword.to_owned())]),
                };
                (keyword.to_owned(), metrics)
            })
            .collect();
        let mut registry = Registry::with_prefix("outbox");
        registry.register(
            "tasks_finished",
            "Attempts this node ended, by keyword and outcome (done; retried: failed, will run again; dead)",
            finished,
        );
        registry.register(
            "tasks_rescued",
            "Tasks this node's rescue passes took from dead nodes or past their deadline, by keyword and new state",
            rescued.clone(),
        );
        registry.register(
            "claim_latency_seconds",
            "Duration of one claim statement",
            claim_latency.clone(),
        );
        registry.register(
            "completion_latency_seconds",
            "Time from a task's claim to its outcome recorded (queue wait, handler, commit), by keyword",
            completion,
        );
        Metrics {
            registry,
            keywords,
            claim_latency,
            rescued,
        }
    }

    /// Counts a task's attempt ended with `outcome`, and its time since the claim.
    pub(crate) fn finished(&self, task: &ClaimedTask, outcome: Finished) {
        self.finished_at(&task.context.keyword, task.claimed_at, outcome);
    }

    /// Counts an attempt of a task of `keyword` claimed at `claimed_at` ended with `outcome`.
    pub(crate) fn finished_at(&self, keyword: &str, claimed_at: Instant, outcome: Finished) {
        let Some(metrics) = self.keywords.get(keyword) else {
            return;
        };
        match outcome {
            Finished::Done => metrics.done.inc(),
            Finished::Retried => metrics.retried.inc(),
            Finished::Dead => metrics.dead.inc(),
        };
        metrics.completion.observe(claimed_at.elapsed());
    }

    /// Counts one claim statement that took from `started` until now.
    pub(crate) fn claimed(&self, started: Instant) {
        self.claim_latency.observe(started.elapsed());
    }

    /// Counts a task of `keyword` rescued to `state` (`pending` or `dead`).
    pub(crate) fn rescued(&self, keyword: &str, state: &str) {
        self.rescued
            .get_or_create(&[("keyword", keyword.to_owned()), ("to", state.to_owned())])
            .inc();
    }

    /// The counters and histograms in the Prometheus text format.
    pub(crate) fn encode(&self, out: &mut String) {
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(out, &self.registry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_a_keyword_not_served_is_ignored() {
        let metrics = Metrics::new(["a"]);
        let mut text = String::new();
        metrics.encode(&mut text);
        assert!(
            text.contains("outbox_tasks_finished_total{keyword=\"a\",outcome=\"done\"} 0\n"),
            "{text}"
        );
        assert!(!text.contains("keyword=\"b\""), "{text}");
    }
}

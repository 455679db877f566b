//! The gauges: what the node holds now (its domains' slots, its heartbeat's age), read at
//! each scrape, and the table's figures per keyword, read from the database at most every
//! [`super::SAMPLE_INTERVAL`], on a thread of their own that a scrape waits for at most
//! [`SAMPLE_WAIT`].

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet};
use prometheus_client::metrics::MetricType;

use crate::db::{DatabaseUrl, DbConnection};
use crate::domain::DomainUse;
use crate::registry::Registry;
use crate::stats::{keyword_stats, KeywordStats};

/// What the node holds now, as the worker lets the metrics read it.
pub(crate) struct Live {
    /// The node's current id.
    pub(crate) node_id: Box<dyn Fn() -> i64 + Send + Sync>,
    /// Time since the node's last successful heartbeat.
    pub(crate) heartbeat_age: Box<dyn Fn() -> Duration + Send + Sync>,
    /// A node silent this long is dead to the others.
    pub(crate) dead_after: Duration,
    /// Each domain's configuration and slot use on this node, `default` first.
    pub(crate) domains: Box<dyn Fn() -> Vec<DomainUse> + Send + Sync>,
}

impl Live {
    /// Whether the node's heartbeat is fresh: its last success younger than `dead_after`.
    pub(crate) fn healthy(&self) -> bool {
        (self.heartbeat_age)() < self.dead_after
    }
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live")
            .field("dead_after", &self.dead_after)
            .finish_non_exhaustive()
    }
}

/// The table's figures per keyword, read on a thread and a connection of their own.
pub(crate) struct TableSample {
    shared: std::sync::Arc<SampleShared>,
}

struct SampleShared {
    url: DatabaseUrl,
    interval: Duration,
    state: Mutex<SampleState>,
    /// Signalled when a read ends.
    read_ended: Condvar,
    /// The reads' connection, kept between them.
    conn: Mutex<Option<DbConnection>>,
}

#[derive(Default)]
struct SampleState {
    /// The last figures read, and when.
    last: Option<(Instant, Vec<KeywordStats>)>,
    /// A read is under way.
    reading: bool,
}

/// The longest a scrape waits for the read it asked for: past it, the scrape serves the last
/// figures (their age shows it), so that a slow or unreachable database, or a table whose
/// count takes long, never holds up `/metrics`.
pub(crate) const SAMPLE_WAIT: Duration = Duration::from_secs(1);

impl TableSample {
    pub(crate) fn new(url: DatabaseUrl, interval: Duration) -> TableSample {
        TableSample {
            shared: std::sync::Arc::new(SampleShared {
                url,
                interval,
                state: Mutex::default(),
                read_ended: Condvar::new(),
                conn: Mutex::default(),
            }),
        }
    }

    /// When the last read is `interval` old (or failed), starts a read on a thread of its
    /// own, unless one is under way, and waits for it at most [`SAMPLE_WAIT`]. A failed read
    /// keeps the last figures and is logged.
    pub(crate) fn refresh_if_stale(&self) {
        let shared = &self.shared;
        let mut state = shared.lock_state();
        if matches!(&state.last, Some((at, _)) if at.elapsed() < shared.interval) {
            return;
        }
        if !state.reading {
            let reader = std::sync::Arc::clone(shared);
            let started = std::thread::Builder::new()
                .name("outbox-metrics-sample".into())
                .spawn(move || reader.read());
            match started {
                Ok(_) => state.reading = true,
                Err(e) => log::warn!("metrics: could not start the task counts' read: {e}"),
            }
        }
        let _waited = shared
            .read_ended
            .wait_timeout_while(state, SAMPLE_WAIT, |s| s.reading)
            .unwrap_or_else(PoisonError::into_inner);
    }
}

impl SampleShared {
    fn lock_state(&self) -> std::sync::MutexGuard<'_, SampleState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One read of the figures, then the waiting scrapes told (also if the read panics: a
    /// flag left set would stop every later read).
    fn read(&self) {
        struct Ended<'s>(&'s SampleShared);
        impl Drop for Ended<'_> {
            fn drop(&mut self) {
                self.0.lock_state().reading = false;
                self.0.read_ended.notify_all();
            }
        }
        let _ended = Ended(self);
        let read = {
            let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
            let read = match conn.as_mut() {
                Some(conn) => keyword_stats(conn, &Registry::new()),
                None => self.url.connect().and_then(|mut opened| {
                    let read = keyword_stats(&mut opened, &Registry::new());
                    *conn = Some(opened);
                    read
                }),
            };
            if read.is_err() {
                *conn = None;
            }
            read
        };
        let mut state = self.lock_state();
        match read {
            Ok(stats) => state.last = Some((Instant::now(), stats)),
            Err(e) => log::warn!("metrics: could not read the task counts: {e}"),
        }
    }
}

impl std::fmt::Debug for TableSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableSample")
            .field("url", &self.shared.url.masked())
            .finish_non_exhaustive()
    }
}

/// The gauges of one node, encoded at each scrape.
#[derive(Debug)]
pub(crate) struct Gauges {
    pub(crate) live: std::sync::Arc<Live>,
    pub(crate) table: std::sync::Arc<TableSample>,
}

/// Writes one gauge family: `name` with `help`, one sample per `(labels, value)`.
fn gauge<L: EncodeLabelSet, V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, V)>,
) -> std::fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        metric.encode_family(&labels)?.encode_gauge(&value)?;
    }
    Ok(())
}

impl Collector for Gauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let node = (self.live.node_id)().to_string();
        gauge(
            &mut encoder,
            "node_heartbeat_age_seconds",
            "Time since this node's last successful heartbeat.",
            [(
                [("node", node.as_str())],
                (self.live.heartbeat_age)().as_secs_f64(),
            )],
        )?;
        let domains = (self.live.domains)();
        type Field = fn(&DomainUse) -> usize;
        let fields: [(&str, &str, Field); 6] = [
            ("domain_threads", "Threads the domain has on this node (MAX: its limit; RESERVED: its reserved threads; default: the threads no RESERVED domain holds)", |d| d.threads),
            ("domain_reserved_threads", "Threads kept for the domain on this node.", |d| d.reserved),
            ("domain_borrowed_threads", "Threads of default the domain runs on now beyond its reserved ones.", |d| d.borrowed),
            ("domain_running", "The domain's handlers running now on this node (stuck ones included).", |d| d.running),
            ("domain_queued", "The domain's claimed tasks waiting for a thread on this node.", |d| d.queued),
            ("domain_stuck", "The domain's handlers past their timeout that have not returned.", |d| d.stuck),
        ];
        for (name, help, field) in fields {
            let samples = domains
                .iter()
                .map(|d| ([("domain", d.domain.as_str())], field(d) as u64));
            gauge(&mut encoder, name, help, samples)?;
        }
        let state = self.table.shared.lock_state();
        let Some((at, stats)) = &state.last else {
            return Ok(());
        };
        gauge(
            &mut encoder,
            "metrics_sample_age_seconds",
            "Age of the task counts served (read from the database at most every few seconds).",
            [([("", ""); 0], at.elapsed().as_secs_f64())],
        )?;
        let keyword = |s: &KeywordStats| [("keyword", s.keyword.clone())];
        gauge(
            &mut encoder,
            "queue_depth",
            "Pending tasks due now, by keyword.",
            stats.iter().map(|s| (keyword(s), s.due)),
        )?;
        gauge(
            &mut encoder,
            "oldest_due_age_seconds",
            "How long the oldest due pending task has waited, by keyword (0: none due).",
            stats
                .iter()
                .map(|s| (keyword(s), s.oldest_due_secs.unwrap_or(0.0).max(0.0))),
        )?;
        let mut per_state = Vec::new();
        for s in stats {
            for (state, n) in [
                ("blocked", s.blocked),
                ("pending", s.pending),
                ("running", s.running),
                ("done", s.done),
                ("dead", s.dead),
                ("cancelled", s.cancelled),
            ] {
                per_state.push((
                    [("keyword", s.keyword.clone()), ("state", state.to_owned())],
                    n,
                ));
            }
        }
        gauge(
            &mut encoder,
            "tasks",
            "Tasks in the table, by keyword and state.",
            per_state,
        )
    }
}

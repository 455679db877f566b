//! A latency histogram of atomic counters: observing is one bucket search and three atomic
//! additions, no lock and no allocation, so that it can sit on the path of every task.
//!
//! `prometheus-client`'s own histogram takes a mutex per observation; this one implements
//! the crate's [`EncodeMetric`] so that the crate still writes the exposition.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// The buckets' upper bounds, in seconds: from a millisecond (a no-op task's completion) to a
/// minute (a slow handler, a claim waiting on SQLite's write lock).
pub(crate) const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0,
];

/// A histogram of durations over [`LATENCY_BUCKETS`]. Clones share their counts.
#[derive(Debug, Clone, Default)]
pub(crate) struct LatencyHistogram(Arc<Counts>);

#[derive(Debug, Default)]
struct Counts {
    /// Observations per bucket (not cumulative); the last one is past every bound.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    /// The sum of the observations, in nanoseconds.
    sum_nanos: AtomicU64,
}

impl LatencyHistogram {
    /// Counts one observation.
    pub(crate) fn observe(&self, duration: Duration) {
        let secs = duration.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        self.0.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        self.0.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Observations so far.
    #[cfg(test)]
    pub(crate) fn count(&self) -> u64 {
        self.0
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .sum()
    }
}

impl TypedMetric for LatencyHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts: Vec<u64> = self
            .0
            .buckets
            .iter()
            .map(|b| b.load(Ordering::Relaxed))
            .collect();
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .copied()
            .zip(counts.iter().copied())
            .collect();
        let sum = self.0.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, counts.iter().sum(), &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let h = LatencyHistogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(120));
        assert_eq!(h.count(), 4);
        let mut registry = Registry::default();
        registry.register("t_seconds", "test", h);
        let mut text = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        // Cumulative: two at or under 1 ms, the 30 ms one from 0.05 on, the two-minute one only
        // in +Inf.
        assert!(
            text.contains("t_seconds_bucket{le=\"0.001\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("t_seconds_bucket{le=\"0.025\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("t_seconds_bucket{le=\"0.05\"} 3\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"60\"} 3\n"), "{text}");
        assert!(text.contains("t_seconds_bucket{le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("t_seconds_count 4\n"), "{text}");
        assert!(text.contains("t_seconds_sum 120.0315\n"), "{text}");
    }
}

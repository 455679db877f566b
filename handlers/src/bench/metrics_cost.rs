//! What the metrics cost a drain (`outbox bench --metrics-cost`): rounds of two drains of
//! the same no-op tasks on fresh scratch databases, one without a metrics endpoint and one
//! with it, scraped every [`SCRAPE_EVERY`] meanwhile; which goes first alternates from round
//! to round, so that a drift of the machine (other work, the server's caches) falls on both.
//! The figure is the median of the rounds' ratios (with / without).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use outbox::DatabaseUrl;

use super::{drain_bench, median, DrainBench};

/// How often the endpoint is scraped during a drain with metrics: far more often than a
/// Prometheus server would (15 s to 1 min), so that the scrapes' own cost shows.
pub const SCRAPE_EVERY: Duration = Duration::from_secs(1);

/// One round: the two drains' rates and their ratio.
#[derive(Debug, Clone, Copy)]
pub struct MetricsRound {
    /// Tasks per second without metrics.
    pub without_per_s: f64,
    /// Tasks per second with the endpoint, scraped.
    pub with_per_s: f64,
    /// `with_per_s / without_per_s`.
    pub ratio: f64,
    /// Scrapes answered during the drain with metrics.
    pub scrapes: u64,
    /// CPU time of this process per task drained, in microseconds, without metrics.
    pub without_cpu_us: f64,
    /// The same with metrics (the endpoint's thread and the scrapes' included).
    pub with_cpu_us: f64,
}

/// The rounds and their medians.
#[derive(Debug, Clone)]
pub struct MetricsCost {
    /// Every round, in order.
    pub rounds: Vec<MetricsRound>,
    /// The median of the rounds' ratios.
    pub ratio: f64,
    /// The median rate without metrics.
    pub without_per_s: f64,
    /// The median rate with metrics.
    pub with_per_s: f64,
    /// The median CPU time per task without metrics, microseconds.
    pub without_cpu_us: f64,
    /// The median CPU time per task with metrics, microseconds.
    pub with_cpu_us: f64,
}

/// Runs `rounds` rounds of `bench` without and with metrics, interleaved; `each` sees every
/// round as it ends.
pub fn metrics_cost(
    url: &DatabaseUrl,
    bench: &DrainBench,
    rounds: usize,
    mut each: impl FnMut(usize, &MetricsRound),
) -> anyhow::Result<MetricsCost> {
    let mut done = Vec::new();
    for round in 1..=rounds {
        let measure = |metrics: bool| {
            drain_bench(
                url,
                &DrainBench {
                    metrics,
                    reference: false,
                    explain: false,
                    ..bench.clone()
                },
            )
        };
        let (without, with) = if round % 2 == 1 {
            let without = measure(false)?;
            (without, measure(true)?)
        } else {
            let with = measure(true)?;
            (measure(false)?, with)
        };
        let figures = MetricsRound {
            without_per_s: without.tasks_per_s,
            with_per_s: with.tasks_per_s,
            ratio: with.tasks_per_s / without.tasks_per_s,
            scrapes: with.scrapes,
            without_cpu_us: without.cpu_s * 1e6 / without.drained.max(1) as f64,
            with_cpu_us: with.cpu_s * 1e6 / with.drained.max(1) as f64,
        };
        each(round, &figures);
        done.push(figures);
    }
    let med = |f: fn(&MetricsRound) -> f64| median(&done.iter().map(f).collect::<Vec<_>>());
    Ok(MetricsCost {
        ratio: med(|r| r.ratio),
        without_per_s: med(|r| r.without_per_s),
        with_per_s: med(|r| r.with_per_s),
        without_cpu_us: med(|r| r.without_cpu_us),
        with_cpu_us: med(|r| r.with_cpu_us),
        rounds: done,
    })
}

/// Scrapes `/metrics` every [`SCRAPE_EVERY`] on a thread of its own until stopped.
pub(super) struct Scraper {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Scraper {
    pub(super) fn start(addr: SocketAddr) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let (stop_, answered_) = (Arc::clone(&stop), Arc::clone(&answered));
        let thread = std::thread::spawn(move || {
            let mut next = Instant::now();
            while !stop_.load(Ordering::Relaxed) {
                if Instant::now() >= next {
                    if scrape(addr).is_ok() {
                        answered_.fetch_add(1, Ordering::Relaxed);
                    }
                    next += SCRAPE_EVERY;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Scraper {
            stop,
            answered,
            thread: Some(thread),
        }
    }

    /// Stops scraping; returns how many scrapes were answered.
    pub(super) fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.answered.load(Ordering::Relaxed)
    }
}

/// One `GET /metrics`, read to the end.
fn scrape(addr: SocketAddr) -> std::io::Result<()> {
    let mut stream = TcpStream::connect(addr)?;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut body = Vec::new();
    stream.read_to_end(&mut body)?;
    if body.starts_with(b"HTTP/1.0 200") || body.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(std::io::Error::other("not 200"))
    }
}

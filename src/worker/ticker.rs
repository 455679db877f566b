//! The loop around a background service's `run_once`: a thread of its own that ticks on
//! schedule until stopped. Tests call the services' `run_once` directly instead.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::log_label;

/// Starts a thread named `name` that calls `tick` every `interval` (each interval drawn by
/// `interval`, so a service can jitter it) until `stop` is set. Ticks keep to their schedule:
/// a slow tick does not push the next one back, and ticks missed meanwhile are not made up.
pub(crate) fn spawn(
    thread: &'static str,
    name: String,
    stop: Arc<AtomicBool>,
    interval: impl Fn() -> Duration + Send + 'static,
    tick: impl Fn() + Send + 'static,
) -> Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name)
        .spawn(log_label::inherited(move || {
            let mut next = Instant::now() + interval();
            while !stop.load(Ordering::Relaxed) {
                sleep_unless(next.saturating_duration_since(Instant::now()), &stop);
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                next += interval();
                tick();
                next = next.max(Instant::now());
            }
        }))
        .map_err(|source| Error::Thread { thread, source })
}

/// Sleeps for `total`, waking early when `stop` is set.
pub(crate) fn sleep_unless(total: Duration, stop: &AtomicBool) {
    let deadline = Instant::now() + total;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
    }
}

/// `base` moved by up to ±`fraction` at random, so that a fleet's nodes do not act in step.
pub(crate) fn jittered(base: Duration, fraction: f64) -> Duration {
    base.mul_f64(1.0 - fraction + 2.0 * fraction * fastrand::f64())
}

//! How long a failed task waits before its next attempt.

use std::time::Duration;

/// The default delay after the first failure.
pub const DEFAULT_BACKOFF_BASE: Duration = Duration::from_secs(1);
/// The default longest delay between two attempts.
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(3600);
/// The default jitter: each delay is moved by up to ±20%, so that tasks that failed
/// together (an outage) do not all retry in the same instant.
pub const DEFAULT_BACKOFF_JITTER: f64 = 0.2;

/// Exponential backoff with jitter, capped: `base × 2^(failures − 1) × (1 ± jitter)`, never
/// more than `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Backoff {
    /// The delay after the first failure (default 1 s).
    pub base: Duration,
    /// The cap (default 1 h).
    pub max: Duration,
    /// The relative jitter, between 0 and 1 (default 0.2).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: DEFAULT_BACKOFF_BASE,
            max: DEFAULT_BACKOFF_MAX,
            jitter: DEFAULT_BACKOFF_JITTER,
        }
    }
}

impl Backoff {
    /// `base × 2^(failures − 1)`, capped at `max`, with the default jitter (±20%).
    pub fn new(base: Duration, max: Duration) -> Self {
        Backoff {
            base,
            max,
            jitter: DEFAULT_BACKOFF_JITTER,
        }
    }

    /// Sets the relative jitter (0 to 1).
    pub fn jitter(mut self, jitter: f64) -> Self {
        self.jitter = jitter;
        self
    }

    /// The delay after the `failures`-th failure (1 for the first), with `unit` a random
    /// number in `[0, 1)` choosing where in the jitter band the delay falls.
    ///
    /// ```
    /// use std::time::Duration;
    /// use outbox::Backoff;
    ///
    /// let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60)).jitter(0.0);
    /// assert_eq!(b.delay(1, 0.5), Duration::from_secs(1));
    /// assert_eq!(b.delay(4, 0.5), Duration::from_secs(8));
    /// assert_eq!(b.delay(30, 0.5), Duration::from_secs(60)); // capped
    /// ```
    pub fn delay(&self, failures: u32, unit: f64) -> Duration {
        let exponent = failures.saturating_sub(1).min(62) as i32;
        let raw = self.base.as_secs_f64() * 2f64.powi(exponent);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let factor = 1.0 - jitter + 2.0 * jitter * unit.clamp(0.0, 1.0);
        let secs = (raw.min(self.max.as_secs_f64()) * factor).min(self.max.as_secs_f64());
        Duration::from_secs_f64(secs.max(0.0))
    }

    /// Checks the settings: a positive base, `max ≥ base`, jitter within `[0, 1]`.
    pub fn validate(&self) -> Result<(), String> {
        if self.base.is_zero() {
            return Err("backoff base must be positive".into());
        }
        if self.max < self.base {
            return Err("backoff max must be at least its base".into());
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err("backoff jitter must be between 0 and 1".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_until_capped() {
        let b = Backoff {
            jitter: 0.0,
            ..Backoff::default()
        };
        let secs: Vec<u64> = (1..=14).map(|n| b.delay(n, 0.0).as_secs()).collect();
        assert_eq!(
            secs,
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3600, 3600]
        );
        assert_eq!(b.delay(u32::MAX, 0.3), DEFAULT_BACKOFF_MAX);
    }

    #[test]
    fn jitter_stays_in_band_and_under_cap() {
        let b = Backoff::default();
        assert_eq!(b.delay(3, 0.0), Duration::from_secs_f64(3.2));
        assert_eq!(b.delay(3, 1.0), Duration::from_secs_f64(4.8));
        for unit in [0.0, 0.25, 0.5, 0.99] {
            assert!(b.delay(40, unit) <= DEFAULT_BACKOFF_MAX);
        }
    }

    #[test]
    fn rejects_bad_settings() {
        assert!(Backoff::default().validate().is_ok());
        let zero = Backoff {
            base: Duration::ZERO,
            ..Backoff::default()
        };
        assert!(zero.validate().is_err());
        let inverted = Backoff {
            max: Duration::from_millis(1),
            ..Backoff::default()
        };
        assert!(inverted.validate().is_err());
        let jitter = Backoff {
            jitter: 1.5,
            ..Backoff::default()
        };
        assert!(jitter.validate().is_err());
    }
}

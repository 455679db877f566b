//! A schedule: a six-field cron expression (with seconds), parsed by `croner`, in UTC or a
//! named time zone, and the tick maths the scheduler needs.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, DurationRound, TimeZone, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::{Cron, CronDateTime};

use super::{ScheduleError, MAX_EXPRESSION_LEN};

/// A cron schedule: six fields — second, minute, hour, day of month, month, day of week —
/// as `croner` reads them (`*`, lists, ranges, steps such as `*/10` and `0/10`, month and
/// day names, `L`, `W`, `#`, and Quartz's `?` for "any" in a day field), in UTC unless the
/// expression starts with `TZ=Area/City` (or `CRON_TZ=…`), an IANA time zone name.
///
/// Days of the week are numbered as in Unix cron: 0 (or 7) is Sunday, 1 Monday … 6 Saturday
/// (names, `MON-FRI`, read the same everywhere). When both the day of month and the day of
/// week are restricted, a day matching either is a tick (Vixie cron's rule). In a zone with
/// daylight saving time, a fixed time that falls in the skipped hour runs when the hour
/// ends, and one in the repeated hour runs once.
///
/// ```
/// use outbox::schedule::Schedule;
///
/// let every_ten_seconds = Schedule::parse("0/10 * * * * ?")?;
/// let paris_at_three = Schedule::parse("TZ=Europe/Paris 0 0 3 * * *")?;
/// assert_eq!(paris_at_three.time_zone(), "Europe/Paris");
/// let err = Schedule::parse("0 0 25 * * *").unwrap_err();
/// assert!(err.to_string().starts_with("cron expression \"0 0 25 * * *\": "), "{err}");
/// # let _ = every_ten_seconds;
/// # Ok::<(), outbox::schedule::ScheduleError>(())
/// ```
#[derive(Clone)]
pub struct Schedule {
    expression: String,
    cron: Cron,
    tz: Option<chrono_tz::Tz>,
    backfill: Duration,
    data: Option<serde_json::Value>,
}

impl Schedule {
    /// Parses `expression`: six fields, optionally after a `TZ=…` (or `CRON_TZ=…`) time
    /// zone. An expression that does not parse, names an unknown zone, is longer than 256
    /// bytes or never comes due (`0 0 0 30 2 ?`) is an [`ScheduleError::InvalidExpression`]
    /// naming it and why.
    pub fn parse(expression: &str) -> Result<Schedule, ScheduleError> {
        let invalid = |reason: String| ScheduleError::InvalidExpression {
            expression: expression.to_owned(),
            reason,
        };
        let trimmed = expression.trim();
        if trimmed.len() > MAX_EXPRESSION_LEN {
            return Err(invalid(format!("longer than {MAX_EXPRESSION_LEN} bytes")));
        }
        let mut fields: Vec<&str> = trimmed.split_whitespace().collect();
        let mut tz = None;
        if let Some(first) = fields.first() {
            let zone = first
                .strip_prefix("TZ=")
                .or_else(|| first.strip_prefix("CRON_TZ="));
            if let Some(zone) = zone {
                tz = Some(chrono_tz::Tz::from_str(zone).map_err(|_| {
                    invalid(format!(
                        "unknown time zone {zone:?} (write an IANA name such as Europe/Paris)"
                    ))
                })?);
                fields.remove(0);
            }
        }
        if fields.len() != 6 {
            return Err(invalid(format!(
                "expected six fields (second minute hour day-of-month month day-of-week), \
                 found {}",
                fields.len()
            )));
        }
        let cron = CronParser::builder()
            .seconds(Seconds::Required)
            .year(Year::Disallowed)
            // Quartz's `0/10` (from 0, every 10), as seed 002 writes it.
            .sloppy_ranges(true)
            .build()
            .parse(&fields.join(" "))
            .map_err(|e| invalid(e.to_string()))?;
        let schedule = Schedule {
            expression: trimmed.to_owned(),
            cron,
            tz,
            backfill: Duration::ZERO,
            data: None,
        };
        // A pattern that matches no real day (30 February) would make every search fail.
        let origin = Utc.with_ymd_and_hms(2000, 1, 1, 0, 0, 0).single();
        if origin.and_then(|t| schedule.next_after(t)).is_none() {
            return Err(invalid("it never comes due".into()));
        }
        Ok(schedule)
    }

    /// Asks for backfill: after an outage, every missed tick within `window` before now
    /// runs (the latest [`super::MAX_TICKS`] at most), not only the latest one. At most
    /// [`super::MAX_BACKFILL`], checked when the schedule is added to a registry. Zero (the
    /// default) runs only the latest missed tick.
    pub fn backfill(mut self, window: Duration) -> Self {
        self.backfill = window;
        self
    }

    /// Sets the payload of every tick's task (by default `{}`).
    pub fn data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }

    /// The expression as given (trimmed), time zone prefix included.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The time zone the fields are read in: `UTC` or the IANA name given.
    pub fn time_zone(&self) -> &str {
        self.tz.as_ref().map_or("UTC", |tz| tz.name())
    }

    /// The backfill window (zero: only the latest missed tick).
    pub fn backfill_window(&self) -> Duration {
        self.backfill
    }

    /// The payload of each tick's task, if set.
    pub fn payload(&self) -> Option<&serde_json::Value> {
        self.data.as_ref()
    }

    /// The first tick strictly after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.search(whole_second(after), false, true)
    }

    /// The last tick at or before `until`.
    pub fn latest_until(&self, until: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.search(whole_second(until), true, false)
    }

    /// The ticks after `after` and at or before `until`, oldest first: the latest `max` of
    /// them when there are more. Found backwards from `until`, so the cost is bounded by
    /// `max` however long ago `after` is.
    pub fn ticks_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
        max: usize,
    ) -> Vec<DateTime<Utc>> {
        let mut ticks = Vec::new();
        let mut tick = self.latest_until(until);
        while let Some(t) = tick {
            if t <= after || ticks.len() >= max {
                break;
            }
            ticks.push(t);
            tick = self.search(t, false, false);
        }
        ticks.reverse();
        ticks
    }

    /// One step of croner's search from `from`, in the schedule's zone.
    fn search(&self, from: DateTime<Utc>, inclusive: bool, forward: bool) -> Option<DateTime<Utc>> {
        fn step<T: CronDateTime>(
            cron: &Cron,
            from: &T,
            inclusive: bool,
            forward: bool,
        ) -> Option<T> {
            let found = if forward {
                cron.find_next_occurrence(from, inclusive)
            } else {
                cron.find_previous_occurrence(from, inclusive)
            };
            found.ok()
        }
        match &self.tz {
            None => step(&self.cron, &from, inclusive, forward),
            Some(tz) => step(&self.cron, &from.with_timezone(tz), inclusive, forward)
                .map(|t| t.with_timezone(&Utc)),
        }
    }
}

/// `t` without its fraction of a second: ticks are whole seconds.
fn whole_second(t: DateTime<Utc>) -> DateTime<Utc> {
    t.duration_trunc(chrono::TimeDelta::seconds(1)).unwrap_or(t)
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The data may hold what a payload holds: only whether there is some.
        f.debug_struct("Schedule")
            .field("expression", &self.expression)
            .field("time_zone", &self.time_zone())
            .field("backfill", &self.backfill)
            .field("data", &self.data.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    fn reason(expression: &str) -> String {
        match Schedule::parse(expression) {
            Err(ScheduleError::InvalidExpression {
                expression: e,
                reason,
            }) => {
                assert_eq!(e, expression, "the error names the expression");
                reason
            }
            other => panic!("{expression:?} parsed: {other:?}"),
        }
    }

    #[test]
    fn six_fields_with_seconds_and_quartz_forms_parse() {
        for e in [
            "0 0 3 * * *",
            "0/10 * * * * ?",
            "*/1 * * * * *",
            "0 0 3 ? * MON-FRI",
            "0 30 9 L * ?",
            "  0 0 3 * * *  ",
            "TZ=Europe/Paris 0 0 3 * * *",
            "CRON_TZ=America/New_York 0 0 3 * * ?",
        ] {
            assert!(
                Schedule::parse(e).is_ok(),
                "{e:?}: {:?}",
                Schedule::parse(e)
            );
        }
        assert_eq!(
            Schedule::parse(" 0 0 3 * * * ").unwrap().expression(),
            "0 0 3 * * *"
        );
    }

    #[test]
    fn a_bad_expression_is_an_error_naming_it_and_why() {
        assert!(
            reason("0 0 3 * *").contains("expected six fields"),
            "five fields"
        );
        assert!(
            reason("0 0 3 * * * 2026").contains("found 7"),
            "a year field"
        );
        assert!(reason("@daily").contains("found 1"));
        assert!(reason("").contains("found 0"));
        assert!(reason("0 0 25 * * *").contains("out of bounds"), "hour 25");
        assert!(!reason("0 0 3 * * FOO").is_empty());
        assert!(
            reason("TZ=Mars/Olympus 0 0 3 * * *").contains("unknown time zone \"Mars/Olympus\"")
        );
        assert_eq!(reason("0 0 0 30 2 ?"), "it never comes due");
        let long = format!("0 0 3 * * {}", "1,".repeat(200));
        assert!(reason(&long).contains("longer than 256 bytes"));
    }

    #[test]
    fn next_and_latest_ticks_in_utc() {
        let s = Schedule::parse("0 0 3 * * *").unwrap();
        let t = at("2026-11-24T03:00:00Z");
        assert_eq!(
            s.next_after(t),
            Some(at("2026-11-25T03:00:00Z")),
            "strictly after"
        );
        assert_eq!(s.latest_until(t), Some(t), "at or before");
        let later = at("2026-11-24T03:00:00.900Z");
        assert_eq!(s.latest_until(later), Some(t));
        assert_eq!(s.next_after(at("2026-11-24T02:59:59.999Z")), Some(t));
        let seed = Schedule::parse("0/10 * * * * ?").unwrap();
        assert_eq!(
            seed.next_after(at("2026-11-24T03:00:00.500Z")),
            Some(at("2026-11-24T03:00:10Z"))
        );
        assert_eq!(
            seed.latest_until(at("2026-11-24T03:00:19Z")),
            Some(at("2026-11-24T03:00:10Z"))
        );
    }

    #[test]
    fn ticks_between_are_the_latest_ones_oldest_first() {
        let s = Schedule::parse("*/1 * * * * *").unwrap();
        let after = at("2026-11-24T03:00:00.250Z");
        let until = at("2026-11-24T03:00:05.100Z");
        let all = s.ticks_between(after, until, 100);
        assert_eq!(
            all,
            (1..=5)
                .map(|n| at(&format!("2026-11-24T03:00:0{n}Z")))
                .collect::<Vec<_>>()
        );
        // `after` itself is excluded, `until` included.
        assert_eq!(
            s.ticks_between(at("2026-11-24T03:00:01Z"), at("2026-11-24T03:00:03Z"), 9)
                .len(),
            2
        );
        let capped = s.ticks_between(after, until, 2);
        assert_eq!(
            capped,
            vec![at("2026-11-24T03:00:04Z"), at("2026-11-24T03:00:05Z")]
        );
        // A year back costs no more than the cap.
        let year = s.ticks_between(at("2025-11-24T03:00:00Z"), until, 3);
        assert_eq!(year.len(), 3);
        assert!(s.ticks_between(until, until, 10).is_empty());
    }

    #[test]
    fn a_time_zone_moves_the_ticks_and_daylight_saving_is_followed() {
        let paris = Schedule::parse("TZ=Europe/Paris 0 0 3 * * *").unwrap();
        // 03:00 in Paris is 02:00 UTC in winter (CET) and 01:00 UTC in summer (CEST).
        assert_eq!(
            paris.next_after(at("2026-11-24T00:00:00Z")),
            Some(at("2026-11-24T02:00:00Z"))
        );
        assert_eq!(
            paris.next_after(at("2026-07-01T00:00:00Z")),
            Some(at("2026-07-01T01:00:00Z"))
        );
        // 02:30 does not exist on 29 March 2026 in Paris: it runs when the gap ends.
        let gap = Schedule::parse("TZ=Europe/Paris 0 30 2 * * *").unwrap();
        assert_eq!(
            gap.next_after(at("2026-03-28T12:00:00Z")),
            Some(at("2026-03-29T01:00:00Z"))
        );
        assert_eq!(
            gap.next_after(at("2026-03-29T01:00:00Z")),
            Some(at("2026-03-30T00:30:00Z"))
        );
        // 02:30 happens twice on 25 October 2026: it runs once.
        let ticks = gap.ticks_between(at("2026-10-24T12:00:00Z"), at("2026-10-25T12:00:00Z"), 10);
        assert_eq!(ticks.len(), 1, "{ticks:?}");
        assert_eq!(Schedule::parse("0 0 3 * * *").unwrap().time_zone(), "UTC");
    }

    #[test]
    fn the_seeds_every_ten_seconds_ticks_on_the_tens() {
        let s = Schedule::parse("0/10 * * * * ?").unwrap();
        let ticks = s.ticks_between(at("2026-11-24T03:00:00Z"), at("2026-11-24T03:01:00Z"), 100);
        let seconds: Vec<u32> = ticks.iter().map(chrono::Timelike::second).collect();
        assert_eq!(seconds, [10, 20, 30, 40, 50, 0]);
    }
}

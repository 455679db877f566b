//! The registry: one handler per keyword.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::handler::Handler;
use crate::schedule::{Schedule, ScheduleError, MAX_BACKFILL};
use crate::task::{validate_keyword, NewTask, DEFAULT_MAX_PAYLOAD_BYTES};

/// The handlers a worker runs, one per keyword. A worker claims only tasks whose keyword is
/// registered here; other keywords stay pending (useful in a rolling deploy) and show up in
/// `outbox stats`.
///
/// ```
/// use outbox::{HandlerResult, Registry, TaskContext, TaskTx};
///
/// fn credit_points(task: &TaskContext, tx: &mut TaskTx) -> HandlerResult {
///     let _ = (task.biz_id(), tx.conn()?);
///     Ok(())
/// }
///
/// let mut registry = Registry::new();
/// registry.register("points.credit", credit_points);
/// assert_eq!(registry.keywords().collect::<Vec<_>>(), ["points.credit"]);
/// ```
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    /// The cron schedules of registered keywords (docs/guide/src/cron.md).
    schedules: BTreeMap<String, Schedule>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `handler` for `keyword`.
    ///
    /// # Panics
    ///
    /// When `keyword` is already registered, or is not a valid keyword: both are programming
    /// errors that must stop the process at start-up, not surface later as stuck tasks.
    pub fn register(&mut self, keyword: &str, handler: impl Handler) -> &mut Self {
        if let Err(e) = validate_keyword(keyword) {
            panic!("cannot register handler: {e}");
        }
        if self
            .handlers
            .insert(keyword.to_owned(), Arc::new(handler))
            .is_some()
        {
            panic!("duplicate handler registered for keyword {keyword:?}");
        }
        self
    }

    /// The handler for `keyword`.
    pub fn get(&self, keyword: &str) -> Option<&dyn Handler> {
        self.handlers.get(keyword).map(|h| &**h)
    }

    /// The registered keywords, sorted.
    pub fn keywords(&self) -> impl Iterator<Item = &str> {
        self.handlers.keys().map(String::as_str)
    }

    /// Whether no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.handlers.is_empty()
    }

    /// Registers `handler` for `keyword` and runs it at each tick of the cron `expression`
    /// ([`Schedule::parse`]: six fields with seconds, UTC unless it starts with
    /// `TZ=Area/City`), as the task `(keyword, "cron:<tick>")`.
    ///
    /// ```
    /// # use outbox::{HandlerResult, TaskContext, TaskTx};
    /// # fn report(_: &TaskContext, _: &mut TaskTx) -> HandlerResult { Ok(()) }
    /// let mut registry = outbox::Registry::new();
    /// registry.schedule("report.daily", "0 0 3 * * *", report);
    /// ```
    ///
    /// # Panics
    ///
    /// As [`Registry::register`] does, and when the expression does not parse, naming the
    /// keyword and the expression: a programming error that must stop the process at
    /// start-up. [`Registry::add_schedule`] returns the error instead.
    pub fn schedule(
        &mut self,
        keyword: &str,
        expression: &str,
        handler: impl Handler,
    ) -> &mut Self {
        let schedule = Schedule::parse(expression)
            .unwrap_or_else(|e| panic!("cannot schedule keyword {keyword:?}: {e}"));
        self.register(keyword, handler);
        if let Err(e) = self.add_schedule(keyword, schedule) {
            panic!("cannot schedule keyword {keyword:?}: {e}");
        }
        self
    }

    /// Schedules the registered keyword `keyword`. Fails, changing nothing, when it has no
    /// handler, already has a schedule (one per keyword), asks for more backfill than
    /// [`MAX_BACKFILL`], or its data would not make a valid payload.
    pub fn add_schedule(
        &mut self,
        keyword: &str,
        schedule: Schedule,
    ) -> Result<&mut Self, ScheduleError> {
        if !self.handlers.contains_key(keyword) {
            return Err(ScheduleError::UnknownKeyword {
                keyword: keyword.to_owned(),
            });
        }
        if let Some(existing) = self.schedules.get(keyword) {
            return Err(ScheduleError::DuplicateSchedule {
                keyword: keyword.to_owned(),
                expression: existing.expression().to_owned(),
            });
        }
        if schedule.backfill_window() > MAX_BACKFILL {
            return Err(ScheduleError::InvalidBackfill {
                keyword: keyword.to_owned(),
                backfill: schedule.backfill_window(),
                max: MAX_BACKFILL,
            });
        }
        if let Some(data) = schedule.payload() {
            // The payload's own checks, as an enqueue makes them (its text's size).
            NewTask::new(keyword, "cron:2000-01-01T00:00:00Z")
                .payload(data)
                .validate(DEFAULT_MAX_PAYLOAD_BYTES, &|json, _| json.len())
                .map_err(|e| ScheduleError::InvalidData {
                    keyword: keyword.to_owned(),
                    reason: e.to_string(),
                })?;
        }
        self.schedules.insert(keyword.to_owned(), schedule);
        Ok(self)
    }

    /// The scheduled keywords and their schedules, sorted by keyword.
    pub fn schedules(&self) -> impl Iterator<Item = (&str, &Schedule)> {
        self.schedules.iter().map(|(k, s)| (k.as_str(), s))
    }
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.handlers.keys()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::{HandlerResult, TaskContext, TaskTx};

    fn noop(_: &TaskContext, _: &mut TaskTx) -> HandlerResult {
        Ok(())
    }

    #[test]
    #[should_panic(expected = "duplicate handler registered for keyword \"a\"")]
    fn duplicate_keyword_panics() {
        Registry::new().register("a", noop).register("a", noop);
    }

    #[test]
    #[should_panic(expected = "invalid keyword")]
    fn invalid_keyword_panics() {
        Registry::new().register("Not Valid", noop);
    }

    #[test]
    #[should_panic(
        expected = "cannot schedule keyword \"report.daily\": cron expression \"0 0 25 * * *\": "
    )]
    fn a_bad_schedule_panics_naming_keyword_and_expression() {
        Registry::new().schedule("report.daily", "0 0 25 * * *", noop);
    }

    #[test]
    fn a_schedule_needs_a_handler_and_one_per_keyword() {
        let mut registry = Registry::new();
        let daily = Schedule::parse("0 0 3 * * *").unwrap();
        assert_eq!(
            registry.add_schedule("report", daily.clone()).unwrap_err(),
            ScheduleError::UnknownKeyword {
                keyword: "report".into()
            }
        );
        registry.schedule("report", "0 0 3 * * *", noop);
        assert_eq!(
            registry
                .add_schedule("report", daily.clone())
                .unwrap_err()
                .to_string(),
            "keyword \"report\" already has a schedule (\"0 0 3 * * *\"): one schedule per keyword"
        );
        registry.register("other", noop);
        let long = daily
            .clone()
            .backfill(MAX_BACKFILL + std::time::Duration::from_secs(1));
        let error = registry.add_schedule("other", long).unwrap_err();
        assert!(matches!(error, ScheduleError::InvalidBackfill { .. }));
        assert_eq!(
            error.to_string(),
            "schedule of keyword \"other\": backfill of 604801s is longer than the most, 604800s"
        );
        let huge = daily.clone().data(serde_json::json!("x".repeat(70_000)));
        assert!(matches!(
            registry.add_schedule("other", huge),
            Err(ScheduleError::InvalidData { .. })
        ));
        registry
            .add_schedule("other", daily.backfill(MAX_BACKFILL))
            .unwrap();
        let scheduled: Vec<&str> = registry.schedules().map(|(k, _)| k).collect();
        assert_eq!(scheduled, ["other", "report"]);
    }
}

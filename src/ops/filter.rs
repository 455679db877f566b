//! Which tasks an operator's listing or retry applies to.

use std::time::Duration;

use crate::driver::ops::TaskSelect;
use crate::error::{Error, Result};
use crate::task::{validate_keyword, TaskState, MAX_BIZ_ID_LEN};

/// The longest age a filter accepts: a hundred years.
pub const MAX_AGE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Which tasks [`super::list_tasks`] lists and [`super::retry_matching`] retries: every
/// condition given must hold; an empty filter matches every task.
///
/// Ages are measured on `created_at` by the database clock: `older_than(1h)` keeps the tasks
/// created more than an hour ago, `newer_than(10m)` those created within the last ten
/// minutes.
///
/// ```
/// use std::time::Duration;
/// use outbox::ops::Filter;
/// use outbox::TaskState;
///
/// let filter = Filter::default()
///     .state(TaskState::Dead)
///     .keyword("coupon.grant")
///     .older_than(Duration::from_secs(3600));
/// assert!(filter.validate().is_ok());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Filter {
    /// Tasks in one of these states (empty: any state).
    pub states: Vec<TaskState>,
    /// Tasks of this keyword.
    pub keyword: Option<String>,
    /// Tasks of this tenant.
    pub tenant: Option<String>,
    /// Tasks with this business key.
    pub biz_id: Option<String>,
    /// Tasks created more than this long ago.
    pub older_than: Option<Duration>,
    /// Tasks created at most this long ago.
    pub newer_than: Option<Duration>,
}

impl Filter {
    /// Also tasks in `state` (a filter with no state matches every state).
    pub fn state(mut self, state: TaskState) -> Self {
        if !self.states.contains(&state) {
            self.states.push(state);
        }
        self
    }

    /// Only tasks of `keyword`.
    pub fn keyword(mut self, keyword: impl Into<String>) -> Self {
        self.keyword = Some(keyword.into());
        self
    }

    /// Only tasks of `tenant`.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Only tasks with the business key `biz_id`.
    pub fn biz_id(mut self, biz_id: impl Into<String>) -> Self {
        self.biz_id = Some(biz_id.into());
        self
    }

    /// Only tasks created more than `age` ago (database clock).
    pub fn older_than(mut self, age: Duration) -> Self {
        self.older_than = Some(age);
        self
    }

    /// Only tasks created at most `age` ago (database clock).
    pub fn newer_than(mut self, age: Duration) -> Self {
        self.newer_than = Some(age);
        self
    }

    /// Checks the filter on its own, as every function taking one does before reading
    /// anything: a valid keyword ([`Error::InvalidKeyword`]), a tenant of 1 to 128 bytes and
    /// a biz_id of 1 to 128 bytes without NUL, ages up to [`MAX_AGE`] ([`Error::InvalidConfig`]
    /// naming the flag).
    pub fn validate(&self) -> Result<()> {
        self.select().map(|_| ())
    }

    /// The filter as the driver binds it.
    pub(crate) fn select(&self) -> Result<TaskSelect<'_>> {
        if let Some(keyword) = &self.keyword {
            validate_keyword(keyword)?;
        }
        if let Some(tenant) = &self.tenant {
            crate::tenant::validate_name(tenant)?;
        }
        if let Some(biz_id) = &self.biz_id {
            if let Some(reason) = crate::task::key_problem(biz_id) {
                return Err(Error::InvalidConfig {
                    setting: "biz-id",
                    reason: format!(
                        "must be 1 to {MAX_BIZ_ID_LEN} bytes without NUL characters: {reason}"
                    ),
                });
            }
        }
        Ok(TaskSelect {
            states: &self.states,
            keyword: self.keyword.as_deref(),
            tenant: self.tenant.as_deref(),
            biz_id: self.biz_id.as_deref(),
            older_than_ms: age_ms("older-than", self.older_than)?,
            newer_than_ms: age_ms("newer-than", self.newer_than)?,
        })
    }

    /// The filter as the audit records it: a line of `name=value` pairs, and a JSON object.
    pub(crate) fn describe(&self) -> (String, serde_json::Value) {
        let states: Vec<&str> = self.states.iter().map(|s| s.as_str()).collect();
        let ms = |d: Option<Duration>| d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let detail = serde_json::json!({
            "states": states,
            "keyword": self.keyword,
            "tenant": self.tenant,
            "biz_id": self.biz_id,
            "older_than_ms": ms(self.older_than),
            "newer_than_ms": ms(self.newer_than),
        });
        let mut parts = Vec::new();
        if !states.is_empty() {
            parts.push(format!("state={}", states.join(",")));
        }
        for (name, value) in [
            ("keyword", &self.keyword),
            ("tenant", &self.tenant),
            ("biz_id", &self.biz_id),
        ] {
            if let Some(value) = value {
                parts.push(format!("{name}={value}"));
            }
        }
        for (name, age) in [
            ("older-than", self.older_than),
            ("newer-than", self.newer_than),
        ] {
            if let Some(age) = age {
                parts.push(format!("{name}={}", humantime::format_duration(age)));
            }
        }
        let target = if parts.is_empty() {
            "all".to_owned()
        } else {
            parts.join(" ")
        };
        (target, detail)
    }
}

fn age_ms(setting: &'static str, age: Option<Duration>) -> Result<Option<i64>> {
    let Some(age) = age else { return Ok(None) };
    if age > MAX_AGE {
        return Err(Error::InvalidConfig {
            setting,
            reason: "must be at most 100 years".into(),
        });
    }
    Ok(Some(i64::try_from(age.as_millis()).unwrap_or(i64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_filter_matches_everything_and_says_so() {
        let filter = Filter::default();
        assert!(filter.validate().is_ok());
        assert_eq!(filter.describe().0, "all");
    }

    #[test]
    fn the_audit_line_names_each_condition() {
        let filter = Filter::default()
            .state(TaskState::Dead)
            .state(TaskState::Dead)
            .keyword("mail.send")
            .older_than(Duration::from_secs(7200));
        let (target, detail) = filter.describe();
        assert_eq!(target, "state=dead keyword=mail.send older-than=2h");
        assert_eq!(detail["older_than_ms"], 7_200_000);
        assert_eq!(detail["states"], serde_json::json!(["dead"]));
    }

    #[test]
    fn bad_conditions_name_their_flag() {
        let error = Filter::default().keyword("Bad").validate().unwrap_err();
        assert!(matches!(error, Error::InvalidKeyword { .. }), "{error}");
        let error = Filter::default().biz_id("").validate().unwrap_err();
        assert!(error.to_string().contains("biz-id"), "{error}");
        let error = Filter::default().tenant("").validate().unwrap_err();
        assert!(error.to_string().contains("tenant"), "{error}");
        let error = Filter::default()
            .older_than(MAX_AGE + Duration::from_secs(1))
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("older-than"), "{error}");
    }
}

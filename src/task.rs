//! Tasks: their states, what a producer enqueues, and what a worker claims.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::handler::TaskContext;

/// The longest keyword, in characters.
pub const MAX_KEYWORD_LEN: usize = 64;
/// The longest biz_id, in bytes.
pub const MAX_BIZ_ID_LEN: usize = 128;
/// The longest tenant, in bytes.
pub const MAX_TENANT_LEN: usize = 128;
/// The limit on a payload's size, and the largest the schema accepts: 64 KiB of JSON text as
/// the database stores it (SQLite: the text itself; PostgreSQL: jsonb's text form,
/// `biz_data::text`). [`crate::EnqueueOptions::max_payload_bytes`] may lower it.
pub const DEFAULT_MAX_PAYLOAD_BYTES: usize = 64 * 1024;
/// The longest delay an enqueue accepts: ten years.
pub const MAX_DELAY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Where a task is in its life. Stored as text (`WHERE state = 'dead'` reads plainly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaskState {
    /// Waiting for its `run_at`, then for a worker to claim it.
    Pending,
    /// Claimed by a node (`owner`) under a claim token; its handler may be running.
    Running,
    /// Its handler succeeded and the completion committed with the side-effect.
    Done,
    /// Failed `max_attempts` times, or failed permanently. `retry` makes it pending again.
    Dead,
    /// Cancelled by an operator; a running handler's completion is fenced out.
    Cancelled,
    /// Waiting for an unfinished parent task.
    Blocked,
}

impl TaskState {
    /// Every state, in life order.
    pub const ALL: [TaskState; 6] = [
        TaskState::Blocked,
        TaskState::Pending,
        TaskState::Running,
        TaskState::Done,
        TaskState::Dead,
        TaskState::Cancelled,
    ];

    /// The stored text: `pending`, `running`, `done`, `dead`, `cancelled` or `blocked`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "pending",
            TaskState::Running => "running",
            TaskState::Done => "done",
            TaskState::Dead => "dead",
            TaskState::Cancelled => "cancelled",
            TaskState::Blocked => "blocked",
        }
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskState {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        TaskState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| format!("unknown task state {s:?}"))
    }
}

/// Checks a keyword: 1 to 64 characters from `[a-z0-9._:-]`.
///
/// ```
/// assert!(outbox::validate_keyword("points.credit").is_ok());
/// assert!(outbox::validate_keyword("Points").is_err());
/// assert!(outbox::validate_keyword("").is_err());
/// ```
pub fn validate_keyword(keyword: &str) -> Result<()> {
    let reason = if keyword.is_empty() {
        "it is empty"
    } else if keyword.chars().count() > MAX_KEYWORD_LEN {
        "it is longer than 64 characters"
    } else if !keyword
        .bytes()
        .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b':' | b'-'))
    {
        "only a-z, 0-9 and . _ : - are allowed"
    } else {
        return Ok(());
    };
    Err(Error::InvalidKeyword {
        keyword: keyword.to_owned(),
        reason,
    })
}

/// A task to enqueue: a keyword, a business key and an optional JSON payload.
///
/// ```
/// use std::time::Duration;
/// use outbox::NewTask;
///
/// let task = NewTask::new("points.credit", "order-42")
///     .payload(&serde_json::json!({"user_id": 7, "points": 120}))
///     .tenant("shop-eu")
///     .delay(Duration::from_secs(30));
/// ```
#[derive(Clone)]
pub struct NewTask {
    pub(crate) keyword: String,
    pub(crate) biz_id: String,
    pub(crate) payload: std::result::Result<String, String>,
    pub(crate) tenant: Option<String>,
    pub(crate) priority: i16,
    pub(crate) max_attempts: Option<i32>,
    pub(crate) delay: Duration,
}

impl NewTask {
    /// A task for `keyword` on business object `biz_id`, with an empty object as payload,
    /// due now, priority 0 and the worker's default max attempts.
    pub fn new(keyword: impl Into<String>, biz_id: impl Into<String>) -> Self {
        NewTask {
            keyword: keyword.into(),
            biz_id: biz_id.into(),
            payload: Ok("{}".to_owned()),
            tenant: None,
            priority: 0,
            max_attempts: None,
            delay: Duration::ZERO,
        }
    }

    /// Sets the payload by serialising `value` to JSON.
    pub fn payload<T: Serialize + ?Sized>(mut self, value: &T) -> Self {
        self.payload = serde_json::to_string(value).map_err(|e| e.to_string());
        self
    }

    /// Sets the payload from JSON text; it is checked at enqueue.
    pub fn payload_json(mut self, json: impl Into<String>) -> Self {
        self.payload = Ok(json.into());
        self
    }

    /// Sets the tenant (1 to 128 bytes), the unit of quotas.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// Sets the priority: lower runs first; the default is 0.
    pub fn priority(mut self, priority: i16) -> Self {
        self.priority = priority;
        self
    }

    /// Sets how many attempts the task gets before it is dead (at least 1); by default the
    /// worker's `max_attempts`.
    pub fn max_attempts(mut self, max_attempts: i32) -> Self {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Makes the task due `delay` after the enqueue, by the database clock.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The keyword.
    pub fn keyword(&self) -> &str {
        &self.keyword
    }

    /// The business key.
    pub fn biz_id(&self) -> &str {
        &self.biz_id
    }

    /// Checks every field, the payload's size as `stored_len` measures it (the backend's
    /// stored form); returns the payload text on success.
    pub(crate) fn validate(
        &self,
        max_payload_bytes: usize,
        stored_len: &dyn Fn(&str, &serde_json::Value) -> usize,
    ) -> Result<&str> {
        validate_keyword(&self.keyword)?;
        let biz_reason = if self.biz_id.is_empty() {
            Some("it is empty")
        } else if self.biz_id.len() > MAX_BIZ_ID_LEN {
            Some("it is longer than 128 bytes")
        } else if self.biz_id.contains('\0') {
            Some("it contains a NUL character")
        } else {
            None
        };
        if let Some(reason) = biz_reason {
            return Err(Error::InvalidBizId {
                keyword: self.keyword.clone(),
                reason,
            });
        }
        let invalid_task = |reason: String| Error::InvalidTask {
            keyword: self.keyword.clone(),
            biz_id: self.biz_id.clone(),
            reason,
        };
        if let Some(tenant) = &self.tenant {
            if tenant.is_empty() || tenant.len() > MAX_TENANT_LEN || tenant.contains('\0') {
                return Err(invalid_task(
                    "tenant must be 1 to 128 bytes without NUL characters".into(),
                ));
            }
        }
        if let Some(max) = self.max_attempts {
            if max < 1 {
                return Err(invalid_task(format!(
                    "max_attempts must be at least 1, not {max}"
                )));
            }
        }
        if self.delay > MAX_DELAY {
            return Err(invalid_task("delay is longer than ten years".into()));
        }
        let invalid_payload = |reason: String| Error::InvalidPayload {
            keyword: self.keyword.clone(),
            biz_id: self.biz_id.clone(),
            reason,
        };
        let payload = self
            .payload
            .as_deref()
            .map_err(|e| invalid_payload(e.clone()))?;
        let value: serde_json::Value = serde_json::from_str(payload)
            .map_err(|e| invalid_payload(format!("not valid JSON: {e}")))?;
        if contains_nul(&value) {
            return Err(invalid_payload(
                "contains \\u0000, which PostgreSQL's jsonb rejects".into(),
            ));
        }
        let size = stored_len(payload, &value);
        if size > max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                keyword: self.keyword.clone(),
                biz_id: self.biz_id.clone(),
                size,
                limit: max_payload_bytes,
            });
        }
        Ok(payload)
    }
}

impl std::fmt::Debug for NewTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The payload may hold personal data: only its size.
        let payload = match &self.payload {
            Ok(json) => format!("<{} bytes>", json.len()),
            Err(_) => "<not serialisable>".to_owned(),
        };
        f.debug_struct("NewTask")
            .field("keyword", &self.keyword)
            .field("biz_id", &self.biz_id)
            .field("payload", &format_args!("{payload}"))
            .field("tenant", &self.tenant)
            .field("priority", &self.priority)
            .field("max_attempts", &self.max_attempts)
            .field("delay", &self.delay)
            .finish()
    }
}

fn contains_nul(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().any(contains_nul),
        serde_json::Value::Object(map) => map
            .iter()
            .any(|(key, item)| key.contains('\0') || contains_nul(item)),
        _ => false,
    }
}

/// A task claimed by this node: its context and the claim that fences every later write.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimedTask {
    /// What the handler sees.
    pub context: TaskContext,
    /// Failures recorded before this attempt.
    pub failures: i32,
    /// The task's own max attempts, if the producer set one.
    pub max_attempts: Option<i32>,
    /// The claim token this claim set; a write with an older token touches nothing.
    pub claim_token: i64,
    /// The claiming node.
    pub owner: i64,
    /// When the task's deadline passes, by this process's clock (its claim plus the claim
    /// timeout, measured from just before the claim): outcomes are recorded until then.
    pub(crate) deadline: std::time::Instant,
}

impl ClaimedTask {
    /// The fence of this claim.
    pub(crate) fn claim(&self) -> crate::driver::Claim {
        crate::driver::Claim {
            id: self.context.id,
            owner: self.owner,
            token: self.claim_token,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_len(json: &str, _: &serde_json::Value) -> usize {
        json.len()
    }

    #[test]
    fn keyword_rules() {
        assert!(validate_keyword("a").is_ok());
        assert!(validate_keyword("coupon.grant:v2_x-y").is_ok());
        assert!(validate_keyword(&"a".repeat(64)).is_ok());
        assert!(validate_keyword(&"a".repeat(65)).is_err());
        for bad in ["", "A", "a b", "a/b", "é", "a\0"] {
            assert!(validate_keyword(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn state_text_round_trips() {
        for state in TaskState::ALL {
            assert_eq!(state.as_str().parse::<TaskState>(), Ok(state));
        }
        assert!("finished".parse::<TaskState>().is_err());
    }

    #[test]
    fn payload_checks() {
        let ok = NewTask::new("k", "1").payload_json(r#"{"a":"\\u0000 is text here"}"#);
        assert!(ok.validate(1024, &text_len).is_ok());
        let nul = NewTask::new("k", "1").payload_json(r#"{"a":"x\u0000"}"#);
        assert!(matches!(
            nul.validate(1024, &text_len),
            Err(Error::InvalidPayload { .. })
        ));
        let nul_key = NewTask::new("k", "1").payload_json(r#"{"\u0000":1}"#);
        assert!(matches!(
            nul_key.validate(1024, &text_len),
            Err(Error::InvalidPayload { .. })
        ));
        let bad = NewTask::new("k", "1").payload_json("{");
        assert!(matches!(
            bad.validate(1024, &text_len),
            Err(Error::InvalidPayload { .. })
        ));
        let big = NewTask::new("k", "1").payload(&"x".repeat(2000));
        assert!(matches!(
            big.validate(1024, &text_len),
            Err(Error::PayloadTooLarge {
                size: 2002,
                limit: 1024,
                ..
            })
        ));
    }

    #[test]
    fn field_checks() {
        assert!(matches!(
            NewTask::new("k", "").validate(10, &text_len),
            Err(Error::InvalidBizId { .. })
        ));
        assert!(matches!(
            NewTask::new("k", "x".repeat(129)).validate(10, &text_len),
            Err(Error::InvalidBizId { .. })
        ));
        assert!(NewTask::new("k", "x".repeat(128))
            .validate(10, &text_len)
            .is_ok());
        assert!(matches!(
            NewTask::new("k", "1")
                .max_attempts(0)
                .validate(10, &text_len),
            Err(Error::InvalidTask { .. })
        ));
        assert!(matches!(
            NewTask::new("k", "1").tenant("").validate(10, &text_len),
            Err(Error::InvalidTask { .. })
        ));
    }
}

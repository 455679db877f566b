//! A task to enqueue, and the checks it passes before anything is written.

use std::time::Duration;

use serde::Serialize;

use super::{key_problem, new_key_problem, validate_keyword, MAX_DELAY};
use crate::error::{Error, Result};

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
    pub(crate) parents: Vec<Parent>,
}

/// A parent a task waits for: by id, or by its `(keyword, biz_id)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Parent {
    Id(i64),
    Key(String, String),
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
            parents: Vec::new(),
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

    /// Makes the task a child of the task `parent_id`: it is enqueued `blocked` and becomes
    /// `pending` in the transaction that marks its last unfinished parent `done`. If a parent
    /// ends `dead` or `cancelled` (now or later), the task is cancelled with it. Call it more
    /// than once for a task that waits for several parents (fan-in).
    ///
    /// The parent must exist when the task is enqueued (created earlier, or by this same
    /// transaction), so no chain can loop back on itself. Parents are linked only when the
    /// enqueue creates the task: a duplicate keeps the parents it was created with.
    ///
    /// ```
    /// use outbox::NewTask;
    ///
    /// // The invoice is sent once the order is both paid and packed.
    /// let send = NewTask::new("invoice.send", "order-42").after(17).after(18);
    /// ```
    pub fn after(mut self, parent_id: i64) -> Self {
        let parent = Parent::Id(parent_id);
        if !self.parents.contains(&parent) {
            self.parents.push(parent);
        }
        self
    }

    /// As [`NewTask::after`], naming the parent by its `(keyword, biz_id)`: a task created
    /// earlier, or one that comes before this one in the same [`crate::enqueue_batch`].
    ///
    /// ```
    /// use outbox::NewTask;
    ///
    /// let batch = [
    ///     NewTask::new("order.pack", "42"),
    ///     NewTask::new("order.ship", "42").after_key("order.pack", "42"),
    /// ];
    /// ```
    pub fn after_key(mut self, keyword: impl Into<String>, biz_id: impl Into<String>) -> Self {
        let parent = Parent::Key(keyword.into(), biz_id.into());
        if !self.parents.contains(&parent) {
            self.parents.push(parent);
        }
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
        if let Some(reason) = new_key_problem(&self.biz_id) {
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
        if let Some(reason) = self.tenant.as_deref().and_then(new_key_problem) {
            return Err(invalid_task(format!(
                "tenant must be 1 to 128 bytes without NUL characters or a trailing space: {reason}"
            )));
        }
        if let Some(max) = self.max_attempts {
            if max < 1 {
                return Err(invalid_task(format!(
                    "max_attempts must be at least 1, not {max}"
                )));
            }
        }
        if self.delay > MAX_DELAY {
            return Err(invalid_task(format!(
                "delay must be at most ten years ({} days), not {:?}",
                MAX_DELAY.as_secs() / 86_400,
                self.delay
            )));
        }
        for parent in &self.parents {
            match parent {
                Parent::Id(id) if *id < 1 => {
                    return Err(invalid_task(format!(
                        "parent id must be positive, not {id}"
                    )))
                }
                Parent::Key(keyword, biz_id) => {
                    if validate_keyword(keyword).is_err() || key_problem(biz_id).is_some() {
                        return Err(invalid_task(format!(
                            "parent ({keyword:?}, {biz_id:?}) is not a valid task key"
                        )));
                    }
                    if *keyword == self.keyword && *biz_id == self.biz_id {
                        return Err(invalid_task("a task cannot be its own parent".into()));
                    }
                }
                Parent::Id(_) => {}
            }
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
        if depth(&value) > MAX_PAYLOAD_DEPTH {
            return Err(invalid_payload(format!(
                "nested {} levels deep, more than {MAX_PAYLOAD_DEPTH}, the most MariaDB's JSON takes",
                depth(&value)
            )));
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
            .field("parents", &self.parents)
            .finish()
    }
}

/// The deepest nesting of arrays and objects a payload may have: MariaDB's JSON refuses more
/// (its `JSON_VALID`), so every backend does, and a payload means the same everywhere.
pub(crate) const MAX_PAYLOAD_DEPTH: usize = 31;

/// How deep `value`'s arrays and objects nest (0 for a scalar).
fn depth(value: &serde_json::Value) -> usize {
    match value {
        serde_json::Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn text_len(json: &str, _: &serde_json::Value) -> usize {
        json.len()
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
        let nested = |n: usize| format!("{}1{}", "[".repeat(n), "]".repeat(n));
        let deepest = NewTask::new("k", "1").payload_json(nested(MAX_PAYLOAD_DEPTH));
        assert!(deepest.validate(1024, &text_len).is_ok());
        let deeper = NewTask::new("k", "1").payload_json(nested(MAX_PAYLOAD_DEPTH + 1));
        assert!(matches!(
            deeper.validate(1024, &text_len),
            Err(Error::InvalidPayload { reason, .. }) if reason.contains("32 levels deep")
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

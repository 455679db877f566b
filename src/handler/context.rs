//! What a handler knows of the task it runs.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::de::DeserializeOwned;

use super::HandlerError;

/// What a handler knows of the task it runs: its id, keyword, business key, tenant, attempt
/// and payload.
///
/// Its `Debug` output leaves the payload out (it may hold personal data): only its size.
#[derive(Clone)]
pub struct TaskContext {
    pub(crate) id: i64,
    pub(crate) keyword: String,
    pub(crate) biz_id: String,
    pub(crate) tenant: Option<String>,
    pub(crate) attempt: i32,
    pub(crate) payload: String,
    /// Set by the worker's heartbeat when the task is found cancelled while it runs.
    pub(crate) cancelled: Arc<AtomicBool>,
}

impl TaskContext {
    /// Whether the task was cancelled while its handler runs ([`crate::cancel()`]): the worker
    /// checks at each heartbeat, so it turns true within one heartbeat of the cancel. A long
    /// handler may poll it and stop early; whatever it then returns, its completion is fenced
    /// out and its in-database effects roll back. (Under lock claims a cancel waits for the
    /// running chunk, so it stays false.)
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// The task's id.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// The task's keyword.
    pub fn keyword(&self) -> &str {
        &self.keyword
    }

    /// The business key, such as an order number.
    pub fn biz_id(&self) -> &str {
        &self.biz_id
    }

    /// The tenant, when the producer gave one.
    pub fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// Which attempt this is: 1 the first time, 2 after one failure, and so on.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// The payload as JSON text.
    pub fn payload_json(&self) -> &str {
        &self.payload
    }

    /// The payload deserialised into `T`.
    ///
    /// A payload that does not fit `T` will never fit it, so the error is permanent: returned
    /// with `?` from a handler, it makes the task dead at once instead of retrying. The error
    /// names the class of the mismatch and where in the payload it is (`data error at
    /// user.email (line 1, column 31)`, `missing field `user_id``), never a value of the
    /// payload: it is stored in `last_error` and logged, and payloads hold personal data.
    ///
    /// ```
    /// # #[cfg(feature = "testing")] {
    /// #[derive(Debug, serde::Deserialize)]
    /// struct Order { user_id: i64 }
    ///
    /// let task = outbox::testing::task_context("points.credit", "42")
    ///     .payload_json(r#"{"user_id": "alice@example.com"}"#)
    ///     .build();
    /// let error = task.payload::<Order>().unwrap_err();
    /// assert!(error.is_permanent());
    /// assert!(error.to_string().contains("at user_id"));
    /// assert!(!error.to_string().contains("alice"));
    /// # }
    /// ```
    pub fn payload<T: DeserializeOwned>(&self) -> Result<T, HandlerError> {
        let mut deserializer = serde_json::Deserializer::from_str(&self.payload);
        serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
            HandlerError::permanent(anyhow::anyhow!(
                "payload of {} {} does not fit the expected type: {}",
                self.keyword,
                self.biz_id,
                describe_mismatch(&e)
            ))
        })
    }
}

/// The class of a deserialisation error and its path in the document, without any of the
/// document's values (serde's own message quotes them: `invalid type: string "…"`).
fn describe_mismatch(error: &serde_path_to_error::Error<serde_json::Error>) -> String {
    let inner = error.inner();
    let class = match inner.classify() {
        serde_json::error::Category::Io => "read error",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Eof => "unexpected end",
        serde_json::error::Category::Data => {
            // A missing field's name comes from the type, not from the payload.
            let message = inner.to_string();
            if let Some(rest) = message.strip_prefix("missing field `") {
                if let Some(field) = rest.split('`').next() {
                    return format!(
                        "missing field `{field}` at {} (line {}, column {})",
                        path_without_data(error.path()),
                        inner.line(),
                        inner.column()
                    );
                }
            }
            "data error"
        }
    };
    format!(
        "{class} at {} (line {}, column {})",
        path_without_data(error.path()),
        inner.line(),
        inner.column()
    )
}

/// The path as serde_path_to_error writes it (`user.items[0].name`), with a key that does not
/// look like a field name shown as `<key>`: a map's keys are the payload's data
/// (`{"alice@example.com": …}`), and the path cannot tell them from a struct's fields, so a
/// key is kept only when it is 1 to 64 letters, digits, `_` or `-` (a map keyed by such
/// values, user names or ids, still shows them).
fn path_without_data(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let looks_like_a_field = |key: &str| {
        (1..=64).contains(&key.len())
            && key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let mut text = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => {
                text.push_str(&format!("[{index}]"));
                continue;
            }
            _ if !text.is_empty() => text.push('.'),
            _ => {}
        }
        match segment {
            Segment::Map { key } if looks_like_a_field(key) => text.push_str(key),
            Segment::Enum { variant } if looks_like_a_field(variant) => text.push_str(variant),
            Segment::Unknown => text.push('?'),
            _ => text.push_str("<key>"),
        }
    }
    if text.is_empty() {
        text.push('.');
    }
    text
}

impl fmt::Debug for TaskContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskContext")
            .field("id", &self.id)
            .field("keyword", &self.keyword)
            .field("biz_id", &self.biz_id)
            .field("tenant", &self.tenant)
            .field("attempt", &self.attempt)
            .field("payload", &format_args!("<{} bytes>", self.payload.len()))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(payload: &str) -> TaskContext {
        TaskContext {
            id: 1,
            keyword: "k".into(),
            biz_id: "b".into(),
            tenant: None,
            attempt: 1,
            payload: payload.into(),
            cancelled: Arc::default(),
        }
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct Order {
        user: User,
        items: Vec<Item>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    struct User {
        id: i64,
        #[serde(default)]
        points: std::collections::HashMap<String, i64>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[allow(dead_code)]
    enum Item {
        Book,
    }

    #[test]
    fn a_mismatch_names_its_class_and_path_but_no_value() {
        let secret = "alice@example.com";
        for (payload, expected) in [
            (
                format!(r#"{{"user": {{"id": "{secret}"}}, "items": []}}"#),
                "data error at user.id",
            ),
            (
                format!(r#"{{"user": {{"id": 1}}, "items": ["{secret}"]}}"#),
                "data error at items[0]",
            ),
            (r#"{"items": []}"#.to_owned(), "missing field `user` at ."),
            // A map's key is the payload's data.
            (
                format!(r#"{{"user": {{"id": 1, "points": {{"{secret}": "x"}}}}, "items": []}}"#),
                "data error at user.points.<key>",
            ),
            (
                format!(r#"{{"user": {{"id": 1}}, "items": [], "{secret}"#),
                "unexpected end at",
            ),
        ] {
            let message = context(&payload)
                .payload::<Order>()
                .unwrap_err()
                .to_string();
            assert!(message.contains(expected), "{message}");
            assert!(!message.contains(secret), "{message}");
        }
    }

    #[test]
    fn debug_leaves_the_payload_out() {
        let shown = format!("{:?}", context(r#"{"card": "4242"}"#));
        assert!(!shown.contains("4242"), "{shown}");
        assert!(shown.contains("<16 bytes>"), "{shown}");
    }
}

//! What `domain set` changes in a domain's row, and its checks on its own.

use std::collections::HashSet;
use std::time::Duration;

use super::view::DomainSetting;
use super::{check_queue_and_timeout, validate_name, DomainMode, DEFAULT_DOMAIN};
use crate::error::{Error, Result};
use crate::task::validate_keyword;

/// The most threads a node may have (the worker refuses more), hence the largest n of
/// `MAX n` or `RESERVED n`.
const MAX_NODE_THREADS: usize = 1024;

/// What [`set`](super::admin::set) changes in a domain's row; a field left out keeps its value (for a domain
/// the nodes are configured with, their configuration).
///
/// `default` takes none of these: it is always `MAX`, owns the threads no `RESERVED` domain
/// holds and lists every keyword no other domain lists, and its queue and timeout are each
/// node's own (`--queue`, `--task-timeout`). It can be paused and resumed.
///
/// ```
/// use std::time::Duration;
/// use outbox::domain::admin::DomainChange;
///
/// let change = DomainChange::default()
///     .keywords(["payment.capture", "payment.refund"])
///     .reserved(4)
///     .queue(16)
///     .timeout(Duration::from_secs(30));
/// assert!(change.validate("payments").is_ok());
/// assert!(change.validate("default").is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DomainChange {
    /// Its keywords (at least one), taken from `default` if it had them.
    pub keywords: Option<Vec<String>>,
    /// `MAX n` (n at least 1) or `RESERVED n`.
    pub mode: Option<(DomainMode, usize)>,
    /// Claimed tasks that may wait for one of its threads, at most [`super::MAX_DOMAIN_QUEUE`].
    pub queue: Option<usize>,
    /// How long one of its handlers may run, 100 ms to 100 years.
    pub timeout: Option<Duration>,
}

impl DomainChange {
    /// Sets its keywords.
    pub fn keywords<K: Into<String>>(mut self, keywords: impl IntoIterator<Item = K>) -> Self {
        self.keywords = Some(keywords.into_iter().map(Into::into).collect());
        self
    }

    /// Makes it `MAX n`.
    pub fn max(mut self, n: usize) -> Self {
        self.mode = Some((DomainMode::Max, n));
        self
    }

    /// Makes it `RESERVED n`.
    pub fn reserved(mut self, n: usize) -> Self {
        self.mode = Some((DomainMode::Reserved, n));
        self
    }

    /// Sets its queue bound.
    pub fn queue(mut self, queue: usize) -> Self {
        self.queue = Some(queue);
        self
    }

    /// Sets its handlers' timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Checks the change on its own, as [`set`](super::admin::set) does before reading anything: the name, the
    /// rules of `default`, the keywords, n, the queue and the timeout. The error names the
    /// domain ([`Error::InvalidDomain`]; [`Error::InvalidKeyword`] for a bad keyword).
    pub fn validate(&self, name: &str) -> Result<()> {
        validate_name(name)?;
        let invalid = |reason: String| Error::InvalidDomain {
            domain: name.to_owned(),
            reason,
        };
        if *self == DomainChange::default() {
            return Err(invalid(
                "nothing to set: give keywords, MAX or RESERVED n, a queue or a timeout".into(),
            ));
        }
        if name == DEFAULT_DOMAIN {
            return Err(invalid(
                if self.keywords.is_some() {
                    "is the domain of every keyword no other domain lists: it cannot list keywords"
                } else if self.mode.is_some() {
                    "is always MAX and has the threads no RESERVED domain holds: it takes no mode"
                } else {
                    "takes its queue and timeout from each node's own configuration (--queue, \
                     --task-timeout): it can only be paused and resumed"
                }
                .into(),
            ));
        }
        if let Some(keywords) = &self.keywords {
            if keywords.is_empty() {
                return Err(invalid("must list at least one keyword".into()));
            }
            let mut seen = HashSet::new();
            for keyword in keywords {
                validate_keyword(keyword)?;
                if !seen.insert(keyword) {
                    return Err(invalid(format!("lists keyword {keyword:?} twice")));
                }
            }
        }
        match self.mode {
            Some((DomainMode::Max, 0)) => return Err(invalid("MAX must be at least 1".into())),
            Some((mode, n)) if n > MAX_NODE_THREADS => {
                return Err(invalid(format!(
                    "{} {n} is over the {MAX_NODE_THREADS} threads a node may have",
                    mode.as_str().to_uppercase()
                )))
            }
            _ => {}
        }
        check_queue_and_timeout(self.queue, self.timeout).map_err(invalid)
    }

    /// The change in words (`keywords a, b; RESERVED 4; queue 16; timeout 30s`).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(keywords) = &self.keywords {
            parts.push(format!("keywords {}", keywords.join(", ")));
        }
        if let Some((mode, n)) = self.mode {
            parts.push(format!("{} {n}", mode.as_str().to_uppercase()));
        }
        if let Some(queue) = self.queue {
            parts.push(format!("queue {queue}"));
        }
        if let Some(timeout) = self.timeout {
            parts.push(format!("timeout {}", humantime::format_duration(timeout)));
        }
        parts.join("; ")
    }

    /// The change as a JSON object, for the audit.
    pub(crate) fn detail(&self) -> serde_json::Value {
        let mut detail = serde_json::Map::new();
        if let Some(keywords) = &self.keywords {
            detail.insert("keywords".into(), keywords.clone().into());
        }
        if let Some((mode, n)) = self.mode {
            detail.insert("mode".into(), mode.as_str().into());
            detail.insert("threads".into(), n.into());
        }
        if let Some(queue) = self.queue {
            detail.insert("queue".into(), queue.into());
        }
        if let Some(timeout) = self.timeout {
            detail.insert("timeout_ms".into(), timeout_ms(timeout).into());
        }
        serde_json::Value::Object(detail)
    }

    /// `setting` with this change applied.
    pub(crate) fn apply(&self, setting: &DomainSetting) -> DomainSetting {
        let mut next = setting.clone();
        if let Some(keywords) = &self.keywords {
            next.keywords = Some(keywords.clone());
        }
        if let Some((mode, n)) = self.mode {
            next.mode = Some(mode);
            next.threads = Some(n);
        }
        next.queue = self.queue.or(next.queue);
        next.timeout_ms = self.timeout.map(timeout_ms).or(next.timeout_ms);
        next
    }
}

fn timeout_ms(timeout: Duration) -> u64 {
    u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::MAX_DOMAIN_QUEUE;

    fn refused(change: &DomainChange, name: &str) -> String {
        change.validate(name).unwrap_err().to_string()
    }

    #[test]
    fn a_change_is_checked_on_its_own() {
        let ok = DomainChange::default().keywords(["a.b"]).reserved(0);
        assert!(
            ok.validate("payments").is_ok(),
            "RESERVED 0 keeps nothing: allowed"
        );
        for (change, name, why) in [
            (DomainChange::default(), "payments", "nothing to set"),
            (DomainChange::default().max(1), "Pay", "only a-z"),
            (
                DomainChange::default().keywords(["a"]),
                "default",
                "cannot list keywords",
            ),
            (
                DomainChange::default().reserved(1),
                "default",
                "takes no mode",
            ),
            (
                DomainChange::default().timeout(Duration::from_secs(1)),
                "default",
                "paused",
            ),
            (
                DomainChange::default().keywords(Vec::<String>::new()),
                "p",
                "at least one keyword",
            ),
            (
                DomainChange::default().keywords(["a", "a"]),
                "p",
                "lists keyword \"a\" twice",
            ),
            (
                DomainChange::default().keywords(["A"]),
                "p",
                "invalid keyword \"A\"",
            ),
            (
                DomainChange::default().max(0),
                "p",
                "MAX must be at least 1",
            ),
            (
                DomainChange::default().reserved(1025),
                "p",
                "RESERVED 1025 is over the 1024",
            ),
            (
                DomainChange::default().queue(MAX_DOMAIN_QUEUE + 1),
                "p",
                "queue must be at most",
            ),
            (
                DomainChange::default().timeout(Duration::from_millis(99)),
                "p",
                "timeout must be",
            ),
        ] {
            let err = refused(&change, name);
            assert!(err.contains(why), "{change:?} on {name}: {err}");
        }
    }

    #[test]
    fn applying_a_change_keeps_what_it_leaves_out() {
        let mut row = DomainSetting::empty("p");
        row.queue = Some(4);
        row.paused = true;
        let next = DomainChange::default()
            .keywords(["a"])
            .max(2)
            .timeout(Duration::from_secs(2))
            .apply(&row);
        assert_eq!(next.keywords, Some(vec!["a".to_owned()]));
        assert_eq!((next.mode, next.threads), (Some(DomainMode::Max), Some(2)));
        assert_eq!(
            (next.queue, next.timeout_ms, next.paused),
            (Some(4), Some(2000), true)
        );
        assert_eq!(
            DomainChange::default().queue(3).reserved(1).describe(),
            "RESERVED 1; queue 3"
        );
    }
}

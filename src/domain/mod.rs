//! Task domains: named sets of keywords, each with its share of a node's one execution pool
//! (seed 004's TaskDomain).
//!
//! A domain is `MAX n` (at most n of the node's threads run its tasks at once) or
//! `RESERVED n` (n threads kept for it even when idle; when they are busy it borrows free
//! threads of `default` and gives them back as its tasks end). Keywords no domain lists
//! belong to [`DEFAULT_DOMAIN`], which owns the threads no `RESERVED` domain holds; `MAX`
//! domains and borrowing run on those threads too.
//!
//! A node is configured with [`crate::WorkerConfig::domain`] (or `outbox run --domains FILE`
//! / `--domain`); `async_domain` and `async_pause` rows, read at each heartbeat, override that
//! configuration at run time; operators write them with [`admin`] (`outbox domain set`,
//! `outbox pause`).

pub mod admin;
mod census;
mod change;
mod file;
mod view;

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use file::{parse_domain_flag, parse_domains_file, parse_domains_toml};

use crate::error::{Error, Result};
use crate::task::{validate_keyword, MAX_TASK_TIMEOUT};

/// The domain that owns every keyword no other domain lists.
pub const DEFAULT_DOMAIN: &str = "default";

/// The most tasks a domain's queue may hold.
pub const MAX_DOMAIN_QUEUE: usize = 100_000;

/// How a domain holds threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainMode {
    /// At most `threads` of the node's shared threads at once.
    Max,
    /// `threads` kept for the domain; more borrowed from `default` while they are free.
    Reserved,
}

impl DomainMode {
    /// `max` or `reserved`.
    pub fn as_str(self) -> &'static str {
        match self {
            DomainMode::Max => "max",
            DomainMode::Reserved => "reserved",
        }
    }
}

impl std::fmt::Display for DomainMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One domain of a node.
///
/// ```
/// use std::time::Duration;
/// use outbox::domain::{Domain, DomainMode};
///
/// let payments = Domain::reserved("payments", ["payment.capture"], 4)
///     .queue(16)
///     .timeout(Duration::from_secs(30));
/// assert_eq!(payments.mode, DomainMode::Reserved);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Domain {
    /// Its name (the rules of a keyword; not `default`).
    pub name: String,
    /// The keywords whose tasks it runs.
    pub keywords: Vec<String>,
    /// How it holds threads.
    pub mode: DomainMode,
    /// `MAX`: the most it runs at once (at least 1); `RESERVED`: the threads kept for it.
    pub threads: usize,
    /// Claimed tasks that may wait for one of its threads (default: 8 per thread it can run
    /// on, as the node's queue — `MAX n`: n; `RESERVED n`: n and `default`'s threads; at
    /// most [`MAX_DOMAIN_QUEUE`]; none under lock claims).
    pub queue: Option<usize>,
    /// How long one of its handlers may run before the watchdog cancels its database work
    /// and charges the task a failure (default: the worker's task timeout).
    pub timeout: Option<Duration>,
}

impl Domain {
    fn new<K: Into<String>>(
        name: &str,
        keywords: impl IntoIterator<Item = K>,
        mode: DomainMode,
        threads: usize,
    ) -> Domain {
        Domain {
            name: name.to_owned(),
            keywords: keywords.into_iter().map(Into::into).collect(),
            mode,
            threads,
            queue: None,
            timeout: None,
        }
    }

    /// A `MAX n` domain.
    pub fn max<K: Into<String>>(
        name: &str,
        keywords: impl IntoIterator<Item = K>,
        n: usize,
    ) -> Domain {
        Domain::new(name, keywords, DomainMode::Max, n)
    }

    /// A `RESERVED n` domain.
    pub fn reserved<K: Into<String>>(
        name: &str,
        keywords: impl IntoIterator<Item = K>,
        n: usize,
    ) -> Domain {
        Domain::new(name, keywords, DomainMode::Reserved, n)
    }

    /// Sets its queue bound.
    pub fn queue(mut self, queue: usize) -> Domain {
        self.queue = Some(queue);
        self
    }

    /// Sets its handlers' timeout.
    pub fn timeout(mut self, timeout: Duration) -> Domain {
        self.timeout = Some(timeout);
        self
    }
}

/// Checks a domain's or keyword's name against the keyword rules, naming it otherwise.
pub fn validate_name(name: &str) -> Result<()> {
    validate_keyword(name).map_err(|e| match e {
        Error::InvalidKeyword { reason, .. } => invalid(name, reason.to_owned()),
        other => other,
    })
}

fn invalid(domain: &str, reason: String) -> Error {
    Error::InvalidDomain {
        domain: domain.to_owned(),
        reason,
    }
}

/// Checks one domain on its own: its name, keywords, threads, queue and timeout.
pub fn validate_domain(domain: &Domain) -> Result<()> {
    let name = domain.name.as_str();
    validate_name(name)?;
    if name == DEFAULT_DOMAIN {
        return Err(invalid(
            name,
            "is the domain of every keyword no other domain lists: it cannot list keywords".into(),
        ));
    }
    if domain.keywords.is_empty() {
        return Err(invalid(name, "must list at least one keyword".into()));
    }
    for keyword in &domain.keywords {
        validate_keyword(keyword)?;
    }
    if domain.mode == DomainMode::Max && domain.threads == 0 {
        return Err(invalid(name, "MAX must be at least 1".into()));
    }
    check_queue_and_timeout(domain.queue, domain.timeout).map_err(|reason| invalid(name, reason))
}

/// A domain's queue and timeout within their bounds (a configured domain's, or a change's);
/// the reason when not.
pub(crate) fn check_queue_and_timeout(
    queue: Option<usize>,
    timeout: Option<Duration>,
) -> std::result::Result<(), String> {
    if queue.is_some_and(|q| q > MAX_DOMAIN_QUEUE) {
        return Err(format!("queue must be at most {MAX_DOMAIN_QUEUE}"));
    }
    if timeout.is_some_and(|t| t < Duration::from_millis(100) || t > MAX_TASK_TIMEOUT) {
        return Err("timeout must be between 100ms and 100 years".into());
    }
    Ok(())
}

/// Checks a node's domains together against its `threads`: each valid, names unique, no
/// keyword in two domains, every `MAX` within the threads, and the `RESERVED` threads fewer
/// than the node's, so that `default` keeps at least one. The error names the domain at
/// fault.
pub fn validate_domains(domains: &[Domain], threads: usize) -> Result<()> {
    let mut owner: HashMap<&str, &str> = HashMap::new();
    let mut reserved = 0usize;
    for (i, domain) in domains.iter().enumerate() {
        validate_domain(domain)?;
        if domains[..i].iter().any(|d| d.name == domain.name) {
            return Err(invalid(&domain.name, "is configured twice".into()));
        }
        for keyword in &domain.keywords {
            if let Some(other) = owner.insert(keyword, &domain.name) {
                return Err(invalid(
                    &domain.name,
                    format!("lists keyword {keyword:?}, which domain {other:?} lists too"),
                ));
            }
        }
        match domain.mode {
            DomainMode::Max if domain.threads > threads => {
                return Err(invalid(
                    &domain.name,
                    format!(
                        "MAX {} is over the node's {threads} threads",
                        domain.threads
                    ),
                ));
            }
            DomainMode::Max => {}
            DomainMode::Reserved => {
                reserved += domain.threads;
                if reserved >= threads {
                    return Err(invalid(
                        &domain.name,
                        format!(
                            "brings the RESERVED threads to {reserved} of the node's {threads}: \
                             {DEFAULT_DOMAIN} must keep at least one"
                        ),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// What a node publishes in `async_node.domains` at each heartbeat: its threads and each
/// domain's configuration and slot use, `default` first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeDomains {
    /// The node's execution threads.
    pub threads: usize,
    /// One entry per domain.
    pub domains: Vec<DomainUse>,
}

/// A domain's configuration and slot use on one node (or, in `outbox stats`, summed over the
/// live nodes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct DomainUse {
    /// The domain.
    pub domain: String,
    /// `max` or `reserved`.
    pub mode: String,
    /// Its keywords that the node registers, paused or not (for `default`, the registered
    /// keywords no other domain lists).
    pub keywords: Vec<String>,
    /// `MAX`: its limit; `RESERVED`: its reserved threads; `default`: the threads no
    /// `RESERVED` domain holds.
    pub threads: usize,
    /// Threads kept for it (`RESERVED` only, 0 once released).
    pub reserved: usize,
    /// Threads of `default` it runs on now beyond its reserved ones.
    pub borrowed: usize,
    /// Its handlers running now (stuck ones included).
    pub running: usize,
    /// Its claimed tasks waiting for a thread.
    pub queued: usize,
    /// Its handlers past their timeout that have not returned: their slots are not reused.
    pub stuck: usize,
    /// Its queue bound.
    pub queue: usize,
    /// Its handlers' timeout in milliseconds.
    pub timeout_ms: u64,
    /// Whether it is paused (nothing claimed for it).
    pub paused: bool,
    /// Whether its reserved threads were force-released.
    pub released: bool,
}

//! The rows of `async_domain` as a node reads them: merged over its configured domains, the
//! keywords paused or released domains hold, the rows of a fleet's shared pool, and the last
//! good rows with the pauses of now (see [`super::domains`]).

use std::time::Duration;

use crate::domain::{Domain, DomainMode, DEFAULT_DOMAIN};
use crate::driver::DomainRow;
use crate::error::{Error, Result};

/// `default`'s overrides from its row.
#[derive(Debug, Default)]
pub(super) struct DefaultRow {
    pub(super) queue: Option<usize>,
    pub(super) timeout: Option<Duration>,
    pub(super) paused: bool,
}

/// A domain as configured and overridden, with its row's flags.
#[derive(Debug)]
pub(super) struct Merged {
    pub(super) domain: Domain,
    pub(super) paused: bool,
    pub(super) released: bool,
}

/// The configured domains with each row's non-NULL fields over them; a row naming a domain
/// not configured here adds it when it sets keywords, mode and threads.
pub(super) fn merge(
    configured: &[Domain],
    rows: &[DomainRow],
) -> Result<(DefaultRow, Vec<Merged>)> {
    let mut default = DefaultRow::default();
    let mut merged: Vec<Merged> = configured
        .iter()
        .map(|d| Merged {
            domain: d.clone(),
            paused: false,
            released: false,
        })
        .collect();
    for row in rows {
        let bad = |reason: String| Error::InvalidDomain {
            domain: row.name.clone(),
            reason: format!("its async_domain row {reason}"),
        };
        let queue = row.queue.map(|q| usize::try_from(q).unwrap_or(0));
        let timeout = row
            .timeout_ms
            .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)));
        if row.name == DEFAULT_DOMAIN {
            default = DefaultRow {
                queue,
                timeout,
                paused: row.paused,
            };
            continue;
        }
        let keywords = row
            .keywords
            .as_deref()
            .map(serde_json::from_str::<Vec<String>>)
            .transpose()
            .map_err(|e| bad(format!("has keywords that are not a JSON array: {e}")))?;
        let mode = match row.mode.as_deref() {
            None => None,
            Some("max") => Some(DomainMode::Max),
            Some("reserved") => Some(DomainMode::Reserved),
            Some(other) => return Err(bad(format!("has an unknown mode {other:?}"))),
        };
        let threads = row.threads.map(|t| usize::try_from(t).unwrap_or(0));
        let entry = match merged.iter().position(|m| m.domain.name == row.name) {
            Some(i) => &mut merged[i],
            None => match (&keywords, mode, threads) {
                (Some(k), Some(m), Some(t)) => {
                    merged.push(Merged {
                        domain: Domain {
                            name: row.name.clone(),
                            keywords: k.clone(),
                            mode: m,
                            threads: t,
                            queue: None,
                            timeout: None,
                        },
                        paused: false,
                        released: false,
                    });
                    merged.last_mut().expect("pushed")
                }
                // A pause or release of a domain this node does not have.
                _ => continue,
            },
        };
        let d = &mut entry.domain;
        d.keywords = keywords.unwrap_or_else(|| d.keywords.clone());
        d.mode = mode.unwrap_or(d.mode);
        d.threads = threads.unwrap_or(d.threads);
        d.queue = queue.or(d.queue);
        d.timeout = timeout.or(d.timeout);
        entry.paused = row.paused;
        entry.released = row.released;
    }
    Ok((default, merged))
}

/// The rows `good` with the pauses of `now`: each row's `paused` and `released` as the
/// table has them now (none for a row gone), and each row of now that `good` lacks (a pause
/// of `default`, of a configured domain) by its pauses alone, its settings left to the
/// node's.
pub(super) fn paused_as_now(good: &[DomainRow], now: &[DomainRow]) -> Vec<DomainRow> {
    let mut rows: Vec<DomainRow> = good
        .iter()
        .map(|g| {
            let cur = now.iter().find(|r| r.name == g.name);
            DomainRow {
                paused: cur.is_some_and(|r| r.paused),
                released: cur.is_some_and(|r| r.released),
                ..g.clone()
            }
        })
        .collect();
    rows.extend(
        now.iter()
            .filter(|r| !good.iter().any(|g| g.name == r.name))
            .map(|r| DomainRow {
                keywords: None,
                mode: None,
                threads: None,
                queue: None,
                timeout_ms: None,
                ..r.clone()
            }),
    );
    rows
}

/// The keywords the paused or released domains of `rows` hold on every node (see
/// [`crate::domain::admin::DomainSetting::held_keywords`]); a row whose list is unreadable
/// holds none, as its domain's other fields it cannot read are left to the node.
pub(super) fn held_keywords(rows: &[DomainRow]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.name != DEFAULT_DOMAIN && (r.paused || r.released))
        .filter_map(|r| {
            serde_json::from_str::<Vec<String>>(r.held_keywords.as_deref()?)
                .map_err(|e| {
                    log::warn!(
                        "async_domain row {:?}: held_keywords are not a JSON array of \
                         strings ({e}); ignored",
                        r.name
                    );
                })
                .ok()
        })
        .flatten()
        .collect()
}

/// What a database of a fleet takes from its `async_domain` rows: `default`'s pause only.
pub(super) fn shared_pool_rows(rows: &[DomainRow]) -> Vec<DomainRow> {
    let mut kept = Vec::new();
    for row in rows {
        if row.name == DEFAULT_DOMAIN {
            kept.push(DomainRow {
                queue: None,
                timeout_ms: None,
                ..row.clone()
            });
        } else {
            log::warn!(
                "domain {:?} of async_domain ignored: a worker serving several databases has \
                 no domains",
                row.name
            );
        }
    }
    kept
}

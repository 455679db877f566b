//! What operators set for a domain (its row of `async_domain`) and what `domain list` and
//! `stats` show of it: its configuration as the rows override the nodes', and its slot use
//! summed over the live nodes.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::census::Census;
use super::{DomainMode, DEFAULT_DOMAIN};
use crate::driver::DomainRow;

/// A row of `async_domain`: what operators set for a domain. `None` leaves a field to each
/// node's own configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DomainSetting {
    /// The domain.
    pub name: String,
    /// Its keywords.
    pub keywords: Option<Vec<String>>,
    /// How it holds threads.
    pub mode: Option<DomainMode>,
    /// The n of `MAX n` or `RESERVED n`.
    pub threads: Option<usize>,
    /// Its queue bound.
    pub queue: Option<usize>,
    /// Its handlers' timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Nothing is claimed for it; its running tasks finish.
    pub paused: bool,
    /// Force-released: paused, and its reserved threads given to `default`.
    pub released: bool,
    /// While it is paused or released, the keywords it holds on every node: none of them is
    /// claimed anywhere, also by a node that does not run this domain (which would
    /// otherwise run them under `default`). Recorded by the pause from its keywords as this
    /// row and the live nodes know them; `None` while it is not paused.
    pub held_keywords: Option<Vec<String>>,
    /// 1 when the row was created, one more at each change.
    pub version: i64,
    /// When the row last changed, by the database clock (UTC, `YYYY-MM-DD HH:MM:SS.SSS`).
    pub updated_at: String,
    /// Who changed it (`$USER@host` from the CLI).
    pub updated_by: String,
}

impl DomainSetting {
    /// A row not written yet: every field left to the nodes.
    pub(crate) fn empty(name: &str) -> DomainSetting {
        DomainSetting {
            name: name.to_owned(),
            keywords: None,
            mode: None,
            threads: None,
            queue: None,
            timeout_ms: None,
            paused: false,
            released: false,
            held_keywords: None,
            version: 0,
            updated_at: String::new(),
            updated_by: String::new(),
        }
    }

    /// Whether the row defines the domain on its own (keywords, mode and threads), as a
    /// domain that no node is configured with needs.
    pub(crate) fn is_complete(&self) -> bool {
        self.keywords.is_some() && self.mode.is_some() && self.threads.is_some()
    }

    /// Whether the two rows set the same thing (the bookkeeping aside).
    pub(crate) fn same_as(&self, other: &DomainSetting) -> bool {
        (
            &self.keywords,
            self.mode,
            self.threads,
            self.queue,
            self.timeout_ms,
            self.paused,
            self.released,
            &self.held_keywords,
        ) == (
            &other.keywords,
            other.mode,
            other.threads,
            other.queue,
            other.timeout_ms,
            other.paused,
            other.released,
            &other.held_keywords,
        )
    }
}

impl From<DomainRow> for DomainSetting {
    fn from(row: DomainRow) -> Self {
        // The schema checks mode and the numbers; keywords are the fields plain SQL could
        // have set to something unreadable: such a row is taken as leaving them to the nodes
        // (holding none).
        let list = |json: Option<&str>, column: &str| {
            json.and_then(|json| match serde_json::from_str::<Vec<String>>(json) {
                Ok(keywords) => Some(keywords),
                Err(e) => {
                    log::warn!(
                        "async_domain row {:?}: {column} are not a JSON array of strings \
                         ({e}); ignored",
                        row.name
                    );
                    None
                }
            })
        };
        let keywords = list(row.keywords.as_deref(), "keywords");
        let held_keywords = list(row.held_keywords.as_deref(), "held_keywords");
        DomainSetting {
            mode: row.mode.as_deref().and_then(parse_mode),
            threads: row.threads.and_then(|n| usize::try_from(n).ok()),
            queue: row.queue.and_then(|n| usize::try_from(n).ok()),
            timeout_ms: row.timeout_ms.and_then(|n| u64::try_from(n).ok()),
            name: row.name,
            keywords,
            paused: row.paused,
            released: row.released,
            held_keywords,
            version: row.version,
            updated_at: row.updated_at,
            updated_by: row.updated_by,
        }
    }
}

pub(crate) fn parse_mode(mode: &str) -> Option<DomainMode> {
    match mode {
        "max" => Some(DomainMode::Max),
        "reserved" => Some(DomainMode::Reserved),
        _ => None,
    }
}

/// One domain across the fleet: its configuration as `async_domain` overrides the nodes'
/// own, and its slot use summed over the live nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct DomainView {
    /// The domain.
    pub domain: String,
    /// How it holds threads (`None`: only a row that does not say, on no live node).
    pub mode: Option<DomainMode>,
    /// The n of `MAX n` or `RESERVED n`, per node (`None` for `default`, which has the
    /// threads no `RESERVED` domain holds).
    pub per_node: Option<usize>,
    /// Its keywords (for `default`, the registered keywords no other domain lists).
    pub keywords: Vec<String>,
    /// Its queue bound per node.
    pub queue: Option<usize>,
    /// Its handlers' timeout in milliseconds.
    pub timeout_ms: Option<u64>,
    /// Nothing is claimed for it (as its row says; without a row, as a node says).
    pub paused: bool,
    /// Its reserved threads are force-released to `default` until it is resumed.
    pub released: bool,
    /// The live nodes that run it.
    pub nodes: usize,
    /// Threads it has, summed over those nodes (see [`super::DomainUse::threads`]).
    pub threads: usize,
    /// Threads kept for it, summed.
    pub reserved: usize,
    /// Threads of `default` it runs on now beyond its reserved ones, summed.
    pub borrowed: usize,
    /// Its handlers running now (stuck ones included), summed.
    pub running: usize,
    /// Its claimed tasks waiting for a thread, summed.
    pub queued: usize,
    /// Its handlers past their timeout that have not returned, summed.
    pub stuck: usize,
    /// Its row of `async_domain`, if it has one.
    pub setting: Option<DomainSetting>,
}

impl DomainView {
    fn new(domain: &str) -> DomainView {
        DomainView {
            domain: domain.to_owned(),
            mode: None,
            per_node: None,
            keywords: Vec::new(),
            queue: None,
            timeout_ms: None,
            paused: false,
            released: false,
            nodes: 0,
            threads: 0,
            reserved: 0,
            borrowed: 0,
            running: 0,
            queued: 0,
            stuck: 0,
            setting: None,
        }
    }
}

/// Every domain of `census`, `default` first, then by name: see [`DomainView`].
pub(crate) fn views(census: &Census) -> Vec<DomainView> {
    let mut views: BTreeMap<&str, DomainView> = BTreeMap::new();
    let mut node_keywords: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for node in &census.nodes {
        for used in &node.published.domains {
            let view = views
                .entry(&used.domain)
                .or_insert_with(|| DomainView::new(&used.domain));
            if view.nodes == 0 {
                // The first node's configuration, by node id; the table overrides it below.
                view.mode = parse_mode(&used.mode);
                view.per_node = (used.domain != DEFAULT_DOMAIN).then_some(used.threads);
                view.queue = Some(used.queue);
                view.timeout_ms = Some(used.timeout_ms);
            }
            view.nodes += 1;
            view.threads += used.threads;
            view.reserved += used.reserved;
            view.borrowed += used.borrowed;
            view.running += used.running;
            view.queued += used.queued;
            view.stuck += used.stuck;
            view.paused |= used.paused;
            view.released |= used.released;
            node_keywords
                .entry(&used.domain)
                .or_default()
                .extend(used.keywords.iter().map(String::as_str));
        }
    }
    // A keyword a row lists belongs to that row's domain, wherever nodes still have it.
    let taken: BTreeSet<&str> = census
        .settings
        .iter()
        .filter_map(|s| s.keywords.as_ref())
        .flatten()
        .map(String::as_str)
        .collect();
    for (domain, keywords) in &node_keywords {
        let view = views.get_mut(domain).expect("made above");
        view.keywords = keywords
            .iter()
            .filter(|k| !taken.contains(*k))
            .map(|k| (*k).to_owned())
            .collect();
    }
    for setting in &census.settings {
        let view = views
            .entry(&setting.name)
            .or_insert_with(|| DomainView::new(&setting.name));
        if let Some(keywords) = &setting.keywords {
            view.keywords = keywords.clone();
            view.keywords.sort();
        }
        view.mode = setting.mode.or(view.mode);
        view.per_node = setting.threads.or(view.per_node);
        view.queue = setting.queue.or(view.queue);
        view.timeout_ms = setting.timeout_ms.or(view.timeout_ms);
        view.paused = setting.paused;
        view.released = setting.released;
        view.setting = Some(setting.clone());
    }
    let mut views: Vec<DomainView> = views.into_values().collect();
    // BTreeMap order is by name; `default` goes first, and is always MAX.
    if let Some(i) = views.iter().position(|v| v.domain == DEFAULT_DOMAIN) {
        let mut default = views.remove(i);
        default.mode = Some(DomainMode::Max);
        views.insert(0, default);
    }
    views
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::census::LiveNode;
    use crate::domain::{DomainUse, NodeDomains};

    fn used(
        domain: &str,
        mode: &str,
        keywords: &[&str],
        threads: usize,
        running: usize,
    ) -> DomainUse {
        DomainUse {
            domain: domain.to_owned(),
            mode: mode.to_owned(),
            keywords: keywords.iter().map(|k| (*k).to_owned()).collect(),
            threads,
            running,
            queue: 8,
            timeout_ms: 1000,
            ..DomainUse::default()
        }
    }

    fn node(id: i64, threads: usize, domains: Vec<DomainUse>) -> LiveNode {
        LiveNode {
            id,
            name: format!("w{id}"),
            published: NodeDomains { threads, domains },
        }
    }

    #[test]
    fn rows_override_the_nodes_and_use_is_summed() {
        let mut row = DomainSetting::empty("payments");
        row.keywords = Some(vec!["pay.b".into(), "pay.a".into()]);
        row.threads = Some(3);
        row.paused = true;
        let mut added = DomainSetting::empty("reports");
        added.keywords = Some(vec!["report".into()]);
        added.mode = Some(DomainMode::Max);
        added.threads = Some(1);
        let census = Census {
            settings: vec![row, added],
            paused_keywords: Vec::new(),
            nodes: vec![
                node(
                    1,
                    4,
                    vec![
                        used("default", "max", &["mail", "pay.a", "report"], 2, 1),
                        used("payments", "reserved", &["pay.b"], 2, 2),
                    ],
                ),
                node(
                    2,
                    8,
                    vec![
                        used("default", "max", &["mail"], 6, 4),
                        used("payments", "reserved", &["pay.b"], 2, 1),
                    ],
                ),
            ],
        };
        let views = views(&census);
        let names: Vec<&str> = views.iter().map(|v| v.domain.as_str()).collect();
        assert_eq!(names, ["default", "payments", "reports"]);
        let [default, payments, reports] = &views[..] else {
            unreachable!()
        };
        // Keywords a row lists leave default, whatever the nodes still publish.
        assert_eq!(default.keywords, ["mail"]);
        assert_eq!(
            (default.mode, default.per_node),
            (Some(DomainMode::Max), None)
        );
        assert_eq!((default.threads, default.running, default.nodes), (8, 5, 2));
        assert_eq!(payments.keywords, ["pay.a", "pay.b"]);
        assert_eq!(
            (payments.mode, payments.per_node),
            (Some(DomainMode::Reserved), Some(3))
        );
        assert_eq!(
            (payments.threads, payments.running, payments.paused),
            (4, 3, true)
        );
        assert_eq!(
            (reports.nodes, reports.per_node, reports.queue),
            (0, Some(1), None)
        );
        assert!(reports.setting.is_some() && default.setting.is_none());
    }
}

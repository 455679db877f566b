//! The census of domains: what the nodes and the tables say about them, read in one place
//! (the rows of `async_domain`, the keywords paused on their own, and what each live node
//! published at its last heartbeat), and the checks an operator's change must pass against
//! them. (A [`crate::Fleet`] is something else: one process serving several databases.)

use std::collections::BTreeSet;
use std::time::Duration;

use super::view::{parse_mode, DomainSetting};
use super::{validate_domains, Domain, NodeDomains, DEFAULT_DOMAIN};
use crate::db::DbConnection;
use crate::driver::{domain_rows, keyword_paused, node_domains};
use crate::error::{Error, OpContext, Result};

/// How recent a node's heartbeat must be for `domain list`, `stats` and the checks of a
/// change to count it as live: 60 seconds, four times the default time after which a silent
/// node is dead (3 heartbeats of 5 s). A node whose heartbeat is older is left out, as are
/// nodes that have published nothing yet.
pub const LIVE_WITHIN: Duration = Duration::from_secs(60);

/// A live node that published its domains.
pub(crate) struct LiveNode {
    pub(crate) id: i64,
    pub(crate) name: String,
    pub(crate) published: NodeDomains,
}

/// The rows, paused keywords and live nodes, as read together.
pub(crate) struct Census {
    pub(crate) settings: Vec<DomainSetting>,
    pub(crate) paused_keywords: Vec<String>,
    pub(crate) nodes: Vec<LiveNode>,
}

impl Census {
    pub(crate) fn read(conn: &mut DbConnection) -> Result<Census> {
        let settings = domain_rows(conn)
            .op("domain list")?
            .into_iter()
            .map(DomainSetting::from)
            .collect();
        let paused_keywords = keyword_paused(conn).op("keyword pause list")?;
        let within = i64::try_from(LIVE_WITHIN.as_millis()).unwrap_or(i64::MAX);
        let nodes = node_domains(conn, within)
            .op("node list")?
            .into_iter()
            .filter_map(|row| {
                // NULL before a node's first heartbeat; a node of an older build publishes
                // no domains.
                let published = serde_json::from_str(row.domains.as_deref()?)
                    .map_err(|e| log::debug!("node {}: no domains published ({e})", row.id))
                    .ok()?;
                Some(LiveNode {
                    id: row.id,
                    name: row.name,
                    published,
                })
            })
            .collect();
        Ok(Census {
            settings,
            paused_keywords,
            nodes,
        })
    }

    pub(crate) fn setting(&self, name: &str) -> Option<&DomainSetting> {
        self.settings.iter().find(|s| s.name == name)
    }

    /// The live nodes that run the domain `name`.
    pub(crate) fn nodes_with(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .filter(|n| n.published.domains.iter().any(|d| d.domain == name))
            .count()
    }

    /// The live nodes that apply the row `setting` once they read it: those that run its
    /// domain now, or every one when the row defines it (a node not configured with it adds
    /// it) or holds keywords (every node holds them).
    pub(crate) fn nodes_applying(&self, setting: &DomainSetting) -> usize {
        if setting.is_complete() || setting.held_keywords.is_some() {
            self.nodes.len()
        } else {
            self.nodes_with(&setting.name)
        }
    }

    /// Sets the keywords that `setting`, a row about to be written, holds on every node: while
    /// its domain (not `default`, which every node has) is paused or released, the domain's
    /// keywords — the row's own when it sets them (every node that runs the domain runs
    /// those), else those the live nodes that run it publish, with those it held already (a
    /// node that ran it may be gone) — and none otherwise.
    pub(crate) fn hold(&self, setting: &mut DomainSetting) {
        if setting.name == DEFAULT_DOMAIN || !(setting.paused || setting.released) {
            setting.held_keywords = None;
            return;
        }
        let held: BTreeSet<String> = match &setting.keywords {
            Some(keywords) => keywords.iter().cloned().collect(),
            None => self
                .nodes
                .iter()
                .flat_map(|n| &n.published.domains)
                .filter(|d| d.domain == setting.name)
                .flat_map(|d| d.keywords.iter().cloned())
                .chain(setting.held_keywords.iter().flatten().cloned())
                .collect(),
        };
        setting.held_keywords = (!held.is_empty()).then(|| held.into_iter().collect());
    }

    /// Whether `name` is a domain: `default`, one with a row, or one a live node runs.
    pub(crate) fn is_domain(&self, name: &str) -> bool {
        name == DEFAULT_DOMAIN || self.setting(name).is_some() || self.nodes_with(name) > 0
    }

    /// Whether `keyword` is a keyword some live node serves or some row lists, or one paused.
    pub(crate) fn is_keyword(&self, keyword: &str) -> bool {
        let listed = |keywords: &[String]| keywords.iter().any(|k| k == keyword);
        self.nodes
            .iter()
            .flat_map(|n| &n.published.domains)
            .any(|d| listed(&d.keywords))
            || self
                .settings
                .iter()
                .any(|s| s.keywords.as_deref().is_some_and(listed))
            || listed(&self.paused_keywords)
    }

    /// The live nodes that serve `keyword`.
    pub(crate) fn nodes_serving(&self, keyword: &str) -> usize {
        self.nodes
            .iter()
            .filter(|n| {
                n.published
                    .domains
                    .iter()
                    .any(|d| d.keywords.iter().any(|k| k == keyword))
            })
            .count()
    }

    /// The domain other than `name` and `default` that lists `keyword` now, and where: its
    /// row when it has keywords there, else the live nodes that run it.
    fn keyword_owner(&self, keyword: &str, name: &str) -> Option<(String, String)> {
        for setting in &self.settings {
            if setting.name != name
                && setting.name != DEFAULT_DOMAIN
                && setting
                    .keywords
                    .as_ref()
                    .is_some_and(|k| k.iter().any(|k| k == keyword))
            {
                return Some((setting.name.clone(), "in async_domain".to_owned()));
            }
        }
        for node in &self.nodes {
            for used in &node.published.domains {
                let overridden = self.setting(&used.domain).and_then(|s| s.keywords.as_ref());
                if used.domain != name
                    && used.domain != DEFAULT_DOMAIN
                    && overridden.is_none()
                    && used.keywords.iter().any(|k| k == keyword)
                {
                    return Some((
                        used.domain.clone(),
                        format!("on node {} ({})", node.id, node.name),
                    ));
                }
            }
        }
        None
    }

    /// Refuses `keywords` for the domain `name` when another domain lists one of them.
    pub(crate) fn check_keywords_free(&self, name: &str, keywords: &[String]) -> Result<()> {
        for keyword in keywords {
            if let Some((other, place)) = self.keyword_owner(keyword, name) {
                return Err(Error::InvalidDomain {
                    domain: name.to_owned(),
                    reason: format!(
                        "keyword {keyword:?} belongs to domain {other:?} ({place}): \
                         a keyword is in one domain only; take it out of {other:?} first"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Checks the domain `name` as `proposed` would leave it on every live node: the node's
    /// domains as the rows override them, with `proposed` in place of `name`'s row, must pass
    /// [`validate_domains`] against the node's threads. An error names the domain and, in
    /// its reason, the node.
    ///
    /// A node whose domains fail without the change as well (one that started with fewer
    /// threads than the rows were checked against) refuses only changes of keywords or mode,
    /// which could make it worse; a change of queue or timeout alone passes.
    pub(crate) fn check_nodes(
        &self,
        proposed: &DomainSetting,
        touches_threads: bool,
    ) -> Result<()> {
        for node in &self.nodes {
            let threads = node.published.threads;
            let with = validate_domains(&self.node_config(node, Some(proposed)), threads);
            let Err(error) = with else { continue };
            let without = validate_domains(&self.node_config(node, None), threads);
            if without.is_err() && !touches_threads {
                log::warn!(
                    "node {} ({}): its domains do not fit its {threads} threads ({error}); \
                     the change of {:?} does not touch threads",
                    node.id,
                    node.name,
                    proposed.name
                );
                continue;
            }
            return Err(match error {
                Error::InvalidDomain { domain, reason } => Error::InvalidDomain {
                    domain,
                    reason: format!(
                        "on node {} ({}, {threads} threads): {reason}",
                        node.id, node.name
                    ),
                },
                other => other,
            });
        }
        Ok(())
    }

    /// A node's domains (not `default`) as it would run them with the rows applied, and
    /// `proposed` in place of its domain's row; that domain last, so that a check that fails
    /// because of it names it.
    fn node_config(&self, node: &LiveNode, proposed: Option<&DomainSetting>) -> Vec<Domain> {
        let changed = proposed.map(|p| p.name.as_str());
        let setting = |name: &str| -> Option<&DomainSetting> {
            match proposed {
                Some(p) if p.name == name => Some(p),
                _ => self.setting(name),
            }
        };
        let mut domains: Vec<Domain> = node
            .published
            .domains
            .iter()
            .filter(|u| u.domain != DEFAULT_DOMAIN)
            .filter_map(|u| {
                Some(Domain {
                    name: u.domain.clone(),
                    keywords: u.keywords.clone(),
                    mode: parse_mode(&u.mode)?,
                    threads: u.threads,
                    queue: None,
                    timeout: None,
                })
            })
            .collect();
        for domain in &mut domains {
            if let Some(s) = setting(&domain.name) {
                override_with(domain, s);
            }
        }
        // Rows of domains the node is not configured with add them, when they define them.
        let mut names: Vec<&str> = self.settings.iter().map(|s| s.name.as_str()).collect();
        names.extend(changed);
        for name in names {
            let on_node = domains.iter().any(|d| d.name == name);
            if let (false, Some(s)) = (on_node || name == DEFAULT_DOMAIN, setting(name)) {
                if let (Some(keywords), Some(mode), Some(threads)) =
                    (&s.keywords, s.mode, s.threads)
                {
                    let mut domain = Domain::new(name, keywords.clone(), mode, threads);
                    override_with(&mut domain, s);
                    domains.push(domain);
                }
            }
        }
        if let Some(i) = changed.and_then(|c| domains.iter().position(|d| d.name == c)) {
            let domain = domains.remove(i);
            domains.push(domain);
        }
        domains
    }
}

fn override_with(domain: &mut Domain, setting: &DomainSetting) {
    if let Some(keywords) = &setting.keywords {
        domain.keywords.clone_from(keywords);
    }
    domain.mode = setting.mode.unwrap_or(domain.mode);
    domain.threads = setting.threads.unwrap_or(domain.threads);
    domain.queue = setting.queue.or(domain.queue);
    domain.timeout = setting
        .timeout_ms
        .map(Duration::from_millis)
        .or(domain.timeout);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{DomainMode, DomainUse};

    /// A node of 2 threads whose `payments` holds both: it started with fewer threads than
    /// its configuration needs.
    fn overcommitted() -> Census {
        let payments = DomainUse {
            domain: "payments".into(),
            mode: "reserved".into(),
            keywords: vec!["pay".into()],
            threads: 2,
            ..DomainUse::default()
        };
        Census {
            settings: Vec::new(),
            paused_keywords: Vec::new(),
            nodes: vec![LiveNode {
                id: 7,
                name: "small".into(),
                published: NodeDomains {
                    threads: 2,
                    domains: vec![payments],
                },
            }],
        }
    }

    #[test]
    fn a_node_already_over_its_threads_refuses_only_changes_of_threads() {
        let census = overcommitted();
        let mut queue_only = DomainSetting::empty("payments");
        queue_only.queue = Some(4);
        assert!(census.check_nodes(&queue_only, false).is_ok());
        // A change that fixes it passes.
        let mut fix = DomainSetting::empty("payments");
        fix.threads = Some(1);
        assert!(census.check_nodes(&fix, true).is_ok());
        // One that does not is refused, naming the domain at fault and the node.
        let mut mail = DomainSetting::empty("mail");
        mail.keywords = Some(vec!["mail".into()]);
        mail.mode = Some(DomainMode::Max);
        mail.threads = Some(1);
        let err = census.check_nodes(&mail, true).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "domain \"payments\": on node 7 (small, 2 threads): brings the RESERVED"
            ),
            "{err}"
        );
    }
}

//! Run-time control of domains through `async_domain` and `async_pause`: list, set, release,
//! pause, resume (`outbox domain …`, `outbox pause`, `outbox resume`).
//!
//! Every live node reads both tables at each heartbeat and applies them: a change reaches
//! the fleet within a heartbeat. A row of `async_domain` overrides, field by field, the
//! configuration the nodes were started with (`--domains FILE`, `--domain`); a row naming a
//! domain no node is configured with adds it, and then defines its keywords and mode itself.
//!
//! Each change checks its input before writing anything, runs in one transaction that
//! first serialises it against other operators' changes, and is written to `async_audit` in
//! that transaction, naming `actor` (`domain.set`, `domain.release`, `domain.pause`,
//! `domain.resume`, `keyword.pause`, `keyword.resume`). A change that changes nothing writes
//! nothing and is not audited.
//!
//! The checks see the live nodes ([`LIVE_WITHIN`]) that have published their domains: a node
//! that starts later with fewer threads than a change was checked against is the worker's to
//! refuse.
//!
//! ```no_run
//! use outbox::domain::admin::{self, DomainChange};
//!
//! # fn main() -> outbox::Result<()> {
//! let mut conn = outbox::DatabaseUrl::parse("postgres://localhost/app")?.connect()?;
//! let change = DomainChange::default().keywords(["payment.capture"]).reserved(4);
//! admin::set(&mut conn, "payments", &change, "ops@host")?;
//! admin::release(&mut conn, "payments", "ops@host")?; // paused, its threads to default
//! admin::resume(&mut conn, "payments", "ops@host")?;
//! admin::pause(&mut conn, "mail.send", "ops@host")?; // a keyword on its own
//! for domain in admin::list(&mut conn)? {
//!     println!("{}: {} running", domain.domain, domain.running);
//! }
//! # Ok(())
//! # }
//! ```

use diesel::Connection;
use serde::Serialize;

pub use super::census::LIVE_WITHIN;
pub use super::change::DomainChange;
pub use super::view::{DomainSetting, DomainView};

use super::census::Census;
use super::view::views;
use super::{validate_name, DomainMode, DEFAULT_DOMAIN};
use crate::db::transaction::depth;
use crate::db::{write_transaction, DbConnection};
use crate::driver::{driver, keyword_paused, AuditEntry, DomainWrite, Driver};
use crate::error::{Error, OpContext, Result};

/// What an operator's change applied to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// A domain (its row of `async_domain`).
    Domain,
    /// A keyword paused on its own (`async_pause`).
    Keyword,
}

/// What a change did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Changed {
    /// A domain or a keyword.
    pub target: Target,
    /// Its name.
    pub name: String,
    /// The action, as audited (`domain.set`, `keyword.pause`, …).
    pub action: &'static str,
    /// Whether anything was written (and audited); `false` when it was so already.
    pub changed: bool,
    /// A domain's row as it stands after the change (`None`: a keyword, or a domain with
    /// no row that was left without one).
    pub setting: Option<DomainSetting>,
    /// The live nodes that apply the change at their next heartbeat: those that run the
    /// domain (every live node when its row defines it, as they all add it, or when it
    /// holds keywords, as they all hold them) or serve the keyword.
    pub nodes: usize,
}

/// Every domain known from `async_domain` or from the live nodes, `default` first, then by
/// name: configuration as the table overrides the nodes', slot use summed over the nodes.
pub fn list(conn: &mut DbConnection) -> Result<Vec<DomainView>> {
    Ok(views(&Census::read(conn)?))
}

/// The keywords paused on their own, by name.
pub fn paused_keywords(conn: &mut DbConnection) -> Result<Vec<String>> {
    keyword_paused(conn).op("keyword pause list")
}

/// Creates or changes the domain `name`'s row, audited as `actor`'s `domain.set`.
///
/// Refused with [`Error::InvalidDomain`], writing nothing, when: the change is invalid on its
/// own ([`DomainChange::validate`]); the domain is new (no row, on no live node) and the
/// change does not give it keywords and a mode; a keyword is listed by another domain (its
/// row, or a live node's configuration where no row overrides it); or on some live node the
/// domains with this change would not pass [`super::validate_domains`] against its threads
/// (a `MAX` over them, `RESERVED` threads that leave `default` none), the reason naming the
/// node.
pub fn set(
    conn: &mut DbConnection,
    name: &str,
    change: &DomainChange,
    actor: &str,
) -> Result<Changed> {
    change.validate(name)?;
    locked(conn, |conn| {
        let census = Census::read(conn)?;
        let current = census.setting(name).cloned();
        let mut proposed = change.apply(current.as_ref().unwrap_or(&DomainSetting::empty(name)));
        census.hold(&mut proposed);
        if census.nodes_with(name) == 0 && !proposed.is_complete() {
            let what = if current.is_some() {
                "is on no live node and its row does not define it"
            } else {
                "is a new domain (no row in async_domain, on no live node)"
            };
            return Err(Error::InvalidDomain {
                domain: name.to_owned(),
                reason: format!("{what}: give it keywords and MAX or RESERVED n"),
            });
        }
        if let Some(keywords) = &change.keywords {
            census.check_keywords_free(name, keywords)?;
        }
        let touches_threads = change.keywords.is_some() || change.mode.is_some();
        census.check_nodes(&proposed, touches_threads)?;
        let nodes = census.nodes_applying(&proposed);
        if current.as_ref().is_some_and(|c| c.same_as(&proposed)) {
            return Ok(unchanged(
                Target::Domain,
                name,
                "domain.set",
                current,
                nodes,
            ));
        }
        let mut detail = change.detail();
        detail["nodes"] = nodes.into();
        write(driver(conn), &proposed, actor, "domain.set", detail, nodes)
    })
}

/// Force-releases the domain `name` (seed 004): it is paused — nothing claimed for it, its
/// running tasks finish — and its reserved threads go to `default`, until [`resume`].
/// Audited as `domain.release`. [`Error::DomainNotFound`] when no row or live node has the
/// domain; `default`, which holds no reserved threads, is an [`Error::InvalidDomain`].
pub fn release(conn: &mut DbConnection, name: &str, actor: &str) -> Result<Changed> {
    validate_release(name)?;
    locked(conn, |conn| {
        let census = Census::read(conn)?;
        if !census.is_domain(name) {
            return Err(Error::DomainNotFound {
                name: name.to_owned(),
            });
        }
        flag(
            driver(conn),
            &census,
            name,
            "domain.release",
            true,
            true,
            actor,
        )
    })
}

/// Checks the name given to [`release`] on its own, as `release` does before reading
/// anything: a valid name, not `default`.
pub fn validate_release(name: &str) -> Result<()> {
    validate_name(name)?;
    if name == DEFAULT_DOMAIN {
        return Err(Error::InvalidDomain {
            domain: name.to_owned(),
            reason: "holds no reserved threads to release; pause it instead".into(),
        });
    }
    Ok(())
}

/// Pauses `name`: a domain (`default` included) when one has that name, else a keyword some
/// live node serves or some row lists. Nothing is claimed for it; running tasks finish.
/// Audited as `domain.pause` or `keyword.pause`; [`Error::DomainNotFound`] when it is
/// neither.
///
/// A domain's pause (and [`release`]) holds on every node: its row records the domain's
/// keywords ([`DomainSetting::held_keywords`]), which no node claims while it is paused,
/// also a node whose configuration has no such domain and would otherwise run them under
/// `default` (and one that starts later).
pub fn pause(conn: &mut DbConnection, name: &str, actor: &str) -> Result<Changed> {
    pause_or_resume(conn, name, actor, true)
}

/// Undoes [`pause`] (and, for a domain, [`release`]) of `name`, a domain or a keyword, as
/// `pause` tells them apart. Audited as `domain.resume` or `keyword.resume`.
pub fn resume(conn: &mut DbConnection, name: &str, actor: &str) -> Result<Changed> {
    pause_or_resume(conn, name, actor, false)
}

fn pause_or_resume(
    conn: &mut DbConnection,
    name: &str,
    actor: &str,
    pause: bool,
) -> Result<Changed> {
    validate_name(name)?;
    locked(conn, |conn| {
        let census = Census::read(conn)?;
        if census.is_domain(name) {
            let (action, released) = if pause {
                // Pausing keeps a release as it is.
                let released = census.setting(name).is_some_and(|s| s.released);
                ("domain.pause", released)
            } else {
                ("domain.resume", false)
            };
            return flag(driver(conn), &census, name, action, pause, released, actor);
        }
        if !census.is_keyword(name) {
            return Err(Error::DomainNotFound {
                name: name.to_owned(),
            });
        }
        let action = if pause {
            "keyword.pause"
        } else {
            "keyword.resume"
        };
        let audit = AuditEntry {
            actor,
            action,
            target: name,
            detail: "{}",
            affected: 1,
        };
        let n = if pause {
            driver(conn)
                .keyword_pause(name, &audit)
                .op("keyword pause")?
        } else {
            driver(conn)
                .keyword_resume(name, &audit)
                .op("keyword resume")?
        };
        Ok(Changed {
            target: Target::Keyword,
            name: name.to_owned(),
            action,
            changed: n > 0,
            setting: None,
            nodes: census.nodes_serving(name),
        })
    })
}

/// Sets a domain's `paused` and `released`, writing its row only if they change.
fn flag(
    driver: &mut dyn Driver,
    census: &Census,
    name: &str,
    action: &'static str,
    paused: bool,
    released: bool,
    actor: &str,
) -> Result<Changed> {
    let current = census.setting(name).cloned();
    let mut proposed = current
        .clone()
        .unwrap_or_else(|| DomainSetting::empty(name));
    (proposed.paused, proposed.released) = (paused, released);
    census.hold(&mut proposed);
    let nodes = census.nodes_applying(&proposed);
    let same = match &current {
        Some(c) => c.same_as(&proposed),
        // No row is neither paused nor released.
        None => !paused && !released,
    };
    if same {
        return Ok(unchanged(Target::Domain, name, action, current, nodes));
    }
    let detail = serde_json::json!({"paused": paused, "released": released, "nodes": nodes});
    write(driver, &proposed, actor, action, detail, nodes)
}

fn unchanged(
    target: Target,
    name: &str,
    action: &'static str,
    setting: Option<DomainSetting>,
    nodes: usize,
) -> Changed {
    Changed {
        target,
        name: name.to_owned(),
        action,
        changed: false,
        setting,
        nodes,
    }
}

/// Writes `setting` as the domain's row, audited as `action`.
fn write(
    driver: &mut dyn Driver,
    setting: &DomainSetting,
    actor: &str,
    action: &'static str,
    detail: serde_json::Value,
    nodes: usize,
) -> Result<Changed> {
    let to_i32 = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    let row = DomainWrite {
        name: &setting.name,
        keywords: setting
            .keywords
            .as_ref()
            .map(|k| serde_json::Value::from(k.clone()).to_string()),
        mode: setting.mode.map(DomainMode::as_str),
        threads: setting.threads.map(to_i32),
        queue: setting.queue.map(to_i32),
        timeout_ms: setting
            .timeout_ms
            .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
        paused: setting.paused,
        released: setting.released,
        held_keywords: setting
            .held_keywords
            .as_ref()
            .map(|k| serde_json::Value::from(k.clone()).to_string()),
    };
    let detail = detail.to_string();
    let audit = AuditEntry {
        actor,
        action,
        target: &setting.name,
        detail: &detail,
        affected: 1,
    };
    let stored = driver.domain_write(&row, &audit).op("domain set")?;
    Ok(Changed {
        target: Target::Domain,
        name: setting.name.clone(),
        action,
        changed: true,
        setting: Some(stored.into()),
        nodes,
    })
}

/// Runs `f` in a write transaction (a savepoint when the caller has one open) that first
/// takes the domains' lock ([`Driver::domain_lock`]), so that what `f` reads and checks is
/// still so when it writes.
fn locked<T>(conn: &mut DbConnection, f: impl FnOnce(&mut DbConnection) -> Result<T>) -> Result<T> {
    let body = |conn: &mut DbConnection| -> Result<T> {
        driver(conn).domain_lock().op("domain lock")?;
        f(conn)
    };
    if depth(conn) == Some(0) {
        write_transaction(conn, body)
    } else {
        conn.transaction(body)
    }
}
